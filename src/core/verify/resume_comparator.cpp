// The comparator of resume verification: traces update by update, final
// metrics, and state trees element by element (docs/verification.md,
// "What is compared").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/fail.h"
#include "format/value/half_float.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/verify/resume_verifier.h"

namespace holdpoint {

using detail::concat;

namespace {

std::string format_number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::string format_number(const TraceNumber& number) {
  return std::visit(
      [](auto value) {
        if constexpr (std::is_same_v<decltype(value), double>) {
          return format_number(value);
        } else {
          return std::to_string(value);
        }
      },
      number);
}

// "step 7: " before a message, or nothing for a location-less quantity.
std::string prefix(const ComparisonLocation& where) { return where.empty() ? "" : where.to_string() + ": "; }

void note_deviation(Comparison& comparison, double deviation, const ComparisonLocation& where) {
  if (!comparison.max_abs_deviation || deviation > *comparison.max_abs_deviation) {
    comparison.max_abs_deviation = deviation;
    comparison.at = where;
  }
}

// A pair of doubles under the tolerance; non-finite values fail unless
// `same_infinity_allowed` and both are the same infinity.
void compare_doubles(Comparison& comparison, double expected, double actual, const ComparisonLocation& where,
                     const Tolerance& tolerance, bool same_infinity_allowed = false) {
  ++comparison.values_compared;
  if (!std::isfinite(expected) || !std::isfinite(actual)) {
    if (same_infinity_allowed && std::isinf(expected) && expected == actual) return;
    comparison.fail(ErrorCode::resume_value_not_finite, where,
                    concat(prefix(where), "continuous ", format_number(expected), ", compared run ",
                           format_number(actual)));
    return;
  }
  const double deviation = std::fabs(actual - expected);
  note_deviation(comparison, deviation, where);
  if (!tolerance.accepts(expected, actual)) {
    comparison.fail(ErrorCode::resume_value_deviation, where,
                    concat(prefix(where), "continuous ", format_number(expected), ", compared run ",
                           format_number(actual), " (|deviation| ", format_number(deviation), " > ",
                           format_number(tolerance.absolute), " + ", format_number(tolerance.relative), " x ",
                           format_number(std::fabs(expected)), ")"));
  }
}

// Integers must be equal; the deviation is still reported.
void compare_integers(Comparison& comparison, long double expected, long double actual,
                      const ComparisonLocation& where, const std::string& expected_text,
                      const std::string& actual_text) {
  ++comparison.values_compared;
  note_deviation(comparison, static_cast<double>(std::fabs(actual - expected)), where);
  if (expected != actual) {
    comparison.fail(ErrorCode::resume_value_mismatch, where,
                    concat(prefix(where), "continuous ", expected_text, ", compared run ", actual_text));
  }
}

bool is_integral(const TraceNumber& number) { return !std::holds_alternative<double>(number); }

long double integral_value(const TraceNumber& number) {
  return std::visit([](auto value) { return static_cast<long double>(value); }, number);
}

// JSON integers compare exactly (a raw 64-bit draw); anything else within tolerance.
void compare_trace_numbers(Comparison& comparison, const TraceNumber& expected, const TraceNumber& actual,
                           const ComparisonLocation& where, const Tolerance& tolerance) {
  if (is_integral(expected) && is_integral(actual)) {
    compare_integers(comparison, integral_value(expected), integral_value(actual), where, format_number(expected),
                     format_number(actual));
  } else {
    compare_doubles(comparison, trace_number_value(expected), trace_number_value(actual), where, tolerance);
  }
}

Comparison make(std::string quantity, bool exact) {
  Comparison comparison;
  comparison.quantity = std::move(quantity);
  comparison.exact = exact;
  return comparison;
}

// ---- state trees ------------------------------------------------------------------

// Floating dtypes as a list of real components (complex: real, imaginary).
bool decodes_as_real(DType dtype) {
  switch (dtype) {
    case DType::float64:
    case DType::float32:
    case DType::float16:
    case DType::bfloat16:
    case DType::complex32:
    case DType::complex64:
    case DType::complex128: return true;
    default: return false;
  }
}

bool is_complex(DType dtype) {
  return dtype == DType::complex32 || dtype == DType::complex64 || dtype == DType::complex128;
}

// Component `i` of a contiguous little-endian buffer of `dtype`.
double real_component(DType dtype, const std::byte* data, std::size_t i) {
  switch (dtype) {
    case DType::float64:
    case DType::complex128: {
      double v;
      std::memcpy(&v, data + i * 8, 8);
      return v;
    }
    case DType::float32:
    case DType::complex64: {
      float v;
      std::memcpy(&v, data + i * 4, 4);
      return v;
    }
    case DType::float16:
    case DType::complex32: {
      std::uint16_t bits;
      std::memcpy(&bits, data + i * 2, 2);
      return holdpoint::value::half_to_double(bits);
    }
    case DType::bfloat16: {
      std::uint16_t bits;
      std::memcpy(&bits, data + i * 2, 2);
      return holdpoint::value::bfloat16_to_double(bits);
    }
    default: return 0;
  }
}

// Integer and bool elements as exact values (long double holds every 64-bit integer).
std::optional<long double> integer_element(DType dtype, const std::byte* data, std::size_t i) {
  const auto load = [&](auto value) {
    std::memcpy(&value, data + i * sizeof value, sizeof value);
    return static_cast<long double>(value);
  };
  switch (dtype) {
    case DType::int64: return load(std::int64_t{});
    case DType::int32: return load(std::int32_t{});
    case DType::int16: return load(std::int16_t{});
    case DType::int8: return load(std::int8_t{});
    case DType::uint8:
    case DType::boolean: return load(std::uint8_t{});
    case DType::uint16: return load(std::uint16_t{});
    case DType::uint32: return load(std::uint32_t{});
    case DType::uint64: return load(std::uint64_t{});
    default: return std::nullopt;  // float8: compared bitwise
  }
}

std::vector<std::int64_t> unravel(std::int64_t flat, std::span<const std::int64_t> sizes) {
  std::vector<std::int64_t> index(sizes.size());
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 0) continue;
    index[d] = flat % sizes[d];
    flat /= sizes[d];
  }
  return index;
}

