// safetensors writer: the layout the reference writer (huggingface/safetensors
// `prepare` + `serialize`) produces, so that its output is byte-for-byte what a
// careful reader expects: `__metadata__` first, tensors by descending element
// bits then name (each tensor is naturally aligned once the buffer is mapped at
// an 8-byte boundary), offsets consecutive from 0, header padded with spaces to
// a multiple of 8.
#include <algorithm>
#include <array>
#include <limits>
#include <string_view>
#include <vector>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "base/json_string.h"
#include "format/safetensors/safetensors.h"
#include "format/safetensors/safetensors_json.h"

namespace holdpoint::format {
namespace {

using detail::append_json_string;
using detail::checked_add;
using detail::checked_mul;
using detail::fail;

constexpr std::string_view kMetadataKey = "__metadata__";
// Non-contiguous tensors are gathered into C order through a buffer of at
// most this size, so writing a large strided view never doubles its memory.
constexpr std::uint64_t kScratchBytes = std::uint64_t{1} << 20;

struct PlannedTensor {
  const std::string* name;
  const TensorData* tensor;
  std::string_view dtype_name;
  std::uint64_t nbytes;
  std::uint64_t offset = 0;  // in the data buffer
};

// The header lists tensors in the caller's order, so a mapping read back has
// its keys in the order it was written; the data buffer is laid out by
// descending element bits, then name, so that every tensor is naturally
// aligned. Readers find tensors by data_offsets, never by header order.
struct Plan {
  std::vector<PlannedTensor> tensors;  // header order
  std::vector<std::size_t> layout;     // indices into tensors, in data order
};

// A sub-byte tensor (F4, F6_*) has no element address of its own, so only a
// contiguous run that starts and ends on byte boundaries can be written, as
// the reference requires of its slices.
std::uint64_t checked_sub_byte_bytes(const std::string& name, const TensorData& tensor, std::uint64_t numel) {
  const std::uint64_t bits = dtype_bits(tensor.dtype);
  const auto total_bits = checked_mul(numel, bits);
  const auto first_bit = checked_mul(static_cast<std::uint64_t>(tensor.storage_offset), bits);
  if (!total_bits || !first_bit) {
    fail(ErrorCode::tensor_numel_limit, "tensor ", quoted_for_message(name), ": its bit size overflows");
  }
  if (!tensor.is_contiguous() || *first_bit % 8 != 0) {
    fail(ErrorCode::tensor_geometry_invalid, "tensor ", quoted_for_message(name), " is a ", dtype_name(tensor.dtype),
         " view that is strided or starts inside a byte; sub-byte elements are written only as whole contiguous bytes");
  }
  if (*total_bits % 8 != 0) {
    fail(ErrorCode::safetensors_misaligned_slice, "tensor ", quoted_for_message(name), ": ", numel, " elements of ",
         dtype_name(tensor.dtype), " are ", *total_bits, " bits, not a whole number of bytes");
  }
  if (!tensor.storage) {
    fail(ErrorCode::tensor_geometry_invalid, "tensor ", quoted_for_message(name), " has elements but no storage");
  }
  const auto end_byte = checked_add(*first_bit / 8, *total_bits / 8);
  if (!end_byte || *end_byte > tensor.storage->nbytes()) {
    fail(ErrorCode::tensor_out_of_bounds, "tensor ", quoted_for_message(name), " reaches past the ",
         tensor.storage->nbytes(), " bytes of its storage");
  }
  return *total_bits / 8;
}

// The view's logical size in bytes, after checking that it describes memory
// inside its storage: a caller-built TensorData is not trusted to be coherent.
std::uint64_t checked_view_bytes(const std::string& name, const TensorData& tensor) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (tensor.sizes.size() != tensor.strides.size()) {
    fail(ErrorCode::tensor_geometry_invalid, "tensor ", quoted_for_message(name), " has ", tensor.sizes.size(),
         " sizes but ", tensor.strides.size(), " strides");
  }
  if (tensor.storage_offset < 0) {
    fail(ErrorCode::tensor_geometry_invalid, "tensor ", quoted_for_message(name), " has a negative storage offset");
  }
  // As in the reader: the product over the nonzero sizes bounds every partial
  // product TensorData computes.
  std::uint64_t numel = 1;
  bool has_zero = false;
  for (std::size_t i = 0; i < tensor.sizes.size(); ++i) {
    if (tensor.sizes[i] < 0 || tensor.strides[i] < 0) {
      fail(ErrorCode::tensor_geometry_invalid, "tensor ", quoted_for_message(name), " has size ", tensor.sizes[i],
           " and stride ", tensor.strides[i], " in dimension ", i);
    }
    if (tensor.sizes[i] == 0) {
      has_zero = true;
      continue;
    }
    const auto next = checked_mul(numel, static_cast<std::uint64_t>(tensor.sizes[i]));
    if (!next || *next > kMax) {
      fail(ErrorCode::tensor_numel_limit, "tensor ", quoted_for_message(name), ": the product of its sizes overflows");
    }
    numel = *next;
  }
  if (has_zero) return 0;
  if (dtype_is_sub_byte(tensor.dtype)) return checked_sub_byte_bytes(name, tensor, numel);
  const std::uint64_t itemsize = tensor.itemsize();
  const auto nbytes = checked_mul(numel, itemsize);
  if (!nbytes) fail(ErrorCode::tensor_numel_limit, "tensor ", quoted_for_message(name), ": its byte size overflows");
  if (!tensor.storage) {
    fail(ErrorCode::tensor_geometry_invalid, "tensor ", quoted_for_message(name), " has elements but no storage");
  }
  std::uint64_t last = static_cast<std::uint64_t>(tensor.storage_offset);
  bool overflow = false;
  for (std::size_t i = 0; i < tensor.sizes.size() && !overflow; ++i) {
    const auto step = checked_mul(static_cast<std::uint64_t>(tensor.sizes[i] - 1),
                                  static_cast<std::uint64_t>(tensor.strides[i]));
    const auto next = step ? checked_add(last, *step) : std::nullopt;
    overflow = !next;
    if (next) last = *next;
  }
  const auto end_element = overflow ? std::nullopt : checked_add(last, std::uint64_t{1});
  const auto end_byte = end_element ? checked_mul(*end_element, itemsize) : std::nullopt;
  if (!end_byte || *end_byte > tensor.storage->nbytes()) {
    fail(ErrorCode::tensor_out_of_bounds, "tensor ", quoted_for_message(name), " reaches past the ",
         tensor.storage->nbytes(), " bytes of its storage");
  }
  return *nbytes;
}

void check_utf8(std::string_view text, std::string_view what) {
  if (!is_valid_utf8(text)) {
    fail(ErrorCode::write_value_unsupported, what, " ", quoted_for_message(text),
         " is not UTF-8, which a safetensors header requires");
  }
}

Plan plan_tensors(const Value& root) {
  if (!root.is_dict()) {
    fail(ErrorCode::convert_not_flat, "safetensors stores a dict of str -> Tensor; the root is a ",
         value_kind_name(root.kind()));
  }
  std::vector<PlannedTensor> planned;
  planned.reserve(root.as_dict().size());
  for (const auto& [key, value] : root.as_dict()) {
    if (!key.is_string()) {
      fail(ErrorCode::convert_not_flat, "key ", key.to_string(), " is an int; safetensors names tensors by str");
    }
    const std::string& name = key.as_string();
    if (!value.is_tensor()) {
      fail(ErrorCode::convert_not_flat, "the value of ", quoted_for_message(name), " is a ",
           value_kind_name(value.kind()), ", not a Tensor");
    }
    // Names a conforming reader would refuse or misread.
    if (name.empty()) fail(ErrorCode::write_value_unsupported, "a tensor has an empty name");
    if (name == kMetadataKey) {
      fail(ErrorCode::write_value_unsupported, "a tensor is named __metadata__, which safetensors reserves");
    }
    check_utf8(name, "tensor name");
    const TensorData& tensor = value.as_tensor();
    const auto dtype_name = dtype_safetensors_name(tensor.dtype);
    if (!dtype_name) {
      fail(ErrorCode::write_value_unsupported, "tensor ", quoted_for_message(name), " has dtype ",
           holdpoint::dtype_name(tensor.dtype), ", which safetensors cannot name");
    }
    if (tensor.conjugate || tensor.negative) {
      // safetensors stores elements only: the stored bits would read back unconjugated.
      fail(ErrorCode::write_value_unsupported, "tensor ", quoted_for_message(name), " is a ",
           tensor.conjugate ? "conjugate" : "negative", " view, which safetensors has no place for; resolve it first");
    }
    planned.push_back(PlannedTensor{&name, &tensor, *dtype_name, checked_view_bytes(name, tensor)});
  }
  Plan plan;
  plan.layout.resize(planned.size());
  for (std::size_t i = 0; i < planned.size(); ++i) plan.layout[i] = i;
  std::sort(plan.layout.begin(), plan.layout.end(), [&](std::size_t i, std::size_t j) {
    const std::size_t x = dtype_bits(planned[i].tensor->dtype);
    const std::size_t y = dtype_bits(planned[j].tensor->dtype);
    return x != y ? x > y : *planned[i].name < *planned[j].name;
  });
  std::uint64_t offset = 0;
  for (const std::size_t i : plan.layout) {
    const auto end = checked_add(offset, planned[i].nbytes);
    if (!end) fail(ErrorCode::write_value_unsupported, "the tensors together exceed 2^64 bytes");
    planned[i].offset = offset;
    offset = *end;
  }
  plan.tensors = std::move(planned);
  return plan;
}

std::string build_header(const std::vector<PlannedTensor>& planned,
                         const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    append_json_string(header, kMetadataKey);
    header.append(":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      check_utf8(key, "metadata key");
      check_utf8(value, "metadata value");
      if (!first) header.push_back(',');
      first = false;
      append_json_string(header, key);
      header.push_back(':');
      append_json_string(header, value);
    }
    header.append("}");
    if (!planned.empty()) header.push_back(',');
  }
  for (std::size_t i = 0; i < planned.size(); ++i) {
    const PlannedTensor& entry = planned[i];
    if (i != 0) header.push_back(',');
    append_json_string(header, *entry.name);
    header.append(":{\"dtype\":\"").append(entry.dtype_name).append("\",\"shape\":[");
    for (std::size_t d = 0; d < entry.tensor->sizes.size(); ++d) {
      if (d != 0) header.push_back(',');
      header.append(std::to_string(entry.tensor->sizes[d]));
    }
    header.append("],\"data_offsets\":[")
        .append(std::to_string(entry.offset))
        .append(",")
        .append(std::to_string(entry.offset + entry.nbytes))
        .append("]}");
  }
  header.push_back('}');
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// Writes a non-contiguous view in C order through `scratch`. The index space
// is split at the outermost dimension k-1 whose trailing block no longer fits
// the scratch buffer: dimensions before it are walked one index at a time, and
// dimension k-1 is cut into runs of whole trailing blocks that fit.
void write_strided(io::ByteSink& sink, const TensorData& tensor, std::vector<std::byte>& scratch) {
  const std::size_t rank = tensor.sizes.size();
  // block[k]: bytes of the trailing dimensions [k, rank).
  std::vector<std::uint64_t> block(rank + 1);
  block[rank] = tensor.itemsize();
  for (std::size_t i = rank; i-- > 0;) block[i] = block[i + 1] * static_cast<std::uint64_t>(tensor.sizes[i]);
  if (block[0] <= kScratchBytes) {
    scratch.resize(block[0]);
    tensor.copy_contiguous_bytes(scratch.data());
    sink.write(scratch);
    return;
  }
  std::size_t k = 0;
  while (block[k] > kScratchBytes) ++k;
  const std::size_t split = k - 1;
  const auto rows_per_run = static_cast<std::int64_t>(kScratchBytes / block[k]);
  scratch.resize(static_cast<std::size_t>(rows_per_run) * block[k]);

  TensorData run;
  run.dtype = tensor.dtype;
  run.storage = tensor.storage;
  run.sizes.assign(tensor.sizes.begin() + static_cast<std::ptrdiff_t>(split), tensor.sizes.end());
  run.strides.assign(tensor.strides.begin() + static_cast<std::ptrdiff_t>(split), tensor.strides.end());
  std::vector<std::int64_t> index(split, 0);
  bool more = true;
  while (more) {
    std::int64_t base = tensor.storage_offset;
    for (std::size_t d = 0; d < split; ++d) base += index[d] * tensor.strides[d];
    for (std::int64_t row = 0; row < tensor.sizes[split]; row += rows_per_run) {
      const std::int64_t rows = std::min(rows_per_run, tensor.sizes[split] - row);
      run.sizes[0] = rows;
      run.storage_offset = base + row * tensor.strides[split];
      run.copy_contiguous_bytes(scratch.data());
      sink.write(std::span<const std::byte>(scratch.data(), static_cast<std::size_t>(rows) * block[k]));
    }
    more = false;
    for (std::size_t d = split; d-- > 0;) {
      if (++index[d] < tensor.sizes[d]) {
        more = true;
        break;
      }
      index[d] = 0;
    }
  }
}

}  // namespace

