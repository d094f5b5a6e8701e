// The restricted pickle emitter: writes a Value as a protocol-2 pickle that
// Python's torch.load(weights_only=True) reads.
//
// Emits only: dict (EMPTY_DICT + MARK..SETITEMS), OrderedDict
// (collections.OrderedDict REDUCE, plus BUILD of `_metadata` when present),
// list (MARK..APPENDS), tuple, str (BINUNICODE), int (BININT1/2, BININT,
// 8-byte LONG1), float (BINFLOAT, or 0-d float64 tensors in torch 1.13
// compatibility mode), bool, None, bytes (_codecs.encode, or uint8 tensors in
// compatibility mode) and tensors (torch._utils._rebuild_tensor_v2 over a
// persistent id; _rebuild_tensor_v3 for dtypes without a legacy storage class).
// A tensor object that appears twice is written once and re-referenced with
// BINGET; views of one storage name one storage key.
//
// Failure contract: throws Error(write_value_unsupported) for a value the mode
// cannot represent, write_storage_dtype_conflict when one storage is viewed
// with two dtypes, pickle_nesting_limit past Limits::max_nesting_depth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "holdpoint/format/limits.h"
#include "holdpoint/format/value.h"

namespace holdpoint::format {

struct PickleWriteOptions {
  bool torch_1_13_compatible = false;
  Limits limits;  // max_nesting_depth applies
};

// One storage record the pickle refers to, in key order "0", "1", ...
struct PickledStorage {
  std::string key;
  std::shared_ptr<const Storage> storage;  // the whole storage is written
  std::uint64_t nbytes = 0;  // the record size (the whole storage)
  // A 0-d float64 or uint8 tensor the torch 1.13 mode made for a float or a
  // bytes value: keyed from 10^12 up, apart from the value's own storages,
  // so a second pickling of the same structure keys the real storages alike.
  bool synthesized = false;
};

struct PickleWriteResult {
  std::vector<std::byte> pickle;
  std::vector<PickledStorage> storages;  // in first-reference order
  std::uint64_t tensor_count = 0;
};

PickleWriteResult write_pickle(const Value& root, const PickleWriteOptions& options = {});

}  // namespace holdpoint::format
