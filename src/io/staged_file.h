// StagedFile: the one way holdpoint makes a file appear under its final name.
//
// create() makes a unique staging file beside the target (O_CREAT|O_EXCL|
// O_NOFOLLOW, relative to a descriptor of the target's directory, so a symlink
// planted at the staging name is never followed). Bytes are streamed in through
// the ByteSink interface while SHA-256 is computed on a second thread, so
// hashing overlaps the write system calls. finish() flushes, waits for the
// hash, fsyncs and closes; commit() renames the staging file over the target
// and fsyncs the directory. Until commit() the target is untouched.
//
// Failure contract: every step throws holdpoint::Error (io_* codes) naming the
// path; after a throw call abandon(), which closes and unlinks the staging
// file. The destructor only closes a descriptor still open; it never unlinks
// or renames (run-directory recovery removes stale staging files).
//
// Thread-safety: one thread drives a StagedFile; the hashing thread is internal.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/sha256.h"
#include "io/byte_sink.h"

namespace holdpoint::io {

// Staging files are named ".<target name>.staging-<pid>-<random>" so that
// recovery can recognise them.
inline constexpr std::string_view kStagingMarker = ".staging-";

class StagedFile final : public ByteSink {
 public:
  static std::unique_ptr<StagedFile> create(const std::filesystem::path& target);
  ~StagedFile() override;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  void write(std::span<const std::byte> bytes) override;
  void write_stable(std::span<const std::byte> bytes) override;
  std::uint64_t position() const override { return position_; }

  // Writes buffered bytes, waits for the hash, fsyncs (when durable) and
  // closes. Returns the SHA-256 of everything written.
  Sha256Digest finish(bool durable);
  // Renames the finished staging file over the target; fsyncs the directory
  // when durable.
  void commit(bool durable);
  // Closes and unlinks the staging file. Never throws.
  void abandon() noexcept;

  const std::filesystem::path& target() const noexcept { return target_; }
  const std::filesystem::path& staging_path() const noexcept { return staging_path_; }

 private:
  struct Piece {
    const std::byte* data;
    std::size_t size;
    int block;  // index of the block buffer to recycle afterwards, or -1
  };

  StagedFile(std::filesystem::path target, std::filesystem::path staging, int directory_fd, int fd);
  void write_to_file(const std::byte* data, std::size_t size);
  void flush_block();
  void submit(Piece piece);
  void hash_loop();
  void stop_hasher() noexcept;
  void fail_io(int error_number, const char* what) const;

  std::filesystem::path target_;
  std::filesystem::path staging_path_;
  int directory_fd_;
  int fd_;
  std::uint64_t position_ = 0;
  std::uint64_t writeback_started_ = 0;
  enum class State { open, finished, committed, abandoned } state_ = State::open;

  // Small writes gather in block buffers; a block is reused only after the
  // hasher has consumed it.
  std::vector<std::vector<std::byte>> blocks_;
  std::vector<bool> block_busy_;
  int current_block_ = 0;
  std::size_t block_fill_ = 0;

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<Piece> queue_;
  bool hasher_busy_ = false;
  bool stopping_ = false;
  Sha256 hasher_;
  std::thread hash_thread_;
};

// fsync of the directory holding `path` (after a rename or unlink).
void sync_directory_of(const std::filesystem::path& path);

}  // namespace holdpoint::io
