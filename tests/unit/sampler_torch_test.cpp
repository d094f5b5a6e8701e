// Samplers: a run interrupted mid-epoch and resumed from a real checkpoint
// file yields exactly the ids the uninterrupted run yields (none skipped, none
// repeated) and continues into the same next-epoch permutation; rejected
// states leave the live sampler and its generator unchanged.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/rand.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/rng_registry.h"
#include "holdpoint/state/sampler.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

constexpr std::int64_t kSamples = 24;

// Takes `count` ids, starting the next epoch whenever one ends, and calls
// `per_sample` after each (a training step that also draws random numbers).
std::vector<std::int64_t> consume(Sampler& sampler, std::int64_t count, const std::function<void()>& per_sample) {
  std::vector<std::int64_t> ids;
  while (static_cast<std::int64_t>(ids.size()) < count) {
    const std::optional<std::int64_t> id = sampler.next();
    if (!id) {
      sampler.start_epoch(sampler.epoch() + 1);
      continue;
    }
    ids.push_back(*id);
    per_sample();
  }
  return ids;
}

bool is_permutation_of_all(std::vector<std::int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<std::int64_t> all(kSamples);
  std::iota(all.begin(), all.end(), 0);
  return ids == all;
}

Value checkpoint(Sampler& sampler, RngRegistry& registry) {
  Dict root;
  root.insert("sampler", SamplerState(sampler).capture(CaptureMode::reference));
  root.insert("rng", registry.capture(CaptureMode::reference));
  return Value::dict(std::move(root));
}

void restore(const Value& root, Sampler& sampler, RngRegistry* registry) {
  SamplerState component(sampler);
  component.validate(root.as_dict().at("sampler"));
  if (registry) registry->validate(root.as_dict().at("rng"));
  component.apply(root.as_dict().at("sampler"));
  if (registry) registry->apply(root.as_dict().at("rng"));
}

// ---- random sampler: the mid-epoch resume proof ---------------------------------------

// Each training step draws from the sampler's generator too, so that the
// generator's position between permutations depends on every step taken.
std::function<void()> augment_with(const at::Generator& generator) {
  return [generator] { at::rand({1}, generator); };
}

TEST(RandomSamplerResume, MidEpochResumeYieldsExactlyTheRemainingIdsThenTheSameNextPermutation) {
  TempDir dir;
  constexpr std::int64_t kTotal = kSamples * 5 / 2;  // 2.5 epochs
  const at::Generator generator_a = at::detail::createCPUGenerator(1234);
  RandomSampler run_a(kSamples, generator_a);
  const std::vector<std::int64_t> ids_a = consume(run_a, kTotal, augment_with(generator_a));
  ASSERT_EQ(run_a.epoch(), 2);

  // Interrupt points: the start, mid-epoch 0, an epoch's end, mid-epoch 1 (the
  // issue's case) and the start of epoch 2.
  for (const std::int64_t stop : {std::int64_t{0}, std::int64_t{5}, kSamples, kSamples + 13, 2 * kSamples}) {
    SCOPED_TRACE(stop);
    const auto path = dir / ("resume-" + std::to_string(stop) + ".pt");
    std::vector<std::int64_t> ids_b;
    {
      const at::Generator generator = at::detail::createCPUGenerator(1234);
      RandomSampler run_b(kSamples, generator);
      RngRegistry registry;
      registry.add("sampler", run_b.generator());
      ids_b = consume(run_b, stop, augment_with(generator));
      save_mapping(path, checkpoint(run_b, registry));
    }
    // A fresh process: a differently seeded generator, a new sampler.
    const at::Generator generator = at::detail::createCPUGenerator(999);
    RandomSampler resumed(kSamples, generator);
    RngRegistry registry;
    registry.add("sampler", generator);
    restore(load_checkpoint_mapping(path).root, resumed, &registry);
    EXPECT_EQ(resumed.epoch(), stop / kSamples - (stop % kSamples == 0 && stop > 0 ? 1 : 0));
    const std::vector<std::int64_t> tail = consume(resumed, kTotal - stop, augment_with(generator));
    ids_b.insert(ids_b.end(), tail.begin(), tail.end());

    EXPECT_EQ(ids_b, ids_a);
    EXPECT_EQ(resumed.epoch(), 2);
    EXPECT_TRUE(resumed.order().equal(run_a.order()));
    EXPECT_EQ(resumed.remaining(), run_a.remaining());
    EXPECT_TRUE(generator.get_state().equal(generator_a.get_state()));
  }
  // Each epoch is a permutation: no id skipped, none repeated.
  EXPECT_TRUE(is_permutation_of_all({ids_a.begin(), ids_a.begin() + kSamples}));
  EXPECT_TRUE(is_permutation_of_all({ids_a.begin() + kSamples, ids_a.begin() + 2 * kSamples}));
}

