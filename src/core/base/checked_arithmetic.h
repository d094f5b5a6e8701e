// Overflow-checked integer arithmetic for sizes read from files.
//
// Every size, offset and count that comes from untrusted bytes is combined only
// through these helpers; they report overflow instead of wrapping.
#pragma once

#include <cstdint>
#include <optional>

namespace holdpoint::detail {

template <typename T>
std::optional<T> checked_add(T a, T b) {
  T result;
  if (__builtin_add_overflow(a, b, &result)) return std::nullopt;
  return result;
}

template <typename T>
std::optional<T> checked_mul(T a, T b) {
  T result;
  if (__builtin_mul_overflow(a, b, &result)) return std::nullopt;
  return result;
}

}  // namespace holdpoint::detail
