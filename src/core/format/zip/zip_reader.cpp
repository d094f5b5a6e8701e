#include "format/zip/zip_reader.h"

#include <algorithm>
#include <bit>
#include <optional>
#include <thread>
#include <utility>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "base/keyed_hash.h"
#include "format/zip/zip_format.h"
#include "format/zip/zip_names.h"
#include "base/crc32.h"

namespace holdpoint::format {
namespace {

using detail::fail;

// Bytes [base, base + bytes.size()) of the file, read through a ZipByteSource;
// fields are addressed by their offset in the file.
struct FileWindow {
  std::span<const std::byte> bytes;
  std::uint64_t base = 0;

  std::span<const std::byte> at(std::uint64_t offset, std::uint64_t size) const {
    return bytes.subspan(offset - base, size);
  }
};

// Readers of little-endian fields. Callers have checked that the field lies
// inside `bytes` (or the window).
std::uint64_t load_le(std::span<const std::byte> bytes, std::uint64_t offset, int width) {
  std::uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<std::uint8_t>(bytes[offset + i]);
  return value;
}
std::uint64_t load_le(const FileWindow& window, std::uint64_t offset, int width) {
  return load_le(window.bytes, offset - window.base, width);
}
template <typename Bytes>
std::uint16_t load_u16(const Bytes& bytes, std::uint64_t offset) {
  return static_cast<std::uint16_t>(load_le(bytes, offset, 2));
}
template <typename Bytes>
std::uint32_t load_u32(const Bytes& bytes, std::uint64_t offset) {
  return static_cast<std::uint32_t>(load_le(bytes, offset, 4));
}
template <typename Bytes>
std::uint64_t load_u64(const Bytes& bytes, std::uint64_t offset) {
  return load_le(bytes, offset, 8);
}

std::string_view text_at(const FileWindow& window, std::uint64_t offset, std::uint64_t size) {
  const auto bytes = window.at(offset, size);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A name as it may appear in a message: hostile names can hold control bytes
// or be hundreds of bytes long.
std::string printable(std::string_view name) {
  constexpr std::size_t kShown = 80;
  std::string out;
  for (std::size_t i = 0; i < name.size() && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7F || c == '\\') {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (name.size() > kShown) out += "...";
  return out;
}

std::string entry_label(std::size_t index, std::string_view name) {
  return detail::concat("zip entry ", index, " '", printable(name), "'");
}

// The size of ZipArchive::record_order for `count` entries: a power of two at
// least twice the count, so that probes stay short and always reach a free slot.
std::size_t record_index_size(std::size_t count) { return std::max<std::size_t>(16, std::bit_ceil(2 * count)); }

// ---- names ---------------------------------------------------------------------

void check_name_characters(std::size_t index, std::string_view name) {
  const std::string problem = zip::name_character_problem(name);
  if (!problem.empty()) fail(ErrorCode::zip_name_invalid, entry_label(index, name), ": ", problem);
}

void check_component(std::size_t index, std::string_view name, std::string_view component) {
  if (!zip::is_valid_path_component(component)) {
    fail(ErrorCode::zip_name_invalid, entry_label(index, name), ": path component '", component,
         "' is empty, '.' or '..'");
  }
}

// `rest` is the part after the archive folder; it is a record name.
void check_record_components(std::size_t index, std::string_view name, std::string_view rest) {
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = rest.find('/', start);
    check_component(index, name, rest.substr(start, slash == std::string_view::npos ? slash : slash - start));
    if (slash == std::string_view::npos) return;
    start = slash + 1;
  }
}

// ---- extra fields --------------------------------------------------------------

struct ExtraBlocks {
  std::optional<std::span<const std::byte>> zip64;  // the block's data
};

// Walks (id, length, data) blocks; only zip64 and (in local headers) PyTorch's
// "FB" padding are allowed, each at most once, and the blocks must fill the
// field exactly. Padding must be the 'Z' bytes PyTorch writes, so that no
// byte of the file can carry anything the reader does not account for.
ExtraBlocks parse_extra(std::span<const std::byte> extra, std::size_t index, std::string_view name,
                        const char* where, bool padding_allowed) {
  ExtraBlocks blocks;
  bool seen_padding = false;
  std::size_t pos = 0;
  while (pos < extra.size()) {
    if (extra.size() - pos < zip::kExtraBlockHeaderSize) {
      fail(ErrorCode::zip_extra_field_invalid, entry_label(index, name), ": ", where, " extra field has ",
           extra.size() - pos, " stray bytes at offset ", pos);
    }
    const std::uint16_t id = load_u16(extra, pos);
    const std::uint16_t length = load_u16(extra, pos + 2);
    pos += zip::kExtraBlockHeaderSize;
    if (length > extra.size() - pos) {
      fail(ErrorCode::zip_extra_field_invalid, entry_label(index, name), ": ", where, " extra block 0x", std::hex,
           id, std::dec, " claims ", length, " bytes but ", extra.size() - pos, " remain");
    }
    if (id == zip::kZip64ExtraId && !blocks.zip64) {
      blocks.zip64 = extra.subspan(pos, length);
    } else if (id == zip::kPaddingExtraId && padding_allowed && !seen_padding) {
      seen_padding = true;
      const auto padding = extra.subspan(pos, length);
      if (std::any_of(padding.begin(), padding.end(), [](std::byte b) { return b != zip::kPaddingByte; })) {
        fail(ErrorCode::zip_extra_field_invalid, entry_label(index, name), ": ", where,
             " padding block holds bytes other than 'Z'");
      }
    } else {
      fail(ErrorCode::zip_extra_field_invalid, entry_label(index, name), ": ", where, " extra block 0x", std::hex,
           id, std::dec, " is repeated or not one PyTorch writes there (zip64 0x0001; padding 0x4246 in local headers only)");
    }
    pos += length;
  }
  return blocks;
}

// ---- end records ---------------------------------------------------------------

struct DirectoryBounds {
  std::uint64_t entry_count = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  // Where the directory must end: the zip64 end record, or the end record.
  std::uint64_t end = 0;
};

DirectoryBounds read_end_records(ZipByteSource& source) {
  const std::uint64_t file_size = source.size();
  if (file_size < zip::kEndSize) {
    fail(ErrorCode::zip_eocd_missing, "zip file of ", file_size, " bytes is too short for an end record");
  }
  const std::uint64_t end_offset = file_size - zip::kEndSize;
  const FileWindow file{source.read(end_offset, zip::kEndSize), end_offset};
  if (load_u32(file, end_offset) != zip::kEndSignature) {
    // Tell "an end record followed by a comment or junk" from "no end record
    // at all"; a comment is at most 65535 bytes, which bounds the scan. The
    // window holds every 4-byte probe, the last one ending inside the
    // would-be end record.
    const std::uint64_t lowest = end_offset > 0xFFFF ? end_offset - 0xFFFF : 0;
    const FileWindow scan{source.read(lowest, end_offset + 3 - lowest), lowest};
    for (std::uint64_t at = end_offset; at-- > lowest;) {
      if (load_u32(scan, at) == zip::kEndSignature) {
        fail(ErrorCode::zip_trailing_data, "zip end record at offset ", at, " is followed by ",
             file_size - at - zip::kEndSize, " bytes (a comment or trailing data)");
      }
    }
    fail(ErrorCode::zip_eocd_missing, "no zip end record at offset ", end_offset, " (file size ", file_size, ")");
  }
  const std::uint16_t disk = load_u16(file, end_offset + 4);
  const std::uint16_t directory_disk = load_u16(file, end_offset + 6);
  const std::uint16_t count_this_disk = load_u16(file, end_offset + 8);
  const std::uint16_t count16 = load_u16(file, end_offset + 10);
  const std::uint32_t size32 = load_u32(file, end_offset + 12);
  const std::uint32_t offset32 = load_u32(file, end_offset + 16);
  const std::uint16_t comment_size = load_u16(file, end_offset + 20);
  if (comment_size != 0) {
    fail(ErrorCode::zip_trailing_data, "zip end record declares a ", comment_size, "-byte comment");
  }
  if (disk != 0 || directory_disk != 0 || count_this_disk != count16) {
    fail(ErrorCode::zip_multi_disk, "zip end record: disk ", disk, ", directory disk ", directory_disk, ", ",
         count_this_disk, " entries on this disk of ", count16, " (a single-disk archive has 0, 0, equal counts)");
  }

  if (file_size < zip::kEndSize + zip::kZip64LocatorSize) return {count16, offset32, size32, end_offset};
  const std::uint64_t locator_offset = end_offset - zip::kZip64LocatorSize;
  const FileWindow locator{source.read(locator_offset, zip::kZip64LocatorSize), locator_offset};
  if (load_u32(locator, locator_offset) != zip::kZip64LocatorSignature) return {count16, offset32, size32, end_offset};

  const std::uint32_t zip64_end_disk = load_u32(locator, locator_offset + 4);
  const std::uint64_t zip64_end_offset = load_u64(locator, locator_offset + 8);
  const std::uint32_t total_disks = load_u32(locator, locator_offset + 16);
  if (zip64_end_disk != 0 || total_disks != 1) {
    fail(ErrorCode::zip64_locator_invalid, "zip64 locator: end record on disk ", zip64_end_disk, ", ", total_disks,
         " disks in total (must be 0 and 1)");
  }
  if (zip64_end_offset > locator_offset || locator_offset - zip64_end_offset < zip::kZip64EndSize) {
    fail(ErrorCode::zip64_eocd_invalid, "zip64 end record offset ", zip64_end_offset, " leaves no room for ",
         zip::kZip64EndSize, " bytes before the locator at ", locator_offset);
  }
  const FileWindow zip64_end{source.read(zip64_end_offset, zip::kZip64EndSize), zip64_end_offset};
  if (load_u32(zip64_end, zip64_end_offset) != zip::kZip64EndSignature) {
    fail(ErrorCode::zip64_eocd_invalid, "no zip64 end record signature at offset ", zip64_end_offset);
  }
  const std::uint64_t record_size = load_u64(zip64_end, zip64_end_offset + 4);
  const std::uint32_t disk64 = load_u32(zip64_end, zip64_end_offset + 16);
  const std::uint32_t directory_disk64 = load_u32(zip64_end, zip64_end_offset + 20);
  const std::uint64_t count_this_disk64 = load_u64(zip64_end, zip64_end_offset + 24);
  const std::uint64_t count64 = load_u64(zip64_end, zip64_end_offset + 32);
  const std::uint64_t size64 = load_u64(zip64_end, zip64_end_offset + 40);
  const std::uint64_t offset64 = load_u64(zip64_end, zip64_end_offset + 48);
  // The record must end exactly at the locator, and without the optional
  // "extensible data" PyTorch never writes: bytes there would be unaccounted for.
  if (record_size != zip::kZip64EndSizeField ||
      record_size != locator_offset - zip64_end_offset - zip::kZip64EndLeadingBytes) {
    fail(ErrorCode::zip64_eocd_invalid, "zip64 end record at ", zip64_end_offset, " has size field ", record_size,
         " but ", locator_offset - zip64_end_offset - zip::kZip64EndLeadingBytes, " bytes precede the locator");
  }
  if (disk64 != 0 || directory_disk64 != 0 || count_this_disk64 != count64) {
    fail(ErrorCode::zip64_eocd_invalid, "zip64 end record: disk ", disk64, ", directory disk ", directory_disk64,
         ", ", count_this_disk64, " entries on this disk of ", count64);
  }
  if (count16 != zip::kEndCountCap && count16 != count64) {
    fail(ErrorCode::zip_entry_count_mismatch, "zip end record counts ", count16, " entries, the zip64 end record ",
         count64);
  }
  if ((size32 != zip::kZip64Threshold && size32 != size64) ||
      (offset32 != zip::kZip64Threshold && offset32 != offset64)) {
    fail(ErrorCode::zip_central_directory_invalid, "zip end record places the directory at ", offset32, " (",
         size32, " bytes), the zip64 end record at ", offset64, " (", size64, " bytes)");
  }
  return {count64, offset64, size64, zip64_end_offset};
}

// ---- central directory ---------------------------------------------------------

// Sizes and offset of one central entry after applying its zip64 block, which
// must hold exactly the fields whose 32-bit slots are saturated, in the order
// uncompressed size, compressed size, offset.
struct CentralValues {
  std::uint64_t uncompressed_size;
  std::uint64_t compressed_size;
  std::uint64_t local_header_offset;
};

CentralValues apply_zip64(const ExtraBlocks& extra, std::uint32_t uncompressed32, std::uint32_t compressed32,
                          std::uint32_t offset32, std::size_t index, std::string_view name) {
  CentralValues values{uncompressed32, compressed32, offset32};
  std::uint64_t* slots[] = {&values.uncompressed_size, &values.compressed_size, &values.local_header_offset};
  std::size_t needed = 0;
  for (std::uint64_t* slot : slots) needed += (*slot == zip::kZip64Threshold) ? 8 : 0;
  if (!extra.zip64) {
    if (needed == 0) return values;
    fail(ErrorCode::zip_extra_field_invalid, entry_label(index, name),
         ": 32-bit size or offset is 0xFFFFFFFF but there is no zip64 block");
  }
  if (extra.zip64->size() != needed) {
    fail(ErrorCode::zip_extra_field_invalid, entry_label(index, name), ": zip64 block has ", extra.zip64->size(),
         " bytes; the saturated 32-bit fields call for ", needed);
  }
  std::size_t pos = 0;
  for (std::uint64_t* slot : slots) {
    if (*slot != zip::kZip64Threshold) continue;
    *slot = load_u64(*extra.zip64, pos);
    pos += 8;
  }
  return values;
}

// Parses central entry `index` at `pos` (inside [pos, directory_end)) into
// `entry` and returns the offset of the next one. Also settles the archive
// folder from entry 0.
std::uint64_t read_central_entry(const FileWindow& file, std::uint64_t pos, std::uint64_t directory_end,
                                 std::size_t index, ZipArchive& archive, ZipEntry& entry, std::string& names,
                                 const EntryNameScreen& screen) {
  if (directory_end - pos < zip::kCentralHeaderSize) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory ends inside entry ", index, " (offset ",
         pos, ")");
  }
  if (load_u32(file, pos) != zip::kCentralHeaderSignature) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory entry ", index, " at offset ", pos,
         " has no signature");
  }
  const std::uint16_t flags = load_u16(file, pos + 8);
  const std::uint16_t method = load_u16(file, pos + 10);
  const std::uint32_t crc = load_u32(file, pos + 16);
  const std::uint32_t compressed32 = load_u32(file, pos + 20);
  const std::uint32_t uncompressed32 = load_u32(file, pos + 24);
  const std::uint16_t name_size = load_u16(file, pos + 28);
  const std::uint16_t extra_size = load_u16(file, pos + 30);
  const std::uint16_t comment_size = load_u16(file, pos + 32);
  const std::uint16_t disk = load_u16(file, pos + 34);
  const std::uint32_t offset32 = load_u32(file, pos + 42);

