// Learning-rate schedulers against PyTorch itself: every case below runs in
// the oracle Python (torch 2.13) and in C++, and the learning rates (and
// OneCycleLR's momentum) of 60 steps must be bitwise equal, as must the final
// state_dict (after the one documented layout change). In both directions a
// state saved after step 23 continues bit for bit on the other side: Python's
// torch.save file read here through the untrusted reader, and holdpoint's file
// read by Python's load_state_dict. Then resume at several cuts through
// save_mapping / load_checkpoint_mapping, and every rejection with its exact
// code and no change to the live objects.
#include <ATen/ops/zeros.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/lr_scheduler.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using holdpoint::testing::TempDir;
namespace fs = std::filesystem;

constexpr int kSteps = 60;
constexpr int kInteropCut = 23;  // the cross-language tests hand over after this many steps

// ---- optimizers and schedulers on both sides ------------------------------------

enum class OptimizerKind { sgd, adam };

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::sgd;
  std::vector<double> lrs;
  double momentum = 0.0;  // SGD only
};

OptimizerSpec sgd(std::vector<double> lrs, double momentum = 0.0) {
  return {OptimizerKind::sgd, std::move(lrs), momentum};
}
OptimizerSpec adam(std::vector<double> lrs) { return {OptimizerKind::adam, std::move(lrs), 0.0}; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec) {
  using namespace torch::optim;
  std::vector<OptimizerParamGroup> groups;
  for (double lr : spec.lrs) {
    std::vector<at::Tensor> params{at::zeros({1}).set_requires_grad(true)};
    if (spec.kind == OptimizerKind::sgd) {
      groups.emplace_back(params, std::make_unique<SGDOptions>(SGDOptions(lr).momentum(spec.momentum)));
    } else {
      groups.emplace_back(params, std::make_unique<AdamOptions>(AdamOptions(lr)));
    }
  }
  if (spec.kind == OptimizerKind::sgd)
    return std::make_unique<SGD>(groups, SGDOptions(spec.lrs[0]).momentum(spec.momentum));
  return std::make_unique<Adam>(groups, AdamOptions(spec.lrs[0]));
}

