// Dict: insertion order, lookups and refusals on either side of the size where
// it starts keeping a hash index, and at sizes whose index holds tagged slots
// (detail::SlotCode) of several widths.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "holdpoint/format/value.h"

namespace holdpoint {
namespace {

std::string key_of(std::size_t i) { return "model.layers." + std::to_string(i) + ".self_attn.q_proj.weight"; }

class DictAtSize : public ::testing::TestWithParam<std::size_t> {};

TEST_P(DictAtSize, FindsEveryKeyRefusesRepeatsAndKeepsOrder) {
  const std::size_t n = GetParam();
  Dict dict;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(dict.insert(key_of(i), Value::integer(static_cast<std::int64_t>(i)))) << i;
    ASSERT_TRUE(dict.insert(static_cast<std::int64_t>(i), Value::integer(-static_cast<std::int64_t>(i)))) << i;
  }
  ASSERT_EQ(dict.size(), 2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const Value* by_name = dict.find(key_of(i));
    ASSERT_NE(by_name, nullptr) << key_of(i);
    EXPECT_EQ(by_name->as_int(), static_cast<std::int64_t>(i));
    const Value* by_number = dict.find(static_cast<std::int64_t>(i));
    ASSERT_NE(by_number, nullptr) << i;
    EXPECT_EQ(by_number->as_int(), -static_cast<std::int64_t>(i));
    EXPECT_EQ(dict.at_index(2 * i).first.as_string(), key_of(i));
  }
  // Absent keys, including a prefix, a longer key and a number as text.
  EXPECT_EQ(dict.find(key_of(n)), nullptr);
  EXPECT_EQ(dict.find(std::string("model.layers.")), nullptr);
  EXPECT_EQ(dict.find(key_of(0) + "x"), nullptr);
  EXPECT_EQ(dict.find(static_cast<std::int64_t>(n)), nullptr);
  if (n > 0) {
    EXPECT_EQ(dict.find(std::string("0")), nullptr);
  }
  // A repeated key changes nothing.
  for (std::size_t i = 0; i < n; i += 1 + n / 50) {
    EXPECT_FALSE(dict.insert(key_of(i), Value::none())) << key_of(i);
    EXPECT_FALSE(dict.insert(static_cast<std::int64_t>(i), Value::none())) << i;
  }
  EXPECT_EQ(dict.size(), 2 * n);
  if (n > 0) {
    EXPECT_EQ(dict.find(key_of(n - 1))->as_int(), static_cast<std::int64_t>(n - 1));
    dict.insert_or_assign(key_of(n - 1), Value::integer(42));
    EXPECT_EQ(dict.find(key_of(n - 1))->as_int(), 42);
    EXPECT_EQ(dict.size(), 2 * n);
  }
}

TEST_P(DictAtSize, PrefetchChangesNothing) {
  const std::size_t n = GetParam();
  Dict dict;
  dict.prefetch("anything");
  for (std::size_t i = 0; i < n; ++i) {
    dict.prefetch(key_of(i));
    ASSERT_TRUE(dict.insert(key_of(i), Value::integer(static_cast<std::int64_t>(i))));
  }
  for (std::size_t i = 0; i <= n; ++i) dict.prefetch(key_of(i));
  ASSERT_EQ(dict.size(), n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_NE(dict.find(key_of(i)), nullptr) << i;
  EXPECT_EQ(dict.find(key_of(n)), nullptr);
}

// 0; just below, at and above the index threshold (16); tables of 2^12 to
// 2^18 slots, across their doublings.
INSTANTIATE_TEST_SUITE_P(Sizes, DictAtSize, ::testing::Values(0, 1, 7, 8, 9, 1000, 32769, 70000));

TEST(DictCopy, ACopyKeepsAWorkingIndex) {
  Dict dict;
  for (std::size_t i = 0; i < 5000; ++i) dict.insert(key_of(i), Value::integer(static_cast<std::int64_t>(i)));
  Dict copy = dict;
  EXPECT_FALSE(copy.insert(key_of(4999), Value::none()));
  EXPECT_TRUE(copy.insert(key_of(5000), Value::none()));
  EXPECT_EQ(copy.find(key_of(1234))->as_int(), 1234);
  EXPECT_EQ(dict.find(key_of(5000)), nullptr);
}

}  // namespace
}  // namespace holdpoint
