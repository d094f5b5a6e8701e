// The ready Trainer (holdpoint/trainer/trainer.h) as a data-parallel job
// under torchrun, on one host or several (docs/distributed.md, "The Trainer
// under torchrun"; the commands are in examples/torchrun/README.md).
//
//   torchrun --nproc-per-node=2 --no-python build/examples/torchrun/trainer -- --run RUN --steps 40
//
//   trainer --run RUN --steps N [--save-every K] [--sleep-ms M] [--timeout-ms MS] [--events FILE]
//           [--hold-save STEP:MS]
//
// Each rank joins the world from torchrun's variables, builds the same model,
// optimizer and scheduler, its own DistributedSampler, and a Trainer;
// holdpoint::make_data_parallel makes the trainer average gradients and the
// loss over the ranks and save sharded generations in RUN every K updates
// (default 2) and at the end. fit() resumes from RUN's LATEST on every start,
// so a restart by torchrun (--max-restarts) continues with no flag.
//
// With the same number of ranks, a run that is killed and restarted ends with
// the model of one that ran straight through, bit for bit: the all-reduce
// adds in the same order every time, and each rank's generator (dropout)
// is saved as rank-local state. Another number of ranks resumes too, but its
// batches and sums differ (unlike examples/torchrun/train.cpp, whose
// trajectory does not depend on the world size).
//
// Output: rank 0 prints "fresh" or "resumed STEP", and at the end
// "final STEP SHA256" (the parameters' bytes). --events appends JSON lines
// (start, resumed, saving, saved, holding, final; with rank, pid, step, world and the
// time) to FILE; --sleep-ms slows each update; --hold-save STEP:MS makes every
// rank wait MS milliseconds in the save of step STEP once its shard is
// written, before the commit. Exit: 0 done, 1 error, 2 usage.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "example_events.h"
#include "holdpoint/dist/data_parallel.h"
#include "holdpoint/dist/launch.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/state/sampler.h"

namespace {

constexpr std::int64_t kRows = 64;
constexpr std::uint64_t kSamplerSeed = 0x5eed;

struct Args {
  std::filesystem::path run;
  std::int64_t steps = 0;
  std::int64_t save_every = 2;
  std::int64_t sleep_ms = 0;
  std::int64_t timeout_ms = 60000;
  std::string events;
  std::int64_t hold_step = -1;
  std::int64_t hold_ms = 0;
};

struct UsageError {
  std::string message;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--") continue;  // torchrun passes it on
    if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
    const std::string value = argv[++i];
    const auto integer = [&] {
      std::size_t used = 0;
      try {
        const std::int64_t parsed = std::stoll(value, &used);
        if (used == value.size() && parsed >= 0) return parsed;
      } catch (const std::exception&) {
      }
      throw UsageError{flag + " needs a non-negative integer, not '" + value + "'"};
    };
    if (flag == "--run") a.run = value;
    else if (flag == "--steps") a.steps = integer();
    else if (flag == "--save-every") a.save_every = integer();
    else if (flag == "--sleep-ms") a.sleep_ms = integer();
    else if (flag == "--timeout-ms") a.timeout_ms = integer();
    else if (flag == "--events") a.events = value;
    else if (flag == "--hold-save") {
      const auto colon = value.find(':');
      std::size_t used_step = 0, used_ms = 0;
      try {
        if (colon == std::string::npos) throw std::invalid_argument("no colon");
        a.hold_step = std::stoll(value.substr(0, colon), &used_step);
        a.hold_ms = std::stoll(value.substr(colon + 1), &used_ms);
      } catch (const std::exception&) {
        used_step = 0;
      }
      if (used_step != colon || used_ms + colon + 1 != value.size() || a.hold_step < 0 || a.hold_ms < 0) {
        throw UsageError{"--hold-save needs STEP:MS, not '" + value + "'"};
      }
    }
    else throw UsageError{"unknown flag " + flag};
  }
  if (a.run.empty() || a.steps <= 0) throw UsageError{"--run and --steps are required"};
  return a;
}

