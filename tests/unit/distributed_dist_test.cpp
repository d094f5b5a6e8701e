// DistributedCheckpointer over real ProcessGroupGloo groups whose ranks are
// threads of this process (one HashStore), and the DistributedSampler.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <torch/nn/modules/linear.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <unistd.h>

#include "holdpoint/base/signature.h"
#include "holdpoint/dist/distributed.h"
#include "holdpoint/dist/gloo_process_group.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/state/sampler.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/rank_threads.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::error_of;
using testing::expect_all_ok;
using testing::run_ranks;
using testing::run_ranks_with_background;

// ---- fixtures ----------------------------------------------------------------------------

// A replicated component: named float tensors (tensors share a storage when asked).
class TensorBag final : public Component {
 public:
  explicit TensorBag(std::string name) : name_(std::move(name)) {}
  std::map<std::string, at::Tensor> tensors;

  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override {
    Dict entries;
    for (const auto& [key, tensor] : tensors) {
      entries.insert(key, Value::tensor(mode == CaptureMode::copy ? from_at_tensor(tensor.clone()) : from_at_tensor(tensor)));
    }
    return Value::dict(std::move(entries));
  }
  void validate(const Value& state) const override {
    if (!state.is_dict() || state.as_dict().size() != tensors.size()) {
      throw Error(ErrorCode::state_structure_mismatch, name_ + ": keys differ");
    }
    for (const auto& [key, tensor] : tensors) {
      const Value* value = state.as_dict().find(std::string_view(key));
      if (!value || !value->is_tensor() || value->as_tensor().numel() != tensor.numel()) {
        throw Error(ErrorCode::state_structure_mismatch, name_ + ": tensor '" + key + "' is missing or resized");
      }
    }
  }
  void apply(const Value& state) override {
    for (auto& [key, tensor] : tensors) tensor.copy_(to_at_tensor(state.as_dict().at(key).as_tensor()));
  }

 private:
  std::string name_;
};

// A rank-local integer; `reject` makes validate refuse any state.
class Counter final : public Component {
 public:
  std::int64_t value = 0;
  bool reject = false;
  std::function<void()> on_validate;  // runs inside validate: between a resume in place's two passes
  const std::string& name() const override {
    static const std::string n = "counter";
    return n;
  }
  Value capture(CaptureMode) const override { return Value::integer(value); }
  void validate(const Value& state) const override {
    if (on_validate) on_validate();
    if (reject) throw Error(ErrorCode::state_value_invalid, "counter: this rank refuses every state (test)");
    if (!state.is_int()) throw Error(ErrorCode::state_type_invalid, "counter: not an int");
  }
  void apply(const Value& state) override { value = state.as_int(); }
};

struct RankSetup {
  TensorBag model{"model"};
  TensorBag optimizer{"optimizer"};
  Counter counter;
  TrainingState state;

  explicit RankSetup(std::int64_t rank, std::int64_t sizes_offset = 0) {
    // Replicated: equal on every rank (unless sizes_offset differs).
    model.tensors["a"] = at::arange(0, 4000 + sizes_offset, at::kFloat);
    model.tensors["b"] = at::full({3000}, 2.0, at::kFloat);
    model.tensors["c"] = at::full({1000}, 3.0, at::kFloat);
    optimizer.tensors["m"] = at::full({2500}, 0.5, at::kDouble);
    counter.value = 100 + rank;
    state.add(model).add(optimizer).add(counter);
    state.set_semantic_identity("distributed-test");
  }
};

DistributedLoadOptions allow_change() {
  DistributedLoadOptions options;
  options.allow_world_size_change = true;
  return options;
}

GenerationSpec at_step(std::int64_t step) {
  GenerationSpec spec;
  spec.step = step;
  return spec;
}

DistributedCheckpointOptions options_with_counter() {
  DistributedCheckpointOptions options;
  options.rank_local = {"counter"};
  options.run.durable = false;
  return options;
}

class DistributedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("holdpoint-dist-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    run_ = root_ / "run";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Saves `steps` on `world` ranks (fresh setups, optionally perturbed per step).
  void save_steps(int world, std::vector<std::int64_t> steps) {
    expect_all_ok(run_ranks(world, [&](std::int64_t rank, c10d::ProcessGroup& group) {
      RankSetup setup(rank);
      DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
      for (const auto step : steps) {
        setup.model.tensors["a"].fill_(static_cast<float>(step));
        setup.counter.value = 100 * step + rank;
        checkpointer.save(at_step(step));
      }
    }));
  }

  std::filesystem::path root_;
  std::filesystem::path run_;
};

std::uint64_t size_of(const std::filesystem::path& path) { return std::filesystem::file_size(path); }

void flip_byte(const std::filesystem::path& path, std::uint64_t offset) {
  auto bytes = testing::read_file_bytes(path);
  bytes.at(offset) ^= std::byte{0x5a};
  testing::write_file_bytes(path, bytes);
}

// ---- save ----------------------------------------------------------------------------------

