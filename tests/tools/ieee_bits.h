// A double's IEEE-754 bit pattern as 16 hex digits, for the traces the
// training tools write: comparisons of losses and learning rates are then
// exact (tests/python/test_resume_fresh_process.py,
// tests/python/test_cross_language_resume.py).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

inline std::string ieee_bits(double value) {
  std::uint64_t b;
  std::memcpy(&b, &value, sizeof b);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(b));
  return text;
}
