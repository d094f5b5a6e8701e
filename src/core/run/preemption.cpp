#include "holdpoint/run/preemption.h"

#include <unistd.h>

#include <array>
#include <atomic>

#include "base/fail.h"

namespace holdpoint {

namespace {

constexpr std::array<int, 3> kSignals = {SIGTERM, SIGINT, SIGUSR1};

std::atomic<int> requested_signal{0};
std::atomic<bool> guard_alive{false};
std::array<struct sigaction, kSignals.size()> previous{};

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_preemption_signal(int signal_number) {
  int expected = 0;
  if (!requested_signal.compare_exchange_strong(expected, signal_number)) {
    // The second signal: stop now. Publication is atomic, so this leaves at
    // most a staging file behind.
    static constexpr char message[] = "holdpoint: second signal, aborting without saving\n";
    [[maybe_unused]] const auto ignored = ::write(STDERR_FILENO, message, sizeof message - 1);
    ::_exit(kExitAborted);
  }
}

}  // namespace

PreemptionGuard::PreemptionGuard() {
  if (guard_alive.exchange(true)) {
    detail::fail(ErrorCode::save_invalid_request, "a PreemptionGuard is already installed in this process");
  }
  requested_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &action, &previous[i]);
}

PreemptionGuard::~PreemptionGuard() {
  for (std::size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous[i], nullptr);
  guard_alive.store(false);
}

bool PreemptionGuard::requested() noexcept { return requested_signal.load() != 0; }
int PreemptionGuard::signal() noexcept { return requested_signal.load(); }
void PreemptionGuard::reset() noexcept { requested_signal.store(0); }
void PreemptionGuard::request(int signal_number) noexcept {
  int expected = 0;
  requested_signal.compare_exchange_strong(expected, signal_number);
}

}  // namespace holdpoint
