// Fuzz target for a signed run directory opened under a trust policy: an
// attacker who can delete, copy and put back files, but holds no key.
//
// A run of steps 1..5 is committed once, with a signing key, on the in-memory
// file system of the tests (tests/support/fault_file_system.h), and the
// directory is recorded after each commit. The input edits the final
// directory, then RunDirectory opens it under a TrustPolicy of that key.
//
// Input layout:
//   byte 0   flags: 0x01 recover (else read-only), 0x02 signature required,
//            0x04 an outside witness says step 5 was committed (min_head_step)
//   rest     3-byte operations [op, a, b] on the sorted list of files:
//              op % 4 == 0  delete file a
//              op % 4 == 1  put back file a as it was after commit (b % 5) + 1
//                           (deleted if it did not exist then)
//              op % 4 == 2  copy file a's bytes over file b
//              op % 4 == 3  delete generation (a % 5) + 1, its sidecar and its
//                           signature
//
// Contracts (a broken one traps):
//   - a load succeeds only for a generation at or after the newest step that
//     any trusted signature left in the directory names (a generation's own
//     signature, or the step of LATEST.sig and index.json.sig); with the
//     witness, only for step 5;
//   - no generation file whose bytes a trusted signature vouches for is lost:
//     it is still there afterwards, under its name or moved aside;
//   - a read-only open changes nothing.
// holdpoint::Error is the expected refusal; any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/fault_file_system.h"
#include "support/generation_writer.h"

namespace {

using holdpoint::testing::FaultFileSystem;
using Files = std::map<std::string, std::string>;  // path -> bytes

constexpr int kSteps = 5;
const std::string kRun = "/run";

[[noreturn]] void contract_broken() { __builtin_trap(); }

holdpoint::RunDirectory::Writer writer_for(std::int64_t step) {
  return holdpoint::testing::generation_writer(step, "run-trust-fuzz", 4);
}

Files files_of(const FaultFileSystem& fs) {
  Files out;
  for (const std::string& directory : {kRun, kRun + "/checkpoints"}) {
    for (const auto& name : fs.list(directory)) {
      const std::string path = directory + "/" + name;
      if (name != "checkpoints") out[path] = fs.contents(path);
    }
  }
  return out;
}

struct SignedRun {
  std::shared_ptr<const holdpoint::SigningKey> key =
      std::make_shared<const holdpoint::SigningKey>(holdpoint::SigningKey::generate(holdpoint::SignatureAlgorithm::ed25519));
  std::vector<Files> after_commit;  // [k]: the directory after commit k + 1

  SignedRun() {
    using namespace holdpoint;
    FaultFileSystem fs;
    RunDirectoryOptions options;
    options.file_system = &fs;
    options.signing_key = key;
    options.best_metric = BestMetric{"loss", false};
    RunDirectory run(kRun, options);
    for (int step = 1; step <= kSteps; ++step) {
      GenerationSpec spec;
      spec.step = step;
      spec.metrics = {{"loss", 1.0 / step}};
      run.commit(spec, writer_for(step));
      after_commit.push_back(files_of(fs));
    }
  }

  holdpoint::TrustPolicy trust() const {
    holdpoint::TrustPolicy policy;
    policy.keys.push_back(key->verifying_key());
    return policy;
  }
};

const SignedRun& signed_run() {
  static const SignedRun run;
  return run;
}

std::optional<holdpoint::SignatureFile> trusted(const std::string& bytes, const holdpoint::TrustPolicy& policy) {
  try {
    holdpoint::SignatureFile signature = holdpoint::SignatureFile::parse(bytes);
    policy.verify(signature);
    return signature;
  } catch (const holdpoint::Error&) {
    return std::nullopt;
  }
}

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace holdpoint;
  if (size < 1 || size > 1 + 3 * 64) return 0;
  const SignedRun& base = signed_run();
  const std::uint8_t flags = data[0];
  Files files = base.after_commit.back();
  for (std::size_t at = 1; at + 3 <= size; at += 3) {
    const std::uint8_t op = data[at] % 4;
    const std::uint8_t a = data[at + 1];
    const std::uint8_t b = data[at + 2];
    if (op == 3) {
      const std::string generation = kRun + "/checkpoints/" + generation_name(a % kSteps + 1);
      for (const char* suffix : {"", ".sha256", ".sig"}) files.erase(generation + suffix);
      continue;
    }
    if (files.empty()) break;
    auto file = std::next(files.begin(), a % files.size());
    if (op == 0) {
      files.erase(file);
    } else if (op == 1) {
      const Files& then = base.after_commit[b % kSteps];
      if (const auto old = then.find(file->first); old != then.end()) {
        file->second = old->second;
      } else {
        files.erase(file);
      }
    } else {
      std::next(files.begin(), b % files.size())->second = file->second;
    }
  }

  const TrustPolicy policy = [&] {
    TrustPolicy p = base.trust();
    p.required = (flags & 0x02) != 0;
    if (flags & 0x04) p.min_head_step = kSteps;
    return p;
  }();
  // What the trusted signatures left in the directory name, and the bytes
  // they vouch for.
  std::int64_t newest_signed = 0;
  std::set<std::pair<std::string, std::string>> vouched;  // (name, sha256 hex)
  for (const auto& [path, bytes] : files) {
    if (!path.ends_with(".sig")) continue;
    const auto signature = trusted(bytes, policy);
    if (!signature) continue;
    const SignedStatement& s = signature->statement;
    if (const auto step = parse_generation_name(s.file); step && s.file + ".sig" == base_name(path)) {
      newest_signed = std::max(newest_signed, *step);
      vouched.emplace(s.file, s.sha256.hex());
    } else if (s.step && (s.file == "LATEST" || s.file == "index.json") && s.file + ".sig" == base_name(path)) {
      newest_signed = std::max(newest_signed, static_cast<std::int64_t>(*s.step));
    }
  }
  std::set<std::string> signed_bytes;  // generation files the signatures vouch for, by content
  for (const auto& [path, bytes] : files) {
    if (vouched.count({base_name(path), Sha256::of(std::as_bytes(std::span(bytes.data(), bytes.size()))).hex()})) {
      signed_bytes.insert(bytes);
    }
  }

  FaultFileSystem fs;
  fs.write_file(kRun + "/checkpoints/.keep", "");  // checkpoints/ exists even when the edits emptied it
  for (const auto& [path, bytes] : files) fs.write_file(path, bytes);
  RunDirectoryOptions options;
  options.file_system = &fs;
  options.recover = (flags & 0x01) != 0;
  options.trust = policy;
  options.best_metric = BestMetric{"loss", false};
  const Files before = files_of(fs);
  try {
    RunDirectory run(kRun, options);
    if (const auto latest = run.latest()) {
      try {
        run.load(*latest);
        if (latest->step < newest_signed) contract_broken();
        if ((flags & 0x04) && latest->step != kSteps) contract_broken();
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  const Files after = files_of(fs);
  if (!options.recover && after != before) contract_broken();
  std::set<std::string> kept;
  for (const auto& [path, bytes] : after) kept.insert(bytes);
  for (const auto& bytes : signed_bytes) {
    if (!kept.count(bytes)) contract_broken();
  }
  return 0;
}
