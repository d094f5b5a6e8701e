// Configuration identity without LibTorch: the canonical JSON and its digests
// (byte for byte what Python's json.dumps(sort_keys=True, separators=(',', ':'),
// ensure_ascii=False) writes), the manifest layout, drift detection and the
// rejections, each asserting config_invalid (docs/resume-contract.md).
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "holdpoint/schema/config_identity.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using namespace std::string_literals;

Value dict_of(std::vector<std::pair<std::string, Value>> entries) {
  Dict dict;
  for (auto& [key, value] : entries) dict.insert(key, std::move(value));
  return Value::dict(std::move(dict));
}

Value scalar_tensor(double value) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(&value), sizeof value);
  return Value::tensor(TensorData::from_bytes(DType::float64, {}, bytes));
}

Value float_tensor(std::vector<std::int64_t> sizes, const std::vector<float>& values) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(values.data()),
                                         values.size() * sizeof(float));
  return Value::tensor(TensorData::from_bytes(DType::float32, std::move(sizes), bytes));
}

Value optimizer(double lr) {
  return dict_of({{"name", Value::string("sgd")},
                  {"defaults", dict_of({{"lr", Value::floating(lr)}, {"momentum", Value::floating(0.9)}})}});
}

TrainingConfig sample_config() {
  TrainingConfig config;
  config.load_bearing("batch_size", Value::integer(32)).load_bearing("optimizer", optimizer(0.1)).max_epochs(10);
  config.operational("log_dir", Value::string("/tmp/logs"));
  return config;
}

// ---- canonical JSON and digests ----------------------------------------------------------

TEST(ConfigIdentity, CanonicalJsonAndDigestMatchPython) {
  // Expected values from Python: json.dumps(fields, sort_keys=True,
  // separators=(",", ":"), ensure_ascii=False) and hashlib.sha256 of its UTF-8.
  const TrainingConfig config = sample_config();
  EXPECT_EQ(config.canonical_load_bearing(),
            R"({"batch_size":32,"optimizer":{"defaults":{"lr":0.1,"momentum":0.9},"name":"sgd"}})");
  EXPECT_EQ(config.load_bearing_digest().hex(), "736cdf4849a591a527022ec03199ca9937e3d4a91ea345f251206996b1d07a8e");
  EXPECT_EQ(config.canonical_operational(), R"({"log_dir":"/tmp/logs","max_epochs":10})");
  EXPECT_EQ(config.operational_digest().hex(), "da3a098f7e7cc926f5528152aa4bb82170440a1434b303a69a571cab5fef8e47");
}

TEST(ConfigIdentity, AnEmptyGroupIsTheEmptyObject) {
  const TrainingConfig config;
  EXPECT_EQ(config.canonical_load_bearing(), "{}");
  EXPECT_EQ(config.load_bearing_digest().hex(), "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
  EXPECT_EQ(config.operational_digest(), config.load_bearing_digest());
}

TEST(ConfigIdentity, FloatsAreWrittenAsPythonsRepr) {
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},
      {100.0, "100.0"},
      {1.5, "1.5"},
      {-2.5e-7, "-2.5e-07"},
      {0.0001, "0.0001"},
      {1e-5, "1e-05"},
      {1e15, "1000000000000000.0"},
      {1e16, "1e+16"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {5e-324, "5e-324"},
      {std::numeric_limits<double>::max(), "1.7976931348623157e+308"},
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {std::numeric_limits<double>::quiet_NaN(), "NaN"},
      {std::numeric_limits<double>::infinity(), "Infinity"},
      {-std::numeric_limits<double>::infinity(), "-Infinity"},
  };
  for (const auto& [value, text] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(canonical_json(Value::floating(value)), text);
  }
  // An int stays an int: 1 and 1.0 are different configurations.
  EXPECT_EQ(canonical_json(Value::integer(1)), "1");
  EXPECT_EQ(canonical_json(Value::integer(std::numeric_limits<std::int64_t>::min())), "-9223372036854775808");
}

TEST(ConfigIdentity, StringsAreEscapedAsJsonDumpsEscapesThem) {
  const std::string text = "q\"b\\s/\b\f\n\r\t\0\x01\x1f\x7f \xC3\xA9 \xE2\x80\xA8 \xF0\x9F\x98\x80"s;
  EXPECT_EQ(canonical_json(Value::string(text)),
            "\"q\\\"b\\\\s/\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f\x7f \xC3\xA9 \xE2\x80\xA8 \xF0\x9F\x98\x80\""s);
}

