// Proves that a resume in place needs memory for the live state, not for a
// second copy of the file (docs/resume-contract.md, "Resuming in place").
//
//   resume_memory_check STATE_MIB MARGIN_MIB [--large]
//
// Writes a checkpoint of a model of STATE_MIB / 2 MiB of float32 weights and
// its SGD momentum (STATE_MIB in all), then, each in a fresh process:
//   1. resumes it the private-copy way with no limit: the reference result;
//   2. resumes it with ResumeMemory::automatic inside a cgroup v1 memory
//      controller whose limit is STATE_MIB + MARGIN_MIB: it must choose the
//      resume in place and succeed, bit for bit equal to (1);
//   3. the negative control: the private copy in the same cgroup must fail
//      (killed for memory or refused an allocation): the margin is smaller
//      than the file;
//   4. in the same cgroup, a resume in place of a file changed in place
//      between its two passes: refused with file_changed_during_read, the
//      live state's digest unchanged.
// The cgroup and the files are removed afterwards, whatever happens. With
// --large it runs only when HOLDPOINT_LARGE_TESTS=1, and skips step 3 (which
// would only fail again, slower). Exit 0: passed; 1: failed; 77: skipped (not
// enabled, no cgroup v1 memory controller, not root, or not enough disk).
//
// The worker modes (what the fresh processes run) are
//   resume_memory_check --save PATH STATE_MIB
//   resume_memory_check --resume PATH STATE_MIB private_copy|in_place|automatic [--poke]
// each printing "digest <hex>" of the live state it ends with.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <ATen/ops/randn_like.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "resume_memory_support.h"