  const std::uint64_t variable_size = std::uint64_t{name_size} + extra_size + comment_size;
  if (comment_size != 0) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory entry ", index, " at offset ", pos,
         " has a ", comment_size, "-byte comment (PyTorch writes none; it would hide unchecked bytes)");
  }
  if (directory_end - pos - zip::kCentralHeaderSize < variable_size) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory entry ", index, " at offset ", pos,
         " runs past the end of the directory");
  }
  const std::string_view name = text_at(file, pos + zip::kCentralHeaderSize, name_size);
  const auto extra = file.at(pos + zip::kCentralHeaderSize + name_size, extra_size);
  if (screen) screen(name);

  if (flags & zip::kEncryptionFlags) {
    fail(ErrorCode::zip_encrypted, entry_label(index, name), ": flags 0x", std::hex, flags, std::dec,
         " mark it encrypted");
  }
  if (flags & ~zip::kAllowedFlags) {
    fail(ErrorCode::zip_unsupported_flags, entry_label(index, name), ": flags 0x", std::hex, flags, std::dec,
         " (only bits 3 and 11 are allowed)");
  }
  if (method != zip::kMethodStored) {
    fail(ErrorCode::zip_compressed, entry_label(index, name), ": compression method ", method,
         " (PyTorch records are stored, method 0)");
  }
  if (disk != 0) fail(ErrorCode::zip_multi_disk, entry_label(index, name), ": starts on disk ", disk);

  const CentralValues values =
      apply_zip64(parse_extra(extra, index, name, "central", false), uncompressed32, compressed32, offset32, index, name);
  if (values.compressed_size != values.uncompressed_size) {
    fail(ErrorCode::zip_size_mismatch, entry_label(index, name), ": compressed size ", values.compressed_size,
         " differs from uncompressed size ", values.uncompressed_size);
  }

  check_name_characters(index, name);
  std::string_view rest;
  if (index == 0) {
    const std::size_t slash = name.find('/');
    if (slash == std::string_view::npos) {
      fail(ErrorCode::zip_archive_folder_invalid, entry_label(index, name),
           ": name has no top-level archive folder");
    }
    check_component(index, name, name.substr(0, slash));
    archive.archive_name = std::string(name.substr(0, slash));
    rest = name.substr(slash + 1);
  } else {
    const std::string_view folder = archive.archive_name;
    if (name.size() <= folder.size() || name.substr(0, folder.size()) != folder || name[folder.size()] != '/') {
      fail(ErrorCode::zip_archive_folder_invalid, entry_label(index, name), ": not inside archive folder '",
           printable(folder), "/' taken from entry 0");
    }
    rest = name.substr(folder.size() + 1);
  }
  if (rest.empty()) {
    fail(ErrorCode::zip_archive_folder_invalid, entry_label(index, name),
         ": a bare directory entry (strict archives hold only records)");
  }
  check_record_components(index, name, rest);

  // The arena was reserved for the whole directory, which holds every name:
  // appending never moves the names already viewed.
  if (names.size() + name.size() > names.capacity()) {
    fail(ErrorCode::zip_central_directory_invalid, entry_label(index, name), ": names longer than the directory");
  }
  names.append(name);
  entry.name = std::string_view(names).substr(names.size() - name.size());
  entry.record_offset = static_cast<std::uint16_t>(name.size() - rest.size());  // names hold at most 65535 bytes
  entry.local_header_offset = values.local_header_offset;
  entry.size = values.uncompressed_size;
  entry.crc32 = crc;
  entry.flags = flags;
  return pos + zip::kCentralHeaderSize + variable_size;
}

