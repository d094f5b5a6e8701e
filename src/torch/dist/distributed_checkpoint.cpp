#include "holdpoint/dist/distributed.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "base/fail.h"
#include "base/regular_file.h"
#include "checkpoint/in_place.h"
#include "format/resume_scan.h"
#include "checkpoint/training_state_access.h"
#include "holdpoint/state/sampler.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/base/file_system.h"
#include "base/publish.h"
#include "base/xxh3.h"
#include "holdpoint/base/snapshot.h"
#include "run/staging_arena.h"
#include "schema/checkpoint_bytes.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

// ---- collectives ---------------------------------------------------------------------------

// Every rank's byte string, in rank order. Gloo's allgather needs equal
// shapes: lengths first, then the bytes padded to the longest.
std::vector<std::string> allgather_strings(c10d::ProcessGroup& group, const std::string& mine) {
  const int world = group.getSize();
  std::vector<at::Tensor> length_in{at::empty({1}, at::kLong)};
  length_in[0].data_ptr<std::int64_t>()[0] = static_cast<std::int64_t>(mine.size());
  std::vector<std::vector<at::Tensor>> length_out(1);
  for (int r = 0; r < world; ++r) length_out[0].push_back(at::empty({1}, at::kLong));
  group.allgather(length_out, length_in)->wait();
  std::vector<std::int64_t> lengths;
  std::int64_t longest = 1;
  for (const auto& t : length_out[0]) {
    lengths.push_back(t.data_ptr<std::int64_t>()[0]);
    longest = std::max(longest, lengths.back());
  }
  std::vector<at::Tensor> bytes_in{at::zeros({longest}, at::kByte)};
  if (!mine.empty()) std::memcpy(bytes_in[0].data_ptr<std::uint8_t>(), mine.data(), mine.size());
  std::vector<std::vector<at::Tensor>> bytes_out(1);
  for (int r = 0; r < world; ++r) bytes_out[0].push_back(at::empty({longest}, at::kByte));
  group.allgather(bytes_out, bytes_in)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const auto* data = reinterpret_cast<const char*>(bytes_out[0][static_cast<std::size_t>(r)].data_ptr<std::uint8_t>());
    out.emplace_back(data, static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
  }
  return out;
}

// A rank's failure as it travels: the error code's name (or "exception") and the detail.
struct Failure {
  std::string code;
  std::string detail;
  std::optional<Error> error;  // the local rank's own error, rethrown on that rank
};

Failure failure_of(const Error& error) {
  std::string detail = error.detail();
  if (!error.path().empty()) detail = concat(error.path(), ": ", detail);
  return {std::string(error_code_name(error.code())), detail, error};
}

Failure failure_of(const std::exception& error) { return {"exception", error.what(), std::nullopt}; }

// How a rank that did not fail reports another's failure.
enum class OthersThrow : std::uint8_t {
  rank_failed,  // distributed_rank_failed
  first_code,   // the first failed rank's own code (a verdict every rank shares)
};

// The ranks agree on a phase's outcome: every rank contributes its payload
// or its failure, and either all return every payload or all throw, naming
// every failed rank and its reason.
std::vector<std::string> agree(c10d::ProcessGroup& group, std::string_view phase, const std::optional<Failure>& mine,
                               const std::string& payload = {}, OthersThrow others = OthersThrow::rank_failed) {
  const std::string message = mine ? concat("F", mine->code, "\n", mine->detail) : concat("K", payload);
  const std::vector<std::string> all = allgather_strings(group, message);
  std::string failures;
  std::optional<ErrorCode> first_code;
  std::vector<std::string> payloads;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string& m = all[r];
    if (!m.empty() && m[0] == 'K') {
      payloads.push_back(m.substr(1));
      continue;
    }
    const auto newline = m.find('\n');
    const std::string code = m.substr(1, newline == std::string::npos ? std::string::npos : newline - 1);
    const std::string why = newline == std::string::npos ? std::string() : m.substr(newline + 1);
    failures += concat(failures.empty() ? "" : "; ", "rank ", r, ": ", code, ": ", why);
    if (!first_code) first_code = error_code_from_name(code);
  }
  if (failures.empty()) return payloads;
  const std::string detail = concat(phase, " rejected on every rank (", failures, ")");
  if (mine && mine->error) throw Error(mine->error->code(), detail);
  if (others == OthersThrow::first_code && first_code) throw Error(*first_code, detail);
  fail(ErrorCode::distributed_rank_failed, detail);
}

// Runs `body`, turning a holdpoint or standard exception into a Failure (a
// c10::Error is the group's own failure and propagates: the group is unusable).
template <typename Body>
std::optional<Failure> attempt(Body&& body) {
  try {
    body();
  } catch (const c10::Error&) {
    throw;
  } catch (const Error& error) {
    return failure_of(error);
  } catch (const std::exception& error) {
    return failure_of(error);
  }
  return std::nullopt;
}