TEST_F(DistributedCheckpoint, EachReplicatedStorageIsWrittenByExactlyOneRank) {
  save_steps(2, {2});
  const auto manifest = run_ / "checkpoints" / "step-00000002.pt";
  const ShardedCheckpoint checkpoint = read_sharded_checkpoint(manifest);
  EXPECT_EQ(checkpoint.sharding().world_size, 2);
  EXPECT_EQ(checkpoint.sharding().replicated, (std::vector<std::string>{"model", "optimizer"}));
  EXPECT_EQ(checkpoint.sharding().rank_local, (std::vector<std::string>{"counter"}));
  // Every tensor position is held by exactly one shard.
  std::map<std::string, int> holders;
  for (std::int64_t r = 0; r < 2; ++r) {
    for (const char* component : {"model", "optimizer"}) {
      for (const auto& [key, value] : checkpoint.shards[r]->root.as_dict().at(component).as_dict()) {
        if (value.is_tensor()) ++holders[std::string(component) + "." + key.as_string()];
      }
    }
  }
  EXPECT_EQ(holders, (std::map<std::string, int>{{"model.a", 1}, {"model.b", 1}, {"model.c", 1}, {"optimizer.m", 1}}));
  // Bytes: each shard holds only its part; together about 1x the replicated state.
  const std::uint64_t state_bytes = (4000 + 3000 + 1000) * 4 + 2500 * 8;
  const std::uint64_t shard0 = size_of(run_ / "checkpoints" / "step-00000002.shards" / "rank-00000.pt");
  const std::uint64_t shard1 = size_of(run_ / "checkpoints" / "step-00000002.shards" / "rank-00001.pt");
  EXPECT_LT(shard0 + shard1, state_bytes + 16 * 1024) << "replicated tensors were written more than once";
  EXPECT_GT(shard0, state_bytes / 3);
  EXPECT_GT(shard1, state_bytes / 3);
  // Merged replicated state and the rank-local states are what each rank had.
  const Value model = checkpoint.replicated("model");
  EXPECT_TRUE(at::equal(to_at_tensor(model.as_dict().at("a").as_tensor()), at::full({4000}, 2.0, at::kFloat)));
  EXPECT_EQ(checkpoint.rank_local("counter", 0).as_int(), 200);
  EXPECT_EQ(checkpoint.rank_local("counter", 1).as_int(), 201);
}

TEST_F(DistributedCheckpoint, SaveCommitsLatestAndRunDirectoryVerifiesTheShards) {
  save_steps(2, {2, 4});
  RunDirectoryOptions read_only;
  read_only.recover = false;
  RunDirectory run(run_, read_only);
  ASSERT_TRUE(run.latest());
  EXPECT_EQ(run.latest()->name, "step-00000004.pt");
  EXPECT_EQ(run.latest()->world_size, 2);
  for (const auto& check : run.verify_all()) EXPECT_TRUE(check.ok) << check.name << ": " << check.detail;
}

TEST_F(DistributedCheckpoint, ReplicatedStructureMismatchIsRefusedOnEveryRankAndNothingCommits) {
  save_steps(2, {2});
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank, rank == 1 ? 7 : 0);  // rank 1's model.a has 7 more elements
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    checkpointer.save(at_step(4));
  });
  for (const auto& error : errors) {
    const auto e = error_of(error);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ErrorCode::distributed_replicated_mismatch) << e->what();
  }
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000004.pt"));
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000004.shards"));
  RunDirectoryOptions read_only;
  read_only.recover = false;
  const auto latest = RunDirectory(run_, read_only).latest();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->name, "step-00000002.pt");
}

// A component left replicated by mistake (its scalar differs per rank) is
// caught at save time, not when the pieces fail to merge on load.
TEST_F(DistributedCheckpoint, ReplicatedScalarsThatDifferAcrossRanksAreRefusedAtSave) {
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointOptions options;
    options.rank_local = {};  // counter differs per rank but is declared replicated
    options.run.durable = false;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    checkpointer.save(at_step(2));
  });
  for (const auto& error : errors) {
    const auto e = error_of(error);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ErrorCode::distributed_replicated_mismatch) << e->what();
  }
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000002.pt"));
}

TEST_F(DistributedCheckpoint, RanksSavingDifferentStepsOrConfigurationsDisagree) {
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    checkpointer.save(at_step(rank == 0 ? 2 : 3));
  });
  for (const auto& error : errors) {
    const auto e = error_of(error);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ErrorCode::distributed_ranks_disagree) << e->what();
  }
  const auto config_errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    TrainingConfig config;
    config.load_bearing("lr", Value::floating(rank == 0 ? 0.1 : 0.2));
    setup.state.set_config(config);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    checkpointer.save(at_step(2));
  });
  for (const auto& error : config_errors) {
    const auto e = error_of(error);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ErrorCode::distributed_ranks_disagree) << e->what();
  }
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000002.shards"));
}

TEST_F(DistributedCheckpoint, CoordinatorFailureFailsTheSaveOnEveryRank) {
  save_steps(2, {4});
  // Step 4 is committed: the coordinator refuses a second one, so every rank must fail.
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    checkpointer.save(at_step(4));
  });
  const auto e0 = error_of(errors[0]);
  const auto e1 = error_of(errors[1]);
  ASSERT_TRUE(e0 && e1);
  EXPECT_EQ(e0->code(), ErrorCode::run_generation_exists);
  EXPECT_EQ(e1->code(), ErrorCode::distributed_rank_failed);
  EXPECT_NE(e1->detail().find("rank 0: run_generation_exists"), std::string::npos) << e1->detail();
}

TEST_F(DistributedCheckpoint, AStepBeforeLatestIsRefusedBeforeAnyShardIsWritten) {
  save_steps(2, {4});
  std::atomic<int> shards_started{0};
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointOptions options = options_with_counter();
    options.phase_hook = [&](std::string_view phase) {
      if (phase == "before-shard") ++shards_started;
    };
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    checkpointer.save(at_step(2));
  });
  ASSERT_TRUE(error_of(errors[0]) && error_of(errors[1]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::run_step_not_increasing);
  EXPECT_EQ(error_of(errors[1])->code(), ErrorCode::distributed_rank_failed);
  EXPECT_EQ(shards_started.load(), 0);
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000002.shards"));
}

