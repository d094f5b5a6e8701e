#include "holdpoint/schema/manifest.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <initializer_list>

#include "base/fail.h"
#include "base/xxh3.h"

namespace holdpoint {

using detail::fail;

std::string_view checkpoint_kind_name(CheckpointKind kind) noexcept {
  switch (kind) {
    case CheckpointKind::resume: return "resume";
    case CheckpointKind::model: return "model";
    case CheckpointKind::selection: return "selection";
    case CheckpointKind::sharded: return "sharded";
    case CheckpointKind::shard: return "shard";
    case CheckpointKind::dcp: return "dcp";
  }
  return "unknown";
}

const ComponentRecord* Manifest::component(const std::string& name) const {
  for (const auto& record : components) {
    if (record.name == name) return &record;
  }
  return nullptr;
}

namespace {

// Field access on manifest dicts: every failure names the field's path.
class ManifestFields {
 public:
  ManifestFields(const Value& value, std::string path) : path_(std::move(path)) {
    if (!value.is_dict()) {
      fail(ErrorCode::schema_field_invalid, path_, " is a ", value_kind_name(value.kind()), ", not a dict");
    }
    dict_ = &value.as_dict();
  }

  // Every key must be one of `known` (schema_field_unknown) and every key of
  // `required` present (schema_field_missing).
  // `optional` keys may be present too.
  void check_keys(std::initializer_list<std::string_view> known,
                  std::initializer_list<std::string_view> optional = {}) const {
    for (const auto& [key, value] : *dict_) {
      bool found = false;
      for (auto name : known) found = found || (key.is_string() && key.as_string() == name);
      for (auto name : optional) found = found || (key.is_string() && key.as_string() == name);
      if (!found) fail(ErrorCode::schema_field_unknown, path_, " has an unknown field ", key.to_string());
    }
    for (auto name : known) {
      if (!dict_->find(name)) fail(ErrorCode::schema_field_missing, path_, ".", name, " is missing");
    }
  }

  const Value& get(std::string_view key) const { return *dict_->find(key); }

  std::string string(std::string_view key) const {
    const Value& value = get(key);
    if (!value.is_string()) invalid(key, "a str", value);
    return value.as_string();
  }

  std::int64_t integer(std::string_view key) const {
    const Value& value = get(key);
    if (!value.is_int()) invalid(key, "an int", value);
    return value.as_int();
  }

  Sha256Digest digest(std::string_view key) const {
    const auto digest = Sha256Digest::from_hex(string(key));
    if (!digest) fail(ErrorCode::schema_field_invalid, path_, ".", key, " is not 64 hexadecimal digits");
    return *digest;
  }

  std::string path_of(std::string_view key) const { return path_ + "." + std::string(key); }

  [[noreturn]] void invalid(std::string_view key, const char* wanted, const Value& found) const {
    fail(ErrorCode::schema_field_invalid, path_, ".", key, " is a ", value_kind_name(found.kind()), ", not ", wanted);
  }

