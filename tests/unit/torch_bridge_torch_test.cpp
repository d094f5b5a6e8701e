// at::Tensor <-> holdpoint round trips through real files: every LibTorch 1.13
// dtype and those added since (on LibTorch 2.x), 0-d/empty/strided views,
// shared storages, zero-copy loading.
#include <ATen/ATen.h>
#include <torch/version.h>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// Bitwise equality (NaN-safe): same dtype, shape, and element bytes.
bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

at::Tensor random_tensor(c10::ScalarType type, at::IntArrayRef sizes) {
  // Random bytes reinterpreted as the dtype cover every bit pattern, NaNs included.
  const std::int64_t numel = c10::multiply_integers(sizes);
  at::Tensor bytes = at::randint(0, 256, {numel * static_cast<std::int64_t>(c10::elementSize(type))}, at::kByte);
  return bytes.view(type).reshape(sizes).clone();
}

LoadedMapping save_and_load(const Value& root, const std::filesystem::path& path) {
  save_mapping(path, root);
  return load_checkpoint_mapping(path);
}

TEST(TorchBridge, EveryLibTorchDtypeRoundTripsBitExactly) {
  TempDir dir;
  const std::vector<c10::ScalarType> types = {
      at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort,
      at::kChar,   at::kByte,  at::kBool, at::kComplexHalf, at::kComplexFloat, at::kComplexDouble};
  Dict entries;
  std::vector<at::Tensor> originals;
  for (c10::ScalarType type : types) {
    at::Tensor t = type == at::kBool ? at::randint(0, 2, {3, 5}, at::kBool) : random_tensor(type, {3, 5});
    originals.push_back(t);
    entries.insert(std::string(c10::toString(type)), tensor_value(t));
  }
  const LoadedMapping loaded = save_and_load(Value::dict(std::move(entries)), dir / "dtypes.pt");
  for (std::size_t i = 0; i < types.size(); ++i) {
    const at::Tensor back = to_at_tensor(loaded.root.as_dict().at(std::string(c10::toString(types[i]))).as_tensor());
    EXPECT_TRUE(bitwise_equal(back, originals[i])) << c10::toString(types[i]);
  }
}

TEST(TorchBridge, ZeroDimEmptyAndHighRankTensors) {
  TempDir dir;
  Dict entries;
  const at::Tensor scalar = at::tensor(3.5, at::kDouble).reshape({});
  const at::Tensor empty = at::zeros({0, 3});
  const at::Tensor rank5 = at::arange(2 * 3 * 1 * 2 * 2, at::kInt).reshape({2, 3, 1, 2, 2});
  entries.insert("scalar", tensor_value(scalar));
  entries.insert("empty", tensor_value(empty));
  entries.insert("rank5", tensor_value(rank5));
  const LoadedMapping loaded = save_and_load(Value::dict(std::move(entries)), dir / "shapes.pt");
  const Dict& d = loaded.root.as_dict();
  EXPECT_TRUE(bitwise_equal(to_at_tensor(d.at("scalar").as_tensor()), scalar));
  EXPECT_EQ(to_at_tensor(d.at("scalar").as_tensor()).dim(), 0);
  EXPECT_TRUE(bitwise_equal(to_at_tensor(d.at("empty").as_tensor()), empty));
  EXPECT_TRUE(bitwise_equal(to_at_tensor(d.at("rank5").as_tensor()), rank5));
}