TEST_F(DistributedCheckpoint, PartialShardDirectoryIsRemovedByRecovery) {
  save_steps(2, {2});
  const auto partial = run_ / "checkpoints" / "step-00000004.shards";
  std::filesystem::create_directories(partial);
  std::ofstream(partial / "rank-00000.pt") << "half a shard";
  std::ofstream(partial / ".rank-00001.pt.staging-1-2") << "staging";
  RunDirectoryOptions read_only;
  read_only.recover = false;
  {
    RunDirectory inspect(run_, read_only);
    EXPECT_EQ(inspect.recovery().removed_uncommitted, std::vector<std::string>{"step-00000004.shards/"});
    EXPECT_TRUE(std::filesystem::exists(partial));
  }
  RunDirectory run(run_);
  EXPECT_FALSE(std::filesystem::exists(partial));
  EXPECT_EQ(run.latest()->name, "step-00000002.pt");
}

TEST_F(DistributedCheckpoint, DamagedShardQuarantinesTheGenerationAndRecoveryFallsBack) {
  save_steps(2, {2, 4});
  const auto shard = run_ / "checkpoints" / "step-00000004.shards" / "rank-00001.pt";
  flip_byte(shard, size_of(shard) / 2);
  RunDirectory run(run_);
  ASSERT_TRUE(run.latest());
  EXPECT_EQ(run.latest()->name, "step-00000002.pt");
  ASSERT_EQ(run.recovery().damaged.size(), 1u);
  EXPECT_EQ(run.recovery().damaged[0].code, ErrorCode::shard_digest_mismatch);
  EXPECT_TRUE(std::filesystem::exists(run_ / "checkpoints" / "step-00000004.pt.damaged"));
  EXPECT_TRUE(std::filesystem::exists(run_ / "checkpoints" / "step-00000004.shards.damaged" / "rank-00001.pt"));
}

TEST_F(DistributedCheckpoint, RetentionRemovesShardDirectoriesWithTheirManifests) {
  DistributedCheckpointOptions options = options_with_counter();
  options.run.retention.keep_last = 1;
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    checkpointer.save(at_step(2));
    checkpointer.save(at_step(4));
  }));
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000002.pt"));
  EXPECT_FALSE(std::filesystem::exists(run_ / "checkpoints" / "step-00000002.shards"));
  EXPECT_TRUE(std::filesystem::exists(run_ / "checkpoints" / "step-00000004.shards" / "rank-00001.pt"));
}

// ---- asynchronous saves -------------------------------------------------------------------------

TEST_F(DistributedCheckpoint, AsyncSaveWritesTheStateOfTheCallWhileTrainingContinues) {
  expect_all_ok(run_ranks_with_background(2, [&](std::int64_t rank, c10d::ProcessGroup& group,
                                                 c10d::ProcessGroup& background) {
    RankSetup setup(rank);
    DistributedCheckpointOptions options = options_with_counter();
    options.background = &background;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    setup.model.tensors["a"].fill_(2.0f);
    setup.counter.value = 200 + rank;
    checkpointer.save_async(at_step(2));
    // Training goes on: the background save must not see these.
    setup.model.tensors["a"].fill_(99.0f);
    setup.counter.value = -1;
    const auto result = checkpointer.wait();
    ASSERT_TRUE(result);
    EXPECT_EQ(result->generation.name, "step-00000002.pt");
    EXPECT_FALSE(checkpointer.wait());  // nothing in flight any more
    // A second async save after the first; then a synchronous one waits for it.
    checkpointer.save_async(at_step(3));
    checkpointer.save(at_step(4));
  }));
  const ShardedCheckpoint checkpoint = read_sharded_checkpoint(run_ / "checkpoints" / "step-00000002.pt");
  EXPECT_TRUE(at::equal(to_at_tensor(checkpoint.replicated("model").as_dict().at("a").as_tensor()),
                        at::full({4000}, 2.0, at::kFloat)));
  EXPECT_EQ(checkpoint.rank_local("counter", 1).as_int(), 201);
  RunDirectoryOptions read_only;
  read_only.recover = false;
  const RunDirectory run(run_, read_only);
  EXPECT_EQ(run.generations().size(), 3u);
  EXPECT_EQ(run.latest()->name, "step-00000004.pt");
}

TEST_F(DistributedCheckpoint, AsyncSaveFailureIsRaisedByTheNextCallOnEveryRank) {
  save_steps(2, {4});
  const auto errors = run_ranks_with_background(2, [&](std::int64_t rank, c10d::ProcessGroup& group,
                                                       c10d::ProcessGroup& background) {
    RankSetup setup(rank);
    DistributedCheckpointOptions options = options_with_counter();
    options.background = &background;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    checkpointer.save_async(at_step(2));  // before LATEST: the coordinator refuses, in the background
    checkpointer.wait();
  });
  ASSERT_TRUE(error_of(errors[0]) && error_of(errors[1]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::run_step_not_increasing);
  EXPECT_EQ(error_of(errors[1])->code(), ErrorCode::distributed_rank_failed);
}

TEST_F(DistributedCheckpoint, AsyncSaveWithoutABackgroundGroupIsRefused) {
  const auto errors = run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    checkpointer.save_async(at_step(1));
  });
  ASSERT_TRUE(error_of(errors[0]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::invalid_argument);
}

// ---- load ----------------------------------------------------------------------------------