// Fills archive.record_order and rejects names that repeat, exactly or up to
// ASCII case (PyTorch looks records up case-insensitively, so either kind makes
// a lookup ambiguous). The entry reported is the first, in directory order,
// whose name repeats an earlier one.
void index_records(ZipArchive& archive) {
  const auto& entries = archive.entries;
  auto& slots = archive.record_order;
  slots.assign(record_index_size(entries.size()), 0);
  const std::size_t mask = slots.size() - 1;
  const detail::SlotCode code(slots.size());
  // At a million records the table is 8 MiB: hashes are taken ahead.
  detail::for_each_hashed_ahead(
      entries.size(), slots.data(), mask, [&](std::size_t i) { return zip::folded_hash(entries[i].record()); },
      [&](std::size_t index, std::uint64_t hash) {
        const auto i = static_cast<std::uint32_t>(index);
        const ZipEntry& entry = entries[i];
        std::size_t slot = hash & mask;
        for (; slots[slot] != 0; slot = (slot + 1) & mask) {
          if (!code.may_hold(slots[slot], hash)) continue;
          const std::uint32_t earlier = code.position(slots[slot]);
          if (!zip::equal_folded(entries[earlier].record(), entry.record())) continue;
          if (entries[earlier].name == entry.name) {
            fail(ErrorCode::zip_name_duplicate, entry_label(i, entry.name), ": same name as entry ", earlier);
          }
          fail(ErrorCode::zip_name_case_duplicate, entry_label(i, entry.name), ": differs only in case from ",
               entry_label(earlier, entries[earlier].name));
        }
        slots[slot] = code.encode(i, hash);
      });
}

