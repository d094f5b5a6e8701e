#include "holdpoint/state/optimizer_state.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "base/fail.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "state/state_fields.h"
#include "state/tensor_state.h"

namespace holdpoint {
namespace {

using state::state_error;
using torch::optim::AdagradOptions;
using torch::optim::AdagradParamState;
using torch::optim::AdamOptions;
using torch::optim::AdamParamState;
using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::Optimizer;
using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using torch::optim::RMSpropOptions;
using torch::optim::RMSpropParamState;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

// LibTorch keys per-parameter state by the parameter's TensorImpl: as its
// address printed to a string up to 2.1, as the address itself (void*) since
// 2.2. Both layouts are served by taking the map type from the API.
using LibTorchState = std::remove_cvref_t<decltype(std::declval<Optimizer&>().state())>;
using LibTorchStateKey = LibTorchState::key_type;

enum class OptimizerKind : std::uint8_t { sgd, adam, adamw, rmsprop, adagrad };

std::string_view kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::sgd: return "SGD";
    case OptimizerKind::adam: return "Adam";
    case OptimizerKind::adamw: return "AdamW";
    case OptimizerKind::rmsprop: return "RMSprop";
    case OptimizerKind::adagrad: return "Adagrad";
  }
  return "unknown";
}

std::optional<OptimizerKind> kind_of_options(const OptimizerOptions& options) {
  if (dynamic_cast<const SGDOptions*>(&options)) return OptimizerKind::sgd;
  if (dynamic_cast<const AdamOptions*>(&options)) return OptimizerKind::adam;
  if (dynamic_cast<const AdamWOptions*>(&options)) return OptimizerKind::adamw;
  if (dynamic_cast<const RMSpropOptions*>(&options)) return OptimizerKind::rmsprop;
  if (dynamic_cast<const AdagradOptions*>(&options)) return OptimizerKind::adagrad;
  return std::nullopt;
}

// The kind of the optimizer; every group must hold options of that kind
// (LibTorch's own step() casts them unchecked).
OptimizerKind kind_of(const Optimizer& optimizer) {
  const std::optional<OptimizerKind> kind = kind_of_options(optimizer.defaults());
  if (!kind) {
    detail::fail(ErrorCode::invalid_argument,
                 "OptimizerState supports SGD, Adam, AdamW, RMSprop and Adagrad; this optimizer's options are none of them");
  }
  const auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].has_options() || kind_of_options(groups[g].options()) != kind) {
      detail::fail(ErrorCode::invalid_argument, "parameter group ", g, " of the ", kind_name(*kind),
                   " optimizer does not hold ", kind_name(*kind), " options");
    }
  }
  return *kind;
}

template <typename Options>
const Options& options_as(const OptimizerOptions& options) {
  return dynamic_cast<const Options&>(options);
}

// ---- hyperparameters ---------------------------------------------------------

// A LibTorch option as Python's param_groups hold it: a float, a bool, or the
// (beta1, beta2) tuple.
using Hyperparameter = std::variant<double, bool, std::array<double, 2>>;
struct NamedHyperparameter {
  std::string_view key;
  Hyperparameter value;
};
using Hyperparameters = std::vector<NamedHyperparameter>;

std::array<double, 2> betas_of(const std::tuple<double, double>& betas) {
  return {std::get<0>(betas), std::get<1>(betas)};
}

// In the order of Python's param_groups keys (the same in torch 1.13 and 2.13).
Hyperparameters hyperparameters_of(OptimizerKind kind, const OptimizerOptions& options) {
  switch (kind) {
    case OptimizerKind::sgd: {
      const auto& o = options_as<SGDOptions>(options);
      return {{"lr", o.lr()},
              {"momentum", o.momentum()},
              {"dampening", o.dampening()},
              {"weight_decay", o.weight_decay()},
              {"nesterov", o.nesterov()}};
    }
    case OptimizerKind::adam: {
      const auto& o = options_as<AdamOptions>(options);
      return {{"lr", o.lr()},
              {"betas", betas_of(o.betas())},
              {"eps", o.eps()},
              {"weight_decay", o.weight_decay()},
              {"amsgrad", o.amsgrad()}};
    }
    case OptimizerKind::adamw: {
      const auto& o = options_as<AdamWOptions>(options);
      return {{"lr", o.lr()},
              {"betas", betas_of(o.betas())},
              {"eps", o.eps()},
              {"weight_decay", o.weight_decay()},
              {"amsgrad", o.amsgrad()}};
    }
    case OptimizerKind::rmsprop: {
      const auto& o = options_as<RMSpropOptions>(options);
      return {{"lr", o.lr()},
              {"momentum", o.momentum()},
              {"alpha", o.alpha()},
              {"eps", o.eps()},
              {"centered", o.centered()},
              {"weight_decay", o.weight_decay()}};
    }
    case OptimizerKind::adagrad: {
      const auto& o = options_as<AdagradOptions>(options);
      return {{"lr", o.lr()},
              {"lr_decay", o.lr_decay()},
              {"eps", o.eps()},
              {"weight_decay", o.weight_decay()},
              {"initial_accumulator_value", o.initial_accumulator_value()}};
    }
  }
  return {};
}

