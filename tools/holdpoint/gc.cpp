// holdpoint gc RUN --keep N: applies a retention policy to a run directory.
//
// The library decides what goes (RunDirectory::plan_gc): it never removes the
// generation LATEST or BEST names, deletes only names it parsed as its own,
// and refuses to delete anything without a verified LATEST. gc opens the run
// with recovery, since deleting from a directory whose state was not
// recovered first could delete the generation recovery would fall back to;
// --dry-run opens it read-only instead, so a dry run changes nothing at all.
// A --metric must agree with the run's BEST (see metric_contradicts_best).
#include <cmath>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "run_directory_output.h"

namespace holdpoint::cli {

namespace {

struct GcArguments {
  std::string run;
  std::size_t keep = 0;
  std::int64_t keep_every = 0;
  std::size_t keep_best = 0;
  std::string metric;
  bool higher_is_better = false;
  bool dry_run = false;
  bool json = false;
};

// The generation `metric` ranks best, by the library's rule (finite values,
// the first of equals).
std::optional<GenerationInfo> ranked_best(const std::vector<GenerationInfo>& generations, const BestMetric& metric) {
  std::optional<GenerationInfo> best;
  for (const auto& g : generations) {
    const auto value = g.metric(metric.name);
    if (!value || !std::isfinite(*value)) continue;
    const double incumbent = best ? *best->metric(metric.name) : 0.0;
    if (!best || (metric.higher_is_better ? *value > incumbent : *value < incumbent)) best = g;
  }
  return best;
}

// Opening a run with a best metric re-ranks BEST by it. A --metric that ranks
// another generation than the run's BEST (a wrong name or direction) would
// move BEST and then let retention delete the real best generation, so it is
// refused; returns the message, or nullopt when the metric agrees.
std::optional<std::string> metric_contradicts_best(const RunDirectory& run, const BestMetric& metric) {
  const auto best = run.best();
  if (!best || run.recovery().best_problem || !best->metric(metric.name)) return std::nullopt;
  const auto ranked = ranked_best(run.generations(), metric);
  if (!ranked || ranked->name == best->name) return std::nullopt;
  return "--metric " + metric.name + (metric.higher_is_better ? " --higher-is-better" : "") + " ranks " + ranked->name +
         " best, but the run's BEST is " + best->name +
         "; gc would move BEST and could delete the best generation. Check the metric's name and direction (a BEST "
         "left behind by a crash is repaired by opening the run with its own metric, e.g. by resuming training)";
}

int refuse(const GcArguments& args, const std::string& message) {
  if (args.json) {
    nlohmann::ordered_json out;
    out["run"] = args.run;
    out["code"] = std::string(error_code_name(ErrorCode::invalid_argument));
    out["message"] = message;
    std::cout << out.dump(2) << "\n";
  } else {
    std::cerr << "error: " << error_code_name(ErrorCode::invalid_argument) << ": " << message << "\n";
  }
  return kExitUsage;
}

int run_gc(const GcArguments& args) {
  // RetentionPolicy reads keep_last = 0 as "keep everything"; on the command
  // line it reads as "keep nothing", so it is refused rather than guessed.
  if (args.keep == 0) return refuse(args, "--keep must be at least 1 (gc never deletes every generation)");
  if (args.keep_every < 0) return refuse(args, "--keep-every must not be negative");
  std::optional<BestMetric> metric;
  if (!args.metric.empty()) {
    metric = BestMetric{args.metric, args.higher_is_better};
    const auto inspected = open_run_directory(args.run, /*recover=*/false, args.json);
    if (!inspected) return kExitUsage;
    if (const auto contradiction = metric_contradicts_best(*inspected, *metric)) return refuse(args, *contradiction);
  }
  const auto run = open_run_directory(args.run, /*recover=*/!args.dry_run, args.json, metric);
  if (!run) return kExitUsage;
  const RecoveryReport& report = run->recovery();

  RetentionPolicy policy;
  policy.keep_last = args.keep;
  policy.keep_every = args.keep_every;
  policy.keep_best = args.keep_best;
  const GcPlan plan = run->plan_gc(policy);

  std::vector<std::string> removed;
  std::optional<Error> failure;
  if (!args.dry_run) {
    try {
      removed = run->collect_garbage(policy);
    } catch (const Error& error) {
      failure = error;
    }
  }

  if (args.json) {
    nlohmann::ordered_json out;
    out["run"] = args.run;
    out["dry_run"] = args.dry_run;
    out["policy"] = {{"keep", args.keep},
                     {"keep_every", args.keep_every},
                     {"keep_best", args.keep_best},
                     {"metric", metric ? nlohmann::ordered_json(metric->name) : nullptr},
                     {"higher_is_better", args.higher_is_better}};
    out["recovery"] = recovery_json(report);
    nlohmann::ordered_json keep = nlohmann::ordered_json::array();
    for (const auto& [name, reasons] : plan.reasons) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (std::size_t start = 0; start <= reasons.size();) {
        const auto comma = std::min(reasons.find(',', start), reasons.size());
        list.push_back(reasons.substr(start, comma - start));
        start = comma + 1;
      }
      keep.push_back({{"name", name}, {"reasons", std::move(list)}});
    }
    out["keep"] = std::move(keep);
    out["remove"] = plan.remove;
    out["removed"] = removed;
    if (failure) {
      out["code"] = std::string(error_code_name(failure->code()));
      out["message"] = failure->what();
    }
    std::cout << out.dump(2) << "\n";
    return failure ? exit_code_for(failure->code()) : kExitOk;
  }

  std::ostream& out = std::cout;
  for (const auto& line : report.lines()) out << "recovery: " << line << "\n";
  out << "plan for " << args.run << " (keep the newest " << args.keep;
  if (args.keep_every > 0) out << ", every step divisible by " << args.keep_every;
  if (args.keep_best > 0) out << ", the best " << args.keep_best << " by " << args.metric;
  out << "; LATEST and BEST always stay):\n";
  for (const auto& [name, reasons] : plan.reasons) out << "  keep    " << name << "  (" << reasons << ")\n";
  for (const auto& name : plan.remove) out << "  remove  " << name << "\n";
  if (failure) return report_error(std::cerr, failure->code(), failure->what());
  if (args.dry_run) {
    out << "dry run: nothing was changed (" << plan.remove.size() << " generations would be removed)\n";
  } else {
    out << "removed " << removed.size() << " generations, kept " << plan.keep.size() << "\n";
  }
  return kExitOk;
}

}  // namespace

void add_gc_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<GcArguments>();
  CLI::App* command = app.add_subcommand(
      "gc", "Remove old generations of a run directory by a retention policy (never LATEST or BEST)");
  command->add_option("run", args->run, "a run directory")->required();
  command->add_option("--keep", args->keep, "keep the newest N generations (N >= 1)")->required();
  command->add_option("--keep-every", args->keep_every, "also keep every generation whose step is a multiple of K");
  auto* keep_best = command->add_option("--keep-best", args->keep_best, "also keep the K best by --metric");
  auto* metric = command->add_option("--metric", args->metric, "the metric --keep-best ranks by (lower is better)");
  auto* higher = command->add_flag("--higher-is-better", args->higher_is_better, "with --metric: higher is better");
  keep_best->needs(metric);
  higher->needs(metric);
  command->add_flag("--dry-run", args->dry_run, "print the plan; change nothing (recovery included)");
  command->add_flag("--json", args->json, "print a JSON report");
  command->callback([args, &exit_code] { exit_code = run_gc(*args); });
}

}  // namespace holdpoint::cli
