// IEEE 754 binary16 ("half") and bfloat16 bit patterns widened to double,
// subnormals, infinities and NaN included. Shared by the pickle reader (NumPy
// float16 scalars) and the resume comparator (float16 and bfloat16 tensors).
// Also the exact widening of NumPy's float32/float16 scalars, NaN payloads
// kept, and its inverse, shared by the reader and the Python extension.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace holdpoint::value {

inline double half_to_double(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  }
  return sign * std::ldexp(mantissa + 1024, exponent - 25);
}

// bfloat16 is the upper half of a float32.
inline double bfloat16_to_double(std::uint16_t bits) {
  const std::uint32_t widened = std::uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

// A float32 (23 mantissa bits) or float16 (10) as a double, exactly: a NaN
// keeps its sign and its whole mantissa, the quiet bit included, in the top
// bits of the double's (a float-to-double conversion would quiet a signaling
// NaN, and half_to_double makes every NaN the canonical one), so that the
// NumPy scalar it came from can be rebuilt bit for bit by narrow_nan_bits.
inline double narrow_float_to_double(std::uint32_t bits, int mantissa_bits) {
  const int exponent_bits = mantissa_bits == 23 ? 8 : 5;
  const std::uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  const std::uint32_t exponent = (bits >> mantissa_bits) & ((1u << exponent_bits) - 1);
  const bool negative = (bits >> (mantissa_bits + exponent_bits)) & 1u;
  if (exponent == (1u << exponent_bits) - 1 && mantissa != 0) {
    const std::uint64_t wide = (std::uint64_t{negative} << 63) | (std::uint64_t{0x7FF} << 52) |
                               (std::uint64_t{mantissa} << (52 - mantissa_bits));
    return std::bit_cast<double>(wide);
  }
  if (mantissa_bits == 23) return static_cast<double>(std::bit_cast<float>(bits));
  return half_to_double(static_cast<std::uint16_t>(bits));
}

// The inverse for a NaN: the float32 (23) or float16 (10) NaN whose sign and
// mantissa narrow_float_to_double kept in `nan`'s top bits. A NaN with no
// payload left in those bits becomes the narrow type's quiet NaN.
inline std::uint32_t narrow_nan_bits(double nan, int mantissa_bits) {
  const int exponent_bits = mantissa_bits == 23 ? 8 : 5;
  const auto bits = std::bit_cast<std::uint64_t>(nan);
  std::uint64_t mantissa = (bits & ((std::uint64_t{1} << 52) - 1)) >> (52 - mantissa_bits);
  if (mantissa == 0) mantissa = std::uint64_t{1} << (mantissa_bits - 1);
  const std::uint64_t exponent = (std::uint64_t{1} << exponent_bits) - 1;
  return static_cast<std::uint32_t>(((bits >> 63) << (mantissa_bits + exponent_bits)) | (exponent << mantissa_bits) |
                                    mantissa);
}

}  // namespace holdpoint::value
