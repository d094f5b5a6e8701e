// make_sharded_run RUN --world W --steps S1,S2,...
//
// Creates a run directory whose generations are sharded (docs/distributed.md)
// without c10d or LibTorch, for the CLI tests (tests/python/test_cli_sharded.py).
// For every step it does what the ranks of a DistributedCheckpointer save do,
// in one process:
//   - the replicated state ("model": three float32 tensors whose values
//     depend on the step; "progress": {step, epoch}) is partitioned across the
//     W ranks with partition_replicated(), so each storage is written by
//     exactly one rank;
//   - every rank also has a rank-local "sampler" state (ints that differ per
//     rank and step);
//   - each rank's shard is a holdpoint checkpoint of kind "shard" (root
//     {"holdpoint": manifest, "model": piece, "progress": piece, "sampler":
//     state}) whose manifest names the rank, world size and step, carries the
//     step manifest's configuration, profile and semantic identity, and
//     records each component's digest; it is saved with save_mapping into the
//     directory RunDirectory::prepare_shard_directory(step) returns;
//   - the step manifest (kind "sharded": world size, component names, each
//     shard's size and SHA-256) is committed with RunDirectory::commit
//     (world_size = W), its verifier checking every shard before the rename.
// After each commit the generation is read back with read_sharded_checkpoint
// (sizes, digests, identities, component digests) and merged with
// combined_view(); the merged model must equal the saved one.
//
// Step i (0-based) has epoch i and metrics {"loss": 1 / (i + 1)}: BEST is
// LATEST. Integers stay below 256 for steps below 60 and W <= 4, so a rank's
// shards of two such steps have the same size (the CLI tests swap them).
//
// Output: per generation "<name> <sha256> world <W>" then, per shard,
// "  rank-0000R.pt <size> <sha256>".
// Exit status: 0 when every generation was committed and read back, 1 when a
// step failed (the error code is printed), 2 on usage errors.

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/error.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/format/value.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"

namespace {

constexpr const char* kSemanticIdentity = "make_sharded_run";

int usage(const std::string& why) {
  std::cerr << "make_sharded_run: " << why << "\n"
            << "usage: make_sharded_run RUN --world W --steps S1,S2,...\n";
  return 2;
}

std::vector<std::int64_t> parse_steps(const std::string& text) {
  std::vector<std::int64_t> steps;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) steps.push_back(std::stoll(item));
  return steps;
}

