// holdpoint verify RUN: every generation of a run directory, and its pointers.
//
// Valid means: every generation on disk verifies (size, SHA-256 against
// index, sidecar and pointers, bounded parse, manifest), LATEST exists and
// names one of them, and BEST, when present, does too. Stale staging files,
// uncommitted generations newer than LATEST and index entries recovery would
// rebuild are reported but do not make the run invalid: opening the run
// repairs them without losing a committed generation. With --trust, every
// signature must verify too: the generations', the chain's, and LATEST's,
// BEST's and index.json's (docs/threat-model.md, "Signing a run").
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "run_directory_output.h"

namespace holdpoint::cli {

int verify_run_directory(const std::string& path, bool json, const std::optional<TrustPolicy>& trust) {
  const auto run = open_run_directory(path, /*recover=*/false, json);
  if (!run) return kExitUsage;
  const RecoveryReport& report = run->recovery();

  std::vector<GenerationCheck> checks = report.damaged;
  for (auto& check : run->verify_all()) checks.push_back(std::move(check));
  std::sort(checks.begin(), checks.end(), [](const GenerationCheck& a, const GenerationCheck& b) { return a.name < b.name; });

  // The first failure names the code: a generation's own, else the pointer's.
  std::optional<ErrorCode> code;
  std::string message;
  std::size_t failures = 0;
  for (const auto& check : checks) {
    if (check.ok) continue;
    if (!code) {
      code = check.code.value_or(ErrorCode::run_generation_missing);
      message = path + ": generation " + check.name + " does not verify: " + check.detail;
    }
    ++failures;
  }
  const auto latest = report.latest_problem ? std::nullopt : run->latest();
  if (!latest && !code) {
    code = ErrorCode::run_pointer_invalid;
    message = path + ": LATEST: " + report.latest_problem.value_or("the run has no generation");
  }
  if (report.best_problem && !code) {
    code = ErrorCode::run_pointer_invalid;
    message = path + ": BEST: " + *report.best_problem;
  }
  const std::vector<GenerationCheck> signatures = trust ? run->verify_signatures(*trust) : std::vector<GenerationCheck>{};
  std::size_t bad_signatures = 0;
  for (const auto& check : signatures) {
    if (check.ok) continue;
    ++bad_signatures;
    if (!code) {
      code = *check.code;
      message = path + ": " + check.name + ": " + check.detail;
    }
  }
  const auto best = run->best();

  if (json) {
    nlohmann::ordered_json out;
    out["run"] = path;
    out["valid"] = !code.has_value();
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& check : checks) list.push_back(check_json(check));
    out["generations"] = std::move(list);
    out["latest"] = {{"name", latest ? nlohmann::ordered_json(latest->name) : nullptr},
                     {"ok", latest.has_value()},
                     {"problem", report.latest_problem ? nlohmann::ordered_json(*report.latest_problem) : nullptr}};
    out["best"] = {{"name", best ? nlohmann::ordered_json(best->name) : nullptr},
                   {"ok", !report.best_problem.has_value()},
                   {"problem", report.best_problem ? nlohmann::ordered_json(*report.best_problem) : nullptr}};
    if (trust) {
      nlohmann::ordered_json signed_list = nlohmann::ordered_json::array();
      for (const auto& check : signatures) signed_list.push_back(check_json(check));
      out["signatures"] = std::move(signed_list);
    }
    out["recovery"] = recovery_json(report);
    if (code) {
      out["code"] = std::string(error_code_name(*code));
      out["message"] = message;
    }
    std::cout << out.dump(2) << "\n";
    return code ? kExitInvalid : kExitOk;
  }

  std::ostream& out = std::cout;
  for (const auto& check : checks) {
    out << "  " << (check.ok ? "ok      " : "FAILED  ") << check.name;
    if (!check.ok) out << "  " << to_text(check);
    out << "\n";
  }
  out << "  LATEST: " << (latest ? latest->name + " (verified)" : "problem: " + report.latest_problem.value_or("none"))
      << "\n";
  if (best || report.best_problem) {
    out << "  BEST:   " << (best && !report.best_problem ? best->name + " (verified)" : "problem: " + *report.best_problem)
        << "\n";
  }
  for (const auto& check : signatures) {
    out << "  " << (check.ok ? "signed  " : "FAILED  ") << check.name << "  "
        << (check.ok ? check.detail : to_text(check)) << "\n";
  }
  for (const auto& line : report.lines()) out << "  recovery (read-only): " << line << "\n";
  if (code) {
    out << "invalid: " << error_code_name(*code) << ": " << message << " (" << failures << " of " << checks.size()
        << " generations fail";
    if (trust) out << ", " << bad_signatures << " of " << signatures.size() << " signature checks fail";
    out << ")\n";
    return kExitInvalid;
  }
  out << "valid: " << path << " (" << checks.size() << (checks.size() == 1 ? " generation" : " generations")
      << " verified, LATEST " << latest->name;
  if (trust) out << "; " << signatures.size() << " signature checks passed";
  out << ")\n";
  return kExitOk;
}

}  // namespace holdpoint::cli
