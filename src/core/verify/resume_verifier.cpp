// The resume verification protocol: plan the runs, run them as fresh
// processes, load what they wrote, compare, decide, report
// (docs/verification.md).
#include "holdpoint/verify/resume_verifier.h"
#include "holdpoint/run/sharded_checkpoint.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/fail.h"
#include "base/file_stream.h"
#include "base/regular_file.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/file_system.h"
#include "base/publish.h"
#include "holdpoint/verify/checkpoint_diff.h"
#include "verify/resume_report_svg.h"
#include "verify/trainer_process.h"
#include "verify/verification_report.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

constexpr std::string_view kSummaryFile = "summary.json";
constexpr std::string_view kCheckpointFile = "checkpoint.pt";
constexpr std::uint64_t kMaxSummaryBytes = 256ull << 20;
constexpr std::size_t kStderrTailBytes = 600;

// One trainer invocation of the plan.
struct PlannedRun {
  std::string name;
  RunExpectation expectation;
  const TrainerRun* resume_from = nullptr;  // the interrupted run whose checkpoint it loads
};

// What a finished run left behind, read back.
struct LoadedRun {
  RunExpectation expectation;
  std::optional<RunSummary> summary;
  std::optional<Comparison> malformed;  // "structure": summary.json breaks the contract
  Value checkpoint;
};

std::filesystem::path resolve_trainer(const std::filesystem::path& trainer) {
  if (trainer.empty()) fail(ErrorCode::invalid_argument, "no trainer program given");
  const auto usable = [](const std::filesystem::path& path) {
    std::error_code error;
    return std::filesystem::is_regular_file(path, error) && ::access(path.c_str(), X_OK) == 0;
  };
  if (trainer.string().find('/') != std::string::npos) {
    if (!usable(trainer)) {
      fail(ErrorCode::resume_trainer_unavailable, trainer.string(), ": not an executable file");
    }
    return std::filesystem::absolute(trainer).lexically_normal();
  }
  const char* search = std::getenv("PATH");
  std::stringstream directories(search ? search : "");
  for (std::string directory; std::getline(directories, directory, ':');) {
    const std::filesystem::path candidate = std::filesystem::path(directory.empty() ? "." : directory) / trainer;
    if (usable(candidate)) return std::filesystem::absolute(candidate).lexically_normal();
  }
  fail(ErrorCode::resume_trainer_unavailable, trainer.string(), ": no executable of that name in PATH");
}

void validate(const ResumeVerificationOptions& options) {
  if (options.steps < 2) fail(ErrorCode::invalid_argument, "--steps is ", options.steps, ", at least 2 are needed to cut");
  if (!options.sweep && (options.cut < 1 || options.cut >= options.steps)) {
    fail(ErrorCode::invalid_argument, "--cut is ", options.cut, ", it must be in 1..", options.steps - 1,
         " (--steps ", options.steps, ")");
  }
  const Tolerance& t = options.tolerance;
  if (!std::isfinite(t.absolute) || !std::isfinite(t.relative) || t.absolute < 0 || t.relative < 0) {
    fail(ErrorCode::invalid_argument, "tolerances must be finite and >= 0 (atol ", t.absolute, ", rtol ", t.relative,
         ")");
  }
  if (options.run_timeout.count() <= 0) fail(ErrorCode::invalid_argument, "the run timeout must be positive");
  if (options.output.empty()) fail(ErrorCode::invalid_argument, "no output directory given");
  std::error_code error;
  if (std::filesystem::symlink_status(options.output, error).type() != std::filesystem::file_type::not_found) {
    fail(ErrorCode::resume_output_exists, options.output.string(),
         ": exists; every verification writes a new directory");
  }
}

std::vector<std::int64_t> cuts_of(const ResumeVerificationOptions& options) {
  if (!options.sweep) return {options.cut};
  std::vector<std::int64_t> cuts;
  for (std::int64_t cut = 1; cut < options.steps; ++cut) cuts.push_back(cut);
  return cuts;
}

// "cut-03" for a sweep of up to 99 cuts, so names sort in cut order.
std::string cut_prefix(std::int64_t cut, std::int64_t steps, bool sweep) {
  if (!sweep) return "";
  const std::size_t width = std::to_string(steps - 1).size();
  std::string digits = std::to_string(cut);
  return "cut-" + std::string(width - std::min(width, digits.size()), '0') + digits + "/";
}

