// RunDirectory: a training run's checkpoints on disk, published crash-safely.
//
//   run/
//     checkpoints/step-00000005.pt         one generation = one file
//     checkpoints/step-00000005.pt.sha256  its digest, in sha256sum format
//     LATEST                               "step-00000005.pt <sha256>\n"
//     BEST                                 the same, for the best metric
//     index.json                           step, epoch, kind, size, sha256, time, metrics
//     checkpoints/step-00000005.shards/    a sharded generation's shard files; the
//                                          .pt is then its step manifest
//                                          (holdpoint/run/sharded_checkpoint.h)
//
// Commit (commit()): the generation is published through io::publish (staged,
// hashed, fsynced, read back and verified, renamed without overwriting, the
// directory fsynced), then its sidecar, then index.json, then LATEST is
// replaced atomically: replacing LATEST is the commit point. BEST follows when
// the metric improved, then retention runs. A crash anywhere leaves either the
// previous committed generation or the new one; docs/publication.md argues
// each step.
//
// Open (the constructor) takes an advisory lock (.holdpoint-lock; only with
// recover = true on the default POSIX file system; a second writer gets
// run_directory_locked) and recovers: stale staging files and orphaned
// sidecars are removed; LATEST is read and its generation
// verified (size, SHA-256 against pointer, sidecar and index, bounded parse,
// manifest schema, and for a sharded generation every shard's size, SHA-256
// and content); generations newer than a verified LATEST are uncommitted
// leftovers of an interrupted save and are removed; a missing or damaged
// LATEST falls back to the newest generation that verifies (LATEST is
// rewritten); index entries without a file are dropped and generation files
// missing from the index are read, hashed, verified and re-adopted. A
// generation whose content fails verification is moved aside as
// "<name>.damaged" (never deleted, never a generation again). A generation
// that cannot be read at all (an I/O error, beyond Limits, a newer schema)
// stops recovery with run_generation_unreadable instead of falling back past
// it. recovery() says what was found and done. With `recover = false` nothing
// is changed and the report says what recovery would do (`holdpoint ls`).
//
// Retention keeps the newest N, every K-th step and the best K by a metric,
// never deletes the generation LATEST or BEST names or the newest verified
// one, deletes only names it parsed as its own (step-<digits>.pt and their
// sidecars), and deletes nothing once an operation of this object failed.
//
// Failure contract: throws holdpoint::Error naming the run directory and the
// file; run_* codes for the directory's own files, io_* for the file system
// (a symlink in place of the run directory is io_open_failed: it is opened
// with O_NOFOLLOW), and the reader's codes for a generation that does not
// verify.
//
// Thread-safety: one thread at a time (CheckpointManager serialises its
// background saves against the training thread).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/error.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/signature.h"

namespace holdpoint {

inline constexpr std::string_view kCheckpointsDirectory = "checkpoints";
inline constexpr std::string_view kLatestPointer = "LATEST";
inline constexpr std::string_view kBestPointer = "BEST";
inline constexpr std::string_view kRunIndex = "index.json";

// "step-00000005.pt" (at least 8 digits) and its inverse; nullopt for any
// other name, sidecars included.
std::string generation_name(std::int64_t step);
std::optional<std::int64_t> parse_generation_name(std::string_view name) noexcept;

struct GenerationInfo {
  std::string name;  // "step-00000005.pt", relative to checkpoints/
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::string kind = "resume";
  std::uint64_t size = 0;
  Sha256Digest sha256;
  std::string saved_at;  // UTC, ISO 8601; empty when re-adopted without an index entry
  std::vector<std::pair<std::string, double>> metrics;
  // Ranks that wrote a sharded generation (docs/distributed.md); 0 for a
  // single-file generation or one re-adopted without its index entry.
  std::int64_t world_size = 0;