// ---- local headers and layout --------------------------------------------------

// Checks entry `index`'s local header, payload bounds and data descriptor and
// fills data_offset and end_offset. Nothing of the entry may reach
// `directory_offset`.
void read_local_entry(ZipByteSource& file, std::uint64_t directory_offset, std::size_t index, ZipEntry& entry) {
  const std::uint64_t file_size = file.size();
  const std::uint64_t lho = entry.local_header_offset;
  if (lho > file_size || file_size - lho < zip::kLocalHeaderSize) {
    fail(ErrorCode::zip_local_header_invalid, entry_label(index, entry.name), ": local header offset ", lho,
         " is outside the ", file_size, "-byte file");
  }
  const std::size_t header_size =
      check_local_header_start(file.read(lho, zip::kLocalHeaderSize), file_size, index, entry);
  const unsigned width = check_local_header(file.read(lho, header_size), directory_offset, index, entry);
  if (width == 0) return;
  const std::uint64_t data_end = entry.end_offset;
  const std::size_t available =
      static_cast<std::size_t>(std::min<std::uint64_t>(max_data_descriptor_bytes(width), directory_offset - data_end));
  check_data_descriptor(file.read(data_end, available), width, directory_offset, index, entry);
}

}  // namespace

const ZipEntry* ZipArchive::find(std::string_view record) const {
  if (record_order.size() != record_index_size(entries.size())) {
    for (const ZipEntry& entry : entries) {
      if (entry.record() == record) return &entry;
    }
    return nullptr;
  }
  // The bounds keep a table edited by hand from reading past `entries` or
  // probing forever; one from read_zip_directory never needs them.
  const std::size_t mask = record_order.size() - 1;
  const detail::SlotCode code(record_order.size());
  const std::uint64_t hash = zip::folded_hash(record);
  std::size_t slot = hash & mask;
  for (std::size_t probes = 0; probes < record_order.size() && record_order[slot] != 0; ++probes) {
    const std::size_t index = code.position(record_order[slot]);
    if (code.may_hold(record_order[slot], hash) && index < entries.size() && entries[index].record() == record) {
      return &entries[index];
    }
    slot = (slot + 1) & mask;
  }
  return nullptr;
}

