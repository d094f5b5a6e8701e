#include "holdpoint/format/dtype.h"

#include <array>

namespace holdpoint {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t bits;
  std::string_view name;
  std::string_view storage_class;     // empty: none
  std::string_view safetensors_name;  // empty: none
  bool differentiable;
  bool in_torch;
};

// Storage classes: torch/storage.py _dtype_to_storage_type_map (1.13 and 2.x).
// safetensors names: the dtype list of the safetensors format specification.
// F4 names float4_e2m1fn, one 4-bit element; the reference's torch loader
// reads it as float4_e2m1fn_x2 with the last dimension halved, which is a
// reshaping, not a dtype correspondence, so float4_e2m1fn_x2 has no name here.
constexpr std::array<DTypeInfo, kDTypeCount> kInfo = {{
    {DType::float64, 64, "float64", "DoubleStorage", "F64", true, true},
    {DType::float32, 32, "float32", "FloatStorage", "F32", true, true},
    {DType::float16, 16, "float16", "HalfStorage", "F16", true, true},
    {DType::bfloat16, 16, "bfloat16", "BFloat16Storage", "BF16", true, true},
    {DType::int64, 64, "int64", "LongStorage", "I64", false, true},
    {DType::int32, 32, "int32", "IntStorage", "I32", false, true},
    {DType::int16, 16, "int16", "ShortStorage", "I16", false, true},
    {DType::int8, 8, "int8", "CharStorage", "I8", false, true},
    {DType::uint8, 8, "uint8", "ByteStorage", "U8", false, true},
    {DType::boolean, 8, "bool", "BoolStorage", "BOOL", false, true},
    {DType::complex32, 32, "complex32", "", "", true, true},
    {DType::complex64, 64, "complex64", "ComplexFloatStorage", "C64", true, true},
    {DType::complex128, 128, "complex128", "ComplexDoubleStorage", "", true, true},
    {DType::uint16, 16, "uint16", "", "U16", false, true},
    {DType::uint32, 32, "uint32", "", "U32", false, true},
    {DType::uint64, 64, "uint64", "", "U64", false, true},
    {DType::float8_e4m3fn, 8, "float8_e4m3fn", "", "F8_E4M3", true, true},
    {DType::float8_e5m2, 8, "float8_e5m2", "", "F8_E5M2", true, true},
    {DType::float8_e4m3fnuz, 8, "float8_e4m3fnuz", "", "F8_E4M3FNUZ", true, true},
    {DType::float8_e5m2fnuz, 8, "float8_e5m2fnuz", "", "F8_E5M2FNUZ", true, true},
    {DType::float8_e8m0fnu, 8, "float8_e8m0fnu", "", "F8_E8M0", true, true},
    {DType::float4_e2m1fn_x2, 8, "float4_e2m1fn_x2", "", "", true, true},
    {DType::bits1x8, 8, "bits1x8", "", "", false, true},
    {DType::bits2x4, 8, "bits2x4", "", "", false, true},
    {DType::bits4x2, 8, "bits4x2", "", "", false, true},
    {DType::bits8, 8, "bits8", "", "", false, true},
    {DType::bits16, 16, "bits16", "", "", false, true},
    {DType::float4_e2m1fn, 4, "float4_e2m1fn", "", "F4", false, false},
    {DType::float6_e2m3fn, 6, "float6_e2m3fn", "", "F6_E2M3", false, false},
    {DType::float6_e3m2fn, 6, "float6_e3m2fn", "", "F6_E3M2", false, false},
}};

// info() indexes the table by enumerator, and a short initializer list would
// silently fill the tail with float64 entries.
constexpr bool table_follows_the_enum() {
  for (std::size_t i = 0; i < kInfo.size(); ++i) {
    if (static_cast<std::size_t>(kInfo[i].dtype) != i || kInfo[i].name.empty()) return false;
  }
  return true;
}
static_assert(table_follows_the_enum(), "kInfo must list every DType in enum order");
static_assert(kDTypeCount == static_cast<std::size_t>(DType::float6_e3m2fn) + 1, "kDTypeCount is out of date");

const DTypeInfo& info(DType dtype) noexcept {
  const auto index = static_cast<std::size_t>(dtype);
  return kInfo[index < kInfo.size() ? index : 0];
}

}  // namespace

std::size_t dtype_bits(DType dtype) noexcept { return info(dtype).bits; }
std::size_t dtype_itemsize(DType dtype) noexcept {
  const std::size_t bits = info(dtype).bits;
  return bits % 8 == 0 ? bits / 8 : 0;
}
bool dtype_is_sub_byte(DType dtype) noexcept { return info(dtype).bits % 8 != 0; }
std::string_view dtype_name(DType dtype) noexcept { return info(dtype).name; }
bool dtype_in_torch(DType dtype) noexcept { return info(dtype).in_torch; }
bool dtype_is_differentiable(DType dtype) noexcept { return info(dtype).differentiable; }

bool dtype_is_complex(DType dtype) noexcept {
  return dtype == DType::complex32 || dtype == DType::complex64 || dtype == DType::complex128;
}

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (const auto& entry : kInfo) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::optional<std::string_view> dtype_storage_class(DType dtype) noexcept {
  const auto& entry = info(dtype);
  if (entry.storage_class.empty()) return std::nullopt;
  return entry.storage_class;
}

std::optional<DType> dtype_from_storage_class(std::string_view storage_class) noexcept {
  if (storage_class.empty()) return std::nullopt;
  for (const auto& entry : kInfo) {
    if (entry.storage_class == storage_class) return entry.dtype;
  }
  return std::nullopt;
}

std::optional<std::string_view> dtype_safetensors_name(DType dtype) noexcept {
  const auto& entry = info(dtype);
  if (entry.safetensors_name.empty()) return std::nullopt;
  return entry.safetensors_name;
}

std::optional<DType> dtype_from_safetensors_name(std::string_view name) noexcept {
  if (name.empty()) return std::nullopt;
  for (const auto& entry : kInfo) {
    if (entry.safetensors_name == name) return entry.dtype;
  }
  return std::nullopt;
}

}  // namespace holdpoint
