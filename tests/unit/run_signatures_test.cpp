// A run directory's signatures (RunDirectory::sign, verify_signatures,
// RunDirectoryOptions::signing_key and ::trust): commit-time signing, the
// chain over previous-sha256, pointers and index, and each refusal with its
// own code: unsigned, another key, revoked, a forged signature, a gap, a
// replaced generation, a rolled-back LATEST or BEST, an edited index. A
// refusal leaves every file of the run as it was. Issue 35's attacks on a
// trusting open (the newest generation deleted with its signature, a
// signature deleted and LATEST put back, the oldest generation removed, a
// whole-directory rollback caught by an outside witness) each fail on the
// code before it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/fault_file_system.h"
#include "support/generation_writer.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

RunDirectory::Writer writer_for(std::int64_t step) { return testing::generation_writer(step, "run-signatures-test", 16); }

GenerationSpec spec(std::int64_t step, double loss) {
  GenerationSpec s;
  s.step = step;
  s.metrics = {{"loss", loss}};
  return s;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Every file of a directory tree and its bytes: "nothing changed" is checked
// against this.
std::map<std::string, std::string> contents(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_regular_file() && entry.path().filename() != ".holdpoint-lock") {
      out[fs::relative(entry.path(), root).string()] = read_text(entry.path());
    }
  }
  return out;
}

struct Signer {
  std::shared_ptr<const SigningKey> key =
      std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::ed25519));
  TrustPolicy trust() const {
    TrustPolicy policy;
    policy.keys.push_back(key->verifying_key());
    return policy;
  }
};

RunDirectoryOptions signing(const Signer& signer) {
  RunDirectoryOptions options;
  options.signing_key = signer.key;
  options.best_metric = BestMetric{"loss", false};
  return options;
}

RunDirectoryOptions read_only() {
  RunDirectoryOptions options;
  options.recover = false;
  options.best_metric = BestMetric{"loss", false};
  return options;
}

// The first failed check's code, or nullopt when every check passed.
std::optional<ErrorCode> first_failure(const std::vector<GenerationCheck>& checks) {
  for (const auto& check : checks) {
    if (!check.ok) return check.code;
  }
  return std::nullopt;
}

std::optional<ErrorCode> verdict(const fs::path& run, const TrustPolicy& policy) {
  return first_failure(RunDirectory(run, read_only()).verify_signatures(policy));
}

// A run of steps 1, 2, 3 committed with a signing key (BEST: step 2).
fs::path signed_run(const TempDir& tmp, const Signer& signer) {
  const fs::path path = tmp / "run";
  RunDirectory run(path, signing(signer));
  run.commit(spec(1, 0.9), writer_for(1));
  run.commit(spec(2, 0.4), writer_for(2));
  run.commit(spec(3, 0.6), writer_for(3));
  return path;
}

// A run of steps 1, 2, 3 signed as it goes, and LATEST and LATEST.sig as
// they were after step 2 (what a rollback puts back).
struct RunWithOldLatest {
  fs::path run;
  std::string old_latest;
  std::string old_latest_sig;
};

RunWithOldLatest run_with_old_latest(const TempDir& tmp, const Signer& signer) {
  RunWithOldLatest out{tmp / "run", {}, {}};
  RunDirectory live(out.run, signing(signer));
  live.commit(spec(1, 0.9), writer_for(1));
  live.commit(spec(2, 0.5), writer_for(2));
  out.old_latest = read_text(out.run / "LATEST");
  out.old_latest_sig = read_text(out.run / "LATEST.sig");
  live.commit(spec(3, 0.7), writer_for(3));
  return out;
}

