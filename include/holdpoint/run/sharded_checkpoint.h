// Sharded checkpoints: one generation written by several ranks
// (docs/distributed.md).
//
//   step-00000005.pt                  the step manifest: a holdpoint .pt of kind
//                                     "sharded" listing world size, the replicated
//                                     and rank-local component names, and each
//                                     shard's size and SHA-256
//   step-00000005.shards/rank-00000.pt one file per rank, kind "shard": the
//   step-00000005.shards/rank-00001.pt rank's rank-local components whole, and
//                                     its piece of every replicated component
//
// A replicated component (the model, the optimizer: equal on every rank) is
// written once in total: its storages are assigned to ranks (largest first,
// to the least loaded rank), and each rank's piece is the component's state
// with the tensors of storages it does not own replaced by None. Merging the
// pieces takes, at every position, the one tensor some piece holds; every
// other value must be equal in all pieces.
//
// Reading (read_sharded_checkpoint) checks the step manifest against an
// expected digest, then each shard it is asked for: a regular file of the
// recorded size (shard_size_mismatch) and SHA-256 (shard_digest_mismatch),
// parsed by the restricted reader, whose own manifest names this rank, world
// size and step and the step manifest's configuration
// (shard_identity_mismatch), holding exactly the listed components, each
// matching its recorded digest. A shard directory or shard file that is
// missing or not what it should be is run_shards_invalid. Nothing here runs
// LibTorch; the torch side (holdpoint/dist/distributed.h) applies the result.
//
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "holdpoint/base/file_system.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

// "step-00000005.shards" and its inverse; "rank-00003.pt".
std::string shard_directory_name(std::int64_t step);
std::optional<std::int64_t> parse_shard_directory_name(std::string_view name) noexcept;
std::string shard_file_name(std::int64_t rank);

// ---- save side -------------------------------------------------------------------------

struct ReplicatedPartition {
  // pieces[rank]: (component name, piece) for every replicated component.
  std::vector<std::vector<std::pair<std::string, Value>>> pieces;
  std::vector<std::uint64_t> bytes;  // storage bytes each rank writes
  // Over the components' structure, storage sizes, scalar values and the
  // placement: equal on two ranks exactly when they partition the same way
  // and their pieces will merge (tensor contents are not compared).
  Sha256Digest fingerprint;
};

// Partitions replicated component states across `world_size` ranks; every
// rank computes the same partition from its own (equal) copy.
ReplicatedPartition partition_replicated(const std::vector<std::pair<std::string, Value>>& states,
                                         std::int64_t world_size);

// Merges one replicated component's pieces (one per rank) back into its
// state. Throws Error(shard_piece_conflict) naming the component and path.
Value merge_replicated_pieces(const std::string& component, std::span<const Value* const> pieces);

// ---- load side -------------------------------------------------------------------------

struct ShardedReadOptions {
  Limits limits;
  std::optional<Sha256Digest> expected_sha256;  // of the step manifest
  // The signature the step manifest must carry, checked before it is read;
  // the shard digests it lists are then authenticated by it.
  std::optional<TrustPolicy> trust;
  // Ranks whose shards to read; unset reads every shard, an empty list
  // none (the step manifest only).
  std::optional<std::vector<std::int64_t>> ranks;
  // Recompute each shard's component digests (a second pass over the bytes;
  // the file digests already chain every shard to the step manifest).
  bool check_component_digests = true;
};

struct ShardedCheckpoint {
  std::filesystem::path path;  // of the step manifest
  Sha256Digest sha256;         // of the step manifest
  std::uint64_t manifest_bytes = 0;
  Manifest manifest;           // kind sharded; manifest.sharding is set
  std::vector<std::optional<LoadedMapping>> shards;  // by rank; set for the ranks read
  // The file bytes of each shard read, checked against the step manifest's
  // SHA-256 (by rank; set for the ranks read): what a distributed load sends
  // to the ranks that did not read them.
  std::vector<std::shared_ptr<io::Buffer>> shard_bytes;

  const Sharding& sharding() const { return *manifest.sharding; }
  // A replicated component, merged from every shard (all must have been read).
  Value replicated(const std::string& name) const;
  // A rank-local component as shard `rank` holds it.
  const Value& rank_local(const std::string& name, std::int64_t rank) const;
  // Every component for inspection and comparison: replicated ones by name,
  // rank-local ones as "<name>@rank<r>" (needs every shard).
  Value combined_view() const;
  std::uint64_t total_bytes() const;  // step manifest and every shard
};

// True when a parsed file is a step manifest (root {"holdpoint": kind sharded}).
bool is_sharded_manifest(const LoadedMapping& mapping);

ShardedCheckpoint read_sharded_checkpoint(const std::filesystem::path& manifest_path,
                                          const ShardedReadOptions& options = {});
// The same on an open directory (the run directory's file system).
ShardedCheckpoint read_sharded_checkpoint(io::Directory& directory, const std::string& manifest_name,
                                          const ShardedReadOptions& options = {});
// Reads and checks shards `ranks` of an already-read step manifest into
// `checkpoint` (from the step manifest's directory), as
// read_sharded_checkpoint would have.
void read_shards(ShardedCheckpoint& checkpoint, std::span<const std::int64_t> ranks, const Limits& limits,
                 bool check_component_digests = true);

// Parses and checks shard `rank` of `step_manifest` from bytes in memory: a
// shard another rank read and checked against the step manifest's size and
// SHA-256 (a distributed load, where each rank reads its own share). Runs the
// checks a read runs after the digest: shard_size_mismatch,
// shard_identity_mismatch, component_missing / component_unknown and, with
// `check_component_digests`, component_digest_mismatch. The result's tensors
// hold `bytes`.
LoadedMapping parse_shard(std::shared_ptr<io::Buffer> bytes, const Manifest& step_manifest, std::int64_t rank,
                          const Limits& limits, bool check_component_digests = true);

// The storage digests of storages a tree holds no bytes of (a resume in
// place's first pass records them), in the manifest's kind.
using KnownStorageDigests = std::function<StorageDigests(StorageDigestKind kind)>;

// The checks parse_shard runs after parsing, on a shard's tree parsed some
// other way (a resume in place's first pass, whose large storages are
// absent): shard_identity_mismatch, component_missing, component_unknown,
// component_digest_mismatch (`known` gives the absent storages' digests).
void check_shard_tree(const Value& root, const Manifest& step_manifest, std::int64_t rank,
                      const KnownStorageDigests& known);

// Checks the shards of an already-read step manifest (every one).
void verify_shards(io::Directory& directory, const Manifest& step_manifest, const Limits& limits,
                   bool check_component_digests = true);

}  // namespace holdpoint
