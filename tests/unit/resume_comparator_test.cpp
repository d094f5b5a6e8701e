// The resume verifier's comparator on hand-written summaries, traces and
// state trees: what passes, what fails, with which code and where.
#include <cmath>
#include <cstring>
#include <limits>

#include "holdpoint/verify/resume_verifier.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- builders ---------------------------------------------------------------------

TraceStep step(std::int64_t n, std::vector<std::int64_t> ids, double lr, double loss,
               std::vector<std::pair<std::string, TraceNumber>> draws = {{"noise", 0.25}}) {
  TraceStep s;
  s.step = n;
  s.epoch = (n - 1) / 6;
  s.sample_ids = std::move(ids);
  s.lr = lr;
  s.loss = loss;
  s.rng_next = std::move(draws);
  return s;
}

std::vector<TraceStep> trace(std::int64_t steps) {
  std::vector<TraceStep> out;
  for (std::int64_t n = 1; n <= steps; ++n) {
    out.push_back(step(n, {4 * n, 4 * n + 1, 4 * n + 2, 4 * n + 3}, 0.03 / static_cast<double>(n), 1.0 / static_cast<double>(n),
                       {{"noise", 0.1 * static_cast<double>(n)}, {"gain", std::int64_t{1000} + n}}));
  }
  return out;
}

const Comparison& find(const std::vector<Comparison>& comparisons, const std::string& quantity) {
  for (const Comparison& c : comparisons) {
    if (c.quantity == quantity) return c;
  }
  ADD_FAILURE() << "no comparison named " << quantity;
  static const Comparison none;
  return none;
}

std::vector<std::string> failed(const std::vector<Comparison>& comparisons) {
  std::vector<std::string> names;
  for (const Comparison& c : comparisons) {
    if (!c.passed) names.push_back(c.quantity);
  }
  return names;
}

Value doubles(std::vector<std::int64_t> sizes, const std::vector<double>& values) {
  return Value::tensor(TensorData::from_bytes(
      DType::float64, std::move(sizes), {reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(double)}));
}

Value floats(std::vector<std::int64_t> sizes, const std::vector<float>& values) {
  return Value::tensor(TensorData::from_bytes(
      DType::float32, std::move(sizes), {reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(float)}));
}

Value int64s(std::vector<std::int64_t> sizes, const std::vector<std::int64_t>& values) {
  return Value::tensor(TensorData::from_bytes(DType::int64, std::move(sizes),
                                              {reinterpret_cast<const std::byte*>(values.data()),
                                               values.size() * sizeof(std::int64_t)}));
}

Value dict(std::vector<std::pair<std::string, Value>> entries) {
  Dict d;
  for (auto& [key, value] : entries) d.insert(key, std::move(value));
  return Value::dict(std::move(d));
}

const char* kSummary = R"({
  "schema": "holdpoint.resume-summary", "schema_version": 1,
  "trainer": "test", "steps_run": 2, "global_step": 7, "resumed_from": "a/checkpoint.pt", "rng_restored": true,
  "versions": {"holdpoint": "0.1.0", "libtorch": "1.13.0"},
  "final": {"loss": 0.5, "mse": "nan", "next_lr": 0.0075},
  "generators": ["noise", "raw"],
  "trace": [
    {"step": 6, "epoch": 1, "sample_ids": [3, 1], "lr": 0.015, "loss": 0.25,
     "rng_next": {"noise": 0.5, "raw": 18446744073709551615}, "extra": "ignored"},
    {"step": 7, "epoch": 1, "sample_ids": [0, 2], "lr": 0.015, "loss": "-inf",
     "rng_next": {"raw": 3, "noise": 1e-300}}
  ]
})";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

// ---- summary.json -------------------------------------------------------------------

