// Learning-rate schedulers: torch/optim/lr_scheduler.py of PyTorch 1.13,
// formula for formula. Each get_lr below mirrors the Python expression it
// names, including the order of operations (Python evaluates `a + b * c / 2`
// as a + ((b * c) / 2), as C++ does), and uses the same libm cos and pow, so
// the doubles are identical. This file must not be built with
// -ffast-math or FMA contraction (g++ in ISO mode does not contract).
#include "holdpoint/state/lr_scheduler.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>

#include "state/state_fields.h"

namespace holdpoint {

namespace {

using state::FieldReader;
using state::repr;
using state::state_error;

constexpr double kPi = std::numbers::pi;  // == Python's math.pi

std::string kind_of(const Value& value) { return std::string(value_kind_name(value.kind())); }

template <typename... Parts>
[[noreturn]] void invalid_option(Parts&&... parts) {
  detail::fail(ErrorCode::invalid_argument, std::forward<Parts>(parts)...);
}

Value float_list(const std::vector<double>& values) {
  Value::List items;
  for (double value : values) items.push_back(Value::floating(value));
  return Value::list(std::move(items));
}

std::vector<double> group_lrs_of(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

void set_group_lrs(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs) {
  auto& groups = optimizer.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(lrs[i]);
}

// Python's _format_param: one value for every group, or one per group.
std::vector<double> per_group(const std::vector<double>& values, std::size_t groups, const char* option) {
  if (values.size() == 1) return std::vector<double>(groups, values.front());
  if (values.size() != groups) {
    invalid_option("expected 1 or ", groups, " values for ", option, " (one per optimizer group), got ", values.size());
  }
  return values;
}

// Checks that a state holds exactly `keys` (plus `optional` ones), naming the
// first missing key, then the first unexpected one.
void require_keys(const FieldReader& reader, const std::vector<std::string>& keys,
                  const std::vector<std::string>& optional = {}) {
  for (const std::string& key : keys) reader.required(key);
  for (const auto& [key, value] : reader.dict()) {
    const bool known =
        key.is_string() && (std::find(keys.begin(), keys.end(), key.as_string()) != keys.end() ||
                            std::find(optional.begin(), optional.end(), key.as_string()) != optional.end());
    if (!known) state_error(ErrorCode::state_key_unknown, reader.path(), " has an unexpected key ", key.to_string());
  }
}

[[noreturn]] void static_mismatch(const std::string& path, const std::string& found, const std::string& expected) {
  state_error(ErrorCode::state_value_invalid, path, " is ", found, ", this scheduler's is ", expected,
              " (load-bearing configuration)");
}

// A state entry that must equal this scheduler's static configuration. Numbers
// compare by value (a float may arrive as a 0-d float64 tensor, an int where
// Python users wrote one); everything else by kind and content.
void expect_static(const Value& expected, const Value& found, const std::string& path) {
  switch (expected.kind()) {
    case ValueKind::integer: {
      const std::int64_t value = state::integer_of(found, path);
      if (value != expected.as_int()) static_mismatch(path, std::to_string(value), std::to_string(expected.as_int()));
      return;
    }
    case ValueKind::floating: {
      const double value = state::number_of(found, path);
      if (!(value == expected.as_double())) static_mismatch(path, repr(value), repr(expected.as_double()));
      return;
    }
    case ValueKind::boolean:
      if (!found.is_bool()) state_error(ErrorCode::state_type_invalid, path, " is a ", kind_of(found), ", not a bool");
      if (found.as_bool() != expected.as_bool())
        static_mismatch(path, found.as_bool() ? "True" : "False", expected.as_bool() ? "True" : "False");
      return;
    case ValueKind::string:
      if (!found.is_string()) state_error(ErrorCode::state_type_invalid, path, " is a ", kind_of(found), ", not a str");
      if (found.as_string() != expected.as_string())
        static_mismatch(path, "'" + found.as_string() + "'", "'" + expected.as_string() + "'");
      return;
    case ValueKind::none:
      if (!found.is_none()) state_error(ErrorCode::state_type_invalid, path, " is a ", kind_of(found), ", not None");
      return;
    case ValueKind::list:
    case ValueKind::tuple: {
      if (!found.is_sequence())
        state_error(ErrorCode::state_type_invalid, path, " is a ", kind_of(found), ", not a list");
      const Value::List& items = found.as_list();
      const Value::List& expected_items = expected.as_list();
      if (items.size() != expected_items.size()) {
        static_mismatch(path, std::to_string(items.size()) + " items",
                        std::to_string(expected_items.size()) + " items");
      }
      for (std::size_t i = 0; i < items.size(); ++i) {
        expect_static(expected_items[i], items[i], path + "[" + std::to_string(i) + "]");
      }
      return;
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      if (!found.is_dict()) state_error(ErrorCode::state_type_invalid, path, " is a ", kind_of(found), ", not a dict");
      const Dict& entries = found.as_dict();
      for (const auto& [key, value] : expected.as_dict()) {
        const Value* item = entries.find(key);
        const std::string item_path = path + "[" + key.to_string() + "]";
        if (!item) static_mismatch(path, "missing " + key.to_string(), "has it");
        expect_static(value, *item, item_path);
      }
      for (const auto& [key, value] : entries) {
        if (!expected.as_dict().contains(key)) static_mismatch(path, "has " + key.to_string(), "does not");
      }
      return;
    }
    default:
      state_error(ErrorCode::state_value_invalid, path, " cannot be compared");
  }
}

// A list of one finite number per optimizer group.
std::vector<double> read_rates(const FieldReader& reader, const char* key, std::size_t groups) {
  const Value::List& items = reader.sequence(key);
  if (items.size() != groups) {
    state_error(ErrorCode::state_structure_mismatch, reader.path_of(key), " has ", items.size(),
                " entries, the optimizer ", groups, " param groups");
  }
  std::vector<double> rates;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string path = reader.path_of(key) + "[" + std::to_string(i) + "]";
    const double rate = state::number_of(items[i], path);
    if (!std::isfinite(rate)) state_error(ErrorCode::state_value_invalid, path, " = ", repr(rate), " is not finite");
    rates.push_back(rate);
  }
  return rates;
}

std::int64_t read_at_least(const FieldReader& reader, const char* key, std::int64_t minimum) {
  const std::int64_t value = reader.integer(key);
  if (value < minimum)
    state_error(ErrorCode::state_value_invalid, reader.path_of(key), " = ", value, " is below ", minimum);
  return value;
}

const std::vector<std::string> kCommonKeys = {"base_lrs", "_step_count", "last_epoch", "_get_lr_called_within_step",
                                              "_last_lr"};
// Keys that only some torch versions write: 'verbose' (1.13 to 2.6),
// '_is_initial' (2.7 and later). Either may be there; both are bools.
const std::vector<std::string> kVersionKeys = {"verbose", "_is_initial"};

void read_version_keys(const FieldReader& reader) {
  for (const std::string& key : kVersionKeys) {
    if (reader.has(key)) reader.boolean(key);
  }
}

// `state` with `from` renamed `to` (same position), where it has `from` and not `to`.
Value with_key_renamed(const Value& state, std::string_view from, std::string_view to) {
  if (!state.is_dict() || !state.as_dict().find(from) || state.as_dict().find(to)) return state;
  Dict renamed;
  for (const auto& [key, value] : state.as_dict()) {
    renamed.insert(key.is_string() && key.as_string() == from ? DictKey(std::string(to)) : key, value);
  }
  return Value::dict(std::move(renamed));
}

}  // namespace

// ---- LRScheduler -------------------------------------------------------------------

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer, std::string name)
    : optimizer_(optimizer), name_(std::move(name)) {}