// The captured manifest as a shard's or the step manifest's: same identity,
// configuration and versions; component records are the shard writer's.
Manifest sharded_manifest(Manifest manifest, CheckpointKind kind, std::int64_t world, std::int64_t step) {
  manifest.kind = kind;
  manifest.components.clear();
  Sharding sharding;
  sharding.world_size = world;
  sharding.step = step;
  manifest.sharding = sharding;
  return manifest;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// ---- load: each rank reads its share ---------------------------------------------------------

// This machine, as the ranks on it share its memory: the kernel's boot id
// (the host name where it cannot be read).
std::string machine_identity() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in >> id && !id.empty()) return id;
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string hex_of(const io::Xxh3Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const auto byte : digest) {
    out += kDigits[byte >> 4];
    out += kDigits[byte & 0xf];
  }
  return out;
}

// The bytes a broadcast moves at once: a receiver's buffer is the shard's
// own, so this bounds only Gloo's per-call work, not memory.
constexpr std::size_t kBroadcastChunk = std::size_t{64} << 20;

// What one rank said after reading: for each shard it read, the XXH3-128 of
// the bytes it will send.
struct ReadReport {
  std::map<std::int64_t, std::string> shard_xxh3;
};

ReadReport parse_read_report(const std::string& payload) {
  ReadReport report;
  const auto lines = split_lines(payload);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::istringstream in(lines[i]);
    std::int64_t shard = -1;
    std::string digest;
    in >> shard >> digest;
    report.shard_xxh3[shard] = digest;
  }
  return report;
}

}  // namespace

struct DistributedCheckpointer::Impl {
  c10d::ProcessGroup& group;  // the agreement collectives' (options.coordination, else the caller's group)
  TrainingState& state;
  std::filesystem::path path;
  DistributedCheckpointOptions options;
  std::int64_t rank = 0;
  std::int64_t world = 1;
  std::unique_ptr<RunDirectory> run;  // the coordinator's
  std::optional<GenerationInfo> latest;
  // Asynchronous saves: the staging copy, the background thread and its outcome.
  run::StagingArena arena;
  std::thread worker;
  std::exception_ptr failure;
  std::optional<DistributedSaveResult> last_result;

  struct Captured {
    PreparedCheckpoint prepared;
    std::optional<Failure> failure;  // carried into the agreement, so no rank waits for this one
  };
  Captured capture(const StateStager& stage);
  void finish_background();

  // The two-phase commit of one save, one function per phase (in order).
  struct SaveRound;
  DistributedSaveResult run_save(c10d::ProcessGroup& group, const Captured& captured, const GenerationSpec& spec);
  void partition_states(SaveRound& round);
  std::string save_identity(const SaveRound& round) const;
  void agree_on_capture(SaveRound& round, const std::optional<Failure>& mine);
  void write_shard(SaveRound& round);
  void agree_on_shards(SaveRound& round, const std::optional<Failure>& mine);
  void commit_step_manifest(SaveRound& round);
  void agree_on_commit(SaveRound& round, const std::optional<Failure>& mine);
  void exchange_shards(ShardedCheckpoint& checkpoint, DistributedLoadReport& out);
  std::unique_ptr<checkpoint::InPlaceFill> scan_shards_for_resume(ShardedCheckpoint& checkpoint,
                                                                  const DistributedLoadOptions& options,
                                                                  std::vector<std::unique_ptr<io::RegularFile>>& files,
                                                                  DistributedLoadReport& out);
  void parse_received_shards(ShardedCheckpoint& checkpoint, const std::vector<std::string>& read_payloads);
  // Rank 0 removes the uncommitted shard directory after a failed phase.
  void discard_shards(std::int64_t step);

  Impl(c10d::ProcessGroup& g, TrainingState& s, c10d::ProcessGroup* coordination)
      : group(coordination ? *coordination : g), state(s) {}

  void hook(std::string_view phase) const {
    if (options.phase_hook) options.phase_hook(phase);
  }

  bool is_rank_local(const std::string& name) const {
    return std::find(options.rank_local.begin(), options.rank_local.end(), name) != options.rank_local.end();
  }

  std::string latest_text() const {
    return latest ? concat(latest->name, " ", latest->sha256.hex(), " ", latest->step, " ", latest->world_size)
                  : std::string("none");
  }

  void set_latest(const std::string& text) {
    if (text == "none" || text.empty()) {
      latest.reset();
      return;
    }
    std::istringstream in(text);
    GenerationInfo g;
    std::string hex;
    in >> g.name >> hex >> g.step >> g.world_size;
    const auto digest = Sha256Digest::from_hex(hex);
    if (!digest) fail(ErrorCode::distributed_rank_failed, "the coordinator sent a malformed LATEST: ", text);
    g.sha256 = *digest;
    latest = g;
  }
};

