// Data-parallel training under torchrun, on one host or several, that
// survives restarts and world-size changes bit for bit (docs/distributed.md,
// "Running under torchrun"; the commands are in examples/torchrun/README.md).
//
//   torchrun --nproc-per-node=2 --no-python build/examples/torchrun/train -- --run RUN --steps 40
//
//   train --run RUN --steps N [--save-every K] [--async] [--sleep-ms M]
//         [--timeout-ms MS] [--events FILE] [--hold-save STEP:MS]
//
// Each rank joins the world from torchrun's variables
// (holdpoint::join_world_from_environment) and resumes from RUN's LATEST when
// there is one: a first start, a restart after a failure (torchrun
// --max-restarts) and a restart with another number of ranks all take the
// same path, with no flag. It then trains until the run's global step is N,
// saving a sharded checkpoint every K updates (default 2) through
// DistributedCheckpointer, asynchronously with --async, and at the end.
//
// The trajectory does not depend on the world size, so a run that is killed,
// restarted and resized ends with the same model, bit for bit, as one that
// ran straight through:
//   - every update takes the next 12 positions of the epoch's permutation
//     (48 rows, 4 updates an epoch); each of the W ranks takes 12 / W of them
//     (W must divide 12), through holdpoint's DistributedSampler, whose state
//     is rank-local and reassigned when W changes;
//   - the randomness of a sample (input noise, dropout mask) comes from a
//     generator seeded by (epoch, position), not from the rank;
//   - each rank computes the gradient of each of its samples separately; the
//     ranks all-gather them and every rank adds the 12 in position order.
// The model, optimizer (Adam), scheduler (StepLR) and progress are replicated
// and written once in total; profile "unqualified" with
// allow_world_size_change.
//
// Output: rank 0 prints "resumed STEP (saved by W ranks)" or "fresh", and at
// the end "final STEP SHA256" (the parameters' bytes). For tests: --events
// appends one JSON line per event to FILE (start, resumed, saving, saved,
// holding, final; with rank, pid, step, world and the time); --sleep-ms slows
// each update; --hold-save STEP:MS makes every rank wait MS milliseconds in the
// save of step STEP once its shard is written, before the commit.
// Exit: 0 done, 1 error (printed with its code), 2 usage.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "example_events.h"
#include "holdpoint/dist/distributed.h"
#include "holdpoint/dist/launch.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/progress.h"
#include "holdpoint/state/sampler.h"

namespace {

constexpr std::int64_t kRows = 48;
constexpr std::int64_t kGlobalBatch = 12;  // per update, over all ranks
constexpr std::uint64_t kInitSeed = 5;
constexpr std::uint64_t kSamplerSeed = 0x5eed;
constexpr std::uint64_t kSampleSeed = 0x7a11;

struct Args {
  std::filesystem::path run;
  std::int64_t steps = 0;
  std::int64_t save_every = 2;
  bool async_saves = false;
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
    if (flag == "--async") {
      a.async_saves = true;
      continue;
    }
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
      if (colon == std::string::npos) throw UsageError{"--hold-save needs STEP:MS"};
      const std::string all = value;
      const auto number = [&](const std::string& part) {
        std::size_t used = 0;
        try {
          const std::int64_t parsed = std::stoll(part, &used);
          if (used == part.size() && parsed >= 0) return parsed;
        } catch (const std::exception&) {
        }
        throw UsageError{"--hold-save needs STEP:MS, not '" + all + "'"};
      };
      a.hold_step = number(value.substr(0, colon));
      a.hold_ms = number(value.substr(colon + 1));
    }
    else throw UsageError{"unknown flag " + flag};
  }
  if (a.run.empty() || a.steps <= 0) throw UsageError{"--run and --steps are required"};
  return a;
}

void event(const Args& a, const std::string& fields) { example::event(a.events, fields); }

// SplitMix64: a sample's seed from (epoch, position).
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

at::Tensor flat_gradient(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters) grads.push_back(p.grad().reshape({-1}));
  return at::cat(grads);
}

