// ByteSink: where format writers put their bytes.
//
// Writers (zip, safetensors) produce a byte stream and never touch files; the
// io layer supplies sinks (a file with streaming SHA-256, an in-memory buffer
// for tests). A sink reports its position so writers can compute offsets.
//
// Failure contract: write() throws holdpoint::Error (io_write_failed, ...);
// after a throw the sink is unusable and the writer must be abandoned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace holdpoint::io {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  // `bytes` need only stay valid for the duration of the call.
  virtual void write(std::span<const std::byte> bytes) = 0;
  // Like write(), but the caller guarantees that `bytes` stays valid and
  // unchanged until the sink is finished or abandoned (tensor memory), so a
  // sink may hash it asynchronously without copying.
  virtual void write_stable(std::span<const std::byte> bytes) { write(bytes); }
  virtual std::uint64_t position() const = 0;
};

// Collects everything in memory (tests, fuzzers, small records).
class MemorySink final : public ByteSink {
 public:
  void write(std::span<const std::byte> bytes) override { bytes_.insert(bytes_.end(), bytes.begin(), bytes.end()); }
  std::uint64_t position() const override { return bytes_.size(); }
  const std::vector<std::byte>& bytes() const noexcept { return bytes_; }
  std::vector<std::byte> take() noexcept { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

}  // namespace holdpoint::io
