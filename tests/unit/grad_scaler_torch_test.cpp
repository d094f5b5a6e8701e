// GradScaler on the CPU: a training loop whose injected inf gradient skips the
// step, backs the scale off and grows it again after growth_interval clean
// steps (scales checked against the documented rule, written out as
// literals); the float32 rounding of the update; misuse; resume through a
// file; every rejection with its code and no change; and torch 2.13's CPU
// GradScaler: its layout, and states continued step for step in both directions.
#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/grad_scaler.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using holdpoint::testing::TempDir;
namespace fs = std::filesystem;

at::Tensor initial_weights() { return at::tensor({0.5f, -1.0f, 2.0f, 0.25f}).set_requires_grad(true); }

// A squared error whose gradients are finite and non-zero.
at::Tensor loss_of(const at::Tensor& weights) {
  return weights.mul(at::tensor({1.0f, 2.0f, 3.0f, 4.0f})).sum().sub(1.0).pow(2);
}

void set_grad(const at::Tensor& param, float first) {
  param.mutable_grad() = at::ones({2});
  param.mutable_grad()[0].fill_(first);
}

TEST(GradScaler, InfGradientSkipsTheStepBacksOffThenGrowsAfterTheInterval) {
  at::Tensor weights = initial_weights();
  at::Tensor reference_weights = initial_weights();
  torch::optim::SGD optimizer({weights}, torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::optim::SGD reference({reference_weights}, torch::optim::SGDOptions(0.01).momentum(0.9));
  GradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});

  // The rule, step by step: clean steps count up to 3 and double the scale;
  // the inf at step 4 halves it and restarts the count.
  const std::vector<double> expected_scales = {1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048, 2048, 2048};
  const std::vector<std::int64_t> expected_trackers = {1, 2, 0, 1, 0, 1, 2, 0, 1, 2};
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    optimizer.zero_grad();
    scaler.scale(loss_of(weights)).backward();
    if (i == 4) {
      at::NoGradGuard no_grad;
      weights.grad()[0].fill_(std::numeric_limits<float>::infinity());
    }
    const at::Tensor before = weights.detach().clone();
    const bool stepped = scaler.step(optimizer);
    scaler.update();
    if (i == 4) {
      EXPECT_FALSE(stepped);
      EXPECT_TRUE(at::equal(weights, before));
    } else {
      // With a power-of-two scale, scaling and unscaling are exact: the step
      // equals an unscaled one bit for bit.
      reference.zero_grad();
      loss_of(reference_weights).backward();
      reference.step();
      EXPECT_TRUE(stepped);
      EXPECT_TRUE(at::equal(weights.grad(), reference_weights.grad()));
      EXPECT_TRUE(at::equal(weights, reference_weights));
    }
    EXPECT_EQ(scaler.get_scale(), expected_scales[i]);
    EXPECT_EQ(scaler.growth_tracker(), expected_trackers[i]);
  }
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(GradScaler, ScaledLossIsLossTimesTheFloat32ScaleTensor) {
  GradScaler scaler({.init_scale = 8.0});
  const at::Tensor loss = at::tensor({1.5f}).sum();
  const at::Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.scalar_type(), at::kFloat);
  EXPECT_EQ(scaled.sizes(), at::IntArrayRef({1}));  // broadcast with Python's 1-element scale
  EXPECT_EQ(scaled.item<float>(), 12.0f);
}

TEST(GradScaler, UpdateRoundsToFloat32AndNeverGrowsToInfinity) {
  at::Tensor param = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.0));
  GradScaler scaler({.init_scale = 3.0, .growth_factor = 1.1, .backoff_factor = 0.3, .growth_interval = 1});
  set_grad(param, 1.0f);
  scaler.step(optimizer);
  scaler.update();
  const float grown = static_cast<float>(static_cast<double>(3.0f) * 1.1);
  EXPECT_EQ(scaler.get_scale(), grown);
  set_grad(param, std::numeric_limits<float>::quiet_NaN());  // NaN counts as inf
  EXPECT_FALSE(scaler.step(optimizer));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<float>(static_cast<double>(grown) * 0.3));

  GradScaler near_max({.init_scale = 3e38, .growth_interval = 1});
  set_grad(param, 1.0f);
  near_max.step(optimizer);
  near_max.update();
  EXPECT_EQ(near_max.get_scale(), 3e38f);
  EXPECT_EQ(near_max.growth_tracker(), 0);
}

