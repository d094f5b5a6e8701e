#include "base/publish.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "base/crc32.h"
#include "base/fail.h"
#include "base/hashing_writer.h"

namespace holdpoint::io {

namespace {

// Writes straight through and hashes inline (small files).
class InlineHashingSink final : public ByteSink {
 public:
  explicit InlineHashingSink(WritableFile& file) : file_(file) {}
  void write(std::span<const std::byte> bytes) override {
    file_.write(bytes);
    hasher_.update(bytes);
    crc32_ = crc32_update(crc32_, bytes.data(), bytes.size());
    position_ += bytes.size();
  }
  std::uint64_t position() const override { return position_; }
  Sha256Digest finish() { return hasher_.finish(); }
  std::uint32_t crc32() const noexcept { return crc32_; }

 private:
  WritableFile& file_;
  Sha256 hasher_;
  std::uint32_t crc32_ = 0;
  std::uint64_t position_ = 0;
};

}  // namespace

bool is_staging_name(std::string_view name) noexcept {
  // Exactly what publish() creates: ".<target>.staging-<pid>-<random>".
  const auto marker = name.rfind(kStagingMarker);
  if (name.size() < 2 || name.front() != '.' || marker == std::string_view::npos || marker < 2) return false;
  const std::string_view tail = name.substr(marker + kStagingMarker.size());
  const auto dash = tail.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == tail.size()) return false;
  const auto digits = [](std::string_view text) {
    return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return digits(tail.substr(0, dash)) && digits(tail.substr(dash + 1));
}

PublishResult publish(Directory& directory, const std::string& target, const PublishOptions& options,
                      const std::function<void(ByteSink&)>& write, const PublishVerifier& verify) {
  if (target.empty() || target.find('/') != std::string::npos || target == "." || target == "..") {
    detail::fail(ErrorCode::invalid_argument, "publish: '", target, "' is not a file name");
  }
  std::random_device random;
  std::string staging;
  std::unique_ptr<WritableFile> file;
  for (int attempt = 0; !file; ++attempt) {
    staging = detail::concat(".", target, kStagingMarker, ::getpid(), "-", random());
    try {
      file = directory.create_exclusive(staging);
    } catch (const Error&) {
      // A name collision (or a planted file or symlink) is tried again under
      // another name; a directory that refuses every name is an error.
      if (attempt == 8) throw;
    }
  }
  PublishResult result;
  try {
    if (options.small) {
      InlineHashingSink writer(*file);
      write(writer);
      result.sha256 = writer.finish();
      result.crc32 = writer.crc32();
      result.size = writer.position();
    } else {
      HashingWriter writer(*file);
      write(writer);
      result.sha256 = writer.finish();
      result.crc32 = writer.crc32();
      result.size = writer.position();
    }
    const bool device = options.read_back == ReadBack::device;
    if (options.durable || device) file->sync();
    file->close();
    file.reset();
    // Read back what the file system now holds: the bytes must be the bytes
    // written, and they must verify, before the target name points at them.
    if (!device && verify && options.verifier_checks_content && !options.small) {
      Snapshot mapped = directory.map(staging, options.max_bytes);
      if (mapped.buffer->size() != result.size) {
        detail::fail(ErrorCode::file_changed_during_read, "the staging file holds ", mapped.buffer->size(),
                     " bytes; ", result.size, " were written");
      }
      // Every byte, headers the verifier does not interpret included, against
      // the CRC-32 computed from the bytes handed to write(2).
      const std::uint32_t crc = crc32_of(mapped.buffer->bytes());
      if (crc != result.crc32) {
        detail::fail(ErrorCode::file_changed_during_read, "the staging file reads back with CRC-32 ", crc,
                     "; the bytes written had ", result.crc32);
      }
      verify(mapped.buffer->bytes(), mapped.buffer);
    } else {
      if (device) directory.drop_cached_pages(staging);
      Snapshot snapshot = directory.read(staging, options.max_bytes, result.sha256);
      if (verify) verify(snapshot.buffer->bytes(), snapshot.buffer);
    }
    directory.rename(staging, target, options.replace);
  } catch (...) {
    file.reset();
    try {
      directory.unlink(staging);
    } catch (const Error&) {
      // Recovery removes staging files left behind.
    }
    throw;
  }
  if (options.durable) directory.sync();
  return result;
}

PublishResult publish_text(Directory& directory, const std::string& target, std::string_view text,
                           const PublishOptions& options, const PublishVerifier& verify) {
  PublishOptions small = options;
  small.small = true;
  return publish(
      directory, target, small,
      [&](ByteSink& sink) { sink.write({reinterpret_cast<const std::byte*>(text.data()), text.size()}); }, verify);
}

}  // namespace holdpoint::io
