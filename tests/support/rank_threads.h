// Threads as ranks: each runs a body with its own Gloo process group over one
// c10d::HashStore (tests of holdpoint/dist only; the *_dist_test targets).
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/dist/gloo_process_group.h"

namespace holdpoint::testing {

// Runs `body(rank, group, background)` on `world` threads, each with its own
// Gloo group pair (the second one for background saves) over one
// HashStore. Returns each rank's exception (empty when it returned).
using TwoGroupBody = std::function<void(std::int64_t rank, c10d::ProcessGroup& group, c10d::ProcessGroup& background)>;
inline std::vector<std::exception_ptr> run_ranks_with_background(int world, const TwoGroupBody& body, bool background = true) {
  static std::atomic<int> launches{0};
  auto store = c10::make_intrusive<c10d::HashStore>();
  const std::string prefix = "t" + std::to_string(launches++);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        const auto make = [&](const std::string& name) {
          holdpoint::GlooGroupOptions options;
          options.timeout = std::chrono::seconds(20);
          options.threads = 1;
          return holdpoint::make_gloo_process_group(c10::make_intrusive<c10d::PrefixStore>(prefix + name, store),
                                                    rank, world, options);
        };
        auto group = make("/main");
        auto second = background ? make("/background") : group;
        body(rank, *group, *second);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same with one group per rank.
using RankBody = std::function<void(std::int64_t rank, c10d::ProcessGroup& group)>;
inline std::vector<std::exception_ptr> run_ranks(int world, const RankBody& body) {
  return run_ranks_with_background(
      world, [&](std::int64_t rank, c10d::ProcessGroup& group, c10d::ProcessGroup&) { body(rank, group); }, false);
}

inline void expect_all_ok(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

inline std::optional<Error> error_of(const std::exception_ptr& error) {
  if (!error) return std::nullopt;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a holdpoint::Error: " << e.what();
  }
  return std::nullopt;
}

}  // namespace holdpoint::testing
