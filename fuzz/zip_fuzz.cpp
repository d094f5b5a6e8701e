// Fuzz target for the strict zip reader: directory, local headers, CRCs.
// Rejection with holdpoint::Error is the expected outcome for most inputs;
// anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "format/zip/zip_reader.h"
#include "holdpoint/base/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  holdpoint::Limits limits;
  limits.max_records = 4096;
  limits.max_central_directory_bytes = 1 << 20;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const holdpoint::format::ZipArchive archive = holdpoint::format::read_zip_directory(file, limits);
    holdpoint::format::verify_zip_crcs(archive, file, limits);
    // Touch every payload byte and look every record up, so that a bounds
    // mistake in the reader shows up as an ASan report here.
    std::uint8_t sum = 0;
    for (const auto& entry : archive.entries) {
      for (std::byte b : holdpoint::format::zip_entry_bytes(file, entry)) sum ^= static_cast<std::uint8_t>(b);
      if (archive.find(entry.record) != &entry) __builtin_trap();
    }
    volatile std::uint8_t sink = sum;
    (void)sink;
  } catch (const holdpoint::Error&) {
  }
  return 0;
}