std::size_t check_local_header_start(std::span<const std::byte> fixed, std::uint64_t file_size, std::size_t index,
                                     const ZipEntry& entry) {
  const std::uint64_t lho = entry.local_header_offset;
  if (load_u32(fixed, 0) != zip::kLocalHeaderSignature) {
    fail(ErrorCode::zip_local_header_invalid, entry_label(index, entry.name), ": no local header signature at ",
         lho);
  }
  const std::uint16_t name_size = load_u16(fixed, 26);
  const std::uint16_t extra_size = load_u16(fixed, 28);
  const std::uint64_t header_end = lho + zip::kLocalHeaderSize + name_size + extra_size;  // < 2^64: lho <= size
  if (header_end > file_size) {
    fail(ErrorCode::zip_local_header_invalid, entry_label(index, entry.name), ": local header at ", lho,
         " runs past the end of the file");
  }
  return zip::kLocalHeaderSize + name_size + extra_size;
}

namespace {

// A local zip64 block is one more copy of values the central directory holds
// and must agree with them, or a reader that trusts the local header (Python's
// zipfile, a streaming extractor) would see another archive than this one.
// Honest writers put three layouts there: [uncompressed, compressed] (Python's
// zipfile; miniz for a record of 4 GiB or more, with compressed 0 because the
// descriptor carries it), [local header offset] (miniz for a header at or past
// 4 GiB, which the zip spec does not foresee) and both, sizes first (miniz).
// So a size there is the central size, or 0 under a descriptor, and an offset
// is where the header actually starts. docs/format.md §3.3 states the rule.
void check_local_zip64(const ExtraBlocks& extra, bool deferred, bool saturated32, std::size_t index,
                       const ZipEntry& entry) {
  std::optional<std::uint64_t> uncompressed;
  std::optional<std::uint64_t> compressed;
  std::optional<std::uint64_t> offset;
  if (extra.zip64) {
    const std::span<const std::byte> block = *extra.zip64;
    if (block.size() != 8 && block.size() != 16 && block.size() != 24) {
      fail(ErrorCode::zip_extra_field_invalid, entry_label(index, entry.name), ": local zip64 block has ",
           block.size(), " bytes; 16 (sizes), 8 (header offset) or 24 (both) expected");
    }
    if (block.size() != 8) {
      uncompressed = load_u64(block, 0);
      compressed = load_u64(block, 8);
    }
    if (block.size() != 16) offset = load_u64(block, block.size() - 8);
  }
  if (saturated32 && !uncompressed) {
    fail(ErrorCode::zip_local_zip64_mismatch, entry_label(index, entry.name),
         ": a local size is 0xFFFFFFFF but no local zip64 block carries the sizes");
  }
  const auto size_agrees = [&](std::uint64_t local) { return local == entry.size || (deferred && local == 0); };
  if (uncompressed && (!size_agrees(*uncompressed) || !size_agrees(*compressed))) {
    fail(ErrorCode::zip_local_zip64_mismatch, entry_label(index, entry.name), ": local zip64 sizes ", *uncompressed,
         "/", *compressed, ", central size ", entry.size, deferred ? " (or 0 under a data descriptor)" : "");
  }
  if (offset && *offset != entry.local_header_offset) {
    fail(ErrorCode::zip_local_zip64_mismatch, entry_label(index, entry.name),
         ": local zip64 block names header offset ", *offset, ", the central directory ", entry.local_header_offset);
  }
}

}  // namespace

