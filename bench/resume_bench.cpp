// Resume in place against the private copy and against the floor
// (docs/resume-contract.md, "Resuming in place"; issue 37, point 5).
//
//   resume_bench [--mib 1024] [--sizes 32,128,256,512,1024] [--repeat 5] [--dir DIR]
//
// For each size, a checkpoint of a model (half the bytes, float32) and its SGD
// momentum (the other half) is written, then each measurement runs in a fresh
// process with the file in the page cache (it was just written, and each
// process reads it):
//   read      pread of the whole file into one reused 8 MiB buffer: the raw read
//   sha256    the same read with OpenSSL's SHA-256 over every byte: one pass
//   private   TrainingState::load_checkpoint, ResumeMemory::private_copy
//   in_place  TrainingState::load_checkpoint, ResumeMemory::in_place
// Only the read or the load is timed (not building the model), and the peak
// RSS a process adds over its model (wait4's ru_maxrss, less that of a process
// that builds the model and stops) is reported beside it. The floor is
// max(read, sha256): a verified resume reads every byte and hashes every byte.
// Medians of --repeat runs; the Markdown report goes to stdout.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <ATen/ops/randn_like.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Square layers of `width` float32 weights, `mib` / 2 MiB of them.
torch::nn::Sequential make_model(std::uint64_t mib) {
  const std::int64_t width = mib >= 256 ? 4096 : 1024;
  const std::uint64_t layer_mib = static_cast<std::uint64_t>(width * width * 4) >> 20;
  torch::nn::Sequential model;
  for (std::uint64_t i = 0; i < std::max<std::uint64_t>(1, mib / 2 / layer_mib); ++i) {
    model->push_back(torch::nn::Linear(torch::nn::LinearOptions(width, width).bias(false)));
  }
  return model;
}

struct Live {
  explicit Live(std::uint64_t mib)
      : model(make_model(mib)),
        sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)),
        model_state(*model),
        optimizer_state("optimizer", sgd) {
    state.add(model_state).add(optimizer_state);
    state.set_semantic_identity("resume-bench");
  }
  torch::nn::Sequential model;
  torch::optim::SGD sgd;
  holdpoint::ModuleState model_state;
  holdpoint::OptimizerState optimizer_state;
  holdpoint::TrainingState state;
};

// ---- the measured work (one per fresh process) ----------------------------------------------

double raw_read(const std::string& path, bool hash) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  std::vector<std::byte> buffer(std::size_t{8} << 20);
  holdpoint::Sha256 sha;
  const auto start = Clock::now();
  for (off_t at = 0;;) {
    const ssize_t got = ::pread(fd, buffer.data(), buffer.size(), at);
    if (got <= 0) break;
    if (hash) sha.update(buffer.data(), static_cast<std::size_t>(got));
    at += got;
  }
  if (hash) (void)sha.finish();
  const double elapsed = seconds_since(start);
  ::close(fd);
  return elapsed;
}

double resume(const std::string& path, std::uint64_t mib, holdpoint::ResumeMemory memory) {
  Live live(mib);
  holdpoint::CheckpointLoadOptions options;
  options.memory = memory;
  const auto start = Clock::now();
  const holdpoint::LoadReport report = live.state.load_checkpoint(path, options);
  const double elapsed = seconds_since(start);
  if (report.in_place != (memory == holdpoint::ResumeMemory::in_place)) std::abort();
  return elapsed;
}

int worker(const std::vector<std::string>& args) {
  const std::string& what = args[1];
  const std::string& path = args[2];
  const std::uint64_t mib = std::stoull(args[3]);
  double elapsed = 0;
  if (what == "save") {
    at::manual_seed(1);
    Live live(mib);
    for (auto& param : live.model->parameters()) param.mutable_grad() = at::randn_like(param);
    live.sgd.step();
    live.state.save(path);
  } else if (what == "model") {
    Live live(mib);  // the baseline RSS of a process with the model built
  } else if (what == "read" || what == "sha256") {
    elapsed = raw_read(path, what == "sha256");
  } else if (what == "private") {
    elapsed = resume(path, mib, holdpoint::ResumeMemory::private_copy);
  } else if (what == "in_place") {
    elapsed = resume(path, mib, holdpoint::ResumeMemory::in_place);
  }
  std::printf("%.6f\n", elapsed);
  return 0;
}