TEST(RunSignatures, CommitSignsEachGenerationThePointersAndTheIndex) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  for (const char* name : {"checkpoints/step-00000001.pt.sig", "checkpoints/step-00000002.pt.sig",
                           "checkpoints/step-00000003.pt.sig", "LATEST.sig", "BEST.sig", "index.json.sig"}) {
    EXPECT_TRUE(fs::exists(run / name)) << name;
  }
  const auto checks = RunDirectory(run, read_only()).verify_signatures(signer.trust());
  EXPECT_EQ(first_failure(checks), std::nullopt);
  EXPECT_EQ(checks.size(), 8u);  // three generations, the head, the chain, LATEST, BEST, index.json
  // Each statement names the one before it.
  const auto second = read_signature_file(run / "checkpoints/step-00000002.pt");
  const auto first = read_signature_file(run / "checkpoints/step-00000001.pt");
  ASSERT_TRUE(first && second);
  EXPECT_FALSE(first->statement.previous_sha256.has_value());
  EXPECT_EQ(second->statement.previous_sha256, first->statement.sha256);
  // The private key is in no file of the run.
  for (const auto& [name, text] : contents(run)) {
    EXPECT_EQ(text.find("PRIVATE"), std::string::npos) << name;
  }
}

TEST(RunSignatures, SignAfterTheFactChainsEveryGenerationAndKeepsExistingOnes) {
  TempDir tmp;
  Signer signer;
  {
    RunDirectory run(tmp / "run");
    for (int step = 1; step <= 3; ++step) run.commit(spec(step, 1.0), writer_for(step));
  }
  EXPECT_EQ(verdict(tmp / "run", signer.trust()), ErrorCode::signature_missing);
  RunDirectory run(tmp / "run");
  const auto written = run.sign(*signer.key);
  EXPECT_EQ(written.size(), 5u);  // three generations, LATEST, index.json (no BEST)
  EXPECT_EQ(verdict(tmp / "run", signer.trust()), std::nullopt);
  const std::string first_signature = read_text(tmp / "run/checkpoints/step-00000001.pt.sig");
  run.commit(spec(4, 1.0), writer_for(4));
  const auto again = run.sign(*signer.key);
  EXPECT_EQ(again.size(), 3u);  // step 4, LATEST, index.json
  EXPECT_EQ(read_text(tmp / "run/checkpoints/step-00000001.pt.sig"), first_signature);
  EXPECT_EQ(verdict(tmp / "run", signer.trust()), std::nullopt);
  const auto fourth = read_signature_file(tmp / "run/checkpoints/step-00000004.pt");
  ASSERT_TRUE(fourth.has_value());
  EXPECT_EQ(fourth->statement.previous_sha256, run.find("step-00000003.pt")->sha256);
}

TEST(RunSignatures, RetentionKeepsTheSignaturesSoTheChainStaysWhole) {
  TempDir tmp;
  Signer signer;
  RunDirectoryOptions options = signing(signer);
  options.retention.keep_last = 2;
  {
    RunDirectory run(tmp / "run", options);
    for (int step = 1; step <= 5; ++step) run.commit(spec(step, 1.0 / step), writer_for(step));
    EXPECT_EQ(run.generations().size(), 2u);
  }
  EXPECT_FALSE(fs::exists(tmp / "run/checkpoints/step-00000002.pt"));
  EXPECT_TRUE(fs::exists(tmp / "run/checkpoints/step-00000002.pt.sig"));
  EXPECT_EQ(verdict(tmp / "run", signer.trust()), std::nullopt);
}

TEST(RunSignatures, OpeningWithTheKeySignsWhatACrashLeftUnsigned) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  // A crash after LATEST moved, before the signatures were written.
  fs::remove(run / "checkpoints/step-00000003.pt.sig");
  fs::remove(run / "LATEST.sig");
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_missing);
  { RunDirectory reopened(run, signing(signer)); }
  EXPECT_EQ(verdict(run, signer.trust()), std::nullopt);
}

TEST(RunSignatures, AnUnsignedRunPassesOnlyAnOptionalPolicy) {
  TempDir tmp;
  Signer signer;
  { RunDirectory(tmp / "run").commit(spec(1, 1.0), writer_for(1)); }
  TrustPolicy optional = signer.trust();
  optional.required = false;
  EXPECT_EQ(verdict(tmp / "run", optional), std::nullopt);
  EXPECT_EQ(verdict(tmp / "run", signer.trust()), ErrorCode::signature_missing);
}

