// The restricted pickle VM: what honest torch.save output it accepts, and
// every rejection of the format reference §7.4 ("Pickle", "Persistent id",
// "Tensor geometry") with its own error code.
#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <unordered_map>
#include <vector>

#include "format/pickle/pickle_opcodes.h"
#include "holdpoint/base/error.h"
#include "support/dropped_tensors.h"
#include "support/test_support.h"
#include "unit/pickle_builder.h"

namespace holdpoint::format {
namespace {

using holdpoint::testing::MemoryStorages;
using holdpoint::testing::PickleBuilder;
namespace op = pickle_op;

PickleResult read(const PickleBuilder& pickle, MemoryStorages& storages, const Limits& limits = {},
                  const PickleOptions& options = {}) {
  const auto bytes = pickle.bytes();
  return read_pickle(bytes, storages, limits, options);
}

PickleResult read(const PickleBuilder& pickle, const Limits& limits = {}, const PickleOptions& options = {}) {
  MemoryStorages storages;
  storages.fabricate_missing(1 << 20);
  return read(pickle, storages, limits, options);
}

Value read_value(const PickleBuilder& pickle) { return read(pickle).root; }

// One float32 tensor of `numel` elements 0, 1, 2, ... under key "0".
MemoryStorages float_storage(std::size_t numel, const std::string& key = "0") {
  MemoryStorages storages;
  std::vector<float> values(numel);
  for (std::size_t i = 0; i < numel; ++i) values[i] = static_cast<float>(i);
  std::vector<std::byte> bytes(numel * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  storages.add(key, bytes);
  return storages;
}

float element(const TensorData& tensor, std::size_t i) {
  const auto bytes = tensor.contiguous_bytes();
  float value;
  std::memcpy(&value, bytes.data() + i * 4, 4);
  return value;
}

// ==== accepted forms ========================================================================

TEST(PickleReader, ReadsGoldenMinimalStateDict) {
  // format reference Appendix A.1: OrderedDict(w=float32[2]) with SETITEM, no memo.
  PickleBuilder p;
  p.proto().ordered_dict().str("w").tensor("FloatStorage", "0", 2, 0, {2}, {1}).setitem().stop();
  auto storages = float_storage(2);
  const PickleResult result = read(p, storages);
  ASSERT_TRUE(result.root.is_ordered_dict());
  const TensorData& w = result.root.as_dict().at("w").as_tensor();
  EXPECT_EQ(w.dtype, DType::float32);
  EXPECT_EQ(w.sizes, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(element(w, 1), 1.0f);
  EXPECT_EQ(result.protocol, 2);
  EXPECT_EQ(result.tensor_count, 1u);
  EXPECT_EQ(result.storage_count, 1u);
  EXPECT_EQ(result.consumed, p.size());
  EXPECT_FALSE(result.uses_binfloat);
}

TEST(PickleReader, ReadsEveryScalarOpcode) {
  PickleBuilder p;
  p.proto().mark();
  p.none().boolean(true).boolean(false);
  p.op(op::BININT1).u8(200).op(op::BININT2).le(60000, 2).op(op::BININT).le(static_cast<std::uint32_t>(-7), 4);
  p.long1(std::int64_t{1} << 40, 6).long1(-1, 1).long1(0, 0).long1(INT64_MIN, 8).long1(INT64_MAX, 8);
  p.op(op::BINFLOAT).u8(0x3f).u8(0xf8).le(0, 6);  // 1.5 big-endian
  p.str("h\xc3\xa9llo").op(op::SHORT_BINUNICODE).u8(2).raw("ab").op(op::BINUNICODE8).le(1, 8).raw("z");
  p.op(op::SHORT_BINSTRING).u8(3).raw("py2").op(op::BINSTRING).le(2, 4).raw("s2");
  p.op(op::SHORT_BINBYTES).u8(2).raw(std::string_view("\x00\xff", 2)).op(op::BINBYTES).le(1, 4).raw("b");
  p.tuple().stop();
  const PickleResult result = read(p);
  EXPECT_TRUE(result.uses_binfloat);
  const auto& items = result.root.as_list();
  ASSERT_EQ(items.size(), 19u);
  EXPECT_TRUE(items[0].is_none());
  EXPECT_TRUE(items[1].as_bool());
  EXPECT_FALSE(items[2].as_bool());
  EXPECT_EQ(items[3].as_int(), 200);
  EXPECT_EQ(items[4].as_int(), 60000);
  EXPECT_EQ(items[5].as_int(), -7);
  EXPECT_EQ(items[6].as_int(), std::int64_t{1} << 40);
  EXPECT_EQ(items[7].as_int(), -1);
  EXPECT_EQ(items[8].as_int(), 0);
  EXPECT_EQ(items[9].as_int(), INT64_MIN);
  EXPECT_EQ(items[10].as_int(), INT64_MAX);
  EXPECT_EQ(items[11].as_double(), 1.5);
  EXPECT_EQ(items[12].as_string(), "h\xc3\xa9llo");
  EXPECT_EQ(items[13].as_string(), "ab");
  EXPECT_EQ(items[14].as_string(), "z");
  EXPECT_EQ(items[15].as_string(), "py2");
  EXPECT_EQ(items[16].as_string(), "s2");
  EXPECT_EQ(items[17].as_bytes(), std::string_view("\x00\xff", 2));
  EXPECT_EQ(items[18].as_bytes(), "b");
}

TEST(PickleReader, ReadsProtocolZeroAndOneTextIntegers) {
  // No PROTO: protocol 0/1 files use INT ("I01" is True) and LONG ("L...L").
  PickleBuilder p;
  p.mark().raw("I00\n").op(op::INT).raw("01\n").op(op::INT).raw("42\n").op(op::INT).raw("-7\n");
  p.op(op::LONG).raw("123456789012L\n").op(op::LONG).raw("-5L\n").tuple().stop();
  const PickleResult result = read(p);
  EXPECT_EQ(result.protocol, 0);
  const auto& items = result.root.as_list();
  ASSERT_EQ(items.size(), 6u);
  EXPECT_FALSE(items[0].as_bool());
  EXPECT_TRUE(items[1].as_bool());
  EXPECT_EQ(items[2].as_int(), 42);
  EXPECT_EQ(items[3].as_int(), -7);
  EXPECT_EQ(items[4].as_int(), 123456789012);
  EXPECT_EQ(items[5].as_int(), -5);
}

TEST(PickleReader, ReadsProtocolFourFramesMemoizeAndStackGlobal) {
  // The shape of gopickle_t1.13_zip_int8_proto4: FRAME, SHORT_BINUNICODE,
  // MEMOIZE and STACK_GLOBAL instead of GLOBAL.
  PickleBuilder body;
  const auto short_str = [&](std::string_view s) {
    body.op(op::SHORT_BINUNICODE).u8(static_cast<std::uint8_t>(s.size())).raw(s).op(op::MEMOIZE);
  };
  short_str("torch._utils");
  short_str("_rebuild_tensor_v2");
  body.op(op::STACK_GLOBAL).op(op::MEMOIZE).mark().mark();
  short_str("storage");
  short_str("torch");
  short_str("CharStorage");
  body.op(op::STACK_GLOBAL).op(op::MEMOIZE);
  short_str("0");
  short_str("cpu");
  body.integer(3).tuple().op(op::MEMOIZE).binpersid().integer(0).integer(3).tuple1().integer(1).tuple1();
  body.boolean(false);
  short_str("collections");
  short_str("OrderedDict");
  body.op(op::STACK_GLOBAL).empty_tuple().reduce().tuple().reduce().stop();
  PickleBuilder p;
  p.proto(4).op(op::FRAME).le(body.size(), 8);
  for (std::byte b : body.bytes()) p.u8(std::to_integer<std::uint8_t>(b));
  MemoryStorages storages;
  storages.add("0", holdpoint::testing::bytes_of("\x01\x02\x03"));
  const PickleResult result = read(p, storages);
  EXPECT_EQ(result.protocol, 4);
  EXPECT_EQ(result.root.as_tensor().dtype, DType::int8);
  EXPECT_EQ(result.root.as_tensor().contiguous_bytes(), holdpoint::testing::bytes_of("\x01\x02\x03"));
}

TEST(PickleReader, AcceptsProtocolsTwoToFive) {
  for (int version : {2, 3, 4, 5}) {
    SCOPED_TRACE(version);
    PickleBuilder p;
    p.proto(version).none().stop();
    EXPECT_EQ(read(p).protocol, version);
  }
}

TEST(PickleReader, ReadsStateDictMetadataBuild) {
  // nn.Module.state_dict(): BUILD of {'_metadata': OrderedDict(prefix -> {'version': int})}.
  PickleBuilder p;
  p.proto().global("collections", "OrderedDict").binput(0).empty_tuple().reduce().binput(1);
  p.str("w").tensor("FloatStorage", "0", 2, 0, {2}, {1}).setitem();
  p.empty_dict().str("_metadata").binget(0).empty_tuple().reduce();
  p.mark().str("").empty_dict().str("version").integer(1).setitem();
  p.str("fc").empty_dict().str("version").integer(2).setitem().setitems();
  p.setitem().build().stop();
  const Value root = read_value(p);
  ASSERT_TRUE(root.is_ordered_dict());
  ASSERT_TRUE(root.as_dict().metadata());
  const Value& metadata = *root.as_dict().metadata();
  EXPECT_EQ(metadata.as_dict().at("fc").as_dict().at("version").as_int(), 2);
  EXPECT_EQ(metadata.as_dict().at("").as_dict().at("version").as_int(), 1);
}

TEST(PickleReader, TiedTensorsShareOneObjectThroughBinget) {
  PickleBuilder p;
  p.proto().empty_dict().mark().str("a").tensor("FloatStorage", "0", 4, 0, {4}, {1}).binput(0);
  p.str("b").binget(0).setitems().stop();
  auto storages = float_storage(4);
  const PickleResult result = read(p, storages);
  EXPECT_EQ(result.root.as_dict().at("a").tensor_ptr(), result.root.as_dict().at("b").tensor_ptr());
  EXPECT_EQ(result.tensor_count, 1u);
}

TEST(PickleReader, ViewsOfOneKeyShareOneStorage) {
  // format reference §2.3: t, t[1:3] and t.view(2,2).t() all name key '0'.
  PickleBuilder p;
  p.proto().mark();
  p.tensor("FloatStorage", "0", 4, 0, {4}, {1});
  p.tensor("FloatStorage", "0", 4, 1, {2}, {1});
  p.tensor("FloatStorage", "0", 4, 0, {2, 2}, {1, 2});
  p.tuple().stop();
  auto storages = float_storage(4);
  const PickleResult result = read(p, storages);
  EXPECT_EQ(storages.resolve_calls, 1);
  EXPECT_EQ(result.storage_count, 1u);
  EXPECT_EQ(result.tensor_count, 3u);
  const auto& items = result.root.as_list();
  EXPECT_EQ(items[0].as_tensor().storage, items[1].as_tensor().storage);
  EXPECT_EQ(items[0].as_tensor().storage, items[2].as_tensor().storage);
  EXPECT_EQ(element(items[1].as_tensor(), 0), 1.0f);
  EXPECT_FALSE(items[2].as_tensor().is_contiguous());
  EXPECT_EQ(element(items[2].as_tensor(), 1), 2.0f);  // [[0,2],[1,3]] in C order
}

TEST(PickleReader, ReadsZeroDimensionalAndEmptyTensors) {
  PickleBuilder p;
  p.proto().mark();
  p.tensor("FloatStorage", "0", 3, 2, {}, {});          // 0-d at the last element
  p.tensor("FloatStorage", "0", 3, 3, {0, 3}, {3, 1});  // empty, offset == storage numel
  p.tensor("FloatStorage", "0", 3, 0, {std::int64_t{1} << 40, 0}, {1, 1});
  p.tuple().stop();
  auto storages = float_storage(3);
  const Value root = read(p, storages).root;
  const auto& items = root.as_list();
  EXPECT_EQ(items[0].as_tensor().numel(), 1);
  EXPECT_EQ(element(items[0].as_tensor(), 0), 2.0f);
  EXPECT_EQ(items[1].as_tensor().numel(), 0);
  EXPECT_EQ(items[2].as_tensor().numel(), 0);
}

TEST(PickleReader, ReadsRebuildParameter) {
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_parameter");
  p.tensor("FloatStorage", "0", 2, 0, {2}, {1}).boolean(true).ordered_dict().tuple3().reduce().stop();
  auto storages = float_storage(2);
  const Value root = read(p, storages).root;
  const TensorData& t = root.as_tensor();
  EXPECT_TRUE(t.is_parameter);
  EXPECT_TRUE(t.requires_grad);
}

TEST(PickleReader, ReadsRebuildTensorV3WithUntypedStorage) {
  // torch 2.x dtypes without a storage class: UntypedStorage numel is bytes.
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_tensor_v3").mark().pid("UntypedStorage", "0", 6).integer(0);
  p.int_tuple({3}).int_tuple({1}).boolean(false).ordered_dict().global("torch", "uint16").tuple().reduce().stop();
  MemoryStorages storages;
  storages.add("0", holdpoint::testing::bytes_of(std::string_view("\x01\x00\x02\x00\x03\x00", 6)));
  const Value root = read(p, storages).root;
  const TensorData& t = root.as_tensor();
  EXPECT_EQ(t.dtype, DType::uint16);
  EXPECT_EQ(t.numel(), 3);

  PickleBuilder q;  // the storage.UntypedStorage spelling and a float8 dtype
  q.proto().global("torch._utils", "_rebuild_tensor_v3").mark();
  q.mark().str("storage").global("torch.storage", "UntypedStorage").str("0").str("cpu").integer(2).tuple();
  q.binpersid().integer(0).int_tuple({2}).int_tuple({1}).boolean(true).ordered_dict();
  q.global("torch", "float8_e4m3fn").empty_dict().tuple().reduce().stop();
  const Value f8_root = read(q).root;
  const TensorData& f8 = f8_root.as_tensor();
  EXPECT_EQ(f8.dtype, DType::float8_e4m3fn);
  EXPECT_TRUE(f8.requires_grad);
}

TEST(PickleReader, ReadsPython2OrderedDictReduce) {
  // Python 2's OrderedDict.__reduce__: OrderedDict([[key, value], ...]).
  PickleBuilder lists;
  lists.proto().global("collections", "OrderedDict").empty_list().mark();
  lists.empty_list().mark().str("a").integer(1).appends().empty_list().mark().str("b").integer(2).appends();
  lists.appends().tuple1().reduce().stop();
  const Value root = read_value(lists);
  ASSERT_TRUE(root.is_ordered_dict());
  EXPECT_EQ(root.as_dict().at("a").as_int(), 1);
  EXPECT_EQ(root.as_dict().at("b").as_int(), 2);
  PickleBuilder tuples;  // a tuple of (key, value) tuples, with a Python 2 str key
  tuples.proto().global("collections", "OrderedDict").mark().str("a").integer(1).tuple2();
  tuples.op(op::SHORT_BINSTRING).u8(1).raw("b").integer(2).tuple2().tuple().tuple1().reduce().stop();
  EXPECT_TRUE(equal_content(read_value(tuples), root));
}

TEST(PickleReader, ReadsTorch2MultiStepLrCounterAsADictOfCounts) {
  // torch 2.x: MultiStepLR's milestones Counter({2: 1, 5: 2}) = Counter.__reduce__ (cls, (dict,)).
  PickleBuilder p;
  p.proto().empty_dict().str("milestones").global("collections", "Counter").empty_dict().mark();
  p.integer(2).integer(1).integer(5).integer(2).setitems().tuple1().reduce().setitem().stop();
  const Value root = read_value(p);
  const Value& milestones = root.as_dict().at("milestones");
  ASSERT_TRUE(milestones.is_dict());
  EXPECT_FALSE(milestones.is_ordered_dict());
  ASSERT_EQ(milestones.as_dict().size(), 2u);
  EXPECT_EQ(milestones.as_dict().at(DictKey(2)).as_int(), 1);
  EXPECT_EQ(milestones.as_dict().at(DictKey(5)).as_int(), 2);
  PickleBuilder empty;
  empty.proto().global("collections", "Counter").empty_tuple().reduce().stop();
  EXPECT_TRUE(read_value(empty).is_dict());
  EXPECT_TRUE(read_value(empty).as_dict().empty());
}

TEST(PickleReader, RejectsCountersThatAreNotADictOfIntCounts) {
  PickleBuilder list_argument;  // Counter([2, 5]) counts an iterable: a call, not data
  list_argument.proto().global("collections", "Counter").empty_list().integer(2).append().tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read_value(list_argument), ErrorCode::pickle_call_args_invalid);
  PickleBuilder float_count;
  float_count.proto().global("collections", "Counter").empty_dict().integer(2).str("x").setitem();
  float_count.tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read_value(float_count), ErrorCode::pickle_call_args_invalid);
  PickleBuilder two_arguments;
  two_arguments.proto().global("collections", "Counter").empty_dict().empty_dict().tuple2().reduce().stop();
  EXPECT_ERROR_CODE(read_value(two_arguments), ErrorCode::pickle_call_args_invalid);
  PickleBuilder other_collection;  // only OrderedDict and Counter are allowlisted
  other_collection.proto().global("collections", "defaultdict").empty_tuple().reduce().stop();
  EXPECT_ERROR_CODE(read_value(other_collection), ErrorCode::pickle_global_forbidden);
}

TEST(PickleReader, ReadsCodecsEncodeAsBytes) {
  // bytes at protocol 2: _codecs.encode('\x00\xe9\xff', 'latin1').
  PickleBuilder p;
  p.proto().global("_codecs", "encode").str(std::string_view("a\x00\xc3\xa9\xc3\xbf", 6)).str("latin1");
  p.tuple2().reduce().stop();
  EXPECT_EQ(read_value(p).as_bytes(), std::string_view("a\x00\xe9\xff", 4));
}

TEST(PickleReader, ReadsIntKeysNestedContainersAndAppend) {
  // Optimizer state: {'state': {0: {...}}, 'param_groups': [{'params': [0, 1]}]}.
  PickleBuilder p;
  p.proto().empty_dict().mark().str("state").empty_dict().integer(0).empty_dict().str("step").integer(3).setitem();
  p.setitem().str("param_groups").empty_list().empty_dict().str("params").empty_list().integer(0).append();
  p.integer(1).append().setitem().append().setitems().stop();
  const Value root = read_value(p);
  EXPECT_EQ(root.as_dict().at("state").as_dict().at(DictKey(0)).as_dict().at("step").as_int(), 3);
  const auto& groups = root.as_dict().at("param_groups").as_list();
  EXPECT_EQ(groups[0].as_dict().at("params").as_list()[1].as_int(), 1);
}

TEST(PickleReader, BingetOfImmutableValuesIsAllowed) {
  PickleBuilder q;
  q.proto().mark().str("s").binput(0).integer(1).integer(2).tuple2().binput(1).binget(0).binget(1).binget(1);
  q.tuple().stop();
  const Value root = read_value(q);
  const auto& items = root.as_list();
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[2].as_string(), "s");
  EXPECT_EQ(items[3].node_identity(), items[4].node_identity());  // shared, not copied
}

TEST(PickleReader, BingetOfAStringSharesOneNode) {
  // The VM makes a string a Value only when a result needs it; every
  // reference to one opcode's string must still share one node.
  PickleBuilder p;
  p.proto().mark().str("s").binput(0).binget(0).binget(0).tuple().stop();
  const Value root = read_value(p);
  const auto& items = root.as_list();
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].as_string(), "s");
  EXPECT_EQ(items[0].node_identity(), items[1].node_identity());
  EXPECT_EQ(items[0].node_identity(), items[2].node_identity());
}

TEST(PickleReader, EmptyContainersKeepTheirKindsInsideValues) {
  // Containers nothing was added to are made only when a result needs them.
  PickleBuilder p;
  p.proto().mark().ordered_dict().empty_dict().empty_list().tuple3().empty_list().empty_dict().tuple().stop();
  const Value root = read_value(p);
  const auto& items = root.as_list();
  ASSERT_EQ(items.size(), 3u);
  const auto& inner = items[0].as_list();
  ASSERT_EQ(inner.size(), 3u);
  EXPECT_TRUE(inner[0].is_ordered_dict());
  EXPECT_TRUE(inner[0].as_dict().empty());
  EXPECT_EQ(inner[1].kind(), ValueKind::dict);
  EXPECT_TRUE(inner[2].is_list());
  EXPECT_TRUE(items[1].is_list());
  EXPECT_EQ(items[2].kind(), ValueKind::dict);
}

TEST(PickleReader, TrailingBytesAllowedOnRequestReportConsumed) {
  PickleBuilder p;
  p.proto().integer(1001).stop().raw("rest of a legacy stream");
  MemoryStorages storages;
  const auto bytes = p.bytes();
  const PickleResult result = read_pickle(bytes, storages, {}, {}, true);
  EXPECT_EQ(result.root.as_int(), 1001);
  EXPECT_EQ(result.consumed, 6u);
  EXPECT_ERROR_CODE(read_pickle(bytes, storages, {}, {}), ErrorCode::pickle_trailing_bytes);
}

TEST(PickleReader, LegacyPersistentIdsTakeViewMetadataNoneAndPointerKeys) {
  PickleOptions legacy;
  legacy.persistent_ids = PersistentIdForm::legacy;
  legacy.canonical_storage_keys = false;
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_tensor_v2").mark();
  p.mark().str("storage").global("torch", "DoubleStorage").str("94264066933152").str("cuda:0").integer(4).none();
  p.tuple().binpersid().integer(0).int_tuple({4}).int_tuple({1}).boolean(false).ordered_dict().tuple().reduce().stop();
  EXPECT_EQ(read(p, {}, legacy).root.as_tensor().dtype, DType::float64);
  // The 6-tuple is not a zip persistent id.
  EXPECT_ERROR_CODE(read(p), ErrorCode::persistent_id_invalid);
}

TEST(PickleReader, AcceptsCudaAndMpsLocations) {
  for (const char* location : {"cuda", "cuda:0", "cuda:15", "mps"}) {
    SCOPED_TRACE(location);
    PickleBuilder p;
    p.proto().tensor_over("FloatStorage", "0", 1, location).stop();
    EXPECT_EQ(read(p).root.as_tensor().numel(), 1);
  }
}

TEST(PickleReader, RealWeightsOnlyPicklesParse) {
  // data.pkl of every weights-only zip file in tests/corpus/real_pt (the fuzz seeds).
  const auto seeds = holdpoint::testing::source_dir() / "fuzz" / "corpus" / "pickle";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(seeds)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("real__", 0) != 0) continue;
    SCOPED_TRACE(name);
    const auto bytes = holdpoint::testing::read_file_bytes(entry.path());
    MemoryStorages storages;
    storages.fabricate_missing(64 << 20);
    EXPECT_NO_THROW(read_pickle(bytes, storages, {}));
    ++count;
  }
  EXPECT_GE(count, 20);
}

