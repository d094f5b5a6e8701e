// HashingWriter: a ByteSink that streams into a WritableFile while a second
// thread computes the SHA-256 of everything written, so that hashing overlaps
// the write system calls. Small writes gather in reusable 1 MiB blocks; large
// stable spans (tensor memory) go to the file straight from the caller's
// memory and are hashed in place. Writeback is started every 32 MiB so that
// the final fsync finds most of the data already on its way to the disk.
//
// In range mode (publish() with PublishOptions::range_digests) the second
// thread digests consecutive ranges of the stream separately, each closed by
// end_range(), instead of the whole file: a reader of one range can then check
// it alone. The bytes of a range still in the current block are handed to the
// hasher without flushing the block, so small ranges cost no extra write.
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
  explicit HashingWriter(WritableFile& file, bool ranges = false);
  ~HashingWriter() override;
  HashingWriter(const HashingWriter&) = delete;
  HashingWriter& operator=(const HashingWriter&) = delete;

  void write(std::span<const std::byte> bytes) override;
  void write_stable(std::span<const std::byte> bytes) override;
  std::uint64_t position() const override { return position_; }

  // Range mode: the range that began after the previous end_range() (or at
  // the start) ends here; its digest is the next of range_digests().
  void end_range();
  // Writes what is buffered and returns the SHA-256 of everything written
  // (zero in range mode, where bytes after the last end_range() are refused).
  // The file is not synced or closed here.
  Sha256Digest finish();
  // Range mode, after finish(): one digest per end_range(), in order, and
  // where each range ends.
  const std::vector<Sha256Digest>& range_digests() const noexcept { return range_digests_; }
  const std::vector<std::uint64_t>& range_ends() const noexcept { return range_ends_; }
  // The CRC-32 of everything written, computed on the writing thread (for a
  // read-back that checks every byte without a second SHA-256 pass).
  std::uint32_t crc32() const noexcept { return crc32_; }

 private:
  struct Piece {
    const std::byte* data;
    std::size_t size;
    int block;  // index of the block buffer to recycle afterwards, -1, or kRangeEnd
  };
  static constexpr int kRangeEnd = -2;

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
  std::size_t block_submitted_ = 0;  // of the current block, handed to the hasher by end_range()

  bool ranges_ = false;
  std::uint64_t range_start_ = 0;
  std::vector<Sha256Digest> range_digests_;  // written by the hasher, read after finish()
  std::vector<std::uint64_t> range_ends_;

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