std::vector<double> lrs_of(const torch::optim::Optimizer& optimizer) {
  std::vector<double> lrs;
  for (const auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
  return lrs;
}

// SGD's momentum or Adam's beta1: what OneCycleLR cycles.
std::vector<double> momenta_of(const torch::optim::Optimizer& optimizer) {
  std::vector<double> momenta;
  for (const auto& group : optimizer.param_groups()) {
    if (const auto* options = dynamic_cast<const torch::optim::SGDOptions*>(&group.options())) {
      momenta.push_back(options->momentum());
    } else {
      momenta.push_back(std::get<0>(dynamic_cast<const torch::optim::AdamOptions&>(group.options()).betas()));
    }
  }
  return momenta;
}

// Plateaus of 8 steps with a little noise, for ReduceLROnPlateau.
double plateau_metric(int step) { return 1.0 / (1 + step / 8) + 0.001 * (step % 3); }

// A Python float literal that parses to exactly `value` (never an int: "1.0", not "1").
std::string py_float(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", value);
  std::string literal = text;
  if (literal.find_first_of(".e") == std::string::npos) literal += ".0";
  return literal;
}

std::string py_list(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + py_float(values[i]);
  return out + "]";
}

struct Case {
  std::string name;
  OptimizerSpec optimizer;
  std::string python;  // builds the scheduler from `opt`
  std::function<std::unique_ptr<Component>(torch::optim::Optimizer&)> make;
  double metric_sign = 0.0;  // ReduceLROnPlateau: steps with metric_sign * plateau_metric(i)
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

template <typename Scheduler, typename... Args>
std::function<std::unique_ptr<Component>(torch::optim::Optimizer&)> maker(Args... args) {
  return [=](torch::optim::Optimizer& optimizer) { return std::make_unique<Scheduler>(optimizer, args...); };
}

LambdaLR::LrLambda decay_095 = [](std::int64_t e) { return std::pow(0.95, static_cast<double>(e)); };
LambdaLR::LrLambda warmup_10 = [](std::int64_t e) { return std::min(1.0, static_cast<double>(e + 1) / 10); };
LambdaLR::LrLambda inverse = [](std::int64_t e) { return 1.0 / static_cast<double>(e + 1); };

std::vector<Case> all_cases() {
  return {
      {"StepLR_two_groups", sgd({0.1, 0.03}), "L.StepLR(opt, step_size=7, gamma=0.5)",
       maker<StepLR>(StepLROptions{.step_size = 7, .gamma = 0.5})},
      {"StepLR_every_step", sgd({0.1}), "L.StepLR(opt, step_size=1, gamma=0.9)",
       maker<StepLR>(StepLROptions{.step_size = 1, .gamma = 0.9})},
      {"StepLR_three_groups_default_gamma", sgd({1.0, 0.5, 0.25}), "L.StepLR(opt, step_size=10)",
       maker<StepLR>(StepLROptions{.step_size = 10})},
      {"MultiStepLR_repeated_milestone", sgd({0.1, 0.03}), "L.MultiStepLR(opt, milestones=[5, 15, 15, 40], gamma=0.3)",
       maker<MultiStepLR>(MultiStepLROptions{.milestones = {5, 15, 15, 40}, .gamma = 0.3})},
      {"MultiStepLR_default_gamma", sgd({0.05}), "L.MultiStepLR(opt, milestones=[10, 20])",
       maker<MultiStepLR>(MultiStepLROptions{.milestones = {10, 20}})},
      {"ExponentialLR_two_groups", sgd({0.1, 0.01}), "L.ExponentialLR(opt, gamma=0.95)",
       maker<ExponentialLR>(ExponentialLROptions{.gamma = 0.95})},
      {"ExponentialLR_fast", sgd({1.0}), "L.ExponentialLR(opt, gamma=0.7)",
       maker<ExponentialLR>(ExponentialLROptions{.gamma = 0.7})},
      {"CosineAnnealingLR_two_groups_past_T_max", sgd({0.1, 0.05}), "L.CosineAnnealingLR(opt, T_max=20, eta_min=0.001)",
       maker<CosineAnnealingLR>(CosineAnnealingLROptions{.t_max = 20, .eta_min = 0.001})},
      {"CosineAnnealingLR_one_period", sgd({0.1}), "L.CosineAnnealingLR(opt, T_max=60, eta_min=0.0)",
       maker<CosineAnnealingLR>(CosineAnnealingLROptions{.t_max = 60})},
      {"CosineAnnealingLR_three_groups_short", sgd({0.3, 0.2, 0.1}),
       "L.CosineAnnealingLR(opt, T_max=7, eta_min=0.0001)",
       maker<CosineAnnealingLR>(CosineAnnealingLROptions{.t_max = 7, .eta_min = 0.0001})},
      {"LinearLR_default_warmup", sgd({0.1, 0.05}), "L.LinearLR(opt)", maker<LinearLR>(LinearLROptions{})},
      {"LinearLR_long_warmup", sgd({0.2}), "L.LinearLR(opt, start_factor=0.25, end_factor=0.75, total_iters=30)",
       maker<LinearLR>(LinearLROptions{.start_factor = 0.25, .end_factor = 0.75, .total_iters = 30})},
      {"LinearLR_decay_two_groups", sgd({0.1, 0.02}),
       "L.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=45)",
       maker<LinearLR>(LinearLROptions{.start_factor = 1.0, .end_factor = 0.1, .total_iters = 45})},
      {"OneCycleLR_cos_sgd_momentum", sgd({0.1, 0.05}, 0.9), "L.OneCycleLR(opt, max_lr=[0.1, 0.05], total_steps=60)",
       maker<OneCycleLR>(OneCycleLROptions{.max_lr = {0.1, 0.05}, .total_steps = 60})},
      {"OneCycleLR_linear_three_phase_adam_beta1", adam({0.01, 0.02}),
       "L.OneCycleLR(opt, max_lr=0.02, total_steps=100, pct_start=0.25, anneal_strategy='linear', three_phase=True)",
       maker<OneCycleLR>(OneCycleLROptions{.max_lr = {0.02},
                                           .total_steps = 100,
                                           .pct_start = 0.25,
                                           .anneal_strategy = AnnealStrategy::linear,
                                           .three_phase = true})},
      {"OneCycleLR_epochs_no_momentum", sgd({0.1}),
       "L.OneCycleLR(opt, max_lr=0.3, epochs=8, steps_per_epoch=10, cycle_momentum=False, div_factor=10.0, "
       "final_div_factor=100.0)",
       maker<OneCycleLR>(OneCycleLROptions{.max_lr = {0.3},
                                           .epochs = 8,
                                           .steps_per_epoch = 10,
                                           .cycle_momentum = false,
                                           .div_factor = 10.0,
                                           .final_div_factor = 100.0})},
      {"LambdaLR_two_groups", sgd({0.1, 0.05}),
       "L.LambdaLR(opt, [lambda e: 0.95 ** e, lambda e: min(1.0, (e + 1) / 10)])",
       maker<LambdaLR>(std::vector<LambdaLR::LrLambda>{decay_095, warmup_10}, std::string("decay_095,warmup_10"))},
      {"LambdaLR_one_for_all_groups", sgd({0.1, 0.01}), "L.LambdaLR(opt, lambda e: 1.0 / (e + 1))",
       maker<LambdaLR>(std::vector<LambdaLR::LrLambda>{inverse}, std::string("inverse"))},
      {"ReduceLROnPlateau_min_rel_cooldown", sgd({0.1, 0.05}),
       "L.ReduceLROnPlateau(opt, factor=0.5, patience=3, cooldown=2, min_lr=[0.001, 0.0005])",
       maker<ReduceLROnPlateau>(
           ReduceLROnPlateauOptions{.factor = 0.5, .patience = 3, .cooldown = 2, .min_lr = {0.001, 0.0005}}),
       1.0},
      {"ReduceLROnPlateau_max_abs", sgd({0.1}),
       "L.ReduceLROnPlateau(opt, mode='max', factor=0.1, patience=2, threshold=0.05, threshold_mode='abs', min_lr=0.0)",
       maker<ReduceLROnPlateau>(ReduceLROnPlateauOptions{.mode = PlateauMode::max,
                                                         .factor = 0.1,
                                                         .patience = 2,
                                                         .threshold = 0.05,
                                                         .threshold_mode = ThresholdMode::abs}),
       -1.0},
      {"ReduceLROnPlateau_min_abs_eps_stops_reducing", sgd({1.0, 0.5}),
       "L.ReduceLROnPlateau(opt, factor=0.9, patience=0, threshold=0.0, threshold_mode='abs', min_lr=0.0, eps=0.01)",
       maker<ReduceLROnPlateau>(ReduceLROnPlateauOptions{
           .factor = 0.9, .patience = 0, .threshold = 0.0, .threshold_mode = ThresholdMode::abs, .eps = 0.01}),
       1.0},
  };
}

struct LiveSchedule {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Component> scheduler;
};

LiveSchedule start(const Case& c) {
  LiveSchedule run;
  run.optimizer = make_optimizer(c.optimizer);
  run.scheduler = c.make(*run.optimizer);
  return run;
}

// Scheduler step `step` (0-based): the (step + 1)-th call to step().
void step(LiveSchedule& run, const Case& c, int step) {
  if (auto* scheduler = dynamic_cast<LRScheduler*>(run.scheduler.get())) {
    scheduler->step();
  } else {
    dynamic_cast<ReduceLROnPlateau&>(*run.scheduler).step(c.metric_sign * plateau_metric(step));
  }
}

struct Trace {
  std::vector<std::vector<double>> lrs;
  std::vector<std::vector<double>> momenta;
};

void record(Trace& trace, const LiveSchedule& run) {
  trace.lrs.push_back(lrs_of(*run.optimizer));
  trace.momenta.push_back(momenta_of(*run.optimizer));
}

// Row 0: after construction; row i + 1: after step i.
Trace uninterrupted(const Case& c, LiveSchedule& run) {
  Trace trace;
  record(trace, run);
  for (int i = 0; i < kSteps; ++i) {
    step(run, c, i);
    record(trace, run);
  }
  return trace;
}

// Empty when equal bit for bit; else the first difference, in hex.
std::string bitwise_difference(const std::vector<std::vector<double>>& expected,
                               const std::vector<std::vector<double>>& actual, std::size_t first_row = 0) {
  if (expected.size() != actual.size() + first_row) {
    return "rows: " + std::to_string(expected.size()) + " vs " + std::to_string(actual.size() + first_row);
  }
  for (std::size_t r = 0; r < actual.size(); ++r) {
    const auto& want = expected[r + first_row];
    if (want.size() != actual[r].size()) return "row " + std::to_string(r + first_row) + " width";
    for (std::size_t g = 0; g < want.size(); ++g) {
      if (std::bit_cast<std::uint64_t>(want[g]) != std::bit_cast<std::uint64_t>(actual[r][g])) {
        char text[160];
        std::snprintf(text, sizeof text, "row %zu group %zu: expected %a (%.17g), got %a (%.17g)", r + first_row, g,
                      want[g], want[g], actual[r][g], actual[r][g]);
        return text;
      }
    }
  }
  return "";
}

// ---- the Python reference ----------------------------------------------------------

using PythonResult = testing::PythonRun;

// Writes `script` to `script_path` and runs it with the oracle Python (torch 2.13).
PythonResult run_python(const fs::path& script_path, const std::string& script, const std::string& arguments) {
  std::ofstream(script_path) << script;
  return testing::run_python(testing::oracle_python(), script_path, arguments);
}

const char* const kPythonPrelude = R"PY(
import sys, warnings, torch
from torch.optim import lr_scheduler as L
warnings.simplefilter('ignore')
OUT = sys.argv[1]

def make_opt(kind, lrs, momentum):
    groups = [{'params': [torch.nn.Parameter(torch.zeros(1))], 'lr': lr} for lr in lrs]
    if kind == 'sgd':
        return torch.optim.SGD(groups, lr=lrs[0], momentum=momentum)
    return torch.optim.Adam(groups, lr=lrs[0])

def momenta(opt):
    return [g['betas'][0] if 'betas' in g else g['momentum'] for g in opt.param_groups]

# One optimizer step, then one scheduler step (ReduceLROnPlateau on the i-th
# metric); returns the groups' lrs and momenta after it. METRICS is defined by
# each script.
def step_once(opt, scheduler, metric_sign, i):
    opt.step()
    if metric_sign:
        scheduler.step(metric_sign * METRICS[i])
    else:
        scheduler.step()
    return [g['lr'] for g in opt.param_groups], momenta(opt)

# holdpoint's one documented layout change: MultiStepLR's Counter -> dict.
def holdpoint_layout(state):
    return {key: dict(value) if key == 'milestones' else value for key, value in state.items()}
)PY";

class SchedulerMatchesPython : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    directory_ = new TempDir;
    std::string script = kPythonPrelude;
    std::vector<double> metrics;
    for (int i = 0; i < kSteps; ++i) metrics.push_back(plateau_metric(i));
    script += "METRICS = " + py_list(metrics) + "\nSTEPS = " + std::to_string(kSteps) +
              "\nCUT = " + std::to_string(kInteropCut) + "\n";
    script += R"PY(
def run(name, kind, lrs, momentum, make, metric_sign):
    opt = make_opt(kind, lrs, momentum)
    scheduler = make(opt)
    lr_rows = [[g['lr'] for g in opt.param_groups]]
    momentum_rows = [momenta(opt)]
    for i in range(STEPS):
        lrs_now, momenta_now = step_once(opt, scheduler, metric_sign, i)
        lr_rows.append(lrs_now)
        momentum_rows.append(momenta_now)
        if i + 1 == CUT:  # the state as Python saves it, untouched
            torch.save({'scheduler': scheduler.state_dict()}, OUT + '/' + name + '.cut.pt')
    torch.save({'lrs': lr_rows, 'momenta': momentum_rows, 'state': holdpoint_layout(scheduler.state_dict())},
               OUT + '/' + name + '.pt')
)PY";
    for (const Case& c : all_cases()) {
      script += "run('" + c.name + "', '" + (c.optimizer.kind == OptimizerKind::sgd ? "sgd" : "adam") + "', " +
                py_list(c.optimizer.lrs) + ", " + py_float(c.optimizer.momentum) + ", lambda opt: " + c.python + ", " +
                py_float(c.metric_sign) + ")\n";
    }
    python_ = new PythonResult(
        run_python(directory_->path() / "reference.py", script, "'" + directory_->path().string() + "'"));
  }
  static void TearDownTestSuite() {
    delete python_;
    delete directory_;
  }

  static Value reference(const std::string& name) {
    return load_checkpoint_mapping(directory_->path() / (name + ".pt")).root;
  }

  static TempDir* directory_;
  static PythonResult* python_;
};

