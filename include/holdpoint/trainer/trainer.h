// Trainer: a ready supervised training loop whose whole state is checkpointed.
//
// The trainer owns the loop (batches from a Sampler over an in-memory dataset,
// forward, loss, backward with gradient accumulation, optional gradient
// clipping and loss scaling, the optimizer step, the scheduler at its cadence,
// progress, history and early stopping) and registers every piece of state it
// touches with a TrainingState: model, optimizer, scheduler, scaler, RNG
// registry, sampler, progress, early stopping, history. Checkpoints can be
// taken at any completed optimizer update, mid-epoch included, and a resumed
// trainer continues the exact trajectory under the profile's preconditions.
//
// The configuration identity is filled in automatically (model schema,
// optimizer type and hyperparameters as constructed, scheduler and its
// cadence, loss identity, batch and sampler contract, gradient accumulation,
// precision, clipping, scaler, early stopping, device) and can be extended by
// the caller (generator seeds, curriculum, ...) through TrainerOptions::config.
//
// The caller owns the model, optimizer, sampler, scheduler, scaler and early
// stopping objects and must keep them alive as long as the trainer.
//
// Thread-safety: one thread drives a trainer.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/schema/config_identity.h"
#include "holdpoint/state/progress.h"
#include "holdpoint/schema/resume_profile.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/state/sampler.h"
#include "holdpoint/checkpoint/training_state.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace holdpoint {

class LRScheduler;
class ReduceLROnPlateau;
class GradScaler;

enum class SchedulerCadence : std::uint8_t { per_step, per_epoch };

struct TrainerOptions {
  std::string semantic_identity = "holdpoint-trainer";
  ResumeProfile profile = ResumeProfile::unqualified;
  TrainingEnvironment environment;
  std::int64_t batch_size = 1;
  // Micro-batches per optimizer update; the loss of each is divided by it.
  std::int64_t gradient_accumulation = 1;
  std::optional<double> max_grad_norm;
  // A name for the loss function: it is load-bearing, and a function has no
  // identity of its own.
  std::string loss_identity = "loss";
  SchedulerCadence scheduler_cadence = SchedulerCadence::per_step;
  std::int64_t max_epochs = 1;                 // operational: may grow on resume
  std::optional<std::int64_t> max_steps;       // operational
  // Checkpoints (operational). `checkpointing.cadence` says when step() saves.
  // With `run_directory` set (RunDirectory layout) saves are generations there,
  // resume() and fit() continue from its LATEST, the final state is saved when
  // the run finishes, and `checkpointing` also sets retention, the best
  // metric and asynchronous saves. Without it, saves at the step and epoch
  // cadences replace the single file `checkpoint_path` (with its sidecar).
  std::filesystem::path run_directory;
  std::filesystem::path checkpoint_path;
  CheckpointManagerOptions checkpointing;
  // fit() installs a PreemptionGuard: SIGTERM/SIGINT/SIGUSR1 save at the next
  // step boundary and fit() returns FitOutcome::preempted (exit with
  // kExitPreempted); a second signal exits with kExitAborted at once.
  bool handle_preemption_signals = false;
  // Extra fields of the caller's (seeds, curriculum, loss weights, ...).
  TrainingConfig config;
  std::string code_identity;
  std::string data_identity;
};

struct StepRecord {
  std::int64_t step = 0;   // global step after this update (1-based)
  std::int64_t epoch = 0;  // epoch the update's samples came from
  std::vector<std::int64_t> sample_ids;
  double loss = 0;         // mean loss over the update's micro-batches
  double learning_rate = 0;  // of the first parameter group, as used by this update
  bool optimizer_stepped = true;  // false when the loss scaler skipped the update
};

enum class FitOutcome : std::uint8_t {
  finished,   // finished() is true
  preempted,  // a preemption signal arrived; the state at the last step boundary is committed
};

