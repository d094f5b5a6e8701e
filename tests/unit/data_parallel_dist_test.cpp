// The Trainer as one rank of a data-parallel job (make_data_parallel): every
// rank takes the same optimizer steps, epochs end together on uneven shards,
// and a run stopped and resumed from its sharded run directory ends with the
// model of one that ran straight through, bit for bit.
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <mutex>
#include <unistd.h>

#include "holdpoint/dist/data_parallel.h"
#include "holdpoint/run/preemption.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/state/sampler.h"
#include "support/rank_threads.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::error_of;
using testing::expect_all_ok;
using testing::run_ranks;

// One rank's trainer over a fixed dataset of `rows` rows.
struct Rank {
  Rank(std::int64_t rank, std::int64_t world, std::int64_t rows, std::int64_t max_steps,
       std::int64_t save_every = 3) {
    // Initial weights from the process-wide generator, which the rank threads share.
    static std::mutex init;
    {
      const std::lock_guard<std::mutex> lock(init);
      at::manual_seed(7);
      model = torch::nn::Sequential(torch::nn::Linear(2, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
      model->to(at::kDouble);
    }
    x = at::arange(0, rows * 2, at::kDouble).reshape({rows, 2}).div_(static_cast<double>(rows)).sin_();
    y = x.sum(1, true).cos_();
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.02));
    scheduler = std::make_unique<StepLR>(*optimizer, StepLROptions{.step_size = 4, .gamma = 0.5});
    sampler = std::make_unique<DistributedSampler>(rows, 11, world, rank);
    TrainerOptions options;
    options.semantic_identity = "data-parallel-test";
    options.batch_size = 2;
    options.max_epochs = 100;
    options.max_steps = max_steps;
    options.loss_identity = "mse";
    options.checkpointing.cadence.every_steps = save_every;
    trainer = std::make_unique<Trainer>(
        *model, [this](const at::Tensor& in) { return model->forward(in); }, *optimizer,
        [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
        x, y, *sampler, options);
    trainer->set_scheduler(*scheduler);
  }

  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  }

  torch::nn::Sequential model{nullptr};
  at::Tensor x, y;
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<StepLR> scheduler;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<Trainer> trainer;
};

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

class DataParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("holdpoint-dp-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Trains `world` ranks to `steps` in `run`, resuming from its LATEST;
  // returns each rank's final parameters and loss history.
  struct Outcome {
    std::vector<std::vector<at::Tensor>> parameters;
    std::vector<std::vector<double>> losses;
    std::vector<std::int64_t> resumed_from;  // the step each rank resumed at (0: fresh)
    std::vector<std::int64_t> epochs;
  };
  Outcome train(const std::filesystem::path& run, int world, std::int64_t rows, std::int64_t steps,
                DataParallelOptions options = {}) {
    Outcome out;
    out.parameters.resize(static_cast<std::size_t>(world));
    out.losses.resize(out.parameters.size());
    out.resumed_from.resize(out.parameters.size());
    out.epochs.resize(out.parameters.size());
    expect_all_ok(run_ranks(world, [&](std::int64_t rank, c10d::ProcessGroup& group) {
      Rank r(rank, world, rows, steps);
      make_data_parallel(*r.trainer, *r.sampler, group, run, options);
      const auto slot = static_cast<std::size_t>(rank);
      const auto report = r.trainer->resume();
      out.resumed_from[slot] = report ? r.trainer->progress().global_step : 0;
      EXPECT_EQ(r.trainer->fit(), FitOutcome::finished);
      out.parameters[slot] = r.parameters();
      for (const auto& record : r.trainer->history().records()) {
        for (const auto& [name, value] : record.metrics) {
          if (name == "loss") out.losses[slot].push_back(value);
        }
      }
      out.epochs[slot] = r.trainer->progress().epoch;
    }));
    return out;
  }

  std::filesystem::path root_;
};

TEST_F(DataParallel, RanksTakeTheSameStepsAndAResumedRunEndsBitIdentical) {
  const Outcome straight = train(root_ / "straight", 2, 24, 14);
  ASSERT_EQ(straight.parameters.size(), 2u);
  EXPECT_TRUE(same(straight.parameters[0], straight.parameters[1])) << "the ranks' models differ";
  EXPECT_EQ(straight.losses[0], straight.losses[1]) << "the ranks' loss histories differ";
  EXPECT_EQ(straight.losses[0].size(), 14u);
  EXPECT_EQ(straight.resumed_from[0], 0);

  // Stopped at step 8 (its last save), then started again with the target 14: it resumes at 8.
  train(root_ / "stopped", 2, 24, 8);
  EXPECT_TRUE(std::filesystem::exists(root_ / "stopped" / "checkpoints" / "step-00000008.shards"));
  const Outcome resumed = train(root_ / "stopped", 2, 24, 14);
  EXPECT_EQ(resumed.resumed_from[0], 8);
  EXPECT_EQ(resumed.resumed_from[1], 8);
  EXPECT_TRUE(same(resumed.parameters[0], straight.parameters[0])) << "the resumed run left the trajectory";
  EXPECT_TRUE(same(resumed.parameters[1], straight.parameters[1]));
  EXPECT_EQ(resumed.losses[0], straight.losses[0]);
}

// The trainer's model differs from a single process's: gradients are averaged.
TEST_F(DataParallel, GradientsAreAveragedOverTheRanks) {
  const Outcome two = train(root_ / "two", 2, 24, 4);
  const Outcome one = train(root_ / "one", 1, 24, 4);
  EXPECT_FALSE(same(two.parameters[0], one.parameters[0]));
  // The first update's loss is the mean of the ranks' losses on their own rows.
  EXPECT_NE(two.losses[0][0], one.losses[0][0]);
}

