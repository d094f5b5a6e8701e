// GradScaler: dynamic loss scaling with torch.cuda.amp.GradScaler's semantics
// (PyTorch 1.13), usable on the CPU, as a checkpoint component.
//
// One iteration: scale(loss).backward(); optionally unscale(optimizer) (to
// clip); step(optimizer); update(). unscale multiplies every gradient by
// float32(1 / double(scale)) once per iteration and records whether any
// gradient held an inf or NaN; step skips optimizer.step() when one did and
// counts the skipped step; update applies the rule of 1.13's
// _amp_update_scale_ kernel (the CPU has no kernel in 1.13, so it is
// emulated here, in the kernel's float32 / double arithmetic):
//   inf or NaN found:  scale = float32(scale * backoff_factor); tracker = 0
//   otherwise:         tracker += 1; when tracker == growth_interval:
//                      scale = float32(scale * growth_factor) unless that is
//                      inf; tracker = 0
// The scale is a float32 value, as Python's scale tensor is; scale(loss)
// returns loss * that 1-element float32 tensor, like Python (so a 0-d loss
// becomes a 1-element tensor). A disabled scaler returns the loss unchanged,
// steps unconditionally and has the empty state {}.
//
// State (Python's state_dict layout): {"scale", "growth_factor",
// "backoff_factor", "growth_interval", "_growth_tracker"} when enabled, {}
// when disabled, plus holdpoint's own "skipped_steps". Python's
// GradScaler.load_state_dict reads only its five keys, so it accepts this
// state; validate accepts a Python state without skipped_steps, and apply then
// restarts the count at 0 (the file does not know it). growth_factor,
// backoff_factor and growth_interval are load-bearing configuration here
// (Python's load_state_dict overwrites them; holdpoint rejects a file whose
// values differ, state_value_invalid). validate also requires a finite scale
// > 0 that stays finite in float32, 0 <= _growth_tracker < growth_interval
// and skipped_steps >= 0; a disabled scaler accepts only {} and an enabled one
// rejects {} (state_key_missing), as Python's load_state_dict does. apply
// also forgets the current iteration (unscaled / stepped optimizers).
// Before scale() is first called, Python's state holds init_scale as given;
// holdpoint's holds it rounded to float32, as Python's does afterwards.
//
// Failure contract: the constructor throws invalid_argument for
// growth_factor <= 1, backoff_factor outside (0, 1), growth_interval outside
// [1, 2^31 - 1] or an init_scale that is not a finite positive float32;
// unscale throws invalid_argument for float16 gradients (as Python does
// without allow_fp16); unscale, step and update throw call_order_invalid
// where Python raises: unscale twice or after step in one iteration, step
// twice, step when no parameter has a gradient, update with no step or
// unscale since the last update. A step that fails for want of gradients
// forgets that optimizer's iteration (Python's stays marked unscaled, so
// every later unscale or step fails too).
//
// Thread-safety: one thread at a time; optimizers are identified by address
// until the next update().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <unordered_map>

#include "holdpoint/state/component.h"
#include "holdpoint/format/value.h"

namespace torch::optim {
class Optimizer;
}

namespace holdpoint {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler final : public Component {
 public:
  explicit GradScaler(GradScalerOptions options = {}, std::string name = "scaler");

  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;

  at::Tensor scale(const at::Tensor& loss) const;
  void unscale(torch::optim::Optimizer& optimizer);
  // Returns whether optimizer.step() ran.
  bool step(torch::optim::Optimizer& optimizer);
  void update();

  // The current scale (1.0 when disabled, as Python's get_scale).
  double get_scale() const noexcept { return options_.enabled ? scale_ : 1.0; }
  std::int64_t growth_tracker() const noexcept { return growth_tracker_; }
  std::int64_t skipped_steps() const noexcept { return skipped_steps_; }
  bool is_enabled() const noexcept { return options_.enabled; }

  // Configuration identity: {"type": "GradScaler", "enabled", "init_scale",
  // "growth_factor", "backoff_factor", "growth_interval"}.
  Value config() const;

 private:
  enum class Stage : std::uint8_t { ready, unscaled, stepped };
  struct Iteration {
    Stage stage = Stage::ready;
    bool found_inf = false;
    // Python records an inf check only for optimizers with gradients.
    bool checked = false;
  };

  GradScalerOptions options_;
  std::string name_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t skipped_steps_ = 0;
  std::unordered_map<const torch::optim::Optimizer*, Iteration> iterations_;
};

}  // namespace holdpoint
