// Element comparison for holdpoint diff (holdpoint/verify/checkpoint_diff.h):
// how two chunks of a tensor's elements, or two scalars, are compared under
// the tolerance, and how a number or an element is written in the report.
// Kept apart from reading the files and walking the trees so that the numeric
// rules (NaN, infinities, integer distances, bitwise dtypes) live in one place.
//
// Thread-safety: DeviationCounter is a plain value, one per tensor pair; the
// functions are pure.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/format/value.h"
#include "holdpoint/verify/checkpoint_diff.h"

namespace holdpoint::diff {

// The C-order index of element `linear` of a tensor of `sizes`.
std::vector<std::int64_t> index_of(std::uint64_t linear, const Dims& sizes);

// Accumulates a Deviation over elements, chunk by chunk.
class DeviationCounter {
 public:
  DeviationCounter(double atol, double rtol, const Dims* sizes) : atol_(atol), rtol_(rtol), sizes_(sizes) {}

  // A pair of reals.
  void reals(double a, double b, std::uint64_t at) {
    bool unequal_pair = false;
    bool differs = false;
    part(a, b, at, unequal_pair, differs);
    if (unequal_pair) unequal(at, differs);
  }

  // One pair of reals of an element (a complex element has two): notes the
  // deviation and whether the pair is unequal, or beyond tolerance.
  void part(double a, double b, std::uint64_t at, bool& unequal_pair, bool& differs);

  void integers(std::int64_t a, std::int64_t b, std::uint64_t at) {
    if (a == b) return;
    const std::uint64_t distance = a > b ? static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b)
                                         : static_cast<std::uint64_t>(b) - static_cast<std::uint64_t>(a);
    integer_distance(static_cast<double>(distance), b == 0 ? 0.0 : std::fabs(static_cast<double>(b)), at);
  }

  void integers(std::uint64_t a, std::uint64_t b, std::uint64_t at) {
    if (a == b) return;
    integer_distance(static_cast<double>(a > b ? a - b : b - a), static_cast<double>(b), at);
  }

  void bitwise(bool equal, std::uint64_t at) {
    if (!equal) unequal(at, true);
  }

  // The pair at `at` is unequal: beyond tolerance or not.
  void unequal(std::uint64_t at, bool differs) {
    if (deviation_.unequal++ == 0) first_unequal_ = at;
    if (differs && deviation_.differing++ == 0) first_differing_ = at;
  }

  void add_numel(std::uint64_t count) { deviation_.numel += count; }

  Deviation finish();

 private:
  void integer_distance(double distance, double magnitude, std::uint64_t at);

  double atol_;
  double rtol_;
  const Dims* sizes_;
  Deviation deviation_;
  std::optional<double> max_abs_;
  std::optional<double> max_rel_;
  std::uint64_t max_abs_at_ = 0;
  std::uint64_t first_unequal_ = 0;
  std::uint64_t first_differing_ = 0;
};


// Compares `count` elements (units) of two chunks; `first` is the linear
// index of the first one.
void compare_chunk(DType dtype, std::size_t unit, const std::byte* a, const std::byte* b, std::size_t count,
                   std::uint64_t first, DeviationCounter& counter);

// The one element of a 1-element tensor, as text.
std::string element_text(DType dtype, const std::byte* p);

}  // namespace holdpoint::diff
