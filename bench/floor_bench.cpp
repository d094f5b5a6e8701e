// The performance targets of issue 13, each as a ratio against its floor
// measured in the same run, with met / not met.
//
// The floor: a save cannot take less than max(the fastest durable write of
// the bytes this machine allows, one SHA-256 pass over them) and a verified
// load cannot take less than max(raw read, one SHA-256 pass), because the
// sidecar is a plain SHA-256 of the whole file and SHA-256 is sequential. Loads are measured twice: warm (repeated in this
// process) and as the first load of a fresh process (a child of this one,
// timed from inside it, around the load call only), which pays for faulting
// in fresh memory as a user's first load does. Whole-process figures (the
// CLI's verify and inspect, openssl dgst) are wall times of a child process.
// Peers: LibTorch torch::save/load here; holdpoint's 2-rank sharded save
// through distributed_bench; Python torch, safetensors and DCP through
// bench/python_peers.py (all children, skipped by --no-peers).
//
//   floor_bench [--dir DIR] [--repeat N] [--mib M] [--python PY] [--no-peers] [--no-growth] [--quick]
//
// Prints Markdown (bench/RESULTS.md records a run); exits 0 even when a target
// is not met (the report says so).
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/rand.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/progress.h"
#include "holdpoint/tensor/torch_tensor.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// ---- measuring ---------------------------------------------------------------------------

double seconds_of(const std::function<void()>& action) {
  const auto start = Clock::now();
  action();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

double median_of(int repeat, const std::function<double()>& run) {
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) times.push_back(run());
  return median(times);
}

// Lets writeback of earlier saves finish, so that no measurement pays for the
// previous one's aftermath.
void settle() {
  ::sync();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
}

struct ProcessResult {
  double wall = 0;
  std::uint64_t max_rss_bytes = 0;
  std::string output;
  int status = -1;
};

// Where children's stderr goes (shown when one fails).
std::string child_stderr = "/dev/null";

// Runs argv as a child with stdout captured (stderr to child_stderr), timing
// its whole life and reading its peak RSS from wait4.
ProcessResult run_process(const std::vector<std::string>& args) {
  int out[2];
  if (::pipe(out) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, child_stderr.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const auto start = Clock::now();
  if (posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) {
    throw std::runtime_error("cannot run " + args[0]);
  }
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ProcessResult result;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(out[0], buffer, sizeof buffer)) > 0) result.output.append(buffer, static_cast<std::size_t>(n));
  ::close(out[0]);
  struct rusage usage {};
  ::wait4(pid, &result.status, 0, &usage);
  result.wall = std::chrono::duration<double>(Clock::now() - start).count();
  result.max_rss_bytes = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
  return result;
}

// A whole process under /usr/bin/time, which forks it from a small process:
// wait4's ru_maxrss of a child spawned from this (large) process would report
// this process's RSS, which exec carries over.
ProcessResult run_measured(const std::vector<std::string>& args, const fs::path& rss_file) {
  std::vector<std::string> wrapped = {"/usr/bin/time", "-f", "%M", "-o", rss_file.string()};
  wrapped.insert(wrapped.end(), args.begin(), args.end());
  ProcessResult result = run_process(wrapped);
  std::ifstream in(rss_file);
  std::uint64_t kib = 0;
  in >> kib;
  result.max_rss_bytes = kib * 1024;
  return result;
}

// A child run of this binary in one of its --child modes, which prints the
// seconds of the timed call (and optionally more numbers).
std::vector<double> child_figures(const std::vector<std::string>& args) {
  const ProcessResult result = run_process(args);
  if (result.status != 0) {
    std::ifstream errors(child_stderr);
    const std::string text((std::istreambuf_iterator<char>(errors)), std::istreambuf_iterator<char>());
    throw std::runtime_error("child failed: " + args.at(2) + " (status " + std::to_string(result.status) + "): " + text);
  }
  std::istringstream in(result.output);
  std::vector<double> figures;
  double x;
  while (in >> x) figures.push_back(x);
  if (figures.empty()) throw std::runtime_error("child printed nothing: " + args.at(2));
  return figures;
}

double child_median(int repeat, const std::vector<std::string>& args) {
  return median_of(repeat, [&] { return child_figures(args).at(0); });
}

std::uint64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  }
  return 0;
}

// ---- baselines ---------------------------------------------------------------------------

struct Span {
  const void* data;
  std::size_t size;
};

// The fastest durable write of the same bytes this machine allows (issue 38,
// item 7): a floor a measured save beats is a naive baseline. Three ways, each
// ending in fsync, and the floor is the fastest:
//   plain           one write() per span;
//   early_writeback the same, starting writeback of every 32 MiB written
//                   (sync_file_range), as holdpoint's own writer does, so the
//                   final fsync has little left to wait for;
//   direct          8 MiB aligned O_DIRECT writes from one staging buffer (the
//                   copy into it included; the tail padded, then truncated),
//                   where the file system takes O_DIRECT.
enum class DurableWay { plain, early_writeback, direct };
constexpr DurableWay kDurableWays[] = {DurableWay::plain, DurableWay::early_writeback, DurableWay::direct};

const char* durable_way_name(DurableWay way) {
  switch (way) {
    case DurableWay::plain: return "write() per tensor + fsync";
    case DurableWay::early_writeback: return "write() + early writeback every 32 MiB + fsync";
    case DurableWay::direct: return "8 MiB aligned O_DIRECT writes + fsync";
  }
  return "?";
}

void write_all(int fd, const char* p, std::size_t left) {
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n <= 0) throw std::runtime_error(std::string("raw write failed: ") + std::strerror(errno));
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

