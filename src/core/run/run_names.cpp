#include "run/run_names.h"

#include <charconv>

#include "base/fail.h"
#include "holdpoint/run/run_directory.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace run {

std::string step_name(std::int64_t step, std::string_view suffix) {
  if (step < 0) fail(ErrorCode::invalid_argument, "a generation's step must not be negative (got ", step, ")");
  std::string digits = std::to_string(step);
  if (digits.size() < 8) digits.insert(0, 8 - digits.size(), '0');
  return concat("step-", digits, suffix);
}

std::optional<std::int64_t> parse_step_name(std::string_view name, std::string_view suffix) noexcept {
  constexpr std::string_view prefix = "step-";
  if (name.size() < prefix.size() + 8 + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  // Digits only: from_chars would take "-0000000" as step 0, a second spelling.
  if (digits.size() > 19 || digits.front() < '0' || digits.front() > '9') return std::nullopt;
  std::int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  // One spelling per step: exactly what step_name writes.
  if (digits.size() > 8 && digits.front() == '0') return std::nullopt;
  return step;
}

std::string sidecar_name(const std::string& generation) { return generation + std::string(kSidecarSuffix); }

std::string signature_name(std::string_view file) { return std::string(file) + std::string(kSignatureSuffix); }

}  // namespace run

std::string generation_name(std::int64_t step) { return run::step_name(step, run::kGenerationSuffix); }

std::optional<std::int64_t> parse_generation_name(std::string_view name) noexcept {
  return run::parse_step_name(name, run::kGenerationSuffix);
}

}  // namespace holdpoint
