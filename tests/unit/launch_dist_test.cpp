// holdpoint/dist/launch.h: torchrun's variables read strictly (every
// rejection by code and naming the variable), and worlds joined over a TCP
// store served by rank 0 or by an "agent" (a store the test serves), over a
// FileStore, with ranks as threads of this process.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>
#include <vector>

#include "holdpoint/dist/launch.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using Env = std::map<std::string, std::string>;

EnvironmentLookup lookup_in(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

// What torchrun sets for rank 5 of 8 (two hosts of four), second restart of three.
Env torchrun_rank5() {
  return {{"RANK", "5"},
          {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"},
          {"MASTER_ADDR", "10.77.0.1"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job-7"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"GLOO_SOCKET_IFNAME", "veth-b"}};
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnvironment, ReadsEveryTorchrunVariable) {
  const LaunchEnvironment e = read_launch_environment(lookup_in(torchrun_rank5()));
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.group_rank, 1);
  EXPECT_EQ(e.master_addr, "10.77.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_EQ(e.max_restarts, 3);
  EXPECT_EQ(e.run_id, "job-7");
  EXPECT_TRUE(e.use_agent_store);
  EXPECT_EQ(e.gloo_interfaces, "veth-b");
  EXPECT_TRUE(e.launched_by_torchrun());
  EXPECT_TRUE(e.is_restart());
}

TEST(LaunchEnvironment, WithoutTorchrunPlacementDefaultsToOneHost) {
  const LaunchEnvironment e = read_launch_environment(
      lookup_in({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 3);
  EXPECT_EQ(e.group_rank, 0);
  EXPECT_EQ(e.restart_count, 0);
  EXPECT_FALSE(e.use_agent_store);
  EXPECT_FALSE(e.launched_by_torchrun());
  EXPECT_FALSE(e.is_restart());
}

TEST(LaunchEnvironment, BooleansInEveryFormTorchrunAndUsersWrite) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, bool>>{
           {"True", true}, {"true", true}, {"1", true}, {"False", false}, {"false", false}, {"0", false}}) {
    Env env = torchrun_rank5();
    env["TORCHELASTIC_USE_AGENT_STORE"] = text;
    EXPECT_EQ(read_launch_environment(lookup_in(env)).use_agent_store, expected) << text;
  }
}

TEST(LaunchEnvironment, EachRequiredVariableMissingIsNamed) {
  for (const std::string name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT"}) {
    SCOPED_TRACE(name);
    for (const bool empty : {false, true}) {
      Env env = torchrun_rank5();
      if (empty) {
        env[name] = "";
      } else {
        env.erase(name);
      }
      EXPECT_ERROR_CODE(read_launch_environment(lookup_in(env)), ErrorCode::launch_variable_missing);
      EXPECT_NE(message_of([&] { read_launch_environment(lookup_in(env)); }).find(name), std::string::npos);
    }
  }
}

TEST(LaunchEnvironment, MalformedNumbersAndBooleansAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK", "-1"},          {"RANK", " 5"},          {"RANK", "5x"},
      {"RANK", "0x5"},         {"WORLD_SIZE", "0"},     {"WORLD_SIZE", "99999999999999999999999"},
      {"MASTER_PORT", "0"},    {"MASTER_PORT", "65536"}, {"MASTER_PORT", "http"},
      {"LOCAL_RANK", "1.0"},   {"GROUP_RANK", "+1"},    {"TORCHELASTIC_RESTART_COUNT", "-2"},
      {"TORCHELASTIC_USE_AGENT_STORE", "yes"},           {"TORCHELASTIC_MAX_RESTARTS", "many"}};
  for (const auto& [name, value] : cases) {
    SCOPED_TRACE(name + "=" + value);
    Env env = torchrun_rank5();
    env[name] = value;
    EXPECT_ERROR_CODE(read_launch_environment(lookup_in(env)), ErrorCode::launch_variable_invalid);
    const std::string message = message_of([&] { read_launch_environment(lookup_in(env)); });
    EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(LaunchEnvironment, ContradictionsNameBothSides) {
  const std::vector<std::pair<Env, std::string>> cases = {
      {{{"RANK", "8"}}, "WORLD_SIZE"},
      {{{"LOCAL_RANK", "4"}}, "LOCAL_WORLD_SIZE"},
      {{{"LOCAL_WORLD_SIZE", "9"}}, "WORLD_SIZE"},
      {{{"LOCAL_RANK", "3"}, {"RANK", "2"}, {"GROUP_RANK", "0"}}, "RANK"},
      {{{"GROUP_RANK", "6"}}, "GROUP_RANK"},
      {{{"TORCHELASTIC_RESTART_COUNT", "4"}}, "TORCHELASTIC_MAX_RESTARTS"}};
  for (const auto& [changes, named] : cases) {
    Env env = torchrun_rank5();
    for (const auto& [k, v] : changes) env[k] = v;
    SCOPED_TRACE(named);
    EXPECT_ERROR_CODE(read_launch_environment(lookup_in(env)), ErrorCode::launch_variables_contradict);
    const std::string message = message_of([&] { read_launch_environment(lookup_in(env)); });
    EXPECT_NE(message.find(named), std::string::npos) << message;
  }
  // An agent store without an agent.
  EXPECT_ERROR_CODE(read_launch_environment(lookup_in({{"RANK", "0"},
                                                       {"WORLD_SIZE", "1"},
                                                       {"MASTER_ADDR", "127.0.0.1"},
                                                       {"MASTER_PORT", "1"},
                                                       {"TORCHELASTIC_USE_AGENT_STORE", "True"}})),
                    ErrorCode::launch_variables_contradict);
}

TEST(LaunchEnvironment, ExplicitValuesAreCheckedLikeVariables) {
  LaunchEnvironment e;
  e.rank = 1;
  e.world_size = 2;
  e.local_rank = 1;
  e.local_world_size = 2;
  e.master_addr = "127.0.0.1";
  e.master_port = 29400;
  EXPECT_NO_THROW(validate_launch_environment(e));
  LaunchEnvironment no_port = e;
  no_port.master_port = 0;
  EXPECT_ERROR_CODE(validate_launch_environment(no_port), ErrorCode::launch_variable_invalid);
  LaunchEnvironment no_addr = e;
  no_addr.master_addr.clear();
  EXPECT_ERROR_CODE(validate_launch_environment(no_addr), ErrorCode::launch_variable_missing);
  LaunchEnvironment two_hosts_on_a_file = e;
  two_hosts_on_a_file.file_store = "/tmp/x";
  two_hosts_on_a_file.local_world_size = 1;
  two_hosts_on_a_file.local_rank = 0;
  EXPECT_ERROR_CODE(validate_launch_environment(two_hosts_on_a_file), ErrorCode::launch_variables_contradict);
  LaunchEnvironment past_world = e;
  past_world.rank = 2;
  EXPECT_ERROR_CODE(validate_launch_environment(past_world), ErrorCode::launch_variables_contradict);
  // join_world checks before it touches the network.
  EXPECT_ERROR_CODE(join_world(past_world), ErrorCode::launch_variables_contradict);
}

// ---- joining worlds -------------------------------------------------------------------------

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// Every rank joins from its own LaunchEnvironment and all-reduces rank + 1,
// on the main group and (when asked) the background one.
std::vector<double> join_and_sum(const std::vector<LaunchEnvironment>& environments, bool background) {
  std::vector<double> sums(environments.size(), -1);
  std::vector<std::thread> ranks;
  for (std::size_t r = 0; r < environments.size(); ++r) {
    ranks.emplace_back([&, r] {
      WorldOptions options;
      options.store_timeout = std::chrono::seconds(30);
      options.background_group = background;
      World world = join_world(environments[r], options);
      std::vector<at::Tensor> values = {at::full({1}, static_cast<double>(r + 1), at::kDouble)};
      world.group->allreduce(values)->wait();
      double total = values[0].item<double>();
      if (background) {
        std::vector<at::Tensor> more = {at::full({1}, 1.0, at::kDouble)};
        world.background->allreduce(more)->wait();
        total += more[0].item<double>() * 1000;
      }
      sums[r] = total;
    });
  }
  for (auto& t : ranks) t.join();
  return sums;
}

std::vector<LaunchEnvironment> tcp_world(int size, std::uint16_t port, bool agent) {
  std::vector<LaunchEnvironment> environments;
  for (int r = 0; r < size; ++r) {
    LaunchEnvironment e;
    e.rank = e.local_rank = r;
    e.world_size = e.local_world_size = size;
    e.master_addr = "127.0.0.1";
    e.master_port = port;
    e.use_agent_store = agent;
    if (agent) e.run_id = "unit";
    environments.push_back(e);
  }
  return environments;
}

TEST(JoinWorld, RankZeroServesTheTcpStore) {
  const auto sums = join_and_sum(tcp_world(3, free_port(), false), true);
  for (double s : sums) EXPECT_EQ(s, 6.0 + 3000.0);
}

TEST(JoinWorld, EveryRankIsAClientOfTheAgentStore) {
  const std::uint16_t port = free_port();
  c10d::TCPStoreOptions served;
  served.port = port;
  served.isServer = true;
  served.waitWorkers = false;
  served.timeout = std::chrono::seconds(30);
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", served);
  const auto sums = join_and_sum(tcp_world(2, port, true), false);
  for (double s : sums) EXPECT_EQ(s, 3.0);
  // The ranks met in the agent's store, under holdpoint's prefix.
  EXPECT_GT(agent->getNumKeys(), 0);
}

TEST(JoinWorld, OneHostOverAFileStore) {
  testing::TempDir dir;
  std::vector<LaunchEnvironment> environments;
  for (int r = 0; r < 2; ++r) {
    LaunchEnvironment e;
    e.rank = e.local_rank = r;
    e.world_size = e.local_world_size = 2;
    e.file_store = dir.path() / "store";
    environments.push_back(e);
  }
  const auto sums = join_and_sum(environments, false);
  for (double s : sums) EXPECT_EQ(s, 3.0);
}

TEST(JoinWorld, FromTheProcessEnvironment) {
  const std::uint16_t port = free_port();
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  World world = join_world_from_environment();
  EXPECT_EQ(world.environment.master_port, port);
  EXPECT_EQ(world.group->getSize(), 1);
  EXPECT_EQ(world.background, nullptr);
  ::unsetenv("MASTER_PORT");
  EXPECT_ERROR_CODE(join_world_from_environment(), ErrorCode::launch_variable_missing);
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR"}) ::unsetenv(name);
}

}  // namespace
}  // namespace holdpoint