  std::optional<double> metric(std::string_view metric_name) const;
};

struct GenerationCheck {
  std::string name;
  bool ok = false;
  std::optional<ErrorCode> code;  // set when !ok
  std::string detail;
};

struct RecoveryReport {
  std::vector<std::string> removed_staging;
  std::vector<std::string> removed_uncommitted;  // generations newer than LATEST (and their sidecars)
  std::vector<GenerationCheck> damaged;          // failed verification; moved aside, never LATEST
  std::vector<std::string> quarantined;          // where damaged files went: "<name>.damaged"
  std::vector<std::string> previously_quarantined;  // "<name>.damaged" files found from earlier opens
  std::vector<std::string> removed_orphan_sidecars;  // sidecars whose generation is gone
  std::vector<std::string> adopted;              // generation files the index lacked
  std::vector<std::string> dropped_from_index;   // index entries without a file
  std::optional<std::string> latest_problem;     // LATEST missing, malformed or not verifying
  std::optional<std::string> best_problem;
  std::optional<std::string> index_problem;      // index.json missing or malformed (rebuilt)
  bool latest_rewritten = false;
  bool best_rewritten = false;
  bool index_rewritten = false;
  std::optional<std::string> latest;  // the verified LATEST after recovery
  bool read_only = false;             // nothing was changed: the fields say what would be

  bool clean() const noexcept;
  // With no verified LATEST: evidence that an earlier run had generations
  // that are now unusable (damaged, quarantined, indexed but missing, a
  // malformed LATEST), in words; nullopt for a genuinely new run. Resuming
  // refuses to start over when this is set (run_no_generation).
  std::optional<std::string> lost_generations() const;
  // One line per finding, for logs.
  std::vector<std::string> lines() const;
};

struct RetentionPolicy {
  std::size_t keep_last = 0;     // 0 keeps every generation
  std::int64_t keep_every = 0;   // also keep steps that are multiples of K (0: none)
  std::size_t keep_best = 0;     // also keep the K best by the run's best metric
  bool enabled() const noexcept { return keep_last > 0; }
};

struct BestMetric {
  std::string name;
  bool higher_is_better = false;
};

struct RunDirectoryOptions {
  io::FileSystem* file_system = nullptr;  // default: the POSIX file system
  bool create = true;                     // create the directory when it is missing (only with recover)
  bool recover = true;                    // false: inspect only, change nothing
  std::optional<BestMetric> best_metric;  // what BEST and keep_best rank by
  RetentionPolicy retention;              // applied after each commit
  bool durable = true;                    // fsync files and directories
  ReadBack read_back = ReadBack::cached;  // how a generation is checked before commit (docs/publication.md)
  Limits limits;                          // bounds of every verifying read
  std::function<void(const std::string&)> log;  // recovery and retention messages
  // Signs the run as it goes (docs/threat-model.md, "Signing a run"): each
  // generation this object commits gets checkpoints/step-N.pt.sig once LATEST
  // names it, its statement taken from the file on disk (one more read of
  // it) and naming the digest of the generation signed before it; then
  // LATEST, BEST and index.json are signed over again. Open signs what a
  // crash left unsigned. The key stays in this process's memory.
  std::shared_ptr<const SigningKey> signing_key;
  // Signatures that load() and verify() require of a generation, checked
  // before a byte of it is read; CheckpointManager::resume also checks the
  // whole run (verify_signatures) before it loads LATEST.
  std::optional<TrustPolicy> trust;
  // Test instrumentation: called inside commit() with "published" once the
  // generation file and its sidecar are durable, before index.json and LATEST
  // move (crash tests kill the process there).
  std::function<void(std::string_view stage)> commit_observer;
};

// What a commit writes besides the bytes.
struct GenerationSpec {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::string kind = "resume";
  std::vector<std::pair<std::string, double>> metrics;
  std::int64_t world_size = 0;  // set by sharded commits
};

struct CommitResult {
  GenerationInfo generation;
  bool became_best = false;
  std::vector<std::string> deleted;  // by retention
};

struct GcPlan {
  std::vector<std::string> keep;    // generation names, with the reason in `reasons`
  std::vector<std::pair<std::string, std::string>> reasons;
  std::vector<std::string> remove;  // generation names
};

class RunDirectory {
 public:
  using Writer = std::function<void(io::ByteSink&)>;
  // Checks the bytes read back before the rename (default: they parse with
  // the restricted reader and hold a holdpoint manifest that reads).
  using Verifier = std::function<void(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner)>;