TEST_F(DistributedCheckpoint, ResumeRestoresReplicatedAndRankLocalStateOnEveryRank) {
  save_steps(2, {2, 4});
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.model.tensors["a"].fill_(-1);
    setup.optimizer.tensors["m"].fill_(-1);
    setup.counter.value = -1;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    const auto report = checkpointer.resume();
    ASSERT_TRUE(report);
    EXPECT_FALSE(report->world_size_changed);
    EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, 4.0, at::kFloat)));
    EXPECT_TRUE(at::equal(setup.optimizer.tensors["m"], at::full({2500}, 0.5, at::kDouble)));
    EXPECT_EQ(setup.counter.value, 400 + rank);
  }));
}

TEST_F(DistributedCheckpoint, ResumeOfAnEmptyRunReturnsNothingOnEveryRank) {
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    EXPECT_FALSE(checkpointer.resume());
  }));
}

// The only generation is damaged: resuming must not silently start over, on any rank.
TEST_F(DistributedCheckpoint, ResumeRefusesToStartOverWhenEveryGenerationIsDamaged) {
  save_steps(2, {2});
  const auto shard = run_ / "checkpoints" / "step-00000002.shards" / "rank-00000.pt";
  flip_byte(shard, size_of(shard) / 2);
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
    checkpointer.resume();
  });
  ASSERT_TRUE(error_of(errors[0]) && error_of(errors[1]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::run_no_generation);
  EXPECT_EQ(error_of(errors[1])->code(), ErrorCode::distributed_rank_failed);
  EXPECT_NE(error_of(errors[1])->detail().find("rank 0: run_no_generation"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(run_ / "checkpoints" / "step-00000002.pt.damaged"));
}

// ---- resume in place ---------------------------------------------------------------------

// A state whose large records (over the first pass's 1 MiB) stay in the
// files until the fill: a model (ModuleState, filled in its own memory) and
// an optimizer-like bag (fresh memory).
struct BigSetup {
  torch::nn::Linear layer{nullptr};
  std::unique_ptr<ModuleState> model;
  TensorBag optimizer{"optimizer"};
  Counter counter;
  TrainingState state;

  BigSetup(std::int64_t rank, float value) {
    layer = torch::nn::Linear(1024, 600);
    {
      at::NoGradGuard no_grad;
      layer->weight.copy_(at::arange(0, 600 * 1024, at::kFloat).reshape({600, 1024}).mul_(value));
      layer->bias.fill_(value / 2);
    }
    model = std::make_unique<ModuleState>(*layer);
    optimizer.tensors["m"] = at::full({400000}, value * 3, at::kDouble);
    counter.value = 100 + rank;
    state.add(*model).add(optimizer).add(counter);
    state.set_semantic_identity("distributed-test");
  }
};

DistributedLoadOptions in_memory(ResumeMemory memory) {
  DistributedLoadOptions options;
  options.memory = memory;
  return options;
}

class DistributedResumeInPlace : public DistributedCheckpoint {
 protected:
  void save_big(float value) {
    expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
      BigSetup setup(rank, value);
      DistributedCheckpointer checkpointer(group, setup.state, run_, options_with_counter());
      checkpointer.save(at_step(3));
    }));
  }
  std::filesystem::path manifest() const { return run_ / "checkpoints" / "step-00000003.pt"; }
};

TEST_F(DistributedResumeInPlace, EqualsThePrivateCopyOnEveryRank) {
  save_big(2.0F);
  std::vector<at::Tensor> private_weights(2), in_place_weights(2), in_place_m(2);
  for (const auto memory : {ResumeMemory::private_copy, ResumeMemory::in_place}) {
    expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
      BigSetup setup(rank, -1.0F);
      const at::Tensor weight_memory = setup.layer->weight;
      DistributedCheckpointer checkpointer(group, setup.state, root_ / "loader", options_with_counter());
      const auto report = checkpointer.load_checkpoint(manifest(), in_memory(memory));
      const auto slot = static_cast<std::size_t>(rank);
      EXPECT_EQ(setup.counter.value, 100 + rank);
      if (memory == ResumeMemory::private_copy) {
        EXPECT_FALSE(report.report.in_place);
        private_weights[slot] = setup.layer->weight.detach().clone();
        return;
      }
      EXPECT_TRUE(report.report.in_place);
      // The model's old bytes were journaled before its own memory was written.
      EXPECT_GE(report.report.bytes_journaled, static_cast<std::uint64_t>(600 * 1024 * 4));
      EXPECT_EQ(setup.layer->weight.data_ptr(), weight_memory.data_ptr());
      EXPECT_EQ(report.shards_read, (std::vector<std::int64_t>{0, 1}));
      in_place_weights[slot] = setup.layer->weight.detach().clone();
      in_place_m[slot] = setup.optimizer.tensors["m"].clone();
    }));
  }
  const at::Tensor expected = at::arange(0, 600 * 1024, at::kFloat).reshape({600, 1024}).mul_(2.0F);
  for (std::size_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(in_place_weights[r].defined() && private_weights[r].defined());
    EXPECT_TRUE(at::equal(in_place_weights[r], private_weights[r])) << "rank " << r;
    EXPECT_TRUE(at::equal(in_place_weights[r], expected)) << "rank " << r;
    EXPECT_TRUE(at::equal(in_place_m[r], at::full({400000}, 6.0, at::kDouble))) << "rank " << r;
  }
}

