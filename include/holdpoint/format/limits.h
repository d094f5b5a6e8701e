// Limits: the bounds every reader checks before it allocates or loops.
//
// A hostile file can only make a reader do work proportional to these bounds.
// Defaults accept every honest PyTorch checkpoint up to 256 GiB; tighten them
// when the expected input is known (a service loading small adapters, say).
// See docs/format.md ("Limits") for the rationale of each default.
//
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>

namespace holdpoint {

struct Limits {
  // Whole file.
  std::uint64_t max_file_bytes = std::uint64_t{256} << 30;

  // Zip container.
  std::uint64_t max_records = std::uint64_t{1} << 20;
  std::uint64_t max_central_directory_bytes = std::uint64_t{128} << 20;

  // Pickle VM.
  std::uint64_t max_pickle_bytes = std::uint64_t{64} << 20;
  std::uint64_t max_opcodes = std::uint64_t{64} << 20;
  std::uint64_t max_stack_items = std::uint64_t{4} << 20;
  std::uint32_t max_mark_depth = 64;
  std::uint32_t max_nesting_depth = 64;
  std::uint64_t max_memo_entries = std::uint64_t{16} << 20;
  std::uint64_t max_string_bytes = std::uint64_t{16} << 20;
  std::uint64_t max_container_elements = std::uint64_t{16} << 20;  // total, all containers
  std::uint64_t max_expanded_nodes = std::uint64_t{64} << 20;      // counts shared references fully

  // Tensors and storages.
  std::uint64_t max_tensors = std::uint64_t{4} << 20;
  std::uint32_t max_tensor_rank = 32;
  std::uint64_t max_tensor_numel = std::uint64_t{1} << 48;
  std::uint64_t max_tensor_logical_bytes = std::uint64_t{1} << 40;
  // A view may describe at most this many times the bytes of its storage (plus
  // 4 KiB), which bounds stride-0 expansion of a small storage.
  std::uint32_t max_view_expansion = 4;

  // torch.distributed.checkpoint folders: the bytes of the items the
  // metadata references, each counted in full every time it is referenced
  // (a range read once and shared is still charged per reference), plus the
  // tensors assembled from several chunks. An honest folder references each
  // byte once: twice max_file_bytes admits one of max_file_bytes whose
  // tensors are all assembled.
  std::uint64_t max_distributed_checkpoint_bytes = std::uint64_t{512} << 30;

  // safetensors header.
  std::uint64_t max_safetensors_header_bytes = 100'000'000;
  std::uint32_t max_json_depth = 16;

  // torch 2.x can write archives with CRC fields of 0
  // (torch.serialization.set_crc32_options(False)); accept those only on request.
  bool allow_zero_crc = false;
};

}  // namespace holdpoint
