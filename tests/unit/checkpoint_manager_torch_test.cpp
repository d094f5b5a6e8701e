// CheckpointManager and the Trainer on a run directory: asynchronous saves
// hold the state of their step, a failed background save is raised at the
// next call and never moves LATEST, the cadence, preemption at a step
// boundary, and auto-resume from LATEST.
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <csignal>
#include <fstream>
#include <thread>

#include "holdpoint/base/signature.h"
#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/run/preemption.h"
#include "holdpoint/trainer/trainer.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/fault_file_system.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Opens a run to inspect it: nothing is recovered or changed.
RunDirectoryOptions inspect_only() {
  RunDirectoryOptions options;
  options.recover = false;
  return options;
}

using testing::FaultFileSystem;
using testing::FaultKind;
using testing::TempDir;

struct TrainRun {
  explicit TrainRun(std::uint64_t seed, const std::function<void(TrainerOptions&)>& customize = {})
      : order(at::detail::createCPUGenerator(seed + 1)) {
    at::manual_seed(99);
    x = at::randn({24, 3}, at::kDouble);
    y = x.sum(1, true);
    at::manual_seed(seed);
    model = torch::nn::Sequential(torch::nn::Linear(3, 16), torch::nn::Tanh(), torch::nn::Dropout(0.2),
                                  torch::nn::Linear(16, 1));
    model->to(at::kDouble);
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
    scheduler = std::make_unique<StepLR>(*optimizer, StepLROptions{.step_size = 5, .gamma = 0.5});
    sampler = std::make_unique<RandomSampler>(24, order);
    TrainerOptions options;
    options.semantic_identity = "manager-test";
    options.profile = ResumeProfile::cpu_shuffled_singleworker_v1;
    options.batch_size = 4;
    options.max_epochs = 4;
    options.loss_identity = "mse";
    if (customize) customize(options);
    trainer = std::make_unique<Trainer>(
        *model, [this](const at::Tensor& in) { return model->forward(in); }, *optimizer,
        [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
        x, y, *sampler, options);
    trainer->set_scheduler(*scheduler);
    trainer->rng().add("sampler", order);
  }

  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  }

  at::Tensor x, y;
  torch::nn::Sequential model{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<StepLR> scheduler;
  at::Generator order;
  std::unique_ptr<RandomSampler> sampler;
  std::unique_ptr<Trainer> trainer;
};

void expect_bit_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].equal(b[i])) << "parameter " << i;
}

GenerationSpec at_step(const Trainer& trainer) {
  GenerationSpec spec;
  spec.step = trainer.progress().global_step;
  spec.epoch = trainer.progress().epoch;
  return spec;
}

CheckpointManagerOptions quiet(bool asynchronous) {
  CheckpointManagerOptions options;
  options.asynchronous = asynchronous;
  options.run.log = [](const std::string&) {};
  return options;
}

// ---- signatures --------------------------------------------------------------------------

// A manager with a signing key signs each save (also in the background); one
// with a trust policy resumes the signed run, refuses another key's, and
// refuses a rolled-back LATEST, leaving the live model as it was.
TEST(CheckpointManager, SignsItsSavesAndResumesOnlyWhatTheTrustPolicyAccepts) {
  TempDir tmp;
  const auto key = std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::ed25519));
  TrustPolicy trust;
  trust.keys.push_back(key->verifying_key());
  TrainRun run(1);
  std::string latest_after_first;
  {
    CheckpointManagerOptions options = quiet(true);
    options.run.signing_key = key;
    CheckpointManager manager(tmp / "run", run.trainer->state(), options);
    for (int save = 0; save < 2; ++save) {
      for (int i = 0; i < 3; ++i) run.trainer->step();
      manager.save(at_step(*run.trainer));
      manager.wait();
      if (save == 0) latest_after_first = read_text(tmp / "run" / "LATEST");
    }
  }
  const auto saved = run.parameters();
  EXPECT_TRUE(std::filesystem::exists(tmp / "run" / "checkpoints" / (generation_name(6) + ".sig")));

  {
    TrainRun resumed(2);
    CheckpointManagerOptions options = quiet(false);
    options.run.trust = trust;
    CheckpointManager manager(tmp / "run", resumed.trainer->state(), options);
    ASSERT_TRUE(manager.resume());
    expect_bit_equal(resumed.parameters(), saved);
  }
  {
    TrainRun stranger_run(3);
    const auto before = stranger_run.parameters();
    CheckpointManagerOptions options = quiet(false);
    options.run.trust = TrustPolicy{};
    options.run.trust->keys.push_back(SigningKey::generate(SignatureAlgorithm::ed25519).verifying_key());
    CheckpointManager manager(tmp / "run", stranger_run.trainer->state(), options);
    EXPECT_ERROR_CODE(manager.resume(), ErrorCode::signature_key_unknown);
    expect_bit_equal(stranger_run.parameters(), before);
  }
  // LATEST put back to the first save: refused on opening, nothing removed.
  write_text(tmp / "run" / "LATEST", latest_after_first);
  TrainRun rolled(4);
  CheckpointManagerOptions options = quiet(false);
  options.run.trust = trust;
  EXPECT_ERROR_CODE(CheckpointManager(tmp / "run", rolled.trainer->state(), options), ErrorCode::signature_rollback);
  EXPECT_TRUE(std::filesystem::exists(tmp / "run" / "checkpoints" / generation_name(6)));
  // Read-only and resumed: the run-wide check refuses it too.
  options.run.recover = false;
  CheckpointManager reader(tmp / "run", rolled.trainer->state(), options);
  const auto before = rolled.parameters();
  EXPECT_ERROR_CODE(reader.resume(), ErrorCode::signature_rollback);
  expect_bit_equal(rolled.parameters(), before);
}