TEST(PickleReader, RealPicklesOfPythonObjectsAreRefused) {
  // Whole modules, Lightning callbacks, TrainingArguments, TorchScript.
  const auto seeds = holdpoint::testing::source_dir() / "fuzz" / "corpus" / "pickle";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(seeds)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("forbidden__", 0) != 0) continue;
    SCOPED_TRACE(name);
    const auto bytes = holdpoint::testing::read_file_bytes(entry.path());
    MemoryStorages storages;
    storages.fabricate_missing(64 << 20);
    EXPECT_ERROR_CODE(read_pickle(bytes, storages, {}), ErrorCode::pickle_global_forbidden);
    ++count;
  }
  EXPECT_EQ(count, 5);
}

TEST(PickleReader, ReadsRealParameterAndViewFiles) {
  const auto seeds = holdpoint::testing::source_dir() / "fuzz" / "corpus" / "pickle";
  MemoryStorages storages;
  storages.fabricate_missing(1 << 20);
  const auto parameter = holdpoint::testing::read_file_bytes(seeds / "real__burn_parameter_2025-10.pkl");
  const Value param_root = read_pickle(parameter, storages, {}).root;
  const TensorData& param = param_root.as_dict().at("param").as_tensor();
  EXPECT_TRUE(param.is_parameter);
  EXPECT_TRUE(param.requires_grad);
  EXPECT_EQ(param.sizes, (std::vector<std::int64_t>{3, 3}));

  MemoryStorages view_storages;
  view_storages.fabricate_missing(1 << 20);
  const auto views = holdpoint::testing::read_file_bytes(seeds / "real__burn_non_contiguous_views.pkl");
  const PickleResult result = read_pickle(views, view_storages, {});
  const TensorData& permuted = result.root.as_dict().at("permuted").as_tensor();
  EXPECT_EQ(permuted.sizes, (std::vector<std::int64_t>{2, 4, 3}));
  EXPECT_EQ(permuted.strides, (std::vector<std::int64_t>{12, 1, 4}));
  EXPECT_EQ(permuted.storage_offset, 5);
  EXPECT_EQ(result.root.as_dict().at("expanded").as_tensor().strides, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(result.storage_count, 1u);  // both views name key '0'
}

// ==== Python's and torch's own value types, as torch.save pickles them =======================

// A BINFLOAT (big-endian).
void binfloat(PickleBuilder& p, double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  p.op(op::BINFLOAT);
  for (int shift = 56; shift >= 0; shift -= 8) p.u8(static_cast<std::uint8_t>(bits >> shift));
}

// _codecs.encode(text, 'latin1'): bytes at protocol 2.
void latin1_bytes(PickleBuilder& p, std::string_view ascii) {
  p.global("_codecs", "encode").str(ascii).str("latin1").tuple2().reduce();
}

TEST(PickleReaderTypes, ReadsTheFormsTorchSaveWrites) {
  // {"c": 1+2j, "s": {1, 'a'}, "ba": bytearray(b'ab'), "dev": torch.device('cuda', 1),
  //  "cpu": torch.device('cpu'), "dt": torch.float16, "sz": torch.Size([2, 3]),
  //  "lay": torch.sparse_coo}, in torch.save's words (pickletools of torch 2.13).
  PickleBuilder p;
  p.proto().empty_dict().mark();
  p.str("c").global("__builtin__", "complex");
  binfloat(p, 1.0);
  binfloat(p, 2.0);
  p.tuple2().reduce();
  p.str("s").global("__builtin__", "set").empty_list().mark().integer(1).str("a").appends().tuple1().reduce();
  p.str("ba").global("__builtin__", "bytearray");
  latin1_bytes(p, "ab");
  p.tuple1().reduce();
  p.str("dev").global("torch", "device").str("cuda").integer(1).tuple2().reduce();
  p.str("cpu").global("torch", "device").str("cpu").tuple1().reduce();
  p.str("dt").global("torch", "float16");
  p.str("sz").global("torch", "Size").integer(2).integer(3).tuple2().binput(0).tuple1().reduce();
  p.str("plain").binget(0);  // the tuple torch.Size took stays a tuple
  p.str("lay").global("torch.serialization", "_get_layout").str("torch.sparse_coo").tuple1().reduce();
  p.str("empty_set").global("builtins", "set").empty_tuple().reduce();
  p.str("empty_bytearray").global("builtins", "bytearray").empty_tuple().reduce();
  p.setitems().stop();
  const Value root = read_value(p);
  const Dict& d = root.as_dict();
  EXPECT_EQ(d.at("c").as_complex(), std::complex<double>(1.0, 2.0));
  ASSERT_TRUE(d.at("s").is_set());
  ASSERT_EQ(d.at("s").as_list().size(), 2u);
  EXPECT_EQ(d.at("s").as_list()[0].as_int(), 1);
  EXPECT_EQ(d.at("s").as_list()[1].as_string(), "a");
  ASSERT_TRUE(d.at("ba").is_bytearray());
  EXPECT_EQ(d.at("ba").as_bytes(), "ab");
  EXPECT_EQ(d.at("dev").as_device(), "cuda:1");
  EXPECT_EQ(d.at("cpu").as_device(), "cpu");
  EXPECT_EQ(d.at("dt").as_dtype(), DType::float16);
  ASSERT_TRUE(d.at("sz").is_size());
  EXPECT_EQ(d.at("sz").as_list().size(), 2u);
  EXPECT_EQ(d.at("sz").as_list()[1].as_int(), 3);
  EXPECT_TRUE(d.at("plain").is_tuple());
  EXPECT_EQ(d.at("lay").as_layout(), "torch.sparse_coo");
  EXPECT_TRUE(d.at("empty_set").is_set() && d.at("empty_set").as_list().empty());
  EXPECT_TRUE(d.at("empty_bytearray").is_bytearray() && d.at("empty_bytearray").as_bytes().empty());
}

TEST(PickleReaderTypes, ReadsAnEmptySetOpcode) {
  PickleBuilder p;
  p.proto(4).op(op::EMPTY_SET).stop();
  const Value root = read_value(p);
  EXPECT_TRUE(root.is_set() && root.as_list().empty());
  // ADDITEMS, which torch's safe loader lacks too, is not read.
  PickleBuilder filled;
  filled.proto(4).op(op::EMPTY_SET).mark().integer(1).op(op::ADDITEMS).stop();
  EXPECT_ERROR_CODE(read(filled), ErrorCode::pickle_opcode_forbidden);
}

TEST(PickleReaderTypes, EveryFormRoundTripsThroughTheWriter) {
  Dict entries;
  entries.insert("c", Value::complex_number({-0.0, std::numeric_limits<double>::infinity()}));
  entries.insert("s", Value::set({Value::integer(3), Value::string("x"), Value::tuple({Value::none(), Value::floating(0.5)}),
                                  Value::dtype(DType::bfloat16)}));
  entries.insert("ba", Value::bytearray(std::string("\x00\xff\x80", 3)));
  entries.insert("dev", Value::device("cuda:7"));
  entries.insert("cpu", Value::device("cpu"));
  entries.insert("dt", Value::dtype(DType::float8_e4m3fn));
  const std::int64_t dims[] = {4, 0, 5, 6};
  entries.insert("sz", Value::size(dims));
  entries.insert("lay", Value::layout("torch.strided"));
  const Value root = Value::dict(std::move(entries));
  const PickleWriteResult written = write_pickle(root);
  MemoryStorages storages;
  const Value back = read_pickle(written.pickle, storages, Limits{}).root;
  EXPECT_EQ(describe_difference(root, back), "");
  EXPECT_TRUE(back.as_dict().at("sz").is_size());
  EXPECT_TRUE(back.as_dict().at("s").is_set());
}

TEST(PickleReaderTypes, RefusesMalformedCallsEachWithItsCode) {
  const auto call = [](std::string_view module, std::string_view name, const std::function<void(PickleBuilder&)>& args) {
    PickleBuilder p;
    p.proto().global(module, name);
    args(p);
    p.reduce().stop();
    return p;
  };
  const auto refused = [&](std::string_view module, std::string_view name,
                           const std::function<void(PickleBuilder&)>& args) {
    SCOPED_TRACE(std::string(module) + "." + std::string(name));
    EXPECT_ERROR_CODE(read(call(module, name, args)), ErrorCode::pickle_call_args_invalid);
  };
  refused("builtins", "complex", [](PickleBuilder& p) { p.integer(1).tuple1(); });
  refused("builtins", "complex", [](PickleBuilder& p) { p.integer(1).integer(2).integer(3).tuple3(); });
  refused("builtins", "complex", [](PickleBuilder& p) { p.str("1").integer(2).tuple2(); });
  refused("builtins", "set", [](PickleBuilder& p) { p.mark().integer(1).tuple().tuple1(); });  // a tuple, not a list
  refused("builtins", "set", [](PickleBuilder& p) { p.empty_list().empty_list().tuple2(); });
  // Unhashable items: a list, a dict, a tensor.
  refused("builtins", "set", [](PickleBuilder& p) { p.empty_list().mark().empty_list().appends().tuple1(); });
  refused("builtins", "set", [](PickleBuilder& p) { p.empty_list().mark().empty_dict().appends().tuple1(); });
  refused("builtins", "set", [](PickleBuilder& p) {
    p.empty_list().mark().tensor("FloatStorage", "0", 2, 0, {2}, {1}).appends().tuple1();
  });
  refused("builtins", "bytearray", [](PickleBuilder& p) { p.str("ab").tuple1(); });  // text, not bytes
  refused("builtins", "bytearray", [](PickleBuilder& p) { p.integer(1000000).tuple1(); });  // a size
  refused("torch", "device", [](PickleBuilder& p) { p.empty_tuple(); });
  refused("torch", "device", [](PickleBuilder& p) { p.str("CUDA").tuple1(); });
  refused("torch", "device", [](PickleBuilder& p) { p.str("cuda").integer(-1).tuple2(); });
  refused("torch", "device", [](PickleBuilder& p) { p.str("cuda").integer(128).tuple2(); });
  refused("torch", "device", [](PickleBuilder& p) { p.str("cuda").str("1").tuple2(); });
  refused("torch", "device", [](PickleBuilder& p) { p.str("cuda:01").tuple1(); });
  refused("torch", "device", [](PickleBuilder& p) { p.str("").tuple1(); });
  refused("torch", "Size", [](PickleBuilder& p) { p.integer(2).tuple1(); });
  refused("torch.serialization", "_get_layout", [](PickleBuilder& p) { p.str("torch.evil").tuple1(); });
  // A dtype is a value, never a callable.
  PickleBuilder dtype_call = call("torch", "float32", [](PickleBuilder& p) { p.empty_tuple(); });
  EXPECT_ERROR_CODE(read(dtype_call), ErrorCode::pickle_call_forbidden);
}

TEST(PickleWriterTypes, RefusesWhatNoLoaderCouldRead) {
  // A set of a list: Python could not hash it.
  EXPECT_ERROR_CODE(write_pickle(Value::set({Value::list()})), ErrorCode::write_value_unsupported);
  // torch 1.13's weights_only loader knows no complex, set, bytearray or device.
  PickleWriteOptions old;
  old.torch_1_13_compatible = true;
  for (const Value& value : {Value::complex_number({1, 2}), Value::set(), Value::bytearray("x"), Value::device("cpu")}) {
    SCOPED_TRACE(std::string(value_kind_name(value.kind())));
    EXPECT_ERROR_CODE(write_pickle(value, old), ErrorCode::write_value_unsupported);
  }
  // torch.Size and layouts it reads.
  const std::int64_t dims[] = {2};
  EXPECT_NO_THROW(write_pickle(Value::size(dims), old));
  EXPECT_NO_THROW(write_pickle(Value::layout("torch.strided"), old));
  // The Value constructors refuse what no torch would make.
  EXPECT_ERROR_CODE(Value::device("cuda:x"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(Value::device("Cuda"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(Value::layout("strided"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(Value::integer(1).as_complex(), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(Value::string("cpu").as_device(), ErrorCode::invalid_argument);
}

// ==== meta tensors ================================================================================

// _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad), as torch.save writes a
// tensor on the meta device (pickletools of torch 2.13).
void meta_tensor(PickleBuilder& p, std::string_view dtype, std::initializer_list<std::int64_t> sizes,
                 std::initializer_list<std::int64_t> strides, bool requires_grad) {
  p.global("torch._utils", "_rebuild_meta_tensor_no_storage").mark().global("torch", dtype);
  p.int_tuple(sizes).int_tuple(strides).boolean(requires_grad).tuple().reduce();
}

TEST(PickleReaderMeta, ReadsMetaTensorsAndParametersAsTorchSaveWritesThem) {
  // {"t": a transposed (3, 2) meta view, "p": Parameter(meta (2, 3)), "again": "t" re-referenced}
  PickleBuilder p;
  p.proto().empty_dict().mark();
  p.str("t");
  meta_tensor(p, "float32", {3, 2}, {1, 3}, false);
  p.binput(0);
  p.str("p").global("torch._utils", "_rebuild_parameter");
  meta_tensor(p, "bfloat16", {2, 3}, {3, 1}, false);
  p.boolean(true).global("collections", "OrderedDict").empty_tuple().reduce().tuple3().reduce();
  p.str("again").binget(0);
  p.setitems().stop();
  const PickleResult result = read(p);
  const Dict& d = result.root.as_dict();
  ASSERT_TRUE(d.at("t").is_meta_tensor());
  const TensorData& t = d.at("t").as_meta_tensor();
  EXPECT_EQ(t.dtype, DType::float32);
  EXPECT_EQ(t.sizes, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(t.strides, (std::vector<std::int64_t>{1, 3}));
  EXPECT_FALSE(t.requires_grad || t.is_parameter);
  EXPECT_EQ(t.storage, nullptr);
  const TensorData& param = d.at("p").as_meta_tensor();
  EXPECT_TRUE(param.is_parameter && param.requires_grad);
  EXPECT_EQ(param.dtype, DType::bfloat16);
  // One object referenced twice stays one node; element readers never see it.
  EXPECT_EQ(d.at("again").node_identity(), d.at("t").node_identity());
  EXPECT_ERROR_CODE(d.at("t").as_tensor(), ErrorCode::invalid_argument);
  EXPECT_EQ(result.tensor_count, 2u);
  EXPECT_EQ(typed_scalar_text(d.at("p")), "Parameter(meta, bfloat16, size=[2, 3], stride=[3, 1], requires_grad)");
}

TEST(PickleReaderMeta, RefusesMalformedMetaTensorsEachWithItsCode) {
  const auto built = [](const std::function<void(PickleBuilder&)>& body) {
    PickleBuilder p;
    p.proto();
    body(p);
    p.stop();
    return p;
  };
  const auto args = [&](const std::function<void(PickleBuilder&)>& arguments) {
    return built([&](PickleBuilder& p) {
      p.global("torch._utils", "_rebuild_meta_tensor_no_storage");
      arguments(p);
      p.reduce();
    });
  };
  // Arity, the dtype and requires_grad's types.
  EXPECT_ERROR_CODE(read(args([](PickleBuilder& p) { p.global("torch", "float32").empty_tuple().empty_tuple().tuple3(); })),
                    ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(args([](PickleBuilder& p) {
                      p.mark().str("float32").empty_tuple().empty_tuple().boolean(false).tuple();
                    })),
                    ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(args([](PickleBuilder& p) {
                      p.mark().global("torch", "float32").empty_tuple().empty_tuple().integer(0).tuple();
                    })),
                    ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(args([](PickleBuilder& p) {
                      p.mark().global("torch", "float32").int_tuple({2}).str("1").boolean(false).tuple();
                    })),
                    ErrorCode::pickle_call_args_invalid);
  // Geometry: ranks that differ, a negative size or stride.
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) { meta_tensor(p, "float32", {2, 3}, {1}, false); })),
                    ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) { meta_tensor(p, "float32", {-2}, {1}, false); })),
                    ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) { meta_tensor(p, "float32", {2}, {-1}, false); })),
                    ErrorCode::tensor_geometry_invalid);
  // More elements than the limit, or than 64 bits count, even with no memory behind them.
  Limits small;
  small.max_tensor_numel = 100;
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) { meta_tensor(p, "float32", {11, 10}, {10, 1}, false); }), small),
                    ErrorCode::tensor_numel_limit);
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) {
                      meta_tensor(p, "float32", {std::int64_t{1} << 40, std::int64_t{1} << 40}, {1, 1}, false);
                    })),
                    ErrorCode::tensor_numel_limit);
  // An empty meta tensor is fine whatever its other sizes.
  EXPECT_NO_THROW(read(built([](PickleBuilder& p) {
    meta_tensor(p, "float32", {0, std::int64_t{1} << 62, std::int64_t{1} << 62}, {1, 1, 1}, false);
  })));
  // requires_grad on an integer dtype; and each meta tensor counts against max_tensors.
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) { meta_tensor(p, "int64", {2}, {1}, true); })),
                    ErrorCode::tensor_requires_grad_invalid);
  Limits one;
  one.max_tensors = 1;
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) {
                      p.empty_list().mark();
                      meta_tensor(p, "float32", {2}, {1}, false);
                      meta_tensor(p, "float32", {2}, {1}, false);
                      p.appends();
                    }),
                         one),
                    ErrorCode::tensor_count_limit);
  // _rebuild_parameter of a requires_grad integer meta tensor.
  EXPECT_ERROR_CODE(read(built([](PickleBuilder& p) {
                      p.global("torch._utils", "_rebuild_parameter");
                      meta_tensor(p, "int32", {2}, {1}, false);
                      p.boolean(true).global("collections", "OrderedDict").empty_tuple().reduce().tuple3().reduce();
                    })),
                    ErrorCode::tensor_requires_grad_invalid);
}

TEST(PickleReaderMeta, MetaTensorsRoundTripThroughTheWriterInBothModes) {
  TensorData plain;
  plain.dtype = DType::float16;
  plain.sizes = std::vector<std::int64_t>{4, 0, 5};
  plain.strides = std::vector<std::int64_t>{5, 5, 1};
  TensorData parameter;
  parameter.dtype = DType::float32;
  parameter.sizes = std::vector<std::int64_t>{3};
  parameter.strides = std::vector<std::int64_t>{1};
  parameter.is_parameter = true;
  parameter.requires_grad = true;
  const Value shared = Value::meta_tensor(parameter);
  Dict entries;
  entries.insert("plain", Value::meta_tensor(plain));
  entries.insert("parameter", shared);
  entries.insert("tied", shared);
  const Value root = Value::dict(std::move(entries));
  for (bool compatible : {false, true}) {
    SCOPED_TRACE(compatible ? "1.13 mode" : "default");
    PickleWriteOptions options;
    options.torch_1_13_compatible = compatible;
    const PickleWriteResult written = write_pickle(root, options);
    EXPECT_TRUE(written.storages.empty());
    MemoryStorages storages;
    const Value back = read_pickle(written.pickle, storages, Limits{}).root;
    EXPECT_EQ(describe_difference(root, back), "");
    EXPECT_EQ(back.as_dict().at("tied").node_identity(), back.as_dict().at("parameter").node_identity());
  }
  // torch 1.13 allowlists ten dtypes as globals: a bool meta tensor is refused in that mode.
  TensorData flags;
  flags.dtype = DType::boolean;
  PickleWriteOptions old;
  old.torch_1_13_compatible = true;
  EXPECT_ERROR_CODE(write_pickle(Value::meta_tensor(flags), old), ErrorCode::write_value_unsupported);
  EXPECT_ERROR_CODE(write_pickle(Value::dtype(DType::boolean), old), ErrorCode::write_value_unsupported);
  EXPECT_NO_THROW(write_pickle(Value::meta_tensor(flags)));
  // A meta tensor differs from another by any of its fields.
  TensorData other = plain;
  other.strides = std::vector<std::int64_t>{1, 4, 4};
  EXPECT_NE(describe_difference(Value::meta_tensor(plain), Value::meta_tensor(other)), "");
  // The constructor refuses what a meta tensor cannot have.
  TensorData stored = TensorData::from_bytes(DType::uint8, {1}, std::as_bytes(std::span("x", 1)));
  EXPECT_ERROR_CODE(Value::meta_tensor(stored), ErrorCode::invalid_argument);
  TensorData ragged = plain;
  ragged.strides = std::vector<std::int64_t>{1};
  EXPECT_ERROR_CODE(Value::meta_tensor(ragged), ErrorCode::invalid_argument);
}

// ==== NumPy values, read as data =============================================================

// numpy.dtype(code, False, True) BUILD (3, order, None, None, None, -1, -1, 0), as NumPy writes it.
void numpy_dtype(PickleBuilder& p, std::string_view code, std::string_view order = "<") {
  p.global("numpy", "dtype").str(code).boolean(false).boolean(true).tuple3().reduce();
  p.mark().integer(3).str(order).none().none().none().integer(-1).integer(-1).integer(0).tuple().build();
}

void binbytes(PickleBuilder& p, std::string_view data) { p.op(op::BINBYTES).le(data.size(), 4).raw(data); }

// _reconstruct(numpy.ndarray, (0,), b'b'): the empty array a BUILD fills.
void reconstruct(PickleBuilder& p, std::string_view module = "numpy._core.multiarray") {
  p.global(module, "_reconstruct").global("numpy", "ndarray").int_tuple({0});
  binbytes(p, "b");
  p.tuple3().reduce();
}

// _reconstruct(...) BUILD (1, shape, dtype, fortran, data)
void numpy_array(PickleBuilder& p, std::initializer_list<std::int64_t> shape, std::string_view code,
                 std::string_view data, bool fortran = false, std::string_view order = "<",
                 std::string_view module = "numpy._core.multiarray") {
  reconstruct(p, module);
  p.mark().integer(1).int_tuple(shape);
  numpy_dtype(p, code, order);
  p.boolean(fortran);
  binbytes(p, data);
  p.tuple().build();
}

// multiarray.scalar(dtype(code), data), alone in a pickle.
PickleBuilder numpy_scalar(std::string_view code, std::string_view data, std::string_view order = "<") {
  PickleBuilder p;
  p.proto(3).global("numpy._core.multiarray", "scalar");
  numpy_dtype(p, code, order);
  binbytes(p, data);
  p.tuple2().reduce().stop();
  return p;
}

std::string le_bytes(std::initializer_list<std::uint32_t> values) {
  std::string out;
  for (std::uint32_t v : values) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  }
  return out;
}

TEST(PickleReaderNumpy, ReadsAnArrayAsATensorOverItsOwnCopy) {
  for (const char* module : {"numpy._core.multiarray", "numpy.core.multiarray"}) {  // NumPy 2 and 1
    SCOPED_TRACE(module);
    PickleBuilder p;
    p.proto(3);
    numpy_array(p, {3}, "u4", le_bytes({7, 8, 4000000000u}), false, "<", module);
    p.stop();
    const Value root = read_value(p);
    const TensorData& t = root.as_tensor();
    EXPECT_TRUE(t.from_numpy);
    EXPECT_EQ(t.dtype, DType::uint32);
    EXPECT_EQ(t.sizes, (std::vector<std::int64_t>{3}));
    EXPECT_EQ(t.strides, (std::vector<std::int64_t>{1}));
    std::uint32_t last;
    std::memcpy(&last, t.contiguous_bytes().data() + 8, 4);
    EXPECT_EQ(last, 4000000000u);
  }
}

