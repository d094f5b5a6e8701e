// Tensors in component states: capturing live at::Tensors into Values,
// checking state tensors against live ones, and copying validated state into
// live tensors in place (so that references held elsewhere, such as an
// optimizer's view of a parameter, stay valid).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "holdpoint/state/component.h"
#include "holdpoint/format/value.h"

namespace holdpoint::state {

// reference: a zero-copy view of `tensor`; copy: a detached clone.
Value capture_tensor(const at::Tensor& tensor, CaptureMode mode);

// state_dtype_mismatch / state_shape_mismatch naming `path`, expected (live) and found.
void check_tensor_matches(const TensorData& state, const at::Tensor& live, const std::string& path);

// A fresh CPU at::Tensor holding a copy of `state`'s elements.
at::Tensor tensor_from_state(const TensorData& state);

// live.copy_(state) without autograd tracking; shapes and dtypes must match.
void copy_into(at::Tensor& live, const TensorData& state);

}  // namespace holdpoint::state
