// Checkpoint publication through a run directory (CheckpointManager) against
// baselines measured in the same run:
//
//   1. asynchronous save: the training thread's blocking time (SaveStats::
//      blocked_seconds) against one single-threaded std::memcpy of the same
//      bytes into a pre-allocated, pre-touched buffer (target: <= 1.2x);
//   2. synchronous save (stream + SHA-256 + fsync + read-back verification +
//      rename + directory fsyncs + sidecar, index.json, LATEST) against a raw
//      write(2) + fsync of the same bytes to a new file in the same directory
//      (target: raw / save >= 0.7), with a breakdown that explains the gap:
//      SHA-256 of the bytes in memory, a read of the written file, a verified
//      load of it (read + SHA-256 + parse: what publish's verify-after-write
//      step does), one small durable publish, and TrainingState::save to a
//      plain file with and without fsyncs;
//   3. the peak RSS each save adds (VmHWM, reset through /proc/self/clear_refs).
//
//   publication_bench [--mib N] [--repeat R] [--dir DIR] [--copy-threads T] [--json FILE]
//
// The state is a ModuleState over a torch::nn::Sequential of 16 Linear(4096,
// 4*N) layers: 32 float32 tensors, N MiB of weights plus 16 small biases
// (default N = 1024, i.e. 1 GiB). Every figure is the median of R runs (the
// asynchronous case runs R+1 saves: the first allocates the staging arena and
// is reported apart). Prints a Markdown report; bench/RESULTS.md records one.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/checkpoint/training_state.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

constexpr int kLayers = 16;
constexpr std::int64_t kInFeatures = 4096;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double seconds_of(const std::function<void()>& action) {
  const auto start = Clock::now();
  action();
  return seconds_since(start);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double median_of(int repeat, const std::function<double()>& run) {
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) times.push_back(run());
  return median(times);
}

[[noreturn]] void die(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

// ---- memory ---------------------------------------------------------------------------

std::uint64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  }
  return 0;
}

// Peak RSS added between reset() and extra_bytes(): "5" in clear_refs resets
// VmHWM to the current RSS (Linux >= 4.0).
struct PeakRss {
  std::uint64_t base_kib = 0;
  bool ok = false;
  void reset() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    ok = static_cast<bool>(clear);
    base_kib = status_kib("VmRSS:");
  }
  double extra_mib() const {
    const std::uint64_t peak = status_kib("VmHWM:");
    return ok && peak > base_kib ? static_cast<double>(peak - base_kib) / 1024 : 0;
  }
};

// An anonymous mapping touched page by page (pre-faulted), like the staging arena's.
struct TouchedBuffer {
  std::byte* data = nullptr;
  std::size_t size = 0;
  explicit TouchedBuffer(std::size_t n) : size(n) {
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    data = static_cast<std::byte*>(p);
    std::memset(data, 1, n);
  }
  ~TouchedBuffer() { ::munmap(data, size); }
  TouchedBuffer(const TouchedBuffer&) = delete;
  TouchedBuffer& operator=(const TouchedBuffer&) = delete;
};

// ---- baselines --------------------------------------------------------------------------

struct Span {
  const std::byte* data;
  std::size_t size;
};

double memcpy_once(const std::vector<Span>& spans, std::byte* destination) {
  return seconds_of([&] {
    std::size_t offset = 0;
    for (const Span& s : spans) {
      std::memcpy(destination + offset, s.data, s.size);
      offset += s.size;
    }
  });
}

void write_all(int fd, const std::byte* p, std::size_t left) {
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min(left, kChunk));
    if (n <= 0) die("raw write");
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void fsync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0 || ::fsync(fd) != 0) die("fsync " + dir.string());
  ::close(fd);
}

// write(2) in 64 MiB chunks from the parameter memory + fsync + close; the
// file is unlinked before the clock starts.
double raw_write_fsync(const std::vector<Span>& spans, const std::filesystem::path& file) {
  std::filesystem::remove(file);
  return seconds_of([&] {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) die("open " + file.string());
    for (const Span& s : spans) write_all(fd, s.data, s.size);
    if (::fsync(fd) != 0) die("fsync");
    ::close(fd);
  });
}

