#include "holdpoint/state/progress.h"

#include <cmath>
#include <limits>

#include "state/state_fields.h"

namespace holdpoint {

namespace {

const std::string kProgressName = "progress";
const std::string kEarlyStoppingName = "early_stop";
const std::string kHistoryName = "history";

std::int64_t counter(const state::FieldReader& reader, std::string_view key) {
  const std::int64_t value = reader.integer(key);
  if (value < 0) state::state_error(ErrorCode::state_value_invalid, reader.path_of(key), " = ", value, " is negative");
  return value;
}

// Validation and apply share one reader, so apply installs exactly what
// validate accepted.
Progress read_progress(const Value& state) {
  const state::FieldReader reader(state, kProgressName);
  reader.allow_only({"global_step", "epoch", "batch_in_epoch", "samples_seen"});
  return Progress{counter(reader, "global_step"), counter(reader, "epoch"), counter(reader, "batch_in_epoch"),
                  counter(reader, "samples_seen")};
}

const char* mode_name(EarlyStoppingMode mode) { return mode == EarlyStoppingMode::min ? "min" : "max"; }

struct EarlyStoppingProgress {
  double best;
  std::int64_t bad_epochs;
  bool stopped;
};

EarlyStoppingProgress read_early_stopping(const Value& state, const EarlyStopping& live) {
  const state::FieldReader reader(state, kEarlyStoppingName);
  reader.allow_only({"mode", "patience", "min_delta", "best", "bad_epochs", "stopped"});
  const std::string& mode = reader.string("mode");
  if (mode != mode_name(live.mode())) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("mode"), " is '", mode, "', the live one '",
                       mode_name(live.mode()), "'");
  }
  const std::int64_t patience = reader.integer("patience");
  if (patience != live.patience()) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("patience"), " is ", patience,
                       ", the live one ", live.patience());
  }
  const double min_delta = reader.number("min_delta");
  if (min_delta != live.min_delta()) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("min_delta"), " is ", min_delta,
                       ", the live one ", live.min_delta());
  }
  const double best = reader.number("best");
  if (std::isnan(best)) state::state_error(ErrorCode::state_value_invalid, reader.path_of("best"), " is NaN");
  const std::int64_t bad_epochs = counter(reader, "bad_epochs");
  // Updates stop counting once stopped, which happens when a bad epoch
  // reaches the patience.
  const std::int64_t most = std::max<std::int64_t>(patience, 1);
  if (bad_epochs > most) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("bad_epochs"), " = ", bad_epochs,
                       " exceeds the patience ", most);
  }
  const bool stopped = reader.boolean("stopped");
  if (stopped != (bad_epochs > 0 && bad_epochs >= patience)) {
    state::state_error(ErrorCode::state_value_invalid, reader.path_of("stopped"), " = ", stopped ? "True" : "False",
                       " contradicts bad_epochs = ", bad_epochs, " with patience ", patience);
  }
  return {best, bad_epochs, stopped};
}

