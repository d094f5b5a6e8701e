// Strict reader for the zip container PyTorch checkpoints use.
//
// read_zip_directory validates the archive structure of docs/format.md ("Zip
// reader checks") and returns the entries; it never allocates from an
// unvalidated size and never reads outside the file. It reads the file
// through a ZipByteSource (bytes in memory, or a file read piece by piece)
// and in two stages that a caller may also run apart:
// read_zip_central_directory (end records and central directory) and
// read_zip_local_entries (local headers, data descriptors, layout).
// verify_zip_crcs then checks every entry's CRC-32. A reader that sees the
// file once as a stream runs the local stage's checks one entry at a time
// (check_local_header_start ... check_data_descriptor; ZipStreamChecker in
// zip_stream_checker.h). Record-level policy (which record names a weights
// checkpoint may have) is the caller's job.
//
// Failure contract: throws holdpoint::Error with a zip_* code naming the entry
// (index and name) and the offset or bound involved.
//
// Thread-safety: the functions keep no state; a ZipArchive is a plain value
// whose const members (find) may be used from several threads at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/format/limits.h"

namespace holdpoint::format {

struct ZipEntry {
  // The full name as stored ("archive/data/0"): a view into the name arena of
  // the ZipArchive it came from (ZipArchive::names), valid while that archive
  // or a copy of it lives. An archive may hold a million entries: one arena,
  // not a heap string each.
  std::string_view name;
  std::uint64_t local_header_offset = 0;
  std::uint64_t data_offset = 0;
  std::uint64_t size = 0;
  // One past the last byte of the entry (payload plus data descriptor).
  std::uint64_t end_offset = 0;
  std::uint32_t crc32 = 0;
  std::uint16_t flags = 0;
  std::uint16_t record_offset = 0;  // where the record name starts in `name`

  // The name without "<archive>/": "data/0", a view into `name`.
  std::string_view record() const { return std::string_view(name).substr(record_offset); }
};

struct ZipArchive {
  std::string archive_name;       // the common top-level folder
  std::vector<ZipEntry> entries;  // in central directory order
  // Every entry's name, back to back. read_zip_directory reserves it once (the
  // names fit in the central directory), so the views never move; copies of
  // the archive share it.
  std::shared_ptr<const std::string> names;
  std::uint64_t central_directory_offset = 0;
  std::uint64_t central_directory_size = 0;
  // A hash table of positions in `entries` (detail::SlotCode in
  // base/keyed_hash.h: 0 a free slot, else position + 1 under a hash tag) by
  // ASCII-lowercased record name, hashed with a key private to the process,
  // so that find() takes constant time (archives may hold a million records,
  // and the .pt reader looks up every storage). read_zip_directory fills it;
  // an archive assembled by hand may leave it empty and find() then scans.
  std::vector<std::uint32_t> record_order;

  // The entry whose record name is exactly `record`, or nullptr.
  const ZipEntry* find(std::string_view record) const;
};

// Called with each central directory entry's raw name as soon as it is in
// bounds, before that entry's other checks, so a caller can name what an
// archive is (a TorchScript archive, say) even when a later check would fail.
// The name is unvalidated bytes; the screen may throw to reject.
using EntryNameScreen = std::function<void(std::string_view name)>;

// Random access to the bytes of a zip file.
class ZipByteSource {
 public:
  virtual ~ZipByteSource() = default;
  virtual std::uint64_t size() const = 0;
  // The bytes [offset, offset + length), which the caller has checked lie
  // inside the file. The span stays valid until the next call of read().
  virtual std::span<const std::byte> read(std::uint64_t offset, std::size_t length) = 0;
  // A hint that `offset` is read soon; only speed, and any offset is allowed.
  virtual void prefetch(std::uint64_t /*offset*/) noexcept {}
  // A hint that [offset, end of file) is read next, before the bytes ahead of
  // it: the end records, then the central directory, are at the end.
  virtual void read_ahead_from(std::uint64_t /*offset*/) {}
};

// A file held in memory, read without copying. For a file still being read
// into that memory, `await` (ParseContext::await_bytes) is called before each
// read and `read_ahead` (ParseContext::read_ahead_from) takes the hints; each
// may be empty.
class ZipMemorySource final : public ZipByteSource {
 public:
  explicit ZipMemorySource(std::span<const std::byte> file,
                           std::function<void(std::uint64_t offset, std::uint64_t size)> await = {},
                           std::function<void(std::uint64_t offset)> read_ahead = {})
      : file_(file), await_(std::move(await)), read_ahead_(std::move(read_ahead)) {}
  std::uint64_t size() const override { return file_.size(); }
  std::span<const std::byte> read(std::uint64_t offset, std::size_t length) override {
    if (await_) await_(offset, length);
    return file_.subspan(offset, length);
  }
  void prefetch(std::uint64_t offset) noexcept override {
    if (offset < file_.size()) __builtin_prefetch(file_.data() + offset);
  }
  void read_ahead_from(std::uint64_t offset) override {
    if (read_ahead_) read_ahead_(offset);
  }

