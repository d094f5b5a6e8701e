// hand_over_storages and Storage page release (holdpoint/format/value.h), and
// the snapshot a load reports (LoadedMapping::snapshot), without LibTorch.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

const std::size_t kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

// A buffer of four pages filled with 0xAB and a tensor over pages 1 and 2
// plus a few bytes on each side.
struct Fixture {
  Fixture() : buffer(io::Buffer::allocate(4 * kPage)) {
    std::memset(buffer->data(), 0xAB, buffer->size());
    auto storage = std::make_shared<const Storage>(buffer->data() + kPage - 8, 2 * kPage + 16, buffer);
    TensorData tensor;
    tensor.dtype = DType::uint8;
    tensor.sizes = {static_cast<std::int64_t>(storage->nbytes())};
    tensor.strides = {1};
    tensor.storage = std::move(storage);
    Dict root;
    root.insert("t", Value::tensor(std::move(tensor)));
    tree = Value::dict(std::move(root));
  }
  bool all(std::size_t from, std::size_t to, std::byte value) const {
    return std::all_of(buffer->data() + from, buffer->data() + to, [value](std::byte b) { return b == value; });
  }
  std::shared_ptr<io::Buffer> buffer;
  Value tree;
};

TEST(HandOver, AHandedOverStorageReleasesItsWholePagesWhenItDies) {
  Fixture f;
  hand_over_storages(f.tree, f.buffer);
  EXPECT_TRUE(f.tree.as_dict().at("t").as_tensor().storage->handed_over());
  f.tree = Value();
  EXPECT_TRUE(f.all(kPage, 3 * kPage, std::byte{0})) << "the whole pages were not released";
  // Bytes of the storage outside whole pages, and the other pages, are kept.
  EXPECT_TRUE(f.all(0, kPage, std::byte{0xAB}));
  EXPECT_TRUE(f.all(3 * kPage, 4 * kPage, std::byte{0xAB}));
}

TEST(HandOver, AStorageNotHandedOverKeepsItsBytes) {
  Fixture f;
  f.tree = Value();
  EXPECT_TRUE(f.all(0, 4 * kPage, std::byte{0xAB}));
}

TEST(HandOver, AStorageOfAnotherOwnerIsNotHandedOver) {
  Fixture f;
  const auto other = io::Buffer::allocate(kPage);
  hand_over_storages(f.tree, other);
  EXPECT_FALSE(f.tree.as_dict().at("t").as_tensor().storage->handed_over());
  hand_over_storages(f.tree, nullptr);
  EXPECT_FALSE(f.tree.as_dict().at("t").as_tensor().storage->handed_over());
  f.tree = Value();
  EXPECT_TRUE(f.all(0, 4 * kPage, std::byte{0xAB}));
}

TEST(HandOver, AHolderKeepsTheBytesUntilItLetsGo) {
  Fixture f;
  hand_over_storages(f.tree, f.buffer);
  Value held = f.tree.as_dict().at("t");
  f.tree = Value();
  EXPECT_TRUE(f.all(0, 4 * kPage, std::byte{0xAB})) << "released while a Value still held the storage";
  held = Value();
  EXPECT_TRUE(f.all(kPage, 3 * kPage, std::byte{0}));
}

TEST(HandOver, ALoadReportsItsPrivateSnapshot) {
  TempDir dir;
  Dict root;
  root.insert("w", Value::tensor(TensorData::from_bytes(DType::uint8, {4096}, std::vector<std::byte>(4096))));
  save_mapping(dir / "m.pt", Value::dict(std::move(root)));
  const LoadedMapping loaded = load_checkpoint_mapping(dir / "m.pt");
  ASSERT_NE(loaded.snapshot, nullptr);
  const Storage& storage = *loaded.root.as_dict().at("w").as_tensor().storage;
  EXPECT_FALSE(storage.owner().owner_before(loaded.snapshot) || loaded.snapshot.owner_before(storage.owner()));
  EXPECT_FALSE(storage.handed_over()) << "a plain load must not hand anything over";
}

}  // namespace
}  // namespace holdpoint
