// The torch-free parts of sharded checkpoints: names, the partition of
// replicated state, the merge of its pieces, and the manifest's sharding field.
#include "holdpoint/run/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "support/test_support.h"

namespace holdpoint {
namespace {

Value floats(std::vector<float> values) {
  return Value::tensor(TensorData::from_bytes(DType::float32, {static_cast<std::int64_t>(values.size())},
                                              std::as_bytes(std::span(values))));
}

// Two tensors viewing one storage (tied weights).
std::pair<Value, Value> tied(std::size_t n) {
  const Value base = floats(std::vector<float>(n, 1.0f));
  TensorData view = base.as_tensor();
  view.sizes = {static_cast<std::int64_t>(n / 2)};
  return {base, Value::tensor(view)};
}

Value model_state() {
  Dict entries;
  entries.insert("big", floats(std::vector<float>(1000, 1.0f)));
  entries.insert("mid", floats(std::vector<float>(600, 2.0f)));
  entries.insert("small", floats(std::vector<float>(300, 3.0f)));
  entries.insert("step", Value::integer(7));
  entries.insert("name", Value::string("m"));
  entries.insert("nothing", Value::none());
  return Value::dict(std::move(entries));
}

std::size_t tensors_in(const Value& value) {
  switch (value.kind()) {
    case ValueKind::tensor: return 1;
    case ValueKind::list:
    case ValueKind::tuple: {
      std::size_t n = 0;
      for (const auto& item : value.as_list()) n += tensors_in(item);
      return n;
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      std::size_t n = 0;
      for (const auto& [key, item] : value.as_dict()) n += tensors_in(item);
      return n;
    }
    default: return 0;
  }
}

// ---- names ---------------------------------------------------------------------------------

TEST(ShardNames, DirectoryAndFileNamesHaveOneSpelling) {
  EXPECT_EQ(shard_directory_name(5), "step-00000005.shards");
  EXPECT_EQ(shard_file_name(3), "rank-00003.pt");
  EXPECT_EQ(parse_shard_directory_name("step-00000005.shards"), 5);
  EXPECT_EQ(parse_shard_directory_name("step-123456789.shards"), 123456789);
  for (const char* bad : {"step-5.shards", "step-00000005.shard", "step--0000005.shards", "step-00000005.pt",
                          "step-00000005.shards.damaged", "step-000000005.shards", ".step-00000005.shards"}) {
    EXPECT_FALSE(parse_shard_directory_name(bad)) << bad;
  }
  EXPECT_ERROR_CODE(shard_file_name(-1), ErrorCode::invalid_argument);
}

// ---- partition -----------------------------------------------------------------------------

TEST(PartitionReplicated, EveryTensorIsHeldByExactlyOneRankAndScalarsByAll) {
  const std::vector<std::pair<std::string, Value>> states = {{"model", model_state()}};
  const ReplicatedPartition partition = partition_replicated(states, 2);
  ASSERT_EQ(partition.pieces.size(), 2u);
  std::size_t held = 0;
  for (const auto& pieces : partition.pieces) {
    ASSERT_EQ(pieces.size(), 1u);
    held += tensors_in(pieces[0].second);
    EXPECT_EQ(pieces[0].second.as_dict().at("step").as_int(), 7);
    EXPECT_EQ(pieces[0].second.as_dict().at("name").as_string(), "m");
  }
  EXPECT_EQ(held, 3u);
  // Largest first to the least loaded rank: 1000 -> 0, 600 -> 1, 300 -> 1.
  EXPECT_EQ(partition.bytes, (std::vector<std::uint64_t>{4000, 3600}));
}

TEST(PartitionReplicated, ASharedStorageStaysWithOneRank) {
  const auto [base, view] = tied(800);
  Dict entries;
  entries.insert("weight", base);
  entries.insert("tied", view);
  entries.insert("other", floats(std::vector<float>(100, 1.0f)));
  const ReplicatedPartition partition = partition_replicated({{"model", Value::dict(std::move(entries))}}, 2);
  const Value& rank0 = partition.pieces[0][0].second;
  EXPECT_TRUE(rank0.as_dict().at("weight").is_tensor());
  EXPECT_TRUE(rank0.as_dict().at("tied").is_tensor());
  EXPECT_TRUE(partition.pieces[1][0].second.as_dict().at("tied").is_none());
  EXPECT_EQ(partition.bytes, (std::vector<std::uint64_t>{3200, 400}));
}

TEST(PartitionReplicated, FingerprintDependsOnStructureScalarsAndWorldButNotTensorValues) {
  const auto fingerprint = [](const Value& state, std::int64_t world) {
    return partition_replicated({{"model", state}}, world).fingerprint;
  };
  const Sha256Digest reference = fingerprint(model_state(), 2);
  EXPECT_EQ(reference, fingerprint(model_state(), 2));
  EXPECT_NE(reference, fingerprint(model_state(), 3));
  Dict changed_scalar = model_state().as_dict();
  changed_scalar.insert_or_assign("step", Value::integer(8));
  EXPECT_NE(reference, fingerprint(Value::dict(changed_scalar), 2));
  Dict changed_shape = model_state().as_dict();
  changed_shape.insert_or_assign("small", floats(std::vector<float>(301, 3.0f)));
  EXPECT_NE(reference, fingerprint(Value::dict(changed_shape), 2));
  Dict changed_values = model_state().as_dict();
  changed_values.insert_or_assign("small", floats(std::vector<float>(300, 9.0f)));
  EXPECT_EQ(reference, fingerprint(Value::dict(changed_values), 2));
}

TEST(PartitionReplicated, AWorldOfOneKeepsEverythingAndNoWorldIsRefused) {
  const ReplicatedPartition partition = partition_replicated({{"model", model_state()}}, 1);
  EXPECT_EQ(tensors_in(partition.pieces[0][0].second), 3u);
  EXPECT_ERROR_CODE(partition_replicated({{"model", model_state()}}, 0), ErrorCode::invalid_argument);
}

// ---- merge ---------------------------------------------------------------------------------

Value merge(const std::vector<Value>& pieces) {
  std::vector<const Value*> pointers;
  for (const auto& piece : pieces) pointers.push_back(&piece);
  return merge_replicated_pieces("model", pointers);
}

TEST(MergeReplicated, PiecesOfAPartitionMergeBackToTheState) {
  for (const std::int64_t world : {1, 2, 3, 5}) {
    const ReplicatedPartition partition = partition_replicated({{"model", model_state()}}, world);
    std::vector<Value> pieces;
    for (const auto& rank : partition.pieces) pieces.push_back(rank[0].second);
    const Value merged = merge(pieces);
    EXPECT_TRUE(equal_content(merged, model_state())) << "world " << world;
  }
}

TEST(MergeReplicated, TwoRanksHoldingOneTensorConflict) {
  Dict a, b;
  a.insert("w", floats({1}));
  b.insert("w", floats({1}));
  EXPECT_ERROR_CODE(merge({Value::dict(a), Value::dict(b)}), ErrorCode::shard_piece_conflict);
}

TEST(MergeReplicated, DifferentScalarsKindsKeysOrLengthsConflict) {
  const auto dict_of = [](std::string key, Value value) {
    Dict d;
    d.insert(std::move(key), std::move(value));
    return Value::dict(std::move(d));
  };
  EXPECT_ERROR_CODE(merge({dict_of("s", Value::integer(1)), dict_of("s", Value::integer(2))}),
                    ErrorCode::shard_piece_conflict);
  EXPECT_ERROR_CODE(merge({dict_of("s", Value::integer(1)), dict_of("s", Value::string("1"))}),
                    ErrorCode::shard_piece_conflict);
  EXPECT_ERROR_CODE(merge({dict_of("s", Value::integer(1)), dict_of("t", Value::integer(1))}),
                    ErrorCode::shard_piece_conflict);
  EXPECT_ERROR_CODE(merge({Value::list({Value::none()}), Value::list({Value::none(), Value::none()})}),
                    ErrorCode::shard_piece_conflict);
  // A tensor against a non-tensor that is not a hole.
  EXPECT_ERROR_CODE(merge({dict_of("w", floats({1})), dict_of("w", Value::integer(0))}),
                    ErrorCode::shard_piece_conflict);
}

TEST(MergeReplicated, HolesEverywhereStayNone) {
  const Value merged = merge({Value::list({Value::none(), floats({2})}), Value::list({Value::none(), Value::none()})});
  EXPECT_TRUE(merged.as_list()[0].is_none());
  EXPECT_TRUE(merged.as_list()[1].is_tensor());
}

// ---- the manifest's sharding field ------------------------------------------------------------

Manifest step_manifest() {
  Manifest m;
  m.kind = CheckpointKind::sharded;
  m.profile = "cpu-gloo-ddp-v1";
  Sharding s;
  s.world_size = 2;
  s.step = 6;
  s.replicated = {"model", "optimizer"};
  s.rank_local = {"sampler", "rng"};
  s.shards = {{0, 100, Sha256::of(testing::bytes_of("a"))}, {1, 90, Sha256::of(testing::bytes_of("b"))}};
  m.sharding = s;
  return m;
}

Value with(const Value& manifest, const std::string& field, Value value) {
  Dict top = manifest.as_dict();
  Dict sharding = top.at("sharding").as_dict();
  sharding.insert_or_assign(field, std::move(value));
  top.insert_or_assign("sharding", Value::dict(std::move(sharding)));
  return Value::dict(std::move(top));
}

TEST(ManifestSharding, StepManifestAndShardRoundTrip) {
  const Manifest read = Manifest::from_value(step_manifest().to_value());
  ASSERT_TRUE(read.sharding);
  EXPECT_EQ(read.kind, CheckpointKind::sharded);
  EXPECT_EQ(read.sharding->world_size, 2);
  EXPECT_EQ(read.sharding->step, 6);
  EXPECT_EQ(read.sharding->rank_local, (std::vector<std::string>{"sampler", "rng"}));
  ASSERT_EQ(read.sharding->shards.size(), 2u);
  EXPECT_EQ(read.sharding->shards[1].size, 90u);
  EXPECT_EQ(read.sharding->shards[1].sha256, Sha256::of(testing::bytes_of("b")));

  Manifest shard;
  shard.kind = CheckpointKind::shard;
  shard.sharding = Sharding{.world_size = 4, .step = 6, .rank = 3, .replicated = {}, .rank_local = {}, .shards = {}};
  const Manifest shard_read = Manifest::from_value(shard.to_value());
  EXPECT_EQ(shard_read.kind, CheckpointKind::shard);
  EXPECT_EQ(shard_read.sharding->rank, 3);
}

TEST(ManifestSharding, KindAndFieldMustGoTogether) {
  Manifest sharded_without = step_manifest();
  sharded_without.sharding.reset();
  EXPECT_ERROR_CODE(Manifest::from_value(sharded_without.to_value()), ErrorCode::schema_field_missing);
  Manifest resume_with = step_manifest();
  resume_with.kind = CheckpointKind::resume;
  EXPECT_ERROR_CODE(Manifest::from_value(resume_with.to_value()), ErrorCode::schema_field_unknown);
}

TEST(ManifestSharding, MalformedShardingIsRejectedNamingTheField) {
  const Value good = step_manifest().to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "world_size", Value::integer(0))), ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "world_size", Value::integer(3))), ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "step", Value::integer(-1))), ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "world_size", Value::string("2"))), ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "replicated", Value::list({Value::string("model"),
                                                                                Value::string("model")}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "replicated", Value::list({Value::string("rng")}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "extra", Value::integer(1))), ErrorCode::schema_field_unknown);
  // Names that would collide in the combined view ("<name>@rank<r>") or with the manifest.
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "replicated", Value::list({Value::string("sampler@rank0")}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "rank_local", Value::list({Value::string("holdpoint")}))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(with(good, "rank_local", Value::list({Value::string("")}))),
                    ErrorCode::schema_field_invalid);
  Dict top = good.as_dict();
  Dict sharding;
  for (const auto& [key, value] : top.at("sharding").as_dict()) {
    if (key.as_string() != "shards") sharding.insert(key, value);
  }
  top.insert_or_assign("sharding", Value::dict(std::move(sharding)));
  EXPECT_ERROR_CODE(Manifest::from_value(Value::dict(top)), ErrorCode::schema_field_missing);
}

TEST(ManifestSharding, ShardRecordsMustBeByRankWithPositiveSizes) {
  Manifest swapped = step_manifest();
  std::swap(swapped.sharding->shards[0], swapped.sharding->shards[1]);
  EXPECT_ERROR_CODE(Manifest::from_value(swapped.to_value()), ErrorCode::schema_field_invalid);
  Manifest empty = step_manifest();
  empty.sharding->shards[0].size = 0;
  EXPECT_ERROR_CODE(Manifest::from_value(empty.to_value()), ErrorCode::schema_field_invalid);
  Manifest shard;
  shard.kind = CheckpointKind::shard;
  shard.sharding = Sharding{.world_size = 2, .step = 6, .rank = 2, .replicated = {}, .rank_local = {}, .shards = {}};
  EXPECT_ERROR_CODE(Manifest::from_value(shard.to_value()), ErrorCode::schema_field_invalid);
}

}  // namespace
}  // namespace holdpoint