 private:
  const Dict* dict_;
  std::string path_;
};

const std::initializer_list<std::string_view> kTopFields = {
    "schema",     "schema_version", "kind",       "semantic_identity", "profile",         "config", "config_identity",
    "components", "versions",       "code_identity", "data_identity", "last_resume_drift"};
constexpr std::string_view kStorageDigestField = "storage_digest";
constexpr std::string_view kConfigDigestVersionField = "digest_version";

// Bounds that keep a hostile manifest from asking for absurd work.
constexpr std::int64_t kMaxWorldSize = 1 << 16;

std::vector<std::string> read_names(const ManifestFields& fields, std::string_view key) {
  const Value& value = fields.get(key);
  if (!value.is_list()) fields.invalid(key, "a list", value);
  std::vector<std::string> names;
  for (const Value& item : value.as_list()) {
    if (!item.is_string()) fields.invalid(key, "a list of str", item);
    if (item.as_string().empty() || item.as_string() == kManifestKey ||
        item.as_string().find("@rank") != std::string::npos) {
      fail(ErrorCode::schema_field_invalid, fields.path_of(key), " names '", item.as_string(),
           "', which is not a component name (empty, the manifest's, or containing '@rank')");
    }
    if (std::find(names.begin(), names.end(), item.as_string()) != names.end()) {
      fail(ErrorCode::schema_field_invalid, fields.path_of(key), " names '", item.as_string(), "' twice");
    }
    names.push_back(item.as_string());
  }
  return names;
}

Sharding read_sharding(const Value& value, CheckpointKind kind, const std::string& path) {
  const ManifestFields fields(value, path);
  Sharding sharding;
  if (kind == CheckpointKind::shard) {
    fields.check_keys({"world_size", "step", "rank"});
  } else {
    fields.check_keys({"world_size", "step", "replicated", "rank_local", "shards"});
  }
  sharding.world_size = fields.integer("world_size");
  sharding.step = fields.integer("step");
  if (sharding.world_size < 1 || sharding.world_size > kMaxWorldSize) {
    fail(ErrorCode::schema_field_invalid, path, ".world_size is ", sharding.world_size, "; it must be in 1..",
         kMaxWorldSize);
  }
  if (sharding.step < 0) fail(ErrorCode::schema_field_invalid, path, ".step is negative");
  if (kind == CheckpointKind::shard) {
    sharding.rank = fields.integer("rank");
    if (sharding.rank < 0 || sharding.rank >= sharding.world_size) {
      fail(ErrorCode::schema_field_invalid, path, ".rank is ", sharding.rank, ", outside 0..", sharding.world_size - 1);
    }
    return sharding;
  }
  sharding.replicated = read_names(fields, "replicated");
  sharding.rank_local = read_names(fields, "rank_local");
  for (const auto& name : sharding.rank_local) {
    if (std::find(sharding.replicated.begin(), sharding.replicated.end(), name) != sharding.replicated.end()) {
      fail(ErrorCode::schema_field_invalid, path, " lists '", name, "' as both replicated and rank-local");
    }
  }
  const Value& shards = fields.get("shards");
  if (!shards.is_list()) fields.invalid("shards", "a list", shards);
  if (static_cast<std::int64_t>(shards.as_list().size()) != sharding.world_size) {
    fail(ErrorCode::schema_field_invalid, path, ".shards has ", shards.as_list().size(), " records for a world of ",
         sharding.world_size);
  }
  for (std::size_t i = 0; i < shards.as_list().size(); ++i) {
    const ManifestFields record(shards.as_list()[i], detail::concat(path, ".shards[", i, "]"));
    record.check_keys({"rank", "size", "sha256"});
    ShardRecord shard{record.integer("rank"), 0, record.digest("sha256")};
    if (shard.rank != static_cast<std::int64_t>(i)) {
      fail(ErrorCode::schema_field_invalid, path, ".shards[", i, "].rank is ", shard.rank, "; records are by rank");
    }
    const std::int64_t size = record.integer("size");
    if (size <= 0) fail(ErrorCode::schema_field_invalid, path, ".shards[", i, "].size is ", size);
    shard.size = static_cast<std::uint64_t>(size);
    sharding.shards.push_back(shard);
  }
  return sharding;
}

// Bounds of a DCP layout: files per generation, ranges per file.
constexpr std::size_t kMaxDcpFiles = std::size_t{1} << 20;
constexpr std::size_t kMaxDcpRanges = std::size_t{16} << 20;

std::uint64_t non_negative(const ManifestFields& fields, std::string_view key) {
  const std::int64_t value = fields.integer(key);
  if (value < 0) fail(ErrorCode::schema_field_invalid, fields.path_of(key), " is negative");
  return static_cast<std::uint64_t>(value);
}

DcpFile read_dcp_file(const Value& value, const std::string& path, std::size_t& ranges_left) {
  const ManifestFields fields(value, path);
  fields.check_keys({"name", "size", "ranges"});
  DcpFile file;
  file.name = fields.string("name");
  if (!is_dcp_file_name(file.name)) {
    fail(ErrorCode::schema_field_invalid, path, ".name '", file.name.substr(0, 64),
         "' is not a file name a DCP folder holds");
  }
  file.size = non_negative(fields, "size");
  const Value& ranges = fields.get("ranges");
  if (!ranges.is_list()) fields.invalid("ranges", "a list", ranges);
  if (ranges.as_list().size() > ranges_left) {
    fail(ErrorCode::schema_field_invalid, path, ".ranges: more than ", kMaxDcpRanges, " ranges in the generation");
  }
  ranges_left -= ranges.as_list().size();
  std::uint64_t next = 0;
  for (std::size_t i = 0; i < ranges.as_list().size(); ++i) {
    const Value& range = ranges.as_list()[i];
    const std::string where = detail::concat(path, ".ranges[", i, "]");
    if (!range.is_list() || range.as_list().size() != 3 || !range.as_list()[0].is_int() ||
        !range.as_list()[1].is_int() || !range.as_list()[2].is_string()) {
      fail(ErrorCode::schema_field_invalid, where, " is not [offset, length, sha256]");
    }
    const std::int64_t offset = range.as_list()[0].as_int();
    const std::int64_t length = range.as_list()[1].as_int();
    const auto digest = Sha256Digest::from_hex(range.as_list()[2].as_string());
    if (!digest) fail(ErrorCode::schema_field_invalid, where, "'s sha256 is not 64 hexadecimal digits");
    // Ranges tile the file: each starts where the one before it ended.
    if (offset < 0 || static_cast<std::uint64_t>(offset) != next || length <= 0 ||
        static_cast<std::uint64_t>(length) > file.size - next) {
      fail(ErrorCode::schema_field_invalid, where, " is [", offset, ", +", length, "); the next range of ",
           file.name, " starts at ", next, " and the file has ", file.size, " bytes");
    }
    next += static_cast<std::uint64_t>(length);
    file.ranges.push_back({static_cast<std::uint64_t>(offset), static_cast<std::uint64_t>(length), *digest});
  }
  if (next != file.size) {
    fail(ErrorCode::schema_field_invalid, path, ".ranges cover ", next, " of the ", file.size, " bytes of ", file.name);
  }
  return file;
}

DcpLayout read_dcp_layout(const Value& value, const std::string& path) {
  const ManifestFields fields(value, path);
  fields.check_keys({"world_size", "step", "files"});
  DcpLayout layout;
  layout.world_size = fields.integer("world_size");
  layout.step = fields.integer("step");
  if (layout.world_size < 1 || layout.world_size > kMaxWorldSize) {
    fail(ErrorCode::schema_field_invalid, path, ".world_size is ", layout.world_size, "; it must be in 1..",
         kMaxWorldSize);
  }
  if (layout.step < 0) fail(ErrorCode::schema_field_invalid, path, ".step is negative");
  const Value& files = fields.get("files");
  if (!files.is_list()) fields.invalid("files", "a list", files);
  if (files.as_list().size() > kMaxDcpFiles) {
    fail(ErrorCode::schema_field_invalid, path, ".files lists ", files.as_list().size(), " files, more than ",
         kMaxDcpFiles);
  }
  std::size_t ranges_left = kMaxDcpRanges;
  for (std::size_t i = 0; i < files.as_list().size(); ++i) {
    DcpFile file = read_dcp_file(files.as_list()[i], detail::concat(path, ".files[", i, "]"), ranges_left);
    if (!layout.files.empty() && !(layout.files.back().name < file.name)) {
      fail(ErrorCode::schema_field_invalid, path, ".files[", i, "] '", file.name,
           "' is out of order or repeated (files are listed by name)");
    }
    layout.files.push_back(std::move(file));
  }
  if (!layout.file(".metadata")) fail(ErrorCode::schema_field_invalid, path, ".files does not list .metadata");
  return layout;
}

}  // namespace

bool is_dcp_file_name(std::string_view name) noexcept {
  if (name == ".metadata") return true;
  if (name.empty() || name.size() > 255 || name.front() == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

const DcpFile* DcpLayout::file(std::string_view name) const {
  for (const DcpFile& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

Value Manifest::to_value() const {
  Dict components_dict;
  for (const auto& record : components) {
    Dict entry;
    entry.insert("sha256", Value::string(record.sha256.hex()));
    entry.insert("contract", record.contract);
    components_dict.insert(record.name, Value::dict(std::move(entry)));
  }
  Dict identity;
  identity.insert("load_bearing_sha256", Value::string(config.load_bearing_digest().hex()));
  identity.insert("operational_sha256", Value::string(config.operational_digest().hex()));
  // Only where the key order matters, so that every other file stays exactly
  // what readers before version 2 read.
  if (config.digest_depends_on_version()) {
    identity.insert(std::string(kConfigDigestVersionField), Value::integer(static_cast<int>(kConfigDigestVersion)));
  }
  Dict versions;
  versions.insert("holdpoint", Value::string(holdpoint_version));
  versions.insert("libtorch", Value::string(libtorch_version));
  versions.insert("compiler", Value::string(compiler));
  Value drift;
  if (last_resume_drift) {
    Dict entry;
    entry.insert("field", Value::string(last_resume_drift->field));
    entry.insert("from", Value::integer(last_resume_drift->from));
    entry.insert("to", Value::integer(last_resume_drift->to));
    entry.insert("at_step", Value::integer(last_resume_drift->at_step));
    drift = Value::dict(std::move(entry));
  }
  Dict out;
  out.insert("schema", Value::string(std::string(kCheckpointSchema)));
  out.insert("schema_version", Value::integer(kCheckpointSchemaVersion));
  out.insert("kind", Value::string(std::string(checkpoint_kind_name(kind))));
  out.insert("semantic_identity", Value::string(semantic_identity));
  out.insert("profile", Value::string(profile));
  out.insert("config", config.to_value());
  out.insert("config_identity", Value::dict(std::move(identity)));
  out.insert("components", Value::dict(std::move(components_dict)));
  out.insert("versions", Value::dict(std::move(versions)));
  out.insert("code_identity", Value::string(code_identity));
  out.insert("data_identity", Value::string(data_identity));
  out.insert("last_resume_drift", drift);
  if (storage_digest != StorageDigestKind::sha256) {
    out.insert(std::string(kStorageDigestField), Value::string(std::string(storage_digest_name(storage_digest))));
  }
  if (sharding) {
    Dict entry;
    entry.insert("world_size", Value::integer(sharding->world_size));
    entry.insert("step", Value::integer(sharding->step));
    if (kind == CheckpointKind::shard) {
      entry.insert("rank", Value::integer(sharding->rank));
    } else {
      const auto names = [](const std::vector<std::string>& list) {
        Value::List items;
        for (const auto& name : list) items.push_back(Value::string(name));
        return Value::list(std::move(items));
      };
      entry.insert("replicated", names(sharding->replicated));
      entry.insert("rank_local", names(sharding->rank_local));
      Value::List shards;
      for (const auto& shard : sharding->shards) {
        Dict record;
        record.insert("rank", Value::integer(shard.rank));
        record.insert("size", Value::integer(static_cast<std::int64_t>(shard.size)));
        record.insert("sha256", Value::string(shard.sha256.hex()));
        shards.push_back(Value::dict(std::move(record)));
      }
      entry.insert("shards", Value::list(std::move(shards)));
    }
    out.insert("sharding", Value::dict(std::move(entry)));
  }
  if (dcp) {
    Value::List files;
    for (const DcpFile& file : dcp->files) {
      Value::List ranges;
      ranges.reserve(file.ranges.size());
      for (const DcpRange& range : file.ranges) {
        ranges.push_back(Value::list({Value::integer(static_cast<std::int64_t>(range.offset)),
                                      Value::integer(static_cast<std::int64_t>(range.length)),
                                      Value::string(range.sha256.hex())}));
      }
      Dict record;
      record.insert("name", Value::string(file.name));
      record.insert("size", Value::integer(static_cast<std::int64_t>(file.size)));
      record.insert("ranges", Value::list(std::move(ranges)));
      files.push_back(Value::dict(std::move(record)));
    }
    Dict entry;
    entry.insert("world_size", Value::integer(dcp->world_size));
    entry.insert("step", Value::integer(dcp->step));
    entry.insert("files", Value::list(std::move(files)));
    out.insert("dcp", Value::dict(std::move(entry)));
  }
  return Value::dict(std::move(out));
}

Manifest Manifest::from_value(const Value& value) {
  const ManifestFields top(value, std::string(kManifestKey));
  // The schema name and version are checked before the field set, so that a
  // future schema is reported as such rather than as unknown fields.
  if (!value.as_dict().find(std::string_view("schema"))) {
    fail(ErrorCode::schema_field_missing, kManifestKey, ".schema is missing");
  }
  if (top.string("schema") != kCheckpointSchema) {
    fail(ErrorCode::schema_version_unsupported, kManifestKey, ".schema is '", top.string("schema"), "', not '",
         kCheckpointSchema, "'");
  }
  if (!value.as_dict().find(std::string_view("schema_version"))) {
    fail(ErrorCode::schema_field_missing, kManifestKey, ".schema_version is missing");
  }
  if (top.integer("schema_version") != kCheckpointSchemaVersion) {
    fail(ErrorCode::schema_version_unsupported, kManifestKey, ".schema_version is ", top.integer("schema_version"),
         "; this build reads version ", kCheckpointSchemaVersion);
  }
  top.check_keys(kTopFields, {"sharding", "dcp", kStorageDigestField});

  Manifest manifest;
  manifest.storage_digest = StorageDigestKind::sha256;
  if (value.as_dict().find(kStorageDigestField)) {
    const std::string name = top.string(kStorageDigestField);
    if (name != storage_digest_name(StorageDigestKind::xxh3_128)) {
      fail(ErrorCode::schema_field_invalid, kManifestKey, ".", kStorageDigestField, " is '", name.substr(0, 32),
           "', not '", storage_digest_name(StorageDigestKind::xxh3_128), "' (absent means sha256)");
    }
    manifest.storage_digest = StorageDigestKind::xxh3_128;
  }
  const std::string kind = top.string("kind");
  if (kind == "resume") {
    manifest.kind = CheckpointKind::resume;
  } else if (kind == "model") {
    manifest.kind = CheckpointKind::model;
  } else if (kind == "selection") {
    manifest.kind = CheckpointKind::selection;
  } else if (kind == "sharded") {
    manifest.kind = CheckpointKind::sharded;
  } else if (kind == "shard") {
    manifest.kind = CheckpointKind::shard;
  } else if (kind == "dcp") {
    manifest.kind = CheckpointKind::dcp;
  } else {
    fail(ErrorCode::schema_field_invalid, kManifestKey, ".kind is '", kind,
         "', not resume, model, selection, sharded, shard or dcp");
  }
  manifest.semantic_identity = top.string("semantic_identity");
  manifest.profile = top.string("profile");
  try {
    manifest.config = TrainingConfig::from_value(top.get("config"), top.path_of("config"));
  } catch (const Error& error) {
    fail(ErrorCode::schema_field_invalid, error.detail());
  }

  const ManifestFields identity(top.get("config_identity"), top.path_of("config_identity"));
  identity.check_keys({"load_bearing_sha256", "operational_sha256"}, {kConfigDigestVersionField});
  // Absent: the file was written under the first key order, or under a later
  // one that gives its config the same text.
  ConfigDigestVersion digest_version = ConfigDigestVersion::text_key_order;
  if (top.get("config_identity").as_dict().find(kConfigDigestVersionField)) {
    const std::int64_t version = identity.integer(kConfigDigestVersionField);
    if (version != static_cast<int>(ConfigDigestVersion::python_key_order)) {
      fail(ErrorCode::schema_field_invalid, kManifestKey, ".config_identity.", kConfigDigestVersionField, " is ",
           version, "; this build knows 2 (absent means 1)");
    }
    digest_version = ConfigDigestVersion::python_key_order;
  }
  // The digests restate the config; a mismatch means one of them was edited.
  if (identity.digest("load_bearing_sha256") != manifest.config.load_bearing_digest(digest_version)) {
    fail(ErrorCode::schema_field_invalid, kManifestKey,
         ".config_identity.load_bearing_sha256 does not match config.load_bearing (digest version ",
         static_cast<int>(digest_version), ")");
  }
  if (identity.digest("operational_sha256") != manifest.config.operational_digest(digest_version)) {
    fail(ErrorCode::schema_field_invalid, kManifestKey,
         ".config_identity.operational_sha256 does not match config.operational (digest version ",
         static_cast<int>(digest_version), ")");
  }

  const Value& components = top.get("components");
  if (!components.is_dict()) top.invalid("components", "a dict", components);
  for (const auto& [key, entry] : components.as_dict()) {
    if (!key.is_string()) fail(ErrorCode::schema_field_invalid, kManifestKey, ".components has a non-str key");
    const ManifestFields fields(entry, top.path_of("components") + "." + key.as_string());
    fields.check_keys({"sha256", "contract"});
    manifest.components.push_back({key.as_string(), fields.digest("sha256"), fields.get("contract")});
  }

  const ManifestFields versions(top.get("versions"), top.path_of("versions"));
  versions.check_keys({"holdpoint", "libtorch", "compiler"});
  manifest.holdpoint_version = versions.string("holdpoint");
  manifest.libtorch_version = versions.string("libtorch");
  manifest.compiler = versions.string("compiler");
  manifest.code_identity = top.string("code_identity");
  manifest.data_identity = top.string("data_identity");

  const Value& drift = top.get("last_resume_drift");
  if (!drift.is_none()) {
    const ManifestFields fields(drift, top.path_of("last_resume_drift"));
    fields.check_keys({"field", "from", "to", "at_step"});
    manifest.last_resume_drift = ResumeDrift{fields.string("field"), fields.integer("from"), fields.integer("to"),
                                             fields.integer("at_step")};
  }
  const bool sharded_kind = manifest.kind == CheckpointKind::sharded || manifest.kind == CheckpointKind::shard;
  const Value* sharding = value.as_dict().find(std::string_view("sharding"));
  if (sharded_kind != (sharding != nullptr)) {
    fail(sharded_kind ? ErrorCode::schema_field_missing : ErrorCode::schema_field_unknown, kManifestKey,
         ".sharding is ", sharded_kind ? "missing (kind " : "present in a manifest of kind ", kind,
         sharded_kind ? ")" : "; only kinds sharded and shard have it");
  }
  if (sharding) manifest.sharding = read_sharding(*sharding, manifest.kind, top.path_of("sharding"));
  const bool dcp_kind = manifest.kind == CheckpointKind::dcp;
  const Value* dcp = value.as_dict().find(std::string_view("dcp"));
  if (dcp_kind != (dcp != nullptr)) {
    fail(dcp_kind ? ErrorCode::schema_field_missing : ErrorCode::schema_field_unknown, kManifestKey, ".dcp is ",
         dcp_kind ? "missing (kind dcp)" : "present in a manifest of kind " + kind + "; only kind dcp has it");
  }
  if (dcp) manifest.dcp = read_dcp_layout(*dcp, top.path_of("dcp"));
  return manifest;
}

const Value* find_manifest_entry(const Value& root) {
  return root.is_dict() ? root.as_dict().find(kManifestKey) : nullptr;
}

Manifest Manifest::of_root(const Value& root) {
  const Value* manifest = find_manifest_entry(root);
  if (!manifest) fail(ErrorCode::schema_field_missing, "the file has no '", kManifestKey, "' manifest");
  return from_value(*manifest);
}

// ---- component digests ------------------------------------------------------------------

std::string_view storage_digest_name(StorageDigestKind kind) noexcept {
  return kind == StorageDigestKind::sha256 ? "sha256" : "xxh3-128";
}

const StorageDigest& StorageDigests::of(const Storage& storage) {
  auto [it, inserted] = known_.try_emplace(storage.identity());
  if (inserted) {
    StorageDigest& digest = it->second;
    if (kind_ == StorageDigestKind::sha256) {
      const Sha256Digest sha = Sha256::of(storage.bytes());
      std::copy(sha.bytes.begin(), sha.bytes.end(), digest.bytes.begin());
      digest.size = 32;
    } else {
      const io::Xxh3Digest xxh = io::Xxh3_128::of(storage.bytes());
      std::copy(xxh.begin(), xxh.end(), digest.bytes.begin());
      digest.size = 16;
    }
  }
  return it->second;
}

namespace {

// A length-prefixed, type-tagged encoding: two different states never encode
// to the same bytes.
class DigestEncoder {
 public:
  explicit DigestEncoder(StorageDigests& storages) : storages_(storages) {}

  void encode(const Value& value) {
    switch (value.kind()) {
      case ValueKind::none: tag('N'); return;
      case ValueKind::boolean: tag(value.as_bool() ? 'T' : 'F'); return;
      case ValueKind::integer: tag('i'); u64(static_cast<std::uint64_t>(value.as_int())); return;
      case ValueKind::floating: {
        const double d = value.as_double();
        std::uint64_t bits;
        std::memcpy(&bits, &d, sizeof bits);
        tag('f');
        u64(bits);
        return;
      }
      case ValueKind::string: tag('s'); text(value.as_string()); return;
      case ValueKind::bytes: tag('b'); text(value.as_bytes()); return;
      case ValueKind::big_integer: tag('I'); text(value.as_big_integer()); return;
      case ValueKind::complex_number: {
        const std::complex<double> z = value.as_complex();
        tag('c');
        u64(std::bit_cast<std::uint64_t>(z.real()));
        u64(std::bit_cast<std::uint64_t>(z.imag()));
        return;
      }
      case ValueKind::bytearray: tag('B'); text(value.as_bytes()); return;
      case ValueKind::device: tag('D'); text(value.as_device()); return;
      case ValueKind::dtype: tag('y'); text(dtype_name(value.as_dtype())); return;
      case ValueKind::layout: tag('L'); text(value.as_layout()); return;
      case ValueKind::meta_tensor: tag('m'); text(typed_scalar_text(value)); return;
      case ValueKind::sparse_tensor: {
        // Its layout, size and flags, then its parts as the tensors they are.
        const SparseTensor& sparse = value.as_sparse_tensor();
        tag('P');
        text(sparse.layout);
        u64(sparse.sizes.size());
        for (auto size : sparse.sizes) u64(static_cast<std::uint64_t>(size));
        tag(!sparse.coalesced ? '-' : *sparse.coalesced ? 'C' : 'c');
        tag(sparse.is_parameter ? (sparse.requires_grad ? 'G' : 'P') : 'p');
        u64(sparse.parts.size());
        for (const Value& part : sparse.parts) encode(part);
        return;
      }
      case ValueKind::set:
      case ValueKind::size:
        tag(value.is_set() ? 'S' : 'z');
        u64(value.as_list().size());
        for (const Value& item : value.as_list()) encode(item);
        return;
      case ValueKind::list:
      case ValueKind::tuple:
        tag(value.is_list() ? 'l' : 't');
        u64(value.as_list().size());
        for (const Value& item : value.as_list()) encode(item);
        return;
      case ValueKind::dict:
      case ValueKind::ordered_dict:
        tag(value.is_ordered_dict() ? 'o' : 'd');
        u64(value.as_dict().size());
        for (const auto& [key, item] : value.as_dict()) {
          if (key.is_string()) {
            tag('s');
            text(key.as_string());
          } else if (key.is_integer()) {
            tag('i');
            u64(static_cast<std::uint64_t>(key.as_int()));
          } else {
            tag('k');
            encode(key.value());
          }
          encode(item);
        }
        return;
      case ValueKind::tensor: {
        const TensorData& t = value.as_tensor();
        tag('X');
        text(dtype_name(t.dtype));
        u64(t.sizes.size());
        for (auto size : t.sizes) u64(static_cast<std::uint64_t>(size));
        for (auto stride : t.strides) u64(static_cast<std::uint64_t>(stride));
        u64(static_cast<std::uint64_t>(t.storage_offset));
        if (t.conjugate || t.negative) {
          // Lower case: the lazy-view bits follow (digests of plain tensors are
          // what they always were).
          tag(t.requires_grad ? 't' : 'f');
          tag(t.conjugate ? 'C' : 'c');
          tag(t.negative ? 'N' : 'n');
        } else {
          tag(t.requires_grad ? 'T' : 'F');
        }
        u64(t.storage->nbytes());
        const StorageDigest& digest = storages_.of(*t.storage);
        hasher_.update(digest.bytes.data(), digest.size);
        return;
      }
    }
  }

  Sha256Digest finish() { return hasher_.finish(); }

 private:
  void tag(char c) { hasher_.update(&c, 1); }
  void u64(std::uint64_t v) {
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(v >> (8 * i));
    hasher_.update(bytes, 8);
  }
  void text(std::string_view s) {
    u64(s.size());
    hasher_.update(s.data(), s.size());
  }

  Sha256 hasher_;
  StorageDigests& storages_;
};

}  // namespace

Sha256Digest component_digest(const Value& state, StorageDigests& storages) {
  DigestEncoder encoder(storages);
  encoder.encode(state);
  return encoder.finish();
}

Value contract_of(const Value& state) {
  switch (state.kind()) {
    case ValueKind::tensor: {
      const TensorData& t = state.as_tensor();
      Value::List shape;
      for (std::int64_t size : t.sizes) shape.push_back(Value::integer(size));
      Dict entry;
      entry.insert("kind", Value::string("Tensor"));
      entry.insert("dtype", Value::string(std::string(dtype_name(t.dtype))));
      entry.insert("shape", Value::list(std::move(shape)));
      return Value::dict(std::move(entry));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : state.as_list()) items.push_back(contract_of(item));
      Dict entry;
      entry.insert("kind", Value::string(std::string(value_kind_name(state.kind()))));
      entry.insert("items", Value::list(std::move(items)));
      return Value::dict(std::move(entry));
    }
    case ValueKind::sparse_tensor: {
      const SparseTensor& sparse = state.as_sparse_tensor();
      Value::List shape;
      for (std::int64_t size : sparse.sizes) shape.push_back(Value::integer(size));
      Dict entry;
      entry.insert("kind", Value::string("sparse Tensor"));
      entry.insert("layout", Value::string(sparse.layout));
      entry.insert("dtype", Value::string(std::string(dtype_name(sparse.values().dtype))));
      entry.insert("shape", Value::list(std::move(shape)));
      return Value::dict(std::move(entry));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict fields;
      for (const auto& [key, item] : state.as_dict()) {
        fields.insert(key, contract_of(item));
      }
      Dict entry;
      entry.insert("kind", Value::string(std::string(value_kind_name(state.kind()))));
      entry.insert("fields", Value::dict(std::move(fields)));
      return Value::dict(std::move(entry));
    }
    default: {
      Dict entry;
      entry.insert("kind", Value::string(std::string(value_kind_name(state.kind()))));
      return Value::dict(std::move(entry));
    }
  }
}

}  // namespace holdpoint
