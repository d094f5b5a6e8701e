// What a read with PickleOptions::drop_tensors (and so scan_checkpoint with
// ScanKeeps::verdict) must give, checked against the full read of the same
// bytes. Header-only, for the unit tests and the fuzz targets.
#pragma once

#include <cstring>

#include "holdpoint/format/value.h"

namespace holdpoint::testing {

// True when `dropped` is `full` with its tensors let go: a dict has no entry
// for a tensor, or None where it was built from pairs (OrderedDict([...]));
// a list or tuple has None in a tensor's place; a root tensor stays, with the
// same description; everything else is equal, in the same order.
inline bool reads_as_dropped(const Value& dropped, const Value& full, bool root = true) {
  if (full.is_tensor()) {
    if (!root) return dropped.is_none();
    if (!dropped.is_tensor()) return false;
    const TensorData& a = dropped.as_tensor();
    const TensorData& b = full.as_tensor();
    return a.dtype == b.dtype && a.sizes == b.sizes && a.strides == b.strides && a.storage_offset == b.storage_offset;
  }
  if (full.is_sparse_tensor()) {
    // Dropped as a tensor is, checked all the same.
    return root ? equal_content(dropped, full) : dropped.is_none();
  }
  if (dropped.kind() != full.kind()) return false;
  switch (full.kind()) {
    case ValueKind::none: return true;
    case ValueKind::boolean: return dropped.as_bool() == full.as_bool();
    case ValueKind::integer: return dropped.as_int() == full.as_int();
    case ValueKind::floating: {
      const double a = dropped.as_double(), b = full.as_double();
      return std::memcmp(&a, &b, sizeof a) == 0;
    }
    case ValueKind::string: return dropped.as_string() == full.as_string();
    case ValueKind::bytes: return dropped.as_bytes() == full.as_bytes();
    case ValueKind::big_integer: return dropped.as_big_integer() == full.as_big_integer();
    case ValueKind::bytearray:
    case ValueKind::complex_number:
    case ValueKind::device:
    case ValueKind::dtype:
    case ValueKind::layout:
    case ValueKind::meta_tensor: return equal_content(dropped, full);  // no bytes: never dropped
    case ValueKind::sparse_tensor: return false;                        // handled above
    case ValueKind::list:
    case ValueKind::tuple:
    case ValueKind::set:
    case ValueKind::size: {
      const auto& a = dropped.as_list();
      const auto& b = full.as_list();
      if (a.size() != b.size()) return false;
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (!reads_as_dropped(a[i], b[i], false)) return false;
      }
      return true;
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      const Dict& a = dropped.as_dict();
      const Dict& b = full.as_dict();
      std::size_t next = 0;
      for (const auto& [key, value] : b) {
        const bool taken = next < a.size() && a.at_index(next).first == key;
        if ((value.is_tensor() || value.is_sparse_tensor()) && !taken) continue;
        if (!taken || !reads_as_dropped(a.at_index(next).second, value, false)) return false;
        ++next;
      }
      if (next != a.size()) return false;
      if (!a.metadata() || !b.metadata()) return !a.metadata() && !b.metadata();
      return reads_as_dropped(*a.metadata(), *b.metadata(), false);
    }
    case ValueKind::tensor: break;
  }
  return false;
}

}  // namespace holdpoint::testing
