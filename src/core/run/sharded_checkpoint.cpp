#include "format/signed_digest.h"
#include "holdpoint/run/sharded_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "base/fail.h"
#include "holdpoint/base/file_system.h"
#include "run/run_names.h"
#include "run/step_manifest.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

// ---- names -------------------------------------------------------------------------------

std::string shard_directory_name(std::int64_t step) { return run::step_name(step, run::kShardDirectorySuffix); }

std::optional<std::int64_t> parse_shard_directory_name(std::string_view name) noexcept {
  return run::parse_step_name(name, run::kShardDirectorySuffix);
}

std::string shard_file_name(std::int64_t rank) {
  if (rank < 0) fail(ErrorCode::invalid_argument, "a rank must not be negative (got ", rank, ")");
  std::string digits = std::to_string(rank);
  if (digits.size() < 5) digits.insert(0, 5 - digits.size(), '0');
  return concat("rank-", digits, ".pt");
}

// ---- partition -----------------------------------------------------------------------------

namespace {

// Storages of the replicated states in first-appearance order.
struct StorageTable {
  std::map<const void*, std::size_t> index;
  std::vector<std::uint64_t> nbytes;

  void collect(const Value& value) {
    switch (value.kind()) {
      case ValueKind::tensor: {
        const Storage& storage = *value.as_tensor().storage;
        if (index.emplace(storage.identity(), nbytes.size()).second) nbytes.push_back(storage.nbytes());
        return;
      }
      case ValueKind::list:
      case ValueKind::tuple:
        for (const Value& item : value.as_list()) collect(item);
        return;
      case ValueKind::dict:
      case ValueKind::ordered_dict:
        for (const auto& [key, item] : value.as_dict()) collect(item);
        return;
      default: return;
    }
  }
};

void fingerprint_value(Sha256& hasher, const Value& value, const StorageTable& table,
                       const std::vector<std::int64_t>& owner) {
  const auto u64 = [&](std::uint64_t v) { hasher.update(&v, sizeof v); };
  const auto text = [&](std::string_view s) {
    u64(s.size());
    hasher.update(s.data(), s.size());
  };
  u64(static_cast<std::uint64_t>(value.kind()));
  switch (value.kind()) {
    case ValueKind::tensor: {
      const TensorData& t = value.as_tensor();
      text(dtype_name(t.dtype));
      u64(t.sizes.size());
      for (auto size : t.sizes) u64(static_cast<std::uint64_t>(size));
      const std::size_t i = table.index.at(t.storage->identity());
      u64(i);
      u64(table.nbytes[i]);
      u64(static_cast<std::uint64_t>(owner[i]));
      return;
    }
    case ValueKind::list:
    case ValueKind::tuple:
      u64(value.as_list().size());
      for (const Value& item : value.as_list()) fingerprint_value(hasher, item, table, owner);
      return;
    case ValueKind::dict:
    case ValueKind::ordered_dict:
      u64(value.as_dict().size());
      for (const auto& [key, item] : value.as_dict()) {
        text(key.to_string());
        fingerprint_value(hasher, item, table, owner);
      }
      return;
    // Scalars are written by every rank and must agree when merged.
    case ValueKind::boolean: u64(value.as_bool() ? 1 : 0); return;
    case ValueKind::integer: u64(static_cast<std::uint64_t>(value.as_int())); return;
    case ValueKind::floating: {
      const double d = value.as_double();
      std::uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      u64(bits);
      return;
    }
    case ValueKind::string: text(value.as_string()); return;
    case ValueKind::bytes: text(value.as_bytes()); return;
    case ValueKind::big_integer: text(value.as_big_integer()); return;
    case ValueKind::bytearray: text(value.as_bytes()); return;
    case ValueKind::complex_number:
    case ValueKind::device:
    case ValueKind::dtype:
    case ValueKind::layout:
    case ValueKind::meta_tensor: text(typed_scalar_text(value)); return;
    // Not partitioned: every rank writes a sparse tensor whole, as it writes a scalar.
    case ValueKind::sparse_tensor: text(typed_scalar_text(value)); return;
    case ValueKind::set:
    case ValueKind::size:
      u64(value.as_list().size());
      for (const Value& item : value.as_list()) fingerprint_value(hasher, item, table, owner);
      return;
    default: return;
  }
}

// The piece of `value` rank `rank` writes: tensors of storages it does not own become None.
Value piece_of(const Value& value, const StorageTable& table, const std::vector<std::int64_t>& owner,
               std::int64_t rank) {
  switch (value.kind()) {
    case ValueKind::tensor:
      return owner[table.index.at(value.as_tensor().storage->identity())] == rank ? value : Value::none();
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : value.as_list()) items.push_back(piece_of(item, table, owner, rank));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, piece_of(item, table, owner, rank));
      if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default: return value;
  }
}

}  // namespace

