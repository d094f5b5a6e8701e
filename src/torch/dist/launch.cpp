#include "holdpoint/dist/launch.h"

#include <cstdlib>
#include <iostream>
#include <limits>
#include <string_view>

#include "base/fail.h"

#ifdef HOLDPOINT_HAVE_GLOO_PROCESS_GROUP
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

namespace holdpoint {
namespace {

using detail::fail;

std::optional<std::string> from_process(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

class Variables {
 public:
  explicit Variables(const EnvironmentLookup& lookup) : lookup_(lookup ? lookup : EnvironmentLookup(from_process)) {}

  // Unset and empty are the same: torch.distributed's env:// treats them alike.
  std::optional<std::string> text(const std::string& name) const {
    auto value = lookup_(name);
    if (!value || value->empty()) return std::nullopt;
    return value;
  }

  std::string required_text(const std::string& name, const std::string& why) const {
    auto value = text(name);
    if (!value) fail(ErrorCode::launch_variable_missing, name, " is not set (", why, ")");
    return *value;
  }

  // A decimal integer in [low, high]: digits only, no sign, space or suffix.
  std::optional<std::int64_t> integer(const std::string& name, std::int64_t low, std::int64_t high) const {
    auto value = text(name);
    if (!value) return std::nullopt;
    std::int64_t result = 0;
    bool ok = value->size() <= 19;
    for (char c : *value) {
      if (c < '0' || c > '9') ok = false;
      if (ok) result = result * 10 + (c - '0');
    }
    if (!ok || result < low || result > high) {
      fail(ErrorCode::launch_variable_invalid, name, "=\"", *value, "\" is not an integer in [", low, ", ", high, "]");
    }
    return result;
  }

  std::int64_t required_integer(const std::string& name, std::int64_t low, std::int64_t high,
                                const std::string& why) const {
    if (!text(name)) fail(ErrorCode::launch_variable_missing, name, " is not set (", why, ")");
    return *integer(name, low, high);
  }

  // torchrun writes Python's str(bool); 1/0 and lower case are taken too.
  std::optional<bool> boolean(const std::string& name) const {
    auto value = text(name);
    if (!value) return std::nullopt;
    if (*value == "True" || *value == "true" || *value == "1") return true;
    if (*value == "False" || *value == "false" || *value == "0") return false;
    fail(ErrorCode::launch_variable_invalid, name, "=\"", *value, "\" is not a boolean (True or False)");
  }

 private:
  EnvironmentLookup lookup_;
};

constexpr std::int64_t kMaxWorld = std::int64_t{1} << 24;

}  // namespace

void validate_launch_environment(const LaunchEnvironment& e) {
  if (e.world_size < 1 || e.world_size > kMaxWorld) {
    fail(ErrorCode::launch_variable_invalid, "WORLD_SIZE=", e.world_size, " is not in [1, ", kMaxWorld, "]");
  }
  if (e.rank < 0 || e.rank >= e.world_size) {
    fail(ErrorCode::launch_variables_contradict, "RANK=", e.rank, " is not below WORLD_SIZE=", e.world_size);
  }
  if (e.local_world_size < 1 || e.local_world_size > e.world_size) {
    fail(ErrorCode::launch_variables_contradict, "LOCAL_WORLD_SIZE=", e.local_world_size,
         " is not in [1, WORLD_SIZE=", e.world_size, "]");
  }
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size) {
    fail(ErrorCode::launch_variables_contradict, "LOCAL_RANK=", e.local_rank, " is not below LOCAL_WORLD_SIZE=",
         e.local_world_size);
  }
  if (e.local_rank > e.rank) {
    fail(ErrorCode::launch_variables_contradict, "LOCAL_RANK=", e.local_rank, " exceeds RANK=", e.rank);
  }
  if (e.group_rank < 0 || e.group_rank > e.rank) {
    fail(ErrorCode::launch_variables_contradict, "GROUP_RANK=", e.group_rank, " is not in [0, RANK=", e.rank, "]");
  }
  if (e.restart_count < 0 || (e.launched_by_torchrun() && e.restart_count > e.max_restarts)) {
    fail(ErrorCode::launch_variables_contradict, "TORCHELASTIC_RESTART_COUNT=", e.restart_count,
         " is not in [0, TORCHELASTIC_MAX_RESTARTS=", e.max_restarts, "]");
  }
  if (e.file_store.empty()) {
    if (e.master_addr.empty()) {
      fail(ErrorCode::launch_variable_missing, "MASTER_ADDR is empty (the host that serves the TCP store)");
    }
    if (e.master_port == 0) {
      fail(ErrorCode::launch_variable_invalid, "MASTER_PORT=0 is not a port the ranks can meet at");
    }
  } else if (e.local_world_size != e.world_size) {
    fail(ErrorCode::launch_variables_contradict, "a file store serves one host, but LOCAL_WORLD_SIZE=",
         e.local_world_size, " differs from WORLD_SIZE=", e.world_size);
  }
}

LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup) {
  const Variables v(lookup);
  LaunchEnvironment e;
  const std::string needed = "torchrun sets it for every rank; without torchrun, set it or pass the values";
  e.world_size = v.required_integer("WORLD_SIZE", 1, kMaxWorld, needed);
  e.rank = v.required_integer("RANK", 0, kMaxWorld, needed);
  e.master_addr = v.required_text("MASTER_ADDR", needed);
  e.master_port = static_cast<std::uint16_t>(v.required_integer("MASTER_PORT", 1, 65535, needed));
  e.run_id = v.text("TORCHELASTIC_RUN_ID").value_or("");
  if (e.launched_by_torchrun()) {
    // torchrun always sets these; their absence means a launcher that only
    // looks like torchrun, whose placement we should not guess.
    const std::string by_torchrun = "TORCHELASTIC_RUN_ID is set, so torchrun launched this rank and sets it";
    e.local_rank = v.required_integer("LOCAL_RANK", 0, kMaxWorld, by_torchrun);
    e.local_world_size = v.required_integer("LOCAL_WORLD_SIZE", 1, kMaxWorld, by_torchrun);
    e.group_rank = v.required_integer("GROUP_RANK", 0, kMaxWorld, by_torchrun);
    e.restart_count = v.required_integer("TORCHELASTIC_RESTART_COUNT", 0, kMaxWorld, by_torchrun);
    e.max_restarts = v.integer("TORCHELASTIC_MAX_RESTARTS", 0, kMaxWorld).value_or(e.restart_count);
    e.use_agent_store = v.boolean("TORCHELASTIC_USE_AGENT_STORE").value_or(false);
  } else {
    e.local_rank = v.integer("LOCAL_RANK", 0, kMaxWorld).value_or(e.rank);
    e.local_world_size = v.integer("LOCAL_WORLD_SIZE", 1, kMaxWorld).value_or(e.world_size);
    e.group_rank = v.integer("GROUP_RANK", 0, kMaxWorld).value_or(0);
    e.restart_count = v.integer("TORCHELASTIC_RESTART_COUNT", 0, kMaxWorld).value_or(0);
    e.max_restarts = v.integer("TORCHELASTIC_MAX_RESTARTS", 0, kMaxWorld).value_or(e.restart_count);
    if (v.boolean("TORCHELASTIC_USE_AGENT_STORE").value_or(false)) {
      fail(ErrorCode::launch_variables_contradict,
           "TORCHELASTIC_USE_AGENT_STORE=True says an elastic agent serves the store, but TORCHELASTIC_RUN_ID is not set");
    }
  }
  e.gloo_interfaces = v.text("GLOO_SOCKET_IFNAME").value_or("");
  validate_launch_environment(e);
  return e;
}

