// Handing a loaded snapshot over to the live state (hand_over_storages in
// holdpoint/format/value.h): a resume lets the optimizer's state tensors view
// the private snapshot instead of copying them, and never lets two live
// tensors, or a live tensor and another reader, share bytes that training
// writes.
#include <torch/optim/adam.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>

#include <sstream>
#include <string>
#include <type_traits>

#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// Memory that LibTorch's CPU allocator did not hand out: a view of something
// else (here, the snapshot).
bool views_foreign_memory(const at::Tensor& tensor) {
  return tensor.storage().data_ptr().get_deleter() != at::empty({1}).storage().data_ptr().get_deleter();
}

// A parameter's entry in an optimizer's state map, whose key is the
// TensorImpl's address as text up to LibTorch 2.1 and the pointer since.
template <typename Map>
auto& state_entry(Map& map, const at::Tensor& param) {
  using Key = std::decay_t<decltype(map.begin()->first)>;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;
    address << param.unsafeGetTensorImpl();
    return map.at(address.str());
  } else {
    return map.at(param.unsafeGetTensorImpl());
  }
}

// Two same-shaped parameters of 16 KiB each (whole pages of the snapshot),
// trained a few Adam steps.
struct AdamRun {
  explicit AdamRun(float start)
      : a(at::full({64, 64}, start).requires_grad_(true)),
        b(at::full({64, 64}, start + 1).requires_grad_(true)),
        adam(std::vector<at::Tensor>{a, b}, torch::optim::AdamOptions(0.01)),
        optimizer("optimizer", adam) {
    state.add(optimizer);
    state.set_semantic_identity("hand-over-test");
  }
  void step(int count) {
    for (int i = 0; i < count; ++i) {
      adam.zero_grad();
      ((a * a).sum() + (b * b * b).sum()).backward();
      adam.step();
    }
  }
  torch::optim::AdamParamState& entry(const at::Tensor& param) {
    return static_cast<torch::optim::AdamParamState&>(*state_entry(adam.state(), param));
  }
  at::Tensor exp_avg(const at::Tensor& param) { return entry(param).exp_avg(); }
  at::Tensor a, b;
  torch::optim::Adam adam;
  OptimizerState optimizer;
  TrainingState state;
};

TEST(HandOver, ResumedOptimizerStateViewsTheSnapshotAndTrainsOnIdentically) {
  TempDir dir;
  AdamRun source(0.5f);
  source.step(3);
  source.state.save(dir / "ckpt.pt");

  AdamRun resumed(0.5f);
  resumed.step(3);  // the same parameters; its optimizer state is replaced
  resumed.state.load_checkpoint(dir / "ckpt.pt");
  EXPECT_TRUE(views_foreign_memory(resumed.exp_avg(resumed.a))) << "the optimizer state was copied, not adopted";
  EXPECT_TRUE(at::equal(resumed.exp_avg(resumed.a), source.exp_avg(source.a)));

  // Training writes into the adopted bytes; the trajectory is the same.
  source.step(4);
  resumed.step(4);
  EXPECT_TRUE(at::equal(resumed.a, source.a));
  EXPECT_TRUE(at::equal(resumed.b, source.b));
  EXPECT_TRUE(at::equal(resumed.exp_avg(resumed.b), source.exp_avg(source.b)));
}

TEST(HandOver, TwoStatesSharingOneStorageInTheFileGetBytesOfTheirOwn) {
  TempDir dir;
  AdamRun source(0.5f);
  source.step(2);
  // Make b's first moment the very tensor of a's: the file then holds one
  // storage that both state entries view.
  source.entry(source.b).exp_avg(source.exp_avg(source.a));
  source.state.save(dir / "shared.pt");

  AdamRun resumed(0.5f);
  resumed.state.load_checkpoint(dir / "shared.pt");
  at::Tensor a_avg = resumed.exp_avg(resumed.a);
  at::Tensor b_avg = resumed.exp_avg(resumed.b);
  ASSERT_TRUE(at::equal(a_avg, b_avg));
  EXPECT_NE(a_avg.data_ptr(), b_avg.data_ptr()) << "one snapshot storage was adopted twice";
  const at::Tensor b_before = b_avg.clone();
  a_avg.add_(1.0);
  EXPECT_TRUE(at::equal(b_avg, b_before)) << "a write to one state reached the other";
}

TEST(HandOver, AMappingTheCallerKeepsIsNeverWrittenByTraining) {
  TempDir dir;
  AdamRun source(0.5f);
  source.step(2);
  source.state.save(dir / "ckpt.pt");

  // A mapping the caller read itself is not handed over by loading another
  // copy of the file, and stays what the file holds while training goes on.
  const LoadedMapping kept = load_checkpoint_mapping(dir / "ckpt.pt");
  ASSERT_NE(kept.snapshot, nullptr);
  const Value& state = kept.root.as_dict().at("optimizer").as_dict().at("state").as_dict().at(0);
  const at::Tensor kept_avg = to_at_tensor(state.as_dict().at("exp_avg").as_tensor());
  const at::Tensor file_avg = kept_avg.clone();
  EXPECT_FALSE(state.as_dict().at("exp_avg").as_tensor().storage->handed_over());

  AdamRun resumed(0.5f);
  resumed.state.load_checkpoint(dir / "ckpt.pt");
  resumed.step(3);
  EXPECT_TRUE(at::equal(kept_avg, file_avg));
  EXPECT_FALSE(at::equal(resumed.exp_avg(resumed.a), file_avg));
}

// A component that keeps the Value it was applied with, as a user's may.
class Keeper final : public Component {
 public:
  const std::string& name() const override { return name_; }
  Value capture(CaptureMode) const override { return Value::tensor(from_at_tensor(data)); }
  void validate(const Value& state) const override {
    if (!state.is_tensor()) throw Error(ErrorCode::state_type_invalid, "keeper");
  }
  void apply(const Value& state) override { kept = state; }
  at::Tensor data;
  Value kept;

 private:
  std::string name_ = "keeper";
};

TEST(HandOver, PagesAreReleasedOnlyWhenNothingHoldsTheStorage) {
  TempDir dir;
  Keeper source;
  source.data = at::arange(0, 64 * 1024, at::kFloat);  // 256 KiB: whole pages
  TrainingState saving;
  saving.add(source);
  saving.set_semantic_identity("keeper");
  saving.save(dir / "keeper.pt");

  Keeper target;
  target.data = at::full({64 * 1024}, 0.0f);
  TrainingState loading;
  loading.add(target);
  loading.set_semantic_identity("keeper");
  loading.load_checkpoint(dir / "keeper.pt");
  // The mapping is gone; the storage the component holds was handed over but
  // is still alive, so its pages hold the file's bytes, not released zeros.
  ASSERT_TRUE(target.kept.is_tensor());
  EXPECT_TRUE(target.kept.as_tensor().storage->handed_over());
  EXPECT_TRUE(at::equal(to_at_tensor(target.kept.as_tensor()), source.data));
}

}  // namespace
}  // namespace holdpoint
