// Reading a torch.distributed.checkpoint (DCP) folder as a Value, without
// executing anything.
//
// DCP's FileSystemWriter leaves a `.metadata` file, a plain pickle of its
// Metadata dataclasses, and `.distcp` files in which each item is a byte
// range holding one torch.save archive: a chunk of a tensor, or a non-tensor
// value pickled whole. DCP's own loader unpickles those values with
// weights_only=False; this reader does not:
//   - `.metadata` goes through the restricted pickle VM, where DCP's
//     dataclasses are record objects: dicts of their fields with the class
//     under "__class__", and storage_data, keyed by MetadataIndex records, a
//     list of (key, value) pairs (docs/format.md, "Record objects");
//   - every name inside the folder (`.metadata`, the `.distcp` files) is
//     opened relative to the folder and never through a symlink
//     (io_not_regular_file), so nothing outside the folder is read; the
//     folder's own path may be a symlink;
//   - each item's range is read into private memory once and parsed as the
//     untrusted .pt archive it is, under the same Limits; references to one
//     range share its Value, and each is charged at the range's length
//     against Limits::max_distributed_checkpoint_bytes, as is each tensor
//     assembled from chunks (dcp_expanded_bytes_limit);
//   - a tensor's chunks are checked to tile it exactly, in O(n log n)
//     (dcp_chunk_corners_limit past 16 Mi corners, 2^dimensions split per
//     chunk), and assembled (a tensor saved as one chunk is that chunk,
//     zero-copy);
//   - the nested state dict is rebuilt from planner_data as DCP's own
//     unflatten_state_dict does (an int path element makes a list where a
//     container is new).
// A DCP folder carries no digest: each archive's CRC-32s catch accidental
// corruption, nothing authenticates the folder.
//
// Failure contract: throws holdpoint::Error naming the file: the pickle and
// zip codes of whatever file is malformed, io_not_regular_file (a symlink,
// FIFO, directory or device where a file is expected), dcp_metadata_invalid,
// dcp_item_missing, dcp_range_invalid, dcp_transform_unsupported,
// dcp_expanded_bytes_limit or dcp_chunk_corners_limit (holdpoint/base/error.h).
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/format/limits.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

// The `.metadata` file of the DCP folder `folder`, decoded as data.
Value read_distributed_checkpoint_metadata(const std::filesystem::path& folder, const Limits& limits = {});

// The state dict a DCP folder holds, every item read and checked.
Value load_distributed_checkpoint(const std::filesystem::path& folder, const Limits& limits = {});

// `.metadata` bytes already in memory, decoded as read_distributed_checkpoint_metadata
// decodes the file (errors name `label`).
Value decode_distributed_checkpoint_metadata(std::span<const std::byte> bytes, const std::filesystem::path& label,
                                             const Limits& limits = {});

// Where an item of a DCP folder lies.
struct DcpItemLocation {
  std::string fqn;
  std::string file;  // a name inside the folder
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// Every item that decoded `.metadata` (`metadata`, read from `label`) places,
// its storage_data checked as load_distributed_checkpoint checks it
// (dcp_metadata_invalid, dcp_range_invalid, dcp_transform_unsupported).
std::vector<DcpItemLocation> distributed_checkpoint_item_locations(const Value& metadata,
                                                                   const std::filesystem::path& label);

// True when `folder` is a directory with an entry named `.metadata` (of any
// type: load_distributed_checkpoint refuses one that is not a regular file).
bool is_distributed_checkpoint(const std::filesystem::path& folder);

}  // namespace holdpoint