// ---- asynchronous saves ------------------------------------------------------------------

TEST(CheckpointManager, AnAsyncSaveHoldsTheStateOfItsStepWhileTrainingGoesOn) {
  TempDir tmp;
  TrainRun sync_run(1);
  for (int i = 0; i < 3; ++i) sync_run.trainer->step();
  CheckpointManager sync_manager(tmp / "sync", sync_run.trainer->state(), quiet(false));
  sync_manager.save(at_step(*sync_run.trainer));

  TrainRun async_run(1);
  for (int i = 0; i < 3; ++i) async_run.trainer->step();
  {
    CheckpointManager async_manager(tmp / "async", async_run.trainer->state(), quiet(true));
    const auto stats = async_manager.save(at_step(*async_run.trainer));
    ASSERT_TRUE(stats);
    EXPECT_TRUE(stats->asynchronous);
    EXPECT_GT(stats->staged_bytes, 0u);
    // Train on while the background thread writes: the file must not see it.
    for (int i = 0; i < 4; ++i) async_run.trainer->step();
    async_manager.wait();
    ASSERT_TRUE(async_manager.latest());
    EXPECT_EQ(async_manager.latest()->step, 3);
    EXPECT_EQ(async_manager.latest()->sha256, sync_manager.latest()->sha256)
        << "the async file is byte-identical to a synchronous save of the same step";
  }

  // And it resumes the exact trajectory.
  TrainRun resumed(77);
  CheckpointManager reader(tmp / "async", resumed.trainer->state(), quiet(false));
  ASSERT_TRUE(reader.resume());
  for (int i = 0; i < 4; ++i) resumed.trainer->step();
  expect_bit_equal(resumed.parameters(), async_run.parameters());
}

TEST(CheckpointManager, StagingMemoryIsReusedFromTheSecondSaveOn) {
  TempDir tmp;
  TrainRun run(2);
  CheckpointManager manager(tmp / "run", run.trainer->state(), quiet(true));
  std::vector<SaveStats> stats;
  for (int i = 0; i < 3; ++i) {
    run.trainer->step();
    stats.push_back(*manager.save(at_step(*run.trainer)));
  }
  manager.wait();
  EXPECT_FALSE(stats[0].staging_reused);
  EXPECT_TRUE(stats[1].staging_reused);
  EXPECT_TRUE(stats[2].staging_reused);
  EXPECT_EQ(manager.generations().size(), 3u);
}

TEST(CheckpointManager, ReservedStagingMakesTheFirstSaveReuseIt) {
  TempDir tmp;
  TrainRun run(17);
  CheckpointManager manager(tmp / "run", run.trainer->state(), quiet(true));
  run.trainer->step();  // Adam creates its state here
  manager.reserve_staging();
  run.trainer->step();
  const auto stats = manager.save(at_step(*run.trainer));
  manager.wait();
  EXPECT_TRUE(stats->staging_reused);
  EXPECT_EQ(manager.latest()->step, 2);

  // Reserving by size works before any step.
  TrainRun fresh(18);
  CheckpointManager sized(tmp / "sized", fresh.trainer->state(), quiet(true));
  sized.reserve_staging(1 << 20);
  fresh.trainer->step();
  EXPECT_TRUE(sized.save(at_step(*fresh.trainer))->staging_reused);
  sized.wait();
}

