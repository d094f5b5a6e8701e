// Private snapshots: a whole file read once into private memory while hashed.
//
// read_snapshot reads the file at `path` exactly once into a buffer no other
// process can change, computing SHA-256 as the bytes arrive (on a second
// thread, so hashing overlaps reading). When an expected digest is given it is
// compared before the function returns. A caller may parse the buffer while
// the file is still read and hashed (SnapshotParser), since the parser is
// built for hostile bytes and only reads; nothing it produced is used unless the digest
// matched, so what callers use comes only from bytes that were hashed and, if
// asked, verified. The file must not change size while it is read.
//
// Failure contract: throws holdpoint::Error (io_open_failed,
// io_not_regular_file, file_too_large, io_read_failed,
// file_changed_during_read, sha256_mismatch) naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "holdpoint/base/sha256.h"

namespace holdpoint::io {

// Page-aligned private memory (an anonymous mapping). A buffer of 8 MiB or
// more starts on a huge-page boundary and asks for transparent huge pages
// (MADV_HUGEPAGE) over its whole huge pages, but only while the kernel's free
// lists hold twice its size in free huge blocks (free_bytes_in_blocks_of on
// /proc/buddyinfo). Filling fresh 4 KiB pages costs a fault, an allocation
// and a zeroing per page, and was the largest cost of a load after SHA-256: an
// 80 MiB read into huge pages took 20 ms here against 70 ms. Without free
// huge blocks, MADV_HUGEPAGE makes the first touch compact memory
// synchronously, which measured up to 4x slower than small pages, so the
// buffer then stays in small pages. The partial huge page at the end stays
// in small pages too, so the resident size is the buffer's, not rounded up.
// In a guest whose balloon driver reports free memory to the host, a huge
// page taken from reported blocks waits for the host on first touch: 2 MiB
// then took 3-7 ms here, 10-30x a warm one and 2-7x as long as 512 small
// pages. populate() measures that and moves the rest of the buffer to small
// pages when it happens (docs/format.md §11). The file is not
// mapped privately and copied on write (MADV_POPULATE_WRITE) instead: 10-20 %
// faster to fill, but the mapping keeps the file's inode, so a generation
// that retention deletes would hold its disk space for as long as any tensor
// views the snapshot.
class Buffer {
 public:
  static std::shared_ptr<Buffer> allocate(std::size_t size);
  // The first `size` bytes of the open file `fd`, mapped privately: reads
  // share the page cache, writes copy (the file never changes).
  static std::shared_ptr<Buffer> map_file(int fd, std::size_t size);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() noexcept { return {data_, size_}; }

  // The least rate, in bytes per second, at which populate() accepts fresh
  // huge pages: 2 MiB per millisecond. Warm huge pages fill at 5-12 GB/s
  // here and small pages at 1.6-2 GB/s; huge pages the host must first bring
  // back fill at 0.3-1 GB/s.
  static constexpr double kSlowestHugePageFill = 2e9;

  // Faults in [offset, offset + size) for writing, in one call per range
  // (MADV_POPULATE_WRITE; kernels before 5.14 ignore it and the pages fault
  // on first write instead). Where that range brought in fresh huge pages
  // slower than `slowest_huge_page_fill` bytes per second of this thread's
  // CPU time (a wait for a core is not a slow fill), the huge pages
  // not yet touched are given up (MADV_NOHUGEPAGE) and the rest of the
  // buffer fills in small pages: the free huge blocks are then ones the host
  // took back, and each further one would cost as much. Call it in
  // ascending order of offset, from one thread.
  void populate(std::size_t offset, std::size_t size, double slowest_huge_page_fill = kSlowestHugePageFill);
  // Faults in [offset, offset + size) in small pages, outside populate()'s
  // ascending order: for a range read ahead of its turn, such as a zip
  // archive's central directory at the end of the file. The huge pages it
  // touches and populate() has not reached are given up first, so that a
  // range far ahead costs no huge page faults and leaves populate()'s measure
  // alone.
  void populate_apart(std::size_t offset, std::size_t size);
  // The huge-page size the untouched rest of the buffer asks for; 0 where it
  // is (or fell back to) small pages.
  std::size_t huge_page_bytes() const noexcept { return huge_; }

