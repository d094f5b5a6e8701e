// allreduce_smoke: the c10d/Gloo foundation for issue 6 (docs/distributed-notes.md).
//
// N processes on one machine join one ProcessGroupGloo through a shared
// c10d::FileStore (or a TCPStore on 127.0.0.1), then run the collectives the
// sharded checkpoint protocol needs:
//   allreduce   float64 [4] of (rank + 1)          -> every element world*(world+1)/2
//   allgather   variable-length bytes per rank     -> every rank sees every rank's
//               (the SHA-256 hex of "holdpoint-shard-<rank>", plus a rank-length tail,
//               so lengths differ): lengths are all-gathered first, then the bytes,
//               padded to the longest
//   broadcast   bytes from rank 0 ("commit step-00000042")
//   barrier
// and prints one JSON line per rank on stdout. Exit 0 on success, 1 on a wrong
// result, 2 on a usage error, 3 when a collective or the setup threw.
//
//   allreduce_smoke --rank R --world-size N --store /tmp/x.store [--store-kind file|tcp]
//                   [--port P] [--device hostname|interface|default] [--timeout-ms MS]
//                   [--die-before PHASE] [--stall-before PHASE [--stall-ms MS]]
// PHASE is setup|allreduce|allgather|broadcast|barrier. RANK, WORLD_SIZE and
// HOLDPOINT_DDP_STORE stand in for the flags. --die-before makes this rank
// SIGKILL itself before that phase, --stall-before makes it sleep (default 60 s):
// probes for how a peer's crash or hang reaches the other ranks.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "holdpoint/dist/gloo_process_group.h"
#include "holdpoint/base/sha256.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  int rank = -1;
  int world_size = -1;
  std::string store;
  std::string store_kind = "file";
  int port = 29577;
  std::string device = "hostname";
  long timeout_ms = 30000;
  std::string die_before;
  std::string stall_before;
  long stall_ms = 60000;
};

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "allreduce_smoke: " << why << "\n"
            << "usage: allreduce_smoke --rank R --world-size N --store PATH [--store-kind file|tcp] [--port P]\n"
            << "       [--device hostname|interface|default] [--timeout-ms MS] [--die-before PHASE]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  if (const char* v = std::getenv("RANK")) a.rank = std::atoi(v);
  if (const char* v = std::getenv("WORLD_SIZE")) a.world_size = std::atoi(v);
  if (const char* v = std::getenv("HOLDPOINT_DDP_STORE")) a.store = v;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage("missing value for " + flag);
    std::string value = argv[++i];
    if (flag == "--rank") a.rank = std::atoi(value.c_str());
    else if (flag == "--world-size") a.world_size = std::atoi(value.c_str());
    else if (flag == "--store") a.store = value;
    else if (flag == "--store-kind") a.store_kind = value;
    else if (flag == "--port") a.port = std::atoi(value.c_str());
    else if (flag == "--device") a.device = value;
    else if (flag == "--timeout-ms") a.timeout_ms = std::atol(value.c_str());
    else if (flag == "--die-before") a.die_before = value;
    else if (flag == "--stall-before") a.stall_before = value;
    else if (flag == "--stall-ms") a.stall_ms = std::atol(value.c_str());
    else usage("unknown flag " + flag);
  }
  if (a.world_size < 1 || a.rank < 0 || a.rank >= a.world_size) usage("need 0 <= rank < world-size");
  if (a.store_kind == "file" && a.store.empty()) usage("need --store PATH for a FileStore");
  if (a.store_kind != "file" && a.store_kind != "tcp") usage("--store-kind is file or tcp");
  return a;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void maybe_die(const Args& a, const char* phase) {
  if (a.die_before == phase) {
    std::cerr << "rank " << a.rank << ": dying before " << phase << "\n";
    std::raise(SIGKILL);
  }
  if (a.stall_before == phase) {
    std::cerr << "rank " << a.rank << ": stalling " << a.stall_ms << " ms before " << phase << "\n";
    std::this_thread::sleep_for(std::chrono::milliseconds(a.stall_ms));
  }
}

at::Tensor bytes_tensor(const std::string& s) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(s.size())}, at::kByte);
  if (!s.empty()) std::memcpy(t.data_ptr<std::uint8_t>(), s.data(), s.size());
  return t;
}

std::string tensor_string(const at::Tensor& t, std::int64_t length) {
  return std::string(reinterpret_cast<const char*>(t.data_ptr<std::uint8_t>()), static_cast<std::size_t>(length));
}

