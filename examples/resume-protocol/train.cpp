// The save/resume protocol example: a small CPU training run whose every
// source of state matters, driven by the resume verifier's CLI contract
// (docs/verification.md).
//
//   train --steps N --output DIR [--resume CKPT] [--omit-rng-restore]
//
// 24 synthetic rows (two inputs, one target, row ids 0..23), a 2-8-1 network
// (33 parameters) with dropout 0.25, batch 4, Adam lr 0.03, StepLR(step_size
// 3, gamma 0.5), float64, one thread, CPU. Three generators all change the
// trajectory:
//   "gain"    std::mt19937   a slight gain on each batch's inputs
//   "noise"   pcg64          input noise, and each epoch's permutation
//   "dropout" LibTorch's default CPU generator, which dropout draws from
// --steps counts the updates this process runs (a resume from step 5 with
// --steps 5 ends at 10). Cut at 5, the sampler's cursor is at 20 of 24 (mid-
// epoch); 10 updates cross into a second permutation.
//
// DIR must not exist. Writes DIR/checkpoint.pt (a holdpoint resume
// checkpoint), DIR/checkpoint.pt.sha256 and DIR/summary.json with a per-update
// trace: sample ids, learning rate applied, loss, and the next draw of every
// generator, observed on a copy (or restored at once) so the run is not
// disturbed. --omit-rng-restore resumes everything but the generators, which
// restart from their seeds: the negative control, which must diverge.
// Exit: 0 done, 1 error (code on stderr), 2 usage or DIR exists.
#include <ATen/Parallel.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <pcg_random.hpp>
#include <random>

#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/trainer/trainer.h"
#include "holdpoint_version.h"

namespace {

constexpr std::int64_t kRows = 24;
constexpr std::uint32_t kGainSeed = 11;
constexpr std::uint64_t kNoiseSeed = 23;
constexpr std::uint64_t kDropoutSeed = 37;

// Each epoch's order is a Fisher-Yates shuffle drawn from the pcg64 stream.
class PcgPermutationSampler final : public holdpoint::StatefulSamplerProtocol {
 public:
  explicit PcgPermutationSampler(pcg64& engine) : engine_(engine) { shuffle(); }

  std::string kind() const override { return "resume-protocol.PcgPermutation/v1"; }
  std::int64_t num_samples() const override { return kRows; }
  std::optional<std::int64_t> next() override {
    if (cursor_ >= kRows) return std::nullopt;
    return order_[static_cast<std::size_t>(cursor_++)];
  }
  void start_epoch(std::int64_t) override { shuffle(); }
  std::int64_t remaining() const override { return kRows - cursor_; }

  holdpoint::Value state_dict() const override {
    holdpoint::Value::List order;
    for (std::int64_t id : order_) order.push_back(holdpoint::Value::integer(id));
    holdpoint::Dict state;
    state.insert("cursor", holdpoint::Value::integer(cursor_));
    state.insert("order", holdpoint::Value::list(std::move(order)));
    return holdpoint::Value::dict(std::move(state));
  }
  void validate_state_dict(const holdpoint::Value& state) const override {
    const auto* cursor = state.as_dict().find("cursor");
    const auto* order = state.as_dict().find("order");
    if (!cursor || !order || !cursor->is_int() || !order->is_list() ||
        static_cast<std::int64_t>(order->as_list().size()) != kRows || cursor->as_int() < 0 ||
        cursor->as_int() > kRows) {
      throw std::invalid_argument("expected {cursor: 0..24, order: 24 ids}");
    }
    std::vector<bool> seen(kRows);
    for (const auto& id : order->as_list()) {
      if (!id.is_int() || id.as_int() < 0 || id.as_int() >= kRows || seen[static_cast<std::size_t>(id.as_int())]) {
        throw std::invalid_argument("order is not a permutation of 0..23");
      }
      seen[static_cast<std::size_t>(id.as_int())] = true;
    }
  }
  void load_state_dict(const holdpoint::Value& state) override {
    cursor_ = state.as_dict().find("cursor")->as_int();
    order_.clear();
    for (const auto& id : state.as_dict().find("order")->as_list()) order_.push_back(id.as_int());
  }
#ifdef HOLDPOINT_PLANTED_BUGS
  void reset_cursor() { cursor_ = 0; }
#endif

