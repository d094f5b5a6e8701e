#include "holdpoint/base/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include "base/fail.h"
#include "base/file_descriptor.h"

namespace holdpoint::io {

using detail::fail;

namespace {

constexpr std::size_t kChunkBytes = std::size_t{4} << 20;
constexpr std::size_t kFirstChunkBytes = std::size_t{256} << 10;
// Below this size a second thread costs more than it saves.
constexpr std::size_t kThreadedHashBytes = std::size_t{8} << 20;
constexpr std::size_t kProgressBytes = std::size_t{64} << 20;

// Reads up to `size` bytes at `out`, retrying short reads; returns bytes read
// (less than `size` only at end of file).
std::size_t read_fully(int fd, std::byte* out, std::size_t size, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::io_read_failed, "read failed at offset ", done, ": ", std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

}  // namespace

std::shared_ptr<Buffer> Buffer::allocate(std::size_t size) {
  const std::size_t mapped = std::max<std::size_t>(size, 1);
  void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    fail(ErrorCode::io_read_failed, "cannot allocate ", size, " bytes of private memory: ", std::strerror(errno));
  }
  return std::shared_ptr<Buffer>(new Buffer(static_cast<std::byte*>(memory), size, mapped));
}

std::shared_ptr<Buffer> Buffer::map_file(int fd, std::size_t size) {
  if (size == 0) return allocate(0);
  void* memory = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (memory == MAP_FAILED) {
    fail(ErrorCode::io_read_failed, "cannot map ", size, " bytes of the file: ", std::strerror(errno));
  }
  // One call maps the cached pages instead of one fault per page; kernels
  // before 5.14 ignore the advice and fault on access.
  ::madvise(memory, size, MADV_POPULATE_READ);
  return std::shared_ptr<Buffer>(new Buffer(static_cast<std::byte*>(memory), size, size));
}

Buffer::~Buffer() { ::munmap(data_, mapped_); }

Snapshot read_snapshot(const std::filesystem::path& path, std::uint64_t max_bytes,
                       const std::optional<Sha256Digest>& expected_sha256, const ReadProgress& progress) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    throw Error(ErrorCode::io_open_failed, detail::concat("cannot open: ", std::strerror(errno))).with_path(path.string());
  }
  return read_snapshot_from_fd(fd.get(), path.string(), max_bytes, expected_sha256, progress);
}

Snapshot read_snapshot_from_fd(int raw_fd, const std::string& label, std::uint64_t max_bytes,
                               const std::optional<Sha256Digest>& expected_sha256, const ReadProgress& progress) {
  const std::filesystem::path path(label);
  try {
    struct Borrowed {
      int value;
      int get() const noexcept { return value; }
    } fd{raw_fd};
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0) fail(ErrorCode::io_open_failed, "cannot stat: ", std::strerror(errno));
    if (!S_ISREG(info.st_mode)) fail(ErrorCode::io_not_regular_file, "not a regular file");
    const auto size = static_cast<std::uint64_t>(info.st_size);
    if (size > max_bytes) {
      fail(ErrorCode::file_too_large, "file is ", size, " bytes, above the limit of ", max_bytes,
           " (Limits::max_file_bytes)");
    }
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);

    Snapshot snapshot;
    snapshot.buffer = Buffer::allocate(static_cast<std::size_t>(size));
    std::byte* data = snapshot.buffer->data();
    Sha256 hasher;

    if (size < kThreadedHashBytes) {
      const std::size_t got = read_fully(fd.get(), data, size, path);
      if (got != size) fail(ErrorCode::file_changed_during_read, "file shrank from ", size, " to ", got, " bytes");
      hasher.update(data, size);
      if (progress) progress(size, size);
    } else {
      // The reader (this thread) publishes how far the buffer is filled; the
      // hasher follows behind. SHA-256 is sequential, so this is the best two
      // cores can do for one stream.
      std::atomic<std::size_t> filled{0};
      std::atomic<bool> reader_failed{false};
      std::thread hash_thread([&] {
        std::size_t hashed = 0;
        while (hashed < size) {
          const std::size_t available = filled.load(std::memory_order_acquire);
          if (reader_failed.load(std::memory_order_acquire)) return;
          if (available == hashed) {
            filled.wait(hashed, std::memory_order_acquire);
            continue;
          }
          const std::size_t piece = std::min(available - hashed, kChunkBytes);
          hasher.update(data + hashed, piece);
          hashed += piece;
        }
      });
      try {
        std::size_t done = 0;
        while (done < size) {
          // A small first piece lets the hasher start almost at once.
          const std::size_t chunk = done == 0 ? kFirstChunkBytes : kChunkBytes;
          const std::size_t want = std::min<std::size_t>(chunk, size - done);
          // Faulting the pages in one call is cheaper than faulting them one
          // by one inside read(); kernels before 5.14 ignore the advice.
          ::madvise(data + done, want, MADV_POPULATE_WRITE);
          const std::size_t got = read_fully(fd.get(), data + done, want, path);
          done += got;
          filled.store(done, std::memory_order_release);
          filled.notify_one();
          if (progress && (done % kProgressBytes < want || done == size)) progress(done, size);
          if (got != want) {
            fail(ErrorCode::file_changed_during_read, "file shrank from ", size, " to ", done, " bytes");
          }
        }
      } catch (...) {
        // Move `filled` off any value the hasher may be waiting on.
        reader_failed.store(true, std::memory_order_release);
        filled.store(SIZE_MAX, std::memory_order_release);
        filled.notify_one();
        hash_thread.join();
        throw;
      }
      hash_thread.join();
    }

    std::byte probe;
    if (read_fully(fd.get(), &probe, 1, path) != 0) {
      fail(ErrorCode::file_changed_during_read, "file grew beyond ", size, " bytes while being read");
    }
    snapshot.sha256 = hasher.finish();
    if (expected_sha256 && !(*expected_sha256 == snapshot.sha256)) {
      fail(ErrorCode::sha256_mismatch, "SHA-256 is ", snapshot.sha256.hex(), ", expected ", expected_sha256->hex());
    }
    return snapshot;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

}  // namespace holdpoint::io
