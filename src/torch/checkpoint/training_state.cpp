#include "holdpoint/checkpoint/training_state.h"

#include <torch/version.h>

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>

#include "format/publish_file.h"
#include "checkpoint/in_place.h"
#include "checkpoint/legacy_layouts.h"
#include "format/resume_scan.h"
#include "checkpoint/training_state_access.h"
#include "base/fail.h"
#include "format/pt_writer.h"
#include "schema/component_writer.h"
#include "schema/resume_checks.h"
#include "schema/checkpoint_bytes.h"
#include "holdpoint/tensor/trusted_load.h"
#include "holdpoint_version.h"

namespace holdpoint {

using detail::fail;

UnsafeCheckpointLoadUnavailable::UnsafeCheckpointLoadUnavailable(std::string detail, ErrorCode reason)
    : Error(ErrorCode::unsafe_checkpoint_load_unavailable, std::move(detail)), reason_(reason) {}

namespace {

// Where each well-known component goes in the restore order (others keep
// their registration order, before the sampler): the model first, so the
// optimizer's references are valid; generators last, so nothing that runs
// during apply can consume randomness after it was restored.
int apply_rank(const std::string& name) {
  static const std::vector<std::string> kOrder = {"model",    "scheduler", "optimizer", "scaler", "progress",
                                                  "early_stop", "history"};
  const auto it = std::find(kOrder.begin(), kOrder.end(), name);
  if (it != kOrder.end()) return static_cast<int>(it - kOrder.begin());
  if (name == "sampler") return 1000;
  if (name == "rng") return 1001;
  return 100;
}

// The restricted reader's verdicts that mean "only LibTorch's deserializer
// could read this": untrusted loads refuse those files with
// UnsafeCheckpointLoadUnavailable.
bool needs_libtorch(ErrorCode code) {
  return code == ErrorCode::torchscript_archive;
}

LoadOptions untrusted_options(const CheckpointLoadOptions& options) {
  LoadOptions load_options;
  load_options.limits = options.limits;
  load_options.expected_sha256 = options.expected_sha256;
  load_options.trust = options.trust;
  load_options.compute_sha256 = true;  // the LoadReport names the file's digest
  return load_options;
}

[[noreturn]] void rethrow_untrusted(const std::filesystem::path& path, const Error& error) {
  if (needs_libtorch(error.code())) {
    throw UnsafeCheckpointLoadUnavailable(
        detail::concat(path.string(), ": only LibTorch's deserializer could read this file (",
                       error_code_name(error.code()), ": ", error.detail(),
                       "); untrusted loads never call it. If you trust its producer and custody, use "
                       "load_trusted_checkpoint."),
        error.code());
  }
  throw error;
}

LoadedMapping read_untrusted(const std::filesystem::path& path, const CheckpointLoadOptions& options) {
  try {
    return load_checkpoint_mapping(path, untrusted_options(options));
  } catch (const Error& error) {
    rethrow_untrusted(path, error);
  }
}

}  // namespace

// ---- registry ----------------------------------------------------------------------------

TrainingState& TrainingState::add(Component& component) {
  if (this->component(component.name())) {
    fail(ErrorCode::invalid_argument, "a component named '", component.name(), "' is already registered");
  }
  if (component.name() == kManifestKey) {
    fail(ErrorCode::invalid_argument, "the component name '", kManifestKey, "' is reserved for the manifest");
  }
  components_.push_back(&component);
  return *this;
}

TrainingState& TrainingState::clear_components() {
  components_.clear();
  return *this;
}

TrainingState& TrainingState::set_semantic_identity(std::string identity) {
  semantic_identity_ = std::move(identity);
  return *this;
}
TrainingState& TrainingState::set_profile(ResumeProfile profile) {
  profile_ = profile;
  return *this;
}
TrainingState& TrainingState::set_config(TrainingConfig config) {
  config_ = std::move(config);
  return *this;
}
TrainingState& TrainingState::set_environment(TrainingEnvironment environment) {
  environment_ = environment;
  return *this;
}
TrainingState& TrainingState::set_code_identity(std::string identity) {
  code_identity_ = std::move(identity);
  return *this;
}
TrainingState& TrainingState::set_data_identity(std::string identity) {
  data_identity_ = std::move(identity);
  return *this;
}
TrainingState& TrainingState::set_warning_sink(std::function<void(const std::string&)> sink) {
  warning_sink_ = std::move(sink);
  return *this;
}
void TrainingState::set_after_apply_hook(std::function<void(const std::string&)> hook) {
  after_apply_hook_ = std::move(hook);
}

Component* TrainingState::component(const std::string& name) const {
  for (Component* c : components_) {
    if (c->name() == name) return c;
  }
  return nullptr;
}

void TrainingState::warn(const std::string& message) const {
  if (warning_sink_) {
    warning_sink_(message);
  } else {
    std::cerr << "holdpoint warning: " << message << "\n";
  }
}

std::vector<Component*> TrainingState::apply_order() const {
  std::vector<Component*> order = components_;
  std::stable_sort(order.begin(), order.end(),
                   [](const Component* a, const Component* b) { return apply_rank(a->name()) < apply_rank(b->name()); });
  return order;
}

ProfileFacts TrainingState::profile_facts() const {
  ProfileFacts facts;
  facts.loader_workers = environment_.loader_workers;
  facts.distributed = environment_.distributed;
  facts.world_size = environment_.world_size;
  facts.rank_local_generators = environment_.rank_local_generators;
  facts.external_randomness = environment_.external_randomness;
  for (const Component* c : components_) c->describe(facts);
  facts.sampler_generator_registered =
      facts.sampler_generator != nullptr &&
      std::find(facts.registered_generators.begin(), facts.registered_generators.end(), facts.sampler_generator) !=
          facts.registered_generators.end();
  return facts;
}

Manifest TrainingState::manifest_preview() const {
  Manifest manifest;
  manifest.kind = CheckpointKind::resume;
  manifest.semantic_identity = semantic_identity_;
  manifest.profile = std::string(resume_profile_name(profile_));
  manifest.config = schema::effective_config(config_, semantic_identity_, profile_);
  manifest.holdpoint_version = HOLDPOINT_VERSION;
  manifest.libtorch_version = TORCH_VERSION;
  manifest.compiler = __VERSION__;
  manifest.code_identity = code_identity_;
  manifest.data_identity = data_identity_;
  manifest.last_resume_drift = pending_drift_;
  for (const Component* c : components_) manifest.components.push_back({c->name(), Sha256Digest{}, Value()});
  return manifest;
}

// ---- save ----------------------------------------------------------------------------------

PreparedCheckpoint TrainingState::prepare_save(const CheckpointSaveOptions& options, const StateStager& stage) const {
  // A profile is a claim; it is checked before it is written down.
  check_profile(profile_, profile_facts());
  PreparedCheckpoint prepared;
  prepared.manifest_ = manifest_preview();
  prepared.torch_1_13_compatible_ = options.torch_1_13_compatible;
  for (const Component* c : components_) prepared.states_.emplace_back(c->name(), c->capture(CaptureMode::reference));
  if (stage) stage(prepared.states_);
  return prepared;
}

namespace {

// The torch 1.13 compatible writer stores floats and bytes as 0-d float64 and
// 1-d uint8 tensors. Doing it once here, before writing, makes them ordinary
// storages of the state: written with the others, covered by the component
// digests exactly as a load will read them back.
Value as_torch_1_13_state(const Value& value) {
  switch (value.kind()) {
    case ValueKind::floating: {
      const double number = value.as_double();
      return Value::tensor(TensorData::from_bytes(DType::float64, {}, std::as_bytes(std::span(&number, 1))));
    }
    case ValueKind::bytes: {
      const std::string_view bytes = value.as_bytes();
      return Value::tensor(TensorData::from_bytes(DType::uint8, {static_cast<std::int64_t>(bytes.size())},
                                                  std::as_bytes(std::span(bytes.data(), bytes.size()))));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : value.as_list()) items.push_back(as_torch_1_13_state(item));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, as_torch_1_13_state(item));
      if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default: return value;
  }
}

}  // namespace

