#include "run/run_files.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "base/fail.h"
#include "run/run_names.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

constexpr std::string_view kIndexSchema = "holdpoint.run-index";
constexpr std::int64_t kIndexSchemaVersion = 1;

nlohmann::json index_json(const std::map<std::int64_t, GenerationInfo>& generations, const run::RetiredByStep& retired) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [step, g] : generations) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [name, value] : g.metrics) {
      if (std::isfinite(value)) metrics[name] = value;
    }
    list.push_back({{"name", g.name},
                    {"step", g.step},
                    {"epoch", g.epoch},
                    {"kind", g.kind},
                    {"size", g.size},
                    {"sha256", g.sha256.hex()},
                    {"saved_at", g.saved_at},
                    {"metrics", std::move(metrics)}});
    if (g.world_size > 0) list.back()["world_size"] = g.world_size;
  }
  nlohmann::json index = {{"schema", kIndexSchema}, {"schema_version", kIndexSchemaVersion}, {"generations", std::move(list)}};
  // Only signed runs have retirements to record: an unsigned run's index is
  // byte for byte what earlier versions wrote.
  if (!retired.empty()) {
    nlohmann::json entries = nlohmann::json::array();
    for (const auto& [step, r] : retired) entries.push_back({{"name", r.name}, {"step", r.step}, {"sha256", r.sha256.hex()}});
    index["retired"] = std::move(entries);
  }
  return index;
}

}  // namespace

std::string run_pointer_text(const GenerationInfo& generation) {
  return concat(generation.name, " ", generation.sha256.hex(), "\n");
}

std::string run_index_text(const std::vector<GenerationInfo>& generations) {
  std::map<std::int64_t, GenerationInfo> by_step;
  for (const auto& g : generations) by_step.emplace(g.step, g);
  return run::index_text(by_step);
}

namespace run {

// "<name> <64 hex>\n"
std::pair<std::string, Sha256Digest> parse_pointer(const std::string& text, std::string_view which) {
  const auto space = text.find(' ');
  if (text.empty() || text.back() != '\n' || space == std::string::npos) {
    fail(ErrorCode::run_pointer_invalid, which, " is not '<generation> <sha256>\\n'");
  }
  std::string name = text.substr(0, space);
  const std::string hex = text.substr(space + 1, text.size() - space - 2);
  if (!parse_generation_name(name)) fail(ErrorCode::run_pointer_invalid, which, " names '", name, "', not a generation");
  const auto digest = Sha256Digest::from_hex(hex);
  if (!digest || hex != digest->hex()) fail(ErrorCode::run_pointer_invalid, which, " has no lowercase SHA-256 digest");
  return {std::move(name), *digest};
}

std::string index_text(const std::map<std::int64_t, GenerationInfo>& by_step, const RetiredByStep& retired) {
  return index_json(by_step, retired).dump(1) + "\n";
}

namespace {

RetiredByStep parse_retired(const nlohmann::json& json) {
  RetiredByStep retired;
  if (!json.contains("retired")) return retired;
  if (!json["retired"].is_array()) fail(ErrorCode::run_index_invalid, "index.json: 'retired' is not an array");
  std::size_t position = 0;
  for (const auto& entry : json["retired"]) {
    const auto where = concat("index.json: retired[", position++, "]");
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("step") ||
        !entry["step"].is_number_integer() || !entry.contains("sha256") || !entry["sha256"].is_string()) {
      fail(ErrorCode::run_index_invalid, where, " is not an object of name, step and sha256");
    }
    RetiredGeneration r;
    r.name = entry["name"].get<std::string>();
    r.step = entry["step"].get<std::int64_t>();
    const auto digest = Sha256Digest::from_hex(entry["sha256"].get<std::string>());
    if (!digest) fail(ErrorCode::run_index_invalid, where, ".sha256 is not a SHA-256 digest");
    r.sha256 = *digest;
    if (parse_generation_name(r.name) != r.step) {
      fail(ErrorCode::run_index_invalid, where, ": name '", r.name, "' does not match step ", r.step);
    }
    if (!retired.emplace(r.step, r).second) fail(ErrorCode::run_index_invalid, where, ": '", r.name, "' is listed twice");
  }
  return retired;
}

}  // namespace

