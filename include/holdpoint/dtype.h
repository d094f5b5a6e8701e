// DType: the element types a checkpoint tensor can have, without LibTorch.
//
// The format layer names dtypes by this enum so that it never depends on
// LibTorch headers; include "holdpoint/torch_tensor.h" to convert to and from
// c10::ScalarType. Each dtype knows its PyTorch spelling, its legacy storage
// class (used in pickled persistent ids), and its safetensors name.
//
// Thread-safety: pure functions over constant tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace holdpoint {

enum class DType : std::uint8_t {
  float64,
  float32,
  float16,
  bfloat16,
  int64,
  int32,
  int16,
  int8,
  uint8,
  boolean,
  complex32,  // torch.complex32 / ComplexHalf: no legacy storage class
  complex64,
  complex128,
  // Written by torch >= 2.x only (UntypedStorage + _rebuild_tensor_v3); LibTorch
  // 1.13 has no such scalar types, so they stay byte buffers on that build.
  uint16,
  uint32,
  uint64,
  float8_e4m3fn,
  float8_e5m2,
  float8_e4m3fnuz,
  float8_e5m2fnuz,
};

inline constexpr std::size_t kDTypeCount = 20;

// Bytes per element (1..16).
std::size_t dtype_itemsize(DType dtype) noexcept;
// "float32", as in torch.float32.
std::string_view dtype_name(DType dtype) noexcept;
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
// "FloatStorage" etc.; nullopt for dtypes that have no legacy storage class.
std::optional<std::string_view> dtype_storage_class(DType dtype) noexcept;
std::optional<DType> dtype_from_storage_class(std::string_view storage_class) noexcept;
// "F32" etc.; nullopt where safetensors has no name for the dtype.
std::optional<std::string_view> dtype_safetensors_name(DType dtype) noexcept;
std::optional<DType> dtype_from_safetensors_name(std::string_view name) noexcept;
// Floating point and complex dtypes can require gradients.
bool dtype_is_differentiable(DType dtype) noexcept;

}  // namespace holdpoint