class StateWalker {
 public:
  StateWalker(Comparison& comparison, const Tolerance& tolerance) : comparison_(comparison), tolerance_(tolerance) {}

  void walk(const Value& expected, const Value& actual, const std::string& path) {
    const ComparisonLocation here{std::nullopt, path, {}};
    if (expected.kind() != actual.kind()) {
      structure(here, concat("continuous has ", value_kind_name(expected.kind()), ", compared run ",
                             value_kind_name(actual.kind())));
      return;
    }
    switch (expected.kind()) {
      case ValueKind::none: ++comparison_.values_compared; return;
      case ValueKind::boolean:
        compare_integers(comparison_, expected.as_bool(), actual.as_bool(), here, expected.as_bool() ? "True" : "False",
                         actual.as_bool() ? "True" : "False");
        return;
      case ValueKind::integer:
        compare_integers(comparison_, expected.as_int(), actual.as_int(), here, std::to_string(expected.as_int()),
                         std::to_string(actual.as_int()));
        return;
      case ValueKind::floating:
        compare_doubles(comparison_, expected.as_double(), actual.as_double(), here, tolerance_,
                        /*same_infinity_allowed=*/true);
        return;
      case ValueKind::string:
        exact_text(expected.as_string(), actual.as_string(), here);
        return;
      case ValueKind::bytes:
        exact_text(std::string(expected.as_bytes()), std::string(actual.as_bytes()), here);
        return;
      case ValueKind::big_integer:
        exact_text(big_integer_decimal(expected.as_big_integer()), big_integer_decimal(actual.as_big_integer()), here);
        return;
      case ValueKind::bytearray:
        exact_text(std::string(expected.as_bytes()), std::string(actual.as_bytes()), here);
        return;
      case ValueKind::complex_number:
      case ValueKind::device:
      case ValueKind::dtype:
      case ValueKind::layout:
      case ValueKind::meta_tensor:
        exact_text(typed_scalar_text(expected), typed_scalar_text(actual), here);
        return;
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::set:
      case ValueKind::size: {
        const auto& a = expected.as_list();
        const auto& b = actual.as_list();
        if (a.size() != b.size()) {
          structure(here, concat("continuous has ", a.size(), " items, compared run ", b.size()));
        }
        for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) walk(a[i], b[i], path + "[" + std::to_string(i) + "]");
        return;
      }
      case ValueKind::dict:
      case ValueKind::ordered_dict: {
        const Dict& a = expected.as_dict();
        const Dict& b = actual.as_dict();
        for (const auto& [key, value] : a) {
          const std::string child = path + "[" + key.to_string() + "]";
          if (const Value* other = b.find(key)) {
            walk(value, *other, child);
          } else {
            structure({std::nullopt, child, {}}, "missing in the compared run");
          }
        }
        for (const auto& [key, value] : b) {
          if (!a.contains(key)) structure({std::nullopt, path + "[" + key.to_string() + "]", {}}, "missing in the continuous run");
        }
        return;
      }
      case ValueKind::tensor: tensor(expected.as_tensor(), actual.as_tensor(), path); return;
      case ValueKind::sparse_tensor: {
        // The header exactly (layout, size, flags, nnz), then each part as a tensor.
        exact_text(typed_scalar_text(expected), typed_scalar_text(actual), here);
        const auto& a = expected.as_sparse_tensor().parts;
        const auto& b = actual.as_sparse_tensor().parts;
        for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) walk(a[i], b[i], path + ".part" + std::to_string(i));
        return;
      }
    }
  }

 private:
  void structure(const ComparisonLocation& where, const std::string& why) {
    comparison_.fail(ErrorCode::resume_structure_mismatch, where, concat(prefix(where), why));
  }

  void exact_text(const std::string& expected, const std::string& actual, const ComparisonLocation& where) {
    ++comparison_.values_compared;
    if (expected != actual) {
      comparison_.fail(ErrorCode::resume_value_mismatch, where,
                       concat(prefix(where), "continuous \"", expected, "\", compared run \"", actual, "\""));
    }
  }

  void tensor(const TensorData& expected, const TensorData& actual, const std::string& path) {
    const ComparisonLocation here{std::nullopt, path, {}};
    if (expected.dtype != actual.dtype) {
      structure(here, concat("dtype ", dtype_name(expected.dtype), " vs ", dtype_name(actual.dtype)));
      return;
    }
    if (expected.sizes != actual.sizes) {
      structure(here, concat("shape ", shape_text(expected.sizes), " vs ", shape_text(actual.sizes)));
      return;
    }
    const std::vector<std::byte> a = expected.contiguous_bytes();
    const std::vector<std::byte> b = actual.contiguous_bytes();
    const std::int64_t numel = expected.numel();
    const bool scalar = expected.sizes.empty();
    if (decodes_as_real(expected.dtype)) {
      const std::size_t parts = is_complex(expected.dtype) ? 2 : 1;
      for (std::size_t i = 0; i < static_cast<std::size_t>(numel) * parts; ++i) {
        ComparisonLocation where{std::nullopt, path, unravel(static_cast<std::int64_t>(i / parts), expected.sizes)};
        if (parts == 2) where.index.push_back(static_cast<std::int64_t>(i % 2));
        compare_doubles(comparison_, real_component(expected.dtype, a.data(), i),
                        real_component(actual.dtype, b.data(), i), where, tolerance_, scalar);
      }
      return;
    }
    if (dtype_is_sub_byte(expected.dtype)) {
      // Elements share bytes, so the packed bytes are compared as one value.
      ++comparison_.values_compared;
      if (a != b) {
        comparison_.fail(ErrorCode::resume_value_mismatch, here,
                         concat(prefix(here), dtype_name(expected.dtype), " bits differ"));
      }
      return;
    }
    const std::size_t itemsize = expected.itemsize();
    for (std::int64_t i = 0; i < numel; ++i) {
      const ComparisonLocation where{std::nullopt, path, unravel(i, expected.sizes)};
      const auto x = integer_element(expected.dtype, a.data(), static_cast<std::size_t>(i));
      const auto y = integer_element(actual.dtype, b.data(), static_cast<std::size_t>(i));
      if (x && y) {
        compare_integers(comparison_, *x, *y, where, format_number(static_cast<double>(*x)),
                         format_number(static_cast<double>(*y)));
        continue;
      }
      ++comparison_.values_compared;
      if (std::memcmp(a.data() + i * itemsize, b.data() + i * itemsize, itemsize) != 0) {
        comparison_.fail(ErrorCode::resume_value_mismatch, where,
                         concat(prefix(where), dtype_name(expected.dtype), " bits differ"));
      }
    }
  }

  Comparison& comparison_;
  const Tolerance& tolerance_;
};

}  // namespace