void write_safetensors(io::ByteSink& sink, const Value& root, const std::map<std::string, std::string>& metadata) {
  const Plan plan = plan_tensors(root);
  const std::string header = build_header(plan.tensors, metadata);

  std::array<std::byte, 8> length;
  std::uint64_t header_bytes = header.size();
  for (auto& byte : length) {
    byte = static_cast<std::byte>(header_bytes & 0xFF);
    header_bytes >>= 8;
  }
  sink.write(length);
  sink.write(std::as_bytes(std::span<const char>(header)));

  std::vector<std::byte> scratch;
  for (const std::size_t i : plan.layout) {
    const PlannedTensor& entry = plan.tensors[i];
    if (entry.nbytes == 0) continue;
    const TensorData& tensor = *entry.tensor;
    if (tensor.is_contiguous()) {
      // Whole bytes for every dtype: checked_view_bytes refused a sub-byte
      // view that starts inside a byte.
      const std::byte* data =
          tensor.storage->data() + static_cast<std::size_t>(tensor.storage_offset) * dtype_bits(tensor.dtype) / 8;
      sink.write_stable(std::span<const std::byte>(data, static_cast<std::size_t>(entry.nbytes)));
    } else {
      write_strided(sink, tensor, scratch);
    }
  }
}

}  // namespace holdpoint::format