TEST(ConfigIdentity, KeysAreSortedByCodePointAndContainersNest) {
  EXPECT_EQ(canonical_json(dict_of({{"b", Value::integer(1)},
                                    {"B", Value::integer(2)},
                                    {"a", Value::integer(3)},
                                    {"\xC3\xA9", Value::integer(4)},
                                    {"aa", Value::integer(5)}})),
            "{\"B\":2,\"a\":3,\"aa\":5,\"b\":1,\"\xC3\xA9\":4}");
  // Tuples are JSON arrays, as json.dumps writes them; an OrderedDict sorts like a dict.
  Dict ordered;
  ordered.insert("z", Value::none());
  ordered.insert("x", Value::boolean(false));
  EXPECT_EQ(canonical_json(Value::list({Value::integer(1),
                                        Value::list({Value::floating(2.5), Value::list()}),
                                        dict_of({{"x", Value::none()}}),
                                        Value::tuple({Value::boolean(true), Value::boolean(false)}),
                                        Value::ordered_dict(std::move(ordered))})),
            R"([1,[2.5,[]],{"x":null},[true,false],{"x":false,"z":null}])");
}

Value int_keyed(std::vector<std::pair<std::int64_t, Value>> entries) {
  Dict dict;
  for (auto& [key, value] : entries) dict.insert(key, std::move(value));
  return Value::dict(std::move(dict));
}

// Issue 35: int keys were sorted as text ("10" before "2"), so an int-keyed
// config had a digest other than the one Python's json.dumps gives.
TEST(ConfigIdentity, IntKeysSortByValueAsPythonSortsThem) {
  TrainingConfig config;
  config.load_bearing("class_weights", int_keyed({{10, Value::floating(1.5)},
                                                   {2, Value::floating(0.5)},
                                                   {-1, Value::floating(0.0)}}))
      .load_bearing("name", Value::string("run"));
  // From Python: json.dumps(fields, sort_keys=True, separators=(",", ":"),
  // ensure_ascii=False) and hashlib.sha256 of its UTF-8.
  EXPECT_EQ(config.canonical_load_bearing(), R"({"class_weights":{"-1":0.0,"2":0.5,"10":1.5},"name":"run"})");
  EXPECT_EQ(config.load_bearing_digest().hex(), "f02c6f79c2e896561640c7aaf6c58a0f4512138c50ee40dbe73c8d7220cc41c0");
  // The first rule, kept to check files written under it.
  EXPECT_EQ(config.canonical_load_bearing(ConfigDigestVersion::text_key_order),
            R"({"class_weights":{"-1":0.0,"10":1.5,"2":0.5},"name":"run"})");
  EXPECT_TRUE(config.digest_depends_on_version());
}

TEST(ConfigIdentity, IntKeysComeBeforeStrKeysAndNoneIsLost) {
  // Python's sort refuses a dict mixing int and str keys; holdpoint puts the
  // ints first, as sorted(key=lambda k: (isinstance(k, str), k)) does. The
  // first rule kept only one of an int and a str key with the same text.
  Dict mixed;
  mixed.insert("b", Value::integer(1));
  mixed.insert(10, Value::string("ten"));
  mixed.insert(2, Value::string("two"));
  mixed.insert("1", Value::string("str one"));
  mixed.insert(1, Value::string("int one"));
  const Value value = Value::dict(std::move(mixed));
  EXPECT_EQ(canonical_json(value), R"({"1":"int one","2":"two","10":"ten","1":"str one","b":1})");
  EXPECT_EQ(canonical_json(value, ConfigDigestVersion::text_key_order),
            R"({"1":"str one","10":"ten","2":"two","b":1})");
}

TEST(ConfigIdentity, TheKeyOrderMattersOnlyWhereTextAndValueOrderDiffer) {
  EXPECT_FALSE(sample_config().digest_depends_on_version());
  TrainingConfig config;
  config.load_bearing("milestones",
                      int_keyed({{1, Value::integer(0)}, {3, Value::integer(1)}, {7, Value::integer(2)}}));
  EXPECT_FALSE(config.digest_depends_on_version());
  config.operational("buckets", int_keyed({{9, Value::none()}, {100, Value::none()}}));
  EXPECT_TRUE(config.digest_depends_on_version());
  EXPECT_EQ(config.load_bearing_digest(ConfigDigestVersion::text_key_order), config.load_bearing_digest());
  EXPECT_NE(config.operational_digest(ConfigDigestVersion::text_key_order), config.operational_digest());
}

