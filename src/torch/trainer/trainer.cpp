#include "holdpoint/trainer/trainer.h"

#include <ATen/ops/tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>

#include "base/fail.h"
#include "holdpoint/state/grad_scaler.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/run/preemption.h"
#include "holdpoint/tensor/torch_tensor.h"

namespace holdpoint {

using detail::fail;

struct Trainer::Impl {
  Impl(torch::nn::Module& model, Forward forward, torch::optim::Optimizer& optimizer, Loss loss, at::Tensor inputs,
       at::Tensor targets, Sampler& sampler, TrainerOptions options)
      : model(model),
        forward(std::move(forward)),
        optimizer(optimizer),
        loss(std::move(loss)),
        inputs(std::move(inputs)),
        targets(std::move(targets)),
        sampler(sampler),
        options(std::move(options)),
        model_state(model),
        optimizer_state("optimizer", optimizer),
        // Recorded as constructed: the initial learning rates are load-bearing,
        // the current ones move with the scheduler.
        optimizer_config(holdpoint::optimizer_config(optimizer)),
        sampler_state(sampler),
        progress_state(progress),
        history_state(history) {}

  torch::nn::Module& model;
  Forward forward;
  torch::optim::Optimizer& optimizer;
  Loss loss;
  at::Tensor inputs;
  at::Tensor targets;
  Sampler& sampler;
  TrainerOptions options;

  Progress progress;
  MetricsHistory history;
  RngRegistry rng;
  ModuleState model_state;
  OptimizerState optimizer_state;
  Value optimizer_config;
  SamplerState sampler_state;
  ProgressState progress_state;
  MetricsHistoryState history_state;
  std::unique_ptr<EarlyStoppingState> early_stop_state;
  std::unique_ptr<CheckpointManager> checkpoints;
  TrainerParallelism parallel;
  bool run_opened = false;

  LRScheduler* scheduler = nullptr;
  ReduceLROnPlateau* plateau = nullptr;
  GradScaler* scaler = nullptr;
  EarlyStopping* early_stopping = nullptr;
  TrainingState state;

  TrainingConfig config() const;
  void refresh_state();
  // Up to batch_size rows, and at most `limit` (when parallel, the rows every
  // process still has, so that all take the same number).
  std::vector<std::int64_t> next_batch(std::int64_t limit);
  void finish_epoch();
  double first_group_lr() const { return optimizer.param_groups().at(0).options().get_lr(); }
  // Rows left in the epoch: this sampler's, or the least over the processes
  // (collective when parallel).
  std::int64_t remaining() const {
    const std::int64_t local = sampler.remaining();
    return parallel.agree_remaining ? parallel.agree_remaining(local) : local;
  }
  bool has_run() const { return !options.run_directory.empty() || parallel.checkpoints != nullptr; }
  // Saves at the cadence of options.checkpointing (steps and epochs).
  bool save_due(const StepRecord& record, bool epoch_done) const {
    const SaveCadence& cadence = options.checkpointing.cadence;
    return (cadence.every_steps > 0 && record.step % cadence.every_steps == 0) ||
           (cadence.every_epochs > 0 && epoch_done && (record.epoch + 1) % cadence.every_epochs == 0);
  }

