// HashingWriter: a ByteSink that streams into a WritableFile while a second
// thread computes the SHA-256 of everything written, so that hashing overlaps
// the write system calls. Small writes gather in reusable 1 MiB blocks; large
// stable spans (tensor memory) go to the file straight from the caller's
// memory and are hashed in place. Writeback is started every 32 MiB so that
// the final fsync finds most of the data already on its way to the disk.
//
// Failure contract: write errors propagate from the WritableFile; after one
// the writer must be abandoned (destroying it stops the hasher; it never
// touches the file system itself).
//
// Thread-safety: one thread writes; the hashing thread is internal.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"

namespace holdpoint::io {

class HashingWriter final : public ByteSink {
 public:
  explicit HashingWriter(WritableFile& file);
  ~HashingWriter() override;
  HashingWriter(const HashingWriter&) = delete;
  HashingWriter& operator=(const HashingWriter&) = delete;

  void write(std::span<const std::byte> bytes) override;
  void write_stable(std::span<const std::byte> bytes) override;
  std::uint64_t position() const override { return position_; }

  // Writes what is buffered and returns the SHA-256 of everything written.
  // The file is not synced or closed here.
  Sha256Digest finish();
  // The CRC-32 of everything written, computed on the writing thread (for a
  // read-back that checks every byte without a second SHA-256 pass).
  std::uint32_t crc32() const noexcept { return crc32_; }

 private:
  struct Piece {
    const std::byte* data;
    std::size_t size;
    int block;  // index of the block buffer to recycle afterwards, or -1
  };

  void flush_block();
  void submit(Piece piece);
  void hash_loop();
  void stop_hasher() noexcept;

  WritableFile& file_;
  std::uint64_t position_ = 0;
  std::uint32_t crc32_ = 0;
  std::uint64_t writeback_started_ = 0;
  bool finished_ = false;

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

}  // namespace holdpoint::io
