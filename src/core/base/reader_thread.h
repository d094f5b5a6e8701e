// Whether read_snapshot reads a large file on a thread of its own while its
// SnapshotParser runs (holdpoint/base/snapshot.h): by default where the
// machine has three cores or more; on fewer, the parser's thread reads as far
// as each await_bytes needs. Tests set it to take either way.
#pragma once

#include <atomic>

namespace holdpoint::io {

enum class ReaderThread { by_cores, always, never };
extern std::atomic<ReaderThread> reader_thread_mode;

// Whether the machine has a core each for a reader, a hasher and a parser:
// the one test behind both by_cores defaults (this one, and the zip reader's
// format::parse_while_read_mode).
bool cores_for_reading_while_parsing();

}  // namespace holdpoint::io
