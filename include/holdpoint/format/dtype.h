// DType: the element types a checkpoint tensor can have, without LibTorch.
//
// The format layer names dtypes by this enum so that it never depends on
// LibTorch headers; include "holdpoint/tensor/torch_tensor.h" to convert to and from
// c10::ScalarType. Each dtype knows its PyTorch spelling, its legacy storage
// class (used in pickled persistent ids), and its safetensors name.
//
// Most dtypes have whole-byte elements. The three safetensors-only dtypes at
// the end (F4, F6_E2M3, F6_E3M2) pack elements across byte boundaries: they
// have no itemsize, only a bit size, and no torch dtype, so a .pt file cannot
// hold them (torch.float4_e2m1fn_x2 holds F4 elements in pairs, one pair per
// byte; the conversion between the two is `holdpoint convert`'s business).
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
  // Written by torch 2.13 like the group above; every one is a whole byte or
  // two. bits* are raw bit patterns with no arithmetic.
  float8_e8m0fnu,
  float4_e2m1fn_x2,  // two float4_e2m1fn elements per byte
  bits1x8,
  bits2x4,
  bits4x2,
  bits8,
  bits16,
  // safetensors only (F4, F6_E2M3, F6_E3M2): sub-byte elements, no torch dtype.
  float4_e2m1fn,
  float6_e2m3fn,
  float6_e3m2fn,
};

inline constexpr std::size_t kDTypeCount = 30;

// Bits per element (4, 6, 8, 16, ... 128).
std::size_t dtype_bits(DType dtype) noexcept;
// Bytes per element (1..16); 0 for the sub-byte dtypes, whose elements do not
// start on byte boundaries (size those with dtype_bits).
std::size_t dtype_itemsize(DType dtype) noexcept;
bool dtype_is_sub_byte(DType dtype) noexcept;
// "float32", as in torch.float32; the sub-byte dtypes are named after the OCP
// microscaling element types (float4_e2m1fn, float6_e2m3fn, float6_e3m2fn).
std::string_view dtype_name(DType dtype) noexcept;
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
// False for the safetensors-only sub-byte dtypes: no torch.<name> exists, so
// neither a .pt reader nor a .pt writer may use their names.
bool dtype_in_torch(DType dtype) noexcept;
// "FloatStorage" etc.; nullopt for dtypes that have no legacy storage class.
std::optional<std::string_view> dtype_storage_class(DType dtype) noexcept;
std::optional<DType> dtype_from_storage_class(std::string_view storage_class) noexcept;
// "F32" etc.; nullopt where safetensors has no name for the dtype.
std::optional<std::string_view> dtype_safetensors_name(DType dtype) noexcept;
std::optional<DType> dtype_from_safetensors_name(std::string_view name) noexcept;
// Floating point and complex dtypes can require gradients.
bool dtype_is_differentiable(DType dtype) noexcept;
// complex32, complex64 and complex128: the dtypes with conjugate views.
bool dtype_is_complex(DType dtype) noexcept;

}  // namespace holdpoint
