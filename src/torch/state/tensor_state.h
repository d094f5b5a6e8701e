// Tensors in component states: capturing live at::Tensors into Values,
// checking state tensors against live ones, and copying validated state into
// live tensors in place (so that references held elsewhere, such as an
// optimizer's view of a parameter, stay valid).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

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

// copy_into for each pair. When every live tensor is on the CPU and there is
// enough to copy, a second thread takes half of the bytes: a resume then
// copies a model at the speed of two cores even where ATen runs one intra-op
// thread (torch.set_num_threads(1), as torchrun sets OMP_NUM_THREADS=1). The
// first failure in `copies` order is rethrown once both threads are done.
void copy_all_into(std::vector<std::pair<at::Tensor, const TensorData*>>& copies);

// A tensor with `like`'s dtype, sizes, strides and device holding `state`'s
// elements, to become live state in place of `like`'s kind of tensor. It views
// the snapshot's bytes directly, without a copy, when `state` was handed over
// (Storage::handed_over) and nothing else holds it or its storage, so that no
// other reader can see the writes that training then makes; otherwise it is a
// fresh tensor with a copy.
at::Tensor adopt_or_copy(const std::shared_ptr<const TensorData>& state, const at::Tensor& like);

}  // namespace holdpoint::state
