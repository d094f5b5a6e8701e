// OptimizerState: LibTorch optimizers saved in PyTorch's state_dict layout.
//
// - Round trips through real files: a run interrupted, saved, loaded into a
//   fresh model and optimizer and resumed is bit-identical to the
//   uninterrupted run, for every supported optimizer and variant.
// - Poison tests: every rejected state has its own code, and neither validate
//   nor apply changes the live optimizer or parameters when it rejects.
// - Python (torch 2.13) as the oracle: key names, order and kinds match its
//   own state_dict; a state written here (in the default and the
//   torch-1.13-compatible mode) loads into torch.optim.*.load_state_dict and
//   takes the same next step, bit for bit; and a state Python wrote with
//   torch.save loads here through the untrusted reader and takes the same
//   next step, bit for bit (SGD, Adagrad, RMSprop) or up to the rounding of
//   Python's lerp_ where LibTorch multiplies and adds (Adam, AdamW, centered
//   RMSprop; see allowed_ulps).
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <span>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "state/tensor_state.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;
using torch::optim::Optimizer;
using torch::optim::OptimizerParamGroup;

// ==== a small model and its training loop ====================================================

// Two layers, plus a parameter the loss never uses: LibTorch gives it no
// per-parameter state, which the layout must preserve ("never stepped").
struct Model {
  std::vector<at::Tensor> params;  // w1 [4,3], b1 [4], w2 [2,4], b2 [2], unused [3]
};

at::Tensor deterministic(at::IntArrayRef sizes, double phase) {
  const std::int64_t numel = c10::multiply_integers(sizes);
  return (at::arange(numel, at::kFloat) * 0.37 + phase).sin().mul(0.5).reshape(sizes);
}

Model make_model(double phase) {
  Model model;
  for (const auto& sizes : std::vector<std::vector<std::int64_t>>{{4, 3}, {4}, {2, 4}, {2}, {3}}) {
    model.params.push_back(deterministic(sizes, phase).requires_grad_(true));
    phase += 1.0;
  }
  return model;
}

// `touch_all` adds the unused parameter to the loss, so that it gets state too.
void train_step(Optimizer& optimizer, const Model& model, int step, bool touch_all = false) {
  optimizer.zero_grad();
  const at::Tensor x = (at::arange(8 * 3, at::kFloat) * 0.11 + step).cos().reshape({8, 3});
  const at::Tensor y = (at::arange(8 * 2, at::kFloat) * 0.07 - step).sin().reshape({8, 2});
  const auto& p = model.params;
  const at::Tensor hidden = (x.matmul(p[0].t()) + p[1]).tanh();
  at::Tensor loss = (hidden.matmul(p[2].t()) + p[3] - y).pow(2).mean();
  if (touch_all) loss = loss + p[4].pow(2).sum();
  loss.backward();
  optimizer.step();
}

// Gradients are not optimizer state; a resumed run starts without them.
void clear_grads(Model& model) {
  for (at::Tensor& param : model.params) param.mutable_grad() = at::Tensor();
}

Value params_value(const Model& model, CaptureMode mode) {
  Value::List items;
  for (const at::Tensor& param : model.params) items.push_back(state::capture_tensor(param, mode));
  return Value::list(std::move(items));
}

std::vector<OptimizerParamGroup> one_group(const std::vector<at::Tensor>& params) {
  return {OptimizerParamGroup(params)};
}

// ==== optimizers under test ===================================================================

using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(const std::vector<at::Tensor>&, double lr_scale)>;

struct OptimizerCase {
  std::string name;
  // `lr_scale` != 1 builds the "wrong" fresh optimizer a resume must correct.
  OptimizerFactory make;
};

std::vector<OptimizerCase> optimizer_cases() {
  using namespace torch::optim;
  return {
      {"SgdPlain", [](const auto& p, double s) { return std::make_unique<SGD>(one_group(p), SGDOptions(0.1 * s)); }},
      {"SgdMomentumNesterov",
       [](const auto& p, double s) {
         return std::make_unique<SGD>(one_group(p), SGDOptions(0.05 * s).momentum(0.9).nesterov(true).weight_decay(0.01));
       }},
      {"SgdMomentumDampening",
       [](const auto& p, double s) {
         return std::make_unique<SGD>(one_group(p), SGDOptions(0.05 * s).momentum(0.8).dampening(0.1));
       }},
      {"Adam", [](const auto& p, double s) { return std::make_unique<Adam>(one_group(p), AdamOptions(0.01 * s)); }},
      {"AdamAmsgrad",
       [](const auto& p, double s) {
         return std::make_unique<Adam>(one_group(p),
                                       AdamOptions(0.01 * s).amsgrad(true).weight_decay(0.02).betas({0.8, 0.99}));
       }},
      {"AdamW", [](const auto& p, double s) { return std::make_unique<AdamW>(one_group(p), AdamWOptions(0.01 * s)); }},
      {"AdamWAmsgrad",
       [](const auto& p, double s) {
         return std::make_unique<AdamW>(one_group(p), AdamWOptions(0.01 * s).amsgrad(true));
       }},
      {"RmspropPlain",
       [](const auto& p, double s) { return std::make_unique<RMSprop>(one_group(p), RMSpropOptions(0.01 * s)); }},
      {"RmspropCenteredMomentum",
       [](const auto& p, double s) {
         return std::make_unique<RMSprop>(one_group(p),
                                          RMSpropOptions(0.01 * s).centered(true).momentum(0.5).weight_decay(0.01));
       }},
      {"Adagrad",
       [](const auto& p, double s) {
         return std::make_unique<Adagrad>(one_group(p),
                                          AdagradOptions(0.1 * s).lr_decay(0.01).initial_accumulator_value(0.1));
       }},
      {"AdamTwoGroups",
       [](const auto& p, double s) {
         std::vector<OptimizerParamGroup> groups;
         groups.emplace_back(std::vector<at::Tensor>{p[0], p[1]}, std::make_unique<AdamOptions>(AdamOptions(0.01 * s)));
         groups.emplace_back(std::vector<at::Tensor>{p[2], p[3], p[4]},
                             std::make_unique<AdamOptions>(AdamOptions(0.05 * s).betas({0.85, 0.995})));
         return std::make_unique<Adam>(std::move(groups), AdamOptions(0.001));
       }},
  };
}

// gtest prints a test parameter that fails; the name says which one.
void PrintTo(const OptimizerCase& c, std::ostream* os) { *os << c.name; }