SaveResult PreparedCheckpoint::write(io::ByteSink& sink) const {
  schema::NamedComponents compatible;
  if (torch_1_13_compatible_) {
    for (const auto& [name, state] : states_) compatible.emplace_back(name, as_torch_1_13_state(state));
  }
  format::PtWriteOptions write_options;
  write_options.torch_1_13_compatible = torch_1_13_compatible_;
  const auto written =
      schema::write_components(sink, manifest_, torch_1_13_compatible_ ? compatible : states_, write_options);
  SaveResult result;
  result.tensor_count = written.tensor_count;
  result.storage_count = written.storage_count;
  return result;
}

SaveResult TrainingState::save(const std::filesystem::path& path, const CheckpointSaveOptions& options) {
  const PreparedCheckpoint prepared = prepare_save(options);
  return detail::publish_file(
      path, {.durable = options.durable, .write_sidecar = options.write_sidecar, .read_back = options.read_back},
      [&](io::ByteSink& sink, SaveResult& result) {
        const SaveResult counts = prepared.write(sink);
        result.tensor_count = counts.tensor_count;
        result.storage_count = counts.storage_count;
      },
      [](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
        schema::verify_checkpoint_bytes(bytes, owner);
      });
}

// ---- load_checkpoint -------------------------------------------------------------------