TEST(RunSummary, ParsesEveryFieldOfTheContract) {
  const RunSummary s = parse_run_summary(kSummary, "summary.json");
  EXPECT_EQ(s.trainer, "test");
  EXPECT_EQ(s.steps_run, 2);
  EXPECT_EQ(s.global_step, 7);
  EXPECT_EQ(s.resumed_from, "a/checkpoint.pt");
  EXPECT_TRUE(s.rng_restored);
  ASSERT_EQ(s.versions.size(), 2u);
  EXPECT_EQ(s.versions[1], (std::pair<std::string, std::string>{"libtorch", "1.13.0"}));
  EXPECT_TRUE(std::isnan(trace_number_value(s.final_mse)));
  EXPECT_EQ(s.generators, (std::vector<std::string>{"noise", "raw"}));
  ASSERT_EQ(s.trace.size(), 2u);
  EXPECT_EQ(s.trace[0].sample_ids, (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(trace_number_value(s.trace[1].loss), -kInf);
  // Draws come in the summary's generator order, whatever the record's key order.
  EXPECT_EQ(s.trace[1].rng_next[0].first, "noise");
  EXPECT_EQ(s.trace[1].rng_next[1].first, "raw");
  // A raw 64-bit draw stays exact.
  EXPECT_EQ(std::get<std::uint64_t>(s.trace[0].rng_next[1].second), std::numeric_limits<std::uint64_t>::max());
}

TEST(RunSummary, BareNaNIsNotJson) {
  EXPECT_ERROR_CODE(parse_run_summary(replaced(kSummary, "\"nan\"", "NaN"), "s"), ErrorCode::resume_summary_unreadable);
  EXPECT_ERROR_CODE(parse_run_summary("{\"schema\": ", "s"), ErrorCode::resume_summary_unreadable);
}

TEST(RunSummary, UnknownSchemaIsRefused) {
  EXPECT_ERROR_CODE(parse_run_summary(replaced(kSummary, "\"schema_version\": 1", "\"schema_version\": 2"), "s"),
                    ErrorCode::resume_summary_schema_unsupported);
  EXPECT_ERROR_CODE(parse_run_summary(replaced(kSummary, "holdpoint.resume-summary", "other"), "s"),
                    ErrorCode::resume_summary_schema_unsupported);
}

TEST(RunSummary, MissingTraceFieldIsNamed) {
  try {
    parse_run_summary(replaced(kSummary, R"("lr": 0.015, "loss": "-inf")", R"("loss": "-inf")"), "resumed/summary.json");
    FAIL() << "accepted a trace record without lr";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::resume_summary_field_missing);
    EXPECT_THAT(error.what(), ::testing::HasSubstr("resumed/summary.json: trace[1].lr is missing"));
  }
}

TEST(RunSummary, MissingTopLevelFieldsAreRefused) {
  for (const std::string field : {R"("trainer": "test", )", R"("steps_run": 2, )", R"("rng_restored": true,)",
                                  R"("generators": ["noise", "raw"],)", R"("next_lr": 0.0075)"}) {
    std::string text = replaced(kSummary, field, "");
    if (field == R"("next_lr": 0.0075)") text = replaced(text, R"("mse": "nan", )", R"("mse": "nan")");
    SCOPED_TRACE(field);
    EXPECT_ERROR_CODE(parse_run_summary(text, "s"), ErrorCode::resume_summary_field_missing);
  }
}

TEST(RunSummary, WrongTypesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("steps_run": 2)", R"("steps_run": 2.0)"},
      {R"("steps_run": 2)", R"("steps_run": "2")"},
      {R"("rng_restored": true)", R"("rng_restored": 1)"},
      {R"("sample_ids": [3, 1])", R"("sample_ids": [3, 1.5])"},
      {R"("sample_ids": [3, 1])", R"("sample_ids": "3,1")"},
      {R"("lr": 0.015, "loss": 0.25)", R"("lr": "fast", "loss": 0.25)"},
      {R"("lr": 0.015, "loss": 0.25)", R"("lr": null, "loss": 0.25)"},
      {R"("resumed_from": "a/checkpoint.pt")", R"("resumed_from": 5)"},
      {R"("libtorch": "1.13.0")", R"("libtorch": 1.13)"},
      {R"("generators": ["noise", "raw"])", R"("generators": ["noise", "noise"])"},
      // A draw of a generator the summary does not list.
      {R"("raw": 3, "noise": 1e-300)", R"("raw": 3, "noise": 1e-300, "other": 1)"},
  };
  for (const auto& edit : cases) {
    SCOPED_TRACE(edit.second);
    EXPECT_ERROR_CODE(parse_run_summary(replaced(kSummary, edit.first, edit.second), "s"),
                      ErrorCode::resume_summary_field_invalid);
  }
}