holdpoint::Value float_tensor(std::vector<std::int64_t> sizes, float base) {
  std::int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  std::vector<float> values(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = base + 0.125f * static_cast<float>(i);
  const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
  return holdpoint::Value::tensor(holdpoint::TensorData::from_bytes(holdpoint::DType::float32, std::move(sizes),
                                                                    {bytes, values.size() * sizeof(float)}));
}

// The step manifest's identity, which every shard repeats.
holdpoint::Manifest base_manifest() {
  holdpoint::Manifest manifest;
  manifest.semantic_identity = kSemanticIdentity;
  manifest.config.load_bearing("lr", holdpoint::Value::floating(0.5)).load_bearing("world", holdpoint::Value::string("sharded"));
  return manifest;
}

struct StepStates {
  std::vector<std::pair<std::string, holdpoint::Value>> replicated;
  std::vector<holdpoint::Value> sampler;  // by rank
};

StepStates states_for(std::int64_t step, std::int64_t epoch, std::int64_t world) {
  StepStates out;
  holdpoint::Dict model;
  model.insert("weight", float_tensor({4, 3}, static_cast<float>(step)));
  model.insert("bias", float_tensor({3}, static_cast<float>(step) + 100.0f));
  model.insert("scale", float_tensor({8}, static_cast<float>(step) + 200.0f));
  out.replicated.emplace_back("model", holdpoint::Value::ordered_dict(std::move(model)));
  holdpoint::Dict progress;
  progress.insert("step", holdpoint::Value::integer(step));
  progress.insert("epoch", holdpoint::Value::integer(epoch));
  out.replicated.emplace_back("progress", holdpoint::Value::dict(std::move(progress)));
  for (std::int64_t rank = 0; rank < world; ++rank) {
    holdpoint::Dict sampler;
    sampler.insert("rank", holdpoint::Value::integer(rank));
    sampler.insert("epoch", holdpoint::Value::integer(epoch));
    sampler.insert("cursor", holdpoint::Value::integer(step * world + rank));
    sampler.insert("seed", holdpoint::Value::integer(17 + rank));
    out.sampler.push_back(holdpoint::Value::dict(std::move(sampler)));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("missing RUN");
  const std::string directory = argv[1];
  std::int64_t world = -1;
  std::vector<std::int64_t> steps;
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 == argc) return usage(flag + " needs a value");
      const std::string value = argv[++i];
      if (flag == "--world") {
        world = std::stoll(value);
      } else if (flag == "--steps") {
        steps = parse_steps(value);
      } else {
        return usage("unknown option " + flag);
      }
    }
  } catch (const std::exception&) {
    return usage("a value is not a number");
  }
  if (world < 1) return usage("--world W is required (W >= 1)");
  if (steps.empty()) return usage("--steps S1,S2,... is required");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] < 0 || (i > 0 && steps[i] <= steps[i - 1])) return usage("--steps must be non-negative and increasing");
  }

  try {
    holdpoint::RunDirectoryOptions options;
    options.best_metric = holdpoint::BestMetric{"loss", false};
    holdpoint::RunDirectory run(directory, options);
    const holdpoint::Manifest identity = base_manifest();
    const std::vector<std::string> rank_local = {"sampler"};

    for (std::size_t i = 0; i < steps.size(); ++i) {
      const std::int64_t step = steps[i];
      const std::int64_t epoch = static_cast<std::int64_t>(i);
      const StepStates states = states_for(step, epoch, world);
      const holdpoint::ReplicatedPartition partition = holdpoint::partition_replicated(states.replicated, world);

      // Each rank's shard, published into the prepared shard directory.
      const std::filesystem::path shard_directory = run.prepare_shard_directory(step);
      holdpoint::Sharding sharding;
      sharding.world_size = world;
      sharding.step = step;
      for (const auto& [name, state] : states.replicated) sharding.replicated.push_back(name);
      sharding.rank_local = rank_local;
      for (std::int64_t rank = 0; rank < world; ++rank) {
        std::vector<std::pair<std::string, holdpoint::Value>> components =
            partition.pieces[static_cast<std::size_t>(rank)];
        components.emplace_back("sampler", states.sampler[static_cast<std::size_t>(rank)]);
        holdpoint::Manifest shard_manifest = identity;
        shard_manifest.kind = holdpoint::CheckpointKind::shard;
        shard_manifest.sharding = holdpoint::Sharding{};
        shard_manifest.sharding->world_size = world;
        shard_manifest.sharding->step = step;
        shard_manifest.sharding->rank = rank;
        holdpoint::StorageDigests digests;
        for (const auto& [name, state] : components) {
          holdpoint::Dict contract;
          contract.insert("writer", holdpoint::Value::string(kSemanticIdentity));
          shard_manifest.components.push_back(
              {name, holdpoint::component_digest(state, digests), holdpoint::Value::dict(std::move(contract))});
        }
        holdpoint::Dict root;
        root.insert(std::string(holdpoint::kManifestKey), shard_manifest.to_value());
        for (const auto& [name, state] : components) root.insert(name, state);
        holdpoint::SaveOptions save;
        save.write_sidecar = false;  // shards have none: the step manifest records their digests
        save.torch_1_13_compatible = true;
        const auto saved = holdpoint::save_mapping(shard_directory / holdpoint::shard_file_name(rank),
                                                   holdpoint::Value::dict(std::move(root)), save);
        sharding.shards.push_back({rank, saved.file_bytes, saved.sha256});
      }

      // The step manifest, committed last: moving LATEST is the commit point.
      holdpoint::Manifest step_manifest = identity;
      step_manifest.kind = holdpoint::CheckpointKind::sharded;
      step_manifest.sharding = sharding;
      holdpoint::Dict step_root;
      step_root.insert(std::string(holdpoint::kManifestKey), step_manifest.to_value());
      const holdpoint::Value step_value = holdpoint::Value::dict(std::move(step_root));

      holdpoint::GenerationSpec spec;
      spec.step = step;
      spec.epoch = epoch;
      spec.metrics = {{"loss", 1.0 / static_cast<double>(i + 1)}};
      spec.world_size = world;
      const std::filesystem::path checkpoints = run.path() / holdpoint::kCheckpointsDirectory;
      const auto result = run.commit(
          spec,
          [&](holdpoint::io::ByteSink& sink) {
            holdpoint::format::PtWriteOptions write_options;
            write_options.torch_1_13_compatible = true;
            holdpoint::format::write_pt(sink, step_value, write_options);
          },
          [&](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
            // The staged step manifest reads, and every shard it names verifies.
            const holdpoint::LoadedMapping staged = holdpoint::parse_checkpoint_bytes(bytes, owner);
            const holdpoint::Manifest read =
                holdpoint::Manifest::from_value(staged.root.as_dict().at(std::string(holdpoint::kManifestKey)));
            auto dir = holdpoint::io::posix_file_system().open_directory(checkpoints, false);
            holdpoint::verify_shards(*dir, read, holdpoint::Limits{});
          });

      // Read back through the library, as a loading rank would.
      holdpoint::ShardedReadOptions read_options;
      read_options.expected_sha256 = result.generation.sha256;
      const holdpoint::ShardedCheckpoint loaded =
          holdpoint::read_sharded_checkpoint(run.file_path(result.generation), read_options);
      const holdpoint::Value view = loaded.combined_view();
      for (const auto& [name, state] : states.replicated) {
        if (!holdpoint::equal_content(view.as_dict().at(name), state)) {
          throw holdpoint::Error(holdpoint::ErrorCode::shard_piece_conflict,
                                 "merged component '" + name + "' differs from the saved state");
        }
      }
      for (std::int64_t rank = 0; rank < world; ++rank) {
        if (!holdpoint::equal_content(view.as_dict().at("sampler@rank" + std::to_string(rank)),
                                      states.sampler[static_cast<std::size_t>(rank)])) {
          throw holdpoint::Error(holdpoint::ErrorCode::component_digest_mismatch,
                                 "rank " + std::to_string(rank) + "'s sampler differs from the saved state");
        }
      }

      std::cout << result.generation.name << " " << result.generation.sha256.hex() << " world " << world
                << (result.became_best ? " best" : "") << "\n";
      for (const auto& shard : sharding.shards) {
        std::cout << "  " << holdpoint::shard_file_name(shard.rank) << " " << shard.size << " " << shard.sha256.hex()
                  << "\n";
      }
    }
  } catch (const holdpoint::Error& error) {
    std::cerr << "make_sharded_run: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
  return 0;
}