// An empty array: pickle protocol 2 writes its b'' data as bytes() with no arguments.
TEST(PickleReaderNumpy, ReadsAnEmptyArrayWhoseDataIsBytesCalledWithNothing) {
  for (const char* module : {"__builtin__", "builtins"}) {
    SCOPED_TRACE(module);
    PickleBuilder p;
    p.proto(2);
    reconstruct(p);
    p.mark().integer(1).int_tuple({0, 3});
    numpy_dtype(p, "f4");
    p.boolean(false);
    p.global(module, "bytes").empty_tuple().reduce();
    p.tuple().build().stop();
    const TensorData& empty = read_value(p).as_tensor();
    EXPECT_EQ(empty.sizes, (std::vector<std::int64_t>{0, 3}));
    EXPECT_EQ(empty.dtype, DType::float32);
    EXPECT_EQ(empty.numel(), 0);
  }
  // bytes() is read only without arguments: bytes(n) or bytes(iterable) would make data.
  PickleBuilder sized;
  sized.proto(2).global("__builtin__", "bytes").integer(1000000).tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(sized), ErrorCode::pickle_call_args_invalid);
  PickleBuilder from_list;
  from_list.proto(2).global("builtins", "bytes").empty_list().tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(from_list), ErrorCode::pickle_call_args_invalid);
  // An empty array whose shape says otherwise: its data must still be the elements'.
  PickleBuilder mismatched;
  mismatched.proto(2);
  reconstruct(mismatched);
  mismatched.mark().integer(1).int_tuple({2});
  numpy_dtype(mismatched, "f4");
  mismatched.boolean(false);
  mismatched.global("__builtin__", "bytes").empty_tuple().reduce();
  mismatched.tuple().build().stop();
  EXPECT_ERROR_CODE(read(mismatched), ErrorCode::numpy_array_invalid);
}

TEST(PickleReaderNumpy, SwapsBigEndianArraysAndKeepsFortranOrder) {
  PickleBuilder p;
  p.proto(3).empty_dict().str("big");
  numpy_array(p, {2}, "i2", std::string("\x01\x02\xff\xfe", 4), false, ">");
  p.setitem().str("fortran");
  // A 2x3 float32 array in column-major order: columns (0,1), (2,3), (4,5).
  std::string data;
  for (float f : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) data.append(reinterpret_cast<const char*>(&f), 4);
  numpy_array(p, {2, 3}, "f4", data, true);
  p.setitem().stop();
  const Value root = read_value(p);
  const TensorData& big = root.as_dict().at("big").as_tensor();
  std::int16_t values[2];
  std::memcpy(values, big.contiguous_bytes().data(), 4);
  EXPECT_EQ(values[0], 0x0102);
  EXPECT_EQ(values[1], -2);
  const TensorData& fortran = root.as_dict().at("fortran").as_tensor();
  EXPECT_EQ(fortran.strides, (std::vector<std::int64_t>{1, 2}));
  EXPECT_FLOAT_EQ(element(fortran, 1), 2.f);  // row 0, column 1
  EXPECT_FLOAT_EQ(element(fortran, 3), 1.f);  // row 1, column 0
}

TEST(PickleReaderNumpy, ReadsScalarsAsPlainValuesTaggedWithTheirDtype) {
  const auto scalar = [](std::string_view code, std::string_view data, std::string_view order = "<") {
    return read_value(numpy_scalar(code, data, order));
  };
  const float f = 1.5f;
  EXPECT_DOUBLE_EQ(scalar("f4", std::string_view(reinterpret_cast<const char*>(&f), 4)).as_double(), 1.5);
  EXPECT_EQ(scalar("i8", std::string("\xfe\xff\xff\xff\xff\xff\xff\xff", 8)).as_int(), -2);
  EXPECT_EQ(scalar("u2", std::string("\x01\x02", 2), ">").as_int(), 0x0102);
  EXPECT_TRUE(scalar("b1", std::string("\x01", 1)).as_bool());
  EXPECT_DOUBLE_EQ(scalar("f2", std::string("\x00\x3c", 2)).as_double(), 1.0);  // half 1.0
  EXPECT_DOUBLE_EQ(scalar("f2", std::string("\x01\x00", 2)).as_double(), std::ldexp(1.0, -24));
  // uint64 across its whole range: up to 2^63 - 1 an int, above a big integer (a Python int).
  EXPECT_EQ(scalar("u8", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8)).as_int(),
            std::numeric_limits<std::int64_t>::max());
  const Value top = scalar("u8", std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8));
  ASSERT_EQ(top.kind(), ValueKind::big_integer);
  EXPECT_EQ(top.as_big_integer(), std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x00", 9));  // 2^64 - 1
  const Value half = scalar("u8", std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8), "<");
  ASSERT_EQ(half.kind(), ValueKind::big_integer);
  EXPECT_EQ(half.as_big_integer(), std::string("\x00\x00\x00\x00\x00\x00\x00\x80\x00", 9));  // 2^63
  const Value big_endian = scalar("u8", std::string("\x80\x00\x00\x00\x00\x00\x00\x01", 8), ">");
  ASSERT_EQ(big_endian.kind(), ValueKind::big_integer);
  EXPECT_EQ(big_endian.as_big_integer(), std::string("\x01\x00\x00\x00\x00\x00\x00\x80\x00", 9));
  // Each keeps the NumPy dtype it had, for Python to give the NumPy type back.
  EXPECT_EQ(top.numpy_scalar_dtype(), DType::uint64);
  EXPECT_EQ(scalar("f4", std::string_view(reinterpret_cast<const char*>(&f), 4)).numpy_scalar_dtype(), DType::float32);
  EXPECT_EQ(scalar("b1", std::string("\x01", 1)).numpy_scalar_dtype(), DType::boolean);
  EXPECT_EQ(scalar("u2", std::string("\x01\x02", 2), ">").numpy_scalar_dtype(), DType::uint16);
  EXPECT_FALSE(Value::integer(-2).numpy_scalar_dtype());
  // The tag is a type for Python, not content: numpy.int64(-2) == -2, as in
  // Python; digests and writers see the plain value.
  const Value minus_two = scalar("i8", std::string("\xfe\xff\xff\xff\xff\xff\xff\xff", 8));
  EXPECT_TRUE(equal_content(minus_two, Value::integer(-2)));
  EXPECT_FALSE(equal_content(minus_two, Value::numpy_scalar(DType::int64, Value::integer(-3))));
  EXPECT_ERROR_CODE(Value::numpy_scalar(DType::float32, Value::string("1.5")), ErrorCode::invalid_argument);
  // A NaN keeps its sign and mantissa, quiet bit included, in the double's top
  // mantissa bits: a signaling float32 NaN and a float16 NaN with a payload.
  const auto bits_of = [](const Value& v) { return std::bit_cast<std::uint64_t>(v.as_double()); };
  EXPECT_EQ(bits_of(scalar("f4", std::string("\x01\x00\x80\x7f", 4))), 0x7FF0000020000000ull);
  EXPECT_EQ(bits_of(scalar("f4", std::string("\x00\x00\xc0\xff", 4))), 0xFFF8000000000000ull);
  EXPECT_EQ(bits_of(scalar("f2", std::string("\x01\x7c", 2))), 0x7FF0040000000000ull);
  EXPECT_EQ(scalar("f2", std::string("\x00\x7c", 2)).as_double(), std::numeric_limits<double>::infinity());
  const std::complex<double> z = scalar("c8", std::string("\x01\x00\x80\x7f\x00\x00\x80\x3f", 8)).as_complex();
  EXPECT_EQ(std::bit_cast<std::uint64_t>(z.real()), 0x7FF0000020000000ull);
  EXPECT_EQ(z.imag(), 1.0);
}

TEST(PickleReaderNumpy, ASharedDtypeSeesItsBuild) {
  // The dtype is memoized after its BUILD and fetched again for a second array.
  PickleBuilder p;
  p.proto(3).mark();
  reconstruct(p);
  p.mark().integer(1).int_tuple({1});
  numpy_dtype(p, "i2", ">");
  p.binput(0).boolean(false);
  binbytes(p, std::string("\x00\x05", 2));
  p.tuple().build();
  p.global("numpy._core.multiarray", "scalar").binget(0);
  binbytes(p, std::string("\x00\x06", 2));
  p.tuple2().reduce().tuple().stop();
  const Value root = read_value(p);
  std::int16_t first;
  std::memcpy(&first, root.as_list()[0].as_tensor().contiguous_bytes().data(), 2);
  EXPECT_EQ(first, 5);
  EXPECT_EQ(root.as_list()[1].as_int(), 6);
}

TEST(PickleReaderNumpy, AnArrayMemoizedBeforeItsBuildIsSharedAfterIt) {
  // pickle's BINPUT follows _reconstruct, before BUILD fills the array; a later
  // BINGET is the built array, one node referenced twice (as [a, a] pickles).
  PickleBuilder p;
  p.proto(3).mark();
  reconstruct(p);
  p.binput(0).mark().integer(1).int_tuple({2});
  numpy_dtype(p, "u1", "|");
  p.boolean(false);
  binbytes(p, "\x07\x09");
  p.tuple().build().binget(0).tuple().stop();
  const Value root = read_value(p);
  const Value::List& items = root.as_list();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].node_identity(), items[1].node_identity());
  EXPECT_EQ(items[1].as_tensor().contiguous_bytes(), holdpoint::testing::bytes_of(std::string_view("\x07\x09")));
  // Fetched inside its own state, before the BUILD: still refused.
  PickleBuilder early;
  early.proto(3);
  reconstruct(early);
  early.binput(0).mark().integer(1).int_tuple({1});
  numpy_dtype(early, "u1", "|");
  early.boolean(false).binget(0).tuple().build().stop();
  EXPECT_ERROR_CODE(read_value(early), ErrorCode::pickle_memo_mutable);
}

TEST(PickleReaderNumpy, ReadsARealTrainerRngState) {
  // rng_state.pth of a Hugging Face Trainer: {'python': random.getstate(),
  // 'numpy': np.random.get_state(), 'cpu': torch.get_rng_state()}.
  const auto seeds = holdpoint::testing::source_dir() / "fuzz" / "corpus" / "pickle";
  const auto bytes = holdpoint::testing::read_file_bytes(seeds / "real__hf_trainer_rng_state_2023-11.pkl");
  MemoryStorages storages;
  storages.fabricate_missing(1 << 20);
  const Value root = read_pickle(bytes, storages, {}).root;
  const auto& state = root.as_dict().at("numpy").as_list();
  ASSERT_EQ(state.size(), 5u);
  EXPECT_EQ(state[0].as_string(), "MT19937");
  EXPECT_TRUE(state[1].as_tensor().from_numpy);
  EXPECT_EQ(state[1].as_tensor().dtype, DType::uint32);
  EXPECT_EQ(state[1].as_tensor().sizes, (std::vector<std::int64_t>{624}));
  EXPECT_TRUE(state[2].is_int());
  EXPECT_EQ(root.as_dict().at("python").as_list().at(1).as_list().size(), 625u);
}

TEST(PickleReaderNumpy, RefusesDtypesThatAreNotPlainNumbers) {
  for (const char* code : {"O8", "U3", "S4", "V16", "M8", "m8", "f16", "i16"}) {
    SCOPED_TRACE(code);
    PickleBuilder array;
    array.proto(3);
    numpy_array(array, {1}, code, "12345678");
    array.stop();
    EXPECT_ERROR_CODE(read(array), ErrorCode::numpy_dtype_unsupported);
    EXPECT_ERROR_CODE(read(numpy_scalar(code, "12345678")), ErrorCode::numpy_dtype_unsupported);
  }
  // A structured dtype: names and fields in the state.
  PickleBuilder structured;
  structured.proto(3).global("numpy", "dtype").str("V8").boolean(false).boolean(true).tuple3().reduce();
  structured.mark().integer(3).str("|").none().mark().str("a").tuple().empty_dict().integer(8).integer(1).integer(16);
  structured.tuple().build().stop();
  EXPECT_ERROR_CODE(read(structured), ErrorCode::numpy_dtype_unsupported);
}

std::string le_float_bytes(std::initializer_list<double> values, bool single) {
  std::string out;
  for (const double v : values) {
    if (single) {
      const float f = static_cast<float>(v);
      out.append(reinterpret_cast<const char*>(&f), sizeof f);
    } else {
      out.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
  }
  return out;
}

TEST(PickleReaderNumpy, ReadsComplexScalarsAsComplexNumbersInEitherByteOrder) {
  EXPECT_EQ(read_value(numpy_scalar("c8", le_float_bytes({1.5, -2.0}, true))).as_complex(),
            std::complex<double>(1.5, -2.0));
  EXPECT_EQ(read_value(numpy_scalar("c16", le_float_bytes({0.1, 3e300}, false))).as_complex(),
            std::complex<double>(0.1, 3e300));
  // '>': each half is one big-endian float; the halves keep their order.
  std::string big = le_float_bytes({0.1, 3e300}, false);
  std::reverse(big.begin(), big.begin() + 8);
  std::reverse(big.begin() + 8, big.end());
  EXPECT_EQ(read_value(numpy_scalar("c16", big, ">")).as_complex(), std::complex<double>(0.1, 3e300));
  // A scalar with the wrong number of bytes for its dtype is refused.
  EXPECT_ERROR_CODE(read(numpy_scalar("c16", le_float_bytes({1.0}, false))), ErrorCode::numpy_array_invalid);
}

TEST(PickleReaderNumpy, RefusesArraysWhoseShapeAndDataDisagree) {
  PickleBuilder short_data;
  short_data.proto(3);
  numpy_array(short_data, {2, 2}, "f4", "12345678");  // 8 bytes for 4 floats
  short_data.stop();
  EXPECT_ERROR_CODE(read(short_data), ErrorCode::numpy_array_invalid);
  PickleBuilder negative;
  negative.proto(3);
  numpy_array(negative, {-1}, "u1", "");
  negative.stop();
  EXPECT_ERROR_CODE(read(negative), ErrorCode::numpy_array_invalid);
  // Object arrays pickle their elements as a list.
  PickleBuilder list_data;
  list_data.proto(3);
  reconstruct(list_data);
  list_data.mark().integer(1).int_tuple({1});
  numpy_dtype(list_data, "f8");
  list_data.boolean(false).empty_list().integer(1).append().tuple().build().stop();
  EXPECT_ERROR_CODE(read(list_data), ErrorCode::numpy_array_invalid);
  EXPECT_ERROR_CODE(read(numpy_scalar("f8", "1234")), ErrorCode::numpy_array_invalid);
}

TEST(PickleReaderNumpy, RefusesMisshapenCallsAndStates) {
  PickleBuilder not_ndarray;  // _reconstruct of anything but numpy.ndarray
  not_ndarray.proto(3).global("numpy._core.multiarray", "_reconstruct").global("collections", "OrderedDict");
  not_ndarray.int_tuple({0});
  binbytes(not_ndarray, "b");
  not_ndarray.tuple3().reduce().stop();
  EXPECT_ERROR_CODE(read(not_ndarray), ErrorCode::pickle_call_args_invalid);
  PickleBuilder ndarray_called;  // the type tag is never called
  ndarray_called.proto(3).global("numpy", "ndarray").empty_tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(ndarray_called), ErrorCode::pickle_call_forbidden);
  PickleBuilder dtype_args;
  dtype_args.proto(3).global("numpy", "dtype").str("f8").tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(dtype_args), ErrorCode::pickle_call_args_invalid);
  PickleBuilder dtype_version;  // a dtype state of another version
  dtype_version.proto(3).global("numpy", "dtype").str("f8").boolean(false).boolean(true).tuple3().reduce();
  dtype_version.mark().integer(2).str("<").none().none().none().integer(-1).integer(-1).integer(0).tuple().build();
  dtype_version.stop();
  EXPECT_ERROR_CODE(read(dtype_version), ErrorCode::pickle_call_args_invalid);
  PickleBuilder byte_order;
  byte_order.proto(3);
  numpy_array(byte_order, {1}, "u1", "x", false, "!");
  byte_order.stop();
  EXPECT_ERROR_CODE(read(byte_order), ErrorCode::pickle_call_args_invalid);
  PickleBuilder array_version;  // array state version 2
  array_version.proto(3);
  reconstruct(array_version);
  array_version.mark().integer(2).int_tuple({1});
  numpy_dtype(array_version, "u1");
  array_version.boolean(false);
  binbytes(array_version, "x");
  array_version.tuple().build().stop();
  EXPECT_ERROR_CODE(read(array_version), ErrorCode::pickle_call_args_invalid);
  // A scalar whose bytes are not one element (every uint64 value itself is read).
  EXPECT_ERROR_CODE(read(numpy_scalar("u8", std::string(7, '\xff'))), ErrorCode::numpy_array_invalid);
  EXPECT_ERROR_CODE(read(numpy_scalar("u8", std::string(9, '\xff'))), ErrorCode::numpy_array_invalid);
}

TEST(PickleReaderNumpy, AnArrayIsFilledOnceAndNeverSharedBeforeThat) {
  // Left without its BUILD, the array is no value.
  PickleBuilder unbuilt;
  unbuilt.proto(3);
  reconstruct(unbuilt);
  unbuilt.tuple1().stop();
  EXPECT_ERROR_CODE(read(unbuilt), ErrorCode::pickle_type_invalid);
  // Fetched from the memo before its BUILD: an alias of a mutable object.
  PickleBuilder shared;
  shared.proto(3);
  reconstruct(shared);
  shared.binput(0).binget(0).stop();
  EXPECT_ERROR_CODE(read(shared), ErrorCode::pickle_memo_mutable);
  // A second BUILD finds a tensor, not an array awaiting its state.
  PickleBuilder twice;
  twice.proto(3);
  numpy_array(twice, {1}, "u1", "x");
  twice.mark().integer(1).int_tuple({1});
  numpy_dtype(twice, "u1");
  twice.boolean(false);
  binbytes(twice, "y");
  twice.tuple().build().stop();
  EXPECT_ERROR_CODE(read(twice), ErrorCode::pickle_build_forbidden);
}

TEST(PickleReaderNumpy, ArraysCountAgainstTheTensorLimits) {
  PickleBuilder p;
  p.proto(3).mark();
  for (int i = 0; i < 3; ++i) numpy_array(p, {1}, "u1", "x");
  p.tuple().stop();
  Limits limits;
  limits.max_tensors = 2;
  EXPECT_ERROR_CODE(read(p, limits), ErrorCode::tensor_count_limit);
  limits.max_tensors = 3;
  EXPECT_EQ(read(p, limits).root.as_list().size(), 3u);
  PickleBuilder big;
  big.proto(3);
  numpy_array(big, {4, 4}, "u1", std::string(16, 'x'));
  big.stop();
  limits.max_tensor_numel = 15;
  EXPECT_ERROR_CODE(read(big, limits), ErrorCode::tensor_numel_limit);
}

// ==== GLOBAL / STACK_GLOBAL ==================================================================

TEST(PickleReader, RejectsGlobalsOutsideTheAllowlist) {
  const std::vector<std::pair<std::string, std::string>> forbidden = {
      {"os", "system"},
      {"posix", "system"},
      {"nt", "system"},
      {"__builtin__", "eval"},
      {"builtins", "eval"},
      {"builtins", "getattr"},
      {"builtins", "frozenset"},  // torch's safe loader refuses it too
      {"__builtin__", "frozenset"},
      {"sys", "modules"},
      {"subprocess", "Popen"},
      {"torch", "load"},
      {"torch", "Tensor"},
      {"torch", "Sizes"},
      {"torch", "EvilStorage"},
      {"torch.cuda", "FloatStorage"},
      {"torch.storage", "TypedStorage"},
      {"torch.storage", "_load_from_bytes"},
      {"torch.jit._pickle", "restore_type_tag"},
      {"torch.jit._pickle", "build_intlist"},
      {"__torch__", "Module"},
      {"__torch__.torch.nn.modules.linear", "Linear"},
      {"torch._tensor", "_rebuild_from_type_v2"},
      {"torch._utils", "_rebuild_tensor"},
      {"torch._utils", "_rebuild_nested_tensor"},
      {"torch._utils", "_rebuild_qtensor"},
      {"torch._utils", "_rebuild_parameter_with_state"},
      {"torch.nn.parameter", "Parameter"},
      {"numpy", "load"},
      {"numpy", "frombuffer"},
      {"numpy.core.multiarray", "_frombuffer"},
      {"numpy._core.numeric", "_frombuffer"},
      {"numpy.random._pickle", "__randomstate_ctor"},
      {"numpy.core.multiarray", "fromstring"},
      {"collections", "defaultdict"},
      {"collections", "deque"},
      {"_codecs", "decode"},
      {"codecs", "encode"},
      {"torch", "float"},  // an alias, never what torch pickles
  };
  for (const auto& [module, name] : forbidden) {
    SCOPED_TRACE(module + "." + name);
    PickleBuilder p;
    p.proto().global(module, name).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_global_forbidden);
    PickleBuilder q;
    q.proto(4).str(module).str(name).op(op::STACK_GLOBAL).stop();
    EXPECT_ERROR_CODE(read(q), ErrorCode::pickle_global_forbidden);
  }
}

TEST(PickleReader, RejectsMalformedSpellingsOfAllowlistedNames) {
  // Allowlisted names are matched before the identifier check; near misses
  // must still be malformed, not forbidden or quantized.
  const std::vector<std::pair<std::string, std::string>> malformed = {
      {"collections ", "OrderedDict"}, {"torch", "FloatStorage "}, {"torch", ".QInt8Storage"},
      {"torch._utils.", "_rebuild_tensor_v2"}, {"torch", std::string("float32\0", 8)},
  };
  for (const auto& [module, name] : malformed) {
    SCOPED_TRACE(module + "|" + name);
    PickleBuilder q;
    q.proto(4).str(module).str(name).op(op::STACK_GLOBAL).stop();
    EXPECT_ERROR_CODE(read(q), ErrorCode::pickle_global_malformed);
  }
}

TEST(PickleReader, RejectsMalformedGlobalNames) {
  const std::vector<std::pair<std::string, std::string>> malformed = {
      {"os system", "x"}, {"os", "sys;tem"},  {"", "OrderedDict"}, {"collections", ""},
      {".os", "x"},       {"os.", "x"},       {"a..b", "x"},       {"1os", "x"},
      {"os", "a.1b"},     {"col\xc3\xa9", "x"}, {std::string(129, 'a'), "x"},
  };
  for (const auto& [module, name] : malformed) {
    SCOPED_TRACE(module + "|" + name);
    PickleBuilder p;
    p.proto().global(module, name).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_global_malformed);
  }
  PickleBuilder long_line;  // no newline within 128 bytes
  long_line.proto().op(op::GLOBAL).raw(std::string(300, 'a')).stop();
  EXPECT_ERROR_CODE(read(long_line), ErrorCode::pickle_global_malformed);
  PickleBuilder stack_ints;
  stack_ints.proto(4).integer(1).integer(2).op(op::STACK_GLOBAL).stop();
  EXPECT_ERROR_CODE(read(stack_ints), ErrorCode::pickle_global_malformed);
  PickleBuilder unterminated;  // the stream ends inside the name line
  unterminated.proto().op(op::GLOBAL).raw("collections\nOrderedDict");
  EXPECT_ERROR_CODE(read(unterminated), ErrorCode::pickle_global_malformed);
  PickleBuilder unterminated_frame;  // the frame ends inside it
  unterminated_frame.proto(4).op(op::FRAME).le(5, 8).op(op::GLOBAL).raw("abcd").raw("\n").raw("x\n").stop();
  EXPECT_ERROR_CODE(read(unterminated_frame), ErrorCode::pickle_frame_invalid);
}

