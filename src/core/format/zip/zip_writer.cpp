#include "format/zip/zip_writer.h"

#include <algorithm>
#include <utility>

#include "base/fail.h"
#include "format/zip/zip_format.h"
#include "format/zip/zip_names.h"
#include "base/crc32.h"

namespace holdpoint::format {
namespace {

// Little-endian field appender for headers built in memory before one write.
class HeaderBuffer {
 public:
  void u16(std::uint64_t value) { put(value, 2); }
  void u32(std::uint64_t value) { put(value, 4); }
  void u64(std::uint64_t value) { put(value, 8); }
  void text(std::string_view value) {
    for (char c : value) bytes_.push_back(static_cast<std::byte>(c));
  }
  void repeat(std::byte value, std::size_t count) { bytes_.insert(bytes_.end(), count, value); }

  std::span<const std::byte> bytes() const noexcept { return bytes_; }
  std::size_t size() const noexcept { return bytes_.size(); }
  void clear() noexcept { bytes_.clear(); }

 private:
  void put(std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes_.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xFF));
  }

  std::vector<std::byte> bytes_;
};

std::uint64_t clamp32(std::uint64_t value) { return std::min(value, zip::kZip64Threshold); }

// A slot holds the entry's index + 1 in its low half and the top 32 bits of
// its name's hash in the high half, so a probe compares names only when those
// agree.
std::uint64_t name_slot(std::size_t hash, std::size_t entry) {
  return (static_cast<std::uint64_t>(hash) & 0xFFFFFFFF00000000ULL) | static_cast<std::uint64_t>(entry + 1);
}

void place_name(std::vector<std::uint64_t>& slots, std::string_view name, std::size_t entry) {
  const std::size_t mask = slots.size() - 1;
  const std::size_t hash = zip::folded_hash(name);
  std::size_t slot = hash & mask;
  while (slots[slot] != 0) slot = (slot + 1) & mask;
  slots[slot] = name_slot(hash, entry);
}

const char* state_name(int state) {
  static constexpr const char* kNames[] = {"idle", "inside a record", "finished", "abandoned"};
  return kNames[state];
}

// The central directory is written in slices of about this size, so that a
// million-record directory never sits in memory whole.
constexpr std::size_t kCentralDirectoryFlushBytes = 64 * 1024;

}  // namespace

ZipWriter::ZipWriter(io::ByteSink& sink, std::string archive_name)
    : sink_(sink), archive_name_(std::move(archive_name)) {
  if (archive_name_.find('/') != std::string::npos || !zip::entry_name_problem(archive_name_).empty()) {
    detail::fail(ErrorCode::invalid_argument, "zip archive name '", archive_name_,
                 "' must be one valid path component (no '/', not '.' or '..')");
  }
}

void ZipWriter::check_state(State expected, const char* operation) const {
  if (state_ != expected) {
    detail::fail(ErrorCode::write_state_invalid, "ZipWriter::", operation, " called while the writer is ",
                 state_name(static_cast<int>(state_)));
  }
}

void ZipWriter::write_raw(std::span<const std::byte> bytes, bool stable) {
  try {
    if (stable) {
      sink_.write_stable(bytes);
    } else {
      sink_.write(bytes);
    }
  } catch (...) {
    // The sink's state is unknown after a failure; any further byte could
    // land at the wrong offset.
    state_ = State::abandoned;
    throw;
  }
  offset_ += bytes.size();
}

bool ZipWriter::name_written(std::string_view name) const {
  if (name_slots_.empty()) return false;
  const std::size_t mask = name_slots_.size() - 1;
  const std::size_t hash = zip::folded_hash(name);
  const std::uint64_t tag = name_slot(hash, 0) & 0xFFFFFFFF00000000ULL;
  for (std::size_t slot = hash & mask; name_slots_[slot] != 0; slot = (slot + 1) & mask) {
    const std::uint64_t entry = name_slots_[slot];
    if ((entry & 0xFFFFFFFF00000000ULL) == tag && zip::equal_folded(entries_[(entry & 0xFFFFFFFFULL) - 1].name, name)) {
      return true;
    }
  }
  return false;
}

