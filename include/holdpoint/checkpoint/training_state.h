// TrainingState: the registry of a training run's components, and the load
// APIs of the trust matrix (docs/resume-contract.md).
//
//   save(path)                    a schema-qualified checkpoint of every component
//   load_checkpoint(path)         full resume; untrusted files are fine; transactional
//   load_model_state(path)        the model only; untrusted files are fine; also reads
//                                 legacy layouts (bare state_dict, the PyTorch tutorial's
//                                 checkpoint, Lightning-style dicts)
//   load_trusted_checkpoint(path) LibTorch torch::save archives and other inputs only
//                                 LibTorch can parse; the caller vouches for producer and
//                                 custody; warns; labelled legacy-unqualified
//
// load_checkpoint order (nothing is mutated until every check passed):
// read the file into a private snapshot (optionally against an expected SHA-256),
// parse it with the restricted reader, check the manifest's fields, kind and
// schema, the resume profile's preconditions on the live setup, the
// configuration identity (drift in a load-bearing field rejects, naming every
// drifted field; max_epochs may grow), the component inventory, each
// component's digest and contract, then validate every component against the
// live objects. Only then are components applied in the order model,
// scheduler, optimizer, scaler, progress, early stop, history, sampler, RNG
// (others in registration order before the sampler); if an apply fails, every
// component already applied is restored from a copy taken just before.
// Untrusted loads never call LibTorch's deserializer: a file that only it
// could parse raises UnsafeCheckpointLoadUnavailable before it is touched.
//
// Thread-safety: one thread at a time; components are not locked.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/memory.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/component.h"
#include "holdpoint/schema/config_identity.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/schema/resume_profile.h"

namespace holdpoint {

// Raised by untrusted load APIs when the file is one only LibTorch's
// unhardened deserializer could read (a TorchScript archive, say). `reason()`
// is the restricted reader's code for the file.
class UnsafeCheckpointLoadUnavailable : public Error {
 public:
  UnsafeCheckpointLoadUnavailable(std::string detail, ErrorCode reason);
  ErrorCode reason() const noexcept { return reason_; }

 private:
  ErrorCode reason_;
};

// What the caller declares about the setup that components cannot tell.
struct TrainingEnvironment {
  int loader_workers = 0;
  bool distributed = false;
  // Set by DistributedCheckpointer (holdpoint/dist/distributed.h): the process
  // group's size, and whether the generator registry ("rng") is rank-local.
  std::int64_t world_size = 1;
  bool rank_local_generators = false;
  // Anything random outside the registry (Python's random, NumPy, wall clock
  // used as a seed, network input). Forces the unqualified profile.
  bool external_randomness = false;
};

struct CheckpointSaveOptions {
  bool durable = true;
  bool write_sidecar = true;
  ReadBack read_back = ReadBack::cached;  // see SaveOptions
  // Python's torch 1.13 weights_only loader cannot read floats; see SaveOptions.
  bool torch_1_13_compatible = false;
};

// How a resume holds the file while it checks it (docs/resume-contract.md,
// "Resuming in place").
enum class ResumeMemory : std::uint8_t {
  // in_place when the private copy would not fit: a file of
  // kInPlaceResumeBytes or more, larger (plus a quarter) than the memory
  // still available to the process (available_memory_bytes), with the model
  // on the CPU; private_copy otherwise, which is faster where it fits.
  automatic,
  // The whole file is read into private memory, checked, and applied from
  // there: fastest for small files; needs memory for the whole file on top of
  // the live state.
  private_copy,
  // Two passes over the file: the first verifies it (SHA-256, structure,
  // every check) keeping only its small records; the second copies each large
  // tensor straight into the live tensor's memory (or into memory the
  // component adopts), checking every byte against a tag the first pass took.
  // Extra memory: 64 MiB of small records plus metadata, whatever the file's
  // size. The live bytes written over go to a journal file first, so that a
  // failure still leaves the live state as it was.
  in_place,
};

// Files smaller than this never resume in place under ResumeMemory::automatic.
inline constexpr std::uint64_t kInPlaceResumeBytes = std::uint64_t{256} << 20;


struct CheckpointLoadOptions {
  Limits limits;
  ResumeMemory memory = ResumeMemory::automatic;
  // Where a resume in place keeps its journal of the live bytes it writes
  // over (an unnamed file, gone when the resume returns). Empty: the
  // checkpoint's own folder. Needs room for the live tensors the file
  // overwrites; tmpfs would hold them in memory.
  std::filesystem::path journal_directory;
  // Checked before any byte is parsed (see LoadOptions::expected_sha256).
  std::optional<Sha256Digest> expected_sha256;
  // The signature the file must carry (holdpoint/base/signature.h), checked
  // before any byte is parsed; see LoadOptions::trust.
  std::optional<TrustPolicy> trust;
};

// Options of the loads that CheckpointManager and DistributedCheckpointer run
// on mappings they read themselves (src/torch/checkpoint/training_state_access.h).
struct ParsedLoadOptions;

enum class ResumeQualification : std::uint8_t {
  qualified,           // a holdpoint checkpoint under its named profile
  legacy_unqualified,  // restored from a legacy or trusted layout; no resume claim
};

struct LoadReport {
  std::filesystem::path path;
  Sha256Digest sha256;
  ResumeQualification qualification = ResumeQualification::qualified;
  std::string profile;
  std::string layout;  // "holdpoint", "state_dict", "tutorial", "lightning", "torchscript"
  std::vector<std::string> restored;  // component names, in apply order
  bool in_place = false;                // resumed in place (ResumeMemory::in_place)
  std::uint64_t bytes_journaled = 0;    // live bytes a resume in place saved before writing over them
  std::optional<ResumeDrift> drift;   // a max_epochs extension accepted by this load
  std::vector<std::string> warnings;
};


// A checkpoint captured at a step boundary and written later, possibly on
// another thread (asynchronous saves). Without a stager its tensors view the
// live tensors and it must be written before the next update; with one (see
// CheckpointManager) they live in staging memory of their own.
class PreparedCheckpoint {
 public:
  PreparedCheckpoint() = default;
  // A checkpoint of given states under `manifest` (its component records are
  // filled in while writing): the shards of holdpoint/dist/distributed.h.
  PreparedCheckpoint(Manifest manifest, std::vector<std::pair<std::string, Value>> states,
                     bool torch_1_13_compatible)
      : manifest_(std::move(manifest)), states_(std::move(states)), torch_1_13_compatible_(torch_1_13_compatible) {}
  // Streams the checkpoint file into `sink` (tensor records first, the
  // manifest with per-component digests last); fills the counts of the result.
  SaveResult write(io::ByteSink& sink) const;
  const Manifest& manifest() const noexcept { return manifest_; }
  const std::vector<std::pair<std::string, Value>>& states() const noexcept { return states_; }

