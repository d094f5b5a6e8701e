// summary.json: what one trainer run says it did (docs/verification.md,
// "The trainer's contract").
#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/fail.h"
#include "holdpoint/verify/resume_verifier.h"

namespace holdpoint {

using detail::fail;

namespace {

using Json = nlohmann::json;

// Where a field sits, for messages: "summary.json (resumed): trace[3].lr".
struct Field {
  const std::string& label;
  std::string path;

  Field child(std::string_view name) const { return {label, path.empty() ? std::string(name) : path + "." + std::string(name)}; }
  Field element(std::size_t index) const { return {label, path + "[" + std::to_string(index) + "]"}; }
  std::string where() const { return label + ": " + path; }
};

const Json& require(const Json& object, const Field& parent, std::string_view name) {
  const auto it = object.find(name);
  if (it == object.end()) fail(ErrorCode::resume_summary_field_missing, parent.child(name).where(), " is missing");
  return *it;
}

[[noreturn]] void wrong_type(const Field& field, const Json& value, std::string_view wanted) {
  fail(ErrorCode::resume_summary_field_invalid, field.where(), " is ", value.type_name(), ", expected ", wanted);
}

std::int64_t integer_of(const Json& value, const Field& field) {
  if (value.is_number_unsigned()) {
    if (value.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(ErrorCode::resume_summary_field_invalid, field.where(), " is ", value.dump(), ", beyond int64");
    }
    return static_cast<std::int64_t>(value.get<std::uint64_t>());
  }
  if (!value.is_number_integer()) wrong_type(field, value, "an integer");
  return value.get<std::int64_t>();
}

std::string string_of(const Json& value, const Field& field) {
  if (!value.is_string()) wrong_type(field, value, "a string");
  return value.get<std::string>();
}

TraceNumber number_of(const Json& value, const Field& field) {
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  if (value.is_number_integer()) return value.get<std::int64_t>();
  if (value.is_number_float()) return value.get<double>();
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-inf") return -std::numeric_limits<double>::infinity();
  }
  wrong_type(field, value, "a number or one of \"nan\", \"inf\", \"-inf\"");
}

const Json& object_of(const Json& value, const Field& field) {
  if (!value.is_object()) wrong_type(field, value, "an object");
  return value;
}

const Json& array_of(const Json& value, const Field& field) {
  if (!value.is_array()) wrong_type(field, value, "an array");
  return value;
}

TraceStep parse_step(const Json& record, const Field& field, const std::vector<std::string>& generators) {
  object_of(record, field);
  TraceStep step;
  step.step = integer_of(require(record, field, "step"), field.child("step"));
  step.epoch = integer_of(require(record, field, "epoch"), field.child("epoch"));
  const Field ids_field = field.child("sample_ids");
  const Json& ids = array_of(require(record, field, "sample_ids"), ids_field);
  step.sample_ids.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) step.sample_ids.push_back(integer_of(ids[i], ids_field.element(i)));
  step.lr = number_of(require(record, field, "lr"), field.child("lr"));
  step.loss = number_of(require(record, field, "loss"), field.child("loss"));
  const Field draws_field = field.child("rng_next");
  const Json& draws = object_of(require(record, field, "rng_next"), draws_field);
  for (const std::string& name : generators) {
    step.rng_next.emplace_back(name, number_of(require(draws, draws_field, name), draws_field.child(name)));
  }
  if (draws.size() != generators.size()) {
    for (const auto& [name, value] : draws.items()) {
      if (std::find(generators.begin(), generators.end(), name) == generators.end()) {
        fail(ErrorCode::resume_summary_field_invalid, draws_field.child(name).where(),
             " names a generator that `generators` does not list");
      }
    }
  }
  return step;
}

}  // namespace

double trace_number_value(const TraceNumber& number) noexcept {
  return std::visit([](auto value) { return static_cast<double>(value); }, number);
}

RunSummary parse_run_summary(std::string_view json_text, const std::string& label) {
  const Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    fail(ErrorCode::resume_summary_unreadable, label, ": not JSON (RFC 8259; write non-finite numbers as \"nan\", "
         "\"inf\", \"-inf\")");
  }
  const Field top{label, ""};
  if (!root.is_object()) wrong_type(Field{label, "(root)"}, root, "an object");
  const Json& schema = require(root, top, "schema");
  const Json& version = require(root, top, "schema_version");
  if (!schema.is_string() || schema.get<std::string>() != kResumeSummarySchema || !version.is_number_integer() ||
      version.get<std::int64_t>() != kResumeSummarySchemaVersion) {
    fail(ErrorCode::resume_summary_schema_unsupported, label, ": schema ", schema.dump(), " version ", version.dump(),
         ", this build reads \"", kResumeSummarySchema, "\" version ", kResumeSummarySchemaVersion);
  }

  RunSummary summary;
  summary.trainer = string_of(require(root, top, "trainer"), top.child("trainer"));
  summary.steps_run = integer_of(require(root, top, "steps_run"), top.child("steps_run"));
  summary.global_step = integer_of(require(root, top, "global_step"), top.child("global_step"));
  const Json& resumed_from = require(root, top, "resumed_from");
  if (!resumed_from.is_null()) summary.resumed_from = string_of(resumed_from, top.child("resumed_from"));
  const Json& rng_restored = require(root, top, "rng_restored");
  if (!rng_restored.is_boolean()) wrong_type(top.child("rng_restored"), rng_restored, "a boolean");
  summary.rng_restored = rng_restored.get<bool>();

  const Field versions_field = top.child("versions");
  for (const auto& [name, value] : object_of(require(root, top, "versions"), versions_field).items()) {
    summary.versions.emplace_back(name, string_of(value, versions_field.child(name)));
  }

  const Field final_field = top.child("final");
  const Json& final = object_of(require(root, top, "final"), final_field);
  summary.final_loss = number_of(require(final, final_field, "loss"), final_field.child("loss"));
  summary.final_mse = number_of(require(final, final_field, "mse"), final_field.child("mse"));
  summary.final_next_lr = number_of(require(final, final_field, "next_lr"), final_field.child("next_lr"));

  const Field generators_field = top.child("generators");
  const Json& generators = array_of(require(root, top, "generators"), generators_field);
  for (std::size_t i = 0; i < generators.size(); ++i) {
    std::string name = string_of(generators[i], generators_field.element(i));
    if (std::find(summary.generators.begin(), summary.generators.end(), name) != summary.generators.end()) {
      fail(ErrorCode::resume_summary_field_invalid, generators_field.element(i).where(), " repeats \"", name, "\"");
    }
    summary.generators.push_back(std::move(name));
  }

  const Field trace_field = top.child("trace");
  const Json& trace = array_of(require(root, top, "trace"), trace_field);
  summary.trace.reserve(trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) {
    summary.trace.push_back(parse_step(trace[i], trace_field.element(i), summary.generators));
  }
  return summary;
}

}  // namespace holdpoint