#ifdef HOLDPOINT_HAVE_GLOO_PROCESS_GROUP

namespace {

c10::intrusive_ptr<c10d::Store> open_store(const LaunchEnvironment& e, const WorldOptions& options) {
  if (!e.file_store.empty()) {
    auto store = c10::make_intrusive<c10d::FileStore>(e.file_store.string(), static_cast<int>(e.world_size));
    store->setTimeout(options.store_timeout);
    return store;
  }
  c10d::TCPStoreOptions tcp;
  tcp.port = e.master_port;
  tcp.timeout = options.store_timeout;
  if (e.use_agent_store) {
    // The elastic agent serves it; it is alive before any worker starts.
    tcp.isServer = false;
    tcp.waitWorkers = false;
  } else {
    tcp.isServer = e.rank == 0;
    tcp.numWorkers = static_cast<std::size_t>(e.world_size);
    tcp.waitWorkers = true;
    tcp.multiTenant = true;
  }
  return c10::make_intrusive<c10d::TCPStore>(e.master_addr, tcp);
}

GlooGroupOptions device_for(const LaunchEnvironment& e, const WorldOptions& options) {
  GlooGroupOptions gloo = options.gloo;
  if (!options.device_from_environment) return gloo;
  gloo.interface.clear();
  gloo.hostname.clear();
  if (!e.gloo_interfaces.empty()) {
    gloo.interface = e.gloo_interfaces;
  } else if (e.local_world_size == e.world_size) {
    gloo.hostname = "127.0.0.1";
  }
  return gloo;
}

}  // namespace

World join_world(const LaunchEnvironment& environment, const WorldOptions& options) {
  validate_launch_environment(environment);
  if (environment.use_agent_store && environment.max_restarts > 0 &&
      !from_process("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")) {
    // The agent's store outlives a restart and still holds the failed
    // world's rendezvous keys unless torchrun makes a fresh one per round.
    if (environment.rank == 0) {
      std::cerr << "holdpoint: torchrun may restart this world (--max-restarts "
                << environment.max_restarts
                << ") over its shared rendezvous store; set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun "
                   "so that each restart meets in a fresh store (docs/distributed.md, \"Running under torchrun\")\n";
    }
  }
  World world;
  world.environment = environment;
  world.store = open_store(environment, options);
  const GlooGroupOptions gloo = device_for(environment, options);
  const int rank = static_cast<int>(environment.rank);
  const int size = static_cast<int>(environment.world_size);
  world.group = make_gloo_process_group(
      c10::make_intrusive<c10d::PrefixStore>(options.store_prefix + "/main", world.store), rank, size, gloo);
  if (options.background_group) {
    world.background = make_gloo_process_group(
        c10::make_intrusive<c10d::PrefixStore>(options.store_prefix + "/background", world.store), rank, size, gloo);
  }
  return world;
}

World join_world_from_environment(const WorldOptions& options) {
  return join_world(read_launch_environment(), options);
}

#endif  // HOLDPOINT_HAVE_GLOO_PROCESS_GROUP

}  // namespace holdpoint