TEST(PickleReader, QuantizedStorageTypesAreUnsupported) {
  PickleBuilder p;
  p.proto().global("torch", "QInt8Storage").stop();
  EXPECT_ERROR_CODE(read(p), ErrorCode::storage_type_unsupported);
}

// ==== REDUCE ===================================================================================

TEST(PickleReader, TypeTagsAreNeverCalled) {
  // torch.FloatStorage(2**30) allocated 4 GiB in 1.13; UntypedStorage and dtypes likewise.
  const std::vector<std::pair<std::string, std::string>> tags = {
      {"torch", "FloatStorage"},
      {"torch", "UntypedStorage"},
      {"torch.storage", "UntypedStorage"},
      {"torch", "float32"}};
  for (const auto& [module, name] : tags) {
    SCOPED_TRACE(name);
    PickleBuilder p;
    p.proto().global(module, name).integer(std::int64_t{1} << 30).tuple1().reduce().stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_call_forbidden);
  }
}

TEST(PickleReader, RejectsReduceOfNonCallables) {
  PickleBuilder str_callable;
  str_callable.proto().str("os.system").empty_tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(str_callable), ErrorCode::pickle_call_forbidden);
  PickleBuilder tensor_callable;  // calling a tensor (or a storage) is not a thing
  tensor_callable.proto().tensor("FloatStorage", "0", 1, 0, {1}, {1}).empty_tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(tensor_callable), ErrorCode::pickle_call_forbidden);
  PickleBuilder storage_callable;
  storage_callable.proto().pid("FloatStorage", "0", 1).empty_tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(storage_callable), ErrorCode::pickle_call_forbidden);
}

TEST(PickleReader, RejectsMisshapenOrderedDictCalls) {
  PickleBuilder not_tuple;
  not_tuple.proto().global("collections", "OrderedDict").empty_list().reduce().stop();
  EXPECT_ERROR_CODE(read(not_tuple), ErrorCode::pickle_call_args_invalid);
  PickleBuilder int_arg;
  int_arg.proto().global("collections", "OrderedDict").integer(1).tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(int_arg), ErrorCode::pickle_call_args_invalid);
  PickleBuilder triple;  // OrderedDict([('a', 1, 2)])
  triple.proto().global("collections", "OrderedDict").str("a").integer(1).integer(2).tuple3().tuple1().tuple1();
  EXPECT_ERROR_CODE(read(triple.reduce().stop()), ErrorCode::pickle_call_args_invalid);
  PickleBuilder two_args;
  two_args.proto().global("collections", "OrderedDict").empty_tuple().empty_tuple().tuple2().reduce().stop();
  EXPECT_ERROR_CODE(read(two_args), ErrorCode::pickle_call_args_invalid);
  PickleBuilder duplicate;
  duplicate.proto().global("collections", "OrderedDict").mark().str("a").integer(1).tuple2().str("a").integer(2);
  duplicate.tuple2().tuple().tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(duplicate), ErrorCode::pickle_duplicate_key);
  PickleBuilder list_key;  // Python could not hash it
  list_key.proto().global("collections", "OrderedDict").mark().empty_list().integer(1).tuple2().tuple().tuple1();
  list_key.reduce().stop();
  EXPECT_ERROR_CODE(read(list_key), ErrorCode::pickle_dict_key_invalid);
  // None is a key as Python allows it.
  PickleBuilder none_key;
  none_key.proto().global("collections", "OrderedDict").mark().none().integer(1).tuple2().tuple().tuple1();
  none_key.reduce().stop();
  const Value none_keyed = read_value(none_key);
  ASSERT_EQ(none_keyed.as_dict().size(), 1u);
  EXPECT_TRUE(none_keyed.as_dict().at_index(0).first.value().is_none());
}

TEST(PickleReader, RejectsCodecsEncodeMisuse) {
  PickleBuilder utf8;
  utf8.proto().global("_codecs", "encode").str("x").str("utf8").tuple2().reduce().stop();
  EXPECT_ERROR_CODE(read(utf8), ErrorCode::pickle_call_args_invalid);
  PickleBuilder one_arg;
  one_arg.proto().global("_codecs", "encode").str("x").tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(one_arg), ErrorCode::pickle_call_args_invalid);
  PickleBuilder wide;  // U+0100 has no latin1 byte
  wide.proto().global("_codecs", "encode").str("\xc4\x80").str("latin1").tuple2().reduce().stop();
  EXPECT_ERROR_CODE(read(wide), ErrorCode::pickle_call_args_invalid);
  PickleBuilder bytes_arg;
  bytes_arg.proto().global("_codecs", "encode").op(op::SHORT_BINBYTES).u8(1).raw("x").str("latin1").tuple2();
  EXPECT_ERROR_CODE(read(bytes_arg.reduce().stop()), ErrorCode::pickle_call_args_invalid);
}

TEST(PickleReader, RejectsNewobjOnOrderedDict) {
  PickleBuilder p;
  p.proto().global("collections", "OrderedDict").empty_tuple().op(op::NEWOBJ).stop();
  EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_call_forbidden);
}

// ==== BUILD ====================================================================================

TEST(PickleReader, RejectsBuildOutsideOrderedDictMetadata) {
  PickleBuilder on_dict;
  on_dict.proto().empty_dict().empty_dict().str("_metadata").empty_dict().setitem().build().stop();
  EXPECT_ERROR_CODE(read(on_dict), ErrorCode::pickle_build_forbidden);
  PickleBuilder on_tensor;  // 1.13 calls tensor.set_(*state): swaps in another storage
  on_tensor.proto().tensor("FloatStorage", "0", 1, 0, {1}, {1}).empty_tuple().build().stop();
  EXPECT_ERROR_CODE(read(on_tensor), ErrorCode::pickle_build_forbidden);
  PickleBuilder other_key;
  other_key.proto().ordered_dict().empty_dict().str("__class__").integer(1).setitem().build().stop();
  EXPECT_ERROR_CODE(read(other_key), ErrorCode::pickle_build_forbidden);
  PickleBuilder none_state;
  none_state.proto().ordered_dict().none().build().stop();
  EXPECT_ERROR_CODE(read(none_state), ErrorCode::pickle_build_forbidden);
  PickleBuilder slot_state;
  slot_state.proto().ordered_dict().empty_dict().none().tuple2().build().stop();
  EXPECT_ERROR_CODE(read(slot_state), ErrorCode::pickle_build_forbidden);
  PickleBuilder non_int;
  non_int.proto().ordered_dict().empty_dict().str("_metadata").empty_dict().str("").empty_dict().str("version");
  non_int.str("1").setitem().setitem().setitem().build().stop();
  EXPECT_ERROR_CODE(read(non_int), ErrorCode::pickle_build_forbidden);
  PickleBuilder twice;
  twice.proto().ordered_dict().empty_dict().str("_metadata").empty_dict().setitem().build();
  twice.empty_dict().str("_metadata").empty_dict().setitem().build().stop();
  EXPECT_ERROR_CODE(read(twice), ErrorCode::pickle_build_forbidden);
}

// ==== SETITEM(S) / APPEND(S) ===================================================================

TEST(PickleReader, RejectsSetitemOnListOrTensor) {
  // CVE-2026-24747 write primitive: SETITEM on a tensor called Tensor.__setitem__.
  PickleBuilder on_tensor;
  on_tensor.proto().tensor("FloatStorage", "0", 6, 0, {6}, {1}).integer(4000).integer(1).setitem().stop();
  EXPECT_ERROR_CODE(read(on_tensor), ErrorCode::pickle_setitem_target);
  PickleBuilder on_list;
  on_list.proto().empty_list().integer(0).integer(1).setitem().stop();
  EXPECT_ERROR_CODE(read(on_list), ErrorCode::pickle_setitem_target);
  PickleBuilder on_tuple;
  on_tuple.proto().empty_tuple().mark().integer(0).integer(1).setitems().stop();
  EXPECT_ERROR_CODE(read(on_tuple), ErrorCode::pickle_setitem_target);
  PickleBuilder on_global;
  on_global.proto().global("collections", "OrderedDict").str("k").integer(1).setitem().stop();
  EXPECT_ERROR_CODE(read(on_global), ErrorCode::pickle_setitem_target);
}

TEST(PickleReader, RejectsAppendOnDictOrTuple) {
  PickleBuilder on_dict;
  on_dict.proto().empty_dict().integer(1).append().stop();
  EXPECT_ERROR_CODE(read(on_dict), ErrorCode::pickle_append_target);
  PickleBuilder on_tuple;
  on_tuple.proto().empty_tuple().mark().integer(1).appends().stop();
  EXPECT_ERROR_CODE(read(on_tuple), ErrorCode::pickle_append_target);
}

// A BINFLOAT (big-endian).
void key_float(PickleBuilder& p, double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  p.op(op::BINFLOAT);
  for (int shift = 56; shift >= 0; shift -= 8) p.u8(static_cast<std::uint8_t>(bits >> shift));
}

TEST(PickleReader, ReadsEveryKeyPythonCanHashAndAFileCanName) {
  // {(1, 2): 0, 1.5: 1, True: 2, None: 3, b'k': 4, (): 5, (1, (2.5, None)): 6, 'a': 7, 9: 8}
  PickleBuilder p;
  p.proto().empty_dict().mark();
  p.integer(1).integer(2).tuple2().integer(0);
  key_float(p, 1.5);
  p.integer(1).boolean(true).integer(2).none().integer(3);
  p.global("_codecs", "encode").str("k").str("latin1").tuple2().reduce().integer(4);
  p.empty_tuple().integer(5);
  p.integer(1);
  key_float(p, 2.5);
  p.none().tuple2().tuple2().integer(6);
  p.str("a").integer(7).integer(9).integer(8);
  p.setitems().stop();
  const Value root = read_value(p);
  const Dict& d = root.as_dict();
  ASSERT_EQ(d.size(), 9u);
  for (std::size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d.at_index(i).second.as_int(), static_cast<std::int64_t>(i));
  EXPECT_EQ(d.at_index(0).first.to_string(), "(1, 2)");
  EXPECT_EQ(d.at_index(1).first.to_string(), "1.5");
  EXPECT_EQ(d.at_index(2).first.to_string(), "True");
  EXPECT_EQ(d.at_index(3).first.to_string(), "None");
  EXPECT_EQ(d.at_index(4).first.to_string(), "b'k'");
  EXPECT_EQ(d.at_index(5).first.to_string(), "()");
  EXPECT_EQ(d.at_index(6).first.to_string(), "(1, (2.5, None))");
  EXPECT_TRUE(d.at_index(2).first.value().is_bool()) << "True stays a bool";
  EXPECT_TRUE(d.at_index(4).first.value().is_bytes());
  // Found by an equal key of another kind, as in Python: 1 == True.
  EXPECT_EQ(d.find(std::int64_t{1})->as_int(), 2);
  EXPECT_EQ(d.find(DictKey(Value::floating(1.0)))->as_int(), 2);
  EXPECT_EQ(d.find(DictKey(Value::tuple({Value::integer(1), Value::integer(2)})))->as_int(), 0);
  EXPECT_EQ(d.find(DictKey(Value::tuple({Value::floating(1.0), Value::boolean(false) /* 0 */})) ), nullptr);
  // The writer writes them back; they read the same.
  const PickleWriteResult written = write_pickle(root);
  MemoryStorages storages;
  const Value back = read_pickle(written.pickle, storages, Limits{}).root;
  EXPECT_EQ(describe_difference(root, back), "");
  EXPECT_TRUE(back.as_dict().at_index(2).first.value().is_bool());
}

TEST(PickleReader, RejectsInvalidDictKeys) {
  const auto keyed = [](const std::function<void(PickleBuilder&)>& key) {
    PickleBuilder p;
    p.proto().empty_dict();
    key(p);
    p.integer(1).setitem().stop();
    return p;
  };
  // Unhashable in Python: a list, a dict, a tuple holding a list.
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) { p.empty_list(); })), ErrorCode::pickle_dict_key_invalid);
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) { p.empty_dict(); })), ErrorCode::pickle_dict_key_invalid);
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) { p.integer(1).empty_list().tuple2(); })),
                    ErrorCode::pickle_dict_key_invalid);
  // A tensor (hashed by identity in Python, which a file cannot carry), also inside a tuple.
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) { p.tensor("FloatStorage", "0", 2, 0, {2}, {1}); })),
                    ErrorCode::pickle_dict_key_invalid);
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) { p.tensor("FloatStorage", "0", 2, 0, {2}, {1}).tuple1(); })),
                    ErrorCode::pickle_dict_key_invalid);
  // Kinds holdpoint keeps out of keys (docs/format.md §5.5): ints beyond int64, complex, sets, torch types.
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) {
                      p.op(op::LONG1).u8(9).raw(std::string("\0\0\0\0\0\0\0\0\x01", 9));  // 2^64
                    })),
                    ErrorCode::pickle_dict_key_invalid);
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) {
                      p.global("builtins", "complex").integer(1).integer(2).tuple2().reduce();
                    })),
                    ErrorCode::pickle_dict_key_invalid);
  EXPECT_ERROR_CODE(read(keyed([](PickleBuilder& p) { p.global("torch", "float32"); })),
                    ErrorCode::pickle_dict_key_invalid);
}

TEST(PickleReader, KeysPythonDeemsEqualAreOneKey) {
  // 1, 1.0 and True are one key in Python: a second is a duplicate, as is a
  // second equal tuple or NaN of the same bits.
  const auto twice = [](const std::function<void(PickleBuilder&)>& first, const std::function<void(PickleBuilder&)>& second) {
    PickleBuilder p;
    p.proto().empty_dict().mark();
    first(p);
    p.integer(1);
    second(p);
    p.integer(2).setitems().stop();
    return p;
  };
  const auto one = [](PickleBuilder& p) { p.integer(1); };
  const auto one_float = [](PickleBuilder& p) { key_float(p, 1.0); };
  const auto true_key = [](PickleBuilder& p) { p.boolean(true); };
  EXPECT_ERROR_CODE(read(twice(one, true_key)), ErrorCode::pickle_duplicate_key);
  EXPECT_ERROR_CODE(read(twice(true_key, one_float)), ErrorCode::pickle_duplicate_key);
  EXPECT_ERROR_CODE(read(twice(one_float, one)), ErrorCode::pickle_duplicate_key);
  EXPECT_ERROR_CODE(read(twice([](PickleBuilder& p) { p.integer(0); }, [](PickleBuilder& p) { key_float(p, -0.0); })),
                    ErrorCode::pickle_duplicate_key);
  EXPECT_ERROR_CODE(read(twice([](PickleBuilder& p) { p.integer(1).none().tuple2(); },
                               [](PickleBuilder& p) { p.boolean(true).none().tuple2(); })),
                    ErrorCode::pickle_duplicate_key);
  // Not equal in Python: a str and bytes, 1.5 and 1, (1,) and 1.
  EXPECT_NO_THROW(read(twice([](PickleBuilder& p) { p.str("k"); },
                             [](PickleBuilder& p) { p.global("_codecs", "encode").str("k").str("latin1").tuple2().reduce(); })));
  EXPECT_NO_THROW(read(twice([](PickleBuilder& p) { key_float(p, 1.5); }, one)));
  EXPECT_NO_THROW(read(twice([](PickleBuilder& p) { p.integer(1).tuple1(); }, one)));
  // The same holds once the dict is indexed (16 keys and more).
  PickleBuilder large;
  large.proto().empty_dict().mark();
  for (int i = 0; i < 40; ++i) large.integer(i).integer(i);
  key_float(large, 33.0);
  large.integer(0).setitems().stop();
  EXPECT_ERROR_CODE(read(large), ErrorCode::pickle_duplicate_key);
}

TEST(PickleReader, RejectsDuplicateKeys) {
  PickleBuilder p;
  p.proto().empty_dict().mark().str("a").integer(1).str("a").integer(2).setitems().stop();
  EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_duplicate_key);
  PickleBuilder ints;
  ints.proto().empty_dict().integer(7).none().setitem().integer(7).none().setitem().stop();
  EXPECT_ERROR_CODE(read(ints), ErrorCode::pickle_duplicate_key);
}

TEST(PickleReader, RejectsVmOnlyObjectsInsideValues) {
  PickleBuilder global_in_list;
  global_in_list.proto().empty_list().global("collections", "OrderedDict").append().stop();
  EXPECT_ERROR_CODE(read(global_in_list), ErrorCode::pickle_type_invalid);
  PickleBuilder storage_in_dict;
  storage_in_dict.proto().empty_dict().str("s").pid("FloatStorage", "0", 1).setitem().stop();
  EXPECT_ERROR_CODE(read(storage_in_dict), ErrorCode::pickle_type_invalid);
  PickleBuilder global_root;
  global_root.proto().global("torch", "FloatStorage").stop();
  EXPECT_ERROR_CODE(read(global_root), ErrorCode::pickle_type_invalid);
  PickleBuilder raw_tuple_root;  // a tuple holding a storage type tag
  raw_tuple_root.proto().global("torch", "FloatStorage").tuple1().stop();
  EXPECT_ERROR_CODE(read(raw_tuple_root), ErrorCode::pickle_type_invalid);
}

// ==== opcodes, protocol, framing ===============================================================

TEST(PickleReader, RejectsEveryOpcodeOutsideTheAllowlist) {
  const std::vector<std::uint8_t> forbidden = {
      op::DUP,   op::POP,       op::POP_MARK, op::LONG4,     op::ADDITEMS,       op::FROZENSET,
      op::DICT,  op::LIST,      op::STRING,   op::UNICODE,   op::FLOAT,       op::GET,            op::PUT,
      op::INST,  op::OBJ,       op::EXT1,     op::EXT2,      op::EXT4,        op::PERSID,
      op::NEWOBJ_EX, op::BINBYTES8, op::BYTEARRAY8, op::NEXT_BUFFER, op::READONLY_BUFFER, 0xff, 0x00, 'z'};
  for (std::uint8_t code : forbidden) {
    SCOPED_TRACE(std::string(op::name(code)) + " " + std::to_string(code));
    PickleBuilder p;
    p.proto().none().op(code).le(0, 16).stop();
    try {
      read(p);
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::pickle_opcode_forbidden);
      // The message names the offset and the opcode.
      EXPECT_NE(error.detail().find("pickle offset 3"), std::string::npos) << error.detail();
      EXPECT_NE(error.detail().find(std::string(op::name(code))), std::string::npos) << error.detail();
    }
  }
}

TEST(PickleReader, RejectsProtocolsOutsideTwoToFiveAndLateProto) {
  for (int version : {0, 1, 6, 255}) {
    SCOPED_TRACE(version);
    PickleBuilder p;
    p.proto(version).none().stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_protocol_unsupported);
  }
  PickleBuilder late;
  late.none().proto(2).stop();
  EXPECT_ERROR_CODE(read(late), ErrorCode::pickle_opcode_forbidden);
}

TEST(PickleReader, RejectsBadFrames) {
  PickleBuilder too_long;
  too_long.proto(4).op(op::FRAME).le(100, 8).none().stop();
  EXPECT_ERROR_CODE(read(too_long), ErrorCode::pickle_frame_invalid);
  PickleBuilder straddling;  // BININT's operand runs past the frame end
  straddling.proto(4).op(op::FRAME).le(2, 8).op(op::BININT).u8(1).le(0, 3).stop();
  EXPECT_ERROR_CODE(read(straddling), ErrorCode::pickle_frame_invalid);
  PickleBuilder nested;
  nested.proto(4).op(op::FRAME).le(11, 8).op(op::FRAME).le(1, 8).none().stop();
  EXPECT_ERROR_CODE(read(nested), ErrorCode::pickle_frame_invalid);
  PickleBuilder ok;  // two consecutive frames
  ok.proto(4).op(op::FRAME).le(1, 8).none().op(op::FRAME).le(1, 8).stop();
  EXPECT_TRUE(read(ok).root.is_none());
}

// ==== memo =====================================================================================

TEST(PickleReader, RejectsMemoMisuse) {
  PickleBuilder missing;
  missing.proto().binget(0).stop();
  EXPECT_ERROR_CODE(read(missing), ErrorCode::pickle_memo_missing);
  PickleBuilder missing_long;
  missing_long.proto().none().binput(0).long_binget(1).stop();
  EXPECT_ERROR_CODE(read(missing_long), ErrorCode::pickle_memo_missing);
  PickleBuilder huge_put;  // 1.13 accepted it; LibTorch resized its memo to 2^32
  huge_put.proto().none().long_binput(0xFFFFFFFF).stop();
  EXPECT_ERROR_CODE(read(huge_put), ErrorCode::pickle_memo_index_invalid);
  PickleBuilder skipping;
  skipping.proto().none().binput(1).stop();
  EXPECT_ERROR_CODE(read(skipping), ErrorCode::pickle_memo_index_invalid);
  PickleBuilder empty_stack;
  empty_stack.proto().binput(0).none().stop();
  EXPECT_ERROR_CODE(read(empty_stack), ErrorCode::pickle_stack_underflow);

  Limits limits;
  limits.max_memo_entries = 2;
  PickleBuilder many;
  many.proto().none().binput(0).binput(1).binput(1).binput(2).stop();
  EXPECT_ERROR_CODE(read(many, limits), ErrorCode::pickle_memo_limit);
  PickleBuilder overwrite;  // overwriting stays within the bound
  overwrite.proto().none().binput(0).binput(1).binput(0).binput(1).stop();
  EXPECT_NO_THROW(read(overwrite, limits));
}

// Both items of a 2-tuple root are one node.
void expect_shared_pair(const Value& root) {
  ASSERT_TRUE(root.is_tuple());
  ASSERT_EQ(root.as_list().size(), 2u);
  EXPECT_NE(root.as_list()[0].node_identity(), nullptr);
  EXPECT_EQ(root.as_list()[0].node_identity(), root.as_list()[1].node_identity());
}