  explicit RunDirectory(const std::filesystem::path& path, RunDirectoryOptions options = {});
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::filesystem::path& path() const noexcept;
  const RunDirectoryOptions& options() const noexcept;
  const RecoveryReport& recovery() const noexcept;

  // Committed generations, by step.
  std::vector<GenerationInfo> generations() const;
  std::optional<GenerationInfo> latest() const;
  std::optional<GenerationInfo> best() const;
  std::optional<GenerationInfo> find(std::string_view name) const;
  std::filesystem::path file_path(const GenerationInfo& generation) const;

  // Publishes a new generation and moves LATEST (and BEST) to it; then
  // applies the retention policy. A step already committed is refused
  // (run_generation_exists). On failure before LATEST moved, LATEST, BEST
  // and the committed generations are untouched.
  CommitResult commit(const GenerationSpec& spec, const Writer& write, const Verifier& verify = {});

  // Sharded generations (holdpoint/dist/distributed.h): creates the empty
  // directory checkpoints/step-<N>.shards/ for the ranks to publish their
  // shards into and returns its path; a leftover of an uncommitted earlier
  // attempt at this step is removed first. A committed step is refused
  // (run_generation_exists), and so is a step before LATEST's
  // (run_step_not_increasing). The step manifest is then committed with
  // commit(); recovery removes a shard directory without a committed
  // manifest, and retention removes it with its manifest (manifest first).
  std::filesystem::path prepare_shard_directory(std::int64_t step);
  // Removes an uncommitted step's shard directory (after a failed save).
  void discard_shard_directory(std::int64_t step);

  // Reads a generation into private memory against its recorded digest and
  // parses it with the restricted reader.
  LoadedMapping load(const GenerationInfo& generation) const;
  GenerationCheck verify(const GenerationInfo& generation) const;
  std::vector<GenerationCheck> verify_all() const;

  // Signs, with `key`, every committed generation that has no valid-looking
  // signature yet (oldest first, each statement naming the digest of the
  // generation before it in the chain), then LATEST, BEST and index.json.
  // Existing generation signatures are kept: the chain goes on from them.
  // Returns the files written, relative to the run directory.
  std::vector<std::string> sign(const SigningKey& key);
  // Checks the run's signatures under `policy`, one check per signature file
  // and one for the chain:
  //   - each checkpoints/step-N.pt.sig verifies under the policy, names its
  //     file, and (for a committed generation) its size and SHA-256;
  //   - a committed generation without one: signature_missing (required);
  //   - by step, each signed generation's previous-sha256 is the digest of
  //     the signed generation before it: signature_chain_broken otherwise;
  //   - LATEST names the newest signed generation, and LATEST.sig, BEST.sig
  //     and index.json.sig sign the current bytes and name that generation
  //     as the chain's head: signature_rollback otherwise (an older pointer,
  //     or an older signature of it, put back).
  // Signatures of generations that retention removed stay, so the chain
  // stays whole. Never throws on content: failures are checks with a code.
  std::vector<GenerationCheck> verify_signatures(const TrustPolicy& policy) const;
  // verify_signatures, throwing the first failed check as an Error naming the
  // run and the file (what resume runs under RunDirectoryOptions::trust).
  void require_signatures(const TrustPolicy& policy) const;

  // What a retention policy would keep and remove now.
  GcPlan plan_gc(const RetentionPolicy& policy) const;
  // Applies it (dry_run: plan only); returns the removed names.
  std::vector<std::string> collect_garbage(const RetentionPolicy& policy, bool dry_run = false);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Compact JSON, the shapes `holdpoint ls`, `verify RUN` and export proofs
// print (docs/cli.md), fields in this order (run_json.cpp):
//   {"name", "step", "epoch", "kind", "size", "sha256", "saved_at",
//    "metrics": {name: value}, "world_size"}
//   {"name", "ok", "code" (null when ok), "detail"}
std::string to_json(const GenerationInfo& generation);
std::string to_json(const GenerationCheck& check);
// "sha256_mismatch: <detail>", or "ok".
std::string to_text(const GenerationCheck& check);

}  // namespace holdpoint
