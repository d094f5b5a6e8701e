// The checkpoint manifest without LibTorch: to_value / from_value round trips
// for every kind, the canonical component digest, and one test per rejection,
// each asserting its ErrorCode (docs/resume-contract.md has the field table).
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/schema/manifest.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::bytes_of;

Sha256Digest digest_of(std::string_view text) { return Sha256::of(bytes_of(text)); }

TrainingConfig sample_config() {
  TrainingConfig config;
  config.load_bearing("batch_size", Value::integer(32)).load_bearing("lr", Value::floating(0.1)).max_epochs(10);
  config.operational("log_dir", Value::string("/tmp/logs"));
  return config;
}

Manifest sample_manifest(CheckpointKind kind = CheckpointKind::resume) {
  Manifest manifest;
  manifest.kind = kind;
  manifest.semantic_identity = "mnist-mlp";
  manifest.profile = "cpu-basic-v1";
  manifest.config = sample_config();
  manifest.components.push_back({"model", digest_of("model"), Value::string("module-v1")});
  manifest.components.push_back({"optimizer", digest_of("optimizer"), Value::dict()});
  manifest.holdpoint_version = "0.9.0";
  manifest.libtorch_version = "2.5.1";
  manifest.compiler = "gcc 13.2";
  manifest.code_identity = "git:abc123";
  manifest.data_identity = "mnist-train-v1";
  return manifest;
}

Sharding sample_step_sharding() {
  Sharding sharding;
  sharding.world_size = 2;
  sharding.step = 40;
  sharding.replicated = {"model", "optimizer"};
  sharding.rank_local = {"rng"};
  sharding.shards = {{0, 1000, digest_of("rank 0")}, {1, 1200, digest_of("rank 1")}};
  return sharding;
}

Manifest sharded_manifest() {
  Manifest manifest = sample_manifest(CheckpointKind::sharded);
  manifest.components.clear();
  manifest.profile = "cpu-gloo-ddp-v1";
  manifest.sharding = sample_step_sharding();
  return manifest;
}

Manifest shard_manifest(std::int64_t rank = 1) {
  Manifest manifest = sample_manifest(CheckpointKind::shard);
  manifest.sharding = Sharding{2, 40, rank, {}, {}, {}};
  return manifest;
}

// The dict at `path` (a list of keys from the top) of `value`, rebuilt with
// `edit` applied to it: the manifest is immutable through Value's accessors.
using Path = std::vector<std::string>;

Value edit_at(const Value& value, const Path& path, const std::function<void(Dict&)>& edit, std::size_t depth = 0) {
  Dict dict = value.as_dict();
  if (depth == path.size()) {
    edit(dict);
  } else {
    dict.insert_or_assign(path[depth], edit_at(dict.at(path[depth]), path, edit, depth + 1));
  }
  return Value::dict(std::move(dict));
}

Dict without(const Dict& dict, std::string_view key) {
  Dict out;
  for (const auto& [k, v] : dict) {
    if (!(k.is_string() && k.as_string() == key)) out.insert(k, v);
  }
  return out;
}

Value with_field(const Value& value, const Path& path, const std::string& key, Value field) {
  return edit_at(value, path, [&](Dict& dict) { dict.insert_or_assign(key, field); });
}

Value without_field(const Value& value, const Path& path, const std::string& key) {
  return edit_at(value, path, [&](Dict& dict) { dict = without(dict, key); });
}

Value sharding_with(const std::string& key, Value field) {
  return with_field(sharded_manifest().to_value(), {"sharding"}, key, std::move(field));
}

Value names(std::initializer_list<const char*> items) {
  Value::List list;
  for (const char* item : items) list.push_back(Value::string(item));
  return Value::list(std::move(list));
}

