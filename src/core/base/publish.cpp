#include "base/publish.h"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <random>
#include <thread>

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

// The cached read-back: the staging file, mapped from the page cache: its size
// and whole-file CRC-32 against the bytes handed to write(2), then the
// verifier, which checks every record's CRC-32.
void check_cached_read_back(const Snapshot& mapped, const PublishResult& result, const PublishVerifier& verify) {
  if (mapped.buffer->size() != result.size) {
    detail::fail(ErrorCode::file_changed_during_read, "the staging file holds ", mapped.buffer->size(), " bytes; ",
                 result.size, " were written");
  }
  // Every byte, headers the verifier does not interpret included.
  const std::uint32_t crc = crc32_of(mapped.buffer->bytes());
  if (crc != result.crc32) {
    detail::fail(ErrorCode::file_changed_during_read, "the staging file reads back with CRC-32 ", crc,
                 "; the bytes written had ", result.crc32);
  }
  verify(mapped.buffer->bytes(), mapped.buffer);
}

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
    if (options.small && options.range_digests) {
      detail::fail(ErrorCode::invalid_argument, "publish: range digests are for streamed files, not small ones");
    }
    if (options.small) {
      InlineHashingSink writer(*file);
      write(writer);
      result.sha256 = writer.finish();
      result.crc32 = writer.crc32();
      result.size = writer.position();
    } else {
      HashingWriter writer(*file, options.range_digests);
      write(writer);
      result.sha256 = writer.finish();
      result.crc32 = writer.crc32();
      result.size = writer.position();
      result.range_digests = writer.range_digests();
      result.range_ends = writer.range_ends();
    }
    const bool device = options.read_back == ReadBack::device;
    // Read back what the file system now holds: the bytes must be the bytes
    // written, and they must verify, before the target name points at them.
    if (!device && verify && options.verifier_checks_content && !options.small) {
      // The page cache returns the same bytes before the fsync as after it,
      // so the read-back runs while the fsync waits for the device. The file
      // is mapped first, so the file system sees the same calls in the same
      // order every time; errors keep the order of the steps: the fsync's,
      // the close's, the check's.
      Snapshot mapped = directory.map(staging, options.max_bytes);
      std::exception_ptr sync_failure;
      std::jthread syncer;
      if (options.durable) {
        syncer = std::jthread([&] {
          try {
            file->sync();
          } catch (...) {
            sync_failure = std::current_exception();
          }
        });
      }
      std::exception_ptr check_failure;
      try {
        check_cached_read_back(mapped, result, verify);
      } catch (...) {
        check_failure = std::current_exception();
      }
      if (syncer.joinable()) syncer.join();
      if (sync_failure) std::rethrow_exception(sync_failure);
      file->close();
      file.reset();
      if (check_failure) std::rethrow_exception(check_failure);
    } else {
      if (options.durable || device) file->sync();
      file->close();
      file.reset();
      if (device) directory.drop_cached_pages(staging);
      Snapshot snapshot = directory.read(staging, options.max_bytes,
                                         options.range_digests ? std::nullopt : std::optional(result.sha256));
      if (verify) verify(snapshot.buffer->bytes(), snapshot.buffer);
    }
    if (options.before_rename) options.before_rename();
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

void end_range(ByteSink& sink) {
  auto* writer = dynamic_cast<HashingWriter*>(&sink);
  if (!writer) detail::fail(ErrorCode::write_state_invalid, "end_range: the sink does not digest ranges");
  writer->end_range();
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