::testing::AssertionResult same_content(const Value& expected, const Value& actual) {
  const std::string difference = describe_difference(expected, actual);
  if (difference.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << difference;
}

// ==== round trips =============================================================================

class OptimizerRoundTrip : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(OptimizerRoundTrip, ResumedRunIsBitIdenticalToTheUninterruptedRun) {
  const OptimizerCase& c = GetParam();
  Model uninterrupted = make_model(0.0);
  const auto optimizer_a = c.make(uninterrupted.params, 1.0);
  OptimizerState state_a("optimizer", *optimizer_a);
  for (int step = 0; step < 4; ++step) train_step(*optimizer_a, uninterrupted, step);

  TempDir dir;
  Dict root;
  root.insert("model", params_value(uninterrupted, CaptureMode::reference));
  root.insert("optimizer", state_a.capture(CaptureMode::reference));
  save_mapping(dir / "checkpoint.pt", Value::dict(std::move(root)), {.durable = false});
  const LoadedMapping loaded = load_checkpoint_mapping(dir / "checkpoint.pt");

  // A fresh run with other parameter values, other lrs and state for every
  // parameter (the unused one included): apply must replace all of it.
  Model resumed = make_model(1.5);
  const auto optimizer_b = c.make(resumed.params, 3.0);
  for (int step = 0; step < 2; ++step) train_step(*optimizer_b, resumed, 100 + step, true);
  clear_grads(resumed);
  OptimizerState state_b("optimizer", *optimizer_b);
  const Value::List& saved_params = loaded.root.as_dict().at("model").as_list();
  for (std::size_t i = 0; i < resumed.params.size(); ++i) state::copy_into(resumed.params[i], saved_params[i].as_tensor());
  const Value& saved_optimizer = loaded.root.as_dict().at("optimizer");
  state_b.validate(saved_optimizer);
  state_b.apply(saved_optimizer);
  ASSERT_TRUE(same_content(state_a.capture(CaptureMode::copy), state_b.capture(CaptureMode::copy)));

  for (int step = 4; step < 9; ++step) {
    train_step(*optimizer_a, uninterrupted, step);
    train_step(*optimizer_b, resumed, step);
  }
  EXPECT_TRUE(same_content(params_value(uninterrupted, CaptureMode::copy), params_value(resumed, CaptureMode::copy)));
  EXPECT_TRUE(same_content(state_a.capture(CaptureMode::copy), state_b.capture(CaptureMode::copy)));
}

TEST_P(OptimizerRoundTrip, AppliedTensorsAreFreshNotViewsOfTheFile) {
  const OptimizerCase& c = GetParam();
  Model model = make_model(0.0);
  const auto optimizer = c.make(model.params, 1.0);
  for (int step = 0; step < 2; ++step) train_step(*optimizer, model, step);
  OptimizerState component("optimizer", *optimizer);
  const Value snapshot = deep_copy(component.capture(CaptureMode::copy));
  component.apply(snapshot);
  const Value before = component.capture(CaptureMode::copy);
  train_step(*optimizer, model, 2);
  // Had apply kept views into `snapshot`, the step would have written into it.
  EXPECT_TRUE(same_content(before, snapshot));
}

INSTANTIATE_TEST_SUITE_P(EveryOptimizer, OptimizerRoundTrip, ::testing::ValuesIn(optimizer_cases()),
                         [](const auto& info) { return info.param.name; });

// ==== layout ==================================================================================

std::vector<std::string> keys_of(const Value& dict) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : dict.as_dict()) keys.push_back(key.to_string());
  return keys;
}

TEST(OptimizerStateLayout, StateIsKeyedByParameterIndexAcrossGroups) {
  Model model = make_model(0.0);
  const auto optimizer = optimizer_cases().back().make(model.params, 1.0);  // AdamTwoGroups
  for (int step = 0; step < 3; ++step) train_step(*optimizer, model, step);
  const Value state = OptimizerState("optimizer", *optimizer).capture(CaptureMode::reference);
  EXPECT_EQ(keys_of(state), (std::vector<std::string>{"'state'", "'param_groups'"}));
  // Parameter 4 was never stepped: no entry, as in Python.
  EXPECT_EQ(keys_of(state.as_dict().at("state")), (std::vector<std::string>{"0", "1", "2", "3"}));
  const Value::List& groups = state.as_dict().at("param_groups").as_list();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(same_content(groups[0].as_dict().at("params"), Value::list({Value::integer(0), Value::integer(1)})));
  EXPECT_TRUE(same_content(groups[1].as_dict().at("params"),
                           Value::list({Value::integer(2), Value::integer(3), Value::integer(4)})));
  EXPECT_EQ(groups[1].as_dict().at("lr").as_double(), 0.05);
  const TensorData& step = state.as_dict().at("state").as_dict().at(DictKey(2)).as_dict().at("step").as_tensor();
  EXPECT_EQ(step.dtype, DType::float32);
  EXPECT_TRUE(step.sizes.empty());
  EXPECT_EQ(step.storage->nbytes(), 4u);
}

TEST(OptimizerStateLayout, StepsAbove2To24AreWrittenAsFloat64AndRestoredExactly) {
  // float32 cannot count past 2^24 by one; the step must survive exactly.
  Model model = make_model(0.0);
  torch::optim::Adam source(one_group(model.params), torch::optim::AdamOptions(0.01));
  train_step(source, model, 0);
  const std::int64_t big_step = (std::int64_t{1} << 24) + 1;
  for (auto& [key, param_state] : source.state()) static_cast<torch::optim::AdamParamState&>(*param_state).step(big_step);
  const Value captured = OptimizerState("optimizer", source).capture(CaptureMode::reference);
  const TensorData& step = captured.as_dict().at("state").as_dict().at(DictKey(0)).as_dict().at("step").as_tensor();
  EXPECT_EQ(step.dtype, DType::float64);

  torch::optim::Adam target(one_group(model.params), torch::optim::AdamOptions(0.01));
  OptimizerState("optimizer", target).apply(captured);
  // The key type of LibTorch's state map changed in 2.2; every entry must carry the step.
  EXPECT_EQ(target.state().size(), source.state().size());
  for (const auto& [key, param_state] : target.state()) {
    EXPECT_EQ(static_cast<const torch::optim::AdamParamState&>(*param_state).step(), big_step);
  }
}