ReplicatedPartition partition_replicated(const std::vector<std::pair<std::string, Value>>& states,
                                         std::int64_t world_size) {
  if (world_size < 1) fail(ErrorCode::invalid_argument, "world size must be at least 1 (got ", world_size, ")");
  StorageTable table;
  for (const auto& [name, state] : states) table.collect(state);
  // Largest storage first, each to the least loaded rank (lowest rank on ties):
  // deterministic, and within the largest storage of an even split.
  std::vector<std::size_t> order(table.nbytes.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return table.nbytes[a] > table.nbytes[b]; });
  ReplicatedPartition partition;
  partition.bytes.assign(static_cast<std::size_t>(world_size), 0);
  std::vector<std::int64_t> owner(table.nbytes.size(), 0);
  for (const std::size_t storage : order) {
    const auto least = std::min_element(partition.bytes.begin(), partition.bytes.end()) - partition.bytes.begin();
    owner[storage] = least;
    partition.bytes[static_cast<std::size_t>(least)] += table.nbytes[storage];
  }
  Sha256 hasher;
  const std::uint64_t world = static_cast<std::uint64_t>(world_size);
  hasher.update(&world, sizeof world);
  for (const auto& [name, state] : states) {
    const std::uint64_t length = name.size();
    hasher.update(&length, sizeof length);
    hasher.update(name.data(), name.size());
    fingerprint_value(hasher, state, table, owner);
  }
  partition.fingerprint = hasher.finish();
  partition.pieces.resize(static_cast<std::size_t>(world_size));
  for (std::int64_t rank = 0; rank < world_size; ++rank) {
    for (const auto& [name, state] : states) {
      partition.pieces[static_cast<std::size_t>(rank)].emplace_back(name, piece_of(state, table, owner, rank));
    }
  }
  return partition;
}

// ---- merge ---------------------------------------------------------------------------------

namespace {

[[noreturn]] void conflict(const std::string& component, const std::string& path, const std::string& why) {
  fail(ErrorCode::shard_piece_conflict, "replicated component '", component, "' at ", path.empty() ? "its root" : path,
       ": ", why);
}

Value merge_at(const std::string& component, const std::string& path, std::span<const Value* const> pieces) {
  std::vector<std::size_t> tensors;
  std::size_t nones = 0;
  for (std::size_t r = 0; r < pieces.size(); ++r) {
    if (pieces[r]->is_tensor()) tensors.push_back(r);
    if (pieces[r]->is_none()) ++nones;
  }
  if (tensors.size() > 1) {
    conflict(component, path, concat("shards ", tensors[0], " and ", tensors[1], " both hold a tensor"));
  }
  if (tensors.size() == 1) {
    if (nones + 1 != pieces.size()) conflict(component, path, "one shard holds a tensor, another a non-tensor value");
    return *pieces[tensors[0]];
  }
  const Value& first = *pieces[0];
  for (std::size_t r = 1; r < pieces.size(); ++r) {
    if (pieces[r]->kind() != first.kind()) {
      conflict(component, path, concat("shard 0 holds a ", value_kind_name(first.kind()), ", shard ", r, " a ",
                                       value_kind_name(pieces[r]->kind())));
    }
  }
  switch (first.kind()) {
    case ValueKind::list:
    case ValueKind::tuple: {
      const std::size_t n = first.as_list().size();
      for (std::size_t r = 1; r < pieces.size(); ++r) {
        if (pieces[r]->as_list().size() != n) conflict(component, path, "the shards' lists differ in length");
      }
      Value::List items;
      std::vector<const Value*> column(pieces.size());
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t r = 0; r < pieces.size(); ++r) column[r] = &pieces[r]->as_list()[i];
        items.push_back(merge_at(component, concat(path, "[", i, "]"), column));
      }
      return first.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      const Dict& keys = first.as_dict();
      for (std::size_t r = 1; r < pieces.size(); ++r) {
        const Dict& other = pieces[r]->as_dict();
        bool same = other.size() == keys.size();
        auto a = keys.begin();
        auto b = other.begin();
        for (; same && a != keys.end(); ++a, ++b) same = a->first.to_string() == b->first.to_string();
        if (!same) conflict(component, path, concat("shards 0 and ", r, " have different keys"));
      }
      Dict entries;
      std::vector<const Value*> column(pieces.size());
      std::size_t i = 0;
      for (const auto& [key, item] : keys) {
        for (std::size_t r = 0; r < pieces.size(); ++r) column[r] = &pieces[r]->as_dict().at_index(i).second;
        entries.insert(key, merge_at(component, concat(path, "[", key.to_string(), "]"), column));
        ++i;
      }
      if (keys.metadata()) entries.set_metadata(*keys.metadata());
      return first.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default:
      for (std::size_t r = 1; r < pieces.size(); ++r) {
        if (!equal_content(first, *pieces[r])) conflict(component, path, concat("shards 0 and ", r, " hold different values"));
      }
      return first;
  }
}

}  // namespace

