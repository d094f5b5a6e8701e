// Fuzz target for the strict zip reader: directory, local headers, CRCs.
// Rejection with holdpoint::Error is the expected outcome for most inputs;
// anything else (a crash, a sanitizer report, another exception) is a bug.
//
// The same bytes then go through the streaming half of the reader
// (read_zip_central_directory, then ZipStreamChecker fed in pieces whose size
// the first byte picks): it must accept exactly the archives
// read_zip_directory accepts, with the same offsets, CRC verdict and payloads.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "format/zip/zip_reader.h"
#include "format/zip/zip_stream_checker.h"
#include "holdpoint/base/error.h"

namespace {

using holdpoint::format::ZipArchive;
using holdpoint::format::ZipEntry;

bool keep_small(const ZipEntry& entry) { return entry.size <= 64; }

void check_streamed(std::span<const std::byte> file, const holdpoint::Limits& limits,
                    const std::optional<ZipArchive>& expected, std::optional<holdpoint::ErrorCode> expected_crc) {
  ZipArchive streamed;
  try {
    holdpoint::format::ZipMemorySource source(file);
    streamed = holdpoint::format::read_zip_central_directory(source, limits);
  } catch (const holdpoint::Error&) {
    if (expected) __builtin_trap();  // the first stage refuses what the whole reader accepts
    return;
  }
  holdpoint::format::ZipStreamChecker checker(streamed, file.size(), keep_small);
  const std::size_t piece = file.empty() ? 1 : 1 + std::to_integer<std::size_t>(file[0]) % 97;
  for (std::size_t at = 0; at < file.size(); at += piece) {
    checker.consume(at, file.subspan(at, std::min(piece, file.size() - at)));
  }
  if (checker.local_entries_ok() != expected.has_value()) __builtin_trap();
  if (!expected) return;
  for (std::size_t i = 0; i < streamed.entries.size(); ++i) {
    const ZipEntry& entry = streamed.entries[i];
    if (entry.data_offset != expected->entries[i].data_offset ||
        entry.end_offset != expected->entries[i].end_offset) {
      __builtin_trap();
    }
    if (keep_small(entry)) {
      const auto kept = checker.kept(entry);
      const auto payload = holdpoint::format::zip_entry_bytes(file, entry);
      if (!std::equal(kept.begin(), kept.end(), payload.begin(), payload.end())) __builtin_trap();
    }
  }
  std::optional<holdpoint::ErrorCode> crc;
  try {
    checker.check_crcs(limits);
  } catch (const holdpoint::Error& error) {
    crc = error.code();
  }
  if (crc != expected_crc) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  holdpoint::Limits limits;
  limits.max_records = 4096;
  limits.max_central_directory_bytes = 1 << 20;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  std::optional<ZipArchive> accepted;
  std::optional<holdpoint::ErrorCode> crc_code;
  try {
    const ZipArchive archive = holdpoint::format::read_zip_directory(file, limits);
    accepted = archive;
    try {
      holdpoint::format::verify_zip_crcs(archive, file, limits);
    } catch (const holdpoint::Error& error) {
      crc_code = error.code();
    }
    // Touch every payload byte and look every record up, so that a bounds
    // mistake in the reader shows up as an ASan report here.
    std::uint8_t sum = 0;
    for (const auto& entry : archive.entries) {
      for (std::byte b : holdpoint::format::zip_entry_bytes(file, entry)) sum ^= static_cast<std::uint8_t>(b);
      if (archive.find(entry.record()) != &entry) __builtin_trap();
    }
    volatile std::uint8_t sink = sum;
    (void)sink;
  } catch (const holdpoint::Error&) {
  }
  check_streamed(file, limits, accepted, crc_code);
  return 0;
}
