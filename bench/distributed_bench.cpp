// Sharded save over a c10d process group against a single-process save of
// the same state, measured in the same run (docs/distributed.md):
//
//   single   one TrainingState (model + rank-local sampler and generators)
//            committed to a run directory: PreparedCheckpoint streamed through
//            io::publish (SHA-256, fsync, read-back verification, rename,
//            directory fsync), sidecar, index.json, LATEST;
//   sharded  the same state on W ranks (threads of this process, each with its
//            own ProcessGroupGloo over one HashStore, loopback TCP), saved by
//            DistributedCheckpointer: each rank publishes its shard, the
//            coordinator commits the step manifest.
// Targets (issue 6): bytes written by the sharded save ~= 1x the state (not
// Wx), and its wall time <= 1.1x the single-process save. The ranks share one
// replicated model object (a rank's replicated state equals every other's by
// definition), so memory stays at 1x; the partition and the bytes written are
// exactly those of W separate copies.
//
//   distributed_bench [--mib N] [--world W] [--repeat R] [--dir DIR] [--json FILE]
//   distributed_bench --load [--worlds 2,4,8] [--mib N] [--repeat R] [--dir DIR] [--json FILE]
//
// The model is a ModuleState over 16 Linear(4096, 4*N) layers (N MiB of
// float32 weights plus biases; default N = 1024, W = 2). Runs alternate
// single and sharded saves R times (default 3); medians are reported.
//
// --load (issue 37): for each world W, one sharded save by W ranks, then R
// rounds of three loads, each after the files' pages are dropped from the
// page cache (POSIX_FADV_DONTNEED): `single`, one process loading an
// unsharded generation of the same state (the baseline); `own share`, W ranks
// each reading the step manifest and its own shard and receiving the rest
// over the group (the default); `every shard`, W ranks each reading every
// shard (read_every_shard). Each rank has its own module (default N = 128 so
// that 8 ranks fit). Reported per W: bytes each rank read from files, that
// over the state's size (target: 1/W for the sharded part), and the wall
// times. Ranks are threads of one process sharing 2 cores here, so times
// show the cost of the exchange, not a cluster's scaling.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/Parallel.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <fcntl.h>
#include <unistd.h>
#include <sstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/dist/distributed.h"
#include "holdpoint/dist/gloo_process_group.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/state/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

constexpr int kLayers = 16;
constexpr std::int64_t kInFeatures = 4096;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::uint64_t tree_bytes(const std::filesystem::path& root) {
  std::uint64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

// One rank's training state: the shared model, and its own sampler and generators.
struct RankState {
  holdpoint::ModuleState model;
  holdpoint::DistributedSampler sampler;
  holdpoint::SamplerState sampler_state{sampler};
  std::mt19937_64 engine;
  holdpoint::RngRegistry rng;
  holdpoint::TrainingState state;

  RankState(torch::nn::Module& module, std::int64_t rank, std::int64_t world)
      : model(module), sampler(1 << 20, 17, world, rank), engine(static_cast<std::uint64_t>(rank) + 1) {
    rng.add("engine", engine);
    state.add(model).add(sampler_state).add(rng);
    state.set_semantic_identity("distributed-bench");
  }
};

struct Options {
  std::int64_t mib = 1024;
  int world = 2;
  int repeat = 3;
  std::filesystem::path dir = "bench-distributed";
  std::string json_path;
  bool load = false;
  std::vector<int> worlds = {2, 4, 8};
};

torch::nn::Sequential make_module(std::int64_t mib) {
  torch::nn::Sequential module;
  for (int i = 0; i < kLayers; ++i) module->push_back(torch::nn::Linear(kInFeatures, 4 * mib));
  return module;
}

// Drops the pages of every file under `root` from the page cache, so the
// next load reads them from the device.
void drop_cached_pages(const std::filesystem::path& root) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Runs `body(rank, group)` on `world` threads over one fresh Gloo group;
// returns the wall time from the first rank's start (after a barrier) to
// the last rank's end. Exits on any rank's failure.
template <typename Body>
double run_ranks(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix, int world, Body&& body) {
  std::vector<Clock::time_point> starts(static_cast<std::size_t>(world)), ends(starts.size());
  std::vector<std::string> errors(starts.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
        const auto group_ptr = holdpoint::make_gloo_process_group(prefixed, r, world);
        body(r, *group_ptr, [&] {
          group_ptr->barrier()->wait();
          starts[static_cast<std::size_t>(r)] = Clock::now();
        });
        ends[static_cast<std::size_t>(r)] = Clock::now();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (!errors[static_cast<std::size_t>(r)].empty()) {
      std::cerr << "rank " << r << ": " << errors[static_cast<std::size_t>(r)] << "\n";
      std::exit(1);
    }
  }
  return std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) -
                                       *std::min_element(starts.begin(), starts.end()))
      .count();
}