const Hyperparameter& find_hyperparameter(const Hyperparameters& values, std::string_view key) {
  for (const NamedHyperparameter& value : values) {
    if (value.key == key) return value.value;
  }
  detail::fail(ErrorCode::invalid_argument, "no hyperparameter ", key);
}
double number_in(const Hyperparameters& values, std::string_view key) {
  return std::get<double>(find_hyperparameter(values, key));
}
bool flag_in(const Hyperparameters& values, std::string_view key) {
  return std::get<bool>(find_hyperparameter(values, key));
}
std::tuple<double, double> betas_in(const Hyperparameters& values) {
  const auto& betas = std::get<std::array<double, 2>>(find_hyperparameter(values, "betas"));
  return {betas[0], betas[1]};
}

// The inverse of hyperparameters_of.
std::unique_ptr<OptimizerOptions> options_from(OptimizerKind kind, const Hyperparameters& values) {
  const double lr = number_in(values, "lr");
  switch (kind) {
    case OptimizerKind::sgd:
      return std::make_unique<SGDOptions>(SGDOptions(lr)
                                              .momentum(number_in(values, "momentum"))
                                              .dampening(number_in(values, "dampening"))
                                              .weight_decay(number_in(values, "weight_decay"))
                                              .nesterov(flag_in(values, "nesterov")));
    case OptimizerKind::adam:
      return std::make_unique<AdamOptions>(AdamOptions(lr)
                                               .betas(betas_in(values))
                                               .eps(number_in(values, "eps"))
                                               .weight_decay(number_in(values, "weight_decay"))
                                               .amsgrad(flag_in(values, "amsgrad")));
    case OptimizerKind::adamw:
      return std::make_unique<AdamWOptions>(AdamWOptions(lr)
                                                .betas(betas_in(values))
                                                .eps(number_in(values, "eps"))
                                                .weight_decay(number_in(values, "weight_decay"))
                                                .amsgrad(flag_in(values, "amsgrad")));
    case OptimizerKind::rmsprop:
      return std::make_unique<RMSpropOptions>(RMSpropOptions(lr)
                                                  .momentum(number_in(values, "momentum"))
                                                  .alpha(number_in(values, "alpha"))
                                                  .eps(number_in(values, "eps"))
                                                  .centered(flag_in(values, "centered"))
                                                  .weight_decay(number_in(values, "weight_decay")));
    case OptimizerKind::adagrad:
      return std::make_unique<AdagradOptions>(AdagradOptions(lr)
                                                  .lr_decay(number_in(values, "lr_decay"))
                                                  .eps(number_in(values, "eps"))
                                                  .weight_decay(number_in(values, "weight_decay"))
                                                  .initial_accumulator_value(
                                                      number_in(values, "initial_accumulator_value")));
  }
  return nullptr;
}

// Assigns in place, so references to the group's options held elsewhere (a
// LibTorch scheduler's) stay valid. Cannot throw: the options are plain values.
void assign_options(OptimizerKind kind, OptimizerOptions& live, const OptimizerOptions& restored) {
  switch (kind) {
    case OptimizerKind::sgd: dynamic_cast<SGDOptions&>(live) = options_as<SGDOptions>(restored); return;
    case OptimizerKind::adam: dynamic_cast<AdamOptions&>(live) = options_as<AdamOptions>(restored); return;
    case OptimizerKind::adamw: dynamic_cast<AdamWOptions&>(live) = options_as<AdamWOptions>(restored); return;
    case OptimizerKind::rmsprop: dynamic_cast<RMSpropOptions&>(live) = options_as<RMSpropOptions>(restored); return;
    case OptimizerKind::adagrad: dynamic_cast<AdagradOptions&>(live) = options_as<AdagradOptions>(restored); return;
  }
}

