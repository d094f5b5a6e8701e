// Seed 004's fixture in LibTorch: a module with one parameter and one
// persistent buffer, a selection at w=2, offset=1 (output 7 at x=3), an
// in-place update to w=7, offset=11 (output 32), and the capture routes
// LibTorch users write, each taken at the selection point. Shared by the
// capture_routes example and tests/unit/best_state_torch_test.cpp, so the
// test asserts exactly the routes the example reports.
#pragma once

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "holdpoint/checkpoint/best_state_gate.h"

namespace tiny_selection {

struct TinyImpl : torch::nn::Cloneable<TinyImpl> {
  TinyImpl() { reset(); }
  void reset() override {
    w = register_parameter("w", at::tensor({2.0f}));
    offset = register_buffer("offset", at::tensor({1.0f}));
  }
  at::Tensor forward(const at::Tensor& x) { return w * x + offset; }

  at::Tensor w;
  at::Tensor offset;
};
TORCH_MODULE(Tiny);

inline holdpoint::ModuleRecipe tiny_recipe() {
  return {[] { return std::static_pointer_cast<torch::nn::Module>(std::make_shared<TinyImpl>()); },
          [](torch::nn::Module& module, const at::Tensor& x) { return dynamic_cast<TinyImpl&>(module).forward(x); }};
}

inline at::Tensor probe_input() { return at::tensor({3.0f}); }

inline float output_at_probe(TinyImpl& module) {
  at::NoGradGuard no_grad;
  return module.forward(probe_input()).item<float>();
}

inline holdpoint::SelectionInfo tiny_selection_info() {
  return {"synthetic-best-step-0", 0, "synthetic_validation_loss", 0.125, "tiny-single-writer-0"};
}

// The later in-place update: w 2 -> 7, offset 1 -> 11, output 7 -> 32.
inline void update_in_place(TinyImpl& module) {
  at::NoGradGuard no_grad;
  module.w.add_(5.0);
  module.offset.add_(10.0);
}

// Every route, captured at the selection point (before update_in_place).
struct CapturedRoutes {
  holdpoint::NamedTensors live_handles;                // auto best = model->named_parameters() (+ buffers)
  std::map<std::string, at::Tensor> copied_container;  // a std::map built from those handles
  holdpoint::NamedTensors parameters_only;             // named_parameters() alone: the buffer is forgotten
  holdpoint::NamedTensors detached;                    // each handle .detach(): shares storage
  holdpoint::NamedTensors cloned;                      // each handle .detach().clone()
  Tiny module_clone{nullptr};                          // model->clone() of a Cloneable module
  holdpoint::NamedTensors snapshot;                    // holdpoint::snapshot(*model)
  std::vector<std::byte> serialized;                   // an envelope encoded at once
};

inline CapturedRoutes capture_routes(Tiny& model, const holdpoint::SelectionRecord& record) {
  CapturedRoutes routes;
  for (const auto& item : model->named_parameters()) routes.live_handles.emplace_back(item.key(), item.value());
  for (const auto& item : model->named_buffers()) routes.live_handles.emplace_back(item.key(), item.value());
  routes.copied_container.insert(routes.live_handles.begin(), routes.live_handles.end());
  for (const auto& item : model->named_parameters()) routes.parameters_only.emplace_back(item.key(), item.value());
  for (const auto& [name, tensor] : routes.live_handles) {
    routes.detached.emplace_back(name, tensor.detach());
    routes.cloned.emplace_back(name, tensor.detach().clone());
  }
  routes.module_clone = Tiny(std::dynamic_pointer_cast<TinyImpl>(model->clone()));
  routes.snapshot = holdpoint::snapshot(*model);
  routes.serialized =
      holdpoint::encode_selection_envelope(record, {"serialized_before_update", holdpoint::live_state(*model), {}});
  return routes;
}

// A route as the gate sees it, read after the update, and the decision the
// fixture expects when the snapshot is offered as the faithful copy.
struct RouteCandidate {
  holdpoint::SelectionCandidate candidate;
  holdpoint::SelectionDecision expected;
};

inline std::vector<RouteCandidate> route_candidates(const CapturedRoutes& routes) {
  using holdpoint::SelectionDecision;
  holdpoint::NamedTensors from_container(routes.copied_container.begin(), routes.copied_container.end());
  return {
      {{"live_handles", routes.live_handles, {}}, SelectionDecision::repair},
      {{"copied_container", from_container, {}}, SelectionDecision::repair},
      {{"parameters_only", routes.parameters_only, {}}, SelectionDecision::repair},
      {{"detached", routes.detached, {}}, SelectionDecision::repair},
      {{"cloned", routes.cloned, {}}, SelectionDecision::accept},
      {{"module_clone", holdpoint::live_state(*routes.module_clone), {}}, SelectionDecision::accept},
      {{"snapshot", routes.snapshot, {}}, SelectionDecision::accept},
      {holdpoint::decode_selection_envelope(routes.serialized).candidate(), SelectionDecision::accept},
  };
}

}  // namespace tiny_selection
