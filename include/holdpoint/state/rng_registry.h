// RngRegistry: every random number generator a training run draws from, as
// one checkpoint component ("rng").
//
// A resume is exact only if every generator continues where it stopped, so
// the registry fails closed on its inventory: a registered generator that the
// file does not hold, a file entry that no registered generator claims, or an
// entry whose kind differs, rejects the load (rng_inventory_mismatch, naming
// every such generator). A state that the generator could not restore to
// exactly those bytes rejects it too (rng_state_invalid).
//
// Adapters (RandomSource) exist for LibTorch's default CPU generator, any
// at::Generator (CPU, and CUDA when this LibTorch has CUDA), std::mt19937,
// std::mt19937_64, pcg64 (pcg-cpp) and user generators given as callbacks.
// Adapters hold references: each generator must outlive the registry.
//
// File layout: {name: {"kind": str, "state": bytes | uint8 tensor}}. Torch
// generators store the ByteTensor of Generator::get_state (the bytes of
// Python's torch.get_rng_state()); standard and PCG engines store their
// textual stream representation; user generators store their own bytes.
// Byte states are also accepted as 1-d uint8 tensors, which is how the
// torch 1.13 compatible writer encodes bytes.
//
// Thread-safety: used from one thread at a time. Torch generators are read
// and written under their own mutex, as LibTorch's samplers lock them.
#pragma once

#include <ATen/core/Generator.h>
#include <pcg_random.hpp>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/state/component.h"

namespace holdpoint {

// One generator the registry saves and restores.
class RandomSource {
 public:
  virtual ~RandomSource() = default;

  virtual const std::string& name() const = 0;
  // The state layout: "torch.cpu", "torch.cuda", "std::mt19937",
  // "std::mt19937_64", "pcg64" or "user".
  virtual const std::string& kind() const = 0;
  // A copy of the current state (bytes or a 1-d uint8 tensor).
  virtual Value get_state() const = 0;
  // Throws Error(rng_state_invalid) naming the source and the defect unless
  // set_state(state) would restore exactly `state`. Changes nothing.
  virtual void validate_state(const Value& state) const = 0;
  // Requires a state validate_state accepted.
  virtual void set_state(const Value& state) = 0;
  // The LibTorch generator behind this source (its GeneratorImpl), or nullptr
  // for other kinds; lets resume profiles check which generators are covered.
  virtual const void* generator_identity() const { return nullptr; }
};

// A generator of the caller's own, as three callbacks on its state bytes.
struct UserGenerator {
  std::function<std::string()> get_state;
  // Throws (any std::exception) if the bytes cannot be restored exactly;
  // must not change the generator.
  std::function<void(std::string_view state)> validate_state;
  std::function<void(std::string_view state)> set_state;
};

class RngRegistry final : public Component {
 public:
  RngRegistry() = default;
  RngRegistry(const RngRegistry&) = delete;
  RngRegistry& operator=(const RngRegistry&) = delete;

  // Each add throws Error(invalid_argument) for an empty or duplicate name.
  void add(std::unique_ptr<RandomSource> source);
  // A CPU or CUDA at::Generator, e.g. the one a RandomSampler draws from.
  void add(std::string name, at::Generator generator);
  void add(std::string name, std::mt19937& engine);
  void add(std::string name, std::mt19937_64& engine);
  void add(std::string name, pcg64& engine);
  void add(std::string name, UserGenerator generator);

  std::size_t size() const noexcept { return sources_.size(); }
  bool contains(std::string_view name) const;
  // {name: kind} for every registered generator, for the manifest.
  Value inventory() const;

  const std::string& name() const override { return name_; }
  Value capture(CaptureMode mode) const override;
  void validate(const Value& state) const override;
  // Validates first, so that no generator changes unless all can.
  void apply(const Value& state) override;
  void describe(ProfileFacts& facts) const override;

 private:
  const RandomSource* find(std::string_view name) const;

  std::string name_ = "rng";
  std::vector<std::unique_ptr<RandomSource>> sources_;
};

// Registers LibTorch's default CPU generator as "torch.cpu" and, when this
// LibTorch has CUDA, each visible device's default generator as "torch.cuda:<i>".
void register_default_generators(RngRegistry& registry);

}  // namespace holdpoint
