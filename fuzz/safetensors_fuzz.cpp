// Fuzz target for the safetensors reader and writer.
//
// Any input either throws holdpoint::Error or parses into tensors that lie
// inside the input (every byte is read, so ASan sees any escape) and that
// survive a write/read round trip unchanged. Anything else aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>

#include "format/safetensors/safetensors.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/byte_sink.h"

namespace {

// Written so that reading every tensor byte cannot be optimised away.
volatile unsigned touched_checksum = 0;

holdpoint::Limits tight_limits() {
  holdpoint::Limits limits;
  limits.max_safetensors_header_bytes = 1 << 16;
  limits.max_json_depth = 8;
  limits.max_tensors = 256;
  limits.max_tensor_rank = 8;
  limits.max_string_bytes = 1 << 10;
  return limits;
}

// The writer reorders tensors (by element size, then name), so the round trip
// preserves the mapping, not the key order.
bool same_tensors(const holdpoint::Value& a, const holdpoint::Value& b) {
  const holdpoint::Dict& x = a.as_dict();
  const holdpoint::Dict& y = b.as_dict();
  if (x.size() != y.size()) return false;
  for (const auto& [key, value] : x) {
    const holdpoint::Value* other = y.find(key);
    if (!other || !holdpoint::equal_content(value, *other)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = std::as_bytes(std::span<const std::uint8_t>(data, size));
  const holdpoint::Limits limits = tight_limits();
  holdpoint::format::SafetensorsFile parsed;
  try {
    parsed = holdpoint::format::read_safetensors(file, nullptr, limits);
  } catch (const holdpoint::Error&) {
    return 0;
  }

  unsigned checksum = 0;
  for (const auto& [name, value] : parsed.root.as_dict()) {
    for (const std::byte b : value.as_tensor().storage->bytes()) checksum += static_cast<unsigned>(b);
  }
  touched_checksum = checksum;

  holdpoint::io::MemorySink sink;
  holdpoint::format::write_safetensors(sink, parsed.root, parsed.metadata);
  // Rewriting can add up to 7 bytes of padding to a header that was at the bound.
  holdpoint::Limits reread_limits = limits;
  reread_limits.max_safetensors_header_bytes += 8;
  const auto rewritten = holdpoint::format::read_safetensors(sink.bytes(), nullptr, reread_limits);
  if (!same_tensors(parsed.root, rewritten.root) || parsed.metadata != rewritten.metadata) std::abort();
  return 0;
}
