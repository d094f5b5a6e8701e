// The Trainer end to end: every registered component survives a resume, and
// every way a load can be refused leaves the model, optimizer, scheduler,
// scaler, generators, sampler, counters, early stopping and history
// bit-identical (the poison tests of the resume contract).
#include <ATen/ops/randn.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <random>

#include "holdpoint/state/grad_scaler.h"
#include "holdpoint/state/lr_scheduler.h"
#include "holdpoint/trainer/trainer.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// A complete run: model with dropout, Adam, StepLR, a loss scaler, early
// stopping, a shuffling sampler with its own generator, and a std::mt19937
// the "data augmentation" draws from.
struct TrainingRun {
  // `seed` drives every generator and the initial weights; the data are the
  // same for every run (they are not part of a checkpoint). `customize`
  // changes the options after the defaults below.
  explicit TrainingRun(std::uint64_t seed, const std::function<void(TrainerOptions&)>& customize = {})
      : order(at::detail::createCPUGenerator(seed + 1)) {
    at::manual_seed(1234);
    x = at::randn({24, 2}, at::kDouble);
    y = x.sum(1, true);
    at::manual_seed(seed);
    model = torch::nn::Sequential(torch::nn::Linear(2, 6), torch::nn::Tanh(), torch::nn::Dropout(0.2),
                                  torch::nn::Linear(6, 1));
    model->to(at::kDouble);
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
    scheduler = std::make_unique<StepLR>(*optimizer, StepLROptions{.step_size = 4, .gamma = 0.5});
    sampler = std::make_unique<RandomSampler>(24, order);
    augment.seed(seed + 2);
    TrainerOptions options;
    options.semantic_identity = "trainer-test";
    options.profile = ResumeProfile::cpu_shuffled_singleworker_v1;
    options.batch_size = 4;
    options.max_epochs = 5;
    options.loss_identity = "mse";
    if (customize) customize(options);
    trainer = std::make_unique<Trainer>(
        *model,
        [this](const at::Tensor& in) {
          // Noise from a registered std::mt19937, so its state matters too.
          std::normal_distribution<double> noise(0.0, 0.01);
          return model->forward(in + noise(augment));
        },
        *optimizer,
        [](const at::Tensor& out, const at::Tensor& target) { return torch::nn::functional::mse_loss(out, target); },
        x, y, *sampler, options);
    trainer->set_scheduler(*scheduler).set_scaler(scaler).set_early_stopping(early_stopping);
    trainer->rng().add("sampler", order);
    trainer->rng().add("augment", augment);
  }

  // Every component's state, plus the next draws of every generator (taken
  // from copies, so the live generators are not advanced).
  Value snapshot() {
    Dict all;
    TrainingState& state = trainer->state();
    for (const char* name : {"model", "optimizer", "scheduler", "scaler", "progress", "early_stop", "history",
                             "sampler", "rng"}) {
      all.insert(name, state.component(name)->capture(CaptureMode::copy));
    }
    return Value::dict(std::move(all));
  }

  at::Tensor x, y;
  torch::nn::Sequential model{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<StepLR> scheduler;
  GradScaler scaler{GradScalerOptions{.init_scale = 1024.0}};
  EarlyStopping early_stopping{EarlyStoppingMode::min, 3};
  at::Generator order;
  std::unique_ptr<RandomSampler> sampler;
  std::mt19937 augment;
  std::unique_ptr<Trainer> trainer;
};

std::vector<StepRecord> steps(TrainingRun& run, int n) {
  std::vector<StepRecord> records;
  for (int i = 0; i < n; ++i) records.push_back(run.trainer->step());
  return records;
}

void expect_same_records(const std::vector<StepRecord>& a, const std::vector<StepRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step);
    EXPECT_EQ(a[i].sample_ids, b[i].sample_ids) << "step " << a[i].step;
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << a[i].step;
    EXPECT_EQ(a[i].learning_rate, b[i].learning_rate) << "step " << a[i].step;
  }
}

TEST(Trainer, ResumeMidEpochContinuesTheExactTrajectory) {
  TempDir dir;
  TrainingRun continuous(1);
  const auto all = steps(continuous, 14);

  TrainingRun first(1);
  const auto head = steps(first, 7);  // mid-epoch 1 (6 batches per epoch)
  first.trainer->state().save(dir / "cut.pt");

  TrainingRun second(50);  // different seeds everywhere: everything must come from the file
  const LoadReport report = second.trainer->state().load_checkpoint(dir / "cut.pt");
  EXPECT_EQ(report.profile, "cpu-shuffled-singleworker-v1");
  EXPECT_EQ(second.trainer->progress().global_step, 7);
  const auto tail = steps(second, 7);
  std::vector<StepRecord> joined = head;
  joined.insert(joined.end(), tail.begin(), tail.end());
  expect_same_records(all, joined);
  EXPECT_EQ(describe_difference(continuous.snapshot(), second.snapshot()), "");
}

