// Bridge between holdpoint's LibTorch-free tensors (TensorData) and at::Tensor.
//
// Both directions are zero-copy: to_at_tensor views the TensorData's storage
// (for a loaded file, the private snapshot) and keeps it alive through the
// at::Tensor's deleter; from_at_tensor views the at::Tensor's storage and
// keeps the c10::Storage alive. Views of one at::Storage map to TensorData
// with the same Storage identity, so writers emit one record for them.
//
// Only dense, strided CPU tensors are captured; CUDA tensors are copied to the
// CPU first (which gives them a storage of their own). Quantized and sparse
// tensors are refused (dtype_unsupported).
//
// Thread-safety: as for at::Tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "holdpoint/format/dtype.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

std::optional<c10::ScalarType> to_scalar_type(DType dtype) noexcept;
// Throws Error(dtype_unsupported) for quantized and other non-plain types.
DType from_scalar_type(c10::ScalarType type);

// Throws Error(dtype_unsupported) if this LibTorch has no scalar type for the dtype.
at::Tensor to_at_tensor(const TensorData& tensor);
TensorData from_at_tensor(const at::Tensor& tensor);

inline Value tensor_value(const at::Tensor& tensor) { return Value::tensor(from_at_tensor(tensor)); }

}  // namespace holdpoint