void expect_same(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.semantic_identity, b.semantic_identity);
  EXPECT_EQ(a.profile, b.profile);
  EXPECT_EQ(a.config.canonical_load_bearing(), b.config.canonical_load_bearing());
  EXPECT_EQ(a.config.canonical_operational(), b.config.canonical_operational());
  ASSERT_EQ(a.components.size(), b.components.size());
  for (std::size_t i = 0; i < a.components.size(); ++i) {
    EXPECT_EQ(a.components[i].name, b.components[i].name);
    EXPECT_EQ(a.components[i].sha256, b.components[i].sha256);
    EXPECT_TRUE(equal_content(a.components[i].contract, b.components[i].contract));
  }
  EXPECT_EQ(a.holdpoint_version, b.holdpoint_version);
  EXPECT_EQ(a.libtorch_version, b.libtorch_version);
  EXPECT_EQ(a.compiler, b.compiler);
  EXPECT_EQ(a.code_identity, b.code_identity);
  EXPECT_EQ(a.data_identity, b.data_identity);
  ASSERT_EQ(a.last_resume_drift.has_value(), b.last_resume_drift.has_value());
  if (a.last_resume_drift) {
    EXPECT_EQ(a.last_resume_drift->field, b.last_resume_drift->field);
    EXPECT_EQ(a.last_resume_drift->from, b.last_resume_drift->from);
    EXPECT_EQ(a.last_resume_drift->to, b.last_resume_drift->to);
    EXPECT_EQ(a.last_resume_drift->at_step, b.last_resume_drift->at_step);
  }
  ASSERT_EQ(a.sharding.has_value(), b.sharding.has_value());
  if (a.sharding) {
    EXPECT_EQ(a.sharding->world_size, b.sharding->world_size);
    EXPECT_EQ(a.sharding->step, b.sharding->step);
    EXPECT_EQ(a.sharding->rank, b.sharding->rank);
    EXPECT_EQ(a.sharding->replicated, b.sharding->replicated);
    EXPECT_EQ(a.sharding->rank_local, b.sharding->rank_local);
    ASSERT_EQ(a.sharding->shards.size(), b.sharding->shards.size());
    for (std::size_t i = 0; i < a.sharding->shards.size(); ++i) {
      EXPECT_EQ(a.sharding->shards[i].rank, b.sharding->shards[i].rank);
      EXPECT_EQ(a.sharding->shards[i].size, b.sharding->shards[i].size);
      EXPECT_EQ(a.sharding->shards[i].sha256, b.sharding->shards[i].sha256);
    }
  }
}

// ---- round trips ------------------------------------------------------------------------

TEST(Manifest, KindsHaveTheirSchemaNames) {
  EXPECT_EQ(checkpoint_kind_name(CheckpointKind::resume), "resume");
  EXPECT_EQ(checkpoint_kind_name(CheckpointKind::model), "model");
  EXPECT_EQ(checkpoint_kind_name(CheckpointKind::selection), "selection");
  EXPECT_EQ(checkpoint_kind_name(CheckpointKind::sharded), "sharded");
  EXPECT_EQ(checkpoint_kind_name(CheckpointKind::shard), "shard");
}

TEST(Manifest, EveryUnshardedKindRoundTrips) {
  for (const auto kind : {CheckpointKind::resume, CheckpointKind::model, CheckpointKind::selection}) {
    SCOPED_TRACE(checkpoint_kind_name(kind));
    const Manifest written = sample_manifest(kind);
    const Value value = written.to_value();
    const Manifest read = Manifest::from_value(value);
    expect_same(read, written);
    EXPECT_TRUE(equal_content(read.to_value(), value));
  }
}