bool Tolerance::accepts(double expected, double actual) const noexcept {
  return std::fabs(actual - expected) <= absolute + relative * std::fabs(expected);
}

std::string ComparisonLocation::to_string() const {
  std::string text;
  if (step) text = "step " + std::to_string(*step);
  if (!path.empty()) text += (text.empty() ? "" : " ") + path;
  if (!index.empty()) text += shape_text(index);
  return text;
}

namespace {

// A structural failure explains more than a non-finite value, which explains
// more than a deviation: the most severe kind is the one reported.
int severity(ErrorCode code) {
  switch (code) {
    case ErrorCode::resume_value_deviation:
    case ErrorCode::resume_value_mismatch: return 0;
    case ErrorCode::resume_value_not_finite: return 1;
    default: return 2;
  }
}

}  // namespace

void Comparison::fail(ErrorCode code, const ComparisonLocation& where, std::string why) {
  ++values_failed;
  if (!passed && severity(code) <= severity(*failure)) return;
  passed = false;
  failure = code;
  first_failure = where;
  detail = std::move(why);
}

std::vector<Comparison> compare_traces(std::span<const TraceStep> expected, std::span<const TraceStep> actual,
                                       const Tolerance& tolerance) {
  Comparison trace = make("trace", true);
  Comparison step = make("step", true);
  Comparison epoch = make("epoch", true);
  Comparison ids = make("sample_ids", true);
  Comparison lr = make("lr", false);
  Comparison loss = make("loss", false);

  // Generators in first-seen order over both traces, so one named only by the
  // compared run still gets its (failing) comparison.
  std::vector<std::string> generators;
  for (const auto* side : {&expected, &actual}) {
    for (const TraceStep& record : *side) {
      for (const auto& [name, draw] : record.rng_next) {
        if (std::find(generators.begin(), generators.end(), name) == generators.end()) generators.push_back(name);
      }
    }
  }
  std::vector<Comparison> draws;
  for (const std::string& name : generators) draws.push_back(make("rng_next." + name, false));

  const std::size_t paired = std::min(expected.size(), actual.size());
  trace.values_compared = paired;
  if (expected.size() != actual.size()) {
    const bool shorter = actual.size() < expected.size();
    const std::int64_t first = shorter ? expected[paired].step : actual[paired].step;
    trace.fail(ErrorCode::resume_structure_mismatch, {first, "", {}},
               concat("the continuous trace has ", expected.size(), " updates, interrupted + resumed ",
                      actual.size(), ": step ", first, shorter ? " is missing" : " is extra"));
  }
  for (std::size_t i = 0; i < paired; ++i) {
    const TraceStep& a = expected[i];
    const TraceStep& b = actual[i];
    const ComparisonLocation at_step{a.step, "", {}};
    compare_integers(step, a.step, b.step, at_step, std::to_string(a.step), std::to_string(b.step));
    compare_integers(epoch, a.epoch, b.epoch, at_step, std::to_string(a.epoch), std::to_string(b.epoch));
    if (a.sample_ids.size() != b.sample_ids.size()) {
      ids.fail(ErrorCode::resume_structure_mismatch, at_step,
               concat("step ", a.step, ": the continuous batch has ", a.sample_ids.size(), " samples, the compared run ",
                      b.sample_ids.size()));
    }
    for (std::size_t j = 0; j < std::min(a.sample_ids.size(), b.sample_ids.size()); ++j) {
      compare_integers(ids, a.sample_ids[j], b.sample_ids[j], {a.step, "", {static_cast<std::int64_t>(j)}},
                       std::to_string(a.sample_ids[j]), std::to_string(b.sample_ids[j]));
    }
    compare_trace_numbers(lr, a.lr, b.lr, at_step, tolerance);
    compare_trace_numbers(loss, a.loss, b.loss, at_step, tolerance);
    for (std::size_t g = 0; g < generators.size(); ++g) {
      const auto find = [&](const TraceStep& record) -> const TraceNumber* {
        for (const auto& [name, draw] : record.rng_next) {
          if (name == generators[g]) return &draw;
        }
        return nullptr;
      };
      const TraceNumber* x = find(a);
      const TraceNumber* y = find(b);
      if (x && y) {
        compare_trace_numbers(draws[g], *x, *y, at_step, tolerance);
      } else {
        draws[g].fail(ErrorCode::resume_structure_mismatch, at_step,
                      concat("step ", a.step, ": generator \"", generators[g], "\" is not recorded by the ",
                             x ? "compared" : "continuous", " run"));
      }
    }
  }
  std::vector<Comparison> result = {std::move(trace), std::move(step), std::move(epoch), std::move(ids),
                                    std::move(lr),    std::move(loss)};
  for (Comparison& draw : draws) result.push_back(std::move(draw));
  return result;
}