 private:
  void shuffle() {
    order_.resize(kRows);
    for (std::int64_t i = 0; i < kRows; ++i) order_[static_cast<std::size_t>(i)] = i;
    for (std::int64_t i = kRows - 1; i > 0; --i) {
      const auto j = static_cast<std::int64_t>(engine_() % static_cast<std::uint64_t>(i + 1));
      std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
    }
    cursor_ = 0;
  }

  pcg64& engine_;
  std::vector<std::int64_t> order_;
  std::int64_t cursor_ = 0;
};

double uniform(auto& engine) { return std::uniform_real_distribution<double>(0.0, 1.0)(engine); }

nlohmann::json number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

int usage(const std::string& message) {
  std::cerr << "train: " << message
            << "\nusage: train --steps N --output DIR [--resume CHECKPOINT] [--omit-rng-restore]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t steps = -1;
  std::filesystem::path output, resume;
  bool omit_rng_restore = false;
  std::string planted;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--omit-rng-restore") {
      omit_rng_restore = true;
      continue;
    }
    if (i + 1 >= argc) return usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--steps") {
      steps = std::stoll(value);
    } else if (flag == "--output") {
      output = value;
    } else if (flag == "--resume") {
      resume = value;
#ifdef HOLDPOINT_PLANTED_BUGS
    } else if (flag == "--plant-bug") {
      planted = value;
#endif
    } else {
      return usage("unknown flag " + flag);
    }
  }
  if (steps < 0 || output.empty()) return usage("--steps and --output are required");
  if (omit_rng_restore && resume.empty()) return usage("--omit-rng-restore needs --resume");
  std::error_code exists_error;
  if (std::filesystem::exists(std::filesystem::symlink_status(output, exists_error))) {
    return usage(output.string() + " exists; every run writes a new directory");
  }
  try {
    at::set_num_threads(1);
    // The data: a fixed synthetic relation, the same in every process.
    std::vector<double> xs, ys;
    for (std::int64_t i = 0; i < kRows; ++i) {
      const double a = std::sin(0.7 * static_cast<double>(i)), b = std::cos(1.3 * static_cast<double>(i) + 0.4);
      xs.insert(xs.end(), {a, b});
      ys.push_back(0.8 * a - 0.5 * b + 0.1 * a * b);
    }
    const at::Tensor x = at::tensor(xs, at::kDouble).reshape({kRows, 2});
    const at::Tensor y = at::tensor(ys, at::kDouble).reshape({kRows, 1});

    at::manual_seed(kDropoutSeed);  // initial weights and dropout
    torch::nn::Sequential model(torch::nn::Linear(2, 8), torch::nn::Tanh(), torch::nn::Dropout(0.25),
                                torch::nn::Linear(8, 1));
    model->to(at::kDouble);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.03));
    holdpoint::StepLR scheduler(optimizer, {.step_size = 3, .gamma = 0.5});
    std::mt19937 gain(kGainSeed);
    pcg64 noise(kNoiseSeed);
    PcgPermutationSampler permutation(noise);
    holdpoint::StatefulSampler sampler(permutation);

    holdpoint::TrainerOptions options;
    options.semantic_identity = "holdpoint.example.resume-protocol";
    options.profile = holdpoint::ResumeProfile::unqualified;
    options.batch_size = 4;
    options.loss_identity = "mse";
    options.max_epochs = 1000;
    options.config.load_bearing("seeds", holdpoint::Value::list({holdpoint::Value::integer(kGainSeed),
                                                                 holdpoint::Value::integer(kNoiseSeed),
                                                                 holdpoint::Value::integer(kDropoutSeed)}));
    options.config.load_bearing("data", holdpoint::Value::string("sin/cos synthetic, 24 rows"));
    options.data_identity = "resume-protocol-24-rows-v1";
    options.code_identity = "examples/resume-protocol/train.cpp";
    holdpoint::Trainer trainer(
        *model,
        [&](const at::Tensor& inputs) {
          const double g = 1.0 + 0.02 * (uniform(gain) - 0.5);
          at::Tensor jitter = at::empty_like(inputs);
          auto* data = jitter.data_ptr<double>();
          for (std::int64_t i = 0; i < jitter.numel(); ++i) data[i] = 0.01 * (uniform(noise) - 0.5);
          return model->forward(inputs * g + jitter);
        },
        optimizer,
        [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
        x, y, sampler, options);
    trainer.set_scheduler(scheduler);
    trainer.rng().add("gain", gain);
    trainer.rng().add("noise", noise);

    nlohmann::json summary = {{"schema", "holdpoint.resume-summary"},
                              {"schema_version", 1},
                              {"trainer", "holdpoint examples/resume-protocol/train"},
                              {"generators", {"gain", "noise", "dropout"}},
                              {"resumed_from", nullptr},
                              {"rng_restored", true}};
    if (!resume.empty()) {
      holdpoint::CheckpointLoadOptions load;
      std::ifstream sidecar(resume.string() + ".sha256");
      std::string digest;
      if (sidecar >> digest) load.expected_sha256 = holdpoint::Sha256Digest::parse(digest);
      trainer.state().load_checkpoint(resume, load);
      summary["resumed_from"] = resume.string();
      if (omit_rng_restore) {
        // The negative control: everything restored but the generators.
        gain.seed(kGainSeed);
        noise.seed(kNoiseSeed);
        at::manual_seed(kDropoutSeed);
        summary["rng_restored"] = false;
      }
#ifdef HOLDPOINT_PLANTED_BUGS
      if (planted == "optimizer-not-restored") {
        optimizer.state().clear();
      } else if (planted == "scheduler-rebuilt") {
        // Built after the optimizer's state was loaded: its constructor resets the rates.
        for (auto& group : optimizer.param_groups()) group.options().set_lr(0.03);
      } else if (planted == "sampler-cursor-reset") {
        permutation.reset_cursor();
      } else if (planted == "generator-not-restored") {
        noise.seed(kNoiseSeed);
      } else if (planted == "crash") {
        std::abort();
      } else if (planted != "nan-in-trace" && planted != "missing-trace-field") {
        return usage("unknown planted bug " + planted);
      }
#endif
    }

    // The next draw of every generator, taken without disturbing any stream.
    const auto next_draws = [&] {
      std::mt19937 gain_copy = gain;
      pcg64 noise_copy = noise;
      at::Generator dropout = at::detail::getDefaultCPUGenerator();
      const at::Tensor saved = dropout.get_state();
      const double dropout_draw = at::rand({1}, dropout, at::kDouble).item<double>();
      dropout.set_state(saved);
      return nlohmann::json{{"gain", uniform(gain_copy)}, {"noise", uniform(noise_copy)}, {"dropout", dropout_draw}};
    };
    nlohmann::json trace = nlohmann::json::array();
    for (std::int64_t i = 0; i < steps; ++i) {
      const holdpoint::StepRecord record = trainer.step();
      nlohmann::json entry = {{"step", record.step},
                              {"epoch", record.epoch},
                              {"sample_ids", record.sample_ids},
                              {"lr", number(record.learning_rate)},
                              {"loss", number(record.loss)},
                              {"rng_next", next_draws()}};
#ifdef HOLDPOINT_PLANTED_BUGS
      if (!resume.empty() && planted == "nan-in-trace" && i == steps / 2) entry["loss"] = number(std::nan(""));
      if (!resume.empty() && planted == "missing-trace-field" && i == steps / 2) entry.erase("lr");
#endif
      trace.push_back(std::move(entry));
    }

    // The final evaluation, without dropout, and the next learning rate.
    model->eval();
    const double mse = torch::nn::functional::mse_loss(model->forward(x), y).item<double>();
    model->train();
    std::filesystem::create_directory(output);
    holdpoint::CheckpointSaveOptions save;
    save.write_sidecar = true;
    trainer.state().save(output / "checkpoint.pt", save);
    summary["steps_run"] = steps;
    summary["global_step"] = trainer.progress().global_step;
    summary["versions"] = {{"holdpoint", HOLDPOINT_VERSION}, {"libtorch", TORCH_VERSION}};
    summary["final"] = {{"loss", trace.empty() ? nlohmann::json(nullptr) : trace.back()["loss"]},
                        {"mse", number(mse)},
                        {"next_lr", number(optimizer.param_groups().at(0).options().get_lr())}};
    summary["trace"] = std::move(trace);
    std::ofstream(output / "summary.json") << summary.dump(1) << "\n";
    std::cout << "step " << trainer.progress().global_step << "  mse " << mse << "  -> " << output.string() << "\n";
    return 0;
  } catch (const holdpoint::Error& error) {
    std::cerr << "train: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
}
