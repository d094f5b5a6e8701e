// OptimizerState: a LibTorch optimizer (SGD, Adam, AdamW, RMSprop, Adagrad)
// as a checkpoint component, in PyTorch's own `state_dict` layout as torch
// 2.13 writes it:
//
//   {'state': {param index: {...per-parameter tensors and counters...}},
//    'param_groups': [{hyperparameters..., 'params': [param indices]}]}
//
// Parameter indices count across all groups in order, as in Python, so a
// file written here loads with `torch.optim.Adam.load_state_dict` (torch
// 2.13, and 1.13 through SaveOptions::torch_1_13_compatible) and a Python
// state dict of the same optimizer, written by torch 1.13 to 2.13, validates
// here. LibTorch keys its state by TensorImpl (its address as a string up
// to LibTorch 2.1, the pointer since 2.2); those keys never reach a file.
// docs/format.md has the table of torch versions per component.
//
// Layout decisions:
// - Step counts are int64 in LibTorch. They are written as 0-d float32
//   tensors, as torch 2.x writes them (torch 1.13 wrote RMSprop's as an int;
//   both are read). Above 2^24 a float32 step would round (and Python's own
//   would stop counting), so such steps are written as 0-d float64 tensors,
//   which Python accepts and which keep the count exact.
// - Python-only group flags are written with torch 2.13's key order and the
//   value LibTorch implements (maximize, capturable, differentiable False;
//   foreach and fused None; decoupled_weight_decay False for Adam, True for
//   AdamW, which is how torch 2.13 tells them apart). Files from older torch
//   versions lack some of them; a missing flag means Python's default, which
//   is that value. A state asking for anything else is rejected, not
//   silently ignored.
// - Python's SGD writes {'momentum_buffer': None} for parameters stepped
//   without momentum; LibTorch keeps no entry for them. Both mean "no
//   buffer yet", so None is accepted and restored as no entry.
// - Python LR schedulers add 'initial_lr' (OneCycleLR also 'max_lr',
//   'min_lr', and with cycle_momentum 'max_momentum' and 'base_momentum') to
//   each group. LibTorch options have no slot for them, so the
//   component keeps them and writes them back: they round trip. Any other
//   extra group key is rejected.
//
// validate checks the optimizer type implied by the group keys, group and
// parameter counts, the index lists, every key, the type and range of every
// hyperparameter and flag, and every state tensor's dtype and shape against
// its parameter; it changes nothing. apply validates again, builds the new
// options and state in fresh tensors (never views of the file snapshot), and
// only then installs them, so a rejected apply changes nothing either.
// Parameters without an entry in the state get no LibTorch state (as if never
// stepped); the optimizer's defaults are left as constructed, as in Python.
//
// Failure contract: Error(invalid_argument) from the constructor for any other
// optimizer type; state_* codes from validate and apply (see component.h).
// Thread-safety: as for the optimizer; one thread at a time.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/state/component.h"
#include "holdpoint/format/value.h"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace holdpoint {

// The group keys Python's LR schedulers add, per parameter group.
struct SchedulerGroupKeys {
  std::optional<double> initial_lr = std::nullopt;
  std::optional<double> max_lr = std::nullopt;
  std::optional<double> min_lr = std::nullopt;
  std::optional<double> max_momentum = std::nullopt;   // OneCycleLR with cycle_momentum
  std::optional<double> base_momentum = std::nullopt;  // OneCycleLR with cycle_momentum

  bool operator==(const SchedulerGroupKeys&) const = default;
};

class OptimizerState final : public Component {
 public:
  // `optimizer` must outlive the component.
  OptimizerState(std::string name, torch::optim::Optimizer& optimizer);

  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;
  // Builds the new state without touching the live optimizer; the returned
  // step swaps it in. State tensors are copies, except that a tensor of a
  // snapshot the load handed over (Storage::handed_over), which nothing
  // else holds, becomes the live state itself (CPU parameters with the same
  // dtype and layout): a resume then reads each byte of the optimizer's
  // state once.
  std::function<void()> stage(const Value& state) override;

  // One entry per parameter group (groups added later have none until set).
  const std::vector<SchedulerGroupKeys>& scheduler_group_keys() const noexcept { return scheduler_keys_; }
  // For C++ schedulers that record initial_lr as Python's do. Throws
  // Error(invalid_argument) unless there is one entry per group and every
  // value is finite and >= 0.
  void set_scheduler_group_keys(std::vector<SchedulerGroupKeys> keys);

 private:
  std::string name_;
  torch::optim::Optimizer* optimizer_;
  std::vector<SchedulerGroupKeys> scheduler_keys_;
};

// The load-bearing configuration of `optimizer` for configuration identity:
//   {"type": "Adam", "defaults": {hyperparameters},
//    "groups": [{hyperparameters except lr, "param_count": n}],
//    "initial_lrs": [lr of each group]}
// No tensors and no state. Group lrs are read as the initial lrs, so call it on
// the optimizer as constructed, before a step or a scheduler changes them.
// Throws Error(invalid_argument) for an optimizer type OptimizerState refuses.
Value optimizer_config(const torch::optim::Optimizer& optimizer);

}  // namespace holdpoint