std::vector<Comparison> compare_final_metrics(const RunSummary& expected, const RunSummary& actual,
                                              const Tolerance& tolerance) {
  Comparison generators = make("generators", true);
  generators.values_compared = 1;
  if (expected.generators != actual.generators) {
    std::string a, b;
    for (const auto& name : expected.generators) a += (a.empty() ? "" : ", ") + name;
    for (const auto& name : actual.generators) b += (b.empty() ? "" : ", ") + name;
    generators.fail(ErrorCode::resume_structure_mismatch, {},
                    concat("continuous generators [", a, "], compared run [", b, "]"));
  }
  Comparison loss = make("final.loss", false);
  Comparison mse = make("final.mse", false);
  Comparison next_lr = make("final.next_lr", false);
  compare_trace_numbers(loss, expected.final_loss, actual.final_loss, {}, tolerance);
  compare_trace_numbers(mse, expected.final_mse, actual.final_mse, {}, tolerance);
  compare_trace_numbers(next_lr, expected.final_next_lr, actual.final_next_lr, {}, tolerance);
  return {std::move(generators), std::move(loss), std::move(mse), std::move(next_lr)};
}

Comparison compare_state(std::string quantity, const Value& expected, const Value& actual,
                         const Tolerance& tolerance) {
  Comparison comparison = make(std::move(quantity), false);
  StateWalker(comparison, tolerance).walk(expected, actual, "");
  return comparison;
}

