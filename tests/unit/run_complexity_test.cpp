// Algorithmic complexity of a run directory's structure checks (issue 35):
// the worst index.json a run admits (64 MiB, the bound on its small files)
// and a long signature chain, each timed against a generous bound on this
// 2-core machine. A quadratic step would miss the bound by orders of
// magnitude; docs/testing.md ("Complexity suite") records the figures.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "holdpoint/base/sha256.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/run_directory.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string generation(std::int64_t step) {
  std::string digits = std::to_string(step);
  return "step-" + std::string(digits.size() < 8 ? 8 - digits.size() : 0, '0') + digits + ".pt";
}

TEST(RunComplexity, TheLargestIndexARunAdmitsOpensInLinearTime) {
  // ~64 MiB of index entries, none of whose files exist: recovery reads and
  // parses it, and drops every entry.
  TempDir tmp;
  const fs::path run = tmp / "run";
  fs::create_directories(run / "checkpoints");
  const std::string digest = Sha256::of(std::as_bytes(std::span("x", 1))).hex();
  std::string index = "{\"schema\": \"holdpoint.run-index\", \"schema_version\": 1, \"generations\": [\n";
  std::int64_t entries = 0;
  const std::size_t bound = (std::size_t{64} << 20) - 512;
  for (std::int64_t step = 1;; ++step) {
    std::string entry = "{\"name\": \"" + generation(step) + "\", \"step\": " + std::to_string(step) +
                        ", \"epoch\": 0, \"kind\": \"resume\", \"size\": 1, \"sha256\": \"" + digest +
                        "\", \"saved_at\": \"2026-12-06T00:00:00Z\", \"metrics\": {}}";
    if (index.size() + entry.size() + 8 > bound) break;
    index += (step > 1 ? ",\n" : "") + entry;
    ++entries;
  }
  index += "\n]}\n";
  write_text(run / "index.json", index);
  RunDirectoryOptions read_only;
  read_only.recover = false;
  const auto start = std::chrono::steady_clock::now();
  RunDirectory opened(run, read_only);
  const double took = seconds_since(start);
  EXPECT_EQ(opened.recovery().dropped_from_index.size(), static_cast<std::size_t>(entries));
  std::cout << "index.json of " << index.size() << " bytes, " << entries << " entries: opened in " << took << " s\n";
  EXPECT_LT(took, 60.0);
}

TEST(RunComplexity, AChainOfTenThousandSignedGenerationsIsJudgedInLinearTime) {
  // 10,000 generation signatures (the files retired), a signed index that
  // records their retirement, and pointer signatures naming the head: what a
  // long run pruned by retention leaves. verify_signatures and a trusting open
  // judge all of it.
  TempDir tmp;
  const fs::path run = tmp / "run";
  fs::create_directories(run / "checkpoints");
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::ed25519);
  constexpr std::int64_t kGenerations = 10'000;
  std::optional<Sha256Digest> previous;
  std::string retired;
  for (std::int64_t step = 1; step <= kGenerations; ++step) {
    SignedStatement statement;
    statement.file = generation(step);
    statement.size = 100;
    const std::string name = statement.file;
    statement.sha256 = Sha256::of(std::as_bytes(std::span(name.data(), name.size())));
    statement.step = static_cast<std::uint64_t>(step);
    statement.previous_sha256 = previous;
    write_text(run / "checkpoints" / (name + ".sig"), key.sign(statement).text());
    previous = statement.sha256;
    retired += std::string(step > 1 ? ",\n" : "") + "{\"name\": \"" + name + "\", \"step\": " + std::to_string(step) +
               ", \"sha256\": \"" + statement.sha256.hex() + "\"}";
  }
  const std::string index = "{\"schema\": \"holdpoint.run-index\", \"schema_version\": 1, \"generations\": [], "
                            "\"retired\": [\n" + retired + "\n]}\n";
  write_text(run / "index.json", index);
  SignedStatement index_statement;
  index_statement.file = "index.json";
  index_statement.size = index.size();
  index_statement.sha256 = Sha256::of(std::as_bytes(std::span(index.data(), index.size())));
  index_statement.previous_sha256 = previous;
  write_text(run / "index.json.sig", key.sign(index_statement).text());
  TrustPolicy trust;
  trust.keys.push_back(key.verifying_key());
  trust.required = false;

  RunDirectoryOptions options;
  options.recover = false;
  options.trust = trust;
  auto start = std::chrono::steady_clock::now();
  RunDirectory opened(run, options);  // judges the head and the chain
  const double open_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  const auto checks = opened.verify_signatures(trust);
  const double verify_seconds = seconds_since(start);
  std::size_t failed = 0;
  for (const auto& check : checks) failed += check.ok ? 0 : 1;
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(checks.size(), static_cast<std::size_t>(kGenerations) + 3);  // each, head, chain, index.json.sig
  std::cout << kGenerations << " signed generations: trusting open " << open_seconds << " s, verify_signatures "
            << verify_seconds << " s\n";
  EXPECT_LT(open_seconds, 30.0);
  EXPECT_LT(verify_seconds, 60.0);
  // A link removed from the middle is still found at this size.
  fs::remove(run / "checkpoints" / (generation(kGenerations / 2) + ".sig"));
  RunDirectoryOptions recovering;
  recovering.trust = trust;
  EXPECT_ERROR_CODE(RunDirectory(run, recovering), ErrorCode::signature_chain_broken);
}

}  // namespace
}  // namespace holdpoint