int run_load(const Options& o) {
  at::set_num_threads(1);
  std::filesystem::remove_all(o.dir);
  std::filesystem::create_directories(o.dir);
  auto reference = make_module(o.mib);
  std::uint64_t state_bytes = 0;
  for (const auto& p : reference->parameters()) state_bytes += static_cast<std::uint64_t>(p.numel() * p.element_size());
  std::printf("state: ModuleState over %d x Linear(%lld, %lld) (%.1f MiB) + per-rank sampler and generator; "
              "ranks are threads with ProcessGroupGloo on loopback; page cache dropped before each load; "
              "median of %d\n\n",
              kLayers, static_cast<long long>(kInFeatures), static_cast<long long>(4 * o.mib),
              static_cast<double>(state_bytes) / (1 << 20), o.repeat);
  auto store = c10::make_intrusive<c10d::HashStore>();
  json results = json::array();
  std::printf("| world | shard bytes (all) | read per rank, own share (max) | read / state | 1/world | "
              "read per rank, every shard | received per rank (max) | single load | own share | every shard | "
              "own / single | every / single |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int round = 0;
  for (const int world : o.worlds) {
    const auto run_path = o.dir / ("run-" + std::to_string(world));
    const auto single_path = o.dir / ("single-" + std::to_string(world));
    // The saves: sharded by `world` ranks, and one unsharded generation.
    run_ranks(store, "save" + std::to_string(world), world, [&](int r, c10d::ProcessGroup& group, auto start) {
      RankState rank(*reference, r, world);
      holdpoint::DistributedCheckpointer checkpointer(group, rank.state, run_path);
      start();
      holdpoint::GenerationSpec spec;
      spec.step = 1;
      checkpointer.save(spec);
    });
    std::filesystem::path single_file;
    {
      RankState rank(*reference, 0, 1);
      holdpoint::RunDirectory directory(single_path);
      const holdpoint::PreparedCheckpoint prepared = rank.state.prepare_save();
      holdpoint::GenerationSpec spec;
      spec.step = 1;
      single_file = single_path / "checkpoints" /
                    directory.commit(spec, [&](holdpoint::io::ByteSink& sink) { prepared.write(sink); }).generation.name;
    }
    const auto manifest = run_path / "checkpoints" / "step-00000001.pt";
    std::uint64_t shard_total = 0;
    for (const auto& entry : std::filesystem::directory_iterator(run_path / "checkpoints" / "step-00000001.shards")) {
      shard_total += entry.file_size();
    }
    std::vector<double> single_s, own_s, every_s;
    std::uint64_t own_read_max = 0, every_read_max = 0, received_max = 0;
    std::vector<std::uint64_t> own_read(static_cast<std::size_t>(world));
    for (int rep = 0; rep < o.repeat; ++rep) {
      {
        auto module = make_module(o.mib);
        RankState rank(*module, 0, 1);
        drop_cached_pages(single_path);
        const auto start = Clock::now();
        rank.state.load_checkpoint(single_file);
        single_s.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      for (const bool every : {false, true}) {
        std::vector<torch::nn::Sequential> modules;
        for (int r = 0; r < world; ++r) modules.push_back(make_module(o.mib));
        drop_cached_pages(run_path);
        const double seconds = run_ranks(
            store, "load" + std::to_string(++round), world, [&](int r, c10d::ProcessGroup& group, auto start) {
              RankState rank(*modules[static_cast<std::size_t>(r)], r, world);
              holdpoint::DistributedCheckpointer checkpointer(group, rank.state,
                                                              o.dir / ("scratch-" + std::to_string(round)));
              holdpoint::DistributedLoadOptions options;
              options.read_every_shard = every;
              start();
              const auto report = checkpointer.load_checkpoint(manifest, options);
              static std::mutex mutex;
              const std::lock_guard<std::mutex> lock(mutex);
              if (every) {
                every_read_max = std::max(every_read_max, report.bytes_read);
              } else {
                own_read[static_cast<std::size_t>(r)] = report.bytes_read;
                own_read_max = std::max(own_read_max, report.bytes_read);
                received_max = std::max(received_max, report.bytes_received);
              }
            });
        (every ? every_s : own_s).push_back(seconds);
      }
      std::fprintf(stderr, "world %d, round %d: single %.2f s, own share %.2f s, every shard %.2f s\n", world,
                   rep + 1, single_s.back(), own_s.back(), every_s.back());
    }
    const double single = median(single_s), own = median(own_s), every = median(every_s);
    const double share = static_cast<double>(own_read_max) / static_cast<double>(state_bytes);
    const auto mib = [](std::uint64_t b) { return static_cast<double>(b) / (1 << 20); };
    std::printf("| %d | %.1f MiB | %.1f MiB | %.3f | %.3f | %.1f MiB | %.1f MiB | %.2f s | %.2f s | %.2f s | %.2f | "
                "%.2f |\n",
                world, mib(shard_total), mib(own_read_max), share, 1.0 / world, mib(every_read_max),
                mib(received_max), single, own, every, own / single, every / single);
    results.push_back({{"world", world},
                       {"state_bytes", state_bytes},
                       {"shard_bytes", shard_total},
                       {"own_share_read_per_rank", own_read},
                       {"own_share_read_max", own_read_max},
                       {"own_share_read_over_state", share},
                       {"every_shard_read_max", every_read_max},
                       {"received_max", received_max},
                       {"single_seconds", single_s},
                       {"own_share_seconds", own_s},
                       {"every_shard_seconds", every_s}});
    std::filesystem::remove_all(run_path);
    std::filesystem::remove_all(single_path);
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << results.dump(2) << "\n";
  std::filesystem::remove_all(o.dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--mib") {
      o.mib = std::stoll(value());
    } else if (arg == "--world") {
      o.world = std::stoi(value());
    } else if (arg == "--repeat") {
      o.repeat = std::stoi(value());
    } else if (arg == "--dir") {
      o.dir = value();
    } else if (arg == "--json") {
      o.json_path = value();
    } else if (arg == "--load") {
      o.load = true;
    } else if (arg == "--worlds") {
      o.worlds.clear();
      std::istringstream in(value());
      for (std::string w; std::getline(in, w, ',');) o.worlds.push_back(std::stoi(w));
    } else {
      std::cerr << "usage: distributed_bench [--mib N] [--world W] [--repeat R] [--dir DIR] [--json FILE]\n"
                   "       distributed_bench --load [--worlds 2,4,8] [--mib N] [--repeat R] [--dir DIR] [--json FILE]\n";
      return 2;
    }
  }
  if (o.load) {
    bool mib_given = false;
    for (int i = 1; i < argc; ++i) mib_given |= std::string(argv[i]) == "--mib";
    if (!mib_given) o.mib = 128;
    return run_load(o);
  }
  at::set_num_threads(1);
  std::filesystem::remove_all(o.dir);
  std::filesystem::create_directories(o.dir);

  torch::nn::Sequential module;
  for (int i = 0; i < kLayers; ++i) module->push_back(torch::nn::Linear(kInFeatures, 4 * o.mib));
  std::uint64_t state_bytes = 0;
  for (const auto& p : module->parameters()) state_bytes += static_cast<std::uint64_t>(p.numel() * p.element_size());
  std::printf("state: ModuleState over %d x Linear(%lld, %lld) (%.1f MiB) + per-rank sampler and generator; "
              "world %d (threads, ProcessGroupGloo on loopback); median of %d\n\n",
              kLayers, static_cast<long long>(kInFeatures), static_cast<long long>(4 * o.mib),
              static_cast<double>(state_bytes) / (1 << 20), o.world, o.repeat);

  std::vector<double> single_seconds, sharded_seconds;
  std::uint64_t single_bytes = 0, sharded_bytes = 0;
  std::vector<std::uint64_t> rank_bytes(static_cast<std::size_t>(o.world));
  auto store = c10::make_intrusive<c10d::HashStore>();

  for (int run = 0; run < o.repeat; ++run) {
    // Single process: one generation committed to a run directory.
    {
      const auto path = o.dir / ("single-" + std::to_string(run));
      RankState rank(*module, 0, 1);
      holdpoint::RunDirectory directory(path);
      const auto start = Clock::now();
      const holdpoint::PreparedCheckpoint prepared = rank.state.prepare_save();
      holdpoint::GenerationSpec spec;
      spec.step = 1;
      directory.commit(spec, [&](holdpoint::io::ByteSink& sink) { prepared.write(sink); });
      single_seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      single_bytes = tree_bytes(path / "checkpoints");
      std::filesystem::remove_all(path);
    }
    // Sharded: W ranks, each timing from a common barrier; wall = last end - first start.
    {
      const auto path = o.dir / ("sharded-" + std::to_string(run));
      std::vector<Clock::time_point> starts(static_cast<std::size_t>(o.world)), ends(starts.size());
      std::vector<std::string> errors(starts.size());
      std::vector<std::thread> threads;
      for (int r = 0; r < o.world; ++r) {
        threads.emplace_back([&, r] {
          try {
            auto prefixed = c10::make_intrusive<c10d::PrefixStore>("run" + std::to_string(run), store);
            const auto group_ptr = holdpoint::make_gloo_process_group(prefixed, r, o.world);
            c10d::ProcessGroup& group = *group_ptr;
            RankState rank(*module, r, o.world);
            holdpoint::DistributedCheckpointer checkpointer(group, rank.state, path);
            group.barrier()->wait();
            starts[static_cast<std::size_t>(r)] = Clock::now();
            holdpoint::GenerationSpec spec;
            spec.step = 1;
            const auto result = checkpointer.save(spec);
            ends[static_cast<std::size_t>(r)] = Clock::now();
            rank_bytes[static_cast<std::size_t>(r)] = result.bytes_written;
          } catch (const std::exception& e) {
            errors[static_cast<std::size_t>(r)] = e.what();
          }
        });
      }
      for (auto& t : threads) t.join();
      for (int r = 0; r < o.world; ++r) {
        if (!errors[static_cast<std::size_t>(r)].empty()) {
          std::cerr << "rank " << r << ": " << errors[static_cast<std::size_t>(r)] << "\n";
          return 1;
        }
      }
      sharded_seconds.push_back(
          std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) -
                                        *std::min_element(starts.begin(), starts.end()))
              .count());
      sharded_bytes = tree_bytes(path / "checkpoints");
      std::filesystem::remove_all(path);
    }
    std::fprintf(stderr, "run %d: single %.2f s, sharded %.2f s\n", run + 1, single_seconds.back(),
                 sharded_seconds.back());
  }

  const double single = median(single_seconds), sharded = median(sharded_seconds);
  const double bytes_ratio = static_cast<double>(sharded_bytes) / static_cast<double>(single_bytes);
  const double time_ratio = sharded / single;
  std::printf("| measure | single process | sharded (%d ranks) | ratio | target |\n|---|---|---|---|---|\n", o.world);
  std::printf("| bytes written (files under checkpoints/) | %.1f MiB | %.1f MiB | %.3f | ~1 (not %d) |\n",
              static_cast<double>(single_bytes) / (1 << 20), static_cast<double>(sharded_bytes) / (1 << 20),
              bytes_ratio, o.world);
  std::printf("| wall time of the save (median) | %.2f s | %.2f s | %.3f | <= 1.1 |\n\n", single, sharded, time_ratio);
  std::printf("per-rank shard bytes:");
  for (const auto b : rank_bytes) std::printf(" %.1f MiB", static_cast<double>(b) / (1 << 20));
  std::printf("\nall runs (s): single");
  for (const auto s : single_seconds) std::printf(" %.2f", s);
  std::printf("; sharded");
  for (const auto s : sharded_seconds) std::printf(" %.2f", s);
  std::printf("\n");
  if (!o.json_path.empty()) {
    json out = {{"world", o.world},
                {"state_bytes", state_bytes},
                {"single_bytes", single_bytes},
                {"sharded_bytes", sharded_bytes},
                {"bytes_ratio", bytes_ratio},
                {"single_seconds", single_seconds},
                {"sharded_seconds", sharded_seconds},
                {"time_ratio", time_ratio},
                {"rank_bytes", rank_bytes}};
    std::ofstream(o.json_path) << out.dump(2) << "\n";
  }
  std::filesystem::remove_all(o.dir);
  return 0;
}