TEST(RunSignatures, AnotherKeyARevokedKeyAndAForgedSignatureAreRefused) {
  TempDir tmp;
  Signer signer;
  Signer stranger;
  const fs::path run = signed_run(tmp, signer);
  EXPECT_EQ(verdict(run, stranger.trust()), ErrorCode::signature_key_unknown);
  TrustPolicy revoked = signer.trust();
  revoked.revoked_key_ids.insert(signer.key->key_id());
  EXPECT_EQ(verdict(run, revoked), ErrorCode::signature_key_revoked);
  // A signature line of another statement.
  const fs::path sig = run / "checkpoints/step-00000002.pt.sig";
  const std::string forged_from = read_text(run / "checkpoints/step-00000001.pt.sig");
  std::string text = read_text(sig);
  const auto at = text.rfind("\nsignature ");
  text = text.substr(0, at) + forged_from.substr(forged_from.rfind("\nsignature "));
  write_text(sig, text);
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_invalid);
  write_text(sig, text.substr(0, text.size() / 2));  // truncated
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_malformed);
}

TEST(RunSignatures, AGapInTheChainIsFound) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  // Step 2 and its signature removed by hand: step 3 names a generation
  // whose signature is gone.
  for (const char* name : {"step-00000002.pt", "step-00000002.pt.sig", "step-00000002.pt.sha256"}) {
    fs::remove(run / "checkpoints" / name);
  }
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_chain_broken);
}

TEST(RunSignatures, GenerationsSwappedWithTheirSignaturesAreFound) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  // Steps 2 and 3 trade places, each with its signature and sidecar: every
  // statement names its own file, so the swap cannot pass for the chain.
  for (const char* suffix : {"", ".sig", ".sha256"}) {
    const fs::path two = run / "checkpoints" / (std::string("step-00000002.pt") + suffix);
    const fs::path three = run / "checkpoints" / (std::string("step-00000003.pt") + suffix);
    fs::rename(two, run / "swap");
    fs::rename(three, two);
    fs::rename(run / "swap", three);
  }
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_statement_mismatch);
}

TEST(RunSignatures, AGenerationReplacedWithAnotherSignedOneBreaksTheChain) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  TempDir other_tmp;
  // Another run by the same key, whose step 2 differs.
  const fs::path other = other_tmp / "run";
  {
    RunDirectory run_b(other, signing(signer));
    run_b.commit(spec(2, 0.4), writer_for(7));
  }
  for (const char* name : {"step-00000002.pt", "step-00000002.pt.sig", "step-00000002.pt.sha256"}) {
    fs::copy_file(other / "checkpoints" / name, run / "checkpoints" / name, fs::copy_options::overwrite_existing);
  }
  // The index still records the old digest: the run itself no longer opens
  // cleanly, and the signatures say why.
  const auto checks = RunDirectory(run, read_only()).verify_signatures(signer.trust());
  const auto code = first_failure(checks);
  EXPECT_TRUE(code == ErrorCode::signature_statement_mismatch || code == ErrorCode::signature_chain_broken)
      << (code ? error_code_name(*code) : "none");
}

TEST(RunSignatures, ARolledBackLatestIsFoundAndRefusedBeforeAnythingIsRemoved) {
  TempDir tmp;
  Signer signer;
  const RunWithOldLatest rolled = run_with_old_latest(tmp, signer);
  const fs::path& run = rolled.run;
  const std::string& old_latest = rolled.old_latest;
  const std::string& old_latest_sig = rolled.old_latest_sig;
  write_text(run / "LATEST", old_latest);
  write_text(run / "LATEST.sig", old_latest_sig);
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_rollback);
  // A trainer that opens the run under the policy is refused, and step 3,
  // which plain recovery would remove as uncommitted, stays.
  const auto before = contents(run);
  RunDirectoryOptions trusting;
  trusting.trust = signer.trust();
  EXPECT_ERROR_CODE(RunDirectory(run, trusting), ErrorCode::signature_rollback);
  EXPECT_EQ(contents(run), before);
  // The pointer's own signature alone put back is a rollback too.
  TempDir tmp2;
  const fs::path run2 = tmp2 / "run";
  std::string old_index_sig;
  {
    RunDirectory live(run2, signing(signer));
    live.commit(spec(1, 0.9), writer_for(1));
    old_index_sig = read_text(run2 / "index.json.sig");
    live.commit(spec(2, 0.5), writer_for(2));
  }
  write_text(run2 / "index.json.sig", old_index_sig);
  EXPECT_NE(verdict(run2, signer.trust()), std::nullopt);
}

