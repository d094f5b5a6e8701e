// A SnapshotParser (holdpoint/base/snapshot.h) that parses a checkpoint while
// its SHA-256 is still being computed, for the reads that return a mapping:
// load_checkpoint_mapping and RunDirectory::load. `out` is filled on the
// reading thread and may be used only if the read returns normally (the
// digest matched); a big-endian archive is byte-swapped only after that.
#pragma once

#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint::format {

inline io::SnapshotParser checkpoint_parser(LoadedMapping& out, const Limits& limits) {
  return [&out, &limits](const std::shared_ptr<io::Buffer>& buffer, const std::function<void()>& await_digest,
                         const std::function<std::size_t()>& bytes_hashed) {
    ParseContext context;
    context.before_in_place_write = await_digest;
    context.await_digest = await_digest;
    context.bytes_hashed = bytes_hashed;
    context.release_spent_bytes = true;  // `out` keeps the tensors; nothing else reads the buffer
    out = parse_checkpoint_bytes(buffer->bytes(), buffer, limits, context);
    out.snapshot = buffer;
  };
}

}  // namespace holdpoint::format