TEST(Trainer, ConfigIdentityCoversTheRunsSettings) {
  TrainingRun run(1);
  const TrainingConfig config = run.trainer->config();
  for (const char* field : {"model_schema", "optimizer", "batch", "loss", "gradient_accumulation", "gradient_clipping",
                            "precision", "device", "scheduler", "scaler", "early_stopping"}) {
    EXPECT_TRUE(config.load_bearing_fields().find(field)) << field;
  }
  EXPECT_EQ(config.max_epochs(), 5);
  EXPECT_EQ(config.load_bearing_fields().at("precision").as_string(), "Double");
}

// ---- poison tests --------------------------------------------------------------------------

class TrainerPoison : public ::testing::Test {
 protected:
  void SetUp() override {
    TrainingRun source(1);
    steps(source, 7);
    source.trainer->state().save(dir.path() / "ckpt.pt");
  }

  // A fresh run that trained a little (so every component holds real state),
  // then is asked to load `path` and must refuse with `code`, unchanged.
  void expect_refused(const std::filesystem::path& path, ErrorCode code,
                      const std::function<void(TrainingRun&)>& prepare = {},
                      const std::function<void(TrainerOptions&)>& options = {}) {
    TrainingRun target(99, options);
    steps(target, 3);
    if (prepare) prepare(target);
    // The snapshot includes every generator's state (the "rng" component).
    const Value before = target.snapshot();
    EXPECT_ERROR_CODE(target.trainer->state().load_checkpoint(path), code);
    EXPECT_EQ(describe_difference(before, target.snapshot()), "") << "a refused load changed the live state";
  }

  std::filesystem::path edited(const std::string& name, const std::function<void(Dict&)>& edit) {
    LoadedMapping mapping = load_checkpoint_mapping(dir.path() / "ckpt.pt");
    Dict root = mapping.root.as_dict();
    edit(root);
    save_mapping(dir.path() / name, Value::dict(std::move(root)));
    return dir.path() / name;
  }

  TempDir dir;
};

TEST_F(TrainerPoison, DriftedFieldsAreRefused) {
  const std::vector<std::function<void(TrainerOptions&)>> drifts = {
      [](TrainerOptions& o) { o.batch_size = 6; },
      [](TrainerOptions& o) { o.gradient_accumulation = 2; },
      [](TrainerOptions& o) { o.max_grad_norm = 1.0; },
      [](TrainerOptions& o) { o.loss_identity = "l1"; },
      [](TrainerOptions& o) { o.max_epochs = 3; },  // max_epochs may grow, not shrink
      [](TrainerOptions& o) { o.config.load_bearing("seed", Value::integer(5)); },
      [](TrainerOptions& o) { o.scheduler_cadence = SchedulerCadence::per_epoch; },
      [](TrainerOptions& o) { o.semantic_identity = "another-run"; },
  };
  for (std::size_t i = 0; i < drifts.size(); ++i) {
    SCOPED_TRACE(i);
    expect_refused(dir.path() / "ckpt.pt", ErrorCode::config_drift, {}, drifts[i]);
  }
}

TEST_F(TrainerPoison, ManifestDamageIsRefused) {
  expect_refused(edited("missing.pt",
                        [](Dict& root) {
                          Dict m;
                          for (const auto& [k, v] : root.at("holdpoint").as_dict()) {
                            if (k.as_string() != "versions") m.insert(k, v);
                          }
                          root.insert_or_assign("holdpoint", Value::dict(m));
                        }),
                 ErrorCode::schema_field_missing);
  expect_refused(edited("unknown.pt",
                        [](Dict& root) {
                          Dict m = root.at("holdpoint").as_dict();
                          m.insert("signature", Value::string("none"));
                          root.insert_or_assign("holdpoint", Value::dict(m));
                        }),
                 ErrorCode::schema_field_unknown);
}

TEST_F(TrainerPoison, TamperedStateIsCaughtByItsDigest) {
  for (const char* component : {"optimizer", "sampler", "rng", "scheduler"}) {
    SCOPED_TRACE(component);
    expect_refused(edited(std::string("tampered_") + component + ".pt",
                          [&](Dict& root) {
                            // Any change to a component's content: replace it by
                            // its state from another, valid run.
                            TrainingRun other(5);
                            steps(other, 2);
                            root.insert_or_assign(component,
                                                  other.trainer->state().component(component)->capture(CaptureMode::copy));
                          }),
                   ErrorCode::component_digest_mismatch);
  }
}

