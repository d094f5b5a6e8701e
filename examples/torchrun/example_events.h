// What the torchrun examples report, for their readers and for
// tests/python/test_torchrun_hosts.py: JSON event lines and the model's digest.
#pragma once

#include <ATen/core/Tensor.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "holdpoint/base/sha256.h"

namespace example {

// One JSON line {"t": ..., "pid": ..., <fields>} appended to `path` in one
// write (O_APPEND), so that the ranks of several hosts can share the file.
// Nothing when `path` is empty.
inline void event(const std::string& path, const std::string& fields) {
  if (path.empty()) return;
  const double t = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line =
      "{\"t\": " + std::to_string(t) + ", \"pid\": " + std::to_string(::getpid()) + ", " + fields + "}\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  [[maybe_unused]] const auto written = ::write(fd, line.data(), line.size());
  ::close(fd);
}

// The SHA-256 of the parameters' bytes, in order: equal models, equal digests.
inline std::string parameters_sha256(const std::vector<at::Tensor>& parameters) {
  holdpoint::Sha256 hasher;
  for (const auto& p : parameters) {
    const at::Tensor data = p.detach().contiguous();
    hasher.update(data.data_ptr(), data.nbytes());
  }
  return hasher.finish().hex();
}

}  // namespace example