std::size_t LRScheduler::group_count() const { return optimizer_.param_groups().size(); }

std::vector<double> LRScheduler::group_lrs() const { return group_lrs_of(optimizer_); }

void LRScheduler::initial_step(std::vector<double> base_lrs, Dict leading, Dict trailing) {
  base_lrs_ = std::move(base_lrs);
  leading_ = std::move(leading);
  trailing_ = std::move(trailing);
  last_epoch_ = -1;
  step_count_ = 0;
  step();
}

void LRScheduler::step() {
  const std::int64_t previous_epoch = last_epoch_;
  const std::int64_t previous_count = step_count_;
  ++step_count_;
  ++last_epoch_;
  std::vector<double> values;
  try {
    values = get_lr();
  } catch (...) {
    // Python leaves the counters advanced when get_lr raises; holdpoint keeps
    // a failed step from changing anything.
    last_epoch_ = previous_epoch;
    step_count_ = previous_count;
    throw;
  }
  set_group_lrs(optimizer_, values);
  last_lr_ = group_lrs();
}

Value LRScheduler::capture(CaptureMode) const {
  Dict state;
  for (const auto& [key, value] : leading_) state.insert(key, value);
  state.insert("base_lrs", float_list(base_lrs_));
  state.insert("last_epoch", Value::integer(last_epoch_));
  state.insert("_step_count", Value::integer(step_count_));
  state.insert("_is_initial", Value::boolean(false));
  state.insert("_get_lr_called_within_step", Value::boolean(false));
  state.insert("_last_lr", float_list(last_lr_));
  for (const auto& [key, value] : trailing_) state.insert(key, value);
  return Value::dict(std::move(state));
}