TEST(ConfigIdentity, InsertionOrderDoesNotChangeTheDigest) {
  TrainingConfig a, b;
  a.load_bearing("lr", Value::floating(0.1)).load_bearing("batch_size", Value::integer(8));
  b.load_bearing("batch_size", Value::integer(8)).load_bearing("lr", Value::floating(0.1));
  EXPECT_EQ(a.load_bearing_digest(), b.load_bearing_digest());
}

TEST(ConfigIdentity, AFieldSetTwiceKeepsTheLastValue) {
  TrainingConfig config;
  config.load_bearing("lr", Value::floating(0.1)).load_bearing("lr", Value::floating(0.2));
  EXPECT_EQ(config.load_bearing_fields().size(), 1u);
  EXPECT_EQ(config.canonical_load_bearing(), R"({"lr":0.2})");
}

TEST(ConfigIdentity, MaxEpochsIsOperational) {
  TrainingConfig config;
  EXPECT_FALSE(config.max_epochs().has_value());
  const Sha256Digest load_bearing = config.load_bearing_digest();
  config.max_epochs(12);
  EXPECT_EQ(config.max_epochs(), 12);
  EXPECT_EQ(config.canonical_operational(), R"({"max_epochs":12})");
  EXPECT_EQ(config.load_bearing_digest(), load_bearing);
  config.max_epochs(0);
  EXPECT_EQ(config.max_epochs(), 0);
}

// ---- the manifest layout -----------------------------------------------------------------

TEST(ConfigIdentity, ToValueAndFromValueRoundTrip) {
  const TrainingConfig written = sample_config();
  const Value value = written.to_value();
  ASSERT_TRUE(value.is_dict());
  EXPECT_EQ(value.as_dict().size(), 2u);
  EXPECT_TRUE(equal_content(value.as_dict().at("load_bearing"), Value::dict(written.load_bearing_fields())));
  EXPECT_TRUE(equal_content(value.as_dict().at("operational"), Value::dict(written.operational_fields())));
  const TrainingConfig read = TrainingConfig::from_value(value);
  EXPECT_EQ(read.canonical_load_bearing(), written.canonical_load_bearing());
  EXPECT_EQ(read.canonical_operational(), written.canonical_operational());
  EXPECT_EQ(read.max_epochs(), 10);
  EXPECT_TRUE(equal_content(read.to_value(), value));
}

TEST(ConfigIdentity, FromValueAcceptsMissingGroups) {
  const TrainingConfig read = TrainingConfig::from_value(Value::dict());
  EXPECT_TRUE(read.load_bearing_fields().empty());
  EXPECT_TRUE(read.operational_fields().empty());
}

TEST(ConfigIdentity, FloatsSavedAsZeroDimTensorsReadBackAsFloats) {
  // torch 1.13 compatible files carry floats as 0-d float64 tensors.
  const Value value = dict_of(
      {{"load_bearing", dict_of({{"lr", scalar_tensor(0.25)},
                                 {"betas", Value::tuple({scalar_tensor(0.9), scalar_tensor(0.999)})},
                                 {"nested", dict_of({{"eps", scalar_tensor(1e-8)}})}})},
       {"operational", Value::dict()}});
  const TrainingConfig read = TrainingConfig::from_value(value);
  EXPECT_EQ(read.canonical_load_bearing(), R"({"betas":[0.9,0.999],"lr":0.25,"nested":{"eps":1e-08}})");
  EXPECT_TRUE(read.load_bearing_fields().at("betas").is_tuple());
}

// ---- drift --------------------------------------------------------------------------------

TEST(ConfigComparison, IdenticalConfigsDoNotDrift) {
  const ConfigComparison result = compare_configs(sample_config(), sample_config());
  EXPECT_TRUE(result.drifted.empty());
  EXPECT_FALSE(result.max_epochs.has_value());
}

TEST(ConfigComparison, EveryDriftedFieldIsNamedByItsPathInOrder) {
  const TrainingConfig saved = sample_config();
  TrainingConfig live = sample_config();
  live.load_bearing("optimizer", optimizer(0.2))
      .load_bearing("batch_size", Value::integer(64))
      .load_bearing("seed", Value::integer(7));
  const ConfigComparison result = compare_configs(saved, live);
  EXPECT_EQ(result.drifted, (std::vector<std::string>{"batch_size", "optimizer.defaults.lr", "seed"}));
}