DistributedCheckpointer::DistributedCheckpointer(c10d::ProcessGroup& group, TrainingState& state,
                                                 std::filesystem::path run_directory,
                                                 DistributedCheckpointOptions options)
    : impl_(std::make_unique<Impl>(group, state, options.coordination)) {
  Impl& d = *impl_;
  d.path = std::move(run_directory);
  d.options = std::move(options);
  d.rank = group.getRank();
  d.world = group.getSize();
  if (d.group.getRank() != d.rank || d.group.getSize() != d.world) {
    fail(ErrorCode::invalid_argument, "the coordination group is rank ", d.group.getRank(), " of ",
         d.group.getSize(), "; the process group is rank ", d.rank, " of ", d.world, ": they must be the same ranks");
  }
  TrainingEnvironment environment = state.environment();
  environment.distributed = true;
  environment.world_size = d.world;
  environment.rank_local_generators = d.is_rank_local("rng");
  state.set_environment(environment);

  const auto mine = attempt([&] {
    if (d.rank != 0) return;
    RunDirectoryOptions run_options = d.options.run;
    const auto observer = run_options.commit_observer;
    run_options.commit_observer = [&d, observer](std::string_view stage) {
      if (observer) observer(stage);
      d.hook(stage);
    };
    d.run = std::make_unique<RunDirectory>(d.path, std::move(run_options));
    d.latest = d.run->latest();
  });
  const auto payloads = agree(group, "opening the run directory", mine, d.rank == 0 ? d.latest_text() : "");
  if (d.rank != 0) d.set_latest(payloads[0]);
}

DistributedCheckpointer::~DistributedCheckpointer() {
  // A save still in flight finishes (its collectives need every rank); its
  // failure has no caller left to reach.
  if (impl_->worker.joinable()) impl_->worker.join();
}

std::int64_t DistributedCheckpointer::rank() const noexcept { return impl_->rank; }
std::int64_t DistributedCheckpointer::world_size() const noexcept { return impl_->world; }
RunDirectory* DistributedCheckpointer::run_directory() noexcept { return impl_->run.get(); }
std::optional<GenerationInfo> DistributedCheckpointer::latest() const { return impl_->latest; }

// ---- save ------------------------------------------------------------------------------------

DistributedCheckpointer::Impl::Captured DistributedCheckpointer::Impl::capture(const StateStager& stage) {
  Captured captured;
  captured.failure = attempt([&] {
    CheckpointSaveOptions save_options;
    save_options.torch_1_13_compatible = options.torch_1_13_compatible;
    captured.prepared = state.prepare_save(save_options, stage);
  });
  return captured;
}

void DistributedCheckpointer::Impl::finish_background() {
  if (worker.joinable()) worker.join();
  if (failure) std::rethrow_exception(std::exchange(failure, nullptr));
}

DistributedSaveResult DistributedCheckpointer::save(const GenerationSpec& spec) {
  Impl& d = *impl_;
  d.finish_background();
  return d.run_save(d.group, d.capture({}), spec);
}

void DistributedCheckpointer::save_async(const GenerationSpec& spec) {
  Impl& d = *impl_;
  d.finish_background();
  if (!d.options.background) {
    fail(ErrorCode::invalid_argument,
         "save_async needs DistributedCheckpointOptions::background: a process group over the same ranks that "
         "no other thread uses (collectives of two threads on one group would interleave)");
  }
  // The copy is taken now, on the training thread; the rest runs behind it.
  auto captured = std::make_shared<Impl::Captured>(d.capture(
      [&d](std::vector<std::pair<std::string, Value>>& states) { d.arena.stage(states); }));
  d.last_result.reset();
  d.worker = std::thread([&d, captured, spec] {
    try {
      d.last_result = d.run_save(*d.options.background, *captured, spec);
    } catch (...) {
      d.failure = std::current_exception();
    }
  });
}

std::optional<DistributedSaveResult> DistributedCheckpointer::wait() {
  Impl& d = *impl_;
  d.finish_background();
  return std::exchange(d.last_result, std::nullopt);
}

// ---- save: the two-phase commit --------------------------------------------------------------
//
// Each phase runs on every rank and ends in agree(): either every rank goes
// on, or every rank throws (and rank 0 discards the shard directory while
// nothing names it). docs/distributed.md §4 describes the protocol.

// One save as it passes through the phases.
struct DistributedCheckpointer::Impl::SaveRound {
  SaveRound(c10d::ProcessGroup& g, const PreparedCheckpoint& p, const GenerationSpec& s)
      : group(g), prepared(p), spec(s) {}

  c10d::ProcessGroup& group;
  const PreparedCheckpoint& prepared;
  const GenerationSpec& spec;
  std::vector<std::string> replicated_names;
  std::vector<std::string> rank_local_names;
  ReplicatedPartition partition;
  std::filesystem::path shards_path;  // the coordinator's, once the capture is agreed
  io::PublishResult shard;            // this rank's
  std::string committed;              // the coordinator's generation, as it travels
  DistributedSaveResult result;
};

DistributedSaveResult DistributedCheckpointer::Impl::run_save(c10d::ProcessGroup& group, const Captured& captured,
                                                              const GenerationSpec& spec) {
  SaveRound round(group, captured.prepared, spec);
  round.result.world_size = world;

  // 1. Partition, and the coordinator's shard directory.
  agree_on_capture(round, captured.failure ? captured.failure : attempt([&] { partition_states(round); }));

  // 2. Every rank publishes its shard.
  hook("before-shard");
  const auto shard_failure = attempt([&] { write_shard(round); });
  hook("after-shard");
  agree_on_shards(round, shard_failure);

  // 3. The coordinator commits the step manifest; LATEST moves last.
  if (rank == 0) hook("before-commit");
  const auto commit_failure = attempt([&] { commit_step_manifest(round); });
  if (commit_failure && rank == 0 && !(run->latest() && run->latest()->step == spec.step)) discard_shards(spec.step);
  agree_on_commit(round, commit_failure);
  return round.result;
}