 private:
  std::span<const std::byte> file_;
  std::function<void(std::uint64_t, std::uint64_t)> await_;
  std::function<void(std::uint64_t)> read_ahead_;
};

ZipArchive read_zip_directory(std::span<const std::byte> file, const Limits& limits,
                              const EntryNameScreen& screen = {});
ZipArchive read_zip_directory(ZipByteSource& file, const Limits& limits, const EntryNameScreen& screen = {});

// The first stage: the file starts with a local header, the end records and
// the central directory hold (docs/format.md §3.1–§3.3), names do not repeat.
// Entries come back without data_offset and end_offset.
ZipArchive read_zip_central_directory(ZipByteSource& file, const Limits& limits, const EntryNameScreen& screen = {});
// The second stage (§3.4): every entry's local header and data descriptor in
// directory order (filling data_offset and end_offset), then the layout.
void read_zip_local_entries(ZipByteSource& file, ZipArchive& archive);

// The second stage entry by entry, in any order: for a reader that needs some
// entries before others while the file is still arriving (the records the
// pickle reads first, then each storage as the pickle names it). finish()
// checks the entries not checked yet, in directory order, then the layout. A
// check passes or fails the same way each time, so the error finish() throws
// is the one read_zip_local_entries would have thrown, whatever was checked
// before it.
class ZipLocalEntries {
 public:
  ZipLocalEntries(ZipByteSource& file, ZipArchive& archive)
      : file_(file), archive_(archive), checked_(archive.entries.size()) {}
  // Checks entry `index` (filling its data_offset and end_offset) unless that
  // was done; throws its error.
  void check(std::size_t index);
  // Once it has returned, later calls do nothing.
  void finish();

 private:
  ZipByteSource& file_;
  ZipArchive& archive_;
  std::vector<bool> checked_;
  bool finished_ = false;
};

// ---- the local stage, one step at a time --------------------------------------
// For entry `index` at local header offset `lho` (lho + 30 <= file size):
//
// `fixed`: the 30 bytes at lho. Checks the signature and that the header fits
// the file; returns the whole header's length, 30 + name + extra.
std::size_t check_local_header_start(std::span<const std::byte> fixed, std::uint64_t file_size, std::size_t index,
                                     const ZipEntry& entry);
// `header`: that many bytes at lho. Checks the header against the central
// entry and the payload against `directory_offset`; sets data_offset and
// end_offset (the payload's end). Returns the width of the data descriptor's
// size fields (4 or 8), or 0 when no descriptor follows.
unsigned check_local_header(std::span<const std::byte> header, std::uint64_t directory_offset, std::size_t index,
                            ZipEntry& entry);
// The most bytes a data descriptor of that width can take (with its optional
// signature).
constexpr std::size_t max_data_descriptor_bytes(unsigned width) { return 4 + 4 + 2 * std::size_t{width}; }
// `bytes`: the bytes at the payload's end, max_data_descriptor_bytes(width)
// of them or up to `directory_offset` if that comes first (fewer is enough
// when the descriptor has no signature). Checks the descriptor; sets
// end_offset past it.
void check_data_descriptor(std::span<const std::byte> bytes, unsigned width, std::uint64_t directory_offset,
                           std::size_t index, ZipEntry& entry);
// Entries (data_offset and end_offset set) tile [0, central directory).
void check_zip_layout(const ZipArchive& archive);

// Throws zip_crc_mismatch (or zip_crc_missing for a zero CRC when
// limits.allow_zero_crc is off) for the first entry whose bytes do not match.
void verify_zip_crcs(const ZipArchive& archive, std::span<const std::byte> file, const Limits& limits);
// The same check shared out entry by entry among threads that join when they
// are free: each call of work() checks entries nobody has taken until none is
// left, and finish() (after every work() has returned) throws the failure a
// sequential check would have found first.
class ZipCrcWork {
 public:
  ZipCrcWork(const ZipArchive& archive, std::span<const std::byte> file, const Limits& limits)
      : archive_(archive), file_(file), limits_(limits) {}
  void work();
  void finish() const;
  // Checks entry `index` on this thread, now, and leaves it out of work(): for
  // a caller about to give the entry's pages back. Only before any work().
  void check_now(std::size_t index);

 private:
  void check(std::size_t index);

  const ZipArchive& archive_;
  std::span<const std::byte> file_;
  const Limits& limits_;
  std::atomic<std::size_t> next_{0};
  std::size_t checked_early_ = SIZE_MAX;
  mutable std::mutex failure_mutex_;
  std::optional<std::pair<std::size_t, Error>> failure_;  // the lowest failing index
};
// The same for one entry whose payload's CRC-32 is `actual` (computed by a
// caller that streams the file).
void check_zip_entry_crc(const ZipArchive& archive, std::size_t index, std::uint32_t actual, const Limits& limits);

// The payload of `entry` (bounds were checked by read_zip_directory).
inline std::span<const std::byte> zip_entry_bytes(std::span<const std::byte> file, const ZipEntry& entry) {
  return file.subspan(entry.data_offset, entry.size);
}

}  // namespace holdpoint::format
