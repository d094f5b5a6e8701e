// Running one trainer process for resume verification: a fresh process with
// stdin from /dev/null, stdout and stderr captured to files, and a wall-clock
// limit, at which it is killed with SIGKILL. It stays in the caller's process
// group, so a terminal's Ctrl-C stops it together with the verifier; a trainer
// started through a wrapper script should `exec` it, so that the process
// killed at the limit is the trainer itself.
//
// Failure contract: run_trainer_process never throws for what the child does;
// it reports how the child ended. It throws Error(resume_run_failed) when the
// process cannot be started (the message names the program and errno), and
// io_open_failed when a log file cannot be created.
//
// Thread-safety: concurrent calls are fine; each waits only for its own child.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace holdpoint::verify {

struct ProcessOutcome {
  std::optional<int> exit_code;  // unset when a signal ended it
  std::optional<int> signal;
  bool timed_out = false;        // killed (SIGKILL) at the limit
  double seconds = 0;
};

// Runs command[0] (searched in PATH when it has no slash) with `command` as argv.
ProcessOutcome run_trainer_process(const std::vector<std::string>& command, const std::filesystem::path& stdout_path,
                                   const std::filesystem::path& stderr_path, std::chrono::milliseconds timeout);

}  // namespace holdpoint::verify
