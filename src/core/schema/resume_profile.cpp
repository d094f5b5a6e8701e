#include "holdpoint/schema/resume_profile.h"

#include <array>

#include "base/fail.h"

namespace holdpoint {

namespace {
constexpr std::array<std::pair<ResumeProfile, std::string_view>, 5> kNames = {{
    {ResumeProfile::cpu_basic_v1, "cpu-basic-v1"},
    {ResumeProfile::cpu_shuffled_singleworker_v1, "cpu-shuffled-singleworker-v1"},
    {ResumeProfile::cuda_single_device_v1, "cuda-single-device-v1"},
    {ResumeProfile::cpu_gloo_ddp_v1, "cpu-gloo-ddp-v1"},
    {ResumeProfile::unqualified, "unqualified"},
}};
}  // namespace

std::string_view resume_profile_name(ResumeProfile profile) noexcept {
  for (const auto& [value, name] : kNames) {
    if (value == profile) return name;
  }
  return "unknown";
}

std::optional<ResumeProfile> resume_profile_from_name(std::string_view name) noexcept {
  for (const auto& [value, text] : kNames) {
    if (text == name) return value;
  }
  return std::nullopt;
}

std::vector<std::string> profile_violations(ResumeProfile profile, const ProfileFacts& facts) {
  std::vector<std::string> violations;
  auto require = [&](bool condition, const char* what) {
    if (!condition) violations.emplace_back(what);
  };
  switch (profile) {
    case ResumeProfile::unqualified: break;
    case ResumeProfile::cpu_basic_v1:
      require(facts.model_on_cpu, "the model must be on the CPU");
      require(facts.loader_workers == 0, "the data loader must use no worker processes");
      require(!facts.distributed, "training must not be distributed");
      require(facts.sampler_kind == "sequential", "the sampler must be sequential");
      require(facts.cpu_generator_registered, "the LibTorch CPU generator must be registered");
      require(!facts.external_randomness, "no randomness outside the registry may be used");
      break;
    case ResumeProfile::cpu_shuffled_singleworker_v1:
      require(facts.model_on_cpu, "the model must be on the CPU");
      require(facts.loader_workers == 0, "the data loader must use no worker processes");
      require(!facts.distributed, "training must not be distributed");
      require(facts.sampler_kind == "random" || facts.sampler_kind == "custom",
              "the sampler must be random (explicit generator) or a custom stateful sampler");
      require(facts.sampler_kind != "random" || facts.sampler_generator_registered,
              "the random sampler's explicit generator must be registered");
      require(facts.cpu_generator_registered, "the LibTorch CPU generator must be registered");
      require(!facts.external_randomness, "no randomness outside the registry may be used");
      break;
    case ResumeProfile::cuda_single_device_v1:
      require(facts.cuda_available, "CUDA must be available (this build or machine has none)");
      require(facts.model_on_first_cuda_device, "the model must be on the first CUDA device");
      require(facts.deterministic_algorithms, "deterministic algorithms must be enabled");
      require(facts.loader_workers == 0, "the data loader must use no worker processes");
      require(!facts.distributed, "training must not be distributed");
      require(facts.all_cuda_generators_registered, "every visible CUDA generator must be registered");
      require(facts.cpu_generator_registered, "the LibTorch CPU generator must be registered");
      require(!facts.external_randomness, "no randomness outside the registry may be used");
      break;
    case ResumeProfile::cpu_gloo_ddp_v1:
      require(facts.model_on_cpu, "the model must be on the CPU");
      require(facts.loader_workers == 0, "the data loader must use no worker processes");
      require(facts.distributed && facts.world_size >= 1,
              "training must be distributed over a process group (saved and loaded collectively)");
      require(facts.sampler_kind == "distributed",
              "the sampler must be holdpoint's DistributedSampler (one permutation per epoch, strided across ranks)");
      require(facts.cpu_generator_registered, "the LibTorch CPU generator must be registered");
      require(facts.rank_local_generators, "the generator registry must be saved per rank (a rank-local component)");
      require(!facts.external_randomness, "no randomness outside the registry may be used");
      break;
  }
  return violations;
}

void check_profile(ResumeProfile profile, const ProfileFacts& facts) {
  const auto violations = profile_violations(profile, facts);
  if (violations.empty()) return;
  std::string text;
  for (const auto& v : violations) text += (text.empty() ? "" : "; ") + v;
  detail::fail(ErrorCode::profile_precondition_violated, "resume profile ", resume_profile_name(profile), ": ", text);
}

}  // namespace holdpoint