TEST(ConfigComparison, RemovedFieldsAndChangedTypesDrift) {
  TrainingConfig saved, live;
  saved.load_bearing("clip", Value::floating(1.0)).load_bearing("steps", Value::integer(3));
  saved.load_bearing("schedule", Value::list({Value::integer(1), Value::integer(2)}));
  live.load_bearing("steps", Value::floating(3.0));
  live.load_bearing("schedule", Value::list({Value::integer(1), Value::integer(2), Value::integer(3)}));
  EXPECT_EQ(compare_configs(saved, live).drifted, (std::vector<std::string>{"clip", "schedule", "steps"}));
}

TEST(ConfigComparison, OperationalChangesDoNotDrift) {
  TrainingConfig live = sample_config();
  live.operational("log_dir", Value::string("/elsewhere")).operational("save_every", Value::integer(5));
  const ConfigComparison result = compare_configs(sample_config(), live);
  EXPECT_TRUE(result.drifted.empty());
  EXPECT_FALSE(result.max_epochs.has_value());
}

TEST(ConfigComparison, MaxEpochsGrowthIsReportedAndIsNoDrift) {
  TrainingConfig live = sample_config();
  live.max_epochs(15);
  const ConfigComparison result = compare_configs(sample_config(), live);
  EXPECT_TRUE(result.drifted.empty());
  ASSERT_TRUE(result.max_epochs.has_value());
  EXPECT_EQ(result.max_epochs->saved, 10);
  EXPECT_EQ(result.max_epochs->live, 15);
}

TEST(ConfigComparison, MaxEpochsShrinkIsReportedForTheCallerToRefuse) {
  TrainingConfig live = sample_config();
  live.max_epochs(9);
  const ConfigComparison result = compare_configs(sample_config(), live);
  ASSERT_TRUE(result.max_epochs.has_value());
  EXPECT_EQ(result.max_epochs->saved, 10);
  EXPECT_EQ(result.max_epochs->live, 9);
}

TEST(ConfigComparison, MaxEpochsOnOneSideOnlyIsNoChange) {
  TrainingConfig without;
  EXPECT_FALSE(compare_configs(sample_config(), without).max_epochs.has_value());
  EXPECT_FALSE(compare_configs(without, sample_config()).max_epochs.has_value());
}

// ---- rejections ---------------------------------------------------------------------------

