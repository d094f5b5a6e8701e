// The restricted pickle emitter: writer -> reader round trips for every value
// kind and dtype, the exact opcode forms LibTorch and torch 1.13 need, the
// compatibility mode, and what the writer refuses. Python is the oracle for
// two differential checks: CPython's pickle, and torch 1.13's weights_only
// unpickler.
#include "format/pickle/pickle_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/pickle/pickle_opcodes.h"
#include "format/pickle/pickle_reader.h"
#include "holdpoint/base/error.h"
#include "support/test_support.h"
#include "unit/pickle_builder.h"

namespace holdpoint::format {
namespace {

namespace op = pickle_op;

// The storages the writer reported, served back to the reader by key.
class WrittenStorages final : public StorageResolver {
 public:
  explicit WrittenStorages(const PickleWriteResult& written) {
    for (const auto& storage : written.storages) storages_[storage.key] = storage.storage;
  }
  std::shared_ptr<const Storage> resolve(const StorageRequest& request) override {
    auto found = storages_.find(request.key);
    if (found == storages_.end()) detail::fail(ErrorCode::storage_record_missing, "no storage ", request.key);
    return found->second;
  }

 private:
  std::map<std::string, std::shared_ptr<const Storage>> storages_;
};

PickleResult read_back(const PickleWriteResult& written) {
  WrittenStorages storages(written);
  return read_pickle(written.pickle, storages, {});
}

PickleResult round_trip(const Value& value, const PickleWriteOptions& options = {}) {
  return read_back(write_pickle(value, options));
}

void expect_round_trip(const Value& value, const PickleWriteOptions& options = {}) {
  const Value back = round_trip(value, options).root;
  EXPECT_TRUE(equal_content(value, back)) << describe_difference(value, back);
}

TensorData float_tensor(std::vector<std::int64_t> sizes) {
  std::int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  std::vector<float> values(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * static_cast<float>(i);
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return TensorData::from_bytes(DType::float32, std::move(sizes), bytes);
}

// How many times `code` occurs as an opcode (walks the stream with the VM's
// own opcode table, so operand bytes are not mistaken for opcodes).
std::size_t count_opcode(const std::vector<std::byte>& pickle, std::uint8_t code) {
  std::size_t count = 0;
  std::size_t pos = 0;
  const auto u32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::to_integer<std::uint32_t>(pickle[at + i]) << (8 * i);
    return v;
  };
  while (pos < pickle.size()) {
    const auto current = std::to_integer<std::uint8_t>(pickle[pos]);
    count += current == code;
    ++pos;
    switch (current) {
      case op::PROTO: case op::BININT1: case op::BINPUT: case op::BINGET: pos += 1; break;
      case op::BININT2: pos += 2; break;
      case op::BININT: case op::LONG_BINPUT: case op::LONG_BINGET: pos += 4; break;
      case op::BINFLOAT: pos += 8; break;
      case op::LONG1: pos += 1 + std::to_integer<std::size_t>(pickle[pos]); break;
      case op::BINUNICODE: pos += 4 + u32(pos); break;
      case op::GLOBAL:
        for (int line = 0; line < 2; ++line) {
          while (std::to_integer<char>(pickle[pos]) != '\n') ++pos;
          ++pos;
        }
        break;
      default: break;
    }
  }
  return count;
}

// ==== round trips ===========================================================================

TEST(PickleWriter, RoundTripsEveryValueKind) {
  Dict dict;
  dict.insert("none", Value::none());
  dict.insert("true", Value::boolean(true));
  dict.insert("false", Value::boolean(false));
  dict.insert("small", Value::integer(7));
  dict.insert("u16", Value::integer(65535));
  dict.insert("neg", Value::integer(-7));
  dict.insert("int32_min", Value::integer(INT32_MIN));
  dict.insert("big", Value::integer(std::int64_t{1} << 40));
  dict.insert("int64_min", Value::integer(INT64_MIN));
  dict.insert("int64_max", Value::integer(INT64_MAX));
  dict.insert("float", Value::floating(0.1));
  dict.insert("nan", Value::floating(std::nan("")));
  dict.insert("inf", Value::floating(-INFINITY));
  dict.insert("str", Value::string("h\xc3\xa9llo \xf0\x9f\x99\x82"));
  dict.insert("empty_str", Value::string(""));
  dict.insert("bytes", Value::bytes(std::string("\x00\x7f\x80\xff", 4)));
  dict.insert("empty_bytes", Value::bytes(""));
  dict.insert("list", Value::list({Value::integer(1), Value::string("two")}));
  dict.insert("empty_list", Value::list());
  dict.insert("tuple0", Value::tuple());
  dict.insert("tuple1", Value::tuple({Value::integer(1)}));
  dict.insert("tuple3", Value::tuple({Value::integer(1), Value::none(), Value::boolean(true)}));
  dict.insert("tuple5", Value::tuple({Value::integer(1), Value::integer(2), Value::integer(3), Value::integer(4),
                                      Value::integer(5)}));
  dict.insert(DictKey(3), Value::string("int key"));
  dict.insert(DictKey(-1), Value::string("negative int key"));
  dict.insert("\xe6\x9d\x83\xe9\x87\x8d", Value::string("unicode key"));
  dict.insert("tensor", Value::tensor(float_tensor({2, 3})));
  Dict ordered;
  ordered.insert("w", Value::tensor(float_tensor({3})));
  dict.insert("ordered", Value::ordered_dict(ordered));
  dict.insert("empty_dict", Value::dict());
  const Value root = Value::dict(dict);
  const PickleResult back = round_trip(root);
  EXPECT_TRUE(equal_content(root, back.root)) << describe_difference(root, back.root);
  EXPECT_TRUE(back.root.as_dict().at("ordered").is_ordered_dict());
  EXPECT_TRUE(back.uses_binfloat);
  EXPECT_EQ(back.protocol, 2);
}

TEST(PickleWriter, RoundTripsScalarsAtTheRoot) {
  for (const Value& value : {Value::none(), Value::integer(-300), Value::floating(2.5), Value::string("x"),
                             Value::bytes("\x01"), Value::tensor(float_tensor({}))}) {
    SCOPED_TRACE(value_kind_name(value.kind()));
    expect_round_trip(value);
  }
}

TEST(PickleWriter, RoundTripsEveryDtype) {
  for (std::size_t i = 0; i < kDTypeCount; ++i) {
    const auto dtype = static_cast<DType>(i);
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    if (!dtype_in_torch(dtype)) continue;  // RefusesDtypesTorchLacks
    std::vector<std::byte> bytes(3 * dtype_itemsize(dtype));
    for (std::size_t b = 0; b < bytes.size(); ++b) bytes[b] = std::byte(b * 37 + 1);
    if (dtype == DType::boolean) {
      for (auto& b : bytes) b = std::byte{1};
    }
    const Value tensor = Value::tensor(TensorData::from_bytes(dtype, {3}, bytes));
    const PickleWriteResult written = write_pickle(tensor);
    const Value back = read_back(written).root;
    EXPECT_TRUE(equal_content(tensor, back)) << describe_difference(tensor, back);
    EXPECT_EQ(back.as_tensor().dtype, dtype);
    // Dtypes with a legacy storage class take _rebuild_tensor_v2, the others v3.
    const std::string text(reinterpret_cast<const char*>(written.pickle.data()), written.pickle.size());
    EXPECT_EQ(text.find("_rebuild_tensor_v3") != std::string::npos, !dtype_storage_class(dtype).has_value());
  }
}

TEST(PickleWriter, UntypedStorageWasNamedAsPythonsWeightsOnlyLoaderRefuses) {
  // Regression: torch 2.13's weights_only loader allowlists UntypedStorage as
  // torch.storage.UntypedStorage only, so every v3 tensor holdpoint wrote as
  // torch.UntypedStorage made the whole file unloadable in Python.
  const std::vector<std::byte> bytes(2);
  const PickleWriteResult written = write_pickle(Value::tensor(TensorData::from_bytes(DType::bits16, {1}, bytes)));
  const std::string text(reinterpret_cast<const char*>(written.pickle.data()), written.pickle.size());
  EXPECT_NE(text.find("ctorch.storage\nUntypedStorage\n"), std::string::npos);
  EXPECT_EQ(text.find("ctorch\nUntypedStorage\n"), std::string::npos);
}

TEST(PickleWriter, RefusesDtypesTorchLacks) {
  // The safetensors-only sub-byte dtypes have no torch.<name> to write.
  for (DType dtype : {DType::float4_e2m1fn, DType::float6_e2m3fn, DType::float6_e3m2fn}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::vector<std::byte> bytes(dtype_bits(dtype));  // 8 elements
    const Value tensor = Value::tensor(TensorData::from_bytes(dtype, {8}, bytes));
    EXPECT_ERROR_CODE(write_pickle(tensor), ErrorCode::write_value_unsupported);
  }
}

TEST(PickleWriter, RoundTripsZeroDimensionalEmptyAndStridedViews) {
  const TensorData base = float_tensor({4, 6});
  TensorData transposed = base;  // a non-contiguous view of the same storage
  transposed.sizes = {6, 4};
  transposed.strides = {1, 6};
  TensorData column = base;
  column.sizes = {4};
  column.strides = {6};
  column.storage_offset = 5;
  TensorData scalar = base;
  scalar.sizes = {};
  scalar.strides = {};
  scalar.storage_offset = 23;
  TensorData empty = base;
  empty.sizes = {0, 3};
  empty.strides = {3, 1};
  empty.storage_offset = 24;
  TensorData expanded = base;
  expanded.sizes = {100, 6};
  expanded.strides = {0, 1};
  const Value root = Value::list({Value::tensor(base), Value::tensor(transposed), Value::tensor(column),
                                  Value::tensor(scalar), Value::tensor(empty), Value::tensor(expanded)});
  const PickleWriteResult written = write_pickle(root);
  ASSERT_EQ(written.storages.size(), 1u);  // all views of one storage: one key
  EXPECT_EQ(written.storages[0].key, "0");
  EXPECT_EQ(written.storages[0].nbytes, 96u);
  EXPECT_EQ(written.tensor_count, 6u);
  const PickleResult back = read_back(written);
  EXPECT_TRUE(equal_content(root, back.root)) << describe_difference(root, back.root);
  const auto& items = back.root.as_list();
  EXPECT_EQ(items[1].as_tensor().strides, (std::vector<std::int64_t>{1, 6}));
  EXPECT_EQ(items[2].as_tensor().storage_offset, 5);
  EXPECT_EQ(items[0].as_tensor().storage, items[5].as_tensor().storage);
  EXPECT_EQ(back.storage_count, 1u);
}

TEST(PickleWriter, NumbersStoragesInFirstReferenceOrder) {
  const TensorData a = float_tensor({2});
  const TensorData b = float_tensor({3});
  const Value root = Value::list({Value::tensor(b), Value::tensor(a), Value::tensor(b)});
  const PickleWriteResult written = write_pickle(root);
  ASSERT_EQ(written.storages.size(), 2u);
  EXPECT_EQ(written.storages[0].key, "0");
  EXPECT_EQ(written.storages[0].storage, b.storage);
  EXPECT_EQ(written.storages[1].key, "1");
  EXPECT_EQ(written.storages[1].storage, a.storage);
}

TEST(PickleWriter, TiedTensorsAreWrittenOnceAndReferencedWithBinget) {
  const auto shared = std::make_shared<const TensorData>(float_tensor({2, 2}));
  Dict dict;
  dict.insert("encoder.weight", Value::tensor(shared));
  dict.insert("decoder.weight", Value::tensor(shared));
  dict.insert("copy", Value::tensor(float_tensor({2, 2})));
  const PickleWriteResult written = write_pickle(Value::dict(dict));
  EXPECT_EQ(written.tensor_count, 2u);
  EXPECT_EQ(count_opcode(written.pickle, op::BINPERSID), 2u);
  // Five constants (_rebuild_tensor_v2, 'storage', FloatStorage, 'cpu',
  // OrderedDict) and the tied tensor are memoized; the second tensor fetches
  // the constants, the second use of the tied one fetches it.
  EXPECT_EQ(count_opcode(written.pickle, op::BINPUT), 6u);
  EXPECT_EQ(count_opcode(written.pickle, op::BINGET), 6u);
  EXPECT_EQ(count_opcode(written.pickle, op::GLOBAL), 3u);
  const Value back = read_back(written).root;
  EXPECT_EQ(back.as_dict().at("encoder.weight").tensor_ptr(), back.as_dict().at("decoder.weight").tensor_ptr());
  EXPECT_TRUE(equal_content(Value::dict(dict), back));
}

TEST(PickleWriter, ManyTiedTensorsUseLongMemoIndices) {
  std::vector<std::shared_ptr<const TensorData>> tensors;
  Value::List items;
  for (int i = 0; i < 300; ++i) tensors.push_back(std::make_shared<const TensorData>(float_tensor({1})));
  for (int round = 0; round < 2; ++round) {
    for (const auto& t : tensors) items.push_back(Value::tensor(t));
  }
  const PickleWriteResult written = write_pickle(Value::list(items));
  // The five constants take memo indices 0..4, the tensors 5..304.
  EXPECT_EQ(count_opcode(written.pickle, op::LONG_BINPUT), 305u - 256u);
  EXPECT_EQ(count_opcode(written.pickle, op::LONG_BINGET), 305u - 256u);
  const Value back = read_back(written).root;
  EXPECT_EQ(back.as_list()[299].tensor_ptr(), back.as_list()[599].tensor_ptr());
}

TEST(PickleWriter, BatchesSetitemsAndAppendsByThousand) {
  Dict dict;
  Value::List list;
  for (int i = 0; i < 1200; ++i) dict.insert("k" + std::to_string(i), Value::integer(i));
  for (int i = 0; i < 2500; ++i) list.push_back(Value::integer(i));
  const Value root = Value::tuple({Value::dict(dict), Value::list(list)});
  const PickleWriteResult written = write_pickle(root);
  EXPECT_EQ(count_opcode(written.pickle, op::SETITEMS), 2u);
  EXPECT_EQ(count_opcode(written.pickle, op::APPENDS), 3u);
  const Value back = read_back(written).root;
  EXPECT_TRUE(equal_content(root, back)) << describe_difference(root, back);
}

TEST(PickleWriter, UsesOnlyTheFormsLibTorch113Reads) {
  // SETITEMS/APPENDS even for one item, 8-byte LONG1 only, protocol 2.
  Dict dict;
  dict.insert("one", Value::list({Value::integer(std::int64_t{1} << 40)}));
  const PickleWriteResult written = write_pickle(Value::dict(dict));
  EXPECT_EQ(std::to_integer<int>(written.pickle[0]), op::PROTO);
  EXPECT_EQ(std::to_integer<int>(written.pickle[1]), 2);
  EXPECT_EQ(std::to_integer<int>(written.pickle.back()), op::STOP);
  EXPECT_EQ(count_opcode(written.pickle, op::SETITEM), 0u);
  EXPECT_EQ(count_opcode(written.pickle, op::APPEND), 0u);
  EXPECT_EQ(count_opcode(written.pickle, op::SETITEMS), 1u);
  EXPECT_EQ(count_opcode(written.pickle, op::APPENDS), 1u);
  const std::string text(reinterpret_cast<const char*>(written.pickle.data()), written.pickle.size());
  EXPECT_NE(text.find(std::string("\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00", 10)), std::string::npos);
}

TEST(PickleWriter, RoundTripsOrderedDictMetadata) {
  Dict metadata;
  Dict version;
  version.insert("version", Value::integer(1));
  metadata.insert("", Value::dict(version));
  metadata.insert("fc", Value::dict(version));
  Dict state;
  state.insert("fc.weight", Value::tensor(float_tensor({2, 2})));
  state.set_metadata(Value::ordered_dict(metadata));
  const PickleWriteResult written = write_pickle(Value::ordered_dict(state));
  EXPECT_EQ(count_opcode(written.pickle, op::BUILD), 1u);
  const Value back = read_back(written).root;
  ASSERT_TRUE(back.as_dict().metadata());
  EXPECT_TRUE(equal_content(*back.as_dict().metadata(), Value::ordered_dict(metadata)));
}

TEST(PickleWriter, RoundTripsParameters) {
  TensorData parameter = float_tensor({3});
  parameter.is_parameter = true;
  parameter.requires_grad = true;
  TensorData frozen = float_tensor({3});
  frozen.is_parameter = true;
  const Value back = round_trip(Value::list({Value::tensor(parameter), Value::tensor(frozen)})).root;
  EXPECT_TRUE(back.as_list()[0].as_tensor().is_parameter);
  EXPECT_TRUE(back.as_list()[0].as_tensor().requires_grad);
  EXPECT_TRUE(back.as_list()[1].as_tensor().is_parameter);
  EXPECT_FALSE(back.as_list()[1].as_tensor().requires_grad);
}

TEST(PickleWriter, NestingUpToTheLimitRoundTrips) {
  Value nested = Value::integer(1);
  for (int i = 0; i < 64; ++i) nested = Value::list({nested});
  expect_round_trip(nested);
}

// ==== torch 1.13 compatibility mode =========================================================

TEST(PickleWriter, CompatibilityModeWritesFloatsAndBytesAsTensors) {
  PickleWriteOptions compat;
  compat.torch_1_13_compatible = true;
  Dict dict;
  dict.insert("lr", Value::floating(0.1));
  dict.insert("betas", Value::tuple({Value::floating(0.9), Value::floating(0.999)}));
  dict.insert("blob", Value::bytes(std::string("\x00\xff", 2)));
  dict.insert("w", Value::tensor(float_tensor({2})));
  const PickleWriteResult written = write_pickle(Value::dict(dict), compat);
  EXPECT_EQ(count_opcode(written.pickle, op::BINFLOAT), 0u);
  const std::string text(reinterpret_cast<const char*>(written.pickle.data()), written.pickle.size());
  EXPECT_EQ(text.find("_codecs"), std::string::npos);
  EXPECT_EQ(written.storages.size(), 5u);  // a fresh storage per float and per bytes value
  const PickleResult back = read_back(written);
  EXPECT_FALSE(back.uses_binfloat);
  const Dict& d = back.root.as_dict();
  const TensorData& lr = d.at("lr").as_tensor();
  EXPECT_EQ(lr.dtype, DType::float64);
  EXPECT_TRUE(lr.sizes.empty());
  EXPECT_EQ(d.at("lr").as_number(), 0.1);
  EXPECT_EQ(d.at("betas").as_list()[1].as_number(), 0.999);
  const TensorData& blob = d.at("blob").as_tensor();
  EXPECT_EQ(blob.dtype, DType::uint8);
  EXPECT_EQ(blob.contiguous_bytes(), holdpoint::testing::bytes_of(std::string_view("\x00\xff", 2)));
}

TEST(PickleWriter, CompatibilityModeRefusesFloatAndBytesKeys) {
  // The mode writes a float or bytes as a tensor, and a tensor cannot be a key.
  PickleWriteOptions compat;
  compat.torch_1_13_compatible = true;
  const Value keys[] = {Value::floating(0.5), Value::bytes("k"),
                        Value::tuple({Value::string("a"), Value::floating(2.5)})};
  for (const Value& key : keys) {
    SCOPED_TRACE(std::string(value_kind_name(key.kind())));
    Dict dict;
    dict.insert(DictKey(key), Value::integer(1));
    EXPECT_ERROR_CODE(write_pickle(Value::dict(dict), compat), ErrorCode::write_value_unsupported);
    const PickleResult back = read_back(write_pickle(Value::dict(dict)));  // the default mode writes them
    EXPECT_EQ(back.root.as_dict().size(), 1u);
  }
  // Keys the mode can write as themselves, and float values beside them.
  Dict fine;
  fine.insert(DictKey(Value::tuple({Value::string("a"), Value::integer(2)})), Value::floating(0.5));
  fine.insert(DictKey(Value::none()), Value::bytes("v"));
  EXPECT_EQ(read_back(write_pickle(Value::dict(fine), compat)).root.as_dict().size(), 2u);
}

TEST(PickleWriter, SharedBytearraysAndTensorsAreWrittenOnce) {
  const Value shared = Value::bytearray("ab");
  const Value tensor = Value::tensor(float_tensor({2}));
  const PickleWriteResult written = write_pickle(Value::list({shared, shared, tensor, tensor}));
  EXPECT_EQ(count_opcode(written.pickle, op::BINGET), 2u);
  const PickleResult back = read_back(written);
  const Value::List& items = back.root.as_list();
  EXPECT_EQ(items[0].node_identity(), items[1].node_identity());
  EXPECT_EQ(items[2].node_identity(), items[3].node_identity());
  EXPECT_EQ(items[0].as_bytes(), "ab");
}

TEST(PickleWriter, RoundTripsConjugateAndNegativeViewBits) {
  const std::vector<std::byte> bytes(16);
  TensorData conjugate = TensorData::from_bytes(DType::complex64, {2}, bytes);
  conjugate.conjugate = true;
  TensorData negative = TensorData::from_bytes(DType::float32, {4}, bytes);
  negative.negative = true;
  TensorData both = TensorData::from_bytes(DType::complex128, {1}, bytes);
  both.conjugate = both.negative = true;
  const PickleResult back = read_back(write_pickle(Value::list({Value::tensor(conjugate), Value::tensor(negative),
                                                                Value::tensor(both), Value::tensor(float_tensor({1}))})));
  const Value::List& items = back.root.as_list();
  EXPECT_TRUE(items[0].as_tensor().conjugate);
  EXPECT_FALSE(items[0].as_tensor().negative);
  EXPECT_TRUE(items[1].as_tensor().negative);
  EXPECT_FALSE(items[1].as_tensor().conjugate);
  EXPECT_TRUE(items[2].as_tensor().conjugate && items[2].as_tensor().negative);
  EXPECT_FALSE(items[3].as_tensor().conjugate || items[3].as_tensor().negative);
  // torch 1.13's _rebuild_tensor_v2 takes no metadata; a float has no conjugate.
  PickleWriteOptions compat;
  compat.torch_1_13_compatible = true;
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(negative), compat), ErrorCode::write_value_unsupported);
  TensorData real_conjugate = TensorData::from_bytes(DType::float32, {4}, bytes);
  real_conjugate.conjugate = true;
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(real_conjugate)), ErrorCode::tensor_metadata_unsupported);
}