TEST(CheckpointManager, AtMostOneSaveIsInFlightAndTheNextOneWaitsForIt) {
  TempDir tmp;
  TrainRun run(3);
  std::vector<std::string> log;
  CheckpointManagerOptions options = quiet(true);
  options.run.log = [&](const std::string& line) { log.push_back(line); };
  CheckpointManager manager(tmp / "run", run.trainer->state(), options);
  run.trainer->step();
  manager.save(at_step(*run.trainer));
  const bool first_in_flight = manager.in_flight();
  run.trainer->step();
  const auto second = manager.save(at_step(*run.trainer));
  manager.wait();
  EXPECT_FALSE(manager.in_flight());
  EXPECT_EQ(manager.generations().size(), 2u);
  ASSERT_TRUE(first_in_flight) << "a save returns before its file is written";
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("waits for the save of step 1"), std::string::npos) << log[0];
  EXPECT_GE(second->waited_seconds, 0.0);
}

TEST(CheckpointManager, AFailedBackgroundSaveIsRaisedAtTheNextCallAndNeverMovesLatest) {
  FaultFileSystem fs;
  TrainRun run(4);
  CheckpointManagerOptions options = quiet(true);
  options.run.file_system = &fs;
  CheckpointManager manager("/run", run.trainer->state(), options);
  run.trainer->step();
  manager.save(at_step(*run.trainer));
  manager.wait();
  const std::string latest_before = fs.contents("/run/LATEST");

  run.trainer->step();
  fs.reset_counter();
  fs.fail_at(3, FaultKind::no_space, true);
  ASSERT_TRUE(manager.save(at_step(*run.trainer)));  // returns: the failure happens in the background
  run.trainer->step();
  try {
    manager.wait();
    FAIL() << "the background failure must be raised";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::io_write_failed);
    EXPECT_NE(std::string(error.what()).find("background save of step 2"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("No space left on device"), std::string::npos) << error.what();
  }
  EXPECT_EQ(fs.contents("/run/LATEST"), latest_before);
  EXPECT_EQ(manager.latest()->step, 1);
  EXPECT_NO_THROW(manager.wait()) << "an error is raised once";

  // Space is back: the next save goes through and retention works again.
  fs.clear_faults();
  ASSERT_TRUE(manager.save(at_step(*run.trainer)));
  manager.wait();
  EXPECT_EQ(manager.latest()->step, 3);
}