Value hyperparameter_value(const Hyperparameter& value) {
  if (const auto* number = std::get_if<double>(&value)) return Value::floating(*number);
  if (const auto* flag = std::get_if<bool>(&value)) return Value::boolean(*flag);
  const auto& betas = std::get<std::array<double, 2>>(value);
  return Value::tuple({Value::floating(betas[0]), Value::floating(betas[1])});
}

// Python's group keys that LibTorch has no option for, in torch 2.13's key
// order, each with the one value LibTorch implements. Older files hold a
// subset of them (torch 1.13: no 'fused' in SGD, no 'decoupled_weight_decay'
// anywhere, ...); Python's own load_state_dict fills a missing one with its
// default, which is that value.
struct PythonFlag {
  std::string_view key;
  enum class Implemented : std::uint8_t { off, on, off_or_none } implemented;
};
std::vector<PythonFlag> python_flags(OptimizerKind kind) {
  using enum PythonFlag::Implemented;
  switch (kind) {
    case OptimizerKind::sgd:
      return {{"maximize", off}, {"foreach", off_or_none}, {"differentiable", off}, {"fused", off_or_none}};
    case OptimizerKind::adam:
    case OptimizerKind::adamw:
      return {{"maximize", off},       {"foreach", off_or_none}, {"capturable", off},
              {"differentiable", off}, {"fused", off_or_none},
              {"decoupled_weight_decay", kind == OptimizerKind::adamw ? on : off}};
    case OptimizerKind::rmsprop:
      return {{"capturable", off}, {"foreach", off_or_none}, {"maximize", off}, {"differentiable", off}};
    case OptimizerKind::adagrad:
      return {{"foreach", off_or_none}, {"maximize", off}, {"differentiable", off}, {"fused", off_or_none}};
  }
  return {};
}

// What a capture writes: torch 2.13's defaults (None where Python means "pick
// the implementation").
Value implied_flag_value(const PythonFlag& flag) {
  return flag.implemented == PythonFlag::Implemented::off_or_none ? Value::none()
                                                                  : Value::boolean(flag.implemented ==
                                                                                   PythonFlag::Implemented::on);
}

struct SchedulerKey {
  std::string_view key;
  std::optional<double> SchedulerGroupKeys::*slot;
};
// In the order Python's schedulers add them (OneCycleLR: initial_lr, max_lr, min_lr).
constexpr std::array<SchedulerKey, 5> kSchedulerKeys = {{{"initial_lr", &SchedulerGroupKeys::initial_lr},
                                                        {"max_lr", &SchedulerGroupKeys::max_lr},
                                                        {"min_lr", &SchedulerGroupKeys::min_lr},
                                                        {"max_momentum", &SchedulerGroupKeys::max_momentum},
                                                        {"base_momentum", &SchedulerGroupKeys::base_momentum}}};

// The optimizer type a param group's keys imply, or nullopt where the keys
// leave it open. Adam and AdamW share every hyperparameter name. torch >= 2.6
// writes 'decoupled_weight_decay' (AdamW: True); torch 1.13 gave only Adam
// the 'differentiable' and 'fused' flags; torch 2.0 to 2.5 gave them to both,
// so a group with neither marker is left to the live optimizer.
std::optional<OptimizerKind> implied_kind(const Dict& group) {
  const auto has = [&](std::string_view key) { return group.find(key) != nullptr; };
  if (has("dampening") || has("nesterov")) return OptimizerKind::sgd;
  if (has("alpha") || has("centered")) return OptimizerKind::rmsprop;
  if (has("lr_decay") || has("initial_accumulator_value")) return OptimizerKind::adagrad;
  if (!has("betas")) return std::nullopt;
  if (const Value* decoupled = group.find("decoupled_weight_decay"); decoupled && decoupled->is_bool()) {
    return decoupled->as_bool() ? OptimizerKind::adamw : OptimizerKind::adam;
  }
  if (!has("differentiable") && !has("fused")) return OptimizerKind::adamw;  // torch 1.13's AdamW
  return std::nullopt;
}

// ---- per-parameter state -----------------------------------------------------