Value merge_replicated_pieces(const std::string& component, std::span<const Value* const> pieces) {
  if (pieces.empty()) fail(ErrorCode::invalid_argument, "merging '", component, "' needs at least one piece");
  return merge_at(component, "", pieces);
}

// ---- reading -------------------------------------------------------------------------------

namespace {

const Manifest& manifest_checked(const Manifest& manifest, const std::string& label) {
  if (manifest.kind != CheckpointKind::sharded || !manifest.sharding) {
    fail(ErrorCode::checkpoint_kind_mismatch, label, " is a checkpoint of kind '", checkpoint_kind_name(manifest.kind),
         "', not a sharded step manifest");
  }
  return manifest;
}

LoadedMapping read_shard_unlabelled(io::Directory& shards, const Manifest& step_manifest, std::int64_t rank,
                                    const Limits& limits, bool check_component_digests,
                                    std::shared_ptr<io::Buffer>* bytes_out);
LoadedMapping check_shard_bytes(std::shared_ptr<io::Buffer> bytes, const Manifest& step_manifest, std::int64_t rank,
                                const Limits& limits, bool check_component_digests);
void check_shard_tree_unlabelled(const Value& root, const Manifest& step_manifest, std::int64_t rank,
                                 bool check_component_digests, const KnownStorageDigests& known);

// Reads and checks shard `rank` of `step_manifest` from the open shard
// directory; errors name the shard's file.
// Where `bytes_out` is given, it receives the shard's verified file bytes.
LoadedMapping read_shard(io::Directory& shards, const Manifest& step_manifest, std::int64_t rank,
                         const Limits& limits, bool check_component_digests,
                         std::shared_ptr<io::Buffer>* bytes_out = nullptr) {
  try {
    return read_shard_unlabelled(shards, step_manifest, rank, limits, check_component_digests, bytes_out);
  } catch (const Error& error) {
    if (!error.path().empty()) throw;
    throw error.with_path((shards.path() / shard_file_name(rank)).string());
  }
}

LoadedMapping read_shard_unlabelled(io::Directory& shards, const Manifest& step_manifest, std::int64_t rank,
                                    const Limits& limits, bool check_component_digests,
                                    std::shared_ptr<io::Buffer>* bytes_out) {
  const Sharding& sharding = *step_manifest.sharding;
  const ShardRecord& record = sharding.shards.at(static_cast<std::size_t>(rank));
  const std::string name = shard_file_name(rank);
  const std::string label = concat(shard_directory_name(sharding.step), "/", name);
  const auto info = shards.stat(name);
  if (!info) fail(ErrorCode::run_shards_invalid, label, " is missing (rank ", rank, "'s shard)");
  if (info->type != io::FileInfo::Type::regular) {
    fail(ErrorCode::run_shards_invalid, label, " is not a regular file (never followed)");
  }
  if (info->size != record.size) {
    fail(ErrorCode::shard_size_mismatch, label, " holds ", info->size, " bytes; the step manifest records ",
         record.size);
  }
  io::Snapshot snapshot;
  try {
    snapshot = shards.read(name, limits.max_file_bytes, record.sha256);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::sha256_mismatch) throw;
    throw Error(ErrorCode::shard_digest_mismatch,
                concat("rank ", rank, "'s shard differs from the digest its step manifest records: ", error.detail()))
        .with_path(error.path());
  }
  if (bytes_out) *bytes_out = snapshot.buffer;
  LoadedMapping mapping = check_shard_bytes(std::move(snapshot.buffer), step_manifest, rank, limits,
                                            check_component_digests);
  mapping.sha256 = snapshot.sha256;
  return mapping;
}