TempDir* SchedulerMatchesPython::directory_ = nullptr;
PythonResult* SchedulerMatchesPython::python_ = nullptr;

TEST_P(SchedulerMatchesPython, LearningRatesMomentaAndStateAreBitIdentical) {
  ASSERT_EQ(python_->status, 0) << python_->output;
  const Case& c = GetParam();
  const Value python = reference(c.name);
  LiveSchedule run = start(c);
  const Trace trace = uninterrupted(c, run);
  EXPECT_EQ(bitwise_difference(testing::number_rows(python.as_dict().at("lrs")), trace.lrs), "") << "learning rates";
  EXPECT_EQ(bitwise_difference(testing::number_rows(python.as_dict().at("momenta")), trace.momenta), "") << "momenta";
  // Same keys in the same order, same kinds, same values (doubles bitwise).
  EXPECT_EQ(describe_difference(python.as_dict().at("state"), run.scheduler->capture(CaptureMode::copy)), "");
  // What Python writes is also what validate accepts.
  EXPECT_NO_THROW(run.scheduler->validate(python.as_dict().at("state")));
}

// Python's own file, saved after kInteropCut steps (a Counter, torch 2.13's
// keys and encoding), read through the untrusted reader into a fresh C++
// scheduler: the remaining learning rates and momenta equal Python's.
TEST_P(SchedulerMatchesPython, PythonStateContinuesBitIdenticallyInCpp) {
  ASSERT_EQ(python_->status, 0) << python_->output;
  const Case& c = GetParam();
  const Value python = reference(c.name);
  const Value state =
      load_checkpoint_mapping(directory_->path() / (c.name + ".cut.pt")).root.as_dict().at("scheduler");
  LiveSchedule resumed = start(c);
  ASSERT_NO_THROW(resumed.scheduler->validate(state));
  resumed.scheduler->apply(state);
  Trace trace;
  record(trace, resumed);
  for (int i = kInteropCut; i < kSteps; ++i) {
    step(resumed, c, i);
    record(trace, resumed);
  }
  EXPECT_EQ(bitwise_difference(testing::number_rows(python.as_dict().at("lrs")), trace.lrs, kInteropCut), "") << "learning rates";
  EXPECT_EQ(bitwise_difference(testing::number_rows(python.as_dict().at("momenta")), trace.momenta, kInteropCut), "") << "momenta";
}

