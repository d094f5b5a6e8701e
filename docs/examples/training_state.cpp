// Registers a model, its optimizer and the progress counters with a
// TrainingState, saves after one update, and loads the file into a second
// setup with other initial weights: every component comes back equal.
#include <ATen/Context.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/progress.h"

namespace {

torch::nn::Linear seeded_linear(std::uint64_t seed) {
  at::manual_seed(seed);
  return torch::nn::Linear(3, 1);
}

// What a training program builds at start-up, before it knows whether it resumes.
struct Setup {
  explicit Setup(std::uint64_t seed) : model(seeded_linear(seed)) {
    state.set_semantic_identity("api-example").add(model_state).add(optimizer_state).add(progress_state);
  }
  torch::nn::Linear model;
  torch::optim::Adam optimizer{model->parameters(), torch::optim::AdamOptions(0.01)};
  holdpoint::Progress progress;
  holdpoint::ModuleState model_state{*model};
  holdpoint::OptimizerState optimizer_state{"optimizer", optimizer};
  holdpoint::ProgressState progress_state{progress};
  holdpoint::TrainingState state;
};

void train_one_step(Setup& setup) {
  const at::Tensor inputs = at::randn({8, 3});
  setup.optimizer.zero_grad();
  torch::nn::functional::mse_loss(setup.model->forward(inputs), inputs.sum(1, true)).backward();
  setup.optimizer.step();
  ++setup.progress.global_step;
}

bool save_and_load(const std::filesystem::path& dir) {
  Setup trained(0);
  train_one_step(trained);
  // Atomic, with checkpoint.pt.sha256 beside it.
  trained.state.save(dir / "checkpoint.pt");

  Setup resumed(1);
  // From a path; untrusted files are fine; nothing changes unless every check passes.
  const holdpoint::LoadReport report = resumed.state.load_checkpoint(dir / "checkpoint.pt");
  for (const std::string& name : report.restored) {
    const std::string difference =
        holdpoint::describe_difference(trained.state.component(name)->capture(holdpoint::CaptureMode::copy),
                                       resumed.state.component(name)->capture(holdpoint::CaptureMode::copy));
    if (!difference.empty()) {
      std::cerr << name << " differs after the load: " << difference << "\n";
      return false;
    }
  }
  return report.restored.size() == 3 && resumed.progress.global_step == 1;
}

}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("holdpoint-api-state-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = false;
  try {
    ok = save_and_load(dir);
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
