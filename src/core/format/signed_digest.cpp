#include "format/signed_digest.h"

#include <system_error>

#include "base/fail.h"
#include "holdpoint/base/signature.h"

namespace holdpoint::format {

std::optional<Sha256Digest> expected_digest(const std::filesystem::path& path, const LoadOptions& options) {
  if (!options.trust) return options.expected_sha256;
  const std::optional<SignedStatement> statement = check_signature(path, *options.trust);
  if (!statement) return options.expected_sha256;
  const auto mismatch = [&](const std::string& what) {
    return Error(ErrorCode::signature_statement_mismatch, what).with_path(path.string());
  };
  if (options.expected_sha256 && !(*options.expected_sha256 == statement->sha256)) {
    throw mismatch("the signed statement vouches for SHA-256 " + statement->sha256.hex() + ", the caller expects " +
                   options.expected_sha256->hex());
  }
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (!error && size != statement->size) {
    throw mismatch(detail::concat("the signed statement says ", statement->size, " bytes, the file has ", size));
  }
  return statement->sha256;
}

}  // namespace holdpoint::format