INSTANTIATE_TEST_SUITE_P(AllSchedulers, SchedulerMatchesPython, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The uninterrupted runs above equal Python's, so resume is checked against
// them in C++ alone (no Python start-up per test under ctest).
class SchedulerResume : public ::testing::TestWithParam<Case> {};

// A cut after `cut` steps, through a real file, into a fresh optimizer and
// scheduler: the continuation equals the uninterrupted run.
TEST_P(SchedulerResume, ResumedRunsContinueIdentically) {
  TempDir directory;
  const Case& c = GetParam();
  LiveSchedule reference_run = start(c);
  const Trace expected = uninterrupted(c, reference_run);
  const Value expected_final = reference_run.scheduler->capture(CaptureMode::copy);

  // 3 and 12 fall inside LinearLR's and OneCycleLR's warmups.
  for (int cut : {0, 1, 3, 12, 31, 59, 60}) {
    SCOPED_TRACE("cut after " + std::to_string(cut) + " steps");
    LiveSchedule first = start(c);
    for (int i = 0; i < cut; ++i) step(first, c, i);
    SaveOptions options;
    options.durable = false;
    options.torch_1_13_compatible = cut % 2 == 1;  // floats as 0-d float64 tensors
    Dict root;
    root.insert("scheduler", first.scheduler->capture(CaptureMode::reference));
    const fs::path path = directory / (c.name + "-cut.pt");
    save_mapping(path, Value::dict(std::move(root)), options);
    const Value state = load_checkpoint_mapping(path).root.as_dict().at("scheduler");

    LiveSchedule resumed = start(c);
    resumed.scheduler->validate(state);
    resumed.scheduler->apply(state);
    Trace trace;
    record(trace, resumed);
    for (int i = cut; i < kSteps; ++i) {
      step(resumed, c, i);
      record(trace, resumed);
    }
    EXPECT_EQ(bitwise_difference(expected.lrs, trace.lrs, cut), "") << "learning rates";
    EXPECT_EQ(bitwise_difference(expected.momenta, trace.momenta, cut), "") << "momenta";
    EXPECT_EQ(describe_difference(expected_final, resumed.scheduler->capture(CaptureMode::copy)), "");
  }
}

INSTANTIATE_TEST_SUITE_P(AllSchedulers, SchedulerResume, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- C++ state into Python ---------------------------------------------------------

TEST(LRSchedulerInterop, StepLRStateWrittenByCppLoadsIntoPythonAndContinuesIdentically) {
  constexpr int kCut = 10;
  constexpr int kMore = 25;
  const Case c = all_cases().front();  // StepLR_two_groups
  ASSERT_EQ(c.name, "StepLR_two_groups");
  TempDir directory;
  LiveSchedule run = start(c);
  for (int i = 0; i < kCut; ++i) step(run, c, i);
  SaveOptions options;
  options.durable = false;
  options.torch_1_13_compatible = true;
  Dict root;
  root.insert("scheduler", run.scheduler->capture(CaptureMode::reference));
  save_mapping(directory / "cpp.pt", Value::dict(std::move(root)), options);

  Trace cpp;
  for (int i = kCut; i < kCut + kMore; ++i) {
    step(run, c, i);
    record(cpp, run);
  }

  const std::string script = std::string(kPythonPrelude) + R"PY(
def plain(value):
    if isinstance(value, torch.Tensor):
        return value.item()
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value

loaded = torch.load(sys.argv[2], weights_only=True)['scheduler']
state = {key: plain(value) for key, value in loaded.items()}
opt = make_opt('sgd', [0.1, 0.03], 0.0)
scheduler = L.StepLR(opt, step_size=7, gamma=0.5)
scheduler.load_state_dict(state)
# PyTorch restores the current lr through optimizer.load_state_dict.
for group, lr in zip(opt.param_groups, state['_last_lr']):
    group['lr'] = lr
rows = []
for _ in range(int(sys.argv[3])):
    opt.step()
    scheduler.step()
    rows.append([g['lr'] for g in opt.param_groups])
torch.save({'lrs': rows, 'state': scheduler.state_dict()}, OUT + '/python.pt')
)PY";
  const PythonResult python = run_python(
      directory / "continue.py", script,
      "'" + directory.path().string() + "' '" + (directory / "cpp.pt").string() + "' " + std::to_string(kMore));
  ASSERT_EQ(python.status, 0) << python.output;
  const Value result = load_checkpoint_mapping(directory / "python.pt").root;
  EXPECT_EQ(bitwise_difference(testing::number_rows(result.as_dict().at("lrs")), cpp.lrs), "");
  EXPECT_EQ(describe_difference(result.as_dict().at("state"), run.scheduler->capture(CaptureMode::copy)), "");
}

// Every scheduler's state as holdpoint writes it (default encoding), saved
// after kInteropCut steps with the optimizer's momenta, loaded by torch 2.13's
// load_state_dict into the same Python scheduler: Python's remaining learning
// rates and momenta equal C++'s uninterrupted run.
TEST(LRSchedulerInterop, EveryCppStateLoadsIntoPythonAndContinuesIdentically) {
  TempDir directory;
  std::string script = std::string(kPythonPrelude) + "METRICS = [";
  for (int i = 0; i < kSteps; ++i) script += (i ? ", " : "") + py_float(plateau_metric(i));
  script += "]\nSTEPS = " + std::to_string(kSteps) + "\nCUT = " + std::to_string(kInteropCut) + R"PY(
def set_momenta(opt, values):
    for group, value in zip(opt.param_groups, values):
        if 'betas' in group:
            group['betas'] = (value, group['betas'][1])
        else:
            group['momentum'] = value

def resume(name, kind, lrs, momentum, make, metric_sign):
    saved = torch.load(OUT + '/' + name + '.cpp.pt', weights_only=True)
    opt = make_opt(kind, lrs, momentum)
    scheduler = make(opt)
    scheduler.load_state_dict(saved['scheduler'])
    # What optimizer.load_state_dict restores in a full resume.
    for group, lr in zip(opt.param_groups, saved['lrs']):
        group['lr'] = lr
    set_momenta(opt, saved['momenta'])
    lr_rows, momentum_rows = [], []
    for i in range(CUT, STEPS):
        lrs_now, momenta_now = step_once(opt, scheduler, metric_sign, i)
        lr_rows.append(lrs_now)
        momentum_rows.append(momenta_now)
    torch.save({'lrs': lr_rows, 'momenta': momentum_rows}, OUT + '/' + name + '.continued.pt')
)PY";
  const auto numbers = [](const std::vector<double>& values) {
    Value::List items;
    for (double value : values) items.push_back(Value::floating(value));
    return Value::list(std::move(items));
  };
  std::vector<Trace> expected;
  for (const Case& c : all_cases()) {
    LiveSchedule run = start(c);
    for (int i = 0; i < kInteropCut; ++i) step(run, c, i);
    Dict root;
    root.insert("scheduler", run.scheduler->capture(CaptureMode::reference));
    root.insert("lrs", numbers(lrs_of(*run.optimizer)));
    root.insert("momenta", numbers(momenta_of(*run.optimizer)));
    save_mapping(directory / (c.name + ".cpp.pt"), Value::dict(std::move(root)), {.durable = false});
    Trace rest;
    for (int i = kInteropCut; i < kSteps; ++i) {
      step(run, c, i);
      record(rest, run);
    }
    expected.push_back(std::move(rest));
    script += "resume('" + c.name + "', '" + (c.optimizer.kind == OptimizerKind::sgd ? "sgd" : "adam") + "', " +
              py_list(c.optimizer.lrs) + ", " + py_float(c.optimizer.momentum) + ", lambda opt: " + c.python + ", " +
              py_float(c.metric_sign) + ")\n";
  }
  const PythonResult python = run_python(directory / "resume.py", script, "'" + directory.path().string() + "'");
  ASSERT_EQ(python.status, 0) << python.output;
  std::size_t index = 0;
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    const Value continued = load_checkpoint_mapping(directory / (c.name + ".continued.pt")).root;
    EXPECT_EQ(bitwise_difference(testing::number_rows(continued.as_dict().at("lrs")), expected[index].lrs), "") << "learning rates";
    EXPECT_EQ(bitwise_difference(testing::number_rows(continued.as_dict().at("momenta")), expected[index].momenta), "")
        << "momenta";
    ++index;
  }
}

