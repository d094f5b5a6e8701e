// Proves that DistributedCheckpointer resumes in place with memory for the
// live state, not for the checkpoint (docs/distributed.md, "Resuming in
// place"): resume_memory_check.cpp's proof for two ranks of a c10d group.
//
//   dist_resume_memory_check STATE_MIB MARGIN_MIB
//
// Two ranks (threads of one process, each with its own Gloo group over a
// c10d::HashStore) each hold a model of STATE_MIB / 2 MiB and its SGD
// momentum, equal on both, and save it as a sharded checkpoint. Then, each in
// a fresh process:
//   1. both ranks resume it the private-copy way with no limit (each reads its
//      shard and receives the other's): the reference;
//   2. both resume it with ResumeMemory::automatic inside a cgroup v1 memory
//      controller limited to the two live states (2 x STATE_MIB) plus
//      MARGIN_MIB: they must choose in place and end bit for bit equal to (1);
//   3. negative control: the private copy under the same limit must fail
//      (each rank would hold the whole checkpoint besides its live state);
//   4. under the same limit, a resume in place whose shard 1 is changed in
//      place between the passes: refused with file_changed_during_read on
//      both ranks, each rank's live state unchanged.
// Exit 0: passed; 1: failed; 77: skipped (not root, no cgroup v1 memory
// controller, not enough disk).
//
// Worker modes:
//   dist_resume_memory_check --save DIR STATE_MIB
//   dist_resume_memory_check --resume DIR STATE_MIB private_copy|in_place|automatic [--poke]
// each printing "digest R <hex>" per rank of the live state it ends with.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/ops/randn_like.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/dist/distributed.h"
#include "holdpoint/dist/gloo_process_group.h"
#include "resume_memory_support.h"