// A template, so that only the branch of this LibTorch's key type is compiled.
template <typename Key>
Key key_of(const at::Tensor& param) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;  // what LibTorch <= 2.1 printed with c10::guts::to_string
    address << param.unsafeGetTensorImpl();
    return address.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

LibTorchStateKey state_key(const at::Tensor& param) { return key_of<LibTorchStateKey>(param); }

// Above 2^24 float32 cannot count by one; float64 keeps every step below 2^53.
Value step_tensor(std::int64_t step) {
  constexpr std::int64_t kFloat32Exact = std::int64_t{1} << 24;
  const at::ScalarType type = step <= kFloat32Exact ? at::kFloat : at::kDouble;
  return tensor_value(at::scalar_tensor(static_cast<double>(step), at::TensorOptions().dtype(type)));
}

void put_tensor(Dict& entry, std::string_view key, const at::Tensor& tensor, CaptureMode mode) {
  if (tensor.defined()) entry.insert(std::string(key), state::capture_tensor(tensor, mode));
}

template <typename ParamState>
const ParamState& param_state_as(const OptimizerParamState& state) {
  const auto* typed = dynamic_cast<const ParamState*>(&state);
  if (!typed) detail::fail(ErrorCode::invalid_argument, "the optimizer holds per-parameter state of another type");
  return *typed;
}

Value capture_param_state(OptimizerKind kind, const OptimizerParamState& live, CaptureMode mode) {
  Dict entry;
  switch (kind) {
    case OptimizerKind::sgd: {
      put_tensor(entry, "momentum_buffer", param_state_as<SGDParamState>(live).momentum_buffer(), mode);
      break;
    }
    case OptimizerKind::adam: {
      const auto& s = param_state_as<AdamParamState>(live);
      entry.insert("step", step_tensor(s.step()));
      put_tensor(entry, "exp_avg", s.exp_avg(), mode);
      put_tensor(entry, "exp_avg_sq", s.exp_avg_sq(), mode);
      put_tensor(entry, "max_exp_avg_sq", s.max_exp_avg_sq(), mode);
      break;
    }
    case OptimizerKind::adamw: {
      const auto& s = param_state_as<AdamWParamState>(live);
      entry.insert("step", step_tensor(s.step()));
      put_tensor(entry, "exp_avg", s.exp_avg(), mode);
      put_tensor(entry, "exp_avg_sq", s.exp_avg_sq(), mode);
      put_tensor(entry, "max_exp_avg_sq", s.max_exp_avg_sq(), mode);
      break;
    }
    case OptimizerKind::rmsprop: {
      const auto& s = param_state_as<RMSpropParamState>(live);
      entry.insert("step", step_tensor(s.step()));
      put_tensor(entry, "square_avg", s.square_avg(), mode);
      put_tensor(entry, "momentum_buffer", s.momentum_buffer(), mode);
      put_tensor(entry, "grad_avg", s.grad_avg(), mode);
      break;
    }
    case OptimizerKind::adagrad: {
      const auto& s = param_state_as<AdagradParamState>(live);
      entry.insert("step", step_tensor(s.step()));
      put_tensor(entry, "sum", s.sum(), mode);
      break;
    }
  }
  return Value::dict(std::move(entry));
}

// Reads one state entry, checked against its parameter and the group options
// it will run under. With `materialize` off only checks (returns nullptr).
class ParamStateReader {
 public:
  ParamStateReader(const Value& entry, std::string path, const at::Tensor& param, bool materialize)
      : fields_(entry, std::move(path)), param_(param), materialize_(materialize) {}

  const state::FieldReader& fields() const { return fields_; }

  // Every key of the entry must be one of `keys` (which depend on the options).
  void allow_only(const std::vector<std::string_view>& keys, std::string_view why) const {
    for (const auto& [key, value] : fields_.dict()) {
      if (!key.is_string() || std::find(keys.begin(), keys.end(), key.as_string()) == keys.end()) {
        state_error(ErrorCode::state_key_unknown, fields_.path(), " has an unexpected key ", key.to_string(), why);
      }
    }
  }

  std::int64_t step() const {
    const std::int64_t step = fields_.integer("step");
    if (step < 0) state_error(ErrorCode::state_value_invalid, fields_.path_of("step"), " = ", step, " is negative");
    return step;
  }