TEST(PickleWriter, CompatibilityModeRefusesDtypesTorch113Lacks) {
  PickleWriteOptions compat;
  compat.torch_1_13_compatible = true;
  for (DType dtype : {DType::complex32, DType::uint16, DType::uint32, DType::uint64, DType::float8_e4m3fn,
                      DType::float8_e5m2, DType::float8_e8m0fnu, DType::float4_e2m1fn_x2, DType::bits8, DType::bits16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::vector<std::byte> bytes(dtype_itemsize(dtype));
    const Value tensor = Value::tensor(TensorData::from_bytes(dtype, {1}, bytes));
    EXPECT_ERROR_CODE(write_pickle(tensor, compat), ErrorCode::write_value_unsupported);
    EXPECT_NO_THROW(write_pickle(tensor));
  }
}

// ==== refusals ================================================================================

TEST(PickleWriter, RefusesOneStorageViewedAsTwoDtypes) {
  const TensorData floats = float_tensor({4});
  TensorData ints = floats;
  ints.dtype = DType::int32;
  EXPECT_ERROR_CODE(write_pickle(Value::list({Value::tensor(floats), Value::tensor(ints)})),
                    ErrorCode::write_storage_dtype_conflict);
  TensorData bytes = floats;  // same itemsize is no excuse, nor is v2 vs v3
  bytes.dtype = DType::uint8;
  bytes.sizes = {16};
  bytes.strides = {1};
  TensorData f8 = bytes;
  f8.dtype = DType::float8_e5m2;
  EXPECT_ERROR_CODE(write_pickle(Value::list({Value::tensor(bytes), Value::tensor(f8)})),
                    ErrorCode::write_storage_dtype_conflict);
}

TEST(PickleWriter, RefusesNestingPastTheLimit) {
  Value nested = Value::integer(1);
  for (int i = 0; i < 65; ++i) nested = Value::list({nested});
  EXPECT_ERROR_CODE(write_pickle(nested), ErrorCode::pickle_nesting_limit);
  Value dicts = Value::none();
  for (int i = 0; i < 65; ++i) {
    Dict d;
    d.insert("k", dicts);
    dicts = Value::dict(d);
  }
  EXPECT_ERROR_CODE(write_pickle(dicts), ErrorCode::pickle_nesting_limit);
  PickleWriteOptions tight;
  tight.limits.max_nesting_depth = 2;
  EXPECT_ERROR_CODE(write_pickle(Value::list({Value::list({Value::list()})}), tight), ErrorCode::pickle_nesting_limit);
  EXPECT_NO_THROW(write_pickle(Value::list({Value::list()}), tight));
}

TEST(PickleWriter, RefusesValuesReadersWouldReject) {
  EXPECT_ERROR_CODE(write_pickle(Value::string("\xed\xa0\x80")), ErrorCode::write_value_unsupported);
  EXPECT_ERROR_CODE(write_pickle(Value::string("\xff")), ErrorCode::write_value_unsupported);
  Dict key_dict;
  key_dict.insert("\xc0\x80", Value::none());
  EXPECT_ERROR_CODE(write_pickle(Value::dict(key_dict)), ErrorCode::write_value_unsupported);
  Dict plain;
  plain.set_metadata(Value::dict());
  EXPECT_ERROR_CODE(write_pickle(Value::dict(plain)), ErrorCode::write_value_unsupported);
  Dict bad_metadata;
  bad_metadata.set_metadata(Value::list());
  EXPECT_ERROR_CODE(write_pickle(Value::ordered_dict(bad_metadata)), ErrorCode::write_value_unsupported);
  Dict float_version;
  Dict entry;
  entry.insert("version", Value::floating(1.0));
  Dict prefixes;
  prefixes.insert("", Value::dict(entry));
  float_version.set_metadata(Value::dict(prefixes));
  EXPECT_ERROR_CODE(write_pickle(Value::ordered_dict(float_version)), ErrorCode::write_value_unsupported);
}

TEST(PickleWriter, RefusesTensorsOutsideTheirStorage) {
  const TensorData base = float_tensor({4});
  TensorData past_end = base;
  past_end.sizes = {5};
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(past_end)), ErrorCode::invalid_argument);
  TensorData offset = base;
  offset.storage_offset = 4;
  offset.sizes = {1};
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(offset)), ErrorCode::invalid_argument);
  TensorData negative = base;
  negative.strides = {-1};
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(negative)), ErrorCode::invalid_argument);
  TensorData mismatched = base;
  mismatched.strides = {1, 1};
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(mismatched)), ErrorCode::invalid_argument);
  TensorData no_storage = base;
  no_storage.storage = nullptr;
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(no_storage)), ErrorCode::invalid_argument);
  TensorData expanded = base;  // stride-0 expansion the reader would refuse
  expanded.sizes = {1 << 20};
  expanded.strides = {0};
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(expanded)), ErrorCode::tensor_bytes_limit);
  PickleWriteOptions few_elements;
  few_elements.limits.max_tensor_numel = 1000;
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(expanded), few_elements), ErrorCode::tensor_numel_limit);
  TensorData grad = TensorData::from_bytes(DType::int64, {1}, std::vector<std::byte>(8));
  grad.requires_grad = true;
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(grad)), ErrorCode::tensor_requires_grad_invalid);
  TensorData odd = TensorData::from_bytes(DType::uint8, {3}, std::vector<std::byte>(3));
  odd.dtype = DType::int16;  // 3 bytes are not a whole number of int16 elements
  odd.sizes = {1};
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(odd)), ErrorCode::write_value_unsupported);
  TensorData rank = float_tensor({1});
  rank.sizes.assign(33, 1);
  rank.strides.assign(33, 1);
  EXPECT_ERROR_CODE(write_pickle(Value::tensor(rank)), ErrorCode::tensor_rank_limit);
}

