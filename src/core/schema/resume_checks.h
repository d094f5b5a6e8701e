// The checks a full resume makes of a parsed checkpoint before any component
// sees it, none of which needs a live object: the manifest, its kind and
// profile, the profile's preconditions on the setup about to continue, the
// configuration identity, the component inventory, and each component's
// digest and contract (docs/resume-contract.md, "What load_checkpoint
// checks"). The C++ TrainingState and the Python package's TrainingState both
// run them, so a file is judged the same whichever language resumes it.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/schema/config_identity.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/schema/resume_profile.h"

namespace holdpoint::schema {

// The configuration a checkpoint's identity covers: the caller's fields plus
// the semantic identity and the profile, both load-bearing.
TrainingConfig effective_config(const TrainingConfig& base, const std::string& semantic_identity,
                                ResumeProfile profile);

// "a, b, c"
std::string list_text(const std::vector<std::string>& items);

struct ResumeExpectation {
  // The live run's effective configuration (effective_config).
  TrainingConfig config;
  // The names of the registered components, each of which the file must hold
  // (component_missing), and nothing else (component_unknown).
  std::vector<std::string> components;
  // The live setup, checked against the preconditions of the file's profile
  // (profile_precondition_violated); not checked when absent.
  std::optional<ProfileFacts> facts;
  // The saved profile is not relied on, so a change of it is no drift.
  bool ignore_profile_drift = false;
  // The whole-file digest matched an expected value, which proves every byte:
  // the component digests are then not recomputed.
  bool digest_checked = false;
  bool check_component_records = true;
  // Digests of storages whose bytes the tree does not hold (a resume in
  // place), of the manifest's storage digest kind. Empty: computed.
  std::function<StorageDigests(StorageDigestKind)> known_storage_digests;
};

struct ResumeCheck {
  Manifest manifest;
  ResumeProfile profile = ResumeProfile::unqualified;  // the file's
  // Set when max_epochs grew (a shrink is config_drift).
  std::optional<MaxEpochsChange> max_epochs_growth;
};

// Throws the first failed check's Error (schema_*, checkpoint_kind_mismatch,
// profile_unknown, profile_precondition_violated, config_drift naming every
// drifted field, component_missing, component_unknown,
// component_digest_mismatch, component_contract_mismatch).
ResumeCheck check_resume_root(const Value& root, const ResumeExpectation& expectation);

// The global_step of a root's "progress" component, or 0.
std::int64_t progress_step_of(const Value& root);

}  // namespace holdpoint::schema
