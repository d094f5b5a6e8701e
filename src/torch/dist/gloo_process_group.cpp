// The only translation unit that includes Gloo's headers (through
// ProcessGroupGloo.hpp); see holdpoint/dist/gloo_process_group.h for why.
#include "holdpoint/dist/gloo_process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#include <algorithm>

namespace holdpoint {

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                               int world_size, const GlooGroupOptions& options) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  if (!options.interface.empty()) {
    // One device per interface of a comma-separated list (GLOO_SOCKET_IFNAME's form).
    std::size_t begin = 0;
    while (begin <= options.interface.size()) {
      const std::size_t end = std::min(options.interface.find(',', begin), options.interface.size());
      if (end > begin) {
        gloo_options->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForInterface(options.interface.substr(begin, end - begin)));
      }
      begin = end + 1;
    }
  } else if (!options.hostname.empty()) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
  } else {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  gloo_options->threads = options.threads;
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.x: the Gloo group is the process group.
  return backend;
#else
  // LibTorch 2.x: a ProcessGroup that sends CPU collectives to the Gloo backend.
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world_size);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  return group;
#endif
}

}  // namespace holdpoint
