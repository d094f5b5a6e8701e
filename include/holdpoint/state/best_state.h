// Best-state capture: keeping the state selected as "best" exactly as it was at
// selection, and publishing it only once a fresh module provably receives it
// (docs/best-state.md).
//
// LibTorch hands out live tensors: named_parameters() and named_buffers()
// return new containers of handles to the module's own tensors, and detach()
// shares storage, so a "best state" kept that way follows every later in-place
// update while its label still names the selected step. This header separates
// the selection decision from the selected contents:
//   snapshot           an independent copy (no storage shared with the module);
//   diagnose           for any candidate mapping: is it the module's own handles,
//                      which tensors share storage with the module;
//   record_selection   the selection record, computed from a private copy:
//                      label, step, metric, source, runtime, a witness per
//                      tensor and the output on a probe input;
//   publish_selection  (holdpoint/checkpoint/best_state_gate.h) the gate: the envelope (manifest of kind "selection",
//                      model state, record) is staged, reloaded into a fresh
//                      module whose tensors were poisoned first, matched key
//                      for key, compared with the record, run on the probe,
//                      and only then renamed into place. It answers ACCEPT,
//                      REPAIR, RERUN or HOLD with its evidence.
//
// Thread-safety: snapshot, diagnose and record_selection read the module and
// must not overlap an update of it (capture at the step boundary, before the
// next write). publish_selection copies its candidate first; what it checks is
// what it writes. A SelectionRecord is an immutable value once built.
//
// Failure contract: snapshot, diagnose, record_selection and the envelope
// functions throw holdpoint::Error with a specific code (LibTorch's c10::Error
// from the recipe's module propagates unchanged). publish_selection does not
// throw for a rejected candidate, a failed check or a failed publication
// (holdpoint::Error or c10::Error): it returns the decision, and on HOLD and
// RERUN the target is untouched and the staging file removed, except the one
// case its report marks published (the rename happened, the directory fsync
// failed). It throws invalid_argument for a recipe without make or forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "holdpoint/format/dtype.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/value.h"

namespace torch::nn {
class Module;
}

namespace holdpoint {

// A state_dict in LibTorch terms: names to tensors, parameters then buffers.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// The module's own tensor handles (named_parameters, then named_buffers):
// what `auto best = model->named_parameters();` keeps. Not a copy.
NamedTensors live_state(const torch::nn::Module& module);

// Independent copies: each tensor detached and cloned into contiguous storage
// of its own on its device. Later writes to the module cannot reach them.
NamedTensors snapshot(const torch::nn::Module& module);
NamedTensors snapshot(const NamedTensors& tensors);

// ---- diagnostics -----------------------------------------------------------------

struct TensorStorageDiagnostic {
  std::string name;
  std::string dtype;  // "float32"; "undefined" for an undefined tensor
  std::vector<std::int64_t> shape;
  bool in_module = false;          // the module has a parameter or buffer of this name
  bool same_tensor = false;        // the module's own TensorImpl (a handle, not a copy)
  bool same_data_pointer = false;  // data_ptr() equals that of the module's tensor of this name
  // Names of module tensors whose storage bytes overlap this tensor's storage
  // (same device, intersecting [data, data + nbytes) ranges): a write to them
  // can change this tensor. data_ptr() equality alone misses offset views.
  std::vector<std::string> shares_storage_with;
  bool shares_storage() const noexcept { return !shares_storage_with.empty(); }
};

struct CandidateDiagnostics {
  // LibTorch keeps no state_dict object, so "the live mapping" is a mapping
  // of exactly the module's names, each bound to the module's own tensor;
  // a std::map copied from named_parameters() is one too.
  bool is_live_mapping = false;
  bool shares_storage = false;                   // some tensor overlaps module storage
  std::vector<std::string> missing;              // module names the candidate lacks
  std::vector<std::string> unexpected;           // candidate names the module lacks
  std::vector<TensorStorageDiagnostic> tensors;  // in the candidate's order
};

CandidateDiagnostics diagnose(const NamedTensors& candidate, const torch::nn::Module& module);

// ---- the selection record ----------------------------------------------------------

// Tensors of at most this many elements keep their values in a witness.
inline constexpr std::int64_t kWitnessValueLimit = 16;

// What a tensor held: dtype, shape, the SHA-256 of its elements in C order as
// a contiguous CPU copy holds them (machine byte order, little-endian on every
// LibTorch platform), and for tiny tensors the elements themselves, in private
// immutable storage.
struct TensorWitness {
  std::string name;
  DType dtype = DType::float32;
  std::vector<std::int64_t> shape;
  Sha256Digest sha256;
  std::optional<TensorData> values;

