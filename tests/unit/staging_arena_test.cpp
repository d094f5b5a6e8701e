// StagingArena: staged states are independent copies, shared storages stay
// shared, the buffer is reused, and the parallel copy is exact.
#include "run/staging_arena.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace holdpoint {
namespace {

std::shared_ptr<std::vector<float>> floats(std::size_t n, float start) {
  auto v = std::make_shared<std::vector<float>>(n);
  std::iota(v->begin(), v->end(), start);
  return v;
}

TensorData view_of(const std::shared_ptr<const Storage>& storage, std::vector<std::int64_t> sizes,
                   std::int64_t offset) {
  TensorData t;
  t.dtype = DType::float32;
  t.sizes = std::move(sizes);
  t.strides = {1};
  t.storage_offset = offset;
  t.storage = storage;
  return t;
}

TEST(StagingArena, StagedTensorsAreCopiesThatLaterWritesDoNotReach) {
  auto live = floats(1000, 0);
  auto storage = std::make_shared<const Storage>(reinterpret_cast<const std::byte*>(live->data()),
                                                 live->size() * sizeof(float), live);
  std::vector<std::pair<std::string, Value>> states;
  Dict model;
  model.insert("weight", Value::tensor(view_of(storage, {600}, 0)));
  model.insert("tail", Value::tensor(view_of(storage, {400}, 600)));  // a view of the same storage
  states.emplace_back("model", Value::dict(std::move(model)));
  states.emplace_back("count", Value::integer(3));

  run::StagingArena arena(2);
  const run::StageStats stats = arena.stage(states);
  EXPECT_EQ(stats.bytes, 4000u) << "the shared storage is copied once";
  EXPECT_EQ(stats.storages, 1u);
  EXPECT_FALSE(stats.reused);

  (*live)[0] = -1;
  (*live)[999] = -1;
  const TensorData& weight = states[0].second.as_dict().find("weight")->as_tensor();
  const TensorData& tail = states[0].second.as_dict().find("tail")->as_tensor();
  EXPECT_EQ(weight.storage, tail.storage) << "views of one storage stay views of one staged storage";
  EXPECT_NE(weight.storage, storage);
  float first, last;
  std::memcpy(&first, weight.storage->data(), sizeof first);
  std::memcpy(&last, weight.storage->data() + 999 * sizeof(float), sizeof last);
  EXPECT_EQ(first, 0.0f);
  EXPECT_EQ(last, 999.0f);
  EXPECT_EQ(tail.storage_offset, 600);
  EXPECT_EQ(states[1].second.as_int(), 3);
}

TEST(StagingArena, TheBufferIsReusedOnlyWhenNoStagedStateHoldsIt) {
  auto live = floats(4096, 1);
  auto storage = std::make_shared<const Storage>(reinterpret_cast<const std::byte*>(live->data()),
                                                 live->size() * sizeof(float), live);
  run::StagingArena arena(1);
  auto make = [&] {
    std::vector<std::pair<std::string, Value>> states;
    states.emplace_back("t", Value::tensor(view_of(storage, {4096}, 0)));
    return states;
  };
  auto first = make();
  EXPECT_FALSE(arena.stage(first).reused);
  auto second = make();
  EXPECT_FALSE(arena.stage(second).reused) << "the first staged state still holds the buffer";
  first.clear();
  second.clear();
  auto third = make();
  EXPECT_TRUE(arena.stage(third).reused);
  EXPECT_GE(arena.capacity(), 4096u * sizeof(float));
}

TEST(StagingArena, ParallelCopyIsExactForAwkwardSizes) {
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, (std::size_t{9} << 20) + 13}) {
    for (unsigned threads : {1u, 2u, 3u, 8u}) {
      std::vector<std::byte> source(size), destination(size + 1, std::byte{0xAA});
      for (std::size_t i = 0; i < size; ++i) source[i] = static_cast<std::byte>(i * 131 + 7);
      run::parallel_copy(destination.data(), source.data(), size, threads);
      EXPECT_TRUE(std::equal(source.begin(), source.end(), destination.begin())) << size << "/" << threads;
      EXPECT_EQ(destination[size], std::byte{0xAA}) << "nothing written past the end";
    }
  }
}

}  // namespace
}  // namespace holdpoint
