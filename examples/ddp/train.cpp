// The data-parallel example: a small CPU training run over a Gloo process
// group whose checkpoints are sharded across the ranks
// (holdpoint/dist/distributed.h), driven by the resume verifier's CLI contract
// (docs/verification.md) and used by the distributed crash and resume tests
// (tests/python/test_ddp_checkpoint.py).
//
//   train --steps N --output DIR [--resume CKPT] [--omit-rng-restore]
//         [--world W] [--run RUN] [--save-every K] [--crash PHASE:RANK:STEP]
//         [--allow-world-size-change] [--profile cpu-gloo-ddp-v1|unqualified]
//         [--torch-1-13-compatible] [--async]
//         [--timeout-ms MS]
//
// One binary, two modes. Without --rank it is the launcher: it creates DIR
// (which must not exist), picks a fresh c10d FileStore path inside it
// (DIR/.store-<pid>-<random>; a stale store file would rendezvous with dead
// ranks), starts W copies of itself with the same arguments plus
// `--rank r --store PATH`, and waits. When a rank fails, the others get 20 s
// to fail too (a peer's death makes their next collective throw) and are then
// killed. With --rank R --store PATH it is rank R of the world.
//
// Each rank: 48 synthetic rows (two inputs, one target, row ids 0..47), a
// 2-8-1 network (33 parameters) with dropout 0.25, float64, one thread, CPU;
// 3 rows per rank per update from holdpoint's DistributedSampler (same
// permutation on every rank, strided by rank; an update never spans two
// epochs), MSE, backward, gradients all-reduced (sum, then / W), Adam lr 0.03,
// StepLR(step_size 3, gamma 0.5) per update. Three generators per rank, seeded
// per rank, all change the trajectory and are checkpointed rank-locally in
// "rng":
//   "dropout" LibTorch's default CPU generator (dropout), seed 37 + rank
//   "gain"    std::mt19937, a slight gain on each batch's inputs, seed 11 + rank
//   "noise"   pcg64, input noise, seed 23 + rank
// Components: model, optimizer, scheduler, progress (replicated: written once
// in total), sampler and rng (rank-local). Profile cpu-gloo-ddp-v1 (default)
// or unqualified (--profile unqualified, needed to resume with another world
// size together with --allow-world-size-change).
//
// Checkpoints go to the run directory RUN (default DIR/run) through
// DistributedCheckpointer: every --save-every K updates and at the end (unless
// that step was just saved). Without --resume a rank resumes from RUN's
// LATEST when it has one (how a crashed run restarts); with --resume CKPT it
// loads that step manifest (shards beside it in step-N.shards/; its digest
// from CKPT.sha256 when present). --steps counts the updates this process runs.
// --omit-rng-restore (with --resume) re-seeds every generator of every rank
// after the load: the negative control, which must diverge.
// --crash PHASE:RANK:STEP makes rank RANK SIGKILL itself in the save of step
// STEP at PHASE (before-shard, after-shard, before-commit, published).
// --torch-1-13-compatible writes every file so that Python's torch 1.13
// torch.load(..., weights_only=True) opens it (floats stored as tensors).
// --async makes the periodic saves asynchronous (save_async over a second
// Gloo group on the same store): training continues while shards are written.
//
// Rank 0 writes DIR/summary.json (the verifier's contract; every rank's
// generators appear as "rank<r>.<name>"; the per-update trace has all ranks'
// sample ids in rank order, the loss averaged over ranks, and extra fields
// world_size, profile, model_sha256, world_size_changed, saved_world_size)
// and publishes the final checkpoint in the verifier's layout: hard links
// DIR/checkpoint.pt (the step manifest), DIR/step-N.shards/rank-*.pt, and
// DIR/checkpoint.pt.sha256.
//
// A rejected load prints, on every rank, "rank R: load rejected: <code>:
// <message>" and "rank R: state unchanged: true|false" (the live state compared
// with a copy taken before the attempt), then exits 1.
// Exit: 0 done, 1 error (a failed rank: its code or signal on stderr), 2 usage
// or DIR exists.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/version.h>

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <pcg_random.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/dist/distributed.h"
#include "holdpoint/dist/gloo_process_group.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/progress.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/state/sampler.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint_version.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

