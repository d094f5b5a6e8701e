#include "holdpoint/tensor/torch_tensor.h"

#include <ATen/ops/from_blob.h>
#include <torch/version.h>

#include "base/fail.h"

// Scalar types that LibTorch added after 1.13 are mapped only where they exist.
#define HOLDPOINT_LIBTORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace holdpoint {

using detail::fail;

std::optional<c10::ScalarType> to_scalar_type(DType dtype) noexcept {
  switch (dtype) {
    case DType::float64: return c10::ScalarType::Double;
    case DType::float32: return c10::ScalarType::Float;
    case DType::float16: return c10::ScalarType::Half;
    case DType::bfloat16: return c10::ScalarType::BFloat16;
    case DType::int64: return c10::ScalarType::Long;
    case DType::int32: return c10::ScalarType::Int;
    case DType::int16: return c10::ScalarType::Short;
    case DType::int8: return c10::ScalarType::Char;
    case DType::uint8: return c10::ScalarType::Byte;
    case DType::boolean: return c10::ScalarType::Bool;
    case DType::complex32: return c10::ScalarType::ComplexHalf;
    case DType::complex64: return c10::ScalarType::ComplexFloat;
    case DType::complex128: return c10::ScalarType::ComplexDouble;
#if HOLDPOINT_LIBTORCH_AT_LEAST(2, 3)
    case DType::uint16: return c10::ScalarType::UInt16;
    case DType::uint32: return c10::ScalarType::UInt32;
    case DType::uint64: return c10::ScalarType::UInt64;
    case DType::float8_e4m3fn: return c10::ScalarType::Float8_e4m3fn;
    case DType::float8_e5m2: return c10::ScalarType::Float8_e5m2;
    case DType::float8_e4m3fnuz: return c10::ScalarType::Float8_e4m3fnuz;
    case DType::float8_e5m2fnuz: return c10::ScalarType::Float8_e5m2fnuz;
    case DType::bits1x8: return c10::ScalarType::Bits1x8;
    case DType::bits2x4: return c10::ScalarType::Bits2x4;
    case DType::bits4x2: return c10::ScalarType::Bits4x2;
    case DType::bits8: return c10::ScalarType::Bits8;
    case DType::bits16: return c10::ScalarType::Bits16;
#endif
#if HOLDPOINT_LIBTORCH_AT_LEAST(2, 7)
    case DType::float8_e8m0fnu: return c10::ScalarType::Float8_e8m0fnu;
#endif
#if HOLDPOINT_LIBTORCH_AT_LEAST(2, 8)
    case DType::float4_e2m1fn_x2: return c10::ScalarType::Float4_e2m1fn_x2;
#endif
    // Not a scalar type of this LibTorch (1.13 has no unsigned > 8 bit, float8 or
    // bits types), or a safetensors-only sub-byte type (float4_e2m1fn, float6_*).
    default: return std::nullopt;
  }
}