  // A tensor shaped (and placed, and laid out) like the parameter: the
  // snapshot's own bytes when the load handed them over, else a copy.
  at::Tensor tensor(std::string_view key) const {
    const TensorData& data = fields_.tensor(key);
    state::check_tensor_matches(data, param_, fields_.path_of(key));
    if (!materialize_) return {};
    return state::adopt_or_copy(fields_.tensor_ptr(key), param_);
  }

  bool materialize() const { return materialize_; }

 private:
  state::FieldReader fields_;
  const at::Tensor& param_;
  bool materialize_;
};

template <typename ParamState>
std::unique_ptr<OptimizerParamState> read_adam_family(const ParamStateReader& reader, bool amsgrad) {
  if (amsgrad) {
    reader.allow_only({"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, "");
  } else {
    reader.allow_only({"step", "exp_avg", "exp_avg_sq"}, " (amsgrad is off)");
  }
  auto state = std::make_unique<ParamState>();
  state->step(reader.step());
  state->exp_avg(reader.tensor("exp_avg"));
  state->exp_avg_sq(reader.tensor("exp_avg_sq"));
  if (amsgrad) state->max_exp_avg_sq(reader.tensor("max_exp_avg_sq"));
  return state;
}

// nullptr: no LibTorch state for this parameter (or nothing materialized).
std::unique_ptr<OptimizerParamState> read_param_state(OptimizerKind kind, const OptimizerOptions& options,
                                                      const ParamStateReader& reader) {
  std::unique_ptr<OptimizerParamState> result;
  switch (kind) {
    case OptimizerKind::sgd: {
      reader.allow_only({"momentum_buffer"}, "");
      if (reader.fields().required("momentum_buffer").is_none()) return nullptr;
      auto state = std::make_unique<SGDParamState>();
      state->momentum_buffer(reader.tensor("momentum_buffer"));
      result = std::move(state);
      break;
    }
    case OptimizerKind::adam:
      result = read_adam_family<AdamParamState>(reader, options_as<AdamOptions>(options).amsgrad());
      break;
    case OptimizerKind::adamw:
      result = read_adam_family<AdamWParamState>(reader, options_as<AdamWOptions>(options).amsgrad());
      break;
    case OptimizerKind::rmsprop: {
      const auto& o = options_as<RMSpropOptions>(options);
      std::vector<std::string_view> keys = {"step", "square_avg"};
      if (o.momentum() > 0) keys.push_back("momentum_buffer");
      if (o.centered()) keys.push_back("grad_avg");
      reader.allow_only(keys, o.momentum() > 0 && o.centered() ? ""
                              : o.momentum() > 0               ? " (centered is off)"
                              : o.centered()                   ? " (momentum is 0)"
                                                               : " (momentum is 0 and centered is off)");
      auto state = std::make_unique<RMSpropParamState>();
      state->step(reader.step());
      state->square_avg(reader.tensor("square_avg"));
      if (o.momentum() > 0) state->momentum_buffer(reader.tensor("momentum_buffer"));
      if (o.centered()) state->grad_avg(reader.tensor("grad_avg"));
      result = std::move(state);
      break;
    }
    case OptimizerKind::adagrad: {
      reader.allow_only({"step", "sum"}, "");
      auto state = std::make_unique<AdagradParamState>();
      state->step(reader.step());
      state->sum(reader.tensor("sum"));
      result = std::move(state);
      break;
    }
  }
  return reader.materialize() ? std::move(result) : nullptr;
}

// ---- param groups ------------------------------------------------------------

void check_hyperparameter_range(std::string_view key, double value, const std::string& path) {
  if (!std::isfinite(value)) state_error(ErrorCode::state_value_invalid, path, " = ", value, " is not finite");
  // PyTorch bounds dampening nowhere; every other float option must be >= 0.
  if (key != "dampening" && value < 0) {
    state_error(ErrorCode::state_value_invalid, path, " = ", value, " is negative (must be >= 0)");
  }
}

double read_beta(const Value& value, const std::string& path) {
  const double beta = state::number_of(value, path);
  if (!(beta >= 0 && beta < 1)) state_error(ErrorCode::state_value_invalid, path, " = ", beta, " is outside [0, 1)");
  return beta;
}

// Reads the hyperparameters `live` has, with the types it has them in.
Hyperparameters read_hyperparameters(const state::FieldReader& group, const Hyperparameters& live) {
  Hyperparameters values;
  for (const NamedHyperparameter& template_value : live) {
    const std::string path = group.path_of(template_value.key);
    Hyperparameter value;
    if (std::holds_alternative<double>(template_value.value)) {
      const double number = group.number(template_value.key);
      check_hyperparameter_range(template_value.key, number, path);
      value = number;
    } else if (std::holds_alternative<bool>(template_value.value)) {
      value = group.boolean(template_value.key);
    } else {
      const Value::List& betas = group.sequence(template_value.key);
      if (betas.size() != 2) {
        state_error(ErrorCode::state_value_invalid, path, " has ", betas.size(), " items, expected 2");
      }
      value = std::array<double, 2>{read_beta(betas[0], path + "[0]"), read_beta(betas[1], path + "[1]")};
    }
    values.push_back({template_value.key, value});
  }
  return values;
}

void check_python_flag(const state::FieldReader& group, const PythonFlag& flag, OptimizerKind kind) {
  if (!group.has(flag.key)) return;
  const Value& value = group.required(flag.key);
  if (flag.implemented == PythonFlag::Implemented::off_or_none && value.is_none()) return;
  if (!value.is_bool()) {
    state_error(ErrorCode::state_type_invalid, group.path_of(flag.key), " is a ", value_kind_name(value.kind()),
                ", not a bool");
  }
  const bool implemented = flag.implemented == PythonFlag::Implemented::on;
  if (value.as_bool() != implemented) {
    state_error(ErrorCode::state_value_invalid, group.path_of(flag.key), " is ", value.as_bool() ? "True" : "False",
                "; LibTorch's ", kind_name(kind), " implements only ", flag.key, "=",
                flag.implemented == PythonFlag::Implemented::off_or_none ? "None or False"
                : implemented                                             ? "True"
                                                                          : "False");
  }
}

void check_group_keys(const state::FieldReader& group, const Hyperparameters& live,
                      const std::vector<PythonFlag>& flags) {
  for (const auto& [key, value] : group.dict()) {
    if (key.is_string()) {
      const std::string& name = key.as_string();
      const bool known = name == "params" ||
                         std::any_of(live.begin(), live.end(), [&](const auto& h) { return h.key == name; }) ||
                         std::any_of(flags.begin(), flags.end(), [&](const auto& f) { return f.key == name; }) ||
                         std::any_of(kSchedulerKeys.begin(), kSchedulerKeys.end(),
                                     [&](const SchedulerKey& k) { return k.key == name; });
      if (known) continue;
    }
    state_error(ErrorCode::state_key_unknown, group.path(), " has an unexpected key ", key.to_string());
  }
}

std::string group_path(const std::string& name, std::size_t g) {
  return detail::concat(name, ".param_groups[", g, "]");
}

// The new options and state, built before anything live changes.
struct RestoredState {
  std::vector<std::unique_ptr<OptimizerOptions>> group_options;
  std::vector<SchedulerGroupKeys> scheduler_keys;
  std::vector<std::unique_ptr<OptimizerParamState>> param_states;  // by parameter index
};

RestoredState read_state(const std::string& name, const Optimizer& optimizer, const Value& state, bool materialize) {
  const OptimizerKind kind = kind_of(optimizer);
  const state::FieldReader top(state, name);
  top.allow_only({"state", "param_groups"});
  const Value::List& groups = top.sequence("param_groups");
  const state::FieldReader entries = top.child("state");
  const auto& live_groups = optimizer.param_groups();

  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].is_dict()) continue;  // reported below with its path
    const std::optional<OptimizerKind> implied = implied_kind(groups[g].as_dict());
    if (implied && *implied != kind) {
      state_error(ErrorCode::state_structure_mismatch, group_path(name, g), " has the keys of ", kind_name(*implied),
                  " parameter groups; the live optimizer is ", kind_name(kind));
    }
  }
  if (groups.size() != live_groups.size()) {
    state_error(ErrorCode::state_structure_mismatch, name, ".param_groups has ", groups.size(),
                " groups; the live optimizer has ", live_groups.size());
  }

  RestoredState restored;
  std::vector<const OptimizerOptions*> options_of_param;
  std::vector<const at::Tensor*> params;
  const std::vector<PythonFlag> flags = python_flags(kind);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const state::FieldReader group(groups[g], group_path(name, g));
    const Hyperparameters live = hyperparameters_of(kind, live_groups[g].options());
    check_group_keys(group, live, flags);
    const Hyperparameters values = read_hyperparameters(group, live);
    if (kind == OptimizerKind::sgd && flag_in(values, "nesterov") &&
        !(number_in(values, "momentum") > 0 && number_in(values, "dampening") == 0)) {
      state_error(ErrorCode::state_value_invalid, group.path_of("nesterov"),
                  " is True, which needs momentum > 0 and dampening 0");
    }
    for (const PythonFlag& flag : flags) check_python_flag(group, flag, kind);
    SchedulerGroupKeys scheduler_keys;
    for (const auto& [key, slot] : kSchedulerKeys) {
      if (!group.has(key)) continue;
      const double value = group.number(key);
      check_hyperparameter_range(key, value, group.path_of(key));
      scheduler_keys.*slot = value;
    }

    const Value::List& indices = group.sequence("params");
    const auto& live_params = live_groups[g].params();
    if (indices.size() != live_params.size()) {
      state_error(ErrorCode::state_structure_mismatch, group.path_of("params"), " lists ", indices.size(),
                  " parameters; the live group has ", live_params.size());
    }
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::string path = detail::concat(group.path_of("params"), "[", i, "]");
      if (!indices[i].is_int()) {
        state_error(ErrorCode::state_type_invalid, path, " is a ", value_kind_name(indices[i].kind()), ", not an int");
      }
      const auto expected = static_cast<std::int64_t>(params.size());
      if (indices[i].as_int() != expected) {
        state_error(ErrorCode::state_structure_mismatch, path, " = ", indices[i].as_int(), ", expected ", expected,
                    " (indices count 0, 1, ... across the groups in order)");
      }
      params.push_back(&live_params[i]);
    }
    restored.group_options.push_back(options_from(kind, values));
    restored.scheduler_keys.push_back(scheduler_keys);
    options_of_param.insert(options_of_param.end(), live_params.size(), restored.group_options.back().get());
  }

  restored.param_states.resize(params.size());
  std::vector<bool> has_entry(params.size(), false);
  for (const auto& [key, entry] : entries.dict()) {
    if (!key.is_integer()) {
      state_error(ErrorCode::state_type_invalid, entries.path(), " key ", key.to_string(),
                  " is a str, not an int parameter index");
    }
    const std::int64_t index = key.as_int();
    if (index < 0 || index >= static_cast<std::int64_t>(params.size())) {
      state_error(ErrorCode::state_key_unknown, entries.path(), " has an entry for parameter ", index,
                  "; the live optimizer has ", params.size(), " parameters");
    }
    const auto i = static_cast<std::size_t>(index);
    const ParamStateReader reader(entry, detail::concat(entries.path(), "[", index, "]"), *params[i], materialize);
    restored.param_states[i] = read_param_state(kind, *options_of_param[i], reader);
    has_entry[i] = true;
  }
  if (kind == OptimizerKind::adagrad) {
    // LibTorch's Adagrad creates state for every parameter at construction and
    // its step() dereferences it unchecked; Python's does the same.
    const auto missing = std::find(has_entry.begin(), has_entry.end(), false);
    if (missing != has_entry.end()) {
      state_error(ErrorCode::state_key_missing, entries.path(), " has no entry for parameter ",
                  missing - has_entry.begin(), " (Adagrad keeps state for every parameter)");
    }
  }
  return restored;
}