// All-gathers one byte string per rank (lengths may differ). Gloo's allgather
// needs equal shapes, so lengths go first and the bytes are padded.
std::vector<std::string> allgather_bytes(c10d::ProcessGroup& pg, const std::string& mine) {
  const int world = pg.getSize();
  std::vector<at::Tensor> length_in{at::full({1}, static_cast<std::int64_t>(mine.size()), at::kLong)};
  std::vector<std::vector<at::Tensor>> length_out(1);
  for (int r = 0; r < world; ++r) length_out[0].push_back(at::empty({1}, at::kLong));
  pg.allgather(length_out, length_in)->wait();
  std::int64_t longest = 0;
  std::vector<std::int64_t> lengths;
  for (auto& t : length_out[0]) {
    lengths.push_back(t.item<std::int64_t>());
    longest = std::max(longest, lengths.back());
  }
  std::vector<at::Tensor> bytes_in{at::zeros({longest}, at::kByte)};
  if (!mine.empty()) std::memcpy(bytes_in[0].data_ptr<std::uint8_t>(), mine.data(), mine.size());
  std::vector<std::vector<at::Tensor>> bytes_out(1);
  for (int r = 0; r < world; ++r) bytes_out[0].push_back(at::empty({longest}, at::kByte));
  pg.allgather(bytes_out, bytes_in)->wait();
  std::vector<std::string> result;
  for (int r = 0; r < world; ++r) result.push_back(tensor_string(bytes_out[0][r], lengths[r]));
  return result;
}

std::string shard_digest_text(int rank) {
  std::string payload = "holdpoint-shard-" + std::to_string(rank);
  auto digest = holdpoint::Sha256::of(std::as_bytes(std::span(payload.data(), payload.size())));
  return digest.hex() + std::string(static_cast<std::size_t>(rank), '+');
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const auto timeout = std::chrono::milliseconds(a.timeout_ms);
  nlohmann::json out;
  out["rank"] = a.rank;
  out["world_size"] = a.world_size;
  out["store_kind"] = a.store_kind;
  out["device"] = a.device;
  bool ok = true;
  try {
    maybe_die(a, "setup");
    const auto t_setup = Clock::now();
    c10::intrusive_ptr<c10d::Store> store;
    if (a.store_kind == "file") {
      store = c10::make_intrusive<c10d::FileStore>(a.store, a.world_size);
    } else {
      c10d::TCPStoreOptions o;
      o.port = static_cast<std::uint16_t>(a.port);
      o.isServer = a.rank == 0;
      o.numWorkers = static_cast<std::size_t>(a.world_size);
      o.waitWorkers = true;
      o.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
    }
    store->setTimeout(timeout);
    // A prefix keeps this group's keys apart from anything else using the store.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("holdpoint/pg0", store);
    holdpoint::GlooGroupOptions options;
    options.timeout = timeout;
    if (a.device == "interface") {
      options.interface = "lo";
    } else if (a.device == "default") {
      options.hostname.clear();
    }
    auto pg = holdpoint::make_gloo_process_group(prefixed, a.rank, a.world_size, options);
    out["setup_ms"] = ms_since(t_setup);

    maybe_die(a, "allreduce");
    const auto t_coll = Clock::now();
    std::vector<at::Tensor> reduce{at::full({4}, static_cast<double>(a.rank + 1), at::kDouble)};
    pg->allreduce(reduce)->wait();
    const double expected_sum = a.world_size * (a.world_size + 1) / 2.0;
    std::vector<double> reduced(reduce[0].data_ptr<double>(), reduce[0].data_ptr<double>() + 4);
    out["allreduce"] = reduced;
    for (double v : reduced) ok = ok && v == expected_sum;

    maybe_die(a, "allgather");
    auto gathered = allgather_bytes(*pg, shard_digest_text(a.rank));
    out["allgather"] = gathered;
    for (int r = 0; r < a.world_size; ++r) ok = ok && gathered[static_cast<std::size_t>(r)] == shard_digest_text(r);

    maybe_die(a, "broadcast");
    const std::string decision = "commit step-00000042";
    std::vector<at::Tensor> cast{a.rank == 0 ? bytes_tensor(decision)
                                             : at::zeros({static_cast<std::int64_t>(decision.size())}, at::kByte)};
    c10d::BroadcastOptions bopts;
    bopts.rootRank = 0;
    pg->broadcast(cast, bopts)->wait();
    out["broadcast"] = tensor_string(cast[0], cast[0].numel());
    ok = ok && out["broadcast"] == decision;

    maybe_die(a, "barrier");
    pg->barrier()->wait();
    out["collectives_ms"] = ms_since(t_coll);
    out["barrier"] = "ok";
  } catch (const c10::Error& e) {
    out["error"] = e.what_without_backtrace();  // what() carries a multi-line C++ backtrace
    std::cout << out.dump() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    out["error"] = e.what();
    std::cout << out.dump() << std::endl;
    return 3;
  }
  out["ok"] = ok;
  std::cout << out.dump() << std::endl;
  return ok ? 0 : 1;
}
