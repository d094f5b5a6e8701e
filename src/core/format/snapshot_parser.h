// A SnapshotParser (holdpoint/base/snapshot.h) that parses a checkpoint while
// the file is still being read and hashed, for the reads that return a mapping:
// load_checkpoint_mapping and RunDirectory::load. `out` is filled on the
// calling thread and may be used only if the read returns normally (the
// digest matched); a big-endian archive is byte-swapped only after that.
#pragma once

#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint::format {

inline io::SnapshotParser checkpoint_parser(LoadedMapping& out, const Limits& limits) {
  return [&out, &limits](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
    ParseContext context;
    context.before_in_place_write = reading.await_digest;
    context.await_digest = reading.await_digest;
    context.bytes_hashed = reading.bytes_hashed;
    context.await_bytes = reading.await_bytes;
    context.read_ahead_from = reading.read_ahead_from;
    context.release_spent_bytes = true;  // `out` keeps the tensors; nothing else reads the buffer
    out = parse_checkpoint_bytes(buffer->bytes(), buffer, limits, context);
    out.snapshot = buffer;
  };
}

}  // namespace holdpoint::format
