#include "holdpoint/checkpoint/checkpoint_manager.h"

#include <chrono>
#include <atomic>
#include <exception>
#include <iostream>
#include <mutex>
#include <thread>

#include "checkpoint/training_state_access.h"
#include "base/fail.h"
#include "holdpoint/base/byte_sink.h"
#include "run/staging_arena.h"

namespace holdpoint {

using detail::concat;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

struct CheckpointManager::Impl {
  TrainingState& state;
  CheckpointManagerOptions options;
  RunDirectory run;
  run::StagingArena arena;

  // The background save: at most one. `run` is touched by it while in flight;
  // the training thread joins it before touching `run` again.
  std::thread worker;
  std::exception_ptr failure;
  std::atomic<bool> worker_done{false};
  std::int64_t failed_step = 0;  // the step of the save in flight (or last started)
  std::optional<CommitResult> last_commit;
  Clock::time_point last_save = Clock::now();

  Impl(const std::filesystem::path& path, TrainingState& s, CheckpointManagerOptions o)
      : state(s), options(std::move(o)), run(path, options.run), arena(options.copy_threads) {}

  void log(const std::string& line) const {
    if (options.run.log) {
      options.run.log(line);
    } else {
      std::cerr << "holdpoint: " << line << "\n";
    }
  }

  // Joins the worker; returns its error (cleared) if it failed.
  std::exception_ptr join() {
    if (worker.joinable()) worker.join();
    return std::exchange(failure, nullptr);
  }

  void rethrow(std::exception_ptr error) const {
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      throw Error(e.code(), concat("the background save of step ", failed_step, " failed: ", e.detail()))
          .with_path(e.path());
    }
  }

  CommitResult commit(const GenerationSpec& spec, const PreparedCheckpoint& prepared) {
    return run.commit(spec, [&](io::ByteSink& sink) { prepared.write(sink); });
  }
};

CheckpointManager::CheckpointManager(const std::filesystem::path& run, TrainingState& state,
                                     CheckpointManagerOptions options)
    : impl_(std::make_unique<Impl>(run, state, std::move(options))) {}

CheckpointManager::~CheckpointManager() {
  if (const auto error = impl_->join()) {
    try {
      impl_->rethrow(error);
    } catch (const std::exception& e) {
      impl_->log(e.what());
    }
  }
}

std::optional<LoadReport> CheckpointManager::resume() {
  impl_->rethrow(impl_->join());
  const auto latest = impl_->run.latest();
  if (!latest) {
    // Evidence of an earlier run with nothing usable left: refuse to start
    // over silently.
    if (const auto lost = impl_->run.recovery().lost_generations()) {
      detail::fail(ErrorCode::run_no_generation, impl_->run.path().string(),
                   ": no generation verifies, but the run directory shows an earlier run (", *lost,
                   "); resuming from scratch is refused. Inspect with `holdpoint ls`, then remove the run directory "
                   "to start over");
    }
    return std::nullopt;
  }
  // The whole run's signatures first: a rolled-back LATEST or a broken chain
  // is refused before a generation is read (load() then checks LATEST's own).
  if (const auto& trust = impl_->run.options().trust) impl_->run.require_signatures(*trust);
  const std::filesystem::path path = impl_->run.file_path(*latest);
  std::error_code ignored;
  const auto size = std::filesystem::file_size(path, ignored);
  LoadReport report;
  if (impl_->state.resumes_in_place(ignored ? 0 : size, impl_->options.resume_memory)) {
    // The same checks as run.load: the digest the run index records, and the
    // generation's signature under the run's trust policy.
    CheckpointLoadOptions load;
    load.limits = impl_->run.options().limits;
    load.expected_sha256 = latest->sha256;
    load.trust = impl_->run.options().trust;
    load.memory = ResumeMemory::in_place;
    load.journal_directory = impl_->options.journal_directory;
    report = impl_->state.load_checkpoint(path, load);
  } else {
    const LoadedMapping mapping = impl_->run.load(*latest);
    report = TrainingStateAccess::load_parsed(impl_->state, mapping, path);
  }
  impl_->log(concat("resumed ", impl_->run.path().string(), " from ", latest->name, " (step ", latest->step, ")"));
  return report;
}