TEST(RunSignatures, ARolledBackBestIsFound) {
  TempDir tmp;
  Signer signer;
  const fs::path run = tmp / "run";
  std::string old_best;
  std::string old_best_sig;
  {
    RunDirectory live(run, signing(signer));
    live.commit(spec(1, 0.9), writer_for(1));
    old_best = read_text(run / "BEST");
    old_best_sig = read_text(run / "BEST.sig");
    live.commit(spec(2, 0.5), writer_for(2));  // the new BEST
  }
  write_text(run / "BEST", old_best);
  write_text(run / "BEST.sig", old_best_sig);
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_rollback);
}

TEST(RunSignatures, AnEditedIndexIsFound) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  std::string index = read_text(run / "index.json");
  const auto at = index.find("0.9");
  ASSERT_NE(at, std::string::npos);
  index.replace(at, 3, "0.1");  // step 1's loss, now the best
  write_text(run / "index.json", index);
  const auto checks = RunDirectory(run, read_only()).verify_signatures(signer.trust());
  bool index_refused = false;
  for (const auto& check : checks) {
    if (check.name == "index.json.sig") index_refused = check.code == ErrorCode::signature_statement_mismatch;
  }
  EXPECT_TRUE(index_refused);
}

TEST(RunSignatures, LoadAndVerifyUnderATrustPolicyCheckTheGenerationsSignature) {
  TempDir tmp;
  Signer signer;
  Signer stranger;
  const fs::path run = signed_run(tmp, signer);
  RunDirectoryOptions trusting = read_only();
  trusting.trust = signer.trust();
  {
    RunDirectory reader(run, trusting);
    EXPECT_EQ(reader.load(*reader.latest()).root.as_dict().at("payload").as_tensor().numel(), 16);
    EXPECT_TRUE(reader.verify(*reader.latest()).ok);
  }
  trusting.trust = stranger.trust();
  {
    RunDirectory reader(run, trusting);
    EXPECT_ERROR_CODE(reader.load(*reader.latest()), ErrorCode::signature_key_unknown);
    const GenerationCheck check = reader.verify(*reader.latest());
    EXPECT_FALSE(check.ok);
    EXPECT_EQ(check.code, ErrorCode::signature_key_unknown);
  }
  fs::remove(run / "checkpoints/step-00000003.pt.sig");
  trusting.trust = signer.trust();
  RunDirectory reader(run, trusting);
  // A read-only open keeps the verdict: step 3 is the head the signed index
  // and pointers name, and its signature is gone.
  EXPECT_ERROR_CODE(reader.load(*reader.latest()), ErrorCode::signature_missing);
  EXPECT_ERROR_CODE(reader.require_signatures(signer.trust()), ErrorCode::signature_missing);
  // Another generation's signature beside it: the statement names another
  // file (a new open: a read-only one keeps the verdict it judged).
  fs::copy_file(run / "checkpoints/step-00000002.pt.sig", run / "checkpoints/step-00000003.pt.sig");
  RunDirectory second_reader(run, trusting);
  EXPECT_ERROR_CODE(second_reader.load(*second_reader.latest()), ErrorCode::signature_statement_mismatch);
}

TEST(RunSignatures, AnHmacKeySignsAndVerifiesARun) {
  TempDir tmp;
  Signer signer;
  signer.key = std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::hmac_sha256));
  const fs::path run = signed_run(tmp, signer);
  EXPECT_EQ(verdict(run, signer.trust()), std::nullopt);
  EXPECT_EQ(read_text(run / "LATEST.sig").find(std::string("algorithm hmac-sha256")) != std::string::npos, true);
}


RunDirectoryOptions trusting(const Signer& signer) {
  RunDirectoryOptions options;
  options.trust = signer.trust();
  options.best_metric = BestMetric{"loss", false};
  return options;
}