TEST(OptimizerStateLayout, SchedulerGroupKeysRoundTripAndOthersAreRejected) {
  Model model = make_model(0.0);
  torch::optim::SGD source(one_group(model.params), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_step(source, model, 0);
  OptimizerState source_state("optimizer", source);
  source_state.set_scheduler_group_keys({{.initial_lr = 0.1, .max_lr = 0.4, .min_lr = 1e-5}});
  const Value captured = source_state.capture(CaptureMode::reference);
  EXPECT_EQ(keys_of(captured.as_dict().at("param_groups").as_list()[0]),
            (std::vector<std::string>{"'lr'", "'momentum'", "'dampening'", "'weight_decay'", "'nesterov'",
                                      "'maximize'", "'foreach'", "'differentiable'", "'fused'", "'initial_lr'",
                                      "'max_lr'", "'min_lr'", "'params'"}));

  torch::optim::SGD target(one_group(model.params), torch::optim::SGDOptions(0.1).momentum(0.9));
  OptimizerState target_state("optimizer", target);
  target_state.apply(captured);
  EXPECT_EQ(target_state.scheduler_group_keys(), source_state.scheduler_group_keys());
  EXPECT_TRUE(same_content(captured, target_state.capture(CaptureMode::reference)));

  EXPECT_ERROR_CODE(source_state.set_scheduler_group_keys({}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(source_state.set_scheduler_group_keys({{.initial_lr = -1.0}}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(source_state.set_scheduler_group_keys({{.max_lr = std::nan("")}}), ErrorCode::invalid_argument);
}

TEST(OptimizerStateLayout, PythonSgdNoneMomentumBufferMeansNoState) {
  // Python's SGD writes {'momentum_buffer': None} for parameters stepped
  // without momentum, and ints where its defaults are ints.
  Model model = make_model(0.0);
  torch::optim::SGD optimizer(one_group(model.params), torch::optim::SGDOptions(0.1).momentum(0.9));
  train_step(optimizer, model, 0);
  OptimizerState component("optimizer", optimizer);
  Dict group;
  group.insert("lr", Value::floating(0.1));
  group.insert("momentum", Value::integer(0));
  group.insert("dampening", Value::integer(0));
  group.insert("weight_decay", Value::integer(0));
  group.insert("nesterov", Value::boolean(false));
  group.insert("maximize", Value::boolean(false));
  group.insert("foreach", Value::none());
  group.insert("differentiable", Value::boolean(false));
  Value::List params;
  for (int i = 0; i < 5; ++i) params.push_back(Value::integer(i));
  group.insert("params", Value::list(std::move(params)));
  Dict entries;
  for (int i = 0; i < 4; ++i) {
    Dict entry;
    entry.insert("momentum_buffer", Value::none());
    entries.insert(DictKey(i), Value::dict(std::move(entry)));
  }
  Dict root;
  root.insert("state", Value::dict(std::move(entries)));
  root.insert("param_groups", Value::list({Value::dict(std::move(group))}));
  component.apply(Value::dict(std::move(root)));
  EXPECT_TRUE(optimizer.state().empty());
  EXPECT_EQ(static_cast<const torch::optim::SGDOptions&>(optimizer.param_groups()[0].options()).momentum(), 0.0);
}

TEST(OptimizerStateLayout, Torch113CompatibilityFilesRestoreTheSameState) {
  // That writer mode turns every float (lr, betas, ...) into a 0-d float64 tensor.
  Model model = make_model(0.0);
  const auto source = optimizer_cases().back().make(model.params, 1.0);  // AdamTwoGroups
  for (int step = 0; step < 3; ++step) train_step(*source, model, step);
  const Value captured = OptimizerState("optimizer", *source).capture(CaptureMode::reference);
  TempDir dir;
  save_mapping(dir / "optimizer.pt", captured, {.torch_1_13_compatible = true, .durable = false});
  const LoadedMapping loaded = load_checkpoint_mapping(dir / "optimizer.pt");
  ASSERT_TRUE(loaded.root.as_dict().at("param_groups").as_list()[0].as_dict().at("lr").is_tensor());

  const auto target = optimizer_cases().back().make(model.params, 3.0);
  OptimizerState target_state("optimizer", *target);
  target_state.apply(loaded.root);
  EXPECT_TRUE(same_content(captured, target_state.capture(CaptureMode::reference)));
}

TEST(OptimizerStateConstruction, RejectsOptimizersItDoesNotKnow) {
  Model model = make_model(0.0);
  torch::optim::LBFGS lbfgs(model.params, torch::optim::LBFGSOptions(1.0));
  EXPECT_ERROR_CODE((void)OptimizerState("optimizer", lbfgs), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE((void)optimizer_config(lbfgs), ErrorCode::invalid_argument);
}

TEST(OptimizerConfig, HoldsTypeDefaultsGroupsAndInitialLrs) {
  Model model = make_model(0.0);
  const auto optimizer = optimizer_cases().back().make(model.params, 1.0);  // AdamTwoGroups
  const Value config = optimizer_config(*optimizer);
  EXPECT_EQ(keys_of(config), (std::vector<std::string>{"'type'", "'defaults'", "'groups'", "'initial_lrs'"}));
  EXPECT_EQ(config.as_dict().at("type").as_string(), "Adam");
  const Dict& defaults = config.as_dict().at("defaults").as_dict();
  EXPECT_EQ(keys_of(config.as_dict().at("defaults")),
            (std::vector<std::string>{"'lr'", "'betas'", "'eps'", "'weight_decay'", "'amsgrad'"}));
  EXPECT_EQ(defaults.at("lr").as_double(), 0.001);
  const Value::List& groups = config.as_dict().at("groups").as_list();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(keys_of(groups[1]),
            (std::vector<std::string>{"'betas'", "'eps'", "'weight_decay'", "'amsgrad'", "'param_count'"}));
  EXPECT_EQ(groups[1].as_dict().at("param_count").as_int(), 3);
  EXPECT_EQ(groups[1].as_dict().at("betas").as_list()[0].as_double(), 0.85);
  EXPECT_TRUE(same_content(config.as_dict().at("initial_lrs"), Value::list({Value::floating(0.01), Value::floating(0.05)})));
  EXPECT_TRUE(same_content(contract_of(config), contract_of(deep_copy(config))));
}

// ==== poison tests ============================================================================

using Path = std::vector<DictKey>;
// Returns the replacement for the value at the end of a path (nullptr when the
// path names a new key), or nullopt to remove it.
using Edit = std::function<std::optional<Value>(const Value*)>;

// A copy of `node` with the value at `path` edited; untouched subtrees are shared.
// Integer path steps index lists and tuples and name integer dict keys.
Value edited(const Value& node, std::span<const DictKey> path, const Edit& edit) {
  const DictKey& head = path.front();
  const std::span<const DictKey> rest = path.subspan(1);
  const auto replace = [&](const Value* old) { return rest.empty() ? edit(old) : std::optional(edited(*old, rest, edit)); };
  if (node.is_dict()) {
    Dict out;
    bool found = false;
    for (const auto& [key, value] : node.as_dict()) {
      if (key == head) {
        found = true;
        if (auto replacement = replace(&value)) out.insert(key, *replacement);
      } else {
        out.insert(key, value);
      }
    }
    if (!found) {
      if (auto added = edit(nullptr)) out.insert(head, *added);
    }
    return node.is_ordered_dict() ? Value::ordered_dict(std::move(out)) : Value::dict(std::move(out));
  }
  const Value::List& items = node.as_list();
  Value::List out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (static_cast<std::int64_t>(i) == head.as_int()) {
      if (auto replacement = replace(&items[i])) out.push_back(*replacement);
    } else {
      out.push_back(items[i]);
    }
  }
  if (head.as_int() == static_cast<std::int64_t>(items.size())) {
    if (auto added = edit(nullptr)) out.push_back(*added);
  }
  return node.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value with(const Value& root, const Path& path, Value value) {
  return edited(root, path, [&](const Value*) { return std::optional(value); });
}
Value without(const Value& root, const Path& path) {
  return edited(root, path, [](const Value*) { return std::optional<Value>(); });
}

Value float_tensor(at::Tensor tensor) { return tensor_value(tensor.contiguous()); }

// An Adam optimizer over two groups (parameters 0-1 and 2-4; 4 never
// stepped), trained 3 steps; each test breaks its captured state one way.
class OptimizerStateRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_model(0.0);
    optimizer_ = optimizer_cases().back().make(model_.params, 1.0);  // AdamTwoGroups
    for (int step = 0; step < 3; ++step) train_step(*optimizer_, model_, step);
    component_ = std::make_unique<OptimizerState>("optimizer", *optimizer_);
    good_ = component_->capture(CaptureMode::copy);
  }

  // Both validate and apply must reject `bad` with `code` and leave the
  // optimizer and the parameters bit-identical.
  void expect_rejected(const Value& bad, ErrorCode code) {
    const Value optimizer_before = component_->capture(CaptureMode::copy);
    const Value params_before = params_value(model_, CaptureMode::copy);
    EXPECT_ERROR_CODE(component_->validate(bad), code);
    EXPECT_TRUE(same_content(optimizer_before, component_->capture(CaptureMode::copy))) << "after validate";
    EXPECT_ERROR_CODE(component_->apply(bad), code);
    EXPECT_TRUE(same_content(optimizer_before, component_->capture(CaptureMode::copy))) << "after apply";
    EXPECT_TRUE(same_content(params_before, params_value(model_, CaptureMode::copy)));
  }

  Model model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<OptimizerState> component_;
  Value good_;
};

TEST_F(OptimizerStateRejects, TheUnbrokenStateIsAccepted) {
  component_->validate(good_);
  component_->apply(good_);
  EXPECT_TRUE(same_content(good_, component_->capture(CaptureMode::copy)));
}

TEST_F(OptimizerStateRejects, MissingKeysAtEveryLevel) {
  for (const Path& path : std::vector<Path>{{"state"},
                                            {"param_groups"},
                                            {"param_groups", 0, "lr"},
                                            {"param_groups", 1, "betas"},
                                            {"param_groups", 0, "eps"},
                                            {"param_groups", 0, "amsgrad"},
                                            {"param_groups", 0, "params"},
                                            {"state", 0, "step"},
                                            {"state", 3, "exp_avg"},
                                            {"state", 1, "exp_avg_sq"}}) {
    SCOPED_TRACE(::testing::PrintToString(path.size()) + " steps, last " + path.back().to_string());
    expect_rejected(without(good_, path), ErrorCode::state_key_missing);
  }
}

TEST_F(OptimizerStateRejects, UnknownKeysAtEveryLevel) {
  for (const Path& path : std::vector<Path>{{"epoch"},
                                            {"param_groups", 0, "momentum"},
                                            {"param_groups", 1, "last_lr"},
                                            {"param_groups", 1, 7},
                                            {"state", 0, "momentum_buffer"},
                                            {"state", 5},
                                            {"state", -1}}) {
    SCOPED_TRACE(path.back().to_string());
    expect_rejected(with(good_, path, deep_copy(good_.as_dict().at("state").as_dict().at(DictKey(0)))),
                    ErrorCode::state_key_unknown);
  }
}

TEST_F(OptimizerStateRejects, AmsgradMismatchInEitherDirection) {
  const Value buffer = float_tensor(at::zeros({4, 3}));
  expect_rejected(with(good_, {"state", 0, "max_exp_avg_sq"}, buffer), ErrorCode::state_key_unknown);
  expect_rejected(with(good_, {"param_groups", 0, "amsgrad"}, Value::boolean(true)), ErrorCode::state_key_missing);
}

TEST_F(OptimizerStateRejects, WrongGroupCount) {
  const Value& groups = good_.as_dict().at("param_groups");
  expect_rejected(with(good_, {"param_groups", 2}, groups.as_list()[1]), ErrorCode::state_structure_mismatch);
  expect_rejected(without(good_, {"param_groups", 1}), ErrorCode::state_structure_mismatch);
  expect_rejected(with(good_, {"param_groups"}, Value::list()), ErrorCode::state_structure_mismatch);
}

TEST_F(OptimizerStateRejects, WrongParamCountOrIndexList) {
  const auto ints = [](std::initializer_list<std::int64_t> values) {
    Value::List items;
    for (std::int64_t v : values) items.push_back(Value::integer(v));
    return Value::list(std::move(items));
  };
  expect_rejected(with(good_, {"param_groups", 1, "params"}, ints({2, 3})), ErrorCode::state_structure_mismatch);
  expect_rejected(with(good_, {"param_groups", 0, "params"}, ints({0, 1, 2})), ErrorCode::state_structure_mismatch);
  expect_rejected(with(good_, {"param_groups", 0, "params"}, ints({1, 0})), ErrorCode::state_structure_mismatch);
  expect_rejected(with(good_, {"param_groups", 1, "params"}, ints({2, 3, 5})), ErrorCode::state_structure_mismatch);
  expect_rejected(with(good_, {"param_groups", 1, "params"}, ints({0, 1, 2})), ErrorCode::state_structure_mismatch);
  expect_rejected(with(good_, {"param_groups", 0, "params", 1}, Value::string("1")), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "params"}, Value::integer(0)), ErrorCode::state_type_invalid);
}

TEST_F(OptimizerStateRejects, WrongTensorShapeOrDtype) {
  expect_rejected(with(good_, {"state", 0, "exp_avg"}, float_tensor(at::zeros({3, 4}))),
                  ErrorCode::state_shape_mismatch);
  expect_rejected(with(good_, {"state", 1, "exp_avg_sq"}, float_tensor(at::zeros({1, 4}))),
                  ErrorCode::state_shape_mismatch);
  expect_rejected(with(good_, {"state", 2, "exp_avg"}, float_tensor(at::zeros({2, 4}, at::kDouble))),
                  ErrorCode::state_dtype_mismatch);
  expect_rejected(with(good_, {"state", 2, "exp_avg"}, Value::floating(0.0)), ErrorCode::state_type_invalid);
}

TEST_F(OptimizerStateRejects, BadSteps) {
  expect_rejected(with(good_, {"state", 0, "step"}, float_tensor(at::scalar_tensor(-1.0))),
                  ErrorCode::state_value_invalid);
  expect_rejected(with(good_, {"state", 0, "step"}, Value::integer(-1)), ErrorCode::state_value_invalid);
  expect_rejected(with(good_, {"state", 0, "step"}, float_tensor(at::scalar_tensor(2.5))),
                  ErrorCode::state_value_invalid);
  expect_rejected(with(good_, {"state", 0, "step"}, float_tensor(at::ones({1}))), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"state", 0, "step"}, Value::string("3")), ErrorCode::state_type_invalid);
}