  // What a run-directory generation records about the state after `record`.
  GenerationSpec generation(const StepRecord& record) const {
    GenerationSpec spec;
    spec.step = record.step;
    spec.epoch = progress.epoch;
    spec.metrics = {{"loss", record.loss}, {"lr", record.learning_rate}};
    return spec;
  }
  GenerationSpec generation_after_last_step() const {
    GenerationSpec spec;
    spec.step = progress.global_step;
    spec.epoch = progress.epoch;
    if (!history.records().empty()) spec.metrics = history.records().back().metrics;
    return spec;
  }
};

TrainingConfig Trainer::Impl::config() const {
  TrainingConfig config = options.config;
  config.load_bearing("model_schema", model_state.contract());
  config.load_bearing("optimizer", optimizer_config);
  Dict batch;
  batch.insert("batch_size", Value::integer(options.batch_size));
  batch.insert("drop_last", Value::boolean(false));
  batch.insert("sampler", Value::string(sampler.kind()));
  batch.insert("num_samples", Value::integer(sampler.num_samples()));
  config.load_bearing("batch", Value::dict(std::move(batch)));
  config.load_bearing("loss", Value::string(options.loss_identity));
  config.load_bearing("gradient_accumulation", Value::integer(options.gradient_accumulation));
  config.load_bearing("gradient_clipping",
                      options.max_grad_norm ? Value::floating(*options.max_grad_norm) : Value::none());
  const auto params = model.parameters();
  config.load_bearing("precision", Value::string(params.empty() ? std::string("none")
                                                                : std::string(c10::toString(params[0].scalar_type()))));
  config.load_bearing("device", Value::string(params.empty() ? std::string("cpu") : params[0].device().str()));
  Dict scheduler_config;
  if (scheduler) scheduler_config.insert("schedule", scheduler->config());
  if (plateau) scheduler_config.insert("plateau", plateau->config());
  scheduler_config.insert("cadence",
                          Value::string(options.scheduler_cadence == SchedulerCadence::per_step ? "step" : "epoch"));
  config.load_bearing("scheduler", Value::dict(std::move(scheduler_config)));
  config.load_bearing("scaler", scaler ? scaler->config() : Value::none());
  if (early_stopping) {
    Dict early;
    early.insert("mode", Value::string(early_stopping->mode() == EarlyStoppingMode::min ? "min" : "max"));
    early.insert("patience", Value::integer(early_stopping->patience()));
    early.insert("min_delta", Value::floating(early_stopping->min_delta()));
    early.insert("metric", Value::string("epoch_mean_loss"));
    config.load_bearing("early_stopping", Value::dict(std::move(early)));
  } else {
    config.load_bearing("early_stopping", Value::none());
  }
  config.max_epochs(options.max_epochs);
  config.operational("max_steps", options.max_steps ? Value::integer(*options.max_steps) : Value::none());
  const SaveCadence& cadence = options.checkpointing.cadence;
  config.operational("save_every_steps", cadence.every_steps > 0 ? Value::integer(cadence.every_steps) : Value::none());
  config.operational("save_every_epochs",
                     cadence.every_epochs > 0 ? Value::integer(cadence.every_epochs) : Value::none());
  return config;
}

// The registry is rebuilt whenever the set of components changes, in a fixed
// order, so that save and load always see the same inventory.
void Trainer::Impl::refresh_state() {
  state.clear_components();
  state.add(model_state).add(optimizer_state);
  if (scheduler) state.add(*scheduler);
  if (plateau) state.add(*plateau);
  if (scaler) state.add(*scaler);
  state.add(progress_state);
  if (early_stop_state) state.add(*early_stop_state);
  state.add(history_state).add(sampler_state).add(rng);
  state.set_semantic_identity(options.semantic_identity)
      .set_profile(options.profile)
      .set_environment(options.environment)
      .set_code_identity(options.code_identity)
      .set_data_identity(options.data_identity)
      .set_config(config());
}

void Trainer::Impl::finish_epoch() {
  double sum = 0;
  std::int64_t count = 0;
  for (const auto& record : history.records()) {
    if (record.epoch != progress.epoch) continue;
    for (const auto& [name, value] : record.metrics) {
      if (name == "loss") {
        sum += value;
        ++count;
      }
    }
  }
  const double mean = count ? sum / static_cast<double>(count) : std::nan("");
  if (scheduler && options.scheduler_cadence == SchedulerCadence::per_epoch) scheduler->step();
  if (plateau) plateau->step(mean);
  if (early_stopping) early_stopping->update(mean);
  progress.epoch += 1;
  progress.batch_in_epoch = 0;
  sampler.start_epoch(progress.epoch);
}

std::vector<std::int64_t> Trainer::Impl::next_batch(std::int64_t limit) {
  std::vector<std::int64_t> ids;
  const std::int64_t size = std::min(options.batch_size, limit);
  while (static_cast<std::int64_t>(ids.size()) < size) {
    const auto id = sampler.next();
    if (!id) break;
    ids.push_back(*id);
  }
  return ids;
}

Trainer::Trainer(torch::nn::Module& model, Forward forward, torch::optim::Optimizer& optimizer, Loss loss,
                 at::Tensor inputs, at::Tensor targets, Sampler& sampler, TrainerOptions options) {
  if (options.batch_size < 1 || options.gradient_accumulation < 1 || options.max_epochs < 0) {
    fail(ErrorCode::invalid_argument, "Trainer: batch_size and gradient_accumulation must be >= 1, max_epochs >= 0");
  }
  if (!inputs.defined() || !targets.defined() || inputs.size(0) != targets.size(0) ||
      inputs.size(0) != sampler.num_samples()) {
    fail(ErrorCode::invalid_argument, "Trainer: inputs, targets and the sampler must cover the same number of rows");
  }
  impl_ = std::make_unique<Impl>(model, std::move(forward), optimizer, std::move(loss), std::move(inputs),
                                 std::move(targets), sampler, std::move(options));
  register_default_generators(impl_->rng);
  impl_->refresh_state();
}

Trainer::~Trainer() = default;

Trainer& Trainer::set_scheduler(LRScheduler& scheduler) {
  impl_->scheduler = &scheduler;
  impl_->refresh_state();
  return *this;
}
Trainer& Trainer::set_plateau_scheduler(ReduceLROnPlateau& scheduler) {
  impl_->plateau = &scheduler;
  impl_->refresh_state();
  return *this;
}
Trainer& Trainer::set_scaler(GradScaler& scaler) {
  impl_->scaler = &scaler;
  impl_->refresh_state();
  return *this;
}
Trainer& Trainer::set_early_stopping(EarlyStopping& early_stopping) {
  impl_->early_stopping = &early_stopping;
  impl_->early_stop_state = std::make_unique<EarlyStoppingState>(early_stopping);
  impl_->refresh_state();
  return *this;
}
RngRegistry& Trainer::rng() noexcept { return impl_->rng; }
const Progress& Trainer::progress() const noexcept { return impl_->progress; }
const MetricsHistory& Trainer::history() const noexcept { return impl_->history; }
TrainingConfig Trainer::config() const { return impl_->config(); }

TrainingState& Trainer::state() {
  // Generators may have been added since the last refresh; the inventory and
  // the configuration must reflect the trainer as it is now.
  impl_->refresh_state();
  return impl_->state;
}

bool Trainer::finished() const {
  const Impl& t = *impl_;
  if (t.options.max_steps && t.progress.global_step >= *t.options.max_steps) return true;
  if (t.early_stopping && t.early_stopping->stopped()) return true;
  return t.progress.epoch >= t.options.max_epochs;
}

StepRecord Trainer::step() {
  Impl& t = *impl_;
  if (finished()) fail(ErrorCode::invalid_argument, "Trainer::step: the run is finished");
  StepRecord record;
  record.learning_rate = t.first_group_lr();
  double loss_sum = 0;
  std::int64_t micro_batches = 0;
  t.model.train();
  for (std::int64_t micro = 0; micro < t.options.gradient_accumulation; ++micro) {
    std::int64_t remaining = t.remaining();
    if (remaining == 0) {
      // The epoch is over. Its end is processed when the next batch is drawn,
      // so that a checkpoint taken after its last update resumes into it.
      if (micro > 0) break;  // an update never spans two epochs
      t.finish_epoch();
      if (finished()) fail(ErrorCode::invalid_argument, "Trainer::step: the run is finished");
      record.learning_rate = t.first_group_lr();
      remaining = t.remaining();
      if (remaining == 0) fail(ErrorCode::invalid_argument, "Trainer::step: the sampler yields no samples");
    }
    const std::vector<std::int64_t> ids = t.next_batch(remaining);
    if (ids.empty()) fail(ErrorCode::invalid_argument, "Trainer::step: the sampler yields no samples");
    record.epoch = t.progress.epoch;
    const at::Tensor index = at::tensor(ids, at::kLong);
    const at::Tensor outputs = t.forward(t.inputs.index_select(0, index));
    const at::Tensor loss = t.loss(outputs, t.targets.index_select(0, index));
    const at::Tensor scaled = loss / static_cast<double>(t.options.gradient_accumulation);
    (t.scaler ? t.scaler->scale(scaled) : scaled).backward();
    loss_sum += loss.item<double>();
    ++micro_batches;
    t.progress.samples_seen += static_cast<std::int64_t>(ids.size());
    record.sample_ids.insert(record.sample_ids.end(), ids.begin(), ids.end());
  }
  if (t.parallel.reduce_gradients) t.parallel.reduce_gradients(t.model);
  if (t.options.max_grad_norm) {
    if (t.scaler) t.scaler->unscale(t.optimizer);
    torch::nn::utils::clip_grad_norm_(t.model.parameters(), *t.options.max_grad_norm);
  }
  if (t.scaler) {
    record.optimizer_stepped = t.scaler->step(t.optimizer);
    t.scaler->update();
  } else {
    t.optimizer.step();
  }
  t.optimizer.zero_grad();
  if (t.scheduler && t.options.scheduler_cadence == SchedulerCadence::per_step) t.scheduler->step();

  t.progress.global_step += 1;
  t.progress.batch_in_epoch += 1;
  record.step = t.progress.global_step;
  record.loss = loss_sum / static_cast<double>(micro_batches);
  if (t.parallel.reduce_loss) record.loss = t.parallel.reduce_loss(record.loss);
  t.history.append(record.step, record.epoch, {{"loss", record.loss}, {"lr", record.learning_rate}});

  const bool epoch_done = t.remaining() == 0;
  if (t.parallel.checkpoints) {
    if (t.save_due(record, epoch_done)) t.parallel.checkpoints->save(t.generation(record));
  } else if (t.checkpoints) {
    t.checkpoints->maybe_save(t.generation(record), epoch_done, record.epoch + 1);
  } else if (t.save_due(record, epoch_done)) {
    if (t.options.checkpoint_path.empty()) {
      fail(ErrorCode::invalid_argument, "Trainer: a save cadence is set but checkpoint_path is empty");
    }
    CheckpointSaveOptions save_options;
    save_options.durable = t.options.checkpointing.run.durable;
    save_options.torch_1_13_compatible = t.options.checkpointing.torch_1_13_compatible;
    t.state.save(t.options.checkpoint_path, save_options);
  }
  return record;
}

FitOutcome Trainer::fit(const std::function<void(const StepRecord&)>& on_step) {
  Impl& t = *impl_;
  if (t.has_run() && !t.run_opened) resume();
  std::optional<PreemptionGuard> guard;
  if (t.options.handle_preemption_signals) guard.emplace();
  const auto save_now = [&] {
    if (t.parallel.checkpoints) {
      t.parallel.checkpoints->save(t.generation_after_last_step());
      t.parallel.checkpoints->wait();
      return;
    }
    if (!t.checkpoints) return;
    t.checkpoints->save(t.generation_after_last_step());
    t.checkpoints->wait();
  };
  // A preemption request, agreed by every process when parallel.
  const auto preempted = [&] {
    const bool local = guard && PreemptionGuard::requested();
    return t.parallel.agree_any ? t.parallel.agree_any(local) : local;
  };
  while (!finished()) {
    if (preempted()) {
      save_now();
      return FitOutcome::preempted;
    }
    // The last epoch's end is reached by drawing from an exhausted sampler.
    if (t.remaining() == 0) {
      t.finish_epoch();
      continue;
    }
    const StepRecord record = step();
    if (on_step) on_step(record);
  }
  if ((t.checkpoints || t.parallel.checkpoints) && t.progress.global_step > 0) save_now();
  return FitOutcome::finished;
}

std::optional<LoadReport> Trainer::resume() {
  Impl& t = *impl_;
  if (t.run_opened) fail(ErrorCode::save_invalid_request, "Trainer::resume: the run directory is open already");
  if (t.parallel.checkpoints) {
    t.refresh_state();
    t.run_opened = true;
    return t.parallel.checkpoints->resume();
  }
  if (t.options.run_directory.empty()) fail(ErrorCode::invalid_argument, "Trainer::resume: run_directory is not set");
  t.checkpoints = std::make_unique<CheckpointManager>(t.options.run_directory, state(), t.options.checkpointing);
  t.run_opened = true;
  return t.checkpoints->resume();
}

CheckpointManager* Trainer::checkpoints() noexcept { return impl_->checkpoints.get(); }

Trainer& Trainer::set_parallelism(TrainerParallelism parallelism, const TrainingEnvironment& environment) {
  Impl& t = *impl_;
  if (t.run_opened || t.progress.global_step > 0) {
    fail(ErrorCode::save_invalid_request, "Trainer::set_parallelism: call it before resume() and the first update");
  }
  if (parallelism.checkpoints && !t.options.run_directory.empty()) {
    fail(ErrorCode::invalid_argument,
         "Trainer::set_parallelism: TrainerOptions::run_directory is set; a parallel trainer's checkpoints go "
         "through TrainerParallelism::checkpoints");
  }
  if (parallelism.checkpoints && t.options.checkpointing.cadence.every_seconds > 0) {
    fail(ErrorCode::invalid_argument,
         "Trainer::set_parallelism: checkpointing.cadence.every_seconds would let the processes' clocks decide "
         "different saves; use every_steps or every_epochs");
  }
  t.parallel = std::move(parallelism);
  t.options.environment = environment;
  t.refresh_state();
  return *this;
}

}  // namespace holdpoint