std::vector<MetricsRecord> read_history(const Value& state) {
  const state::FieldReader reader(state, kHistoryName);
  reader.allow_only({"records"});
  const Value::List& items = reader.sequence("records");
  std::vector<MetricsRecord> records;
  records.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const state::FieldReader item(items[i], reader.path_of("records") + "[" + std::to_string(i) + "]");
    item.allow_only({"step", "epoch", "metrics"});
    MetricsRecord record;
    record.step = counter(item, "step");
    record.epoch = counter(item, "epoch");
    if (!records.empty() && record.step < records.back().step) {
      state::state_error(ErrorCode::state_value_invalid, item.path_of("step"), " = ", record.step,
                         " is below the previous record's ", records.back().step);
    }
    const state::FieldReader metrics = item.child("metrics");
    for (const auto& [key, value] : metrics.dict()) {
      if (!key.is_string() || key.as_string().empty()) {
        state::state_error(ErrorCode::state_type_invalid, metrics.path(), " has the key ", key.to_string(),
                           ", not a metric name");
      }
      record.metrics.emplace_back(key.as_string(), state::number_of(value, metrics.path_of(key.as_string())));
    }
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace

// ---- progress ---------------------------------------------------------------------------

const std::string& ProgressState::name() const { return kProgressName; }

Value ProgressState::capture(CaptureMode) const {
  Dict entries;
  entries.insert("global_step", Value::integer(progress_.global_step));
  entries.insert("epoch", Value::integer(progress_.epoch));
  entries.insert("batch_in_epoch", Value::integer(progress_.batch_in_epoch));
  entries.insert("samples_seen", Value::integer(progress_.samples_seen));
  return Value::dict(std::move(entries));
}

void ProgressState::validate(const Value& state) const { read_progress(state); }
void ProgressState::apply(const Value& state) { progress_ = read_progress(state); }

// ---- early stopping ---------------------------------------------------------------------

EarlyStopping::EarlyStopping(EarlyStoppingMode mode, std::int64_t patience, double min_delta)
    : mode_(mode),
      patience_(patience),
      min_delta_(min_delta),
      best_(mode == EarlyStoppingMode::min ? std::numeric_limits<double>::infinity()
                                           : -std::numeric_limits<double>::infinity()) {
  if (patience < 0) state::state_error(ErrorCode::invalid_argument, "early_stop: patience ", patience, " is negative");
  if (!std::isfinite(min_delta) || min_delta < 0) {
    state::state_error(ErrorCode::invalid_argument, "early_stop: min_delta ", min_delta, " is not a finite value >= 0");
  }
}

bool EarlyStopping::update(double metric) {
  if (stopped_) return true;
  const bool improved = mode_ == EarlyStoppingMode::min ? metric < best_ - min_delta_ : metric > best_ + min_delta_;
  if (improved) {
    best_ = metric;
    bad_epochs_ = 0;
  } else if (++bad_epochs_ >= patience_) {
    stopped_ = true;
  }
  return stopped_;
}

const std::string& EarlyStoppingState::name() const { return kEarlyStoppingName; }

Value EarlyStoppingState::capture(CaptureMode) const {
  const EarlyStopping& live = early_stopping_;
  Dict entries;
  entries.insert("mode", Value::string(mode_name(live.mode())));
  entries.insert("patience", Value::integer(live.patience()));
  entries.insert("min_delta", Value::floating(live.min_delta()));
  entries.insert("best", Value::floating(live.best()));
  entries.insert("bad_epochs", Value::integer(live.bad_epochs()));
  entries.insert("stopped", Value::boolean(live.stopped()));
  return Value::dict(std::move(entries));
}

void EarlyStoppingState::validate(const Value& state) const { read_early_stopping(state, early_stopping_); }

void EarlyStoppingState::apply(const Value& state) {
  const EarlyStoppingProgress progress = read_early_stopping(state, early_stopping_);
  early_stopping_.best_ = progress.best;
  early_stopping_.bad_epochs_ = progress.bad_epochs;
  early_stopping_.stopped_ = progress.stopped;
}

// ---- metrics history --------------------------------------------------------------------

void MetricsHistory::append(std::int64_t step, std::int64_t epoch, std::vector<std::pair<std::string, double>> metrics) {
  if (step < 0 || epoch < 0) {
    state::state_error(ErrorCode::invalid_argument, "history: step ", step, " or epoch ", epoch, " is negative");
  }
  if (!records_.empty() && step < records_.back().step) {
    state::state_error(ErrorCode::invalid_argument, "history: step ", step, " is below the last record's ",
                       records_.back().step);
  }
  for (std::size_t i = 0; i < metrics.size(); ++i) {
    if (metrics[i].first.empty()) state::state_error(ErrorCode::invalid_argument, "history: a metric name is empty");
    for (std::size_t j = 0; j < i; ++j) {
      if (metrics[j].first == metrics[i].first) {
        state::state_error(ErrorCode::invalid_argument, "history: metric '", metrics[i].first, "' is logged twice");
      }
    }
  }
  records_.push_back(MetricsRecord{step, epoch, std::move(metrics)});
}

const std::string& MetricsHistoryState::name() const { return kHistoryName; }

Value MetricsHistoryState::capture(CaptureMode) const {
  Value::List records;
  records.reserve(history_.records().size());
  for (const MetricsRecord& record : history_.records()) {
    Dict metrics;
    for (const auto& [name, value] : record.metrics) metrics.insert(name, Value::floating(value));
    Dict entry;
    entry.insert("step", Value::integer(record.step));
    entry.insert("epoch", Value::integer(record.epoch));
    entry.insert("metrics", Value::dict(std::move(metrics)));
    records.push_back(Value::dict(std::move(entry)));
  }
  Dict entries;
  entries.insert("records", Value::list(std::move(records)));
  return Value::dict(std::move(entries));
}

void MetricsHistoryState::validate(const Value& state) const { read_history(state); }
void MetricsHistoryState::apply(const Value& state) { history_.records_ = read_history(state); }

}  // namespace holdpoint