LoadedMapping check_shard_bytes(std::shared_ptr<io::Buffer> bytes, const Manifest& step_manifest, std::int64_t rank,
                                const Limits& limits, bool check_component_digests) {
  const std::span<std::byte> span = bytes->bytes();
  LoadedMapping mapping = parse_checkpoint_bytes(span, std::move(bytes), limits);
  check_shard_tree_unlabelled(mapping.root, step_manifest, rank, check_component_digests, {});
  return mapping;
}

void check_shard_tree_unlabelled(const Value& root, const Manifest& step_manifest, std::int64_t rank,
                                 bool check_component_digests, const KnownStorageDigests& known) {
  const Sharding& sharding = *step_manifest.sharding;
  const std::string label = concat(shard_directory_name(sharding.step), "/", shard_file_name(rank));
  const Manifest own = Manifest::of_root(root);
  if (own.kind != CheckpointKind::shard) {
    fail(ErrorCode::shard_identity_mismatch, label, " is of kind '", checkpoint_kind_name(own.kind), "', not shard");
  }
  const Sharding& mine = *own.sharding;
  if (mine.rank != rank || mine.world_size != sharding.world_size || mine.step != sharding.step) {
    fail(ErrorCode::shard_identity_mismatch, label, " says rank ", mine.rank, " of ", mine.world_size, " at step ",
         mine.step, "; the step manifest expects rank ", rank, " of ", sharding.world_size, " at step ", sharding.step);
  }
  if (own.config.load_bearing_digest() != step_manifest.config.load_bearing_digest() ||
      own.profile != step_manifest.profile || own.semantic_identity != step_manifest.semantic_identity) {
    fail(ErrorCode::shard_identity_mismatch, label,
         " records another configuration, profile or semantic identity than its step manifest");
  }
  std::vector<std::string> expected = sharding.replicated;
  expected.insert(expected.end(), sharding.rank_local.begin(), sharding.rank_local.end());
  for (const auto& name_ : expected) {
    if (!root.as_dict().find(name_) || !own.component(name_)) {
      fail(ErrorCode::component_missing, label, " lacks component '", name_, "'");
    }
  }
  for (const auto& [key, value] : root.as_dict()) {
    const std::string k = key.is_string() ? key.as_string() : key.to_string();
    if (k != kManifestKey && std::find(expected.begin(), expected.end(), k) == expected.end()) {
      fail(ErrorCode::component_unknown, label, " holds component '", k, "', which its step manifest does not list");
    }
  }
  if (own.components.size() != expected.size()) {
    fail(ErrorCode::component_unknown, label, "'s manifest lists components its step manifest does not");
  }
  if (check_component_digests) {
    StorageDigests digests = known ? known(own.storage_digest) : StorageDigests(own.storage_digest);
    for (const auto& name_ : expected) {
      if (component_digest(root.as_dict().at(name_), digests) != own.component(name_)->sha256) {
        fail(ErrorCode::component_digest_mismatch, label, ": component '", name_,
             "' does not match the digest its manifest records");
      }
    }
  }
}

std::vector<std::int64_t> ranks_to_read(const ShardedReadOptions& options, const Sharding& sharding) {
  std::vector<std::int64_t> ranks;
  if (options.ranks) {
    ranks = *options.ranks;
  } else {
    for (std::int64_t r = 0; r < sharding.world_size; ++r) ranks.push_back(r);
  }
  for (const auto r : ranks) {
    if (r < 0 || r >= sharding.world_size) {
      fail(ErrorCode::invalid_argument, "rank ", r, " is outside the checkpoint's world of ", sharding.world_size);
    }
  }
  return ranks;
}

