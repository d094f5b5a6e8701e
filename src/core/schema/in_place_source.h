// The file side of a resume in place's second pass (docs/resume-contract.md,
// "Resuming in place"), without LibTorch: the C++ TrainingState
// (checkpoint/in_place.h) and the Python package's TrainingState both use it.
//
// After the first pass (format/resume_scan.h) verified the file and took a
// Poly1305 tag of each large record, an InPlaceSource
//   - journals live bytes before they are written over (journal(),
//     journal_in_background(): an unnamed file, O_TMPFILE, in the journal
//     folder, gone when the source is), and puts them back (restore());
//   - checks, before any byte moves (begin()), that the open file is the one
//     verified: same device, inode, size and modification time
//     (file_changed_during_read otherwise, nothing written);
//   - reads a record into its destination in pieces of kPieceBytes and checks
//     its tag over the bytes as they lie there (read_into();
//     file_changed_during_read when they differ, io_read_failed when reading
//     fails).
// It never applies anything: its callers decide where records go and undo
// their own changes with restore() when anything fails.
//
// Thread-safety: read_into() may run on several threads for different
// records and destinations; the rest on one thread.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/file_descriptor.h"
#include "format/resume_scan.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint::schema {

inline constexpr std::size_t kPieceBytes = std::size_t{8} << 20;

class InPlaceSource {
 public:
  // `file` is the descriptor the first pass reads (kept open), `identity`
  // the fstat taken when it was opened.
  InPlaceSource(const io::RegularFile& file, const struct stat& identity, std::filesystem::path journal_directory);
  ~InPlaceSource();
  InPlaceSource(const InPlaceSource&) = delete;
  InPlaceSource& operator=(const InPlaceSource&) = delete;

  // Journals `ranges` (live bytes a resume may write over) on a second
  // thread, while the first pass runs; the live state does not change during
  // a resume. The ranges must stay valid until begin(), which raises the
  // thread's failure.
  void journal_in_background(std::vector<std::pair<std::byte*, std::uint64_t>> ranges);
  // The first pass's records of the absent storages, by storage identity.
  void set_records(std::unordered_map<const void*, format::AbsentRecord> records) { records_ = std::move(records); }
  const std::unordered_map<const void*, format::AbsentRecord>& records() const noexcept { return records_; }

  // The absent storages' digests of `kind` by identity, for component
  // digests: the first pass's XXH3-128, or SHA-256 read again from the file
  // (files that predate "storage_digest").
  StorageDigests storage_digests(StorageDigestKind kind) const;
  // The same, added to `digests` (of its kind).
  void add_storage_digests(StorageDigests& digests) const;

  // Waits for the background journal (raising its failure) and checks the
  // file's identity. Call before the first byte moves.
  void begin();
  // Journals [live, live + size) unless the background journal holds it.
  void journal_unless_held(std::byte* live, std::uint64_t size);
  // Reads `record` into `destination` and checks its tag. `fresh`, when the
  // destination is a fresh Buffer, is faulted in a piece at a time.
  void read_into(std::byte* destination, const format::AbsentRecord& record, io::Buffer* fresh = nullptr);
  // Puts the journaled bytes back, newest first. Returns what failed ("" when
  // nothing did).
  std::string restore() noexcept;

  std::uint64_t bytes_filled() const noexcept { return bytes_filled_; }
  std::uint64_t bytes_journaled() const noexcept { return journal_end_; }

 private:
  struct Journaled {
    std::byte* live;
    std::uint64_t size;
    std::uint64_t at;  // in the journal
  };
  void journal(std::byte* live, std::uint64_t size);
  void check_identity() const;

  const io::RegularFile& file_;
  struct stat identity_;
  std::filesystem::path journal_directory_;
  std::unordered_map<const void*, format::AbsentRecord> records_;
  io::FileDescriptor journal_fd_;
  std::uint64_t journal_end_ = 0;
  std::vector<Journaled> journaled_;
  std::unordered_map<const std::byte*, std::uint64_t> held_;  // live start -> bytes journaled
  std::thread background_;
  std::exception_ptr background_failure_;
  std::atomic<bool> stop_background_{false};
  std::atomic<std::uint64_t> bytes_filled_{0};
};

}  // namespace holdpoint::schema
