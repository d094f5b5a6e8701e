// Sparse tensors as Values: the five layouts torch.save writes through
// torch._utils._rebuild_sparse_tensor, and the invariants torch checks of them
// only on request (torch.sparse.check_sparse_tensor_invariants), which holdpoint
// checks always, since a hostile index read unchecked is an out-of-bounds
// access in every kernel that touches the tensor.
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "base/fail.h"
#include "holdpoint/base/error.h"
#include "holdpoint/format/value.h"

namespace holdpoint {
namespace {

constexpr std::array<std::string_view, 5> kSparseLayouts = {"torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
                                                           "torch.sparse_bsr", "torch.sparse_bsc"};

template <typename... Parts>
[[noreturn]] void refuse(ErrorCode code, const SparseTensor& sparse, Parts&&... parts) {
  detail::fail(code, "a ", sparse.layout.substr(sparse.layout.find('.') + 1), " tensor of size ", shape_text(sparse.sizes),
               ": ", std::forward<Parts>(parts)...);
}

// Whether an index tensor's elements can be read: a scan (scan_checkpoint)
// checks records without keeping their bytes, and then only the structure is
// checked here; every load that keeps the tensors checks the elements too.
bool readable(const TensorData& tensor) {
  return tensor.numel() == 0 || (tensor.storage && tensor.storage->has_bytes());
}

// An index tensor's elements in C order, widened to int64.
std::vector<std::int64_t> index_elements(const TensorData& tensor) {
  const std::vector<std::byte> bytes = tensor.contiguous_bytes();
  std::vector<std::int64_t> out(static_cast<std::size_t>(tensor.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (tensor.dtype == DType::int64) {
      std::memcpy(&out[i], bytes.data() + 8 * i, 8);
    } else {
      std::int32_t narrow;
      std::memcpy(&narrow, bytes.data() + 4 * i, 4);
      out[i] = narrow;
    }
  }
  return out;
}

void check_index_tensor(const SparseTensor& sparse, const TensorData& tensor, std::string_view what, bool int32_allowed) {
  if (tensor.dtype != DType::int64 && !(int32_allowed && tensor.dtype == DType::int32)) {
    refuse(ErrorCode::sparse_indices_invalid, sparse, what, " are ", dtype_name(tensor.dtype),
           int32_allowed ? ", not int32 or int64" : ", not int64");
  }
  if (tensor.negative || tensor.conjugate || tensor.is_parameter || tensor.requires_grad) {
    refuse(ErrorCode::sparse_indices_invalid, sparse, what, " are a negative view, a Parameter or require grad");
  }
}

void validate_coo(const SparseTensor& sparse) {
  if (sparse.parts.size() != 2) {
    refuse(ErrorCode::pickle_call_args_invalid, sparse, sparse.parts.size(), " parts, not (indices, values)");
  }
  const TensorData& indices = sparse.parts[0].as_tensor();
  const TensorData& values = sparse.parts[1].as_tensor();
  check_index_tensor(sparse, indices, "the indices", false);
  if (indices.sizes.size() != 2) {
    refuse(ErrorCode::sparse_indices_invalid, sparse, "the indices have ", indices.sizes.size(),
           " dimensions, not 2 (sparse_dim x nnz)");
  }
  const std::int64_t sparse_dim = indices.sizes[0];
  const std::int64_t nnz = indices.sizes[1];
  if (values.sizes.empty()) refuse(ErrorCode::sparse_shape_invalid, sparse, "the values are 0-d, not nnz x dense sizes");
  const auto dense_dim = static_cast<std::int64_t>(values.sizes.size()) - 1;
  if (static_cast<std::int64_t>(sparse.sizes.size()) != sparse_dim + dense_dim) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, "its ", sparse.sizes.size(), " dimensions are not sparse_dim ",
           sparse_dim, " + dense_dim ", dense_dim);
  }
  if (values.sizes[0] != nnz) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, "indices for ", nnz, " elements but ", values.sizes[0], " values");
  }
  for (std::int64_t d = 0; d < dense_dim; ++d) {
    if (values.sizes[static_cast<std::size_t>(d + 1)] != sparse.sizes[static_cast<std::size_t>(sparse_dim + d)]) {
      refuse(ErrorCode::sparse_shape_invalid, sparse, "the values' dense sizes ", shape_text(values.sizes),
             " disagree with the size");
    }
  }
  if (!readable(indices)) return;
  const std::vector<std::int64_t> index = index_elements(indices);
  const auto n = static_cast<std::size_t>(nnz);
  for (std::size_t d = 0; d < static_cast<std::size_t>(sparse_dim); ++d) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t at = index[d * n + i];
      if (at < 0 || at >= sparse.sizes[d]) {
        refuse(ErrorCode::sparse_index_out_of_bounds, sparse, "element ", i, "'s index ", at, " in dimension ", d,
               " lies outside [0, ", sparse.sizes[d], ")");
      }
    }
  }
  if (sparse.coalesced.value_or(false)) {
    // Coalesced: the index columns in strictly increasing lexicographic order.
    for (std::size_t i = 1; i < n; ++i) {
      int order = 0;
      for (std::size_t d = 0; d < static_cast<std::size_t>(sparse_dim) && order == 0; ++d) {
        const std::int64_t before = index[d * n + i - 1], at = index[d * n + i];
        order = before < at ? 1 : before > at ? -1 : 0;
      }
      if (order <= 0) {
        refuse(ErrorCode::sparse_not_coalesced, sparse, "marked coalesced, but element ", i, "'s index ",
               order == 0 ? "repeats" : "comes before", " element ", i - 1, "'s");
      }
    }
  }
}