// A shard written over after the first pass (inside a component's validate,
// before the agreement): every rank refuses at the fill, and every rank's
// model is as it was.
TEST_F(DistributedResumeInPlace, AShardChangedBetweenThePassesIsRefusedWithEveryRankUnchanged) {
  save_big(2.0F);
  const auto shard = run_ / "checkpoints" / "step-00000003.shards" / "rank-00001.pt";
  const std::uint64_t middle = size_of(shard) / 2;
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    BigSetup setup(rank, -1.0F);
    const at::Tensor before = setup.layer->weight.detach().clone();
    const at::Tensor m_before = setup.optimizer.tensors["m"].clone();
    if (rank == 0) setup.counter.on_validate = [&] { flip_byte(shard, middle); };
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "loader", options_with_counter());
    try {
      checkpointer.load_checkpoint(manifest(), in_memory(ResumeMemory::in_place));
    } catch (...) {
      EXPECT_TRUE(at::equal(setup.layer->weight, before)) << "rank " << rank << "'s model changed";
      EXPECT_TRUE(at::equal(setup.optimizer.tensors["m"], m_before));
      EXPECT_EQ(setup.counter.value, 100 + rank);
      throw;
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    const auto e = error_of(errors[r]);
    ASSERT_TRUE(e) << "rank " << r << " accepted a shard changed between the passes";
    EXPECT_EQ(e->code(), ErrorCode::file_changed_during_read) << e->what();
  }
}

// A damaged shard is refused in the first pass, by every rank (each scans every shard).
TEST_F(DistributedResumeInPlace, ADamagedShardIsRefusedBeforeAnythingMoves) {
  save_big(2.0F);
  const auto shard = run_ / "checkpoints" / "step-00000003.shards" / "rank-00000.pt";
  flip_byte(shard, size_of(shard) / 3);
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    BigSetup setup(rank, -1.0F);
    const at::Tensor before = setup.layer->weight.detach().clone();
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "loader", options_with_counter());
    try {
      checkpointer.load_checkpoint(manifest(), in_memory(ResumeMemory::in_place));
    } catch (...) {
      EXPECT_TRUE(at::equal(setup.layer->weight, before));
      throw;
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    const auto e = error_of(errors[r]);
    ASSERT_TRUE(e) << "rank " << r;
    EXPECT_EQ(e->code(), ErrorCode::shard_digest_mismatch) << e->what();
    EXPECT_NE(e->detail().find("rank-00000.pt"), std::string::npos) << e->detail();
  }
}

// In place and the private copy need every rank to take the same path: one
// rank asking for in place takes them all there.
TEST_F(DistributedResumeInPlace, OneRankAskingForInPlaceTakesEveryRankThere) {
  save_big(2.0F);
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    BigSetup setup(rank, -1.0F);
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "loader", options_with_counter());
    const auto report = checkpointer.load_checkpoint(
        manifest(), in_memory(rank == 1 ? ResumeMemory::in_place : ResumeMemory::automatic));
    EXPECT_TRUE(report.report.in_place) << "rank " << rank;
    EXPECT_EQ(setup.counter.value, 100 + rank);
  }));
}

// A byte flip in one shard: every rank rejects, and no rank's state changed.
TEST_F(DistributedCheckpoint, TamperedShardIsRejectedOnEveryRankWithStateUntouched) {
  save_steps(2, {2});
  const auto shard = run_ / "checkpoints" / "step-00000002.shards" / "rank-00001.pt";
  flip_byte(shard, size_of(shard) / 2);
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.model.tensors["a"].fill_(-1);
    setup.counter.value = -5;
    DistributedCheckpointOptions options = options_with_counter();
    try {
      DistributedCheckpointer checkpointer(group, setup.state, root_ / "other-run", options);
      checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000002.pt");
    } catch (...) {
      EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, -1.0, at::kFloat)));
      EXPECT_EQ(setup.counter.value, -5);
      throw;
    }
  });
  // Only rank 1 reads shard 1; the verdict is every rank's, with its code.
  for (std::size_t r = 0; r < 2; ++r) {
    const auto e = error_of(errors[r]);
    ASSERT_TRUE(e) << "rank " << r << " accepted a tampered shard";
    EXPECT_EQ(e->code(), ErrorCode::shard_digest_mismatch) << e->what();
    EXPECT_NE(e->detail().find("rank 1: shard_digest_mismatch"), std::string::npos) << e->detail();
    EXPECT_NE(e->detail().find("rank-00001.pt"), std::string::npos) << e->detail();
    EXPECT_EQ(e->detail().find("rank 0: "), std::string::npos) << e->detail();
  }
}

// read_every_shard: each rank reads and rejects the damaged shard itself.
TEST_F(DistributedCheckpoint, TamperedShardIsRejectedByEveryReaderWhenEveryRankReadsEveryShard) {
  save_steps(2, {2});
  const auto shard = run_ / "checkpoints" / "step-00000002.shards" / "rank-00000.pt";
  flip_byte(shard, size_of(shard) / 2);
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "other-run", options_with_counter());
    DistributedLoadOptions options;
    options.read_every_shard = true;
    checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000002.pt", options);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    const auto e = error_of(errors[r]);
    ASSERT_TRUE(e) << "rank " << r << " accepted a tampered shard";
    EXPECT_EQ(e->code(), ErrorCode::shard_digest_mismatch) << e->what();
    EXPECT_NE(e->detail().find("rank 0: shard_digest_mismatch"), std::string::npos) << e->detail();
    EXPECT_NE(e->detail().find("rank 1: shard_digest_mismatch"), std::string::npos) << e->detail();
  }
}

