// The canonical JSON encoding of a Value, shared by `holdpoint inspect --json`
// and the interop tests' Python oracle (tests/python/oracle.py):
//   None -> null, bool -> true/false, int -> {"int": "<decimal>"},
//   float -> {"float": "<16 hex digits of the IEEE-754 bits>"},
//   str -> {"str": s}, bytes -> {"bytes": "<hex>"}, list/tuple -> {"list"|"tuple": [...]},
//   dict/OrderedDict -> {"dict"|"odict": [[key, value], ...]} (key {"str"} or {"int"}),
//   tensor -> {"tensor": {dtype, shape, stride, offset, requires_grad, parameter,
//              storage, [sha256 of the elements in C order]}}.
// Storages are numbered "0", "1", ... in first-reference order.
#pragma once

#include <nlohmann/json.hpp>

#include "holdpoint/format/value.h"

namespace holdpoint::cli {

nlohmann::ordered_json value_to_json(const Value& value, bool tensor_digests);

}  // namespace holdpoint::cli
