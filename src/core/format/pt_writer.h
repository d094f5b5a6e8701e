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
#include <functional>
#include <string>
#include <vector>

#include "holdpoint/format/limits.h"
#include "base/xxh3.h"
#include "holdpoint/format/value.h"
#include "holdpoint/base/byte_sink.h"

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

// One storage record written by write_pt_storages_first, with the XXH3-128 of
// its bytes computed while they streamed (the storage digest of a manifest's
// component digests; the whole file's SHA-256 is computed by the sink).
struct WrittenStorage {
  std::string key;           // "0", "1", ...
  const void* identity = nullptr;  // Storage::identity()
  io::Xxh3Digest xxh3{};
};

// Writes the storage records first, digesting each as it streams, then asks
// `final_root` for the root to pickle (a checkpoint's manifest carries the
// digests of what was just written) and writes data.pkl, byteorder and
// version last: one pass over the tensor bytes. The final root must reference
// exactly the storages of `provisional_root`, in the same first-reference
// order (invalid_argument otherwise); readers do not care about record order.
PtWriteResult write_pt_storages_first(io::ByteSink& sink, const Value& provisional_root,
                                      const std::function<Value(const std::vector<WrittenStorage>&)>& final_root,
                                      const PtWriteOptions& options = {});

}  // namespace holdpoint::format
