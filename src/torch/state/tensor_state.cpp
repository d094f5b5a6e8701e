#include "state/tensor_state.h"

#include <ATen/core/grad_mode.h>

#include "holdpoint/tensor/torch_tensor.h"
#include "state/state_fields.h"

namespace holdpoint::state {

Value capture_tensor(const at::Tensor& tensor, CaptureMode mode) {
  const at::Tensor source = tensor.detach();
  return tensor_value(mode == CaptureMode::copy ? source.clone() : source);
}

void check_tensor_matches(const TensorData& state, const at::Tensor& live, const std::string& path) {
  const DType live_dtype = from_scalar_type(live.scalar_type());
  if (state.dtype != live_dtype) {
    state_error(ErrorCode::state_dtype_mismatch, path, " has dtype ", dtype_name(state.dtype), ", the live tensor ",
                dtype_name(live_dtype));
  }
  if (at::IntArrayRef(state.sizes) != live.sizes()) {
    state_error(ErrorCode::state_shape_mismatch, path, " has shape ", shape_text(state.sizes), ", the live tensor ",
                shape_text(live.sizes()));
  }
}

at::Tensor tensor_from_state(const TensorData& state) { return to_at_tensor(state).clone(); }

void copy_into(at::Tensor& live, const TensorData& state) {
  at::NoGradGuard no_grad;
  live.copy_(to_at_tensor(state));
}

}  // namespace holdpoint::state