 private:
  friend class TrainingState;
  Manifest manifest_;
  std::vector<std::pair<std::string, Value>> states_;
  bool torch_1_13_compatible_ = false;
};

// Rewrites captured component states in place (copies their tensors into
// staging memory).
using StateStager = std::function<void(std::vector<std::pair<std::string, Value>>& states)>;

class TrainingState {
 public:
  TrainingState() = default;
  TrainingState(const TrainingState&) = delete;
  TrainingState& operator=(const TrainingState&) = delete;

  // Components are referenced, not owned; names must be unique.
  TrainingState& add(Component& component);
  // Forgets every component (to register a new set); settings and an accepted
  // resume drift are kept.
  TrainingState& clear_components();
  TrainingState& set_semantic_identity(std::string identity);
  TrainingState& set_profile(ResumeProfile profile);
  TrainingState& set_config(TrainingConfig config);
  TrainingState& set_environment(TrainingEnvironment environment);
  TrainingState& set_code_identity(std::string identity);
  TrainingState& set_data_identity(std::string identity);
  // Warnings of trusted loads go here (default: standard error).
  TrainingState& set_warning_sink(std::function<void(const std::string&)> sink);

  Component* component(const std::string& name) const;
  const TrainingConfig& config() const noexcept { return config_; }
  const TrainingEnvironment& environment() const noexcept { return environment_; }
  ResumeProfile profile() const noexcept { return profile_; }
  // The profile-relevant facts derived from the components and the environment.
  ProfileFacts profile_facts() const;
  // The manifest a save would write now (digests left empty).
  Manifest manifest_preview() const;

  SaveResult save(const std::filesystem::path& path, const CheckpointSaveOptions& options = {});
  // Captures every component now (checking the profile first); `stage`, if
  // given, replaces the captured tensors with copies before returning.
  PreparedCheckpoint prepare_save(const CheckpointSaveOptions& options = {}, const StateStager& stage = {}) const;
  LoadReport load_checkpoint(const std::filesystem::path& path, const CheckpointLoadOptions& options = {});
  // Whether load_checkpoint resumes a file of `file_bytes` in place under
  // `memory` (see ResumeMemory::automatic).
  bool resumes_in_place(std::uint64_t file_bytes, ResumeMemory memory) const;
  LoadReport load_model_state(const std::filesystem::path& path, const CheckpointLoadOptions& options = {});
  // With `trust`, the file's signature is checked, and its bytes held to the
  // signed digest, before LibTorch reads it.
  LoadReport load_trusted_checkpoint(const std::filesystem::path& path,
                                     const std::optional<TrustPolicy>& trust = std::nullopt);

  // Hook for tests and instrumentation: called after each component is applied
  // during load_checkpoint (a throw here exercises the rollback).
  void set_after_apply_hook(std::function<void(const std::string& component)> hook);

 private:
  friend struct TrainingStateAccess;  // src/torch/checkpoint/training_state_access.h
  // load_checkpoint on a mapping already read and parsed by the restricted
  // reader; `path` labels the report and errors.
  LoadReport load_parsed_checkpoint(const LoadedMapping& mapping, const std::filesystem::path& path,
                                    const ParsedLoadOptions& options);
  std::vector<Component*> apply_order() const;
  void warn(const std::string& message) const;
  LoadReport apply_transactionally(const Value& root, LoadReport report);

  std::vector<Component*> components_;
  std::string semantic_identity_;
  ResumeProfile profile_ = ResumeProfile::unqualified;
  TrainingConfig config_;
  TrainingEnvironment environment_;
  std::string code_identity_;
  std::string data_identity_;
  std::optional<ResumeDrift> pending_drift_;
  std::function<void(const std::string&)> warning_sink_;
  std::function<void(const std::string&)> after_apply_hook_;
};

}  // namespace holdpoint
