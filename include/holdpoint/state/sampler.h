// Samplers: the order in which a training loop visits dataset indices, with
// state that lets a resume continue mid-epoch.
//
// A sampler yields the indices of one epoch through next() until it returns
// nullopt; start_epoch(e) then begins epoch e. A sampler starts in epoch 0.
// Its state is {"kind", "num_samples", "epoch", "cursor"} plus, for the
// random sampler, "order": the epoch's permutation as an int64 tensor. The
// order is stored rather than re-drawn, so a resumed run yields exactly the
// ids the interrupted one had left, and the next epoch's permutation comes
// from the restored generator (register it in the RngRegistry).
//
// validate_state checks the state against the live sampler (kind and
// num_samples: state_structure_mismatch) and itself (0 <= cursor <= length,
// order a permutation of 0..n-1, epoch >= 0: state_value_invalid; order's
// dtype and shape: state_dtype_mismatch / state_shape_mismatch) without
// changing anything; apply_state requires a validated state.
//
// StatefulSampler adapts a custom sampler that follows PyTorch's stateful
// sampler protocol (state_dict / load_state_dict) to this interface.
//
// Thread-safety: used from one thread at a time.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/state/component.h"

namespace holdpoint {

class Sampler {
 public:
  virtual ~Sampler() = default;

  // "sequential", "random" or "stateful".
  virtual const std::string& kind() const = 0;
  virtual std::int64_t num_samples() const = 0;
  // The next index of the current epoch, or nullopt once it is exhausted.
  virtual std::optional<std::int64_t> next() = 0;
  virtual std::int64_t epoch() const = 0;
  // Begins `epoch` (>= 0, else Error(invalid_argument)) from its first index.
  virtual void start_epoch(std::int64_t epoch) = 0;
  // Indices left in the current epoch.
  virtual std::int64_t remaining() const = 0;

  virtual Value capture_state(CaptureMode mode) const = 0;
  virtual void validate_state(const Value& state) const = 0;
  virtual void apply_state(const Value& state) = 0;
};

// 0, 1, ..., n-1 in every epoch.
class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(std::int64_t num_samples);

  const std::string& kind() const override;
  std::int64_t num_samples() const override { return num_samples_; }
  std::optional<std::int64_t> next() override;
  std::int64_t epoch() const override { return epoch_; }
  void start_epoch(std::int64_t epoch) override;
  std::int64_t remaining() const override { return num_samples_ - cursor_; }

  Value capture_state(CaptureMode mode) const override;
  void validate_state(const Value& state) const override;
  void apply_state(const Value& state) override;

 private:
  std::int64_t num_samples_;
  std::int64_t epoch_ = 0;
  std::int64_t cursor_ = 0;
};

// A fresh permutation per epoch, drawn with at::randperm from `generator`
// (a CPU generator) when the epoch starts, including epoch 0 at construction.
class RandomSampler final : public Sampler {
 public:
  RandomSampler(std::int64_t num_samples, at::Generator generator);

  const std::string& kind() const override;
  std::int64_t num_samples() const override { return num_samples_; }
  std::optional<std::int64_t> next() override;
  std::int64_t epoch() const override { return epoch_; }
  void start_epoch(std::int64_t epoch) override;
  std::int64_t remaining() const override { return num_samples_ - cursor_; }

  // The current epoch's permutation (int64, length num_samples).
  const at::Tensor& order() const noexcept { return order_; }
  const at::Generator& generator() const noexcept { return generator_; }

  Value capture_state(CaptureMode mode) const override;
  void validate_state(const Value& state) const override;
  void apply_state(const Value& state) override;

 private:
  std::int64_t num_samples_;
  at::Generator generator_;
  std::int64_t epoch_ = 0;
  std::int64_t cursor_ = 0;
  at::Tensor order_;
};

// PyTorch's stateful sampler protocol, for samplers holdpoint does not know:
// the sampler describes its own position in state_dict().
class StatefulSamplerProtocol {
 public:
  virtual ~StatefulSamplerProtocol() = default;

  // Names the sampler's state layout ("my_project.BucketSampler/v1"): a
  // state is only loaded into a sampler of the same kind.
  virtual std::string kind() const = 0;
  virtual std::int64_t num_samples() const = 0;
  virtual std::optional<std::int64_t> next() = 0;
  virtual void start_epoch(std::int64_t epoch) = 0;
  virtual std::int64_t remaining() const = 0;

  virtual Value state_dict() const = 0;
  // Throws (any std::exception) if `state` cannot be loaded; changes nothing.
  virtual void validate_state_dict(const Value& state) const = 0;
  virtual void load_state_dict(const Value& state) = 0;
};

