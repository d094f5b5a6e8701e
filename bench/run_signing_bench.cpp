// What signing costs a commit as a run grows (issue 35: a signed commit must
// cost O(1) in the number of generations).
//
// Two runs of tiny generations are committed side by side into DIR (default:
// a folder under /tmp), without fsync (RunDirectoryOptions::durable = false,
// so that the disk's flushes do not drown the difference): one with a signing
// key, one without. Near each mark (by default 100, 1,000 and 10,000
// generations) the mean time of a commit in each is taken over a window of
// commits. Signing's own cost is the difference; the report gives it at each
// mark and its ratio to the first mark's. A commit signs its generation
// (one more read and SHA-256 of it) and re-signs LATEST, BEST and index.json:
// only the index grows with the run, as it does for an unsigned commit (its
// digest is one more pass over it). Re-reading every earlier generation's
// signature, as commits did before issue 35, adds a read per generation.
// (The number of file operations per commit is shown constant by
// tests/unit/run_signatures_test.cpp, ACommitSignsInWorkThatDoesNotGrowWithTheRun.)
//
//   run_signing_bench [--generations N] [--window W] [--dir DIR]
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/generation_writer.h"

namespace {

using namespace holdpoint;
using Clock = std::chrono::steady_clock;

RunDirectory::Writer writer_for(std::int64_t step) { return testing::generation_writer(step, "run-signing-bench"); }

struct BenchRun {
  std::unique_ptr<RunDirectory> run;

  BenchRun(const std::filesystem::path& path, std::shared_ptr<const SigningKey> key) {
    RunDirectoryOptions options;
    options.durable = false;
    options.signing_key = std::move(key);
    run = std::make_unique<RunDirectory>(path, options);
  }

  // Seconds of one commit.
  double commit(std::int64_t step) {
    GenerationSpec spec;
    spec.step = step;
    const auto start = Clock::now();
    run->commit(spec, writer_for(step));
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t generations = 10'000;
  std::int64_t window = 50;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("run-signing-bench-" + std::to_string(::getpid()));
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--generations") generations = std::atoll(argv[i + 1]);
    else if (flag == "--window") window = std::atoll(argv[i + 1]);
    else if (flag == "--dir") dir = argv[i + 1];
  }
  std::filesystem::remove_all(dir);
  std::vector<std::int64_t> marks;
  for (std::int64_t mark = 100; mark <= generations; mark *= 10) marks.push_back(mark);
  if (marks.empty() || marks.back() != generations) marks.push_back(generations);

  const auto key = std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::ed25519));
  BenchRun plain(dir / "unsigned", nullptr);
  BenchRun signed_run(dir / "signed", key);
  std::cout << "| generations | commit, unsigned (ms) | commit, signed (ms) | signing's cost (ms) | vs. first mark |\n"
               "| --- | --- | --- | --- | --- |" << std::endl;
  double first_cost = 0;
  std::int64_t step = 0;
  for (const std::int64_t mark : marks) {
    const std::int64_t window_start = std::max<std::int64_t>(step + 1, mark - window + 1);
    while (step + 1 < window_start) {
      ++step;
      plain.commit(step);
      signed_run.commit(step);
    }
    double plain_seconds = 0, signed_seconds = 0;
    std::int64_t timed = 0;
    while (step < mark) {
      ++step;
      // Alternated, so that both see the same machine state.
      plain_seconds += plain.commit(step);
      signed_seconds += signed_run.commit(step);
      ++timed;
    }
    const double plain_ms = 1000 * plain_seconds / timed;
    const double signed_ms = 1000 * signed_seconds / timed;
    const double cost = signed_ms - plain_ms;
    if (first_cost == 0) first_cost = cost;
    std::cout << std::fixed << std::setprecision(3) << "| " << mark << " | " << plain_ms << " | " << signed_ms << " | "
              << cost << " | " << std::setprecision(2) << cost / first_cost << "x |" << std::endl;
  }
  // The whole chain checked once, as `verify RUN --trust` does.
  TrustPolicy policy;
  policy.keys.push_back(key->verifying_key());
  const auto start = Clock::now();
  const std::vector<GenerationCheck> checks = signed_run.run->verify_signatures(policy);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::size_t failed = 0;
  for (const auto& check : checks) failed += check.ok ? 0 : 1;
  std::cout << "\nverify_signatures over " << generations << " generations: " << checks.size() << " checks, "
            << failed << " failed, " << std::setprecision(2) << seconds << " s\n";
  std::filesystem::remove_all(dir);
  return 0;
}