// ---- traces ---------------------------------------------------------------------------

TEST(CompareTraces, IdenticalTracesPassWithZeroDeviation) {
  const auto a = trace(10);
  const auto comparisons = compare_traces(a, a, {});
  EXPECT_TRUE(failed(comparisons).empty());
  for (const std::string q : {"trace", "step", "epoch", "sample_ids", "lr", "loss", "rng_next.noise", "rng_next.gain"}) {
    const Comparison& c = find(comparisons, q);
    EXPECT_TRUE(c.passed) << q;
    EXPECT_GT(c.values_compared, 0u) << q;
  }
  EXPECT_EQ(find(comparisons, "loss").max_abs_deviation, 0.0);
  EXPECT_EQ(find(comparisons, "sample_ids").values_compared, 40u);
}

TEST(CompareTraces, DeviationBeyondAbsoluteToleranceFailsAtItsStep) {
  const auto a = trace(10);
  auto b = a;
  b[6].loss = trace_number_value(a[6].loss) + 1e-9;
  const auto comparisons = compare_traces(a, b, {});
  EXPECT_EQ(failed(comparisons), std::vector<std::string>{"loss"});
  const Comparison& loss = find(comparisons, "loss");
  EXPECT_EQ(loss.failure, ErrorCode::resume_value_deviation);
  EXPECT_EQ(loss.first_failure.step, 7);
  EXPECT_EQ(loss.at.step, 7);
  EXPECT_NEAR(*loss.max_abs_deviation, 1e-9, 1e-15);
  EXPECT_THAT(loss.detail, ::testing::HasSubstr("step 7"));
}

TEST(CompareTraces, DeviationWithinAbsoluteTolerancePasses) {
  const auto a = trace(4);
  auto b = a;
  b[2].lr = trace_number_value(a[2].lr) + 5e-13;
  const auto comparisons = compare_traces(a, b, {.absolute = 1e-12, .relative = 0});
  EXPECT_TRUE(failed(comparisons).empty());
  EXPECT_GT(*find(comparisons, "lr").max_abs_deviation, 0.0);
}

TEST(CompareTraces, RelativeToleranceScalesWithTheContinuousValue) {
  auto a = trace(2);
  a[0].loss = 1000.0;
  a[1].loss = 0.001;
  auto b = a;
  b[0].loss = 1000.0 + 1e-4;  // 1e-7 relative
  EXPECT_TRUE(find(compare_traces(a, b, {.absolute = 0, .relative = 1e-6}), "loss").passed);
  b[1].loss = 0.001 + 1e-8;  // 1e-5 relative: beyond
  const Comparison loss = find(compare_traces(a, b, {.absolute = 0, .relative = 1e-6}), "loss");
  EXPECT_FALSE(loss.passed);
  EXPECT_EQ(loss.first_failure.step, 2);
  // The largest absolute deviation is at step 1, which passed.
  EXPECT_EQ(loss.at.step, 1);
}

TEST(CompareTraces, NaNFailsEvenWhenBothRunsHaveIt) {
  auto a = trace(3);
  a[1].loss = kNaN;
  const Comparison loss = find(compare_traces(a, a, {}), "loss");
  EXPECT_FALSE(loss.passed);
  EXPECT_EQ(loss.failure, ErrorCode::resume_value_not_finite);
  EXPECT_EQ(loss.first_failure.step, 2);
}

TEST(CompareTraces, NaNAfterADeviationIsTheReportedFailure) {
  const auto a = trace(6);
  auto b = a;
  b[1].loss = 0.123;  // deviates first
  b[4].loss = kNaN;   // then a NaN, which must not hide behind the deviation
  const Comparison loss = find(compare_traces(a, b, {}), "loss");
  EXPECT_EQ(loss.failure, ErrorCode::resume_value_not_finite);
  EXPECT_EQ(loss.first_failure.step, 5);
  EXPECT_EQ(loss.values_failed, 2u);
}

TEST(CompareTraces, InfinityInTheResumedTraceFails) {
  const auto a = trace(3);
  auto b = a;
  b[2].lr = -kInf;
  const Comparison lr = find(compare_traces(a, b, {.absolute = 1e300, .relative = 0}), "lr");
  EXPECT_EQ(lr.failure, ErrorCode::resume_value_not_finite);
  EXPECT_EQ(lr.first_failure.step, 3);
}

