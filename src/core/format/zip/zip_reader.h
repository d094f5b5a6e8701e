// Strict reader for the zip container PyTorch checkpoints use.
//
// read_zip_directory validates the archive structure of docs/format.md ("Zip
// reader checks") over bytes already in memory and returns the entries; it
// never allocates from an unvalidated size and never reads outside `file`.
// verify_zip_crcs then checks every entry's CRC-32. Record-level policy (which
// record names a weights checkpoint may have) is the caller's job.
//
// Failure contract: throws holdpoint::Error with a zip_* code naming the entry
// (index and name) and the offset or bound involved.
//
// Thread-safety: the functions keep no state; a ZipArchive is a plain value
// whose const members (find) may be used from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/format/limits.h"

namespace holdpoint::format {

struct ZipEntry {
  std::string name;    // full name as stored: "archive/data/0"
  std::string record;  // the name without "<archive>/": "data/0"
  std::uint64_t local_header_offset = 0;
  std::uint64_t data_offset = 0;
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
  std::uint16_t flags = 0;
  // One past the last byte of the entry (payload plus data descriptor).
  std::uint64_t end_offset = 0;
};

struct ZipArchive {
  std::string archive_name;       // the common top-level folder
  std::vector<ZipEntry> entries;  // in central directory order
  std::uint64_t central_directory_offset = 0;
  std::uint64_t central_directory_size = 0;
  // A hash table of positions in `entries` + 1 (0: a free slot) by
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

ZipArchive read_zip_directory(std::span<const std::byte> file, const Limits& limits,
                              const EntryNameScreen& screen = {});

// Throws zip_crc_mismatch (or zip_crc_missing for a zero CRC when
// limits.allow_zero_crc is off) for the first entry whose bytes do not match.
void verify_zip_crcs(const ZipArchive& archive, std::span<const std::byte> file, const Limits& limits);

// The payload of `entry` (bounds were checked by read_zip_directory).
inline std::span<const std::byte> zip_entry_bytes(std::span<const std::byte> file, const ZipEntry& entry) {
  return file.subspan(entry.data_offset, entry.size);
}

}  // namespace holdpoint::format