// Each rank reads its own shard from the file system and receives the others:
// bytes read are the step manifest plus 1/world of the shards, and the state
// equals what reading every shard gives.
TEST_F(DistributedCheckpoint, EachRankReadsOnlyItsOwnShardAndReceivesTheRest) {
  save_steps(4, {2});
  const auto manifest = run_ / "checkpoints" / "step-00000002.pt";
  const auto shards = run_ / "checkpoints" / "step-00000002.shards";
  std::vector<std::uint64_t> shard_bytes;
  std::uint64_t all_shards = 0;
  for (std::int64_t r = 0; r < 4; ++r) {
    shard_bytes.push_back(size_of(shards / shard_file_name(r)));
    all_shards += shard_bytes.back();
  }
  const std::uint64_t manifest_bytes = size_of(manifest);
  expect_all_ok(run_ranks(4, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    for (const bool every : {false, true}) {
      RankSetup setup(rank);
      setup.model.tensors["a"].fill_(-1);
      setup.optimizer.tensors["m"].fill_(-1);
      setup.counter.value = -1;
      DistributedCheckpointer checkpointer(group, setup.state, root_ / (every ? "every-run" : "own-run"),
                                           options_with_counter());
      DistributedLoadOptions options;
      options.read_every_shard = every;
      const auto report = checkpointer.load_checkpoint(manifest, options);
      if (every) {
        EXPECT_EQ(report.shards_read, (std::vector<std::int64_t>{0, 1, 2, 3}));
        EXPECT_EQ(report.bytes_read, manifest_bytes + all_shards);
        EXPECT_EQ(report.bytes_received, 0u);
      } else {
        EXPECT_EQ(report.shards_read, std::vector<std::int64_t>{rank});
        EXPECT_EQ(report.bytes_read, manifest_bytes + shard_bytes[static_cast<std::size_t>(rank)]);
        EXPECT_EQ(report.bytes_received, all_shards - shard_bytes[static_cast<std::size_t>(rank)]);
      }
      EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, 2.0, at::kFloat)));
      EXPECT_TRUE(at::equal(setup.optimizer.tensors["m"], at::full({2500}, 0.5, at::kDouble)));
      EXPECT_EQ(setup.counter.value, 200 + rank);
    }
  }));
}

// What a receiver runs on bytes another rank read: the size, identity and
// schema checks of a read, so a shard sent under the wrong rank or cut short
// is refused by its own code.
TEST_F(DistributedCheckpoint, AReceivedShardIsCheckedAsIfItWereRead) {
  save_steps(2, {2});
  ShardedReadOptions options;
  const auto checkpoint = read_sharded_checkpoint(run_ / "checkpoints" / "step-00000002.pt", options);
  ASSERT_EQ(checkpoint.shard_bytes.size(), 2u);
  const auto& bytes0 = checkpoint.shard_bytes[0];
  ASSERT_TRUE(bytes0 && checkpoint.shard_bytes[1]);
  const LoadedMapping parsed = parse_shard(bytes0, checkpoint.manifest, 0, Limits{});
  EXPECT_EQ(parsed.sha256, checkpoint.sharding().shards[0].sha256);
  EXPECT_TRUE(parsed.root.as_dict().find("counter"));

  auto short_copy = io::Buffer::allocate(bytes0->size() - 1);
  std::memcpy(short_copy->data(), bytes0->data(), short_copy->size());
  auto expect_code = [](ErrorCode code, const std::function<void()>& body) {
    try {
      body();
      ADD_FAILURE() << "accepted; expected " << error_code_name(code);
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), code) << error.what();
    }
  };
  expect_code(ErrorCode::shard_size_mismatch, [&] { parse_shard(short_copy, checkpoint.manifest, 0, Limits{}); });

  // Shard 0's bytes sent as rank 1's (sizes made equal): its own manifest says rank 0.
  Manifest lying = checkpoint.manifest;
  lying.sharding->shards[1].size = lying.sharding->shards[0].size;
  expect_code(ErrorCode::shard_identity_mismatch, [&] { parse_shard(bytes0, lying, 1, Limits{}); });
  expect_code(ErrorCode::invalid_argument, [&] { parse_shard(bytes0, checkpoint.manifest, 2, Limits{}); });

  // Reading no shard at all: the step manifest only.
  options.ranks = std::vector<std::int64_t>{};
  const auto manifest_only = read_sharded_checkpoint(run_ / "checkpoints" / "step-00000002.pt", options);
  EXPECT_FALSE(manifest_only.shards.at(0) || manifest_only.shards.at(1));
}

// Saved by 2, loaded by 3: rank 2 reads no shard and receives both; saved
// by 4, loaded by 2: each rank reads two.
TEST_F(DistributedCheckpoint, AChangedWorldSplitsTheSavedShardsAmongTheNewRanks) {
  for (const auto& [saved, live] : std::vector<std::pair<int, int>>{{2, 3}, {4, 2}}) {
    std::filesystem::remove_all(run_);
    save_steps(saved, {2});
    expect_all_ok(run_ranks(live, [&, saved = saved, live = live](std::int64_t rank, c10d::ProcessGroup& group) {
      RankSetup setup(rank);
      DistributedCheckpointer checkpointer(group, setup.state, root_ / ("other-run-" + std::to_string(live)),
                                           options_with_counter());
      const auto report = checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000002.pt", allow_change());
      std::vector<std::int64_t> expected;
      for (std::int64_t s = 0; s < saved; ++s) {
        if (s % live == rank) expected.push_back(s);
      }
      EXPECT_EQ(report.shards_read, expected);
      EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, 2.0, at::kFloat)));
      EXPECT_EQ(setup.counter.value, 200 + rank % saved);
    }));
  }
}

