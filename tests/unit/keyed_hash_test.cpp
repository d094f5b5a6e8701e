// SipHash-2-4 against the reference vectors (key 00..0f, messages 00 01 ...),
// ASCII case folding, and the process key.
#include "base/keyed_hash.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace holdpoint::detail {
namespace {

SipKey reference_key() {
  SipKey key;
  for (int i = 0; i < 8; ++i) {
    key.k0 |= std::uint64_t(i) << (8 * i);
    key.k1 |= std::uint64_t(8 + i) << (8 * i);
  }
  return key;
}

TEST(SipHash, MatchesTheReferenceVectors) {
  std::array<std::uint8_t, 64> message{};
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<std::uint8_t>(i);
  const SipKey key = reference_key();
  // Message lengths 0, 7, 8, 15 and 63: empty, one partial block, one whole
  // block, a whole and a partial one, many.
  EXPECT_EQ(siphash24(key, message.data(), 0), 0x726fdb47dd0e0e31u);
  EXPECT_EQ(siphash24(key, message.data(), 7), 0xab0200f58b01d137u);
  EXPECT_EQ(siphash24(key, message.data(), 8), 0x93f5f5799a932462u);
  EXPECT_EQ(siphash24(key, message.data(), 15), 0xa129ca6149be45e5u);
  EXPECT_EQ(siphash24(key, message.data(), 63), 0x958a324ceb064572u);
}

TEST(SipHash, FoldingMakesNamesEqualUpToAsciiCaseHashEqual) {
  const SipKey key = reference_key();
  const std::string upper = "Archive/Data/Model.Weight_Z", lower = "archive/data/model.weight_z";
  EXPECT_EQ(siphash24(key, upper.data(), upper.size(), true), siphash24(key, lower.data(), lower.size(), true));
  EXPECT_EQ(siphash24(key, lower.data(), lower.size(), true), siphash24(key, lower.data(), lower.size()));
  EXPECT_NE(siphash24(key, upper.data(), upper.size()), siphash24(key, lower.data(), lower.size()));
  const std::string other = "archive/data/model.weight_y";  // folding changes only 'A'..'Z'
  EXPECT_NE(siphash24(key, other.data(), other.size(), true), siphash24(key, lower.data(), lower.size(), true));
}

TEST(SipHash, FoldingLowersExactlyAsciiUppercaseForEveryByteValue) {
  const SipKey key = reference_key();
  for (int value = 0; value < 256; ++value) {
    for (std::size_t at : {0u, 3u, 7u, 8u, 12u}) {  // in a whole block and in the tail
      std::string text(13, 'q');
      text[at] = static_cast<char>(value);
      std::string lowered = text;
      if (value >= 'A' && value <= 'Z') lowered[at] = static_cast<char>(value + ('a' - 'A'));
      ASSERT_EQ(siphash24(key, text.data(), text.size(), true), siphash24(key, lowered.data(), lowered.size()))
          << "byte " << value << " at " << at;
    }
  }
}

TEST(SipHash, TheProcessKeyIsDrawnOnceAndIsNotZero) {
  const SipKey& key = process_sip_key();
  EXPECT_EQ(&key, &process_sip_key());
  EXPECT_TRUE(key.k0 != 0 || key.k1 != 0);
  EXPECT_EQ(keyed_hash("layer0.weight"), siphash24(key, "layer0.weight", 13));
  EXPECT_NE(keyed_hash("layer0.weight"), siphash24(reference_key(), "layer0.weight", 13));
}

TEST(SlotCode, APositionComesBackAndTheTagIsTheHashsTopBits) {
  const SlotCode code(std::size_t{1} << 19);  // 19 position bits, a 13-bit tag
  const std::uint64_t hash = 0xABCD'0000'0000'1234;
  for (std::uint32_t position : {0u, 1u, 200000u, (1u << 18) - 1}) {
    const std::uint32_t slot = code.encode(position, hash);
    EXPECT_NE(slot, 0u) << "a used slot reads as free";
    EXPECT_EQ(code.position(slot), position);
    EXPECT_EQ(slot >> 19, 0xABCDu >> 3);
    EXPECT_TRUE(code.may_hold(slot, hash));
    // The low bits choose the slot, so a hash that differs only there keeps
    // the tag; one that differs in the top bits does not.
    EXPECT_TRUE(code.may_hold(slot, hash ^ 0xFFFF));
    EXPECT_FALSE(code.may_hold(slot, hash ^ (std::uint64_t{1} << 63)));
    EXPECT_FALSE(code.may_hold(slot, hash ^ (std::uint64_t{1} << 51)));
  }
}

TEST(SlotCode, SmallestAndLargestTables) {
  const SlotCode small(16);  // 4 position bits, a 28-bit tag
  const std::uint64_t hash = ~std::uint64_t{0};
  EXPECT_EQ(small.position(small.encode(7, hash)), 7u);
  EXPECT_EQ(small.encode(7, hash) >> 4, (1u << 28) - 1);
  // 2^32 slots and more leave no room for a tag: every slot may hold any key.
  const SlotCode huge(std::size_t{1} << 33);
  EXPECT_EQ(huge.encode(0xFFFF'FFFD, hash), 0xFFFF'FFFEu);
  EXPECT_EQ(huge.position(0xFFFF'FFFEu), 0xFFFF'FFFDu);
  EXPECT_TRUE(huge.may_hold(1, hash));
  EXPECT_TRUE(huge.may_hold(1, 0));
}

TEST(ForEachHashedAhead, VisitsEveryIndexOnceInOrderWithItsOwnHash) {
  const std::array<std::uint32_t, 64> slots{};
  // Around the look-ahead distance (8), and well past it.
  for (const std::size_t count : {0u, 1u, 7u, 8u, 9u, 16u, 1000u}) {
    std::vector<std::pair<std::size_t, std::uint64_t>> visits;
    std::size_t hashed = 0;
    for_each_hashed_ahead(
        count, slots.data(), slots.size() - 1,
        [&](std::size_t i) {
          ++hashed;
          return std::uint64_t{i} * 0x9E3779B97F4A7C15u + 1;
        },
        [&](std::size_t i, std::uint64_t hash) { visits.emplace_back(i, hash); });
    EXPECT_EQ(hashed, count) << "each entry is hashed exactly once";
    ASSERT_EQ(visits.size(), count);
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT_EQ(visits[i].first, i);
      EXPECT_EQ(visits[i].second, std::uint64_t{i} * 0x9E3779B97F4A7C15u + 1) << "entry " << i;
    }
  }
}

}  // namespace
}  // namespace holdpoint::detail