TEST(PickleReader, ReadsAContainerReferencedTwiceAsOneSharedNode) {
  // As torch.save writes them: memoized when made, filled, fetched again later.
  PickleBuilder shared_dict;
  shared_dict.proto().empty_dict().binput(0).binget(0).tuple2().stop();
  expect_shared_pair(read_value(shared_dict));
  PickleBuilder shared_od;
  shared_od.proto().ordered_dict().binput(0).binget(0).tuple2().stop();
  expect_shared_pair(read_value(shared_od));
  PickleBuilder tuple_with_list;  // through an immutable wrapper
  tuple_with_list.proto().empty_list().tuple1().binput(0).binget(0).tuple2().stop();
  expect_shared_pair(read_value(tuple_with_list));
  PickleBuilder dict;  // the memo slot was filled while the dict was still empty
  dict.proto().empty_dict().binput(0).str("k").integer(1).setitem().binget(0).tuple2().stop();
  const Value dicts = read_value(dict);
  expect_shared_pair(dicts);
  EXPECT_EQ(dicts.as_list()[1].as_dict().at("k").as_int(), 1) << "the fetch sees what was set before it";
  PickleBuilder list;
  list.proto().empty_list().binput(0).integer(1).append().binget(0).tuple2().stop();
  expect_shared_pair(read_value(list));
  PickleBuilder built;
  built.proto().ordered_dict().binput(0).empty_dict().str("_metadata").empty_dict().setitem().build();
  built.binget(0).tuple2().stop();
  const Value built_pair = read_value(built);
  expect_shared_pair(built_pair);
  EXPECT_TRUE(built_pair.as_list()[1].as_dict().metadata());
  // {'a': l, 'b': l} with l still on the stack (not yet placed) when fetched.
  PickleBuilder siblings;
  siblings.proto().empty_dict().binput(0).mark().str("a").empty_list().binput(1).mark().integer(1).integer(2);
  siblings.appends().str("b").binget(1).setitems().stop();
  const Value root = read_value(siblings);
  EXPECT_EQ(root.as_dict().at("a").node_identity(), root.as_dict().at("b").node_identity());
  EXPECT_EQ(root.as_dict().at("b").as_list().size(), 2u);
}

TEST(PickleReader, RefusesCyclesWithTheirOwnCode) {
  PickleBuilder self_list;  // l = []; l.append(l), as pickle writes it
  self_list.proto().empty_list().binput(0).mark().binget(0).appends().stop();
  EXPECT_ERROR_CODE(read(self_list), ErrorCode::pickle_cycle);
  PickleBuilder self_dict;  // d = {}; d['me'] = d
  self_dict.proto().empty_dict().binput(0).mark().str("me").binget(0).setitems().stop();
  EXPECT_ERROR_CODE(read(self_dict), ErrorCode::pickle_cycle);
  PickleBuilder through_child;  // a = []; b = [a]; a.append(b)
  through_child.proto().empty_list().binput(0).empty_list().binput(1).binget(0).append().append().stop();
  EXPECT_ERROR_CODE(read(through_child), ErrorCode::pickle_cycle);
  PickleBuilder through_tuple;  // a = []; a.append((a,))
  through_tuple.proto().empty_list().binput(0).binget(0).tuple1().append().stop();
  EXPECT_ERROR_CODE(read(through_tuple), ErrorCode::pickle_cycle);
  // Changing a container after the memo handed it out is refused alike,
  // cycle or not: it is how a container comes to hold itself.
  PickleBuilder changed;
  changed.proto().empty_dict().binput(0).binget(0).str("k").integer(1).setitem().tuple2().stop();
  EXPECT_ERROR_CODE(read(changed), ErrorCode::pickle_cycle);
  PickleBuilder metadata_after;
  metadata_after.proto().ordered_dict().binput(0).binget(0).empty_dict().str("_metadata").empty_dict().setitem();
  metadata_after.build().tuple2().stop();
  EXPECT_ERROR_CODE(read(metadata_after), ErrorCode::pickle_cycle);
}

TEST(PickleReader, ASharedContainerCountsItsWholeSizeAtEveryFetch) {
  // A list of 1000 ints fetched 6 times: 6006 expanded nodes, past a bound of 5000.
  const auto fetched = [](int times) {
    PickleBuilder p;
    p.proto().empty_list().binput(0).mark();
    for (int i = 0; i < 1000; ++i) p.integer(i);
    p.appends().mark();
    for (int i = 0; i < times; ++i) p.binget(0);
    p.tuple().tuple2().stop();
    return p;
  };
  Limits limits;
  limits.max_expanded_nodes = 5000;
  EXPECT_NO_THROW(read(fetched(4), limits));
  EXPECT_ERROR_CODE(read(fetched(6), limits), ErrorCode::pickle_expansion_limit);
  // A list fetched while empty and filled afterwards would count as empty:
  // the fill is refused instead.
  PickleBuilder grown;
  grown.proto().empty_list().binput(0).mark().binget(0).binget(0).binget(0).tuple();
  grown.binget(0).mark().integer(1).integer(2).appends().tuple2().stop();
  EXPECT_ERROR_CODE(read(grown), ErrorCode::pickle_cycle);
  // A fetch nests as deep as the container is now, not as it was when
  // memoized: [[[]]] memoized while empty, then fetched into one more list.
  Limits shallow;
  shallow.max_nesting_depth = 3;
  const auto wrapped = [](bool wrap) {
    PickleBuilder p;
    p.proto().empty_list().binput(0).empty_list().empty_list().append().append();
    if (wrap) p.empty_list().binget(0).append().tuple2();
    return p.stop();
  };
  EXPECT_NO_THROW(read(wrapped(false), shallow));
  EXPECT_ERROR_CODE(read(wrapped(true), shallow), ErrorCode::pickle_nesting_limit);
}

TEST(PickleReader, RejectsExponentialTupleDag) {
  // t0 = ('x',); t(k+1) = (tk, tk) to depth 64: 2^64 nodes from ~600 bytes.
  PickleBuilder p;
  p.proto().mark().str("x").tuple1().binput(0);
  for (int k = 0; k < 64; ++k) {
    p.binget(static_cast<std::uint8_t>(k)).binget(static_cast<std::uint8_t>(k)).tuple2();
    p.binput(static_cast<std::uint8_t>(k + 1));
  }
  p.tuple().stop();
  EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_expansion_limit);
  Limits limits;
  limits.max_expanded_nodes = 1000;
  PickleBuilder small;  // 2^10 expansion exceeds a tight budget as well
  small.proto().mark().str("x").tuple1().binput(0);
  for (int k = 0; k < 10; ++k) {
    small.binget(static_cast<std::uint8_t>(k)).binget(static_cast<std::uint8_t>(k)).tuple2();
    small.binput(static_cast<std::uint8_t>(k + 1));
  }
  small.tuple().stop();
  EXPECT_ERROR_CODE(read(small, limits), ErrorCode::pickle_expansion_limit);
  limits.max_expanded_nodes = 1 << 20;
  EXPECT_NO_THROW(read(small, limits));
}

// The machine keeps only the memo entries that some BINGET names and drops the
// tuples and strings nothing refers to any more (PickleOptions::
// keep_fetched_memo_only). A large pickle in torch.save's manner, every object
// memoized, with objects memoized first and fetched after thousands of
// compactions, reads the same either way.

// Kinds, keys, scalars and tensor geometry, with storages and tensors numbered
// by first appearance so that sharing shows.
void render(const Value& value, std::string& out, std::unordered_map<const void*, std::size_t>& seen) {
  const auto number = [&seen](const void* p) { return seen.try_emplace(p, seen.size()).first->second; };
  out += std::string(value_kind_name(value.kind())) + ":";
  switch (value.kind()) {
    case ValueKind::none: break;
    case ValueKind::boolean: out += value.as_bool() ? "1" : "0"; break;
    case ValueKind::integer: out += std::to_string(value.as_int()); break;
    case ValueKind::floating: out += std::to_string(value.as_double()); break;
    case ValueKind::string: out += value.as_string(); break;
    case ValueKind::bytes: out += std::string(value.as_bytes()); break;
    case ValueKind::big_integer: out += big_integer_decimal(value.as_big_integer()); break;
    case ValueKind::bytearray: out += std::string(value.as_bytes()); break;
    case ValueKind::complex_number:
    case ValueKind::device:
    case ValueKind::dtype:
    case ValueKind::layout: out += typed_scalar_text(value); break;
    case ValueKind::meta_tensor:
      out += "t" + std::to_string(number(&value.as_meta_tensor())) + typed_scalar_text(value);
      break;
    case ValueKind::sparse_tensor:
      out += "t" + std::to_string(number(&value.as_sparse_tensor())) + typed_scalar_text(value) + "(";
      for (const Value& part : value.as_sparse_tensor().parts) render(part, out, seen), out += ",";
      out += ")";
      break;
    case ValueKind::list:
    case ValueKind::tuple:
    case ValueKind::set:
    case ValueKind::size:
      out += "[";
      for (const Value& element : value.as_list()) render(element, out, seen), out += ",";
      out += "]";
      break;
    case ValueKind::dict:
    case ValueKind::ordered_dict:
      out += "{";
      for (const auto& [key, element] : value.as_dict()) out += key.to_string() + "=", render(element, out, seen), out += ",";
      out += "}";
      break;
    case ValueKind::tensor: {
      const TensorData& tensor = value.as_tensor();
      out += "t" + std::to_string(number(&tensor)) + "/s" + std::to_string(number(tensor.storage->identity())) +
             std::string(dtype_name(tensor.dtype)) + shape_text(tensor.sizes) + shape_text(tensor.strides) + "+" +
             std::to_string(tensor.storage_offset) + (tensor.requires_grad ? "g" : "") +
             (tensor.is_parameter ? "p" : "") + "#" + std::to_string(tensor.storage->nbytes());
      break;
    }
  }
}

std::string render(const Value& value) {
  std::string out;
  std::unordered_map<const void*, std::size_t> seen;
  render(value, out, seen);
  return out;
}

// {'early': ('early', 7), 's': 'shared', 'groups': [{'w<i>': tensor, 'n<i>': [i, 'shared']}, ...],
//  'late_tuple': <memo 0>, 'late_str': <memo 1>, 'tied': <the tensor of group
// 1500>} with every object memoized, as Python's pickler does.
PickleBuilder memo_heavy_state(std::size_t groups) {
  PickleBuilder p;
  std::uint32_t memo = 0;
  const auto put = [&p, &memo] { p.long_binput(memo++); };
  p.proto().empty_dict();
  put();
  p.mark().str("early");
  put();
  p.str("early").integer(7).tuple2();
  put();  // memo 2: the tuple
  p.str("s").str("shared");
  put();  // memo 3
  // Closing the batch takes these off the stack: only the memo keeps them.
  p.setitems().mark().str("groups");
  put();
  p.empty_list();
  put();  // memo 5; group i then memoizes 6 + 5i (its dict) to 10 + 5i (its list)
  std::uint32_t tied = 0;
  for (std::size_t i = 0; i < groups; ++i) {
    if (i % 100 == 0) p.mark();
    p.empty_dict();
    put();
    p.mark().str("w" + std::to_string(i));
    put();
    p.tensor("FloatStorage", std::to_string(i), 6, 0, {2, 3}, {3, 1});
    if (i == groups / 2) tied = memo;
    put();
    p.str("n" + std::to_string(i));
    put();
    p.empty_list();
    put();
    p.mark().integer(static_cast<std::int64_t>(i)).long_binget(3).appends();
    p.setitems();
    if (i % 100 == 99 || i + 1 == groups) p.appends();
  }
  p.str("late_tuple").long_binget(2).str("late_str").long_binget(3).str("tied").long_binget(tied);
  p.setitems().stop();
  return p;
}

TEST(PickleReader, KeepingOnlyFetchedMemoEntriesReadsTheSame) {
  const PickleBuilder pickle = memo_heavy_state(3000);
  PickleOptions keep_all;
  keep_all.keep_fetched_memo_only = false;
  const PickleResult compact = read(pickle);
  const PickleResult full = read(pickle, Limits{}, keep_all);
  EXPECT_EQ(render(compact.root), render(full.root));
  EXPECT_EQ(compact.tensor_count, 3000u);
  const Dict& root = compact.root.as_dict();
  const Value::List& late = root.at("late_tuple").as_list();
  ASSERT_EQ(late.size(), 2u);
  EXPECT_EQ(late[0].as_string(), "early");
  EXPECT_EQ(late[1].as_int(), 7);
  EXPECT_EQ(root.at("late_str").as_string(), "shared");
  const Value::List& groups = root.at("groups").as_list();
  ASSERT_EQ(groups.size(), 3000u);
  EXPECT_EQ(groups[2999].as_dict().at("n2999").as_list()[1].as_string(), "shared");
  EXPECT_EQ(root.at("tied").tensor_ptr(), groups[1500].as_dict().at("w1500").tensor_ptr());
  EXPECT_EQ(root.at("tied").as_tensor().sizes, (std::vector<std::int64_t>{2, 3}));
}

// PickleOptions::on_spent: a caller that gives the reported bytes back (they
// then read as zeros) gets the same result. The fixture holds what the VM
// still needs from early bytes at the end: a string memoized first and
// fetched last, and a storage whose key goes in the hashed table (too large
// for the by-number one) that a late view names again.
PickleBuilder late_references_state(std::size_t tensors) {
  PickleBuilder p;
  p.proto().empty_dict().binput(0).mark();
  p.str("first").binput(1).tensor("FloatStorage", "9999999999", 6, 0, {6}, {1}).binput(2);
  p.str("early").binput(3).str("a string fetched again at the very end").binput(4);
  p.setitems();
  for (std::size_t i = 0; i < tensors; ++i) {
    if (i % 1000 == 0) p.mark();
    p.str("w" + std::to_string(i)).tensor("FloatStorage", std::to_string(i), 6, 0, {2, 3}, {3, 1});
    if (i % 1000 == 999 || i + 1 == tensors) p.setitems();
  }
  p.mark().str("late_view").tensor("FloatStorage", "9999999999", 6, 2, {2}, {1});
  p.str("late_view_of_0").tensor("FloatStorage", "0", 6, 1, {3}, {1});
  p.str("late_str").binget(4).setitems().stop();
  return p;
}

struct SpentRead {
  PickleResult result;
  std::vector<std::size_t> reports;
  int resolve_calls = 0;
};

// Reads a copy of `bytes`, zeroing every byte the VM reports spent.
SpentRead read_zeroing_spent(std::vector<std::byte> bytes, PickleOptions options = {},
                             bool allow_trailing_bytes = false) {
  SpentRead out;
  options.on_spent = [&](std::size_t spent) {
    out.reports.push_back(spent);
    std::fill(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(spent), std::byte{0});
  };
  MemoryStorages storages;
  storages.fabricate_missing(1 << 20);
  out.result = read_pickle(bytes, storages, Limits{}, options, allow_trailing_bytes);
  out.resolve_calls = storages.resolve_calls;
  return out;
}

TEST(PickleReader, BytesReportedSpentAreNeverReadAgain) {
  const std::vector<std::byte> bytes = late_references_state(40000).bytes();
  ASSERT_GT(bytes.size(), std::size_t{2} << 20) << "the fixture must span several reports";
  const PickleResult plain = read(late_references_state(40000));
  const SpentRead zeroed = read_zeroing_spent(bytes);

  ASSERT_GE(zeroed.reports.size(), 2u);
  EXPECT_GE(zeroed.reports.front(), std::size_t{256} << 10);
  for (std::size_t i = 1; i < zeroed.reports.size(); ++i) EXPECT_GT(zeroed.reports[i], zeroed.reports[i - 1]);
  EXPECT_LT(zeroed.reports.back(), bytes.size());

  EXPECT_TRUE(render(zeroed.result.root) == render(plain.root)) << "the result differs once spent bytes are zeros";
  EXPECT_EQ(zeroed.resolve_calls, 40001) << "a late view found its storage again by key";
  EXPECT_EQ(zeroed.result.storage_count, 40001u);
  const Dict& root = zeroed.result.root.as_dict();
  EXPECT_EQ(root.at("late_str").as_string(), "a string fetched again at the very end");
  EXPECT_EQ(root.at("late_view").as_tensor().storage, root.at("first").as_tensor().storage);
  EXPECT_EQ(root.at("late_view_of_0").as_tensor().storage, root.at("w0").as_tensor().storage);
  EXPECT_EQ(root.at("w39999").as_tensor().sizes, (std::vector<std::int64_t>{2, 3}));
}

TEST(PickleReader, FrequentSpentReportsReadTheSame) {
  // A report every 100 bytes: views into spent bytes are copied out in the
  // middle of tensors, tuples and memoized groups.
  PickleOptions often;
  often.spend_every_bytes = 100;
  for (const PickleBuilder& pickle : {late_references_state(3000), memo_heavy_state(3000)}) {
    const std::vector<std::byte> bytes = pickle.bytes();
    const SpentRead zeroed = read_zeroing_spent(bytes, often);
    EXPECT_GE(zeroed.reports.size(), bytes.size() / 100 / 2);
    EXPECT_TRUE(render(zeroed.result.root) == render(read(pickle).root));
  }
}

TEST(PickleReader, AMessageNamesAStorageWhoseKeyBytesAreSpent) {
  // Views past their storage's end, declared after the storages' keys went
  // with the spent bytes: the message still names each storage by its key
  // (one found by number, one through the hashed table).
  for (const std::string key : {"7", "9999999999"}) {
    PickleBuilder p = late_references_state(40000);
    std::vector<std::byte> bytes = p.bytes();
    bytes.pop_back();  // STOP
    bytes.pop_back();  // the SETITEMS that closes the late entries
    PickleBuilder tail;
    tail.str("too_far").tensor("FloatStorage", key, 6, 0, {7}, {1}).setitems().stop();
    const std::vector<std::byte> more = tail.bytes();
    bytes.insert(bytes.end(), more.begin(), more.end());
    std::vector<std::size_t> reports;
    PickleOptions options;
    options.on_spent = [&](std::size_t spent) {
      reports.push_back(spent);
      std::fill(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(spent), std::byte{0});
    };
    MemoryStorages storages;
    storages.fabricate_missing(1 << 20);
    try {
      read_pickle(bytes, storages, Limits{}, options);
      ADD_FAILURE() << "a view past its storage was accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::tensor_out_of_bounds);
      EXPECT_NE(std::string(error.what()).find("storage '" + key + "' of 6 elements"), std::string::npos)
          << error.what();
    }
    EXPECT_GE(reports.size(), 2u);
  }
}

TEST(PickleReader, NothingIsReportedSpentWhereTheVmMayReadItAgain) {
  const std::vector<std::byte> bytes = late_references_state(40000).bytes();
  const std::string expected = render(read(late_references_state(40000)).root);
  // Every memo entry kept: any early string may be fetched again.
  PickleOptions keep_all;
  keep_all.keep_fetched_memo_only = false;
  const SpentRead kept = read_zeroing_spent(bytes, keep_all);
  EXPECT_TRUE(kept.reports.empty());
  EXPECT_TRUE(render(kept.result.root) == expected);
  // A stream with trailing bytes (a legacy file) hands over more than the pickle.
  const SpentRead legacy = read_zeroing_spent(bytes, {}, /*allow_trailing_bytes=*/true);
  EXPECT_TRUE(legacy.reports.empty());
  EXPECT_TRUE(render(legacy.result.root) == expected);
  // A small pickle has nothing worth reporting.
  const SpentRead small = read_zeroing_spent(late_references_state(100).bytes());
  EXPECT_TRUE(small.reports.empty());
  EXPECT_EQ(small.result.tensor_count, 103u);
}

TEST(PickleReader, ManyFetchesOfFewEntriesReadTheSame) {
  // 200,000 fetches of three entries (the list of fetched indices is
  // deduplicated as it grows) and fetches of an index no memo can reach.
  PickleBuilder p;
  p.proto().mark().str("a").binput(0).str("b").binput(1).str("c").long_binput(2);
  for (int i = 0; i < 200000; ++i) p.binget(static_cast<std::uint8_t>(i % 2));
  p.long_binget(2).tuple().stop();
  PickleOptions keep_all;
  keep_all.keep_fetched_memo_only = false;
  const PickleResult compact = read(p);
  EXPECT_EQ(render(compact.root), render(read(p, Limits{}, keep_all).root));
  ASSERT_EQ(compact.root.as_list().size(), 3u + 200000u + 1u);
  EXPECT_EQ(compact.root.as_list()[3].as_string(), "a");
  EXPECT_EQ(compact.root.as_list()[3 + 199999].as_string(), "b");
  EXPECT_EQ(compact.root.as_list()[3 + 200000].as_string(), "c");
  Limits limits;
  limits.max_memo_entries = 3;
  PickleBuilder beyond;  // past max_memo_entries: never stored, so missing
  beyond.proto().str("a").binput(0).long_binget(3).tuple2().stop();
  EXPECT_ERROR_CODE(read(beyond, limits), ErrorCode::pickle_memo_missing);
}

TEST(PickleReader, DroppingTensorsChecksThemAndKeepsEverythingElse) {
  PickleOptions drop;
  drop.drop_tensors = true;
  const PickleBuilder state = memo_heavy_state(300);
  const PickleResult full = read(state);
  const PickleResult dropped = read(state, Limits{}, drop);
  EXPECT_TRUE(testing::reads_as_dropped(dropped.root, full.root));
  EXPECT_EQ(dropped.tensor_count, 300u);
  EXPECT_EQ(dropped.storage_count, full.storage_count);
  // Dicts filled by SETITEMS take no entry for a tensor.
  const Dict& root = dropped.root.as_dict();
  EXPECT_EQ(root.find("tied"), nullptr);
  EXPECT_EQ(root.at("late_str").as_string(), "shared");
  const Dict& group = root.at("groups").as_list()[7].as_dict();
  EXPECT_EQ(group.size(), 1u);
  EXPECT_EQ(group.find("w7"), nullptr);
  EXPECT_EQ(group.at("n7").as_list()[0].as_int(), 7);

  // A parameter set by SETITEM, a list, a tuple, an OrderedDict built from
  // pairs and one with _metadata; a tensor at the root stays one.
  PickleBuilder nested;
  nested.proto().global("collections", "OrderedDict").empty_tuple().reduce().binput(0);
  nested.str("p").global("torch._utils", "_rebuild_parameter").tensor("FloatStorage", "0", 6, 0, {2, 3}, {3, 1});
  nested.boolean(true).ordered_dict().tuple3().reduce().setitem();
  nested.str("l").empty_list().tensor("FloatStorage", "1", 4, 0, {4}, {1}).append().setitem();
  nested.str("t").tensor("FloatStorage", "1", 4, 1, {2}, {1}).integer(3).tuple2().setitem();
  nested.str("pairs").global("collections", "OrderedDict").empty_list().str("w");
  nested.tensor("FloatStorage", "1", 4, 2, {2}, {1}).tuple2().append().tuple1().reduce().setitem();
  nested.empty_dict().str("_metadata").global("collections", "OrderedDict").empty_tuple().reduce();
  nested.str("").empty_dict().str("version").integer(1).setitem().setitem().setitem().build().stop();
  const PickleResult nested_full = read(nested);
  const PickleResult nested_dropped = read(nested, Limits{}, drop);
  EXPECT_TRUE(testing::reads_as_dropped(nested_dropped.root, nested_full.root));
  const Dict& nested_root = nested_dropped.root.as_dict();
  EXPECT_EQ(nested_root.find("p"), nullptr);
  EXPECT_TRUE(nested_root.at("l").as_list()[0].is_none());
  EXPECT_TRUE(nested_root.at("t").as_list()[0].is_none());
  EXPECT_EQ(nested_root.at("t").as_list()[1].as_int(), 3);
  EXPECT_TRUE(nested_root.at("pairs").as_dict().at("w").is_none());
  ASSERT_NE(nested_root.metadata(), nullptr);
  EXPECT_EQ(nested_dropped.tensor_count, 4u);
  PickleBuilder bare;
  bare.proto().tensor("FloatStorage", "0", 6, 0, {2, 3}, {3, 1}).stop();
  EXPECT_TRUE(read(bare, Limits{}, drop).root.is_tensor());
  // The oracle tells a dropped read from a wrong one.
  EXPECT_FALSE(testing::reads_as_dropped(full.root, full.root));
  EXPECT_FALSE(testing::reads_as_dropped(nested_full.root, nested_dropped.root));
}