bool TrainingState::resumes_in_place(std::uint64_t file_bytes, ResumeMemory memory) const {
  if (memory != ResumeMemory::automatic) return memory == ResumeMemory::in_place;
  // Measured (bench/RESULTS.md, "Resume in place"): in place takes 1.2 to 1.6
  // times the private copy's time at every size from 32 MiB to 1 GiB, so it
  // is chosen only where the private copy would not fit in the memory left:
  // the file, plus a quarter for what the process allocates meanwhile.
  if (file_bytes < kInPlaceResumeBytes || !profile_facts().model_on_cpu) return false;
  return file_bytes + file_bytes / 4 > available_memory_bytes();
}

LoadReport TrainingState::load_checkpoint(const std::filesystem::path& path, const CheckpointLoadOptions& options) {
  std::error_code ignored;
  const auto size = std::filesystem::file_size(path, ignored);
  if (!resumes_in_place(ignored ? 0 : size, options.memory)) return load_parsed_checkpoint(read_untrusted(path, options), path, {});

  const io::RegularFile file = io::open_regular_for_reading(path);
  struct stat identity {};
  ::fstat(file.fd.get(), &identity);
  std::filesystem::path journal_directory = options.journal_directory;
  if (journal_directory.empty()) journal_directory = std::filesystem::absolute(path).parent_path();
  checkpoint::InPlaceFill fill(file, identity, journal_directory);
  // The model's bytes go to the journal while the first pass hashes the file.
  fill.journal_in_background(components_);
  format::ResumeScan scan;
  try {
    scan = format::scan_for_resume(file, path, untrusted_options(options), kInPlaceKeptBytes);
  } catch (const Error& error) {
    rethrow_untrusted(path, error);
  }
  fill.set_records(std::move(scan.absent));
  ParsedLoadOptions parsed;
  parsed.in_place = &fill;
  return load_parsed_checkpoint(scan.mapping, path, parsed);
}