TEST(GradScaler, MisuseFailsWithItsCode) {
  at::Tensor param = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  EXPECT_ERROR_CODE(scaler.step(optimizer), ErrorCode::call_order_invalid);  // no gradients
  EXPECT_ERROR_CODE(scaler.update(), ErrorCode::call_order_invalid);         // nothing checked
  // Python would now be stuck (its failed step left the optimizer "unscaled");
  // holdpoint forgot the failed iteration.
  set_grad(param, 1.0f);
  scaler.unscale(optimizer);
  EXPECT_ERROR_CODE(scaler.unscale(optimizer), ErrorCode::call_order_invalid);
  scaler.step(optimizer);
  EXPECT_ERROR_CODE(scaler.step(optimizer), ErrorCode::call_order_invalid);
  EXPECT_ERROR_CODE(scaler.unscale(optimizer), ErrorCode::call_order_invalid);
  scaler.update();
  param.mutable_grad() = at::ones({2}, at::kHalf);
  EXPECT_ERROR_CODE(scaler.unscale(optimizer), ErrorCode::invalid_argument);

  EXPECT_ERROR_CODE(GradScaler({.growth_factor = 1.0}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(GradScaler({.backoff_factor = 1.0}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(GradScaler({.growth_interval = 0}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(GradScaler({.init_scale = 1e39}), ErrorCode::invalid_argument);
}

TEST(GradScaler, DisabledScalerPassesThroughAndHasNoState) {
  at::Tensor param = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.5));
  GradScaler scaler({.enabled = false});
  const at::Tensor loss = at::tensor({2.0f});
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  set_grad(param, 1.0f);
  EXPECT_TRUE(scaler.step(optimizer));
  scaler.update();
  EXPECT_EQ(param[0].item<float>(), 0.5f);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.capture(CaptureMode::copy).as_dict().empty());
  EXPECT_NO_THROW(scaler.validate(Value::dict()));
  EXPECT_ERROR_CODE(scaler.validate(GradScaler().capture(CaptureMode::copy)), ErrorCode::state_key_unknown);
  EXPECT_ERROR_CODE(GradScaler().validate(Value::dict()), ErrorCode::state_key_missing);
}

// Drives a scaler through updates with the given gradient pattern (true: inf).
void drive(GradScaler& scaler, torch::optim::Optimizer& optimizer, const at::Tensor& param,
           const std::vector<bool>& infs, std::vector<double>* scales = nullptr) {
  for (bool inf : infs) {
    set_grad(param, inf ? std::numeric_limits<float>::infinity() : 1.0f);
    scaler.step(optimizer);
    scaler.update();
    if (scales) scales->push_back(scaler.get_scale());
  }
}

TEST(GradScaler, ResumesMidIntervalThroughAFile) {
  const GradScalerOptions options{.init_scale = 256.0, .growth_factor = 1.5, .growth_interval = 4};
  const std::vector<bool> before_cut = {false, true, false, false, false, false, true, false, false};
  const std::vector<bool> after_cut = {false, false, true, false, false, false, false, false, false};
  at::Tensor param = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.0));

  GradScaler uninterrupted(options);
  drive(uninterrupted, optimizer, param, before_cut);
  std::vector<double> expected;
  GradScaler interrupted(options);
  drive(interrupted, optimizer, param, before_cut);
  ASSERT_EQ(interrupted.growth_tracker(), 2);
  drive(uninterrupted, optimizer, param, after_cut, &expected);

  TempDir directory;
  SaveOptions save;
  save.durable = false;
  save.torch_1_13_compatible = true;
  Dict root;
  root.insert("scaler", interrupted.capture(CaptureMode::reference));
  save_mapping(directory / "scaler.pt", Value::dict(std::move(root)), save);
  const Value state = load_checkpoint_mapping(directory / "scaler.pt").root.as_dict().at("scaler");

  GradScaler resumed(options);
  resumed.validate(state);
  resumed.apply(state);
  EXPECT_EQ(resumed.skipped_steps(), 2);
  std::vector<double> actual;
  drive(resumed, optimizer, param, after_cut, &actual);
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(describe_difference(uninterrupted.capture(CaptureMode::copy), resumed.capture(CaptureMode::copy)), "");
}

Value with_entry(const Value& state, const std::string& key, Value value) {
  Dict entries;
  for (const auto& [name, item] : state.as_dict()) entries.insert(name, name == DictKey(key) ? value : item);
  if (!entries.contains(key)) entries.insert(key, std::move(value));
  return Value::dict(std::move(entries));
}

Value without_entry(const Value& state, const std::string& key) {
  Dict entries;
  for (const auto& [name, item] : state.as_dict()) {
    if (!(name == DictKey(key))) entries.insert(name, item);
  }
  return Value::dict(std::move(entries));
}

TEST(GradScaler, RejectsInvalidStateAndChangesNothing) {
  at::Tensor param = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.0));
  const GradScalerOptions options{.init_scale = 64.0, .growth_interval = 5};
  GradScaler scaler(options);
  drive(scaler, optimizer, param, {false, true, false});
  GradScaler twin(options);
  drive(twin, optimizer, param, {false, false});
  const Value good = twin.capture(CaptureMode::copy);
  ASSERT_NO_THROW(scaler.validate(good));

  const Value before = scaler.capture(CaptureMode::copy);
  const auto rejected = [&](const Value& state, ErrorCode code) {
    EXPECT_ERROR_CODE(scaler.validate(state), code);
    EXPECT_EQ(describe_difference(before, scaler.capture(CaptureMode::copy)), "");
  };
  const double inf = std::numeric_limits<double>::infinity();
  rejected(with_entry(good, "scale", Value::floating(-64.0)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "scale", Value::floating(0.0)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "scale", Value::floating(std::nan(""))), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "scale", Value::floating(inf)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "scale", Value::floating(1e39)), ErrorCode::state_value_invalid);  // inf in float32
  rejected(with_entry(good, "scale", Value::string("64")), ErrorCode::state_type_invalid);
  rejected(with_entry(good, "_growth_tracker", Value::integer(5)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "_growth_tracker", Value::integer(-1)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "growth_interval", Value::integer(2000)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "growth_factor", Value::floating(4.0)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "backoff_factor", Value::floating(0.25)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "skipped_steps", Value::integer(-1)), ErrorCode::state_value_invalid);
  rejected(with_entry(good, "_scale", Value::floating(64.0)), ErrorCode::state_key_unknown);
  rejected(without_entry(good, "_growth_tracker"), ErrorCode::state_key_missing);
  rejected(Value::list(), ErrorCode::state_type_invalid);
}

