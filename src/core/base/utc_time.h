// The current time as UTC ISO 8601 with seconds ("2026-11-30T23:59:59Z"),
// for records people read (index.json, selection records, export proofs).
//
// Thread-safety: safe from any thread (gmtime_r).
#pragma once

#include <string>

namespace holdpoint::detail {

std::string utc_timestamp();

}  // namespace holdpoint::detail