std::unique_ptr<io::Directory> open_shards(io::Directory& directory, const Sharding& sharding) {
  const std::string name = shard_directory_name(sharding.step);
  const auto info = directory.stat(name);
  if (!info) fail(ErrorCode::run_shards_invalid, name, "/ is missing; the step manifest names its ", sharding.world_size, " shards");
  if (info->type != io::FileInfo::Type::directory) {
    fail(ErrorCode::run_shards_invalid, name, " is not a directory (a symlink or a file; never followed)");
  }
  return directory.open_subdirectory(name, false);
}

}  // namespace

void read_shards(ShardedCheckpoint& checkpoint, std::span<const std::int64_t> ranks, const Limits& limits,
                 bool check_component_digests) {
  const Sharding& sharding = checkpoint.sharding();
  ShardedReadOptions bounds;
  bounds.ranks = std::vector<std::int64_t>(ranks.begin(), ranks.end());
  const auto chosen = ranks_to_read(bounds, sharding);
  if (chosen.empty()) return;
  const std::filesystem::path parent = checkpoint.path.has_parent_path() ? checkpoint.path.parent_path() : ".";
  try {
    auto directory = io::posix_file_system().open_directory(parent, false);
    const auto shards = open_shards(*directory, sharding);
    checkpoint.shards.resize(static_cast<std::size_t>(sharding.world_size));
    checkpoint.shard_bytes.resize(static_cast<std::size_t>(sharding.world_size));
    for (const auto r : chosen) {
      const auto slot = static_cast<std::size_t>(r);
      checkpoint.shards[slot] =
          read_shard(*shards, checkpoint.manifest, r, limits, check_component_digests, &checkpoint.shard_bytes[slot]);
    }
  } catch (const Error& error) {
    if (!error.path().empty()) throw;
    throw error.with_path(checkpoint.path.string());
  }
}

void check_shard_tree(const Value& root, const Manifest& step_manifest, std::int64_t rank,
                      const KnownStorageDigests& known) {
  manifest_checked(step_manifest, "the generation");
  if (rank < 0 || rank >= step_manifest.sharding->world_size) {
    fail(ErrorCode::invalid_argument, "rank ", rank, " is outside the checkpoint's world of ",
         step_manifest.sharding->world_size);
  }
  check_shard_tree_unlabelled(root, step_manifest, rank, true, known);
}

LoadedMapping parse_shard(std::shared_ptr<io::Buffer> bytes, const Manifest& step_manifest, std::int64_t rank,
                          const Limits& limits, bool check_component_digests) {
  manifest_checked(step_manifest, "the generation");
  const Sharding& sharding = *step_manifest.sharding;
  if (rank < 0 || rank >= sharding.world_size) {
    fail(ErrorCode::invalid_argument, "rank ", rank, " is outside the checkpoint's world of ", sharding.world_size);
  }
  const std::string label = concat(shard_directory_name(sharding.step), "/", shard_file_name(rank));
  const ShardRecord& record = sharding.shards.at(static_cast<std::size_t>(rank));
  if (bytes->size() != record.size) {
    fail(ErrorCode::shard_size_mismatch, label, ": ", bytes->size(), " bytes received; the step manifest records ",
         record.size);
  }
  LoadedMapping mapping = check_shard_bytes(std::move(bytes), step_manifest, rank, limits, check_component_digests);
  mapping.sha256 = record.sha256;
  return mapping;
}

void require_manifest_only(const Value& root, const std::string& label) {
  if (root.is_dict() && root.as_dict().size() != 1) {
    fail(ErrorCode::component_unknown, label, " is a step manifest holding ", root.as_dict().size() - 1,
         " component states; a step manifest holds only its manifest");
  }
}

bool is_sharded_manifest(const LoadedMapping& mapping) {
  const Value* manifest = find_manifest_entry(mapping.root);
  if (!manifest || !manifest->is_dict()) return false;
  const Value* kind = manifest->as_dict().find(std::string_view("kind"));
  return kind && kind->is_string() && kind->as_string() == "sharded";
}

