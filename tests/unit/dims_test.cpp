// Dims (holdpoint/format/value.h): a tensor's sizes or strides, two
// dimensions held inline and more on the heap; and the compact Storage.
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "holdpoint/format/value.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

// Whether the values live inside the object (no allocation) or elsewhere.
bool held_inline(const Dims& dims) {
  const auto* object = reinterpret_cast<const std::byte*>(&dims);
  const auto* values = reinterpret_cast<const std::byte*>(dims.data());
  return values >= object && values < object + sizeof(Dims);
}

std::vector<std::int64_t> values_of(const Dims& dims) { return {dims.begin(), dims.end()}; }

TEST(Dims, IsNoLargerThanTheVectorItReplaces) {
  EXPECT_LE(sizeof(Dims), sizeof(std::vector<std::int64_t>));
}

TEST(Dims, ScalarsVectorsAndMatricesAreHeldInline) {
  const Dims scalar;
  const Dims vector{7};
  const Dims matrix{3, 4};
  EXPECT_TRUE(scalar.empty());
  EXPECT_TRUE(held_inline(vector));
  EXPECT_TRUE(held_inline(matrix));
  EXPECT_EQ(values_of(matrix), (std::vector<std::int64_t>{3, 4}));
}

TEST(Dims, AThirdDimensionMovesTheValuesToTheHeapAndKeepsThem) {
  Dims dims{2, 3};
  dims.push_back(5);
  EXPECT_FALSE(held_inline(dims));
  EXPECT_EQ(values_of(dims), (std::vector<std::int64_t>{2, 3, 5}));
  for (std::int64_t i = 0; i < 40; ++i) dims.push_back(i);
  ASSERT_EQ(dims.size(), 43u);
  EXPECT_EQ(dims[2], 5);
  EXPECT_EQ(dims.back(), 39);
}

TEST(Dims, CopiesAreEqualAndIndependent) {
  for (const Dims& original : {Dims{1, 2}, Dims{1, 2, 3, 4}}) {
    Dims copy = original;
    EXPECT_EQ(copy, original);
    copy[0] = 99;
    EXPECT_EQ(original[0], 1) << "a copy shares its values with the original";
    Dims assigned{8};
    assigned = original;
    EXPECT_EQ(assigned, original);
    const Dims& same = assigned;
    assigned = same;  // self-assignment keeps the values
    EXPECT_EQ(assigned, original);
  }
}

TEST(Dims, MovesTakeTheValuesAndLeaveTheSourceEmpty) {
  Dims heap{1, 2, 3};
  const std::int64_t* values = heap.data();
  Dims taken = std::move(heap);
  EXPECT_EQ(taken.data(), values) << "moving a heap Dims copied its values";
  EXPECT_EQ(values_of(taken), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_TRUE(heap.empty());  // NOLINT(bugprone-use-after-move): the state after a move is specified
  heap.push_back(4);
  EXPECT_TRUE(held_inline(heap));

  Dims small{5, 6};
  Dims into_heap{7, 8, 9};
  into_heap = std::move(small);
  EXPECT_EQ(values_of(into_heap), (std::vector<std::int64_t>{5, 6}));
  Dims into_inline{1};
  into_inline = std::move(taken);
  EXPECT_EQ(values_of(into_inline), (std::vector<std::int64_t>{1, 2, 3}));
}

TEST(Dims, ConvertsToAndFromVectorsAndSpans) {
  const std::vector<std::int64_t> shape{4, 5, 6};
  const Dims dims = shape;
  EXPECT_EQ(dims, shape);
  EXPECT_EQ(dims.vec(), shape);
  const std::vector<std::int64_t> back = dims;
  EXPECT_EQ(back, shape);
  const std::span<const std::int64_t> view = dims;
  EXPECT_EQ(view.size(), 3u);
  EXPECT_EQ(view.data(), dims.data());
  EXPECT_EQ(shape_text(dims), shape_text(shape));
  EXPECT_NE(dims, (std::vector<std::int64_t>{4, 5}));
  EXPECT_NE(dims, (Dims{4, 5, 7}));
}

TEST(Dims, AssignAndResizeFillAsAVectorWould) {
  Dims dims;
  dims.assign(3, 1);
  EXPECT_EQ(values_of(dims), (std::vector<std::int64_t>{1, 1, 1}));
  dims.resize(1);
  EXPECT_EQ(values_of(dims), (std::vector<std::int64_t>{1}));
  dims.resize(4, 9);
  EXPECT_EQ(values_of(dims), (std::vector<std::int64_t>{1, 9, 9, 9}));
  const std::vector<std::uint64_t> unsigned_shape{2, 8};
  dims.assign(unsigned_shape.begin(), unsigned_shape.end());
  EXPECT_EQ(values_of(dims), (std::vector<std::int64_t>{2, 8}));
  dims.clear();
  EXPECT_TRUE(dims.empty());
}

TEST(Dims, ACapacityBeyondItsCounterIsRefusedBeforeAllocating) {
  Dims dims;
  EXPECT_ERROR_CODE(dims.reserve(std::size_t{std::numeric_limits<std::uint32_t>::max()} + 1),
                    ErrorCode::invalid_argument);
  EXPECT_TRUE(dims.empty());
}

TEST(Dims, TensorGeometryKeepsItsValuesThroughATensorCopy) {
  TensorData tensor = TensorData::from_bytes(DType::uint8, {2, 3, 4}, std::vector<std::byte>(24));
  EXPECT_EQ(tensor.strides, (std::vector<std::int64_t>{12, 4, 1}));
  const TensorData copy = tensor;
  tensor.sizes[0] = 1;
  EXPECT_EQ(copy.sizes, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_EQ(copy.numel(), 24);
}

TEST(StorageLayout, FitsA64ByteAllocationWithItsControlBlock) {
  // make_shared puts a 16-byte control block before the object; glibc rounds
  // a request of up to 56 bytes to a 64-byte chunk.
  EXPECT_LE(sizeof(Storage), 40u);
  const std::vector<std::byte> bytes(10, std::byte{7});
  const auto storage = std::make_shared<const Storage>(bytes.data(), bytes.size(), nullptr);
  EXPECT_EQ(storage->nbytes(), 10u);
  EXPECT_TRUE(storage->has_bytes());
  EXPECT_FALSE(storage->handed_over());
  const auto absent = Storage::absent(std::size_t{1} << 40);
  EXPECT_EQ(absent->nbytes(), std::size_t{1} << 40);
  EXPECT_FALSE(absent->has_bytes());
}

TEST(StorageLayout, ASizeBeyond62BitsIsRefused) {
  EXPECT_ERROR_CODE(Storage(nullptr, std::size_t{1} << 62, nullptr), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(Storage::absent(~std::size_t{0}), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace holdpoint