TEST(TorchBridge, ViewsKeepTheirGeometryAndShareOneStorage) {
  TempDir dir;
  const at::Tensor base = at::arange(24, at::kFloat).reshape({4, 6});
  const at::Tensor transposed = base.t();
  const at::Tensor slice = base.slice(1, 2, 5);  // offset 2, non-contiguous rows
  const at::Tensor expanded = base.select(0, 1).unsqueeze(0).expand({3, 6});  // stride 0
  Dict entries;
  entries.insert("base", tensor_value(base));
  entries.insert("transposed", tensor_value(transposed));
  entries.insert("slice", tensor_value(slice));
  entries.insert("expanded", tensor_value(expanded));
  const auto path = dir / "views.pt";
  const SaveResult saved = save_mapping(path, Value::dict(std::move(entries)));
  EXPECT_EQ(saved.tensor_count, 4u);
  EXPECT_EQ(saved.storage_count, 1u) << "all four views name one storage record";

  const LoadedMapping loaded = load_checkpoint_mapping(path);
  const Dict& d = loaded.root.as_dict();
  for (const char* name : {"base", "transposed", "slice", "expanded"}) {
    EXPECT_EQ(d.at(name).as_tensor().storage->identity(), d.at("base").as_tensor().storage->identity()) << name;
  }
  EXPECT_EQ(d.at("transposed").as_tensor().strides, (std::vector<std::int64_t>{1, 6}));
  EXPECT_EQ(d.at("slice").as_tensor().storage_offset, 2);
  EXPECT_EQ(d.at("expanded").as_tensor().strides, (std::vector<std::int64_t>{0, 1}));
  EXPECT_TRUE(bitwise_equal(to_at_tensor(d.at("transposed").as_tensor()), transposed));
  EXPECT_TRUE(bitwise_equal(to_at_tensor(d.at("slice").as_tensor()), slice));
  EXPECT_TRUE(bitwise_equal(to_at_tensor(d.at("expanded").as_tensor()), expanded));
  // The loaded views alias the same bytes, as the originals did.
  const at::Tensor loaded_base = to_at_tensor(d.at("base").as_tensor());
  const at::Tensor loaded_slice = to_at_tensor(d.at("slice").as_tensor());
  EXPECT_EQ(static_cast<char*>(loaded_slice.data_ptr()), static_cast<char*>(loaded_base.data_ptr()) + 2 * 4);
}

TEST(TorchBridge, LoadedTensorsAreZeroCopyAndKeepTheSnapshotAlive) {
  TempDir dir;
  const at::Tensor original = at::randn({256, 256});
  Dict entries;
  entries.insert("w", tensor_value(original));
  at::Tensor view;
  const void* storage_bytes = nullptr;
  {
    const LoadedMapping loaded = save_and_load(Value::dict(std::move(entries)), dir / "w.pt");
    const TensorData& w = loaded.root.as_dict().at("w").as_tensor();
    storage_bytes = w.storage->data();
    view = to_at_tensor(w);
  }
  EXPECT_EQ(view.data_ptr(), storage_bytes) << "no copy between the snapshot and the at::Tensor";
  EXPECT_TRUE(bitwise_equal(view, original)) << "the snapshot outlives the LoadedMapping";
}

TEST(TorchBridge, CapturedTensorsAreZeroCopyUntilWritten) {
  const at::Tensor t = at::arange(10, at::kLong);
  const TensorData data = from_at_tensor(t);
  EXPECT_EQ(static_cast<const void*>(data.storage->data()), t.data_ptr());
  EXPECT_EQ(data.storage->identity(), t.storage().unsafeGetStorageImpl());
}

TEST(TorchBridge, RequiresGradAndConjugationSurvive) {
  TempDir dir;
  const at::Tensor weight = at::randn({3}).set_requires_grad(true);
  const at::Tensor complex = at::randn({2}, at::kComplexFloat);
  const at::Tensor conjugated = complex.conj();  // a lazy conj view; captured resolved
  Dict entries;
  entries.insert("weight", tensor_value(weight));
  entries.insert("conj", tensor_value(conjugated));
  const LoadedMapping loaded = save_and_load(Value::dict(std::move(entries)), dir / "grad.pt");
  const at::Tensor w = to_at_tensor(loaded.root.as_dict().at("weight").as_tensor());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(bitwise_equal(w.detach(), weight.detach()));
  EXPECT_TRUE(bitwise_equal(to_at_tensor(loaded.root.as_dict().at("conj").as_tensor()), conjugated.resolve_conj()));
}

