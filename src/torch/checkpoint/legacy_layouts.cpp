#include "checkpoint/legacy_layouts.h"

#include "base/fail.h"

namespace holdpoint::checkpoint {

namespace {

bool is_tensor_mapping(const Value& value) {
  if (!value.is_dict() || value.as_dict().empty()) return false;
  for (const auto& [key, item] : value.as_dict()) {
    if (!key.is_string() || !item.is_tensor()) return false;
  }
  return true;
}

std::optional<std::int64_t> counter(const Dict& dict, std::string_view key) {
  const Value* value = dict.find(key);
  if (value && value->is_int()) return value->as_int();
  return std::nullopt;
}

std::string keys_of(const Dict& dict) {
  std::string out;
  std::size_t shown = 0;
  for (const auto& [key, value] : dict) {
    if (shown++ == 12) {
      out += ", ...";
      break;
    }
    out += (out.empty() ? "" : ", ") + key.to_string();
  }
  return out.empty() ? "none" : out;
}

}  // namespace

LegacyLayout recognise_legacy_layout(const Value& root) {
  if (!root.is_dict()) {
    detail::fail(ErrorCode::legacy_layout_unrecognized, "the file holds a ", value_kind_name(root.kind()),
                 ", not a dict");
  }
  const Dict& dict = root.as_dict();
  LegacyLayout layout;
  if (is_tensor_mapping(root)) {
    layout.name = "state_dict";
    layout.model = root;
    return layout;
  }
  if (const Value* model = dict.find(std::string_view("model_state_dict")); model && is_tensor_mapping(*model)) {
    layout.name = "tutorial";
    layout.model = *model;
    if (const Value* optimizer = dict.find(std::string_view("optimizer_state_dict"))) layout.optimizer = *optimizer;
    layout.epoch = counter(dict, "epoch");
    return layout;
  }
  if (const Value* model = dict.find(std::string_view("state_dict")); model && is_tensor_mapping(*model)) {
    layout.name = "lightning";
    layout.model = *model;
    // Lightning keeps one state per optimizer and scheduler; a single-optimizer
    // run restores the first.
    if (const Value* optimizers = dict.find(std::string_view("optimizer_states"));
        optimizers && optimizers->is_sequence() && optimizers->as_list().size() == 1) {
      layout.optimizer = optimizers->as_list()[0];
    }
    if (const Value* schedulers = dict.find(std::string_view("lr_schedulers"));
        schedulers && schedulers->is_sequence() && schedulers->as_list().size() == 1) {
      layout.scheduler = schedulers->as_list()[0];
    }
    layout.epoch = counter(dict, "epoch");
    layout.global_step = counter(dict, "global_step");
    return layout;
  }
  detail::fail(ErrorCode::legacy_layout_unrecognized,
               "the mapping is neither a state_dict, the PyTorch tutorial's checkpoint (model_state_dict, ...) "
               "nor a Lightning-style dict (state_dict, ...); its keys are ",
               keys_of(dict));
}

}  // namespace holdpoint::checkpoint