TEST(Manifest, ToValueWritesTheDocumentedLayout) {
  const Value value = sample_manifest().to_value();
  const Dict& top = value.as_dict();
  std::vector<std::string> keys;
  for (const auto& [key, item] : top) keys.push_back(key.as_string());
  EXPECT_EQ(keys, (std::vector<std::string>{"schema", "schema_version", "kind", "semantic_identity", "profile",
                                            "config", "config_identity", "components", "versions", "code_identity",
                                            "data_identity", "last_resume_drift", "storage_digest"}));
  EXPECT_EQ(top.at("storage_digest").as_string(), "xxh3-128");
  EXPECT_EQ(top.at("schema").as_string(), kCheckpointSchema);
  EXPECT_EQ(top.at("schema_version").as_int(), kCheckpointSchemaVersion);
  EXPECT_EQ(top.at("kind").as_string(), "resume");
  EXPECT_TRUE(top.at("last_resume_drift").is_none());
  const Dict& identity = top.at("config_identity").as_dict();
  EXPECT_EQ(identity.at("load_bearing_sha256").as_string(), sample_config().load_bearing_digest().hex());
  EXPECT_EQ(identity.at("operational_sha256").as_string(), sample_config().operational_digest().hex());
  const Dict& model = top.at("components").as_dict().at("model").as_dict();
  EXPECT_EQ(model.at("sha256").as_string(), digest_of("model").hex());
  EXPECT_EQ(model.at("contract").as_string(), "module-v1");
  const Dict& versions = top.at("versions").as_dict();
  EXPECT_EQ(versions.at("holdpoint").as_string(), "0.9.0");
  EXPECT_EQ(versions.at("libtorch").as_string(), "2.5.1");
  EXPECT_EQ(versions.at("compiler").as_string(), "gcc 13.2");
}

TEST(Manifest, AcceptedMaxEpochsDriftRoundTrips) {
  Manifest written = sample_manifest();
  written.last_resume_drift = ResumeDrift{"max_epochs", 10, 15, 1700};
  const Value value = written.to_value();
  const Dict& drift = value.as_dict().at("last_resume_drift").as_dict();
  EXPECT_EQ(drift.at("field").as_string(), "max_epochs");
  EXPECT_EQ(drift.at("from").as_int(), 10);
  EXPECT_EQ(drift.at("to").as_int(), 15);
  EXPECT_EQ(drift.at("at_step").as_int(), 1700);
  expect_same(Manifest::from_value(value), written);
}

TEST(Manifest, StepManifestOfAShardedGenerationRoundTrips) {
  const Manifest written = sharded_manifest();
  const Value value = written.to_value();
  const Dict& sharding = value.as_dict().at("sharding").as_dict();
  EXPECT_EQ(sharding.at("world_size").as_int(), 2);
  EXPECT_EQ(sharding.at("shards").as_list().size(), 2u);
  EXPECT_FALSE(sharding.contains("rank"));
  expect_same(Manifest::from_value(value), written);
}

TEST(Manifest, ShardManifestRoundTripsWithItsRankOnly) {
  const Manifest written = shard_manifest();
  const Value value = written.to_value();
  const Dict& sharding = value.as_dict().at("sharding").as_dict();
  EXPECT_EQ(sharding.size(), 3u);
  EXPECT_EQ(sharding.at("rank").as_int(), 1);
  expect_same(Manifest::from_value(value), written);
}

TEST(Manifest, AShardedKindWithNoShardNamesIsValid) {
  Manifest written = sharded_manifest();
  written.sharding->replicated.clear();
  written.sharding->rank_local.clear();
  expect_same(Manifest::from_value(written.to_value()), written);
}

TEST(Manifest, ComponentIsFoundByName) {
  const Manifest manifest = sample_manifest();
  ASSERT_NE(manifest.component("optimizer"), nullptr);
  EXPECT_EQ(manifest.component("optimizer")->sha256, digest_of("optimizer"));
  EXPECT_EQ(manifest.component("scheduler"), nullptr);
}

TEST(Manifest, OfRootReadsTheHoldpointEntry) {
  Dict root;
  root.insert("model", Value::dict());
  root.insert(std::string(kManifestKey), sample_manifest().to_value());
  const Value value = Value::dict(std::move(root));
  ASSERT_EQ(find_manifest_entry(value), value.as_dict().find(kManifestKey));
  expect_same(Manifest::of_root(value), sample_manifest());
}

// ---- rejections: the root and the schema ---------------------------------------------------

TEST(ManifestRejects, ARootWithoutAHoldpointEntry) {
  Dict root;
  root.insert("model", Value::dict());
  const Value value = Value::dict(std::move(root));
  EXPECT_EQ(find_manifest_entry(value), nullptr);
  EXPECT_ERROR_CODE(Manifest::of_root(value), ErrorCode::schema_field_missing);
}