// ---- rejections ------------------------------------------------------------------

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

Value floats(std::vector<double> values) {
  Value::List items;
  for (double value : values) items.push_back(Value::floating(value));
  return Value::list(std::move(items));
}

// validate must throw `code` and leave the scheduler and the optimizer as they were.
void expect_rejected(const Component& scheduler, const torch::optim::Optimizer& optimizer, const Value& state,
                     ErrorCode code) {
  const Value before = scheduler.capture(CaptureMode::copy);
  const auto lrs = lrs_of(optimizer);
  const auto momenta = momenta_of(optimizer);
  EXPECT_ERROR_CODE(scheduler.validate(state), code);
  EXPECT_EQ(describe_difference(before, scheduler.capture(CaptureMode::copy)), "");
  EXPECT_EQ(bitwise_difference({lrs}, {lrs_of(optimizer)}), "");
  EXPECT_EQ(bitwise_difference({momenta}, {momenta_of(optimizer)}), "");
}

struct Stepped {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Component> scheduler;
  Value state;  // captured from a twin after `steps` steps
};

Stepped stepped(const Case& c, int steps) {
  LiveSchedule twin = start(c);
  for (int i = 0; i < steps; ++i) step(twin, c, i);
  LiveSchedule live = start(c);
  return {std::move(live.optimizer), std::move(live.scheduler), twin.scheduler->capture(CaptureMode::copy)};
}