void remove_generation(const fs::path& run, const std::string& name, bool with_signature) {
  fs::remove(run / "checkpoints" / name);
  fs::remove(run / "checkpoints" / (name + ".sha256"));
  if (with_signature) fs::remove(run / "checkpoints" / (name + ".sig"));
}

TEST(RunSignatures, TheNewestGenerationDeletedWithItsSignatureIsARollbackAtOpen) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  remove_generation(run, "step-00000003.pt", true);
  // LATEST, LATEST.sig, BEST.sig and the signed index still name step 3.
  const auto before = contents(run);
  EXPECT_ERROR_CODE(RunDirectory(run, trusting(signer)), ErrorCode::signature_rollback);
  EXPECT_EQ(contents(run), before);
  RunDirectoryOptions reading = trusting(signer);
  reading.recover = false;
  RunDirectory reader(run, reading);
  ASSERT_TRUE(reader.find("step-00000002.pt").has_value());
  EXPECT_ERROR_CODE(reader.load(*reader.find("step-00000002.pt")), ErrorCode::signature_rollback);
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_rollback);
  // Without a policy, recovery falls back as before: the signatures are not its business.
  EXPECT_EQ(RunDirectory(run).latest()->step, 2);
}

TEST(RunSignatures, ASignatureDeletedAndLatestPutBackIsRefusedAndTheGenerationKept) {
  TempDir tmp;
  Signer signer;
  const RunWithOldLatest rolled = run_with_old_latest(tmp, signer);
  const fs::path& run = rolled.run;
  const std::string& old_latest = rolled.old_latest;
  const std::string& old_latest_sig = rolled.old_latest_sig;
  fs::remove(run / "checkpoints/step-00000003.pt.sig");
  write_text(run / "LATEST", old_latest);
  write_text(run / "LATEST.sig", old_latest_sig);
  // BEST.sig and index.json.sig name step 3's digest as the head; the signed
  // index lists it. Recovery would have unlinked step 3 as uncommitted.
  const auto before = contents(run);
  EXPECT_ERROR_CODE(RunDirectory(run, trusting(signer)), ErrorCode::signature_rollback);
  EXPECT_EQ(contents(run), before);
  EXPECT_TRUE(fs::exists(run / "checkpoints/step-00000003.pt"));
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_rollback);
}

TEST(RunSignatures, TheOldestGenerationRemovedWithItsSignatureBreaksTheChain) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  remove_generation(run, "step-00000001.pt", true);
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_chain_broken);
  const auto before = contents(run);
  EXPECT_ERROR_CODE(RunDirectory(run, trusting(signer)), ErrorCode::signature_chain_broken);
  EXPECT_EQ(contents(run), before);
  // The same with the index rewritten unsigned (it no longer lists step 1):
  // the first link still names a predecessor.
  { RunDirectory(run).generations(); }  // plain recovery rewrites the index
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_chain_broken);
}

TEST(RunSignatures, ASignedGenerationRemovedWithoutARetentionRecordBreaksTheChain) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  remove_generation(run, "step-00000002.pt", false);  // its signature stays, as retention would leave it
  EXPECT_EQ(verdict(run, signer.trust()), ErrorCode::signature_chain_broken);
  EXPECT_ERROR_CODE(RunDirectory(run, trusting(signer)), ErrorCode::signature_chain_broken);
  EXPECT_TRUE(fs::exists(run / "checkpoints/step-00000003.pt"));
}

TEST(RunSignatures, RetentionRecordsWhatItRemovesInTheSignedIndex) {
  TempDir tmp;
  Signer signer;
  RunDirectoryOptions options = signing(signer);
  options.retention.keep_last = 2;
  {
    RunDirectory run(tmp / "run", options);
    for (int step = 1; step <= 4; ++step) run.commit(spec(step, 1.0 / step), writer_for(step));
  }
  const std::string index = read_text(tmp / "run/index.json");
  EXPECT_NE(index.find("\"retired\""), std::string::npos);
  EXPECT_NE(index.find("step-00000001.pt"), std::string::npos);
  RunDirectory run(tmp / "run", trusting(signer));
  EXPECT_EQ(run.latest()->step, 4);
  EXPECT_EQ(first_failure(run.verify_signatures(signer.trust())), std::nullopt);
  // The record survives recovery's rewrite of the index, and an unsigned run
  // writes none.
  TempDir plain;
  RetentionPolicy keep_one;
  keep_one.keep_last = 1;
  RunDirectoryOptions unsigned_options;
  unsigned_options.retention = keep_one;
  {
    RunDirectory unsigned_run(plain / "run", unsigned_options);
    for (int step = 1; step <= 3; ++step) unsigned_run.commit(spec(step, 1.0), writer_for(step));
  }
  EXPECT_EQ(read_text(plain / "run/index.json").find("retired"), std::string::npos);
}

