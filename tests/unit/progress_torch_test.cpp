// Progress counters, early stopping and the metrics history: round trips
// through real checkpoint files (plain and torch 1.13 compatible), the early
// stopping rule, and rejected states that leave the live objects unchanged.
#include <cmath>
#include <limits>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/progress.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

constexpr double kInfinity = std::numeric_limits<double>::infinity();

Value round_trip(const Value& state, const std::filesystem::path& path, bool torch_1_13_compatible) {
  SaveOptions options;
  options.torch_1_13_compatible = torch_1_13_compatible;  // floats become 0-d float64 tensors
  save_mapping(path, state, options);
  return load_checkpoint_mapping(path).root;
}

Value with_field(const Value& state, const std::string& key, std::optional<Value> value) {
  Dict entries;
  bool found = false;
  for (const auto& [name, item] : state.as_dict()) {
    if (name.as_string() != key) {
      entries.insert(name, item);
    } else {
      found = true;
      if (value) entries.insert(name, *value);
    }
  }
  if (!found && value) entries.insert(key, *value);
  return Value::dict(std::move(entries));
}

// The poison check: `component` rejects `state` with `code` and its capture
// is the same before and after.
void expect_rejected(Component& component, const Value& state, ErrorCode code) {
  const Value before = component.capture(CaptureMode::copy);
  EXPECT_ERROR_CODE(component.validate(state), code);
  const Value after = component.capture(CaptureMode::copy);
  EXPECT_TRUE(equal_content(before, after)) << describe_difference(before, after);
}

// ---- progress ---------------------------------------------------------------------------

TEST(ProgressState, RoundTripsThroughAFile) {
  TempDir dir;
  Progress progress{1234, 5, 17, 98765};
  ProgressState component(progress);
  EXPECT_EQ(component.name(), "progress");
  for (bool compatible : {false, true}) {
    const Value loaded = round_trip(component.capture(CaptureMode::reference), dir / "progress.pt", compatible);
    Progress restored;
    ProgressState target(restored);
    target.validate(loaded);
    target.apply(loaded);
    EXPECT_EQ(restored.global_step, 1234);
    EXPECT_EQ(restored.epoch, 5);
    EXPECT_EQ(restored.batch_in_epoch, 17);
    EXPECT_EQ(restored.samples_seen, 98765);
  }
}

TEST(ProgressState, NegativeMissingUnknownAndMistypedCountersAreRejected) {
  Progress progress{10, 1, 2, 320};
  ProgressState component(progress);
  const Value good = component.capture(CaptureMode::copy);
  for (const char* key : {"global_step", "epoch", "batch_in_epoch", "samples_seen"}) {
    SCOPED_TRACE(key);
    expect_rejected(component, with_field(good, key, Value::integer(-1)), ErrorCode::state_value_invalid);
    expect_rejected(component, with_field(good, key, std::nullopt), ErrorCode::state_key_missing);
    expect_rejected(component, with_field(good, key, Value::string("10")), ErrorCode::state_type_invalid);
    expect_rejected(component, with_field(good, key, Value::floating(2.5)), ErrorCode::state_value_invalid);
  }
  expect_rejected(component, with_field(good, "loss", Value::floating(0.1)), ErrorCode::state_key_unknown);
  expect_rejected(component, Value::integer(3), ErrorCode::state_type_invalid);
  EXPECT_EQ(progress.global_step, 10);
  EXPECT_EQ(progress.samples_seen, 320);
}

// ---- early stopping ---------------------------------------------------------------------