TEST_F(OptimizerStateRejects, PythonFlagsLibTorchDoesNotImplement) {
  for (const char* flag : {"maximize", "foreach", "capturable", "differentiable", "fused"}) {
    SCOPED_TRACE(flag);
    expect_rejected(with(good_, {"param_groups", 1, flag}, Value::boolean(true)), ErrorCode::state_value_invalid);
  }
  expect_rejected(with(good_, {"param_groups", 0, "maximize"}, Value::integer(0)), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "capturable"}, Value::none()), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "fused"}, Value::string("yes")), ErrorCode::state_type_invalid);
  // Adam with decoupled weight decay is AdamW: another optimizer, not a flag.
  expect_rejected(with(good_, {"param_groups", 0, "decoupled_weight_decay"}, Value::boolean(true)),
                  ErrorCode::state_structure_mismatch);
}

// Files from older torch versions lack the flags added since (torch 1.13: no
// 'decoupled_weight_decay'; SGD without 'fused'); Python's load_state_dict
// fills each with its default, the one value LibTorch implements. Both
// None (torch 2.13) and False (torch 1.13) mean "not fused".
TEST_F(OptimizerStateRejects, FlagsOlderTorchVersionsDidNotWriteAreTheirDefaults) {
  // torch 1.13's Adam: every flag but decoupled_weight_decay. Older releases
  // lacked more of them; 'differentiable' and 'fused' still mark it as Adam.
  Value older = good_;
  for (const char* flag : {"maximize", "foreach", "capturable", "decoupled_weight_decay"}) {
    older = without(without(older, {"param_groups", 0, flag}), {"param_groups", 1, flag});
  }
  EXPECT_NO_THROW(component_->validate(older));
  EXPECT_NO_THROW(component_->validate(with(good_, {"param_groups", 0, "fused"}, Value::boolean(false))));
  component_->apply(older);
  EXPECT_TRUE(same_content(good_, component_->capture(CaptureMode::copy)));
}

