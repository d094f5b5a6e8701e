// holdpoint ls RUN: the generations of a run directory, its pointers and what
// recovery would do, without changing anything.
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "run_directory_output.h"

namespace holdpoint::cli {

namespace {

struct LsArguments {
  std::string run;
  bool verify = false;
  bool json = false;
};

std::string metrics_text(const GenerationInfo& generation) {
  std::string out;
  for (const auto& [name, value] : generation.metrics) {
    out += (out.empty() ? "" : " ") + name + "=" + nlohmann::json(value).dump();
  }
  return out;
}

int run_ls(const LsArguments& args) {
  // Read-only: listing a run must never be what changes it.
  const auto run = open_run_directory(args.run, /*recover=*/false, args.json);
  if (!run) return kExitUsage;
  const RecoveryReport& report = run->recovery();
  const auto generations = run->generations();
  const auto latest = report.latest_problem ? std::nullopt : run->latest();
  const auto best = run->best();

  // Generations that failed when the directory was opened count as checked.
  std::map<std::string, GenerationCheck> checks;
  bool failed = false;
  if (args.verify) {
    for (const auto& check : run->verify_all()) checks[check.name] = check;
    for (const auto& check : report.damaged) checks[check.name] = check;
    for (const auto& [name, check] : checks) failed = failed || !check.ok;
  }

  if (args.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& generation : generations) {
      auto entry = generation_json(generation);
      entry["latest"] = latest && latest->name == generation.name;
      entry["best"] = best && best->name == generation.name;
      if (args.verify) {
        const auto& check = checks.at(generation.name);
        entry["verified"] = check.ok;
        entry["code"] = check.code ? nlohmann::ordered_json(std::string(error_code_name(*check.code))) : nullptr;
        entry["detail"] = check.detail;
      }
      list.push_back(std::move(entry));
    }
    nlohmann::ordered_json out;
    out["run"] = args.run;
    out["generations"] = std::move(list);
    out["latest"] = latest ? nlohmann::ordered_json(latest->name) : nullptr;
    out["best"] = best ? nlohmann::ordered_json(best->name) : nullptr;
    out["recovery"] = recovery_json(report);
    if (args.verify) {
      nlohmann::ordered_json all = nlohmann::ordered_json::array();
      for (const auto& [name, check] : checks) all.push_back(check_json(check));
      out["verification"] = {{"ok", !failed}, {"checks", std::move(all)}};
    }
    std::cout << out.dump(2) << "\n";
    return failed ? kExitInvalid : kExitOk;
  }

  std::ostream& out = std::cout;
  out << "run: " << args.run << "\n";
  out << "generations (" << generations.size() << "):\n";
  for (const auto& generation : generations) {
    out << "  " << generation.name << "  step " << generation.step << "  epoch " << generation.epoch << "  "
        << generation.kind << (generation.world_size > 0 ? "  sharded x" + std::to_string(generation.world_size) : "")
        << "  " << generation.size << " bytes  sha256 " << generation.sha256.hex() << "  "
        << (generation.saved_at.empty() ? "(no time)" : generation.saved_at);
    if (!generation.metrics.empty()) out << "  " << metrics_text(generation);
    if (latest && latest->name == generation.name) out << "  [LATEST]";
    if (best && best->name == generation.name) out << "  [BEST]";
    if (args.verify) {
      const auto& check = checks.at(generation.name);
      out << "  " << (check.ok ? "verified" : "FAILED " + to_text(check));
    }
    out << "\n";
  }
  out << "LATEST: " << (latest ? latest->name : "(none: " + report.latest_problem.value_or("no generation") + ")") << "\n";
  out << "BEST:   " << (best ? best->name : report.best_problem ? "(none: " + *report.best_problem + ")" : "(none)") << "\n";
  if (report.clean()) {
    out << "recovery: nothing to do\n";
  } else {
    out << "recovery (read-only; nothing was changed):\n";
    for (const auto& line : report.lines()) out << "  " << line << "\n";
  }
  if (args.verify) {
    std::size_t failures = 0;
    for (const auto& [name, check] : checks) failures += check.ok ? 0 : 1;
    out << (failed ? "verification failed: " : "verified: ") << checks.size() - failures << " of " << checks.size()
        << " generations verify (damaged ones found on opening included)\n";
  }
  return failed ? kExitInvalid : kExitOk;
}

}  // namespace

void add_ls_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<LsArguments>();
  CLI::App* command = app.add_subcommand(
      "ls", "List a run directory's generations, LATEST/BEST and what recovery would do (changes nothing)");
  command->add_option("run", args->run, "a run directory (RUN/checkpoints, LATEST, BEST, index.json)")->required();
  command->add_flag("--verify", args->verify, "also verify every generation (exit 1 if one fails)");
  command->add_flag("--json", args->json, "print a JSON report");
  command->callback([args, &exit_code] { exit_code = run_ls(*args); });
}

}  // namespace holdpoint::cli
