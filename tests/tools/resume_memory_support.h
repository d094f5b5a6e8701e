// What the resume memory checks share (resume_memory_check.cpp, one process;
// dist_resume_memory_check.cpp, ranks of a c10d group): the state they save
// and resume, and the driver's way of running itself in a fresh process,
// inside a cgroup v1 memory controller.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"

namespace resume_memory {

inline constexpr int kSkipped = 77;
inline constexpr const char* kMemoryController = "/sys/fs/cgroup/memory";

// Layers of 4096 x 4096 float32 (64 MiB each) up to state_mib / 2.
inline torch::nn::Sequential make_model(std::uint64_t state_mib) {
  torch::nn::Sequential model;
  const std::uint64_t layers = std::max<std::uint64_t>(1, state_mib / 2 / 64);
  for (std::uint64_t i = 0; i < layers; ++i) model->push_back(torch::nn::Linear(torch::nn::LinearOptions(4096, 4096).bias(false)));
  return model;
}

// Counters whose validate, with `poke`, changes one byte of the file in
// place: the moment between the two passes of a resume in place.
class Progress final : public holdpoint::Component {
 public:
  const std::string& name() const override { return name_; }
  holdpoint::Value capture(holdpoint::CaptureMode) const override { return holdpoint::Value::integer(step); }
  void validate(const holdpoint::Value& state) const override {
    if (!state.is_int()) throw holdpoint::Error(holdpoint::ErrorCode::state_type_invalid, "progress");
    if (!poke_path.empty()) {
      const int fd = ::open(poke_path.c_str(), O_RDWR | O_CLOEXEC);
      char byte = 0;
      const off_t at = static_cast<off_t>(std::filesystem::file_size(poke_path) / 3);
      if (fd < 0 || ::pread(fd, &byte, 1, at) != 1) std::abort();
      byte = static_cast<char>(byte ^ 1);
      if (::pwrite(fd, &byte, 1, at) != 1) std::abort();
      ::close(fd);
    }
  }
  void apply(const holdpoint::Value& state) override { step = state.as_int(); }
  std::int64_t step = 0;
  std::filesystem::path poke_path;

 private:
  std::string name_ = "progress";
};

struct Live {
  explicit Live(std::uint64_t state_mib)
      : model(make_model(state_mib)),
        sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9)),
        model_state(*model),
        optimizer_state("optimizer", sgd) {
    state.add(model_state).add(optimizer_state).add(progress);
    state.set_semantic_identity("resume-memory-check");
  }
  // SHA-256 over every parameter and momentum buffer, in order.
  std::string digest() const {
    holdpoint::Sha256 hasher;
    const auto add = [&](const at::Tensor& tensor) {
      const at::Tensor bytes = tensor.contiguous();
      hasher.update(bytes.data_ptr(), bytes.nbytes());
    };
    const holdpoint::Value optimizer = optimizer_state.capture(holdpoint::CaptureMode::reference);
    for (const auto& param : model->parameters()) add(param);
    for (const auto& [key, entry] : optimizer.as_dict().at("state").as_dict()) {
      for (const auto& [name, value] : entry.as_dict()) {
        if (value.is_tensor()) hasher.update(value.as_tensor().storage->data(), value.as_tensor().storage->nbytes());
      }
    }
    return hasher.finish().hex();
  }
  torch::nn::Sequential model;
  torch::optim::SGD sgd;
  holdpoint::ModuleState model_state;
  holdpoint::OptimizerState optimizer_state;
  Progress progress;
  holdpoint::TrainingState state;
};

// ---- the driver ------------------------------------------------------------------------------

struct Outcome {
  int status = -1;
  std::string output;
};

// Runs this program with `arguments` (in `cgroup` when given) and collects its output.
inline Outcome run_self(const std::vector<std::string>& arguments, const std::filesystem::path& cgroup = {}) {
  const auto out_path = std::filesystem::temp_directory_path() / ("resume_memory_check.out." + std::to_string(::getpid()));
  const pid_t child = ::fork();
  if (child == 0) {
    if (!cgroup.empty()) {
      std::ofstream procs(cgroup / "cgroup.procs");
      procs << ::getpid() << std::flush;
      if (!procs) _exit(124);
    }
    const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    argv.push_back(self.data());
    for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    _exit(125);
  }
  Outcome outcome;
  ::waitpid(child, &outcome.status, 0);
  std::ifstream in(out_path);
  outcome.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::filesystem::remove(out_path);
  return outcome;
}

inline std::string field(const std::string& output, const std::string& name) {
  const auto at = output.find(name + " ");
  if (at == std::string::npos) return "";
  const auto end = output.find('\n', at);
  return output.substr(at + name.size() + 1, end - at - name.size() - 1);
}

inline std::string describe(const Outcome& outcome) {
  if (WIFSIGNALED(outcome.status)) return "killed by signal " + std::to_string(WTERMSIG(outcome.status));
  return "exit " + std::to_string(WEXITSTATUS(outcome.status));
}

inline bool exited_ok(const Outcome& outcome) { return WIFEXITED(outcome.status) && WEXITSTATUS(outcome.status) == 0; }

inline std::uint64_t read_number(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::uint64_t value = 0;
  in >> value;
  return value;
}

}  // namespace resume_memory
