// RunDirectory's state, shared by the units that implement it
// (holdpoint/run/run_directory.h):
//
//   run_directory.cpp  the object: open's lock, reading, verifying, loading
//   run_recovery.cpp   open's recovery: scan, adopt, quarantine, LATEST, BEST
//   run_commit.cpp     commit, shard directories, retention
//   run_files.cpp      the texts of LATEST, BEST, sidecars and index.json
//   run_names.cpp      the names of generations and the files beside them
//
// Thread-safety: as RunDirectory's, one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/publish.h"
#include "holdpoint/base/file_system.h"
#include "holdpoint/run/run_directory.h"
#include "run/run_files.h"

namespace holdpoint {

namespace run {

// Failures that say nothing about a file's content: it could not be read
// here (I/O), it is beyond this build's limits, or a newer holdpoint wrote it.
// Recovery stops on these instead of falling back past a good generation.
bool unreadable_here(ErrorCode code);

inline bool better(double candidate, double incumbent, const BestMetric& metric) {
  return metric.higher_is_better ? candidate > incumbent : candidate < incumbent;
}

}  // namespace run

struct RunDirectory::Impl {
  using ByStep = std::map<std::int64_t, GenerationInfo>;
  using ByName = std::map<std::string, GenerationInfo>;

  std::filesystem::path path;
  RunDirectoryOptions options;
  io::FileSystem* fs = nullptr;
  std::unique_ptr<io::Directory> root;
  std::unique_ptr<io::Directory> checkpoints;  // null while the run has none
  ByStep committed;
  std::optional<std::int64_t> latest;
  std::optional<std::int64_t> best;
  RecoveryReport report;
  bool failed = false;
  int lock_fd = -1;
  std::optional<std::pair<std::string, Sha256Digest>> latest_pointer;  // as read on open
  std::optional<Error> latest_pointer_error;
  std::set<std::string> pending_adoption;  // generation files not yet read (newer than LATEST's)
  std::map<std::int64_t, std::string> shard_directories;  // found on open
  run::RetiredByStep retired;  // signed generations retention removed (index.json's record)
  // Under options.trust, judged on open before recovery changes anything: the
  // newest generation the run's signatures name, and the first failed check
  // of them (a read-only open keeps it, and load refuses with it).
  std::optional<std::int64_t> signed_head_step;
  std::optional<Error> signature_verdict;
  // The newest signed generation, while this process signs the run: a commit
  // signs only its own generation after it, reading no other signature.
  bool chain_head_known = false;
  std::optional<Sha256Digest> chain_head;

  ~Impl();

  // ---- run_directory.cpp ----
  // invalid_argument when opened with recover = false.
  void require_writable() const;
  void log(const std::string& line) const;
  [[noreturn]] void rethrow_with_run(const Error& error) const;
  io::Directory& checkpoints_dir();
  std::optional<std::string> read_small(io::Directory& dir, const std::string& name) const;
  io::PublishOptions publish_options(bool replace) const;
  void write_index();
  void write_pointer(std::string_view which, const GenerationInfo& g);
  void verify_bytes(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) const;
  // verify_bytes, and for a step manifest every shard it names.
  // Returns the ranks of a sharded generation (0 for a single file).
  // Recovery (`at_open`) checks a DCP generation's folder without hashing its
  // data files: each rank that loads it hashes the items it reads, and
  // verify() hashes every byte (docs/dcp.md, "What is checked when").
  std::int64_t verify_content(const GenerationInfo& g, std::span<std::byte> bytes,
                              const std::shared_ptr<const void>& owner, bool at_open = false) const;
  // Full verification of a recorded generation: sidecar, size, SHA-256,
  // bounded parse, manifest. Failures of the content come back as a failed
  // check; failures to read it at all (I/O, limits, a newer schema) are
  // thrown when `unreadable_throws`, so recovery never falls back over them.
  // Recovery passes unreadable_throws, and checks as verify_content(at_open).
  GenerationCheck check(const GenerationInfo& g, bool unreadable_throws) const;
  // Removes checkpoints/<name>/ and the files in it (shard directories hold
  // only shard and staging files).
  void remove_tree(const std::string& name);
  // Subdirectories are descended (a stray one must not block recovery);
  // symlinks are unlinked, never followed.
  static void remove_tree(io::Directory& parent, const std::string& name);
  void lock();