// 11 rows over 2 ranks: 6 and 5. With batches of 2 the ranks run out at
// different updates; every epoch still ends on both at the same step.
TEST_F(DataParallel, UnevenShardsEndEachEpochOnEveryRankTogether) {
  const Outcome out = train(root_ / "uneven", 2, 11, 9);
  EXPECT_EQ(out.epochs[0], out.epochs[1]);
  EXPECT_EQ(out.losses[0], out.losses[1]);
  // 3 updates an epoch (the least rank's 5 rows in batches of 2), so step 9 closes epoch 2.
  EXPECT_EQ(out.epochs[0], 2);
  EXPECT_TRUE(same(out.parameters[0], out.parameters[1]));
}

TEST_F(DataParallel, AChangedWorldSizeResumesWhenAllowed) {
  train(root_ / "run", 2, 24, 6);
  // Refused by default: the world size is part of the checkpoint.
  const auto errors = run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    Rank r(rank, 1, 24, 9);
    make_data_parallel(*r.trainer, *r.sampler, group, root_ / "run");
    r.trainer->fit();
  });
  ASSERT_TRUE(error_of(errors[0]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::distributed_world_size_changed);
  DataParallelOptions options;
  options.load.allow_world_size_change = true;
  const Outcome one = train(root_ / "run", 1, 24, 9, options);
  EXPECT_EQ(one.resumed_from[0], 6);
  EXPECT_EQ(one.losses[0].size(), 9u);
}

// A preemption signal reaches the processes at different moments; the ranks
// agree on it at every step boundary, so they stop at the same step and save
// it together. Here only rank 0 installs the handler and asks for a stop after
// step 3; rank 1 stops there too, and the run resumes onto the straight
// trajectory.
TEST_F(DataParallel, APreemptionSeenByOneRankStopsEveryRankAtTheSameStep) {
  const Outcome straight = train(root_ / "straight", 2, 24, 10);
  std::vector<std::int64_t> stopped_at(2, -1);
  std::vector<FitOutcome> outcomes(2, FitOutcome::finished);
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    Rank r(rank, 2, 24, 10, /*save_every=*/100);
    if (rank == 0) {
      // The only guard of the process; rank 1 learns of the request through the agreement alone.
      TrainerOptions options;
      options.batch_size = 2;
      options.max_epochs = 100;
      options.max_steps = 10;
      options.semantic_identity = "data-parallel-test";
      options.loss_identity = "mse";
      options.checkpointing.cadence.every_steps = 100;
      options.handle_preemption_signals = true;
      r.trainer = std::make_unique<Trainer>(
          *r.model, [&r](const at::Tensor& in) { return r.model->forward(in); }, *r.optimizer,
          [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
          r.x, r.y, *r.sampler, options);
      r.trainer->set_scheduler(*r.scheduler);
    }
    make_data_parallel(*r.trainer, *r.sampler, group, root_ / "preempted");
    const auto slot = static_cast<std::size_t>(rank);
    outcomes[slot] = r.trainer->fit([&](const StepRecord& record) {
      if (rank == 0 && record.step == 3) PreemptionGuard::request(SIGTERM);
    });
    stopped_at[slot] = r.trainer->progress().global_step;
  }));
  PreemptionGuard::reset();
  EXPECT_EQ(outcomes[0], FitOutcome::preempted);
  EXPECT_EQ(outcomes[1], FitOutcome::preempted);
  EXPECT_EQ(stopped_at[0], 3);
  EXPECT_EQ(stopped_at[1], 3);
  EXPECT_TRUE(std::filesystem::exists(root_ / "preempted" / "checkpoints" / "step-00000003.shards"));
  const Outcome resumed = train(root_ / "preempted", 2, 24, 10);
  EXPECT_EQ(resumed.resumed_from[0], 3);
  EXPECT_TRUE(same(resumed.parameters[0], straight.parameters[0])) << "the preempted run left the trajectory";
}

TEST_F(DataParallel, RefusesASamplerOfAnotherRankOrATimedCadence) {
  const auto errors = run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    Rank r(rank, 1, 24, 4);
    DistributedSampler other(24, 11, 2, 1);
    make_data_parallel(*r.trainer, other, group, root_ / "a");
  });
  ASSERT_TRUE(error_of(errors[0]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::invalid_argument);
  EXPECT_NE(error_of(errors[0])->detail().find("rank 1 of 2"), std::string::npos) << error_of(errors[0])->detail();

  const auto timed = run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    Rank r(rank, 1, 24, 4);
    // A cadence by the clock would let the ranks decide different saves.
    TrainerOptions options;
    options.checkpointing.cadence.every_seconds = 5;
    Trainer timed_trainer(*r.model, [&](const at::Tensor& in) { return r.model->forward(in); }, *r.optimizer,
                          [](const at::Tensor& out, const at::Tensor& t) { return (out - t).pow(2).mean(); }, r.x,
                          r.y, *r.sampler, options);
    make_data_parallel(timed_trainer, *r.sampler, group, root_ / "b");
  });
  ASSERT_TRUE(error_of(timed[0]));
  EXPECT_EQ(error_of(timed[0])->code(), ErrorCode::invalid_argument);
  EXPECT_NE(error_of(timed[0])->detail().find("every_seconds"), std::string::npos);
}

}  // namespace
}  // namespace holdpoint
