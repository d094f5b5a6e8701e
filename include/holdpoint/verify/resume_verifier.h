// Resume verification: does resuming a trainer reproduce its uninterrupted run?
//
// verify_resume runs a trainer program that honours the resume CLI contract of
// docs/verification.md as fresh processes: continuous (N updates), interrupted
// (K updates, then save), resumed from that checkpoint (N - K more), and the
// same resume without restoring the generators (the negative control). Each run
// writes summary.json, a per-update trace (sample ids, learning rate, loss and
// the next draw of every generator), and checkpoint.pt. The comparator then
// checks the interrupted trace followed by the resumed trace against the
// continuous trace, update by update, and the final checkpoints component by
// component (read with the restricted reader). The verdict passes only when the
// resume matches within tolerance *and* the negative control diverges: a check
// that cannot fail proves nothing.
//
// The comparator (parse_run_summary, compare_*) is pure and LibTorch-free, so
// it is unit-tested on hand-written traces and values.
//
// Failure contract: verify_resume throws holdpoint::Error before it creates
// anything when the options are unusable (invalid_argument,
// resume_trainer_unavailable, resume_output_exists), and an io_* code when the
// output directory or a report file cannot be written. Once the output
// directory exists, every outcome (a run that failed or timed out, a file that
// cannot be read, a failed comparison) is recorded in the result and in
// verification.json instead of thrown. parse_run_summary throws the
// resume_summary_* codes; the compare_* functions never throw on content, they
// report.
//
// Thread-safety: the comparator functions are reentrant. verify_resume blocks
// while its trainer runs; concurrent calls need distinct output directories.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

// ---- what a run records (summary.json, docs/verification.md) ---------------

inline constexpr std::string_view kResumeSummarySchema = "holdpoint.resume-summary";
inline constexpr std::int64_t kResumeSummarySchemaVersion = 1;

// A number as the trainer wrote it: JSON integers stay exact (a raw 64-bit
// generator draw survives), everything else is a double; the strings "nan",
// "inf" and "-inf" become the non-finite doubles.
using TraceNumber = std::variant<double, std::int64_t, std::uint64_t>;

double trace_number_value(const TraceNumber& number) noexcept;  // rounded for large integers

// One optimizer update, as the process that ran it recorded it.
struct TraceStep {
  std::int64_t step = 0;  // global, 1-based
  std::int64_t epoch = 0;
  std::vector<std::int64_t> sample_ids;
  TraceNumber lr = 0.0;
  TraceNumber loss = 0.0;
  // The next draw of each generator after the update, in the summary's
  // `generators` order.
  std::vector<std::pair<std::string, TraceNumber>> rng_next;
};

struct RunSummary {
  std::string trainer;
  std::int64_t steps_run = 0;
  std::int64_t global_step = 0;
  std::optional<std::string> resumed_from;
  bool rng_restored = true;
  std::vector<std::pair<std::string, std::string>> versions;
  TraceNumber final_loss = 0.0;
  TraceNumber final_mse = 0.0;
  TraceNumber final_next_lr = 0.0;
  std::vector<std::string> generators;
  std::vector<TraceStep> trace;
};

// Parses summary.json. `label` names the file in messages. Fields beyond the
// contract are allowed and ignored. Throws Error:
//   resume_summary_unreadable          not JSON (RFC 8259: a bare NaN is not JSON)
//   resume_summary_schema_unsupported  schema / schema_version not the ones above
//   resume_summary_field_missing       a required field is absent (names it, and the trace record)
//   resume_summary_field_invalid       a field has the wrong type, or a trace record's
//                                      rng_next does not name exactly the generators
RunSummary parse_run_summary(std::string_view json_text, const std::string& label);

// ---- the comparator -------------------------------------------------------------

// |actual - expected| <= absolute + relative * |expected|. The defaults are the
// protocol's CPU float64 tolerance (docs/verification.md says how to choose one).
struct Tolerance {
  double absolute = 1e-12;
  double relative = 0.0;
  bool accepts(double expected, double actual) const noexcept;
};