RunIndex parse_index(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) fail(ErrorCode::run_index_invalid, "index.json is not a JSON object");
  // Not json.value("schema", ""): it throws nlohmann's type_error when schema is not a string.
  if (!json.contains("schema") || !json["schema"].is_string() || json["schema"].get<std::string>() != kIndexSchema) {
    fail(ErrorCode::run_index_invalid, "index.json: schema is not '", kIndexSchema, "'");
  }
  if (!json.contains("schema_version") || !json["schema_version"].is_number_integer() ||
      json["schema_version"].get<std::int64_t>() != kIndexSchemaVersion) {
    fail(ErrorCode::run_index_invalid, "index.json: schema_version is not ", kIndexSchemaVersion);
  }
  if (!json.contains("generations") || !json["generations"].is_array()) {
    fail(ErrorCode::run_index_invalid, "index.json: 'generations' is not an array");
  }
  std::map<std::string, GenerationInfo> out;
  std::size_t position = 0;
  for (const auto& entry : json["generations"]) {
    const auto where = concat("index.json: generations[", position++, "]");
    if (!entry.is_object()) fail(ErrorCode::run_index_invalid, where, " is not an object");
    const auto field = [&](const char* key, auto check, const char* type) -> const nlohmann::json& {
      if (!entry.contains(key) || !check(entry[key])) fail(ErrorCode::run_index_invalid, where, ".", key, " is not ", type);
      return entry[key];
    };
    const auto is_string = [](const nlohmann::json& j) { return j.is_string(); };
    const auto is_int = [](const nlohmann::json& j) { return j.is_number_integer(); };
    const auto is_uint = [](const nlohmann::json& j) { return j.is_number_unsigned(); };
    GenerationInfo g;
    g.name = field("name", is_string, "a string").get<std::string>();
    g.step = field("step", is_int, "an integer").get<std::int64_t>();
    g.epoch = field("epoch", is_int, "an integer").get<std::int64_t>();
    g.kind = field("kind", is_string, "a string").get<std::string>();
    g.size = field("size", is_uint, "an unsigned integer").get<std::uint64_t>();
    g.saved_at = field("saved_at", is_string, "a string").get<std::string>();
    const auto digest = Sha256Digest::from_hex(field("sha256", is_string, "a string").get<std::string>());
    if (!digest) fail(ErrorCode::run_index_invalid, where, ".sha256 is not a SHA-256 digest");
    g.sha256 = *digest;
    const auto& metrics = field("metrics", [](const nlohmann::json& j) { return j.is_object(); }, "an object");
    for (const auto& [name, value] : metrics.items()) {
      if (!value.is_number()) fail(ErrorCode::run_index_invalid, where, ".metrics.", name, " is not a number");
      g.metrics.emplace_back(name, value.get<double>());
    }
    if (entry.contains("world_size")) {
      const auto& world = entry["world_size"];
      if (!world.is_number_integer() || world.get<std::int64_t>() < 1) {
        fail(ErrorCode::run_index_invalid, where, ".world_size is not a positive integer");
      }
      g.world_size = world.get<std::int64_t>();
    }
    if (parse_generation_name(g.name) != g.step) {
      fail(ErrorCode::run_index_invalid, where, ": name '", g.name, "' does not match step ", g.step);
    }
    if (!out.emplace(g.name, g).second) fail(ErrorCode::run_index_invalid, where, ": '", g.name, "' is listed twice");
  }
  return {std::move(out), parse_retired(json)};
}

}  // namespace run
}  // namespace holdpoint
