// Learning-rate schedulers with PyTorch's semantics and state_dict layout
// (torch 2.13's; states written by torch 1.13 are read too).
//
// LibTorch's C++ LRScheduler keeps no state, so a resumed C++ run cannot
// continue a schedule. These schedulers compute exactly what
// torch.optim.lr_scheduler computes in step() (the chainable get_lr formulas,
// in the same operation order, so the learning rates match Python's bit for
// bit in double precision) and capture exactly the keys and values of Python's
// state_dict(), with these documented differences:
//   - MultiStepLR.milestones is written as a plain dict {milestone: count}:
//     Python's is a collections.Counter, which torch 1.13's weights_only load
//     cannot build (Python's load_state_dict accepts the dict; `in` and []
//     behave the same on it). A Counter in a file reads as that dict;
//   - _is_initial and _get_lr_called_within_step are always written as
//     False: holdpoint never captures inside step(). torch 1.13's 'verbose'
//     is read (and must be a bool) but not written;
//   - OneCycleLR writes '_anneal_func_type' ('cos' | 'linear') as torch 2.13
//     does; torch 1.13 pickled the function itself (anneal_func), which cannot
//     be loaded safely, and holdpoint's files from then, which wrote
//     'anneal_strategy', still load.
// Numbers that Python keeps as ints are written as ints; floats as floats
// (0-d float64 tensors under SaveOptions::torch_1_13_compatible, which
// validate accepts too).
//
// Construction follows PyTorch with last_epoch = -1: base_lrs are the groups'
// current lrs (OneCycleLR: max_lr / div_factor) and the constructor performs
// the first step, so last_epoch() == 0 and get_last_lr() holds the lrs of
// step 0. step() takes no epoch argument (Python's closed forms, used only
// with one, are not implemented). LibTorch's param groups have no
// 'initial_lr', 'max_lr', ... entries, so base_lrs live in the scheduler and
// OneCycleLR keeps its per-group bounds itself.
//
// As a Component: validate requires the exact key set (state_key_missing /
// state_key_unknown), the right types (state_type_invalid), static parameters
// equal to this scheduler's (step_size, gamma, milestones, T_max, ... are
// load-bearing configuration: state_value_invalid), one base_lr and one
// _last_lr per optimizer group (state_structure_mismatch), last_epoch >= -1
// and _step_count >= 0 (state_value_invalid). apply restores last_epoch,
// _step_count, base_lrs and _last_lr and sets every group's lr to _last_lr, so
// optimizer and scheduler agree. In a full restore (model, scheduler,
// optimizer, ...) the optimizer component is applied after the scheduler and
// its param_groups carry the same lrs; if they differed, the optimizer's would
// win, as in PyTorch, where load_state_dict never touches the optimizer.
//
// Failure contract: constructors throw Error(invalid_argument) for options
// PyTorch rejects or that cannot work (step_size < 1, empty max_lr, ...);
// step() throws Error(call_order_invalid) where Python's step raises
// (OneCycleLR past total_steps, a zero-length phase) and then changes nothing.
//
// Thread-safety: as for the optimizer the scheduler is bound to: one thread at
// a time. The optimizer must outlive the scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/state/component.h"
#include "holdpoint/format/value.h"

namespace torch::optim {
class Optimizer;
}

namespace holdpoint {

class LRScheduler : public Component {
 public:
  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

  // Python's step() without an epoch: last_epoch += 1, then every group's lr
  // becomes the scheduler's new value.
  void step();
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }

  // Configuration identity: {"type": <Python class name>, <static parameters>},
  // the load-bearing scheduler fields of a TrainingConfig.
  virtual Value config() const = 0;

 protected:
  LRScheduler(torch::optim::Optimizer& optimizer, std::string name);

  // The last statement of every concrete constructor (the first step needs the
  // concrete get_lr). `leading` and `trailing` are the class's own state
  // entries, written before and after the common ones as Python's __dict__
  // orders them; they never change, and validate requires a state to hold the
  // same values.
  void initial_step(std::vector<double> base_lrs, Dict leading, Dict trailing = {});