// "; <stderr.log>: <its last lines>" or "; <stderr.log> is empty", for messages about a failed run.
std::string stderr_tail(const std::filesystem::path& path) {
  std::string text;
  try {
    // The trainer may have replaced its log by a FIFO: a blocking read
    // would hang the verifier.
    const io::RegularFile file = io::open_regular_for_reading(path);
    const std::uint64_t start = file.size > kStderrTailBytes ? file.size - kStderrTailBytes : 0;
    text.resize(static_cast<std::size_t>(file.size - start));
    text.resize(io::pread_fully(file.fd.get(), reinterpret_cast<std::byte*>(text.data()), text.size(), start));
    if (start > 0) text = "..." + text;
  } catch (const Error& error) {
    return "; " + path.string() + ": " + error.detail();
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return text.empty() ? "; " + path.string() + " is empty" : "; " + path.string() + ": " + text;
}

class Protocol {
 public:
  Protocol(const ResumeVerificationOptions& options, std::filesystem::path trainer, const RunObserver& observer,
           ResumeVerification& result)
      : options_(options), trainer_(std::move(trainer)), observer_(observer), result_(result) {
    const std::size_t cuts = cuts_of(options).size();
    total_runs_ = 1 + 3 * cuts;
    result_.runs.reserve(total_runs_);  // PlannedRun::resume_from points into it
  }

  void run() {
    const PlannedRun continuous{"continuous", {"continuous", options_.steps, options_.steps, false, true}};
    continuous_ = load(execute(continuous), continuous.expectation);
    if (continuous_.summary) {
      context_.trainer_versions = continuous_.summary->versions;
      context_.trainer_name = continuous_.summary->trainer;
    }
    for (const std::int64_t cut : cuts_of(options_)) {
      const std::string prefix = cut_prefix(cut, options_.steps, options_.sweep);
      const std::int64_t rest = options_.steps - cut;
      const PlannedRun interrupted{prefix + "interrupted", {"interrupted", cut, cut, false, true}};
      const TrainerRun& interrupted_run = execute(interrupted);
      const PlannedRun resumed{prefix + "resumed", {"resumed", rest, options_.steps, true, true}, &interrupted_run};
      const PlannedRun no_rng{prefix + "resumed-no-rng", {"resumed-no-rng", rest, options_.steps, true, false},
                              &interrupted_run};
      const TrainerRun& resumed_run = execute(resumed);
      const TrainerRun& no_rng_run = execute(no_rng);
      const LoadedRun interrupted_files = load(interrupted_run, interrupted.expectation);
      const LoadedRun resumed_files = load(resumed_run, resumed.expectation);
      const LoadedRun no_rng_files = load(no_rng_run, no_rng.expectation);
      result_.cuts.push_back(judge(cut, interrupted_files, resumed_files, no_rng_files));
      draw(cut, interrupted_files, resumed_files, no_rng_files);
    }
  }

  const verify::ReportContext& context() const { return context_; }
  const verify::ResumePicture& picture() const { return picture_; }

 private:
  const TrainerRun& execute(const PlannedRun& plan) {
    TrainerRun& run = result_.runs.emplace_back();
    run.name = plan.name;
    run.directory = options_.output / "runs" / plan.name;
    run.output = run.directory / "output";
    run.command = {trainer_.string(), "--steps", std::to_string(plan.expectation.steps_run), "--output",
                   run.output.string()};
    if (plan.resume_from) {
      run.command.insert(run.command.end(), {"--resume", (plan.resume_from->output / kCheckpointFile).string()});
    }
    if (!plan.expectation.rng_restored) run.command.push_back("--omit-rng-restore");
    run.command.insert(run.command.end(), options_.trainer_args.begin(), options_.trainer_args.end());

    io::posix_file_system().open_directory(run.directory, /*create=*/true);
    const std::size_t index = result_.runs.size();
    if (observer_) observer_(RunEvent::started, run, index, total_runs_);
    const verify::ProcessOutcome outcome = verify::run_trainer_process(
        run.command, run.directory / "stdout.log", run.directory / "stderr.log", options_.run_timeout);
    run.exit_code = outcome.exit_code;
    run.signal = outcome.signal;
    run.timed_out = outcome.timed_out;
    run.seconds = outcome.seconds;
    if (observer_) observer_(RunEvent::finished, run, index, total_runs_);

    if (outcome.timed_out) {
      fail(ErrorCode::resume_run_timed_out, run.name, ": killed after ", options_.run_timeout.count() / 1000.0, " s",
           stderr_tail(run.directory / "stderr.log"));
    }
    if (outcome.signal || outcome.exit_code != 0) {
      const std::string how = outcome.signal
                                  ? concat("killed by signal ", *outcome.signal, " (", ::strsignal(*outcome.signal), ")")
                                  : concat("exited with status ", *outcome.exit_code);
      fail(ErrorCode::resume_run_failed, run.name, ": ", how, stderr_tail(run.directory / "stderr.log"));
    }
    for (const std::string& name : {std::string(kSummaryFile), std::string(kCheckpointFile),
                                   std::string(kCheckpointFile) + ".sha256"}) {
      std::error_code error;
      if (!std::filesystem::is_regular_file(run.output / name, error)) {
        fail(ErrorCode::resume_run_output_missing, run.name, ": exited 0 but wrote no ", (run.output / name).string());
      }
    }
    return run;
  }

  // Unreadable files stop the verification (thrown); a summary that is JSON
  // but breaks the contract becomes a failed "structure" comparison.
  LoadedRun load(const TrainerRun& run, const RunExpectation& expectation) {
    LoadedRun loaded;
    loaded.expectation = expectation;
    const auto directory = io::posix_file_system().open_directory(run.output, false);
    const io::Snapshot text = directory->read(std::string(kSummaryFile), kMaxSummaryBytes);
    const std::string label = (run.output / kSummaryFile).string();
    try {
      loaded.summary = parse_run_summary(
          std::string_view(reinterpret_cast<const char*>(text.buffer->data()), text.buffer->size()), label);
    } catch (const Error& error) {
      if (error.code() == ErrorCode::resume_summary_unreadable) throw;
      Comparison structure;
      structure.quantity = "structure";
      structure.exact = true;
      structure.values_compared = 1;
      structure.fail(error.code(), {}, error.what());
      loaded.malformed = std::move(structure);
    }
    const std::filesystem::path checkpoint = run.output / kCheckpointFile;
    LoadOptions load;
    load.expected_sha256 = read_sha256_sidecar(checkpoint);
    LoadedMapping mapping = load_checkpoint_mapping(checkpoint, load);
    if (is_sharded_manifest(mapping)) {
      // A multi-rank trainer's step manifest: its shards beside it, every one
      // checked; replicated components compare by name, rank-local ones as
      // "<name>@rank<r>" (docs/distributed.md).
      ShardedReadOptions sharded;
      sharded.expected_sha256 = mapping.sha256;
      loaded.checkpoint = read_sharded_checkpoint(checkpoint, sharded).combined_view();
    } else {
      loaded.checkpoint = std::move(mapping.root);
    }
    return loaded;
  }

  // Comparisons of one side (resumed or resumed-no-rng) against the continuous
  // run; the positive side also checks the continuous and interrupted runs' protocol.
  std::vector<Comparison> compare_side(const LoadedRun& interrupted, const LoadedRun& side, bool positive) {
    std::vector<Comparison> out;
    bool summaries = true;
    for (const LoadedRun* run : {static_cast<const LoadedRun*>(&continuous_), &interrupted, &side}) {
      if (run->malformed) {
        out.push_back(*run->malformed);
        summaries = false;
      }
    }
    const auto append = [&out](std::vector<Comparison> more) {
      for (Comparison& c : more) out.push_back(std::move(c));
    };
    if (summaries) {
      const auto* versions = &continuous_.summary->versions;
      if (positive) {
        out.push_back(check_run_protocol(*continuous_.summary, continuous_.expectation, nullptr));
        out.push_back(check_run_protocol(*interrupted.summary, interrupted.expectation, versions));
      }
      out.push_back(check_run_protocol(*side.summary, side.expectation, versions));
      append(compare_final_metrics(*continuous_.summary, *side.summary, options_.tolerance));
      std::vector<TraceStep> joined = interrupted.summary->trace;
      joined.insert(joined.end(), side.summary->trace.begin(), side.summary->trace.end());
      append(compare_traces(continuous_.summary->trace, joined, options_.tolerance));
    }
    append(compare_checkpoints(continuous_.checkpoint, side.checkpoint, options_.tolerance));
    return out;
  }

  CutVerdict judge(std::int64_t cut, const LoadedRun& interrupted, const LoadedRun& resumed, const LoadedRun& no_rng) {
    CutVerdict verdict;
    verdict.cut = cut;
    verdict.resumed = compare_side(interrupted, resumed, true);
    verdict.resumed_no_rng = compare_side(interrupted, no_rng, false);
    verdict.positive = std::all_of(verdict.resumed.begin(), verdict.resumed.end(),
                                   [](const Comparison& c) { return c.passed; });
    verdict.negative_well_formed = true;
    for (const Comparison& c : verdict.resumed_no_rng) {
      if (c.quantity == "model") verdict.negative_max_weight_deviation = c.max_abs_deviation;
      if (c.quantity == "final.mse") verdict.negative_final_mse_deviation = c.max_abs_deviation;
      if (c.passed) continue;
      if (c.failure == ErrorCode::resume_value_deviation || c.failure == ErrorCode::resume_value_mismatch) {
        verdict.negative_divergence_detected = true;
      } else {
        verdict.negative_well_formed = false;
      }
    }
    return verdict;
  }

  void draw(std::int64_t cut, const LoadedRun& interrupted, const LoadedRun& resumed, const LoadedRun& no_rng) {
    picture_.cuts.push_back(cut);
    if (!continuous_.summary) return;
    const auto& reference = continuous_.summary->trace;
    const auto losses = [](const LoadedRun& run) {
      std::vector<std::pair<double, double>> points;
      if (run.summary) {
        for (const TraceStep& step : run.summary->trace) {
          points.emplace_back(static_cast<double>(step.step), trace_number_value(step.loss));
        }
      }
      return points;
    };
    const auto deviations = [&](const LoadedRun& run) {
      std::vector<std::pair<double, double>> points;
      if (!run.summary) return points;
      for (const TraceStep& step : run.summary->trace) {
        if (step.step < 1 || step.step > static_cast<std::int64_t>(reference.size())) continue;
        const double expected = trace_number_value(reference[static_cast<std::size_t>(step.step - 1)].loss);
        points.emplace_back(static_cast<double>(step.step), std::fabs(trace_number_value(step.loss) - expected));
      }
      return points;
    };
    const bool first = picture_.losses.empty();
    if (first) picture_.losses.push_back({"continuous", "#222", false, 2.5, 1.0, losses(continuous_)});
    if (options_.sweep) {
      picture_.losses.push_back({first ? "resumed (each cut)" : "", "#1f63c6", true, 1.2, 0.55, losses(resumed)});
      picture_.losses.push_back({first ? "no RNG restore (each cut)" : "", "#d23b2a", false, 1.0, 0.4, losses(no_rng)});
      picture_.deviations.push_back({first ? "resumed (each cut)" : "", "#1f63c6", false, 1.2, 0.55, deviations(resumed)});
      picture_.deviations.push_back(
          {first ? "no RNG restore (each cut)" : "", "#d23b2a", false, 1.0, 0.4, deviations(no_rng)});
      return;
    }
    picture_.losses.push_back({"interrupted", "#999", false, 5, 0.5, losses(interrupted)});
    picture_.losses.push_back({"resumed", "#1f63c6", true, 2, 1.0, losses(resumed)});
    picture_.losses.push_back({"resumed, no RNG restore", "#d23b2a", false, 1.5, 1.0, losses(no_rng)});
    picture_.deviations.push_back({"interrupted", "#999", false, 1.5, 1.0, deviations(interrupted)});
    picture_.deviations.push_back({"resumed", "#1f63c6", false, 2, 1.0, deviations(resumed)});
    picture_.deviations.push_back({"resumed, no RNG restore", "#d23b2a", false, 1.5, 1.0, deviations(no_rng)});
  }

  const ResumeVerificationOptions& options_;
  const std::filesystem::path trainer_;
  const RunObserver& observer_;
  ResumeVerification& result_;
  std::size_t total_runs_ = 0;
  LoadedRun continuous_;
  verify::ReportContext context_;
  verify::ResumePicture picture_;
};

// The run of `result` named `name`, or nullptr.
const TrainerRun* run_named(const ResumeVerification& result, const std::string& name) {
  for (const TrainerRun& run : result.runs) {
    if (run.name == name) return &run;
  }
  return nullptr;
}

// DIR/final-diff.txt and .json: where the first failing cut's resumed
// checkpoint differs from the continuous run's, for a reader who wants to
// know which tensors diverged and by how much.
void write_final_diff(io::Directory& directory, const ResumeVerificationOptions& options, ResumeVerification& result) {
  const auto failing = std::find_if(result.cuts.begin(), result.cuts.end(), [](const CutVerdict& v) { return !v.positive; });
  if (failing == result.cuts.end()) return;
  const TrainerRun* continuous = run_named(result, "continuous");
  const TrainerRun* resumed =
      run_named(result, options.sweep ? concat("cut-", failing->cut, "/resumed") : std::string("resumed"));
  if (!continuous || !resumed) return;
  std::string text;
  std::string json;
  try {
    DiffOptions diff_options;
    diff_options.atol = options.tolerance.absolute;
    diff_options.rtol = options.tolerance.relative;
    const CheckpointDiff diff = diff_checkpoints(continuous->output / std::string(kCheckpointFile),
                                                 resumed->output / std::string(kCheckpointFile), diff_options);
    text = diff.text();
    json = diff.json();
  } catch (const Error& error) {
    text = concat("error: ", error_code_name(error.code()), ": ", error.what(), "\n");
  }
  io::publish_text(directory, "final-diff.txt", text, {});
  result.final_diff_text = options.output / "final-diff.txt";
  if (!json.empty()) {
    io::publish_text(directory, "final-diff.json", json, {});
    result.final_diff_json = options.output / "final-diff.json";
  }
}

}  // namespace

