// Reader for whole checkpoint files in memory: routes PyTorch zip archives,
// legacy PyTorch streams and safetensors files to their parsers and applies
// the record-level policy of a weights checkpoint (docs/format.md, "Records").
//
// The bytes must be private (a snapshot): a big-endian archive is byte-swapped
// in place, and tensors of the result are zero-copy views that keep `owner`
// alive.
//
// Failure contract: throws holdpoint::Error with the specific code of the
// first check that fails; never executes anything from the file.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/format/limits.h"

namespace holdpoint::format {

struct ParsedFile {
  Value root;
  FileFormat format = FileFormat::pytorch_zip;
  FormatMarkers markers;
  std::vector<RecordInfo> records;
  std::uint64_t tensor_count = 0;
  std::uint64_t storage_count = 0;
};

// Which parser `file` belongs to; throws the specific code for files that are
// recognisably something else (empty, TorchScript-era containers, tar, Git LFS
// pointers) and unknown_format for anything unrecognised.
FileFormat detect_format(std::span<const std::byte> file);

ParsedFile read_checkpoint_file(std::span<std::byte> file, const std::shared_ptr<const void>& owner,
                                const Limits& limits);

}  // namespace holdpoint::format
