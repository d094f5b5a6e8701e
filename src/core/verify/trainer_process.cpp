#include "verify/trainer_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/fail.h"
#include "base/file_descriptor.h"

extern char** environ;

namespace holdpoint::verify {

using detail::fail;

namespace {

using io::FileDescriptor;

int open_or_fail(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorCode::io_open_failed, path.string(), ": cannot open: ", std::strerror(errno));
  return fd;
}

// posix_spawn's C structures, released on every path.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

}  // namespace

ProcessOutcome run_trainer_process(const std::vector<std::string>& command, const std::filesystem::path& stdout_path,
                                   const std::filesystem::path& stderr_path, std::chrono::milliseconds timeout) {
  if (command.empty()) fail(ErrorCode::invalid_argument, "run_trainer_process: empty command");
  const FileDescriptor input(open_or_fail("/dev/null", O_RDONLY));
  const FileDescriptor output(open_or_fail(stdout_path, O_WRONLY | O_CREAT | O_EXCL));
  const FileDescriptor errors(open_or_fail(stderr_path, O_WRONLY | O_CREAT | O_EXCL));

  SpawnSetup setup;
  posix_spawn_file_actions_adddup2(&setup.actions, input.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, output.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, errors.get(), STDERR_FILENO);
  // Default signal dispositions and an empty mask, as from a shell. The child
  // stays in our process group so that Ctrl-C in a terminal stops it with us
  // rather than leaving it to run on unsupervised.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&setup.attributes, &all);
  posix_spawnattr_setsigmask(&setup.attributes, &none);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> argv;
  for (const std::string& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);

  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int spawn_error = ::posix_spawnp(&pid, argv[0], &setup.actions, &setup.attributes, argv.data(), environ);
  if (spawn_error != 0) fail(ErrorCode::resume_run_failed, command[0], ": cannot start: ", std::strerror(spawn_error));

  ProcessOutcome outcome;
  int status = 0;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) {
      // Not our child any more (someone reaped it): nothing to wait for.
      fail(ErrorCode::resume_run_failed, command[0], ": waitpid failed: ", std::strerror(errno));
    }
    if (std::chrono::steady_clock::now() - start >= timeout) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      outcome.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  return outcome;
}

}  // namespace holdpoint::verify