// Seconds for `way`, or nullopt where the file system refuses it (O_DIRECT on tmpfs).
std::optional<double> durable_write(const fs::path& path, const std::vector<Span>& spans, DurableWay way) {
  fs::remove(path);
  if (way == DurableWay::direct) {
    const int probe = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (probe < 0) return std::nullopt;
    ::close(probe);
    fs::remove(path);
  }
  constexpr std::size_t kChunk = std::size_t{8} << 20;
  constexpr std::uint64_t kWriteback = std::uint64_t{32} << 20;
  void* staging = nullptr;
  if (way == DurableWay::direct && ::posix_memalign(&staging, 4096, kChunk) != 0) return std::nullopt;
  std::unique_ptr<void, decltype(&std::free)> staging_owner(staging, &std::free);
  return seconds_of([&] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (way == DurableWay::direct ? O_DIRECT : 0), 0644);
    if (fd < 0) throw std::runtime_error("raw write: cannot open " + path.string());
    std::uint64_t written = 0, writeback_from = 0;
    std::size_t filled = 0;
    auto* buffer = static_cast<char*>(staging);
    for (const Span& span : spans) {
      const char* p = static_cast<const char*>(span.data);
      if (way != DurableWay::direct) {
        write_all(fd, p, span.size);
        written += span.size;
        if (way == DurableWay::early_writeback && written - writeback_from >= kWriteback) {
          ::sync_file_range(fd, static_cast<off64_t>(writeback_from), static_cast<off64_t>(written - writeback_from),
                            SYNC_FILE_RANGE_WRITE);
          writeback_from = written;
        }
        continue;
      }
      for (std::size_t left = span.size; left > 0;) {
        const std::size_t take = std::min(left, kChunk - filled);
        std::memcpy(buffer + filled, p, take);
        filled += take, p += take, left -= take, written += take;
        if (filled == kChunk) write_all(fd, buffer, kChunk), filled = 0;
      }
    }
    if (way == DurableWay::direct && filled > 0) {
      const std::size_t padded = (filled + 4095) / 4096 * 4096;
      std::memset(buffer + filled, 0, padded - filled);
      write_all(fd, buffer, padded);
      if (::ftruncate(fd, static_cast<off_t>(written)) != 0) throw std::runtime_error("raw write: ftruncate failed");
    }
    ::fsync(fd);
    ::close(fd);
  });
}

// Every way once, in turn; the fastest is the repetition's floor. `samples`
// (by way) collects each way's time for the report.
double raw_write_fsync(const fs::path& path, const std::vector<Span>& spans,
                       std::vector<std::vector<double>>* samples = nullptr) {
  double fastest = std::numeric_limits<double>::infinity();
  for (const DurableWay way : kDurableWays) {
    const auto seconds = durable_write(path, spans, way);
    fs::remove(path);
    if (!seconds) continue;
    fastest = std::min(fastest, *seconds);
    if (samples) {
      samples->resize(std::size(kDurableWays));
      (*samples)[static_cast<std::size_t>(way)].push_back(*seconds);
    }
  }
  return fastest;
}