void LRScheduler::validate(const Value& state) const {
  const FieldReader reader(state, name_);
  std::vector<std::string> keys;
  for (const auto& [key, value] : leading_) keys.push_back(key.as_string());
  keys.insert(keys.end(), kCommonKeys.begin(), kCommonKeys.end());
  for (const auto& [key, value] : trailing_) keys.push_back(key.as_string());
  require_keys(reader, keys, kVersionKeys);

  for (const Dict* entries : {&leading_, &trailing_}) {
    for (const auto& [key, expected] : *entries) {
      expect_static(expected, reader.required(key.as_string()), reader.path_of(key.as_string()));
    }
  }
  read_rates(reader, "base_lrs", group_count());
  read_at_least(reader, "last_epoch", -1);
  read_version_keys(reader);
  read_at_least(reader, "_step_count", 0);
  reader.boolean("_get_lr_called_within_step");
  read_rates(reader, "_last_lr", group_count());
}

void LRScheduler::apply(const Value& state) {
  const FieldReader reader(state, name_);
  base_lrs_ = read_rates(reader, "base_lrs", group_count());
  last_epoch_ = reader.integer("last_epoch");
  step_count_ = reader.integer("_step_count");
  last_lr_ = read_rates(reader, "_last_lr", group_count());
  set_group_lrs(optimizer_, last_lr_);
}

// ---- StepLR ----------------------------------------------------------------------

StepLR::StepLR(torch::optim::Optimizer& optimizer, StepLROptions options, std::string name)
    : LRScheduler(optimizer, std::move(name)), options_(options) {
  if (options_.step_size < 1) invalid_option("StepLR step_size must be >= 1, got ", options_.step_size);
  Dict leading;
  leading.insert("step_size", Value::integer(options_.step_size));
  leading.insert("gamma", Value::floating(options_.gamma));
  initial_step(group_lrs(), std::move(leading));
}

Value StepLR::config() const {
  Dict config;
  config.insert("type", Value::string("StepLR"));
  config.insert("step_size", Value::integer(options_.step_size));
  config.insert("gamma", Value::floating(options_.gamma));
  return Value::dict(std::move(config));
}

std::vector<double> StepLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (last_epoch() == 0 || last_epoch() % options_.step_size != 0) return lrs;
  for (double& lr : lrs) lr = lr * options_.gamma;
  return lrs;
}

// ---- MultiStepLR -----------------------------------------------------------------

MultiStepLR::MultiStepLR(torch::optim::Optimizer& optimizer, MultiStepLROptions options, std::string name)
    : LRScheduler(optimizer, std::move(name)), options_(std::move(options)) {
  for (std::int64_t milestone : options_.milestones) {
    const Value* count = counts_.find(milestone);
    counts_.insert_or_assign(milestone, Value::integer(count ? count->as_int() + 1 : 1));
  }
  Dict leading;
  leading.insert("milestones", Value::dict(counts_));
  leading.insert("gamma", Value::floating(options_.gamma));
  initial_step(group_lrs(), std::move(leading));
}

Value MultiStepLR::config() const {
  Value::List milestones;
  for (std::int64_t milestone : options_.milestones) milestones.push_back(Value::integer(milestone));
  Dict config;
  config.insert("type", Value::string("MultiStepLR"));
  config.insert("milestones", Value::list(std::move(milestones)));
  config.insert("gamma", Value::floating(options_.gamma));
  return Value::dict(std::move(config));
}

std::vector<double> MultiStepLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  const Value* count = counts_.find(last_epoch());
  if (!count) return lrs;
  // group['lr'] * self.gamma ** self.milestones[self.last_epoch]: float ** int is C pow.
  const double factor = std::pow(options_.gamma, static_cast<double>(count->as_int()));
  for (double& lr : lrs) lr = lr * factor;
  return lrs;
}

// ---- ExponentialLR ---------------------------------------------------------------

ExponentialLR::ExponentialLR(torch::optim::Optimizer& optimizer, ExponentialLROptions options, std::string name)
    : LRScheduler(optimizer, std::move(name)), options_(options) {
  Dict leading;
  leading.insert("gamma", Value::floating(options_.gamma));
  initial_step(group_lrs(), std::move(leading));
}

Value ExponentialLR::config() const {
  Dict config;
  config.insert("type", Value::string("ExponentialLR"));
  config.insert("gamma", Value::floating(options_.gamma));
  return Value::dict(std::move(config));
}

std::vector<double> ExponentialLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  if (last_epoch() == 0) return lrs;
  for (double& lr : lrs) lr = lr * options_.gamma;
  return lrs;
}

