// CheckpointManager: a TrainingState saved into a RunDirectory on a cadence,
// synchronously or in the background, and resumed from LATEST.
//
// Synchronous save: capture every component (views of the live tensors),
// stream the file through the run directory's commit (publish, verify,
// rename, LATEST), return.
//
// Asynchronous save: on the training thread, wait for the previous save if
// one is still in flight (logged, and counted in SaveStats::waited_seconds),
// capture every component and copy its tensors into reusable staging memory
// with several threads; then hand the staged checkpoint to a background
// thread that writes, hashes, verifies and commits it. The training thread
// may update the model as soon as save() returns. At most one save is in
// flight. A background save that fails before LATEST moves leaves LATEST
// where it was; one that fails after (LATEST's directory fsync, BEST,
// retention) is committed and its message says so. Either error is thrown by
// the next call of save(), maybe_save(), wait() or resume(), with the code it
// failed with and the step it was for.
//
// The destructor waits for a save in flight; an error it had is logged, not
// thrown. Call wait() before the end of training to see it.
//
// Failure contract: holdpoint::Error from the run directory, the file system,
// the capture (profile preconditions) or a background save.
//
// Thread-safety: one training thread calls the manager; the manager's own
// background thread is internal.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/run/run_directory.h"
#include "holdpoint/checkpoint/training_state.h"

namespace holdpoint {

struct SaveCadence {
  std::int64_t every_steps = 0;   // 0: not by steps
  std::int64_t every_epochs = 0;  // 0: not by epochs
  double every_seconds = 0;       // 0: not by time (steady clock, since the last save or the start)
};

struct CheckpointManagerOptions {
  RunDirectoryOptions run;
  SaveCadence cadence;
  bool asynchronous = false;
  bool torch_1_13_compatible = false;
  unsigned copy_threads = 0;  // staging copy threads; 0: one per hardware thread (at most 8)
  // How resume() holds LATEST while it checks it (ResumeMemory in
  // holdpoint/checkpoint/training_state.h): in place, LATEST is verified
  // against the run index's digest in a first pass and its large tensors
  // copied straight into live memory in a second.
  ResumeMemory resume_memory = ResumeMemory::automatic;
  std::filesystem::path journal_directory;  // CheckpointLoadOptions::journal_directory
};

struct SaveStats {
  std::int64_t step = 0;
  bool asynchronous = false;
  double blocked_seconds = 0;  // the training thread's time in save()
  double waited_seconds = 0;   // of which waiting for the previous save
  double staging_seconds = 0;  // of which copying into staging memory
  std::uint64_t staged_bytes = 0;
  bool staging_reused = false;
};

class CheckpointManager {
 public:
  CheckpointManager(const std::filesystem::path& run, TrainingState& state, CheckpointManagerOptions options = {});
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Loads LATEST into the training state transactionally, against its
  // recorded SHA-256; nullopt when the run has no generation yet. A run whose
  // generations are all damaged (quarantined) is refused with
  // run_no_generation rather than silently restarted from scratch.
  std::optional<LoadReport> resume();

  // True when the cadence asks for a save after this step.
  bool due(std::int64_t step, bool epoch_completed, std::int64_t epochs_completed) const;
  // Saves now (asynchronously when configured). A save of the step LATEST
  // already holds is skipped (nullopt); an older step is refused
  // (run_step_not_increasing). Throws the error of a failed background save
  // first.
  std::optional<SaveStats> save(const GenerationSpec& spec);
  std::optional<SaveStats> maybe_save(const GenerationSpec& spec, bool epoch_completed, std::int64_t epochs_completed);
  // Allocates and touches the staging memory of asynchronous saves now (one
  // capture and copy of the state, and at least `minimum_bytes`), so the
  // first save() blocks no longer than later ones. Optimizers create their
  // state at their first step: call it after one, or pass the expected size.
  void reserve_staging(std::uint64_t minimum_bytes = 0);
  // Waits for the save in flight and throws its error, if any.
  void wait();
  bool in_flight() const;

  // These wait for a save in flight (without throwing its error).
  std::optional<GenerationInfo> latest();
  std::optional<GenerationInfo> best();
  std::vector<GenerationInfo> generations();
  std::optional<CommitResult> last_commit();
  // The run directory itself (recovery() says what opening it found); wait()
  // first when saves are asynchronous.
  RunDirectory& run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace holdpoint
