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
//   - each item's range is read into private memory and parsed as the
//     untrusted .pt archive it is, under the same Limits;
//   - a tensor's chunks are checked to tile it exactly and assembled (a
//     tensor saved as one chunk is that chunk, zero-copy);
//   - the nested state dict is rebuilt from planner_data as DCP's own
//     unflatten_state_dict does (an int path element makes a list where a
//     container is new).
// A DCP folder carries no digest: each archive's CRC-32s catch accidental
// corruption, nothing authenticates the folder.
//
// Failure contract: throws holdpoint::Error naming the file: the pickle and
// zip codes of whatever file is malformed, dcp_metadata_invalid,
// dcp_item_missing, dcp_range_invalid or dcp_transform_unsupported
// (holdpoint/base/error.h).
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <filesystem>

#include "holdpoint/format/limits.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

// The `.metadata` file of a DCP folder, decoded as data.
Value read_distributed_checkpoint_metadata(const std::filesystem::path& metadata_file, const Limits& limits = {});

// The state dict a DCP folder holds, every item read and checked.
Value load_distributed_checkpoint(const std::filesystem::path& folder, const Limits& limits = {});

// True when `folder` is a directory with a `.metadata` file.
bool is_distributed_checkpoint(const std::filesystem::path& folder);

}  // namespace holdpoint