// ---- CosineAnnealingLR -----------------------------------------------------------

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, CosineAnnealingLROptions options,
                                     std::string name)
    : LRScheduler(optimizer, std::move(name)), options_(options) {
  if (options_.t_max < 1) invalid_option("CosineAnnealingLR T_max must be >= 1, got ", options_.t_max);
  Dict leading;
  leading.insert("T_max", Value::integer(options_.t_max));
  leading.insert("eta_min", Value::floating(options_.eta_min));
  initial_step(group_lrs(), std::move(leading));
}

Value CosineAnnealingLR::config() const {
  Dict config;
  config.insert("type", Value::string("CosineAnnealingLR"));
  config.insert("T_max", Value::integer(options_.t_max));
  config.insert("eta_min", Value::floating(options_.eta_min));
  return Value::dict(std::move(config));
}

std::vector<double> CosineAnnealingLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  const std::int64_t epoch = last_epoch();
  const double t_max = static_cast<double>(options_.t_max);
  const double eta_min = options_.eta_min;
  if (epoch == 0) return lrs;
  if (step_count() == 1 && epoch > 0) {
    // Only reachable from a state with _step_count 0; Python constructs it
    // when a scheduler is created with last_epoch >= 0.
    for (std::size_t i = 0; i < lrs.size(); ++i) {
      lrs[i] = eta_min + (base_lrs()[i] - eta_min) * (1 + std::cos(static_cast<double>(epoch) * kPi / t_max)) / 2;
    }
    return lrs;
  }
  // Python's % floors and C++'s truncates; both are 0 for the same epochs.
  if ((epoch - 1 - options_.t_max) % (2 * options_.t_max) == 0) {
    for (std::size_t i = 0; i < lrs.size(); ++i) {
      lrs[i] = lrs[i] + (base_lrs()[i] - eta_min) * (1 - std::cos(kPi / t_max)) / 2;
    }
    return lrs;
  }
  for (double& lr : lrs) {
    lr = (1 + std::cos(kPi * static_cast<double>(epoch) / t_max)) /
             (1 + std::cos(kPi * static_cast<double>(epoch - 1) / t_max)) * (lr - eta_min) +
         eta_min;
  }
  return lrs;
}

// ---- LinearLR --------------------------------------------------------------------

LinearLR::LinearLR(torch::optim::Optimizer& optimizer, LinearLROptions options, std::string name)
    : LRScheduler(optimizer, std::move(name)), options_(options) {
  // Python accepts start_factor 0 and then divides by zero at the second step.
  if (!(options_.start_factor > 0.0 && options_.start_factor <= 1.0)) {
    invalid_option("LinearLR start_factor must be in (0, 1], got ", repr(options_.start_factor));
  }
  if (!(options_.end_factor >= 0.0 && options_.end_factor <= 1.0)) {
    invalid_option("LinearLR end_factor must be in [0, 1], got ", repr(options_.end_factor));
  }
  if (options_.total_iters < 1) invalid_option("LinearLR total_iters must be >= 1, got ", options_.total_iters);
  Dict leading;
  leading.insert("start_factor", Value::floating(options_.start_factor));
  leading.insert("end_factor", Value::floating(options_.end_factor));
  leading.insert("total_iters", Value::integer(options_.total_iters));
  initial_step(group_lrs(), std::move(leading));
}

Value LinearLR::config() const {
  Dict config;
  config.insert("type", Value::string("LinearLR"));
  config.insert("start_factor", Value::floating(options_.start_factor));
  config.insert("end_factor", Value::floating(options_.end_factor));
  config.insert("total_iters", Value::integer(options_.total_iters));
  return Value::dict(std::move(config));
}

std::vector<double> LinearLR::get_lr() {
  std::vector<double> lrs = group_lrs();
  const double start = options_.start_factor;
  const double end = options_.end_factor;
  const std::int64_t epoch = last_epoch();
  if (epoch == 0) {
    for (double& lr : lrs) lr = lr * start;
    return lrs;
  }
  if (epoch > options_.total_iters) return lrs;
  for (double& lr : lrs) {
    lr = lr * (1. + (end - start) / (static_cast<double>(options_.total_iters) * start +
                                     static_cast<double>(epoch - 1) * (end - start)));
  }
  return lrs;
}

// ---- OneCycleLR ------------------------------------------------------------------