void check_scheduler_value(const std::optional<double>& value, std::size_t g, std::string_view key) {
  if (value && !(std::isfinite(*value) && *value >= 0)) {
    detail::fail(ErrorCode::invalid_argument, "scheduler key ", key, " of group ", g, " = ", *value,
                 " is not a finite value >= 0");
  }
}

}  // namespace

OptimizerState::OptimizerState(std::string name, torch::optim::Optimizer& optimizer)
    : name_(std::move(name)), optimizer_(&optimizer) {
  kind_of(optimizer);
  scheduler_keys_.resize(optimizer.param_groups().size());
}

Value OptimizerState::capture(CaptureMode mode) const {
  const OptimizerKind kind = kind_of(*optimizer_);
  const LibTorchState& live_state = optimizer_->state();
  Dict entries;
  Value::List groups;
  std::int64_t index = 0;
  const auto& live_groups = optimizer_->param_groups();
  for (std::size_t g = 0; g < live_groups.size(); ++g) {
    Dict group;
    for (const NamedHyperparameter& value : hyperparameters_of(kind, live_groups[g].options())) {
      group.insert(std::string(value.key), hyperparameter_value(value.value));
    }
    for (const PythonFlag& flag : python_flags(kind)) group.insert(std::string(flag.key), implied_flag_value(flag));
    if (g < scheduler_keys_.size()) {
      for (const auto& [key, slot] : kSchedulerKeys) {
        const std::optional<double>& value = scheduler_keys_[g].*slot;
        if (value) group.insert(std::string(key), Value::floating(*value));
      }
    }
    Value::List indices;
    for (const at::Tensor& param : live_groups[g].params()) {
      const auto found = live_state.find(state_key(param));
      if (found != live_state.end()) entries.insert(DictKey(index), capture_param_state(kind, *found->second, mode));
      indices.push_back(Value::integer(index++));
    }
    group.insert("params", Value::list(std::move(indices)));
    groups.push_back(Value::dict(std::move(group)));
  }
  Dict root;
  root.insert("state", Value::dict(std::move(entries)));
  root.insert("param_groups", Value::list(std::move(groups)));
  return Value::dict(std::move(root));
}

