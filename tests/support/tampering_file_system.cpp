#include "support/tampering_file_system.h"

#include <fcntl.h>
#include <unistd.h>

#include <stdexcept>

#include "base/publish.h"
#include "format/zip/zip_reader.h"
#include "support/test_support.h"

namespace holdpoint::testing {

io::Snapshot TamperingDirectory::read(const std::string& name, std::uint64_t max_bytes,
                                      const std::optional<Sha256Digest>& expected, const io::ReadProgress& progress,
                                      const io::SnapshotParser& parse) {
  ++tamper_->read_calls;
  if (io::is_staging_name(name)) {
    ++tamper_->staging_read_calls;
    tamper_->order.push_back("read");
    if (tamper_->on_read) plant(name);
  }
  return inner_->read(name, max_bytes, expected, progress, parse);
}

io::Snapshot TamperingDirectory::map(const std::string& name, std::uint64_t max_bytes) {
  ++tamper_->map_calls;
  if (io::is_staging_name(name)) {
    ++tamper_->staging_map_calls;
    tamper_->order.push_back("map");
    if (tamper_->on_map) plant(name);
  }
  return inner_->map(name, max_bytes);
}

void TamperingDirectory::drop_cached_pages(const std::string& name) {
  ++tamper_->drop_calls;
  if (io::is_staging_name(name)) tamper_->order.push_back("drop");
  inner_->drop_cached_pages(name);
}

void TamperingDirectory::plant(const std::string& name) {
  if (!tamper_->offset || tamper_->flipped.contains(name)) return;
  const auto file = path() / name;
  const auto offset = tamper_->offset(read_file_bytes(file));
  if (!offset) return;
  flip_on_disk(file, *offset);
  tamper_->flipped.insert(name);
}

std::unique_ptr<io::Directory> TamperingFileSystem::open_directory(const std::filesystem::path& path, bool create) {
  return std::make_unique<TamperingDirectory>(io::posix_file_system().open_directory(path, create), tamper_);
}

std::function<std::optional<std::uint64_t>(const std::vector<std::byte>& file)> in_record_payload(
    std::string record) {
  return [record = std::move(record)](const std::vector<std::byte>& file) -> std::optional<std::uint64_t> {
    const auto archive = format::read_zip_directory(file, Limits{});
    const format::ZipEntry* entry = archive.find(record);
    if (!entry || entry->size == 0) return std::nullopt;
    return entry->data_offset + entry->size / 2;
  };
}

void flip_on_disk(const std::filesystem::path& path, std::uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path.string());
  std::byte b{};
  bool ok = ::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1;
  b ^= std::byte{0xFF};
  ok = ok && ::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1;
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot flip byte " + std::to_string(offset) + " of " + path.string());
}

}  // namespace holdpoint::testing