TEST(RunSignatures, ADamagedNewestGenerationIsNotFallenBackFromUnderTrust) {
  TempDir tmp;
  Signer signer;
  const fs::path run = signed_run(tmp, signer);
  std::string bytes = read_text(run / "checkpoints/step-00000003.pt");
  bytes[bytes.size() / 2] ^= 0x01;
  write_text(run / "checkpoints/step-00000003.pt", bytes);
  const auto before = contents(run);
  EXPECT_ERROR_CODE(RunDirectory(run, trusting(signer)), ErrorCode::signature_rollback);
  EXPECT_EQ(contents(run), before);
}

TEST(RunSignatures, AWholeDirectoryRollbackIsCaughtOnlyByAnOutsideWitness) {
  TempDir tmp;
  Signer signer;
  const fs::path run = tmp / "run";
  const fs::path saved = tmp / "saved";
  Sha256Digest head;
  {
    RunDirectory live(run, signing(signer));
    live.commit(spec(1, 0.9), writer_for(1));
    live.commit(spec(2, 0.5), writer_for(2));
    fs::copy(run, saved, fs::copy_options::recursive);
    live.commit(spec(3, 0.7), writer_for(3));
    head = live.latest()->sha256;
  }
  TrustPolicy witness = signer.trust();
  witness.min_head_step = 3;
  EXPECT_EQ(verdict(run, witness), std::nullopt);
  witness.expected_head_sha256 = head;
  EXPECT_EQ(verdict(run, witness), std::nullopt);
  // Every file of the run put back as it was after step 2, signatures included.
  fs::remove_all(run);
  fs::copy(saved, run, fs::copy_options::recursive);
  EXPECT_EQ(verdict(run, signer.trust()), std::nullopt);  // nothing inside the run can tell
  TrustPolicy at_least = signer.trust();
  at_least.min_head_step = 3;
  EXPECT_EQ(verdict(run, at_least), ErrorCode::signature_rollback);
  TrustPolicy exactly = signer.trust();
  exactly.expected_head_step = 3;
  EXPECT_EQ(verdict(run, exactly), ErrorCode::signature_rollback);
  TrustPolicy by_digest = signer.trust();
  by_digest.expected_head_sha256 = head;
  EXPECT_EQ(verdict(run, by_digest), ErrorCode::signature_rollback);
  RunDirectoryOptions options = trusting(signer);
  options.trust->min_head_step = 3;
  EXPECT_ERROR_CODE(RunDirectory(run, options), ErrorCode::signature_rollback);
}

TEST(RunSignatures, ACommitSignsInWorkThatDoesNotGrowWithTheRun) {
  // File operations of one signed commit, early and late in a run on the
  // in-memory file system: signing reads no earlier generation's signature.
  testing::FaultFileSystem fs;
  Signer signer;
  RunDirectoryOptions options = signing(signer);
  options.file_system = &fs;
  RunDirectory run("/run", options);
  const auto operations_of_commit = [&](std::int64_t step) {
    fs.reset_counter();
    run.commit(spec(step, 1.0), writer_for(step));
    return fs.operation_count();
  };
  for (int step = 1; step < 10; ++step) operations_of_commit(step);
  const std::uint64_t early = operations_of_commit(10);
  for (int step = 11; step < 200; ++step) operations_of_commit(step);
  const std::uint64_t late = operations_of_commit(200);
  EXPECT_EQ(late, early);
  for (const auto& check : run.verify_signatures(signer.trust())) EXPECT_TRUE(check.ok) << check.name << ": " << check.detail;
}

}  // namespace
}  // namespace holdpoint
