#include "base/keyed_hash.h"

#include <bit>
#include <cstring>
#include <random>

namespace holdpoint::detail {

namespace {

constexpr std::uint64_t rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipState {
  std::uint64_t v0, v1, v2, v3;

  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }

  void absorb(std::uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

constexpr std::uint64_t kEachByte = 0x0101010101010101u;

// 'A'..'Z' lowered in each byte of `word` at once: a byte below 0x80 gets its
// top bit set by adding 0x80 - 'A' when it is >= 'A', and by adding
// 0x80 - 'Z' - 1 when it is > 'Z' (no carry crosses bytes: 0x7F + 0x3F < 0x100).
std::uint64_t folded(std::uint64_t word) {
  constexpr std::uint64_t kHigh = 0x80 * kEachByte;
  const std::uint64_t low7 = word & ~kHigh;
  const std::uint64_t at_least_a = low7 + (0x80 - 'A') * kEachByte;
  const std::uint64_t above_z = low7 + (0x80 - 'Z' - 1) * kEachByte;
  const std::uint64_t upper = at_least_a & ~above_z & ~word & kHigh;
  return word | (upper >> 2);  // 0x80 >> 2 = 0x20, 'a' - 'A'
}

// `count` (<= 8) little-endian bytes from `p`.
std::uint64_t load(const std::uint8_t* p, std::size_t count, bool fold) {
  std::uint64_t m = 0;
  if (count == 8) {
    std::memcpy(&m, p, 8);
    if constexpr (std::endian::native == std::endian::big) m = __builtin_bswap64(m);
  } else {
    for (std::size_t i = 0; i < count; ++i) m |= std::uint64_t{p[i]} << (8 * i);
  }
  return fold ? folded(m) : m;
}

}  // namespace

std::uint64_t siphash24(const SipKey& key, const void* data, std::size_t size, bool fold_ascii_case) {
  SipState s{key.k0 ^ 0x736f6d6570736575u, key.k1 ^ 0x646f72616e646f6du, key.k0 ^ 0x6c7967656e657261u,
             key.k1 ^ 0x7465646279746573u};
  const auto* p = static_cast<const std::uint8_t*>(data);
  const std::size_t whole = size & ~std::size_t{7};
  for (std::size_t i = 0; i < whole; i += 8) s.absorb(load(p + i, 8, fold_ascii_case));
  s.absorb(load(p + whole, size - whole, fold_ascii_case) | (std::uint64_t{size & 0xff} << 56));
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

const SipKey& process_sip_key() {
  static const SipKey key = [] {
    std::random_device random;
    const auto draw = [&random] { return (std::uint64_t{random()} << 32) ^ random(); };
    return SipKey{draw(), draw()};
  }();
  return key;
}

}  // namespace holdpoint::detail