TEST(CompareTraces, SampleIdsAreExactWhateverTheTolerance) {
  const auto a = trace(5);
  auto b = a;
  std::swap(b[3].sample_ids[1], b[3].sample_ids[2]);
  const Comparison ids = find(compare_traces(a, b, {.absolute = 100, .relative = 1}), "sample_ids");
  EXPECT_EQ(ids.failure, ErrorCode::resume_value_mismatch);
  EXPECT_EQ(ids.first_failure.step, 4);
  EXPECT_EQ(ids.first_failure.index, std::vector<std::int64_t>{1});
  EXPECT_EQ(ids.values_failed, 2u);
}

TEST(CompareTraces, ShorterBatchIsAStructureFailure) {
  const auto a = trace(3);
  auto b = a;
  b[1].sample_ids.pop_back();
  const Comparison ids = find(compare_traces(a, b, {}), "sample_ids");
  EXPECT_EQ(ids.failure, ErrorCode::resume_structure_mismatch);
  EXPECT_EQ(ids.first_failure.step, 2);
}

TEST(CompareTraces, MissingStepIsAStructureFailureAtThatStep) {
  const auto a = trace(10);
  auto b = a;
  b.pop_back();
  const Comparison t = find(compare_traces(a, b, {}), "trace");
  EXPECT_EQ(t.failure, ErrorCode::resume_structure_mismatch);
  EXPECT_EQ(t.first_failure.step, 10);
  EXPECT_THAT(t.detail, ::testing::HasSubstr("step 10 is missing"));
}

TEST(CompareTraces, ExtraStepIsAStructureFailure) {
  const auto a = trace(4);
  auto b = trace(5);
  const auto comparisons = compare_traces(a, b, {});
  EXPECT_EQ(failed(comparisons), std::vector<std::string>{"trace"});
  EXPECT_THAT(find(comparisons, "trace").detail, ::testing::HasSubstr("step 5 is extra"));
}

TEST(CompareTraces, RepeatedStepIsAMismatchOfTheStepNumber) {
  const auto a = trace(4);
  auto b = a;
  b[2].step = 2;  // step 2 ran twice (a resume that redid an update)
  const Comparison s = find(compare_traces(a, b, {}), "step");
  EXPECT_EQ(s.failure, ErrorCode::resume_value_mismatch);
  EXPECT_EQ(s.first_failure.step, 3);
}

TEST(CompareTraces, OneGeneratorDrawDivergesUnderItsOwnName) {
  const auto a = trace(6);
  auto b = a;
  for (std::size_t i = 3; i < 6; ++i) b[i].rng_next[0].second = 0.9;
  const auto comparisons = compare_traces(a, b, {});
  EXPECT_EQ(failed(comparisons), std::vector<std::string>{"rng_next.noise"});
  EXPECT_EQ(find(comparisons, "rng_next.noise").first_failure.step, 4);
}

TEST(CompareTraces, IntegerDrawsCompareExactly) {
  auto a = trace(2);
  a[0].rng_next[1].second = std::numeric_limits<std::uint64_t>::max();
  auto b = a;
  b[0].rng_next[1].second = std::numeric_limits<std::uint64_t>::max() - 1;  // equal as doubles
  const Comparison gain = find(compare_traces(a, b, {.absolute = 1e6, .relative = 1}), "rng_next.gain");
  EXPECT_EQ(gain.failure, ErrorCode::resume_value_mismatch);
  EXPECT_EQ(*gain.max_abs_deviation, 1.0);
}

TEST(CompareTraces, GeneratorMissingFromARecordIsAStructureFailure) {
  const auto a = trace(3);
  auto b = a;
  b[1].rng_next.pop_back();
  const Comparison gain = find(compare_traces(a, b, {}), "rng_next.gain");
  EXPECT_EQ(gain.failure, ErrorCode::resume_structure_mismatch);
  EXPECT_EQ(gain.first_failure.step, 2);
}

// ---- final metrics and protocol ----------------------------------------------------------