TEST(ManifestRejects, ARootThatIsNotADict) {
  const Value root = Value::list({sample_manifest().to_value()});
  EXPECT_EQ(find_manifest_entry(root), nullptr);
  EXPECT_ERROR_CODE(Manifest::of_root(root), ErrorCode::schema_field_missing);
}

TEST(ManifestRejects, AManifestThatIsNotADict) {
  EXPECT_ERROR_CODE(Manifest::from_value(Value::string("holdpoint.checkpoint")), ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AMissingSchemaOrVersion) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {}, "schema")), ErrorCode::schema_field_missing);
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {}, "schema_version")),
                    ErrorCode::schema_field_missing);
}

TEST(ManifestRejects, AnotherSchemaOrVersionAsUnsupported) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "schema", Value::string("other.checkpoint"))),
                    ErrorCode::schema_version_unsupported);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "schema_version", Value::integer(2))),
                    ErrorCode::schema_version_unsupported);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "schema_version", Value::integer(0))),
                    ErrorCode::schema_version_unsupported);
}

TEST(ManifestRejects, AFutureSchemaAsUnsupportedEvenWithUnknownFields) {
  // A later version is reported as such, not as the unknown fields it brings.
  Value value = with_field(sample_manifest().to_value(), {}, "schema_version", Value::integer(2));
  value = with_field(value, {}, "new_in_v2", Value::integer(1));
  EXPECT_ERROR_CODE(Manifest::from_value(value), ErrorCode::schema_version_unsupported);
}

TEST(ManifestRejects, SchemaFieldsOfTheWrongType) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "schema", Value::integer(1))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "schema_version", Value::string("1"))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, EachMissingTopLevelField) {
  const Value value = sample_manifest().to_value();
  for (const char* field : {"kind", "semantic_identity", "profile", "config", "config_identity", "components",
                            "versions", "code_identity", "data_identity", "last_resume_drift"}) {
    SCOPED_TRACE(field);
    EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {}, field)), ErrorCode::schema_field_missing);
  }
}

TEST(Manifest, StorageDigestKindRoundTripsAndDefaultsToSha256WhenAbsent) {
  EXPECT_EQ(Manifest::from_value(sample_manifest().to_value()).storage_digest, StorageDigestKind::xxh3_128);
  // Files written before the field existed used SHA-256 storage digests.
  const Value old = without_field(sample_manifest().to_value(), {}, "storage_digest");
  EXPECT_EQ(Manifest::from_value(old).storage_digest, StorageDigestKind::sha256);
  Manifest legacy = sample_manifest();
  legacy.storage_digest = StorageDigestKind::sha256;
  EXPECT_FALSE(legacy.to_value().as_dict().find(std::string_view("storage_digest")));
  EXPECT_EQ(Manifest::from_value(legacy.to_value()).storage_digest, StorageDigestKind::sha256);
}

Manifest int_keyed_manifest() {
  Manifest manifest = sample_manifest();
  Dict weights;
  weights.insert(10, Value::floating(1.5));
  weights.insert(2, Value::floating(0.5));
  manifest.config.load_bearing("class_weights", Value::dict(std::move(weights)));
  return manifest;
}

TEST(Manifest, ConfigDigestVersionIsWrittenOnlyWhereTheKeyOrderMatters) {
  EXPECT_FALSE(sample_manifest().to_value().as_dict().at("config_identity").as_dict().find(
      std::string_view("digest_version")));
  const Manifest manifest = int_keyed_manifest();
  const Value value = manifest.to_value();
  const Dict& identity = value.as_dict().at("config_identity").as_dict();
  EXPECT_EQ(identity.at("digest_version").as_int(), 2);
  EXPECT_EQ(identity.at("load_bearing_sha256").as_string(), manifest.config.load_bearing_digest().hex());
  EXPECT_EQ(Manifest::from_value(value).config.canonical_load_bearing(), manifest.config.canonical_load_bearing());
}