TEST_F(TrainerPoison, AnotherModelShapeIsDriftOfTheModelSchema) {
  // The model schema (names, dtypes, shapes) is load-bearing for a trainer, so
  // a reshaped parameter is refused as drift before any component is asked.
  expect_refused(dir.path() / "ckpt.pt", ErrorCode::config_drift, [](TrainingRun& run) {
    at::NoGradGuard guard;
    run.model->named_parameters()["3.weight"].set_data(at::randn({1, 7}, at::kDouble));
  });
}

TEST_F(TrainerPoison, ProfileViolationIsRefusedBeforeTheProfileIsUsed) {
  expect_refused(dir.path() / "ckpt.pt", ErrorCode::profile_precondition_violated, {},
                 [](TrainerOptions& o) { o.environment.external_randomness = true; });
  expect_refused(dir.path() / "ckpt.pt", ErrorCode::profile_precondition_violated, {},
                 [](TrainerOptions& o) { o.environment.loader_workers = 2; });
}

TEST_F(TrainerPoison, GeneratorInventoryMustMatch) {
  std::mt19937 extra;
  expect_refused(dir.path() / "ckpt.pt", ErrorCode::rng_inventory_mismatch,
                 [&](TrainingRun& run) { run.trainer->rng().add("extra", extra); });
}

TEST_F(TrainerPoison, WholeFileDigestAndForeignFiles) {
  TrainingRun target(99);
  steps(target, 3);
  const Value before = target.snapshot();
  CheckpointLoadOptions options;
  options.expected_sha256 = Sha256Digest::parse(std::string(64, 'a'));
  EXPECT_ERROR_CODE(target.trainer->state().load_checkpoint(dir.path() / "ckpt.pt", options), ErrorCode::sha256_mismatch);
  testing::write_file_bytes(dir.path() / "junk.pt", testing::bytes_of("not a checkpoint"));
  EXPECT_ERROR_CODE(target.trainer->state().load_checkpoint(dir.path() / "junk.pt"), ErrorCode::unknown_format);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");
}

TEST(TrainerRollback, FailureAfterSomeComponentsRestoresAllOfThem) {
  TempDir dir;
  TrainingRun source(1);
  steps(source, 7);
  source.trainer->state().save(dir / "ckpt.pt");
  for (const char* fail_after : {"model", "optimizer", "progress", "sampler"}) {
    SCOPED_TRACE(fail_after);
    TrainingRun target(99);
    steps(target, 3);
    const Value before = target.snapshot();
    target.trainer->state().set_after_apply_hook([&](const std::string& name) {
      if (name == fail_after) throw std::runtime_error("injected");
    });
    EXPECT_ERROR_CODE(target.trainer->state().load_checkpoint(dir / "ckpt.pt"), ErrorCode::state_apply_failed);
    EXPECT_EQ(describe_difference(before, target.snapshot()), "");
  }
}

TEST(TrainerFeatures, EarlyStoppingAndMaxEpochsEndTheRun) {
  TrainingRun run(1);
  int updates = 0;
  run.trainer->fit([&](const StepRecord&) { ++updates; });
  EXPECT_TRUE(run.trainer->finished());
  EXPECT_LE(run.trainer->progress().epoch, 5);
  EXPECT_EQ(updates, run.trainer->progress().global_step);
  EXPECT_EQ(static_cast<std::size_t>(updates), run.trainer->history().records().size());
}

TEST(TrainerFeatures, SaveCadenceWritesCheckpointsThatResume) {
  TempDir dir;
  const auto cadence = [&](TrainerOptions& o) {
    o.checkpointing.cadence.every_steps = 4;
    o.checkpoint_path = dir / "latest.pt";
  };
  TrainingRun run(1, cadence);
  steps(run, 5);
  ASSERT_TRUE(std::filesystem::exists(dir / "latest.pt"));
  TrainingRun resumed(2, cadence);
  resumed.trainer->state().load_checkpoint(dir / "latest.pt");
  EXPECT_EQ(resumed.trainer->progress().global_step, 4);
}

TEST(TrainerFeatures, GrowingMaxEpochsIsRecordedAsDrift) {
  TempDir dir;
  TrainingRun run(1);
  steps(run, 3);
  run.trainer->state().save(dir / "ckpt.pt");
  TrainingRun resumed(2, [](TrainerOptions& o) { o.max_epochs = 8; });
  const LoadReport report = resumed.trainer->state().load_checkpoint(dir / "ckpt.pt");
  ASSERT_TRUE(report.drift.has_value());
  EXPECT_EQ(report.drift->from, 5);
  EXPECT_EQ(report.drift->to, 8);
  EXPECT_EQ(report.drift->at_step, 3);
  resumed.trainer->state().save(dir / "next.pt");
  const Manifest next = Manifest::from_value(load_checkpoint_mapping(dir / "next.pt").root.as_dict().at("holdpoint"));
  ASSERT_TRUE(next.last_resume_drift.has_value());
  EXPECT_EQ(next.last_resume_drift->from, 5);
}

}  // namespace
}  // namespace holdpoint
