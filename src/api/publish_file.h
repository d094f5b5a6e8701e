// The one routine that makes a file appear under its final name: a staging
// file beside it, streamed through a ByteSink while hashed, fsynced, renamed
// over the target, the directory fsynced, and optionally a sha256sum sidecar
// published the same way. On any failure the staging file is removed and the
// target is untouched. (Run directories add verification before the rename.)
#pragma once

#include <filesystem>
#include <functional>

#include "holdpoint/checkpoint_mapping.h"
#include "io/byte_sink.h"

namespace holdpoint::detail {

struct PublishOptions {
  bool durable = true;
  bool write_sidecar = false;
};

// `write` streams the file's bytes into the sink and may fill the counts of
// the result; file_bytes and sha256 are set here.
SaveResult publish_file(const std::filesystem::path& path, const PublishOptions& options,
                        const std::function<void(io::ByteSink&, SaveResult&)>& write);

}  // namespace holdpoint::detail