TEST(EarlyStopping, StopsAfterPatienceUpdatesWithoutImprovementBeyondMinDelta) {
  EarlyStopping stopper(EarlyStoppingMode::min, 2, 0.1);
  EXPECT_EQ(stopper.best(), kInfinity);
  EXPECT_FALSE(stopper.update(1.0));   // improves on +inf
  EXPECT_FALSE(stopper.update(0.95));  // within min_delta: bad epoch 1
  EXPECT_EQ(stopper.bad_epochs(), 1);
  EXPECT_FALSE(stopper.update(0.8));   // improves by more than min_delta
  EXPECT_EQ(stopper.best(), 0.8);
  EXPECT_EQ(stopper.bad_epochs(), 0);
  EXPECT_FALSE(stopper.update(std::nan("")));  // NaN never improves
  EXPECT_TRUE(stopper.update(0.79));
  EXPECT_TRUE(stopper.stopped());
  EXPECT_TRUE(stopper.update(0.0));  // once stopped, nothing changes
  EXPECT_EQ(stopper.best(), 0.8);
  EXPECT_EQ(stopper.bad_epochs(), 2);

  EarlyStopping maximizer(EarlyStoppingMode::max, 1);
  EXPECT_EQ(maximizer.best(), -kInfinity);
  EXPECT_FALSE(maximizer.update(0.5));
  EXPECT_TRUE(maximizer.update(0.5));

  EXPECT_ERROR_CODE(EarlyStopping(EarlyStoppingMode::min, -1), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(EarlyStopping(EarlyStoppingMode::min, 1, -0.1), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(EarlyStopping(EarlyStoppingMode::min, 1, kInfinity), ErrorCode::invalid_argument);
}

TEST(EarlyStoppingState, RoundTripsThroughAFileIncludingAnInfiniteBest) {
  TempDir dir;
  for (bool compatible : {false, true}) {
    for (int updates : {0, 2}) {
      SCOPED_TRACE(std::to_string(compatible) + "/" + std::to_string(updates));
      EarlyStopping stopper(EarlyStoppingMode::max, 3, 0.01);
      if (updates) {
        stopper.update(0.7);
        stopper.update(0.705);
      }
      EarlyStoppingState component(stopper);
      EXPECT_EQ(component.name(), "early_stop");
      const Value loaded = round_trip(component.capture(CaptureMode::reference), dir / "early.pt", compatible);

      EarlyStopping restored(EarlyStoppingMode::max, 3, 0.01);
      restored.update(100.0);  // a different state, to see apply replace it
      EarlyStoppingState target(restored);
      target.validate(loaded);
      target.apply(loaded);
      EXPECT_EQ(restored.best(), stopper.best());
      EXPECT_EQ(restored.bad_epochs(), stopper.bad_epochs());
      EXPECT_EQ(restored.stopped(), stopper.stopped());
      // Both continue identically.
      EXPECT_EQ(restored.update(0.71), stopper.update(0.71));
      EXPECT_EQ(restored.update(0.70), stopper.update(0.70));
      EXPECT_EQ(restored.bad_epochs(), stopper.bad_epochs());
    }
  }
}

TEST(EarlyStoppingState, ConfigurationDriftAndInconsistentProgressAreRejected) {
  EarlyStopping stopper(EarlyStoppingMode::min, 3, 0.0);
  stopper.update(1.0);
  stopper.update(2.0);
  EarlyStoppingState component(stopper);
  const Value good = component.capture(CaptureMode::copy);
  component.validate(good);

  expect_rejected(component, with_field(good, "mode", Value::string("max")), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "patience", Value::integer(4)), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "min_delta", Value::floating(0.5)), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "best", Value::floating(std::nan(""))), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "best", Value::string("1.0")), ErrorCode::state_type_invalid);
  expect_rejected(component, with_field(good, "bad_epochs", Value::integer(-1)), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "bad_epochs", Value::integer(4)), ErrorCode::state_value_invalid);
  // Three bad epochs with patience 3 means stopped; stopped means patience reached.
  expect_rejected(component, with_field(good, "bad_epochs", Value::integer(3)), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "stopped", Value::boolean(true)), ErrorCode::state_value_invalid);
  expect_rejected(component, with_field(good, "stopped", Value::integer(0)), ErrorCode::state_type_invalid);
  expect_rejected(component, with_field(good, "wait", Value::integer(0)), ErrorCode::state_key_unknown);
  expect_rejected(component, with_field(good, "best", std::nullopt), ErrorCode::state_key_missing);
  EXPECT_EQ(stopper.bad_epochs(), 1);
  EXPECT_EQ(stopper.best(), 1.0);
}

// ---- metrics history --------------------------------------------------------------------