DType from_scalar_type(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Double: return DType::float64;
    case c10::ScalarType::Float: return DType::float32;
    case c10::ScalarType::Half: return DType::float16;
    case c10::ScalarType::BFloat16: return DType::bfloat16;
    case c10::ScalarType::Long: return DType::int64;
    case c10::ScalarType::Int: return DType::int32;
    case c10::ScalarType::Short: return DType::int16;
    case c10::ScalarType::Char: return DType::int8;
    case c10::ScalarType::Byte: return DType::uint8;
    case c10::ScalarType::Bool: return DType::boolean;
    case c10::ScalarType::ComplexHalf: return DType::complex32;
    case c10::ScalarType::ComplexFloat: return DType::complex64;
    case c10::ScalarType::ComplexDouble: return DType::complex128;
#if HOLDPOINT_LIBTORCH_AT_LEAST(2, 3)
    case c10::ScalarType::UInt16: return DType::uint16;
    case c10::ScalarType::UInt32: return DType::uint32;
    case c10::ScalarType::UInt64: return DType::uint64;
    case c10::ScalarType::Float8_e4m3fn: return DType::float8_e4m3fn;
    case c10::ScalarType::Float8_e5m2: return DType::float8_e5m2;
    case c10::ScalarType::Float8_e4m3fnuz: return DType::float8_e4m3fnuz;
    case c10::ScalarType::Float8_e5m2fnuz: return DType::float8_e5m2fnuz;
    case c10::ScalarType::Bits1x8: return DType::bits1x8;
    case c10::ScalarType::Bits2x4: return DType::bits2x4;
    case c10::ScalarType::Bits4x2: return DType::bits4x2;
    case c10::ScalarType::Bits8: return DType::bits8;
    case c10::ScalarType::Bits16: return DType::bits16;
#endif
#if HOLDPOINT_LIBTORCH_AT_LEAST(2, 7)
    case c10::ScalarType::Float8_e8m0fnu: return DType::float8_e8m0fnu;
#endif
#if HOLDPOINT_LIBTORCH_AT_LEAST(2, 8)
    case c10::ScalarType::Float4_e2m1fn_x2: return DType::float4_e2m1fn_x2;
#endif
    default: break;
  }
  fail(ErrorCode::dtype_unsupported, "scalar type ", c10::toString(type), " has no checkpoint dtype");
}

at::Tensor to_at_tensor(const TensorData& tensor) {
  const auto type = to_scalar_type(tensor.dtype);
  if (!type) {
    fail(ErrorCode::dtype_unsupported, "dtype ", dtype_name(tensor.dtype), " has no scalar type in this LibTorch");
  }
  // The view starts at storage_offset; from_blob derives the storage extent
  // from sizes and strides. The deleter holds the storage (and through it the
  // snapshot or the source tensor) for as long as the at::Tensor lives.
  auto* start = const_cast<std::byte*>(tensor.storage->data()) +
                static_cast<std::size_t>(tensor.storage_offset) * tensor.itemsize();
  std::shared_ptr<const Storage> keep = tensor.storage;
  at::Tensor result = at::from_blob(
      start, at::IntArrayRef(tensor.sizes.data(), tensor.sizes.size()),
      at::IntArrayRef(tensor.strides.data(), tensor.strides.size()), [keep](void*) mutable { keep.reset(); },
      at::TensorOptions().dtype(*type).device(at::kCPU));
  // torch's lazy views keep their bits, as torch.load's set_tensor_metadata does.
  if (tensor.conjugate) result._set_conj(true);
  if (tensor.negative) result._set_neg(true);
  if (tensor.requires_grad) result.set_requires_grad(true);
  return result;
}

TensorData from_at_tensor(const at::Tensor& input) {
  if (!input.defined()) fail(ErrorCode::invalid_argument, "undefined at::Tensor");
  if (input.is_sparse() || input.is_quantized() || input.is_mkldnn()) {
    fail(ErrorCode::dtype_unsupported, "only dense strided tensors can be captured (got layout ", input.layout(),
         ", quantized ", input.is_quantized(), ")");
  }
  at::Tensor tensor = input.device().is_cpu() ? input : input.to(at::kCPU);
  if (tensor.is_conj() || tensor.is_neg()) tensor = tensor.resolve_conj().resolve_neg();

  TensorData data;
  data.dtype = from_scalar_type(tensor.scalar_type());
  data.sizes = tensor.sizes().vec();
  data.strides = tensor.strides().vec();
  data.storage_offset = tensor.storage_offset();
  data.requires_grad = tensor.requires_grad();
  const c10::Storage& storage = tensor.storage();
  auto owner = std::make_shared<c10::Storage>(storage);
  const auto* bytes = static_cast<const std::byte*>(storage.data());
  data.storage = std::make_shared<const Storage>(bytes, storage.nbytes(), std::move(owner),
                                                 storage.unsafeGetStorageImpl());
  return data;
}

}  // namespace holdpoint