TEST_F(OptimizerStateRejects, HyperparametersOfTheWrongTypeOrOutOfRange) {
  expect_rejected(with(good_, {"param_groups", 0, "lr"}, Value::string("0.01")), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "lr"}, Value::boolean(true)), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "amsgrad"}, Value::integer(0)), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "betas"}, Value::floating(0.9)), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0, "betas", 0}, Value::string("0.9")), ErrorCode::state_type_invalid);
  for (double bad : {-0.1, std::nan(""), std::numeric_limits<double>::infinity()}) {
    expect_rejected(with(good_, {"param_groups", 0, "lr"}, Value::floating(bad)), ErrorCode::state_value_invalid);
    expect_rejected(with(good_, {"param_groups", 1, "eps"}, Value::floating(bad)), ErrorCode::state_value_invalid);
    expect_rejected(with(good_, {"param_groups", 1, "weight_decay"}, Value::floating(bad)),
                    ErrorCode::state_value_invalid);
    expect_rejected(with(good_, {"param_groups", 0, "initial_lr"}, Value::floating(bad)),
                    ErrorCode::state_value_invalid);
  }
  // The torch 1.13 compatibility encoding of floats is range-checked too.
  expect_rejected(with(good_, {"param_groups", 0, "lr"}, float_tensor(at::scalar_tensor(-1.0, at::kDouble))),
                  ErrorCode::state_value_invalid);
  for (double bad : {1.0, -0.5, std::nan("")}) {
    expect_rejected(with(good_, {"param_groups", 0, "betas", 1}, Value::floating(bad)), ErrorCode::state_value_invalid);
  }
  expect_rejected(with(good_, {"param_groups", 0, "betas", 2}, Value::floating(0.5)), ErrorCode::state_value_invalid);
  expect_rejected(without(good_, {"param_groups", 0, "betas", 1}), ErrorCode::state_value_invalid);
}

TEST_F(OptimizerStateRejects, StateKeyedByStrInsteadOfInt) {
  Dict entries;
  for (const auto& [key, value] : good_.as_dict().at("state").as_dict()) entries.insert(std::to_string(key.as_int()), value);
  expect_rejected(with(good_, {"state"}, Value::dict(std::move(entries))), ErrorCode::state_type_invalid);
}

TEST_F(OptimizerStateRejects, ContainersOfTheWrongKind) {
  expect_rejected(Value::list(), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"state"}, Value::list()), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"state", 0}, Value::list()), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups"}, Value::dict()), ErrorCode::state_type_invalid);
  expect_rejected(with(good_, {"param_groups", 0}, Value::list()), ErrorCode::state_type_invalid);
}

TEST_F(OptimizerStateRejects, StateOfAnotherOptimizerType) {
  Model model = make_model(0.0);
  for (const OptimizerCase& c : optimizer_cases()) {
    if (c.name.rfind("Adam", 0) == 0) continue;
    SCOPED_TRACE(c.name);
    const auto other = c.make(model.params, 1.0);
    expect_rejected(OptimizerState("optimizer", *other).capture(CaptureMode::copy), ErrorCode::state_structure_mismatch);
  }
  // Adam and AdamW share their hyperparameter names; only Adam has 'differentiable' and 'fused'.
  const auto adamw = optimizer_cases()[5].make(model.params, 1.0);
  ASSERT_EQ(optimizer_cases()[5].name, "AdamW");
  expect_rejected(OptimizerState("optimizer", *adamw).capture(CaptureMode::copy), ErrorCode::state_structure_mismatch);
}

TEST(OptimizerStateRejectsOther, AdagradNeedsAnEntryForEveryParameter) {
  // LibTorch's Adagrad dereferences the state of every parameter unchecked.
  Model model = make_model(0.0);
  torch::optim::Adagrad optimizer(one_group(model.params), torch::optim::AdagradOptions(0.1));
  OptimizerState component("optimizer", optimizer);
  const Value good = component.capture(CaptureMode::copy);
  const Value before = component.capture(CaptureMode::copy);
  EXPECT_ERROR_CODE(component.apply(without(good, {"state", 4})), ErrorCode::state_key_missing);
  EXPECT_TRUE(same_content(before, component.capture(CaptureMode::copy)));
}

TEST(OptimizerStateRejectsOther, RmspropBuffersMustMatchMomentumAndCentered) {
  Model model = make_model(0.0);
  torch::optim::RMSprop optimizer(one_group(model.params), torch::optim::RMSpropOptions(0.01).momentum(0.5));
  train_step(optimizer, model, 0);
  OptimizerState component("optimizer", optimizer);
  const Value good = component.capture(CaptureMode::copy);
  const Value before = component.capture(CaptureMode::copy);
  EXPECT_ERROR_CODE(component.apply(with(good, {"param_groups", 0, "momentum"}, Value::floating(0.0))),
                    ErrorCode::state_key_unknown);
  EXPECT_ERROR_CODE(component.apply(with(good, {"param_groups", 0, "centered"}, Value::boolean(true))),
                    ErrorCode::state_key_missing);
  EXPECT_ERROR_CODE(component.apply(with(good, {"state", 0, "grad_avg"}, float_tensor(at::zeros({4, 3})))),
                    ErrorCode::state_key_unknown);
  EXPECT_ERROR_CODE(component.apply(with(good, {"state", 0, "step"}, Value::floating(-3.0))),
                    ErrorCode::state_value_invalid);
  EXPECT_TRUE(same_content(before, component.capture(CaptureMode::copy)));
}

