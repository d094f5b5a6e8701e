// TamperingFileSystem: the POSIX file system with one wrong byte planted in a
// staging file just before publish's read-back maps it (ReadBack::cached) or
// re-reads it (ReadBack::device), so the file system returns a byte other
// than the one written. It also records which read-back calls were made, in
// order, so a test can tell the modes apart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "holdpoint/base/file_system.h"

namespace holdpoint::testing {

// What the decorator saw and does.
struct Tamper {
  // Flip one byte of a staging file just before the read-back maps it
  // (on_map) or reads it (on_read). `offset` picks the byte from the file as
  // written (nullopt: flip nothing).
  bool on_map = false;
  bool on_read = false;
  std::function<std::optional<std::uint64_t>(const std::vector<std::byte>& file)> offset;
  std::set<std::string> flipped;  // each staging file is flipped once

  int map_calls = 0;
  int read_calls = 0;
  int drop_calls = 0;
  int staging_read_calls = 0;
  int staging_map_calls = 0;
  std::vector<std::string> order;  // "map", "drop", "read" on staging files
};

// Decorates a real directory; its subdirectories are decorated too.
class TamperingDirectory final : public io::Directory {
 public:
  TamperingDirectory(std::unique_ptr<io::Directory> inner, std::shared_ptr<Tamper> tamper)
      : inner_(std::move(inner)), tamper_(std::move(tamper)) {}

  const std::filesystem::path& path() const override { return inner_->path(); }
  std::unique_ptr<io::WritableFile> create_exclusive(const std::string& name) override {
    return inner_->create_exclusive(name);
  }
  io::Snapshot read(const std::string& name, std::uint64_t max_bytes, const std::optional<Sha256Digest>& expected,
                    const io::ReadProgress& progress, const io::SnapshotParser& parse) override;
  io::Snapshot map(const std::string& name, std::uint64_t max_bytes) override;
  void drop_cached_pages(const std::string& name) override;
  void rename(const std::string& from, const std::string& to, bool replace) override {
    inner_->rename(from, to, replace);
  }
  void link(const std::string& from, const std::string& to) override { inner_->link(from, to); }
  void unlink(const std::string& name) override { inner_->unlink(name); }
  void remove_directory(const std::string& name) override { inner_->remove_directory(name); }
  std::vector<std::string> list() override { return inner_->list(); }
  std::optional<io::FileInfo> stat(const std::string& name) override { return inner_->stat(name); }
  void sync() override { inner_->sync(); }
  std::unique_ptr<io::Directory> open_subdirectory(const std::string& name, bool create) override {
    return std::make_unique<TamperingDirectory>(inner_->open_subdirectory(name, create), tamper_);
  }

 private:
  void plant(const std::string& name);

  std::unique_ptr<io::Directory> inner_;
  std::shared_ptr<Tamper> tamper_;
};

class TamperingFileSystem final : public io::FileSystem {
 public:
  explicit TamperingFileSystem(std::shared_ptr<Tamper> tamper) : tamper_(std::move(tamper)) {}
  std::unique_ptr<io::Directory> open_directory(const std::filesystem::path& path, bool create) override;

 private:
  std::shared_ptr<Tamper> tamper_;
};

// A Tamper::offset: the middle byte of zip record `record`'s payload
// ("data/0": a tensor's bytes), or nullopt when the file has no such record.
std::function<std::optional<std::uint64_t>(const std::vector<std::byte>& file)> in_record_payload(
    std::string record);

// Flips every bit of the byte at `offset` of the file, in place.
void flip_on_disk(const std::filesystem::path& path, std::uint64_t offset);

}  // namespace holdpoint::testing