// The coordinator signs each step manifest it commits; a resume under the
// trust policy reads them, and a load under another key's policy is refused
// on every rank with every rank's state untouched: the shards a signed
// manifest lists are authenticated by it, so none is read unsigned.
TEST_F(DistributedCheckpoint, SignedStepManifestsResumeUnderTheirKeyAndNoOtherOnEveryRank) {
  const auto key = std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::ed25519));
  TrustPolicy trust;
  trust.keys.push_back(key->verifying_key());
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointOptions options = options_with_counter();
    options.run.signing_key = key;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    for (const std::int64_t step : {2, 4}) {
      setup.model.tensors["a"].fill_(static_cast<float>(step));
      setup.counter.value = 100 * step + rank;
      checkpointer.save(at_step(step));
    }
  }));
  EXPECT_TRUE(std::filesystem::exists(run_ / "checkpoints" / "step-00000004.pt.sig"));
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.model.tensors["a"].fill_(-1);
    DistributedCheckpointOptions options = options_with_counter();
    options.run.trust = trust;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    ASSERT_TRUE(checkpointer.resume());
    EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, 4.0, at::kFloat)));
  }));
  TrustPolicy stranger;
  stranger.keys.push_back(SigningKey::generate(SignatureAlgorithm::ed25519).verifying_key());
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.model.tensors["a"].fill_(-1);
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "other-run", options_with_counter());
    DistributedLoadOptions load;
    load.trust = stranger;
    try {
      checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000004.pt", load);
    } catch (...) {
      EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, -1.0, at::kFloat)));
      throw;
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    const auto e = error_of(errors[r]);
    ASSERT_TRUE(e) << "rank " << r << " loaded under another key's policy";
    EXPECT_EQ(e->code(), ErrorCode::signature_key_unknown) << e->what();
  }
}

// One rank's validation fails: the others, whose checks passed, reject too and change nothing.
TEST_F(DistributedCheckpoint, OneRanksRejectionRejectsTheLoadOnAllRanks) {
  save_steps(2, {2});
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.model.tensors["a"].fill_(-1);
    setup.counter.reject = rank == 1;
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "other-run", options_with_counter());
    try {
      checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000002.pt");
    } catch (...) {
      EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, -1.0, at::kFloat))) << "rank " << rank;
      throw;
    }
  });
  const auto e0 = error_of(errors[0]);
  const auto e1 = error_of(errors[1]);
  ASSERT_TRUE(e0 && e1);
  EXPECT_EQ(e0->code(), ErrorCode::distributed_rank_failed);
  EXPECT_NE(e0->detail().find("rank 1: state_value_invalid"), std::string::npos) << e0->detail();
  EXPECT_EQ(e1->code(), ErrorCode::state_value_invalid);
}

TEST_F(DistributedCheckpoint, WrongExpectedDigestIsRejectedEverywhere) {
  save_steps(2, {2});
  const auto errors = run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "other-run", options_with_counter());
    DistributedLoadOptions options;
    options.expected_sha256 = Sha256::of(testing::bytes_of("not the manifest"));
    checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000002.pt", options);
  });
  for (const auto& error : errors) {
    const auto e = error_of(error);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->code(), ErrorCode::sha256_mismatch) << e->what();
  }
}

// ---- world size ------------------------------------------------------------------------------

TEST_F(DistributedCheckpoint, ChangedWorldSizeNeedsPermissionAndAnUnqualifiedProfile) {
  save_steps(2, {2});
  const auto manifest = run_ / "checkpoints" / "step-00000002.pt";
  // Refused without permission.
  auto errors = run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "one", options_with_counter());
    checkpointer.load_checkpoint(manifest);
  });
  ASSERT_TRUE(error_of(errors[0]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::distributed_world_size_changed);
  // Refused under a qualified profile even with permission (checked before the profile's preconditions).
  errors = run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.state.set_profile(ResumeProfile::cpu_gloo_ddp_v1);
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "two", options_with_counter());
    checkpointer.load_checkpoint(manifest, allow_change());
  });
  ASSERT_TRUE(error_of(errors[0]));
  EXPECT_EQ(error_of(errors[0])->code(), ErrorCode::distributed_world_size_changed);
  // Accepted with permission as unqualified: replicated state whole, rank-local from rank 0.
  expect_all_ok(run_ranks(1, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    setup.counter.value = -1;
    DistributedCheckpointer checkpointer(group, setup.state, root_ / "three", options_with_counter());
    const auto report = checkpointer.load_checkpoint(manifest, allow_change());
    EXPECT_TRUE(report.world_size_changed);
    EXPECT_EQ(report.saved_world_size, 2);
    EXPECT_EQ(report.rank_local_source, 0);
    EXPECT_EQ(setup.counter.value, 200);
    EXPECT_TRUE(at::equal(setup.model.tensors["a"], at::full({4000}, 2.0, at::kFloat)));
  }));
}

// ---- profile ---------------------------------------------------------------------------------

TEST(DistributedProfile, GlooDdpProfileNeedsADistributedSamplerAndRankLocalGenerators) {
  ProfileFacts facts;
  facts.distributed = true;
  facts.world_size = 2;
  facts.sampler_kind = "distributed";
  facts.cpu_generator_registered = true;
  facts.rank_local_generators = true;
  EXPECT_TRUE(profile_violations(ResumeProfile::cpu_gloo_ddp_v1, facts).empty());
  EXPECT_EQ(resume_profile_from_name("cpu-gloo-ddp-v1"), ResumeProfile::cpu_gloo_ddp_v1);
  auto broken = facts;
  broken.rank_local_generators = false;
  EXPECT_EQ(profile_violations(ResumeProfile::cpu_gloo_ddp_v1, broken).size(), 1u);
  broken = facts;
  broken.sampler_kind = "random";
  EXPECT_EQ(profile_violations(ResumeProfile::cpu_gloo_ddp_v1, broken).size(), 1u);
  broken = facts;
  broken.distributed = false;
  EXPECT_EQ(profile_violations(ResumeProfile::cpu_gloo_ddp_v1, broken).size(), 1u);
  // The single-process profiles refuse distributed training.
  EXPECT_FALSE(profile_violations(ResumeProfile::cpu_basic_v1, facts).empty());
}

