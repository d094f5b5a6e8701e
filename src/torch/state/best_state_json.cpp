// Evidence of best-state capture as JSON (field names in docs/best-state.md).
#include <cmath>

#include "state/best_state_json.h"
#include "holdpoint/tensor/torch_tensor.h"

namespace holdpoint {

using Json = nlohmann::ordered_json;

namespace best_state_json {

Json code_json(const std::optional<ErrorCode>& code) {
  return code ? Json(std::string(error_code_name(*code))) : Json(nullptr);
}

// NaN and infinities have no JSON number; they appear as strings, so poison
// left behind by a load that did nothing is visible as "nan".
Json number_json(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

Json witness_json(const TensorWitness& witness) {
  Json out;
  out["name"] = witness.name;
  out["dtype"] = std::string(dtype_name(witness.dtype));
  out["shape"] = witness.shape;
  out["sha256"] = witness.sha256.hex();
  if (const auto values = witness.values_as_doubles()) {
    Json list = Json::array();
    for (double value : *values) list.push_back(number_json(value));
    out["values"] = std::move(list);
  } else {
    out["values"] = nullptr;
  }
  return out;
}

Json comparison_json(const StateComparison& comparison) {
  Json tensors = Json::array();
  for (const auto& c : comparison.tensors) {
    Json entry;
    entry["name"] = c.name;
    entry["matches"] = c.matches;
    entry["mismatch"] = code_json(c.mismatch);
    entry["detail"] = c.detail;
    entry["observed"] = c.observed ? witness_json(*c.observed) : Json(nullptr);
    tensors.push_back(std::move(entry));
  }
  Json out;
  out["matches"] = comparison.matches;
  out["first_mismatch"] = code_json(comparison.first_mismatch);
  out["detail"] = comparison.detail;
  out["tensors"] = std::move(tensors);
  return out;
}

}  // namespace best_state_json

using namespace best_state_json;

std::string to_json(const SelectionRecord& record) {
  Json tensors = Json::array();
  for (const auto& witness : record.tensors) tensors.push_back(witness_json(witness));
  Json out;
  out["label"] = record.info.label;
  out["step"] = record.info.step;
  out["metric_name"] = record.info.metric_name;
  out["metric_value"] = number_json(record.info.metric_value);
  out["source"] = record.info.source;
  out["runtime"] = {{"holdpoint", record.runtime.holdpoint_version},
                    {"libtorch", record.runtime.libtorch_version},
                    {"compiler", record.runtime.compiler},
                    {"selected_at", record.runtime.selected_at},
                    {"intra_op_threads", record.runtime.intra_op_threads}};
  out["tensors"] = std::move(tensors);
  out["buffers"] = record.buffer_names;
  out["probe"] = {{"input", witness_json(witness_of("input", to_at_tensor(record.probe_input)))},
                  {"output", witness_json(record.probe_output)}};
  return out.dump(2, ' ', false, Json::error_handler_t::replace);
}

std::string to_json(const CandidateDiagnostics& diagnostics) {
  Json tensors = Json::array();
  for (const auto& d : diagnostics.tensors) {
    Json entry;
    entry["name"] = d.name;
    entry["dtype"] = d.dtype;
    entry["shape"] = d.shape;
    entry["in_module"] = d.in_module;
    entry["same_tensor"] = d.same_tensor;
    entry["same_data_pointer"] = d.same_data_pointer;
    entry["shares_storage"] = d.shares_storage();
    entry["shares_storage_with"] = d.shares_storage_with;
    tensors.push_back(std::move(entry));
  }
  Json out;
  out["is_live_mapping"] = diagnostics.is_live_mapping;
  out["shares_storage"] = diagnostics.shares_storage;
  out["missing"] = diagnostics.missing;
  out["unexpected"] = diagnostics.unexpected;
  out["tensors"] = std::move(tensors);
  return out.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace holdpoint