TEST(CompareFinalMetrics, GeneratorsAndMetrics) {
  RunSummary a = parse_run_summary(kSummary, "a");
  a.final_mse = 0.25;
  RunSummary b = a;
  EXPECT_TRUE(failed(compare_final_metrics(a, b, {})).empty());
  b.final_mse = 0.26;
  b.generators = {"noise"};
  EXPECT_EQ(failed(compare_final_metrics(a, b, {})), (std::vector<std::string>{"generators", "final.mse"}));
  EXPECT_EQ(find(compare_final_metrics(a, b, {}), "generators").failure, ErrorCode::resume_structure_mismatch);
}

TEST(CheckRunProtocol, SummaryMustMatchTheCommand) {
  const RunSummary s = parse_run_summary(kSummary, "s");
  const RunExpectation resumed{"resumed", 2, 7, true, true};
  EXPECT_TRUE(check_run_protocol(s, resumed, &s.versions).passed);

  RunExpectation more_steps = resumed;
  more_steps.steps_run = 3;
  more_steps.global_step = 8;
  const Comparison wrong_steps = check_run_protocol(s, more_steps, nullptr);
  EXPECT_EQ(wrong_steps.failure, ErrorCode::resume_protocol_violated);
  EXPECT_EQ(wrong_steps.quantity, "protocol.resumed");

  RunExpectation no_rng = resumed;
  no_rng.rng_restored = false;  // the trainer ignored --omit-rng-restore
  EXPECT_THAT(check_run_protocol(s, no_rng, nullptr).detail, ::testing::HasSubstr("rng_restored is true"));

  RunExpectation fresh = resumed;
  fresh.resumed = false;
  EXPECT_FALSE(check_run_protocol(s, fresh, nullptr).passed);

  std::vector<std::pair<std::string, std::string>> other = s.versions;
  other[1].second = "2.0.0";
  EXPECT_FALSE(check_run_protocol(s, resumed, &other).passed);
}

// ---- state trees ---------------------------------------------------------------------------

TEST(CompareState, IdenticalTreesPass) {
  const Value a = dict({{"w", doubles({2, 2}, {1, 2, 3, 4})}, {"step", Value::integer(5)}, {"lr", Value::floating(0.1)},
                        {"name", Value::string("adam")}, {"none", Value::none()}, {"ids", int64s({3}, {2, 0, 1})}});
  const Comparison c = compare_state("optimizer", a, a, {});
  EXPECT_TRUE(c.passed) << c.detail;
  EXPECT_EQ(c.values_compared, 11u);
  EXPECT_EQ(c.max_abs_deviation, 0.0);
}

TEST(CompareState, TensorDeviationIsLocatedByPathAndIndex) {
  const Value a = dict({{"0.weight", doubles({2, 3}, {1, 2, 3, 4, 5, 6})}});
  const Value b = dict({{"0.weight", doubles({2, 3}, {1, 2, 3, 4, 5 + 1e-6, 6})}});
  const Comparison c = compare_state("model", a, b, {});
  EXPECT_EQ(c.failure, ErrorCode::resume_value_deviation);
  EXPECT_EQ(c.first_failure.path, "['0.weight']");
  EXPECT_EQ(c.first_failure.index, (std::vector<std::int64_t>{1, 1}));
  EXPECT_NEAR(*c.max_abs_deviation, 1e-6, 1e-12);
  EXPECT_THAT(c.detail, ::testing::HasSubstr("['0.weight'][1, 1]"));
  EXPECT_TRUE(compare_state("model", a, b, {.absolute = 1e-5, .relative = 0}).passed);
}

TEST(CompareState, Float32ElementsCompareAsDoubles) {
  const Comparison c = compare_state("m", floats({2}, {1.0f, 2.0f}), floats({2}, {1.0f, std::nextafter(2.0f, 3.0f)}), {});
  EXPECT_EQ(c.failure, ErrorCode::resume_value_deviation);
  EXPECT_NEAR(*c.max_abs_deviation, 2.384185791015625e-07, 1e-20);
}