int train(const Args& a) {
  // Gloo writes to peers' sockets: a dead peer must surface as an error.
  ::signal(SIGPIPE, SIG_IGN);
  at::set_num_threads(1);
  holdpoint::WorldOptions world_options;
  world_options.store_timeout = std::chrono::milliseconds(a.timeout_ms);
  world_options.gloo.timeout = std::chrono::milliseconds(a.timeout_ms);
  world_options.background_group = a.async_saves;
  holdpoint::World world = holdpoint::join_world_from_environment(world_options);
  c10d::ProcessGroup& group = *world.group;
  const std::int64_t rank = world.environment.rank, size = world.environment.world_size;
  if (kGlobalBatch % size != 0) {
    throw holdpoint::Error(holdpoint::ErrorCode::invalid_argument,
                           "WORLD_SIZE=" + std::to_string(size) + " does not divide the global batch of " +
                               std::to_string(kGlobalBatch));
  }
  const std::int64_t per_rank = kGlobalBatch / size;
  const std::string where = "\"rank\": " + std::to_string(rank) + ", \"world\": " + std::to_string(size) +
                            ", \"restart\": " + std::to_string(world.environment.restart_count);
  event(a, "\"event\": \"start\", " + where);

  // Data, model, optimizer, scheduler: equal on every rank.
  std::vector<double> xs, ys;
  for (std::int64_t i = 0; i < kRows; ++i) {
    const double p = std::sin(0.7 * static_cast<double>(i)), q = std::cos(1.3 * static_cast<double>(i) + 0.4);
    xs.insert(xs.end(), {p, q});
    ys.push_back(0.8 * p - 0.5 * q + 0.1 * p * q);
  }
  const at::Tensor x = at::tensor(xs, at::kDouble).reshape({kRows, 2});
  const at::Tensor y = at::tensor(ys, at::kDouble).reshape({kRows, 1});
  at::manual_seed(kInitSeed);
  torch::nn::Linear hidden(2, 8), output(8, 1);
  torch::nn::Sequential model(hidden, torch::nn::Tanh(), output);
  model->to(at::kDouble);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.03));
  const holdpoint::Value optimizer_identity = holdpoint::optimizer_config(optimizer);
  holdpoint::StepLR scheduler(optimizer, {.step_size = 6, .gamma = 0.5});
  holdpoint::DistributedSampler sampler(kRows, kSamplerSeed, size, rank);
  holdpoint::Progress progress;

  holdpoint::ModuleState model_state(*model);
  holdpoint::OptimizerState optimizer_state("optimizer", optimizer);
  holdpoint::ProgressState progress_state(progress);
  holdpoint::SamplerState sampler_state(sampler);
  holdpoint::TrainingConfig config;
  config.load_bearing("model_schema", model_state.contract());
  config.load_bearing("optimizer", optimizer_identity);
  config.load_bearing("scheduler", scheduler.config());
  config.load_bearing("global_batch", holdpoint::Value::integer(kGlobalBatch));
  config.load_bearing("sample_seed", holdpoint::Value::integer(static_cast<std::int64_t>(kSampleSeed)));
  config.load_bearing("gradient", holdpoint::Value::string("per-sample, summed in position order"));
  config.operational("save_every", holdpoint::Value::integer(a.save_every));
  holdpoint::TrainingState state;
  state.add(model_state).add(optimizer_state).add(scheduler).add(progress_state).add(sampler_state);
  state.set_semantic_identity("holdpoint.example.torchrun")
      .set_profile(holdpoint::ResumeProfile::unqualified)
      .set_config(config)
      .set_code_identity("examples/torchrun/train.cpp")
      .set_data_identity("torchrun-48-rows-v1");

  holdpoint::DistributedCheckpointOptions checkpoint_options;
  checkpoint_options.rank_local = {"sampler"};
  checkpoint_options.background = world.background.get();
  std::atomic<std::int64_t> saving_step{-1};  // read on the background thread of an asynchronous save
  checkpoint_options.phase_hook = [&](std::string_view phase) {
    if (phase == "after-shard" && saving_step == a.hold_step) {
      event(a, "\"event\": \"holding\", " + where + ", \"step\": " + std::to_string(a.hold_step));
      std::this_thread::sleep_for(std::chrono::milliseconds(a.hold_ms));
    }
  };
  holdpoint::DistributedCheckpointer checkpointer(group, state, a.run, std::move(checkpoint_options));

  // Every start resumes from LATEST when the run has one.
  holdpoint::DistributedLoadOptions load;
  load.allow_world_size_change = true;
  if (const auto loaded = checkpointer.resume(load)) {
    if (rank == 0) {
      std::cout << "resumed " << progress.global_step << " (saved by " << loaded->saved_world_size << " ranks)"
                << std::endl;
    }
    event(a, "\"event\": \"resumed\", " + where + ", \"step\": " + std::to_string(progress.global_step) +
                 ", \"saved_world\": " + std::to_string(loaded->saved_world_size));
  } else if (rank == 0) {
    std::cout << "fresh" << std::endl;
  }

  const std::vector<at::Tensor> parameters = model->parameters();
  std::int64_t parameter_count = 0;
  for (const auto& p : parameters) parameter_count += p.numel();
  const auto saved = [&](std::int64_t step) {
    event(a, "\"event\": \"saved\", " + where + ", \"step\": " + std::to_string(step));
  };
  const auto finish_pending = [&] {
    if (const auto done = checkpointer.wait()) saved(done->generation.step);
  };
  const auto save = [&](bool last) {
    finish_pending();
    holdpoint::GenerationSpec spec;
    spec.step = progress.global_step;
    spec.epoch = progress.epoch;
    saving_step = spec.step;
    event(a, "\"event\": \"saving\", " + where + ", \"step\": " + std::to_string(spec.step));
    if (a.async_saves && !last) {
      checkpointer.save_async(spec);
    } else {
      saved(checkpointer.save(spec).generation.step);
    }
  };

  while (progress.global_step < a.steps) {
    if (sampler.remaining_on_every_rank() <= 0) {
      sampler.start_epoch(sampler.epoch() + 1);
      progress.epoch = sampler.epoch();
      progress.batch_in_epoch = 0;
    }
    if (sampler.remaining_on_every_rank() < per_rank) {
      throw holdpoint::Error(holdpoint::ErrorCode::invalid_argument, "an update would span two epochs");
    }
    // This rank's samples and their gradients, one by one.
    at::Tensor grads = at::empty({per_rank, parameter_count}, at::kDouble);
    at::Tensor positions = at::empty({per_rank}, at::kLong);
    at::Tensor losses = at::empty({per_rank}, at::kDouble);
    for (std::int64_t k = 0; k < per_rank; ++k) {
      const std::int64_t position = sampler.start() + sampler.cursor() * size + rank;
      const std::int64_t row = *sampler.next();
      at::Generator generator = at::detail::createCPUGenerator(
          mix(kSampleSeed ^ mix(static_cast<std::uint64_t>(sampler.epoch()) * 1000003u + position)));
      const at::Tensor input = x.narrow(0, row, 1) + 0.01 * at::randn({1, 2}, generator, at::kDouble);
      const at::Tensor mask = at::bernoulli(at::full({1, 8}, 0.75, at::kDouble), generator) / 0.75;
      const at::Tensor prediction = output->forward(at::tanh(hidden->forward(input)) * mask);
      const at::Tensor loss = (prediction - y.narrow(0, row, 1)).pow(2).sum() / static_cast<double>(kGlobalBatch);
      for (const auto& p : parameters) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      loss.backward();
      grads[k].copy_(flat_gradient(parameters));
      positions[k] = position;
      losses[k] = loss.item<double>();
    }
    // Every rank gets every sample's gradient and adds them in position order.
    std::vector<std::vector<at::Tensor>> all_grads(1), all_positions(1);
    for (std::int64_t r = 0; r < size; ++r) {
      all_grads[0].push_back(at::empty_like(grads));
      all_positions[0].push_back(at::empty_like(positions));
    }
    std::vector<at::Tensor> mine{grads}, my_positions{positions};
    group.allgather(all_grads, mine)->wait();
    group.allgather(all_positions, my_positions)->wait();
    std::vector<std::pair<std::int64_t, at::Tensor>> by_position;
    for (std::int64_t r = 0; r < size; ++r) {
      for (std::int64_t k = 0; k < per_rank; ++k) {
        by_position.emplace_back(all_positions[0][r][k].item<std::int64_t>(), all_grads[0][r][k]);
      }
    }
    std::sort(by_position.begin(), by_position.end(),
              [](const auto& l, const auto& r) { return l.first < r.first; });
    at::Tensor total = at::zeros({parameter_count}, at::kDouble);
    for (const auto& [position, gradient] : by_position) total.add_(gradient);
    {
      at::NoGradGuard no_grad;
      std::int64_t offset = 0;
      for (const auto& p : parameters) {
        p.mutable_grad().copy_(total.narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
    }
    optimizer.step();
    scheduler.step();
    progress.global_step += 1;
    progress.batch_in_epoch += 1;
    progress.samples_seen += kGlobalBatch;
    if (a.sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.sleep_ms));
    if (a.save_every > 0 && progress.global_step % a.save_every == 0 && progress.global_step < a.steps) save(false);
  }
  finish_pending();
  const auto latest = checkpointer.latest();
  if (!latest || latest->step != progress.global_step) save(true);
  const std::string digest = example::parameters_sha256(parameters);
  if (rank == 0) std::cout << "final " << progress.global_step << " " << digest << std::endl;
  event(a, "\"event\": \"final\", " + where + ", \"step\": " + std::to_string(progress.global_step) +
               ", \"sha256\": \"" + digest + "\"");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "train: " << error.message << "\n"
              << "usage: torchrun [...] --no-python train -- --run RUN --steps N [--save-every K] [--async]"
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