std::vector<Comparison> compare_checkpoints(const Value& expected, const Value& actual,
                                            const Tolerance& tolerance) {
  std::vector<Comparison> result;
  if (!expected.is_dict() || !actual.is_dict()) {
    Comparison root = make("checkpoint", true);
    root.fail(ErrorCode::resume_structure_mismatch, {},
              concat("a resume checkpoint is a dict of components; continuous has ", value_kind_name(expected.kind()),
                     ", compared run ", value_kind_name(actual.kind())));
    result.push_back(std::move(root));
    return result;
  }
  const Dict& a = expected.as_dict();
  const Dict& b = actual.as_dict();
  const auto component_name = [](const DictKey& key) { return key.is_string() ? key.as_string() : key.to_string(); };
  for (const auto& [key, value] : a) {
    if (key.is_string() && key.as_string() == kManifestKey) continue;
    if (const Value* other = b.find(key)) {
      result.push_back(compare_state(component_name(key), value, *other, tolerance));
    } else {
      Comparison missing = make(component_name(key), false);
      missing.fail(ErrorCode::resume_structure_mismatch, {}, "the compared run's checkpoint lacks this component");
      result.push_back(std::move(missing));
    }
  }
  for (const auto& [key, value] : b) {
    if ((key.is_string() && key.as_string() == kManifestKey) || a.contains(key)) continue;
    Comparison extra = make(component_name(key), false);
    extra.fail(ErrorCode::resume_structure_mismatch, {}, "only the compared run's checkpoint has this component");
    result.push_back(std::move(extra));
  }
  return result;
}

Comparison check_run_protocol(const RunSummary& summary, const RunExpectation& expected,
                              const std::vector<std::pair<std::string, std::string>>* reference_versions) {
  Comparison protocol = make("protocol." + expected.name, true);
  const auto require = [&](bool ok, const std::string& why) {
    ++protocol.values_compared;
    if (!ok) protocol.fail(ErrorCode::resume_protocol_violated, {}, expected.name + ": " + why);
  };
  require(summary.steps_run == expected.steps_run,
          concat("steps_run is ", summary.steps_run, ", the command asked for ", expected.steps_run));
  require(summary.global_step == expected.global_step,
          concat("global_step is ", summary.global_step, ", expected ", expected.global_step));
  require(static_cast<std::int64_t>(summary.trace.size()) == expected.steps_run,
          concat("the trace has ", summary.trace.size(), " records for ", expected.steps_run, " updates"));
  const std::int64_t first_step = expected.global_step - expected.steps_run + 1;
  require(summary.trace.empty() || summary.trace.front().step == first_step,
          concat("the first traced update is step ", summary.trace.empty() ? 0 : summary.trace.front().step,
                 ", expected ", first_step));
  require(summary.resumed_from.has_value() == expected.resumed,
          expected.resumed ? "resumed_from is null although --resume was given"
                           : "resumed_from is set although --resume was not given");
  require(summary.rng_restored == expected.rng_restored,
          expected.rng_restored ? "rng_restored is false although --omit-rng-restore was not given"
                                : "rng_restored is true although --omit-rng-restore was given");
  if (reference_versions) {
    require(summary.versions == *reference_versions, "its versions differ from the continuous run's");
  }
  return protocol;
}

}  // namespace holdpoint
