#include "holdpoint/base/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <exception>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "base/fail.h"
#include "base/file_stream.h"
#include "base/reader_thread.h"
#include "base/regular_file.h"

namespace holdpoint::io {

using detail::fail;

std::atomic<ReaderThread> reader_thread_mode{ReaderThread::by_cores};

bool cores_for_reading_while_parsing() {
  static const bool enough = std::thread::hardware_concurrency() >= 3;
  return enough;
}

namespace {

constexpr std::size_t kChunkBytes = std::size_t{4} << 20;
constexpr std::size_t kFirstChunkBytes = std::size_t{256} << 10;
// A chunk is read in pieces of this size; a parser's request for the file's
// end (read_ahead_from) is served between them.
constexpr std::size_t kReadPieceBytes = std::size_t{1} << 20;
// Below this size a second thread costs more than it saves.
constexpr std::size_t kThreadedHashBytes = std::size_t{8} << 20;
constexpr std::size_t kProgressBytes = std::size_t{64} << 20;
// Smaller buffers gain too little from huge pages to pay for reading the
// kernel's free lists.
constexpr std::size_t kHugePageMinimumBytes = std::size_t{8} << 20;

// The whole text of a small kernel file; empty when it cannot be read.
std::string file_text(const char* path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// Transparent huge pages: the size the kernel maps anonymous memory with
// (hpage_pmd_size), or 0 when they are off.
std::size_t transparent_huge_page_bytes() {
  const std::string modes = file_text("/sys/kernel/mm/transparent_hugepage/enabled");
  if (modes.find("[never]") != std::string::npos || modes.empty()) return 0;
  std::ifstream size_file("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  std::size_t bytes = 0;
  if (!(size_file >> bytes) || bytes == 0 || (bytes & (bytes - 1)) != 0) return 0;
  // Kernels from 6.8 on can turn one size off on its own.
  const std::string per_size =
      "/sys/kernel/mm/transparent_hugepage/hugepages-" + std::to_string(bytes / 1024) + "kB/enabled";
  if (file_text(per_size.c_str()).find("[never]") != std::string::npos) return 0;
  return bytes;
}

// The huge-page size to back a buffer of `size` bytes with, or 0 for small
// pages. Filling fresh memory costs a fault, a page allocation and a zeroing
// per page; a huge page does that once per 512 small ones (a 80 MiB read was
// 3x faster here). They are asked for only while the free lists already hold
// twice the buffer in whole huge blocks: under MADV_HUGEPAGE a fault that
// finds none compacts memory synchronously, which measured 4x slower than
// small pages.
std::size_t huge_page_bytes_for(std::size_t size) {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  static const std::size_t huge = transparent_huge_page_bytes();
  if (huge == 0 || size < kHugePageMinimumBytes) return 0;
  return free_bytes_in_blocks_of(file_text("/proc/buddyinfo"), huge, page) >= 2 * std::uint64_t{size} ? huge : 0;
}

// The CPU time this thread has used. A fill is timed by it, not by the wall
// clock: a thread that waits for a core while others run (a parser beside the
// reader and the hasher) has not filled slowly, while a fault the host makes
// the guest wait for still counts.
double thread_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

}  // namespace

std::shared_ptr<Buffer> Buffer::allocate(std::size_t size) {
  static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t kept = (std::max<std::size_t>(size, 1) + page - 1) / page * page;
  const std::size_t huge = huge_page_bytes_for(size);
  // Room to move the start to a huge-page boundary, where the kernel can map
  // whole huge pages.
  const std::size_t reserved = kept + huge;
  void* memory = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    fail(ErrorCode::io_read_failed, "cannot allocate ", size, " bytes of private memory: ", std::strerror(errno));
  }
  auto* data = static_cast<std::byte*>(memory);
  if (huge != 0) {
    const auto start = reinterpret_cast<std::uintptr_t>(data);
    const std::size_t head = (huge - start % huge) % huge;
    if (head != 0) ::munmap(data, head);
    if (reserved - head - kept != 0) ::munmap(data + head + kept, reserved - head - kept);
    data += head;
    // Only the whole huge pages: the partial one at the end stays in small
    // pages, so the resident size is the buffer's, not rounded up.
    ::madvise(data, size / huge * huge, MADV_HUGEPAGE);
  }
  return std::shared_ptr<Buffer>(new Buffer(data, size, kept, huge));
}

void Buffer::populate(std::size_t offset, std::size_t size, double slowest_huge_page_fill) {
  if (offset >= size_) return;
  size = std::min(size, size_ - offset);
  const double start = thread_seconds();
  ::madvise(data_ + offset, size, MADV_POPULATE_WRITE);
  if (huge_ == 0) return;
  const double seconds = thread_seconds() - start;
  // The kernel faults whole huge pages in: the range's last one is whole too.
  const std::size_t advised = size_ / huge_ * huge_;
  const std::size_t end = std::min(advised, (offset + size + huge_ - 1) / huge_ * huge_);
  const std::size_t fresh = end > huge_end_ ? end - huge_end_ : 0;
  huge_end_ = std::max(huge_end_, end);
  if (fresh == 0 || seconds * slowest_huge_page_fill <= static_cast<double>(fresh)) return;
  // Advisory, like MADV_HUGEPAGE: a failure leaves huge pages, which is only
  // speed.
  if (advised > huge_end_) ::madvise(data_ + huge_end_, advised - huge_end_, MADV_NOHUGEPAGE);
  huge_ = 0;
}

void Buffer::populate_apart(std::size_t offset, std::size_t size) {
  if (offset >= size_) return;
  size = std::min(size, size_ - offset);
  if (huge_ != 0) {
    const std::size_t advised = size_ / huge_ * huge_;
    const std::size_t first = std::max(huge_end_, offset / huge_ * huge_);
    const std::size_t last = std::min(advised, (offset + size + huge_ - 1) / huge_ * huge_);
    if (last > first) ::madvise(data_ + first, last - first, MADV_NOHUGEPAGE);
  }
  ::madvise(data_ + offset, size, MADV_POPULATE_WRITE);
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

std::uint64_t free_bytes_in_blocks_of(std::string_view buddyinfo, std::size_t block, std::size_t page) {
  std::uint64_t total = 0;
  std::istringstream lines{std::string(buddyinfo)};
  std::string line;
  while (std::getline(lines, line)) {
    // "Node 0, zone   Normal  14611   6449 ..."
    const std::size_t zone = line.find("zone");
    if (zone == std::string::npos) continue;
    std::istringstream fields(line.substr(zone + 4));
    std::string zone_name;
    fields >> zone_name;
    std::uint64_t count = 0;
    for (unsigned order = 0; order < 40 && fields >> count; ++order) {
      const std::uint64_t block_bytes = std::uint64_t{page} << order;
      if (block_bytes >= block && count <= UINT64_MAX / block_bytes) total += count * block_bytes;
    }
  }
  return total;
}

void release_whole_pages(const std::byte* data, std::size_t size) noexcept {
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + size) / page * page;
  // Advisory: a failure leaves the pages resident, which is only memory.
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

Snapshot read_snapshot(const std::filesystem::path& path, std::uint64_t max_bytes,
                       const std::optional<Sha256Digest>& expected_sha256, const ReadProgress& progress,
                       const SnapshotParser& parse, Hashing hashing) {
  const RegularFile file = open_regular_for_reading(path);
  return read_snapshot_from_fd(file.fd.get(), path.string(), max_bytes, expected_sha256, progress, parse, hashing);
}

namespace {

// The reading half of read_snapshot_from_fd: fills the buffer from `fd`
// while a second thread hashes behind it (large files) or hashes after it
// (small ones). A large file's bytes are read in order, except that a parser
// may ask for the file's end first (read_ahead_from): the reader then reads
// [tail, end) at its next chunk and stops its in-order pass at `tail`. Each
// byte is read exactly once, so what the parser sees is what is hashed.
class SnapshotReader {
 public:
  // With `hash` false nothing is hashed: the reader only reads, and
  // hashed() follows the in-order read.
  SnapshotReader(int fd, Buffer& buffer, const ReadProgress& progress, bool hash)
      : fd_(fd), buffer_(buffer), data_(buffer.data()), size_(buffer.size()), progress_(progress), hash_(hash),
        tail_(size_), tail_wanted_(size_) {}
  ~SnapshotReader() {
    if (read_thread_.joinable()) read_thread_.join();
    stop_hashing();
  }

  // Reads the whole file on this thread.
  void read() {
    if (size_ < kThreadedHashBytes) {
      read_small();
      return;
    }
    if (hash_) hash_thread_ = std::thread([this] { hash_loop(); });
    try {
      read_in_order();
    } catch (...) {
      stop_hashing();
      throw;
    }
  }

  // Starts reading for a parser that runs meanwhile. A small file is read at
  // once. A large one is read by a thread of its own where the machine has a
  // core each for the reader, the hasher and the parser; on fewer, a third
  // busy thread would take CPU from the hasher, so the parser's own thread
  // reads instead, as far as each await_bytes needs (and the rest in
  // finish_read): reading and parsing then alternate beside the hasher.
  void start_reading() {
    if (size_ < kThreadedHashBytes) {
      read();
      return;
    }
    if (hash_) hash_thread_ = std::thread([this] { hash_loop(); });
    const ReaderThread mode = reader_thread_mode.load(std::memory_order_relaxed);
    if (mode == ReaderThread::never || (mode == ReaderThread::by_cores && !cores_for_reading_while_parsing())) {
      pulled_ = true;
      return;
    }
    read_thread_ = std::thread([this] {
      try {
        read_in_order();
      } catch (...) {
        const std::lock_guard lock(mutex_);
        read_failure_ = std::current_exception();
      }
      {
        const std::lock_guard lock(mutex_);
        read_done_ = true;
      }
      changed_.notify_all();
    });
  }

  // Joins the reading thread and rethrows its failure.
  void finish_read() {
    if (read_thread_.joinable()) read_thread_.join();
    if (pulled_) pull(size_, 0);
    if (read_failure_) {
      stop_hashing();
      std::rethrow_exception(read_failure_);
    }
  }

  void await_bytes(std::uint64_t offset, std::uint64_t size) {
    if (offset >= size_) return;
    const std::uint64_t end = offset + std::min<std::uint64_t>(size, size_ - offset);
    if (covered(offset, end)) return;
    if (pulled_) {
      pull(offset, end);
      if (read_failure_) std::rethrow_exception(read_failure_);
      return;
    }
    std::unique_lock lock(mutex_);
    // The reader wakes waiters only once the in-order pass has reached what
    // they wait for: a wake per chunk would take a core from it and the
    // hasher each time.
    ++waiters_;
    wake_at_ = std::min<std::uint64_t>(wake_at_, end);
    changed_.wait(lock, [&] { return read_done_ || covered(offset, end); });
    if (--waiters_ == 0) wake_at_ = UINT64_MAX;
    if (read_failure_) std::rethrow_exception(read_failure_);
  }

  void read_ahead_from(std::uint64_t offset) {
    const auto wanted = static_cast<std::size_t>(std::min<std::uint64_t>(offset, size_));
    std::size_t current = tail_wanted_.load(std::memory_order_relaxed);
    while (wanted < current && !tail_wanted_.compare_exchange_weak(current, wanted, std::memory_order_release)) {
    }
  }

  // How far the hasher has got (SnapshotReading::bytes_hashed).
  std::size_t hashed() const { return hashed_.load(std::memory_order_acquire); }

  // The file's digest, or nothing when the reader does not hash.
  std::optional<Sha256Digest> finish_hash() {
    if (hash_thread_.joinable()) hash_thread_.join();
    hashed_.store(size_, std::memory_order_release);
    if (hash_ && !digest_) digest_ = hasher_.finish();
    return digest_;
  }

 private:
  void read_small() {
    const std::size_t got = read_at(0, size_);
    if (got != size_) fail(ErrorCode::file_changed_during_read, "file shrank from ", size_, " to ", got, " bytes");
    if (hash_) hasher_.update(data_, size_);
    hashed_.store(size_, std::memory_order_release);
    in_order_.store(size_, std::memory_order_release);
    if (progress_) progress_(size_, size_);
    check_no_more_bytes();
  }

  // The reader publishes how far the buffer is filled from the start; the
  // hasher follows behind. SHA-256 is sequential, so this is the best two
  // cores can do for one stream.
  void read_in_order() {
    while (read_step()) {
    }
    check_no_more_bytes();
  }

  // Reads on the calling thread until [offset, end) is in, or, with end 0,
  // to the end of the file. A failure is kept for finish_read.
  void pull(std::uint64_t offset, std::uint64_t end) {
    const std::lock_guard lock(pull_mutex_);
    if (read_done_) return;
    try {
      while (end == 0 || !covered(offset, end)) {
        if (read_step()) continue;
        check_no_more_bytes();
        read_done_ = true;
        return;
      }
    } catch (...) {
      read_failure_ = std::current_exception();
      read_done_ = true;
    }
  }

  // Reads a request for the file's end, if one came in, and the next chunk
  // in order; false once every byte is in.
  bool read_step() {
    read_tail_if_wanted(done_);
    const std::size_t tail = tail_.load(std::memory_order_relaxed);
    if (done_ >= tail) return false;
    // A small first piece lets the hasher start almost at once.
    const std::size_t chunk = done_ == 0 ? kFirstChunkBytes : kChunkBytes;
    const std::size_t want = std::min<std::size_t>(chunk, tail - done_);
    // Faulting the pages in one call is cheaper than faulting them one by
    // one inside read().
    buffer_.populate(done_, want);
    // In pieces, so that a request for the end waits for one piece at most;
    // the chunk lies below any request served here.
    for (std::size_t piece = 0; piece < want; piece += kReadPieceBytes) {
      if (piece != 0) read_tail_if_wanted(done_ + want);
      const std::size_t length = std::min(kReadPieceBytes, want - piece);
      const std::size_t got = read_at(done_ + piece, length);
      if (got != length) {
        fail(ErrorCode::file_changed_during_read, "file shrank from ", size_, " to ", done_ + piece + got, " bytes");
      }
    }
    done_ += want;
    publish(done_);
    const std::size_t total = done_ + (size_ - tail_.load(std::memory_order_relaxed));
    if (progress_ && (total / kProgressBytes != reported_ / kProgressBytes || total == size_)) {
      progress_(total, size_);
      reported_ = total;
    }
    return done_ < tail_.load(std::memory_order_relaxed);
  }

  // Serves a request for the file's end, if one came in: the bytes from the
  // request to the current tail, read now, ahead of their turn. `reached` is
  // where the in-order pass will have read to before it looks again.
  void read_tail_if_wanted(std::size_t reached) {
    const std::size_t tail = tail_.load(std::memory_order_relaxed);
    const std::size_t wanted = tail_wanted_.load(std::memory_order_acquire);
    // A request the in-order pass is about to reach is left to it.
    if (wanted >= tail || wanted <= reached + kChunkBytes) return;
    buffer_.populate_apart(wanted, tail - wanted);
    const std::size_t got = read_at(wanted, tail - wanted);
    if (got != tail - wanted) {
      fail(ErrorCode::file_changed_during_read, "file shrank from ", size_, " to ", wanted + got, " bytes");
    }
    {
      const std::lock_guard lock(mutex_);
      tail_.store(wanted, std::memory_order_release);
    }
    changed_.notify_all();
  }

  void publish(std::size_t done) {
    const std::size_t tail = tail_.load(std::memory_order_relaxed);
    bool wake = false;
    {
      const std::lock_guard lock(mutex_);
      in_order_.store(done, std::memory_order_release);
      wake = waiters_ > 0 && (done >= wake_at_ || done >= tail);
    }
    if (wake) changed_.notify_all();
    // The hasher may run on to the end once the in-order pass meets the tail.
    const std::size_t filled = done >= tail ? size_ : done;
    if (!hash_) {
      hashed_.store(filled, std::memory_order_release);
      return;
    }
    filled_.store(filled, std::memory_order_release);
    filled_.notify_one();
  }

  bool covered(std::uint64_t offset, std::uint64_t end) const {
    const std::size_t in_order = in_order_.load(std::memory_order_acquire);
    const std::size_t tail = tail_.load(std::memory_order_acquire);
    return end <= in_order || offset >= tail || in_order >= tail;
  }

  std::size_t read_at(std::size_t offset, std::size_t size) { return pread_fully(fd_, data_ + offset, size, offset); }

  void check_no_more_bytes() {
    std::byte probe;
    if (pread_fully(fd_, &probe, 1, size_) != 0) {
      fail(ErrorCode::file_changed_during_read, "file grew beyond ", size_, " bytes while being read");
    }
  }

  void hash_loop() {
    std::size_t hashed = 0;
    while (hashed < size_) {
      const std::size_t available = filled_.load(std::memory_order_acquire);
      if (stopping_.load(std::memory_order_acquire)) return;
      if (available == hashed) {
        filled_.wait(hashed, std::memory_order_acquire);
        continue;
      }
      const std::size_t piece = std::min(available - hashed, kChunkBytes);
      hasher_.update(data_ + hashed, piece);
      hashed += piece;
      hashed_.store(hashed, std::memory_order_release);
    }
  }

  // Moves `filled_` off any value the hasher may be waiting on, and joins it.
  void stop_hashing() noexcept {
    if (!hash_thread_.joinable()) return;
    stopping_.store(true, std::memory_order_release);
    filled_.store(SIZE_MAX, std::memory_order_release);
    filled_.notify_one();
    hash_thread_.join();
  }

  int fd_;
  Buffer& buffer_;
  std::byte* data_;
  std::size_t size_;
  const ReadProgress& progress_;
  const bool hash_;
  Sha256 hasher_;
  std::optional<Sha256Digest> digest_;
  std::atomic<std::size_t> filled_{0};    // the prefix the hasher may take
  std::atomic<std::size_t> hashed_{0};
  std::atomic<bool> stopping_{false};
  std::thread hash_thread_;

  // Reading on a thread of its own (start_reading).
  std::mutex mutex_;
  std::condition_variable changed_;       // in_order_, tail_ or read_done_ moved
  std::atomic<std::size_t> in_order_{0};  // [0, in_order_) is read
  std::atomic<std::size_t> tail_;         // [tail_, size_) is read
  std::atomic<std::size_t> tail_wanted_;  // the lowest read_ahead_from asked for
  std::size_t done_ = 0;                  // the in-order pass's position (its thread's)
  std::size_t reported_ = 0;              // bytes last reported to progress_
  bool pulled_ = false;                   // no reading thread: await_bytes reads
  std::mutex pull_mutex_;                 // one thread pulls at a time
  std::size_t waiters_ = 0;               // threads in await_bytes
  std::uint64_t wake_at_ = UINT64_MAX;    // the least in-order end they wait for
  bool read_done_ = false;
  std::exception_ptr read_failure_;
  std::thread read_thread_;
};

}  // namespace

SnapshotReading SnapshotReading::complete(std::size_t size) {
  SnapshotReading reading;
  reading.await_digest = [] {};
  reading.bytes_hashed = [size] { return size; };
  reading.await_bytes = [](std::uint64_t, std::uint64_t) {};
  reading.read_ahead_from = [](std::uint64_t) {};
  return reading;
}

Snapshot read_snapshot_from_fd(int fd, const std::string& label, std::uint64_t max_bytes,
                               const std::optional<Sha256Digest>& expected_sha256, const ReadProgress& progress,
                               const SnapshotParser& parse, Hashing hashing) {
  const std::filesystem::path path(label);
  try {
    struct stat info {};
    if (::fstat(fd, &info) != 0) fail(ErrorCode::io_open_failed, "cannot stat: ", std::strerror(errno));
    if (!S_ISREG(info.st_mode)) fail(ErrorCode::io_not_regular_file, "not a regular file");
    const auto size = static_cast<std::uint64_t>(info.st_size);
    if (size > max_bytes) {
      fail(ErrorCode::file_too_large, "file is ", size, " bytes, above the limit of ", max_bytes,
           " (Limits::max_file_bytes)");
    }
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);

    Snapshot snapshot;
    snapshot.buffer = Buffer::allocate(static_cast<std::size_t>(size));
    const bool hash = hashing == Hashing::always || expected_sha256.has_value();
    SnapshotReader reader(fd, *snapshot.buffer, progress, hash);
    // Takes the reader's digest into the snapshot and checks it.
    const auto take_digest = [&] {
      const std::optional<Sha256Digest> digest = reader.finish_hash();
      snapshot.hashed = digest.has_value();
      if (!digest) return;
      snapshot.sha256 = *digest;
      if (expected_sha256 && !(*expected_sha256 == snapshot.sha256)) {
        fail(ErrorCode::sha256_mismatch, "SHA-256 is ", snapshot.sha256.hex(), ", expected ", expected_sha256->hex());
      }
    };
    if (!parse) {
      reader.read();
      take_digest();
      return snapshot;
    }
    reader.start_reading();
    // Thread-safe: a helper thread of the parser may wait here too.
    std::mutex digest_mutex;
    const auto check_digest = [&] {
      const std::lock_guard lock(digest_mutex);
      reader.finish_read();
      take_digest();
    };
    // The parser runs while the reader and the hasher go on: it reads the
    // same private bytes they fill and hash, each only once it is in, and its
    // result is handed out only below, once the digest is known and matched.
    // A failed read, then a digest mismatch, is reported ahead of anything
    // the parser found, since the bytes are not the expected ones.
    SnapshotReading reading;
    reading.await_digest = check_digest;
    reading.bytes_hashed = [&reader] { return reader.hashed(); };
    reading.await_bytes = [&reader](std::uint64_t offset, std::uint64_t length) { reader.await_bytes(offset, length); };
    reading.read_ahead_from = [&reader](std::uint64_t offset) { reader.read_ahead_from(offset); };
    std::exception_ptr parse_failure;
    try {
      parse(snapshot.buffer, reading);
    } catch (...) {
      parse_failure = std::current_exception();
    }
    check_digest();
    if (parse_failure) std::rethrow_exception(parse_failure);
    return snapshot;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

}  // namespace holdpoint::io
