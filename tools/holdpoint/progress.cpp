#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "commands.h"

namespace holdpoint::cli {

std::function<void(std::uint64_t, std::uint64_t)> terminal_progress(const std::string& label) {
  if (!::isatty(STDERR_FILENO)) return {};
  auto start = std::chrono::steady_clock::now();
  return [label, start](std::uint64_t done, std::uint64_t total) {
    // Small files finish before anyone could read a progress line.
    if (total < (std::uint64_t{256} << 20)) return;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::fprintf(stderr, "\r%s: %3.0f%% (%.2f of %.2f GiB, %.2f GB/s)", label.c_str(),
                 100.0 * static_cast<double>(done) / static_cast<double>(total), static_cast<double>(done) / gib,
                 static_cast<double>(total) / gib, seconds > 0 ? static_cast<double>(done) / 1e9 / seconds : 0.0);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

}  // namespace holdpoint::cli
