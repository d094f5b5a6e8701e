// What signing costs a commit as a run grows (issue 35: a signed commit must
// cost O(1) in the number of generations).
//
// Two runs of tiny generations are committed side by side on the in-memory
// file system of the tests (so that the disk's fsyncs do not drown the
// difference): one with a signing key, one without. Near each mark (by
// default 100, 1,000 and 10,000 generations) the mean time of a commit in
// each is taken over a window of commits, and the file operations of one
// commit counted. Signing's own cost is the difference; the report gives it
// at each mark and its ratio to the first mark's. O(1) signing keeps the ratio
// near 1 and the operation count unchanged; re-reading every earlier signature
// (as commits did before issue 35) makes both grow with the run.
//
//   run_signing_bench [--generations N] [--window W]
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/fault_file_system.h"
#include "support/generation_writer.h"

namespace {

using namespace holdpoint;
using Clock = std::chrono::steady_clock;

RunDirectory::Writer writer_for(std::int64_t step) { return testing::generation_writer(step, "run-signing-bench"); }

struct BenchRun {
  testing::FaultFileSystem fs;
  std::unique_ptr<RunDirectory> run;

  explicit BenchRun(std::shared_ptr<const SigningKey> key) {
    RunDirectoryOptions options;
    options.file_system = &fs;
    options.signing_key = std::move(key);
    run = std::make_unique<RunDirectory>("/run", options);
  }

  // Seconds of one commit, and its file operations.
  std::pair<double, std::uint64_t> commit(std::int64_t step) {
    GenerationSpec spec;
    spec.step = step;
    fs.reset_counter();
    const auto start = Clock::now();
    run->commit(spec, writer_for(step));
    return {std::chrono::duration<double>(Clock::now() - start).count(), fs.operation_count()};
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::int64_t generations = 10'000;
  std::int64_t window = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--generations") generations = std::atoll(argv[i + 1]);
    else if (flag == "--window") window = std::atoll(argv[i + 1]);
  }
  std::vector<std::int64_t> marks;
  for (std::int64_t mark = 100; mark <= generations; mark *= 10) marks.push_back(mark);
  if (marks.empty() || marks.back() != generations) marks.push_back(generations);

  const auto key = std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::ed25519));
  BenchRun plain(nullptr);
  BenchRun signed_run(key);
  std::cout << "| generations | commit, unsigned (ms) | commit, signed (ms) | signing's cost (ms) | vs. first mark | "
               "file operations, unsigned / signed |\n| --- | --- | --- | --- | --- | --- |\n";
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
    std::uint64_t plain_operations = 0, signed_operations = 0;
    std::int64_t timed = 0;
    while (step < mark) {
      ++step;
      // Alternated, so that both see the same machine state.
      const auto [p, p_ops] = plain.commit(step);
      const auto [s, s_ops] = signed_run.commit(step);
      plain_seconds += p;
      signed_seconds += s;
      plain_operations = p_ops;
      signed_operations = s_ops;
      ++timed;
    }
    const double plain_ms = 1000 * plain_seconds / timed;
    const double signed_ms = 1000 * signed_seconds / timed;
    const double cost = signed_ms - plain_ms;
    if (first_cost == 0) first_cost = cost;
    std::cout << std::fixed << std::setprecision(3) << "| " << mark << " | " << plain_ms << " | " << signed_ms << " | "
              << cost << " | " << std::setprecision(2) << cost / first_cost << "x | " << plain_operations << " / "
              << signed_operations << " |\n";
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
  return 0;
}