TEST(MetricsHistoryState, RoundTripsThroughAFileKeepingOrderAndSpecialValues) {
  TempDir dir;
  MetricsHistory history;
  history.append(0, 0, {{"loss", 2.5}, {"accuracy", 0.1}});
  history.append(10, 0, {{"loss", std::nan("")}, {"lr", 1e-3}});
  history.append(10, 1, {});
  history.append(20, 1, {{"val/loss", -kInfinity}});
  MetricsHistoryState component(history);
  EXPECT_EQ(component.name(), "history");
  for (bool compatible : {false, true}) {
    const Value captured = component.capture(CaptureMode::reference);
    const Value loaded = round_trip(captured, dir / "history.pt", compatible);
    MetricsHistory restored;
    restored.append(5, 0, {{"stale", 1.0}});
    MetricsHistoryState target(restored);
    target.validate(loaded);
    target.apply(loaded);
    EXPECT_TRUE(equal_content(target.capture(CaptureMode::copy), captured))
        << describe_difference(target.capture(CaptureMode::copy), captured);
    ASSERT_EQ(restored.records().size(), 4u);
    EXPECT_EQ(restored.records()[1].metrics[0].first, "loss");
    EXPECT_TRUE(std::isnan(restored.records()[1].metrics[0].second));
  }
}

TEST(MetricsHistory, AppendChecksItsArguments) {
  MetricsHistory history;
  history.append(5, 0, {{"loss", 1.0}});
  EXPECT_ERROR_CODE(history.append(4, 0, {}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(history.append(-1, 0, {}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(history.append(6, -1, {}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(history.append(6, 0, {{"loss", 1.0}, {"loss", 2.0}}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(history.append(6, 0, {{"", 1.0}}), ErrorCode::invalid_argument);
  EXPECT_EQ(history.records().size(), 1u);
}

Value record(std::int64_t step, std::int64_t epoch, Value metrics) {
  Dict entry;
  entry.insert("step", Value::integer(step));
  entry.insert("epoch", Value::integer(epoch));
  entry.insert("metrics", std::move(metrics));
  return Value::dict(std::move(entry));
}

Value history_of(Value::List records) {
  Dict root;
  root.insert("records", Value::list(std::move(records)));
  return Value::dict(std::move(root));
}

Value metrics(std::initializer_list<std::pair<DictKey, Value>> entries) {
  Dict dict;
  for (const auto& [key, value] : entries) dict.insert(key, value);
  return Value::dict(std::move(dict));
}

TEST(MetricsHistoryState, MalformedRecordsAreRejected) {
  MetricsHistory history;
  history.append(1, 0, {{"loss", 0.5}});
  MetricsHistoryState component(history);
  const Value ok = metrics({{"loss", Value::floating(1.0)}});

  expect_rejected(component, history_of({record(5, 0, ok), record(4, 0, ok)}), ErrorCode::state_value_invalid);
  expect_rejected(component, history_of({record(-1, 0, ok)}), ErrorCode::state_value_invalid);
  expect_rejected(component, history_of({record(1, -3, ok)}), ErrorCode::state_value_invalid);
  expect_rejected(component, history_of({record(1, 0, metrics({{"loss", Value::string("low")}}))}),
                  ErrorCode::state_type_invalid);
  expect_rejected(component, history_of({record(1, 0, metrics({{DictKey(std::int64_t{3}), Value::floating(1.0)}}))}),
                  ErrorCode::state_type_invalid);
  expect_rejected(component, history_of({record(1, 0, Value::list())}), ErrorCode::state_type_invalid);
  expect_rejected(component, history_of({Value::integer(1)}), ErrorCode::state_type_invalid);
  expect_rejected(component, history_of({with_field(record(1, 0, ok), "wall_time", Value::floating(0.0))}),
                  ErrorCode::state_key_unknown);
  expect_rejected(component, history_of({with_field(record(1, 0, ok), "metrics", std::nullopt)}),
                  ErrorCode::state_key_missing);
  expect_rejected(component, with_field(history_of({}), "records", Value::integer(0)), ErrorCode::state_type_invalid);
  ASSERT_EQ(history.records().size(), 1u);
  EXPECT_EQ(history.records()[0].step, 1);
}

}  // namespace
}  // namespace holdpoint
