#include "format/signed_digest.h"

#include <system_error>

#include "base/fail.h"

namespace holdpoint::format {

Sha256Digest signed_digest(const SignatureFile& signature, const TrustPolicy& trust, const std::string& name,
                           std::optional<std::uint64_t> size, const std::optional<Sha256Digest>& expected) {
  trust.verify(signature);
  const SignedStatement& statement = signature.statement;
  if (statement.file != name) {
    detail::fail(ErrorCode::signature_statement_mismatch, "the signed statement names '", statement.file, "', not '",
                 name, "'");
  }
  if (expected && !(*expected == statement.sha256)) {
    detail::fail(ErrorCode::signature_statement_mismatch, "the signed statement vouches for SHA-256 ",
                 statement.sha256.hex(), ", the caller expects ", expected->hex());
  }
  if (size && *size != statement.size) {
    detail::fail(ErrorCode::signature_statement_mismatch, "the signed statement says ", statement.size,
                 " bytes, the file has ", *size);
  }
  return statement.sha256;
}

std::optional<Sha256Digest> expected_digest(const std::filesystem::path& path, const LoadOptions& options) {
  if (!options.trust) return options.expected_sha256;
  const std::optional<SignatureFile> signature = read_signature_file(path);
  if (!signature) {
    check_signature(path, *options.trust);  // signature_missing when one is required
    return options.expected_sha256;
  }
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  try {
    return signed_digest(*signature, *options.trust, path.filename().string(),
                         error ? std::nullopt : std::optional<std::uint64_t>(size), options.expected_sha256);
  } catch (const Error& failure) {
    throw failure.with_path((failure.code() == ErrorCode::signature_statement_mismatch ? path
                                                                                         : signature_path(path)).string());
  }
}

std::optional<Sha256Digest> expected_digest(io::Directory& directory, const std::string& name,
                                            const TrustPolicy& trust, const std::optional<Sha256Digest>& expected) {
  const std::string signature_name = name + ".sig";
  const std::optional<SignatureFile> signature = read_signature(directory, signature_name);
  if (!signature) {
    if (trust.required) {
      detail::fail(ErrorCode::signature_missing, "the trust policy requires a signature and there is no ",
                   signature_name);
    }
    return expected;
  }
  const auto file = directory.stat(name);
  return signed_digest(*signature, trust, name, file ? std::optional<std::uint64_t>(file->size) : std::nullopt,
                       expected);
}

}  // namespace holdpoint::format