void DistributedCheckpointer::Impl::discard_shards(std::int64_t step) {
  if (rank != 0 || !run) return;
  try {
    run->discard_shard_directory(step);
  } catch (const Error&) {
    // Recovery removes it on the next open.
  }
}

void DistributedCheckpointer::Impl::partition_states(SaveRound& round) {
  std::vector<std::pair<std::string, Value>> replicated;
  for (const auto& [name, state] : round.prepared.states()) {
    if (is_rank_local(name)) {
      round.rank_local_names.push_back(name);
    } else {
      round.replicated_names.push_back(name);
      replicated.emplace_back(name, state);
    }
  }
  round.partition = partition_replicated(replicated, world);
  if (rank == 0) round.shards_path = run->prepare_shard_directory(round.spec.step);
}

// What every rank must agree on besides the replicated structure: the step,
// the configuration identity, profile and semantic identity, and which
// components are replicated or rank-local.
std::string DistributedCheckpointer::Impl::save_identity(const SaveRound& round) const {
  const Manifest& m = round.prepared.manifest();
  std::string identity = concat("step ", round.spec.step, "; config ", m.config.load_bearing_digest().hex(),
                                "; profile ", m.profile, "; semantic identity '", m.semantic_identity, "'; replicated");
  for (const auto& n : round.replicated_names) identity += " " + n;
  identity += "; rank-local";
  for (const auto& n : round.rank_local_names) identity += " " + n;
  return identity;
}

// Every rank reports its partition's fingerprint and its identity; rank 0
// also the shard directory, which every rank then writes into.
void DistributedCheckpointer::Impl::agree_on_capture(SaveRound& round, const std::optional<Failure>& mine) {
  const GenerationSpec& spec = round.spec;
  const std::string identity = mine ? std::string() : save_identity(round);
  std::vector<std::string> payloads;
  try {
    payloads = agree(round.group, concat("saving step ", spec.step, ": capture"), mine,
                     concat(round.partition.fingerprint.hex(), "\n", identity, "\n", round.shards_path.string()));
  } catch (const Error&) {
    discard_shards(spec.step);
    throw;
  }
  for (std::size_t r = 1; r < payloads.size(); ++r) {
    const auto theirs = split_lines(payloads[r]);
    const auto coordinator = split_lines(payloads[0]);
    if (theirs.at(1) != coordinator.at(1)) {
      discard_shards(spec.step);
      fail(ErrorCode::distributed_ranks_disagree, "saving step ", spec.step, ": rank ", r, " has ", theirs.at(1),
           "; rank 0 has ", coordinator.at(1));
    }
    if (theirs.at(0) != coordinator.at(0)) {
      discard_shards(spec.step);
      std::string rank_local;
      for (const auto& n : options.rank_local) rank_local += (rank_local.empty() ? "" : ", ") + n;
      fail(ErrorCode::distributed_replicated_mismatch, "saving step ", spec.step, ": rank ", r,
           "'s replicated components differ from rank 0's in structure, tensor sizes or scalar values, so they "
           "cannot be written once for all ranks; a component that differs per rank must be rank-local "
           "(rank-local now: ", rank_local, ")");
    }
  }
  const auto coordinator_lines = split_lines(payloads[0]);
  round.shards_path = coordinator_lines.size() > 2 ? std::filesystem::path(coordinator_lines[2]) : std::filesystem::path();
}

// This rank's rank-local components whole and its piece of every replicated
// one, published into the shard directory.
void DistributedCheckpointer::Impl::write_shard(SaveRound& round) {
  Manifest manifest = sharded_manifest(round.prepared.manifest(), CheckpointKind::shard, world, round.spec.step);
  manifest.sharding->rank = rank;
  std::vector<std::pair<std::string, Value>> states;
  const auto& pieces = round.partition.pieces.at(static_cast<std::size_t>(rank));
  std::size_t piece = 0;
  for (const auto& [name, state] : round.prepared.states()) {
    if (is_rank_local(name)) {
      states.emplace_back(name, state);
    } else {
      states.push_back(pieces.at(piece++));
    }
  }
  const PreparedCheckpoint shard(std::move(manifest), std::move(states), options.torch_1_13_compatible);
  auto directory = io::posix_file_system().open_directory(round.shards_path, false);
  io::PublishOptions publish_options;
  publish_options.replace = false;
  publish_options.durable = options.run.durable;
  publish_options.max_bytes = options.run.limits.max_file_bytes;
  publish_options.read_back = options.run.read_back;
  publish_options.verifier_checks_content = true;  // the shard is parsed, CRC-32s included
  const Limits limits = options.run.limits;
  round.shard = io::publish(
      *directory, shard_file_name(rank), publish_options, [&](io::ByteSink& sink) { shard.write(sink); },
      [&limits](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
        schema::verify_checkpoint_bytes(bytes, owner, limits);
      });
}

