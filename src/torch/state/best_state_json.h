// The JSON forms of best-state evidence that the gate's report reuses
// (src/torch/checkpoint/best_state_gate_json.cpp); field names in
// docs/best-state.md.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "holdpoint/base/error.h"
#include "holdpoint/state/best_state.h"

namespace holdpoint::best_state_json {

// null, or the code's name.
nlohmann::ordered_json code_json(const std::optional<ErrorCode>& code);
// NaN and infinities have no JSON number; they appear as strings, so poison
// left behind by a load that did nothing is visible as "nan".
nlohmann::ordered_json number_json(double value);
nlohmann::ordered_json witness_json(const TensorWitness& witness);
nlohmann::ordered_json comparison_json(const StateComparison& comparison);

}  // namespace holdpoint::best_state_json
