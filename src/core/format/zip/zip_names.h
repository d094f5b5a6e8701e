// The naming rules for zip entries, shared by the reader (which rejects
// archives that break them) and the writer (which refuses to produce them).
//
// A name is 1..kMaxNameBytes bytes of strict UTF-8 (no overlong forms,
// surrogates or code points past U+10FFFF), without control characters (C0,
// DEL, C1), without a backslash (a separator to Windows tools), not starting
// with '/', and every '/'-separated component is non-empty and not '.' or '..'.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace holdpoint::format::zip {

// Why `name`'s bytes are unacceptable ("byte 3 is a control character"), or ""
// when they are fine. Does not look at path components.
std::string name_character_problem(std::string_view name);

bool is_valid_path_component(std::string_view component) noexcept;

// Both checks over a whole name; "" when the name is acceptable.
std::string entry_name_problem(std::string_view name);

// Names equal up to ASCII case: PyTorch looks records up case-insensitively,
// so the reader rejects and the writer never produces two such names.
bool equal_folded(std::string_view a, std::string_view b) noexcept;

// A hash of the ASCII-lowercased name (names equal up to case hash equal):
// SipHash-2-4 under the process key (base/keyed_hash.h), so that names built
// in advance cannot make many share a slot.
std::uint64_t folded_hash(std::string_view name);

}  // namespace holdpoint::format::zip