// State: {"kind": "stateful", "sampler_kind", "num_samples", "epoch",
// "state_dict"}. A protocol sampler's rejection is reported as
// state_value_invalid at "sampler.state_dict".
class StatefulSampler final : public Sampler {
 public:
  // `sampler` must outlive the adapter; it is in epoch 0.
  explicit StatefulSampler(StatefulSamplerProtocol& sampler);

  const std::string& kind() const override;
  std::int64_t num_samples() const override { return sampler_.num_samples(); }
  std::optional<std::int64_t> next() override { return sampler_.next(); }
  std::int64_t epoch() const override { return epoch_; }
  void start_epoch(std::int64_t epoch) override;
  std::int64_t remaining() const override { return sampler_.remaining(); }

  Value capture_state(CaptureMode mode) const override;
  void validate_state(const Value& state) const override;
  void apply_state(const Value& state) override;

 private:
  StatefulSamplerProtocol& sampler_;
  std::int64_t epoch_ = 0;
};

// Data-parallel sampling (docs/distributed.md). Every rank draws the same
// permutation of 0..n-1 for an epoch from (seed, epoch) alone (a SplitMix64
// Fisher-Yates shuffle, the same on every platform, no generator state to
// save) and yields the positions start + rank, start + rank + world_size, ...
// of it. `start` is the global position at which this world began the epoch:
// 0, or where a resume with another world size took over. The ranks of one
// world together consume each index of an epoch exactly once.
//
// State: {"kind": "distributed", "num_samples", "seed", "epoch",
// "world_size", "rank", "start", "cursor"}; cursor counts the indices this
// rank yielded since `start`. validate_state requires the live sampler's
// kind, num_samples and seed (state_structure_mismatch) and its world size
// and rank (state_value_invalid; reassign a state for another world with
// reassign_distributed_sampler_state first).
class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(std::int64_t num_samples, std::uint64_t seed, std::int64_t world_size, std::int64_t rank);

  const std::string& kind() const override;
  std::int64_t num_samples() const override { return num_samples_; }
  std::optional<std::int64_t> next() override;
  std::int64_t epoch() const override { return epoch_; }
  void start_epoch(std::int64_t epoch) override;
  std::int64_t remaining() const override;

  std::int64_t world_size() const noexcept { return world_size_; }
  std::int64_t rank() const noexcept { return rank_; }
  std::int64_t start() const noexcept { return start_; }
  std::int64_t cursor() const noexcept { return cursor_; }
  // Indices every rank of the world still has in this epoch, assuming the
  // ranks step in lockstep (equal cursors): the last rank's share is the
  // smallest, so an update that takes this many rows on every rank keeps
  // the cursors equal.
  std::int64_t remaining_on_every_rank() const;
  // The epoch's permutation, as every rank draws it.
  static std::vector<std::int64_t> permutation(std::int64_t num_samples, std::uint64_t seed, std::int64_t epoch);

  Value capture_state(CaptureMode mode) const override;
  void validate_state(const Value& state) const override;
  void apply_state(const Value& state) override;

 private:
  std::int64_t num_samples_;
  std::uint64_t seed_;
  std::int64_t world_size_;
  std::int64_t rank_;
  std::int64_t epoch_ = 0;
  std::int64_t start_ = 0;
  std::int64_t cursor_ = 0;
  std::vector<std::int64_t> order_;
};

// The world-size-change rule: `saved` holds the sampler state of every rank
// of the saved world (rank order). They must agree on kind, num_samples,
// seed, epoch and start and have equal cursors (ranks step in lockstep;
// otherwise distributed_cursor_uneven): the world consumed exactly the
// positions before start + cursor x old world size. The result continues
// the same epoch for `new_rank` of `new_world` from that position, with
// cursor 0, so no index is skipped or repeated.
Value reassign_distributed_sampler_state(std::span<const Value* const> saved, std::int64_t new_rank,
                                         std::int64_t new_world);

// A Sampler as the checkpoint component "sampler".
class SamplerState final : public Component {
 public:
  explicit SamplerState(Sampler& sampler) : sampler_(sampler) {}

  const std::string& name() const override;
  Value capture(CaptureMode mode) const override { return sampler_.capture_state(mode); }
  void validate(const Value& state) const override { sampler_.validate_state(state); }
  void apply(const Value& state) override { sampler_.apply_state(state); }
  // The sampler's kind for profiles ("sequential", "random", or "custom" for
  // the stateful protocol) and a random sampler's generator.
  void describe(ProfileFacts& facts) const override;

 private:
  Sampler& sampler_;
};

}  // namespace holdpoint
