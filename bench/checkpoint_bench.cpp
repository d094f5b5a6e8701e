// Save/load throughput and load memory of holdpoint against baselines measured
// in the same run: raw write+fsync and raw read / SHA-256 of the same bytes,
// LibTorch torch::save / torch::load, and Python torch.save / torch.load
// (Debian's torch 1.13, through bench/python_peer.py).
//
//   checkpoint_bench [--case big|many|all] [--repeat N] [--dir DIR] [--python PY]
//
// Prints a Markdown report (bench/RESULTS.md records one). Every figure is the
// median of N runs; ratios are "times faster than the baseline" (> 1 is better).
#include <fcntl.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <ATen/ops/rand.h>
#include <torch/serialize.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/tensor/torch_tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

struct BenchCase {
  std::string name;
  std::int64_t tensors;
  std::int64_t elements_per_tensor;
};

double seconds_of(const std::function<void()>& action) {
  const auto start = Clock::now();
  action();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median_of(int repeat, const std::function<double()>& run) {
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) times.push_back(run());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void fsync_path(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) throw std::runtime_error("fsync failed: " + path.string());
  ::close(fd);
}

void drop_file(const std::filesystem::path& path) {
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
  std::filesystem::remove(path.string() + ".sha256", ignored);
}

std::uint64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  }
  return 0;
}

// Peak RSS added by one load, measured in a fresh process (this binary run
// with --peak KIND FILE [SHA256]) so that memory the allocator kept from
// earlier work cannot hide the load's own: the child records RSS after start
// up, loads, and prints VmHWM - RSS in bytes.
std::uint64_t extra_peak_bytes(const std::string& self, const std::string& kind, const std::filesystem::path& file,
                               const std::string& sha256 = "") {
  const std::string command = self + " --peak " + kind + " " + file.string() + " " + sha256;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  unsigned long long extra = 0;
  const int parsed = std::fscanf(pipe, "%llu", &extra);
  if (::pclose(pipe) != 0 || parsed != 1) throw std::runtime_error("peak measurement failed: " + command);
  return extra;
}

int run_peak(const std::string& kind, const std::string& file, const std::string& sha256) {
  const std::uint64_t before = status_kib("VmRSS:");
  std::size_t count = 0;
  if (kind == "holdpoint") {
    holdpoint::LoadOptions options;
    if (!sha256.empty()) options.expected_sha256 = holdpoint::Sha256Digest::parse(sha256);
    const auto mapping = holdpoint::load_checkpoint_mapping(file, options);
    count = mapping.root.as_dict().size();
  } else {
    std::vector<at::Tensor> loaded;
    torch::load(loaded, file);
    count = loaded.size();
  }
  const std::uint64_t peak = status_kib("VmHWM:");
  if (count == 0) return 1;
  std::printf("%llu\n", static_cast<unsigned long long>((peak > before ? peak - before : 0) * 1024));
  return 0;
}

struct PythonFigures {
  double save = 0;
  double load = 0;
  bool ok = false;
};

PythonFigures run_python_peer(const std::string& python, const std::string& script, const BenchCase& bench_case,
                              const std::filesystem::path& dir, int repeat) {
  std::ostringstream command;
  command << "cd /tmp && " << python << " " << script << " --tensors " << bench_case.tensors << " --elements "
          << bench_case.elements_per_tensor << " --path " << (dir / "python.pt").string() << " --repeat " << repeat;
  PythonFigures figures;
  FILE* pipe = ::popen(command.str().c_str(), "r");
  if (!pipe) return figures;
  char line[512];
  while (std::fgets(line, sizeof line, pipe)) {
    double save = 0, load = 0;
    if (std::sscanf(line, "save %lf load %lf", &save, &load) == 2) {
      figures = {save, load, true};
    }
  }
  ::pclose(pipe);
  return figures;
}