 private:
  Buffer(std::byte* data, std::size_t size, std::size_t mapped, std::size_t huge = 0)
      : data_(data), size_(size), mapped_(mapped), huge_(huge) {}
  std::byte* data_;
  std::size_t size_;
  std::size_t mapped_;
  std::size_t huge_;           // 0: small pages
  std::size_t huge_end_ = 0;   // where the huge pages populate() has faulted in end
};

// Returns the memory pages wholly inside [data, data + size) to the kernel
// (madvise MADV_DONTNEED); they read as zeros (or, in a Buffer::map_file
// mapping, as the file) afterwards. For bytes of a Buffer nothing will read
// again; a range without a whole page is left alone.
void release_whole_pages(const std::byte* data, std::size_t size) noexcept;

// The bytes that `buddyinfo` (the text of /proc/buddyinfo: per zone, the
// count of free blocks of 2^k pages of `page` bytes, for k = 0, 1, ...)
// counts in free blocks of at least `block` bytes. Lines it cannot read add
// nothing.
std::uint64_t free_bytes_in_blocks_of(std::string_view buddyinfo, std::size_t block, std::size_t page);

struct Snapshot {
  std::shared_ptr<Buffer> buffer;
  // The file's SHA-256; all zeros when the read was asked to skip the hash
  // (Hashing::when_expected with no expected digest), which `hashed` says.
  Sha256Digest sha256;
  bool hashed = true;
};

// Whether read_snapshot computes the file's SHA-256. `when_expected` skips it
// when there is no expected digest to check: the read then costs a read,
// not a read plus a hash pass (a load that only checks structure and CRCs).
enum class Hashing { always, when_expected };

// Called on the reading thread with (bytes read, file size) every few dozen
// MiB of a large file, and once at the end.
using ReadProgress = std::function<void(std::uint64_t done, std::uint64_t total)>;

// What read_snapshot hands a SnapshotParser along with the buffer. Every
// function may be called from any thread, any number of times.
struct SnapshotReading {
  // Returns once the file's SHA-256 is known (or, with the hash skipped,
  // once every byte is read), and so once every byte is in the buffer;
  // throws sha256_mismatch where it differs from the expected one. A parser
  // calls it before it writes anything into the buffer.
  std::function<void()> await_digest;
  // How many bytes from the start of the buffer the hasher has taken in so
  // far (with the hash skipped, how many are read in order): it only grows,
  // and is the buffer's size once await_digest has returned. A parser that gives pages back (MADV_DONTNEED, which turns them
  // into zeros) may do so only below it.
  std::function<std::size_t()> bytes_hashed;
  // Returns once [offset, offset + size) (cut at the buffer's end) holds the
  // file's bytes. The reader goes on meanwhile; if it fails, this throws its
  // error. A parser reads no byte it has not awaited.
  std::function<void(std::uint64_t offset, std::uint64_t size)> await_bytes;
  // Asks the reader to read [offset, end of file) next, ahead of the bytes
  // before it that it has not reached: for a format whose index is at the
  // end, as a zip archive's central directory is. Only order changes; each
  // byte is still read once, and hashed in file order.
  std::function<void(std::uint64_t offset)> read_ahead_from;

  // For a buffer that already holds every byte, hashed and checked.
  static SnapshotReading complete(std::size_t size);
};

// Parses the buffer while the file is still being read and hashed; the
// parser runs on the calling thread. A large file (8 MiB and more) is read by
// a thread of its own where the machine has three cores or more, so parsing
// overlaps reading as well as hashing; on fewer, the parser's thread reads as
// far as each await_bytes needs (src/core/base/reader_thread.h). A small file
// is read first. Whatever the parser produces must not be used
// unless read_snapshot returns normally. A failed read is reported first,
// then a digest mismatch, then the parser's own error.
using SnapshotParser = std::function<void(const std::shared_ptr<Buffer>& buffer, const SnapshotReading& reading)>;

Snapshot read_snapshot(const std::filesystem::path& path, std::uint64_t max_bytes,
                       const std::optional<Sha256Digest>& expected_sha256 = std::nullopt,
                       const ReadProgress& progress = {}, const SnapshotParser& parse = {},
                       Hashing hashing = Hashing::always);

// The same from an open descriptor (not closed here); `label` names the file
// in errors.
Snapshot read_snapshot_from_fd(int fd, const std::string& label, std::uint64_t max_bytes,
                               const std::optional<Sha256Digest>& expected_sha256 = std::nullopt,
                               const ReadProgress& progress = {}, const SnapshotParser& parse = {},
                               Hashing hashing = Hashing::always);

}  // namespace holdpoint::io