TEST(RandomSamplerResume, NegativeControlResumeWithoutTheGeneratorIsDetected) {
  TempDir dir;
  const at::Generator generator_a = at::detail::createCPUGenerator(1234);
  RandomSampler run_a(kSamples, generator_a);
  const std::vector<std::int64_t> ids_a = consume(run_a, 3 * kSamples, augment_with(generator_a));

  const auto path = dir / "no-rng.pt";
  std::vector<std::int64_t> ids_b;
  {
    const at::Generator generator = at::detail::createCPUGenerator(1234);
    RandomSampler run_b(kSamples, generator);
    RngRegistry registry;
    registry.add("sampler", generator);
    ids_b = consume(run_b, kSamples + 13, augment_with(generator));
    save_mapping(path, checkpoint(run_b, registry));
  }
  const at::Generator generator = at::detail::createCPUGenerator(999);
  RandomSampler resumed(kSamples, generator);
  restore(load_checkpoint_mapping(path).root, resumed, nullptr);  // the sampler only
  const std::vector<std::int64_t> tail = consume(resumed, 2 * kSamples - 13, augment_with(generator));
  ids_b.insert(ids_b.end(), tail.begin(), tail.end());
  // The stored order still finishes epoch 1 exactly; epoch 2 is drawn from
  // the wrong generator state, which the comparison sees.
  EXPECT_TRUE(std::equal(ids_a.begin(), ids_a.begin() + 2 * kSamples, ids_b.begin()));
  EXPECT_NE(ids_b, ids_a);
}

// ---- the custom stateful-sampler protocol -------------------------------------------------

// A sampler holdpoint does not know: it shuffles with its own std::mt19937
// (registered in the RngRegistry) and keeps its position in its state_dict.
class ShuffledSampler final : public StatefulSamplerProtocol {
 public:
  ShuffledSampler(std::int64_t num_samples, std::mt19937& engine) : num_samples_(num_samples), engine_(engine) {
    start_epoch(0);
  }

  std::string kind() const override { return "test.ShuffledSampler/v1"; }
  std::int64_t num_samples() const override { return num_samples_; }
  std::optional<std::int64_t> next() override {
    if (cursor_ == num_samples_) return std::nullopt;
    return order_[static_cast<std::size_t>(cursor_++)];
  }
  void start_epoch(std::int64_t) override {
    order_.resize(static_cast<std::size_t>(num_samples_));
    std::iota(order_.begin(), order_.end(), 0);
    std::shuffle(order_.begin(), order_.end(), engine_);
    cursor_ = 0;
  }
  std::int64_t remaining() const override { return num_samples_ - cursor_; }

  Value state_dict() const override {
    Value::List order;
    for (std::int64_t id : order_) order.push_back(Value::integer(id));
    Dict state;
    state.insert("order", Value::list(std::move(order)));
    state.insert("cursor", Value::integer(cursor_));
    return Value::dict(std::move(state));
  }
  void validate_state_dict(const Value& state) const override {
    if (!state.is_dict() || state.as_dict().size() != 2) throw std::invalid_argument("expected {order, cursor}");
    const Value::List& order = state.as_dict().at("order").as_list();
    std::vector<std::int64_t> ids;
    for (const Value& id : order) ids.push_back(id.as_int());
    if (static_cast<std::int64_t>(ids.size()) != num_samples_ || !is_permutation_of_all(ids)) {
      throw std::invalid_argument("order is not a permutation of the samples");
    }
    const std::int64_t cursor = state.as_dict().at("cursor").as_int();
    if (cursor < 0 || cursor > num_samples_) throw std::invalid_argument("cursor out of range");
  }
  void load_state_dict(const Value& state) override {
    order_.clear();
    for (const Value& id : state.as_dict().at("order").as_list()) order_.push_back(id.as_int());
    cursor_ = state.as_dict().at("cursor").as_int();
  }

