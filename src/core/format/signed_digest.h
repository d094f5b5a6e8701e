// LoadOptions::trust, applied before a byte of a file is parsed: the file's
// signature is checked under the trust policy, and the digest it vouches for
// becomes the digest the file must have (docs/threat-model.md, "Signatures").
#pragma once

#include <filesystem>
#include <optional>

#include "holdpoint/base/sha256.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint::format {

// The digest `path` must have: the signed one when options.trust holds a
// signature for it (signature_* codes when it fails; the caller's
// expected_sha256 and the file's size must agree with the statement:
// signature_statement_mismatch), else options.expected_sha256.
std::optional<Sha256Digest> expected_digest(const std::filesystem::path& path, const LoadOptions& options);

}  // namespace holdpoint::format