constexpr std::int64_t kRows = 48;
constexpr std::int64_t kBatch = 3;  // per rank
constexpr std::uint64_t kInitSeed = 5;  // initial weights, equal on every rank
constexpr std::uint64_t kSamplerSeed = 0x5eed;
constexpr std::uint32_t kGainSeed = 11;     // + rank
constexpr std::uint64_t kNoiseSeed = 23;    // + rank
constexpr std::uint64_t kDropoutSeed = 37;  // + rank
constexpr auto kGracePeriod = std::chrono::seconds(20);
const std::vector<std::string> kPhases = {"before-shard", "after-shard", "before-commit", "published"};
const std::vector<std::string> kComponents = {"model", "optimizer", "scheduler", "progress", "sampler", "rng"};

struct Crash {
  std::string phase;
  std::int64_t rank = -1;
  std::int64_t step = -1;
};

struct Args {
  std::int64_t world = 2;
  std::int64_t steps = -1;
  fs::path output, resume, run;
  bool omit_rng_restore = false;
  std::int64_t save_every = 0;
  std::optional<Crash> crash;
  bool allow_world_size_change = false;
  bool torch_1_13_compatible = false;
  bool async_saves = false;
  holdpoint::ResumeProfile profile = holdpoint::ResumeProfile::cpu_gloo_ddp_v1;
  long timeout_ms = 30000;
  std::int64_t rank = -1;  // rank mode when >= 0
  std::string store;
};

struct UsageError {
  std::string message;
};

int usage(const std::string& message) {
  std::cerr << "train: " << message
            << "\nusage: train --steps N --output DIR [--resume CHECKPOINT] [--omit-rng-restore] [--world W]\n"
               "             [--run RUN] [--save-every K] [--crash PHASE:RANK:STEP] [--allow-world-size-change]\n"
               "             [--profile cpu-gloo-ddp-v1|unqualified] [--timeout-ms MS] [--torch-1-13-compatible] [--async]\n";
  return 2;
}

std::int64_t integer_value(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const std::int64_t parsed = std::stoll(value, &used);
    if (used == value.size()) return parsed;
  } catch (const std::exception&) {
  }
  throw UsageError{flag + " needs an integer, got '" + value + "'"};
}

