// Publishing a whole file under a path through io::publish on the POSIX file
// system (staging, fsync, read-back verification, rename, directory fsync),
// plus an optional sha256sum sidecar published the same way. Used by
// save_mapping and TrainingState::save; run directories call io::publish
// themselves.
#pragma once

#include <filesystem>
#include <functional>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/byte_sink.h"
#include "base/publish.h"

namespace holdpoint::detail {

struct PublishOptions {
  bool durable = true;
  bool write_sidecar = false;
  // save_mapping replaces an existing file, like torch.save; run directories
  // never replace a generation.
  bool replace = true;
  ReadBack read_back = ReadBack::cached;
  // The file is a zip archive whose verifier checks every record's CRC-32, so
  // the cached read-back may map the page cache instead of re-hashing.
  bool zip_records = true;
};

// `write` streams the file's bytes into the sink and may fill the counts of
// the result; `verify` checks the re-read bytes (default: they parse as a
// checkpoint); file_bytes and sha256 are set here.
SaveResult publish_file(const std::filesystem::path& path, const PublishOptions& options,
                        const std::function<void(io::ByteSink&, SaveResult&)>& write,
                        const io::PublishVerifier& verify = {});

}  // namespace holdpoint::detail
