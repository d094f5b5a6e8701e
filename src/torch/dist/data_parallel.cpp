#include "holdpoint/dist/data_parallel.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/nn/module.h>

#include <utility>
#include <vector>

#include "base/fail.h"
#include "holdpoint/state/sampler.h"

namespace holdpoint {

using detail::fail;

namespace {

at::Tensor all_reduce(c10d::ProcessGroup& group, at::Tensor tensor, c10d::ReduceOp op) {
  std::vector<at::Tensor> tensors{std::move(tensor)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.allreduce(tensors, options)->wait();
  return tensors[0];
}

// The trainer's checkpoints through a DistributedCheckpointer.
class DistributedTrainerCheckpoints final : public TrainerCheckpoints {
 public:
  DistributedTrainerCheckpoints(c10d::ProcessGroup& group, TrainingState& state, const std::filesystem::path& run,
                                DataParallelOptions options)
      : load_(options.load),
        asynchronous_(options.asynchronous),
        checkpointer_(group, state, run, std::move(options.checkpoints)) {}

  std::optional<LoadReport> resume() override {
    const auto report = checkpointer_.resume(load_);
    if (!report) return std::nullopt;
    return report->report;
  }
  void save(const GenerationSpec& spec) override {
    checkpointer_.wait();
    // This exact step is committed already (a cadence save, then the end of
    // fit(); or a run resumed at its last step). Every rank sees the same LATEST.
    if (const auto latest = checkpointer_.latest(); latest && latest->step == spec.step) return;
    if (asynchronous_) {
      checkpointer_.save_async(spec);
    } else {
      checkpointer_.save(spec);
    }
  }
  void wait() override { checkpointer_.wait(); }
  DistributedCheckpointer& checkpointer() { return checkpointer_; }

 private:
  DistributedLoadOptions load_;
  bool asynchronous_ = false;
  DistributedCheckpointer checkpointer_;
};

}  // namespace

DistributedCheckpointer& make_data_parallel(Trainer& trainer, const DistributedSampler& sampler,
                                            c10d::ProcessGroup& group, const std::filesystem::path& run,
                                            DataParallelOptions options) {
  const std::int64_t world = group.getSize();
  const std::int64_t rank = group.getRank();
  if (sampler.world_size() != world || sampler.rank() != rank) {
    fail(ErrorCode::invalid_argument, "make_data_parallel: the sampler is rank ", sampler.rank(), " of ",
         sampler.world_size(), "; this process is rank ", rank, " of ", world);
  }
  c10d::ProcessGroup* reducer = &group;
  TrainerParallelism parallel;
  parallel.reduce_gradients = [reducer, world](torch::nn::Module& model) {
    std::vector<at::Tensor> parameters = model.parameters();
    std::vector<at::Tensor> flat;
    flat.reserve(parameters.size());
    for (auto& p : parameters) {
      if (!p.requires_grad()) continue;
      flat.push_back((p.grad().defined() ? p.grad() : at::zeros_like(p)).reshape({-1}));
    }
    if (flat.empty()) return;
    at::Tensor packed = all_reduce(*reducer, at::cat(flat), c10d::ReduceOp::SUM);
    packed.div_(static_cast<double>(world));
    std::int64_t offset = 0;
    for (auto& p : parameters) {
      if (!p.requires_grad()) continue;
      const std::int64_t n = p.numel();
      at::Tensor mean = packed.narrow(0, offset, n).view_as(p);
      if (p.grad().defined()) {
        p.mutable_grad().copy_(mean);
      } else {
        p.mutable_grad() = mean.clone();
      }
      offset += n;
    }
  };
  parallel.reduce_loss = [reducer, world](double local) {
    at::Tensor value = at::zeros({1}, at::kDouble);
    value.data_ptr<double>()[0] = local;
    return all_reduce(*reducer, value, c10d::ReduceOp::SUM).data_ptr<double>()[0] / static_cast<double>(world);
  };
  parallel.agree_remaining = [reducer](std::int64_t local) {
    at::Tensor value = at::zeros({1}, at::kLong);
    value.data_ptr<std::int64_t>()[0] = local;
    return all_reduce(*reducer, value, c10d::ReduceOp::MIN).data_ptr<std::int64_t>()[0];
  };
  parallel.agree_any = [reducer](bool local) {
    at::Tensor value = at::zeros({1}, at::kLong);
    value.data_ptr<std::int64_t>()[0] = local ? 1 : 0;
    return all_reduce(*reducer, value, c10d::ReduceOp::MAX).data_ptr<std::int64_t>()[0] != 0;
  };
  // The checkpointer sets the state's environment (distributed, world size,
  // rank-local generators); the trainer keeps it from then on.
  TrainingState& state = trainer.state();
  auto checkpoints = std::make_unique<DistributedTrainerCheckpoints>(group, state, run, std::move(options));
  DistributedCheckpointer& checkpointer = checkpoints->checkpointer();
  const TrainingEnvironment environment = state.environment();
  parallel.checkpoints = std::move(checkpoints);
  trainer.set_parallelism(std::move(parallel), environment);
  return checkpointer;
}

}  // namespace holdpoint