namespace {

using namespace resume_memory;

constexpr int kRanks = 2;

// Runs `body(rank, group)` on kRanks threads; returns whether every rank returned.
template <typename Body>
bool on_ranks(Body&& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<int> ok(kRanks, 0);
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        holdpoint::GlooGroupOptions options;
        options.timeout = std::chrono::seconds(120);
        const auto group = holdpoint::make_gloo_process_group(
            c10::make_intrusive<c10d::PrefixStore>("check", store), rank, kRanks, options);
        body(rank, *group);
        ok[static_cast<std::size_t>(rank)] = 1;
      } catch (const std::exception& error) {
        std::printf("rank %d failed: %s\n", rank, error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return ok[0] && ok[1];
}

holdpoint::DistributedCheckpointOptions checkpoint_options() {
  holdpoint::DistributedCheckpointOptions options;
  options.rank_local = {};
  options.run.durable = false;
  return options;
}

std::filesystem::path step_manifest(const std::filesystem::path& dir) {
  return dir / "run" / "checkpoints" / "step-00000001.pt";
}

// Both ranks' states are built one after the other from one seed: equal.
std::mutex building;

int save(const std::filesystem::path& dir, std::uint64_t state_mib) {
  std::mutex printing;
  const bool ok = on_ranks([&](int rank, c10d::ProcessGroup& group) {
    std::unique_ptr<Live> live;
    {
      const std::lock_guard<std::mutex> lock(building);
      at::manual_seed(1);
      live = std::make_unique<Live>(state_mib);
      for (auto& param : live->model->parameters()) param.mutable_grad() = at::randn_like(param);
      live->sgd.step();  // every parameter gets its momentum buffer
    }
    live->progress.step = 1;
    holdpoint::DistributedCheckpointer checkpointer(group, live->state, dir / "run", checkpoint_options());
    holdpoint::GenerationSpec spec;
    spec.step = 1;
    checkpointer.save(spec);
    const std::lock_guard<std::mutex> lock(printing);
    std::printf("digest %d %s\n", rank, live->digest().c_str());
  });
  return ok ? 0 : 1;
}

int resume(const std::filesystem::path& dir, std::uint64_t state_mib, const std::string& mode, bool poke) {
  std::mutex printing;
  int refused = 0;
  const bool ok = on_ranks([&](int rank, c10d::ProcessGroup& group) {
    std::unique_ptr<Live> live;
    {
      const std::lock_guard<std::mutex> lock(building);
      at::manual_seed(2);
      live = std::make_unique<Live>(state_mib);
    }
    if (poke && rank == 0) {
      live->progress.poke_path = dir / "run" / "checkpoints" / "step-00000001.shards" / "rank-00001.pt";
    }
    const std::string before = live->digest();
    holdpoint::DistributedLoadOptions options;
    options.memory = mode == "in_place"    ? holdpoint::ResumeMemory::in_place
                     : mode == "automatic" ? holdpoint::ResumeMemory::automatic
                                           : holdpoint::ResumeMemory::private_copy;
    holdpoint::DistributedCheckpointer checkpointer(group, live->state, dir / ("loader-" + mode),
                                                    checkpoint_options());
    const auto start = std::chrono::steady_clock::now();
    try {
      const auto report = checkpointer.load_checkpoint(step_manifest(dir), options);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::lock_guard<std::mutex> lock(printing);
      std::printf("resumed %d in_place=%d journaled=%llu read=%llu received=%llu in %.2f s\n", rank,
                  report.report.in_place ? 1 : 0, static_cast<unsigned long long>(report.report.bytes_journaled),
                  static_cast<unsigned long long>(report.bytes_read),
                  static_cast<unsigned long long>(report.bytes_received), seconds);
      std::printf("digest %d %s\n", rank, live->digest().c_str());
    } catch (const holdpoint::Error& error) {
      const std::lock_guard<std::mutex> lock(printing);
      std::printf("refused %d %s\n", rank, std::string(holdpoint::error_code_name(error.code())).c_str());
      std::printf("unchanged %d %d\n", rank, live->digest() == before ? 1 : 0);
      ++refused;
    }
  });
  if (!ok) return 1;
  return refused ? 3 : 0;
}

int drive(std::uint64_t state_mib, std::uint64_t margin_mib) {
  if (::geteuid() != 0 || !std::filesystem::exists(std::filesystem::path(kMemoryController) / "memory.limit_in_bytes")) {
    std::printf("skipped: needs root and the cgroup v1 memory controller at %s\n", kMemoryController);
    return kSkipped;
  }
  const std::filesystem::path dir =
      std::filesystem::current_path() / ("dist_resume_memory_check." + std::to_string(::getpid()));
  const std::filesystem::path cgroup =
      std::filesystem::path(kMemoryController) / ("holdpoint-dist-resume-" + std::to_string(::getpid()));
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
  const auto digests = [](const std::string& output) { return field(output, "digest 0") + field(output, "digest 1"); };
  try {
    const std::string mib = std::to_string(state_mib);
    const Outcome saved = run_self({"--save", dir.string(), mib});
    check(exited_ok(saved) && !field(saved.output, "digest 0").empty(), "two ranks saved a sharded checkpoint",
          describe(saved) + " " + saved.output);
    const Outcome reference = run_self({"--resume", dir.string(), mib, "private_copy"});
    check(exited_ok(reference) && digests(reference.output) == digests(saved.output),
          "the private copy resumes the saved state on both ranks (no limit)",
          describe(reference) + " " + field(reference.output, "resumed 0"));

    std::filesystem::create_directory(cgroup);
    const std::uint64_t limit = (kRanks * state_mib + margin_mib) << 20;
    std::ofstream(cgroup / "memory.limit_in_bytes") << limit << std::flush;
    std::printf("cgroup %s: limit %llu MiB = %d live states of %llu MiB + margin %llu MiB\n", cgroup.c_str(),
                static_cast<unsigned long long>(limit >> 20), kRanks, static_cast<unsigned long long>(state_mib),
                static_cast<unsigned long long>(margin_mib));

    const Outcome streamed = run_self({"--resume", dir.string(), mib, "automatic"}, cgroup);
    const std::uint64_t peak = read_number(cgroup / "memory.max_usage_in_bytes");
    check(exited_ok(streamed) && digests(streamed.output) == digests(reference.output) &&
              field(streamed.output, "resumed 0").starts_with("in_place=1") &&
              field(streamed.output, "resumed 1").starts_with("in_place=1"),
          "both ranks resumed in place (chosen by automatic) under the limit, bit for bit equal to the private copy",
          describe(streamed) + ", cgroup peak " + std::to_string(peak >> 20) + " MiB; rank 0: " +
              field(streamed.output, "resumed 0"));

    std::ofstream(cgroup / "memory.max_usage_in_bytes") << 0 << std::flush;
    const Outcome copied = run_self({"--resume", dir.string(), mib, "private_copy"}, cgroup);
    check(!exited_ok(copied), "negative control: the private copy does not fit under the same limit",
          describe(copied));

    const Outcome poked = run_self({"--resume", dir.string(), mib, "in_place", "--poke"}, cgroup);
    check(WIFEXITED(poked.status) && WEXITSTATUS(poked.status) == 3 &&
              field(poked.output, "refused 0") == "file_changed_during_read" &&
              field(poked.output, "refused 1") == "file_changed_during_read" &&
              field(poked.output, "unchanged 0") == "1" && field(poked.output, "unchanged 1") == "1",
          "a shard changed between the passes is refused on both ranks with their live states unchanged",
          describe(poked) + " " + field(poked.output, "refused 0") + " / " + field(poked.output, "refused 1"));
  } catch (const std::exception& error) {
    check(false, "the check ran", error.what());
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (std::filesystem::exists(cgroup)) ::rmdir(cgroup.c_str());
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
    if (args.size() == 2) return drive(std::stoull(args[0]), std::stoull(args[1]));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dist_resume_memory_check: %s\n", error.what());
    return 2;
  }
  std::fprintf(stderr, "usage: dist_resume_memory_check STATE_MIB MARGIN_MIB\n");
  return 2;
}