const Case& case_named(const std::string& name) {
  static const std::vector<Case> cases = all_cases();
  for (const Case& c : cases) {
    if (c.name == name) return c;
  }
  throw std::out_of_range(name);
}

TEST(LRSchedulerRejects, MissingAndUnknownKeys) {
  Stepped s = stepped(case_named("StepLR_two_groups"), 9);
  expect_rejected(*s.scheduler, *s.optimizer, without_entry(s.state, "last_epoch"), ErrorCode::state_key_missing);
  expect_rejected(*s.scheduler, *s.optimizer, without_entry(s.state, "gamma"), ErrorCode::state_key_missing);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "lr_lambdas", Value::list()),
                  ErrorCode::state_key_unknown);
  Dict int_keyed;
  for (const auto& [key, value] : s.state.as_dict()) int_keyed.insert(key, value);
  int_keyed.insert(7, Value::integer(1));
  expect_rejected(*s.scheduler, *s.optimizer, Value::dict(std::move(int_keyed)), ErrorCode::state_key_unknown);
}

TEST(LRSchedulerRejects, WrongTypes) {
  Stepped s = stepped(case_named("StepLR_two_groups"), 9);
  expect_rejected(*s.scheduler, *s.optimizer, Value::list(), ErrorCode::state_type_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "last_epoch", Value::string("9")),
                  ErrorCode::state_type_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "gamma", Value::string("0.5")),
                  ErrorCode::state_type_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "base_lrs", Value::floating(0.1)),
                  ErrorCode::state_type_invalid);
  expect_rejected(*s.scheduler, *s.optimizer,
                  with_entry(s.state, "_last_lr", Value::list({Value::none(), Value::none()})),
                  ErrorCode::state_type_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "verbose", Value::integer(0)),
                  ErrorCode::state_type_invalid);
}

