// Export: a self-contained, verified copy of generations of a run directory
// in a new directory DEST, with LOADING.md (how to load it) and
// RECOVERY-PROOF.json (what was copied and which checks passed). DEST is
// itself a run directory. `holdpoint export` is this function (docs/cli.md).
//
// Order of work, and why:
//   1. DEST must not exist or be an empty directory: an export never mixes
//      with, or overwrites, anything.
//   2. RUN is opened read-only; the selected generations must verify there
//      (LATEST verified on opening, every copy read against its recorded
//      SHA-256), so an export never launders a damaged file.
//   3. Every file is written into DEST through io::publish (staged, fsynced,
//      re-read, checkpoints parsed by the restricted reader, renamed without
//      replacing, directory fsynced), in the run directory's commit order:
//      generations and sidecars, index.json, BEST, then LATEST. A sharded
//      generation's shards (checked whole in the source first) are published
//      into DEST's step-N.shards/ before its step manifest, whose verifier
//      checks them there.
//   4. Checks at DEST: each copy re-read for size and SHA-256 against the
//      source; DEST opened as a run directory with recover = false must need
//      no recovery, with the expected LATEST/BEST; LATEST loaded back through
//      RunDirectory::load and its manifest read; a sharded LATEST is read back
//      whole with read_sharded_checkpoint and its components merged.
//   5. LOADING.md, then RECOVERY-PROOF.json last: an export without
//      RECOVERY-PROOF.json did not finish and should be deleted.
//
// Selection: `latest` (the default) copies the generation LATEST names;
// `best` the one BEST names (it becomes DEST's LATEST too); `all` every
// committed generation, skipping, and listing in the proof, older ones that
// do not verify in the source (a generation is skipped only for an error
// about its bytes, never for an environment error: is_environment_error).
// `latest` and `all` need a verified LATEST in the source.
//
// Failure contract: throws ExportError, a holdpoint::Error with the code of
// the first failure: export_destination_invalid for a DEST that exists and
// is not an empty directory (or is a symlink), run_pointer_invalid for a
// LATEST or BEST that is missing or does not verify, the reader's and io_*
// codes for a file that does not copy or verify. ExportError also says
// whether RUN failed to open and whether DEST may hold a partial export
// (which then has no RECOVERY-PROOF.json). The source run is never changed.
//
// Thread-safety: export_run keeps no state between calls and may run on any
// thread. Nothing else may write into DEST during an export; the checks at
// DEST (step 4) are there to fail an export that was written to concurrently.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/run/run_directory.h"

namespace holdpoint {

// The files an export writes into DEST besides the run directory's own.
inline constexpr std::string_view kExportLoadingFile = "LOADING.md";
inline constexpr std::string_view kExportProofFile = "RECOVERY-PROOF.json";

enum class ExportSelection { latest, best, all };

// "latest", "best", "all": the proof's "selection" and the CLI's flag names.
std::string_view export_selection_name(ExportSelection selection) noexcept;

struct ExportOptions {
  ExportSelection selection = ExportSelection::latest;
  // The command that asked for the export, recorded in the proof ("command")
  // and in LOADING.md.
  std::vector<std::string> command_line;
  // Progress of each large file read or written, given a label such as
  // "reading RUN/checkpoints/step-00000005.pt"; may return an empty function.
  std::function<io::ReadProgress(const std::string& label)> progress;
};

struct ExportResult {
  // RECOVERY-PROOF.json's text, exactly as written into DEST
  // (docs/cli.md gives its fields).
  std::string proof_json;
  std::vector<GenerationInfo> generations;  // exported, by step
  GenerationInfo latest;                    // DEST's LATEST, loaded back from DEST
  std::optional<GenerationInfo> best;       // DEST's BEST, when the source's BEST was exported
  std::vector<GenerationCheck> skipped;     // not exported: they do not verify in the source
};

class ExportError : public Error {
 public:
  ExportError(const Error& error, bool source_unopened, bool destination_touched)
      : Error(error), source_unopened_(source_unopened), destination_touched_(destination_touched) {}

  // RUN could not be opened as a run directory (the CLI's exit code 2).
  bool source_unopened() const noexcept { return source_unopened_; }
  // Something may have been written into DEST: it holds an unfinished export
  // without RECOVERY-PROOF.json and must be deleted before exporting again.
  bool destination_touched() const noexcept { return destination_touched_; }

 private:
  bool source_unopened_;
  bool destination_touched_;
};

ExportResult export_run(const std::filesystem::path& run, const std::filesystem::path& destination,
                        const ExportOptions& options = {});

}  // namespace holdpoint