TEST(CheckpointManager, TheFailureIsRaisedByTheNextMaybeSaveEvenWhenNoSaveIsDue) {
  FaultFileSystem fs;
  TrainRun run(5);
  CheckpointManagerOptions options = quiet(true);
  options.run.file_system = &fs;
  options.cadence.every_steps = 100;
  CheckpointManager manager("/run", run.trainer->state(), options);
  run.trainer->step();
  fs.fail_at(1, FaultKind::io_error, true);
  manager.save(at_step(*run.trainer));
  // Wait for the worker to finish without joining it.
  for (int i = 0; i < 2000 && manager.in_flight(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    try {
      run.trainer->step();
      manager.maybe_save(at_step(*run.trainer), false, 0);
    } catch (const Error& error) {
      EXPECT_TRUE(error_code_name(error.code()).starts_with("io_")) << error.what();
      EXPECT_NE(std::string(error.what()).find("Input/output error"), std::string::npos) << error.what();
      return;
    }
  }
  FAIL() << "maybe_save never raised the background failure";
}

TEST(CheckpointManager, ASynchronousSaveFailureLeavesLatestAndThrowsAtOnce) {
  FaultFileSystem fs;
  TrainRun run(6);
  CheckpointManagerOptions options = quiet(false);
  options.run.file_system = &fs;
  CheckpointManager manager("/run", run.trainer->state(), options);
  run.trainer->step();
  manager.save(at_step(*run.trainer));
  run.trainer->step();
  fs.fail_at(2, FaultKind::quota_exceeded, true);
  try {
    manager.save(at_step(*run.trainer));
    FAIL() << "a synchronous save throws its failure at once";
  } catch (const Error& error) {
    EXPECT_TRUE(error_code_name(error.code()).starts_with("io_")) << error.what();
    EXPECT_NE(std::string(error.what()).find("Disk quota exceeded"), std::string::npos) << error.what();
  }
  EXPECT_EQ(manager.latest()->step, 1);
}

TEST(CheckpointManager, Torch113CompatibleSavesOfAWholeStateRoundTrip) {
  TempDir tmp;
  TrainRun run(19);
  CheckpointManagerOptions options = quiet(false);
  options.torch_1_13_compatible = true;  // floats (learning rates, betas) become 0-d tensors
  {
    CheckpointManager manager(tmp / "run", run.trainer->state(), options);
    run.trainer->step();
    ASSERT_TRUE(manager.save(at_step(*run.trainer)));
  }
  TrainRun resumed(99);
  CheckpointManager reader(tmp / "run", resumed.trainer->state(), quiet(false));
  ASSERT_TRUE(reader.resume());
  expect_bit_equal(resumed.parameters(), run.parameters());
}

TEST(CheckpointManager, ASaveOfTheStepLatestHoldsIsSkipped) {
  TempDir tmp;
  TrainRun run(7);
  CheckpointManager manager(tmp / "run", run.trainer->state(), quiet(false));
  run.trainer->step();
  EXPECT_TRUE(manager.save(at_step(*run.trainer)));
  EXPECT_FALSE(manager.save(at_step(*run.trainer)));
  EXPECT_EQ(manager.generations().size(), 1u);
}

// ---- cadence --------------------------------------------------------------------------------

TEST(CheckpointManager, CadenceBySteps) {
  TempDir tmp;
  TrainRun run(8);
  CheckpointManagerOptions options = quiet(false);
  options.cadence.every_steps = 3;
  CheckpointManager manager(tmp / "run", run.trainer->state(), options);
  EXPECT_FALSE(manager.due(1, false, 0));
  EXPECT_FALSE(manager.due(2, false, 0));
  EXPECT_TRUE(manager.due(3, false, 0));
  EXPECT_TRUE(manager.due(6, true, 1));
  EXPECT_FALSE(manager.due(0, false, 0));
}

TEST(CheckpointManager, CadenceByEpochs) {
  TempDir tmp;
  TrainRun run(9);
  CheckpointManagerOptions options = quiet(false);
  options.cadence.every_epochs = 2;
  CheckpointManager manager(tmp / "run", run.trainer->state(), options);
  EXPECT_FALSE(manager.due(6, true, 1));
  EXPECT_TRUE(manager.due(12, true, 2));
  EXPECT_FALSE(manager.due(13, false, 2)) << "only at the end of an epoch";
  EXPECT_TRUE(manager.due(24, true, 4));
}

TEST(CheckpointManager, CadenceByTime) {
  TempDir tmp;
  TrainRun run(10);
  CheckpointManagerOptions options = quiet(false);
  options.cadence.every_seconds = 0.05;
  CheckpointManager manager(tmp / "run", run.trainer->state(), options);
  EXPECT_FALSE(manager.due(1, false, 0));
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_TRUE(manager.due(1, false, 0));
  run.trainer->step();
  manager.save(at_step(*run.trainer));
  EXPECT_FALSE(manager.due(2, false, 0)) << "the clock restarts at each save";
}

TEST(Trainer, RunDirectoryCadenceSavesGenerations) {
  TempDir tmp;
  TrainRun run(11, [&](TrainerOptions& o) {
    o.run_directory = tmp / "run";
    o.max_steps = 10;
    o.checkpointing = quiet(true);
    o.checkpointing.cadence.every_steps = 4;
  });
  EXPECT_EQ(run.trainer->fit(), FitOutcome::finished);
  std::vector<std::int64_t> steps;
  for (const auto& g : RunDirectory(tmp / "run", inspect_only()).generations()) steps.push_back(g.step);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{4, 8, 10})) << "cadence saves, then the final state";
  const auto latest = RunDirectory(tmp / "run", inspect_only()).latest();
  EXPECT_EQ(latest->metric("loss").has_value(), true);
}

// ---- auto-resume and preemption ---------------------------------------------------------------

TEST(Trainer, AutoResumesFromLatestAndContinuesTheExactTrajectory) {
  TempDir tmp;
  TrainRun continuous(12, [](TrainerOptions& o) { o.max_steps = 14; });
  continuous.trainer->fit();

  TrainRun first(12, [&](TrainerOptions& o) {
    o.max_steps = 9;
    o.run_directory = tmp / "run";
    o.checkpointing = quiet(false);
  });
  EXPECT_FALSE(first.trainer->checkpoints());
  first.trainer->fit();
  EXPECT_EQ(RunDirectory(tmp / "run", inspect_only()).latest()->step, 9);
  EXPECT_ERROR_CODE(RunDirectory(tmp / "run", {}), ErrorCode::run_directory_locked);  // the trainer holds the run
  first.trainer.reset();  // the process ends

  TrainRun second(500, [&](TrainerOptions& o) {  // other seeds: everything must come from LATEST
    o.max_steps = 14;
    o.run_directory = tmp / "run";
    o.checkpointing = quiet(false);
  });
  EXPECT_EQ(second.trainer->fit(), FitOutcome::finished);
  EXPECT_EQ(second.trainer->progress().global_step, 14);
  expect_bit_equal(second.parameters(), continuous.parameters());
  EXPECT_EQ(RunDirectory(tmp / "run", inspect_only()).latest()->step, 14);
}