TEST(TorchBridge, UnsupportedKindsAreRefusedWithTheirCode) {
  const at::Tensor quantized = at::quantize_per_tensor(at::randn({4}), 0.1, 0, at::kQInt8);
  EXPECT_ERROR_CODE(from_at_tensor(quantized), ErrorCode::dtype_unsupported);
  const at::Tensor sparse = at::eye(3).to_sparse();
  EXPECT_ERROR_CODE(from_at_tensor(sparse), ErrorCode::dtype_unsupported);
  EXPECT_ERROR_CODE(from_at_tensor(at::Tensor()), ErrorCode::invalid_argument);
  // safetensors' F4 (one float4 per 4 bits) has no scalar type in any LibTorch.
  const std::uint8_t two_float4s = 0x21;
  const TensorData float4 = TensorData::from_bytes(
      DType::float4_e2m1fn, {2}, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&two_float4s), 1));
  EXPECT_ERROR_CODE(to_at_tensor(float4), ErrorCode::dtype_unsupported);
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 3)
  // LibTorch before 2.3 has no uint16.
  const std::uint16_t value = 7;
  const TensorData uint16 = TensorData::from_bytes(
      DType::uint16, {1}, std::span<const std::byte>(reinterpret_cast<const std::byte*>(&value), 2));
  EXPECT_ERROR_CODE(to_at_tensor(uint16), ErrorCode::dtype_unsupported);
#endif
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
// The scalar types LibTorch added after 1.13 (uint16/32/64, the float8
// variants, float8_e8m0fnu, float4_e2m1fn_x2, bits*): through a real file and
// back, bit for bit, with holdpoint's dtype names and the same storage sharing.
TEST(TorchBridge, DtypesAddedSinceLibTorch113RoundTripBitExactly) {
  TempDir dir;
  const std::vector<std::pair<c10::ScalarType, DType>> types = {
      {c10::ScalarType::UInt16, DType::uint16},
      {c10::ScalarType::UInt32, DType::uint32},
      {c10::ScalarType::UInt64, DType::uint64},
      {c10::ScalarType::Float8_e4m3fn, DType::float8_e4m3fn},
      {c10::ScalarType::Float8_e5m2, DType::float8_e5m2},
      {c10::ScalarType::Float8_e4m3fnuz, DType::float8_e4m3fnuz},
      {c10::ScalarType::Float8_e5m2fnuz, DType::float8_e5m2fnuz},
      {c10::ScalarType::Bits1x8, DType::bits1x8},
      {c10::ScalarType::Bits2x4, DType::bits2x4},
      {c10::ScalarType::Bits4x2, DType::bits4x2},
      {c10::ScalarType::Bits8, DType::bits8},
      {c10::ScalarType::Bits16, DType::bits16},
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 7
      {c10::ScalarType::Float8_e8m0fnu, DType::float8_e8m0fnu},
#endif
#if TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 8
      {c10::ScalarType::Float4_e2m1fn_x2, DType::float4_e2m1fn_x2},
#endif
  };
  Dict entries;
  std::vector<at::Tensor> originals;
  for (const auto& [type, dtype] : types) {
    // No clone: LibTorch has no copy kernel for the bits types.
    at::Tensor t = at::randint(0, 256, {12 * static_cast<std::int64_t>(c10::elementSize(type))}, at::kByte)
                       .view(type)
                       .reshape({3, 4});
    EXPECT_EQ(from_at_tensor(t).dtype, dtype) << c10::toString(type);
    EXPECT_EQ(to_scalar_type(dtype), std::optional<c10::ScalarType>(type)) << c10::toString(type);
    originals.push_back(t);
    entries.insert(std::string(dtype_name(dtype)), tensor_value(t));
  }
  const LoadedMapping loaded = save_and_load(Value::dict(std::move(entries)), dir / "new_dtypes.pt");
  for (std::size_t i = 0; i < types.size(); ++i) {
    const at::Tensor back = to_at_tensor(loaded.root.as_dict().at(std::string(dtype_name(types[i].second))).as_tensor());
    EXPECT_TRUE(bitwise_equal(back, originals[i])) << c10::toString(types[i].first);
  }
}
#endif

}  // namespace
}  // namespace holdpoint
