// FaultFileSystem: an in-memory io::FileSystem that fails the N-th operation,
// simulates a crash after any operation, and drops or tears data written
// since the last fsync (after leveldb's FaultInjectionTestEnv and SQLite's
// I/O-error and crash tests).
//
// Model. Directories and regular files are nodes, as in a real file system,
// so a Directory handle keeps naming the same directory after a rename, and a
// WritableFile keeps writing to its file after an unlink. Each directory has
// current entries and durable entries; Directory::sync() makes the current
// ones durable. Each file has current data and durable data;
// WritableFile::sync() makes the current data durable. A crash sets every
// directory and file back to its durable state (in tear_unsynced mode a file
// keeps a seeded-random prefix of its unsynced bytes, possibly with a zeroed
// 512-byte sector in it; directory entries always revert, since journaling
// file systems make a rename all-or-nothing).
//
// Creating a directory is durable at once: open_subdirectory(create) syncs
// the parent, exactly as the POSIX implementation fsyncs it, and
// open_directory(create) treats every directory it creates as synced into its
// parent (the POSIX implementation fsyncs each parent it creates in; a test that wants a
// run directory to vanish in a crash cannot express that with this double).
//
// Refusals mirror posix_file_system.cpp code for code and strerror text for
// strerror text: a symlink at the last component is never followed
// (io_open_failed, "Too many levels of symbolic links"), reading a directory
// is io_not_regular_file, rename without replace onto an existing name is
// io_rename_failed and changes nothing. Names passed to Directory must be
// plain names (no '/', not "." or ".."); anything else is invalid_argument.
//
// Operations. Every call of an io::FileSystem, io::Directory or
// io::WritableFile method except Directory::path() and
// WritableFile::start_writeback() (a hint that cannot fail) is one operation:
// it is counted, logged ("write /run/x 4096") and may be failed. Operations
// refused because of a crash are neither counted nor logged. The helpers
// below (exists, contents, write_file, ...) are the test's view from outside:
// never counted, never failed, usable while crashed.
//
// Faults. fail_at(n, ...) and crash_after(n) name the n-th operation counted
// from the call (n = 1 is the next operation). An injected failure happens
// before the operation does anything: a failed write appends no byte, a
// failed rename renames nothing, a failed close still closes the handle (as
// close(2) does). crash_after(n) lets the n-th operation finish (succeed or
// fail), then crashes and throws SimulatedCrash out of it; from then on every
// operation throws SimulatedCrash until restart(). Handles opened before a
// crash stay dead after restart(): the process that held them died.
//
// Thread-safety: every method takes one mutex, so handles may be used from
// any thread (async saves write on a background thread). Handles share the
// state with the FaultFileSystem and may outlive it.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/file_system.h"

namespace holdpoint::testing {

// The errno an injected failure reports; the ErrorCode is the one the POSIX
// implementation raises for the failing operation (io_write_failed for a
// write, io_sync_failed for an fsync, ...).
enum class FaultKind : std::uint8_t {
  io_error,        // EIO, "Input/output error"
  no_space,        // ENOSPC, "No space left on device"
  quota_exceeded,  // EDQUOT, "Disk quota exceeded"
};

enum class CrashMode : std::uint8_t {
  drop_unsynced,  // every file loses all bytes written since its last sync
  tear_unsynced,  // every file keeps a random prefix of them, maybe with a zeroed sector
};

// Thrown out of the operation after which a simulated crash happened, and
// out of every operation until restart(). Deliberately not a holdpoint::Error:
// code that handles I/O errors must not be able to handle a power cut.
class SimulatedCrash : public std::exception {
 public:
  explicit SimulatedCrash(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

class FaultFileSystem final : public io::FileSystem {
 public:
  // `seed` drives tear_unsynced crashes, so a failing test can be replayed.
  explicit FaultFileSystem(std::uint64_t seed = 1);
  ~FaultFileSystem() override;
  FaultFileSystem(const FaultFileSystem&) = delete;
  FaultFileSystem& operator=(const FaultFileSystem&) = delete;

  std::unique_ptr<io::Directory> open_directory(const std::filesystem::path& path, bool create) override;

  // --- fault injection ---
  // The n-th operation from now (n >= 1) fails with `kind`; with
  // `persistent`, so does every later one until clear_faults(). One fault is
  // armed at a time; a second call replaces the first.
  void fail_at(std::uint64_t n, FaultKind kind, bool persistent);
  // After the n-th operation from now (n >= 1), crash (see the header
  // comment) and throw SimulatedCrash.
  void crash_after(std::uint64_t n, CrashMode mode = CrashMode::drop_unsynced);
  // Disarms fail_at and crash_after; does not undo a crash (see restart()).
  void clear_faults();
  // A power cut and reboot right now: everything reverts to its durable
  // state and every open handle dies, but new operations work at once (no
  // SimulatedCrash is thrown and restart() is not needed).
  void crash(CrashMode mode = CrashMode::drop_unsynced);
  // Ends the crashed state that crash_after started; handles opened before
  // the crash stay dead (their operations throw SimulatedCrash).
  void restart();
  bool crashed() const;

  // Operations counted since construction or reset_counter().
  std::uint64_t operation_count() const;
  // One line per counted operation, in order, e.g.
  // "write /run/.x.staging-1-2 4096"; an injected failure appends
  // " -> injected EIO" (ENOSPC, EDQUOT), the crash point " -> crash".
  std::vector<std::string> operation_log() const;
  // Zeroes operation_count() and clears the log; armed faults keep the number
  // of operations they still wait for.
  void reset_counter();

  // --- the test's view from outside (never counted or failed) ---
  // Paths are absolute, "/run/checkpoints"; no component may be a symlink
  // (they are named, never followed). Misuse throws invalid_argument.
  bool exists(const std::filesystem::path& path) const;
  // Current (not necessarily durable) bytes of a regular file.
  std::string contents(const std::filesystem::path& path) const;
  // Creates or replaces a regular file, durably, creating missing parent
  // directories; for setting up a scenario.
  void write_file(const std::filesystem::path& path, std::string_view bytes);
  // Flips every bit of the byte at `offset`, in current and durable data
  // (bit rot on the medium).
  void corrupt(const std::filesystem::path& path, std::uint64_t offset);
  // Sorted current entry names of a directory.
  std::vector<std::string> list(const std::filesystem::path& directory) const;
  // Creates the symlink directory/name -> target, durably (an attacker's or a
  // careless user's link); target need not exist.
  void plant_symlink(const std::filesystem::path& directory, const std::string& name, const std::string& target);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace holdpoint::testing
