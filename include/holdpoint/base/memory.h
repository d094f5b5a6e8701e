// How much memory this process may still take, for choices that trade
// memory for speed (a resume in place, docs/resume-contract.md).
//
// Thread-safety: reads /proc and /sys; safe from any thread.
#pragma once

#include <cstdint>

namespace holdpoint {

// MemAvailable (/proc/meminfo), or less where the memory cgroup this process
// runs in (v1 or v2) has less left under its limit. The maximum of
// std::uint64_t where neither can be read.
std::uint64_t available_memory_bytes();

}  // namespace holdpoint