// Reads a file into fresh memory with read(2); the memory is released after
// the clock stops.
double read_fresh(const std::filesystem::path& file) {
  const std::size_t size = std::filesystem::file_size(file);
  std::unique_ptr<std::byte[]> fresh;
  const double seconds = seconds_of([&] {
    fresh.reset(new std::byte[size]);
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("open " + file.string());
    std::size_t done = 0;
    while (done < size) {
      const ssize_t n = ::read(fd, fresh.get() + done, size - done);
      if (n <= 0) die("read " + file.string());
      done += static_cast<std::size_t>(n);
    }
    ::close(fd);
  });
  if (fresh[size / 2] == std::byte{0x5a} && fresh[0] == std::byte{0x5a}) std::fputc(' ', stderr);  // keep the read
  return seconds;
}

// What publish() does for each small file (sidecar, index.json, LATEST):
// create, write, fsync, close, rename, fsync the directory (without its
// read-back, which is a page-cache read of a few hundred bytes).
double small_durable_publish(const std::filesystem::path& dir) {
  const auto staging = dir / ".small.staging";
  const auto target = dir / "small.txt";
  return seconds_of([&] {
    const int fd = ::open(staging.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) die("open " + staging.string());
    const std::string text(200, 'x');
    write_all(fd, reinterpret_cast<const std::byte*>(text.data()), text.size());
    if (::fsync(fd) != 0) die("fsync");
    ::close(fd);
    std::filesystem::rename(staging, target);
    fsync_directory(dir);
  });
}

// ---- report helpers ---------------------------------------------------------------------

std::string machine_line() {
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  utsname u{};
  ::uname(&u);
  return std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) + " CPUs (" + cpu + "), " +
         std::to_string(static_cast<long long>(static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                                               static_cast<double>(::sysconf(_SC_PAGE_SIZE)) / (1 << 30) + 0.5)) +
         " GiB RAM, Linux " + u.release;
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

const char* verdict(bool met) { return met ? "yes" : "**no**"; }

}  // namespace

