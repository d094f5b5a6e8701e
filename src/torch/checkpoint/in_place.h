// The second pass of a resume in place (docs/resume-contract.md, "Resuming in
// place"). The first, format::scan_for_resume (format/resume_scan.h), has
// verified the file and built its tree, in which every large storage is
// absent: a size, an offset in the file, and a Poly1305 tag under a key only
// this process knows. Once every check and every component's validate
// passed, fill() puts those bytes where they end up:
//   - for a model (ModuleState, whose apply copies every tensor into the live
//     one), where the live tensor at the same key has the same dtype and
//     shape, both are contiguous and the file's tensor views all of its
//     storage: straight into the live tensor's memory, after its old bytes
//     went to the journal;
//   - elsewhere: into fresh memory, handed over (Storage::handed_over), which
//     an optimizer adopts as its new state instead of copying it; other
//     components copy from it.
// Each storage is read in pieces of kPieceBytes into its destination (on two
// threads, each taking half the bytes) and its
// tag is computed over the bytes as they lie there; a tag that differs (the
// file changed after the first pass) or a failed read puts the journal back
// and throws file_changed_during_read or io_read_failed. Before any byte
// moves, the open file's identity (device, inode, size, modification
// time) is compared with the first pass's: a file changed between the
// passes is refused with nothing written.
//
// fill() returns the tree with those tensors viewing their destinations; the
// components' own apply then finds the bytes in place (copy_into skips a
// copy onto itself). If anything fails later, restore() puts back every live
// byte the journal holds; the fresh memory simply goes with the tree.
//
// The journal is an unnamed file (O_TMPFILE) in `journal_directory`, the
// checkpoint's own folder by default: it holds the old bytes of the live
// tensors written over, and it is gone when the resume ends, whatever the
// outcome. Its pages are left to the page cache: those never written back
// cost no I/O, and under a memory limit the kernel writes them back and
// reclaims them. journal_in_background() writes it on a
// second thread while the first pass runs (the model's tensors are known
// before the file is): the live state does not change during a resume, and
// the first pass is bound by SHA-256 on one core.
//
// Memory: the pieces are the live tensors' own; besides them, the tree's
// metadata and the journal's index.
//
// Thread-safety: one thread calls; the second pass reads on two.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <exception>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "schema/in_place_source.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/state/component.h"

namespace holdpoint::checkpoint {

// Below this many bytes the second pass reads on one thread.
inline constexpr std::uint64_t kParallelReadBytes = std::uint64_t{32} << 20;

class InPlaceFill {
 public:
  // `file` is the descriptor the first pass reads (kept open), `identity` the
  // fstat taken when it was opened.
  InPlaceFill(const io::RegularFile& file, const struct stat& identity, std::filesystem::path journal_directory);
  ~InPlaceFill();
  InPlaceFill(const InPlaceFill&) = delete;
  InPlaceFill& operator=(const InPlaceFill&) = delete;

  // Starts journaling the live tensors of `components` that fill() may
  // write into (a model's) on a second thread. Its failure is raised by
  // fill(), before any byte moves.
  void journal_in_background(const std::vector<Component*>& components);
  // The first pass's records of the absent storages.
  void set_records(std::unordered_map<const void*, format::AbsentRecord> absent) {
    source_.set_records(std::move(absent));
  }
  // Another file whose absent storages fill() reads too (the other shards of
  // a sharded checkpoint): its own first pass's records, and its own
  // identity check before any byte moves. The journal stays one.
  void add_file(const io::RegularFile& file, const struct stat& identity,
                std::unordered_map<const void*, format::AbsentRecord> absent);
  // The absent storages' digests (schema::InPlaceSource::storage_digests), of every file.
  StorageDigests storage_digests(StorageDigestKind kind) const;

  // `states` are the components' validated states in `root`, each with its
  // component. Returns `root` with every absent storage filled.
  Value fill(const Value& root, const std::vector<std::pair<Component*, const Value*>>& states);

  // Puts the journaled bytes back into the live tensors, newest first.
  // Returns what failed ("" when nothing did).
  std::string restore() noexcept { return source_.restore(); }

  std::uint64_t bytes_filled() const noexcept {
    std::uint64_t total = source_.bytes_filled();
    for (const auto& source : more_) total += source->bytes_filled();
    return total;
  }
  std::uint64_t bytes_journaled() const noexcept { return source_.bytes_journaled(); }

 private:
  struct Destination {
    std::byte* live = nullptr;          // the live tensor's bytes, or null: fresh memory
    std::shared_ptr<const void> owner;  // keeps `live` alive
  };

  void plan(const Value& file, const Value& live, std::unordered_map<const void*, Destination>& plan) const;
  // Whether a file holds the absent storage `identity`, and the source whose file does (null: none).
  bool holds(const void* identity) const;
  schema::InPlaceSource* source_of(const void* identity);

  schema::InPlaceSource source_;                              // the first file, and the journal
  std::vector<std::unique_ptr<schema::InPlaceSource>> more_;  // add_file's
  std::vector<Value> journal_sources_;  // the captures the background journal reads
};

}  // namespace holdpoint::checkpoint
