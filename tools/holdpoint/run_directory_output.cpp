#include "run_directory_output.h"

#include <iostream>

#include "commands.h"

namespace holdpoint::cli {

std::unique_ptr<RunDirectory> open_run_directory(const std::string& run, bool recover, bool json,
                                                 std::optional<BestMetric> best_metric) {
  RunDirectoryOptions options;
  options.create = false;
  options.recover = recover;
  options.best_metric = std::move(best_metric);
  try {
    return std::make_unique<RunDirectory>(run, std::move(options));
  } catch (const Error& error) {
    if (json) {
      nlohmann::ordered_json out;
      out["run"] = run;
      out["code"] = std::string(error_code_name(error.code()));
      out["message"] = error.what();
      std::cout << out.dump(2) << "\n";
    } else {
      std::cerr << "error: " << error_code_name(error.code()) << ": " << error.what() << "\n";
    }
    return nullptr;
  }
}

nlohmann::ordered_json generation_json(const GenerationInfo& generation) {
  return nlohmann::ordered_json::parse(to_json(generation));
}

nlohmann::ordered_json check_json(const GenerationCheck& check) { return nlohmann::ordered_json::parse(to_json(check)); }

nlohmann::ordered_json recovery_json(const RecoveryReport& report) {
  const auto optional_text = [](const std::optional<std::string>& text) {
    return text ? nlohmann::ordered_json(*text) : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json damaged = nlohmann::ordered_json::array();
  for (const auto& check : report.damaged) damaged.push_back(check_json(check));
  nlohmann::ordered_json out;
  out["read_only"] = report.read_only;
  out["clean"] = report.clean();
  out["removed_staging"] = report.removed_staging;
  out["removed_uncommitted"] = report.removed_uncommitted;
  out["damaged"] = std::move(damaged);
  out["quarantined"] = report.quarantined;
  out["previously_quarantined"] = report.previously_quarantined;
  out["removed_orphan_sidecars"] = report.removed_orphan_sidecars;
  out["adopted"] = report.adopted;
  out["dropped_from_index"] = report.dropped_from_index;
  out["latest_problem"] = optional_text(report.latest_problem);
  out["best_problem"] = optional_text(report.best_problem);
  out["index_problem"] = optional_text(report.index_problem);
  out["latest_rewritten"] = report.latest_rewritten;
  out["best_rewritten"] = report.best_rewritten;
  out["index_rewritten"] = report.index_rewritten;
  out["latest"] = optional_text(report.latest);
  out["lines"] = report.lines();
  return out;
}

int report_error(std::ostream& out, ErrorCode code, const std::string& message) {
  const int exit_code = exit_code_for(code);
  out << (exit_code == kExitInvalid ? "invalid: " : "error: ") << error_code_name(code) << ": " << message << "\n";
  return exit_code;
}

}  // namespace holdpoint::cli
