#include "holdpoint/run/provenance.h"

#include "holdpoint/format/scan.h"
#include "holdpoint/schema/config_identity.h"
#include "holdpoint/schema/manifest.h"
#include "schema/resume_checks.h"

namespace holdpoint {

SignedStatement checkpoint_statement(const std::filesystem::path& file, const LoadOptions& options) {
  const LoadedMapping mapping = scan_checkpoint(file, options, ScanKeeps::verdict);
  SignedStatement statement;
  statement.file = file.filename().string();
  statement.size = mapping.file_bytes;
  statement.sha256 = mapping.sha256;
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
