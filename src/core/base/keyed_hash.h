// A keyed hash for tables a file fills: SipHash-2-4 (Aumasson and Bernstein),
// keyed once per process from std::random_device. A file can fill a dict or a
// zip directory with a million keys; with a public hash function it could
// choose keys that all land in one slot and make every insert scan them all.
// Without the key it cannot.
//
// Thread-safety: all functions may be called concurrently.
#pragma once

#include <algorithm>
#include <bit>
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

// The slots of the open-addressing tables such keys fill (Dict's index, a
// zip archive's record index): 32 bits each, 0 for a free slot. A slot holds
// a position + 1 in its low bits and, in the high bits that a position in a
// table of this size never needs, a tag: the hash's top bits, which the slot
// index (its low bits) does not use. A probe compares a stored key only
// where the tag matches. At 200,000 keys each compare costs a cache miss or
// two (the entry, and a long key's heap bytes); a table of 2^19 slots has a
// 13-bit tag, which skips all but 1 in 8192 of the compares with other keys.
// The tables keep at least twice as many slots as positions, so position + 1
// always fits below the tag; a table of 2^32 slots or more has no tag.
class SlotCode {
 public:
  // `table_size` is a power of two.
  explicit SlotCode(std::size_t table_size) noexcept
      : position_bits_(static_cast<unsigned>(std::countr_zero(table_size))),
        tag_bits_(position_bits_ >= 32 ? 0 : 32 - position_bits_) {}

  std::uint32_t encode(std::uint32_t position, std::uint64_t hash) const noexcept {
    return static_cast<std::uint32_t>((std::uint64_t{tag_of(hash)} << position_bits_) | (std::uint64_t{position} + 1));
  }
  // The position a used (nonzero) slot holds. A slot edited by hand may
  // give any value; callers bound it by their entry count.
  std::uint32_t position(std::uint32_t slot) const noexcept {
    const std::uint64_t mask = tag_bits_ == 0 ? 0xFFFFFFFFu : (std::uint64_t{1} << position_bits_) - 1;
    return static_cast<std::uint32_t>((slot & mask) - 1);
  }
  // False where the slot's key cannot be one with this hash.
  bool may_hold(std::uint32_t slot, std::uint64_t hash) const noexcept {
    return tag_bits_ == 0 || (slot >> position_bits_) == tag_of(hash);
  }

 private:
  std::uint32_t tag_of(std::uint64_t hash) const noexcept {
    return tag_bits_ == 0 ? 0 : static_cast<std::uint32_t>(hash >> (64 - tag_bits_));
  }
  unsigned position_bits_;
  unsigned tag_bits_;
};

// Calls visit(i, hash_of(i)) for each i in [0, count), in order, computing
// each hash a few entries early and prefetching its home slot in `slots` (a
// table of mask + 1 slots, a power of two): in a table larger than the
// caches, each first probe would otherwise wait on memory.
template <typename Slot, typename HashOf, typename Visit>
void for_each_hashed_ahead(std::size_t count, const Slot* slots, std::size_t mask, HashOf hash_of, Visit visit) {
  constexpr std::size_t kAhead = 8;
  std::uint64_t ahead[kAhead];
  const auto hash_ahead = [&](std::size_t i) {
    ahead[i % kAhead] = hash_of(i);
    __builtin_prefetch(&slots[ahead[i % kAhead] & mask], 1);
  };
  for (std::size_t i = 0; i < std::min(kAhead, count); ++i) hash_ahead(i);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t hash = ahead[i % kAhead];
    if (i + kAhead < count) hash_ahead(i + kAhead);
    visit(i, hash);
  }
}

}  // namespace holdpoint::detail
