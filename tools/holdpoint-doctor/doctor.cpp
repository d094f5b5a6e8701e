// holdpoint-doctor: this build's capability matrix, run as `holdpoint doctor`.
// It is a program of its own because it links LibTorch, which the rest of the
// CLI does not need (and which takes a noticeable time to load).
#include <ATen/Context.h>
#include <ATen/Version.h>
#include <dlfcn.h>
#include <torch/version.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "holdpoint/schema/resume_profile.h"
#include "holdpoint_version.h"
#include "python_probe.h"

#ifndef HOLDPOINT_SOURCE_DIR
#define HOLDPOINT_SOURCE_DIR ""
#endif

namespace holdpoint::doctor {
namespace {

// Importing torch takes a few seconds on a cold cache; the probes run concurrently.
constexpr std::chrono::seconds kPythonTimeout{20};

struct Capability {
  std::string name;
  bool available;
  std::string why;
};

enum class Trust { untrusted_ok, trusted_only };

struct LoadApi {
  std::string name;
  Trust trust;
  bool available;
  std::string why;
};

// The LibTorch this process actually loaded, which may differ from the headers
// it was compiled against when the run path or LD_LIBRARY_PATH finds another.
struct RuntimeLibTorch {
  std::string version;  // empty when show_config() does not say
  std::string library;  // the shared object that defines at::show_config
};

RuntimeLibTorch runtime_libtorch() {
  RuntimeLibTorch runtime;
  const std::string config = at::show_config();
  const std::string key = "TORCH_VERSION=";
  if (const auto at = config.find(key); at != std::string::npos) {
    const auto begin = at + key.size();
    const auto end = config.find_first_of(", \n", begin);
    runtime.version = config.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&at::show_config), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code error;
    const auto resolved = std::filesystem::canonical(info.dli_fname, error);
    runtime.library = error ? info.dli_fname : resolved.string();
  }
  return runtime;
}

constexpr bool kHaveDist =
#ifdef HOLDPOINT_HAVE_DIST
    true;
#else
    false;
#endif

constexpr bool kHaveGlooProcessGroup =
#ifdef HOLDPOINT_HAVE_GLOO_PROCESS_GROUP
    true;
#else
    false;
#endif

std::vector<LoadApi> load_apis() {
  const std::string restricted = "restricted reader (private snapshot + SHA-256, pickle allowlist, Limits)";
  return {
      {"load_checkpoint_mapping", Trust::untrusted_ok, true, restricted},
      {"TrainingState::load_model_state", Trust::untrusted_ok, true,
       "model only; holdpoint, state_dict, tutorial and Lightning layouts; " + restricted},
      {"TrainingState::load_checkpoint", Trust::untrusted_ok, true,
       "schema-qualified full resume; validated before anything is applied; transactional; " + restricted},
      {"CheckpointManager::resume", Trust::untrusted_ok, true,
       "the newest valid generation of a run directory through TrainingState::load_checkpoint"},
      {"DistributedCheckpointer::load_checkpoint / resume", Trust::untrusted_ok, kHaveDist,
       kHaveDist ? "every shard checked on every rank, ranks agree before applying; " + restricted
                 : "unavailable: this build has no holdpoint_dist (LibTorch without c10d headers)"},
      {"load_trusted_mapping", Trust::trusted_only, true,
       std::string("the one route to LibTorch ") + TORCH_VERSION +
           "'s deserializer, after the restricted reader refuses a file (torch::save archives); caller vouches "
           "for producer and custody; warns (LibTorch 1.13 is affected by CVE-2025-32434 and CVE-2026-24747)"},
      {"TrainingState::load_trusted_checkpoint", Trust::trusted_only, true,
       "restores what load_trusted_mapping read; labelled legacy-unqualified"},
  };
}

std::vector<Capability> resume_profiles(bool cuda) {
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
      c.available = kHaveDist;
      c.why = kHaveDist ? "multi-rank over a c10d process group (holdpoint_dist); same world size on load"
                        : "unavailable: this build has no holdpoint_dist (LibTorch without c10d headers)";
    } else {
      c.why = "CPU; preconditions checked at save and load";
    }
    profiles.push_back(c);
  }
  return profiles;
}

std::filesystem::path own_directory() {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : self.parent_path();
}

const char* yes_no(bool value) { return value ? "yes" : "no"; }

nlohmann::ordered_json python_json(const PythonTorch& python) {
  nlohmann::ordered_json entry;
  entry["path"] = python.path.string();
  entry["found_as"] = python.found_as;
  entry["status"] = probe_status_name(python.status);
  if (!python.detail.empty()) entry["detail"] = python.detail;
  if (!python.executable.empty()) entry["executable"] = python.executable;
  if (!python.prefix.empty()) entry["prefix"] = python.prefix;
  if (python.status == ProbeStatus::ok) {
    const TorchLoadSupport support = torch_load_support(python.torch_version);
    entry["torch"] = python.torch_version;
    entry["weights_only_available"] = support.weights_only_available;
    entry["weights_only_default"] = support.weights_only_default;
    entry["reads_default_files"] = support.reads_default_files;
    entry["reads_torch_1_13_compatible_files"] = support.reads_torch_1_13_compatible_files;
    entry["note"] = support.note;
  } else {
    entry["torch"] = nullptr;
  }
  return entry;
}

