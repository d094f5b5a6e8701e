// ModuleState: the model as a checkpoint component.
//
// Its state is PyTorch's state_dict layout: an OrderedDict from dotted names
// ("encoder.0.weight") to tensors, parameters first then buffers, in the order
// torch::nn::Module::named_parameters / named_buffers list them (LibTorch has
// no non-persistent buffers: every registered buffer is saved). A Python
// `model.state_dict()` file therefore loads into the equivalent LibTorch
// module and the other way round.
//
// validate checks that the keys are exactly the module's (every missing and
// every unexpected name is listed), and each tensor's dtype and shape; apply
// copies values into the live tensors in place, so optimizers that hold the
// parameters keep working.
//
// Thread-safety: as for the module.
#pragma once

#include <string>

#include "holdpoint/state/component.h"

namespace torch::nn {
class Module;
}

namespace holdpoint {

class ModuleState final : public Component {
 public:
  explicit ModuleState(torch::nn::Module& module, std::string name = "model");

  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  void apply(const Value& state) override;
  // On the CPU, installing a validated state is a copy between tensors of the
  // same dtype and shape, which cannot fail; elsewhere it stages nothing.
  std::function<void()> stage(const Value& state) override;
  void describe(ProfileFacts& facts) const override;

  torch::nn::Module& module() noexcept { return module_; }

 private:
  torch::nn::Module& module_;
  std::string name_;
};

}  // namespace holdpoint
