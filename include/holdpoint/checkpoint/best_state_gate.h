// The best-state publication gate: the selection envelope file and
// publish_selection, which writes it only once a fresh module provably
// receives the selected state (docs/best-state.md). The capture side, what
// the gate checks against (snapshot, record_selection, compare_with_record),
// is in holdpoint/state/best_state.h.
//
// Failure contract: the envelope functions throw holdpoint::Error with a
// specific code. publish_selection does not throw for a rejected candidate, a
// failed check or a failed publication (holdpoint::Error or c10::Error): it
// returns the decision, and on HOLD and RERUN the target is untouched and the
// staging file removed, except the one case its report marks published (the
// rename happened, the directory fsync failed). It throws invalid_argument for
// a recipe without make or forward.
//
// Thread-safety: publish_selection copies its candidate first; what it checks
// is what it writes. Independent calls may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/file_system.h"
#include "holdpoint/state/best_state.h"

namespace holdpoint {

// ---- envelopes -------------------------------------------------------------------

// A candidate for publication and how it was captured ("snapshot",
// "live_handles", ...). A candidate read back from an envelope carries the
// record the envelope claims, which must equal the trusted one.
struct SelectionCandidate {
  std::string route;
  NamedTensors tensors;
  std::optional<SelectionRecord> claimed_record;
};

// The envelope file: a holdpoint checkpoint (.pt zip) whose manifest has kind
// "selection" and two components, "model" (the state_dict) and "selection"
// ({record, artifact_route}), each with its digest in the manifest. Python
// torch.load(f, weights_only=True) reads it, torch 1.13 included.
struct SelectionEnvelope {
  SelectionRecord record;
  std::string route;
  NamedTensors state;  // views of the envelope's bytes, which they keep alive

  SelectionCandidate candidate() const { return {route, state, record}; }
};

// Serialises at once (the "serialize before the next update" route).
std::vector<std::byte> encode_selection_envelope(const SelectionRecord& record, const SelectionCandidate& candidate);
// Parses with the restricted reader and checks kind, components and digests
// (checkpoint_kind_mismatch, component_missing, component_unknown,
// component_digest_mismatch, selection_envelope_invalid, selection_record_invalid).
SelectionEnvelope decode_selection_envelope(std::vector<std::byte> bytes);
SelectionEnvelope read_selection_envelope(const std::filesystem::path& path);

// ---- the publication gate --------------------------------------------------------

enum class SelectionDecision : std::uint8_t {
  accept,  // the candidate holds the selection and was published
  repair,  // the candidate lost it; the faithful copy passed the whole gate and was published instead
  rerun,   // the candidate (or faithful copy) holds the selection but a check or the publication did not
           // complete; nothing was published; run the gate again once the named cause is fixed
  hold,    // no candidate offered holds the selected contents; nothing was published
};

// "ACCEPT", "REPAIR", "RERUN", "HOLD".
std::string_view selection_decision_name(SelectionDecision decision) noexcept;

// One pass of a candidate through the gate.
struct PublicationAttempt {
  std::string route;
  // The gate's private copy of the candidate against the record, in memory:
  // does the candidate hold the selection at all?
  StateComparison candidate;
  bool staged = false;                  // the envelope was written to a staging file
  bool poisoned = false;                // the fresh module's tensors were poisoned and differ from the record
  bool reloaded = false;                // the staged state was loaded into it
  StateComparison reloaded_state;       // the fresh module's tensors after the load
  std::optional<TensorWitness> output;  // its forward(probe_input)
  bool output_matches = false;
  bool verified = false;   // every check on the staged bytes passed
  bool published = false;  // renamed onto the target
  // What stopped this attempt; a LibTorch error has no code, only detail.
  std::optional<ErrorCode> failure;
  std::string failure_detail;
  std::optional<Sha256Digest> sha256;  // of the published file
  std::uint64_t file_bytes = 0;
};

struct SelectionGateReport {
  SelectionDecision decision = SelectionDecision::hold;
  std::string reason;
  std::filesystem::path target;
  PublicationAttempt candidate;
  std::optional<PublicationAttempt> faithful_copy;  // tried only when the candidate lost the selection
};

struct SelectionGateOptions {
  io::FileSystem* file_system = nullptr;  // default: the POSIX file system
  bool durable = true;
  // How the staged file is read back before the rename (ReadBack in
  // holdpoint/base/file_system.h; docs/publication.md): the default maps the
  // page cache and checks every CRC-32 while the envelope is parsed; device
  // drops the cached pages and re-reads and re-hashes what the disk returns.
  ReadBack read_back = ReadBack::cached;
  // How the fresh module receives the staged state. Default: strict
  // state_dict load (ModuleState: every name, no other, matching dtype and
  // shape, copied in place). The gate's checks do not trust it: a load that
  // does nothing leaves the poison, which the comparison catches.
  std::function<void(torch::nn::Module& fresh, const NamedTensors& state)> load;
  // Called after every check on the staged bytes passed, just before the
  // rename; a throw there aborts the publication (tests inject failures here).
  std::function<void()> before_publish;
};

// The gate. Publishes `candidate` at `target` (replacing the previously
// accepted file) only if it holds the recorded selection and its staged
// envelope verifies; otherwise, when the candidate lost the selection and a
// faithful copy is given, runs the copy through the same gate (REPAIR).
// Decision table in docs/best-state.md.
SelectionGateReport publish_selection(const std::filesystem::path& target, const SelectionRecord& record,
                                      const ModuleRecipe& recipe, const SelectionCandidate& candidate,
                                      const SelectionCandidate* faithful_copy = nullptr,
                                      const SelectionGateOptions& options = {});

// JSON text of the gate's report (field names in docs/best-state.md).
std::string to_json(const SelectionGateReport& report);

}  // namespace holdpoint