void verify_shards(io::Directory& directory, const Manifest& step_manifest, const Limits& limits,
                   bool check_component_digests) {
  manifest_checked(step_manifest, "the generation");
  const auto shards = open_shards(directory, *step_manifest.sharding);
  for (std::int64_t r = 0; r < step_manifest.sharding->world_size; ++r) {
    read_shard(*shards, step_manifest, r, limits, check_component_digests);
  }
}

ShardedCheckpoint read_sharded_checkpoint(io::Directory& directory, const std::string& manifest_name,
                                          const ShardedReadOptions& options) {
  try {
    ShardedCheckpoint out;
    out.path = directory.path() / manifest_name;
    // A signed step manifest authenticates the shard digests it lists.
    const std::optional<Sha256Digest> expected =
        options.trust ? format::expected_digest(directory, manifest_name, *options.trust, options.expected_sha256)
                      : options.expected_sha256;
    io::Snapshot snapshot = directory.read(manifest_name, options.limits.max_file_bytes, expected);
    out.sha256 = snapshot.sha256;
    out.manifest_bytes = snapshot.buffer->size();
    const LoadedMapping mapping = parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, options.limits);
    out.manifest = Manifest::of_root(mapping.root);
    manifest_checked(out.manifest, manifest_name);
    require_manifest_only(mapping.root, manifest_name);
    const Sharding& sharding = out.sharding();
    const auto shards = open_shards(directory, sharding);
    out.shards.resize(static_cast<std::size_t>(sharding.world_size));
    out.shard_bytes.resize(static_cast<std::size_t>(sharding.world_size));
    for (const auto r : ranks_to_read(options, sharding)) {
      auto& slot = out.shards[static_cast<std::size_t>(r)];
      slot = read_shard(*shards, out.manifest, r, options.limits, options.check_component_digests,
                        &out.shard_bytes[static_cast<std::size_t>(r)]);
    }
    return out;
  } catch (const Error& error) {
    if (!error.path().empty()) throw;
    throw error.with_path((directory.path() / manifest_name).string());
  }
}

ShardedCheckpoint read_sharded_checkpoint(const std::filesystem::path& manifest_path,
                                          const ShardedReadOptions& options) {
  const std::filesystem::path parent = manifest_path.has_parent_path() ? manifest_path.parent_path() : ".";
  auto directory = io::posix_file_system().open_directory(parent, false);
  ShardedCheckpoint out = read_sharded_checkpoint(*directory, manifest_path.filename().string(), options);
  out.path = manifest_path;
  return out;
}

Value ShardedCheckpoint::replicated(const std::string& name) const {
  std::vector<const Value*> pieces;
  for (std::size_t r = 0; r < shards.size(); ++r) {
    if (!shards[r]) fail(ErrorCode::invalid_argument, "merging '", name, "' needs every shard; rank ", r, "'s was not read");
    pieces.push_back(&shards[r]->root.as_dict().at(name));
  }
  return merge_replicated_pieces(name, pieces);
}

const Value& ShardedCheckpoint::rank_local(const std::string& name, std::int64_t rank) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= shards.size() || !shards[static_cast<std::size_t>(rank)]) {
    fail(ErrorCode::invalid_argument, "shard ", rank, " was not read");
  }
  return shards[static_cast<std::size_t>(rank)]->root.as_dict().at(name);
}

Value ShardedCheckpoint::combined_view() const {
  Dict view;
  for (const auto& name : sharding().replicated) view.insert(name, replicated(name));
  for (std::int64_t r = 0; r < sharding().world_size; ++r) {
    for (const auto& name : sharding().rank_local) {
      if (!view.insert(concat(name, "@rank", r), rank_local(name, r))) {
        fail(ErrorCode::schema_field_invalid, "component name ", name, "@rank", r, " appears twice");
      }
    }
  }
  return Value::dict(std::move(view));
}

std::uint64_t ShardedCheckpoint::total_bytes() const {
  std::uint64_t total = manifest_bytes;
  for (const auto& shard : sharding().shards) total += shard.size;
  return total;
}

}  // namespace holdpoint
