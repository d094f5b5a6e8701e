// LoadOptions::trust, applied before a byte of a file is parsed: the file's
// signature is checked under the trust policy, and the digest it vouches for
// becomes the digest the file must have (docs/threat-model.md, "Signatures").
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "holdpoint/base/file_system.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint::format {

// The digest `path` must have: the signed one when options.trust holds a
// signature for it (signature_* codes when it fails; the caller's
// expected_sha256 and the file's size must agree with the statement:
// signature_statement_mismatch), else options.expected_sha256.
std::optional<Sha256Digest> expected_digest(const std::filesystem::path& path, const LoadOptions& options);

// The same for the file `name` of `directory`, its `<name>.sig` read through
// the directory (run directories, sharded steps). Errors name no path: the
// caller adds it.
std::optional<Sha256Digest> expected_digest(io::Directory& directory, const std::string& name,
                                            const TrustPolicy& trust, const std::optional<Sha256Digest>& expected);

// The checks both share: `signature` (of the file `name`, `size` bytes on
// disk) verifies under `trust` and its statement names that file, that size
// and, when given, the `expected` digest. Returns the signed digest.
Sha256Digest signed_digest(const SignatureFile& signature, const TrustPolicy& trust, const std::string& name,
                           std::optional<std::uint64_t> size, const std::optional<Sha256Digest>& expected);

}  // namespace holdpoint::format