Crash parse_crash(const std::string& value) {
  const auto first = value.find(':');
  const auto second = first == std::string::npos ? std::string::npos : value.find(':', first + 1);
  if (second == std::string::npos) throw UsageError{"--crash is PHASE:RANK:STEP, got '" + value + "'"};
  Crash crash{value.substr(0, first), integer_value("--crash RANK", value.substr(first + 1, second - first - 1)),
              integer_value("--crash STEP", value.substr(second + 1))};
  if (std::find(kPhases.begin(), kPhases.end(), crash.phase) == kPhases.end()) {
    throw UsageError{"--crash PHASE is before-shard, after-shard, before-commit or published, got '" + crash.phase +
                     "'"};
  }
  return crash;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--omit-rng-restore") {
      a.omit_rng_restore = true;
      continue;
    }
    if (flag == "--allow-world-size-change") {
      a.allow_world_size_change = true;
      continue;
    }
    if (flag == "--torch-1-13-compatible") {
      a.torch_1_13_compatible = true;
      continue;
    }
    if (flag == "--async") {
      a.async_saves = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
    const std::string value = argv[++i];
    if (flag == "--steps") {
      a.steps = integer_value(flag, value);
    } else if (flag == "--output") {
      a.output = value;
    } else if (flag == "--resume") {
      a.resume = value;
    } else if (flag == "--world") {
      a.world = integer_value(flag, value);
    } else if (flag == "--run") {
      a.run = value;
    } else if (flag == "--save-every") {
      a.save_every = integer_value(flag, value);
    } else if (flag == "--crash") {
      a.crash = parse_crash(value);
    } else if (flag == "--profile") {
      const auto profile = holdpoint::resume_profile_from_name(value);
      if (!profile || (*profile != holdpoint::ResumeProfile::cpu_gloo_ddp_v1 &&
                       *profile != holdpoint::ResumeProfile::unqualified)) {
        throw UsageError{"--profile is cpu-gloo-ddp-v1 or unqualified, got '" + value + "'"};
      }
      a.profile = *profile;
    } else if (flag == "--timeout-ms") {
      a.timeout_ms = static_cast<long>(integer_value(flag, value));
    } else if (flag == "--rank") {
      a.rank = integer_value(flag, value);
    } else if (flag == "--store") {
      a.store = value;
    } else {
      throw UsageError{"unknown flag " + flag};
    }
  }
  if (a.steps < 0 || a.output.empty()) throw UsageError{"--steps and --output are required"};
  if (a.world < 1 || a.world > 64) throw UsageError{"--world must be 1..64"};
  if (a.save_every < 0) throw UsageError{"--save-every must be >= 0"};
  if (a.timeout_ms < 1) throw UsageError{"--timeout-ms must be positive"};
  if (a.omit_rng_restore && a.resume.empty()) throw UsageError{"--omit-rng-restore needs --resume"};
  if (a.crash && (a.crash->rank < 0 || a.crash->rank >= a.world)) throw UsageError{"--crash RANK is not in the world"};
  if (a.rank >= a.world) throw UsageError{"--rank must be below --world"};
  if (a.rank >= 0 && a.store.empty()) throw UsageError{"--rank needs --store"};
  if (a.run.empty()) a.run = a.output / "run";
  return a;
}

// ---- launcher --------------------------------------------------------------------------