TEST_F(DistributedCheckpoint, QualifiedProfileRoundTripsWithSamplerAndGenerators) {
  std::vector<std::vector<std::int64_t>> drawn(2);
  expect_all_ok(run_ranks(2, [&](std::int64_t rank, c10d::ProcessGroup& group) {
    RankSetup setup(rank);
    DistributedSampler sampler(24, 5, 2, rank);
    SamplerState sampler_state(sampler);
    std::mt19937 engine(static_cast<std::uint32_t>(rank + 1));
    RngRegistry rng;
    rng.add("cpu", at::detail::getDefaultCPUGenerator());
    rng.add("engine", engine);
    setup.state.add(sampler_state).add(rng).set_profile(ResumeProfile::cpu_gloo_ddp_v1);
    DistributedCheckpointOptions options;
    options.rank_local = {"sampler", "rng", "counter"};
    options.run.durable = false;
    DistributedCheckpointer checkpointer(group, setup.state, run_, options);
    sampler.next();
    sampler.next();
    checkpointer.save(at_step(1));
    const auto expected_next = sampler.next();
    const auto expected_draw = engine();
    sampler.next();
    engine();
    checkpointer.load_checkpoint(run_ / "checkpoints" / "step-00000001.pt");
    EXPECT_EQ(sampler.next(), expected_next);
    EXPECT_EQ(engine(), expected_draw);
  }));
}

// ---- DistributedSampler ----------------------------------------------------------------------

std::vector<std::int64_t> drain(DistributedSampler& sampler) {
  std::vector<std::int64_t> out;
  while (const auto id = sampler.next()) out.push_back(*id);
  return out;
}

TEST(DistributedSamplerTest, RanksOfOneWorldConsumeEachIndexOfAnEpochOnce) {
  for (const std::int64_t world : {1, 2, 3, 4}) {
    std::multiset<std::int64_t> seen;
    for (std::int64_t rank = 0; rank < world; ++rank) {
      DistributedSampler sampler(25, 9, world, rank);
      sampler.start_epoch(3);
      for (const auto id : drain(sampler)) seen.insert(id);
    }
    EXPECT_EQ(seen.size(), 25u);
    for (std::int64_t id = 0; id < 25; ++id) EXPECT_EQ(seen.count(id), 1u) << "world " << world << " id " << id;
  }
  EXPECT_NE(DistributedSampler::permutation(25, 9, 0), DistributedSampler::permutation(25, 9, 1));
  EXPECT_EQ(DistributedSampler::permutation(25, 9, 1), DistributedSampler::permutation(25, 9, 1));
}

TEST(DistributedSamplerTest, WorldSizeChangeContinuesTheEpochWithoutSkipsOrRepeats) {
  std::vector<DistributedSampler> old;
  for (std::int64_t rank = 0; rank < 4; ++rank) old.emplace_back(48, 7, 4, rank);
  std::multiset<std::int64_t> seen;
  for (auto& sampler : old) {
    for (int i = 0; i < 5; ++i) seen.insert(*sampler.next());
  }
  std::vector<Value> states;
  for (const auto& sampler : old) states.push_back(sampler.capture_state(CaptureMode::copy));
  std::vector<const Value*> saved;
  for (const auto& state : states) saved.push_back(&state);
  for (std::int64_t rank = 0; rank < 2; ++rank) {
    DistributedSampler resumed(48, 7, 2, rank);
    const Value state = reassign_distributed_sampler_state(saved, rank, 2);
    resumed.validate_state(state);
    resumed.apply_state(state);
    for (const auto id : drain(resumed)) seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 48u);
  for (std::int64_t id = 0; id < 48; ++id) EXPECT_EQ(seen.count(id), 1u) << id;
}

TEST(DistributedSamplerTest, RemainingOnEveryRankIsTheSmallestShare) {
  DistributedSampler rank0(10, 3, 4, 0), rank3(10, 3, 4, 3);
  EXPECT_EQ(rank0.remaining(), 3);   // positions 0, 4, 8
  EXPECT_EQ(rank3.remaining(), 2);   // positions 3, 7
  EXPECT_EQ(rank0.remaining_on_every_rank(), 2);
  rank0.next();
  rank0.next();
  EXPECT_EQ(rank0.remaining_on_every_rank(), 0);
  EXPECT_EQ(rank0.remaining(), 1);
}

TEST(DistributedSamplerTest, UnevenCursorsAreNotReassigned) {
  DistributedSampler a(48, 7, 2, 0), b(48, 7, 2, 1);
  a.next();
  const Value sa = a.capture_state(CaptureMode::copy), sb = b.capture_state(CaptureMode::copy);
  const std::vector<const Value*> saved{&sa, &sb};
  try {
    reassign_distributed_sampler_state(saved, 0, 4);
    FAIL() << "uneven cursors were reassigned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::distributed_cursor_uneven);
  }
}

TEST(DistributedSamplerTest, StateOfAnotherRankOrSeedIsRejected) {
  DistributedSampler rank0(48, 7, 2, 0), rank1(48, 7, 2, 1), other_seed(48, 8, 2, 0);
  const Value state = rank0.capture_state(CaptureMode::copy);
  try {
    rank1.validate_state(state);
    FAIL() << "rank 0's state validated on rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::state_value_invalid);
  }
  try {
    other_seed.validate_state(state);
    FAIL() << "another seed's state validated";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::state_structure_mismatch);
  }
}

}  // namespace
}  // namespace holdpoint
