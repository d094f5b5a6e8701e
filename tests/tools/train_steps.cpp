// A small, fully checkpointed CPU training run for the fresh-process resume
// test (tests/python/test_resume_fresh_process.py).
//
//   train_steps --steps N --output DIR [--resume CHECKPOINT [--omit-rng-restore]]
//               [--torch-1-13-compatible]
//
// Trains a 2-8-1 float64 network with dropout on 24 synthetic rows (batch 4,
// shuffled by an explicit generator, Adam + StepLR, profile
// cpu-shuffled-singleworker-v1) until N optimizer updates in total have run,
// resuming from CHECKPOINT first if given. Writes DIR/checkpoint.pt and
// DIR/trace.json: per update the sample ids, the loss and learning rate (as
// IEEE-754 bit patterns, so comparisons are exact). --omit-rng-restore
// re-seeds both generators after the resume: the negative control, whose
// trajectory must diverge. --torch-1-13-compatible saves in the encoding
// torch 1.13's weights_only loader reads (tests/python/test_training_state_interop.py).
#include <ATen/ops/linspace.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/stack.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "ieee_bits.h"

#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/trainer/trainer.h"

int main(int argc, char** argv) {
  std::int64_t steps = -1;
  std::filesystem::path output;
  std::filesystem::path resume;
  bool omit_rng_restore = false;
  bool torch_1_13_compatible = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--omit-rng-restore") {
      omit_rng_restore = true;
      continue;
    }
    if (flag == "--torch-1-13-compatible") {
      torch_1_13_compatible = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::cerr << flag << " needs a value\n";
      return 2;
    }
    if (flag == "--steps") steps = std::stoll(argv[++i]);
    else if (flag == "--output") output = argv[++i];
    else if (flag == "--resume") resume = argv[++i];
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (steps < 0 || output.empty()) {
    std::cerr << "usage: train_steps --steps N --output DIR [--resume CHECKPOINT]\n";
    return 2;
  }
  try {
    std::filesystem::create_directories(output);
    // Everything below is rebuilt identically in every process; a resume then
    // replaces the state that training changes.
    at::manual_seed(2024);
    const at::Tensor x = at::randn({24, 2}, at::kDouble);
    const at::Tensor y = (x.select(1, 0) * 0.7 - x.select(1, 1) * 0.3).unsqueeze(1);
    torch::nn::Sequential model(torch::nn::Linear(2, 8), torch::nn::Tanh(), torch::nn::Dropout(0.25),
                                torch::nn::Linear(8, 1));
    model->to(at::kDouble);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.03));
    holdpoint::StepLR scheduler(optimizer, {.step_size = 3, .gamma = 0.5});
    at::Generator order = at::detail::createCPUGenerator(7);
    holdpoint::RandomSampler sampler(24, order);

    holdpoint::TrainerOptions options;
    options.semantic_identity = "train-steps-test";
    options.profile = holdpoint::ResumeProfile::cpu_shuffled_singleworker_v1;
    options.batch_size = 4;
    options.loss_identity = "mse";
    options.max_epochs = 100;
    options.max_steps = steps;
    options.config.load_bearing("seeds", holdpoint::Value::list({holdpoint::Value::integer(2024),
                                                                 holdpoint::Value::integer(7)}));
    holdpoint::Trainer trainer(
        *model, [&](const at::Tensor& inputs) { return model->forward(inputs); }, optimizer,
        [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
        x, y, sampler, options);
    trainer.set_scheduler(scheduler);
    trainer.rng().add("sampler", order);

    nlohmann::json trace;
    trace["resumed_from"] = resume.string();
    if (!resume.empty()) {
      const auto report = trainer.state().load_checkpoint(resume);
      trace["resumed_at_step"] = trainer.progress().global_step;
      trace["profile"] = report.profile;
      if (omit_rng_restore) {
        at::manual_seed(2024);
        order.set_current_seed(7);
      }
    }
    nlohmann::json records = nlohmann::json::array();
    trainer.fit([&](const holdpoint::StepRecord& record) {
      records.push_back({{"step", record.step},
                         {"epoch", record.epoch},
                         {"ids", record.sample_ids},
                         {"loss", ieee_bits(record.loss)},
                         {"lr", ieee_bits(record.learning_rate)}});
    });
    trace["steps"] = records;
    trainer.state().save(output / "checkpoint.pt", {.torch_1_13_compatible = torch_1_13_compatible});
    std::ofstream(output / "trace.json") << trace.dump(1) << "\n";
    return 0;
  } catch (const holdpoint::Error& error) {
    std::cerr << "error: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
}