std::string random_hex() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device();
  return out.str();
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = sigabbrev_np(signal);
    return "killed by signal " + std::to_string(signal) + (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

int launch(const Args& a, int argc, char** argv) {
  std::error_code error;
  if (fs::exists(fs::symlink_status(a.output, error))) {
    return usage(a.output.string() + " exists; every run writes a new directory");
  }
  if (!fs::create_directory(a.output, error) || error) {
    std::cerr << "train: cannot create " << a.output.string() << ": " << error.message() << "\n";
    return 1;
  }
  // A fresh store per launch: a stale file would rendezvous with dead ranks.
  const fs::path store = a.output / (".store-" + std::to_string(getpid()) + "-" + random_hex());
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (error) {
    std::cerr << "train: cannot resolve /proc/self/exe: " << error.message() << "\n";
    return 1;
  }
  std::vector<pid_t> pids;
  for (std::int64_t r = 0; r < a.world; ++r) {
    std::vector<std::string> args(argv, argv + argc);
    args.insert(args.end(), {"--rank", std::to_string(r), "--store", store.string()});
    std::vector<char*> raw;
    for (auto& arg : args) raw.push_back(arg.data());
    raw.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, exe.c_str(), nullptr, nullptr, raw.data(), environ);
    if (rc != 0) {
      std::cerr << "train: cannot start rank " << r << ": " << std::strerror(rc) << "\n";
      for (pid_t started : pids) kill(started, SIGKILL);
      for (pid_t started : pids) waitpid(started, nullptr, 0);
      return 1;
    }
    pids.push_back(pid);
  }

  std::vector<std::optional<int>> statuses(pids.size());
  std::size_t running = pids.size();
  std::optional<std::chrono::steady_clock::time_point> deadline;
  bool killed = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != pid || statuses[r]) continue;
        statuses[r] = status;
        --running;
        const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && !deadline) deadline = std::chrono::steady_clock::now() + kGracePeriod;
      }
      continue;
    }
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    if (deadline && !killed && std::chrono::steady_clock::now() > *deadline) {
      for (std::size_t r = 0; r < pids.size(); ++r) {
        if (!statuses[r]) {
          std::cerr << "train: rank " << r << " still running " << kGracePeriod.count()
                    << " s after a peer failed; killing it\n";
          kill(pids[r], SIGKILL);
        }
      }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fs::remove(store, error);

  int failed = 0;
  for (std::size_t r = 0; r < pids.size(); ++r) {
    const int status = statuses[r].value_or(-1);
    if (statuses[r] && WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    ++failed;
    std::cerr << "train: rank " << r << " " << (statuses[r] ? describe_status(status) : "was lost") << "\n";
  }
  if (failed) {
    std::cerr << "train: " << failed << " of " << pids.size() << " ranks failed\n";
    return 1;
  }
  return 0;
}

// ---- rank ------------------------------------------------------------------------------

// One write per line: the ranks share the launcher's stderr, and a pipe keeps
// writes up to PIPE_BUF whole, so lines of different ranks never interleave.
void say(std::string line) {
  for (auto& c : line) {
    if (c == '\n') c = ' ';
  }
  line += '\n';
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

double uniform(auto& engine) { return std::uniform_real_distribution<double>(0.0, 1.0)(engine); }

nlohmann::json number(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

template <typename T>
std::vector<T> allgather(c10d::ProcessGroup& group, const std::vector<T>& mine, at::ScalarType dtype) {
  const auto count = static_cast<std::int64_t>(mine.size());
  std::vector<at::Tensor> input{at::empty({count}, dtype)};
  if (count) std::memcpy(input[0].data_ptr(), mine.data(), mine.size() * sizeof(T));
  std::vector<std::vector<at::Tensor>> output(1);
  for (int r = 0; r < group.getSize(); ++r) output[0].push_back(at::empty({count}, dtype));
  group.allgather(output, input)->wait();
  std::vector<T> all;
  for (const auto& t : output[0]) {
    const T* data = static_cast<const T*>(t.data_ptr());
    all.insert(all.end(), data, data + count);
  }
  return all;
}

std::string model_sha256(torch::nn::Module& model) {
  holdpoint::Sha256 hasher;
  for (const auto& parameter : model.named_parameters()) {
    const at::Tensor data = parameter.value().detach().contiguous();
    hasher.update(data.data_ptr(), data.nbytes());
  }
  return hasher.finish().hex();
}

std::vector<holdpoint::Value> capture_copies(const holdpoint::TrainingState& state) {
  std::vector<holdpoint::Value> copies;
  for (const auto& name : kComponents) copies.push_back(state.component(name)->capture(holdpoint::CaptureMode::copy));
  return copies;
}

int rank_main(const Args& a) {
  // Die with the launcher: a killed launcher must not leave ranks waiting.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) return 1;
  // Gloo writes to its peers' sockets: a peer's death must reach this rank as
  // an error of the collective (EPIPE), which it reports, not as a SIGPIPE
  // that kills it without a word.
  ::signal(SIGPIPE, SIG_IGN);
  const std::int64_t rank = a.rank, world = a.world;
  const std::string who = "rank " + std::to_string(rank) + ": ";
  const auto timeout = std::chrono::milliseconds(a.timeout_ms);
  try {
    at::set_num_threads(1);
    auto store = c10::make_intrusive<c10d::FileStore>(a.store, static_cast<int>(world));
    store->setTimeout(timeout);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("holdpoint/ddp-train", store);
    holdpoint::GlooGroupOptions options;
    options.timeout = timeout;
    const auto group_ptr =
        holdpoint::make_gloo_process_group(prefixed, static_cast<int>(rank), static_cast<int>(world), options);
    c10d::ProcessGroup& group = *group_ptr;
    // Asynchronous saves run their collectives on a group of their own.
    c10::intrusive_ptr<c10d::ProcessGroup> background_ptr;
    if (a.async_saves) {
      background_ptr = holdpoint::make_gloo_process_group(
          c10::make_intrusive<c10d::PrefixStore>("holdpoint/ddp-train-background", store), static_cast<int>(rank),
          static_cast<int>(world), options);
    }

    // The data: a fixed synthetic relation, the same on every rank.
    std::vector<double> xs, ys;
    for (std::int64_t i = 0; i < kRows; ++i) {
      const double p = std::sin(0.7 * static_cast<double>(i)), q = std::cos(1.3 * static_cast<double>(i) + 0.4);
      xs.insert(xs.end(), {p, q});
      ys.push_back(0.8 * p - 0.5 * q + 0.1 * p * q);
    }
    const at::Tensor x = at::tensor(xs, at::kDouble).reshape({kRows, 2});
    const at::Tensor y = at::tensor(ys, at::kDouble).reshape({kRows, 1});

    at::manual_seed(kInitSeed);  // the same initial weights on every rank
    torch::nn::Sequential model(torch::nn::Linear(2, 8), torch::nn::Tanh(), torch::nn::Dropout(0.25),
                                torch::nn::Linear(8, 1));
    model->to(at::kDouble);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.03));
    // Recorded as constructed: the initial learning rates are load-bearing.
    const holdpoint::Value optimizer_identity = holdpoint::optimizer_config(optimizer);
    holdpoint::StepLR scheduler(optimizer, {.step_size = 3, .gamma = 0.5});

    // Per-rank generators.
    const auto dropout_seed = kDropoutSeed + static_cast<std::uint64_t>(rank);
    const auto gain_seed = kGainSeed + static_cast<std::uint32_t>(rank);
    const auto noise_seed = kNoiseSeed + static_cast<std::uint64_t>(rank);
    at::manual_seed(dropout_seed);
    std::mt19937 gain(gain_seed);
    pcg64 noise(noise_seed);
    at::Generator dropout = at::detail::getDefaultCPUGenerator();
    holdpoint::DistributedSampler sampler(kRows, kSamplerSeed, world, rank);
    holdpoint::Progress progress;

    holdpoint::ModuleState model_state(*model);
    holdpoint::OptimizerState optimizer_state("optimizer", optimizer);
    holdpoint::ProgressState progress_state(progress);
    holdpoint::SamplerState sampler_state(sampler);
    holdpoint::RngRegistry rng;
    rng.add("dropout", dropout);
    rng.add("gain", gain);
    rng.add("noise", noise);
    const std::vector<std::string> generator_names = {"dropout", "gain", "noise"};

    holdpoint::TrainingConfig config;
    config.load_bearing("model_schema", model_state.contract());
    config.load_bearing("optimizer", optimizer_identity);
    config.load_bearing("scheduler", scheduler.config());
    config.load_bearing("loss", holdpoint::Value::string("mse"));
    {
      holdpoint::Dict batch;
      batch.insert("per_rank", holdpoint::Value::integer(kBatch));
      batch.insert("sampler", holdpoint::Value::string("distributed"));
      batch.insert("sampler_seed", holdpoint::Value::integer(static_cast<std::int64_t>(kSamplerSeed)));
      batch.insert("epoch_boundary", holdpoint::Value::string("an update never spans two epochs"));
      config.load_bearing("batch", holdpoint::Value::dict(std::move(batch)));
      holdpoint::Dict seeds;
      seeds.insert("init", holdpoint::Value::integer(static_cast<std::int64_t>(kInitSeed)));
      seeds.insert("dropout", holdpoint::Value::integer(static_cast<std::int64_t>(kDropoutSeed)));
      seeds.insert("gain", holdpoint::Value::integer(kGainSeed));
      seeds.insert("noise", holdpoint::Value::integer(static_cast<std::int64_t>(kNoiseSeed)));
      seeds.insert("per_rank", holdpoint::Value::string("seed + rank"));
      config.load_bearing("seeds", holdpoint::Value::dict(std::move(seeds)));
    }
    config.load_bearing("gradient_reduction", holdpoint::Value::string("allreduce sum / world size"));
    config.load_bearing("data", holdpoint::Value::string("sin/cos synthetic, 48 rows"));
    config.load_bearing("precision", holdpoint::Value::string("float64"));
    config.load_bearing("device", holdpoint::Value::string("cpu"));
    config.operational("save_every", holdpoint::Value::integer(a.save_every));

    holdpoint::TrainingState state;
    state.add(model_state).add(optimizer_state).add(scheduler).add(progress_state).add(sampler_state).add(rng);
    state.set_semantic_identity("holdpoint.example.ddp")
        .set_profile(a.profile)
        .set_config(config)
        .set_code_identity("examples/ddp/train.cpp")
        .set_data_identity("ddp-48-rows-v1");

    std::atomic<std::int64_t> saving_step{-1};  // read by the phase hook, on the background thread with --async
    holdpoint::DistributedCheckpointOptions checkpoint_options;
    checkpoint_options.background = background_ptr.get();
    checkpoint_options.torch_1_13_compatible = a.torch_1_13_compatible;
    checkpoint_options.phase_hook = [&](std::string_view phase) {
      if (a.crash && a.crash->rank == rank && a.crash->step == saving_step && a.crash->phase == phase) {
        say(who + "crashing at " + std::string(phase) + " of the save of step " + std::to_string(saving_step.load()));
        std::raise(SIGKILL);
      }
    };
    holdpoint::DistributedCheckpointer checkpointer(group, state, a.run, std::move(checkpoint_options));

    nlohmann::json summary = {{"schema", "holdpoint.resume-summary"},
                              {"schema_version", 1},
                              {"trainer", "holdpoint examples/ddp/train"},
                              {"world_size", world},
                              {"profile", std::string(holdpoint::resume_profile_name(a.profile))},
                              {"resumed_from", nullptr},
                              {"rng_restored", true},
                              {"world_size_changed", false},
                              {"saved_world_size", nullptr}};
    nlohmann::json generators = nlohmann::json::array();
    for (std::int64_t r = 0; r < world; ++r) {
      for (const auto& name : generator_names) generators.push_back("rank" + std::to_string(r) + "." + name);
    }
    summary["generators"] = generators;

    // Resume: the given checkpoint, or the run's LATEST.
    {
      const std::vector<holdpoint::Value> before = capture_copies(state);
      std::optional<holdpoint::DistributedLoadReport> loaded;
      std::string source;
      try {
        holdpoint::DistributedLoadOptions load;
        load.allow_world_size_change = a.allow_world_size_change;
        if (!a.resume.empty()) {
          std::ifstream sidecar(a.resume.string() + ".sha256");
          std::string digest;
          if (sidecar >> digest) {
            load.expected_sha256 = holdpoint::Sha256Digest::from_hex(digest);
            if (!load.expected_sha256) {
              throw holdpoint::Error(holdpoint::ErrorCode::invalid_argument,
                                     a.resume.string() + ".sha256 does not start with 64 hex digits");
            }
          }
          loaded = checkpointer.load_checkpoint(a.resume, load);
          source = a.resume.string();
        } else {
          loaded = checkpointer.resume(load);
          if (loaded) source = loaded->report.path.string();
        }
      } catch (const std::exception& error) {
        std::string code = "exception";
        std::string message = error.what();
        if (const auto* failure = dynamic_cast<const holdpoint::Error*>(&error)) {
          code = std::string(holdpoint::error_code_name(failure->code()));
        } else if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
          code = "c10d";
          message = c10_error->what_without_backtrace();
        }
        const std::vector<holdpoint::Value> after = capture_copies(state);
        std::string difference;
        for (std::size_t i = 0; i < before.size() && difference.empty(); ++i) {
          const std::string d = holdpoint::describe_difference(before[i], after[i]);
          if (!d.empty()) difference = kComponents[i] + d;
        }
        say(who + "load rejected: " + code + ": " + message);
        say(who + "state unchanged: " + (difference.empty() ? "true" : "false (" + difference + ")"));
        return 1;
      }
      if (loaded) {
        summary["resumed_from"] = source;
        summary["world_size_changed"] = loaded->world_size_changed;
        summary["saved_world_size"] = loaded->saved_world_size;
        if (a.omit_rng_restore) {
          // The negative control: everything restored but the generators.
          at::manual_seed(dropout_seed);
          gain.seed(gain_seed);
          noise.seed(noise_seed);
          summary["rng_restored"] = false;
        }
      }
    }

    // The next draw of every generator, taken without disturbing any stream.
    const auto next_draws = [&] {
      std::mt19937 gain_copy = gain;
      pcg64 noise_copy = noise;
      const at::Tensor saved = dropout.get_state();
      const double dropout_draw = at::rand({1}, dropout, at::kDouble).item<double>();
      dropout.set_state(saved);
      return std::vector<double>{dropout_draw, uniform(gain_copy), uniform(noise_copy)};
    };
    const auto save = [&](std::int64_t step, bool final_save) {
      checkpointer.wait();  // the previous asynchronous save, if any (its failure is thrown here)
      saving_step = step;
      holdpoint::GenerationSpec spec;
      spec.step = step;
      spec.epoch = progress.epoch;
      if (a.async_saves && !final_save) {
        checkpointer.save_async(spec);
        return;
      }
      checkpointer.save(spec);
      saving_step = -1;
    };

    nlohmann::json trace = nlohmann::json::array();
    const std::vector<at::Tensor> parameters = model->parameters();
    for (std::int64_t i = 0; i < a.steps; ++i) {
      // The batch; an exhausted epoch ends when the next batch is drawn, so a
      // checkpoint taken after its last update resumes into it.
      std::int64_t available = sampler.remaining_on_every_rank();
      if (available <= 0) {
        sampler.start_epoch(sampler.epoch() + 1);
        progress.epoch = sampler.epoch();
        progress.batch_in_epoch = 0;
        available = sampler.remaining_on_every_rank();
        if (available <= 0) {
          throw holdpoint::Error(holdpoint::ErrorCode::invalid_argument, "the sampler yields no samples per rank");
        }
      }
      const std::int64_t count = std::min(kBatch, available);
      std::vector<std::int64_t> ids;
      for (std::int64_t k = 0; k < count; ++k) ids.push_back(*sampler.next());
      const std::int64_t epoch = sampler.epoch();
      const double lr = optimizer.param_groups().at(0).options().get_lr();

      model->train();
      const at::Tensor index = at::tensor(ids, at::kLong);
      const at::Tensor inputs = x.index_select(0, index);
      const double g = 1.0 + 0.02 * (uniform(gain) - 0.5);
      at::Tensor jitter = at::empty_like(inputs);
      auto* jitter_data = jitter.data_ptr<double>();
      for (std::int64_t e = 0; e < jitter.numel(); ++e) jitter_data[e] = 0.01 * (uniform(noise) - 0.5);
      const at::Tensor outputs = model->forward(inputs * g + jitter);
      const at::Tensor loss = torch::nn::functional::mse_loss(outputs, y.index_select(0, index));
      loss.backward();

      // Data parallelism: every rank applies the mean of the ranks' gradients.
      std::vector<at::Tensor> flat{at::cat([&] {
        std::vector<at::Tensor> grads;
        for (const auto& p : parameters) grads.push_back(p.grad().reshape({-1}));
        return grads;
      }())};
      group.allreduce(flat)->wait();
      flat[0].div_(static_cast<double>(world));
      {
        at::NoGradGuard no_grad;
        std::int64_t offset = 0;
        for (const auto& p : parameters) {
          p.grad().copy_(flat[0].narrow(0, offset, p.numel()).view_as(p));
          offset += p.numel();
        }
      }
      optimizer.step();
      optimizer.zero_grad();
      scheduler.step();
      progress.global_step += 1;
      progress.batch_in_epoch += 1;
      progress.samples_seen += count * world;

      // The trace: every rank's ids, loss and next draws, gathered to all.
      std::vector<double> local{loss.item<double>()};
      for (double draw : next_draws()) local.push_back(draw);
      const std::vector<double> numbers = allgather(group, local, at::kDouble);
      const std::vector<std::int64_t> all_ids = allgather(group, ids, at::kLong);
      if (rank == 0) {
        double loss_sum = 0;
        nlohmann::json rng_next = nlohmann::json::object();
        for (std::int64_t r = 0; r < world; ++r) {
          const std::size_t base = static_cast<std::size_t>(r) * local.size();
          loss_sum += numbers[base];
          for (std::size_t k = 0; k < generator_names.size(); ++k) {
            rng_next["rank" + std::to_string(r) + "." + generator_names[k]] = numbers[base + 1 + k];
          }
        }
        trace.push_back({{"step", progress.global_step},
                         {"epoch", epoch},
                         {"sample_ids", all_ids},
                         {"lr", number(lr)},
                         {"loss", number(loss_sum / static_cast<double>(world))},
                         {"rng_next", std::move(rng_next)}});
      }
      if (a.save_every > 0 && progress.global_step % a.save_every == 0) save(progress.global_step, false);
    }
    checkpointer.wait();
    const auto latest = checkpointer.latest();
    if (!latest || latest->step != progress.global_step) save(progress.global_step, true);

    // The final evaluation, without dropout (equal on every rank).
    double mse = 0;
    {
      at::NoGradGuard no_grad;
      model->eval();
      mse = torch::nn::functional::mse_loss(model->forward(x), y).item<double>();
      model->train();
    }
    if (rank == 0) {
      // The final checkpoint in the verifier's layout, by hard links into the run.
      const auto final_generation = checkpointer.latest();
      holdpoint::RunDirectory* run = checkpointer.run_directory();
      if (!final_generation || !run) {
        throw holdpoint::Error(holdpoint::ErrorCode::invalid_argument, "no committed generation to publish");
      }
      const fs::path manifest = run->file_path(*final_generation);
      const std::string shards = holdpoint::shard_directory_name(final_generation->step);
      const auto link = [](const fs::path& from, const fs::path& to) {
        std::error_code error;
        fs::create_hard_link(from, to, error);
        if (error) fs::copy_file(from, to);  // another file system
      };
      link(manifest, a.output / "checkpoint.pt");
      fs::create_directory(a.output / shards);
      for (const auto& entry : fs::directory_iterator(manifest.parent_path() / shards)) {
        const std::string name = entry.path().filename().string();
        if (!name.empty() && name[0] != '.' && entry.is_regular_file()) link(entry.path(), a.output / shards / name);
      }
      std::ofstream(a.output / "checkpoint.pt.sha256") << final_generation->sha256.hex() << "  checkpoint.pt\n";

      summary["steps_run"] = a.steps;
      summary["global_step"] = progress.global_step;
      summary["model_sha256"] = model_sha256(*model);
      summary["versions"] = {{"holdpoint", HOLDPOINT_VERSION}, {"libtorch", TORCH_VERSION}};
      summary["final"] = {{"loss", trace.empty() ? nlohmann::json(nullptr) : trace.back()["loss"]},
                          {"mse", number(mse)},
                          {"next_lr", number(optimizer.param_groups().at(0).options().get_lr())}};
      summary["trace"] = std::move(trace);
      std::ofstream(a.output / "summary.json") << summary.dump(1) << "\n";
      std::cout << "step " << progress.global_step << "  world " << world << "  mse " << mse << "  -> "
                << a.output.string() << "\n";
    }
    return 0;
  } catch (const holdpoint::Error& error) {
    say(who + "error: " + std::string(holdpoint::error_code_name(error.code())) + ": " + error.what());
    return 1;
  } catch (const c10::Error& error) {
    say(who + "error: c10d: " + error.what_without_backtrace());
    return 1;
  } catch (const std::exception& error) {
    say(who + "error: " + error.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& error) {
    return usage(error.message);
  }
  return args.rank >= 0 ? rank_main(args) : launch(args, argc, argv);
}
