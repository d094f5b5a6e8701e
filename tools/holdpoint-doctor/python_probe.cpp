#include "python_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <utility>

extern char** environ;

namespace holdpoint::doctor {
namespace {

using Clock = std::chrono::steady_clock;

// Prints what identifies the interpreter before importing torch, so that a
// Python without torch is told apart from something that is not a Python.
constexpr const char* kProbeScript =
    "import os, sys\n"
    "print('executable=' + os.path.realpath(sys.executable))\n"
    "print('prefix=' + os.path.realpath(sys.prefix))\n"
    "sys.stdout.flush()\n"
    "import torch\n"
    "print('torch=' + torch.__version__)\n";

// A traceback is a few KiB; anything longer is not worth keeping.
constexpr std::size_t kMaxOutputBytes = 64 * 1024;

struct ProcessResult {
  int spawn_error = 0;  // errno of posix_spawn (the interpreter could not be started)
  bool timed_out = false;
  int wait_status = 0;
  std::string output;  // stdout and stderr together
};

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

void kill_group(pid_t pid) { ::kill(-pid, SIGKILL); }

// Waits for `pid` until `deadline`, then kills its group and reaps it.
int reap(pid_t pid, Clock::time_point deadline, bool& timed_out) {
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0 && errno != EINTR) return status;
    if (Clock::now() >= deadline) {
      timed_out = true;
      kill_group(pid);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ProcessResult run_with_timeout(const std::filesystem::path& program, std::chrono::milliseconds timeout) {
  ProcessResult result;
  int fds[2];
  // Close-on-exec: a probe started concurrently must not inherit this pipe,
  // or the read below would not see end-of-file until that probe ends too.
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.spawn_error = errno;
    return result;
  }
  Fd read_end(fds[0]);
  Fd write_end(fds[1]);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  // A group of its own, so that a timeout kills whatever it started as well.
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);