struct ComparisonLocation {
  std::optional<std::int64_t> step;  // global step of a trace record
  std::string path;                  // inside a state tree: "['state'][0]['exp_avg']"
  std::vector<std::int64_t> index;   // element of a tensor (C order dims) or list
  bool empty() const noexcept { return !step && path.empty() && index.empty(); }
  std::string to_string() const;  // "step 7 ['0.weight'][3, 1]"; empty when empty()
};

// The result of comparing one quantity of one run with the continuous run.
struct Comparison {
  // "trace", "step", "epoch", "sample_ids", "lr", "loss", "rng_next.<generator>",
  // "final.loss", "final.mse", "final.next_lr", "generators", "protocol.<run>",
  // "structure", or a checkpoint component ("model", "optimizer", "scheduler", ...).
  std::string quantity;
  bool exact = false;  // equality required (ids, integers, booleans, strings)
  bool passed = true;
  // When !passed: the code of the first failure of the most severe kind found
  // (structure, then non-finite, then deviation or mismatch), so a NaN after a
  // divergence is not hidden by it; `detail` and `first_failure` describe it.
  std::optional<ErrorCode> failure;
  std::string detail;  // what failed, with both values
  std::uint64_t values_compared = 0;
  std::uint64_t values_failed = 0;
  // Over finite pairs; nullopt when no number was compared. `at` is where it occurs.
  std::optional<double> max_abs_deviation;
  ComparisonLocation at;
  ComparisonLocation first_failure;

  // Records a failure; see `failure` for which one is reported.
  void fail(ErrorCode code, const ComparisonLocation& where, std::string why);
};

// `expected` is the continuous trace; `actual` is the interrupted trace
// followed by the resumed trace. One comparison per quantity: "trace" (length
// and the generators each record names), "step", "epoch", "sample_ids"
// (exact), "lr", "loss" and one "rng_next.<generator>" per generator of
// `expected` (tolerance). Pairs are compared up to the shorter trace; an extra
// or missing step fails "trace" at that step. NaN and infinities fail
// (resume_value_not_finite) wherever they occur, in either trace.
std::vector<Comparison> compare_traces(std::span<const TraceStep> expected, std::span<const TraceStep> actual,
                                       const Tolerance& tolerance);

// "generators" (same names in the same order), "final.loss", "final.mse",
// "final.next_lr".
std::vector<Comparison> compare_final_metrics(const RunSummary& expected, const RunSummary& actual,
                                              const Tolerance& tolerance);

// Deep comparison of two state trees under `quantity`. Structure (kinds, dict
// keys, list lengths, tensor dtypes and shapes) must be identical
// (resume_structure_mismatch). Floating tensors (float16/bfloat16/float32/
// float64, complex as real and imaginary parts) and float scalars compare as
// doubles within tolerance; integer and bool tensors, float8 tensors
// (bitwise), ints, bools, strings, bytes and None compare exactly
// (resume_value_mismatch). NaN fails, and so does an infinity, except an
// infinite float scalar that is the same infinity on both sides (a sentinel
// such as ReduceLROnPlateau's initial `best`).
Comparison compare_state(std::string quantity, const Value& expected, const Value& actual,
                         const Tolerance& tolerance);

// The top-level keys of two checkpoints, except the manifest ("holdpoint",
// which records run-specific operational settings): one compare_state per
// component in the union of both key sets; a component present on one side
// only fails with resume_structure_mismatch.
std::vector<Comparison> compare_checkpoints(const Value& expected, const Value& actual,
                                            const Tolerance& tolerance);

// What a run was asked to do, for checking what its summary says it did.
struct RunExpectation {
  std::string name;  // "continuous", "interrupted", "resumed", "resumed-no-rng"
  std::int64_t steps_run = 0;
  std::int64_t global_step = 0;
  bool resumed = false;
  bool rng_restored = true;
};