// Where a trainer's checkpoints go when they are not one process's run
// directory (TrainerOptions::run_directory): make_data_parallel
// (holdpoint/dist/data_parallel.h) saves through a DistributedCheckpointer.
// The trainer calls resume() once, before the first update; save() at the
// cadence of TrainerOptions::checkpointing.cadence (steps and epochs) and
// at the end of fit(); wait() before fit() returns.
class TrainerCheckpoints {
 public:
  virtual ~TrainerCheckpoints() = default;
  // Resumes the trainer's state from the run's LATEST; nothing for a run
  // without a generation.
  virtual std::optional<LoadReport> resume() = 0;
  virtual void save(const GenerationSpec& spec) = 0;
  virtual void wait() = 0;
};

// How a trainer runs as one of several data-parallel processes. Each hook
// is collective when set: every process calls it at the same point of the
// same update, so each must be set on every process or on none.
struct TrainerParallelism {
  // After the update's backward passes, before clipping and the optimizer
  // step: replaces each parameter's gradient with the mean over the processes.
  std::function<void(torch::nn::Module& model)> reduce_gradients;
  // The update's mean loss on this process -> the mean over the processes
  // (history, plateau scheduling and early stopping then agree everywhere).
  std::function<double(double local_mean)> reduce_loss;
  // This process's sampler's remaining count -> the least over the
  // processes. An epoch ends on every process when any has run out (the
  // others' few remaining rows are dropped, as DistributedSampler's uneven
  // tail).
  std::function<std::int64_t(std::int64_t local_remaining)> agree_remaining;
  // Whether any process has this flag set: fit() asks it at every step
  // boundary whether a preemption signal arrived anywhere (a signal reaches
  // the processes at different moments; all must stop at the same step).
  std::function<bool(bool local)> agree_any;
  std::unique_ptr<TrainerCheckpoints> checkpoints;
};

class Trainer {
 public:
  using Forward = std::function<at::Tensor(const at::Tensor& inputs)>;
  using Loss = std::function<at::Tensor(const at::Tensor& outputs, const at::Tensor& targets)>;

  // `inputs` and `targets` hold the dataset along dimension 0; the sampler
  // yields row indices into them.
  Trainer(torch::nn::Module& model, Forward forward, torch::optim::Optimizer& optimizer, Loss loss,
          at::Tensor inputs, at::Tensor targets, Sampler& sampler, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  Trainer& set_scheduler(LRScheduler& scheduler);
  Trainer& set_plateau_scheduler(ReduceLROnPlateau& scheduler);  // stepped per epoch with the epoch's mean loss
  Trainer& set_scaler(GradScaler& scaler);
  Trainer& set_early_stopping(EarlyStopping& early_stopping);  // updated per epoch with the epoch's mean loss
  // Generators the run draws from (the default CPU generator is registered
  // already; add the sampler's explicit generator and any others).
  RngRegistry& rng() noexcept;

  StepRecord step();
  // Runs until finished() or preemption, calling `on_step` after every
  // update. With a run directory it first resumes from LATEST (resume()).
  FitOutcome fit(const std::function<void(const StepRecord&)>& on_step = {});
  // Opens the run directory (recovering it) and resumes from its LATEST, if
  // it has one; fit() calls it. Returns the load report, or nothing for a run
  // without a generation. (To load a given file instead: state().load_checkpoint.)
  std::optional<LoadReport> resume();
  // The run directory's manager (nullptr before resume(), and when the
  // trainer is parallel).
  CheckpointManager* checkpoints() noexcept;
  // Makes this trainer one of several data-parallel processes (see
  // TrainerParallelism; make_data_parallel sets it). Call before the first
  // update. The environment is what the checkpoints record about the job
  // (distributed, world size, rank-local generators).
  Trainer& set_parallelism(TrainerParallelism parallelism, const TrainingEnvironment& environment);
  bool finished() const;


  const Progress& progress() const noexcept;
  const MetricsHistory& history() const noexcept;
  // Every component the trainer registered: save, load_checkpoint,
  // load_model_state and load_trusted_checkpoint are TrainingState's.
  TrainingState& state();
  // The configuration identity as it is now (automatic fields + the caller's).
  TrainingConfig config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace holdpoint