  // Same dtype, shape and digest.
  bool same_content(const TensorWitness& other) const noexcept;
  // The tiny values as doubles (exact for every real dtype but int64 beyond
  // 2^53); nullopt for larger tensors and complex dtypes.
  std::optional<std::vector<double>> values_as_doubles() const;
  // "[2]" for tiny real tensors, "sha256 <64 hex digits>" otherwise.
  std::string content_text() const;
};

// Throws dtype_unsupported for tensors holdpoint cannot represent.
TensorWitness witness_of(std::string name, const at::Tensor& tensor);

// The selection decision, as the training loop made it. Only `label` is
// required; the rest is carried as given.
struct SelectionInfo {
  std::string label;        // "synthetic-best-step-0"
  std::int64_t step = 0;    // the selected step
  std::string metric_name;  // "validation_loss"
  double metric_value = 0;
  std::string source;  // which module or run the selection was made from
};

struct SelectionRuntime {
  std::string holdpoint_version;
  std::string libtorch_version;
  std::string compiler;
  std::string selected_at;  // UTC, "2026-10-17T12:00:00Z"
  std::int64_t intra_op_threads = 0;
};

// How to obtain a receiving module and run it. `make` returns a new module of
// the selected module's definition (its initial values never matter: the gate
// poisons them); `forward` runs it, e.g.
//   [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<TinyImpl&>(m).forward(x); }
struct ModuleRecipe {
  std::function<std::shared_ptr<torch::nn::Module>()> make;
  std::function<at::Tensor(torch::nn::Module& module, const at::Tensor& input)> forward;
};

struct SelectionRecord {
  SelectionInfo info;
  SelectionRuntime runtime;
  std::vector<TensorWitness> tensors;     // every state tensor, in state_dict order
  std::vector<std::string> buffer_names;  // which of them are buffers
  TensorData probe_input;                 // a private copy
  // forward(probe_input) of a fresh module in eval mode holding the selected
  // state: the output witness the gate's reload must reproduce bit for bit.
  TensorWitness probe_output;

  const TensorWitness* tensor(std::string_view name) const noexcept;
  // The layout stored in envelopes (docs/best-state.md).
  Value to_value() const;
  // Fails closed: selection_record_invalid naming the field.
  static SelectionRecord from_value(const Value& value);
};

// Empty when equal; otherwise names the first differing field.
std::string describe_record_difference(const SelectionRecord& trusted, const SelectionRecord& other);

// Records the selection of `selected` now: takes a private copy first and
// derives everything from it, then loads that copy into a poisoned module
// from `recipe` (proving the recipe receives it) and records the output on
// `probe_input` in eval mode. Passing live handles is fine: they are read
// once, here. Throws invalid_argument (bad recipe or probe), the strict-load
// codes (state_key_missing, ...) when the recipe's module does not match.
SelectionRecord record_selection(const SelectionInfo& info, const NamedTensors& selected, const ModuleRecipe& recipe,
                                 const at::Tensor& probe_input);
SelectionRecord record_selection(const SelectionInfo& info, const torch::nn::Module& module, const ModuleRecipe& recipe,
                                 const at::Tensor& probe_input);

// ---- comparing a candidate with the record -----------------------------------------

struct WitnessComparison {
  std::string name;
  std::optional<TensorWitness> observed;  // absent for a tensor the candidate lacks
  bool matches = false;
  std::optional<ErrorCode> mismatch;  // selection_key_missing, ..._unexpected, ..._dtype_, ..._shape_, ..._content_
  std::string detail;
};

struct StateComparison {
  bool matches = false;
  std::optional<ErrorCode> first_mismatch;
  std::string detail;                      // of the first mismatch
  std::vector<WitnessComparison> tensors;  // the record's order, then unexpected names
};

// Strict: every name of the record, no other, and each tensor's dtype, shape
// and elements as witnessed.
StateComparison compare_with_record(const SelectionRecord& record, const NamedTensors& tensors);
// compare_with_record, throwing the first mismatch with its code.
void check_matches_record(const SelectionRecord& record, const NamedTensors& tensors);

// ---- evidence ------------------------------------------------------------------

// JSON text (objects with stable field names) for logs and evidence files.
std::string to_json(const SelectionRecord& record);
std::string to_json(const CandidateDiagnostics& diagnostics);

}  // namespace holdpoint