void validate_compressed(const SparseTensor& sparse) {
  if (sparse.parts.size() != 3) {
    refuse(ErrorCode::pickle_call_args_invalid, sparse, sparse.parts.size(),
           " parts, not (compressed indices, plain indices, values)");
  }
  if (sparse.coalesced) refuse(ErrorCode::pickle_call_args_invalid, sparse, "a coalesced flag on a compressed layout");
  const bool rows_compressed = sparse.layout == "torch.sparse_csr" || sparse.layout == "torch.sparse_bsr";
  const bool blocked = sparse.layout == "torch.sparse_bsr" || sparse.layout == "torch.sparse_bsc";
  const TensorData& compressed = sparse.parts[0].as_tensor();
  const TensorData& plain = sparse.parts[1].as_tensor();
  const TensorData& values = sparse.parts[2].as_tensor();
  check_index_tensor(sparse, compressed, "the compressed indices", true);
  check_index_tensor(sparse, plain, "the plain indices", true);
  if (compressed.dtype != plain.dtype) {
    refuse(ErrorCode::sparse_indices_invalid, sparse, "compressed indices of ", dtype_name(compressed.dtype),
           " and plain indices of ", dtype_name(plain.dtype));
  }
  if (compressed.sizes.empty() || plain.sizes.size() != compressed.sizes.size()) {
    refuse(ErrorCode::sparse_indices_invalid, sparse, "compressed indices of ", compressed.sizes.size(),
           " dimensions and plain indices of ", plain.sizes.size(), " (both batch dimensions + 1)");
  }
  const std::size_t batch = compressed.sizes.size() - 1;
  const std::size_t block = blocked ? 2 : 0;
  if (values.sizes.size() < batch + 1 + block) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, "the values have ", values.sizes.size(),
           " dimensions, fewer than batch + 1", blocked ? " + 2 block dimensions" : "");
  }
  const std::size_t dense = values.sizes.size() - batch - 1 - block;
  if (sparse.sizes.size() != batch + 2 + dense) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, "its ", sparse.sizes.size(), " dimensions are not batch ", batch,
           " + 2 + dense ", dense);
  }
  for (std::size_t d = 0; d < batch; ++d) {
    if (compressed.sizes[d] != sparse.sizes[d] || plain.sizes[d] != sparse.sizes[d] ||
        values.sizes[d] != sparse.sizes[d]) {
      refuse(ErrorCode::sparse_shape_invalid, sparse, "batch dimension ", d, " differs among size and parts");
    }
  }
  const std::int64_t block_rows = blocked ? values.sizes[batch + 1] : 1;
  const std::int64_t block_columns = blocked ? values.sizes[batch + 2] : 1;
  const std::int64_t rows = sparse.sizes[batch], columns = sparse.sizes[batch + 1];
  if (block_rows <= 0 || block_columns <= 0 || rows % block_rows != 0 || columns % block_columns != 0) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, "blocks of ", block_rows, " x ", block_columns,
           " do not tile its ", rows, " x ", columns, " matrix");
  }
  const std::int64_t compressed_size = rows_compressed ? rows / block_rows : columns / block_columns;
  const std::int64_t plain_size = rows_compressed ? columns / block_columns : rows / block_rows;
  const std::int64_t nnz = plain.sizes[batch];
  if (compressed.sizes[batch] != compressed_size + 1) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, compressed.sizes[batch], " compressed indices per batch, not ",
           compressed_size, " + 1");
  }
  if (values.sizes[batch] != nnz) {
    refuse(ErrorCode::sparse_shape_invalid, sparse, nnz, " plain indices per batch but ", values.sizes[batch], " values");
  }
  for (std::size_t d = 0; d < dense; ++d) {
    if (values.sizes[batch + 1 + block + d] != sparse.sizes[batch + 2 + d]) {
      refuse(ErrorCode::sparse_shape_invalid, sparse, "the values' dense sizes ", shape_text(values.sizes),
             " disagree with the size");
    }
  }
  if (compressed.dtype == DType::int32 &&
      (nnz > std::numeric_limits<std::int32_t>::max() || compressed_size >= std::numeric_limits<std::int32_t>::max() ||
       plain_size > std::numeric_limits<std::int32_t>::max())) {
    refuse(ErrorCode::sparse_indices_invalid, sparse, "int32 indices cannot count ", nnz, " elements in ",
           compressed_size, " x ", plain_size);
  }
  if (!readable(compressed) || !readable(plain)) return;
  const std::vector<std::int64_t> starts = index_elements(compressed);
  const std::vector<std::int64_t> index = index_elements(plain);
  std::int64_t batches = 1;
  for (std::size_t d = 0; d < batch; ++d) batches *= sparse.sizes[d];
  const auto per_start = static_cast<std::size_t>(compressed_size + 1);
  const auto per_index = static_cast<std::size_t>(nnz);
  for (std::size_t b = 0; b < static_cast<std::size_t>(batches); ++b) {
    const std::int64_t* first = starts.data() + b * per_start;
    const std::int64_t* plains = index.data() + b * per_index;
    if (first[0] != 0 || first[per_start - 1] != nnz) {
      refuse(ErrorCode::sparse_compressed_indices_invalid, sparse, "batch ", b, "'s compressed indices run from ",
             first[0], " to ", first[per_start - 1], ", not from 0 to nnz ", nnz);
    }
    for (std::size_t r = 0; r + 1 < per_start; ++r) {
      const std::int64_t step = first[r + 1] - first[r];
      // Also bounded by nnz here, not only at the end: a later step back down
      // must not let this slice read past the plain indices.
      if (step < 0 || step > plain_size || first[r + 1] > nnz) {
        refuse(ErrorCode::sparse_compressed_indices_invalid, sparse, "batch ", b, "'s compressed index ", r + 1,
               " is ", first[r + 1], ", a step of ", step, " (outside [0, ", plain_size, "] or past nnz ", nnz, ")");
      }
      for (std::int64_t i = first[r]; i < first[r + 1]; ++i) {
        const std::int64_t at = plains[i];
        if (at < 0 || at >= plain_size) {
          refuse(ErrorCode::sparse_index_out_of_bounds, sparse, "batch ", b, "'s plain index ", i, " is ", at,
                 ", outside [0, ", plain_size, ")");
        }
        if (i > first[r] && plains[i - 1] >= at) {
          refuse(ErrorCode::sparse_compressed_indices_invalid, sparse, "batch ", b, "'s plain indices ", i - 1,
                 " and ", i, " (", plains[i - 1], ", ", at, ") are not sorted and distinct within their slice");
        }
      }
    }
  }
}

}  // namespace