TEST(PickleReader, DroppingTensorsRefusesWhatReadingRefusesWithTheSameCode) {
  PickleOptions drop;
  drop.drop_tensors = true;
  std::vector<std::pair<PickleBuilder, ErrorCode>> cases(8);
  // A view past its storage, in a dict.
  cases[0].first.proto().empty_dict().str("w").tensor("FloatStorage", "0", 6, 0, {2, 4}, {4, 1}).setitem().stop();
  cases[0].second = ErrorCode::tensor_out_of_bounds;
  // A tensor as a Counter's count: dropped first, refused all the same.
  cases[1].first.proto().global("collections", "Counter").empty_dict().integer(2);
  cases[1].first.tensor("FloatStorage", "0", 1, 0, {}, {}).setitem().tuple1().reduce().stop();
  cases[1].second = ErrorCode::pickle_call_args_invalid;
  // A tensor as a module version in _metadata.
  cases[2].first.proto().global("collections", "OrderedDict").empty_tuple().reduce().empty_dict().str("_metadata");
  cases[2].first.empty_dict().str("").empty_dict().str("version").tensor("FloatStorage", "0", 1, 0, {}, {});
  cases[2].first.setitem().setitem().setitem().build().stop();
  cases[2].second = ErrorCode::pickle_build_forbidden;
  // The same key twice, both values tensors.
  cases[3].first.proto().empty_dict().mark().str("w").tensor("FloatStorage", "0", 6, 0, {6}, {1});
  cases[3].first.str("w").tensor("FloatStorage", "1", 6, 0, {6}, {1}).setitems().stop();
  cases[3].second = ErrorCode::pickle_duplicate_key;
  // One storage key declared with two sizes.
  cases[4].first.proto().empty_list().mark().tensor("FloatStorage", "0", 6, 0, {6}, {1});
  cases[4].first.tensor("FloatStorage", "0", 8, 0, {8}, {1}).appends().stop();
  cases[4].second = ErrorCode::storage_redeclared;
  // requires_grad on an integer tensor.
  cases[5].first.proto().empty_list().tensor("LongStorage", "0", 6, 0, {6}, {1}, true).append().stop();
  cases[5].second = ErrorCode::tensor_requires_grad_invalid;
  // A tensor as a backward hook: the hooks dict is not empty, though its
  // entry was dropped.
  cases[6].first.proto().global("torch._utils", "_rebuild_tensor_v2").mark();
  cases[6].first.pid("FloatStorage", "0", 6).integer(0).int_tuple({6}).int_tuple({1}).boolean(false);
  cases[6].first.global("collections", "OrderedDict").empty_tuple().reduce().integer(1);
  cases[6].first.tensor("FloatStorage", "1", 1, 0, {}, {}).setitem().tuple().reduce().stop();
  cases[6].second = ErrorCode::tensor_hooks_not_empty;
  // A tensor beside _metadata in a BUILD state: not a dict whose only key is
  // '_metadata'.
  cases[7].first.proto().global("collections", "OrderedDict").empty_tuple().reduce().empty_dict().mark();
  cases[7].first.str("_metadata").empty_dict().str("w").tensor("FloatStorage", "0", 1, 0, {}, {});
  cases[7].first.setitems().build().stop();
  cases[7].second = ErrorCode::pickle_build_forbidden;
  for (const auto& test_case : cases) {  // not a structured binding: lambdas capture it (clang 14)
    const PickleBuilder& pickle = test_case.first;
    const ErrorCode code = test_case.second;
    EXPECT_ERROR_CODE(read(pickle), code);
    EXPECT_ERROR_CODE(read(pickle, Limits{}, drop), code);
  }
  // A key used twice, once for a dropped tensor and once for something kept,
  // in either order, and as an int; the same key in two dicts is no duplicate.
  PickleBuilder tensor_then_int;
  tensor_then_int.proto().empty_dict().mark().str("w").tensor("FloatStorage", "0", 6, 0, {6}, {1});
  tensor_then_int.str("w").integer(1).setitems().stop();
  PickleBuilder int_then_tensor;
  int_then_tensor.proto().empty_dict().mark().integer(4).integer(1).integer(4);
  int_then_tensor.tensor("FloatStorage", "0", 6, 0, {6}, {1}).setitems().stop();
  for (const PickleBuilder* pickle : {&tensor_then_int, &int_then_tensor}) {
    EXPECT_ERROR_CODE(read(*pickle), ErrorCode::pickle_duplicate_key);
    EXPECT_ERROR_CODE(read(*pickle, Limits{}, drop), ErrorCode::pickle_duplicate_key);
  }
  PickleBuilder two_dicts;
  two_dicts.proto().empty_list().mark();
  for (int i = 0; i < 2; ++i) {
    two_dicts.empty_dict().str("w").tensor("FloatStorage", std::to_string(i), 6, 0, {6}, {1}).setitem();
  }
  two_dicts.appends().stop();
  const PickleResult two = read(two_dicts, Limits{}, drop);
  ASSERT_EQ(two.root.as_list().size(), 2u);
  EXPECT_TRUE(two.root.as_list()[1].as_dict().empty());
}

TEST(PickleReader, MemoRejectionsHoldAfterCompactions) {
  // memo_heavy_state(1000) up to its last SETITEMS, then one more key whose
  // value is fetched from the memo.
  const auto fetched_last = [](std::uint32_t index) {
    PickleBuilder head = memo_heavy_state(1000);
    auto bytes = head.bytes();
    bytes.resize(bytes.size() - 2);  // SETITEMS, STOP
    PickleBuilder p;
    p.raw(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    p.str("x").long_binget(index).setitems().stop();
    return p;
  };
  // The list memoized before everything else (memo 5) is shared, however
  // much was dropped in between.
  const PickleResult groups = read(fetched_last(5));
  EXPECT_EQ(groups.root.as_dict().at("x").node_identity(), groups.root.as_dict().at("groups").node_identity());
  EXPECT_EQ(groups.root.as_dict().at("x").as_list().size(), 1000u);
  EXPECT_ERROR_CODE(read(fetched_last(6 + 5 * 1000)), ErrorCode::pickle_memo_missing);  // one past the memo
  // The last group's tensor (memo 6 + 5 * 999 + 2) is there.
  const PickleResult last = read(fetched_last(6 + 5 * 999 + 2));
  const Dict& root = last.root.as_dict();
  EXPECT_EQ(root.at("x").tensor_ptr(), root.at("groups").as_list()[999].as_dict().at("w999").tensor_ptr());
}

// ==== stack, marks, STOP =======================================================================

// ---- the tensor fast path ----

// The read of `pickle` with the tensor fast path is the read without it: an
// equal value and counts, or the same error code and message.
struct Outcome {
  std::optional<ErrorCode> code;  // nullopt: accepted
  std::uint64_t fast_path_tensors = 0;
};

Outcome expect_same_without_fast_path(const PickleBuilder& pickle, const Limits& limits = {}) {
  PickleOptions slow;
  slow.tensor_fast_path = false;
  const auto attempt = [&](const PickleOptions& options) -> std::variant<PickleResult, Error> {
    try {
      return read(pickle, limits, options);
    } catch (const Error& error) {
      return error;
    }
  };
  const auto fast = attempt({});
  const auto plain = attempt(slow);
  EXPECT_EQ(fast.index(), plain.index());
  if (fast.index() != plain.index()) return {ErrorCode::invalid_argument, 0};
  if (const auto* result = std::get_if<PickleResult>(&fast)) {
    const auto& reference = std::get<PickleResult>(plain);
    EXPECT_EQ(render(result->root), render(reference.root));
    EXPECT_EQ(result->tensor_count, reference.tensor_count);
    EXPECT_EQ(result->storage_count, reference.storage_count);
    EXPECT_EQ(reference.fast_path_tensors, 0u);
    return {std::nullopt, result->fast_path_tensors};
  }
  const Error& error = std::get<Error>(fast);
  EXPECT_EQ(error.code(), std::get<Error>(plain).code());
  EXPECT_STREQ(error.what(), std::get<Error>(plain).what());
  return {error.code(), 0};
}

// {'w<i>': tensor i} as torch.save memoizes it: every object but an int is
// BINPUT, and the rebuild and storage globals, 'storage', 'cpu' and the
// OrderedDict global are fetched back by every tensor after the first.
PickleBuilder torch_style_state(std::size_t tensors, std::initializer_list<std::int64_t> size = {2, 3},
                                std::initializer_list<std::int64_t> stride = {3, 1}) {
  PickleBuilder p;
  std::uint32_t next = 0;
  const auto binput = [&p, &next] {
    const std::uint32_t index = next++;
    p.long_binput(index);
    return index;
  };
  p.proto().empty_dict();
  binput();
  p.mark();
  std::uint32_t rebuild = 0, tag = 0, type = 0, cpu = 0, hooks = 0;
  std::int64_t numel = 1;
  for (std::int64_t d : size) numel *= d;
  for (std::size_t i = 0; i < tensors; ++i) {
    p.str("w" + std::to_string(i));
    binput();
    if (i == 0) {
      p.global("torch._utils", "_rebuild_tensor_v2");
      rebuild = binput();
      p.mark().mark().str("storage");
      tag = binput();
      p.global("torch", "FloatStorage");
      type = binput();
    } else {
      p.long_binget(rebuild).mark().mark().long_binget(tag).long_binget(type);
    }
    p.str(std::to_string(i));
    binput();
    if (i == 0) {
      p.str("cpu");
      cpu = binput();
    } else {
      p.long_binget(cpu);
    }
    p.integer(numel).tuple();
    binput();
    p.binpersid().integer(0);
    p.int_tuple(size);
    binput();
    p.int_tuple(stride);
    binput();
    p.boolean(false);
    if (i == 0) {
      p.global("collections", "OrderedDict");
      hooks = binput();
    } else {
      p.long_binget(hooks);
    }
    p.empty_tuple().reduce();
    binput();
    p.tuple();
    binput();
    p.reduce();
    binput();
  }
  p.setitems().stop();
  return p;
}

TEST(PickleReader, TensorFastPathReadsTheSame) {
  // holdpoint's writer: no memo at all; every tensor takes the fast path.
  PickleBuilder plain;
  plain.proto().ordered_dict().mark();
  for (int i = 0; i < 50; ++i) {
    plain.str("w" + std::to_string(i)).tensor("FloatStorage", std::to_string(i), 6, 0, {2, 3}, {3, 1}, i % 2 == 0);
  }
  plain.setitems().stop();
  const Outcome plain_outcome = expect_same_without_fast_path(plain);
  EXPECT_FALSE(plain_outcome.code);
  EXPECT_EQ(plain_outcome.fast_path_tensors, 50u);

  // torch.save's memo: the first tensor stores entries the others fetch, so
  // it goes opcode by opcode; the other 199 take the fast path.
  const auto accepted_with = [](const PickleBuilder& pickle, std::uint64_t fast_path_tensors) {
    const Outcome outcome = expect_same_without_fast_path(pickle);
    EXPECT_FALSE(outcome.code);
    EXPECT_EQ(outcome.fast_path_tensors, fast_path_tensors);
  };
  accepted_with(torch_style_state(200), 199);
  accepted_with(torch_style_state(20, {}, {}), 19);                               // 0-d: EMPTY_TUPLE
  accepted_with(torch_style_state(20, {70000}, {1}), 19);                         // BININT, TUPLE1
  accepted_with(torch_style_state(5, {1, 2, 3, 1, 2}, {12, 6, 2, 2, 1}), 4);      // MARK ... TUPLE

  // Every object memoized, a tensor fetched again, tensors shared: the
  // tensor's own BINPUT follows the run and is the loop's.
  accepted_with(memo_heavy_state(300), 300);

  // A parameter around a tensor, one storage under two views, and runs the
  // fast path leaves to the loop (_rebuild_tensor_v3 over an UntypedStorage,
  // a metadata argument).
  PickleBuilder mixed;
  mixed.proto().empty_dict().mark().str("p").global("torch._utils", "_rebuild_parameter").mark();
  mixed.tensor("FloatStorage", "0", 6, 0, {6}, {1}).boolean(true).ordered_dict().tuple().reduce();
  mixed.str("view").tensor("FloatStorage", "0", 6, 2, {2}, {2});
  mixed.str("untyped").global("torch._utils", "_rebuild_tensor_v3").mark().pid("UntypedStorage", "1", 8).integer(0);
  mixed.int_tuple({2}).int_tuple({1}).boolean(false).ordered_dict().global("torch", "float32").tuple().reduce();
  mixed.str("meta").global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "2", 4).integer(0);
  mixed.int_tuple({4}).int_tuple({1}).boolean(false).ordered_dict().ordered_dict().tuple().reduce();
  mixed.setitems().stop();
  accepted_with(mixed, 2);  // the parameter's tensor and the view
}

TEST(PickleReader, TensorFastPathRefusesLikeTheVm) {
  const auto one = [](auto&& build) {
    PickleBuilder p;
    p.proto().empty_dict().mark().str("a").tensor("FloatStorage", "0", 6, 0, {2, 3}, {3, 1}).str("b");
    build(p);
    p.setitems().stop();
    return p;
  };
  const auto refused = [](const PickleBuilder& pickle, ErrorCode code, const Limits& limits = {}) {
    EXPECT_EQ(expect_same_without_fast_path(pickle, limits).code, code);
  };
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "01", 6, 0, {6}, {1}); }),
          ErrorCode::storage_key_invalid);
  refused(one([](PickleBuilder& p) {
            p.global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "1", 6, "tpu").integer(0);
            p.int_tuple({6}).int_tuple({1}).boolean(false).ordered_dict().tuple().reduce();
          }),
          ErrorCode::storage_location_unsupported);
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "1", -1, 0, {1}, {1}); }),
          ErrorCode::storage_numel_invalid);
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "1", 6, 0, {3, 3}, {3, 1}); }),
          ErrorCode::tensor_out_of_bounds);
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "1", 6, -1, {2}, {1}); }),
          ErrorCode::tensor_geometry_invalid);
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "0", 7, 0, {7}, {1}); }),
          ErrorCode::storage_redeclared);
  refused(one([](PickleBuilder& p) { p.tensor("LongStorage", "1", 6, 0, {6}, {1}, true); }),
          ErrorCode::tensor_requires_grad_invalid);
  Limits two_tensors;
  two_tensors.max_tensors = 1;
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "1", 6, 0, {6}, {1}); }),
          ErrorCode::tensor_count_limit, two_tensors);
  Limits rank_one;
  rank_one.max_tensor_rank = 1;
  refused(one([](PickleBuilder& p) { p.tensor("FloatStorage", "1", 6, 0, {6}, {1}); }),
          ErrorCode::tensor_rank_limit, rank_one);

  // Every limit the run counts against, set so that it is reached at each
  // opcode of the run in turn (and past it): the first error is the VM's.
  const PickleBuilder state = torch_style_state(3);
  const auto sweep = [&state](const char* what, auto set, std::uint64_t up_to) {
    std::set<std::optional<ErrorCode>> codes;
    for (std::uint64_t bound = 0; bound <= up_to; ++bound) {
      SCOPED_TRACE(std::string(what) + " = " + std::to_string(bound));
      Limits limits;
      set(limits, bound);
      codes.insert(expect_same_without_fast_path(state, limits).code);
    }
    EXPECT_TRUE(codes.count(std::nullopt)) << what;  // the sweep reaches a bound the file fits in
    EXPECT_GT(codes.size(), 1u) << what;              // and bounds it does not
  };
  sweep("max_opcodes", [](Limits& l, std::uint64_t b) { l.max_opcodes = b; }, 120);
  sweep("max_stack_items", [](Limits& l, std::uint64_t b) { l.max_stack_items = b; }, 24);
  sweep("max_mark_depth", [](Limits& l, std::uint64_t b) { l.max_mark_depth = b; }, 4);
  sweep("max_nesting_depth", [](Limits& l, std::uint64_t b) { l.max_nesting_depth = b; }, 4);
  sweep("max_container_elements", [](Limits& l, std::uint64_t b) { l.max_container_elements = b; }, 60);
  sweep("max_memo_entries", [](Limits& l, std::uint64_t b) { l.max_memo_entries = b; }, 40);
  sweep("max_expanded_nodes", [](Limits& l, std::uint64_t b) { l.max_expanded_nodes = b; }, 20);
  sweep("max_tensor_rank", [](Limits& l, std::uint64_t b) { l.max_tensor_rank = b; }, 3);
  sweep("max_string_bytes", [](Limits& l, std::uint64_t b) { l.max_string_bytes = b; }, 8);
}

TEST(PickleReader, EveryPoppingOpcodeChecksForUnderflow) {
  const std::vector<std::uint8_t> popping = {op::APPEND, op::SETITEM, op::TUPLE1,    op::TUPLE2,      op::TUPLE3,
                                             op::REDUCE, op::BUILD,   op::BINPERSID, op::STACK_GLOBAL};
  for (std::uint8_t code : popping) {
    SCOPED_TRACE(std::string(op::name(code)));
    PickleBuilder p;
    p.proto().op(code).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_stack_underflow);
    // Items below a MARK are out of reach, as in CPython.
    PickleBuilder behind_mark;
    behind_mark.proto().empty_list().integer(1).integer(2).integer(3).mark().op(code).stop();
    EXPECT_ERROR_CODE(read(behind_mark), ErrorCode::pickle_stack_underflow);
  }
  for (std::uint8_t code : {op::BINPUT, op::LONG_BINPUT}) {
    PickleBuilder p;
    p.proto().op(code).le(0, 4).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_stack_underflow);
  }
  PickleBuilder memoize;
  memoize.proto(4).op(op::MEMOIZE).stop();
  EXPECT_ERROR_CODE(read(memoize), ErrorCode::pickle_stack_underflow);
  PickleBuilder appends_no_target;
  appends_no_target.proto().mark().integer(1).appends().stop();
  EXPECT_ERROR_CODE(read(appends_no_target), ErrorCode::pickle_stack_underflow);
  PickleBuilder setitems_no_target;
  setitems_no_target.proto().mark().str("a").integer(1).setitems().stop();
  EXPECT_ERROR_CODE(read(setitems_no_target), ErrorCode::pickle_stack_underflow);
  PickleBuilder odd;
  odd.proto().empty_dict().mark().str("a").integer(1).str("b").setitems().stop();
  EXPECT_ERROR_CODE(read(odd), ErrorCode::pickle_stack_underflow);
}

TEST(PickleReader, RejectsMarkMisuse) {
  for (std::uint8_t code : {op::TUPLE, op::APPENDS, op::SETITEMS}) {
    SCOPED_TRACE(std::string(op::name(code)));
    PickleBuilder p;
    p.proto().empty_list().op(code).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_mark_missing);
  }
  PickleBuilder nested;  // 100k nested MARKs
  nested.proto().repeat(op::MARK, 100000).stop();
  EXPECT_ERROR_CODE(read(nested), ErrorCode::pickle_mark_limit);
}

TEST(PickleReader, RejectsDeepNesting) {
  PickleBuilder lists;  // [[[[...]]]] 100k deep: lists appended into their parents
  lists.proto().repeat(op::EMPTY_LIST, 100000).repeat(op::APPEND, 99999).stop();
  EXPECT_ERROR_CODE(read(lists), ErrorCode::pickle_nesting_limit);
  PickleBuilder tuples;
  tuples.proto().none().repeat(op::TUPLE1, 100000).stop();
  EXPECT_ERROR_CODE(read(tuples), ErrorCode::pickle_nesting_limit);
  PickleBuilder dicts;
  dicts.proto();
  for (int i = 0; i < 70; ++i) dicts.empty_dict().str("k");
  dicts.none();
  for (int i = 0; i < 70; ++i) dicts.setitem();
  dicts.stop();
  EXPECT_ERROR_CODE(read(dicts), ErrorCode::pickle_nesting_limit);
  PickleBuilder at_limit;  // exactly 64 levels is fine
  at_limit.proto().none().repeat(op::TUPLE1, 64).stop();
  EXPECT_NO_THROW(read(at_limit));
}

TEST(PickleReader, RejectsBadStop) {
  PickleBuilder open_mark;
  open_mark.proto().mark().none().stop();
  EXPECT_ERROR_CODE(read(open_mark), ErrorCode::pickle_stop_invalid);
  PickleBuilder two_items;
  two_items.proto().none().none().stop();
  EXPECT_ERROR_CODE(read(two_items), ErrorCode::pickle_stop_invalid);
  PickleBuilder empty_stack;
  empty_stack.proto().stop();
  EXPECT_ERROR_CODE(read(empty_stack), ErrorCode::pickle_stop_invalid);
  PickleBuilder no_stop;
  no_stop.proto().none();
  EXPECT_ERROR_CODE(read(no_stop), ErrorCode::pickle_truncated);
  PickleBuilder empty;
  EXPECT_ERROR_CODE(read(empty), ErrorCode::pickle_truncated);
  PickleBuilder trailing;
  trailing.proto().none().stop().u8(0);
  EXPECT_ERROR_CODE(read(trailing), ErrorCode::pickle_trailing_bytes);
}

TEST(PickleReader, EnforcesStackOpcodeSizeAndContainerLimits) {
  Limits limits;
  limits.max_stack_items = 10;
  PickleBuilder deep_stack;
  deep_stack.proto().repeat(op::NONE, 11).stop();
  EXPECT_ERROR_CODE(read(deep_stack, limits), ErrorCode::pickle_stack_limit);

  limits = {};
  limits.max_opcodes = 5;
  PickleBuilder many_ops;
  many_ops.proto().mark().repeat(op::NONE, 4).tuple().stop();
  EXPECT_ERROR_CODE(read(many_ops, limits), ErrorCode::pickle_opcode_limit);

  limits = {};
  limits.max_pickle_bytes = 8;
  PickleBuilder big;
  big.proto().str("0123456789").stop();
  EXPECT_ERROR_CODE(read(big, limits), ErrorCode::pickle_too_large);
  MemoryStorages storages;  // with trailing bytes allowed, the bound is on how far the pickle reaches
  const auto bytes = big.bytes();
  EXPECT_ERROR_CODE(read_pickle(bytes, storages, limits, {}, true), ErrorCode::pickle_too_large);

  limits = {};
  limits.max_container_elements = 5;
  PickleBuilder wide;
  wide.proto().empty_list().mark().repeat(op::NONE, 6).appends().stop();
  EXPECT_ERROR_CODE(read(wide, limits), ErrorCode::pickle_container_limit);
  PickleBuilder spread;  // the bound is on all containers together
  spread.proto().mark().none().none().tuple().none().none().none().tuple3().tuple2().stop();
  EXPECT_ERROR_CODE(read(spread, limits), ErrorCode::pickle_container_limit);
}