void print_python_text(const PythonTorch& python) {
  std::string where = python.path.empty() ? std::string("-") : python.path.string();
  std::string labels;
  for (const auto& label : python.found_as) labels += (labels.empty() ? "" : ", ") + label;
  if (python.status != ProbeStatus::ok) {
    std::cout << "  [" << probe_status_name(python.status) << "] " << where << " (" << labels << ")";
    if (!python.detail.empty()) std::cout << ": " << python.detail;
    std::cout << "\n";
    return;
  }
  const TorchLoadSupport support = torch_load_support(python.torch_version);
  std::cout << "  [ok] " << where << " (" << labels << "): torch " << python.torch_version << "\n"
            << "        weights_only default: " << yes_no(support.weights_only_default)
            << "; reads holdpoint's default files: " << yes_no(support.reads_default_files)
            << "; torch_1_13_compatible files: " << yes_no(support.reads_torch_1_13_compatible_files) << "\n"
            << "        " << support.note << "\n";
}

int run_doctor(bool json) {
  const bool cuda = at::hasCUDA();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const RuntimeLibTorch runtime = runtime_libtorch();
  const auto apis = load_apis();
  const auto profiles = resume_profiles(cuda);
  const auto pythons = probe_pythons(python_candidates(own_directory(), HOLDPOINT_SOURCE_DIR), kPythonTimeout);

  if (json) {
    nlohmann::ordered_json out;
    out["holdpoint"] = HOLDPOINT_VERSION;
    out["libtorch"] = TORCH_VERSION;
    out["libtorch_runtime"] = {{"version", runtime.version}, {"library", runtime.library}};
    out["compiler"] = __VERSION__;
    out["cuda"] = cuda;
    out["deterministic_algorithms"] = deterministic;
    out["distributed"] = {{"holdpoint_dist", kHaveDist}, {"gloo_process_group", kHaveGlooProcessGroup}};
    nlohmann::ordered_json api_entries = nlohmann::ordered_json::array();
    for (const auto& api : apis) {
      api_entries.push_back({{"name", api.name},
                             {"available", api.available},
                             {"untrusted_ok", api.trust == Trust::untrusted_ok},
                             {"reaches_libtorch_unpickler", api.trust == Trust::trusted_only},
                             {"why", api.why}});
    }
    out["load_apis"] = std::move(api_entries);
    nlohmann::ordered_json profile_entries = nlohmann::ordered_json::array();
    for (const auto& c : profiles) {
      profile_entries.push_back({{"name", c.name}, {"available", c.available}, {"why", c.why}});
    }
    out["resume_profiles"] = std::move(profile_entries);
    nlohmann::ordered_json python_entries = nlohmann::ordered_json::array();
    for (const auto& python : pythons) python_entries.push_back(python_json(python));
    out["python_torch"] = std::move(python_entries);
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  std::cout << "holdpoint " << HOLDPOINT_VERSION << "\n";
  std::cout << "LibTorch  built with " << TORCH_VERSION << ", runs with "
            << (runtime.version.empty() ? std::string("an unknown version") : runtime.version);
  if (!runtime.library.empty()) std::cout << " (" << runtime.library << ")";
  std::cout << "\n          " << (cuda ? "CUDA available" : "CPU only: no CUDA") << "\n";
  std::cout << "c10d      holdpoint_dist: " << yes_no(kHaveDist)
            << "; make_gloo_process_group (Gloo): " << yes_no(kHaveGlooProcessGroup) << "\n";
  std::cout << "compiler  " << __VERSION__ << "\n";
  std::cout << "deterministic algorithms: " << (deterministic ? "on" : "off") << "\n";

  std::cout << "\nload APIs (untrusted OK: never reach LibTorch's unpickler):\n";
  for (const auto& api : apis) {
    std::cout << "  " << (api.available ? "" : "[unavailable] ")
              << (api.trust == Trust::untrusted_ok ? "[untrusted OK] " : "[trusted only] ") << api.name << "\n"
              << "        " << api.why << "\n";
  }
  std::cout << "\nresume profiles:\n";
  for (const auto& c : profiles) {
    std::cout << "  " << (c.available ? "[yes] " : "[no]  ") << c.name << "\n        " << c.why << "\n";
  }
  std::cout << "\nPython torch (what torch.load(path, weights_only=True) reads of holdpoint's output):\n";
  for (const auto& python : pythons) print_python_text(python);
  return 0;
}

}  // namespace
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