bool is_sparse_layout(std::string_view layout) noexcept {
  return std::find(kSparseLayouts.begin(), kSparseLayouts.end(), layout) != kSparseLayouts.end();
}

void validate_sparse_tensor(const SparseTensor& sparse) {
  if (!is_sparse_layout(sparse.layout)) {
    detail::fail(ErrorCode::pickle_call_args_invalid, "'", sparse.layout.substr(0, 64), "' is not a sparse layout");
  }
  for (const Value& part : sparse.parts) {
    if (!part.is_tensor()) {
      refuse(ErrorCode::pickle_call_args_invalid, sparse, "a part is a ", value_kind_name(part.kind()), ", not a tensor");
    }
  }
  if (sparse.parts.empty()) refuse(ErrorCode::pickle_call_args_invalid, sparse, "no parts");
  for (std::size_t d = 0; d < sparse.sizes.size(); ++d) {
    if (sparse.sizes[d] < 0) refuse(ErrorCode::sparse_shape_invalid, sparse, "dimension ", d, " is negative");
  }
  const TensorData& values = sparse.values();
  if (sparse.requires_grad && !dtype_is_differentiable(values.dtype)) {
    refuse(ErrorCode::tensor_requires_grad_invalid, sparse, "requires_grad on ", dtype_name(values.dtype), " values");
  }
  if (sparse.is_coo()) {
    validate_coo(sparse);
  } else {
    validate_compressed(sparse);
  }
}

Value Value::sparse_tensor(SparseTensor sparse) {
  validate_sparse_tensor(sparse);
  return Value(ValueKind::sparse_tensor, std::make_shared<const SparseTensor>(std::move(sparse)));
}

const SparseTensor& Value::as_sparse_tensor() const {
  if (kind_ != ValueKind::sparse_tensor) {
    detail::fail(ErrorCode::invalid_argument, "value is a ", value_kind_name(kind_), ", not a sparse Tensor");
  }
  return *std::get<std::shared_ptr<const SparseTensor>>(node_);
}

}  // namespace holdpoint
