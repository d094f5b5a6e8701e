// The Python interpreters `holdpoint doctor` reports on, and what the torch
// each one has can load of what holdpoint writes.
//
// Each interpreter runs once, with stdin from /dev/null, in a process group
// of its own that is killed when it outlives the timeout: a hanging or broken
// Python is reported as such, never waited for. The probes run concurrently.
//
// Failure contract: nothing throws for a missing or broken interpreter; the
// result says "not found", "timed out" and so on.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace holdpoint::doctor {

// Where to look, in report order. `path` is empty when the place holds no
// interpreter; `detail` then says what was looked for.
struct PythonCandidate {
  std::string found_as;  // "HOLDPOINT_PYTHON", "python3 on PATH", "project .venv", "/usr/bin/python3"
  std::filesystem::path path;
  std::string detail;
};

// HOLDPOINT_PYTHON (if set), python3 on PATH, the project's .venv/bin/python
// (beside the doctor's build directory or in `source_dir`), /usr/bin/python3.
std::vector<PythonCandidate> python_candidates(const std::filesystem::path& doctor_dir,
                                               const std::filesystem::path& source_dir);

enum class ProbeStatus { ok, not_found, torch_not_importable, timed_out, failed };
std::string_view probe_status_name(ProbeStatus status) noexcept;

// One interpreter, however many candidates named it.
struct PythonTorch {
  std::vector<std::string> found_as;
  std::filesystem::path path;  // as first found
  ProbeStatus status = ProbeStatus::not_found;
  std::string detail;          // why, when status is not ok
  std::string executable;      // realpath of its sys.executable
  std::string prefix;          // realpath of its sys.prefix (a venv's own folder)
  std::string torch_version;   // torch.__version__, when status is ok
};

// Runs every distinct candidate. Two candidates are one interpreter when they
// resolve to the same file in the same folder (a venv's python is a symlink to
// its base interpreter, but a different environment) or when they report the
// same sys.executable and sys.prefix.
std::vector<PythonTorch> probe_pythons(const std::vector<PythonCandidate>& candidates,
                                       std::chrono::milliseconds timeout);

// What a Python torch version can load of holdpoint's output with
// torch.load(path, weights_only=True). docs/format.md section 6.1 has the
// constructs behind it.
struct TorchLoadSupport {
  bool weights_only_available = false;  // torch >= 1.13
  bool weights_only_default = false;    // torch >= 2.6
  bool reads_default_files = false;     // BINFLOAT, bytes, _rebuild_tensor_v3: torch >= 2.0
  bool reads_torch_1_13_compatible_files = false;  // SaveOptions::torch_1_13_compatible
  std::string note;
};

// `version` is torch.__version__ ("2.13.0+cpu", "1.13.0a0"); an unparsable
// one supports nothing and says so in the note.
TorchLoadSupport torch_load_support(std::string_view version);

}  // namespace holdpoint::doctor