namespace {

enum class MomentumKind : std::uint8_t { momentum, beta1 };

// Python: 'betas' in optimizer.defaults -> beta1, else 'momentum' -> momentum.
std::optional<MomentumKind> momentum_kind_of(const torch::optim::OptimizerOptions& options) {
  if (dynamic_cast<const torch::optim::AdamOptions*>(&options) ||
      dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return MomentumKind::beta1;
  }
  if (dynamic_cast<const torch::optim::SGDOptions*>(&options) ||
      dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    return MomentumKind::momentum;
  }
  return std::nullopt;
}

const char* const kLrBoundNames[] = {"initial_lr", "max_lr", "min_lr"};
const char* const kMomentumBoundNames[] = {"max_momentum", "base_momentum"};
// torch 2.13 names the annealing function by '_anneal_func_type'; torch
// 1.13 pickled the function itself ('anneal_func'), which no weights-only
// load can read, and holdpoint's files from then wrote 'anneal_strategy'.
constexpr std::string_view kAnnealKey = "_anneal_func_type";
constexpr std::string_view kHoldpoint113AnnealKey = "anneal_strategy";

}  // namespace

OneCycleLR::OneCycleLR(torch::optim::Optimizer& optimizer, OneCycleLROptions options, std::string name)
    : LRScheduler(optimizer, std::move(name)), options_(std::move(options)) {
  if (options_.total_steps > 0) {
    total_steps_ = options_.total_steps;
  } else if (options_.epochs > 0 && options_.steps_per_epoch > 0) {
    if (options_.epochs > std::numeric_limits<std::int64_t>::max() / options_.steps_per_epoch) {
      invalid_option("OneCycleLR epochs x steps_per_epoch overflows");
    }
    total_steps_ = options_.epochs * options_.steps_per_epoch;
  } else {
    invalid_option("OneCycleLR needs total_steps > 0, or epochs > 0 and steps_per_epoch > 0");
  }
  if (!(options_.pct_start >= 0.0 && options_.pct_start <= 1.0)) {
    invalid_option("OneCycleLR pct_start must be in [0, 1], got ", repr(options_.pct_start));
  }
  const double steps = static_cast<double>(total_steps_);
  const double last_step = static_cast<double>(total_steps_ - 1);
  if (options_.three_phase) {
    phases_ = {{options_.pct_start * steps - 1, 0, 1, 0, 1},
               {2 * options_.pct_start * steps - 2, 1, 0, 1, 0},
               {last_step, 0, 2, 0, 0}};
  } else {
    phases_ = {{options_.pct_start * steps - 1, 0, 1, 0, 1}, {last_step, 1, 2, 1, 0}};
  }

  const std::size_t groups = group_count();
  max_lrs_ = per_group(options_.max_lr, groups, "max_lr");
  for (double max_lr : max_lrs_) {
    initial_lrs_.push_back(max_lr / options_.div_factor);
    min_lrs_.push_back(initial_lrs_.back() / options_.final_div_factor);
  }
  if (options_.cycle_momentum) {
    const auto kind = momentum_kind_of(optimizer.defaults());
    if (!kind) {
      invalid_option("OneCycleLR cycle_momentum needs an optimizer with momentum or betas (SGD, RMSprop, Adam, AdamW)");
    }
    use_beta1_ = *kind == MomentumKind::beta1;
    max_momentums_ = per_group(options_.max_momentum, groups, "max_momentum");
    base_momentums_ = per_group(options_.base_momentum, groups, "base_momentum");
    for (std::size_t i = 0; i < groups; ++i) set_momentum(i, max_momentums_[i]);
  }

  Value::List phases;
  for (std::size_t i = 0; i < phases_.size(); ++i) {
    const Phase& phase = phases_[i];
    Dict entry;
    // The last phase ends at the int total_steps - 1; the others at floats.
    entry.insert("end_step",
                 i + 1 == phases_.size() ? Value::integer(total_steps_ - 1) : Value::floating(phase.end_step));
    entry.insert("start_lr", Value::string(kLrBoundNames[phase.start_lr]));
    entry.insert("end_lr", Value::string(kLrBoundNames[phase.end_lr]));
    entry.insert("start_momentum", Value::string(kMomentumBoundNames[phase.start_momentum]));
    entry.insert("end_momentum", Value::string(kMomentumBoundNames[phase.end_momentum]));
    phases.push_back(Value::dict(std::move(entry)));
  }
  Dict leading;
  leading.insert("total_steps", Value::integer(total_steps_));
  leading.insert("_schedule_phases", Value::list(std::move(phases)));
  leading.insert(std::string(kAnnealKey), Value::string(options_.anneal_strategy == AnnealStrategy::cos ? "cos" : "linear"));
  leading.insert("cycle_momentum", Value::boolean(options_.cycle_momentum));
  if (options_.cycle_momentum) leading.insert("use_beta1", Value::boolean(use_beta1_));
  initial_step(initial_lrs_, std::move(leading));
}