// Issue 35: files written before int keys sorted by value carry digests of the
// text order and no digest_version; they must still read (and so resume).
TEST(Manifest, AnOldFilesConfigDigestsAreCheckedWithTheOldKeyOrder) {
  const Manifest manifest = int_keyed_manifest();
  Value old = without_field(manifest.to_value(), {"config_identity"}, "digest_version");
  old = with_field(old, {"config_identity"}, "load_bearing_sha256",
                   Value::string(manifest.config.load_bearing_digest(ConfigDigestVersion::text_key_order).hex()));
  EXPECT_EQ(Manifest::from_value(old).config.load_bearing_digest(), manifest.config.load_bearing_digest());
  // Each rule's digests only under its own version.
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(manifest.to_value(), {"config_identity"}, "digest_version")),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(old, {"config_identity"}, "digest_version", Value::integer(2))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AnUnknownConfigDigestVersion) {
  const Value value = int_keyed_manifest().to_value();
  for (const Value& version : {Value::integer(1), Value::integer(3), Value::string("2")}) {
    EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"config_identity"}, "digest_version", version)),
                      ErrorCode::schema_field_invalid);
  }
}

TEST(ManifestRejects, AnUnknownStorageDigestKind) {
  const Value value = sample_manifest().to_value();
  // Only the kind this build computes is named; sha256 is spelled by absence.
  for (const char* name : {"sha256", "xxh3-64", "", "XXH3-128"}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "storage_digest", Value::string(name))),
                      ErrorCode::schema_field_invalid);
  }
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "storage_digest", Value::integer(1))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AnUnknownTopLevelField) {
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(sample_manifest().to_value(), {}, "surprise", Value::integer(1))),
                    ErrorCode::schema_field_unknown);
}

TEST(ManifestRejects, AnIntegerKeyAtTheTop) {
  const Value value = edit_at(sample_manifest().to_value(), {}, [](Dict& dict) { dict.insert(7, Value::none()); });
  EXPECT_ERROR_CODE(Manifest::from_value(value), ErrorCode::schema_field_unknown);
}

TEST(ManifestRejects, AnUnknownKind) {
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(sample_manifest().to_value(), {}, "kind", Value::string("bogus"))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(sample_manifest().to_value(), {}, "kind", Value::string("Resume"))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, TextFieldsThatAreNotStr) {
  const Value value = sample_manifest().to_value();
  for (const char* field : {"kind", "semantic_identity", "profile", "code_identity", "data_identity"}) {
    SCOPED_TRACE(field);
    EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, field, Value::integer(3))),
                      ErrorCode::schema_field_invalid);
    EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, field, Value::bytes("text"))),
                      ErrorCode::schema_field_invalid);
  }
}

// ---- rejections: config and its identity --------------------------------------------------

TEST(ManifestRejects, AnInvalidConfigAsASchemaError) {
  const Value value = sample_manifest().to_value();
  // TrainingConfig reports config_invalid; inside a manifest it is a field of the schema.
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "config", Value::list())),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"config"}, "extra", Value::dict())),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"config", "load_bearing"}, "blob", Value::bytes("x"))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AConfigEditedWithoutItsDigest) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(
      Manifest::from_value(with_field(value, {"config", "load_bearing"}, "batch_size", Value::integer(64))),
      ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(
      Manifest::from_value(with_field(value, {"config", "operational"}, "log_dir", Value::string("/elsewhere"))),
      ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, ConfigIdentityDigestsThatAreNotHex) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"config_identity"}, "load_bearing_sha256",
                                                    Value::string(std::string(63, 'a')))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"config_identity"}, "operational_sha256",
                                                    Value::string(std::string(64, 'g')))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(
      Manifest::from_value(with_field(value, {"config_identity"}, "operational_sha256", Value::integer(0))),
      ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, ConfigIdentityWithAMissingOrExtraField) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {"config_identity"}, "operational_sha256")),
                    ErrorCode::schema_field_missing);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"config_identity"}, "sha1", Value::string("x"))),
                    ErrorCode::schema_field_unknown);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "config_identity", Value::none())),
                    ErrorCode::schema_field_invalid);
}

// ---- rejections: components, versions, drift ------------------------------------------------