 private:
  std::int64_t num_samples_;
  std::mt19937& engine_;
  std::vector<std::int64_t> order_;
  std::int64_t cursor_ = 0;
};

TEST(StatefulSamplerResume, MidEpochResumeThroughTheProtocolYieldsTheSameIds) {
  TempDir dir;
  constexpr std::int64_t kTotal = kSamples * 5 / 2;
  std::mt19937 engine_a(77);
  ShuffledSampler custom_a(kSamples, engine_a);
  StatefulSampler run_a(custom_a);
  const auto no_draws = [] {};
  const std::vector<std::int64_t> ids_a = consume(run_a, kTotal, no_draws);

  const auto path = dir / "stateful.pt";
  std::vector<std::int64_t> ids_b;
  {
    std::mt19937 engine(77);
    ShuffledSampler custom(kSamples, engine);
    StatefulSampler run_b(custom);
    RngRegistry registry;
    registry.add("shuffle", engine);
    ids_b = consume(run_b, kSamples + 13, no_draws);
    save_mapping(path, checkpoint(run_b, registry));
  }
  std::mt19937 engine(5);
  ShuffledSampler custom(kSamples, engine);
  StatefulSampler resumed(custom);
  RngRegistry registry;
  registry.add("shuffle", engine);
  restore(load_checkpoint_mapping(path).root, resumed, &registry);
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(resumed.remaining(), kSamples - 13);
  const std::vector<std::int64_t> tail = consume(resumed, kTotal - (kSamples + 13), no_draws);
  ids_b.insert(ids_b.end(), tail.begin(), tail.end());

  EXPECT_EQ(ids_b, ids_a);
  EXPECT_EQ(engine, engine_a);
  EXPECT_TRUE(equal_content(resumed.capture_state(CaptureMode::copy), run_a.capture_state(CaptureMode::copy)));
}

// ---- sequential sampler -------------------------------------------------------------------

TEST(SequentialSampler, YieldsEveryIndexInOrderAndResumesMidEpoch) {
  TempDir dir;
  SequentialSampler sampler(5);
  std::vector<std::int64_t> ids = consume(sampler, 7, [] {});
  EXPECT_EQ(ids, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 0, 1}));
  EXPECT_EQ(sampler.epoch(), 1);

  const auto path = dir / "sequential.pt";
  save_mapping(path, SamplerState(sampler).capture(CaptureMode::reference));
  SequentialSampler resumed(5);
  SamplerState component(resumed);
  const Value loaded = load_checkpoint_mapping(path).root;
  EXPECT_FALSE(loaded.as_dict().contains("order"));
  component.validate(loaded);
  component.apply(loaded);
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(resumed.remaining(), 3);
  EXPECT_EQ(consume(resumed, 4, [] {}), (std::vector<std::int64_t>{2, 3, 4, 0}));
  EXPECT_EQ(resumed.epoch(), 2);
}

