// Writer for PyTorch zip checkpoints: the restricted pickle of a Value plus
// one stored record per storage, streamed through a ByteSink.
//
// Record order is torch 2.x's: data.pkl, byteorder, data/0 .. data/N-1 in
// numeric order, version (torch 1.13 omits byteorder and orders the storage
// records as strings; readers do not care). Storage bytes go from tensor memory to the sink without a copy
// (ByteSink::write_stable), so the Value must stay alive until the sink is
// finished.
//
// Failure contract: throws holdpoint::Error (write_*, pickle_nesting_limit,
// or the sink's io_* codes). On a throw the sink holds a partial archive that
// the caller must abandon.
#pragma once

#include <cstdint>
#include <string>

#include "holdpoint/limits.h"
#include "holdpoint/value.h"
#include "io/byte_sink.h"

namespace holdpoint::format {

struct PtWriteOptions {
  bool torch_1_13_compatible = false;
  std::string archive_name = "archive";
  Limits limits;
};

struct PtWriteResult {
  std::uint64_t tensor_count = 0;
  std::uint64_t storage_count = 0;
};

PtWriteResult write_pt(io::ByteSink& sink, const Value& root, const PtWriteOptions& options = {});

}  // namespace holdpoint::format