void ZipWriter::index_name(std::size_t entry) {
  if (2 * entries_.size() > name_slots_.size()) {
    // Double (from 64) and re-place every entry, this one included.
    name_slots_.assign(std::max<std::size_t>(64, 2 * name_slots_.size()), 0);
    for (std::size_t i = 0; i < entries_.size(); ++i) place_name(name_slots_, entries_[i].name, i);
    return;
  }
  place_name(name_slots_, entries_[entry].name, entry);
}

void ZipWriter::begin_record(std::string_view record, std::uint64_t size) {
  check_state(State::idle, "begin_record");
  if (record.empty()) detail::fail(ErrorCode::invalid_argument, "zip record name is empty");
  std::string name = archive_name_ + "/" + std::string(record);
  // Never write a name the reader would reject.
  if (const std::string problem = zip::entry_name_problem(name); !problem.empty()) {
    detail::fail(ErrorCode::invalid_argument, "zip entry name '", name.substr(0, 64),
                 name.size() > 64 ? "..." : "", "': ", problem);
  }
  if (name_written(name)) {
    detail::fail(ErrorCode::invalid_argument, "zip entry name '", name,
                 "' was already written (names may not repeat, even in another ASCII case)");
  }

  const std::uint64_t header_offset = offset_;
  const std::uint64_t zip64_size = zip::local_zip64_block_size(header_offset, size);
  const std::uint64_t padding = zip::padding_size(header_offset, name.size(), size);
  const std::uint64_t extra_size = zip64_size + zip::kExtraBlockHeaderSize + padding;

  HeaderBuffer header;
  header.u32(zip::kLocalHeaderSignature);
  header.u16(0);  // version needed
  header.u16(size > 0 ? zip::kWriterFlags : zip::kWriterFlagsEmptyRecord);
  header.u16(zip::kMethodStored);
  header.u32(0);  // DOS time and date
  // CRC and sizes are not known yet; they follow the payload in the data
  // descriptor (and, with no payload, zero is right).
  header.u32(0);
  header.u32(0);
  header.u32(0);
  header.u16(name.size());
  header.u16(extra_size);
  header.text(name);
  if (zip64_size > 0) {
    header.u16(zip::kZip64ExtraId);
    header.u16(zip64_size - zip::kExtraBlockHeaderSize);
    if (size >= zip::kZip64Threshold) {
      header.u64(size);
      header.u64(0);  // miniz writes the compressed size as 0 here
    }
    if (header_offset >= zip::kZip64Threshold) header.u64(header_offset);
  }
  header.u16(zip::kPaddingExtraId);
  header.u16(padding);
  header.repeat(zip::kPaddingByte, padding);
  write_raw(header.bytes());

  if (entries_.size() >= UINT32_MAX - 1) detail::fail(ErrorCode::invalid_argument, "too many zip entries");
  entries_.push_back(Entry{std::move(name), header_offset, size, 0});
  index_name(entries_.size() - 1);
  remaining_ = size;
  running_crc_ = 0;
  state_ = State::in_record;
}

void ZipWriter::write_payload(std::span<const std::byte> bytes, bool stable) {
  check_state(State::in_record, stable ? "write_stable" : "write");
  if (bytes.size() > remaining_) {
    detail::fail(ErrorCode::invalid_argument, "zip record '", entries_.back().name, "' was declared as ",
                 entries_.back().size, " bytes; writing ", bytes.size(), " more would exceed it by ",
                 bytes.size() - remaining_);
  }
  write_raw(bytes, stable);
  running_crc_ = io::crc32_update(running_crc_, bytes.data(), bytes.size());
  remaining_ -= bytes.size();
}

void ZipWriter::write(std::span<const std::byte> bytes) { write_payload(bytes, false); }

void ZipWriter::write_stable(std::span<const std::byte> bytes) { write_payload(bytes, true); }