unsigned check_local_header(std::span<const std::byte> header, std::uint64_t directory_offset, std::size_t index,
                            ZipEntry& entry) {
  const std::uint64_t lho = entry.local_header_offset;
  const std::uint16_t flags = load_u16(header, 6);
  const std::uint16_t method = load_u16(header, 8);
  const std::uint32_t crc = load_u32(header, 14);
  const std::uint32_t compressed32 = load_u32(header, 18);
  const std::uint32_t uncompressed32 = load_u32(header, 22);
  const std::uint16_t name_size = load_u16(header, 26);
  const std::uint16_t extra_size = load_u16(header, 28);
  const std::uint64_t header_end = lho + header.size();
  const std::string_view local_name(reinterpret_cast<const char*>(header.data()) + zip::kLocalHeaderSize, name_size);
  if (local_name != entry.name) {
    fail(ErrorCode::zip_local_header_mismatch, entry_label(index, entry.name), ": local header names '",
         printable(local_name), "'");
  }
  if (flags != entry.flags || method != zip::kMethodStored) {
    fail(ErrorCode::zip_local_header_mismatch, entry_label(index, entry.name), ": local flags 0x", std::hex, flags,
         " method ", method, ", central flags 0x", entry.flags, " method 0", std::dec);
  }
  // The local CRC and sizes are a second copy of the central ones and must
  // agree. With a descriptor (bit 3) the writer may not know them yet when it
  // writes the header, and miniz writes 0 instead; 0xFFFFFFFF defers a size
  // to the local zip64 block, checked in check_local_zip64.
  const bool deferred = (flags & zip::kFlagDataDescriptor) != 0;
  {
    const auto size_agrees = [&](std::uint32_t local) {
      return local == zip::kZip64Threshold || local == entry.size || (deferred && local == 0);
    };
    const bool crc_agrees = crc == entry.crc32 || (deferred && crc == 0);
    if (!crc_agrees || !size_agrees(compressed32) || !size_agrees(uncompressed32)) {
      fail(ErrorCode::zip_local_header_mismatch, entry_label(index, entry.name), ": local CRC ", crc, " sizes ",
           compressed32, "/", uncompressed32, ", central CRC ", entry.crc32, " size ", entry.size);
    }
  }
  const ExtraBlocks extra =
      parse_extra(header.subspan(zip::kLocalHeaderSize + name_size, extra_size), index, entry.name, "local", true);
  check_local_zip64(extra, deferred, compressed32 == zip::kZip64Threshold || uncompressed32 == zip::kZip64Threshold,
                    index, entry);

  entry.data_offset = header_end;
  const auto payload_end = detail::checked_add(header_end, entry.size);
  if (!payload_end) {
    fail(ErrorCode::zip_entries_overlap, entry_label(index, entry.name), " payload end: ", header_end, " + ",
         entry.size, " overflows 64 bits");
  }
  const std::uint64_t data_end = *payload_end;
  if (data_end > directory_offset) {
    fail(ErrorCode::zip_entries_overlap, entry_label(index, entry.name), ": payload [", header_end, ", ", data_end,
         ") runs into the central directory at ", directory_offset);
  }
  entry.end_offset = data_end;
  if (!(flags & zip::kFlagDataDescriptor) || entry.size == 0) return 0;
  // The descriptor's sizes are 64-bit exactly when the local header carries
  // a zip64 block.
  return extra.zip64 ? 8 : 4;
}

void check_data_descriptor(std::span<const std::byte> bytes, unsigned width, std::uint64_t directory_offset,
                           std::size_t index, ZipEntry& entry) {
  // The descriptor's signature is optional in the zip spec.
  const std::uint64_t data_end = entry.end_offset;
  std::size_t pos = 0;
  if (bytes.size() >= 4 && load_u32(bytes, 0) == zip::kDataDescriptorSignature) pos = 4;
  if (bytes.size() - pos < 4 + 2 * std::size_t{width}) {
    fail(ErrorCode::zip_entries_overlap, entry_label(index, entry.name), ": data descriptor at ", data_end,
         " runs into the central directory at ", directory_offset);
  }
  const std::uint32_t descriptor_crc = load_u32(bytes, pos);
  const std::uint64_t descriptor_compressed = load_le(bytes, pos + 4, static_cast<int>(width));
  const std::uint64_t descriptor_uncompressed = load_le(bytes, pos + 4 + width, static_cast<int>(width));
  if (descriptor_crc != entry.crc32 || descriptor_compressed != entry.size || descriptor_uncompressed != entry.size) {
    fail(ErrorCode::zip_descriptor_mismatch, entry_label(index, entry.name), ": data descriptor says CRC ",
         descriptor_crc, " sizes ", descriptor_compressed, "/", descriptor_uncompressed, ", central directory CRC ",
         entry.crc32, " size ", entry.size);
  }
  entry.end_offset = data_end + pos + 4 + 2 * width;
}

