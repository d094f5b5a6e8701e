#include "holdpoint/base/memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>

namespace holdpoint {

namespace {

std::optional<std::uint64_t> number_in(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::uint64_t available_memory_bytes() {
  std::uint64_t available = std::numeric_limits<std::uint64_t>::max();
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    std::uint64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib >> unit) {
      if (key == "MemAvailable:") available = kib * 1024;
    }
  }
  // The memory cgroup this process is in, v1 or v2: its limit less its usage.
  std::ifstream groups("/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string where = line.substr(second + 1);
    std::optional<std::uint64_t> limit;
    std::optional<std::uint64_t> usage;
    if (controllers == "memory") {
      const std::filesystem::path group = std::filesystem::path("/sys/fs/cgroup/memory") / where.substr(1);
      limit = number_in(group / "memory.limit_in_bytes");
      usage = number_in(group / "memory.usage_in_bytes");
    } else if (controllers.empty()) {
      const std::filesystem::path group = std::filesystem::path("/sys/fs/cgroup") / where.substr(1);
      limit = number_in(group / "memory.max");
      usage = number_in(group / "memory.current");
    }
    if (limit && usage) available = std::min(available, *limit > *usage ? *limit - *usage : 0);
  }
  return available;
}

}  // namespace holdpoint