LoadReport TrainingState::load_parsed_checkpoint(const LoadedMapping& mapping, const std::filesystem::path& path,
                                                 const ParsedLoadOptions& options) {
  // Every caller reads the mapping for this load alone and drops it after.
  hand_over_storages(mapping.root, mapping.snapshot);
  LoadReport report;
  report.path = path;
  report.sha256 = mapping.sha256.value_or(Sha256Digest{});
  report.layout = "holdpoint";
  try {
    const Value& root = mapping.root;
    schema::ResumeExpectation expectation;
    expectation.config = schema::effective_config(config_, semantic_identity_, profile_);
    for (const Component* c : components_) expectation.components.push_back(c->name());
    const bool drop_profile_claim = options.allow_unqualified_profile_change && profile_ == ResumeProfile::unqualified;
    // A dropped claim is not relied on: its preconditions are not checked and
    // the profile stops being load-bearing.
    if (!drop_profile_claim) expectation.facts = profile_facts();
    expectation.ignore_profile_drift = drop_profile_claim;
    expectation.digest_checked = mapping.digest_checked;
    expectation.check_component_records = options.check_component_records;
    if (options.in_place) {
      expectation.known_storage_digests = [fill = options.in_place](StorageDigestKind kind) {
        return fill->storage_digests(kind);
      };
    }
    const schema::ResumeCheck check = schema::check_resume_root(root, expectation);
    report.profile = check.manifest.profile;
    for (const Component* c : components_) c->validate(root.as_dict().at(c->name()));

    if (check.max_epochs_growth) {
      report.drift = ResumeDrift{"max_epochs", check.max_epochs_growth->saved, check.max_epochs_growth->live,
                                 schema::progress_step_of(root)};
    }
    if (options.before_apply) options.before_apply();
    if (!options.in_place) {
      report = apply_transactionally(root, std::move(report));
    } else {
      // The large tensors' bytes go where they end up, then the components
      // apply as usual and find them there; any failure puts the live bytes
      // written over back from the journal.
      std::vector<std::pair<Component*, const Value*>> states;
      for (Component* c : components_) {
        if (const Value* state = root.as_dict().find(c->name())) states.emplace_back(c, state);
      }
      const Value filled = options.in_place->fill(root, states);
      report.in_place = true;
      report.bytes_journaled = options.in_place->bytes_journaled();
      try {
        report = apply_transactionally(filled, std::move(report));
      } catch (const Error& error) {
        const std::string unrestored = options.in_place->restore();
        if (unrestored.empty()) throw;
        fail(error.code(), error.detail(), "; the live tensors the resume wrote over could not all be restored",
             unrestored);
      }
    }
    // The accepted extension is part of the run's history from now on.
    if (report.drift) pending_drift_ = report.drift;
    return report;
  } catch (const UnsafeCheckpointLoadUnavailable&) {
    throw;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

namespace {

[[noreturn]] void fail_apply(const std::string& component, const std::exception& failure, std::string_view outcome) {
  const Error* known = dynamic_cast<const Error*>(&failure);
  fail(ErrorCode::state_apply_failed, "applying component '", component, "' failed (",
       known ? error_code_name(known->code()) : std::string_view("exception"), ": ",
       known ? known->detail() : std::string(failure.what()), "); ", outcome);
}

}  // namespace

LoadReport TrainingState::apply_transactionally(const Value& root, LoadReport report) {
  std::vector<std::pair<Component*, const Value*>> order;
  for (Component* c : apply_order()) {
    if (const Value* state = root.as_dict().find(c->name())) order.emplace_back(c, state);
  }
  // 1. Components that can stage their state prepare it; nothing live changes.
  //    (The test hook observes each component right after it is applied, so
  //    with a hook every component takes the rollback path.)
  std::vector<std::function<void()>> installs(order.size());
  if (!after_apply_hook_) {
    for (std::size_t i = 0; i < order.size(); ++i) {
      try {
        installs[i] = order[i].first->stage(*order[i].second);
      } catch (const std::exception& failure) {
        fail_apply(order[i].first->name(), failure, "nothing was applied");
      }
    }
  }
  // 2. The others, in order, each after a rollback copy of it was captured.
  std::vector<std::pair<Component*, Value>> applied;  // with the copy taken just before
  try {
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (installs[i]) continue;
      Component* c = order[i].first;
      applied.emplace_back(c, c->capture(CaptureMode::copy));
      c->apply(*order[i].second);
      if (after_apply_hook_) after_apply_hook_(c->name());
    }
  } catch (const std::exception& failure) {
    // Undo in reverse, including the component that failed midway.
    std::string rollback_failures;
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
      try {
        it->first->apply(it->second);
      } catch (const std::exception& error) {
        rollback_failures += detail::concat("; restoring '", it->first->name(), "' failed too: ", error.what());
      }
    }
    fail_apply(applied.empty() ? "?" : applied.back().first->name(), failure,
               "every component applied before it was restored" + rollback_failures);
  }
  // 3. The staged states, which cannot fail to install.
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (installs[i]) installs[i]();
    report.restored.push_back(order[i].first->name());
  }
  return report;
}