// ---- Python's GradScaler (torch 2.13, the oracle) ----------------------------------------------------

using PythonResult = testing::PythonRun;

// Writes `script` to `script_path` and runs it with the oracle Python (torch 2.13).
PythonResult run_python(const fs::path& script_path, const std::string& script, const std::string& arguments) {
  std::ofstream(script_path) << script;
  return testing::run_python(testing::oracle_python(), script_path, arguments);
}

// torch 2.x's GradScaler runs on the CPU (torch.amp.GradScaler("cpu")), so
// both directions are checked on live scalers: a state saved mid-interval on
// one side continues on the other with the same scales and growth trackers,
// step for step, through the same pattern of inf and finite gradients.
const GradScalerOptions kInteropOptions{.init_scale = 1024.0, .growth_factor = 2.0, .growth_interval = 3};
const std::vector<bool> kBeforeCut = {false, false, true, false};
const std::vector<bool> kAfterCut = {false, false, false, true, false, false, false, false};

const char* const kPythonScaler = R"PY(
import sys, torch
BEFORE, AFTER = [False, False, True, False], [False, False, False, True, False, False, False, False]
param = torch.nn.Parameter(torch.ones(2))
optimizer = torch.optim.SGD([param], lr=0.0)

def drive(scaler, infs):
    rows = []
    for inf in infs:
        optimizer.zero_grad()
        scaler.scale(param.sum()).backward()
        if inf:
            param.grad[0] = float('inf')
        scaler.step(optimizer)
        scaler.update()
        rows.append([scaler.get_scale(), float(scaler.state_dict()['_growth_tracker'])])
    return rows