TEST(CompareState, SubByteTensorsCompareTheirPackedBytes) {
  // F6 elements straddle bytes: one differing bit anywhere is one mismatch.
  const auto f6 = [](std::string_view bytes) {
    return Value::tensor(TensorData::from_bytes(DType::float6_e2m3fn, {4}, std::as_bytes(std::span(bytes))));
  };
  const Comparison same = compare_state("m", f6("\x01\x02\x03"), f6("\x01\x02\x03"), {});
  EXPECT_TRUE(same.passed) << same.detail;
  EXPECT_EQ(same.values_compared, 1u);
  const Comparison differ = compare_state("m", f6("\x01\x02\x03"), f6("\x01\x02\x83"), {.absolute = 1, .relative = 1});
  EXPECT_EQ(differ.failure, ErrorCode::resume_value_mismatch);
  EXPECT_THAT(differ.detail, ::testing::HasSubstr("float6_e2m3fn bits differ"));
}

TEST(CompareState, ShapeMismatchIsStructure) {
  const Comparison c = compare_state("model", doubles({2, 3}, {1, 2, 3, 4, 5, 6}), doubles({3, 2}, {1, 2, 3, 4, 5, 6}), {});
  EXPECT_EQ(c.failure, ErrorCode::resume_structure_mismatch);
  EXPECT_THAT(c.detail, ::testing::HasSubstr("shape [2, 3] vs [3, 2]"));
}

TEST(CompareState, DtypeMismatchIsStructure) {
  EXPECT_EQ(compare_state("model", doubles({2}, {1, 2}), floats({2}, {1, 2}), {}).failure,
            ErrorCode::resume_structure_mismatch);
}

TEST(CompareState, KindMismatchIsStructure) {
  EXPECT_EQ(compare_state("s", Value::integer(3), Value::floating(3.0), {}).failure, ErrorCode::resume_structure_mismatch);
  EXPECT_EQ(compare_state("s", Value::list({}), Value::tuple({}), {}).failure, ErrorCode::resume_structure_mismatch);
}

TEST(CompareState, MissingAndExtraKeysAreStructure) {
  const Value a = dict({{"state", dict({})}, {"param_groups", Value::list({})}});
  const Value b = dict({{"param_groups", Value::list({})}, {"extra", Value::none()}});
  const Comparison c = compare_state("optimizer", a, b, {});
  EXPECT_EQ(c.failure, ErrorCode::resume_structure_mismatch);
  EXPECT_EQ(c.first_failure.path, "['state']");
  EXPECT_EQ(c.values_failed, 2u);
}

TEST(CompareState, KeyOrderDoesNotMatter) {
  const Value a = dict({{"x", Value::integer(1)}, {"y", Value::integer(2)}});
  const Value b = dict({{"y", Value::integer(2)}, {"x", Value::integer(1)}});
  EXPECT_TRUE(compare_state("s", a, b, {}).passed);
}

TEST(CompareState, ListLengthIsStructure) {
  const Comparison c = compare_state("s", Value::list({Value::integer(1), Value::integer(2)}),
                                     Value::list({Value::integer(1)}), {});
  EXPECT_EQ(c.failure, ErrorCode::resume_structure_mismatch);
}

TEST(CompareState, IntegersAreExactWhateverTheTolerance) {
  const Tolerance loose{.absolute = 10, .relative = 1};
  const Comparison scalar = compare_state("progress", dict({{"global_step", Value::integer(10)}}),
                                          dict({{"global_step", Value::integer(9)}}), loose);
  EXPECT_EQ(scalar.failure, ErrorCode::resume_value_mismatch);
  EXPECT_EQ(scalar.first_failure.path, "['global_step']");

  const Comparison tensor = compare_state("sampler", int64s({4}, {3, 1, 0, 2}), int64s({4}, {3, 1, 2, 0}), loose);
  EXPECT_EQ(tensor.failure, ErrorCode::resume_value_mismatch);
  EXPECT_EQ(tensor.first_failure.index, std::vector<std::int64_t>{2});
  EXPECT_EQ(tensor.values_failed, 2u);

  EXPECT_EQ(compare_state("s", Value::boolean(true), Value::boolean(false), loose).failure,
            ErrorCode::resume_value_mismatch);
  EXPECT_EQ(compare_state("s", Value::string("StepLR"), Value::string("ExponentialLR"), loose).failure,
            ErrorCode::resume_value_mismatch);
}

TEST(CompareState, NaNInATensorFails) {
  const Value a = doubles({3}, {1, kNaN, 3});
  const Comparison c = compare_state("model", a, a, {});
  EXPECT_EQ(c.failure, ErrorCode::resume_value_not_finite);
  EXPECT_EQ(c.first_failure.index, std::vector<std::int64_t>{1});
}

