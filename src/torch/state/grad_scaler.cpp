#include "holdpoint/state/grad_scaler.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "state/state_fields.h"

namespace holdpoint {

namespace {

using state::FieldReader;
using state::repr;
using state::state_error;

constexpr std::int64_t kMaxGrowthInterval = std::numeric_limits<std::int32_t>::max();  // the kernel's int

const char* const kStateKeys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};
constexpr const char* kSkippedStepsKey = "skipped_steps";

// A positive double that is still finite after rounding to float32.
bool is_float32_scale(double value) {
  return std::isfinite(value) && value > 0 && std::isfinite(static_cast<float>(value)) && static_cast<float>(value) > 0;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options, std::string name)
    : options_(options), name_(std::move(name)), scale_(static_cast<float>(options.init_scale)) {
  if (!options_.enabled) return;
  if (!(options_.growth_factor > 1.0) || !std::isfinite(options_.growth_factor)) {
    detail::fail(ErrorCode::invalid_argument, "GradScaler growth_factor must be > 1, got ",
                 repr(options_.growth_factor));
  }
  if (!(options_.backoff_factor > 0.0 && options_.backoff_factor < 1.0)) {
    detail::fail(ErrorCode::invalid_argument, "GradScaler backoff_factor must be in (0, 1), got ",
                 repr(options_.backoff_factor));
  }
  if (options_.growth_interval < 1 || options_.growth_interval > kMaxGrowthInterval) {
    detail::fail(ErrorCode::invalid_argument, "GradScaler growth_interval must be in [1, ", kMaxGrowthInterval,
                 "], got ", options_.growth_interval);
  }
  if (!is_float32_scale(options_.init_scale)) {
    detail::fail(ErrorCode::invalid_argument, "GradScaler init_scale must be a finite positive float32, got ",
                 repr(options_.init_scale));
  }
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss.mul(at::full({1}, scale_, at::TensorOptions().dtype(at::kFloat).device(loss.device())));
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  Iteration& iteration = iterations_[&optimizer];
  if (iteration.stage == Stage::unscaled) {
    detail::fail(ErrorCode::call_order_invalid, name_,
                 ": unscale() was already called on this optimizer since the last update()");
  }
  if (iteration.stage == Stage::stepped) {
    detail::fail(ErrorCode::call_order_invalid, name_, ": unscale() called after step() in the same iteration");
  }
  // Python: self._scale.double().reciprocal().float(), then each element times
  // that float32 in the gradient's own precision (float32 grads in float32).
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  at::NoGradGuard no_grad;
  // Python checks every gradient's dtype before it unscales any of them.
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (grad.defined() && grad.scalar_type() == at::kHalf) {
        detail::fail(ErrorCode::invalid_argument, name_, ": attempting to unscale float16 gradients");
      }
    }
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      at::Tensor values = grad.is_sparse() ? grad._values() : grad;
      if (!at::isfinite(values).all().item<bool>()) iteration.found_inf = true;
      values.mul_(inv_scale);
      iteration.checked = true;
    }
  }
  iteration.stage = Stage::unscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (iterations_[&optimizer].stage == Stage::stepped) {
    detail::fail(ErrorCode::call_order_invalid, name_, ": step() was already called since the last update()");
  }
  if (iterations_[&optimizer].stage == Stage::ready) unscale(optimizer);
  Iteration& iteration = iterations_[&optimizer];
  if (!iteration.checked) {
    // Python leaves the optimizer marked unscaled here, so that every later
    // unscale or step fails too; holdpoint forgets the optimizer's iteration.
    iterations_.erase(&optimizer);
    detail::fail(ErrorCode::call_order_invalid, name_,
                 ": no inf checks were recorded for this optimizer (no parameter has a gradient)");
  }
  iteration.stage = Stage::stepped;
  if (iteration.found_inf) {
    ++skipped_steps_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool checked = false;
  bool found_inf = false;
  for (const auto& [optimizer, iteration] : iterations_) {
    checked = checked || iteration.checked;
    found_inf = found_inf || iteration.found_inf;
  }
  if (!checked) {
    detail::fail(ErrorCode::call_order_invalid, name_, ": no inf checks were recorded prior to update()");
  }
  // 1.13's _amp_update_scale_ kernel: a float32 scale times a double factor,
  // stored back into float32.
  if (found_inf) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 == options_.growth_interval) {
    const float grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_ = grown;  // never grow past float32's range
    growth_tracker_ = 0;
  } else {
    growth_tracker_ += 1;
  }
  iterations_.clear();
}

