// Component: one piece of training state that a checkpoint saves and restores
// (the model, the optimizer, a scheduler, the RNG registry, the sampler, ...).
//
// Every component speaks the same four verbs, which is what makes loading
// transactional:
//   capture   the live state as a Value in the component's file layout
//             (PyTorch's state_dict layout where PyTorch has one);
//   validate  check a Value against the live objects without changing them;
//   apply     make the live objects hold a validated Value;
//   contract  the structure (keys, kinds, tensor dtypes and shapes) the
//             manifest records, so a file is checked before any component runs.
// TrainingState validates every component before applying any, captures a
// copy of each component before applying it, and on a failure applies those
// copies back in reverse order.
//
// Failure contract: validate throws holdpoint::Error (state_* codes) naming
// the component, the field and the expected and found values. apply may throw
// only for failures outside the state (out of memory, a device error); it is
// wrapped as state_apply_failed.
//
// Thread-safety: components are used from one thread at a time.
#pragma once

#include <string>

#include "holdpoint/format/value.h"

namespace holdpoint {

struct ProfileFacts;

enum class CaptureMode : std::uint8_t {
  // Tensors in the Value view the live tensors' memory: cheap, valid until the
  // next optimizer step. Used for synchronous saves.
  reference,
  // Tensors are copied into storage of their own: a snapshot that later
  // training cannot change. Used for rollback and asynchronous saves.
  copy,
};

class Component {
 public:
  virtual ~Component() = default;

  // The key of this component in the checkpoint ("model", "optimizer", ...).
  virtual const std::string& name() const = 0;
  virtual Value capture(CaptureMode mode) const = 0;
  virtual void validate(const Value& state) const = 0;
  virtual void apply(const Value& state) = 0;
  // Default: contract_of(capture(CaptureMode::reference)).
  virtual Value contract() const;
  // Adds what this component knows about the setup to `facts` (the model's
  // device, the sampler's kind, the registered generators), for checking
  // resume-profile preconditions. Default: nothing.
  virtual void describe(ProfileFacts& facts) const;
};

// The structure of a state Value: dict keys and value kinds, tensor dtypes and
// shapes, list lengths; no tensor data and no scalar values.
Value contract_of(const Value& state);

// A deep copy in which every tensor owns a contiguous copy of its elements.
Value deep_copy(const Value& value);

}  // namespace holdpoint