// Reads the file into fresh anonymous memory, as any loader must; the time
// includes faulting the pages in. `loader_memory` reads into a buffer from
// io::Buffer::allocate instead of plain 4 KiB pages: the loader's own
// allocation, with huge pages where the kernel has them free. The floor is
// the faster of the two, so a loader cannot beat its floor by allocating
// better than the baseline does.
double raw_read(const fs::path& path, bool loader_memory) {
  const auto size = static_cast<std::size_t>(fs::file_size(path));
  void* memory = nullptr;
  std::shared_ptr<holdpoint::io::Buffer> buffer;
  const double seconds = seconds_of([&] {
    if (loader_memory) {
      buffer = holdpoint::io::Buffer::allocate(size);
      memory = buffer->data();
    } else {
      memory = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    const int fd = ::open(path.c_str(), O_RDONLY);
    // The loader's memory is filled the loader's way: a range populated (and
    // moved to small pages if its huge pages come in slowly), then read.
    const std::size_t piece = loader_memory ? std::size_t{4} << 20 : size;
    std::size_t done = 0;
    while (done < size) {
      const std::size_t want = std::min(piece, size - done);
      if (loader_memory) buffer->populate(done, want);
      const ssize_t n = ::read(fd, static_cast<char*>(memory) + done, want);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
  });
  if (!loader_memory) ::munmap(memory, size);
  return seconds;
}

// Medians of both kinds of raw read, warm (this process) and fresh (a child
// each time).
struct RawReads {
  double small_warm = 0, small_fresh = 0, loader_warm = 0, loader_fresh = 0;
  double warm() const { return std::min(small_warm, loader_warm); }
  double fresh() const { return std::min(small_fresh, loader_fresh); }
};

RawReads raw_reads(const std::string& self, const fs::path& file, int repeat) {
  RawReads r;
  r.small_warm = median_of(repeat, [&] { return raw_read(file, false); });
  r.loader_warm = median_of(repeat, [&] { return raw_read(file, true); });
  r.small_fresh = child_median(repeat, {self, "--child", "raw-read", file.string(), "small"});
  r.loader_fresh = child_median(repeat, {self, "--child", "raw-read", file.string(), "loader"});
  return r;
}

double sha256_pass(const fs::path& path, int repeat) {
  std::vector<char> bytes(fs::file_size(path));
  std::ifstream(path, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return median_of(repeat, [&] {
    return seconds_of([&] { holdpoint::Sha256::of({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()}); });
  });
}

// ---- the states --------------------------------------------------------------------------

// A model of `layers` Linear(1024, width) layers, Adam with its state after one
// step, and progress: parameters + exp_avg + exp_avg_sq ~= `mib` MiB.
struct Setup {
  Setup(std::int64_t mib, std::uint64_t seed) {
    at::manual_seed(seed);
    const std::int64_t width = std::max<std::int64_t>(1, (mib << 20) / 3 / kLayers / (1024 * 4));
    for (int i = 0; i < kLayers; ++i) model->push_back(torch::nn::Linear(torch::nn::LinearOptions(1024, width).bias(false)));
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
    for (auto& p : model->parameters()) p.mutable_grad() = at::ones_like(p);
    optimizer->step();
    module_state = std::make_unique<holdpoint::ModuleState>(*model);
    optimizer_state = std::make_unique<holdpoint::OptimizerState>("optimizer", *optimizer);
    progress_state = std::make_unique<holdpoint::ProgressState>(progress);
    state.set_semantic_identity("floor-bench").add(*module_state).add(*optimizer_state).add(*progress_state);
  }

  std::vector<Span> spans() const {
    std::vector<Span> out;
    for (const auto& p : model->parameters()) out.push_back({p.data_ptr(), p.nbytes()});
    for (const auto& group : optimizer->state()) {
      const auto& adam = static_cast<const torch::optim::AdamParamState&>(*group.second);
      out.push_back({adam.exp_avg().data_ptr(), adam.exp_avg().nbytes()});
      out.push_back({adam.exp_avg_sq().data_ptr(), adam.exp_avg_sq().nbytes()});
    }
    return out;
  }

  static constexpr int kLayers = 16;
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Adam> optimizer;
  holdpoint::Progress progress;
  std::unique_ptr<holdpoint::ModuleState> module_state;
  std::unique_ptr<holdpoint::OptimizerState> optimizer_state;
  std::unique_ptr<holdpoint::ProgressState> progress_state;
  holdpoint::TrainingState state;
};

holdpoint::CheckpointManagerOptions manager_options() {
  holdpoint::CheckpointManagerOptions options;
  options.run.retention.keep_last = 2;
  options.run.log = [](const std::string&) {};
  return options;
}

struct FlatState {
  std::vector<at::Tensor> tensors;
  holdpoint::Value mapping;
  std::vector<Span> spans;
};

FlatState flat_state(std::int64_t tensors, std::int64_t elements) {
  FlatState out;
  holdpoint::Dict entries;
  for (std::int64_t i = 0; i < tensors; ++i) {
    at::Tensor t = at::rand({elements});
    entries.insert("layer" + std::to_string(i) + ".weight", holdpoint::tensor_value(t));
    out.spans.push_back({t.data_ptr(), t.nbytes()});
    out.tensors.push_back(t);
  }
  out.mapping = holdpoint::Value::ordered_dict(std::move(entries));
  return out;
}

// ---- child modes -------------------------------------------------------------------------

int run_child(const std::vector<std::string>& args) {
  const std::string& kind = args.at(0);
  const std::uint64_t rss_before = status_kib("VmRSS:");
  double seconds = 0;
  if (kind == "raw-read") {
    seconds = raw_read(args.at(1), args.at(2) == "loader");
  } else if (kind == "load") {
    holdpoint::LoadOptions options;
    // "-": no expected digest, so no SHA-256 pass (CRC-32s and structure only).
    if (args.at(2) != "-") options.expected_sha256 = holdpoint::Sha256Digest::parse(args.at(2));
    holdpoint::LoadedMapping mapping;
    seconds = seconds_of([&] { mapping = holdpoint::load_checkpoint_mapping(args.at(1), options); });
    if (!mapping.root.is_dict()) return 1;
  } else if (kind == "resume") {
    Setup setup(std::stoll(args.at(2)), 7);
    holdpoint::CheckpointManager manager(args.at(1), setup.state, manager_options());
    std::optional<holdpoint::LoadReport> report;
    seconds = seconds_of([&] { report = manager.resume(); });
    if (!report) return 1;
  } else if (kind == "torch-load") {
    std::vector<at::Tensor> loaded;
    seconds = seconds_of([&] { torch::load(loaded, args.at(1)); });
    if (loaded.empty()) return 1;
  } else {
    return 2;
  }
  const std::uint64_t peak = status_kib("VmHWM:");
  std::printf("%.6f %llu\n", seconds, static_cast<unsigned long long>((peak > rss_before ? peak - rss_before : 0) * 1024));
  return 0;
}

// ---- the report --------------------------------------------------------------------------

struct Target {
  std::string name;
  double measured;
  double bound;
  bool at_most;  // measured <= bound (else >=)
  std::string detail;
  bool met() const { return at_most ? measured <= bound : measured >= bound; }
};

std::vector<Target> targets;

void target(std::string name, double measured, double bound, bool at_most, std::string detail) {
  targets.push_back({std::move(name), measured, bound, at_most, std::move(detail)});
}

void row(const std::string& what, double seconds, double bytes, double ours) {
  std::printf("| %s | %.3f | %.2f | %s |\n", what.c_str(), seconds, bytes / 1e9 / seconds,
              ours > 0 ? (std::to_string(seconds / ours).substr(0, 5) + "x").c_str() : "-");
}

struct Paths {
  std::string self;
  std::string cli;
  std::string publication_bench;
  std::string distributed_bench;
  std::string python;
  std::string python_peers;
  fs::path dir;
};

// ---- 1 GiB ---------------------------------------------------------------------------------

void big_case(const Paths& paths, std::int64_t mib, int repeat) {
  Setup setup(mib, 1);
  std::uint64_t state_bytes = 0;
  for (const Span& s : setup.spans()) state_bytes += s.size;
  const double bytes = static_cast<double>(state_bytes);
  const fs::path run = paths.dir / "floor-run";
  const fs::path raw = paths.dir / "raw.bin";
  const fs::path mapping_file = paths.dir / "mapping.pt";
  fs::remove_all(run);

  // Saves, each paired with its baselines.
  std::vector<double> raw_saves, manager_saves, mapping_saves;
  std::vector<std::vector<double>> raw_ways;  // each way of a durable write, by DurableWay
  auto manager = std::make_unique<holdpoint::CheckpointManager>(run, setup.state, manager_options());
  holdpoint::Dict flat;
  {
    int i = 0;
    for (const auto& p : setup.model->named_parameters()) flat.insert(p.key(), holdpoint::tensor_value(p.value()));
    for (const auto& group : setup.optimizer->state()) {
      const auto& adam = static_cast<const torch::optim::AdamParamState&>(*group.second);
      flat.insert("exp_avg." + std::to_string(i), holdpoint::tensor_value(adam.exp_avg()));
      flat.insert("exp_avg_sq." + std::to_string(i++), holdpoint::tensor_value(adam.exp_avg_sq()));
    }
  }
  const holdpoint::Value flat_mapping = holdpoint::Value::ordered_dict(std::move(flat));
  holdpoint::SaveResult mapping_saved;
  for (int i = 0; i < repeat; ++i) {
    settle();
    raw_saves.push_back(raw_write_fsync(raw, setup.spans(), &raw_ways));
    fs::remove(raw);
    settle();
    holdpoint::GenerationSpec spec;
    spec.step = ++setup.progress.global_step;
    manager_saves.push_back(seconds_of([&] { manager->save(spec); }));
    settle();
    fs::remove(mapping_file);
    mapping_saves.push_back(seconds_of([&] { mapping_saved = holdpoint::save_mapping(mapping_file, flat_mapping); }));
  }
  const auto latest = manager->run().latest();
  const fs::path generation = manager->run().file_path(*latest);
  manager.reset();  // releases the run's lock for the resumes below
  const double file_bytes = static_cast<double>(fs::file_size(generation));
  const double sha = sha256_pass(generation, repeat);
  const double raw_save = median(raw_saves);
  const double save_floor = std::max(raw_save, sha);

  // LibTorch torch::save / load of the same tensors.
  std::vector<at::Tensor> tensors;
  for (const auto& p : setup.model->parameters()) tensors.push_back(p);
  for (const auto& group : setup.optimizer->state()) {
    const auto& adam = static_cast<const torch::optim::AdamParamState&>(*group.second);
    tensors.push_back(adam.exp_avg());
    tensors.push_back(adam.exp_avg_sq());
  }
  const fs::path libtorch = paths.dir / "libtorch.pt";
  const double libtorch_save = median_of(repeat, [&] {
    settle();
    fs::remove(libtorch);
    return seconds_of([&] {
      torch::save(tensors, libtorch.string());
      const int fd = ::open(libtorch.c_str(), O_RDONLY);
      ::fsync(fd);
      ::close(fd);
    });
  });
  settle();

  // Loads.
  const std::string digest = latest->sha256.hex();
  const RawReads reads = raw_reads(paths.self, generation, repeat);
  const double read_fresh = reads.fresh(), read_warm = reads.warm();
  const double resume_fresh =
      child_median(repeat, {paths.self, "--child", "resume", run.string(), std::to_string(mib)});
  double resume_warm = 0;
  {
    Setup live(mib, 2);
    holdpoint::CheckpointManager resumer(run, live.state, manager_options());
    resume_warm = median_of(repeat, [&] { return seconds_of([&] { resumer.resume(); }); });
  }
  const double load_fresh = child_median(repeat, {paths.self, "--child", "load", generation.string(), digest});
  holdpoint::LoadOptions verified;
  verified.expected_sha256 = latest->sha256;
  const double load_warm = median_of(repeat, [&] {
    holdpoint::LoadedMapping mapping;
    const double s = seconds_of([&] { mapping = holdpoint::load_checkpoint_mapping(generation, verified); });
    return s;
  });
  const double unchecked_fresh = child_median(repeat, {paths.self, "--child", "load", generation.string(), "-"});
  const double unchecked_warm = median_of(repeat, [&] {
    holdpoint::LoadedMapping mapping;
    return seconds_of([&] { mapping = holdpoint::load_checkpoint_mapping(generation); });
  });
  const double libtorch_load_fresh = child_median(repeat, {paths.self, "--child", "torch-load", libtorch.string()});
  const double libtorch_load_warm = median_of(repeat, [&] {
    std::vector<at::Tensor> loaded;
    return seconds_of([&] { torch::load(loaded, libtorch.string()); });
  });
  std::vector<double> verify_walls, openssl_walls;
  std::uint64_t verify_rss = 0;
  for (int i = 0; i < repeat; ++i) {
    const ProcessResult verify =
        run_measured({paths.cli, "verify", generation.string(), "--sha256", digest}, paths.dir / "rss.txt");
    if (verify.status != 0) throw std::runtime_error("holdpoint verify failed: " + verify.output);
    verify_walls.push_back(verify.wall);
    verify_rss = std::max(verify_rss, verify.max_rss_bytes);
    openssl_walls.push_back(run_measured({"openssl", "dgst", "-sha256", generation.string()}, paths.dir / "rss.txt").wall);
  }
  const ProcessResult tiny_verify = run_measured({paths.cli, "--version"}, paths.dir / "rss.txt");
  const double verify_wall = median(verify_walls), openssl_wall = median(openssl_walls);
  const double fresh_floor = std::max(read_fresh, sha), warm_floor = std::max(read_warm, sha);

  std::printf("\n### 1. Save, %lld MiB TrainingState (16 Linear layers + Adam state after one step; file %.1f MiB), "
              "median of %d\n\n",
              static_cast<long long>(mib), file_bytes / (1 << 20), repeat);
  std::printf("| operation | seconds | GB/s | x holdpoint's time |\n|---|---|---|---|\n");
  row("CheckpointManager::save (sync, durable: file + sidecar + index + LATEST)", median(manager_saves), bytes, 0);
  row("save_mapping of the same tensors (durable, sidecar)", median(mapping_saves), bytes, 0);
  for (std::size_t way = 0; way < raw_ways.size(); ++way) {
    if (raw_ways[way].empty()) continue;
    const std::string what = std::string("raw durable write, ") + durable_way_name(kDurableWays[way]);
    row(what.c_str(), median(raw_ways[way]), bytes, median(manager_saves));
  }
  row("floor: the fastest durable write of the tensor bytes (median of each repetition's fastest way)", raw_save,
      bytes, median(manager_saves));
  row("floor: one SHA-256 pass over the file (in memory)", sha, bytes, median(manager_saves));
  row("LibTorch torch::save + fsync (no digest)", libtorch_save, bytes, median(manager_saves));
  target("1 GiB CheckpointManager save / max(fastest durable write, SHA-256)", median(manager_saves) / save_floor, 1.15,
         true, "");
  target("1 GiB save_mapping / max(fastest durable write, SHA-256)", median(mapping_saves) / save_floor, 1.15, true, "");

  std::printf("\n### 2. Resume and verified load of that generation, median of %d\n\n", repeat);
  std::printf("| operation | fresh process (s) | warm (s) |\n|---|---|---|\n");
  std::printf("| CheckpointManager::resume (LATEST digest, validation, apply into live model + Adam) | %.3f | %.3f |\n",
              resume_fresh, resume_warm);
  std::printf("| load_checkpoint_mapping with expected SHA-256 | %.3f | %.3f |\n", load_fresh, load_warm);
  std::printf("| load_checkpoint_mapping, no digest (CRC-32s and structure; no SHA-256) | %.3f | %.3f |\n",
              unchecked_fresh, unchecked_warm);
  std::printf("| floor: raw read into fresh 4 KiB pages | %.3f | %.3f |\n", reads.small_fresh, reads.small_warm);
  std::printf("| floor: raw read into the loader's memory, filled its way (huge pages when free and fast) "
              "| %.3f | %.3f |\n",
              reads.loader_fresh, reads.loader_warm);
  std::printf("| floor: one SHA-256 pass (in memory) | %.3f | %.3f |\n", sha, sha);
  std::printf("| LibTorch torch::load (no digest) | %.3f | %.3f |\n", libtorch_load_fresh, libtorch_load_warm);
  std::printf("\n| whole process | wall (s) | peak RSS (MiB) |\n|---|---|---|\n");
  std::printf("| holdpoint verify FILE --sha256 (streams) | %.3f | %.1f |\n", verify_wall,
              static_cast<double>(verify_rss) / (1 << 20));
  std::printf("| openssl dgst -sha256 FILE | %.3f | - |\n", openssl_wall);
  target("1 GiB resume, fresh process / max(raw read, SHA-256)", resume_fresh / fresh_floor, 1.15, true, "");
  target("1 GiB resume, warm / max(raw read, SHA-256)", resume_warm / warm_floor, 1.15, true, "");
  target("1 GiB load_checkpoint_mapping + digest, fresh / floor", load_fresh / fresh_floor, 1.15, true, "");
  target("1 GiB load_checkpoint_mapping + digest, warm / floor", load_warm / warm_floor, 1.15, true, "");
  target("1 GiB load_checkpoint_mapping (no digest) / LibTorch torch::load, fresh process",
         unchecked_fresh / libtorch_load_fresh, 1.0, true, "");
  target("1 GiB load_checkpoint_mapping (no digest) / LibTorch torch::load, warm", unchecked_warm / libtorch_load_warm,
         1.0, true, "");
  target("1 GiB holdpoint verify / openssl dgst -sha256 (whole process)", verify_wall / openssl_wall, 1.3, true, "");
  target("1 GiB holdpoint verify: extra RSS (MiB) over a bare start",
         static_cast<double>(verify_rss - std::min(verify_rss, tiny_verify.max_rss_bytes)) / (1 << 20), 256, true, "");
  fs::remove(libtorch);
  fs::remove(mapping_file);
  fs::remove(mapping_file.string() + ".sha256");
  fs::remove_all(run);
}

// ---- many small tensors --------------------------------------------------------------------

struct SmallFigures {
  double save = 0, raw_save = 0, load_warm = 0, load_fresh = 0, sha = 0;
  RawReads reads;
  double verify = 0, inspect = 0, libtorch_save = 0, libtorch_load = 0;
  std::uint64_t load_peak = 0, verify_rss = 0, file_bytes = 0;
};

SmallFigures small_case(const Paths& paths, std::int64_t tensors, std::int64_t elements, int repeat, bool peers) {
  const FlatState state = flat_state(tensors, elements);
  const fs::path file = paths.dir / "small.pt";
  const fs::path raw = paths.dir / "small-raw.bin";
  SmallFigures f;
  holdpoint::SaveResult saved;
  std::vector<double> saves, raws;
  for (int i = 0; i < repeat; ++i) {
    settle();
    raws.push_back(raw_write_fsync(raw, state.spans));
    fs::remove(raw);
    fs::remove(file);
    saves.push_back(seconds_of([&] { saved = holdpoint::save_mapping(file, state.mapping); }));
  }
  f.save = median(saves);
  f.raw_save = median(raws);
  f.file_bytes = saved.file_bytes;
  settle();
  holdpoint::LoadOptions verified;
  verified.expected_sha256 = saved.sha256;
  f.load_warm = median_of(repeat, [&] {
    holdpoint::LoadedMapping mapping;
    return seconds_of([&] { mapping = holdpoint::load_checkpoint_mapping(file, verified); });
  });
  std::vector<double> fresh;
  for (int i = 0; i < repeat; ++i) {
    const auto figures = child_figures({paths.self, "--child", "load", file.string(), saved.sha256.hex()});
    fresh.push_back(figures.at(0));
    f.load_peak = std::max<std::uint64_t>(f.load_peak, static_cast<std::uint64_t>(figures.at(1)));
  }
  f.load_fresh = median(fresh);
  f.reads = raw_reads(paths.self, file, repeat);
  f.sha = sha256_pass(file, repeat);
  std::vector<double> verifies, inspects;
  for (int i = 0; i < repeat; ++i) {
    const ProcessResult verify =
        run_measured({paths.cli, "verify", file.string(), "--sha256", saved.sha256.hex()}, paths.dir / "rss.txt");
    if (verify.status != 0) throw std::runtime_error("holdpoint verify failed");
    verifies.push_back(verify.wall);
    f.verify_rss = std::max(f.verify_rss, verify.max_rss_bytes);
    inspects.push_back(run_measured({paths.cli, "inspect", file.string()}, paths.dir / "rss.txt").wall);
  }
  f.verify = median(verifies);
  f.inspect = median(inspects);
  if (peers) {
    const fs::path libtorch = paths.dir / "small-libtorch.pt";
    f.libtorch_save = median_of(repeat, [&] {
      fs::remove(libtorch);
      return seconds_of([&] {
        torch::save(state.tensors, libtorch.string());
        const int fd = ::open(libtorch.c_str(), O_RDONLY);
        ::fsync(fd);
        ::close(fd);
      });
    });
    f.libtorch_load = child_median(repeat, {paths.self, "--child", "torch-load", libtorch.string()});
    fs::remove(libtorch);
  }
  fs::remove(file);
  fs::remove(file.string() + ".sha256");
  return f;
}

struct SaveCase {
  std::int64_t tensors = 0, elements = 0;
  SmallFigures* figures = nullptr;
};

// Times save_mapping and the raw write + fsync of each case in turn, then the
// verified load of each case's file in a fresh process in turn, `repeat`
// rounds of each, and stores the medians in the cases' figures.
void interleaved_saves_and_loads(const Paths& paths, const std::vector<SaveCase>& cases, int repeat) {
  std::vector<FlatState> states;
  for (const SaveCase& c : cases) states.push_back(flat_state(c.tensors, c.elements));
  std::vector<std::vector<double>> saves(cases.size()), raws(cases.size()), loads(cases.size());
  std::vector<holdpoint::SaveResult> saved(cases.size());
  const auto file = [&](std::size_t c) { return paths.dir / ("paired-" + std::to_string(c) + ".pt"); };
  const fs::path raw = paths.dir / "paired-raw.bin";
  for (int i = 0; i < repeat; ++i) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      settle();
      raws[c].push_back(raw_write_fsync(raw, states[c].spans));
      fs::remove(raw);
      fs::remove(file(c));
      saves[c].push_back(seconds_of([&] { saved[c] = holdpoint::save_mapping(file(c), states[c].mapping); }));
    }
  }
  states.clear();
  settle();
  for (int i = 0; i < repeat; ++i) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      loads[c].push_back(
          child_figures({paths.self, "--child", "load", file(c).string(), saved[c].sha256.hex()}).at(0));
    }
  }
  for (std::size_t c = 0; c < cases.size(); ++c) {
    cases[c].figures->save = median(saves[c]);
    cases[c].figures->raw_save = median(raws[c]);
    cases[c].figures->load_fresh = median(loads[c]);
    fs::remove(file(c));
    fs::remove(file(c).string() + ".sha256");
  }
}

