// Resume profiles: named, versioned claims about how exactly a resumed run
// reproduces the uninterrupted one, each with preconditions that are checked
// when saving and again when loading (before the profile is relied on).
//
//   cpu-basic-v1                  CPU only, no loader workers, a sequential sampler,
//                                 the LibTorch CPU generator registered, no external
//                                 randomness declared.
//   cpu-shuffled-singleworker-v1  CPU only, no loader workers, a random or custom
//                                 stateful sampler driven by an explicit registered
//                                 generator, the CPU generator registered.
//   cuda-single-device-v1         the first CUDA device, deterministic algorithms on,
//                                 no loader workers, not distributed, every visible
//                                 CUDA generator registered.
//   cpu-gloo-ddp-v1               data-parallel over a c10d process group (Gloo on CPU):
//                                 CPU only, no loader workers, holdpoint's
//                                 DistributedSampler, the CPU generator registered and
//                                 the registry saved per rank (each rank's own
//                                 explicit generators), no external randomness; on
//                                 load also the same world size as the checkpoint
//                                 (checked by DistributedCheckpointer). A changed world
//                                 size resumes only as unqualified (docs/distributed.md).
//   unqualified                   no preconditions and no deterministic-resume claim.
//
// What no profile covers (and why a run that uses them must be unqualified):
// randomness outside the registry (Python's random, NumPy, hidden generators),
// wall-clock time, network input, nondeterministic kernels. New guarantees get
// new versioned names; an existing profile never changes meaning.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace holdpoint {

enum class ResumeProfile : std::uint8_t {
  cpu_basic_v1,
  cpu_shuffled_singleworker_v1,
  cuda_single_device_v1,
  cpu_gloo_ddp_v1,
  unqualified,
};

std::string_view resume_profile_name(ResumeProfile profile) noexcept;
std::optional<ResumeProfile> resume_profile_from_name(std::string_view name) noexcept;

// What the training setup looks like, as far as the profiles care. TrainingState
// derives most of it from its components; the rest is declared by the caller.
struct ProfileFacts {
  bool model_on_cpu = true;
  bool model_on_first_cuda_device = false;
  bool cuda_available = false;
  bool deterministic_algorithms = false;
  int loader_workers = 0;
  bool distributed = false;
  std::int64_t world_size = 1;        // ranks of the process group (distributed only)
  bool rank_local_generators = false;  // the registry is saved per rank (distributed only)
  bool external_randomness = false;  // declared by the caller
  bool cpu_generator_registered = false;
  bool all_cuda_generators_registered = false;
  std::string sampler_kind;  // "sequential", "random", "custom", or "" for none
  bool sampler_generator_registered = false;
  // Filled by components and resolved by TrainingState::profile_facts(): the
  // random sampler's generator, and every generator the registry holds
  // (identities of at::GeneratorImpl objects).
  const void* sampler_generator = nullptr;
  std::vector<const void*> registered_generators;
};

// The preconditions of `profile` that `facts` violate, in words; empty if none.
std::vector<std::string> profile_violations(ResumeProfile profile, const ProfileFacts& facts);

// Throws Error(profile_precondition_violated) listing every violation.
void check_profile(ResumeProfile profile, const ProfileFacts& facts);

}  // namespace holdpoint