// ==== scalars ==================================================================================

TEST(PickleReader, RejectsTruncatedOperands) {
  PickleBuilder unicode;
  unicode.proto().op(op::BINUNICODE).le(10, 4).raw("abc");
  EXPECT_ERROR_CODE(read(unicode), ErrorCode::pickle_truncated);
  PickleBuilder unicode_length;
  unicode_length.proto().op(op::BINUNICODE).le(1, 2);
  EXPECT_ERROR_CODE(read(unicode_length), ErrorCode::pickle_truncated);
  PickleBuilder binint;
  binint.proto().op(op::BININT).le(1, 3);
  EXPECT_ERROR_CODE(read(binint), ErrorCode::pickle_truncated);
  PickleBuilder long1;
  long1.proto().op(op::LONG1).u8(8).le(1, 4);
  EXPECT_ERROR_CODE(read(long1), ErrorCode::pickle_truncated);
  PickleBuilder binfloat;
  binfloat.proto().op(op::BINFLOAT).le(0, 7);
  EXPECT_ERROR_CODE(read(binfloat), ErrorCode::pickle_truncated);
  PickleBuilder int_line;
  int_line.op(op::INT).raw("12");
  EXPECT_ERROR_CODE(read(int_line), ErrorCode::pickle_truncated);
  PickleBuilder proto;
  proto.op(op::PROTO);
  EXPECT_ERROR_CODE(read(proto), ErrorCode::pickle_truncated);
}

TEST(PickleReader, RejectsOversizedStrings) {
  PickleBuilder huge;  // checked before the bytes are looked for
  huge.proto().op(op::BINUNICODE).le(0xFFFFFFFF, 4).stop();
  EXPECT_ERROR_CODE(read(huge), ErrorCode::pickle_string_too_long);
  PickleBuilder huge8;
  huge8.proto(4).op(op::BINUNICODE8).le(~std::uint64_t{0}, 8).stop();
  EXPECT_ERROR_CODE(read(huge8), ErrorCode::pickle_string_too_long);
  PickleBuilder huge_bytes;
  huge_bytes.proto(3).op(op::BINBYTES).le(0xFFFFFFFF, 4).stop();
  EXPECT_ERROR_CODE(read(huge_bytes), ErrorCode::pickle_string_too_long);
  Limits limits;
  limits.max_string_bytes = 4;
  PickleBuilder five;
  five.proto().str("12345").stop();
  EXPECT_ERROR_CODE(read(five, limits), ErrorCode::pickle_string_too_long);
  PickleBuilder four;
  four.proto().str("1234").stop();
  EXPECT_EQ(read(four, limits).root.as_string(), "1234");
}

TEST(PickleReader, RejectsInvalidUtf8) {
  const std::vector<std::string> invalid = {
      "\xc0\x80",          // overlong NUL
      "\xe0\x80\xaf",      // overlong '/'
      "\xf0\x80\x80\xaf",  // overlong, 4 bytes
      "\xed\xa0\x80",      // lone high surrogate
      "\xed\xbf\xbf",      // lone low surrogate
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xf8\x88\x80\x80\x80",
      "\x80",          // continuation without lead
      "a\xc3",         // truncated sequence
      "\xe2\x82",      // truncated sequence
      "\xff",
  };
  for (const std::string& text : invalid) {
    SCOPED_TRACE(::testing::PrintToString(text));
    PickleBuilder p;
    p.proto().str(text).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_string_invalid);
  }
  PickleBuilder py2_non_ascii;
  py2_non_ascii.proto().op(op::SHORT_BINSTRING).u8(1).raw("\xe9").stop();
  EXPECT_ERROR_CODE(read(py2_non_ascii), ErrorCode::pickle_string_invalid);
  PickleBuilder negative_binstring;
  negative_binstring.proto().op(op::BINSTRING).le(0xFFFFFFFF, 4).stop();
  EXPECT_ERROR_CODE(read(negative_binstring), ErrorCode::pickle_string_invalid);
  PickleBuilder valid;  // the largest code point and U+FFFF are fine
  valid.proto().str("\xf4\x8f\xbf\xbf\xef\xbf\xbf").stop();
  EXPECT_NO_THROW(read(valid));
}

TEST(PickleReader, ReadsLong1IntegersBeyondInt64AsBigIntegers) {
  PickleBuilder long1_9;  // 2^63 needs 9 bytes
  long1_9.proto().op(op::LONG1).u8(9).le(std::uint64_t{1} << 63, 8).u8(0).stop();
  const Value two_63 = read_value(long1_9);
  ASSERT_TRUE(two_63.is_big_int());
  EXPECT_EQ(big_integer_decimal(two_63.as_big_integer()), "9223372036854775808");
  PickleBuilder pcg_state;  // -(2^127) and 2^128 - 1, as a PCG64 state may hold
  pcg_state.proto().op(op::LONG1).u8(16).repeat(0x00, 15).u8(0x80);
  pcg_state.op(op::LONG1).u8(17).repeat(0xff, 16).u8(0x00).tuple2().stop();
  const Value pair = read_value(pcg_state);
  EXPECT_EQ(big_integer_decimal(pair.as_list()[0].as_big_integer()), "-170141183460469231731687303715884105728");
  EXPECT_EQ(big_integer_decimal(pair.as_list()[1].as_big_integer()), "340282366920938463463374607431768211455");
  PickleBuilder padded;  // sign-extension bytes beyond what the value needs: an ordinary int
  padded.proto().op(op::LONG1).u8(12).le(static_cast<std::uint64_t>(-5), 8).repeat(0xff, 4).stop();
  EXPECT_EQ(read_value(padded).as_int(), -5);
  PickleBuilder long1_255;  // the longest LONG1 (torch 1.13 loads it too)
  long1_255.proto().op(op::LONG1).u8(255).repeat(0x7f, 255).stop();
  EXPECT_EQ(read_value(long1_255).as_big_integer().size(), 255u);
  // The writer writes them back as LONG1, and they read again equal.
  const PickleWriteResult written = write_pickle(pair);
  MemoryStorages storages;
  EXPECT_TRUE(equal_content(read_pickle(written.pickle, storages, {}).root, pair));
}

TEST(PickleReader, RejectsIntegerTextOutsideInt64AndMalformedText) {
  const std::vector<std::string> bad_int_lines = {"+5", " 5", "05", "-0", "1_0", "", "-",
                                                  "9223372036854775808", "99999999999999999999", "0x10"};
  for (const std::string& line : bad_int_lines) {
    SCOPED_TRACE(line);
    PickleBuilder p;
    p.op(op::INT).raw(line).raw("\n").stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::pickle_int_invalid);
  }
  PickleBuilder long_line;
  long_line.op(op::INT).raw(std::string(100, '1')).raw("\n").stop();
  EXPECT_ERROR_CODE(read(long_line), ErrorCode::pickle_int_invalid);
  PickleBuilder no_suffix;
  no_suffix.op(op::LONG).raw("12\n").stop();
  EXPECT_ERROR_CODE(read(no_suffix), ErrorCode::pickle_int_invalid);
  PickleBuilder magic;  // the legacy magic number does not fit in int64
  magic.op(op::LONG).raw("119547037146038801333356L\n").stop();
  EXPECT_ERROR_CODE(read(magic), ErrorCode::pickle_int_invalid);
  PickleBuilder int_min;
  int_min.op(op::INT).raw("-9223372036854775808\n").stop();
  EXPECT_EQ(read(int_min).root.as_int(), INT64_MIN);
}

// ==== persistent ids ===========================================================================

TEST(PickleReader, RejectsPersistentIdsOfTheWrongShape) {
  PickleBuilder not_tuple;
  not_tuple.proto().str("storage").binpersid().stop();
  EXPECT_ERROR_CODE(read(not_tuple), ErrorCode::persistent_id_invalid);
  PickleBuilder int_pid;  // 1.13's int branch was buggy
  int_pid.proto().integer(0).binpersid().stop();
  EXPECT_ERROR_CODE(read(int_pid), ErrorCode::persistent_id_invalid);
  PickleBuilder list_pid;
  list_pid.proto().empty_list().binpersid().stop();
  EXPECT_ERROR_CODE(read(list_pid), ErrorCode::persistent_id_invalid);
  PickleBuilder short_tuple;
  short_tuple.proto().mark().str("storage").global("torch", "FloatStorage").str("0").str("cpu").tuple();
  EXPECT_ERROR_CODE(read(short_tuple.binpersid().stop()), ErrorCode::persistent_id_invalid);
  PickleBuilder wrong_tag;
  wrong_tag.proto().mark().str("module").global("torch", "FloatStorage").str("0").str("cpu").integer(1).tuple();
  EXPECT_ERROR_CODE(read(wrong_tag.binpersid().stop()), ErrorCode::persistent_id_invalid);
  PickleBuilder bytes_tag;
  bytes_tag.proto().mark().op(op::SHORT_BINBYTES).u8(7).raw("storage").global("torch", "FloatStorage").str("0");
  EXPECT_ERROR_CODE(read(bytes_tag.str("cpu").integer(1).tuple().binpersid().stop()),
                    ErrorCode::persistent_id_invalid);
}

TEST(PickleReader, RejectsWrongSlotTypesInPersistentIds) {
  const auto pid_with = [](auto&& type, auto&& key, auto&& location, auto&& numel) {
    PickleBuilder p;
    p.proto().mark().str("storage");
    type(p);
    key(p);
    location(p);
    numel(p);
    return p.tuple().binpersid().stop();
  };
  const auto float_type = [](PickleBuilder& p) { p.global("torch", "FloatStorage"); };
  const auto key0 = [](PickleBuilder& p) { p.str("0"); };
  const auto cpu = [](PickleBuilder& p) { p.str("cpu"); };
  const auto one = [](PickleBuilder& p) { p.integer(1); };
  const auto str_type = [](PickleBuilder& p) { p.str("FloatStorage"); };
  const auto int_key = [](PickleBuilder& p) { p.integer(0); };
  const auto int_location = [](PickleBuilder& p) { p.integer(0); };
  const auto str_numel = [](PickleBuilder& p) { p.str("1"); };
  const auto bool_numel = [](PickleBuilder& p) { p.boolean(true); };
  const auto float_numel = [](PickleBuilder& p) { p.op(op::BINFLOAT).u8(0x3f).u8(0xf0).le(0, 6); };
  EXPECT_ERROR_CODE(read(pid_with(str_type, key0, cpu, one)), ErrorCode::persistent_id_invalid);
  EXPECT_ERROR_CODE(read(pid_with(float_type, int_key, cpu, one)), ErrorCode::persistent_id_invalid);
  EXPECT_ERROR_CODE(read(pid_with(float_type, key0, int_location, one)), ErrorCode::persistent_id_invalid);
  EXPECT_ERROR_CODE(read(pid_with(float_type, key0, cpu, str_numel)), ErrorCode::persistent_id_invalid);
  EXPECT_ERROR_CODE(read(pid_with(float_type, key0, cpu, bool_numel)), ErrorCode::persistent_id_invalid);
  EXPECT_ERROR_CODE(read(pid_with(float_type, key0, cpu, float_numel)), ErrorCode::persistent_id_invalid);
  // A global that is not a storage type in the type slot.
  const auto dtype_type = [](PickleBuilder& p) { p.global("torch", "float32"); };
  const auto od_type = [](PickleBuilder& p) { p.global("collections", "OrderedDict"); };
  EXPECT_ERROR_CODE(read(pid_with(dtype_type, key0, cpu, one)), ErrorCode::storage_type_unsupported);
  EXPECT_ERROR_CODE(read(pid_with(od_type, key0, cpu, one)), ErrorCode::storage_type_unsupported);
  const auto unknown_type = [](PickleBuilder& p) { p.global("torch", "EvilStorage"); };
  EXPECT_ERROR_CODE(read(pid_with(unknown_type, key0, cpu, one)), ErrorCode::pickle_global_forbidden);
}

TEST(PickleReader, RejectsNonCanonicalStorageKeys) {
  for (const char* key : {"../version", "0/../0", "00", "01", "12345678901234567890", "", "-1", "1e3", " 0", "0\n"}) {
    SCOPED_TRACE(key);
    PickleBuilder p;
    p.proto().pid("FloatStorage", key, 1).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::storage_key_invalid);
  }
  PickleBuilder max_key;  // 19 digits is the longest canonical key
  max_key.proto().tensor_over("FloatStorage", "1234567890123456789", 1).stop();
  EXPECT_NO_THROW(read(max_key));

  PickleOptions legacy;
  legacy.persistent_ids = PersistentIdForm::legacy;
  legacy.canonical_storage_keys = false;
  for (const std::string& key : {std::string("../x"), std::string("a/b"), std::string(65, '1'), std::string()}) {
    SCOPED_TRACE(key);
    PickleBuilder p;
    p.proto().mark().str("storage").global("torch", "FloatStorage").str(key).str("cpu").integer(1).none().tuple();
    EXPECT_ERROR_CODE(read(p.binpersid().stop(), {}, legacy), ErrorCode::storage_key_invalid);
  }
}

TEST(PickleReader, RejectsUnsupportedLocations) {
  for (const char* location : {"meta", "evil", "cuda:", "cuda:01", "cuda:-1", "CPU", "cpu ", "xla:0", "cuda:123456"}) {
    SCOPED_TRACE(location);
    PickleBuilder p;
    p.proto().pid("FloatStorage", "0", 1, location).stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::storage_location_unsupported);
  }
}

TEST(PickleReader, RejectsInvalidStorageElementCounts) {
  PickleBuilder negative;
  negative.proto().pid("FloatStorage", "0", -1).stop();
  EXPECT_ERROR_CODE(read(negative), ErrorCode::storage_numel_invalid);
  PickleBuilder wrapping;  // 2^61 x 8 bytes wraps u64
  wrapping.proto().pid("DoubleStorage", "0", std::int64_t{1} << 61).stop();
  EXPECT_ERROR_CODE(read(wrapping), ErrorCode::storage_numel_invalid);
  PickleBuilder over_int64;  // 2^62 x 4 bytes = 2^64
  over_int64.proto().pid("FloatStorage", "0", std::int64_t{1} << 62).stop();
  EXPECT_ERROR_CODE(read(over_int64), ErrorCode::storage_numel_invalid);
  PickleBuilder complex_wrap;
  complex_wrap.proto().pid("ComplexDoubleStorage", "0", std::int64_t{1} << 60).stop();
  EXPECT_ERROR_CODE(read(complex_wrap), ErrorCode::storage_numel_invalid);
  PickleBuilder huge;  // 2^62-1 floats over a 24-byte record: 1.13 returned a 2^64-byte storage
  huge.proto().pid("FloatStorage", "0", (std::int64_t{1} << 62) - 1).stop();
  MemoryStorages storages;
  storages.add_zeros("0", 24);
  EXPECT_ERROR_CODE(read(huge, storages), ErrorCode::storage_numel_invalid);
  PickleBuilder huge_bytes;  // 2^62-1 bytes fit int64: the record size check catches it
  huge_bytes.proto().pid("ByteStorage", "0", (std::int64_t{1} << 62) - 1).stop();
  EXPECT_ERROR_CODE(read(huge_bytes, storages), ErrorCode::storage_size_mismatch);
}

TEST(PickleReader, RejectsRecordShorterThanDeclared) {
  // CVE-2026-24747 read primitive: numel 64 over a 24-byte record.
  PickleBuilder p;
  p.proto().tensor("FloatStorage", "0", 64, 0, {64}, {1}).stop();
  MemoryStorages storages;
  storages.add_zeros("0", 24);
  EXPECT_ERROR_CODE(read(p, storages), ErrorCode::storage_size_mismatch);
  MemoryStorages none;
  EXPECT_ERROR_CODE(read(p, none), ErrorCode::storage_record_missing);
}

TEST(PickleReader, RejectsStorageRedeclaration) {
  PickleBuilder dtype;  // 1.13: the first reference silently wins
  dtype.proto().mark().pid("FloatStorage", "0", 4).pid("IntStorage", "0", 4).tuple().stop();
  EXPECT_ERROR_CODE(read(dtype), ErrorCode::storage_redeclared);
  PickleBuilder numel;
  numel.proto().mark().pid("FloatStorage", "0", 4).pid("FloatStorage", "0", 5).tuple2().stop();
  EXPECT_ERROR_CODE(read(numel), ErrorCode::storage_redeclared);
  PickleBuilder untyped;
  untyped.proto().mark().pid("ByteStorage", "0", 4).pid("UntypedStorage", "0", 4).tuple2().stop();
  EXPECT_ERROR_CODE(read(untyped), ErrorCode::storage_redeclared);
  PickleBuilder same;  // repeating the identical declaration is how views work
  same.proto().mark().tensor_over("FloatStorage", "0", 4).tensor_over("FloatStorage", "0", 4, "cuda:0").tuple().stop();
  EXPECT_NO_THROW(read(same));
}

TEST(PickleReader, RepeatedKeysFindTheirStorageWhateverTheirNumbers) {
  // Small keys are looked up by number, large or sparse ones by hash; either
  // way a repeated key must meet its first declaration. '1500' is hashed when
  // first seen, then falls inside the numbered range once '1600' is added.
  std::vector<std::string> keys = {"1500"};
  for (int i = 0; i < 300; ++i) keys.push_back(std::to_string(1'000'000'000'000 + 7919 * i));
  keys.insert(keys.end(), {"1600", "0", "1", "5000", "9999999999999999999"});
  PickleBuilder p;
  p.proto().mark();
  for (int round = 0; round < 2; ++round) {
    for (const std::string& key : keys) p.tensor_over("FloatStorage", key, 1);
  }
  p.tuple().stop();
  MemoryStorages storages;
  storages.fabricate_missing(1 << 20);
  const PickleResult result = read(p, storages);
  EXPECT_EQ(result.storage_count, keys.size());
  EXPECT_EQ(storages.resolve_calls, static_cast<int>(keys.size()));
  const auto& tensors = result.root.as_list();
  for (std::size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(tensors[i].as_tensor().storage, tensors[keys.size() + i].as_tensor().storage) << keys[i];
  }
  PickleBuilder large;
  large.proto().mark().pid("FloatStorage", "123456789012", 4).pid("IntStorage", "123456789012", 4).tuple2().stop();
  EXPECT_ERROR_CODE(read(large), ErrorCode::storage_redeclared);

  PickleOptions legacy;  // legacy keys are always hashed
  legacy.canonical_storage_keys = false;
  PickleBuilder pointers;
  pointers.proto().tensor_over("FloatStorage", "94e3", 1).tensor_over("FloatStorage", "94e3", 1).tuple2().stop();
  MemoryStorages legacy_storages;
  legacy_storages.fabricate_missing(1 << 20);
  EXPECT_EQ(read(pointers, legacy_storages, {}, legacy).storage_count, 1u);
}

TEST(PickleReader, RejectsViewMetadataInLegacyPersistentIds) {
  PickleOptions legacy;
  legacy.persistent_ids = PersistentIdForm::legacy;
  legacy.canonical_storage_keys = false;
  PickleBuilder p;
  p.proto().mark().str("storage").global("torch", "FloatStorage").str("1").str("cpu").integer(4);
  p.str("2").integer(1).integer(2).tuple3().tuple().binpersid().stop();
  EXPECT_ERROR_CODE(read(p, {}, legacy), ErrorCode::legacy_view_metadata_unsupported);
}

TEST(PickleReader, LimitsTheNumberOfStoragesAndTensors) {
  Limits limits;
  limits.max_tensors = 1;
  PickleBuilder storages;
  storages.proto().mark().pid("FloatStorage", "0", 1).pid("FloatStorage", "1", 1).tuple2().stop();
  EXPECT_ERROR_CODE(read(storages, limits), ErrorCode::tensor_count_limit);
  PickleBuilder tensors;
  tensors.proto().tensor("FloatStorage", "0", 1, 0, {1}, {1}).tensor("FloatStorage", "0", 1, 0, {1}, {1});
  EXPECT_ERROR_CODE(read(tensors.tuple2().stop(), limits), ErrorCode::tensor_count_limit);
}

// ==== tensor geometry ==========================================================================

TEST(PickleReader, RejectsViewsOutsideTheStorage) {
  const auto read_view = [](std::int64_t offset, std::initializer_list<std::int64_t> size,
                            std::initializer_list<std::int64_t> stride) {
    PickleBuilder p;
    p.proto().tensor("FloatStorage", "0", 6, offset, size, stride).stop();
    return read(p);
  };
  EXPECT_ERROR_CODE(read_view(0, {7}, {1}), ErrorCode::tensor_out_of_bounds);
  EXPECT_ERROR_CODE(read_view(4, {3}, {1}), ErrorCode::tensor_out_of_bounds);
  EXPECT_ERROR_CODE(read_view(6, {1}, {1}), ErrorCode::tensor_out_of_bounds);  // offset == numel, size 1
  EXPECT_ERROR_CODE(read_view(0, {2, 3}, {3, 2}), ErrorCode::tensor_out_of_bounds);
  EXPECT_ERROR_CODE(read_view(1000, {0}, {1}), ErrorCode::tensor_out_of_bounds);  // empty, 1.13 accepted
  EXPECT_ERROR_CODE(read_view(0, {2, INT64_MAX}, {1, INT64_MAX}), ErrorCode::tensor_numel_limit);
  EXPECT_ERROR_CODE(read_view(INT64_MAX, {2}, {INT64_MAX}), ErrorCode::tensor_out_of_bounds);
  EXPECT_NO_THROW(read_view(0, {2, 3}, {3, 1}));
  EXPECT_NO_THROW(read_view(5, {1}, {1}));
  EXPECT_NO_THROW(read_view(6, {0}, {1}));
}

