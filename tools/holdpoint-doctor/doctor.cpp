// holdpoint-doctor: this build's capability matrix, run as `holdpoint doctor`.
// It is a program of its own because it links LibTorch, which the rest of the
// CLI does not need (and which takes a noticeable time to load).
#include <ATen/Context.h>
#include <torch/version.h>

#include <iostream>

#include <nlohmann/json.hpp>

#include <cstring>

#include "holdpoint/resume_profile.h"
#include "holdpoint_version.h"

namespace holdpoint::doctor {

struct Capability {
  std::string name;
  bool available;
  std::string why;
};

int run_doctor(bool json) {
  const bool cuda = at::hasCUDA();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const std::vector<Capability> apis = {
      {"load_checkpoint_mapping (untrusted)", true,
       "restricted reader: private snapshot + SHA-256, pickle allowlist, Limits; never calls LibTorch's unpickler"},
      {"TrainingState::load_model_state (untrusted)", true, "model only; holdpoint, state_dict, tutorial and Lightning layouts"},
      {"TrainingState::load_checkpoint (untrusted)", true,
       "schema-qualified full resume; validated before anything is applied; transactional"},
      {"TrainingState::load_trusted_checkpoint (trusted)", true,
       std::string("LibTorch ") + TORCH_VERSION +
           " deserializer for torch::save archives; caller vouches for producer and custody; warns; "
           "labelled legacy-unqualified (LibTorch 1.13 is affected by CVE-2025-32434 and CVE-2026-24747)"},
      {"load_checkpoint_mapping {trusted} (trusted)", true,
       "falls back to LibTorch's deserializer after the restricted reader refuses a file; warns"},
  };
  std::vector<Capability> profiles;
  for (const auto profile : {ResumeProfile::cpu_basic_v1, ResumeProfile::cpu_shuffled_singleworker_v1,
                             ResumeProfile::cuda_single_device_v1, ResumeProfile::cpu_gloo_ddp_v1,
                             ResumeProfile::unqualified}) {
    Capability c{std::string(resume_profile_name(profile)), true, ""};
    if (profile == ResumeProfile::cuda_single_device_v1) {
      c.available = cuda;
      c.why = cuda ? "CUDA available; needs deterministic algorithms on at save and load"
                   : "unavailable: this LibTorch build has no CUDA (at::hasCUDA() is false)";
    } else if (profile == ResumeProfile::unqualified) {
      c.why = "no preconditions, no deterministic-resume claim";
    } else if (profile == ResumeProfile::cpu_gloo_ddp_v1) {
#ifdef HOLDPOINT_HAVE_DIST
      c.why = "multi-rank over a c10d process group (holdpoint_dist); same world size on load";
#else
      c.available = false;
      c.why = "unavailable: this build has no holdpoint_dist (LibTorch without c10d headers)";
#endif
    } else {
      c.why = "CPU; preconditions checked at save and load";
    }
    profiles.push_back(c);
  }
  if (json) {
    nlohmann::ordered_json out;
    out["holdpoint"] = HOLDPOINT_VERSION;
    out["libtorch"] = TORCH_VERSION;
    out["compiler"] = __VERSION__;
    out["cuda"] = cuda;
    out["deterministic_algorithms"] = deterministic;
    const auto to_json = [](const std::vector<Capability>& list) {
      nlohmann::ordered_json entries = nlohmann::ordered_json::array();
      for (const auto& c : list) {
        nlohmann::ordered_json entry;
        entry["name"] = c.name;
        entry["available"] = c.available;
        entry["why"] = c.why;
        entries.push_back(std::move(entry));
      }
      return entries;
    };
    out["load_apis"] = to_json(apis);
    out["resume_profiles"] = to_json(profiles);
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << "holdpoint " << HOLDPOINT_VERSION << "\n";
  std::cout << "LibTorch  " << TORCH_VERSION << " (" << (cuda ? "CUDA available" : "CPU only: no CUDA") << ")\n";
  std::cout << "compiler  " << __VERSION__ << "\n";
  std::cout << "deterministic algorithms: " << (deterministic ? "on" : "off") << "\n\nload APIs:\n";
  for (const auto& c : apis) {
    std::cout << "  " << (c.available ? "[yes] " : "[no]  ") << c.name << "\n        " << c.why << "\n";
  }
  std::cout << "\nresume profiles:\n";
  for (const auto& c : profiles) {
    std::cout << "  " << (c.available ? "[yes] " : "[no]  ") << c.name << "\n        " << c.why << "\n";
  }
  return 0;
}

}  // namespace holdpoint::doctor

int main(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else {
      std::cerr << "usage: holdpoint doctor [--json]\n";
      return 2;
    }
  }
  return holdpoint::doctor::run_doctor(json);
}
