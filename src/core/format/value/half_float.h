// IEEE 754 binary16 ("half") and bfloat16 bit patterns widened to double,
// subnormals, infinities and NaN included. Shared by the pickle reader (NumPy
// float16 scalars) and the resume comparator (float16 and bfloat16 tensors).
#pragma once

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

}  // namespace holdpoint::value
