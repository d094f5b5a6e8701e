// JSON string literals for the JSON holdpoint writes byte for byte itself: the
// safetensors header and the canonical configuration JSON whose SHA-256
// identifies a config (docs/resume-contract.md). Both must match what Python's
// json.dumps(..., ensure_ascii=False) writes, so there is one escaping rule.
//
// Thread-safety: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace holdpoint::detail {

// Appends `text` as a JSON string literal, escaped as json.dumps(ensure_ascii=False)
// escapes it: '"' and '\' backslashed, \b \f \n \r \t by their short escapes,
// other bytes below 0x20 as \u00xx (lowercase hex), everything else raw.
// `text` should be valid UTF-8; its bytes are copied, not checked.
void append_json_string(std::string& out, std::string_view text);

}  // namespace holdpoint::detail