Value OneCycleLR::config() const {
  Dict config;
  config.insert("type", Value::string("OneCycleLR"));
  config.insert("max_lr", float_list(max_lrs_));
  config.insert("total_steps", Value::integer(total_steps_));
  config.insert("pct_start", Value::floating(options_.pct_start));
  config.insert("anneal_strategy", Value::string(options_.anneal_strategy == AnnealStrategy::cos ? "cos" : "linear"));
  config.insert("cycle_momentum", Value::boolean(options_.cycle_momentum));
  if (options_.cycle_momentum) {
    config.insert("base_momentum", float_list(base_momentums_));
    config.insert("max_momentum", float_list(max_momentums_));
  }
  config.insert("div_factor", Value::floating(options_.div_factor));
  config.insert("final_div_factor", Value::floating(options_.final_div_factor));
  config.insert("three_phase", Value::boolean(options_.three_phase));
  return Value::dict(std::move(config));
}

std::optional<OneCycleLR::Position> OneCycleLR::find_position(std::int64_t step_num) const {
  if (step_num > total_steps_) return std::nullopt;
  const double step = static_cast<double>(step_num);
  double start_step = 0;
  for (std::size_t i = 0; i < phases_.size(); ++i) {
    const double end_step = phases_[i].end_step;
    if (step <= end_step || i + 1 == phases_.size()) {
      // Python raises ZeroDivisionError on a zero-length phase.
      if (end_step - start_step == 0) return std::nullopt;
      return Position{i, (step - start_step) / (end_step - start_step)};
    }
    start_step = end_step;
  }
  return std::nullopt;
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == AnnealStrategy::cos) {
    const double cos_out = std::cos(kPi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

double OneCycleLR::momentum_at(std::size_t group, const Position& position) const {
  const Phase& phase = phases_[position.phase];
  const double bounds[] = {max_momentums_[group], base_momentums_[group]};
  return anneal(bounds[phase.start_momentum], bounds[phase.end_momentum], position.pct);
}

void OneCycleLR::set_momentum(std::size_t group, double momentum) {
  auto& options = optimizer().param_groups()[group].options();
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    sgd->momentum(momentum);
  } else if (auto* rmsprop = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    rmsprop->momentum(momentum);
  } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas({momentum, std::get<1>(adam->betas())});
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    adamw->betas({momentum, std::get<1>(adamw->betas())});
  } else {
    invalid_option("OneCycleLR cannot cycle the momentum of param group ", group, ": its options have none");
  }
}

std::vector<double> OneCycleLR::get_lr() {
  const std::int64_t step_num = last_epoch();
  const auto position = find_position(step_num);
  if (!position) {
    if (step_num > total_steps_) {
      detail::fail(ErrorCode::call_order_invalid, name(), ": tried to step ", step_num + 1,
                   " times; OneCycleLR total_steps is ", total_steps_);
    }
    detail::fail(ErrorCode::call_order_invalid, name(), ": step ", step_num,
                 " falls in a OneCycleLR phase of length 0 (pct_start ", repr(options_.pct_start), ", total_steps ",
                 total_steps_, ")");
  }
  const Phase& phase = phases_[position->phase];
  std::vector<double> lrs;
  for (std::size_t i = 0; i < group_count(); ++i) {
    const double bounds[] = {initial_lrs_[i], max_lrs_[i], min_lrs_[i]};
    lrs.push_back(anneal(bounds[phase.start_lr], bounds[phase.end_lr], position->pct));
  }
  if (options_.cycle_momentum) {
    for (std::size_t i = 0; i < group_count(); ++i) set_momentum(i, momentum_at(i, *position));
  }
  return lrs;
}

void OneCycleLR::validate(const Value& given) const {
  const Value state = with_key_renamed(given, kHoldpoint113AnnealKey, kAnnealKey);
  LRScheduler::validate(state);
  const FieldReader reader(state, name());
  const std::int64_t epoch = reader.integer("last_epoch");
  if (epoch >= 0 && !find_position(epoch)) {
    state_error(ErrorCode::state_value_invalid, reader.path_of("last_epoch"), " = ", epoch,
                " is a step this OneCycleLR cannot reach (total_steps ", total_steps_, ")");
  }
}

void OneCycleLR::apply(const Value& given) {
  const Value state = with_key_renamed(given, kHoldpoint113AnnealKey, kAnnealKey);
  LRScheduler::apply(state);
  // The momentum step last_epoch set; the optimizer component carries it too.
  if (!options_.cycle_momentum || last_epoch() < 0) return;
  const Position position = *find_position(last_epoch());
  for (std::size_t i = 0; i < group_count(); ++i) set_momentum(i, momentum_at(i, position));
}

