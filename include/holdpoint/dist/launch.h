// Joining a world from what the launcher says: torchrun's environment
// variables, or explicit arguments where there is no launcher
// (docs/distributed.md, "Running under torchrun").
//
// read_launch_environment() reads, strictly, the variables torchrun (the
// elastic agent) sets for each worker: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
// TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE, and GLOO_SOCKET_IFNAME.
// join_world() then builds the store and Gloo process group(s) the way
// torch.distributed's env:// rendezvous does:
//   - TORCHELASTIC_USE_AGENT_STORE=True: the agent on the first host serves a
//     c10d::TCPStore at MASTER_ADDR:MASTER_PORT and every rank is a client;
//   - otherwise rank 0 serves it there and the others are clients;
//   - with `file_store` set (one host, no launcher), a c10d::FileStore.
// The Gloo device: GLOO_SOCKET_IFNAME's interface(s) when set; loopback when
// every rank is on this host (LOCAL_WORLD_SIZE == WORLD_SIZE); otherwise the
// address this host's name resolves to, as torch.distributed does.
//
// torchrun restarts the whole world after any failure (up to
// --max-restarts); TORCHELASTIC_RESTART_COUNT is its only sign. A program
// resumes by calling DistributedCheckpointer::resume() (or Trainer::resume())
// on every start: the run's LATEST, or nothing on the first.
//
// Failure contract: holdpoint::Error launch_variable_missing (a required
// variable is absent or empty), launch_variable_invalid (not a number, out of
// range, not a boolean) or launch_variables_contradict (RANK >= WORLD_SIZE,
// LOCAL_RANK >= LOCAL_WORLD_SIZE, ...); each message names the variable(s)
// and value(s). join_world propagates what c10d throws when the store or the
// group cannot be reached within `store_timeout` (c10::Error,
// std::runtime_error).
//
// Thread-safety: read_launch_environment reads the process environment
// (getenv); call it before starting threads that set variables.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include <c10/util/intrusive_ptr.h>

#include "holdpoint/dist/gloo_process_group.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace holdpoint {

struct LaunchEnvironment {
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  std::int64_t local_rank = 0;        // the rank's index on its host
  std::int64_t local_world_size = 1;  // ranks on this host
  std::int64_t group_rank = 0;        // the host's index (torchrun's node rank)
  std::string master_addr;            // where the TCP store is served
  std::uint16_t master_port = 0;
  std::int64_t restart_count = 0;     // 0 on the first start, n after the n-th restart
  std::int64_t max_restarts = 0;
  std::string run_id;                 // TORCHELASTIC_RUN_ID; empty without torchrun
  bool use_agent_store = false;       // the agent, not rank 0, serves the store
  std::string gloo_interfaces;        // GLOO_SOCKET_IFNAME: comma-separated interfaces
  // One host without a launcher: a c10d::FileStore at this path instead of TCP
  // (the path must be fresh for each start of the world).
  std::filesystem::path file_store;

  bool launched_by_torchrun() const { return !run_id.empty(); }
  bool is_restart() const { return restart_count > 0; }
};

// Looks a variable up: nullopt when unset. The default reads the process
// environment; tests pass their own.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads and checks the variables. RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT are required; LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK are
// required when TORCHELASTIC_RUN_ID is set (torchrun sets them all) and
// otherwise default to a single host (LOCAL_RANK = RANK, LOCAL_WORLD_SIZE =
// WORLD_SIZE, GROUP_RANK = 0).
LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup = {});

// Checks an environment built by hand (the explicit-arguments path) with the
// same rules and codes as read_launch_environment; the message names the
// field as the variable it stands for.
void validate_launch_environment(const LaunchEnvironment& environment);

struct WorldOptions {
  // How long the store connection and the Gloo rendezvous may take.
  std::chrono::milliseconds store_timeout = std::chrono::minutes(5);
  // Collective timeout and threads; the device fields are ignored unless
  // `device_from_environment` is false.
  GlooGroupOptions gloo;
  bool device_from_environment = true;
  // A second group over the same ranks, for DistributedCheckpointer's
  // background saves (DistributedCheckpointOptions::background).
  bool background_group = false;
  // Keys of the store are written under this prefix.
  std::string store_prefix = "holdpoint";
};

struct World {
  LaunchEnvironment environment;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::intrusive_ptr<c10d::ProcessGroup> background;  // null unless asked for
};

// Collective: every rank of the world calls it. Validates first.
World join_world(const LaunchEnvironment& environment, const WorldOptions& options = {});

// join_world(read_launch_environment(), options).
World join_world_from_environment(const WorldOptions& options = {});

}  // namespace holdpoint