void ZipWriter::end_record() {
  check_state(State::in_record, "end_record");
  Entry& entry = entries_.back();
  if (remaining_ != 0) {
    detail::fail(ErrorCode::write_state_invalid, "zip record '", entry.name, "' ended after ",
                 entry.size - remaining_, " of its ", entry.size, " declared bytes");
  }
  entry.crc32 = running_crc_;
  if (entry.size > 0) {
    HeaderBuffer descriptor;
    descriptor.u32(zip::kDataDescriptorSignature);
    descriptor.u32(entry.crc32);
    if (zip::needs_zip64(entry.local_header_offset, entry.size)) {
      descriptor.u64(entry.size);
      descriptor.u64(entry.size);
    } else {
      descriptor.u32(entry.size);
      descriptor.u32(entry.size);
    }
    write_raw(descriptor.bytes());
  }
  state_ = State::idle;
}

void ZipWriter::add_record(std::string_view record, std::span<const std::byte> payload) {
  begin_record(record, payload.size());
  write(payload);
  end_record();
}

void ZipWriter::finish() {
  check_state(State::idle, "finish");
  if (entries_.empty()) {
    detail::fail(ErrorCode::write_state_invalid,
                 "ZipWriter::finish called with no records (readers reject an empty archive)");
  }

  const std::uint64_t directory_offset = offset_;
  HeaderBuffer buffer;
  for (const Entry& entry : entries_) {
    const bool big_size = entry.size >= zip::kZip64Threshold;
    const bool big_offset = entry.local_header_offset >= zip::kZip64Threshold;
    const std::uint64_t zip64_fields = (big_size ? 16 : 0) + (big_offset ? 8 : 0);

    buffer.u32(zip::kCentralHeaderSignature);
    buffer.u16(0);  // version made by
    buffer.u16(0);  // version needed
    buffer.u16(entry.size > 0 ? zip::kWriterFlags : zip::kWriterFlagsEmptyRecord);
    buffer.u16(zip::kMethodStored);
    buffer.u32(0);  // DOS time and date
    buffer.u32(entry.crc32);
    buffer.u32(clamp32(entry.size));  // compressed
    buffer.u32(clamp32(entry.size));  // uncompressed
    buffer.u16(entry.name.size());
    buffer.u16(zip64_fields > 0 ? zip::kExtraBlockHeaderSize + zip64_fields : 0);
    buffer.u16(0);  // comment length
    buffer.u16(0);  // disk number
    buffer.u16(0);  // internal attributes
    buffer.u32(0);  // external attributes
    buffer.u32(clamp32(entry.local_header_offset));
    buffer.text(entry.name);
    if (zip64_fields > 0) {
      buffer.u16(zip::kZip64ExtraId);
      buffer.u16(zip64_fields);
      if (big_size) {
        buffer.u64(entry.size);
        buffer.u64(entry.size);
      }
      if (big_offset) buffer.u64(entry.local_header_offset);
    }
    if (buffer.size() >= kCentralDirectoryFlushBytes) {
      write_raw(buffer.bytes());
      buffer.clear();
    }
  }
  write_raw(buffer.bytes());
  buffer.clear();

  const std::uint64_t directory_size = offset_ - directory_offset;
  const std::uint64_t zip64_end_offset = offset_;
  const std::uint64_t count = entries_.size();

  buffer.u32(zip::kZip64EndSignature);
  buffer.u64(zip::kZip64EndSizeField);
  buffer.u16(zip::kZip64EndVersionMadeBy);
  buffer.u16(zip::kZip64EndVersionNeeded);
  buffer.u32(0);  // this disk
  buffer.u32(0);  // disk with the central directory
  buffer.u64(count);
  buffer.u64(count);
  buffer.u64(directory_size);
  buffer.u64(directory_offset);

  buffer.u32(zip::kZip64LocatorSignature);
  buffer.u32(0);  // disk with the zip64 end record
  buffer.u64(zip64_end_offset);
  buffer.u32(1);  // total disks

  buffer.u32(zip::kEndSignature);
  buffer.u16(0);  // this disk
  buffer.u16(0);  // disk with the central directory
  buffer.u16(std::min(count, zip::kEndCountCap));
  buffer.u16(std::min(count, zip::kEndCountCap));
  buffer.u32(clamp32(directory_size));
  buffer.u32(clamp32(directory_offset));
  buffer.u16(0);  // comment length
  write_raw(buffer.bytes());

  state_ = State::finished;
}

void ZipWriter::abandon() noexcept { state_ = State::abandoned; }

}  // namespace holdpoint::format