TEST(ManifestRejects, ComponentsThatAreNotADict) {
  EXPECT_ERROR_CODE(
      Manifest::from_value(with_field(sample_manifest().to_value(), {}, "components", names({"model"}))),
      ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AComponentWithAnIntegerName) {
  const Value value = edit_at(sample_manifest().to_value(), {"components"}, [](Dict& dict) {
    dict.insert(0, dict.at("model"));
  });
  EXPECT_ERROR_CODE(Manifest::from_value(value), ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AComponentRecordWithAMissingOrExtraField) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {"components", "model"}, "contract")),
                    ErrorCode::schema_field_missing);
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {"components", "model"}, "sha256")),
                    ErrorCode::schema_field_missing);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"components", "model"}, "size", Value::integer(1))),
                    ErrorCode::schema_field_unknown);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"components"}, "model", Value::string("digest"))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AComponentDigestThatIsNotSha256) {
  const Value value = sample_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"components", "model"}, "sha256",
                                                    Value::string(digest_of("model").hex() + "00"))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"components", "model"}, "sha256", Value::none())),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, VersionsWithAMissingOrExtraField) {
  const Value value = sample_manifest().to_value();
  for (const char* field : {"holdpoint", "libtorch", "compiler"}) {
    SCOPED_TRACE(field);
    EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {"versions"}, field)),
                      ErrorCode::schema_field_missing);
    EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"versions"}, field, Value::integer(2))),
                      ErrorCode::schema_field_invalid);
  }
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"versions"}, "python", Value::string("3.12"))),
                    ErrorCode::schema_field_unknown);
}

TEST(ManifestRejects, ADriftRecordWithAMissingExtraOrMistypedField) {
  Manifest manifest = sample_manifest();
  manifest.last_resume_drift = ResumeDrift{"max_epochs", 10, 15, 1700};
  const Value value = manifest.to_value();
  for (const char* field : {"field", "from", "to", "at_step"}) {
    SCOPED_TRACE(field);
    EXPECT_ERROR_CODE(Manifest::from_value(without_field(value, {"last_resume_drift"}, field)),
                      ErrorCode::schema_field_missing);
  }
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"last_resume_drift"}, "why", Value::string("longer"))),
                    ErrorCode::schema_field_unknown);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {"last_resume_drift"}, "to", Value::floating(15))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_field(value, {}, "last_resume_drift", Value::integer(15))),
                    ErrorCode::schema_field_invalid);
}

// ---- rejections: sharding -----------------------------------------------------------------

TEST(ManifestRejects, ShardingOnAKindThatHasNone) {
  const Value value = with_field(sample_manifest().to_value(), {}, "sharding",
                                 sharded_manifest().to_value().as_dict().at("sharding"));
  EXPECT_ERROR_CODE(Manifest::from_value(value), ErrorCode::schema_field_unknown);
}

TEST(ManifestRejects, AShardedKindWithoutSharding) {
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(sharded_manifest().to_value(), {}, "sharding")),
                    ErrorCode::schema_field_missing);
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(shard_manifest().to_value(), {}, "sharding")),
                    ErrorCode::schema_field_missing);
}

TEST(ManifestRejects, ShardingWithAMissingOrForeignField) {
  for (const char* field : {"world_size", "step", "replicated", "rank_local", "shards"}) {
    SCOPED_TRACE(field);
    EXPECT_ERROR_CODE(Manifest::from_value(without_field(sharded_manifest().to_value(), {"sharding"}, field)),
                      ErrorCode::schema_field_missing);
  }
  // A step manifest has no rank; a shard has no lists.
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("rank", Value::integer(0))), ErrorCode::schema_field_unknown);
  EXPECT_ERROR_CODE(
      Manifest::from_value(with_field(shard_manifest().to_value(), {"sharding"}, "replicated", names({"model"}))),
      ErrorCode::schema_field_unknown);
  EXPECT_ERROR_CODE(Manifest::from_value(without_field(shard_manifest().to_value(), {"sharding"}, "rank")),
                    ErrorCode::schema_field_missing);
}