void many_case(const Paths& paths, int repeat, bool growth) {
  const SmallFigures f = small_case(paths, 20000, 1000, repeat, true);
  const double bytes = 20000.0 * 1000 * 4;
  std::printf("\n### 3. 20,000 small tensors (1000 float32 each, file %.1f MiB), median of %d\n\n",
              static_cast<double>(f.file_bytes) / (1 << 20), repeat);
  std::printf("| operation | seconds | GB/s | x holdpoint's time |\n|---|---|---|---|\n");
  row("save_mapping (durable, sidecar)", f.save, bytes, 0);
  row("fastest durable write of the tensor bytes (plain, early writeback or O_DIRECT)", f.raw_save, bytes, f.save);
  row("LibTorch torch::save + fsync", f.libtorch_save, bytes, f.save);
  row("verified load, warm", f.load_warm, bytes, 0);
  row("verified load, fresh process", f.load_fresh, bytes, 0);
  row("floor: raw read into 4 KiB pages, warm", f.reads.small_warm, bytes, f.load_warm);
  row("floor: raw read into 4 KiB pages, fresh process", f.reads.small_fresh, bytes, f.load_fresh);
  row("floor: raw read into the loader's memory, warm", f.reads.loader_warm, bytes, f.load_warm);
  row("floor: raw read into the loader's memory, fresh process", f.reads.loader_fresh, bytes, f.load_fresh);
  row("floor: one SHA-256 pass", f.sha, bytes, f.load_warm);
  row("LibTorch torch::load, fresh process", f.libtorch_load, bytes, f.load_fresh);
  target("20k tensors: verified load, warm / max(raw read, SHA-256)", f.load_warm / std::max(f.reads.warm(), f.sha), 1.15,
         true, "");
  target("20k tensors: verified load, fresh / max(raw read, SHA-256)", f.load_fresh / std::max(f.reads.fresh(), f.sha),
         1.15, true, "");
  target("20k tensors: raw write+fsync / save (speed relative to raw)", f.raw_save / f.save, 1.0, false, "");
  if (!growth) return;

  SmallFigures small = small_case(paths, 20000, 300, repeat, false);
  SmallFigures large = small_case(paths, 200000, 300, repeat, false);
  // Saves and fresh loads are timed again in pairs, 20k then 200k, so that a
  // drift of the disk or the guest within the section weighs on both sizes
  // alike: the figures above ran minutes apart, and the fsync's cost and the
  // guest's page faults move that much.
  const SmallFigures small_sequential = small, large_sequential = large;
  interleaved_saves_and_loads(paths, {{20000, 300, &small}, {200000, 300, &large}}, repeat);
  std::printf("\n### 4. Growth: 20,000 vs 200,000 tensors of 300 float32, median of %d\n\n", repeat);
  std::printf("The saves, raw writes and fresh verified loads of both sizes are timed in alternation "
              "(20k, then 200k, %d times each).\n\n",
              repeat);
  std::printf("| operation | 20k (s) | 200k (s) | ratio (bound 11) |\n|---|---|---|---|\n");
  const auto growth_row = [&](const char* what, double a, double b) {
    std::printf("| %s | %.3f | %.3f | %.2f |\n", what, a, b, b / a);
    target(std::string("growth 20k -> 200k: ") + what, b / a, 11, true, "");
  };
  growth_row("save_mapping", small.save, large.save);
  growth_row("verified load (fresh process)", small.load_fresh, large.load_fresh);
  growth_row("holdpoint verify (whole process)", small.verify, large.verify);
  growth_row("holdpoint inspect (whole process)", small.inspect, large.inspect);
  // The floors grow too, and not always tenfold: a disk's write cache or the
  // guest's warm huge pages serve a 27 MiB file better than a 269 MiB one.
  const auto floor_row = [](const char* what, double a, double b) {
    std::printf("| floor, for comparison: %s | %.3f | %.3f | %.2f |\n", what, a, b, b / a);
  };
  floor_row("fastest durable write of the same tensors", small.raw_save, large.raw_save);
  floor_row("max(raw read, SHA-256), fresh process", std::max(small.reads.fresh(), small.sha),
            std::max(large.reads.fresh(), large.sha));
  // The same operations measured size after size, minutes apart: in
  // alternation each 20k run follows a 200k one, whose freed memory this
  // guest may have handed back to the host, so both are shown.
  std::printf("| not in alternation, for comparison: save_mapping | %.3f | %.3f | %.2f |\n", small_sequential.save,
              large_sequential.save, large_sequential.save / small_sequential.save);
  std::printf("| not in alternation, for comparison: verified load (fresh process) | %.3f | %.3f | %.2f |\n",
              small_sequential.load_fresh, large_sequential.load_fresh,
              large_sequential.load_fresh / small_sequential.load_fresh);
  const double file_mib = static_cast<double>(large.file_bytes) / (1 << 20);
  const double peak_mib = static_cast<double>(large.load_peak) / (1 << 20);
  const double per_tensor = (static_cast<double>(large.verify_rss) - static_cast<double>(small.verify_rss)) / 180000.0;
  std::printf("\nAt 200k: file %.1f MiB; verified load extra peak RSS %.1f MiB; holdpoint verify peak RSS %.1f MiB "
              "(20k: %.1f MiB), so %.0f bytes per additional tensor.\n",
              file_mib, peak_mib, static_cast<double>(large.verify_rss) / (1 << 20),
              static_cast<double>(small.verify_rss) / (1 << 20), per_tensor);
  target("200k tensors: verified load extra peak RSS (MiB) <= file + 64", peak_mib, file_mib + 64, true, "");
  target("200k tensors: holdpoint verify metadata bytes per tensor", per_tensor, 256, true, "");
}

