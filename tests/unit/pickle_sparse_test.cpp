// Sparse tensors (COO, CSR, CSC, BSR, BSC) as Values: torch's invariants, each
// refusal with its own code, the reader's _rebuild_sparse_tensor and the
// writer's round trip. tests/python/test_sparse_tensors.py checks the same
// forms against torch 2.13 in both directions.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"
#include "holdpoint/base/error.h"
#include "holdpoint/format/value.h"
#include "support/test_support.h"
#include "unit/pickle_builder.h"

namespace holdpoint::format {
namespace {

using holdpoint::testing::MemoryStorages;
using holdpoint::testing::PickleBuilder;

Value int_tensor(DType dtype, std::vector<std::int64_t> sizes, const std::vector<std::int64_t>& elements) {
  std::vector<std::byte> bytes;
  for (const std::int64_t e : elements) {
    if (dtype == DType::int64) {
      bytes.resize(bytes.size() + 8);
      std::memcpy(bytes.data() + bytes.size() - 8, &e, 8);
    } else {
      const auto narrow = static_cast<std::int32_t>(e);
      bytes.resize(bytes.size() + 4);
      std::memcpy(bytes.data() + bytes.size() - 4, &narrow, 4);
    }
  }
  return Value::tensor(TensorData::from_bytes(dtype, std::move(sizes), bytes));
}

Value float_tensor(std::vector<std::int64_t> sizes) {
  std::int64_t numel = 1;
  for (const auto s : sizes) numel *= s;
  std::vector<float> values(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 1.5f + static_cast<float>(i);
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return Value::tensor(TensorData::from_bytes(DType::float32, std::move(sizes), bytes));
}

// torch.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3., 4., 5.], (2, 3)): coalesced order.
SparseTensor coo() {
  SparseTensor s;
  s.layout = "torch.sparse_coo";
  s.sizes = std::vector<std::int64_t>{2, 3};
  s.coalesced = true;
  s.parts = {int_tensor(DType::int64, {2, 3}, {0, 1, 1, 2, 0, 2}), float_tensor({3})};
  return s;
}

// The same matrix as CSR: rows [0, 1, 3], columns [2, 0, 2].
SparseTensor csr(DType index = DType::int64) {
  SparseTensor s;
  s.layout = "torch.sparse_csr";
  s.sizes = std::vector<std::int64_t>{2, 3};
  s.parts = {int_tensor(index, {3}, {0, 1, 3}), int_tensor(index, {3}, {2, 0, 2}), float_tensor({3})};
  return s;
}

// A 4 x 4 BSR of 2 x 2 blocks on the diagonal.
SparseTensor bsr() {
  SparseTensor s;
  s.layout = "torch.sparse_bsr";
  s.sizes = std::vector<std::int64_t>{4, 4};
  s.parts = {int_tensor(DType::int64, {3}, {0, 1, 2}), int_tensor(DType::int64, {2}, {0, 1}), float_tensor({2, 2, 2})};
  return s;
}

class WrittenStorages final : public StorageResolver {
 public:
  explicit WrittenStorages(const PickleWriteResult& written) {
    for (const auto& storage : written.storages) storages_[storage.key] = storage.storage;
  }
  std::shared_ptr<const Storage> resolve(const StorageRequest& request) override {
    return storages_.at(request.key);
  }

 private:
  std::map<std::string, std::shared_ptr<const Storage>> storages_;
};

PickleResult round_trip(const Value& value, const PickleOptions& options = {}) {
  const PickleWriteResult written = write_pickle(value);
  WrittenStorages storages(written);
  return read_pickle(written.pickle, storages, {}, options);
}

TEST(SparseTensor, AcceptsEachLayoutTorchSaves) {
  EXPECT_NO_THROW(Value::sparse_tensor(coo()));
  EXPECT_NO_THROW(Value::sparse_tensor(csr()));
  EXPECT_NO_THROW(Value::sparse_tensor(csr(DType::int32)));
  EXPECT_NO_THROW(Value::sparse_tensor(bsr()));
  // CSC of the same matrix: columns [0, 1, 1, 3], rows [1, 0, 1].
  SparseTensor csc = csr();
  csc.layout = "torch.sparse_csc";
  csc.parts[0] = int_tensor(DType::int64, {4}, {0, 1, 1, 3});
  csc.parts[1] = int_tensor(DType::int64, {3}, {1, 0, 1});
  EXPECT_NO_THROW(Value::sparse_tensor(csc));
  // Hybrid COO (a dense dimension of 4), uncoalesced order without the flag, and empty.
  SparseTensor hybrid = coo();
  hybrid.sizes = std::vector<std::int64_t>{2, 3, 4};
  hybrid.parts[1] = float_tensor({3, 4});
  EXPECT_NO_THROW(Value::sparse_tensor(hybrid));
  SparseTensor unordered = coo();
  unordered.coalesced = false;
  unordered.parts[0] = int_tensor(DType::int64, {2, 3}, {1, 1, 1, 2, 2, 2});
  EXPECT_NO_THROW(Value::sparse_tensor(unordered));
  SparseTensor empty = coo();
  empty.parts = {int_tensor(DType::int64, {2, 0}, {}), float_tensor({0})};
  EXPECT_NO_THROW(Value::sparse_tensor(empty));
  // Batched CSR: two 2 x 3 matrices of two elements each.
  SparseTensor batched;
  batched.layout = "torch.sparse_csr";
  batched.sizes = std::vector<std::int64_t>{2, 2, 3};
  batched.parts = {int_tensor(DType::int64, {2, 3}, {0, 1, 2, 0, 2, 2}),
                   int_tensor(DType::int64, {2, 2}, {0, 2, 0, 1}), float_tensor({2, 2})};
  EXPECT_NO_THROW(Value::sparse_tensor(batched));
  EXPECT_EQ(typed_scalar_text(Value::sparse_tensor(coo())), "tensor(sparse_coo, float32, size=[2, 3], nnz=3, coalesced)");
}

TEST(SparseTensor, RefusesEachBrokenInvariantWithItsCode) {
  const auto refused = [](const std::function<void(SparseTensor&)>& edit, SparseTensor base, ErrorCode code) {
    edit(base);
    EXPECT_ERROR_CODE(Value::sparse_tensor(base), code);
  };
  // Index dtypes and ranks.
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int32, {2, 3}, {0, 1, 1, 2, 0, 2}); }, coo(),
          ErrorCode::sparse_indices_invalid);
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {6}, {0, 1, 1, 2, 0, 2}); }, coo(),
          ErrorCode::sparse_indices_invalid);
  refused([](SparseTensor& s) { s.parts[1] = int_tensor(DType::int32, {3}, {2, 0, 2}); }, csr(),
          ErrorCode::sparse_indices_invalid);
  refused([](SparseTensor& s) { s.parts[0] = float_tensor({3}); }, csr(), ErrorCode::sparse_indices_invalid);
  // Shapes that disagree: rank, nnz, dense sizes, compressed length, blocks.
  refused([](SparseTensor& s) { s.sizes = std::vector<std::int64_t>{2, 3, 1}; }, coo(), ErrorCode::sparse_shape_invalid);
  refused([](SparseTensor& s) { s.parts[1] = float_tensor({4}); }, coo(), ErrorCode::sparse_shape_invalid);
  refused([](SparseTensor& s) { s.parts[1] = float_tensor({}); }, coo(), ErrorCode::sparse_shape_invalid);
  refused(
      [](SparseTensor& s) {
        s.sizes = std::vector<std::int64_t>{2, 3, 4};
        s.parts[1] = float_tensor({3, 5});
      },
      coo(), ErrorCode::sparse_shape_invalid);
  refused([](SparseTensor& s) { s.sizes = std::vector<std::int64_t>{3, 3}; }, csr(), ErrorCode::sparse_shape_invalid);
  refused([](SparseTensor& s) { s.parts[2] = float_tensor({2}); }, csr(), ErrorCode::sparse_shape_invalid);
  refused([](SparseTensor& s) { s.parts[2] = float_tensor({2, 3, 3}); }, bsr(), ErrorCode::sparse_shape_invalid);
  refused([](SparseTensor& s) { s.sizes = std::vector<std::int64_t>{2, -3}; }, coo(), ErrorCode::sparse_shape_invalid);
  // Indices outside the size.
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {2, 3}, {0, 1, 2, 2, 0, 2}); }, coo(),
          ErrorCode::sparse_index_out_of_bounds);
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {2, 3}, {0, 1, 1, 2, -1, 2}); }, coo(),
          ErrorCode::sparse_index_out_of_bounds);
  refused([](SparseTensor& s) { s.parts[1] = int_tensor(DType::int64, {3}, {2, 0, 3}); }, csr(),
          ErrorCode::sparse_index_out_of_bounds);
  // Compressed indices: not from 0, not to nnz, decreasing, or overshooting nnz
  // before stepping back (a slice that would read past the plain indices).
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {3}, {1, 1, 3}); }, csr(),
          ErrorCode::sparse_compressed_indices_invalid);
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {3}, {0, 1, 2}); }, csr(),
          ErrorCode::sparse_compressed_indices_invalid);
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {3}, {0, 4, 3}); }, csr(),
          ErrorCode::sparse_compressed_indices_invalid);
  refused(
      [](SparseTensor& s) {
        s.sizes = std::vector<std::int64_t>{2, 9};
        s.parts[0] = int_tensor(DType::int64, {3}, {0, 8, 3});
      },
      csr(), ErrorCode::sparse_compressed_indices_invalid);
  // Plain indices repeated or out of order within a row.
  refused([](SparseTensor& s) { s.parts[1] = int_tensor(DType::int64, {3}, {2, 2, 0}); }, csr(),
          ErrorCode::sparse_compressed_indices_invalid);
  refused(
      [](SparseTensor& s) {
        s.parts[0] = int_tensor(DType::int64, {3}, {0, 2, 3});
        s.parts[1] = int_tensor(DType::int64, {3}, {2, 1, 0});
      },
      csr(), ErrorCode::sparse_compressed_indices_invalid);
  // Marked coalesced, with a repeated or an out-of-order index.
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {2, 3}, {0, 1, 1, 2, 2, 2}); }, coo(),
          ErrorCode::sparse_not_coalesced);
  refused([](SparseTensor& s) { s.parts[0] = int_tensor(DType::int64, {2, 3}, {1, 0, 1, 0, 2, 2}); }, coo(),
          ErrorCode::sparse_not_coalesced);
  // Structure: a layout that is not sparse, a part that is no tensor, the wrong part count,
  // a coalesced flag on a compressed layout, requires_grad on integer values.
  refused([](SparseTensor& s) { s.layout = "torch.strided"; }, coo(), ErrorCode::pickle_call_args_invalid);
  refused([](SparseTensor& s) { s.parts[0] = Value::integer(1); }, coo(), ErrorCode::pickle_call_args_invalid);
  refused([](SparseTensor& s) { s.parts.pop_back(); }, csr(), ErrorCode::pickle_call_args_invalid);
  refused([](SparseTensor& s) { s.coalesced = true; }, csr(), ErrorCode::pickle_call_args_invalid);
  refused(
      [](SparseTensor& s) {
        s.parts[1] = int_tensor(DType::int64, {3}, {1, 2, 3});
        s.is_parameter = s.requires_grad = true;
      },
      coo(), ErrorCode::tensor_requires_grad_invalid);
}