void OptimizerState::validate(const Value& state) const { read_state(name_, *optimizer_, state, false); }

void OptimizerState::apply(const Value& state) { stage(state)(); }

std::function<void()> OptimizerState::stage(const Value& state) {
  struct Staged {
    OptimizerKind kind;
    RestoredState restored;
    LibTorchState new_state;
  };
  auto staged = std::make_shared<Staged>();
  staged->kind = kind_of(*optimizer_);
  staged->restored = read_state(name_, *optimizer_, state, true);
  std::size_t index = 0;
  for (const auto& group : optimizer_->param_groups()) {
    for (const at::Tensor& param : group.params()) {
      if (staged->restored.param_states[index]) {
        staged->new_state.emplace(state_key(param), std::move(staged->restored.param_states[index]));
      }
      ++index;
    }
  }
  // Nothing in the step can throw: the live optimizer changes all at once or not at all.
  return [this, staged] {
    auto& groups = optimizer_->param_groups();
    for (std::size_t g = 0; g < groups.size(); ++g) {
      assign_options(staged->kind, groups[g].options(), *staged->restored.group_options[g]);
    }
    // Replaces the whole map: entries left from parameters no longer in the
    // optimizer would otherwise match a new TensorImpl at a reused address.
    optimizer_->state() = std::move(staged->new_state);
    scheduler_keys_ = std::move(staged->restored.scheduler_keys);
  };
}

