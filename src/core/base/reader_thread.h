// Whether read_snapshot reads a large file on a thread of its own while its
// SnapshotParser runs (holdpoint/base/snapshot.h): by default where the
// machine has three cores or more; on fewer, the parser's thread reads as far
// as each await_bytes needs. Tests set it to take either way.
#pragma once

#include <atomic>

namespace holdpoint::io {

enum class ReaderThread { by_cores, always, never };
extern std::atomic<ReaderThread> reader_thread_mode;

}  // namespace holdpoint::io
