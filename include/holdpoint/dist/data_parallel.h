// Data-parallel training with the ready Trainer (holdpoint/trainer/trainer.h)
// over a c10d process group, checkpointed as a sharded run directory
// (docs/distributed.md, "The Trainer under torchrun").
//
// make_data_parallel(trainer, group, run) makes the trainer one rank of the
// group:
//   - after each update's backward passes, every parameter's gradient is
//     replaced by its mean over the ranks (one all-reduce of the gradients
//     packed in parameter order; a parameter without a gradient counts as
//     zeros), so every rank takes the same optimizer step;
//   - the update's mean loss is averaged too, so the history, a plateau
//     scheduler and early stopping agree on every rank;
//   - an epoch ends on every rank when any rank's sampler has run out (a
//     DistributedSampler's uneven tail is dropped);
//   - a preemption signal (TrainerOptions::handle_preemption_signals) that
//     reaches any rank stops every rank at the same step boundary, where they
//     save together and fit() returns FitOutcome::preempted on each;
//   - checkpoints are DistributedCheckpointer generations in `run`, at the
//     trainer's step and epoch cadence (TrainerOptions::checkpointing.cadence)
//     and at the end of fit(); fit() first resumes from LATEST on every rank,
//     so a program started again by torchrun after a failure continues with
//     no flag.
// The sampler must be the rank's own (a DistributedSampler of the group's
// world size and this rank). Replicated components: model, optimizer,
// schedulers, scaler, progress, early stopping, history; rank-local ones:
// sampler and rng (DistributedCheckpointOptions::rank_local).
//
// Determinism: with the same world size, the all-reduce sums in the same
// order on every run, so a run killed and resumed by torchrun ends with the
// model of one that ran straight through, bit for bit. With another world
// size the batches and the sums differ: the trainer resumes
// (DataParallelOptions::load.allow_world_size_change and the unqualified
// profile) but the trajectory is not the uninterrupted one's.
//
// Failure contract: what DistributedCheckpointer and the group throw
// (holdpoint::Error, c10::Error); make_data_parallel throws invalid_argument
// for a sampler of another world or rank, or a time-based save cadence.
//
// Thread-safety: one thread per rank drives the trainer.
#pragma once

#include <filesystem>
#include <memory>

#include "holdpoint/dist/distributed.h"
#include "holdpoint/trainer/trainer.h"

namespace holdpoint {

struct DataParallelOptions {
  DistributedCheckpointOptions checkpoints;
  // How resume() loads LATEST (world-size changes, trust, per-rank reads).
  DistributedLoadOptions load;
  // Saves in the background (DistributedCheckpointer::save_async; needs
  // checkpoints.background); fit() waits for the last one before it returns.
  bool asynchronous = false;
};

class DistributedSampler;

// Collective: every rank of `group` calls it with its own trainer, before
// the first update. Opens (and recovers) `run` on rank 0. Returns the
// checkpointer, which the trainer also holds.
DistributedCheckpointer& make_data_parallel(Trainer& trainer, const DistributedSampler& sampler,
                                            c10d::ProcessGroup& group, const std::filesystem::path& run,
                                            DataParallelOptions options = {});

}  // namespace holdpoint