// ---- LambdaLR --------------------------------------------------------------------

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::vector<LrLambda> lr_lambdas, std::string identity,
                   std::string name)
    : LRScheduler(optimizer, std::move(name)), lr_lambdas_(std::move(lr_lambdas)), identity_(std::move(identity)) {
  const std::size_t groups = group_count();
  if (lr_lambdas_.size() == 1) lr_lambdas_.assign(groups, lr_lambdas_.front());
  if (lr_lambdas_.size() != groups) {
    invalid_option("LambdaLR expected 1 or ", groups, " lr_lambdas (one per optimizer group), got ",
                   lr_lambdas_.size());
  }
  for (const LrLambda& lr_lambda : lr_lambdas_) {
    if (!lr_lambda) invalid_option("LambdaLR was given an empty lr_lambda");
  }
  if (identity_.empty()) invalid_option("LambdaLR needs a non-empty identity naming its lr_lambdas");
  Dict trailing;
  trailing.insert("lr_lambdas", Value::list(Value::List(groups, Value::none())));
  initial_step(group_lrs(), {}, std::move(trailing));
}

Value LambdaLR::config() const {
  Dict config;
  config.insert("type", Value::string("LambdaLR"));
  config.insert("lr_lambda", Value::string(identity_));
  return Value::dict(std::move(config));
}

std::vector<double> LambdaLR::get_lr() {
  std::vector<double> lrs;
  for (std::size_t i = 0; i < lr_lambdas_.size(); ++i) lrs.push_back(base_lrs()[i] * lr_lambdas_[i](last_epoch()));
  return lrs;
}

// ---- ReduceLROnPlateau -----------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(torch::optim::Optimizer& optimizer, ReduceLROnPlateauOptions options,
                                     std::string name)
    : optimizer_(optimizer), options_(std::move(options)), name_(std::move(name)) {
  if (!(options_.factor < 1.0)) invalid_option("ReduceLROnPlateau factor must be < 1.0, got ", repr(options_.factor));
  if (options_.patience < 0) invalid_option("ReduceLROnPlateau patience must be >= 0, got ", options_.patience);
  if (options_.cooldown < 0) invalid_option("ReduceLROnPlateau cooldown must be >= 0, got ", options_.cooldown);
  min_lrs_ = per_group(options_.min_lr, optimizer_.param_groups().size(), "min_lr");
  best_ = mode_worse();
  last_lr_ = group_lrs_of(optimizer_);
}

double ReduceLROnPlateau::mode_worse() const {
  const double inf = std::numeric_limits<double>::infinity();
  return options_.mode == PlateauMode::min ? inf : -inf;
}

bool ReduceLROnPlateau::is_better(double a, double best) const {
  const bool min = options_.mode == PlateauMode::min;
  if (options_.threshold_mode == ThresholdMode::rel) {
    const double rel_epsilon = min ? 1. - options_.threshold : options_.threshold + 1.;
    return min ? a < best * rel_epsilon : a > best * rel_epsilon;
  }
  return min ? a < best - options_.threshold : a > best + options_.threshold;
}

void ReduceLROnPlateau::reduce_lr() {
  auto& groups = optimizer_.param_groups();
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const double old_lr = groups[i].options().get_lr();
    // Python's max(old_lr * factor, min_lr) keeps the first unless the second is greater.
    double new_lr = old_lr * options_.factor;
    if (min_lrs_[i] > new_lr) new_lr = min_lrs_[i];
    if (old_lr - new_lr > options_.eps) groups[i].options().set_lr(new_lr);
  }
}