def fresh():
    return torch.amp.GradScaler('cpu', init_scale=1.0, growth_factor=2.0, growth_interval=3)

folder = sys.argv[1]
# Python first: its own file at the cut, then its continuation.
scaler = torch.amp.GradScaler('cpu', init_scale=1024.0, growth_factor=2.0, growth_interval=3)
drive(scaler, BEFORE)
torch.save({'scaler': scaler.state_dict()}, folder + '/python_cut.pt')
python_rows = drive(scaler, AFTER)
# C++ first: holdpoint's file at the cut, continued by Python.
cpp = torch.load(folder + '/cpp_cut.pt', weights_only=True)['scaler']
resumed = fresh()
resumed.load_state_dict({key: value for key, value in cpp.items() if key != 'skipped_steps'})
torch.save({'python_rows': python_rows, 'continued_rows': drive(resumed, AFTER),
            'enabled': resumed.is_enabled()}, folder + '/python.pt')
)PY";

std::vector<std::vector<double>> drive_rows(GradScaler& scaler, torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param, const std::vector<bool>& infs) {
  std::vector<std::vector<double>> rows;
  for (bool inf : infs) {
    drive(scaler, optimizer, param, {inf});
    rows.push_back({scaler.get_scale(), static_cast<double>(scaler.growth_tracker())});
  }
  return rows;
}

TEST(GradScalerInterop, StatesContinueStepForStepInBothDirections) {
  at::Tensor param = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.0));
  GradScaler cpp(kInteropOptions);
  drive(cpp, optimizer, param, kBeforeCut);
  ASSERT_EQ(cpp.get_scale(), 512.0);  // backed off at step 2, one clean step since
  TempDir directory;
  Dict root;
  root.insert("scaler", cpp.capture(CaptureMode::reference));
  save_mapping(directory / "cpp_cut.pt", Value::dict(std::move(root)), {.durable = false});
  const auto cpp_rows = drive_rows(cpp, optimizer, param, kAfterCut);

  const PythonResult python =
      run_python(directory / "scaler.py", kPythonScaler, "'" + directory.path().string() + "'");
  ASSERT_EQ(python.status, 0) << python.output;
  const Value result = load_checkpoint_mapping(directory / "python.pt").root;
  EXPECT_TRUE(result.as_dict().at("enabled").as_bool());
  // C++ -> Python: Python's load_state_dict continues holdpoint's state.
  EXPECT_EQ(testing::number_rows(result.as_dict().at("continued_rows")), cpp_rows);

  // Python -> C++: Python's own file, through the untrusted reader, into a
  // scaler constructed with another initial scale.
  const Value python_state = load_checkpoint_mapping(directory / "python_cut.pt").root.as_dict().at("scaler");
  GradScaler from_python({.init_scale = 1.0, .growth_factor = 2.0, .growth_interval = 3});
  ASSERT_NO_THROW(from_python.validate(python_state));
  from_python.apply(python_state);
  EXPECT_EQ(from_python.skipped_steps(), 0);  // holdpoint's own count: Python has none
  const auto python_rows = testing::number_rows(result.as_dict().at("python_rows"));
  EXPECT_EQ(drive_rows(from_python, optimizer, param, kAfterCut), python_rows);
  EXPECT_EQ(python_rows, cpp_rows);  // the same rule on both sides
}

// Python's key names, order and kinds for a fresh and a driven scaler.
TEST(GradScalerInterop, StateMatchesPythonLayout) {
  TempDir directory;
  const std::string script = R"PY(
import sys, torch
scaler = torch.amp.GradScaler('cpu')
torch.save({'default_state': scaler.state_dict()}, sys.argv[1] + '/python.pt')
)PY";
  const PythonResult python = run_python(directory / "layout.py", script, "'" + directory.path().string() + "'");
  ASSERT_EQ(python.status, 0) << python.output;
  const Value result = load_checkpoint_mapping(directory / "python.pt").root;
  // Python's five keys, in Python's order, kinds and values; skipped_steps is holdpoint's own.
  EXPECT_EQ(describe_difference(result.as_dict().at("default_state"),
                                without_entry(GradScaler().capture(CaptureMode::copy), "skipped_steps")),
            "");
}

}  // namespace
}  // namespace holdpoint