// Every rank reports its shard's size and digest, for the step manifest.
void DistributedCheckpointer::Impl::agree_on_shards(SaveRound& round, const std::optional<Failure>& mine) {
  std::vector<std::string> payloads;
  try {
    payloads = agree(round.group, concat("saving step ", round.spec.step, ": shards"), mine,
                     concat(round.shard.size, " ", round.shard.sha256.hex()));
  } catch (const Error&) {
    discard_shards(round.spec.step);
    throw;
  }
  for (std::size_t r = 0; r < payloads.size(); ++r) {
    std::istringstream in(payloads[r]);
    ShardRecord record;
    std::string hex;
    in >> record.size >> hex;
    record.rank = static_cast<std::int64_t>(r);
    const auto digest = Sha256Digest::from_hex(hex);
    if (!digest) fail(ErrorCode::distributed_rank_failed, "rank ", r, " reported a malformed shard digest");
    record.sha256 = *digest;
    round.result.shards.push_back(record);
  }
  round.result.bytes_written = round.shard.size;
}

// On rank 0: the step manifest, listing every shard, committed to the run
// directory once each shard is there at its reported size.
void DistributedCheckpointer::Impl::commit_step_manifest(SaveRound& round) {
  if (rank != 0) return;
  const GenerationSpec& spec = round.spec;
  Manifest manifest = sharded_manifest(round.prepared.manifest(), CheckpointKind::sharded, world, spec.step);
  Sharding& sharding = *manifest.sharding;
  sharding.replicated = round.replicated_names;
  sharding.rank_local = round.rank_local_names;
  sharding.shards = round.result.shards;
  const PreparedCheckpoint step_manifest(manifest, {}, options.torch_1_13_compatible);
  GenerationSpec generation = spec;
  generation.world_size = world;
  const Limits limits = options.run.limits;
  const std::filesystem::path& shards_path = round.shards_path;
  const auto verify = [&](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
    const Manifest read = Manifest::of_root(parse_checkpoint_bytes(bytes, owner, limits).root);
    if (read.kind != CheckpointKind::sharded || read.sharding->shards.size() != sharding.shards.size()) {
      fail(ErrorCode::schema_field_invalid, "the step manifest read back is not the one written");
    }
    // The shards are there, at their reported sizes (each rank read its own back already).
    auto shards = io::posix_file_system().open_directory(shards_path, false);
    for (const auto& shard : sharding.shards) {
      const auto info = shards->stat(shard_file_name(shard.rank));
      if (!info || info->type != io::FileInfo::Type::regular || info->size != shard.size) {
        fail(ErrorCode::run_shards_invalid, shard_directory_name(spec.step), "/", shard_file_name(shard.rank),
             " is missing or not of its reported size ", shard.size);
      }
    }
  };
  const CommitResult commit = run->commit(generation, [&](io::ByteSink& sink) { step_manifest.write(sink); }, verify);
  round.result.generation = commit.generation;
  round.committed = concat(commit.generation.name, " ", commit.generation.sha256.hex(), " ", commit.generation.step,
                           " ", commit.generation.size);
}

// Every rank learns the committed generation (or every rank throws).
void DistributedCheckpointer::Impl::agree_on_commit(SaveRound& round, const std::optional<Failure>& mine) {
  const GenerationSpec& spec = round.spec;
  const auto outcome = agree(round.group, concat("saving step ", spec.step, ": commit"), mine, round.committed);
  DistributedSaveResult& result = round.result;
  GenerationInfo& g = result.generation;
  {
    std::istringstream in(outcome[0]);
    std::string hex;
    in >> g.name >> hex >> g.step >> g.size;
    const auto digest = Sha256Digest::from_hex(hex);
    if (!digest) fail(ErrorCode::distributed_rank_failed, "the coordinator reported a malformed commit: ", outcome[0]);
    g.sha256 = *digest;
  }
  g.epoch = spec.epoch;
  g.kind = spec.kind;
  g.metrics = spec.metrics;
  g.world_size = world;
  result.total_bytes = g.size;
  for (const auto& shard : result.shards) result.total_bytes += shard.size;
  latest = g;
}

// ---- load ------------------------------------------------------------------------------------

// Every saved shard goes from the rank that read it (shard s: rank s mod
// world) to every other rank, in chunks. Collective; a failure of the group
// propagates.
void DistributedCheckpointer::Impl::exchange_shards(ShardedCheckpoint& checkpoint, DistributedLoadReport& out) {
  const Sharding& sharding = checkpoint.sharding();
  checkpoint.shards.resize(static_cast<std::size_t>(sharding.world_size));
  checkpoint.shard_bytes.resize(static_cast<std::size_t>(sharding.world_size));
  for (std::int64_t s = 0; s < sharding.world_size; ++s) {
    const auto owner = static_cast<int>(s % world);
    auto& bytes = checkpoint.shard_bytes[static_cast<std::size_t>(s)];
    if (owner != rank) {
      bytes = io::Buffer::allocate(sharding.shards.at(static_cast<std::size_t>(s)).size);
      out.bytes_received += bytes->size();
    }
    for (std::size_t offset = 0; offset < bytes->size(); offset += kBroadcastChunk) {
      const std::size_t size = std::min(kBroadcastChunk, bytes->size() - offset);
      std::vector<at::Tensor> chunk{at::from_blob(bytes->data() + offset, {static_cast<std::int64_t>(size)},
                                                  at::TensorOptions().dtype(at::kByte))};
      c10d::BroadcastOptions broadcast;
      broadcast.rootRank = owner;
      group.broadcast(chunk, broadcast)->wait();
    }
  }
}