TEST(OptimizerStateRejectsOther, SgdNesterovNeedsMomentumAndNoDampening) {
  Model model = make_model(0.0);
  torch::optim::SGD optimizer(one_group(model.params), torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  train_step(optimizer, model, 0);
  OptimizerState component("optimizer", optimizer);
  const Value good = component.capture(CaptureMode::copy);
  EXPECT_ERROR_CODE(component.validate(with(good, {"param_groups", 0, "dampening"}, Value::floating(0.1))),
                    ErrorCode::state_value_invalid);
  EXPECT_ERROR_CODE(component.validate(with(good, {"param_groups", 0, "momentum"}, Value::floating(0.0))),
                    ErrorCode::state_value_invalid);
  EXPECT_ERROR_CODE(component.validate(with(good, {"state", 0, "momentum_buffer"}, Value::integer(0))),
                    ErrorCode::state_type_invalid);
  EXPECT_ERROR_CODE(component.validate(with(good, {"state", 0}, Value::dict())), ErrorCode::state_key_missing);
}

// ==== Python as the oracle ====================================================================

// Runs `script` with the oracle Python (torch 2.13) and returns its output;
// a failing script fails the test.
std::optional<std::string> run_python(const TempDir& dir, const std::string& script, const std::string& args = "") {
  testing::write_file_bytes(dir / "oracle.py", testing::bytes_of(script));
  const auto run = testing::run_python(testing::oracle_python(), dir / "oracle.py", args);
  if (run.status != 0) ADD_FAILURE() << "python failed:\n" << run.output;
  return run.output;
}

// Each line: name|group keys|state keys|kind of 'step' (for parameter 0).
std::string layout_line(const std::string& name, const Value& state) {
  const auto join = [](const Value& dict) {
    std::string out;
    for (const auto& [key, value] : dict.as_dict()) out += (out.empty() ? "" : ",") + key.as_string();
    return out;
  };
  const Value& entry = state.as_dict().at("state").as_dict().at(DictKey(0));
  std::string step = "none";
  if (const Value* value = entry.as_dict().find("step")) {
    step = value->is_int() ? "int"
                           : "Tensor:" + std::string(dtype_name(value->as_tensor().dtype)) + ":" +
                                 std::to_string(value->as_tensor().sizes.size());
  }
  return name + "|" + join(state.as_dict().at("param_groups").as_list()[0]) + "|" + join(entry) + "|" + step + "\n";
}

TEST(OptimizerStatePython, KeyNamesOrderAndKindsMatchTorch) {
  TempDir dir;
  const auto output = run_python(dir, R"(
import torch
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
dtype_names = {torch.float32: 'float32', torch.float64: 'float64'}
def show(name, optimizer):
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
    sd = optimizer.state_dict()
    entry = sd['state'][0]
    step = entry.get('step')
    kind = 'none' if step is None else 'int' if isinstance(step, int) else 'Tensor:%s:%d' % (dtype_names[step.dtype], step.dim())
    print('%s|%s|%s|%s' % (name, ','.join(sd['param_groups'][0]), ','.join(entry), kind))
p = model.parameters
show('SgdMomentum', torch.optim.SGD(p(), lr=0.1, momentum=0.9))
show('Adam', torch.optim.Adam(p(), lr=0.01))
show('AdamAmsgrad', torch.optim.Adam(p(), lr=0.01, amsgrad=True))
show('AdamW', torch.optim.AdamW(p(), lr=0.01))
show('RmspropPlain', torch.optim.RMSprop(p(), lr=0.01))
show('RmspropCenteredMomentum', torch.optim.RMSprop(p(), lr=0.01, momentum=0.5, centered=True))
show('Adagrad', torch.optim.Adagrad(p(), lr=0.1))
)");
  ASSERT_TRUE(output);

  using namespace torch::optim;
  const std::vector<OptimizerCase> cases = {
      {"SgdMomentum", [](const auto& p, double) { return std::make_unique<SGD>(one_group(p), SGDOptions(0.1).momentum(0.9)); }},
      {"Adam", [](const auto& p, double) { return std::make_unique<Adam>(one_group(p), AdamOptions(0.01)); }},
      {"AdamAmsgrad",
       [](const auto& p, double) { return std::make_unique<Adam>(one_group(p), AdamOptions(0.01).amsgrad(true)); }},
      {"AdamW", [](const auto& p, double) { return std::make_unique<AdamW>(one_group(p), AdamWOptions(0.01)); }},
      {"RmspropPlain", [](const auto& p, double) { return std::make_unique<RMSprop>(one_group(p), RMSpropOptions(0.01)); }},
      {"RmspropCenteredMomentum",
       [](const auto& p, double) {
         return std::make_unique<RMSprop>(one_group(p), RMSpropOptions(0.01).momentum(0.5).centered(true));
       }},
      {"Adagrad", [](const auto& p, double) { return std::make_unique<Adagrad>(one_group(p), AdagradOptions(0.1)); }},
  };
  std::string expected;
  for (const OptimizerCase& c : cases) {
    Model model = make_model(0.0);
    const auto optimizer = c.make(model.params, 1.0);
    for (int step = 0; step < 2; ++step) train_step(*optimizer, model, step);
    expected += layout_line(c.name, OptimizerState("optimizer", *optimizer).capture(CaptureMode::reference));
  }
  EXPECT_EQ(*output, expected);
}

// The Python half of the cross-language step: for each line "name<TAB>constructor"
// of manifest.txt it loads <name>.pt (saved by C++), restores an nn.Linear and
// the optimizer with load_state_dict, takes one step with the gradients C++
// used, and saves the parameters and optimizer state to <name>.python.pt.
constexpr const char* kPythonStep = R"(
import sys, torch
folder = sys.argv[1]

def python_float(value):
    # holdpoint's torch 1.13 compatibility mode writes floats as 0-d float64
    # tensors (1.13's weights_only unpickler has no BINFLOAT). A tensor lr would
    # turn Python's step arithmetic into tensor arithmetic, so param_groups get
    # their floats back; state tensors ('step' included) stay as they are.
    if torch.is_tensor(value) and value.dim() == 0 and value.dtype == torch.float64:
        return value.item()
    if isinstance(value, tuple):
        return tuple(python_float(v) for v in value)
    return value

for line in open(folder + '/manifest.txt'):
    name, constructor = line.rstrip('\n').split('\t')
    saved = torch.load('%s/%s.pt' % (folder, name), weights_only=True)
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(saved['model'])
    optimizer = eval(constructor)  # deliberately other hyperparameters: the file's must win
    state = saved['optimizer']
    optimizer.load_state_dict({
        'state': state['state'],
        'param_groups': [{k: python_float(v) for k, v in g.items()} for g in state['param_groups']],
    })
    model.weight.grad = saved['grads']['weight'].clone()
    model.bias.grad = saved['grads']['bias'].clone()
    optimizer.step()
    torch.save({'weight': model.weight.detach(), 'bias': model.bias.detach(),
                'state': optimizer.state_dict()['state']}, '%s/%s.python.pt' % (folder, name))
print('ok')
)";

struct CrossLanguageCase {
  std::string name;
  OptimizerFactory make;  // over {weight, bias}
  std::string python_constructor;
};