void OptimizerState::set_scheduler_group_keys(std::vector<SchedulerGroupKeys> keys) {
  if (keys.size() != optimizer_->param_groups().size()) {
    detail::fail(ErrorCode::invalid_argument, "got scheduler keys for ", keys.size(), " groups; the optimizer has ",
                 optimizer_->param_groups().size());
  }
  for (std::size_t g = 0; g < keys.size(); ++g) {
    for (const auto& [key, slot] : kSchedulerKeys) check_scheduler_value(keys[g].*slot, g, key);
  }
  scheduler_keys_ = std::move(keys);
}

Value optimizer_config(const torch::optim::Optimizer& optimizer) {
  const OptimizerKind kind = kind_of(optimizer);
  const auto values_of = [&](const OptimizerOptions& options, bool with_lr) {
    Dict values;
    for (const NamedHyperparameter& value : hyperparameters_of(kind, options)) {
      if (!with_lr && value.key == "lr") continue;
      values.insert(std::string(value.key), hyperparameter_value(value.value));
    }
    return values;
  };
  Value::List groups;
  Value::List initial_lrs;
  for (const auto& group : optimizer.param_groups()) {
    Dict values = values_of(group.options(), false);
    values.insert("param_count", Value::integer(static_cast<std::int64_t>(group.params().size())));
    groups.push_back(Value::dict(std::move(values)));
    initial_lrs.push_back(Value::floating(group.options().get_lr()));
  }
  Dict config;
  config.insert("type", Value::string(std::string(kind_name(kind))));
  config.insert("defaults", Value::dict(values_of(optimizer.defaults(), true)));
  config.insert("groups", Value::list(std::move(groups)));
  config.insert("initial_lrs", Value::list(std::move(initial_lrs)));
  return Value::dict(std::move(config));
}

}  // namespace holdpoint
