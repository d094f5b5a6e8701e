#include "holdpoint/state/module_state.h"

#include <torch/nn/module.h>

#include <set>

#include "holdpoint/schema/resume_profile.h"
#include "state/state_fields.h"
#include "state/tensor_state.h"

namespace holdpoint {

namespace {

// Parameters then buffers, as state_dict orders them.
std::vector<std::pair<std::string, at::Tensor>> named_state(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> entries;
  for (const auto& item : module.named_parameters()) entries.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) entries.emplace_back(item.key(), item.value());
  return entries;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 20; ++i) out += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 20) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

ModuleState::ModuleState(torch::nn::Module& module, std::string name) : module_(module), name_(std::move(name)) {}

Value ModuleState::capture(CaptureMode mode) const {
  Dict entries;
  for (const auto& [key, tensor] : named_state(module_)) entries.insert(key, state::capture_tensor(tensor, mode));
  return Value::ordered_dict(std::move(entries));
}

void ModuleState::validate(const Value& value) const {
  const state::FieldReader reader(value, name_);
  const auto live = named_state(module_);
  std::vector<std::string> missing;
  std::set<std::string> expected;
  for (const auto& [key, tensor] : live) {
    expected.insert(key);
    if (!reader.has(key)) missing.push_back(key);
  }
  if (!missing.empty()) state::state_error(ErrorCode::state_key_missing, name_, " lacks ", joined(missing));
  std::vector<std::string> unexpected;
  for (const auto& [key, item] : reader.dict()) {
    if (!key.is_string() || !expected.count(key.as_string())) unexpected.push_back(key.to_string());
  }
  if (!unexpected.empty()) {
    state::state_error(ErrorCode::state_key_unknown, name_, " has entries the model does not: ", joined(unexpected));
  }
  for (const auto& [key, tensor] : live) state::check_tensor_matches(reader.tensor(key), tensor, reader.path_of(key));
}

void ModuleState::apply(const Value& value) {
  const Dict& entries = value.as_dict();
  std::vector<std::pair<at::Tensor, const TensorData*>> copies;
  for (auto& [key, tensor] : named_state(module_)) copies.emplace_back(tensor, &entries.at(key).as_tensor());
  state::copy_all_into(copies);
}

std::function<void()> ModuleState::stage(const Value& value) {
  for (const auto& [key, tensor] : named_state(module_)) {
    if (!tensor.device().is_cpu()) return {};
  }
  return [this, &value] { apply(value); };
}

void ModuleState::describe(ProfileFacts& facts) const {
  bool on_cpu = true;
  bool on_first_cuda = true;
  for (const auto& [key, tensor] : named_state(module_)) {
    on_cpu = on_cpu && tensor.device().is_cpu();
    on_first_cuda = on_first_cuda && tensor.device().is_cuda() && tensor.device().index() == 0;
  }
  facts.model_on_cpu = on_cpu;
  facts.model_on_first_cuda_device = on_first_cuda && !named_state(module_).empty();
}

}  // namespace holdpoint