  // The chainable formula of 1.13's get_lr for the current last_epoch.
  virtual std::vector<double> get_lr() = 0;

  torch::optim::Optimizer& optimizer() const noexcept { return optimizer_; }
  std::size_t group_count() const;
  std::vector<double> group_lrs() const;
  std::int64_t step_count() const noexcept { return step_count_; }

 private:
  torch::optim::Optimizer& optimizer_;
  std::string name_;
  Dict leading_;
  Dict trailing_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  std::int64_t last_epoch_ = -1;
  std::int64_t step_count_ = 0;
};

struct StepLROptions {
  std::int64_t step_size = 0;  // required, >= 1
  double gamma = 0.1;
};

class StepLR final : public LRScheduler {
 public:
  StepLR(torch::optim::Optimizer& optimizer, StepLROptions options, std::string name = "scheduler");
  Value config() const override;

 protected:
  std::vector<double> get_lr() override;

 private:
  StepLROptions options_;
};

struct MultiStepLROptions {
  // Counted like Python's Counter(milestones): a milestone given twice
  // multiplies by gamma twice.
  std::vector<std::int64_t> milestones;
  double gamma = 0.1;
};

class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(torch::optim::Optimizer& optimizer, MultiStepLROptions options, std::string name = "scheduler");
  Value config() const override;

 protected:
  std::vector<double> get_lr() override;

 private:
  MultiStepLROptions options_;
  Dict counts_;  // milestone -> count, in first-occurrence order (the Counter's)
};

struct ExponentialLROptions {
  double gamma = 0.0;  // required
};

class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(torch::optim::Optimizer& optimizer, ExponentialLROptions options, std::string name = "scheduler");
  Value config() const override;

 protected:
  std::vector<double> get_lr() override;

 private:
  ExponentialLROptions options_;
};

struct CosineAnnealingLROptions {
  std::int64_t t_max = 0;  // Python's T_max; required, >= 1
  double eta_min = 0.0;
};

class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, CosineAnnealingLROptions options,
                    std::string name = "scheduler");
  Value config() const override;

 protected:
  std::vector<double> get_lr() override;

 private:
  CosineAnnealingLROptions options_;
};

struct LinearLROptions {
  double start_factor = 1.0 / 3;  // in (0, 1]
  double end_factor = 1.0;        // in [0, 1]
  std::int64_t total_iters = 5;   // >= 1
};

class LinearLR final : public LRScheduler {
 public:
  LinearLR(torch::optim::Optimizer& optimizer, LinearLROptions options = {}, std::string name = "scheduler");
  Value config() const override;

 protected:
  std::vector<double> get_lr() override;

 private:
  LinearLROptions options_;
};

enum class AnnealStrategy : std::uint8_t { cos, linear };

struct OneCycleLROptions {
  // Per-group values: one for every group, or one per group.
  std::vector<double> max_lr;
  // total_steps if > 0, else epochs * steps_per_epoch.
  std::int64_t total_steps = 0;
  std::int64_t epochs = 0;
  std::int64_t steps_per_epoch = 0;
  double pct_start = 0.3;
  AnnealStrategy anneal_strategy = AnnealStrategy::cos;
  // Cycles SGD's and RMSprop's momentum, or Adam's and AdamW's beta1, inversely
  // to the lr, as Python does; other optimizers are rejected (invalid_argument).
  bool cycle_momentum = true;
  std::vector<double> base_momentum = {0.85};
  std::vector<double> max_momentum = {0.95};
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

// validate also requires last_epoch <= total_steps (Python cannot step past
// it); apply also sets the groups' momentum (or beta1) to the value of step
// last_epoch when momentum is cycled.
class OneCycleLR final : public LRScheduler {
 public:
  OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options, std::string name = "scheduler");
  Value config() const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

 protected:
  std::vector<double> get_lr() override;

