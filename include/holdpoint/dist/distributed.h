// DistributedCheckpointer: one consistent checkpoint across the ranks of a
// c10d process group (docs/distributed.md).
//
// The API takes a c10d::ProcessGroup& and uses only its collectives
// (allgather of CPU int64 and uint8 tensors); nothing here names a backend.
// A group that carries only device tensors (NCCL) needs a CPU-capable group
// over the same ranks for these small agreement messages: pass a Gloo group
// as DistributedCheckpointOptions::coordination (untested here: this machine
// has no GPU).
//
// Save (collective; every rank calls save() with the same spec):
//   1. each rank captures its TrainingState; replicated components (all but
//      `rank_local`) are partitioned so each storage is written by one rank
//      (holdpoint/run/sharded_checkpoint.h); the ranks check they partitioned
//      alike (distributed_replicated_mismatch) and agree on the step,
//      configuration identity, profile, semantic identity and component
//      names (distributed_ranks_disagree), and the coordinator (rank 0)
//      creates checkpoints/step-N.shards/;
//   2. each rank publishes its shard (staged, SHA-256 while streaming,
//      fsynced, read back and verified, renamed, directory fsynced);
//   3. sizes and digests are gathered; any rank's failure fails the save on
//      every rank, naming the rank and its reason (distributed_rank_failed);
//   4. the coordinator commits the step manifest through RunDirectory::commit
//      (world size, the shards' sizes and digests, profile, configuration
//      identity); moving LATEST is the commit point;
//   5. the outcome is gathered, so every rank returns the committed
//      generation or throws the coordinator's error.
// A rank that dies makes its peers' next collective fail: nobody commits and
// LATEST stays on the previous generation; the partial shard directory is
// removed by the next open's recovery (or at once after a reported failure).
//
// Load (collective): every rank reads the step manifest (against LATEST's or
// the given digest) and its own share of the shards: saved shard s is read
// by rank s mod world (so with an unchanged world, each rank its own shard).
// The reader checks the shard's size, SHA-256 against the step manifest,
// schema, identity and component digests. The ranks agree on that verdict
// (a damaged shard fails the load on every rank, before any byte is sent),
// then each reader broadcasts its verified bytes with their XXH3-128; every
// receiver checks that digest and parses the shard with the same schema and
// identity checks. Each rank then merges the replicated components and runs
// TrainingState's checks (profile, configuration identity, inventory, every
// component's validate). Then the ranks agree again: if any rank failed,
// every rank throws, naming the failing ranks and reasons, and no rank has
// changed anything. Only then does each rank apply its state
// transactionally. A rank reads about 1/world of the bytes from the file
// system and receives the rest over the group (DistributedLoadReport's
// bytes_read and bytes_received; read_every_shard reads them all instead).
// Resuming in place (DistributedLoadOptions::memory), every rank instead
// runs the first pass of a resume in place over every shard (SHA-256 against
// the step manifest, the same checks, large records left in the files and
// tagged), the ranks agree, and each fills its live tensors from the files
// after the final agreement: its memory is the live state plus a bounded
// amount, and nothing travels over the group.
//
// World size: profile cpu-gloo-ddp-v1 requires the checkpoint's world size.
// Another world size loads only with allow_world_size_change and a live
// profile of unqualified: replicated components load as saved, new rank r
// takes the rank-local state of saved rank r mod W_saved, and the sampler
// (a DistributedSampler) is reassigned by the global-position rule of
// reassign_distributed_sampler_state. Anything else is
// distributed_world_size_changed.
//
// Failure contract: holdpoint::Error; distributed_rank_failed on ranks whose
// own part succeeded when another's failed (detail: "rank R: <code>: <reason>"
// for each failed rank); a rank that failed with a holdpoint::Error throws its
// own code with that same detail (one that failed with another exception
// throws distributed_rank_failed). A failure of the group itself (a peer
// died, a timeout) propagates as the exception the backend throws (Gloo:
// std::runtime_error "Connection closed by peer" or c10::Error); the group
// is unusable afterwards. Limits: an apply failure after the ranks agreed (out of memory)
// is rolled back on that rank only; a commit that moved LATEST but failed
// afterwards (BEST, retention) is reported as a failure on every rank,
// although the generation is committed. Shards and the commit's checks
// use the POSIX file system, whatever RunDirectoryOptions::file_system says.
//
// Thread-safety: collective calls must be made by every rank in the same
// order, from one thread per rank; latest() and run_directory() are safe to
// use only while no asynchronous save is in flight (after wait()).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/checkpoint/training_state.h"

namespace c10d {
class ProcessGroup;
}