int main(int argc, char** argv) {
  std::int64_t mib = 1024;
  int repeat = 5;
  std::filesystem::path base_dir = std::filesystem::temp_directory_path();
  std::filesystem::path json_path;
  unsigned copy_threads = 0;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "flag " << flag << " needs a value\n";
      return 2;
    }
    const std::string value = argv[i + 1];
    if (flag == "--mib") mib = std::stoll(value);
    else if (flag == "--repeat") repeat = std::stoi(value);
    else if (flag == "--dir") base_dir = value;
    else if (flag == "--json") json_path = value;
    else if (flag == "--copy-threads") copy_threads = static_cast<unsigned>(std::stoul(value));
    else {
      std::cerr << "unknown flag " << flag
                << "\nusage: publication_bench [--mib N] [--repeat R] [--dir DIR] [--copy-threads T] [--json FILE]\n";
      return 2;
    }
  }
  if (mib < 1 || repeat < 1) {
    std::cerr << "--mib and --repeat must be >= 1\n";
    return 2;
  }
  at::set_num_threads(1);
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];

  const std::filesystem::path dir = base_dir / ("holdpoint-publication-bench-" + std::to_string(::getpid()));
  json report;
  try {
    std::filesystem::create_directories(dir);
    const std::string load_before = load_average();

    // ---- the state -------------------------------------------------------------------
    torch::nn::Sequential model;
    for (int i = 0; i < kLayers; ++i) model->push_back(torch::nn::Linear(kInFeatures, 4 * mib));
    std::vector<Span> spans;
    std::uint64_t state_bytes = 0;
    for (const auto& p : model->parameters()) {
      spans.push_back({static_cast<const std::byte*>(p.data_ptr()), p.nbytes()});
      state_bytes += p.nbytes();
    }
    holdpoint::ModuleState module_state(*model);
    holdpoint::TrainingState state;
    state.add(module_state).set_semantic_identity("publication-bench");
    const double gb = static_cast<double>(state_bytes) / 1e9;
    const double state_mib = static_cast<double>(state_bytes) / (1 << 20);
    auto rate = [&](double s) { return s > 0 ? gb / s : 0; };

    std::printf("## holdpoint publication benchmark\n\ncommand: %s\n\n", command.c_str());
    std::printf("state: ModuleState over %d x Linear(%lld, %lld): %zu float32 tensors, %.1f MiB; median of %d; "
                "directory %s; %s; load average at start %s\n",
                kLayers, static_cast<long long>(kInFeatures), static_cast<long long>(4 * mib), spans.size(), state_mib,
                repeat, base_dir.c_str(), machine_line().c_str(), load_before.c_str());
    std::fflush(stdout);

    PeakRss peak;
    // ---- 1. asynchronous saves vs memcpy -------------------------------------------------
    // Each save is preceded by one timed memcpy of the same bytes (after an
    // untimed warm-up), so that baseline and save see the same machine.
    std::vector<double> memcpy_times, blocked, staging, wall, background;
    std::vector<bool> reused;
    double first_peak_mib = 0, steady_peak_mib = 0;
    json async_saves = json::array();
    {
      TouchedBuffer destination(state_bytes);
      memcpy_once(spans, destination.data);  // warm-up
      holdpoint::CheckpointManagerOptions options;
      options.asynchronous = true;
      options.copy_threads = copy_threads;
      options.run.retention.keep_last = 2;  // bounds the disk used; runs on the background thread
      options.run.log = [](const std::string&) {};
      holdpoint::CheckpointManager manager(dir / "async-run", state, options);
      for (int i = 0; i <= repeat; ++i) {
        memcpy_times.push_back(memcpy_once(spans, destination.data));
        if (i <= 1) peak.reset();
        holdpoint::GenerationSpec spec;
        spec.step = i + 1;
        const auto start = Clock::now();
        const auto stats = manager.save(spec);
        const auto returned = Clock::now();
        manager.wait();
        const double save_wall = seconds_since(start);
        if (i == 0) first_peak_mib = peak.extra_mib();
        if (i == 1) steady_peak_mib = peak.extra_mib();
        if (!stats) throw std::runtime_error("the asynchronous save was skipped");
        blocked.push_back(stats->blocked_seconds);
        staging.push_back(stats->staging_seconds);
        wall.push_back(save_wall);
        background.push_back(std::chrono::duration<double>(Clock::now() - returned).count());
        reused.push_back(stats->staging_reused);
        async_saves.push_back({{"step", spec.step},
                               {"memcpy_s", memcpy_times.back()},
                               {"blocked_s", stats->blocked_seconds},
                               {"staging_s", stats->staging_seconds},
                               {"waited_s", stats->waited_seconds},
                               {"staging_reused", stats->staging_reused},
                               {"staged_bytes", stats->staged_bytes},
                               {"save_plus_wait_s", save_wall}});
      }
    }
    std::filesystem::remove_all(dir / "async-run");
    // What the first save pays on top: copying into memory never touched
    // before (every 4 KiB page faulted in during the copy).
    const double memcpy_fresh = median_of(std::min(repeat, 3), [&] {
      void* p = ::mmap(nullptr, state_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) die("mmap");
      const double s = memcpy_once(spans, static_cast<std::byte*>(p));
      ::munmap(p, state_bytes);
      return s;
    });
    const auto steady = [](const std::vector<double>& v) { return median({v.begin() + 1, v.end()}); };
    const double memcpy_median = median(memcpy_times);
    const double steady_blocked = steady(blocked);
    const double async_ratio = steady_blocked / memcpy_median;
    const double first_ratio = blocked[0] / memcpy_median;

    // ---- 2. synchronous saves vs raw write + fsync ----------------------------------------
    // Alternating: raw write+fsync of the same bytes into a new file in the run
    // directory, then a synchronous save of the next step. Generations are kept
    // (no retention), so the save never pays for deleting one.
    std::vector<double> raw_times, sync_times;
    double sync_peak_mib = 0;
    json sync_saves = json::array();
    const auto sync_run = dir / "sync-run";
    const auto raw_file = sync_run / "raw.bin";
    std::filesystem::path last_generation;
    std::string last_sha;
    {
      holdpoint::CheckpointManagerOptions options;
      options.asynchronous = false;
      options.run.log = [](const std::string&) {};
      holdpoint::CheckpointManager manager(sync_run, state, options);
      for (int i = 0; i < repeat; ++i) {
        raw_times.push_back(raw_write_fsync(spans, raw_file));
        std::filesystem::remove(raw_file);
        if (i == 0) peak.reset();
        holdpoint::GenerationSpec spec;
        spec.step = i + 1;
        const auto start = Clock::now();
        const auto stats = manager.save(spec);
        sync_times.push_back(seconds_since(start));
        if (i == 0) sync_peak_mib = peak.extra_mib();
        if (!stats) throw std::runtime_error("the synchronous save was skipped");
        sync_saves.push_back({{"step", spec.step}, {"raw_write_fsync_s", raw_times.back()}, {"save_s", sync_times.back()}});
      }
      const auto latest = manager.latest();
      last_generation = manager.run().file_path(*latest);
      last_sha = latest->sha256.hex();
    }
    const double raw_median = median(raw_times);
    const double sync_median = median(sync_times);
    const double sync_ratio = raw_median / sync_median;
    // The disk of a shared VM is noisy (raw write+fsync of 1 GiB varies 5x
    // within minutes), so also: the ratio within each back-to-back pair, and
    // the ratio against the run's fastest raw write (the disk at its best).
    std::vector<double> pair_ratios;
    for (std::size_t i = 0; i < raw_times.size(); ++i) pair_ratios.push_back(raw_times[i] / sync_times[i]);
    const double pair_ratio_median = median(pair_ratios);
    const double raw_best = *std::min_element(raw_times.begin(), raw_times.end());
    const double best_disk_ratio = raw_best / sync_median;
    const std::uint64_t file_bytes = std::filesystem::file_size(last_generation);

    // ---- breakdown -----------------------------------------------------------------------
    const double sha_memory = median_of(repeat, [&] {
      return seconds_of([&] {
        holdpoint::Sha256 hasher;
        for (const Span& s : spans) hasher.update(s.data, s.size);
        hasher.finish();
      });
    });
    const double read_back = median_of(repeat, [&] { return read_fresh(last_generation); });
    holdpoint::LoadOptions verified;
    verified.expected_sha256 = holdpoint::Sha256Digest::parse(last_sha);
    const double verified_load = median_of(repeat, [&] {
      holdpoint::LoadedMapping mapping;
      const double s = seconds_of([&] { mapping = holdpoint::load_checkpoint_mapping(last_generation, verified); });
      if (!mapping.root.is_dict()) std::abort();
      return s;
    });
    const double small_publish = median_of(std::max(repeat, 5), [&] {
      std::filesystem::remove(dir / "small.txt");
      return small_durable_publish(dir);
    });
    const auto plain_file = dir / "plain.pt";
    auto ts_save = [&](bool durable) {
      return median_of(repeat, [&] {
        std::filesystem::remove(plain_file);
        std::filesystem::remove(plain_file.string() + ".sha256");
        holdpoint::CheckpointSaveOptions o;
        o.durable = durable;
        return seconds_of([&] { state.save(plain_file, o); });
      });
    };
    const double ts_durable = ts_save(true);
    const double ts_volatile = ts_save(false);
    std::filesystem::remove_all(dir);
    const std::string load_after = load_average();

    // ---- report --------------------------------------------------------------------------
    std::printf("\n### 1. Asynchronous save: training-thread blocking time vs memcpy\n\n");
    std::printf("| operation | seconds | GB/s | ratio to memcpy |\n|---|---|---|---|\n");
    std::printf("| std::memcpy of the state into a pre-touched buffer (1 thread) | %.3f | %.2f | 1.00 |\n",
                memcpy_median, rate(memcpy_median));
    std::printf("| std::memcpy into a fresh, untouched mapping (1 thread, page faults included) | %.3f | %.2f | %.2f |\n",
                memcpy_fresh, rate(memcpy_fresh), memcpy_fresh / memcpy_median);
    std::printf("| async save(), first (allocates the staging arena): blocked | %.3f | %.2f | %.2f |\n", blocked[0],
                rate(blocked[0]), first_ratio);
    std::printf("| async save(), first: of which staging copy | %.3f | %.2f | %.2f |\n", staging[0], rate(staging[0]),
                staging[0] / memcpy_median);
    std::printf("| async save(), steady (saves 2..%d): blocked | %.3f | %.2f | %.2f |\n", repeat + 1, steady_blocked,
                rate(steady_blocked), async_ratio);
    std::printf("| async save(), steady: of which staging copy | %.3f | %.2f | %.2f |\n", steady(staging),
                rate(steady(staging)), steady(staging) / memcpy_median);
    std::printf("| async save() + wait(), steady: wall | %.3f | %.2f | %.2f |\n", steady(wall), rate(steady(wall)),
                steady(wall) / memcpy_median);
    std::printf("| of which background (after save() returned) | %.3f | %.2f | %.2f |\n", steady(background),
                rate(steady(background)), steady(background) / memcpy_median);
    std::printf("\nStaging reused from save 2 on: %s. Each save, in order:\n\n",
                std::all_of(reused.begin() + 1, reused.end(), [](bool r) { return r; }) ? "yes" : "no");
    std::printf("| step | memcpy just before | blocked | of which staging | blocked / memcpy | save() + wait() |\n"
                "|---|---|---|---|---|---|\n");
    for (std::size_t i = 0; i < blocked.size(); ++i) {
      std::printf("| %zu | %.3f | %.3f | %.3f | %.2f | %.3f |\n", i + 1, memcpy_times[i], blocked[i], staging[i],
                  blocked[i] / memcpy_times[i], wall[i]);
    }

    std::printf("\n### 2. Synchronous save vs raw write + fsync (file %.1f MiB)\n\n", static_cast<double>(file_bytes) / (1 << 20));
    std::printf("| operation | seconds | GB/s | raw write+fsync / this |\n|---|---|---|---|\n");
    std::printf("| raw write(2) + fsync of the same bytes (new file, same directory) | %.3f | %.2f | 1.00 |\n",
                raw_median, rate(raw_median));
    std::printf("| CheckpointManager sync save (publish + verify + sidecar + index.json + LATEST) | %.3f | %.2f | %.2f |\n",
                sync_median, rate(sync_median), sync_ratio);
    std::printf("\nEach pair, in order (raw write+fsync first, then the save of the next step):\n\n");
    std::printf("| step | raw write+fsync | sync save | raw / save |\n|---|---|---|---|\n");
    for (std::size_t i = 0; i < raw_times.size(); ++i) {
      std::printf("| %zu | %.3f | %.3f | %.2f |\n", i + 1, raw_times[i], sync_times[i], pair_ratios[i]);
    }
    std::printf("\nMedian of the paired ratios %.2f; fastest raw write+fsync of the run / median save %.2f "
                "(the disk at its best).\n",
                pair_ratio_median, best_disk_ratio);
    std::printf("\nBreakdown (each measured alone, same bytes):\n\n");
    std::printf("| operation | seconds | GB/s |\n|---|---|---|\n");
    std::printf("| SHA-256 of the state in memory (one stream, one core) | %.3f | %.2f |\n", sha_memory, rate(sha_memory));
    std::printf("| read of the written generation into fresh memory | %.3f | %.2f |\n", read_back, rate(read_back));
    std::printf("| verified load of the generation (read + SHA-256 + parse/CRC-32 ~ publish's read-back step) | %.3f | %.2f |\n",
                verified_load, rate(verified_load));
    std::printf("| one small durable publish (write + fsync + rename + directory fsync) | %.4f | - |\n", small_publish);
    std::printf("| TrainingState::save to a plain file (publish + verify + sidecar), durable | %.3f | %.2f |\n",
                ts_durable, rate(ts_durable));
    std::printf("| the same with durable = false (no fsyncs) | %.3f | %.2f |\n", ts_volatile, rate(ts_volatile));
    std::printf("| derived: write phase (stream + SHA-256s + CRC-32) = durable=false save - verified load | %.3f | %.2f |\n",
                ts_volatile - verified_load, rate(ts_volatile - verified_load));
    std::printf("| derived: fsyncs = durable save - durable=false save | %.3f | - |\n", ts_durable - ts_volatile);
    std::printf("| derived: run directory (index.json, LATEST, ...) = manager save - durable file save | %.3f | - |\n",
                sync_median - ts_durable);

    std::printf("\n### 3. Peak RSS added\n\n");
    std::printf("| save | extra peak RSS (MiB) | / state size |\n|---|---|---|\n");
    std::printf("| async, first save + wait (staging arena allocated) | %.1f | %.2f |\n", first_peak_mib, first_peak_mib / state_mib);
    std::printf("| async, second save + wait (arena reused) | %.1f | %.2f |\n", steady_peak_mib, steady_peak_mib / state_mib);
    std::printf("| sync save | %.1f | %.2f |\n", sync_peak_mib, sync_peak_mib / state_mib);

    std::printf("\nTargets: async blocking (steady) / memcpy %.3f (<= 1.2: %s; first save %.2f); "
                "raw write+fsync / sync save %.3f (>= 0.7: %s; paired %.2f, disk at its best %.2f).\n"
                "Load average at end: %s.\n",
                async_ratio, verdict(async_ratio <= 1.2), first_ratio, sync_ratio, verdict(sync_ratio >= 0.7),
                pair_ratio_median, best_disk_ratio,
                load_after.c_str());
    std::fflush(stdout);

    report = {
        {"benchmark", "publication_bench"},
        {"command", command},
        {"date_utc", utc_now()},
        {"machine", machine_line()},
        {"load_average_start", load_before},
        {"load_average_end", load_after},
        {"state", {{"mib", mib},
                   {"bytes", state_bytes},
                   {"tensors", spans.size()},
                   {"layers", kLayers},
                   {"file_bytes", file_bytes}}},
        {"repeat", repeat},
        {"async",
         {{"memcpy_median_s", memcpy_median},
          {"memcpy_fresh_mapping_median_s", memcpy_fresh},
          {"first_blocked_s", blocked[0]},
          {"first_staging_s", staging[0]},
          {"steady_blocked_median_s", steady_blocked},
          {"steady_staging_median_s", steady(staging)},
          {"steady_save_plus_wait_median_s", steady(wall)},
          {"steady_background_median_s", steady(background)},
          {"ratio_blocked_to_memcpy", async_ratio},
          {"ratio_first_blocked_to_memcpy", first_ratio},
          {"target_max_ratio", 1.2},
          {"met", async_ratio <= 1.2},
          {"saves", async_saves}}},
        {"sync",
         {{"raw_write_fsync_median_s", raw_median},
          {"save_median_s", sync_median},
          {"ratio_raw_to_save", sync_ratio},
          {"paired_ratio_median", pair_ratio_median},
          {"raw_write_fsync_best_s", raw_best},
          {"ratio_best_raw_to_save", best_disk_ratio},
          {"target_min_ratio", 0.7},
          {"met", sync_ratio >= 0.7},
          {"saves", sync_saves},
          {"breakdown",
           {{"sha256_in_memory_s", sha_memory},
            {"read_back_s", read_back},
            {"verified_load_s", verified_load},
            {"small_durable_publish_s", small_publish},
            {"training_state_save_durable_s", ts_durable},
            {"training_state_save_volatile_s", ts_volatile}}}}},
        {"peak_rss_extra_mib",
         {{"async_first", first_peak_mib}, {"async_second", steady_peak_mib}, {"sync", sync_peak_mib}}},
    };
  } catch (const std::exception& error) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    std::cerr << "benchmark failed: " << error.what() << "\n";
    return 1;
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << report.dump(2) << "\n";
    if (!out) {
      std::cerr << "cannot write " << json_path << "\n";
      return 1;
    }
  }
  return 0;
}
