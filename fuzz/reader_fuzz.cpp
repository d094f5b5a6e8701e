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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "format/zip/zip_writer.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/byte_sink.h"

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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto file = std::make_shared<std::vector<std::byte>>();
  if (size >= 1 && data[0] == 'R') {
    *file = archive_around(data + 1, size - 1);
  } else {
    file->assign(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size);
  }
  try {
    const auto mapping = holdpoint::parse_checkpoint_bytes(*file, file, fuzz_limits());
    std::uint64_t checksum = 0;
    touch(mapping.root, checksum);
  } catch (const holdpoint::Error&) {
    // Rejection with a code is the expected outcome for most inputs.
  }
  return 0;
}