TEST(LRSchedulerRejects, ChangedLoadBearingParameters) {
  Stepped s = stepped(case_named("StepLR_two_groups"), 9);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "gamma", Value::floating(0.1)),
                  ErrorCode::state_value_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "step_size", Value::integer(8)),
                  ErrorCode::state_value_invalid);

  Stepped multi = stepped(case_named("MultiStepLR_repeated_milestone"), 20);
  Dict fewer;  // 15 counted once instead of twice
  fewer.insert(5, Value::integer(1));
  fewer.insert(15, Value::integer(1));
  fewer.insert(40, Value::integer(1));
  expect_rejected(*multi.scheduler, *multi.optimizer, with_entry(multi.state, "milestones", Value::dict(fewer)),
                  ErrorCode::state_value_invalid);
  fewer.insert(41, Value::integer(1));
  expect_rejected(*multi.scheduler, *multi.optimizer,
                  with_entry(multi.state, "milestones", Value::dict(std::move(fewer))), ErrorCode::state_value_invalid);

  Stepped cosine = stepped(case_named("CosineAnnealingLR_two_groups_past_T_max"), 30);
  expect_rejected(*cosine.scheduler, *cosine.optimizer, with_entry(cosine.state, "T_max", Value::integer(21)),
                  ErrorCode::state_value_invalid);

  Stepped cycle = stepped(case_named("OneCycleLR_cos_sgd_momentum"), 12);
  expect_rejected(*cycle.scheduler, *cycle.optimizer,
                  with_entry(cycle.state, "_anneal_func_type", Value::string("linear")), ErrorCode::state_value_invalid);
  // holdpoint's files from the torch 1.13 era named it anneal_strategy; still checked.
  const Value renamed = without_entry(with_entry(cycle.state, "anneal_strategy", Value::string("linear")),
                                      "_anneal_func_type");
  expect_rejected(*cycle.scheduler, *cycle.optimizer, renamed, ErrorCode::state_value_invalid);
  // Both names at once is not a layout any writer produced.
  expect_rejected(*cycle.scheduler, *cycle.optimizer,
                  with_entry(cycle.state, "anneal_strategy", Value::string("cos")), ErrorCode::state_key_unknown);
  expect_rejected(*cycle.scheduler, *cycle.optimizer, with_entry(cycle.state, "total_steps", Value::integer(61)),
                  ErrorCode::state_value_invalid);
  expect_rejected(*cycle.scheduler, *cycle.optimizer, with_entry(cycle.state, "use_beta1", Value::boolean(true)),
                  ErrorCode::state_value_invalid);

  Stepped lambda = stepped(case_named("LambdaLR_two_groups"), 5);
  Dict callable_state;  // what Python writes for a callable object with attributes
  callable_state.insert("factor", Value::floating(2.0));
  expect_rejected(
      *lambda.scheduler, *lambda.optimizer,
      with_entry(lambda.state, "lr_lambdas", Value::list({Value::none(), Value::dict(std::move(callable_state))})),
      ErrorCode::state_type_invalid);

  Stepped plateau = stepped(case_named("ReduceLROnPlateau_min_rel_cooldown"), 20);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, with_entry(plateau.state, "mode", Value::string("max")),
                  ErrorCode::state_value_invalid);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, with_entry(plateau.state, "min_lrs", floats({0.001, 0.001})),
                  ErrorCode::state_value_invalid);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, with_entry(plateau.state, "patience", Value::integer(4)),
                  ErrorCode::state_value_invalid);
}

TEST(LRSchedulerRejects, GroupCountMismatch) {
  Stepped s = stepped(case_named("StepLR_two_groups"), 9);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "base_lrs", floats({0.1})),
                  ErrorCode::state_structure_mismatch);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "_last_lr", floats({0.1, 0.1, 0.1})),
                  ErrorCode::state_structure_mismatch);
  Stepped plateau = stepped(case_named("ReduceLROnPlateau_min_rel_cooldown"), 20);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, with_entry(plateau.state, "_last_lr", floats({0.1})),
                  ErrorCode::state_structure_mismatch);
}

TEST(LRSchedulerRejects, CountersOutOfRange) {
  Stepped s = stepped(case_named("StepLR_two_groups"), 9);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "last_epoch", Value::integer(-2)),
                  ErrorCode::state_value_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "_step_count", Value::integer(-1)),
                  ErrorCode::state_value_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "_last_lr", floats({0.1, NAN})),
                  ErrorCode::state_value_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "base_lrs", floats({INFINITY, 0.1})),
                  ErrorCode::state_value_invalid);

  Stepped cycle = stepped(case_named("OneCycleLR_cos_sgd_momentum"), 12);
  expect_rejected(*cycle.scheduler, *cycle.optimizer, with_entry(cycle.state, "last_epoch", Value::integer(61)),
                  ErrorCode::state_value_invalid);

  Stepped plateau = stepped(case_named("ReduceLROnPlateau_min_rel_cooldown"), 20);
  expect_rejected(*plateau.scheduler, *plateau.optimizer,
                  with_entry(plateau.state, "num_bad_epochs", Value::integer(4)), ErrorCode::state_value_invalid);
  expect_rejected(*plateau.scheduler, *plateau.optimizer,
                  with_entry(plateau.state, "cooldown_counter", Value::integer(3)), ErrorCode::state_value_invalid);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, with_entry(plateau.state, "best", Value::floating(NAN)),
                  ErrorCode::state_value_invalid);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, without_entry(plateau.state, "_last_lr"),
                  ErrorCode::state_key_missing);
  // This scheduler was given one min_lr per group, so Python keeps no default_min_lr (None).
  expect_rejected(*plateau.scheduler, *plateau.optimizer,
                  with_entry(plateau.state, "default_min_lr", Value::floating(0.5)), ErrorCode::state_type_invalid);
  expect_rejected(*plateau.scheduler, *plateau.optimizer, with_entry(plateau.state, "verbose", Value::integer(1)),
                  ErrorCode::state_type_invalid);
  expect_rejected(*s.scheduler, *s.optimizer, with_entry(s.state, "_is_initial", Value::string("no")),
                  ErrorCode::state_type_invalid);
}

