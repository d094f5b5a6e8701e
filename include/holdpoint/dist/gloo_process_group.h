// make_gloo_process_group: a c10d::ProcessGroup over Gloo, for CPU training,
// the examples and the tests, on LibTorch 1.13 and 2.x alike.
//
// LibTorch 1.13's ProcessGroupGloo is itself a ProcessGroup; from 2.0 on it
// is a c10d::Backend that a ProcessGroup dispatches to. This one function
// hides that difference, so the rest of holdpoint (DistributedCheckpointer)
// and its users see only c10d::ProcessGroup. It is built into
// holdpoint::dist only where Gloo's headers were found at configure time
// (HOLDPOINT_HAVE_GLOO_PROCESS_GROUP in holdpoint/config.h).
//
// Thread-safety: each call builds an independent group; the ranks of one
// group must call it with the same store, world size and options.
// Failure contract: what c10d throws (c10::Error, std::runtime_error) when
// the rendezvous through the store fails or times out.
#pragma once

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace holdpoint {

struct GlooGroupOptions {
  // How the rank's Gloo device is found: by the address a host name
  // resolves to (the default: loopback, for ranks on one machine), by a
  // network interface when `interface` is set (a comma-separated list: one
  // device each, as GLOO_SOCKET_IFNAME), or Gloo's own default device
  // when both are empty.
  std::string hostname = "127.0.0.1";
  std::string interface;
  // Collective timeout; the rendezvous itself obeys the store's timeout.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Gloo's worker threads per group.
  int threads = 2;
};

// Collective over `store`: every rank of the group calls it.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                               int world_size, const GlooGroupOptions& options = {});

}  // namespace holdpoint
