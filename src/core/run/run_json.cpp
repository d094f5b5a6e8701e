// The JSON and text forms of generations and checks (holdpoint/run/run_directory.h):
// one implementation for the CLI's output and export proofs.
#include <nlohmann/json.hpp>

#include "holdpoint/run/run_directory.h"

namespace holdpoint {

std::string to_json(const GenerationInfo& generation) {
  nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
  for (const auto& [name, value] : generation.metrics) metrics[name] = value;
  const nlohmann::ordered_json out = {{"name", generation.name},         {"step", generation.step},
                                      {"epoch", generation.epoch},       {"kind", generation.kind},
                                      {"size", generation.size},         {"sha256", generation.sha256.hex()},
                                      {"saved_at", generation.saved_at}, {"metrics", std::move(metrics)},
                                      {"world_size", generation.world_size}};
  return out.dump();
}

std::string to_json(const GenerationCheck& check) {
  nlohmann::ordered_json out;
  out["name"] = check.name;
  out["ok"] = check.ok;
  out["code"] = check.code ? nlohmann::ordered_json(std::string(error_code_name(*check.code))) : nullptr;
  out["detail"] = check.detail;
  return out.dump();
}

std::string to_text(const GenerationCheck& check) {
  if (check.ok) return "ok";
  return std::string(check.code ? error_code_name(*check.code) : "unknown") + ": " + check.detail;
}

}  // namespace holdpoint