  // ---- run_recovery.cpp: open() in the order it runs ----
  void open();
  void remove_stale_staging_files();
  void scan_checkpoints(ByStep& present);
  ByName read_index(const ByStep& present);
  void read_latest_pointer();
  void reconcile_with_index(ByStep& present, const ByName& indexed);
  void recover_pointers(ByStep& present);
  void judge_latest_pointer(const ByStep& present);
  void verify_latest(ByStep& present);
  void remove_uncommitted(ByStep& present);
  void fall_back_to_newest_verified(ByStep& present);
  void adopt_pending(ByStep& present);
  void remove_uncommitted_shard_directories();
  void decide_index_rewrite();
  void recover_best();
  void rank_best_by_metric();
  void write_recovered_pointers();
  // A generation file the index does not list: read whole, digest computed,
  // verified; its sidecar, if any, must agree.
  GenerationCheck adopt(GenerationInfo& g) const;
  // Records the failed check and moves the generation aside.
  void quarantine_failed(ByStep& present, ByStep::iterator it, GenerationCheck check);
  // Moves a damaged generation (and its sidecar) aside under a name that is
  // not a generation's, so nothing here deletes or re-adopts it.
  void quarantine(const std::string& name);

  // ---- run_signatures.cpp ----
  // checkpoints/step-N.pt.sig files, by step.
  std::map<std::int64_t, std::string> generation_signatures() const;
  // The statement of a committed generation, from its bytes on disk
  // (read once more, against its recorded digest).
  SignedStatement generation_statement(const GenerationInfo& g) const;
  // Signs the committed generations that lack a signature, then the pointers
  // and the index (RunDirectory::sign, and open with a signing key).
  std::vector<std::string> sign_run(const SigningKey& key);
  // Signs the generation a commit just made, after the chain's head, then the
  // pointers and the index: O(1) in the run's generations.
  void sign_commit(const SigningKey& key, const GenerationInfo& g);
  void sign_pointers(const SigningKey& key, const Sha256Digest& head, std::vector<std::string>& written);
  // The signature of LATEST, BEST or index.json over its bytes on disk now.
  void sign_small_file(const SigningKey& key, std::string_view name, std::optional<std::int64_t> step,
                       const Sha256Digest& head, std::vector<std::string>& written);
  // Under options.trust: the signature of `g`, before its bytes are read
  // (signature codes; a statement that disagrees with the recorded size or
  // digest is signature_statement_mismatch).
  void check_generation_signature(const GenerationInfo& g) const;
  // What the run's signatures, trusted under `policy`, say of the run on disk
  // as it is (before recovery): "head" (the outside witness, and LATEST
  // against the newest signed generation: signature_rollback) and "chain"
  // (from the first link to the head, every signed generation present or
  // retired on record: signature_chain_broken). Sets signed_head_step.
  std::vector<GenerationCheck> judge_signed_head(const TrustPolicy& policy, std::optional<std::int64_t>* head_step) const;
  // open()'s use of it under options.trust: a recovering open refuses before
  // it changes anything; a read-only one keeps the verdict for load.
  void judge_signatures_on_open();
  // ---- run_commit.cpp ----
  // Moves BEST to `g` when its metric improved; true when it did.
  bool offer_best(const GenerationInfo& g);
  // Removes a published generation (and its sidecar) whose commit failed
  // before LATEST moved, so it is never mistaken for a committed one.
  void roll_back(const GenerationInfo& g);
};

}  // namespace holdpoint