TEST(SparseTensor, RoundTripsThroughTheWriterAndReader) {
  SparseTensor parameter = bsr();
  parameter.layout = "torch.sparse_bsc";
  parameter.is_parameter = parameter.requires_grad = true;
  SparseTensor old_form = coo();
  old_form.coalesced.reset();  // the three-part form of older torch
  const Value tied = Value::sparse_tensor(csr(DType::int32));
  Dict entries;
  entries.insert("coo", Value::sparse_tensor(coo()));
  entries.insert("old", Value::sparse_tensor(old_form));
  entries.insert("csr", tied);
  entries.insert("again", tied);
  entries.insert("bsc", Value::sparse_tensor(parameter));
  const Value root = Value::dict(std::move(entries));
  const PickleResult back = round_trip(root);
  EXPECT_EQ(describe_difference(root, back.root), "");
  const Dict& d = back.root.as_dict();
  EXPECT_EQ(d.at("again").node_identity(), d.at("csr").node_identity());
  EXPECT_FALSE(d.at("old").as_sparse_tensor().coalesced.has_value());
  EXPECT_TRUE(d.at("bsc").as_sparse_tensor().is_parameter);
  // Four sparse tensors (the tied one once) and their ten parts.
  EXPECT_EQ(back.tensor_count, 14u);
  // Differences name what differs.
  SparseTensor other = coo();
  other.coalesced = false;
  EXPECT_NE(describe_difference(Value::sparse_tensor(coo()), Value::sparse_tensor(other)), "");
  // A scan that drops tensors drops the sparse ones too, checking them all the same.
  PickleOptions drop;
  drop.drop_tensors = true;
  EXPECT_TRUE(round_trip(root, drop).root.as_dict().empty());
  // torch 1.13's loader has no sparse form holdpoint writes.
  PickleWriteOptions old;
  old.torch_1_13_compatible = true;
  EXPECT_ERROR_CODE(write_pickle(Value::sparse_tensor(coo()), old), ErrorCode::write_value_unsupported);
}

