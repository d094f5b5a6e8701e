// Element comparison for holdpoint diff: the numeric rules of diff_elements.h.
#include "verify/diff_elements.h"

#include <cmath>
#include <cstring>

#include "base/fail.h"
#include "format/value/half_float.h"

namespace holdpoint::diff {

using detail::concat;

std::vector<std::int64_t> index_of(std::uint64_t linear, const Dims& sizes) {
  std::vector<std::int64_t> index(sizes.size(), 0);
  for (std::size_t d = sizes.size(); d-- > 0;) {
    const auto size = static_cast<std::uint64_t>(sizes[d]);
    if (size == 0) break;
    index[d] = static_cast<std::int64_t>(linear % size);
    linear /= size;
  }
  return index;
}

namespace {

enum class ElementClass : std::uint8_t { floating, complex, signed_integer, unsigned_integer, bitwise };

ElementClass element_class(DType dtype) {
  switch (dtype) {
    case DType::float64:
    case DType::float32:
    case DType::float16:
    case DType::bfloat16: return ElementClass::floating;
    case DType::complex32:
    case DType::complex64:
    case DType::complex128: return ElementClass::complex;
    case DType::int64:
    case DType::int32:
    case DType::int16:
    case DType::int8: return ElementClass::signed_integer;
    case DType::uint8:
    case DType::uint16:
    case DType::uint32:
    case DType::uint64:
    case DType::boolean: return ElementClass::unsigned_integer;
    default: return ElementClass::bitwise;
  }
}

template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

// One real number of a floating dtype (or one part of a complex one).
double load_real(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::float64:
    case DType::complex128: return load<double>(p);
    case DType::float32:
    case DType::complex64: return load<float>(p);
    case DType::float16:
    case DType::complex32: return value::half_to_double(load<std::uint16_t>(p));
    case DType::bfloat16: return value::bfloat16_to_double(load<std::uint16_t>(p));
    default: return 0;
  }
}

std::int64_t load_signed(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::int64: return load<std::int64_t>(p);
    case DType::int32: return load<std::int32_t>(p);
    case DType::int16: return load<std::int16_t>(p);
    default: return load<std::int8_t>(p);
  }
}

std::uint64_t load_unsigned(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::uint64: return load<std::uint64_t>(p);
    case DType::uint32: return load<std::uint32_t>(p);
    case DType::uint16: return load<std::uint16_t>(p);
    default: return load<std::uint8_t>(p);
  }
}


}  // namespace

void DeviationCounter::part(double a, double b, std::uint64_t at, bool& unequal_pair, bool& differs) {
  if (a == b) return;
  const bool a_nan = std::isnan(a);
  const bool b_nan = std::isnan(b);
  if (a_nan && b_nan) return;
  unequal_pair = true;
  if (a_nan || b_nan) {
    differs = true;
    return;
  }
  const double deviation = std::fabs(a - b);
  if (!(deviation <= atol_ + rtol_ * std::fabs(b))) differs = true;
  if (!max_abs_ || deviation > *max_abs_) {
    max_abs_ = deviation;
    max_abs_at_ = at;
  }
  if (b != 0) {
    const double relative = deviation / std::fabs(b);
    if (!max_rel_ || relative > *max_rel_) max_rel_ = relative;
  }
}

Deviation DeviationCounter::finish() {
  Deviation out = deviation_;
  out.max_abs_deviation = max_abs_;
  out.max_rel_deviation = max_rel_;
  if (sizes_) {
    if (max_abs_) out.max_abs_index = index_of(max_abs_at_, *sizes_);
    if (out.unequal > 0) out.first_index = index_of(out.differing > 0 ? first_differing_ : first_unequal_, *sizes_);
  }
  return out;
}

void DeviationCounter::integer_distance(double distance, double magnitude, std::uint64_t at) {
  if (!max_abs_ || distance > *max_abs_) {
    max_abs_ = distance;
    max_abs_at_ = at;
  }
  if (magnitude != 0 && (!max_rel_ || distance / magnitude > *max_rel_)) max_rel_ = distance / magnitude;
  unequal(at, true);
}

void compare_chunk(DType dtype, std::size_t unit, const std::byte* a, const std::byte* b, std::size_t count,
                   std::uint64_t first, DeviationCounter& counter) {
  counter.add_numel(count);
  // Whole equal stretches cost one memcmp: most tensors compared are equal.
  if (std::memcmp(a, b, count * unit) == 0) return;
  switch (element_class(dtype)) {
    case ElementClass::floating:
      for (std::size_t i = 0; i < count; ++i) {
        counter.reals(load_real(dtype, a + i * unit), load_real(dtype, b + i * unit), first + i);
      }
      return;
    case ElementClass::complex: {
      // One element differs when either part is beyond tolerance; deviations
      // are over the parts.
      const std::size_t half = unit / 2;
      for (std::size_t i = 0; i < count; ++i) {
        const std::byte* pa = a + i * unit;
        const std::byte* pb = b + i * unit;
        bool unequal_pair = false;
        bool differs = false;
        counter.part(load_real(dtype, pa), load_real(dtype, pb), first + i, unequal_pair, differs);
        counter.part(load_real(dtype, pa + half), load_real(dtype, pb + half), first + i, unequal_pair, differs);
        if (unequal_pair) counter.unequal(first + i, differs);
      }
      return;
    }
    case ElementClass::signed_integer:
      for (std::size_t i = 0; i < count; ++i) {
        counter.integers(load_signed(dtype, a + i * unit), load_signed(dtype, b + i * unit), first + i);
      }
      return;
    case ElementClass::unsigned_integer:
      for (std::size_t i = 0; i < count; ++i) {
        counter.integers(load_unsigned(dtype, a + i * unit), load_unsigned(dtype, b + i * unit), first + i);
      }
      return;
    case ElementClass::bitwise:
      for (std::size_t i = 0; i < count; ++i) {
        counter.bitwise(std::memcmp(a + i * unit, b + i * unit, unit) == 0, first + i);
      }
      return;
  }
}

std::string element_text(DType dtype, const std::byte* p) {
  switch (element_class(dtype)) {
    case ElementClass::floating: return float_text(load_real(dtype, p));
    case ElementClass::complex: {
      const std::size_t half = dtype_itemsize(dtype) / 2;
      return concat("(", float_text(load_real(dtype, p)), "+", float_text(load_real(dtype, p + half)), "j)");
    }
    case ElementClass::signed_integer: return std::to_string(load_signed(dtype, p));
    case ElementClass::unsigned_integer:
      if (dtype == DType::boolean) return load_unsigned(dtype, p) ? "True" : "False";
      return std::to_string(load_unsigned(dtype, p));
    case ElementClass::bitwise: {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string out = "0x";
      for (std::size_t i = dtype_itemsize(dtype); i-- > 0;) {
        const auto byte = static_cast<unsigned>(p[i]);
        out += kHex[byte >> 4];
        out += kHex[byte & 15];
      }
      return out;
    }
  }
  return {};
}

}  // namespace holdpoint::diff