TEST(ManifestRejects, AWorldSizeOutsideItsBounds) {
  for (const std::int64_t world_size : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{(1 << 16) + 1}}) {
    SCOPED_TRACE(world_size);
    EXPECT_ERROR_CODE(Manifest::from_value(with_field(shard_manifest(0).to_value(), {"sharding"}, "world_size",
                                                      Value::integer(world_size))),
                      ErrorCode::schema_field_invalid);
  }
}

TEST(ManifestRejects, ANegativeStep) {
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("step", Value::integer(-1))), ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AShardRankOutsideTheWorld) {
  for (const std::int64_t rank : {std::int64_t{-1}, std::int64_t{2}}) {
    SCOPED_TRACE(rank);
    EXPECT_ERROR_CODE(
        Manifest::from_value(with_field(shard_manifest().to_value(), {"sharding"}, "rank", Value::integer(rank))),
        ErrorCode::schema_field_invalid);
  }
}

TEST(ManifestRejects, ShardRecordsThatDoNotMatchTheWorld) {
  const Value value = sharded_manifest().to_value();
  const Value::List& shards = value.as_dict().at("sharding").as_dict().at("shards").as_list();
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("shards", Value::list({shards[0]}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("shards", Value::list({shards[1], shards[0]}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("shards", Value::dict())), ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, AShardRecordOfNoBytesOrABadDigest) {
  const Value value = sharded_manifest().to_value();
  const Value::List& shards = value.as_dict().at("sharding").as_dict().at("shards").as_list();
  const auto with_second = [&](const std::string& key, Value field) {
    Dict record = shards[1].as_dict();
    record.insert_or_assign(key, std::move(field));
    return sharding_with("shards", Value::list({shards[0], Value::dict(std::move(record))}));
  };
  EXPECT_ERROR_CODE(Manifest::from_value(with_second("size", Value::integer(0))), ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_second("size", Value::integer(-5))), ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_second("sha256", Value::string("abc"))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with_second("offset", Value::integer(0))), ErrorCode::schema_field_unknown);
}

TEST(ManifestRejects, ComponentNamesAShardListCannotHold) {
  for (const char* name : {"", "holdpoint", "rng@rank0"}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("replicated", names({"model", name}))),
                      ErrorCode::schema_field_invalid);
    EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("rank_local", names({name}))),
                      ErrorCode::schema_field_invalid);
  }
}

TEST(ManifestRejects, AComponentNamedTwiceOrInBothLists) {
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("replicated", names({"model", "model"}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("rank_local", names({"rng", "model"}))),
                    ErrorCode::schema_field_invalid);
}

TEST(ManifestRejects, ShardListsThatAreNotListsOfStr) {
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("replicated", Value::string("model"))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(sharding_with("rank_local", Value::list({Value::integer(1)}))),
                    ErrorCode::schema_field_invalid);
}

// ---- component digests --------------------------------------------------------------------

template <typename T>
Value tensor_of(DType dtype, std::vector<std::int64_t> sizes, const std::vector<T>& values) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(T));
  return Value::tensor(TensorData::from_bytes(dtype, std::move(sizes), bytes));
}

Sha256Digest digest(const Value& state, StorageDigestKind kind = StorageDigestKind::xxh3_128) {
  StorageDigests storages(kind);
  return component_digest(state, storages);
}

TEST(ComponentDigest, MatchesTheDocumentedEncoding) {
  // Known answers computed with Python's hashlib over the encoding manifest.cpp
  // documents: a type tag, little-endian u64 lengths, and for a tensor its
  // dtype, geometry and the digest of its storage (XXH3-128 from libxxhash
  // through ctypes, canonical byte order; SHA-256 for files without
  // storage_digest).
  EXPECT_EQ(digest(Value::none()).hex(), "8ce86a6ae65d3692e7305e2c58ac62eebd97d3d943e093f577da25c36988246b");
  Dict dict;
  dict.insert("a", Value::integer(1));
  EXPECT_EQ(digest(Value::dict(std::move(dict))).hex(),
            "5e4951fb3a5132b1c093102b0070cef7885056314e85816f6436788403dd6392");
  const Value tensor = tensor_of<float>(DType::float32, {2}, {1.0f, 2.0f});
  EXPECT_EQ(digest(tensor).hex(), "87d1240252ff2616fe69bdb5a6f63292f4aa8d9077049c0258fcafcfc18ff3b7");
  EXPECT_EQ(digest(tensor, StorageDigestKind::sha256).hex(),
            "1c7aee93f7e999caf760d2b7e43a06bd77341e864337465ebb8a454754279be5");
}

