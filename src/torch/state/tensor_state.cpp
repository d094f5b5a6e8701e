#include "state/tensor_state.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>

#include <cstdint>
#include <exception>
#include <thread>

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
  if (at::IntArrayRef(state.sizes.data(), state.sizes.size()) != live.sizes()) {
    state_error(ErrorCode::state_shape_mismatch, path, " has shape ", shape_text(state.sizes), ", the live tensor ",
                shape_text(live.sizes()));
  }
}

at::Tensor tensor_from_state(const TensorData& state) { return to_at_tensor(state).clone(); }

void copy_into(at::Tensor& live, const TensorData& state) {
  // A resume in place has already written the bytes where they belong: the
  // state views the live tensor's own memory.
  if (live.device().is_cpu() && state.storage && state.storage->has_bytes() &&
      live.data_ptr() == static_cast<const void*>(state.storage->data() + state.storage_offset * state.itemsize()) &&
      at::IntArrayRef(state.strides.data(), state.strides.size()) == live.strides() &&
      to_scalar_type(state.dtype) == live.scalar_type()) {
    return;
  }
  at::NoGradGuard no_grad;
  live.copy_(to_at_tensor(state));
}

namespace {

// Below this many bytes a second thread costs more than it saves.
constexpr std::uint64_t kParallelCopyBytes = std::uint64_t{32} << 20;

}  // namespace

void copy_all_into(std::vector<std::pair<at::Tensor, const TensorData*>>& copies) {
  std::uint64_t total = 0;
  bool on_cpu = true;
  for (const auto& [live, state] : copies) {
    total += static_cast<std::uint64_t>(live.nbytes());
    on_cpu = on_cpu && live.device().is_cpu();
  }
  if (!on_cpu || total < kParallelCopyBytes || copies.size() < 2) {
    for (auto& [live, state] : copies) copy_into(live, *state);
    return;
  }
  // This thread takes the first half of the bytes, the helper the rest.
  std::size_t split = 0;
  for (std::uint64_t running = 0; split < copies.size() && running < total / 2; ++split) {
    running += static_cast<std::uint64_t>(copies[split].first.nbytes());
  }
  const auto copy_range = [&copies](std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) copy_into(copies[i].first, *copies[i].second);
  };
  std::exception_ptr second_half;
  std::thread helper([&] {
    try {
      copy_range(split, copies.size());
    } catch (...) {
      second_half = std::current_exception();
    }
  });
  std::exception_ptr first_half;
  try {
    copy_range(0, split);
  } catch (...) {
    first_half = std::current_exception();
  }
  helper.join();
  if (first_half) std::rethrow_exception(first_half);
  if (second_half) std::rethrow_exception(second_half);
}

namespace {

bool can_adopt(const std::shared_ptr<const TensorData>& state, const at::Tensor& like) {
  const TensorData& data = *state;
  if (state.use_count() != 1 || !data.storage || data.storage.use_count() != 1 || !data.storage->handed_over()) {
    return false;
  }
  if (!like.device().is_cpu() || like.layout() != at::kStrided || to_scalar_type(data.dtype) != like.scalar_type() ||
      at::IntArrayRef(data.sizes.data(), data.sizes.size()) != like.sizes() ||
      at::IntArrayRef(data.strides.data(), data.strides.size()) != like.strides()) {
    return false;
  }
  const std::size_t itemsize = data.itemsize();
  const auto start = reinterpret_cast<std::uintptr_t>(data.storage->data()) +
                     static_cast<std::uintptr_t>(data.storage_offset) * itemsize;
  return itemsize > 0 && start % itemsize == 0;
}

}  // namespace

at::Tensor adopt_or_copy(const std::shared_ptr<const TensorData>& state, const at::Tensor& like) {
  if (can_adopt(state, like)) return to_at_tensor(*state).detach();
  at::Tensor fresh = at::empty_like(like.detach(), at::MemoryFormat::Preserve);
  copy_into(fresh, *state);
  return fresh;
}

}  // namespace holdpoint::state
