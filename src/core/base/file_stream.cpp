#include "base/file_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "base/fail.h"

namespace holdpoint::io {

using detail::fail;

std::size_t pread_fully(int fd, std::byte* out, std::size_t size, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::io_read_failed, "read failed at offset ", offset + done, ": ", std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

namespace {

// Progress is reported this often (a multiple of the chunk size), and at the end.
constexpr std::uint64_t kProgressBytes = std::uint64_t{64} << 20;

// Chunk i lives in buffer i % kStreamBuffers. The reader (the calling thread)
// publishes how many chunks are filled, the hasher how many it has hashed; a
// buffer is refilled only once the hasher is past the chunk it held.
class HashRing {
 public:
  explicit HashRing(std::uint64_t size) : size_(size) {
    const std::uint64_t buffers = std::min<std::uint64_t>(kStreamBuffers, chunk_count());
    for (std::uint64_t i = 0; i < buffers; ++i) buffers_[i] = Buffer::allocate(kStreamChunkBytes);
  }

  std::uint64_t chunk_count() const { return (size_ + kStreamChunkBytes - 1) / kStreamChunkBytes; }
  std::size_t chunk_size(std::uint64_t chunk) const {
    return static_cast<std::size_t>(std::min<std::uint64_t>(kStreamChunkBytes, size_ - chunk * kStreamChunkBytes));
  }
  std::byte* buffer(std::uint64_t chunk) { return buffers_[chunk % kStreamBuffers]->data(); }

  // Reader side.
  void wait_until_free(std::uint64_t chunk) {
    while (true) {
      const std::uint64_t hashed = hashed_.load(std::memory_order_acquire);
      if (chunk < hashed + kStreamBuffers) return;
      hashed_.wait(hashed, std::memory_order_acquire);
    }
  }
  void publish_filled(std::uint64_t chunks) {
    filled_.store(chunks, std::memory_order_release);
    filled_.notify_one();
  }
  // Stops the hasher early (the reader failed); it returns at its next wait.
  void abandon() {
    abandoned_.store(true, std::memory_order_release);
    filled_.store(UINT64_MAX, std::memory_order_release);
    filled_.notify_one();
  }

  // Hasher side: SHA-256 is sequential, so this is the best two cores can do
  // for one stream.
  void hash_all() {
    const std::uint64_t chunks = chunk_count();
    for (std::uint64_t chunk = 0; chunk < chunks; ++chunk) {
      while (true) {
        if (abandoned_.load(std::memory_order_acquire)) return;
        const std::uint64_t filled = filled_.load(std::memory_order_acquire);
        if (chunk < filled) break;
        filled_.wait(filled, std::memory_order_acquire);
      }
      if (abandoned_.load(std::memory_order_acquire)) return;
      hasher_.update(buffer(chunk), chunk_size(chunk));
      hashed_.store(chunk + 1, std::memory_order_release);
      hashed_.notify_one();
    }
  }

  Sha256Digest finish() { return hasher_.finish(); }

 private:
  std::uint64_t size_;
  std::shared_ptr<Buffer> buffers_[kStreamBuffers];
  std::atomic<std::uint64_t> filled_{0};
  std::atomic<std::uint64_t> hashed_{0};
  std::atomic<bool> abandoned_{false};
  Sha256 hasher_;
};

void check_nothing_follows(int fd, std::uint64_t size) {
  std::byte probe;
  if (pread_fully(fd, &probe, 1, size) != 0) {
    fail(ErrorCode::file_changed_during_read, "file grew beyond ", size, " bytes while being read");
  }
}

// A file of one chunk at most: a second thread would cost more than it saves.
Sha256Digest stream_small_file(int fd, std::uint64_t size, const ChunkConsumer& consume,
                               const ReadProgress& progress) {
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  const std::size_t got = pread_fully(fd, bytes.data(), bytes.size(), 0);
  if (got != size) fail(ErrorCode::file_changed_during_read, "file shrank from ", size, " to ", got, " bytes");
  if (consume) consume(0, bytes);
  if (progress) progress(size, size);
  check_nothing_follows(fd, size);
  return Sha256::of(bytes);
}

}  // namespace

Sha256Digest stream_file(int fd, const std::string& label, std::uint64_t size, const ChunkConsumer& consume,
                         const ReadProgress& progress) {
  try {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (size <= kStreamChunkBytes) return stream_small_file(fd, size, consume, progress);
    HashRing ring(size);
    std::thread hash_thread([&ring] { ring.hash_all(); });
    try {
      const std::uint64_t chunks = ring.chunk_count();
      for (std::uint64_t chunk = 0; chunk < chunks; ++chunk) {
        ring.wait_until_free(chunk);
        const std::uint64_t offset = chunk * kStreamChunkBytes;
        const std::size_t want = ring.chunk_size(chunk);
        std::byte* data = ring.buffer(chunk);
        const std::size_t got = pread_fully(fd, data, want, offset);
        if (got != want) {
          fail(ErrorCode::file_changed_during_read, "file shrank from ", size, " to ", offset + got,
               " bytes while being read");
        }
        ring.publish_filled(chunk + 1);
        // The hasher reads the buffer at the same time; neither writes it.
        if (consume) consume(offset, {data, want});
        const std::uint64_t done = offset + want;
        if (progress && (done % kProgressBytes == 0 || done == size)) progress(done, size);
      }
      check_nothing_follows(fd, size);
    } catch (...) {
      ring.abandon();
      hash_thread.join();
      throw;
    }
    hash_thread.join();
    return ring.finish();
  } catch (const Error& error) {
    throw error.with_path(label);
  }
}

}  // namespace holdpoint::io