// Entries must be disjoint and, as PyTorch writes them, tile [0, cd_offset)
// with no byte unaccounted for (no room for a polyglot payload).
void check_zip_layout(const ZipArchive& archive) {
  const auto& entries = archive.entries;
  std::vector<std::uint32_t> by_offset(entries.size());
  for (std::uint32_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  const auto earlier = [&](std::uint32_t a, std::uint32_t b) {
    return entries[a].local_header_offset < entries[b].local_header_offset;
  };
  if (!std::is_sorted(by_offset.begin(), by_offset.end(), earlier)) {
    std::stable_sort(by_offset.begin(), by_offset.end(), earlier);
  }
  std::uint64_t covered = 0;
  for (std::size_t k = 0; k < by_offset.size(); ++k) {
    const ZipEntry& entry = entries[by_offset[k]];
    if (k > 0 && entry.local_header_offset < covered) {
      const std::uint32_t previous = by_offset[k - 1];
      fail(ErrorCode::zip_entries_overlap, entry_label(by_offset[k], entry.name), " starts at ",
           entry.local_header_offset, ", inside ", entry_label(previous, entries[previous].name), " which ends at ",
           covered);
    }
    if (entry.local_header_offset != covered) {
      fail(ErrorCode::zip_gap, entry_label(by_offset[k], entry.name), " starts at ", entry.local_header_offset,
           "; bytes [", covered, ", ", entry.local_header_offset, ") belong to no entry");
    }
    covered = entry.end_offset;
  }
  if (covered != archive.central_directory_offset) {
    fail(ErrorCode::zip_gap, "bytes [", covered, ", ", archive.central_directory_offset,
         ") between the last entry and the central directory belong to no entry");
  }
}

ZipArchive read_zip_directory(std::span<const std::byte> file, const Limits& limits, const EntryNameScreen& screen) {
  ZipMemorySource source(file);
  return read_zip_directory(source, limits, screen);
}

ZipArchive read_zip_directory(ZipByteSource& file, const Limits& limits, const EntryNameScreen& screen) {
  ZipArchive archive = read_zip_central_directory(file, limits, screen);
  read_zip_local_entries(file, archive);
  return archive;
}

void read_zip_local_entries(ZipByteSource& file, ZipArchive& archive) { ZipLocalEntries(file, archive).finish(); }

void ZipLocalEntries::check(std::size_t index) {
  if (checked_[index]) return;
  read_local_entry(file_, archive_.central_directory_offset, index, archive_.entries[index]);
  checked_[index] = true;
}

void ZipLocalEntries::finish() {
  if (finished_) return;
  // The headers lie a record apart, further than the hardware prefetcher
  // looks ahead; in a file larger than the caches each would wait on memory.
  constexpr std::size_t kAhead = 8;
  const auto& entries = archive_.entries;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i + kAhead < entries.size() && !checked_[i + kAhead]) file_.prefetch(entries[i + kAhead].local_header_offset);
    check(i);
  }
  check_zip_layout(archive_);
  finished_ = true;
}

ZipArchive read_zip_central_directory(ZipByteSource& file, const Limits& limits, const EntryNameScreen& screen) {
  // An archive without entries is nothing but its end record; name that
  // precisely rather than as a missing local header.
  const std::uint64_t file_size = file.size();
  // The end records lie in the last bytes (a zip64 end record just before
  // its locator), and the directory right before them: a file still arriving
  // is asked for its end first.
  constexpr std::uint64_t kEndRecordsBytes = std::uint64_t{64} << 10;
  file.read_ahead_from(file_size > kEndRecordsBytes ? file_size - kEndRecordsBytes : 0);
  const std::uint32_t first_signature = file_size < 4 ? 0 : load_u32(file.read(0, 4), 0);
  const bool bare_end_record = file_size == zip::kEndSize && first_signature == zip::kEndSignature;
  if (!bare_end_record && (file_size < 4 || first_signature != zip::kLocalHeaderSignature)) {
    fail(ErrorCode::zip_local_header_invalid, "zip file does not start with a local header signature");
  }

  const DirectoryBounds bounds = read_end_records(file);
  if (bounds.entry_count == 0) fail(ErrorCode::zip_empty, "zip archive has no entries");
  // Entries are indexed with 32-bit positions; no real archive comes near.
  if (bounds.entry_count > limits.max_records || bounds.entry_count > UINT32_MAX) {
    fail(ErrorCode::zip_too_many_entries, "zip archive has ", bounds.entry_count, " entries (limit ",
         limits.max_records, ")");
  }
  const auto directory_end = detail::checked_add(bounds.offset, bounds.size);
  if (!directory_end || *directory_end != bounds.end) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory at ", bounds.offset, " (", bounds.size,
         " bytes) does not end where the end records start (", bounds.end, ")");
  }
  if (bounds.size > limits.max_central_directory_bytes) {
    fail(ErrorCode::zip_central_directory_too_large, "zip central directory is ", bounds.size, " bytes (limit ",
         limits.max_central_directory_bytes, ")");
  }
  if (bounds.entry_count > bounds.size / zip::kCentralHeaderSize) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory of ", bounds.size,
         " bytes cannot hold the ", bounds.entry_count, " entries the end record counts");
  }

  ZipArchive archive;
  archive.central_directory_offset = bounds.offset;
  archive.central_directory_size = bounds.size;
  archive.entries.resize(bounds.entry_count);
  auto names = std::make_shared<std::string>();
  names->reserve(static_cast<std::size_t>(bounds.size));
  archive.names = names;
  // The size was bounded by Limits::max_central_directory_bytes above, and the
  // directory ends where the end records start, inside the file.
  file.read_ahead_from(bounds.offset);
  const FileWindow directory{file.read(bounds.offset, static_cast<std::size_t>(bounds.size)), bounds.offset};
  std::uint64_t pos = bounds.offset;
  for (std::size_t i = 0; i < archive.entries.size(); ++i) {
    pos = read_central_entry(directory, pos, bounds.end, i, archive, archive.entries[i], *names, screen);
  }
  if (pos != bounds.end) {
    fail(ErrorCode::zip_central_directory_invalid, "zip central directory has ", bounds.end - pos,
         " bytes after its last entry");
  }
  index_records(archive);
  return archive;
}

