// Reader for PyTorch's legacy (non-zip) stream: torch.save before 1.6, or with
// _use_new_zipfile_serialization=False.
//
// Layout (docs/format.md, "Legacy stream"): five pickles back to back (magic
// number, protocol version 1001, sys_info, the object, the list of storage
// keys), then for each key in that list an 8-byte little-endian element count
// followed by the storage bytes. The object pickle is decoded by the same
// restricted VM as zip archives, with 6-tuple persistent ids.
//
// Failure contract: throws holdpoint::Error (legacy_* and the VM's codes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "format/pickle/pickle_reader.h"
#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/format/value.h"

namespace holdpoint::format {

struct LegacyStream {
  Value root;
  PickleResult object;  // stats of the object pickle (root moved out)
  std::uint64_t protocol_version = 0;
  std::vector<RecordInfo> storages;  // one per storage, named "storage/<key>"
};

// True if `file` starts the way a legacy stream does (a pickle whose first
// value is the magic number), so format detection can route to this reader.
bool looks_like_legacy_stream(std::span<const std::byte> file) noexcept;

// `owner` keeps `file` alive for the tensors of the result.
LegacyStream read_legacy_stream(std::span<const std::byte> file, const std::shared_ptr<const void>& owner,
                                const Limits& limits);

}  // namespace holdpoint::format
