// The gate's report as JSON (field names in docs/best-state.md).
#include "holdpoint/checkpoint/best_state_gate.h"
#include "state/best_state_json.h"

namespace holdpoint {

namespace {

using Json = nlohmann::ordered_json;
using best_state_json::code_json;
using best_state_json::comparison_json;
using best_state_json::witness_json;

Json attempt_json(const PublicationAttempt& attempt) {
  Json out;
  out["route"] = attempt.route;
  out["candidate"] = comparison_json(attempt.candidate);
  out["staged"] = attempt.staged;
  out["poisoned"] = attempt.poisoned;
  out["reloaded"] = attempt.reloaded;
  out["reloaded_state"] = attempt.reloaded ? comparison_json(attempt.reloaded_state) : Json(nullptr);
  out["output"] = attempt.output ? witness_json(*attempt.output) : Json(nullptr);
  out["output_matches"] = attempt.output_matches;
  out["verified"] = attempt.verified;
  out["published"] = attempt.published;
  out["failure"] = code_json(attempt.failure);
  out["failure_detail"] = attempt.failure_detail;
  out["sha256"] = attempt.sha256 ? Json(attempt.sha256->hex()) : Json(nullptr);
  out["file_bytes"] = attempt.file_bytes;
  return out;
}

}  // namespace

std::string to_json(const SelectionGateReport& report) {
  Json out;
  out["decision"] = std::string(selection_decision_name(report.decision));
  out["reason"] = report.reason;
  out["target"] = report.target.string();
  out["candidate"] = attempt_json(report.candidate);
  out["faithful_copy"] = report.faithful_copy ? attempt_json(*report.faithful_copy) : Json(nullptr);
  return out.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace holdpoint