TEST(Samplers, ArgumentsAreChecked) {
  EXPECT_ERROR_CODE(SequentialSampler(-1), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(RandomSampler(-1, at::detail::createCPUGenerator(1)), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(RandomSampler(3, at::Generator()), ErrorCode::invalid_argument);
  SequentialSampler sampler(3);
  EXPECT_ERROR_CODE(sampler.start_epoch(-1), ErrorCode::invalid_argument);
  SequentialSampler empty(0);
  EXPECT_FALSE(empty.next().has_value());
  EXPECT_EQ(SamplerState(empty).name(), "sampler");
}

// ---- rejected states --------------------------------------------------------------------

Value with_field(const Value& state, const std::string& key, std::optional<Value> value) {
  Dict entries;
  bool found = false;
  for (const auto& [name, item] : state.as_dict()) {
    if (name.as_string() != key) {
      entries.insert(name, item);
    } else {
      found = true;
      if (value) entries.insert(name, *value);
    }
  }
  if (!found && value) entries.insert(key, *value);
  return Value::dict(std::move(entries));
}

Value int64_order(const std::vector<std::int64_t>& ids, std::vector<std::int64_t> sizes = {}) {
  if (sizes.empty()) sizes = {static_cast<std::int64_t>(ids.size())};
  return Value::tensor(TensorData::from_bytes(DType::int64, std::move(sizes), std::as_bytes(std::span(ids))));
}

class RandomSamplerStateTest : public ::testing::Test {
 protected:
  RandomSamplerStateTest() : generator(at::detail::createCPUGenerator(3)), sampler(kSamples, generator) {
    consume(sampler, kSamples + 7, [] {});
    good = sampler.capture_state(CaptureMode::copy);
    const at::Tensor order = to_at_tensor(good.as_dict().at("order").as_tensor());
    ids.assign(order.data_ptr<std::int64_t>(), order.data_ptr<std::int64_t>() + kSamples);
  }

  // The poison check: validate rejects `state` with `code`, and the sampler
  // and its generator are exactly as before.
  void expect_rejected(const Value& state, ErrorCode code) {
    const Value before = sampler.capture_state(CaptureMode::copy);
    const at::Tensor generator_before = generator.get_state();
    EXPECT_ERROR_CODE(SamplerState(sampler).validate(state), code);
    const Value after = sampler.capture_state(CaptureMode::copy);
    EXPECT_TRUE(equal_content(before, after)) << describe_difference(before, after);
    EXPECT_TRUE(generator.get_state().equal(generator_before));
    EXPECT_EQ(sampler.remaining(), kSamples - 7);
  }

  at::Generator generator;
  RandomSampler sampler;
  Value good;
  std::vector<std::int64_t> ids;
};

TEST_F(RandomSamplerStateTest, TheCapturedStateIsAccepted) {
  SamplerState(sampler).validate(good);
  EXPECT_EQ(good.as_dict().at("epoch").as_int(), 1);
  EXPECT_EQ(good.as_dict().at("cursor").as_int(), 7);
  EXPECT_EQ(good.as_dict().at("kind").as_string(), "random");
}

TEST_F(RandomSamplerStateTest, CursorOutsideTheOrderIsRejected) {
  expect_rejected(with_field(good, "cursor", Value::integer(kSamples + 1)), ErrorCode::state_value_invalid);
  expect_rejected(with_field(good, "cursor", Value::integer(-1)), ErrorCode::state_value_invalid);
  expect_rejected(with_field(good, "cursor", Value::string("7")), ErrorCode::state_type_invalid);
}

TEST_F(RandomSamplerStateTest, OrderThatIsNotAPermutationIsRejected) {
  std::vector<std::int64_t> duplicate = ids;
  duplicate[3] = duplicate[4];
  expect_rejected(with_field(good, "order", int64_order(duplicate)), ErrorCode::state_value_invalid);
  std::vector<std::int64_t> too_large = ids;
  too_large[0] = kSamples;
  expect_rejected(with_field(good, "order", int64_order(too_large)), ErrorCode::state_value_invalid);
  std::vector<std::int64_t> negative = ids;
  negative[kSamples - 1] = -1;
  expect_rejected(with_field(good, "order", int64_order(negative)), ErrorCode::state_value_invalid);
}

TEST_F(RandomSamplerStateTest, OrderOfTheWrongDtypeOrShapeIsRejected) {
  std::vector<float> as_float(ids.begin(), ids.end());
  expect_rejected(with_field(good, "order",
                             Value::tensor(TensorData::from_bytes(DType::float32, {kSamples},
                                                                  std::as_bytes(std::span(as_float))))),
                  ErrorCode::state_dtype_mismatch);
  expect_rejected(with_field(good, "order", int64_order({ids.begin(), ids.end() - 1})), ErrorCode::state_shape_mismatch);
  expect_rejected(with_field(good, "order", int64_order(ids, {4, kSamples / 4})), ErrorCode::state_shape_mismatch);
  Value::List as_list;
  for (std::int64_t id : ids) as_list.push_back(Value::integer(id));
  expect_rejected(with_field(good, "order", Value::list(std::move(as_list))), ErrorCode::state_type_invalid);
}

TEST_F(RandomSamplerStateTest, OtherSamplersStatesAreRejected) {
  expect_rejected(with_field(good, "num_samples", Value::integer(kSamples + 1)), ErrorCode::state_structure_mismatch);
  expect_rejected(with_field(good, "kind", Value::string("sequential")), ErrorCode::state_structure_mismatch);
  SequentialSampler sequential(kSamples);
  expect_rejected(sequential.capture_state(CaptureMode::copy), ErrorCode::state_structure_mismatch);
}

TEST_F(RandomSamplerStateTest, FieldsAreChecked) {
  expect_rejected(with_field(good, "epoch", Value::integer(-1)), ErrorCode::state_value_invalid);
  expect_rejected(with_field(good, "order", std::nullopt), ErrorCode::state_key_missing);
  expect_rejected(with_field(good, "seed", Value::integer(3)), ErrorCode::state_key_unknown);
  expect_rejected(Value::list(), ErrorCode::state_type_invalid);
}

TEST_F(RandomSamplerStateTest, ApplyAfterARejectedStateStillRestoresTheGoodOne) {
  consume(sampler, 30, [] {});
  SamplerState component(sampler);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "cursor", Value::integer(99))), ErrorCode::state_value_invalid);
  component.validate(good);
  component.apply(good);
  EXPECT_TRUE(equal_content(sampler.capture_state(CaptureMode::copy), good));
  std::vector<std::int64_t> rest;
  while (const auto id = sampler.next()) rest.push_back(*id);
  EXPECT_EQ(rest, std::vector<std::int64_t>(ids.begin() + 7, ids.end()));
}