TEST(Trainer, AFreshRunDirectoryStartsFromScratch) {
  TempDir tmp;
  TrainRun run(13, [&](TrainerOptions& o) {
    o.max_steps = 2;
    o.run_directory = tmp / "run";
    o.checkpointing = quiet(false);
  });
  EXPECT_FALSE(run.trainer->resume());
  EXPECT_ERROR_CODE(run.trainer->resume(), ErrorCode::save_invalid_request);
  EXPECT_EQ(run.trainer->fit(), FitOutcome::finished);
}

TEST(Trainer, APreemptionSignalSavesAtTheNextStepBoundaryAndReturns) {
  TempDir tmp;
  TrainRun continuous(14, [](TrainerOptions& o) { o.max_steps = 12; });
  continuous.trainer->fit();

  TrainRun preempted(14, [&](TrainerOptions& o) {
    o.max_steps = 12;
    o.run_directory = tmp / "run";
    o.handle_preemption_signals = true;
    o.checkpointing = quiet(true);
  });
  const FitOutcome outcome = preempted.trainer->fit([](const StepRecord& record) {
    if (record.step == 5) std::raise(SIGTERM);  // handled by the guard, not fatal
  });
  EXPECT_EQ(outcome, FitOutcome::preempted);
  EXPECT_EQ(PreemptionGuard::signal(), SIGTERM);
  EXPECT_EQ(preempted.trainer->progress().global_step, 5);
  EXPECT_EQ(RunDirectory(tmp / "run", inspect_only()).latest()->step, 5);
  PreemptionGuard::reset();
  preempted.trainer.reset();  // the process exits (kExitPreempted)

  TrainRun restarted(900, [&](TrainerOptions& o) {
    o.max_steps = 12;
    o.run_directory = tmp / "run";
    o.handle_preemption_signals = true;
    o.checkpointing = quiet(true);
  });
  EXPECT_EQ(restarted.trainer->fit(), FitOutcome::finished);
  expect_bit_equal(restarted.parameters(), continuous.parameters());
}

TEST(CheckpointManager, ARunWhoseGenerationsAreAllDamagedIsNotRestartedFromScratch) {
  TempDir tmp;
  {
    TrainRun run(15);
    CheckpointManager manager(tmp / "run", run.trainer->state(), quiet(false));
    run.trainer->step();
    manager.save(at_step(*run.trainer));
  }
  std::ofstream(tmp / "run" / "checkpoints" / "step-00000001.pt", std::ios::binary | std::ios::trunc) << "torn";
  TrainRun restarted(15, [&](TrainerOptions& o) {
    o.run_directory = tmp / "run";
    o.checkpointing = quiet(false);
  });
  EXPECT_ERROR_CODE(restarted.trainer->fit(), ErrorCode::run_no_generation);
  EXPECT_EQ(restarted.trainer->progress().global_step, 0);
}

TEST(CheckpointManager, ARunWhoseCheckpointsVanishedIsNotRestartedFromScratch) {
  TempDir tmp;
  {
    TrainRun run(16);
    CheckpointManager manager(tmp / "run", run.trainer->state(), quiet(false));
    run.trainer->step();
    manager.save(at_step(*run.trainer));
  }
  std::filesystem::remove_all(tmp / "run" / "checkpoints");
  TrainRun restarted(16);
  CheckpointManager manager(tmp / "run", restarted.trainer->state(), quiet(false));
  EXPECT_ERROR_CODE(manager.resume(), ErrorCode::run_no_generation);
}

TEST(PreemptionGuard, OnlyOneGuardAtATimeAndHandlersAreRestored) {
  {
    PreemptionGuard guard;
    EXPECT_ERROR_CODE(PreemptionGuard(), ErrorCode::save_invalid_request);
    EXPECT_FALSE(PreemptionGuard::requested());
    std::raise(SIGUSR1);
    EXPECT_TRUE(PreemptionGuard::requested());
    EXPECT_EQ(PreemptionGuard::signal(), SIGUSR1);
    PreemptionGuard::reset();
  }
  struct sigaction current {};
  ::sigaction(SIGTERM, nullptr, &current);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
  PreemptionGuard again;  // a new guard may follow
  EXPECT_FALSE(PreemptionGuard::requested());
}

}  // namespace
}  // namespace holdpoint
