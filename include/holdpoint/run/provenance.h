// Provenance of checkpoint files: the statement a signature vouches for
// (holdpoint/base/signature.h), as read from a checkpoint itself.
//
// Failure contract: throws holdpoint::Error with the reader's code when the
// file does not verify; nothing is signed for a file that is not well formed.
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <filesystem>

#include "holdpoint/base/signature.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/loaded_mapping.h"

namespace holdpoint {

// The statement for `file`, after a full verification of it (streamed, in
// bounded memory): its name, size and SHA-256, and, for a holdpoint
// checkpoint, the step (the progress component's global_step, or a sharded
// step's), the config identity (the load-bearing digest) and the profile its
// manifest records. `created` and `previous_sha256` are left to the signer.
SignedStatement checkpoint_statement(const std::filesystem::path& file, const LoadOptions& options = {});
// The same from a mapping already read and verified, for the file `file_name`.
SignedStatement checkpoint_statement(const LoadedMapping& mapping, std::string file_name);

}  // namespace holdpoint
