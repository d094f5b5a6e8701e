// The .sha256 sidecar: a file `<name>.sha256` beside the file `name`, holding
// the one line sha256sum writes and `sha256sum -c` checks:
//
//   <64 lowercase hex digits><two spaces><name>\n
//
// (sha256sum's binary-mode marker, a space and '*', is read in place of the
// two spaces). `name` is the bare file name, never a path. save_mapping, the
// run directory's commit and export write it; read_sha256_sidecar
// (`holdpoint verify --sidecar`) and the run directory's verification read it
// (docs/cli.md, docs/publication.md "Sidecar").
//
// Failure contract: parse_sidecar throws the caller's ErrorCode (the public
// read's sidecar_invalid, a run generation's run_sidecar_invalid), with a
// message naming the sidecar and what is wrong with it.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "holdpoint/base/error.h"
#include "holdpoint/base/sha256.h"

namespace holdpoint::format {

inline constexpr std::string_view kSidecarSuffix = ".sha256";
// One line of 64 digits, two characters and a file name (NAME_MAX is 255):
// readers refuse a larger file before reading it.
inline constexpr std::uint64_t kMaxSidecarBytes = 4096;

// The sidecar's text for the file `name`.
std::string sidecar_text(const Sha256Digest& digest, std::string_view name);

// The digest `text`, the sidecar of the file `name`, records; throws `code`
// unless `text` is exactly one such line, ending in a newline, naming `name`.
Sha256Digest parse_sidecar(std::string_view text, std::string_view name, ErrorCode code);

}  // namespace holdpoint::format