void ReduceLROnPlateau::step(double metric) {
  last_epoch_ += 1;
  if (is_better(metric, best_)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    num_bad_epochs_ += 1;
  }
  if (cooldown_counter_ > 0) {
    cooldown_counter_ -= 1;
    num_bad_epochs_ = 0;  // bad epochs in cooldown do not count
  }
  if (num_bad_epochs_ > options_.patience) {
    reduce_lr();
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  last_lr_ = group_lrs_of(optimizer_);
}

Dict ReduceLROnPlateau::static_entries() const {
  Dict entries;
  entries.insert("factor", Value::floating(options_.factor));
  // Python keeps the scalar min_lr it was given (None for a per-group list).
  entries.insert("default_min_lr",
                 options_.min_lr.size() == 1 ? Value::floating(options_.min_lr.front()) : Value::none());
  entries.insert("min_lrs", float_list(min_lrs_));
  entries.insert("patience", Value::integer(options_.patience));
  entries.insert("cooldown", Value::integer(options_.cooldown));
  entries.insert("eps", Value::floating(options_.eps));
  entries.insert("mode_worse", Value::floating(mode_worse()));
  entries.insert("mode", Value::string(options_.mode == PlateauMode::min ? "min" : "max"));
  entries.insert("threshold", Value::floating(options_.threshold));
  entries.insert("threshold_mode", Value::string(options_.threshold_mode == ThresholdMode::rel ? "rel" : "abs"));
  return entries;
}

// torch 2.13's key order: the static entries up to eps, last_epoch,
// _last_lr (set from construction on), the rest of the static entries, then
// the counters.
Value ReduceLROnPlateau::capture(CaptureMode) const {
  Dict state;
  for (const auto& [key, value] : static_entries()) {
    if (key.as_string() == "mode_worse") {
      state.insert("last_epoch", Value::integer(last_epoch_));
      state.insert("_last_lr", float_list(last_lr_));
    }
    state.insert(key, value);
  }
  state.insert("best", Value::floating(best_));
  state.insert("cooldown_counter", Value::integer(cooldown_counter_));
  state.insert("num_bad_epochs", Value::integer(num_bad_epochs_));
  return Value::dict(std::move(state));
}

// Accepts torch 1.13's layout too: 'verbose', no 'default_min_lr', and
// '_last_lr' only once a step was taken.
void ReduceLROnPlateau::validate(const Value& state) const {
  const FieldReader reader(state, name_);
  const Dict fixed = static_entries();
  std::vector<std::string> keys;
  for (const auto& [key, value] : fixed) {
    if (key.as_string() != "default_min_lr") keys.push_back(key.as_string());
  }
  for (const char* key : {"cooldown_counter", "best", "num_bad_epochs", "last_epoch"}) keys.push_back(key);
  require_keys(reader, keys, {"_last_lr", "default_min_lr", "verbose"});

  for (const auto& [key, expected] : fixed) {
    if (!reader.has(key.as_string())) continue;  // default_min_lr, from torch 1.13
    expect_static(expected, reader.required(key.as_string()), reader.path_of(key.as_string()));
  }
  if (reader.has("verbose")) reader.boolean("verbose");
  const std::int64_t cooldown_counter = read_at_least(reader, "cooldown_counter", 0);
  if (cooldown_counter > options_.cooldown) {
    state_error(ErrorCode::state_value_invalid, reader.path_of("cooldown_counter"), " = ", cooldown_counter,
                " exceeds cooldown ", options_.cooldown);
  }
  const double best = reader.number("best");
  if (std::isnan(best)) state_error(ErrorCode::state_value_invalid, reader.path_of("best"), " is NaN");
  const std::int64_t bad_epochs = read_at_least(reader, "num_bad_epochs", 0);
  if (bad_epochs > options_.patience) {
    state_error(ErrorCode::state_value_invalid, reader.path_of("num_bad_epochs"), " = ", bad_epochs,
                " exceeds patience ", options_.patience, " (step resets it past patience)");
  }
  const std::int64_t epoch = read_at_least(reader, "last_epoch", 0);
  // torch 1.13 set _last_lr in step() only; torch 2.13 also at construction.
  if (reader.has("_last_lr")) {
    read_rates(reader, "_last_lr", optimizer_.param_groups().size());
  } else if (epoch > 0) {
    state_error(ErrorCode::state_key_missing, reader.path(), " has no _last_lr, but last_epoch is ", epoch);
  }
}

void ReduceLROnPlateau::apply(const Value& state) {
  const FieldReader reader(state, name_);
  cooldown_counter_ = reader.integer("cooldown_counter");
  best_ = reader.number("best");
  num_bad_epochs_ = reader.integer("num_bad_epochs");
  last_epoch_ = reader.integer("last_epoch");
  if (reader.has("_last_lr")) {
    last_lr_ = read_rates(reader, "_last_lr", optimizer_.param_groups().size());
    set_group_lrs(optimizer_, last_lr_);
  } else {
    last_lr_ = group_lrs_of(optimizer_);
  }
}

Value ReduceLROnPlateau::config() const {
  Dict config;
  config.insert("type", Value::string("ReduceLROnPlateau"));
  config.insert("mode", Value::string(options_.mode == PlateauMode::min ? "min" : "max"));
  config.insert("factor", Value::floating(options_.factor));
  config.insert("patience", Value::integer(options_.patience));
  config.insert("threshold", Value::floating(options_.threshold));
  config.insert("threshold_mode", Value::string(options_.threshold_mode == ThresholdMode::rel ? "rel" : "abs"));
  config.insert("cooldown", Value::integer(options_.cooldown));
  config.insert("min_lr", float_list(min_lrs_));
  config.insert("eps", Value::floating(options_.eps));
  return Value::dict(std::move(config));
}

}  // namespace holdpoint
