#include "verify/verification_report.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "holdpoint_version.h"

namespace holdpoint::verify {

namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kNegativeRun = "resumed-no-rng";

Json optional_number(const std::optional<double>& value) {
  return value && std::isfinite(*value) ? Json(*value) : Json(nullptr);
}

Json location_json(const ComparisonLocation& location) {
  if (location.empty()) return nullptr;
  Json out = Json::object();
  if (location.step) out["step"] = *location.step;
  if (!location.path.empty()) out["path"] = location.path;
  if (!location.index.empty()) out["index"] = location.index;
  out["text"] = location.to_string();
  return out;
}

bool is_divergence(const Comparison& comparison) {
  return comparison.failure == ErrorCode::resume_value_deviation ||
         comparison.failure == ErrorCode::resume_value_mismatch;
}

// The positive run must pass; the negative control is expected to diverge,
// so its comparisons say "match", "diverged" or (malformed) "fail".
std::string verdict_of(const Comparison& comparison, bool negative) {
  if (comparison.passed) return negative ? "match" : "pass";
  return negative && is_divergence(comparison) ? "diverged" : "fail";
}

Json comparison_json(const Comparison& comparison, const Tolerance& tolerance, bool negative) {
  Json out;
  out["quantity"] = comparison.quantity;
  out["verdict"] = verdict_of(comparison, negative);
  if (comparison.exact) {
    out["tolerance"] = "exact";
  } else {
    out["tolerance"] = {{"absolute", tolerance.absolute}, {"relative", tolerance.relative}};
  }
  out["max_abs_deviation"] = optional_number(comparison.max_abs_deviation);
  out["location"] = location_json(comparison.at);
  out["values_compared"] = comparison.values_compared;
  out["values_failed"] = comparison.values_failed;
  if (!comparison.passed) {
    out["code"] = std::string(error_code_name(*comparison.failure));
    out["first_failure"] = location_json(comparison.first_failure);
    out["detail"] = comparison.detail;
  }
  return out;
}

Json failure_json(std::int64_t cut, std::string_view run, const Comparison& comparison) {
  return {{"cut", cut},
          {"run", run},
          {"quantity", comparison.quantity},
          {"code", std::string(error_code_name(*comparison.failure))},
          {"location", location_json(comparison.first_failure)},
          {"detail", comparison.detail}};
}

std::string relative_to(const std::filesystem::path& path, const std::filesystem::path& base) {
  return path.lexically_relative(base).generic_string();
}

}  // namespace

std::string compiler_version() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

std::string verification_report_json(const ResumeVerificationOptions& options, const ResumeVerification& result,
                                     const ReportContext& context) {
  Json report;
  report["schema"] = kVerificationSchema;
  report["schema_version"] = kVerificationSchemaVersion;
  report["all_checks_passed"] = result.all_checks_passed;
  report["positive"] = result.positive;
  report["negative_divergence_detected"] = result.negative_divergence_detected;
  report["exit_code"] = result.exit_code();
  report["completed"] = result.completed;
  if (result.completed) {
    report["error"] = nullptr;
  } else {
    report["error"] = {{"code", std::string(error_code_name(*result.incomplete_code))},
                       {"message", result.incomplete_reason}};
  }

  Json trainer;
  trainer["program"] = context.trainer_command.empty() ? "" : context.trainer_command.front();
  trainer["args"] = options.trainer_args;
  trainer["name"] = context.trainer_name;
  report["trainer"] = trainer;
  report["steps"] = options.steps;
  report["sweep"] = options.sweep;
  Json cuts = Json::array();
  if (options.sweep) {
    for (std::int64_t cut = 1; cut < options.steps; ++cut) cuts.push_back(cut);
  } else {
    cuts.push_back(options.cut);
  }
  report["cuts"] = cuts;
  report["tolerance"] = {{"absolute", options.tolerance.absolute},
                         {"relative", options.tolerance.relative},
                         {"rule", "|compared - continuous| <= absolute + relative x |continuous|"}};
  report["run_timeout_seconds"] = static_cast<double>(options.run_timeout.count()) / 1000.0;

  Json trainer_versions = Json::object();
  for (const auto& [name, version] : context.trainer_versions) trainer_versions[name] = version;
  report["versions"] = {{"holdpoint", HOLDPOINT_VERSION}, {"compiler", compiler_version()}, {"trainer", trainer_versions}};

  Json runs = Json::array();
  for (const TrainerRun& run : result.runs) {
    Json entry;
    entry["name"] = run.name;
    entry["command"] = run.command;
    entry["exit_code"] = run.exit_code ? Json(*run.exit_code) : Json(nullptr);
    entry["signal"] = run.signal ? Json(*run.signal) : Json(nullptr);
    entry["timed_out"] = run.timed_out;
    entry["seconds"] = run.seconds;
    entry["stdout"] = relative_to(run.directory / "stdout.log", options.output);
    entry["stderr"] = relative_to(run.directory / "stderr.log", options.output);
    entry["output"] = relative_to(run.output, options.output);
    runs.push_back(std::move(entry));
  }
  report["runs"] = runs;

  Json results = Json::array();
  Json failures = Json::array();
  for (const CutVerdict& verdict : result.cuts) {
    Json entry;
    entry["cut"] = verdict.cut;
    entry["positive"] = verdict.positive;
    entry["negative_divergence_detected"] = verdict.negative_divergence_detected;
    entry["negative_well_formed"] = verdict.negative_well_formed;
    entry["negative_max_weight_deviation"] = optional_number(verdict.negative_max_weight_deviation);
    entry["negative_final_mse_deviation"] = optional_number(verdict.negative_final_mse_deviation);
    Json positive = Json::array();
    for (const Comparison& comparison : verdict.resumed) {
      positive.push_back(comparison_json(comparison, options.tolerance, false));
      if (!comparison.passed) failures.push_back(failure_json(verdict.cut, "resumed", comparison));
    }
    Json negative = Json::array();
    for (const Comparison& comparison : verdict.resumed_no_rng) {
      negative.push_back(comparison_json(comparison, options.tolerance, true));
      if (!comparison.passed && !is_divergence(comparison)) {
        failures.push_back(failure_json(verdict.cut, kNegativeRun, comparison));
      }
    }
    if (!verdict.negative_divergence_detected && verdict.negative_well_formed) {
      failures.push_back({{"cut", verdict.cut},
                          {"run", kNegativeRun},
                          {"quantity", "negative_control"},
                          {"code", std::string(error_code_name(ErrorCode::resume_negative_control_matched))},
                          {"location", nullptr},
                          {"detail", "every compared quantity matched the continuous run within tolerance although "
                                     "the generators were not restored"}});
    }
    entry["resumed"] = positive;
    entry["resumed_no_rng"] = negative;
    results.push_back(std::move(entry));
  }
  report["results"] = results;
  report["failures"] = failures;
  return report.dump(2) + "\n";
}

}  // namespace holdpoint::verify