TEST(PickleReader, RejectsInvalidGeometry) {
  const auto read_view = [](std::int64_t offset, std::initializer_list<std::int64_t> size,
                            std::initializer_list<std::int64_t> stride) {
    PickleBuilder p;
    p.proto().tensor("FloatStorage", "0", 6, offset, size, stride).stop();
    return read(p);
  };
  EXPECT_ERROR_CODE(read_view(5, {2}, {-1}), ErrorCode::tensor_geometry_invalid);  // negative stride
  EXPECT_ERROR_CODE(read_view(0, {-1}, {1}), ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(read_view(-1, {1}, {1}), ErrorCode::tensor_geometry_invalid);
  EXPECT_ERROR_CODE(read_view(0, {2, 3}, {1}), ErrorCode::tensor_geometry_invalid);
}

TEST(PickleReader, RejectsHugeElementCountsAndExpansion) {
  const auto read_view = [](std::initializer_list<std::int64_t> size, std::initializer_list<std::int64_t> stride,
                            const Limits& limits = {}) {
    PickleBuilder p;
    p.proto().tensor("FloatStorage", "0", 6, 0, size, stride).stop();
    return read(p, limits);
  };
  const std::int64_t two31 = std::int64_t{1} << 31;
  const std::int64_t two40 = std::int64_t{1} << 40;
  EXPECT_ERROR_CODE(read_view({two31, two31}, {0, 0}), ErrorCode::tensor_numel_limit);  // 2^62, 1.13 loaded it
  EXPECT_ERROR_CODE(read_view({two40, two40}, {0, 0}), ErrorCode::tensor_numel_limit);  // overflows u64
  EXPECT_ERROR_CODE(read_view({1 << 20}, {0}), ErrorCode::tensor_bytes_limit);          // 4 MiB over 24 bytes
  EXPECT_NO_THROW(read_view({1000}, {0}));  // 4000 bytes: within 4 x 24 + 4096
  Limits tight;
  tight.max_tensor_logical_bytes = 16;
  EXPECT_ERROR_CODE(read_view({6}, {1}, tight), ErrorCode::tensor_bytes_limit);
  tight = {};
  tight.max_tensor_numel = 5;
  EXPECT_ERROR_CODE(read_view({6}, {1}, tight), ErrorCode::tensor_numel_limit);
}

TEST(PickleReader, RejectsExcessiveRank) {
  for (int rank : {33, 1000}) {
    SCOPED_TRACE(rank);
    PickleBuilder p;
    p.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).integer(0);
    p.mark();
    for (int i = 0; i < rank; ++i) p.integer(1);
    p.tuple().mark();
    for (int i = 0; i < rank; ++i) p.integer(1);
    p.tuple().boolean(false).ordered_dict().tuple().reduce().stop();
    EXPECT_ERROR_CODE(read(p), ErrorCode::tensor_rank_limit);
  }
}

TEST(PickleReader, RejectsRequiresGradOnIntegerTensors) {
  PickleBuilder p;
  p.proto().tensor("LongStorage", "0", 1, 0, {1}, {1}, true).stop();
  EXPECT_ERROR_CODE(read(p), ErrorCode::tensor_requires_grad_invalid);
  PickleBuilder parameter;
  parameter.proto().global("torch._utils", "_rebuild_parameter").tensor("IntStorage", "0", 1, 0, {1}, {1});
  parameter.boolean(true).ordered_dict().tuple3().reduce().stop();
  EXPECT_ERROR_CODE(read(parameter), ErrorCode::tensor_requires_grad_invalid);
  PickleBuilder float_grad;
  float_grad.proto().tensor("HalfStorage", "0", 1, 0, {1}, {1}, true).stop();
  EXPECT_TRUE(read(float_grad).root.as_tensor().requires_grad);
}

// v2 argument tuple with `hooks` and an optional 7th argument built by `extra`.
template <typename Hooks, typename Extra>
PickleBuilder tensor_with(Hooks&& hooks, Extra&& extra) {
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).integer(0);
  p.int_tuple({1}).int_tuple({1}).boolean(false);
  hooks(p);
  extra(p);
  return p.tuple().reduce().stop();
}

TEST(PickleReader, RejectsBackwardHooksAndRebuildMetadata) {
  const auto nothing = [](PickleBuilder&) {};
  const auto empty_od = [](PickleBuilder& p) { p.ordered_dict(); };
  const auto hooked_od = [](PickleBuilder& p) { p.ordered_dict().integer(0).str("hook").setitem(); };
  const auto hooked_dict = [](PickleBuilder& p) { p.empty_dict().integer(0).str("hook").setitem(); };
  const auto list_hooks = [](PickleBuilder& p) { p.empty_list(); };
  const auto metadata_od = [](PickleBuilder& p) {
    p.ordered_dict().empty_dict().str("_metadata").empty_dict().setitem().build();
  };
  const auto empty_dict = [](PickleBuilder& p) { p.empty_dict(); };
  const auto conj_metadata = [](PickleBuilder& p) { p.empty_dict().str("conj").boolean(true).setitem(); };
  const auto none = [](PickleBuilder& p) { p.none(); };
  EXPECT_ERROR_CODE(read(tensor_with(hooked_od, nothing)), ErrorCode::tensor_hooks_not_empty);
  EXPECT_ERROR_CODE(read(tensor_with(hooked_dict, nothing)), ErrorCode::tensor_hooks_not_empty);
  EXPECT_ERROR_CODE(read(tensor_with(metadata_od, nothing)), ErrorCode::tensor_hooks_not_empty);
  EXPECT_ERROR_CODE(read(tensor_with(list_hooks, nothing)), ErrorCode::pickle_call_args_invalid);
  // The conj bit on a float tensor: torch's own loader trips an internal assert.
  EXPECT_ERROR_CODE(read(tensor_with(empty_od, conj_metadata)), ErrorCode::tensor_metadata_unsupported);
  EXPECT_ERROR_CODE(read(tensor_with(empty_od, none)), ErrorCode::pickle_call_args_invalid);
  const auto two_extra = [](PickleBuilder& p) { p.empty_dict().empty_dict(); };
  EXPECT_ERROR_CODE(read(tensor_with(empty_od, two_extra)), ErrorCode::pickle_call_args_invalid);
  EXPECT_NO_THROW(read(tensor_with(empty_od, empty_dict)));  // 2.x's 7-argument form
  EXPECT_NO_THROW(read(tensor_with(empty_dict, nothing)));
  EXPECT_NO_THROW(read(tensor_with(none, nothing)));
}

// _rebuild_tensor_v2 over a `type` storage of 2 elements, with a metadata dict
// built by `metadata` as its 7th argument.
template <typename Metadata>
PickleBuilder tensor_with_metadata(std::string_view type, Metadata&& metadata) {
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid(type, "0", 2).integer(0);
  p.int_tuple({2}).int_tuple({1}).boolean(false).ordered_dict();
  metadata(p);
  return p.tuple().reduce().stop();
}

TEST(PickleReader, ReadsConjugateAndNegativeViewBits) {
  // torch.save of x.conj(), x._neg_view() and both: get_tensor_metadata's dict.
  const auto conj = [](PickleBuilder& p) { p.empty_dict().str("conj").boolean(true).setitem(); };
  const auto neg = [](PickleBuilder& p) { p.empty_dict().str("neg").boolean(true).setitem(); };
  const auto both = [](PickleBuilder& p) {
    p.empty_dict().mark().str("neg").boolean(true).str("conj").boolean(true).setitems();
  };
  const auto neg_false = [](PickleBuilder& p) { p.empty_dict().str("neg").boolean(false).setitem(); };
  const TensorData conjugate = read_value(tensor_with_metadata("ComplexFloatStorage", conj)).as_tensor();
  EXPECT_TRUE(conjugate.conjugate);
  EXPECT_FALSE(conjugate.negative);
  EXPECT_EQ(conjugate.dtype, DType::complex64);
  const TensorData negative = read_value(tensor_with_metadata("FloatStorage", neg)).as_tensor();
  EXPECT_TRUE(negative.negative);
  EXPECT_FALSE(negative.conjugate);
  const TensorData conjugate_negative = read_value(tensor_with_metadata("ComplexDoubleStorage", both)).as_tensor();
  EXPECT_TRUE(conjugate_negative.conjugate && conjugate_negative.negative);
  const TensorData plain = read_value(tensor_with_metadata("LongStorage", neg_false)).as_tensor();
  EXPECT_FALSE(plain.conjugate || plain.negative);
  // Different bits are different content.
  EXPECT_FALSE(equal_content(Value::tensor(negative), read_value(tensor_with_metadata("FloatStorage", neg_false))));
}

TEST(PickleReader, RefusesRebuildMetadataItCannotHonour) {
  const auto unknown = [](PickleBuilder& p) { p.empty_dict().str("sparse").boolean(true).setitem(); };
  const auto int_key = [](PickleBuilder& p) { p.empty_dict().integer(1).boolean(true).setitem(); };
  const auto int_bit = [](PickleBuilder& p) { p.empty_dict().str("neg").integer(1).setitem(); };
  const auto conj = [](PickleBuilder& p) { p.empty_dict().str("conj").boolean(true).setitem(); };
  const auto list = [](PickleBuilder& p) { p.empty_list(); };
  EXPECT_ERROR_CODE(read(tensor_with_metadata("FloatStorage", unknown)), ErrorCode::tensor_metadata_unsupported);
  EXPECT_ERROR_CODE(read(tensor_with_metadata("FloatStorage", int_key)), ErrorCode::tensor_metadata_unsupported);
  EXPECT_ERROR_CODE(read(tensor_with_metadata("FloatStorage", int_bit)), ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(tensor_with_metadata("IntStorage", conj)), ErrorCode::tensor_metadata_unsupported);
  EXPECT_ERROR_CODE(read(tensor_with_metadata("FloatStorage", list)), ErrorCode::pickle_call_args_invalid);
}

TEST(PickleReader, RejectsMisshapenRebuildArguments) {
  PickleBuilder five;
  five.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).integer(0);
  five.int_tuple({1}).int_tuple({1}).boolean(false).tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(five), ErrorCode::pickle_call_args_invalid);
  PickleBuilder list_args;
  list_args.proto().global("torch._utils", "_rebuild_tensor_v2").empty_list().reduce().stop();
  EXPECT_ERROR_CODE(read(list_args), ErrorCode::pickle_call_args_invalid);
  PickleBuilder no_storage;  // a plain tuple instead of a storage
  no_storage.proto().global("torch._utils", "_rebuild_tensor_v2").mark().empty_tuple().integer(0);
  no_storage.int_tuple({1}).int_tuple({1}).boolean(false).ordered_dict().tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(no_storage), ErrorCode::pickle_call_args_invalid);
  PickleBuilder list_size;
  list_size.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).integer(0);
  list_size.empty_list().integer(1).append().int_tuple({1}).boolean(false).ordered_dict().tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(list_size), ErrorCode::pickle_call_args_invalid);
  PickleBuilder bool_size;
  bool_size.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).integer(0);
  bool_size.boolean(true).tuple1().int_tuple({1}).boolean(false).ordered_dict().tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(bool_size), ErrorCode::pickle_call_args_invalid);
  PickleBuilder str_offset;
  str_offset.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).str("0");
  str_offset.int_tuple({1}).int_tuple({1}).boolean(false).ordered_dict().tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(str_offset), ErrorCode::pickle_call_args_invalid);
  PickleBuilder int_grad;
  int_grad.proto().global("torch._utils", "_rebuild_tensor_v2").mark().pid("FloatStorage", "0", 1).integer(0);
  int_grad.int_tuple({1}).int_tuple({1}).integer(0).ordered_dict().tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(int_grad), ErrorCode::pickle_call_args_invalid);
  PickleBuilder not_tensor_param;
  not_tensor_param.proto().global("torch._utils", "_rebuild_parameter").str("x").boolean(false).ordered_dict();
  EXPECT_ERROR_CODE(read(not_tensor_param.tuple3().reduce().stop()), ErrorCode::pickle_call_args_invalid);
}

// _rebuild_tensor_v3 of a one-element view of storage "0".
PickleBuilder v3(std::string_view storage_type, std::int64_t numel, std::string_view dtype_module,
                 std::string_view dtype) {
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_tensor_v3").mark().pid(storage_type, "0", numel).integer(0);
  p.int_tuple({1}).int_tuple({1}).boolean(false).ordered_dict().global(dtype_module, dtype).tuple().reduce().stop();
  return p;
}

TEST(PickleReader, ReadsTheDtypesTorch213AddedThroughRebuildV3) {
  for (const char* name : {"float8_e8m0fnu", "float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"}) {
    SCOPED_TRACE(name);
    const Value root = read(v3("UntypedStorage", 4, "torch", name)).root;
    EXPECT_EQ(dtype_name(root.as_tensor().dtype), name);
  }
}

TEST(PickleReader, RefusesTheSafetensorsOnlyDtypeNames) {
  // No torch.<name> exists for these, so no torch-written pickle names them.
  for (const char* name : {"float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_CODE(read(v3("UntypedStorage", 4, "torch", name)), ErrorCode::pickle_global_forbidden);
  }
}

TEST(PickleReader, RejectsMismatchedRebuildV3Arguments) {
  EXPECT_ERROR_CODE(read(v3("FloatStorage", 4, "torch", "uint16")), ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(v3("UntypedStorage", 4, "torch", "FloatStorage")), ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(v3("UntypedStorage", 3, "torch", "uint16")), ErrorCode::storage_size_mismatch);
  EXPECT_NO_THROW(read(v3("UntypedStorage", 4, "torch", "uint16")));
  PickleBuilder v2_untyped;  // the untyped storage is v3's only
  v2_untyped.proto().tensor("UntypedStorage", "0", 4, 0, {1}, {1}).stop();
  EXPECT_ERROR_CODE(read(v2_untyped), ErrorCode::pickle_call_args_invalid);
}

// ==== record objects (torch.distributed.checkpoint's .metadata) ===============================

constexpr std::string_view kDcp = "torch.distributed.checkpoint.metadata";
constexpr std::string_view kDcpFilesystem = "torch.distributed.checkpoint.filesystem";

// cls() by NEWOBJ, as pickle makes a dataclass.
PickleBuilder& record(PickleBuilder& p, std::string_view module, std::string_view name) {
  return p.global(module, name).empty_tuple().op(op::NEWOBJ);
}

// MetadataIndex(fqn, offset=torch.Size(offsets), index=0), built from a dict state.
PickleBuilder& metadata_index(PickleBuilder& p, std::string_view fqn, std::initializer_list<std::int64_t> offsets) {
  record(p, kDcp, "MetadataIndex").empty_dict().mark().str("fqn").str(fqn).str("index").integer(0).str("offset");
  return p.global("torch", "Size").int_tuple(offsets).tuple1().reduce().setitems().build();
}

PickleBuilder& storage_info(PickleBuilder& p, std::string_view file, std::int64_t offset, std::int64_t length) {
  record(p, kDcpFilesystem, "_StorageInfo").empty_dict().mark().str("relative_path").str(file);
  return p.str("offset").integer(offset).str("length").integer(length).setitems().build();
}

// TensorProperties pickles a tuple: (dtype, layout, requires_grad, memory format code, pin_memory).
PickleBuilder& tensor_properties(PickleBuilder& p, std::int64_t memory_format_code, std::size_t fields = 5) {
  record(p, kDcp, "TensorProperties").mark().global("torch", "float16");
  p.global("torch.serialization", "_get_layout").str("torch.strided").tuple1().reduce().boolean(true);
  p.global(kDcp, "_MEM_FORMAT_ENCODING").integer(memory_format_code).tuple1().reduce();
  if (fields == 5) p.boolean(false);
  return p.tuple().build();
}

const Value& field(const Value& record, std::string_view name) { return record.as_dict().at(std::string(name)); }

TEST(PickleReader, ReadsDcpRecordsAsDictsOfTheirFieldsUnderTheirClass) {
  PickleBuilder p;
  p.proto(4).empty_dict().mark().str("properties");
  tensor_properties(p, 1);
  p.str("bytes_item");
  record(p, kDcp, "BytesStorageMetadata");  // no fields: pickle writes no BUILD
  p.str("path").global("pathlib", "PosixPath").str("/runs").str("ck").tuple2().reduce();
  p.str("dtype").global("torch", "bfloat16");
  p.setitems().stop();
  const Value root = read_value(p);
  const Value& properties = field(root, "properties");
  EXPECT_EQ(field(properties, "__class__").as_string(), "torch.distributed.checkpoint.metadata.TensorProperties");
  EXPECT_EQ(field(properties, "dtype").as_dtype(), DType::float16);
  EXPECT_EQ(field(properties, "layout").as_layout(), "torch.strided");
  EXPECT_TRUE(field(properties, "requires_grad").as_bool());
  EXPECT_EQ(field(properties, "memory_format").as_string(), "torch.channels_last");
  EXPECT_FALSE(field(properties, "pin_memory").as_bool());
  EXPECT_EQ(properties.as_dict().size(), 6u);
  const Value& bytes_item = field(root, "bytes_item");
  EXPECT_EQ(bytes_item.as_dict().size(), 1u);
  EXPECT_EQ(field(bytes_item, "__class__").as_string(), "torch.distributed.checkpoint.metadata.BytesStorageMetadata");
  EXPECT_EQ(field(root, "path").as_string(), "/runs/ck");
  EXPECT_EQ(field(root, "dtype").as_dtype(), DType::bfloat16);  // a dtype is a value, as weights_only admits
}

TEST(PickleReader, ReadsADictKeyedByRecordsAsAListOfPairs) {
  PickleBuilder p;
  p.proto(4).empty_dict().mark();
  metadata_index(p, "w", {0, 2});
  storage_info(p, "__0_0.distcp", 0, 9);
  metadata_index(p, "w", {0, 4});
  storage_info(p, "__1_0.distcp", 0, 7);
  p.setitems().stop();
  const Value root = read_value(p);
  ASSERT_TRUE(root.is_list());
  ASSERT_EQ(root.as_list().size(), 2u);
  const Value& second = root.as_list()[1];
  ASSERT_TRUE(second.is_tuple());
  const Value& key = second.as_list()[0];
  EXPECT_EQ(field(key, "__class__").as_string(), "torch.distributed.checkpoint.metadata.MetadataIndex");
  EXPECT_EQ(field(key, "fqn").as_string(), "w");
  EXPECT_EQ(field(key, "offset").as_list()[1].as_int(), 4);
  const Value& info = second.as_list()[1];
  EXPECT_EQ(field(info, "__class__").as_string(), "torch.distributed.checkpoint.filesystem._StorageInfo");
  EXPECT_EQ(field(info, "relative_path").as_string(), "__1_0.distcp");
  EXPECT_EQ(field(info, "length").as_int(), 7);
}

TEST(PickleReader, RejectsRecordsMadeOrBuiltOtherwiseThanPickleMakesThem) {
  PickleBuilder with_args;  // cls.__new__(cls, 1)
  with_args.proto(4).global(kDcp, "MetadataIndex").integer(1).tuple1().op(op::NEWOBJ).stop();
  EXPECT_ERROR_CODE(read(with_args), ErrorCode::pickle_record_invalid);
  PickleBuilder unknown_field;
  record(unknown_field.proto(4), kDcp, "MetadataIndex").empty_dict().str("__reduce__").integer(1).setitem().build().stop();
  EXPECT_ERROR_CODE(read(unknown_field), ErrorCode::pickle_record_invalid);
  PickleBuilder twice;
  record(twice.proto(4), kDcp, "StorageMeta").empty_dict().build().empty_dict().build().stop();
  EXPECT_ERROR_CODE(read(twice), ErrorCode::pickle_record_invalid);
  PickleBuilder short_tuple;
  tensor_properties(short_tuple.proto(4), 0, 4).stop();
  EXPECT_ERROR_CODE(read(short_tuple), ErrorCode::pickle_record_invalid);
  PickleBuilder list_state;
  record(list_state.proto(4), kDcp, "ChunkStorageMetadata").empty_list().build().stop();
  EXPECT_ERROR_CODE(read(list_state), ErrorCode::pickle_record_invalid);
  PickleBuilder dict_for_tuple;  // TensorProperties pickles a tuple, never a dict
  record(dict_for_tuple.proto(4), kDcp, "TensorProperties").empty_dict().build().stop();
  EXPECT_ERROR_CODE(read(dict_for_tuple), ErrorCode::pickle_record_invalid);
}

TEST(PickleReader, RejectsRecordsUsedAsAnythingButData) {
  PickleBuilder called;  // a record class is made by NEWOBJ, never called
  called.proto(4).global(kDcp, "Metadata").empty_tuple().reduce().stop();
  EXPECT_ERROR_CODE(read(called), ErrorCode::pickle_call_forbidden);
  PickleBuilder other_class;
  other_class.proto(4).global(kDcp, "_version").empty_tuple().op(op::NEWOBJ).stop();
  EXPECT_ERROR_CODE(read(other_class), ErrorCode::pickle_global_forbidden);
  PickleBuilder setitem_on_record;
  record(setitem_on_record.proto(4), kDcp, "StorageMeta").str("modules").none().setitem().stop();
  EXPECT_ERROR_CODE(read(setitem_on_record), ErrorCode::pickle_setitem_target);
  PickleBuilder shared;  // a record is mutable until built: fetching it again would allow cycles
  record(shared.proto(4), kDcp, "StorageMeta").binput(0).empty_dict().str("modules").binget(0).setitem().build().stop();
  EXPECT_ERROR_CODE(read(shared), ErrorCode::pickle_memo_mutable);
}

TEST(PickleReader, RejectsDictsThatMixRecordKeysWithOtherKeys) {
  PickleBuilder record_after_str;
  record_after_str.proto(4).empty_dict().str("a").none().setitem();
  metadata_index(record_after_str, "w", {0});
  record_after_str.none().setitem().stop();
  EXPECT_ERROR_CODE(read(record_after_str), ErrorCode::pickle_dict_key_invalid);
  PickleBuilder str_after_record;
  metadata_index(str_after_record.proto(4).empty_dict(), "w", {0});
  str_after_record.none().setitem().str("a").none().setitem().stop();
  EXPECT_ERROR_CODE(read(str_after_record), ErrorCode::pickle_dict_key_invalid);
  PickleBuilder append_to_pairs;  // the list of pairs is still a dict to the pickle
  metadata_index(append_to_pairs.proto(4).empty_dict(), "w", {0});
  append_to_pairs.none().setitem().integer(1).append().stop();
  EXPECT_ERROR_CODE(read(append_to_pairs), ErrorCode::pickle_append_target);
  PickleBuilder record_key_in_record;
  record(record_key_in_record.proto(4), kDcp, "StorageMeta");
  metadata_index(record_key_in_record, "w", {0});
  record_key_in_record.none().setitem().stop();
  EXPECT_ERROR_CODE(read(record_key_in_record), ErrorCode::pickle_setitem_target);
}

TEST(PickleReader, RejectsDcpHelpersCalledWithOtherArguments) {
  PickleBuilder size_of_str;
  size_of_str.proto(4).global("torch", "Size").mark().integer(1).str("2").tuple().tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(size_of_str), ErrorCode::pickle_call_args_invalid);
  PickleBuilder unknown_layout;
  unknown_layout.proto(4).global("torch.serialization", "_get_layout").str("os.system").tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(unknown_layout), ErrorCode::pickle_call_args_invalid);
  PickleBuilder memory_format_3;
  tensor_properties(memory_format_3.proto(4), 3).stop();
  EXPECT_ERROR_CODE(read(memory_format_3), ErrorCode::pickle_call_args_invalid);
  PickleBuilder path_of_int;
  path_of_int.proto(4).global("pathlib", "PosixPath").integer(1).tuple1().reduce().stop();
  EXPECT_ERROR_CODE(read(path_of_int), ErrorCode::pickle_call_args_invalid);
}

}  // namespace
}  // namespace holdpoint::format
