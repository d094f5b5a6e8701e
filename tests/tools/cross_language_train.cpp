// The C++ half of the cross-language resume proofs
// (tests/python/test_cross_language_resume.py, whose Python loop is the same
// program step for step):
//
//   cross_language_train --optimizer sgd|adam --until N --output DIR
//                        [--resume CHECKPOINT] [--save-at S]
//
// Trains a 2-8-1 float64 network with dropout on 24 fixed rows (batch 4,
// shuffled by an explicit generator, StepLR, profile
// cpu-shuffled-singleworker-v1) until N optimizer updates in total have run,
// resuming from CHECKPOINT first if given (a file holdpoint's Python
// TrainingState wrote, or this program). Saves DIR/step-S.pt after update S
// and DIR/final.pt at the end, and writes DIR/trace.json: per update the
// sample ids and the loss's IEEE-754 bits.
//
// The training state is registered by hand (TrainingState, not Trainer) so
// that both languages register the same components under the same
// configuration: model, optimizer, scheduler, rng, sampler, progress.
#include <ATen/Parallel.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "ieee_bits.h"

#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/progress.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/state/sampler.h"

namespace {

constexpr std::int64_t kRows = 24;
constexpr std::int64_t kBatch = 4;

}  // namespace

int main(int argc, char** argv) {
  std::string optimizer_name;
  std::int64_t until = -1;
  std::int64_t save_at = -1;
  std::filesystem::path output;
  std::filesystem::path resume;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--optimizer") optimizer_name = value;
    else if (flag == "--until") until = std::stoll(value);
    else if (flag == "--save-at") save_at = std::stoll(value);
    else if (flag == "--output") output = value;
    else if (flag == "--resume") resume = value;
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  if ((optimizer_name != "sgd" && optimizer_name != "adam") || until < 0 || output.empty()) {
    std::cerr << "usage: cross_language_train --optimizer sgd|adam --until N --output DIR [--resume FILE] "
                 "[--save-at S]\n";
    return 2;
  }
  try {
    std::filesystem::create_directories(output);
    at::set_num_threads(1);
    at::manual_seed(2024);
    const at::Tensor x = at::linspace(-1.0, 1.0, kRows * 2, at::kDouble).reshape({kRows, 2});
    const at::Tensor y = (x.select(1, 0) * 0.7 - x.select(1, 1) * 0.3).unsqueeze(1);
    torch::nn::Sequential model(torch::nn::Linear(2, 8), torch::nn::Tanh(), torch::nn::Dropout(0.25),
                                torch::nn::Linear(8, 1));
    model->to(at::kDouble);
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (optimizer_name == "sgd") {
      optimizer = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    } else {
      optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.03));
    }
    holdpoint::StepLR scheduler(*optimizer, {.step_size = 3, .gamma = 0.5});
    at::Generator order = at::detail::createCPUGenerator(7);
    holdpoint::RandomSampler sampler(kRows, order);
    holdpoint::Progress progress;

    holdpoint::ModuleState model_state(*model);
    holdpoint::OptimizerState optimizer_state("optimizer", *optimizer);
    holdpoint::RngRegistry rng;
    holdpoint::register_default_generators(rng);
    rng.add("sampler", order);
    holdpoint::SamplerState sampler_state(sampler);
    holdpoint::ProgressState progress_state(progress);
    holdpoint::TrainingConfig config;
    // The same fields, with the same values, as the Python loop's.
    config.load_bearing("model", holdpoint::Value::string("2-8-1 tanh dropout(0.25) float64"));
    config.load_bearing("optimizer", holdpoint::Value::string(optimizer_name == "sgd" ? "SGD lr=0.05 momentum=0.9"
                                                                                      : "Adam lr=0.03"));
    config.load_bearing("scheduler", holdpoint::Value::string("StepLR step_size=3 gamma=0.5"));
    config.load_bearing("batch_size", holdpoint::Value::integer(kBatch));
    config.load_bearing("data", holdpoint::Value::string("linspace(-1, 1, 48) as 24x2"));
    holdpoint::TrainingState state;
    state.set_semantic_identity("cross-language-2-8-1")
        .set_profile(holdpoint::ResumeProfile::cpu_shuffled_singleworker_v1)
        .set_config(config);
    state.add(model_state).add(optimizer_state).add(scheduler).add(rng).add(sampler_state).add(progress_state);

    nlohmann::json trace;
    if (!resume.empty()) {
      const auto report = state.load_checkpoint(resume);
      trace["resumed_at_step"] = progress.global_step;
      trace["profile"] = report.profile;
    }
    nlohmann::json records = nlohmann::json::array();
    model->train();
    while (progress.global_step < until) {
      std::vector<std::int64_t> ids;
      while (static_cast<std::int64_t>(ids.size()) < kBatch) {
        const auto id = sampler.next();
        if (!id) {
          progress.epoch += 1;
          progress.batch_in_epoch = 0;
          sampler.start_epoch(progress.epoch);
          continue;
        }
        ids.push_back(*id);
      }
      const at::Tensor index = at::tensor(ids, at::kLong);
      optimizer->zero_grad();
      const at::Tensor out = model->forward(x.index_select(0, index));
      const at::Tensor loss = torch::nn::functional::mse_loss(out, y.index_select(0, index));
      loss.backward();
      optimizer->step();
      scheduler.step();
      progress.global_step += 1;
      progress.batch_in_epoch += 1;
      progress.samples_seen += kBatch;
      records.push_back({{"step", progress.global_step}, {"ids", ids}, {"loss", ieee_bits(loss.item<double>())}});
      if (progress.global_step == save_at) {
        state.save(output / ("step-" + std::to_string(save_at) + ".pt"));
      }
    }
    trace["steps"] = records;
    state.save(output / "final.pt");
    std::ofstream(output / "trace.json") << trace.dump(1) << "\n";
    return 0;
  } catch (const holdpoint::Error& error) {
    std::cerr << "error: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
}