// ---- model only -------------------------------------------------------------------------

LoadReport TrainingState::load_model_state(const std::filesystem::path& path, const CheckpointLoadOptions& options) {
  Component* model = component("model");
  if (!model) fail(ErrorCode::invalid_argument, "load_model_state needs a component named 'model'");
  const LoadedMapping mapping = read_untrusted(path, options);
  LoadReport report;
  report.path = path;
  report.sha256 = mapping.sha256.value_or(Sha256Digest{});
  try {
    Value state;
    const Value& root = mapping.root;
    const Value* manifest_value = find_manifest_entry(root);
    if (manifest_value) {
      const Manifest manifest = Manifest::from_value(*manifest_value);
      const Value* model_state = root.as_dict().find(std::string_view("model"));
      const ComponentRecord* record = manifest.component("model");
      if (!model_state || !record) fail(ErrorCode::component_missing, "the checkpoint has no 'model' component");
      StorageDigests digests(manifest.storage_digest);
      if (!mapping.digest_checked && component_digest(*model_state, digests) != record->sha256) {
        fail(ErrorCode::component_digest_mismatch, "component 'model' does not match the digest its manifest records");
      }
      state = *model_state;
      report.layout = "holdpoint";
      report.profile = manifest.profile;
    } else {
      const checkpoint::LegacyLayout layout = checkpoint::recognise_legacy_layout(root);
      state = layout.model;
      report.layout = layout.name;
      report.qualification = ResumeQualification::legacy_unqualified;
      report.profile = std::string(resume_profile_name(ResumeProfile::unqualified));
    }
    model->validate(state);
    const Value snapshot = model->capture(CaptureMode::copy);
    try {
      model->apply(state);
    } catch (const std::exception& error) {
      model->apply(snapshot);
      fail(ErrorCode::state_apply_failed, "applying the model failed (", error.what(), "); the model was restored");
    }
    report.restored.push_back("model");
    return report;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

// ---- trusted -------------------------------------------------------------------------------

LoadReport TrainingState::load_trusted_checkpoint(const std::filesystem::path& path,
                                                  const std::optional<TrustPolicy>& trust) {
  LoadOptions options;
  options.trust = trust;
  const LoadedMapping mapping = load_trusted_mapping(path, options);
  LoadReport report;
  report.path = path;
  report.sha256 = mapping.sha256.value_or(Sha256Digest{});
  report.qualification = ResumeQualification::legacy_unqualified;
  report.profile = std::string(resume_profile_name(ResumeProfile::unqualified));
  report.warnings = mapping.warnings;
  report.warnings.push_back(detail::concat(
      path.string(), ": loaded as a trusted checkpoint; the caller vouches for its producer and custody. "
                     "It is labelled legacy-unqualified and carries no deterministic-resume claim."));
  for (const auto& warning : report.warnings) warn(warning);
  try {
    const Value& root = mapping.root;
    if (find_manifest_entry(root)) {
      // A holdpoint checkpoint needs no trust; restore it the checked way.
      LoadReport checked = load_checkpoint(path);
      checked.warnings = report.warnings;
      return checked;
    }
    const checkpoint::LegacyLayout layout = checkpoint::recognise_legacy_layout(root);
    report.layout = mapping.via_libtorch ? "torchscript" : layout.name;
    Dict states;
    std::vector<std::string> skipped;
    const auto offer = [&](const std::string& name, const std::optional<Value>& state) {
      if (!state) return;
      if (component(name)) {
        states.insert(name, *state);
      } else {
        skipped.push_back(name);
      }
    };
    offer("model", layout.model);
    offer("optimizer", layout.optimizer);
    offer("scheduler", layout.scheduler);
    if (!skipped.empty()) warn(detail::concat("not restored (no such component registered): ", schema::list_text(skipped)));
    // Validate everything first, then apply transactionally, as for checked loads.
    for (const auto& [key, state] : states) component(key.as_string())->validate(state);
    return apply_transactionally(Value::dict(std::move(states)), std::move(report));
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

}  // namespace holdpoint