// Python 2.x updates Adam's and AdamW's exp_avg and centered RMSprop's
// grad_avg with lerp_; LibTorch's C++ optimizers (2.13 as 1.13) with
// mul_().add_(), which rounds differently in the last bit or two. The state
// crosses the language boundary bit for bit (checked separately); the step
// after it is then equal up to that rounding, and bit for bit everywhere else.
// On the second configuration, LibTorch 1.13's Adagrad step also rounds
// differently (1 ulp seen) from torch 2.13's Python one; LibTorch 2.13's
// equals it bit for bit.
std::int64_t allowed_ulps(const std::string& name) {
  const bool lerp = name.rfind("Adam", 0) == 0 || name.rfind("RmspropCentered", 0) == 0;
  if (lerp) return 8;
  if (TORCH_VERSION_MAJOR < 2 && name.rfind("Adagrad", 0) == 0) return 4;
  return 0;
}

// Empty when the two trees are equal up to `ulps` units in the last place in
// every float32/float64 element and bit for bit elsewhere; else the first difference.
std::string ulp_difference(const Value& expected, const Value& actual, std::int64_t ulps, const std::string& path = "") {
  if (expected.kind() != actual.kind()) return path + ": kinds differ";
  if (expected.is_dict()) {
    if (expected.as_dict().size() != actual.as_dict().size()) return path + ": key counts differ";
    for (const auto& [key, value] : expected.as_dict()) {
      const Value* other = actual.as_dict().find(key);
      if (!other) return path + "[" + key.to_string() + "]: missing";
      const std::string difference = ulp_difference(value, *other, ulps, path + "[" + key.to_string() + "]");
      if (!difference.empty()) return difference;
    }
    return "";
  }
  if (!expected.is_tensor()) return describe_difference(expected, actual).empty() ? "" : path + ": values differ";
  const at::Tensor a = to_at_tensor(expected.as_tensor()).contiguous();
  const at::Tensor b = to_at_tensor(actual.as_tensor()).contiguous();
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return path + ": dtype or shape differ";
  if (a.scalar_type() != at::kFloat && a.scalar_type() != at::kDouble) {
    return at::equal(a, b) ? "" : path + ": elements differ";
  }
  // IEEE-754 bit patterns of finite values of one sign order like the values.
  const at::Tensor bits_a = a.scalar_type() == at::kFloat ? a.view(at::kInt).to(at::kLong) : a.view(at::kLong);
  const at::Tensor bits_b = b.scalar_type() == at::kFloat ? b.view(at::kInt).to(at::kLong) : b.view(at::kLong);
  const std::int64_t worst = (bits_a - bits_b).abs().max().item<std::int64_t>();
  const bool same_signs = at::equal(a.signbit(), b.signbit()) || ulps == 0;
  if (!same_signs || worst > ulps) {
    return path + ": " + std::to_string(worst) + " units in the last place apart (allowed " + std::to_string(ulps) +
           ")";
  }
  return "";
}

TEST(OptimizerStatePython, TorchOptimizersLoadTheStateAndTakeTheSameStepBitForBit) {
  using namespace torch::optim;
  const std::string single = "model.parameters()";
  const std::string two_groups = "[{'params': [model.weight]}, {'params': [model.bias]}]";
  const std::vector<CrossLanguageCase> cases = {
      {"Adam",
       [](const auto& p, double) {
         return std::make_unique<Adam>(one_group(p), AdamOptions(0.01).weight_decay(0.01).betas({0.8, 0.99}));
       },
       "torch.optim.Adam(" + single + ", lr=0.5)"},
      {"AdamAmsgradTwoGroups",
       [](const auto& p, double) {
         std::vector<OptimizerParamGroup> groups;
         groups.emplace_back(std::vector<at::Tensor>{p[0]}, std::make_unique<AdamOptions>(AdamOptions(0.02).amsgrad(true)));
         groups.emplace_back(std::vector<at::Tensor>{p[1]}, std::make_unique<AdamOptions>(AdamOptions(0.005).amsgrad(true)));
         return std::make_unique<Adam>(std::move(groups));
       },
       "torch.optim.Adam(" + two_groups + ", lr=0.5)"},
      {"SgdMomentum",
       [](const auto& p, double) {
         return std::make_unique<SGD>(one_group(p), SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(0.01));
       },
       "torch.optim.SGD(" + single + ", lr=0.5)"},
      {"AdamW", [](const auto& p, double) { return std::make_unique<AdamW>(one_group(p), AdamWOptions(0.01)); },
       "torch.optim.AdamW(" + single + ", lr=0.5)"},
      {"RmspropCenteredMomentum",
       [](const auto& p, double) {
         return std::make_unique<RMSprop>(one_group(p), RMSpropOptions(0.01).momentum(0.5).centered(true));
       },
       "torch.optim.RMSprop(" + single + ", lr=0.5)"},
      {"Adagrad",
       [](const auto& p, double) { return std::make_unique<Adagrad>(one_group(p), AdagradOptions(0.1).lr_decay(0.01)); },
       "torch.optim.Adagrad(" + single + ", lr=0.5)"},
  };

  TempDir dir;
  std::string manifest;
  const at::Tensor x = deterministic({4, 3}, 0.25);
  const at::Tensor y = deterministic({4, 2}, 2.5);
  std::vector<Value> expected;  // {weight, bias, state} after the C++ step
  for (const CrossLanguageCase& c : cases) {
    const std::vector<at::Tensor> params = {deterministic({2, 3}, 0.0).requires_grad_(true),
                                            deterministic({2}, 1.0).requires_grad_(true)};
    const auto optimizer = c.make(params, 1.0);
    OptimizerState component("optimizer", *optimizer);
    const auto compute_grads = [&](int step) {
      optimizer->zero_grad();
      (x.add(step).matmul(params[0].t()) + params[1] - y).pow(2).mean().backward();
    };
    for (int step = 0; step < 3; ++step) {
      compute_grads(step);
      optimizer->step();
    }
    compute_grads(3);
    Dict model;
    model.insert("weight", state::capture_tensor(params[0], CaptureMode::copy));
    model.insert("bias", state::capture_tensor(params[1], CaptureMode::copy));
    Dict grads;
    grads.insert("weight", state::capture_tensor(params[0].grad(), CaptureMode::copy));
    grads.insert("bias", state::capture_tensor(params[1].grad(), CaptureMode::copy));
    Dict root;
    root.insert("model", Value::dict(std::move(model)));
    root.insert("optimizer", component.capture(CaptureMode::copy));
    root.insert("grads", Value::dict(std::move(grads)));
    const Value file = Value::dict(std::move(root));
    for (const bool compatible : {false, true}) {
      const std::string file_name = c.name + (compatible ? "-compat" : "");
      save_mapping(dir / (file_name + ".pt"), file, {.torch_1_13_compatible = compatible, .durable = false});
      manifest += file_name + "\t" + c.python_constructor + "\n";
    }

    optimizer->step();
    Dict after;
    after.insert("weight", state::capture_tensor(params[0], CaptureMode::copy));
    after.insert("bias", state::capture_tensor(params[1], CaptureMode::copy));
    after.insert("state", component.capture(CaptureMode::copy).as_dict().at("state"));
    expected.push_back(Value::dict(std::move(after)));
  }
  testing::write_file_bytes(dir / "manifest.txt", testing::bytes_of(manifest));

  const auto output = run_python(dir, kPythonStep, dir.path().string());
  ASSERT_TRUE(output);
  ASSERT_EQ(*output, "ok\n");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    for (const char* suffix : {"", "-compat"}) {
      SCOPED_TRACE(cases[i].name + suffix);
      const LoadedMapping python = load_checkpoint_mapping(dir / (cases[i].name + suffix + ".python.pt"));
      EXPECT_EQ(ulp_difference(expected[i], python.root, allowed_ulps(cases[i].name)), "");
    }
  }
}

