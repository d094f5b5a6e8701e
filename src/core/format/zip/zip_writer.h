// Writes zip archives byte-for-byte as PyTorch's PyTorchStreamWriter (miniz in
// zip64 mode) does: stored records, payloads aligned to 64 bytes with an "FB"
// padding extra field, data descriptors, zip64 blocks when a size or offset
// needs them, and a zip64 end of central directory always. docs/format.md has
// the byte tables.
//
// Payloads stream: begin_record(name, size) writes the local header, write()
// passes payload bytes straight to the sink (computing CRC-32 on the way), and
// end_record() writes the data descriptor. Nothing is buffered beyond headers.
//
// Failure contract: calls out of order (a record after finish, end_record
// before all bytes, finish with no record) throw Error(write_state_invalid);
// bad arguments (too many bytes, an empty, over-long or duplicate name) throw
// Error(invalid_argument) and leave the writer usable. Sink errors propagate
// and leave the writer abandoned. finish() and abandon() are explicit; the
// destructor does no I/O.
//
// Thread-safety: none; one writer per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/byte_sink.h"

namespace holdpoint::format {

class ZipWriter {
 public:
  ZipWriter(io::ByteSink& sink, std::string archive_name);
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  // Starts record "<archive>/<record>" whose payload is exactly `size` bytes.
  void begin_record(std::string_view record, std::uint64_t size);
  // Payload bytes of the current record. write_stable passes the caller's
  // guarantee on to the sink (see io::ByteSink::write_stable).
  void write(std::span<const std::byte> bytes);
  void write_stable(std::span<const std::byte> bytes);
  void end_record();
  // begin_record + write + end_record.
  void add_record(std::string_view record, std::span<const std::byte> payload);

  // Writes the central directory and the end records. The archive is complete
  // once this returns.
  void finish();
  // Marks the writer unusable without writing anything more.
  void abandon() noexcept;

  std::size_t record_count() const noexcept { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    std::uint64_t local_header_offset;
    std::uint64_t size;
    std::uint32_t crc32;
  };
  enum class State { idle, in_record, finished, abandoned };

  void check_state(State expected, const char* operation) const;
  // Every byte of the archive goes through here, so offset_ is exact; a
  // throwing sink leaves the writer abandoned.
  void write_raw(std::span<const std::byte> bytes, bool stable = false);
  void write_payload(std::span<const std::byte> bytes, bool stable);

  io::ByteSink& sink_;
  std::string archive_name_;
  std::vector<Entry> entries_;
  // The entries by ASCII-lowercased full name: the reader rejects names that
  // differ only in case (PyTorch looks records up case-insensitively), so the
  // writer must never produce them. Open addressing over entries_ (index + 1
  // and a hash tag, 0 for an empty slot), at most half full: a node per name
  // missed the cache on every record of a large archive.
  bool name_written(std::string_view name) const;
  void index_name(std::size_t entry);
  std::vector<std::uint64_t> name_slots_;
  State state_ = State::idle;
  // Bytes written so far; zip offsets count from the start of the archive.
  std::uint64_t offset_ = 0;
  std::uint64_t remaining_ = 0;
  std::uint32_t running_crc_ = 0;
};

}  // namespace holdpoint::format