// _rebuild_sparse_tensor(_get_layout(name), data) with `data` built by `body`.
PickleBuilder sparse_call(std::string_view layout, const std::function<void(PickleBuilder&)>& body) {
  PickleBuilder p;
  p.proto().global("torch._utils", "_rebuild_sparse_tensor");
  p.global("torch.serialization", "_get_layout").str(layout).tuple1().reduce();
  body(p);
  p.tuple2().reduce().stop();
  return p;
}

TEST(SparseTensor, ReaderRefusesMalformedCallsEachWithItsCode) {
  MemoryStorages storages;
  storages.fabricate_missing(1 << 16);
  const auto read = [&](const PickleBuilder& p, const Limits& limits = {}) {
    return read_pickle(p.bytes(), storages, limits);
  };
  // A strided layout; data that is no tuple; too few items; a str where a tensor goes.
  EXPECT_ERROR_CODE(read(sparse_call("torch.strided", [](PickleBuilder& p) { p.empty_tuple(); })),
                    ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(sparse_call("torch.sparse_coo", [](PickleBuilder& p) { p.empty_list(); })),
                    ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(sparse_call("torch.sparse_coo", [](PickleBuilder& p) { p.integer(1).integer(2).tuple2(); })),
                    ErrorCode::pickle_call_args_invalid);
  EXPECT_ERROR_CODE(read(sparse_call("torch.sparse_csr",
                                     [](PickleBuilder& p) { p.mark().str("a").str("b").str("c").empty_tuple().tuple(); })),
                    ErrorCode::pickle_call_args_invalid);
  // A valid file, rewritten: its is_coalesced flag a str, then its max_tensors bound.
  Dict one;
  one.insert("s", Value::sparse_tensor(coo()));
  const PickleWriteResult written = write_pickle(Value::dict(std::move(one)));
  WrittenStorages resolver(written);
  Limits two;
  two.max_tensors = 2;
  EXPECT_ERROR_CODE(read_pickle(written.pickle, resolver, two), ErrorCode::tensor_count_limit);
  std::vector<std::byte> flag = written.pickle;
  // The flag is the NEWTRUE right before the data tuple's TUPLE.
  bool patched = false;
  for (std::size_t i = flag.size(); i-- > 1;) {
    if (flag[i] == std::byte{'t'} && flag[i - 1] == std::byte{0x88}) {
      flag[i - 1] = std::byte{'N'};  // None: allowed (torch's own default)
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  const Value read_none = read_pickle(flag, resolver, {}).root;
  EXPECT_FALSE(read_none.as_dict().at("s").as_sparse_tensor().coalesced.has_value());
}

}  // namespace
}  // namespace holdpoint::format