// Layouts older torch versions wrote still load: torch 1.13's 'verbose' and no
// '_is_initial'; ReduceLROnPlateau without 'default_min_lr' and, before its
// first step, without '_last_lr'; OneCycleLR's anneal_strategy (holdpoint's
// name for it then).
TEST(LRSchedulerLayouts, Torch113LayoutsStillLoad) {
  Stepped s = stepped(case_named("StepLR_two_groups"), 9);
  const Value old_step = with_entry(without_entry(s.state, "_is_initial"), "verbose", Value::boolean(false));
  EXPECT_NO_THROW(s.scheduler->validate(old_step));
  s.scheduler->apply(old_step);
  EXPECT_EQ(describe_difference(s.state, s.scheduler->capture(CaptureMode::copy)), "");

  Stepped cycle = stepped(case_named("OneCycleLR_cos_sgd_momentum"), 12);
  const Value old_cycle = without_entry(
      with_entry(cycle.state, "anneal_strategy", cycle.state.as_dict().at("_anneal_func_type")), "_anneal_func_type");
  EXPECT_NO_THROW(cycle.scheduler->validate(old_cycle));
  cycle.scheduler->apply(old_cycle);
  EXPECT_EQ(describe_difference(cycle.state, cycle.scheduler->capture(CaptureMode::copy)), "");

  Stepped fresh_plateau = stepped(case_named("ReduceLROnPlateau_min_rel_cooldown"), 0);
  const Value old_plateau = with_entry(
      without_entry(without_entry(fresh_plateau.state, "default_min_lr"), "_last_lr"), "verbose", Value::boolean(false));
  EXPECT_NO_THROW(fresh_plateau.scheduler->validate(old_plateau));
  Stepped plateau = stepped(case_named("ReduceLROnPlateau_min_rel_cooldown"), 20);
  EXPECT_NO_THROW(plateau.scheduler->validate(without_entry(plateau.state, "default_min_lr")));
}

// ---- construction and stepping errors ------------------------------------------------

TEST(LRSchedulerOptions, RejectsWhatPyTorchRejectsOrCannotRun) {
  auto optimizer = make_optimizer(sgd({0.1, 0.05}));
  EXPECT_ERROR_CODE(StepLR(*optimizer, {.step_size = 0}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(CosineAnnealingLR(*optimizer, {.t_max = 0}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(LinearLR(*optimizer, {.start_factor = 0.0}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(OneCycleLR(*optimizer, {.max_lr = {0.1, 0.2, 0.3}, .total_steps = 10}),
                    ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(OneCycleLR(*optimizer, {.max_lr = {0.1}}), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(LambdaLR(*optimizer, {inverse, inverse, inverse}, "inverse"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(LambdaLR(*optimizer, {inverse}, ""), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(ReduceLROnPlateau(*optimizer, {.factor = 1.0}), ErrorCode::invalid_argument);

  std::vector<at::Tensor> params{at::zeros({1}).set_requires_grad(true)};
  torch::optim::Adagrad adagrad(params, torch::optim::AdagradOptions(0.1));
  EXPECT_ERROR_CODE(OneCycleLR(adagrad, {.max_lr = {0.1}, .total_steps = 10}), ErrorCode::invalid_argument);
  EXPECT_NO_THROW(OneCycleLR(adagrad, {.max_lr = {0.1}, .total_steps = 10, .cycle_momentum = false}));
}

TEST(LRSchedulerOptions, OneCyclePastTotalStepsFailsAndChangesNothing) {
  auto optimizer = make_optimizer(sgd({0.1}, 0.9));
  OneCycleLR scheduler(*optimizer, {.max_lr = {0.1}, .total_steps = 5});
  for (int i = 0; i < 5; ++i) scheduler.step();  // step_num 5 == total_steps is still allowed, as in Python
  const Value before = scheduler.capture(CaptureMode::copy);
  const auto lrs = lrs_of(*optimizer);
  const auto momenta = momenta_of(*optimizer);
  EXPECT_ERROR_CODE(scheduler.step(), ErrorCode::call_order_invalid);
  EXPECT_EQ(describe_difference(before, scheduler.capture(CaptureMode::copy)), "");
  EXPECT_EQ(bitwise_difference({lrs}, {lrs_of(*optimizer)}), "");
  EXPECT_EQ(bitwise_difference({momenta}, {momenta_of(*optimizer)}), "");
}

TEST(LRSchedulerConfig, NamesTypeAndStaticParameters) {
  auto optimizer = make_optimizer(sgd({0.1, 0.05}));
  Dict step_lr;
  step_lr.insert("type", Value::string("StepLR"));
  step_lr.insert("step_size", Value::integer(7));
  step_lr.insert("gamma", Value::floating(0.5));
  EXPECT_EQ(describe_difference(StepLR(*optimizer, {.step_size = 7, .gamma = 0.5}).config(), Value::dict(step_lr)), "");

  Dict lambda;
  lambda.insert("type", Value::string("LambdaLR"));
  lambda.insert("lr_lambda", Value::string("warmup-v2"));
  EXPECT_EQ(describe_difference(LambdaLR(*optimizer, {inverse}, "warmup-v2").config(), Value::dict(lambda)), "");
  EXPECT_EQ(ReduceLROnPlateau(*optimizer).config().as_dict().at("min_lr").as_list().size(), 2u);
}

}  // namespace
}  // namespace holdpoint
