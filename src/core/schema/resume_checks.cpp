#include "schema/resume_checks.h"

#include <algorithm>

#include "base/fail.h"

namespace holdpoint::schema {

using detail::fail;

TrainingConfig effective_config(const TrainingConfig& base, const std::string& semantic_identity,
                                ResumeProfile profile) {
  TrainingConfig config = base;
  config.load_bearing("semantic_identity", Value::string(semantic_identity));
  config.load_bearing("profile", Value::string(std::string(resume_profile_name(profile))));
  return config;
}

std::string list_text(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

namespace {

bool registered(const ResumeExpectation& expectation, const std::string& name) {
  return std::find(expectation.components.begin(), expectation.components.end(), name) !=
         expectation.components.end();
}

void check_inventory(const Value& root, const Manifest& manifest, const ResumeExpectation& expectation) {
  std::vector<std::string> missing, unknown;
  for (const std::string& name : expectation.components) {
    if (!root.as_dict().find(name) || !manifest.component(name)) missing.push_back(name);
  }
  for (const auto& [key, value] : root.as_dict()) {
    if (!key.is_string()) {
      unknown.push_back(key.to_string());
    } else if (key.as_string() != kManifestKey && !registered(expectation, key.as_string())) {
      unknown.push_back(key.as_string());
    }
  }
  for (const auto& record : manifest.components) {
    if (!registered(expectation, record.name) &&
        std::find(unknown.begin(), unknown.end(), record.name) == unknown.end()) {
      unknown.push_back(record.name);
    }
  }
  if (!missing.empty()) fail(ErrorCode::component_missing, "registered components absent from the file: ", list_text(missing));
  if (!unknown.empty()) fail(ErrorCode::component_unknown, "components in the file that are not registered: ", list_text(unknown));
}

void check_component_records(const Value& root, const Manifest& manifest, const ResumeExpectation& expectation) {
  StorageDigests digests = expectation.known_storage_digests && !expectation.digest_checked
                               ? expectation.known_storage_digests(manifest.storage_digest)
                               : StorageDigests(manifest.storage_digest);
  for (const std::string& name : expectation.components) {
    const Value& state = root.as_dict().at(name);
    const ComponentRecord& record = *manifest.component(name);
    // A whole-file digest that matched an expected value already proves every
    // byte; the component digests are then identity, not integrity.
    if (!expectation.digest_checked && component_digest(state, digests) != record.sha256) {
      fail(ErrorCode::component_digest_mismatch, "component '", name, "' does not match the digest its manifest records");
    }
    if (!equal_content(contract_of(state), record.contract)) {
      fail(ErrorCode::component_contract_mismatch, "component '", name,
           "' does not have the structure its manifest records");
    }
  }
}

}  // namespace

ResumeCheck check_resume_root(const Value& root, const ResumeExpectation& expectation) {
  if (!root.is_dict()) {
    fail(ErrorCode::schema_field_missing, "the file holds a ", value_kind_name(root.kind()),
         ", not a holdpoint checkpoint (dict with a '", kManifestKey, "' manifest)");
  }
  const Value* manifest_value = find_manifest_entry(root);
  if (!manifest_value) {
    fail(ErrorCode::schema_field_missing, "the file has no '", kManifestKey,
         "' manifest; legacy checkpoints restore the model with load_model_state, or everything they hold "
         "with load_trusted_checkpoint");
  }
  ResumeCheck check;
  check.manifest = Manifest::from_value(*manifest_value);
  const Manifest& manifest = check.manifest;
  if (manifest.kind != CheckpointKind::resume) {
    fail(ErrorCode::checkpoint_kind_mismatch, "the checkpoint's kind is '", checkpoint_kind_name(manifest.kind),
         "'; a full resume needs kind 'resume'");
  }
  const auto file_profile = resume_profile_from_name(manifest.profile);
  if (!file_profile) fail(ErrorCode::profile_unknown, "resume profile '", manifest.profile, "' is not known");
  check.profile = *file_profile;
  // The profile's preconditions must hold for the setup about to continue
  // the run, before anything relies on the profile's claim.
  if (expectation.facts) check_profile(*file_profile, *expectation.facts);

  const ConfigComparison comparison = compare_configs(manifest.config, expectation.config);
  std::vector<std::string> drifted = comparison.drifted;
  if (expectation.ignore_profile_drift) {
    std::erase_if(drifted, [](const std::string& field) { return field == "profile"; });
  }
  if (comparison.max_epochs && comparison.max_epochs->live < comparison.max_epochs->saved) {
    drifted.push_back(detail::concat("max_epochs (", comparison.max_epochs->saved, " -> ", comparison.max_epochs->live,
                                     ": may grow, not shrink)"));
  }
  if (!drifted.empty()) {
    fail(ErrorCode::config_drift, "load-bearing configuration differs from the checkpoint's: ", list_text(drifted));
  }
  if (comparison.max_epochs && comparison.max_epochs->live > comparison.max_epochs->saved) {
    check.max_epochs_growth = comparison.max_epochs;
  }

  check_inventory(root, manifest, expectation);
  if (expectation.check_component_records) check_component_records(root, manifest, expectation);
  return check;
}

std::int64_t progress_step_of(const Value& root) {
  if (!root.is_dict()) return 0;
  const Value* progress = root.as_dict().find(std::string_view("progress"));
  if (!progress || !progress->is_dict()) return 0;
  const Value* global = progress->as_dict().find(std::string_view("global_step"));
  return global && global->is_int() ? global->as_int() : 0;
}

}  // namespace holdpoint::schema