TEST(CompareState, InfinityInATensorFails) {
  const Value a = doubles({2}, {kInf, 1});
  EXPECT_EQ(compare_state("model", a, a, {}).failure, ErrorCode::resume_value_not_finite);
}

TEST(CompareState, TheSameInfiniteScalarIsASentinelAndPasses) {
  // ReduceLROnPlateau's initial `best`, as a float or a 0-d tensor.
  EXPECT_TRUE(compare_state("scheduler", dict({{"best", Value::floating(kInf)}}), dict({{"best", Value::floating(kInf)}}), {})
                  .passed);
  EXPECT_TRUE(compare_state("scheduler", doubles({}, {kInf}), doubles({}, {kInf}), {}).passed);
  EXPECT_EQ(compare_state("scheduler", Value::floating(kInf), Value::floating(-kInf), {}).failure,
            ErrorCode::resume_value_not_finite);
  EXPECT_EQ(compare_state("scheduler", Value::floating(kNaN), Value::floating(kNaN), {}).failure,
            ErrorCode::resume_value_not_finite);
}

TEST(CompareState, StridedViewsCompareByTheirElements) {
  // A transposed view of [[1, 2], [3, 4]] holds the elements 1, 3, 2, 4.
  std::vector<double> storage = {1, 2, 3, 4};
  TensorData view = TensorData::from_bytes(DType::float64, {2, 2},
                                           {reinterpret_cast<const std::byte*>(storage.data()), 4 * sizeof(double)});
  view.strides = {1, 2};
  EXPECT_TRUE(compare_state("m", Value::tensor(view), doubles({2, 2}, {1, 3, 2, 4}), {}).passed);
  EXPECT_FALSE(compare_state("m", Value::tensor(view), doubles({2, 2}, {1, 2, 3, 4}), {}).passed);
}

// ---- checkpoints -------------------------------------------------------------------------------

TEST(CompareCheckpoints, OneComparisonPerComponentAndTheManifestIsSkipped) {
  const Value a = dict({{"holdpoint", dict({{"max_steps", Value::integer(10)}})},
                        {"model", dict({{"w", doubles({1}, {1})}})},
                        {"scheduler", dict({{"last_epoch", Value::integer(10)}})}});
  const Value b = dict({{"holdpoint", dict({{"max_steps", Value::integer(5)}})},
                        {"model", dict({{"w", doubles({1}, {1})}})},
                        {"scheduler", dict({{"last_epoch", Value::integer(10)}})}});
  const auto comparisons = compare_checkpoints(a, b, {});
  ASSERT_EQ(comparisons.size(), 2u);
  EXPECT_EQ(comparisons[0].quantity, "model");
  EXPECT_EQ(comparisons[1].quantity, "scheduler");
  EXPECT_TRUE(failed(comparisons).empty());
}

TEST(CompareCheckpoints, MissingComponentFails) {
  const Value a = dict({{"model", dict({})}, {"optimizer", dict({})}});
  const Value b = dict({{"model", dict({})}, {"sampler", dict({})}});
  const auto comparisons = compare_checkpoints(a, b, {});
  EXPECT_EQ(failed(comparisons), (std::vector<std::string>{"optimizer", "sampler"}));
  EXPECT_EQ(find(comparisons, "optimizer").failure, ErrorCode::resume_structure_mismatch);
}

TEST(CompareCheckpoints, ARootThatIsNotADictFails) {
  const auto comparisons = compare_checkpoints(Value::list({}), dict({}), {});
  ASSERT_EQ(comparisons.size(), 1u);
  EXPECT_EQ(comparisons[0].failure, ErrorCode::resume_structure_mismatch);
}

TEST(Tolerance, TheRuleIsAbsolutePlusRelativeTimesContinuous) {
  const Tolerance t{.absolute = 0.25, .relative = 0.5};  // exact binary fractions: the bound is 1.25 at 2
  EXPECT_TRUE(t.accepts(2.0, 3.25));
  EXPECT_TRUE(t.accepts(-2.0, -3.25));
  EXPECT_FALSE(t.accepts(2.0, std::nextafter(3.25, 4.0)));
  EXPECT_FALSE(t.accepts(kNaN, kNaN));
}

}  // namespace
}  // namespace holdpoint
