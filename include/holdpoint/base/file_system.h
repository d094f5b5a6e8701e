// FileSystem: every file effect holdpoint has goes through this interface.
//
// Operations on names are made relative to an open Directory (a directory file
// descriptor in the POSIX implementation), and never follow a symlink at the
// final component: a symlink planted at a staging name, a generation name or a
// run directory is refused, not followed (io_not_regular_file /
// io_open_failed). Reads return a private snapshot hashed while it is read.
//
// Two implementations: posix_file_system() for real use, and the fault-
// injecting in-memory double of tests/support/fault_file_system.h, which can
// fail the N-th operation, simulate a crash after any operation, and drop or
// tear data written since the last fsync. Everything that publishes or
// recovers files takes a FileSystem&, so the same code runs against both.
//
// Failure contract: every operation throws holdpoint::Error with an io_* code
// naming the path and the system error.
//
// Thread-safety: a Directory is used by one thread at a time; distinct
// Directory objects may be used concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/base/snapshot.h"

namespace holdpoint {

// How a save checks the file it wrote, after writing and before the rename
// makes it visible (docs/publication.md, "Read-back").
enum class ReadBack : std::uint8_t {
  // The default. The staging file is mapped from the page cache, without a
  // copy or a second SHA-256 pass, and parsed; every zip record's CRC-32 is
  // checked against the CRC computed from the source memory while writing.
  // (A file without CRCs, such as safetensors, is re-read and re-hashed.)
  // Proves the file system returns the bytes written, as far as the kernel's
  // cache; it cannot see what the medium holds.
  cached,
  // Also fsyncs, drops the file's cached pages (posix_fadvise DONTNEED) and
  // re-reads it from the device into private memory, re-computing the
  // SHA-256: proves what the device returns. Costs one more read and one more
  // SHA-256 pass.
  device,
};

}  // namespace holdpoint

namespace holdpoint::io {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual void write(std::span<const std::byte> bytes) = 0;
  // Asks the system to start writing back [offset, offset + size); a hint.
  virtual void start_writeback(std::uint64_t offset, std::uint64_t size) {}
  virtual void sync() = 0;
  virtual void close() = 0;
};

struct FileInfo {
  enum class Type : std::uint8_t { regular, directory, symlink, other };
  Type type = Type::regular;
  std::uint64_t size = 0;
};

class Directory {
 public:
  virtual ~Directory() = default;
  virtual const std::filesystem::path& path() const = 0;

  // Creates `name` for writing; fails (io_open_failed) if anything, a symlink
  // included, already has that name.
  virtual std::unique_ptr<WritableFile> create_exclusive(const std::string& name) = 0;
  // Reads the regular file `name` whole into private memory while hashing it
  // (see read_snapshot, which also says how `parse` may run while the hash
  // finishes); a symlink is refused.
  virtual Snapshot read(const std::string& name, std::uint64_t max_bytes,
                        const std::optional<Sha256Digest>& expected = std::nullopt,
                        const ReadProgress& progress = {}, const SnapshotParser& parse = {}) = 0;
  // The regular file `name` mapped from the page cache, neither copied nor
  // hashed (the snapshot's sha256 is left zero); writes to the buffer stay
  // private. Only for a file this process has just written and no one else
  // writes (publish's read-back). The default reads a private snapshot.
  virtual Snapshot map(const std::string& name, std::uint64_t max_bytes) { return read(name, max_bytes); }
  // Asks the kernel to drop the clean cached pages of `name`, so that the
  // next read comes from the device. The default does nothing.
  virtual void drop_cached_pages(const std::string& name) {}
  // Renames within this directory. Without `replace`, an existing `to` makes
  // the rename fail (io_rename_failed) and nothing changes.
  virtual void rename(const std::string& from, const std::string& to, bool replace) = 0;
  virtual void link(const std::string& from, const std::string& to) = 0;
  virtual void unlink(const std::string& name) = 0;
  // Removes the empty subdirectory `name` (rmdir); a symlink or file in its
  // place, or a non-empty directory, fails with io_write_failed.
  virtual void remove_directory(const std::string& name) = 0;
  virtual std::vector<std::string> list() = 0;
  virtual std::optional<FileInfo> stat(const std::string& name) = 0;
  // fsync of the directory itself, which makes creations, renames and
  // unlinks in it durable.
  virtual void sync() = 0;
  // A subdirectory, created if asked (and the creation made durable); a
  // symlink in its place is refused.
  virtual std::unique_ptr<Directory> open_subdirectory(const std::string& name, bool create) = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Opens (and with `create`, creates with parents) a directory; the last
  // component must not be a symlink.
  virtual std::unique_ptr<Directory> open_directory(const std::filesystem::path& path, bool create) = 0;
};

FileSystem& posix_file_system();

}  // namespace holdpoint::io
