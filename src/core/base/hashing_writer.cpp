#include "base/hashing_writer.h"

#include <algorithm>
#include <cstring>

#include "base/crc32.h"
#include "base/fail.h"

namespace holdpoint::io {

namespace {
constexpr std::size_t kBlockBytes = std::size_t{1} << 20;
constexpr int kBlockCount = 4;
constexpr std::uint64_t kWritebackBytes = std::uint64_t{32} << 20;
constexpr std::size_t kStablePieceBytes = std::size_t{8} << 20;
}  // namespace

HashingWriter::HashingWriter(WritableFile& file, bool ranges) : file_(file), ranges_(ranges) {
  blocks_.assign(kBlockCount, std::vector<std::byte>(kBlockBytes));
  block_busy_.assign(kBlockCount, false);
  hash_thread_ = std::thread([this] { hash_loop(); });
}

HashingWriter::~HashingWriter() { stop_hasher(); }

void HashingWriter::hash_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left
    Piece piece = queue_.front();
    queue_.pop_front();
    hasher_busy_ = true;
    lock.unlock();
    if (piece.block == kRangeEnd) {
      range_digests_.push_back(hasher_.finish());
    } else {
      hasher_.update(piece.data, piece.size);
    }
    lock.lock();
    hasher_busy_ = false;
    if (piece.block >= 0) block_busy_[static_cast<std::size_t>(piece.block)] = false;
    work_done_.notify_all();
  }
}

void HashingWriter::submit(Piece piece) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(piece);
  }
  work_ready_.notify_one();
}

void HashingWriter::flush_block() {
  if (block_fill_ == 0) return;
  const auto index = static_cast<std::size_t>(current_block_);
  file_.write({blocks_[index].data(), block_fill_});
  crc32_ = crc32_update(crc32_, blocks_[index].data(), block_fill_);
  {
    std::lock_guard lock(mutex_);
    block_busy_[index] = true;
  }
  // What end_range() already handed over is hashed before this piece (the
  // queue is in order), so the block is recycled only after all of it.
  submit({blocks_[index].data() + block_submitted_, block_fill_ - block_submitted_, current_block_});
  current_block_ = (current_block_ + 1) % kBlockCount;
  block_fill_ = 0;
  block_submitted_ = 0;
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [this] { return !block_busy_[static_cast<std::size_t>(current_block_)]; });
}

void HashingWriter::write(std::span<const std::byte> bytes) {
  if (finished_) detail::fail(ErrorCode::write_state_invalid, "write after finish");
  while (!bytes.empty()) {
    auto& block = blocks_[static_cast<std::size_t>(current_block_)];
    const std::size_t take = std::min(bytes.size(), block.size() - block_fill_);
    std::memcpy(block.data() + block_fill_, bytes.data(), take);
    block_fill_ += take;
    position_ += take;
    bytes = bytes.subspan(take);
    if (block_fill_ == block.size()) flush_block();
  }
}

void HashingWriter::write_stable(std::span<const std::byte> bytes) {
  if (finished_) detail::fail(ErrorCode::write_state_invalid, "write after finish");
  if (bytes.size() < kBlockBytes / 4) {
    write(bytes);
    return;
  }
  flush_block();
  // Large spans go to the kernel straight from the caller's memory and are
  // hashed in place by the worker, in order with everything before them.
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t piece = std::min(bytes.size() - done, kStablePieceBytes);
    file_.write(bytes.subspan(done, piece));
    crc32_ = crc32_update(crc32_, bytes.data() + done, piece);
    submit({bytes.data() + done, piece, -1});
    done += piece;
    position_ += piece;
    if (position_ - writeback_started_ >= kWritebackBytes) {
      file_.start_writeback(writeback_started_, position_ - writeback_started_);
      writeback_started_ = position_;
    }
  }
}

void HashingWriter::end_range() {
  if (!ranges_) detail::fail(ErrorCode::write_state_invalid, "end_range on a writer that digests the whole file");
  if (finished_) detail::fail(ErrorCode::write_state_invalid, "end_range after finish");
  if (block_fill_ > block_submitted_) {
    // The block's memory stays put until the block is flushed and its last
    // piece hashed; bytes appended meanwhile go after this piece.
    const auto index = static_cast<std::size_t>(current_block_);
    submit({blocks_[index].data() + block_submitted_, block_fill_ - block_submitted_, -1});
    block_submitted_ = block_fill_;
  }
  submit({nullptr, 0, kRangeEnd});
  range_ends_.push_back(position_);
  range_start_ = position_;
}

Sha256Digest HashingWriter::finish() {
  if (finished_) detail::fail(ErrorCode::write_state_invalid, "finish after finish");
  if (ranges_ && position_ != range_start_) {
    detail::fail(ErrorCode::write_state_invalid, "finish with ", position_ - range_start_,
                 " bytes after the last end_range");
  }
  flush_block();
  {
    std::unique_lock lock(mutex_);
    work_done_.wait(lock, [this] { return queue_.empty() && !hasher_busy_; });
  }
  stop_hasher();
  finished_ = true;
  return ranges_ ? Sha256Digest{} : hasher_.finish();
}

void HashingWriter::stop_hasher() noexcept {
  if (!hash_thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_ready_.notify_all();
  hash_thread_.join();
}

}  // namespace holdpoint::io
