// A training process on a run directory, for the kill and preemption tests
// (tests/python/test_kill_resume.py).
//
//   train_run --run DIR --steps N [--every K] [--async] [--width W] [--sleep-ms M] [--keep-last L]
//
// Trains a 32-W-1 float64 network with dropout on 96 synthetic rows (batch 8,
// shuffled by an explicit generator, Adam + StepLR, profile
// cpu-shuffled-singleworker-v1) until N optimizer updates in total, saving a
// generation every K updates (asynchronously with --async) and keeping the
// newest L. Started on an existing run directory it resumes from LATEST.
// SIGTERM/SIGINT/SIGUSR1 save at the next step boundary and exit 75; a
// second signal exits 76 at once.
//
// Prints "resumed <step>" or "fresh", then "final <step> <sha256 of every
// parameter's bytes>" or "preempted <step>". Exit: 0 finished, 75 preempted,
// 1 error (with the error code on stderr), 2 usage.
#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <chrono>
#include <iostream>
#include <thread>

#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/run/preemption.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/trainer/trainer.h"

int main(int argc, char** argv) {
  std::filesystem::path run;
  std::int64_t steps = -1, every = 3, width = 256, sleep_ms = 0, keep_last = 3;
  bool asynchronous = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--async") {
      asynchronous = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::cerr << flag << " needs a value\n";
      return 2;
    }
    const std::string value = argv[++i];
    if (flag == "--run") run = value;
    else if (flag == "--steps") steps = std::stoll(value);
    else if (flag == "--every") every = std::stoll(value);
    else if (flag == "--width") width = std::stoll(value);
    else if (flag == "--sleep-ms") sleep_ms = std::stoll(value);
    else if (flag == "--keep-last") keep_last = std::stoll(value);
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (run.empty() || steps <= 0 || every <= 0) {
    std::cerr << "usage: train_run --run DIR --steps N [--every K] [--async] [--width W] [--sleep-ms M]\n";
    return 2;
  }
  try {
    at::set_num_threads(1);
    at::manual_seed(31);
    const at::Tensor x = at::randn({96, 32}, at::kDouble);
    const at::Tensor y = x.narrow(1, 0, 4).sum(1, true) - x.narrow(1, 4, 4).sum(1, true) * 0.5;
    torch::nn::Sequential model(torch::nn::Linear(32, width), torch::nn::Tanh(), torch::nn::Dropout(0.1),
                                torch::nn::Linear(width, 1));
    model->to(at::kDouble);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.002));
    holdpoint::StepLR scheduler(optimizer, {.step_size = 40, .gamma = 0.7});
    at::Generator order = at::detail::createCPUGenerator(5);
    holdpoint::RandomSampler sampler(96, order);

    holdpoint::TrainerOptions options;
    options.semantic_identity = "train-run-kill-test";
    options.profile = holdpoint::ResumeProfile::cpu_shuffled_singleworker_v1;
    options.batch_size = 8;
    options.loss_identity = "mse";
    options.max_epochs = 1000;
    options.max_steps = steps;
    options.checkpointing.cadence.every_steps = every;
    options.run_directory = run;
    options.checkpointing.asynchronous = asynchronous;
    options.checkpointing.run.retention.keep_last = static_cast<std::size_t>(keep_last);
    options.checkpointing.run.best_metric = holdpoint::BestMetric{"loss", false};
    options.checkpointing.run.retention.keep_best = 1;
    options.handle_preemption_signals = true;
    options.config.load_bearing("width", holdpoint::Value::integer(width));
    holdpoint::Trainer trainer(
        *model, [&](const at::Tensor& inputs) { return model->forward(inputs); }, optimizer,
        [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
        x, y, sampler, options);
    trainer.set_scheduler(scheduler);
    trainer.rng().add("sampler", order);

    const auto resumed = trainer.resume();
    std::cout << (resumed ? "resumed " + std::to_string(trainer.progress().global_step) : std::string("fresh"))
              << std::endl;
    const holdpoint::FitOutcome outcome = trainer.fit([&](const holdpoint::StepRecord&) {
      if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    });
    if (outcome == holdpoint::FitOutcome::preempted) {
      std::cout << "preempted " << trainer.progress().global_step << std::endl;
      return holdpoint::kExitPreempted;
    }
    holdpoint::Sha256 hash;
    for (const auto& p : model->parameters()) {
      const at::Tensor c = p.detach().contiguous();
      hash.update(c.data_ptr(), static_cast<std::size_t>(c.numel()) * c.element_size());
    }
    std::cout << "final " << trainer.progress().global_step << " " << hash.finish().hex() << std::endl;
    return 0;
  } catch (const holdpoint::Error& error) {
    std::cerr << "error: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
}
