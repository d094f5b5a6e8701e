// Fuzz target for the whole reader (format detection, zip, record policy,
// pickle VM, legacy streams, safetensors) as load_checkpoint_mapping runs it.
//
// Naive byte mutation of a zip stops at the CRC and offset checks, so the
// first input byte picks a mode:
//   'R' <pickle bytes>  the bytes become data.pkl of a well-formed archive with
//                       valid CRCs and storage records data/0..data/4 of
//                       0, 1, 8, 24 and 64 bytes, so the pickle VM and the
//                       storage/tensor checks are fuzzed behind a valid zip;
//   anything else       the whole input is the file.
//
// The same file is then scanned (scan_checkpoint, holdpoint/format/scan.h)
// through a memfd: it must reach the same verdict, code and records without
// holding the file.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/zip/zip_writer.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/byte_sink.h"
#include "support/dropped_tensors.h"

namespace {

holdpoint::Limits fuzz_limits() {
  holdpoint::Limits limits;
  limits.max_records = 4096;
  limits.max_pickle_bytes = 1 << 20;
  limits.max_opcodes = 1 << 20;
  limits.max_stack_items = 1 << 16;
  limits.max_memo_entries = 1 << 16;
  limits.max_container_elements = 1 << 18;
  limits.max_expanded_nodes = 1 << 20;
  limits.max_tensors = 1 << 12;
  limits.max_tensor_numel = 1 << 24;
  limits.max_tensor_logical_bytes = 1 << 26;
  limits.max_safetensors_header_bytes = 1 << 20;
  return limits;
}

std::vector<std::byte> archive_around(const std::uint8_t* pickle, std::size_t size) {
  holdpoint::io::MemorySink sink;
  holdpoint::format::ZipWriter zip(sink, "archive");
  zip.add_record("data.pkl", {reinterpret_cast<const std::byte*>(pickle), size});
  zip.add_record("byteorder", {reinterpret_cast<const std::byte*>("little"), 6});
  const std::size_t sizes[] = {0, 1, 8, 24, 64};
  for (std::size_t i = 0; i < 5; ++i) {
    std::vector<std::byte> storage(sizes[i], std::byte{0x3f});
    zip.add_record("data/" + std::to_string(i), storage);
  }
  zip.add_record("version", {reinterpret_cast<const std::byte*>("3\n"), 2});
  zip.finish();
  return sink.take();
}

// Reads every tensor element so that a view reaching outside its storage is
// caught by AddressSanitizer.
void touch(const holdpoint::Value& value, std::uint64_t& checksum) {
  if (value.is_tensor()) {
    for (std::byte b : value.as_tensor().contiguous_bytes()) checksum += static_cast<std::uint8_t>(b);
  } else if (value.is_sequence()) {
    for (const auto& item : value.as_list()) touch(item, checksum);
  } else if (value.is_dict()) {
    for (const auto& entry : value.as_dict()) touch(entry.second, checksum);
  }
}

// A reading's verdict: the code, or what it found (format, records).
struct Verdict {
  std::optional<holdpoint::ErrorCode> code;
  std::string records;
  bool operator==(const Verdict&) const = default;
};

Verdict verdict_of(const holdpoint::LoadedMapping& mapping) {
  Verdict verdict;
  verdict.records = std::string(holdpoint::file_format_name(mapping.format)) + mapping.markers.producer;
  for (const auto& record : mapping.records) {
    verdict.records += record.name + ":" + std::to_string(record.offset) + "+" + std::to_string(record.size) + ";";
  }
  return verdict;
}

// scan_checkpoint of `file` through an anonymous in-memory file. For
// ScanKeeps::verdict the records are not listed and no tensor is kept (its
// tree must read as `full`, the parse's, with the tensors dropped): the
// verdict carries the format and producer alone.
Verdict scanned(const std::vector<std::byte>& file, holdpoint::ScanKeeps keeps, const holdpoint::Value& full = {}) {
  const int fd = ::memfd_create("scan_fuzz", MFD_CLOEXEC);
  if (fd < 0) __builtin_trap();
  for (std::size_t done = 0; done < file.size();) {
    const ssize_t n = ::write(fd, file.data() + done, file.size() - done);
    if (n <= 0) __builtin_trap();
    done += static_cast<std::size_t>(n);
  }
  Verdict verdict;
  try {
    holdpoint::LoadOptions options;
    options.limits = fuzz_limits();
    const auto mapping = holdpoint::scan_checkpoint("/proc/self/fd/" + std::to_string(fd), options, keeps);
    if (keeps == holdpoint::ScanKeeps::verdict) {
      if (!mapping.records.empty()) __builtin_trap();
      if (!holdpoint::testing::reads_as_dropped(mapping.root, full)) __builtin_trap();
      verdict.records = std::string(holdpoint::file_format_name(mapping.format)) + mapping.markers.producer;
    } else {
      verdict = verdict_of(mapping);
    }
  } catch (const holdpoint::Error& error) {
    verdict.code = error.code();
  }
  ::close(fd);
  return verdict;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto file = std::make_shared<std::vector<std::byte>>();
  if (size >= 1 && data[0] == 'R') {
    *file = archive_around(data + 1, size - 1);
  } else {
    file->assign(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
  }
  Verdict verdict;
  std::string described;  // format and producer, what a ScanKeeps::verdict scan tells
  holdpoint::Value root;
  try {
    const auto mapping = holdpoint::parse_checkpoint_bytes(*file, file, fuzz_limits());
    verdict = verdict_of(mapping);
    described = std::string(holdpoint::file_format_name(mapping.format)) + mapping.markers.producer;
    root = mapping.root;
    std::uint64_t checksum = 0;
    touch(mapping.root, checksum);
  } catch (const holdpoint::Error& error) {
    // Rejection with a code is the expected outcome for most inputs.
    verdict.code = error.code();
  }
  // parse_checkpoint_bytes has no file to open: an empty input is file_empty
  // both ways.
  if (!(scanned(*file, holdpoint::ScanKeeps::tree) == verdict)) __builtin_trap();
  if (!(scanned(*file, holdpoint::ScanKeeps::verdict, root) == Verdict{verdict.code, described})) __builtin_trap();
  return 0;
}