int train(const Args& a) {
  ::signal(SIGPIPE, SIG_IGN);  // a dead peer must surface as an error, not kill this rank
  at::set_num_threads(1);
  holdpoint::WorldOptions world_options;
  world_options.store_timeout = std::chrono::milliseconds(a.timeout_ms);
  world_options.gloo.timeout = std::chrono::milliseconds(a.timeout_ms);
  holdpoint::World world = holdpoint::join_world_from_environment(world_options);
  const std::int64_t rank = world.environment.rank, size = world.environment.world_size;
  const std::string where = "\"rank\": " + std::to_string(rank) + ", \"world\": " + std::to_string(size) +
                            ", \"restart\": " + std::to_string(world.environment.restart_count);
  example::event(a.events, "\"event\": \"start\", " + where);

  // Data, model, optimizer and scheduler: equal on every rank.
  std::vector<double> xs, ys;
  for (std::int64_t i = 0; i < kRows; ++i) {
    const double p = std::sin(0.7 * static_cast<double>(i)), q = std::cos(1.3 * static_cast<double>(i) + 0.4);
    xs.insert(xs.end(), {p, q});
    ys.push_back(0.8 * p - 0.5 * q + 0.1 * p * q);
  }
  const at::Tensor x = at::tensor(xs, at::kDouble).reshape({kRows, 2});
  const at::Tensor y = at::tensor(ys, at::kDouble).reshape({kRows, 1});
  at::manual_seed(5);
  torch::nn::Sequential model(torch::nn::Linear(2, 16), torch::nn::Tanh(), torch::nn::Dropout(0.1),
                              torch::nn::Linear(16, 1));
  model->to(at::kDouble);
  // Dropout draws from each rank's own stream (saved as rank-local state).
  at::manual_seed(1000 + static_cast<std::uint64_t>(rank));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.02));
  holdpoint::StepLR scheduler(optimizer, {.step_size = 10, .gamma = 0.7});
  holdpoint::DistributedSampler sampler(kRows, kSamplerSeed, size, rank);

  holdpoint::TrainerOptions options;
  options.semantic_identity = "holdpoint.example.torchrun-trainer";
  options.batch_size = 4;
  options.max_epochs = 1 << 20;
  options.max_steps = a.steps;
  options.loss_identity = "mse";
  options.checkpointing.cadence.every_steps = a.save_every;
  options.code_identity = "examples/torchrun/trainer.cpp";
  options.data_identity = "torchrun-64-rows-v1";
  holdpoint::Trainer trainer(
      *model, [&](const at::Tensor& in) { return model->forward(in); }, optimizer,
      [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
      x, y, sampler, options);
  trainer.set_scheduler(scheduler);

  holdpoint::DataParallelOptions parallel;
  parallel.load.allow_world_size_change = true;  // another number of ranks resumes as unqualified
  parallel.checkpoints.phase_hook = [&](std::string_view phase) {
    const std::int64_t step = trainer.progress().global_step;
    if (phase == "before-shard") {
      example::event(a.events, "\"event\": \"saving\", " + where + ", \"step\": " + std::to_string(step));
    } else if (phase == "after-shard" && step == a.hold_step) {
      example::event(a.events, "\"event\": \"holding\", " + where + ", \"step\": " + std::to_string(step));
      std::this_thread::sleep_for(std::chrono::milliseconds(a.hold_ms));
    }
  };
  holdpoint::DistributedCheckpointer& checkpointer =
      holdpoint::make_data_parallel(trainer, sampler, *world.group, a.run, parallel);

  // fit() would resume by itself; resuming first lets the program say so.
  if (trainer.resume()) {
    const std::int64_t step = trainer.progress().global_step;
    if (rank == 0) std::cout << "resumed " << step << std::endl;
    example::event(a.events, "\"event\": \"resumed\", " + where + ", \"step\": " + std::to_string(step));
  } else if (rank == 0) {
    std::cout << "fresh" << std::endl;
  }
  std::int64_t last_saved = checkpointer.latest() ? checkpointer.latest()->step : 0;
  trainer.fit([&](const holdpoint::StepRecord&) {
    // A save at the cadence has returned inside the update: report it.
    if (const auto latest = checkpointer.latest(); latest && latest->step != last_saved) {
      last_saved = latest->step;
      example::event(a.events, "\"event\": \"saved\", " + where + ", \"step\": " + std::to_string(last_saved));
    }
    if (a.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
  });
  const std::int64_t step = trainer.progress().global_step;
  const std::string digest = example::parameters_sha256(model->parameters());
  if (rank == 0) std::cout << "final " << step << " " << digest << std::endl;
  example::event(a.events, "\"event\": \"final\", " + where + ", \"step\": " + std::to_string(step) +
                               ", \"sha256\": \"" + digest + "\"");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "trainer: " << error.message << "\n"
              << "usage: torchrun [...] --no-python trainer -- --run RUN --steps N [--save-every K]"
                 " [--sleep-ms M] [--timeout-ms MS] [--events FILE] [--hold-save STEP:MS]\n";
    return 2;
  }
  const std::string who = "rank " + std::string(std::getenv("RANK") ? std::getenv("RANK") : "?") + ": ";
  try {
    return train(args);
  } catch (const holdpoint::Error& error) {
    std::cerr << who << "error: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << std::endl;
  } catch (const c10::Error& error) {
    std::cerr << who << "error: c10d: " << error.what_without_backtrace() << std::endl;
  } catch (const std::exception& error) {
    std::cerr << who << "error: " << error.what() << std::endl;
  }
  return 1;
}
