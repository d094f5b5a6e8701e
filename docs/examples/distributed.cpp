// A sharded checkpoint over a c10d process group, on one rank: saves with
// DistributedCheckpointer, changes the model, and loads the saved step back
// from its step manifest. Every rank of a real job runs the same calls.
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <unistd.h>

#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "holdpoint/dist/distributed.h"
#include "holdpoint/dist/gloo_process_group.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/state/sampler.h"

namespace {

bool save_and_load(const std::filesystem::path& run) {
  // One process, one rank. A real job has one process per rank, meeting
  // through a c10d::FileStore or TCPStore (examples/ddp/train.cpp).
  const auto store = c10::make_intrusive<c10d::HashStore>();
  const auto group = holdpoint::make_gloo_process_group(store, /*rank=*/0, /*world_size=*/1);

  at::manual_seed(0);
  torch::nn::Linear model(3, 1);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  holdpoint::DistributedSampler sampler(16, /*seed=*/7, group->getSize(), group->getRank());
  holdpoint::ModuleState model_state(*model);
  holdpoint::OptimizerState optimizer_state("optimizer", optimizer);
  holdpoint::SamplerState sampler_state(sampler);
  holdpoint::TrainingState state;
  // Model and optimizer are replicated (written once in total); the sampler is rank-local.
  state.set_semantic_identity("api-example").add(model_state).add(optimizer_state).add(sampler_state);

  holdpoint::DistributedCheckpointer checkpointer(*group, state, run);
  if (checkpointer.resume()) {
    std::cerr << "a new run directory has no LATEST to resume from\n";
    return false;
  }
  const holdpoint::Value saved_model = model_state.capture(holdpoint::CaptureMode::copy);
  holdpoint::GenerationSpec spec;
  spec.step = 1;
  const holdpoint::DistributedSaveResult saved = checkpointer.save(spec);  // collective

  {
    at::NoGradGuard no_grad;
    model->weight.add_(1.0);
  }
  // The step manifest's path is the same on every rank; its shards lie beside it.
  const std::filesystem::path manifest = run / "checkpoints" / saved.generation.name;
  checkpointer.load_checkpoint(manifest);  // collective: every rank checks every shard before any applies
  const std::string difference =
      holdpoint::describe_difference(saved_model, model_state.capture(holdpoint::CaptureMode::copy));
  if (!difference.empty()) std::cerr << "the model differs after the load: " << difference << "\n";
  return difference.empty();
}

}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("holdpoint-api-distributed-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = false;
  try {
    ok = save_and_load(dir / "run");
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