TEST(ComponentDigest, TellsApartValuesThatLookAlike) {
  const std::vector<Value> values = {
      Value::none(),
      Value::boolean(false),
      Value::boolean(true),
      Value::integer(0),
      Value::integer(1),
      Value::floating(0.0),
      Value::floating(-0.0),
      Value::floating(1.0),
      Value::string(""),
      Value::string("1"),
      Value::bytes("1"),
      Value::list(),
      Value::tuple(),
      Value::dict(),
      Value::ordered_dict(),
      Value::list({Value::integer(1)}),
      Value::tuple({Value::integer(1)}),
      Value::list({Value::list()}),
      Value::list({Value::list(), Value::list()}),
  };
  for (std::size_t i = 0; i < values.size(); ++i) {
    for (std::size_t j = i + 1; j < values.size(); ++j) {
      EXPECT_NE(digest(values[i]), digest(values[j])) << i << " vs " << j;
    }
  }
}

TEST(ComponentDigest, DictKeysCountByTypeAndOrder) {
  Dict by_string, by_int, ab, ba;
  by_string.insert("1", Value::none());
  by_int.insert(1, Value::none());
  ab.insert("a", Value::integer(1));
  ab.insert("b", Value::integer(2));
  ba.insert("b", Value::integer(2));
  ba.insert("a", Value::integer(1));
  EXPECT_NE(digest(Value::dict(by_string)), digest(Value::dict(by_int)));
  EXPECT_NE(digest(Value::dict(ab)), digest(Value::dict(ba)));
}

TEST(ComponentDigest, TensorsCountByDtypeGeometryFlagsAndBytes) {
  const Value base = tensor_of<float>(DType::float32, {2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(digest(base), digest(tensor_of<float>(DType::float32, {2, 2}, {1, 2, 3, 4})));
  EXPECT_NE(digest(base), digest(tensor_of<float>(DType::float32, {4}, {1, 2, 3, 4})));
  EXPECT_NE(digest(base), digest(tensor_of<float>(DType::float32, {2, 2}, {1, 2, 3, 5})));
  EXPECT_NE(digest(base), digest(tensor_of<std::int32_t>(DType::int32, {2, 2}, {1, 2, 3, 4})));
  TensorData transposed = base.as_tensor();
  transposed.strides = {1, 2};
  EXPECT_NE(digest(base), digest(Value::tensor(transposed)));
  TensorData grad = base.as_tensor();
  grad.requires_grad = true;
  EXPECT_NE(digest(base), digest(Value::tensor(grad)));
}

TEST(ComponentDigest, EachStorageIsHashedOnceAndRecordedDigestsAreReused) {
  const Value tensor = tensor_of<float>(DType::float32, {2}, {1.0f, 2.0f});
  const Storage& storage = *tensor.as_tensor().storage;
  StorageDigests by_sha(StorageDigestKind::sha256);
  const Sha256Digest sha = Sha256::of(storage.bytes());
  EXPECT_EQ(by_sha.of(storage).size, 32);
  EXPECT_TRUE(std::equal(sha.bytes.begin(), sha.bytes.end(), by_sha.of(storage).bytes.begin()));
  StorageDigests by_xxh3;
  EXPECT_EQ(by_xxh3.of(storage).size, 16);
  EXPECT_EQ(by_xxh3.kind(), StorageDigestKind::xxh3_128);
  // A digest set by the writer (computed while streaming) is the one used.
  StorageDigests preset;
  StorageDigest streamed;
  streamed.bytes[0] = 0x5a;
  streamed.size = 16;
  preset.set(storage.identity(), streamed);
  EXPECT_EQ(preset.of(storage).bytes[0], 0x5a);
  EXPECT_NE(component_digest(tensor, preset), digest(tensor));
}

}  // namespace
}  // namespace holdpoint