// ---- async (publication_bench) and Python peers ----------------------------------------------

void async_case(const Paths& paths, int repeat) {
  const fs::path json_path = paths.dir / "publication.json";
  const ProcessResult result = run_process({paths.publication_bench, "--mib", "256", "--repeat", std::to_string(repeat),
                                            "--dir", (paths.dir / "publication").string(), "--json", json_path.string()});
  if (result.status != 0) {
    std::printf("\n### 5. Async blocking: publication_bench failed\n");
    return;
  }
  const auto report = nlohmann::json::parse(std::ifstream(json_path));
  const double ratio = report["async"]["ratio_blocked_to_memcpy"].get<double>();
  std::printf("\n### 5. Asynchronous save: training-thread blocking vs memcpy of the state (publication_bench, 256 MiB)\n\n"
              "blocked %.4f s, memcpy %.4f s, ratio %.2f\n",
              report["async"]["steady_blocked_median_s"].get<double>(), report["async"]["memcpy_median_s"].get<double>(),
              ratio);
  target("async save blocking / memcpy of the state", ratio, 1.2, true, "");
  fs::remove(json_path);
}

// holdpoint's own 2-rank sharded save (distributed_bench: two Gloo ranks as
// threads of one process), for the row beside torch.distributed.checkpoint's.
void sharded_case(const Paths& paths, std::int64_t mib, int repeat) {
  const fs::path json_path = paths.dir / "distributed.json";
  const ProcessResult result =
      run_process({paths.distributed_bench, "--mib", std::to_string(mib), "--world", "2", "--repeat",
                   std::to_string(std::max(3, repeat)), "--dir", (paths.dir / "distributed").string(), "--json",
                   json_path.string()});
  if (result.status != 0) {
    std::printf("\n### 6. Sharded save on 2 ranks: distributed_bench failed\n");
    return;
  }
  const auto report = nlohmann::json::parse(std::ifstream(json_path));
  const auto seconds = [&](const char* key) {
    return median(report[key].get<std::vector<double>>());
  };
  const double state_mib = report["state_bytes"].get<double>() / (1 << 20);
  std::printf("\n### 6. holdpoint sharded save, 2 Gloo ranks (distributed_bench, %.0f MiB state)\n\n"
              "| operation | seconds | bytes written / state |\n|---|---|---|\n"
              "| single-process run-directory save (SHA-256, fsync, read-back, LATEST) | %.3f | %.2f |\n"
              "| DistributedCheckpointer save, 2 ranks (per-shard SHA-256, step manifest, LATEST) | %.3f | %.2f |\n"
              "\nCompare with `dcp_save_2ranks` in section 7 (the same bytes, no digest).\n",
              state_mib, seconds("single_seconds"), report["single_bytes"].get<double>() / report["state_bytes"].get<double>(),
              seconds("sharded_seconds"), report["sharded_bytes"].get<double>() / report["state_bytes"].get<double>());
  fs::remove(json_path);
}