// ==== Python as the oracle ====================================================================

// Runs `script` with `interpreter` and the pickle on stdin; returns its
// output, or nullopt when no interpreter is given. A failing script fails the test.
std::optional<std::string> run_python(const std::string& interpreter, const std::vector<std::byte>& pickle,
                                      const std::string& script) {
  if (interpreter.empty()) return std::nullopt;
  holdpoint::testing::TempDir dir;
  holdpoint::testing::write_file_bytes(dir / "data.pkl", pickle);
  holdpoint::testing::write_file_bytes(dir / "check.py", holdpoint::testing::bytes_of(script));
  const auto run = holdpoint::testing::run_python(interpreter, dir / "check.py", "", dir / "data.pkl");
  if (run.status != 0) ADD_FAILURE() << "python failed: " << run.output;
  return run.output;
}

TEST(PickleWriter, CPythonUnpicklesPlainValuesIdentically) {
  // Our own bytes, without tensors: plain pickle.loads is safe here.
  Dict dict;
  dict.insert("a", Value::integer(1));
  dict.insert("b", Value::list({Value::integer(1), Value::integer(2)}));
  dict.insert("c", Value::string("x"));
  dict.insert("big", Value::integer(-(std::int64_t{1} << 40)));
  dict.insert("t", Value::tuple({Value::none(), Value::boolean(true), Value::boolean(false), Value::integer(65536)}));
  dict.insert("f", Value::floating(0.25));
  dict.insert("u", Value::string("h\xc3\xa9"));
  dict.insert("by", Value::bytes(std::string("\x00\xff", 2)));
  dict.insert(DictKey(7), Value::tuple({Value::integer(1), Value::integer(2), Value::integer(3), Value::integer(4)}));
  const auto output = run_python(holdpoint::testing::oracle_python(), write_pickle(Value::dict(dict)).pickle,
                                 "import pickle, sys\nprint(repr(pickle.loads(sys.stdin.buffer.read())))\n");
  ASSERT_TRUE(output);
  EXPECT_EQ(*output,
            "{'a': 1, 'b': [1, 2], 'c': 'x', 'big': -1099511627776, 't': (None, True, False, 65536), 'f': 0.25, "
            "'u': 'h\xc3\xa9', 'by': b'\\x00\\xff', 7: (1, 2, 3, 4)}\n");
}