  const std::string program_name = program.string();
  std::vector<char*> argv = {const_cast<char*>(program_name.c_str()), const_cast<char*>("-c"),
                             const_cast<char*>(kProbeScript), nullptr};
  pid_t pid = 0;
  const auto deadline = Clock::now() + timeout;
  const int spawned = ::posix_spawn(&pid, program_name.c_str(), &actions, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  write_end.reset();
  if (spawned != 0) {
    result.spawn_error = spawned;
    return result;
  }

  char buffer[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd ready{read_end.get(), POLLIN, 0};
    const int polled = ::poll(&ready, 1, static_cast<int>(left));
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) continue;  // the deadline check above ends the loop
    const ssize_t got = ::read(read_end.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // end of file (or an error: the exit status tells)
    const auto keep = std::min<std::size_t>(static_cast<std::size_t>(got), kMaxOutputBytes - result.output.size());
    result.output.append(buffer, keep);
  }
  read_end.reset();
  result.wait_status = reap(pid, deadline, result.timed_out);
  return result;
}

std::optional<std::filesystem::path> find_on_path(std::string_view name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return std::nullopt;
  std::string_view rest = path;
  while (true) {
    const auto colon = rest.find(':');
    const std::string_view dir = rest.substr(0, colon);
    const std::filesystem::path candidate = std::filesystem::path(dir.empty() ? "." : dir) / name;
    if (::access(candidate.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

std::string canonical_or_empty(const std::filesystem::path& path) {
  std::error_code error;
  const auto resolved = std::filesystem::canonical(path, error);
  return error ? std::string() : resolved.string();
}

// The identity used before running anything: the resolved file and the
// resolved folder it was found in (python decides which environment it is by
// the folder it was started from, not by the file a symlink points to).
std::string location_key(const std::filesystem::path& path) {
  return canonical_or_empty(path.parent_path()) + "\n" + canonical_or_empty(path);
}

std::string last_line(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  const auto newline = text.rfind('\n');
  return std::string(newline == std::string_view::npos ? text : text.substr(newline + 1));
}

std::string value_of(std::string_view output, std::string_view key) {
  std::size_t at = 0;
  while (at < output.size()) {
    auto end = output.find('\n', at);
    if (end == std::string_view::npos) end = output.size();
    const std::string_view line = output.substr(at, end - at);
    if (line.substr(0, key.size()) == key && line.size() > key.size() && line[key.size()] == '=') {
      return std::string(line.substr(key.size() + 1));
    }
    at = end + 1;
  }
  return {};
}

void probe(PythonTorch& python, std::chrono::milliseconds timeout) {
  const ProcessResult run = run_with_timeout(python.path, timeout);
  if (run.spawn_error != 0) {
    python.status = run.spawn_error == ENOENT ? ProbeStatus::not_found : ProbeStatus::failed;
    python.detail = std::string("cannot run it: ") + std::strerror(run.spawn_error);
    return;
  }
  python.executable = value_of(run.output, "executable");
  python.prefix = value_of(run.output, "prefix");
  python.torch_version = value_of(run.output, "torch");
  const bool exited_zero = WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0;
  if (!python.torch_version.empty() && (exited_zero || run.timed_out)) {
    // Killed while shutting down after it answered: the answer stands.
    python.status = ProbeStatus::ok;
  } else if (run.timed_out) {
    python.status = ProbeStatus::timed_out;
    python.detail = "no answer within " + std::to_string(timeout.count() / 1000) + " s (killed)";
  } else if (!python.executable.empty()) {
    python.status = ProbeStatus::torch_not_importable;
    python.torch_version.clear();
    python.detail = last_line(run.output);
  } else {
    python.status = ProbeStatus::failed;
    python.detail = "not a working Python";
    if (const auto line = last_line(run.output); !line.empty()) python.detail += ": " + line;
  }
}

std::optional<std::pair<int, int>> major_minor(std::string_view version) {
  int major = 0;
  int minor = 0;
  const char* end = version.data() + version.size();
  auto parsed = std::from_chars(version.data(), end, major);
  if (parsed.ec != std::errc() || parsed.ptr == end || *parsed.ptr != '.') return std::nullopt;
  parsed = std::from_chars(parsed.ptr + 1, end, minor);
  if (parsed.ec != std::errc()) return std::nullopt;
  return std::pair{major, minor};
}

}  // namespace

std::vector<PythonCandidate> python_candidates(const std::filesystem::path& doctor_dir,
                                               const std::filesystem::path& source_dir) {
  std::vector<PythonCandidate> candidates;
  if (const char* chosen = std::getenv("HOLDPOINT_PYTHON"); chosen != nullptr && *chosen != '\0') {
    std::filesystem::path path = chosen;
    if (path.native().find('/') == std::string::npos) {
      // A bare name, as a shell would take it.
      const auto on_path = find_on_path(chosen);
      path = on_path ? *on_path : path;
    }
    candidates.push_back({"HOLDPOINT_PYTHON", path, ""});
  }

  if (const auto python3 = find_on_path("python3")) {
    candidates.push_back({"python3 on PATH", *python3, ""});
  } else {
    candidates.push_back({"python3 on PATH", {}, "no python3 in any PATH directory"});
  }

  // The build directory usually sits in the checkout (build/, build-debian/).
  std::vector<std::filesystem::path> venvs = {doctor_dir.parent_path() / ".venv/bin/python"};
  if (!source_dir.empty()) venvs.push_back(source_dir / ".venv/bin/python");
  PythonCandidate venv{"project .venv", {}, "no .venv/bin/python in"};
  for (const auto& path : venvs) {
    if (::access(path.c_str(), X_OK) == 0) {
      venv.path = path;
      venv.detail.clear();
      break;
    }
    venv.detail += " " + path.parent_path().parent_path().parent_path().string();
  }
  candidates.push_back(venv);

  candidates.push_back({"/usr/bin/python3", "/usr/bin/python3", ""});
  return candidates;
}

std::string_view probe_status_name(ProbeStatus status) noexcept {
  switch (status) {
    case ProbeStatus::ok:
      return "ok";
    case ProbeStatus::not_found:
      return "not found";
    case ProbeStatus::torch_not_importable:
      return "torch not importable";
    case ProbeStatus::timed_out:
      return "timed out";
    case ProbeStatus::failed:
      return "failed";
  }
  return "failed";
}

std::vector<PythonTorch> probe_pythons(const std::vector<PythonCandidate>& candidates,
                                       std::chrono::milliseconds timeout) {
  std::vector<PythonTorch> pythons;
  std::vector<std::string> keys;
  for (const auto& candidate : candidates) {
    if (candidate.path.empty()) {
      pythons.push_back({{candidate.found_as}, {}, ProbeStatus::not_found, candidate.detail, {}, {}, {}});
      keys.emplace_back();
      continue;
    }
    const std::string key = location_key(candidate.path);
    if (key.back() == '\n') {  // the file does not resolve: it does not exist
      pythons.push_back({{candidate.found_as}, candidate.path, ProbeStatus::not_found, "no such file", {}, {}, {}});
      keys.emplace_back();
      continue;
    }
    const auto same = std::find(keys.begin(), keys.end(), key);
    if (same != keys.end()) {
      pythons[static_cast<std::size_t>(same - keys.begin())].found_as.push_back(candidate.found_as);
      continue;
    }
    pythons.push_back({{candidate.found_as}, candidate.path, ProbeStatus::ok, {}, {}, {}, {}});
    keys.push_back(key);
  }

  std::vector<std::future<void>> running;
  for (std::size_t i = 0; i < pythons.size(); ++i) {
    if (keys[i].empty()) continue;
    running.push_back(std::async(std::launch::async, [&python = pythons[i], timeout] { probe(python, timeout); }));
  }
  for (auto& done : running) done.get();

  // Different paths to one environment (a shim, a second symlink).
  std::vector<PythonTorch> distinct;
  for (auto& python : pythons) {
    const auto same = std::find_if(distinct.begin(), distinct.end(), [&](const PythonTorch& seen) {
      return !python.executable.empty() && seen.executable == python.executable && seen.prefix == python.prefix;
    });
    if (same == distinct.end()) {
      distinct.push_back(std::move(python));
    } else {
      same->found_as.insert(same->found_as.end(), python.found_as.begin(), python.found_as.end());
    }
  }
  return distinct;
}

TorchLoadSupport torch_load_support(std::string_view version) {
  TorchLoadSupport support;
  const auto parsed = major_minor(version);
  if (!parsed) {
    support.note = "unrecognized torch version";
    return support;
  }
  const auto at_least = [&](int major, int minor) { return *parsed >= std::pair{major, minor}; };
  support.weights_only_available = at_least(1, 13);
  support.weights_only_default = at_least(2, 6);
  support.reads_default_files = at_least(2, 0);
  support.reads_torch_1_13_compatible_files = at_least(1, 13);
  if (!at_least(1, 6)) {
    support.note = "reads no zip archives (torch.save's format since 1.6)";
  } else if (!support.weights_only_available) {
    support.note = "no weights_only: its torch.load runs the file's pickle code; reads holdpoint files only that way";
  } else if (!support.reads_default_files) {
    support.note =
        "weights_only=True refuses BINFLOAT, bytes and _rebuild_tensor_v3: write with "
        "SaveOptions::torch_1_13_compatible for it";
  } else if (!support.weights_only_default) {
    support.note = "reads holdpoint files with torch.load(path, weights_only=True); its default runs pickle code";
  } else {
    support.note = "torch.load(path) reads holdpoint files (weights_only=True is the default)";
  }
  return support;
}

}  // namespace holdpoint::doctor
