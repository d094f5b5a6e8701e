// Trains a linear model for two epochs with the ready loop, saving into a
// run directory every epoch; a second trainer, built with other initial
// weights, resumes from the run's LATEST and trains on to a third epoch.
#include <ATen/Context.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "holdpoint/state/sampler.h"
#include "holdpoint/trainer/trainer.h"

namespace {

torch::nn::Linear seeded_linear(std::uint64_t seed) {
  at::manual_seed(seed);
  return torch::nn::Linear(3, 1);
}

// The caller owns the model, optimizer and sampler; the trainer registers
// them (and progress, history, the CPU generator) with its TrainingState.
struct TrainingRun {
  TrainingRun(std::uint64_t seed, const at::Tensor& inputs, const at::Tensor& targets,
              const holdpoint::TrainerOptions& options)
      : model(seeded_linear(seed)),
        trainer(*model, [this](const at::Tensor& batch) { return model->forward(batch); }, optimizer,
                [](const at::Tensor& outputs, const at::Tensor& expected) {
                  return torch::nn::functional::mse_loss(outputs, expected);
                },
                inputs, targets, sampler, options) {}
  torch::nn::Linear model;
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.05)};
  holdpoint::SequentialSampler sampler{16};
  holdpoint::Trainer trainer;
};

bool fit_and_resume(const std::filesystem::path& run) {
  at::manual_seed(7);
  const at::Tensor inputs = at::randn({16, 3});
  const at::Tensor targets = inputs.sum(1, true);

  holdpoint::TrainerOptions options;
  options.semantic_identity = "api-example";
  options.profile = holdpoint::ResumeProfile::cpu_basic_v1;
  options.loss_identity = "mse";
  options.batch_size = 4;
  options.max_epochs = 2;
  options.run_directory = run;
  options.checkpointing.cadence.every_epochs = 1;

  at::Tensor weight_after_two_epochs;
  {
    TrainingRun first(0, inputs, targets, options);
    first.trainer.fit();  // resumes from LATEST (none yet), trains, saves each epoch and at the end
    weight_after_two_epochs = first.model->weight.detach().clone();
  }  // destroying the trainer releases the run directory's lock

  options.max_epochs = 3;  // operational: may grow on resume
  TrainingRun second(1, inputs, targets, options);
  const std::optional<holdpoint::LoadReport> report = second.trainer.resume();
  if (!report || second.trainer.progress().global_step != 8 ||
      !second.model->weight.detach().equal(weight_after_two_epochs)) {
    std::cerr << "did not resume the state after two epochs\n";
    return false;
  }
  const holdpoint::FitOutcome outcome = second.trainer.fit();
  return outcome == holdpoint::FitOutcome::finished && second.trainer.progress().global_step == 12;
}

}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("holdpoint-api-trainer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = false;
  try {
    ok = fit_and_resume(dir / "run");
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
