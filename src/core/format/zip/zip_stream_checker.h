// The local half of the strict zip reader for a file that is seen once, as a
// stream, in file order (scan_checkpoint, holdpoint/format/scan.h).
//
// read_zip_central_directory gives the entries; the checker then takes the
// file's bytes in order and, for each entry in local header order, runs the
// checks of read_zip_local_entries on the bytes as they pass (local header,
// payload bounds, data descriptor), computes the payload's CRC-32, and keeps
// the payloads the caller asks for (the small records and data.pkl). Memory is
// one header and the kept payloads, whatever the file size.
//
// It follows honest archives only: entries must tile the file from offset 0
// to the central directory, each starting where the previous one ended. At
// the first entry that does not (a failed check, a gap, an overlap) it stops
// and says so (local_entries_ok() is false); the file is then certainly
// malformed and read_zip_local_entries over random access names the exact
// error, as the in-memory reader would. consume() never throws for a
// malformed file.
//
// Thread-safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "format/zip/zip_reader.h"
#include "holdpoint/format/limits.h"

namespace holdpoint::format {

class ZipStreamChecker {
 public:
  // `archive` comes from read_zip_central_directory over a file of
  // `file_size` bytes and must outlive the checker; the checker fills its
  // entries' data_offset and end_offset. `keep` says which payloads to keep.
  ZipStreamChecker(ZipArchive& archive, std::uint64_t file_size, std::function<bool(const ZipEntry&)> keep);

  // The next bytes of the file, starting at `offset` (the end of the
  // previous call, 0 at first).
  void consume(std::uint64_t offset, std::span<const std::byte> bytes);

  // After the whole file: whether every entry passed its local checks and
  // the entries tile [0, central directory offset).
  bool local_entries_ok() const { return step_ == Step::done; }
  // Throws, as verify_zip_crcs does, for the first entry in directory order
  // whose CRC-32 does not match. Only after local_entries_ok().
  void check_crcs(const Limits& limits) const;
  // The payload of an entry `keep` chose. Only after local_entries_ok().
  std::span<const std::byte> kept(const ZipEntry& entry) const;
  // Called with each piece of every entry's payload as it passes (an empty
  // payload: once, with no bytes), by entry index in the directory; `last`
  // on its final piece.
  using PayloadObserver = std::function<void(std::size_t index, std::span<const std::byte> piece, bool last)>;
  void observe_payloads(PayloadObserver observer) { observe_ = std::move(observer); }

 private:
  enum class Step : std::uint8_t {
    header_start,
    header_rest,
    payload,
    descriptor_start,
    descriptor_rest,
    done,
    failed,
  };

  // Copies bytes into scratch_ until it holds `wanted` bytes; true when it does.
  bool gather(std::span<const std::byte>& bytes, std::size_t wanted);
  void begin_entry();
  void end_payload();
  void end_entry();

  ZipArchive& archive_;
  std::uint64_t file_size_;
  std::function<bool(const ZipEntry&)> keep_;
  PayloadObserver observe_;
  std::vector<std::uint32_t> by_offset_;  // entry indices in local header order
  std::vector<std::uint32_t> crcs_;       // by entry index
  // The kept payloads by entry index: only a few records (data.pkl and the
  // small ones), so nothing is spent per tensor.
  std::unordered_map<std::uint32_t, std::vector<std::byte>> kept_;
  std::vector<std::byte>* keeping_ = nullptr;  // the current entry's, while its payload passes
  std::uint64_t position_ = 0;            // offset of the next byte consume() expects
  Step step_ = Step::header_start;
  std::size_t current_ = 0;   // position in by_offset_
  std::vector<std::byte> scratch_;
  std::size_t header_size_ = 0;
  unsigned descriptor_width_ = 0;
  std::size_t descriptor_size_ = 0;
  std::uint64_t payload_left_ = 0;
};

}  // namespace holdpoint::format
