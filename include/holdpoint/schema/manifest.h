// The checkpoint manifest: the "holdpoint" entry of every checkpoint file, which
// says what the file is, what it may be used for, and how to check it.
//
// Layout (schema version 1; docs/resume-contract.md has the field table):
//   schema "holdpoint.checkpoint", schema_version 1, kind ("resume" | "model" |
//   "selection"), semantic_identity, profile, config {load_bearing, operational},
//   config_identity {load_bearing_sha256, operational_sha256, and
//   digest_version 2 where the key order changes the config's canonical JSON;
//   absent means 1: holdpoint/schema/config_identity.h},
//   components {name: {sha256, contract}}, versions {holdpoint, libtorch,
//   compiler}, code_identity, data_identity, last_resume_drift (None or
//   {field, from, to, at_step}).
// Sharded checkpoints (docs/distributed.md) add two kinds and one field:
//   kind "sharded"  the step manifest of a multi-rank generation. It holds no
//                   component states; "sharding" = {world_size, step,
//                   replicated: [names], rank_local: [names], shards: [{rank,
//                   size, sha256}]}. Its "components" are empty: each shard's
//                   own manifest carries the digests of what it holds.
//   kind "shard"    one rank's file; "sharding" = {world_size, step, rank}.
//   Shard files live beside the step manifest, at
//   step-<8+ digits>.shards/rank-<5 digits>.pt; names are derived, never read
//   from the file. Other kinds have no "sharding" field.
// torch.distributed.checkpoint generations (docs/dcp.md) add a third kind:
//   kind "dcp"      the step manifest of a generation whose data is a DCP
//                   folder at step-<8+ digits>.shards/; "dcp" = {world_size,
//                   step, files: [{name, size, ranges: [[offset, length,
//                   sha256], ...]}]}, the ranges of each file in order and
//                   tiling it exactly (one per DCP item; `.metadata` is one
//                   range). Its "components" are empty.
// Reading fails closed: a missing field is schema_field_missing, an unknown one
// schema_field_unknown, a wrong type or value schema_field_invalid, each naming
// the field; another schema or version is schema_version_unsupported.
//
// A component's digest is the SHA-256 of a canonical encoding of its state in
// which each tensor contributes its dtype, geometry and the digest of its
// storage record (XXH3-128, or SHA-256 in files without "storage_digest"), so
// writing a checkpoint digests each tensor byte once, while it streams, and
// the one SHA-256 pass over the bytes is the whole file's.
//
// Thread-safety: plain value types.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "holdpoint/schema/config_identity.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

inline constexpr std::int64_t kCheckpointSchemaVersion = 1;
inline constexpr std::string_view kCheckpointSchema = "holdpoint.checkpoint";
inline constexpr std::string_view kManifestKey = "holdpoint";

enum class CheckpointKind : std::uint8_t { resume, model, selection, sharded, shard, dcp };
std::string_view checkpoint_kind_name(CheckpointKind kind) noexcept;

struct ResumeDrift {
  std::string field;  // "max_epochs"
  std::int64_t from = 0;
  std::int64_t to = 0;
  std::int64_t at_step = 0;
};

// How each storage's bytes enter a component digest: the manifest field
// "storage_digest". Files written before it existed have no such field and
// used SHA-256; current writers use XXH3-128, which is about 20x faster and
// enough for identity because the whole-file SHA-256 authenticates the bytes
// (docs/format.md, "What each digest proves").
enum class StorageDigestKind : std::uint8_t { sha256, xxh3_128 };

std::string_view storage_digest_name(StorageDigestKind kind) noexcept;

struct ComponentRecord {
  std::string name;
  Sha256Digest sha256;
  Value contract;
};

struct ShardRecord {
  std::int64_t rank = 0;
  std::uint64_t size = 0;
  Sha256Digest sha256;
};

// What a step manifest or a shard says about the generation's sharding.
struct Sharding {
  std::int64_t world_size = 1;
  std::int64_t step = 0;
  std::int64_t rank = 0;                   // kind shard only
  std::vector<std::string> replicated;     // kind sharded only: partitioned across the shards
  std::vector<std::string> rank_local;     // kind sharded only: one state per shard
  std::vector<ShardRecord> shards;         // kind sharded only: one per rank, by rank
};

// One item's bytes in a DCP generation's file, and their SHA-256.
struct DcpRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  Sha256Digest sha256;
};

struct DcpFile {
  std::string name;  // inside the generation's folder: ".metadata" or a data file
  std::uint64_t size = 0;
  std::vector<DcpRange> ranges;  // by offset, tiling [0, size)
};

// What the step manifest of a DCP generation lists.
struct DcpLayout {
  std::int64_t world_size = 1;
  std::int64_t step = 0;
  std::vector<DcpFile> files;  // by name; ".metadata" among them

  const DcpFile* file(std::string_view name) const;
};

// True for a name a DCP generation's folder may hold: ".metadata" or a
// plain file name of letters, digits, '_', '-' and '.' that does not start
// with '.' (no path, no hidden or staging name), at most 255 bytes.
bool is_dcp_file_name(std::string_view name) noexcept;

struct Manifest {
  CheckpointKind kind = CheckpointKind::resume;
  std::string semantic_identity;
  std::string profile = "unqualified";
  TrainingConfig config;
  std::vector<ComponentRecord> components;
  std::string holdpoint_version;
  std::string libtorch_version;
  std::string compiler;
  std::string code_identity;
  std::string data_identity;
  std::optional<ResumeDrift> last_resume_drift;
  std::optional<Sharding> sharding;  // exactly for kinds sharded and shard
  std::optional<DcpLayout> dcp;      // exactly for kind dcp
  // Written as "storage_digest" unless sha256 (the files that predate it).
  StorageDigestKind storage_digest = StorageDigestKind::xxh3_128;

  const ComponentRecord* component(const std::string& name) const;

  Value to_value() const;
  static Manifest from_value(const Value& value);
  // Reads the "holdpoint" entry of a checkpoint's root; schema_field_missing
  // when the root is not a dict that has one.
  static Manifest of_root(const Value& root);
};

// The "holdpoint" entry of a checkpoint's root, unread; nullptr when the root
// is not a dict that has one. For callers that must tell a file without a
// manifest from one with a bad manifest; the others use Manifest::of_root.
const Value* find_manifest_entry(const Value& root);

// One storage's digest: 32 bytes of SHA-256 or 16 of XXH3-128.
struct StorageDigest {
  std::array<std::uint8_t, 32> bytes{};
  std::uint8_t size = 0;
};

// Digests of storages, by Storage::identity(), computed once and reused.
class StorageDigests {
 public:
  explicit StorageDigests(StorageDigestKind kind = StorageDigestKind::xxh3_128) : kind_(kind) {}
  StorageDigestKind kind() const noexcept { return kind_; }
  void set(const void* identity, const StorageDigest& digest) { known_[identity] = digest; }
  const StorageDigest& of(const Storage& storage);

 private:
  StorageDigestKind kind_;
  std::unordered_map<const void*, StorageDigest> known_;
};

// A component digest for the manifest's storage digest kind.
Sha256Digest component_digest(const Value& state, StorageDigests& storages);

// The structure of a state Value, which a manifest records as a component's
// contract: dict keys and value kinds, tensor dtypes and shapes, list lengths;
// no tensor data and no scalar values.
Value contract_of(const Value& state);

}  // namespace holdpoint
