// Preemption: SIGTERM, SIGINT and SIGUSR1 turn into a request to save at the
// next step boundary and exit cleanly.
//
// While a PreemptionGuard lives, the first of those signals only sets a flag
// (requested()); the training loop checks it between steps, saves, waits for
// the save to commit, and exits with kExitPreempted. A second signal means
// "stop now": the handler calls _exit(kExitAborted) at once. Nothing is
// corrupted by that: every file becomes visible only by an atomic rename, so
// an abort leaves at most a staging file and, if a save was in flight, an
// uncommitted generation, which the next open of the run directory removes.
// The previous handlers are restored when the guard ends.
//
// Failure contract: constructing a second guard while one lives throws
// holdpoint::Error (save_invalid_request).
//
// Thread-safety: requested() may be called from any thread; the handler is
// async-signal-safe (it touches one lock-free atomic and may call _exit).
#pragma once

#include <csignal>

namespace holdpoint {

// sysexits.h's EX_TEMPFAIL: "try again later" is exactly what a preempted
// run asks of its scheduler.
inline constexpr int kExitPreempted = 75;
// A second signal: stopped at once, LATEST still the last committed save.
inline constexpr int kExitAborted = 76;

class PreemptionGuard {
 public:
  PreemptionGuard();
  ~PreemptionGuard();
  PreemptionGuard(const PreemptionGuard&) = delete;
  PreemptionGuard& operator=(const PreemptionGuard&) = delete;

  // True once a signal arrived; signal() says which (0 if none).
  static bool requested() noexcept;
  static int signal() noexcept;
  // Forgets a request (tests).
  static void reset() noexcept;
  // Raises the request as if a signal had arrived (tests, schedulers that
  // notify by other means).
  static void request(int signal_number = SIGTERM) noexcept;
};

}  // namespace holdpoint