namespace {

// Whether entry `i`'s payload is to be checked against its CRC field. An
// empty payload's CRC is legitimately 0; a zero CRC on anything else means the
// writer skipped it (torch 2.x can), and then there is nothing to verify
// against: zip_crc_missing unless Limits::allow_zero_crc lets it pass unchecked.
bool crc_to_check(const ZipArchive& archive, std::size_t i, const Limits& limits) {
  const ZipEntry& entry = archive.entries[i];
  if (entry.crc32 != 0 || entry.size == 0) return true;
  if (limits.allow_zero_crc) return false;
  fail(ErrorCode::zip_crc_missing, entry_label(i, entry.name), ": CRC-32 field is 0 (Limits::allow_zero_crc is off)");
}

void compare_crc(const ZipArchive& archive, std::size_t i, std::uint32_t actual) {
  const ZipEntry& entry = archive.entries[i];
  if (actual != entry.crc32) {
    fail(ErrorCode::zip_crc_mismatch, entry_label(i, entry.name), ": CRC-32 of the payload is 0x", std::hex, actual,
         ", the central directory says 0x", entry.crc32);
  }
}

void verify_entry_crc(const ZipArchive& archive, std::size_t i, std::span<const std::byte> file, const Limits& limits) {
  const ZipEntry& entry = archive.entries[i];
  if (entry.data_offset > file.size() || file.size() - entry.data_offset < entry.size) {
    fail(ErrorCode::invalid_argument, entry_label(i, entry.name), " lies outside the given ", file.size(),
         "-byte file; the archive was read from other bytes");
  }
  if (!crc_to_check(archive, i, limits)) return;
  compare_crc(archive, i, io::crc32_of(zip_entry_bytes(file, entry)));
}

// The first failing entry of [first, last), with its error.
std::optional<std::pair<std::size_t, Error>> first_crc_failure(const ZipArchive& archive, std::size_t first,
                                                                std::size_t last, std::span<const std::byte> file,
                                                                const Limits& limits) {
  for (std::size_t i = first; i < last; ++i) {
    try {
      verify_entry_crc(archive, i, file, limits);
    } catch (const Error& error) {
      return std::make_pair(i, error);
    }
  }
  return std::nullopt;
}

// Below this many payload bytes a second thread costs more than it saves.
constexpr std::uint64_t kParallelCrcBytes = std::uint64_t{8} << 20;

}  // namespace

void check_zip_entry_crc(const ZipArchive& archive, std::size_t index, std::uint32_t actual, const Limits& limits) {
  if (crc_to_check(archive, index, limits)) compare_crc(archive, index, actual);
}

void ZipCrcWork::check(std::size_t index) {
  if (auto failure = first_crc_failure(archive_, index, index + 1, file_, limits_)) {
    const std::lock_guard lock(failure_mutex_);
    if (!failure_ || failure->first < failure_->first) failure_ = std::move(failure);
  }
}

void ZipCrcWork::work() {
  for (std::size_t i = next_.fetch_add(1, std::memory_order_relaxed); i < archive_.entries.size();
       i = next_.fetch_add(1, std::memory_order_relaxed)) {
    if (i != checked_early_) check(i);
  }
}

void ZipCrcWork::check_now(std::size_t index) {
  checked_early_ = index;
  check(index);
}

void ZipCrcWork::finish() const {
  const std::lock_guard lock(failure_mutex_);
  if (failure_) throw failure_->second;
}

void verify_zip_crcs(const ZipArchive& archive, std::span<const std::byte> file, const Limits& limits) {
  std::uint64_t total = 0;
  for (const ZipEntry& entry : archive.entries) total += entry.size;
  ZipCrcWork work(archive, file, limits);
  std::thread helper;
  if (total >= kParallelCrcBytes) helper = std::thread([&work] { work.work(); });
  work.work();
  if (helper.joinable()) helper.join();
  work.finish();
}

}  // namespace holdpoint::format