TEST(SequentialSamplerState, RejectedStatesLeaveTheSamplerUnchanged) {
  SequentialSampler sampler(6);
  consume(sampler, 8, [] {});
  const Value good = sampler.capture_state(CaptureMode::copy);
  SamplerState component(sampler);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "cursor", Value::integer(7))), ErrorCode::state_value_invalid);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "order", int64_order({0, 1, 2, 3, 4, 5}))),
                    ErrorCode::state_key_unknown);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "num_samples", Value::integer(5))),
                    ErrorCode::state_structure_mismatch);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "kind", Value::string("random"))),
                    ErrorCode::state_structure_mismatch);
  EXPECT_TRUE(equal_content(sampler.capture_state(CaptureMode::copy), good));
  EXPECT_EQ(sampler.next(), std::optional<std::int64_t>(2));
}

TEST(StatefulSamplerState, ProtocolRejectionsAndKindMismatchesAreCoded) {
  std::mt19937 engine(1);
  ShuffledSampler custom(kSamples, engine);
  StatefulSampler sampler(custom);
  consume(sampler, 5, [] {});
  const Value good = sampler.capture_state(CaptureMode::copy);
  const std::mt19937 engine_before = engine;
  SamplerState component(sampler);

  EXPECT_ERROR_CODE(component.validate(with_field(good, "sampler_kind", Value::string("other/v1"))),
                    ErrorCode::state_structure_mismatch);
  Dict bad_inner;
  bad_inner.insert("order", Value::list());
  bad_inner.insert("cursor", Value::integer(0));
  EXPECT_ERROR_CODE(component.validate(with_field(good, "state_dict", Value::dict(std::move(bad_inner)))),
                    ErrorCode::state_value_invalid);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "state_dict", std::nullopt)), ErrorCode::state_key_missing);
  EXPECT_ERROR_CODE(component.validate(with_field(good, "epoch", Value::integer(-2))), ErrorCode::state_value_invalid);

  EXPECT_TRUE(equal_content(sampler.capture_state(CaptureMode::copy), good));
  EXPECT_EQ(engine, engine_before);
  EXPECT_EQ(sampler.remaining(), kSamples - 5);
}

}  // namespace
}  // namespace holdpoint