namespace {

using namespace resume_memory;

int save(const std::filesystem::path& path, std::uint64_t state_mib) {
  at::manual_seed(1);
  Live live(state_mib);
  for (auto& param : live.model->parameters()) param.mutable_grad() = at::randn_like(param);
  live.sgd.step();  // every parameter gets its momentum buffer
  live.progress.step = 1;
  live.state.save(path);
  std::printf("digest %s\n", live.digest().c_str());
  return 0;
}

int resume(const std::filesystem::path& path, std::uint64_t state_mib, const std::string& mode, bool poke) {
  at::manual_seed(2);
  Live live(state_mib);
  holdpoint::CheckpointLoadOptions options;
  options.memory = mode == "in_place"       ? holdpoint::ResumeMemory::in_place
                   : mode == "automatic"    ? holdpoint::ResumeMemory::automatic
                                            : holdpoint::ResumeMemory::private_copy;
  if (poke) live.progress.poke_path = path;
  const std::string before = live.digest();
  const auto start = std::chrono::steady_clock::now();
  try {
    const holdpoint::LoadReport report = live.state.load_checkpoint(path, options);
    std::printf("resumed in_place=%d journaled=%llu in %.2f s\n", report.in_place ? 1 : 0,
                static_cast<unsigned long long>(report.bytes_journaled),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } catch (const holdpoint::Error& error) {
    std::printf("refused %s\n", std::string(holdpoint::error_code_name(error.code())).c_str());
    std::printf("unchanged %d\n", live.digest() == before ? 1 : 0);
    return 3;
  }
  std::printf("digest %s\n", live.digest().c_str());
  return 0;
}

int drive(std::uint64_t state_mib, std::uint64_t margin_mib, bool large) {
  if (large) {
    const char* enabled = std::getenv("HOLDPOINT_LARGE_TESTS");
    if (!enabled || std::string(enabled) != "1") {
      std::printf("skipped: set HOLDPOINT_LARGE_TESTS=1 for the %llu MiB resume\n",
                  static_cast<unsigned long long>(state_mib));
      return kSkipped;
    }
  }
  if (::geteuid() != 0 || !std::filesystem::exists(std::filesystem::path(kMemoryController) / "memory.limit_in_bytes")) {
    std::printf("skipped: needs root and the cgroup v1 memory controller at %s\n", kMemoryController);
    return kSkipped;
  }
  const std::filesystem::path dir = std::filesystem::current_path() / ("resume_memory_check." + std::to_string(::getpid()));
  const std::filesystem::path cgroup =
      std::filesystem::path(kMemoryController) / ("holdpoint-resume-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  if (std::filesystem::space(dir).available < (state_mib * 2 + 1024) << 20) {
    std::filesystem::remove_all(dir);
    std::printf("skipped: needs %llu MiB of free disk\n", static_cast<unsigned long long>(state_mib * 2 + 1024));
    return kSkipped;
  }
  int failures = 0;
  const auto check = [&failures](bool ok, const std::string& what, const std::string& detail) {
    std::printf("%s: %s (%s)\n", ok ? "ok" : "FAILED", what.c_str(), detail.c_str());
    if (!ok) ++failures;
  };
  try {
    const std::string mib = std::to_string(state_mib);
    const auto path = (dir / "state.pt").string();
    const Outcome saved = run_self({"--save", path, mib});
    check(exited_ok(saved), "the checkpoint was written", describe(saved) + " " + saved.output);
    const std::uint64_t file_mib = std::filesystem::file_size(path) >> 20;
    const Outcome reference = run_self({"--resume", path, mib, "private_copy"});
    check(exited_ok(reference) && field(reference.output, "digest") == field(saved.output, "digest"),
          "the private copy resumes the saved state (no limit)", describe(reference));

    std::filesystem::create_directory(cgroup);
    const std::uint64_t limit = (file_mib + margin_mib) << 20;
    std::ofstream(cgroup / "memory.limit_in_bytes") << limit << std::flush;
    std::printf("cgroup %s: limit %llu MiB = file %llu MiB + margin %llu MiB\n", cgroup.c_str(),
                static_cast<unsigned long long>(limit >> 20), static_cast<unsigned long long>(file_mib),
                static_cast<unsigned long long>(margin_mib));

    // ResumeMemory::automatic: the file does not fit in what the cgroup has
    // left, so the resume goes in place on its own.
    const Outcome streamed = run_self({"--resume", path, mib, "automatic"}, cgroup);
    const std::uint64_t peak = read_number(cgroup / "memory.max_usage_in_bytes");
    check(exited_ok(streamed) && field(streamed.output, "digest") == field(reference.output, "digest") &&
              field(streamed.output, "resumed").starts_with("in_place=1"),
          "resumed in place (chosen by automatic) under the limit, bit for bit equal to the private copy",
          describe(streamed) + ", cgroup peak " + std::to_string(peak >> 20) + " MiB; " + field(streamed.output, "resumed"));

    if (!large) {
      std::ofstream(cgroup / "memory.max_usage_in_bytes") << 0 << std::flush;
      const Outcome copied = run_self({"--resume", path, mib, "private_copy"}, cgroup);
      check(!exited_ok(copied), "negative control: the private copy does not fit under the same limit",
            describe(copied));
    }

    const Outcome poked = run_self({"--resume", path, mib, "in_place", "--poke"}, cgroup);
    check(WIFEXITED(poked.status) && WEXITSTATUS(poked.status) == 3 &&
              field(poked.output, "refused") == "file_changed_during_read" && field(poked.output, "unchanged") == "1",
          "a file changed between the passes is refused with the live state unchanged",
          describe(poked) + " " + field(poked.output, "refused"));
  } catch (const std::exception& error) {
    check(false, "the check ran", error.what());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (std::filesystem::exists(cgroup)) {
    // Processes are gone once waited for; the empty group can go.
    ::rmdir(cgroup.c_str());
  }
  std::printf("%s\n", failures == 0 ? "PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 3 && args[0] == "--save") return save(args[1], std::stoull(args[2]));
    if (args.size() >= 4 && args[0] == "--resume") {
      return resume(args[1], std::stoull(args[2]), args[3], args.size() == 5 && args[4] == "--poke");
    }
    if (args.size() >= 2 && args[0] != "--save" && args[0] != "--resume") {
      return drive(std::stoull(args[0]), std::stoull(args[1]), args.size() == 3 && args[2] == "--large");
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "resume_memory_check: %s\n", error.what());
    return 2;
  }
  std::fprintf(stderr, "usage: resume_memory_check STATE_MIB MARGIN_MIB [--large]\n");
  return 2;
}
