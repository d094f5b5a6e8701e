// Opening a file for reading: the one way every reader in holdpoint opens a
// file, so that what it then reads is a regular file and nothing else.
//
// Both functions open without blocking (O_RDONLY | O_NONBLOCK | O_CLOEXEC),
// check with fstat that the file is regular, clear O_NONBLOCK and return the
// descriptor with the size fstat saw. Opening a FIFO with a blocking open()
// waits for a writer forever, and so would every later read; a device node
// can answer endlessly. Checking before the open (stat, then open) leaves a
// window in which the name can be replaced; checking the opened descriptor
// does not.
//
// Failure contract: throws holdpoint::Error naming the path:
//   - io_not_regular_file: a FIFO, directory, socket or device node; and, for
//     open_regular_for_reading_at, a symlink (never followed inside a folder);
//   - `when_absent` (io_open_failed unless given): the name does not exist;
//   - io_open_failed: any other open or fstat failure (permissions, EMFILE).
// The size is what fstat saw at the open. A file that grows or shrinks later
// is the reader's to detect (file_changed_during_read).
//
// Thread-safety: stateless; safe from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "base/file_descriptor.h"
#include "holdpoint/base/error.h"

namespace holdpoint::io {

struct RegularFile {
  FileDescriptor fd;
  std::uint64_t size = 0;
};

// A path the user named. Symlinks are followed, at every component: the user
// chose the path, and Hugging Face's cache links snapshot names to blobs.
RegularFile open_regular_for_reading(const std::filesystem::path& path,
                                     ErrorCode when_absent = ErrorCode::io_open_failed);

// `name`, a single component (no '/', not "." or ".."; invalid_argument
// otherwise), opened relative to the folder open at `directory_fd` and never
// through a symlink (O_NOFOLLOW), so that it resolves inside that folder
// whatever the folder's contents are. A name inside a folder was written by
// whoever wrote the folder, not chosen by the user: a link there may lead
// anywhere. `label` is the path that errors name (normally folder / name).
RegularFile open_regular_for_reading_at(int directory_fd, const std::string& name, const std::filesystem::path& label,
                                        ErrorCode when_absent = ErrorCode::io_open_failed);

// The folder at `path` opened for open_regular_for_reading_at (O_DIRECTORY;
// the path the user named may itself be a symlink); `when_absent` where it
// does not exist, io_open_failed otherwise.
FileDescriptor open_directory_for_reading(const std::filesystem::path& path,
                                          ErrorCode when_absent = ErrorCode::io_open_failed);

}  // namespace holdpoint::io