TEST(ConfigIdentityRejects, ATensorAsAFieldValue) {
  TrainingConfig config;
  EXPECT_ERROR_CODE(config.load_bearing("weights", float_tensor({2}, {1, 2})), ErrorCode::config_invalid);
  // Not even the 0-d float64 tensor a stored config may hold: callers pass numbers.
  EXPECT_ERROR_CODE(config.operational("lr", scalar_tensor(0.1)), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, BytesAsAFieldValue) {
  TrainingConfig config;
  EXPECT_ERROR_CODE(config.load_bearing("salt", Value::bytes("x")), ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(config.operational("blob", Value::bytes("")), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, ATensorNestedInAListOrTuple) {
  TrainingConfig config;
  EXPECT_ERROR_CODE(config.load_bearing("list", Value::list({Value::integer(1), float_tensor({1}, {1})})),
                    ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(config.operational("tuple", Value::tuple({float_tensor({1}, {1})})), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, BytesNestedInADict) {
  TrainingConfig config;
  EXPECT_ERROR_CODE(config.load_bearing("dict", dict_of({{"inner", dict_of({{"key", Value::bytes("k")}})}})),
                    ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, WithAMessageNamingTheFieldsPath) {
  TrainingConfig config;
  try {
    config.load_bearing("optimizer", dict_of({{"defaults", dict_of({{"salt", Value::bytes("x")}})}}));
    FAIL() << "bytes accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::config_invalid);
    EXPECT_NE(error.detail().find("config.load_bearing.optimizer.defaults.salt"), std::string::npos)
        << error.detail();
  }
}

TEST(ConfigIdentityRejects, ARejectedFieldLeavesTheConfigAsItWas) {
  TrainingConfig config = sample_config();
  const std::string before = config.canonical_load_bearing();
  EXPECT_ERROR_CODE(config.load_bearing("batch_size", Value::bytes("64")), ErrorCode::config_invalid);
  EXPECT_EQ(config.canonical_load_bearing(), before);
}

TEST(ConfigIdentityRejects, ANegativeMaxEpochs) {
  TrainingConfig config = sample_config();
  EXPECT_ERROR_CODE(config.max_epochs(-1), ErrorCode::config_invalid);
  EXPECT_EQ(config.max_epochs(), 10);
}

TEST(ConfigIdentityRejects, CanonicalJsonOfBytes) {
  EXPECT_ERROR_CODE(canonical_json(Value::bytes("")), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, CanonicalJsonOfATensor) {
  EXPECT_ERROR_CODE(canonical_json(float_tensor({}, {1})), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AStoredConfigThatIsNotADict) {
  EXPECT_ERROR_CODE(TrainingConfig::from_value(Value::list()), ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(TrainingConfig::from_value(Value::none()), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AGroupOtherThanLoadBearingAndOperational) {
  EXPECT_ERROR_CODE(TrainingConfig::from_value(dict_of({{"hyper", Value::dict()}})), ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(TrainingConfig::from_value(dict_of({{"Operational", Value::dict()}})), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AGroupWithAnIntegerKey) {
  Dict by_int;
  by_int.insert(0, Value::dict());
  EXPECT_ERROR_CODE(TrainingConfig::from_value(Value::dict(std::move(by_int))), ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AGroupThatIsNotADict) {
  EXPECT_ERROR_CODE(TrainingConfig::from_value(dict_of({{"load_bearing", Value::list()}})),
                    ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(TrainingConfig::from_value(dict_of({{"operational", Value::none()}})),
                    ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AFieldWithAnIntegerName) {
  Dict fields;
  fields.insert(3, Value::integer(1));
  EXPECT_ERROR_CODE(TrainingConfig::from_value(dict_of({{"load_bearing", Value::dict(std::move(fields))}})),
                    ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AMaxEpochsSetAsAnythingButANonNegativeInt) {
  // max_epochs() reads it back as an int: a float, a str or a negative count is
  // refused when set, not later when read.
  TrainingConfig config = sample_config();
  EXPECT_ERROR_CODE(config.operational("max_epochs", Value::floating(10)), ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(config.operational("max_epochs", Value::string("10")), ErrorCode::config_invalid);
  EXPECT_ERROR_CODE(config.operational("max_epochs", Value::integer(-2)), ErrorCode::config_invalid);
  EXPECT_EQ(config.max_epochs(), 10);
  config.operational("max_epochs", Value::integer(12));
  EXPECT_EQ(config.max_epochs(), 12);
}

TEST(ConfigIdentityRejects, AStoredFieldErrorNamesTheFieldWhereTheFileHasIt) {
  try {
    TrainingConfig::from_value(dict_of({{"load_bearing", dict_of({{"lr", Value::bytes("x")}})}}),
                               "manifest.config");
    FAIL() << "a bytes field was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::config_invalid);
    EXPECT_NE(std::string(error.what()).find("manifest.config.load_bearing.lr"), std::string::npos) << error.what();
  }
}

TEST(ConfigIdentityRejects, AStoredMaxEpochsThatIsAFloat) {
  EXPECT_ERROR_CODE(
      TrainingConfig::from_value(dict_of({{"operational", dict_of({{"max_epochs", Value::floating(10)}})}})),
      ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AStoredMaxEpochsThatIsAStr) {
  EXPECT_ERROR_CODE(
      TrainingConfig::from_value(dict_of({{"operational", dict_of({{"max_epochs", Value::string("10")}})}})),
      ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AStoredZeroDimTensorOtherThanFloat64) {
  // Only the torch 1.13 encoding of a float is read as a number.
  EXPECT_ERROR_CODE(
      TrainingConfig::from_value(dict_of({{"load_bearing", dict_of({{"lr", float_tensor({}, {0.5f})}})}})),
      ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, AStoredTensorWithDimensions) {
  EXPECT_ERROR_CODE(
      TrainingConfig::from_value(dict_of({{"load_bearing", dict_of({{"w", float_tensor({1}, {0.5f})}})}})),
      ErrorCode::config_invalid);
}

TEST(ConfigIdentityRejects, StoredBytes) {
  EXPECT_ERROR_CODE(TrainingConfig::from_value(dict_of({{"operational", dict_of({{"key", Value::bytes("k")}})}})),
                    ErrorCode::config_invalid);
}

}  // namespace
}  // namespace holdpoint