Value GradScaler::capture(CaptureMode) const {
  Dict state;
  if (!options_.enabled) return Value::dict(std::move(state));
  state.insert("scale", Value::floating(scale_));
  state.insert("growth_factor", Value::floating(options_.growth_factor));
  state.insert("backoff_factor", Value::floating(options_.backoff_factor));
  state.insert("growth_interval", Value::integer(options_.growth_interval));
  state.insert("_growth_tracker", Value::integer(growth_tracker_));
  state.insert(kSkippedStepsKey, Value::integer(skipped_steps_));
  return Value::dict(std::move(state));
}

void GradScaler::validate(const Value& state) const {
  const FieldReader reader(state, name_);
  if (!options_.enabled) {
    if (!reader.dict().empty()) {
      state_error(ErrorCode::state_key_unknown, name_, " is disabled and holds no state, but the file has key ",
                  reader.dict().at_index(0).first.to_string());
    }
    return;
  }
  for (const char* key : kStateKeys) reader.required(key);
  for (const auto& [key, value] : reader.dict()) {
    const bool known = key.is_string() &&
                       (key.as_string() == kSkippedStepsKey || std::find(std::begin(kStateKeys), std::end(kStateKeys),
                                                                         key.as_string()) != std::end(kStateKeys));
    if (!known) state_error(ErrorCode::state_key_unknown, name_, " has an unexpected key ", key.to_string());
  }

  const double scale = reader.number("scale");
  if (!is_float32_scale(scale)) {
    state_error(ErrorCode::state_value_invalid, reader.path_of("scale"), " = ", repr(scale),
                " is not a finite positive float32");
  }
  const auto expect_same = [&](const char* key, double found, double live) {
    if (!(found == live)) {
      state_error(ErrorCode::state_value_invalid, reader.path_of(key), " is ", repr(found), ", this scaler's is ",
                  repr(live), " (load-bearing configuration)");
    }
  };
  expect_same("growth_factor", reader.number("growth_factor"), options_.growth_factor);
  expect_same("backoff_factor", reader.number("backoff_factor"), options_.backoff_factor);
  const std::int64_t interval = reader.integer("growth_interval");
  if (interval != options_.growth_interval) {
    state_error(ErrorCode::state_value_invalid, reader.path_of("growth_interval"), " is ", interval,
                ", this scaler's is ", options_.growth_interval, " (load-bearing configuration)");
  }
  const std::int64_t tracker = reader.integer("_growth_tracker");
  if (tracker < 0 || tracker >= options_.growth_interval) {
    state_error(ErrorCode::state_value_invalid, reader.path_of("_growth_tracker"), " = ", tracker,
                " is outside [0, growth_interval ", options_.growth_interval, ")");
  }
  if (reader.has(kSkippedStepsKey)) {
    const std::int64_t skipped = reader.integer(kSkippedStepsKey);
    if (skipped < 0)
      state_error(ErrorCode::state_value_invalid, reader.path_of(kSkippedStepsKey), " = ", skipped, " is negative");
  }
}

void GradScaler::apply(const Value& state) {
  iterations_.clear();
  if (!options_.enabled) return;
  const FieldReader reader(state, name_);
  scale_ = static_cast<float>(reader.number("scale"));
  growth_tracker_ = reader.integer("_growth_tracker");
  skipped_steps_ = reader.has(kSkippedStepsKey) ? reader.integer(kSkippedStepsKey) : 0;
}

Value GradScaler::config() const {
  Dict config;
  config.insert("type", Value::string("GradScaler"));
  config.insert("enabled", Value::boolean(options_.enabled));
  if (options_.enabled) {
    config.insert("init_scale", Value::floating(options_.init_scale));
    config.insert("growth_factor", Value::floating(options_.growth_factor));
    config.insert("backoff_factor", Value::floating(options_.backoff_factor));
    config.insert("growth_interval", Value::integer(options_.growth_interval));
  }
  return Value::dict(std::move(config));
}

}  // namespace holdpoint
