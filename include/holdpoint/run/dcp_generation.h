// torch.distributed.checkpoint (DCP) generations of a run directory
// (docs/dcp.md): holdpoint as DCP's storage layer.
//
//   checkpoints/step-00000005.pt             the step manifest, kind "dcp": every
//                                            file of the folder with its size and
//                                            the SHA-256 of each item's bytes
//   checkpoints/step-00000005.shards/        a DCP folder that stock
//     .metadata                              FileSystemReader also loads
//     __0_0.distcp, __1_0.distcp, ...
//
// Each rank publishes its data files (write_dcp_file): staged, each item
// digested while it streams (on the writer's hashing thread), fsynced, read
// back, renamed without replacing, the folder fsynced. The coordinator then
// publishes `.metadata` the same way and commits the step manifest with
// RunDirectory::commit, so LATEST moves only once every file is durable.
//
// Items are digested one by one, not whole files: a rank that reads some
// items of a file checks exactly the bytes it reads (read_dcp_ranges). The
// ranges tile each file, so checking every range checks every byte; the step
// manifest's own SHA-256 (in LATEST, the index and its signature) covers the
// digests. docs/format.md, "What each digest proves".
//
// Failure contract: throws holdpoint::Error naming the folder and file:
// shard_size_mismatch and shard_digest_mismatch (bytes that are not the ones
// recorded), dcp_file_unlisted (a file the manifest does not list),
// dcp_range_unlisted (.metadata places an item where the manifest has no
// range), run_shards_invalid (the folder or a listed file missing),
// io_not_regular_file (a symlink or FIFO; never followed), and the DCP and
// pickle codes of a `.metadata` that does not decode.
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "holdpoint/base/file_system.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/format/value.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint {

// One item of a data file: bytes written as they are (a DCP BYTE_IO item,
// a torch.save of a value), or a PyTorch archive of `archive` (a tensor item,
// which torch.load(weights_only=True) reads back).
struct DcpItem {
  std::span<const std::byte> bytes;
  const Value* archive = nullptr;
};

struct DcpWriteOptions {
  bool durable = true;  // fsync the file and the folder
  Limits limits;        // of the archives written
};

// Publishes `name` (is_dcp_file_name) in `folder`, one range per item, and
// returns its record for the step manifest. Nothing is visible under `name`
// unless every byte was written, synced and read back.
DcpFile write_dcp_file(const std::filesystem::path& folder, const std::string& name, std::span<const DcpItem> items,
                       const DcpWriteOptions& options = {});

// Checks a DCP generation against its step manifest (kind dcp): the folder
// holds exactly the listed files, each a regular file of its recorded size,
// `.metadata` has its recorded digest, and every item it places is exactly
// one listed range. With `hash_data`, every data file is also read once, in
// bounded memory, and each range checked against its digest; without, that
// is left to the reads (read_dcp_ranges), so that opening a run does not
// cost a read of the whole generation on every rank.
void verify_dcp_generation(io::Directory& checkpoints, const Manifest& step_manifest, const Limits& limits,
                           bool hash_data = true);

// True when a parsed file is the step manifest of a DCP generation
// (root {"holdpoint": manifest of kind dcp}).
bool is_dcp_manifest(const LoadedMapping& mapping);

// One range read by read_dcp_ranges: its bytes, in a buffer that `owner`
// keeps alive (every range of one call shares one buffer).
struct DcpRangeBytes {
  std::span<std::byte> bytes;
  std::shared_ptr<const void> owner;
};

// Reads ranges of the listed file `file` of the DCP folder `folder` into
// private memory, each checked against its recorded digest before it is
// returned. `wanted` holds indexes into file.ranges. The ranges go into one
// io::Buffer (huge pages where the kernel has free ones: filling fresh small
// pages cost more than the SHA-256 here), in the order given.
std::vector<DcpRangeBytes> read_dcp_ranges(const std::filesystem::path& folder, const DcpFile& file,
                                           std::span<const std::size_t> wanted);

}  // namespace holdpoint