// A resume in place's first pass over every shard (format::scan_for_resume):
// each against the step manifest's size and SHA-256, with the checks a read
// runs; large records stay in the files, tagged, for the fill. The files stay
// open in `files` until then.
std::unique_ptr<checkpoint::InPlaceFill> DistributedCheckpointer::Impl::scan_shards_for_resume(
    ShardedCheckpoint& checkpoint, const DistributedLoadOptions& load,
    std::vector<std::unique_ptr<io::RegularFile>>& files, DistributedLoadReport& out) {
  const Sharding& sharding = checkpoint.sharding();
  const std::filesystem::path folder = checkpoint.path.has_parent_path() ? checkpoint.path.parent_path() : ".";
  const std::string shards_name = shard_directory_name(sharding.step);
  const std::filesystem::path shards_path = folder / shards_name;
  const io::FileDescriptor parent = io::open_directory_for_reading(folder);
  // Never through a symlink, as a read (run_shards_invalid).
  const io::FileDescriptor shards(::openat(parent.get(), shards_name.c_str(),
                                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (shards.get() < 0) {
    fail(ErrorCode::run_shards_invalid, shards_path.string(), " is missing or not a directory (never followed): ",
         std::strerror(errno));
  }
  std::filesystem::path journal = load.journal_directory;
  if (journal.empty()) journal = std::filesystem::absolute(folder);
  const std::uint64_t keep = kInPlaceKeptBytes / static_cast<std::uint64_t>(sharding.world_size);
  std::unique_ptr<checkpoint::InPlaceFill> fill;
  checkpoint.shards.resize(static_cast<std::size_t>(sharding.world_size));
  out.bytes_read = checkpoint.manifest_bytes;
  for (std::int64_t s = 0; s < sharding.world_size; ++s) {
    const ShardRecord& record = sharding.shards.at(static_cast<std::size_t>(s));
    const std::filesystem::path label = shards_path / shard_file_name(s);
    try {
      try {
        files.push_back(std::make_unique<io::RegularFile>(
            io::open_regular_for_reading_at(shards.get(), shard_file_name(s), label, ErrorCode::run_shards_invalid)));
      } catch (const Error& error) {
        if (error.code() != ErrorCode::io_not_regular_file) throw;
        fail(ErrorCode::run_shards_invalid, "rank ", s, "'s shard is not a regular file (never followed)");
      }
      const io::RegularFile& file = *files.back();
      if (file.size != record.size) {
        fail(ErrorCode::shard_size_mismatch, "holds ", file.size, " bytes; the step manifest records ", record.size);
      }
      struct stat identity {};
      ::fstat(file.fd.get(), &identity);
      if (!fill) {
        fill = std::make_unique<checkpoint::InPlaceFill>(file, identity, journal);
        // The models' bytes go to the journal while the first pass hashes the shards.
        fill->journal_in_background(TrainingStateAccess::components(state));
      }
      LoadOptions scan_options;
      scan_options.limits = options.run.limits;
      scan_options.expected_sha256 = record.sha256;
      format::ResumeScan scan;
      try {
        scan = format::scan_for_resume(file, label, scan_options, keep);
      } catch (const Error& error) {
        if (error.code() != ErrorCode::sha256_mismatch) throw;
        throw Error(ErrorCode::shard_digest_mismatch,
                    concat("rank ", s, "'s shard differs from the digest its step manifest records: ", error.detail()));
      }
      if (s == 0) {
        fill->set_records(std::move(scan.absent));
      } else {
        fill->add_file(file, identity, std::move(scan.absent));
      }
      check_shard_tree(scan.mapping.root, checkpoint.manifest, s,
                       [&fill](StorageDigestKind kind) { return fill->storage_digests(kind); });
      checkpoint.shards[static_cast<std::size_t>(s)] = std::move(scan.mapping);
      out.shards_read.push_back(s);
      out.bytes_read += file.size;
    } catch (const Error& error) {
      if (!error.path().empty()) throw;
      throw error.with_path(label.string());
    }
  }
  return fill;
}

// Checks each received shard against its reader's XXH3-128 and parses it
// with the checks its reader ran (but the component digests, which its reader
// checked over the same bytes).
void DistributedCheckpointer::Impl::parse_received_shards(ShardedCheckpoint& checkpoint,
                                                         const std::vector<std::string>& read_payloads) {
  const Sharding& sharding = checkpoint.sharding();
  const auto shards_path = checkpoint.path.parent_path() / shard_directory_name(sharding.step);
  for (std::int64_t s = 0; s < sharding.world_size; ++s) {
    const auto owner = static_cast<std::size_t>(s % world);
    if (static_cast<std::int64_t>(owner) == rank) continue;
    const auto& bytes = checkpoint.shard_bytes[static_cast<std::size_t>(s)];
    const std::string path = (shards_path / shard_file_name(s)).string();
    const ReadReport sender = parse_read_report(read_payloads[owner]);
    const auto sent = sender.shard_xxh3.find(s);
    const std::string received = hex_of(io::Xxh3_128::of(bytes->bytes()));
    if (sent == sender.shard_xxh3.end() || sent->second != received) {
      throw Error(ErrorCode::shard_digest_mismatch,
                  concat("the bytes received from rank ", owner, " (XXH3-128 ", received,
                         ") differ from those it read and verified (",
                         sent == sender.shard_xxh3.end() ? std::string("none reported") : sent->second, ")"))
          .with_path(path);
    }
    try {
      checkpoint.shards[static_cast<std::size_t>(s)] =
          parse_shard(bytes, checkpoint.manifest, s, options.run.limits, false);
    } catch (const Error& error) {
      if (!error.path().empty()) throw;
      throw error.with_path(path);
    }
  }
}


std::optional<DistributedLoadReport> DistributedCheckpointer::resume(const DistributedLoadOptions& options) {
  Impl& d = *impl_;
  d.finish_background();
  const auto mine = attempt([&] {
    if (d.rank != 0) return;
    d.latest = d.run->latest();
    // The run's signatures (chain, pointers) before LATEST is read.
    if (d.latest && d.options.run.trust) d.run->require_signatures(*d.options.run.trust);
    if (const auto lost = d.latest ? std::nullopt : d.run->recovery().lost_generations()) {
      fail(ErrorCode::run_no_generation, d.path.string(),
           ": no generation verifies, but the run directory shows an earlier run (", *lost,
           "); resuming from scratch is refused. Inspect with `holdpoint ls`, then remove the run directory to "
           "start over");
    }
  });
  const auto payloads = agree(d.group, "resuming", mine, d.rank == 0 ? d.latest_text() : "");
  d.set_latest(payloads[0]);
  if (!d.latest) return std::nullopt;
  DistributedLoadOptions load_options = options;
  load_options.expected_sha256 = d.latest->sha256;
  if (!load_options.trust) load_options.trust = d.options.run.trust;
  return load_checkpoint(d.path / kCheckpointsDirectory / d.latest->name, load_options);
}

DistributedLoadReport DistributedCheckpointer::load_checkpoint(const std::filesystem::path& manifest_path,
                                                    const DistributedLoadOptions& options) {
  Impl& d = *impl_;
  d.finish_background();
  DistributedLoadReport out;
  const std::string phase = concat("loading ", manifest_path.string());

  // The step manifest, on every rank: the ranks agree that they read the
  // same one, and on how to read the shards.
  ShardedCheckpoint checkpoint;
  std::string plan;
  const auto manifest_failure = attempt([&] {
    ShardedReadOptions read_options;
    read_options.limits = d.options.run.limits;
    read_options.expected_sha256 = options.expected_sha256;
    read_options.trust = options.trust;
    read_options.ranks = std::vector<std::int64_t>{};
    checkpoint = read_sharded_checkpoint(manifest_path, read_options);
    const Sharding& sharding = checkpoint.sharding();
    out.saved_world_size = sharding.world_size;
    out.world_size_changed = sharding.world_size != d.world;
    if (out.world_size_changed) {
      if (!options.allow_world_size_change) {
        fail(ErrorCode::distributed_world_size_changed, manifest_path.string(), " was saved by ", sharding.world_size,
             " ranks; this group has ", d.world,
             ". A changed world size resumes only as unqualified, with allow_world_size_change "
             "(docs/distributed.md)");
      }
      if (d.state.profile() != ResumeProfile::unqualified) {
        fail(ErrorCode::distributed_world_size_changed, manifest_path.string(), " was saved by ", sharding.world_size,
             " ranks; this group has ", d.world, ", and profile ", resume_profile_name(d.state.profile()),
             " requires the same world size. Resume as unqualified to change it");
      }
    }
    plan = concat(checkpoint.sha256.hex(), " ", machine_identity());
  });
  const auto plans = agree(d.group, phase, manifest_failure, plan, OthersThrow::first_code);
  // Every rank sees the same plans, so every rank reaches the same verdict.
  const auto split_plan = [](const std::string& text) {
    const auto space = text.find(' ');
    return std::pair<std::string, std::string>(text.substr(0, space),
                                               space == std::string::npos ? "" : text.substr(space + 1));
  };
  const std::string my_machine = split_plan(plans[static_cast<std::size_t>(d.rank)]).second;
  std::uint64_t ranks_here = 0;
  for (std::size_t r = 0; r < plans.size(); ++r) {
    const auto [sha, machine] = split_plan(plans[r]);
    if (sha != split_plan(plans[0]).first) {
      fail(ErrorCode::distributed_ranks_disagree, manifest_path.string(), ": rank ", r,
           " read a step manifest of SHA-256 ", sha, ", rank 0 one of ", split_plan(plans[0]).first,
           "; every rank must see the same file");
    }
    if (machine == my_machine) ++ranks_here;
  }
  // A private copy holds every shard on every rank, and the ranks on this
  // machine share its memory: in place when that would not fit, on every
  // rank if on any.
  std::uint64_t shard_bytes = 0;
  for (const ShardRecord& record : checkpoint.sharding().shards) shard_bytes += record.size;
  const bool wish = d.state.resumes_in_place(shard_bytes * ranks_here, options.memory);
  bool in_place = false;
  for (const auto& answer : agree(d.group, phase, std::nullopt, wish ? "1" : "0")) in_place |= answer == "1";

  // The shards. In place: every rank runs the first pass over every shard.
  // Otherwise: this rank's share, each checked whole; the ranks agree on the
  // verdict before any byte travels.
  std::unique_ptr<checkpoint::InPlaceFill> fill;
  std::vector<std::unique_ptr<io::RegularFile>> files;  // open until the fill
  std::vector<std::string> read_payloads;
  if (in_place) {
    const auto scan_failure = attempt([&] { fill = d.scan_shards_for_resume(checkpoint, options, files, out); });
    agree(d.group, phase, scan_failure, "", OthersThrow::first_code);
  } else {
    std::string read_payload;
    const auto read_failure = attempt([&] {
      for (std::int64_t s = 0; s < checkpoint.sharding().world_size; ++s) {
        if (options.read_every_shard || s % d.world == d.rank) out.shards_read.push_back(s);
      }
      read_shards(checkpoint, out.shards_read, d.options.run.limits);
      out.bytes_read = checkpoint.manifest_bytes;
      for (const auto s : out.shards_read) {
        const auto& bytes = checkpoint.shard_bytes[static_cast<std::size_t>(s)];
        out.bytes_read += bytes->size();
        read_payload += concat(s, " ", hex_of(io::Xxh3_128::of(bytes->bytes())), "\n");
      }
    });
    read_payloads = agree(d.group, phase, read_failure, read_payload, OthersThrow::first_code);
    if (!options.read_every_shard) d.exchange_shards(checkpoint, out);
  }

  bool agreed = false;
  const auto run = [&] {
    if (!in_place && !options.read_every_shard) d.parse_received_shards(checkpoint, read_payloads);
    const Sharding& sharding = checkpoint.sharding();
    out.rank_local_source = d.rank % sharding.world_size;

    Dict root;
    Manifest manifest = checkpoint.manifest;
    manifest.kind = CheckpointKind::resume;
    manifest.sharding.reset();
    manifest.components.clear();
    std::vector<std::pair<std::string, Value>> states;
    for (const auto& name : sharding.replicated) states.emplace_back(name, checkpoint.replicated(name));
    for (const auto& name : sharding.rank_local) {
      if (out.world_size_changed && name == "sampler") {
        std::vector<const Value*> saved;
        for (std::int64_t r = 0; r < sharding.world_size; ++r) saved.push_back(&checkpoint.rank_local(name, r));
        states.emplace_back(name, reassign_distributed_sampler_state(saved, d.rank, d.world));
      } else {
        states.emplace_back(name, checkpoint.rank_local(name, out.rank_local_source));
      }
    }
    // Each shard was checked against its own manifest's digests, and each
    // shard's bytes against the step manifest's: the merged state carries no
    // digests of its own.
    for (const auto& [name, state] : states) manifest.components.push_back({name, Sha256Digest{}, Value()});
    root.insert(std::string(kManifestKey), manifest.to_value());
    for (auto& [name, state] : states) root.insert(name, std::move(state));
    LoadedMapping mapping;
    mapping.root = Value::dict(std::move(root));
    mapping.sha256 = checkpoint.sha256;

    ParsedLoadOptions load_options;
    load_options.check_component_records = false;
    load_options.allow_unqualified_profile_change = out.world_size_changed;
    load_options.before_apply = [&] {
      agreed = true;
      agree(d.group, phase, std::nullopt);
    };
    load_options.in_place = fill.get();
    out.report = TrainingStateAccess::load_parsed(d.state, mapping, manifest_path, load_options);
  };
  std::optional<Failure> failure;
  try {
    run();
  } catch (const c10::Error&) {
    throw;
  } catch (const Error& error) {
    if (agreed) throw;
    failure = failure_of(error);
  } catch (const std::exception& error) {
    if (agreed) throw;
    failure = failure_of(error);
  }
  if (failure) agree(d.group, phase, failure);  // throws on every rank
  if (out.world_size_changed) {
    out.report.profile = std::string(resume_profile_name(ResumeProfile::unqualified));
    out.report.warnings.push_back(concat("resumed a checkpoint of ", out.saved_world_size, " ranks on ", d.world,
                                         " as unqualified: rank-local state from saved rank ", out.rank_local_source,
                                         ", the sampler's global position reassigned"));
  }
  return out;
}

}  // namespace holdpoint