namespace holdpoint {

struct DistributedCheckpointOptions {
  // Components every rank saves for itself; all others are replicated
  // (equal on every rank) and written once in total.
  std::vector<std::string> rank_local = {"sampler", "rng"};
  // The coordinator's run directory (retention, best metric, limits, durability).
  RunDirectoryOptions run;
  bool torch_1_13_compatible = false;
  // The group for the agreement collectives (CPU tensors); null: the
  // checkpointer's group. Must hold the same ranks.
  c10d::ProcessGroup* coordination = nullptr;
  // The group save_async's background thread uses: the same ranks, CPU
  // tensors, and used by no other thread (Gloo matches collectives by order).
  c10d::ProcessGroup* background = nullptr;
  // Test instrumentation: called on each rank at "before-shard",
  // "after-shard", "before-commit" (coordinator) and "published" (coordinator,
  // inside the commit once the step manifest is durable and before LATEST moves).
  std::function<void(std::string_view phase)> phase_hook;
};

struct DistributedSaveResult {
  GenerationInfo generation;      // the committed step manifest
  std::int64_t world_size = 1;
  std::vector<ShardRecord> shards;  // by rank
  std::uint64_t bytes_written = 0;  // this rank's shard
  std::uint64_t total_bytes = 0;    // every shard and the step manifest
};

struct DistributedLoadOptions {
  std::optional<Sha256Digest> expected_sha256;  // of the step manifest
  // The signature the step manifest must carry (load_checkpoint; resume
  // takes the run's RunDirectoryOptions::trust instead).
  std::optional<TrustPolicy> trust;
  // Allow a checkpoint of another world size (the live profile must be unqualified).
  bool allow_world_size_change = false;
  // Every rank reads every shard from the file system instead of its own
  // share (for a file system faster than the group's network).
  bool read_every_shard = false;
  // Resume in place (docs/distributed.md, "Resuming in place"): every rank
  // streams every shard twice, verifying, then straight into its live
  // tensors, instead of holding the checkpoint in memory. automatic: when
  // any rank's TrainingState::resumes_in_place says so for the shards' total
  // size; the ranks then all do.
  ResumeMemory memory = ResumeMemory::automatic;
  // Where the model's old bytes are journaled while resuming in place; empty:
  // the step manifest's folder.
  std::filesystem::path journal_directory;
};

struct DistributedLoadReport {
  LoadReport report;
  std::int64_t saved_world_size = 1;
  bool world_size_changed = false;
  std::int64_t rank_local_source = 0;  // the saved rank whose rank-local state this rank took
  std::vector<std::int64_t> shards_read;  // the saved shards this rank read from files
  std::uint64_t bytes_read = 0;      // from files: the step manifest and those shards
  std::uint64_t bytes_received = 0;  // the other shards, from the ranks that read them
};

class DistributedCheckpointer {
 public:
  // Collective. Rank 0 opens (and recovers) the run directory; every rank
  // learns whether that worked. Sets the TrainingState's environment
  // (distributed, world size, rank-local generators).
  DistributedCheckpointer(c10d::ProcessGroup& group, TrainingState& state, std::filesystem::path run_directory,
                          DistributedCheckpointOptions options = {});
  ~DistributedCheckpointer();
  DistributedCheckpointer(const DistributedCheckpointer&) = delete;
  DistributedCheckpointer& operator=(const DistributedCheckpointer&) = delete;

  std::int64_t rank() const noexcept;
  std::int64_t world_size() const noexcept;
  // The coordinator's run directory; nullptr on other ranks.
  RunDirectory* run_directory() noexcept;
  // LATEST as the coordinator saw it on open or after the last save (every rank).
  std::optional<GenerationInfo> latest() const;

  DistributedSaveResult save(const GenerationSpec& spec);
  // Collective, asynchronous: copies the state now into staging memory of
  // this checkpointer's own (reused by later saves) on the calling thread,
  // so training may continue at once, and runs the rest of save() on a
  // background thread over options.background (required: invalid_argument
  // without it). One save is in flight at a time: save_async, save, wait,
  // load_checkpoint and resume first wait for the previous one and throw its failure.
  void save_async(const GenerationSpec& spec);
  // Waits for the save in flight; returns its result (nullopt when none was
  // in flight) or throws its failure.
  std::optional<DistributedSaveResult> wait();
  // Resumes from LATEST; nullopt (on every rank) when the run has no generation yet.
  std::optional<DistributedLoadReport> resume(const DistributedLoadOptions& options = {});
  // Loads the sharded checkpoint whose step manifest is at `manifest_path`
  // (its shards beside it in step-N.shards/), on every rank.
  DistributedLoadReport load_checkpoint(const std::filesystem::path& manifest_path,
                                        const DistributedLoadOptions& options = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace holdpoint