// The reverse direction: torch 2.13 trains three steps, saves model, optimizer
// state and the next gradients with plain torch.save (its own layout and
// encoding), then takes the fourth step itself. C++ loads the file through the
// untrusted reader into a fresh optimizer built with other hyperparameters
// (the file's must win), takes the fourth step, and must land on Python's
// parameters and state bit for bit.
constexpr const char* kPythonTrainsFirst = R"(
import sys, torch
folder = sys.argv[1]
x = (torch.arange(4 * 3, dtype=torch.float32) * 0.23 + 0.5).cos().reshape(4, 3)
y = (torch.arange(4 * 2, dtype=torch.float32) * 0.31).sin().reshape(4, 2)
def deterministic(shape, phase):
    n = 1
    for d in shape: n *= d
    return ((torch.arange(n, dtype=torch.float32) * 0.37 + phase).sin() * 0.5).reshape(shape)
for line in open(folder + '/manifest.txt'):
    name, constructor = line.rstrip('\n').split('\t')
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(deterministic((2, 3), 0.0))
        model.bias.copy_(deterministic((2,), 1.0))
    optimizer = eval(constructor)
    def grads(step):
        optimizer.zero_grad()
        ((x + step) @ model.weight.t() + model.bias - y).pow(2).mean().backward()
    for step in range(3):
        grads(step)
        optimizer.step()
    grads(3)
    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                'grads': {'weight': model.weight.grad, 'bias': model.bias.grad}},
               '%s/%s.python.pt' % (folder, name))
    optimizer.step()
    torch.save({'weight': model.weight.detach(), 'bias': model.bias.detach(),
                'state': optimizer.state_dict()['state']}, '%s/%s.after.pt' % (folder, name))
print('ok')
)";

TEST(OptimizerStatePython, TorchWrittenStateLoadsThroughTheUntrustedReaderAndTakesTheSameStep) {
  using namespace torch::optim;
  const std::string single = "model.parameters()";
  const std::string two_groups = "[{'params': [model.weight], 'lr': 0.02}, {'params': [model.bias]}]";
  const std::vector<CrossLanguageCase> cases = {
      {"SgdMomentumNesterov",
       [](const auto& p, double) { return std::make_unique<SGD>(one_group(p), SGDOptions(0.9)); },
       "torch.optim.SGD(" + single + ", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)"},
      {"SgdPlain", [](const auto& p, double) { return std::make_unique<SGD>(one_group(p), SGDOptions(0.9)); },
       "torch.optim.SGD(" + single + ", lr=0.1)"},
      {"Adam", [](const auto& p, double) { return std::make_unique<Adam>(one_group(p), AdamOptions(0.9)); },
       "torch.optim.Adam(" + single + ", lr=0.01, betas=(0.8, 0.99), weight_decay=0.01)"},
      {"AdamAmsgradTwoGroups",
       [](const auto& p, double) {
         std::vector<OptimizerParamGroup> groups;
         groups.emplace_back(std::vector<at::Tensor>{p[0]}, std::make_unique<AdamOptions>(AdamOptions(0.5).amsgrad(true)));
         groups.emplace_back(std::vector<at::Tensor>{p[1]}, std::make_unique<AdamOptions>(AdamOptions(0.5).amsgrad(true)));
         return std::make_unique<Adam>(std::move(groups));
       },
       "torch.optim.Adam(" + two_groups + ", lr=0.005, amsgrad=True)"},
      {"AdamW", [](const auto& p, double) { return std::make_unique<AdamW>(one_group(p), AdamWOptions(0.9)); },
       "torch.optim.AdamW(" + single + ", lr=0.01, weight_decay=0.05)"},
      {"RmspropCenteredMomentum",
       [](const auto& p, double) {
         return std::make_unique<RMSprop>(one_group(p), RMSpropOptions(0.9).momentum(0.5).centered(true));
       },
       "torch.optim.RMSprop(" + single + ", lr=0.01, momentum=0.5, centered=True)"},
      {"Adagrad", [](const auto& p, double) { return std::make_unique<Adagrad>(one_group(p), AdagradOptions(0.9)); },
       "torch.optim.Adagrad(" + single + ", lr=0.1, lr_decay=0.01)"},
  };
  TempDir dir;
  std::string manifest;
  for (const CrossLanguageCase& c : cases) manifest += c.name + "\t" + c.python_constructor + "\n";
  testing::write_file_bytes(dir / "manifest.txt", testing::bytes_of(manifest));
  const auto output = run_python(dir, kPythonTrainsFirst, dir.path().string());
  ASSERT_TRUE(output);
  ASSERT_EQ(*output, "ok\n");

  for (const CrossLanguageCase& c : cases) {
    SCOPED_TRACE(c.name);
    const LoadedMapping file = load_checkpoint_mapping(dir / (c.name + ".python.pt"));
    const Dict& root = file.root.as_dict();
    const std::vector<at::Tensor> params = {
        to_at_tensor(root.at("model").as_dict().at("weight").as_tensor()).clone().requires_grad_(true),
        to_at_tensor(root.at("model").as_dict().at("bias").as_tensor()).clone().requires_grad_(true)};
    const auto optimizer = c.make(params, 1.0);
    OptimizerState component("optimizer", *optimizer);
    ASSERT_NO_THROW(component.apply(root.at("optimizer")));
    // The per-parameter state Python wrote is now LibTorch's, bit for bit and in
    // Python's layout (its param_groups hold Python ints where LibTorch has doubles).
    EXPECT_TRUE(same_content(root.at("optimizer").as_dict().at("state"),
                             component.capture(CaptureMode::copy).as_dict().at("state")))
        << "loaded state";
    params[0].mutable_grad() = to_at_tensor(root.at("grads").as_dict().at("weight").as_tensor()).clone();
    params[1].mutable_grad() = to_at_tensor(root.at("grads").as_dict().at("bias").as_tensor()).clone();
    optimizer->step();

    const LoadedMapping python = load_checkpoint_mapping(dir / (c.name + ".after.pt"));
    const Dict& after = python.root.as_dict();
    const std::int64_t ulps = allowed_ulps(c.name);
    EXPECT_EQ(ulp_difference(after.at("weight"), state::capture_tensor(params[0], CaptureMode::copy), ulps), "")
        << "weight";
    EXPECT_EQ(ulp_difference(after.at("bias"), state::capture_tensor(params[1], CaptureMode::copy), ulps), "") << "bias";
    EXPECT_EQ(ulp_difference(after.at("state"), component.capture(CaptureMode::copy).as_dict().at("state"), ulps), "")
        << "optimizer state";
  }
}

}  // namespace
}  // namespace holdpoint