// "protocol.<name>": steps_run, global_step, trace length, the first traced
// step, resumed_from and rng_restored agree with `expected`, and the
// versions equal `reference_versions` when given (every run is the same
// program). Fails with resume_protocol_violated.
Comparison check_run_protocol(const RunSummary& summary, const RunExpectation& expected,
                              const std::vector<std::pair<std::string, std::string>>* reference_versions);

// ---- the protocol ----------------------------------------------------------------

struct ResumeVerificationOptions {
  std::filesystem::path trainer;
  std::vector<std::string> trainer_args;  // appended to every run's command
  std::int64_t steps = 10;                // N
  std::int64_t cut = 5;                   // K, 1 <= K < N; ignored by a sweep
  bool sweep = false;                     // every cut 1..N-1
  std::filesystem::path output;           // must not exist
  Tolerance tolerance;
  std::chrono::milliseconds run_timeout{std::chrono::minutes(2)};
};

// One trainer process.
struct TrainerRun {
  std::string name;  // "continuous", "interrupted", or "cut-3/resumed" in a sweep
  std::vector<std::string> command;
  std::filesystem::path directory;  // DIR/runs/<name>: stdout.log, stderr.log, output/
  std::filesystem::path output;     // the trainer's --output
  std::optional<int> exit_code;     // unset when killed by a signal
  std::optional<int> signal;
  bool timed_out = false;
  double seconds = 0;
};

// The comparisons of one cut point.
struct CutVerdict {
  std::int64_t cut = 0;
  std::vector<Comparison> resumed;         // continuous vs interrupted + resumed
  std::vector<Comparison> resumed_no_rng;  // continuous vs interrupted + resumed without RNG
  bool positive = false;                   // every `resumed` comparison passed
  // Some value of the no-RNG run deviates (resume_value_deviation /
  // resume_value_mismatch) ...
  bool negative_divergence_detected = false;
  // ... and nothing else is wrong with it (structure, non-finite values,
  // protocol): a malformed control run is no control.
  bool negative_well_formed = false;
  std::optional<double> negative_max_weight_deviation;   // the "model" component
  std::optional<double> negative_final_mse_deviation;
};

struct ResumeVerification {
  bool completed = false;  // false: a run failed or a file could not be read
  std::optional<ErrorCode> incomplete_code;
  std::string incomplete_reason;
  bool positive = false;                      // every cut
  bool negative_divergence_detected = false;  // every cut, each control well formed
  bool all_checks_passed = false;
  std::vector<CutVerdict> cuts;
  std::vector<TrainerRun> runs;
  std::filesystem::path report_json;  // DIR/verification.json
  std::filesystem::path report_svg;   // DIR/report.svg (when the comparison completed)
  // When a resume deviates: the continuous run's final checkpoint compared
  // with the resumed run's (of the first cut that fails) by diff_checkpoints
  // (holdpoint/verify/checkpoint_diff.h) under the verification's tolerance,
  // written as DIR/final-diff.txt and DIR/final-diff.json; empty otherwise.
  // A diff that cannot be made (a checkpoint missing or unreadable) leaves
  // its error line in final-diff.txt and no JSON.
  std::filesystem::path final_diff_text;
  std::filesystem::path final_diff_json;

  // 0 all checks passed, 1 a comparison failed, 2 the verification could not complete.
  int exit_code() const noexcept;
};

enum class RunEvent : std::uint8_t { started, finished };
// Called on the verifying thread as each run starts and finishes.
using RunObserver = std::function<void(RunEvent event, const TrainerRun& run, std::size_t index, std::size_t total)>;

// Runs the protocol (one cut, or every cut with `sweep`), writes
// DIR/verification.json (always) and DIR/report.svg (when it completed), and
// returns the verdict. Stops at the first run that fails or file that cannot
// be read.
ResumeVerification verify_resume(const ResumeVerificationOptions& options, const RunObserver& observer = {});

}  // namespace holdpoint
