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
// TrainingState validates every component before applying any. Components
// that can stage their state (stage) prepare it first, without changing
// anything; the others are then applied in order, each after a copy of it was
// captured, and on a failure those copies are applied back in reverse order;
// only when all of them succeeded are the staged states installed, which
// cannot fail.
//
// Failure contract: validate throws holdpoint::Error (state_* codes) naming
// the component, the field and the expected and found values. apply may throw
// only for failures outside the state (out of memory, a device error); it is
// wrapped as state_apply_failed.
//
// Thread-safety: components are used from one thread at a time.
#pragma once

#include <functional>
#include <string>

#include "holdpoint/format/value.h"
#include "holdpoint/schema/manifest.h"  // contract_of

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
  // Two-phase apply, for a component that can do every step that may fail
  // without touching its live objects: prepares the validated `state` and
  // returns the step that installs it, which must not throw. TrainingState then
  // keeps no rollback copy of the component (copying a large model and its
  // optimizer state into fresh memory costs more than reading them). `state`
  // outlives the returned step. Default: an empty function, meaning apply()
  // with a rollback copy.
  virtual std::function<void()> stage(const Value& state);
  // Default: contract_of(capture(CaptureMode::reference)).
  virtual Value contract() const;
  // Adds what this component knows about the setup to `facts` (the model's
  // device, the sampler's kind, the registered generators), for checking
  // resume-profile preconditions. Default: nothing.
  virtual void describe(ProfileFacts& facts) const;
};

// A deep copy in which every tensor owns a contiguous copy of its elements.
Value deep_copy(const Value& value);

}  // namespace holdpoint
