// Saves a TrainingState into a run directory every second step (in the
// background, keeping the newest two generations), then opens the run again
// with a fresh setup and resumes from LATEST.
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
#include <optional>
#include <string>

#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/progress.h"

namespace {

torch::nn::Linear seeded_linear(std::uint64_t seed) {
  at::manual_seed(seed);
  return torch::nn::Linear(3, 1);
}

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

bool train_and_resume(const std::filesystem::path& run) {
  holdpoint::CheckpointManagerOptions options;
  options.cadence.every_steps = 2;
  options.asynchronous = true;  // save() only copies the state; a background thread writes it
  options.run.retention.keep_last = 2;

  Setup trained(0);
  {
    holdpoint::CheckpointManager manager(run, trained.state, options);
    for (int i = 0; i < 6; ++i) {
      train_one_step(trained);
      holdpoint::GenerationSpec spec;
      spec.step = trained.progress.global_step;
      manager.maybe_save(spec, /*epoch_completed=*/false, /*epochs_completed=*/0);
    }
    manager.wait();  // throws the error of a failed background save
    if (manager.generations().size() != 2) {
      std::cerr << "retention kept " << manager.generations().size() << " generations\n";
      return false;
    }
  }  // closing the manager releases the run directory's lock

  Setup resumed(1);
  holdpoint::CheckpointManager manager(run, resumed.state, options);
  // LATEST, against the SHA-256 it records; nullopt for a run without generations.
  const std::optional<holdpoint::LoadReport> report = manager.resume();
  if (!report || resumed.progress.global_step != 6) {
    std::cerr << "did not resume at step 6\n";
    return false;
  }
  const std::string difference =
      holdpoint::describe_difference(trained.state.component("model")->capture(holdpoint::CaptureMode::copy),
                                     resumed.state.component("model")->capture(holdpoint::CaptureMode::copy));
  if (!difference.empty()) std::cerr << "the model differs after resume: " << difference << "\n";
  return difference.empty();
}

}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("holdpoint-api-manager-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = false;
  try {
    ok = train_and_resume(dir / "run");
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