int ResumeVerification::exit_code() const noexcept {
  if (!completed) return 2;
  return all_checks_passed ? 0 : 1;
}

ResumeVerification verify_resume(const ResumeVerificationOptions& options, const RunObserver& observer) {
  validate(options);
  const std::filesystem::path trainer = resolve_trainer(options.trainer);
  ResumeVerificationOptions absolute = options;
  absolute.output = std::filesystem::absolute(options.output).lexically_normal();

  const auto directory = io::posix_file_system().open_directory(absolute.output, /*create=*/true);

  ResumeVerification result;
  result.report_json = absolute.output / "verification.json";
  Protocol protocol(absolute, trainer, observer, result);
  try {
    protocol.run();
    result.completed = true;
  } catch (const Error& error) {
    result.incomplete_code = error.code();
    result.incomplete_reason = error.what();
  }
  if (result.completed) {
    result.positive = std::all_of(result.cuts.begin(), result.cuts.end(), [](const CutVerdict& v) { return v.positive; });
    result.negative_divergence_detected = std::all_of(result.cuts.begin(), result.cuts.end(), [](const CutVerdict& v) {
      return v.negative_divergence_detected && v.negative_well_formed;
    });
    result.all_checks_passed = result.positive && result.negative_divergence_detected;
  }

  if (result.completed && !result.positive) write_final_diff(*directory, absolute, result);

  if (result.completed) {
    verify::ResumePicture picture = protocol.picture();
    picture.title = "Resume verification: " + (protocol.context().trainer_name.empty() ? trainer.filename().string()
                                                                                      : protocol.context().trainer_name);
    picture.subtitle = concat(absolute.steps, " updates, ", options.sweep ? "every cut" : concat("cut after ", options.cut),
                              "; all_checks_passed: ", result.all_checks_passed ? "true" : "false",
                              ", positive: ", result.positive ? "true" : "false",
                              ", negative_divergence_detected: ", result.negative_divergence_detected ? "true" : "false");
    picture.steps = absolute.steps;
    picture.tolerance = options.tolerance.absolute;
    result.report_svg = absolute.output / "report.svg";
    io::publish_text(*directory, "report.svg", verify::render_resume_svg(picture), {});
  }
  verify::ReportContext context = protocol.context();
  context.trainer_command = {trainer.string()};
  io::publish_text(*directory, "verification.json", verify::verification_report_json(absolute, result, context), {});
  return result;
}

}  // namespace holdpoint
