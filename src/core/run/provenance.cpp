#include "holdpoint/run/provenance.h"

#include "holdpoint/format/scan.h"
#include "holdpoint/schema/config_identity.h"
#include "holdpoint/schema/manifest.h"
#include "base/fail.h"
#include "schema/resume_checks.h"

namespace holdpoint {

SignedStatement checkpoint_statement(const std::filesystem::path& file, const LoadOptions& options) {
  const LoadedMapping verdict = scan_checkpoint(file, options, ScanKeeps::verdict);
  try {
    return checkpoint_statement(verdict, file.filename().string());
  } catch (const Error&) {
    // A manifest whose config holds floats as 0-d tensors (a step manifest,
    // a torch 1.13-compatible file): the verdict dropped them. Read the file
    // whole, pinned to the digest just computed.
    LoadOptions pinned = options;
    pinned.expected_sha256 = verdict.sha256;
    pinned.trust.reset();
    return checkpoint_statement(load_checkpoint_mapping(file, pinned), file.filename().string());
  }
}

SignedStatement checkpoint_statement(const LoadedMapping& mapping, std::string file_name) {
  SignedStatement statement;
  statement.file = std::move(file_name);
  statement.size = mapping.file_bytes;
  if (!mapping.sha256) {
    detail::fail(ErrorCode::invalid_argument, "a signed statement needs the file's SHA-256; load ", statement.file,
                 " with LoadOptions::compute_sha256 or an expected digest");
  }
  statement.sha256 = *mapping.sha256;
  if (find_manifest_entry(mapping.root)) {
    const Manifest manifest = Manifest::of_root(mapping.root);
    statement.profile = manifest.profile;
    statement.config_identity = manifest.config.load_bearing_digest();
    statement.step = static_cast<std::uint64_t>(manifest.sharding ? manifest.sharding->step
                                                                   : schema::progress_step_of(mapping.root));
  }
  return statement;
}

}  // namespace holdpoint
