// A keyed hash for tables a file fills: SipHash-2-4 (Aumasson and Bernstein),
// keyed once per process from std::random_device. A file can fill a dict or a
// zip directory with a million keys; with a public hash function it could
// choose keys that all land in one slot and make every insert scan them all.
// Without the key it cannot.
//
// Thread-safety: all functions may be called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace holdpoint::detail {

struct SipKey {
  std::uint64_t k0 = 0;
  std::uint64_t k1 = 0;
};

// SipHash-2-4 of `size` bytes at `data` under `key`. With `fold_ascii_case`,
// of the bytes with 'A'..'Z' lowered (equal up to ASCII case, equal hash).
std::uint64_t siphash24(const SipKey& key, const void* data, std::size_t size, bool fold_ascii_case = false);

// The key of this process, drawn on first use.
const SipKey& process_sip_key();

inline std::uint64_t keyed_hash(std::string_view text) {
  return siphash24(process_sip_key(), text.data(), text.size());
}

}  // namespace holdpoint::detail
