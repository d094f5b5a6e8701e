// Training progress, early stopping and the metrics history: the counters and
// records a resumed run needs to carry on where it stopped, each as a
// checkpoint component.
//
//   ProgressState        "progress"    {"global_step", "epoch", "batch_in_epoch", "samples_seen"}
//   EarlyStoppingState   "early_stop"  {"mode", "patience", "min_delta", "best", "bad_epochs", "stopped"}
//   MetricsHistoryState  "history"     {"records": [{"step", "epoch", "metrics": {name: float}}]}
//
// Validation is strict: unknown or missing keys (state_key_unknown /
// state_key_missing), wrong types (state_type_invalid), negative counters and
// inconsistent values (state_value_invalid). The early-stopping configuration
// (mode, patience, min_delta) must equal the live object's.
//
// Thread-safety: used from one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "holdpoint/state/component.h"

namespace holdpoint {

struct Progress {
  std::int64_t global_step = 0;     // optimizer updates
  std::int64_t epoch = 0;
  std::int64_t batch_in_epoch = 0;  // batches consumed in the current epoch
  std::int64_t samples_seen = 0;
};

class ProgressState final : public Component {
 public:
  explicit ProgressState(Progress& progress) : progress_(progress) {}

  const std::string& name() const override;
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

 private:
  Progress& progress_;
};

enum class EarlyStoppingMode : std::uint8_t { min, max };

// Stops after `patience` consecutive updates that do not improve on the best
// metric by more than min_delta (PyTorch Lightning's rule). NaN never improves.
class EarlyStopping {
 public:
  // Throws Error(invalid_argument) for a negative patience or a negative or
  // non-finite min_delta.
  EarlyStopping(EarlyStoppingMode mode, std::int64_t patience, double min_delta = 0.0);

  // Records one evaluation and returns stopped(). Once stopped, further
  // updates change nothing.
  bool update(double metric);

  EarlyStoppingMode mode() const noexcept { return mode_; }
  std::int64_t patience() const noexcept { return patience_; }
  double min_delta() const noexcept { return min_delta_; }
  // +inf (min) or -inf (max) before the first update.
  double best() const noexcept { return best_; }
  std::int64_t bad_epochs() const noexcept { return bad_epochs_; }
  bool stopped() const noexcept { return stopped_; }

 private:
  friend class EarlyStoppingState;

  EarlyStoppingMode mode_;
  std::int64_t patience_;
  double min_delta_;
  double best_;
  std::int64_t bad_epochs_ = 0;
  bool stopped_ = false;
};

class EarlyStoppingState final : public Component {
 public:
  explicit EarlyStoppingState(EarlyStopping& early_stopping) : early_stopping_(early_stopping) {}

  const std::string& name() const override;
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

 private:
  EarlyStopping& early_stopping_;
};

struct MetricsRecord {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::vector<std::pair<std::string, double>> metrics;  // in the order logged
};

// Records in order of non-decreasing step.
class MetricsHistory {
 public:
  // Throws Error(invalid_argument) for a negative step or epoch, a step below
  // the last record's, or an empty or repeated metric name.
  void append(std::int64_t step, std::int64_t epoch, std::vector<std::pair<std::string, double>> metrics);

  const std::vector<MetricsRecord>& records() const noexcept { return records_; }

 private:
  friend class MetricsHistoryState;

  std::vector<MetricsRecord> records_;
};

class MetricsHistoryState final : public Component {
 public:
  explicit MetricsHistoryState(MetricsHistory& history) : history_(history) {}

  const std::string& name() const override;
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

 private:
  MetricsHistory& history_;
};

}  // namespace holdpoint
