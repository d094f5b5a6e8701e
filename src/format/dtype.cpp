#include "holdpoint/dtype.h"

#include <array>

namespace holdpoint {
namespace {

struct DTypeInfo {
  DType dtype;
  std::size_t itemsize;
  std::string_view name;
  std::string_view storage_class;     // empty: none
  std::string_view safetensors_name;  // empty: none
  bool differentiable;
};

// Storage classes: torch/storage.py _dtype_to_storage_type_map (1.13 and 2.x).
// safetensors names: the dtype list of the safetensors format specification.
constexpr std::array<DTypeInfo, kDTypeCount> kInfo = {{
    {DType::float64, 8, "float64", "DoubleStorage", "F64", true},
    {DType::float32, 4, "float32", "FloatStorage", "F32", true},
    {DType::float16, 2, "float16", "HalfStorage", "F16", true},
    {DType::bfloat16, 2, "bfloat16", "BFloat16Storage", "BF16", true},
    {DType::int64, 8, "int64", "LongStorage", "I64", false},
    {DType::int32, 4, "int32", "IntStorage", "I32", false},
    {DType::int16, 2, "int16", "ShortStorage", "I16", false},
    {DType::int8, 1, "int8", "CharStorage", "I8", false},
    {DType::uint8, 1, "uint8", "ByteStorage", "U8", false},
    {DType::boolean, 1, "bool", "BoolStorage", "BOOL", false},
    {DType::complex32, 4, "complex32", "", "", true},
    {DType::complex64, 8, "complex64", "ComplexFloatStorage", "C64", true},
    {DType::complex128, 16, "complex128", "ComplexDoubleStorage", "", true},
    {DType::uint16, 2, "uint16", "", "U16", false},
    {DType::uint32, 4, "uint32", "", "U32", false},
    {DType::uint64, 8, "uint64", "", "U64", false},
    {DType::float8_e4m3fn, 1, "float8_e4m3fn", "", "F8_E4M3", true},
    {DType::float8_e5m2, 1, "float8_e5m2", "", "F8_E5M2", true},
    {DType::float8_e4m3fnuz, 1, "float8_e4m3fnuz", "", "F8_E4M3FNUZ", true},
    {DType::float8_e5m2fnuz, 1, "float8_e5m2fnuz", "", "F8_E5M2FNUZ", true},
}};

const DTypeInfo& info(DType dtype) noexcept {
  const auto index = static_cast<std::size_t>(dtype);
  return kInfo[index < kInfo.size() ? index : 0];
}

}  // namespace

std::size_t dtype_itemsize(DType dtype) noexcept { return info(dtype).itemsize; }
std::string_view dtype_name(DType dtype) noexcept { return info(dtype).name; }
bool dtype_is_differentiable(DType dtype) noexcept { return info(dtype).differentiable; }

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