bool CheckpointManager::due(std::int64_t step, bool epoch_completed, std::int64_t epochs_completed) const {
  const SaveCadence& c = impl_->options.cadence;
  if (c.every_steps > 0 && step > 0 && step % c.every_steps == 0) return true;
  if (c.every_epochs > 0 && epoch_completed && epochs_completed > 0 && epochs_completed % c.every_epochs == 0) return true;
  if (c.every_seconds > 0 && seconds_since(impl_->last_save) >= c.every_seconds) return true;
  return false;
}

std::optional<SaveStats> CheckpointManager::save(const GenerationSpec& spec) {
  Impl& d = *impl_;
  const auto start = Clock::now();
  SaveStats stats;
  stats.step = spec.step;
  stats.asynchronous = d.options.asynchronous;
  if (d.worker.joinable()) {
    d.log(concat("save of step ", spec.step, " waits for the save of step ", d.failed_step, " still in flight"));
  }
  d.rethrow(d.join());
  stats.waited_seconds = seconds_since(start);
  if (const auto latest = d.run.latest(); latest && latest->step == spec.step) {
    return std::nullopt;  // this exact step is committed already (a cadence save, then a preemption save)
  }
  CheckpointSaveOptions save_options;
  save_options.torch_1_13_compatible = d.options.torch_1_13_compatible;
  if (!d.options.asynchronous) {
    const PreparedCheckpoint prepared = d.state.prepare_save(save_options);
    d.last_commit = d.commit(spec, prepared);
    d.last_save = Clock::now();
    stats.blocked_seconds = seconds_since(start);
    return stats;
  }
  const auto staging_start = Clock::now();
  run::StageStats staged;
  auto prepared = std::make_shared<PreparedCheckpoint>(d.state.prepare_save(
      save_options, [&](std::vector<std::pair<std::string, Value>>& states) { staged = d.arena.stage(states); }));
  stats.staging_seconds = seconds_since(staging_start);
  stats.staged_bytes = staged.bytes;
  stats.staging_reused = staged.reused;
  d.last_save = Clock::now();
  d.failed_step = spec.step;
  d.worker_done = false;
  d.worker = std::thread([&d, spec, prepared] {
    try {
      CommitResult result = d.commit(spec, *prepared);
      d.last_commit = std::move(result);
    } catch (...) {
      d.failure = std::current_exception();
    }
    d.worker_done = true;
  });
  stats.blocked_seconds = seconds_since(start);
  return stats;
}

std::optional<SaveStats> CheckpointManager::maybe_save(const GenerationSpec& spec, bool epoch_completed,
                                                       std::int64_t epochs_completed) {
  if (!due(spec.step, epoch_completed, epochs_completed)) {
    // A finished background save is joined here, so its failure is reported
    // at the first call after it, not at the next save.
    if (impl_->worker.joinable() && impl_->worker_done) impl_->rethrow(impl_->join());
    return std::nullopt;
  }
  return save(spec);
}

void CheckpointManager::reserve_staging(std::uint64_t minimum_bytes) {
  Impl& d = *impl_;
  d.rethrow(d.join());
  CheckpointSaveOptions save_options;
  save_options.torch_1_13_compatible = d.options.torch_1_13_compatible;
  // The staged copy is dropped at once; the arena keeps its buffer for the next save.
  d.state.prepare_save(save_options, [&](std::vector<std::pair<std::string, Value>>& states) { d.arena.stage(states); });
  d.arena.reserve(minimum_bytes);
}

void CheckpointManager::wait() { impl_->rethrow(impl_->join()); }

bool CheckpointManager::in_flight() const { return impl_->worker.joinable(); }

std::optional<GenerationInfo> CheckpointManager::latest() {
  if (impl_->worker.joinable()) impl_->worker.join();
  return impl_->run.latest();
}

std::optional<GenerationInfo> CheckpointManager::best() {
  if (impl_->worker.joinable()) impl_->worker.join();
  return impl_->run.best();
}

std::vector<GenerationInfo> CheckpointManager::generations() {
  if (impl_->worker.joinable()) impl_->worker.join();
  return impl_->run.generations();
}

std::optional<CommitResult> CheckpointManager::last_commit() {
  if (impl_->worker.joinable()) impl_->worker.join();
  return impl_->last_commit;
}

RunDirectory& CheckpointManager::run() { return impl_->run; }

}  // namespace holdpoint