TEST(PickleWriter, Torch113WeightsOnlyUnpicklerAcceptsCompatibilityOutput) {
  // torch 1.13's weights_only unpickler (no BINFLOAT, no _codecs) must take the
  // compatibility output; storages are served as zero-filled typed storages.
  PickleWriteOptions compat;
  compat.torch_1_13_compatible = true;
  const auto shared = std::make_shared<const TensorData>(float_tensor({2, 3}));
  Dict metadata;
  Dict version;
  version.insert("version", Value::integer(1));
  metadata.insert("", Value::dict(version));
  Dict model;
  model.insert("w", Value::tensor(shared));
  model.insert("tied", Value::tensor(shared));
  model.set_metadata(Value::ordered_dict(metadata));
  Dict root;
  root.insert("model", Value::ordered_dict(model));
  root.insert("step", Value::integer(std::int64_t{1} << 40));
  root.insert("lr", Value::floating(0.5));
  root.insert("name", Value::string("h\xc3\xa9llo"));
  root.insert("shape", Value::tuple({Value::integer(2), Value::integer(3)}));
  root.insert("params", Value::list({Value::integer(0), Value::integer(1)}));
  root.insert(DictKey(0), Value::none());
  const std::string script = R"(
import io, sys, torch
from torch import _weights_only_unpickler as wo
u = wo.Unpickler(io.BytesIO(sys.stdin.buffer.read()))
def persistent_load(pid):
    _, storage_type, key, location, numel = pid
    return storage_type(numel).fill_(0)
u.persistent_load = persistent_load
obj = u.load()
m = obj['model']
print(type(m).__name__, list(m.keys()), m._metadata, m['w'] is m['tied'], m['w'].dtype, tuple(m['w'].shape))
print(obj['step'], obj['lr'].dtype, obj['lr'].dim(), obj['name'], obj['shape'], obj['params'], obj[0])
)";
  // The torch-1.13-compatible encoding, read by torch 1.13's own weights-only unpickler.
  const auto output = run_python(holdpoint::testing::compat_python(), write_pickle(Value::dict(root), compat).pickle, script);
  if (!output) GTEST_SKIP() << "no Python with torch 1.x (Debian's python3-torch)";
  EXPECT_EQ(*output,
            "OrderedDict ['w', 'tied'] OrderedDict([('', {'version': 1})]) True torch.float32 (2, 3)\n"
            "1099511627776 torch.float64 0 h\xc3\xa9llo (2, 3) [0, 1] None\n");
}

}  // namespace
}  // namespace holdpoint::format
