// safetensors reader and writer.
//
// Reader: the checks of the reference implementation (huggingface/safetensors
// read_metadata + validate) plus duplicate keys, JSON depth, tensor count and
// rank limits, exact u64 integers, and shapes whose nonzero product fits int64
// (docs/format.md, "safetensors"). Like the reference, it allows JSON
// whitespace before and after the header object. Tensors are zero-copy views
// into `file` whose storages hold `owner`; their data is not necessarily
// aligned. Every dtype of the specification reads, the sub-byte ones (F4,
// F6_*) as DTypes with a bit size and no itemsize.
// Writer: header padded with spaces to a multiple of 8 and listing tensors in
// the mapping's order (so keys read back in the order written); the data
// buffer ordered by descending element bits then name, so every tensor is
// naturally aligned (the reference writer orders by its dtype list, which
// aligns the same way but may order same-size dtypes differently).
//
// Failure contract: throws holdpoint::Error with a safetensors_* code naming
// the tensor and the bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/format/value.h"
#include "holdpoint/base/byte_sink.h"

namespace holdpoint::format {

struct SafetensorsFile {
  Value root;  // an ordered dict: tensor name -> tensor, in header order
  std::map<std::string, std::string> metadata;
  std::vector<RecordInfo> tensors;  // name, absolute offset, size
  std::uint64_t header_bytes = 0;
};

// A plausible safetensors prefix: '{' at byte 8, or JSON whitespace (space,
// tab, LF, CR) from byte 8 up to a '{' inside a header length that fits the
// file.
bool looks_like_safetensors(std::span<const std::byte> file) noexcept;
// The same from the first bytes of a file of `file_size` bytes; nullopt when
// `head` ends inside the whitespace before the '{'.
std::optional<bool> looks_like_safetensors(std::span<const std::byte> head, std::uint64_t file_size) noexcept;
// The whitespace rule alone, for a caller that follows a long run of it past
// the head: true at the first '{', false at the first byte that is neither
// '{' nor JSON whitespace, nullopt when `bytes` are all whitespace.
std::optional<bool> safetensors_whitespace_verdict(std::span<const std::byte> bytes) noexcept;

SafetensorsFile read_safetensors(std::span<const std::byte> file, const std::shared_ptr<const void>& owner,
                                 const Limits& limits);

// read_safetensors for a reader that holds only the front of the file:
// `head` is the first bytes of a file of `file_size` bytes, at least
// safetensors_head_bytes(head, file_size, limits) of them. `make_storage`
// gives each tensor its storage from the absolute offset and size of its
// bytes (which are not read).
using SafetensorsStorageMaker = std::function<std::shared_ptr<const Storage>(std::uint64_t offset, std::uint64_t size)>;
SafetensorsFile read_safetensors_header(std::span<const std::byte> head, std::uint64_t file_size,
                                        const SafetensorsStorageMaker& make_storage, const Limits& limits);
// How many leading bytes read_safetensors_header reads of a file whose first
// bytes are `head` (at least 8 of them, or the whole file): the length prefix
// and the header it announces, or only the prefix when the header cannot be
// read (too large for Limits, or longer than the file).
std::uint64_t safetensors_head_bytes(std::span<const std::byte> head, std::uint64_t file_size, const Limits& limits);

// `root` must be a dict of str -> tensor (any layout; non-contiguous views are
// written in C order). Throws convert_not_flat otherwise; write_value_unsupported
// for a dtype safetensors cannot name, an empty, non-UTF-8 or "__metadata__"
// tensor name, or non-UTF-8 metadata; tensor_geometry_invalid /
// tensor_out_of_bounds for a view that does not fit its storage (or, for a
// sub-byte dtype, is strided or starts inside a byte);
// safetensors_misaligned_slice for a sub-byte tensor whose bits do not fill
// whole bytes.
// requires_grad and is_parameter are not stored (the format has no place).
void write_safetensors(io::ByteSink& sink, const Value& root, const std::map<std::string, std::string>& metadata = {});

}  // namespace holdpoint::format