 private:
  struct Phase {
    double end_step;
    // Indexes into bounds_: 0 initial_lr, 1 max_lr, 2 min_lr.
    int start_lr;
    int end_lr;
    // 0 max_momentum, 1 base_momentum.
    int start_momentum;
    int end_momentum;
  };
  struct Position {
    std::size_t phase;
    double pct;
  };
  // Where step `step_num` falls; nullopt where Python's get_lr raises (past
  // total_steps, or in a phase of length 0).
  std::optional<Position> find_position(std::int64_t step_num) const;
  double anneal(double start, double end, double pct) const;
  double momentum_at(std::size_t group, const Position& position) const;
  void set_momentum(std::size_t group, double momentum);

  OneCycleLROptions options_;
  std::int64_t total_steps_ = 0;
  bool use_beta1_ = false;
  std::vector<Phase> phases_;
  std::vector<double> max_lrs_;
  std::vector<double> initial_lrs_;
  std::vector<double> min_lrs_;
  std::vector<double> max_momentums_;
  std::vector<double> base_momentums_;
};

// lr = base_lr * lr_lambda(last_epoch), one function per group (or one for
// all). Functions are code, not state: `identity` names them in config() so
// that a changed schedule shows up as configuration drift, and the state holds
// lr_lambdas as a list of None, as Python writes it for plain functions.
class LambdaLR final : public LRScheduler {
 public:
  using LrLambda = std::function<double(std::int64_t epoch)>;

  LambdaLR(torch::optim::Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, std::string identity,
           std::string name = "scheduler");
  Value config() const override;

 protected:
  std::vector<double> get_lr() override;

 private:
  std::vector<LrLambda> lr_lambdas_;
  std::string identity_;
};

enum class PlateauMode : std::uint8_t { min, max };
enum class ThresholdMode : std::uint8_t { rel, abs };

struct ReduceLROnPlateauOptions {
  PlateauMode mode = PlateauMode::min;
  double factor = 0.1;  // < 1
  std::int64_t patience = 10;
  double threshold = 1e-4;
  ThresholdMode threshold_mode = ThresholdMode::rel;
  std::int64_t cooldown = 0;
  std::vector<double> min_lr = {0.0};  // one for every group, or one per group
  double eps = 1e-8;
};

// ReduceLROnPlateau is not an LRScheduler in PyTorch and has its own state:
// all of its __dict__ but the optimizer, in torch 2.13's order (factor,
// default_min_lr, min_lrs, patience, cooldown, eps, last_epoch, _last_lr,
// mode_worse, mode, threshold, threshold_mode, best, cooldown_counter,
// num_bad_epochs). best and mode_worse may be +-inf. validate also accepts
// torch 1.13's layout ('verbose', no 'default_min_lr', _last_lr only once it
// has stepped); it requires the static fields to equal this scheduler's,
// 0 <= cooldown_counter <= cooldown, 0 <= num_bad_epochs <= patience, a best
// that is not NaN, last_epoch >= 0, and _last_lr whenever last_epoch > 0;
// apply sets the groups' lrs to _last_lr when it is present.
class ReduceLROnPlateau final : public Component {
 public:
  ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options = {},
                    std::string name = "scheduler");

  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

  // Python's step(metrics) without an epoch.
  void step(double metric);
  // The groups' lrs at construction until the first step, as in torch 2.13.
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  double best() const noexcept { return best_; }
  std::int64_t num_bad_epochs() const noexcept { return num_bad_epochs_; }
  std::int64_t cooldown_counter() const noexcept { return cooldown_counter_; }

  Value config() const;

 private:
  bool is_better(double a, double best) const;
  void reduce_lr();
  double mode_worse() const;
  Dict static_entries() const;

  torch::optim::Optimizer& optimizer_;
  ReduceLROnPlateauOptions options_;
  std::string name_;
  std::vector<double> min_lrs_;
  std::int64_t cooldown_counter_ = 0;
  double best_ = 0.0;
  std::int64_t num_bad_epochs_ = 0;
  std::int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace holdpoint