// ---- the driver -------------------------------------------------------------------------------

struct Sample {
  double seconds = 0;
  double rss_mib = 0;
};

Sample run_worker(const std::string& what, const std::string& path, std::uint64_t mib) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) std::abort();
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(pipe_fds[1], 1);
    ::close(pipe_fds[0]);
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string mib_text = std::to_string(mib);
    ::execl(self.c_str(), self.c_str(), "--worker", what.c_str(), path.c_str(), mib_text.c_str(),
            static_cast<char*>(nullptr));
    _exit(125);
  }
  ::close(pipe_fds[1]);
  std::string output;
  char chunk[256];
  for (ssize_t got; (got = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;) output.append(chunk, static_cast<std::size_t>(got));
  ::close(pipe_fds[0]);
  int status = 0;
  rusage usage{};
  ::wait4(child, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "resume_bench: worker %s failed (status %d)\n", what.c_str(), status);
    std::exit(1);
  }
  return {std::atof(output.c_str()), static_cast<double>(usage.ru_maxrss) / 1024.0};
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::vector<std::uint64_t> parse_sizes(const std::string& text) {
  std::vector<std::uint64_t> sizes;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) sizes.push_back(std::stoull(item));
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);
  if (args.size() == 5 && args[1] == "--worker") return worker({args.begin() + 1, args.end()});
  std::vector<std::uint64_t> sizes = {32, 128, 256, 512, 1024};
  int repeat = 5;
  std::filesystem::path dir = std::filesystem::current_path();
  for (std::size_t i = 1; i + 1 < args.size(); i += 2) {
    if (args[i] == "--sizes") sizes = parse_sizes(args[i + 1]);
    else if (args[i] == "--mib") sizes = {std::stoull(args[i + 1])};
    else if (args[i] == "--repeat") repeat = std::stoi(args[i + 1]);
    else if (args[i] == "--dir") dir = args[i + 1];
    else {
      std::fprintf(stderr, "usage: resume_bench [--sizes 32,128,...] [--mib M] [--repeat N] [--dir DIR]\n");
      return 2;
    }
  }
  std::printf("## Resume in place against the private copy (issue 37)\n\n");
  std::printf("Fresh process per measurement, file in the page cache, medians of %d runs. floor = "
              "max(read, sha256). RSS: peak RSS over a process with the model built, MiB.\n\n",
              repeat);
  std::printf("| state MiB | read s | sha256 s | private s | in place s | private / floor | in place / floor | "
              "in place / private | private RSS+ | in place RSS+ |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const std::uint64_t mib : sizes) {
    const std::string path = (dir / ("resume_bench_" + std::to_string(mib) + ".pt")).string();
    run_worker("save", path, mib);
    const double model_rss = run_worker("model", path, mib).rss_mib;
    std::vector<double> read, sha, copy, place, copy_rss, place_rss;
    for (int r = 0; r < repeat; ++r) {
      read.push_back(run_worker("read", path, mib).seconds);
      sha.push_back(run_worker("sha256", path, mib).seconds);
      const Sample c = run_worker("private", path, mib);
      const Sample p = run_worker("in_place", path, mib);
      copy.push_back(c.seconds);
      place.push_back(p.seconds);
      copy_rss.push_back(c.rss_mib - model_rss);
      place_rss.push_back(p.rss_mib - model_rss);
    }
    const double floor = std::max(median(read), median(sha));
    std::printf("| %llu | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.2f | %.0f | %.0f |\n",
                static_cast<unsigned long long>(std::filesystem::file_size(path) >> 20), median(read), median(sha),
                median(copy), median(place), median(copy) / floor, median(place) / floor, median(place) / median(copy),
                median(copy_rss), median(place_rss));
    std::fflush(stdout);
    std::filesystem::remove(path);
  }
  return 0;
}