void run_case(const std::string& self, const BenchCase& bench_case, int repeat, const std::filesystem::path& dir,
              const std::string& python, const std::string& python_script) {
  std::vector<at::Tensor> tensors;
  holdpoint::Dict entries;
  for (std::int64_t i = 0; i < bench_case.tensors; ++i) {
    at::Tensor t = at::rand({bench_case.elements_per_tensor});
    entries.insert("layer" + std::to_string(i) + ".weight", holdpoint::tensor_value(t));
    tensors.push_back(t);
  }
  const holdpoint::Value state = holdpoint::Value::ordered_dict(std::move(entries));
  const std::uint64_t state_bytes =
      static_cast<std::uint64_t>(bench_case.tensors * bench_case.elements_per_tensor) * sizeof(float);
  const auto ours = dir / "holdpoint.pt";
  const auto raw = dir / "raw.bin";
  const auto libtorch = dir / "libtorch.pt";

  // --- saves ---------------------------------------------------------------------
  const double raw_save = median_of(repeat, [&] {
    drop_file(raw);
    return seconds_of([&] {
      const int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (const at::Tensor& t : tensors) {
        const auto* p = static_cast<const char*>(t.data_ptr());
        std::size_t left = t.numel() * sizeof(float);
        while (left > 0) {
          const ssize_t n = ::write(fd, p, left);
          if (n <= 0) throw std::runtime_error("raw write failed");
          p += n;
          left -= static_cast<std::size_t>(n);
        }
      }
      ::fsync(fd);
      ::close(fd);
    });
  });
  holdpoint::SaveResult saved;
  const double our_save = median_of(repeat, [&] {
    drop_file(ours);
    return seconds_of([&] { saved = holdpoint::save_mapping(ours, state); });
  });
  const double libtorch_save = median_of(repeat, [&] {
    drop_file(libtorch);
    return seconds_of([&] {
      torch::save(tensors, libtorch.string());
      fsync_path(libtorch);
    });
  });

  // --- loads (warm page cache: each file was just written) -------------------------
  // Let the saves' writeback and the deleted files' page freeing finish first,
  // so that no loader pays for the save phase's aftermath.
  ::sync();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::vector<char> scratch(std::filesystem::file_size(ours));
  // Raw read into fresh memory (as every loader must), released after the clock stops.
  const double raw_read = median_of(repeat, [&] {
    std::unique_ptr<char[]> fresh;
    const double seconds = seconds_of([&] {
      fresh.reset(new char[scratch.size()]);
      std::ifstream in(ours, std::ios::binary);
      in.read(fresh.get(), static_cast<std::streamsize>(scratch.size()));
    });
    std::memcpy(scratch.data(), fresh.get(), scratch.size());
    return seconds;
  });
  const double sha_of_file = median_of(repeat, [&] {
    return seconds_of([&] {
      holdpoint::Sha256::of({reinterpret_cast<const std::byte*>(scratch.data()), scratch.size()});
    });
  });
  holdpoint::LoadOptions verified;
  verified.expected_sha256 = saved.sha256;
  // A load is timed until its result is usable; the result is released after
  // the clock stops, for every loader alike (Python's peer does the same).
  const double our_load = median_of(repeat, [&] {
    holdpoint::LoadedMapping mapping;
    const double seconds = seconds_of([&] { mapping = holdpoint::load_checkpoint_mapping(ours, verified); });
    if (mapping.root.as_dict().size() != static_cast<std::size_t>(bench_case.tensors)) std::abort();
    return seconds;
  });
  const double libtorch_load = median_of(repeat, [&] {
    std::vector<at::Tensor> loaded;
    const double seconds = seconds_of([&] { torch::load(loaded, libtorch.string()); });
    if (loaded.size() != static_cast<std::size_t>(bench_case.tensors)) std::abort();
    return seconds;
  });
  const std::uint64_t our_peak = extra_peak_bytes(self, "holdpoint", ours, saved.sha256.hex());
  const std::uint64_t libtorch_peak = extra_peak_bytes(self, "libtorch", libtorch);
  const PythonFigures py = run_python_peer(python, python_script, bench_case, dir, repeat);

  const double gb = static_cast<double>(state_bytes) / 1e9;
  const double file_mb = static_cast<double>(saved.file_bytes) / (1 << 20);
  auto rate = [&](double s) { return gb / s; };
  std::printf("\n### %s: %lld tensors x %lld float32 (%.1f MB of tensor data, file %.1f MiB), median of %d\n\n",
              bench_case.name.c_str(), static_cast<long long>(bench_case.tensors),
              static_cast<long long>(bench_case.elements_per_tensor), gb * 1000, file_mb, repeat);
  std::printf("| operation | seconds | GB/s | holdpoint speed-up vs this |\n|---|---|---|---|\n");
  std::printf("| holdpoint save (stream + SHA-256 + fsync + rename) | %.3f | %.2f | 1.00 |\n", our_save, rate(our_save));
  std::printf("| raw write + fsync of the tensor bytes | %.3f | %.2f | %.2f |\n", raw_save, rate(raw_save),
              raw_save / our_save);
  std::printf("| LibTorch torch::save + fsync | %.3f | %.2f | %.2f |\n", libtorch_save, rate(libtorch_save),
              libtorch_save / our_save);
  if (py.ok) {
    std::printf("| Python 1.13 torch.save + fsync | %.3f | %.2f | %.2f |\n", py.save, rate(py.save), py.save / our_save);
  }
  std::printf("\n| operation | seconds | GB/s | holdpoint speed-up vs this |\n|---|---|---|---|\n");
  std::printf("| holdpoint verified load (read once + SHA-256 checked + parse) | %.3f | %.2f | 1.00 |\n", our_load,
              rate(our_load));
  std::printf("| raw read of the file | %.3f | %.2f | %.2f |\n", raw_read, rate(raw_read), raw_read / our_load);
  std::printf("| SHA-256 of the file (in memory) | %.3f | %.2f | %.2f |\n", sha_of_file, rate(sha_of_file),
              sha_of_file / our_load);
  std::printf("| LibTorch torch::load (warm) | %.3f | %.2f | %.2f |\n", libtorch_load, rate(libtorch_load),
              libtorch_load / our_load);
  if (py.ok) {
    std::printf("| Python 1.13 torch.load(weights_only=True) (warm) | %.3f | %.2f | %.2f |\n", py.load, rate(py.load),
                py.load / our_load);
  }
  const double slower_baseline = std::max(raw_read, sha_of_file);
  std::printf("\nTargets: save vs raw write+fsync %.2f (>= 0.8); save vs torch::save %.2f (>= %s); ", raw_save / our_save,
              libtorch_save / our_save, bench_case.tensors > 1000 ? "3" : "1.3");
  if (py.ok) std::printf("save vs Python %.2f%s; ", py.save / our_save, bench_case.tensors > 1000 ? " (>= 3)" : "");
  std::printf("verified load vs slower of raw read and SHA-256 %.2f (>= 0.8); load vs torch::load %.2f (>= %s)",
              slower_baseline / our_load, libtorch_load / our_load, bench_case.tensors > 1000 ? "3" : "1.5");
  if (py.ok && bench_case.tensors > 1000) std::printf("; load vs Python %.2f (>= 3)", py.load / our_load);
  std::printf(".\nExtra peak RSS of a load: holdpoint %.1f MiB (bound: file %.1f MiB + 64 MiB), torch::load %.1f MiB.\n",
              static_cast<double>(our_peak) / (1 << 20), file_mb, static_cast<double>(libtorch_peak) / (1 << 20));
  std::fflush(stdout);
  drop_file(ours);
  drop_file(raw);
  drop_file(libtorch);
  drop_file(dir / "python.pt");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--peak") return run_peak(argv[2], argv[3], argc >= 5 ? argv[4] : "");
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  std::string which = "all";
  int repeat = 3;
  std::filesystem::path dir = std::filesystem::temp_directory_path();
  std::string python = "/usr/bin/python3";
  std::string script = std::string(HOLDPOINT_SOURCE_DIR) + "/bench/python_peer.py";
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h" || i + 1 == argc) {
      std::cerr << "usage: checkpoint_bench [--case big|many|all] [--repeat N] [--dir DIR] [--python PY]\n";
      return flag == "--help" || flag == "-h" ? 0 : 2;
    }
    if (flag == "--case") which = argv[i + 1];
    else if (flag == "--repeat") repeat = std::stoi(argv[i + 1]);
    else if (flag == "--dir") dir = argv[i + 1];
    else if (flag == "--python") python = argv[i + 1];
    else {
      std::cerr << "unknown flag " << flag << "\n";
      return 2;
    }
  }
  at::set_num_threads(1);
  std::printf("## holdpoint checkpoint benchmark\n\ncommand: %s", argv[0]);
  for (int i = 1; i < argc; ++i) std::printf(" %s", argv[i]);
  std::printf("\n");
  try {
    if (which == "big" || which == "all") run_case(self, {"1 GiB state", 64, 4 << 20}, repeat, dir, python, script);
    if (which == "many" || which == "all") run_case(self, {"20,000 small tensors", 20000, 1000}, repeat, dir, python, script);
  } catch (const std::exception& error) {
    std::cerr << "benchmark failed: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
