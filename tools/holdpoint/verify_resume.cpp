#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "holdpoint/verify/resume_verifier.h"

namespace holdpoint::cli {

namespace {

struct VerifyResumeArguments {
  std::string trainer;
  std::vector<std::string> trainer_args;
  std::int64_t steps = 10;
  std::int64_t cut = 5;
  std::string output;
  double atol = 1e-12;
  double rtol = 0;
  bool sweep = false;
  bool json = false;
  double timeout_seconds = 120;
};

std::string shell_words(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& word : words) {
    const bool plain = !word.empty() && word.find_first_not_of(
                                            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:+,@") ==
                                            std::string::npos;
    if (!line.empty()) line += ' ';
    if (plain) {
      line += word;
      continue;
    }
    line += '\'';
    for (const char c : word) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

std::string deviation_text(const std::optional<double>& deviation) {
  if (!deviation) return "n/a";
  std::ostringstream out;
  out << std::setprecision(6) << *deviation;
  return out.str();
}

void print_cut(std::ostream& out, const CutVerdict& verdict) {
  std::size_t failed = 0;
  for (const Comparison& c : verdict.resumed) failed += c.passed ? 0 : 1;
  out << "cut " << verdict.cut << ": resumed "
      << (verdict.positive ? "matches the continuous run on all " + std::to_string(verdict.resumed.size()) + " quantities"
                           : "differs on " + std::to_string(failed) + " of " + std::to_string(verdict.resumed.size()) +
                                 " quantities")
      << "; without RNG restore "
      << (!verdict.negative_well_formed           ? "the control run is malformed"
          : verdict.negative_divergence_detected ? "diverged"
                                                 : "did NOT diverge")
      << " (max weight deviation " << deviation_text(verdict.negative_max_weight_deviation)
      << ", final mse deviation " << deviation_text(verdict.negative_final_mse_deviation) << ")\n";
  for (const Comparison& c : verdict.resumed) {
    if (!c.passed) out << "  FAIL resumed " << c.quantity << " [" << error_code_name(*c.failure) << "]: " << c.detail << "\n";
  }
  for (const Comparison& c : verdict.resumed_no_rng) {
    const bool divergence = c.failure == ErrorCode::resume_value_deviation || c.failure == ErrorCode::resume_value_mismatch;
    if (!c.passed && !divergence) {
      out << "  FAIL resumed-no-rng " << c.quantity << " [" << error_code_name(*c.failure) << "]: " << c.detail << "\n";
    }
  }
}

// The diff of the final checkpoints a failed verification wrote: its lines up
// to a screenful, and its summary line.
void print_final_diff(std::ostream& out, const std::filesystem::path& path) {
  constexpr std::size_t kShown = 20;
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  out << "final checkpoints, continuous vs resumed (" << path.string() << "):\n";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (i == kShown && lines.size() > kShown + 1) {
      out << "  ... " << lines.size() - kShown - 1 << " more lines\n";
      i = lines.size() - 1;
    }
    out << "  " << lines[i] << "\n";
  }
}

int run_verify_resume(const VerifyResumeArguments& args) {
  ResumeVerificationOptions options;
  options.trainer = args.trainer;
  options.trainer_args = args.trainer_args;
  options.steps = args.steps;
  options.cut = args.cut;
  options.sweep = args.sweep;
  options.output = args.output;
  options.tolerance = {args.atol, args.rtol};
  if (!(args.timeout_seconds > 0) || !std::isfinite(args.timeout_seconds)) {
    std::cerr << "error: invalid_argument: --timeout must be a positive number of seconds\n";
    return kExitUsage;
  }
  options.run_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::ceil(args.timeout_seconds * 1000)));

  // With --json, stdout carries only the report.
  std::ostream& progress = args.json ? std::cerr : std::cout;
  const auto observer = [&progress](RunEvent event, const TrainerRun& run, std::size_t index, std::size_t total) {
    progress << "[" << index << "/" << total << "] " << run.name << ": ";
    if (event == RunEvent::started) {
      progress << "started: " << shell_words(run.command) << std::endl;
      return;
    }
    if (run.timed_out) {
      progress << "TIMED OUT";
    } else if (run.signal) {
      progress << "killed by signal " << *run.signal;
    } else {
      progress << "exit " << *run.exit_code;
    }
    progress << " in " << std::fixed << std::setprecision(2) << run.seconds << " s" << std::defaultfloat << std::endl;
  };

  ResumeVerification result;
  try {
    result = verify_resume(options, observer);
  } catch (const Error& error) {
    std::cerr << "error: " << error_code_name(error.code()) << ": " << error.what() << "\n";
    return kExitUsage;
  }

  if (args.json) {
    std::ifstream report(result.report_json);
    std::cout << report.rdbuf();
    return result.exit_code();
  }
  if (!result.completed) {
    std::cout << "error: " << error_code_name(*result.incomplete_code) << ": " << result.incomplete_reason << "\n";
  }
  for (const CutVerdict& verdict : result.cuts) print_cut(std::cout, verdict);
  if (!result.final_diff_text.empty()) print_final_diff(std::cout, result.final_diff_text);
  std::cout << "all_checks_passed: " << (result.all_checks_passed ? "true" : "false") << "\n"
            << "positive: " << (result.positive ? "true" : "false") << "\n"
            << "negative_divergence_detected: " << (result.negative_divergence_detected ? "true" : "false") << "\n";
  std::cout << "report: " << result.report_json.string();
  if (!result.report_svg.empty()) std::cout << ", " << result.report_svg.string();
  std::cout << "\n";
  return result.exit_code();
}

}  // namespace

void add_verify_resume_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<VerifyResumeArguments>();
  CLI::App* command = app.add_subcommand(
      "verify-resume",
      "Run a trainer continuous, interrupted, resumed and resumed without RNG restore as fresh processes and "
      "compare them (exit 0 all checks passed, 1 a comparison failed, 2 could not complete)");
  command->add_option("--trainer", args->trainer, "the trainer program (docs/verification.md: its CLI contract)")
      ->required();
  command->add_option("--trainer-arg", args->trainer_args, "an argument appended to every run's command (repeatable)");
  command->add_option("--steps", args->steps, "N: updates of the continuous run (default 10)");
  command->add_option("--cut", args->cut, "K: updates before the interruption, 1 <= K < N (default 5)");
  command->add_option("--output", args->output, "a directory that does not exist yet")->required();
  command->add_option("--atol", args->atol, "absolute tolerance (default 1e-12)");
  command->add_option("--rtol", args->rtol, "relative tolerance, times |continuous value| (default 0)");
  command->add_flag("--sweep", args->sweep, "verify every cut 1..N-1 against one continuous run");
  command->add_flag("--json", args->json, "print verification.json on stdout (progress goes to stderr)");
  command->add_option("--timeout", args->timeout_seconds, "seconds each run may take before it is killed (default 120)");
  command->callback([args, &exit_code] { exit_code = run_verify_resume(*args); });
}

}  // namespace holdpoint::cli