void python_peers(const Paths& paths, std::int64_t tensors, std::int64_t elements, int repeat, const std::string& label) {
  const ProcessResult result = run_process({paths.python, paths.python_peers, "--tensors", std::to_string(tensors),
                                            "--elements", std::to_string(elements), "--dir", paths.dir.string(),
                                            "--repeat", std::to_string(repeat), "--world", "2"});
  std::printf("\n### 7. Python peers, %s (%s)\n\n", label.c_str(), paths.python.c_str());
  if (result.status != 0) {
    std::printf("python_peers.py failed (status %d)\n", result.status);
    return;
  }
  const auto report = nlohmann::json::parse(result.output);
  std::printf("torch %s, safetensors %s. Seconds are medians of %d; `fresh` is the first load in a new process.\n\n",
              report["torch_version"].get<std::string>().c_str(), report["safetensors_version"].get<std::string>().c_str(),
              repeat);
  std::printf("| peer operation | seconds | what it checks |\n|---|---|---|\n");
  for (const auto& [key, value] : report["seconds"].items()) {
    const std::string note = report["notes"].contains(key) ? report["notes"][key].get<std::string>() : "";
    std::printf("| %s | %.3f | %s |\n", key.c_str(), value.get<double>(), note.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "--child") {
    try {
      return run_child(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& error) {
      std::cerr << error.what() << "\n";
      return 1;
    }
  }
  Paths paths;
  paths.self = fs::canonical("/proc/self/exe").string();
  const fs::path build = fs::path(paths.self).parent_path().parent_path();
  paths.cli = (build / "holdpoint").string();
  paths.publication_bench = (build / "bench" / "publication_bench").string();
  paths.distributed_bench = (build / "bench" / "distributed_bench").string();
  paths.python = std::string(HOLDPOINT_SOURCE_DIR) + "/.venv/bin/python";
  paths.python_peers = std::string(HOLDPOINT_SOURCE_DIR) + "/bench/python_peers.py";
  paths.dir = fs::temp_directory_path() / "holdpoint-floor-bench";
  int repeat = 5;
  std::int64_t mib = 1024;
  bool peers = true, growth = true, big = true;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 == argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    try {
      if (flag == "--dir") paths.dir = fs::path(value()) / "holdpoint-floor-bench";
      else if (flag == "--repeat") repeat = std::stoi(value());
      else if (flag == "--mib") mib = std::stoll(value());
      else if (flag == "--python") paths.python = value();
      else if (flag == "--no-peers") peers = false;
      else if (flag == "--no-growth") growth = false;
      else if (flag == "--no-big") big = false;  // sections 1, 2 and 5: the 1 GiB state and async blocking
      else if (flag == "--quick") repeat = 3, mib = 256, growth = false, peers = false;
      else {
        std::cerr << "usage: floor_bench [--dir DIR] [--repeat N] [--mib M] [--python PY] [--no-peers] [--no-growth] "
                     "[--no-big] [--quick]\n";
        return flag == "--help" || flag == "-h" ? 0 : 2;
      }
    } catch (const std::exception& error) {
      std::cerr << error.what() << "\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  std::printf("## holdpoint performance floor benchmark (issue 13)\n\ncommand:");
  for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n\nEvery ratio compares figures measured in this run; `fresh process` figures are the first call in "
              "a new process, timed inside it.\n");
  std::fflush(stdout);
  try {
    fs::remove_all(paths.dir);
    fs::create_directories(paths.dir);
    child_stderr = (paths.dir / "child-stderr.txt").string();
    if (big) big_case(paths, mib, repeat);
    std::fflush(stdout);
    many_case(paths, repeat, growth);
    std::fflush(stdout);
    if (big) async_case(paths, repeat);
    std::fflush(stdout);
    if (peers) {
      sharded_case(paths, mib, repeat);
      std::fflush(stdout);
      python_peers(paths, 48, (mib << 20) / 48 / 4, repeat, std::to_string(mib) + " MiB in 48 tensors");
      python_peers(paths, 20000, 1000, repeat, "20,000 tensors of 1000 float32");
    }
  } catch (const std::exception& error) {
    std::cerr << "benchmark failed: " << error.what() << "\n";
    fs::remove_all(paths.dir);
    return 1;
  }
  fs::remove_all(paths.dir);
  std::printf("\n## Targets\n\n| target | measured | bound | met? |\n|---|---|---|---|\n");
  for (const Target& t : targets) {
    std::printf("| %s | %.3f | %s %.2f | %s |\n", t.name.c_str(), t.measured, t.at_most ? "<=" : ">=", t.bound,
                t.met() ? "met" : "**not met**");
  }
  return 0;
}
