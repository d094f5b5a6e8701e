// Recognising checkpoints that predate holdpoint's schema, so that the model
// (and, where present, the optimizer and counters) can be restored from them,
// labelled legacy-unqualified: they never carry a deterministic-resume claim.
//
//   state_dict   a bare mapping of names to tensors (model.state_dict())
//   tutorial     PyTorch's "saving a general checkpoint" recipe:
//                {model_state_dict, optimizer_state_dict, epoch, loss}
//   lightning    a Lightning-style dict of plain values:
//                {state_dict, optimizer_states, lr_schedulers, epoch, global_step}
#pragma once

#include <optional>
#include <string>

#include "holdpoint/format/value.h"

namespace holdpoint::checkpoint {

struct LegacyLayout {
  std::string name;  // "state_dict", "tutorial", "lightning"
  Value model;
  std::optional<Value> optimizer;
  std::optional<Value> scheduler;
  std::optional<std::int64_t> epoch;
  std::optional<std::int64_t> global_step;
};

// Throws legacy_layout_unrecognized (listing the top-level keys) for anything else.
LegacyLayout recognise_legacy_layout(const Value& root);

}  // namespace holdpoint::checkpoint
