// RunDirectory's open: what recovery finds and decides
// (holdpoint/run/run_directory.h; docs/publication.md argues each step).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "base/fail.h"
#include "format/sidecar.h"
#include "base/publish.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "run/run_directory_impl.h"
#include "run/run_files.h"
#include "run/run_names.h"

namespace holdpoint {

using detail::concat;
using detail::fail;
using run::kDamagedSuffix;
using run::kSidecarSuffix;
using run::sidecar_name;
using run::unreadable_here;

// ---- the report ----------------------------------------------------------------------------

bool RecoveryReport::clean() const noexcept {
  return removed_staging.empty() && removed_uncommitted.empty() && damaged.empty() && adopted.empty() &&
         removed_orphan_sidecars.empty() &&
         dropped_from_index.empty() && !latest_problem && !best_problem && !index_problem;
}

std::optional<std::string> RecoveryReport::lost_generations() const {
  if (damaged.empty() && previously_quarantined.empty() && dropped_from_index.empty() &&
      !(latest_problem && *latest_problem != "missing")) {
    return std::nullopt;
  }
  return concat(damaged.size() + previously_quarantined.size(), " damaged generations moved aside as *.damaged, ",
                dropped_from_index.size(), " indexed generations missing",
                latest_problem ? ", LATEST " + *latest_problem : std::string());
}

std::vector<std::string> RecoveryReport::lines() const {
  const std::string verb = read_only ? "would remove" : "removed";
  std::vector<std::string> out;
  for (const auto& name : removed_staging) out.push_back(concat(verb, " stale staging file ", name));
  for (const auto& name : removed_uncommitted) {
    out.push_back(name.ends_with("/") ? concat(verb, " shard directory ", name, " (no committed step manifest)")
                                      : concat(verb, " uncommitted generation ", name, " (newer than LATEST)"));
  }
  for (const auto& check : damaged) {
    out.push_back(concat("generation ", check.name, " does not verify (",
                         check.code ? error_code_name(*check.code) : "unknown", "): ", check.detail));
  }
  for (const auto& name : quarantined) out.push_back(concat(read_only ? "would move" : "moved", " a damaged generation aside as ", name));
  for (const auto& name : previously_quarantined) out.push_back(concat("damaged generation kept aside from before: ", name));
  for (const auto& name : removed_orphan_sidecars) out.push_back(concat(verb, " orphaned sidecar ", name));
  for (const auto& name : adopted) out.push_back(concat("adopted ", name, " (missing from index.json; verified)"));
  for (const auto& name : dropped_from_index) out.push_back(concat("index.json listed ", name, ", which is not on disk"));
  if (index_problem) out.push_back(concat("index.json: ", *index_problem));
  if (latest_problem) out.push_back(concat("LATEST: ", *latest_problem));
  if (best_problem) out.push_back(concat("BEST: ", *best_problem));
  const std::string rewrote = read_only ? "would rewrite" : "rewrote";
  if (latest_rewritten) out.push_back(concat(rewrote, " LATEST -> ", latest.value_or("(none)")));
  if (best_rewritten) out.push_back(concat(rewrote, " BEST"));
  if (index_rewritten) out.push_back(concat(rewrote, " index.json"));
  return out;
}

// ---- open: what is on disk -----------------------------------------------------------------

void RunDirectory::Impl::open() {
  report.read_only = !options.recover;
  const bool mutate = options.recover;
  root = fs->open_directory(path, options.create && mutate);
  lock();
  // Under a trust policy the signatures are judged first: a rolled-back run
  // is refused before recovery removes or moves a file of it.
  judge_signatures_on_open();
  remove_stale_staging_files();
  ByStep present;
  scan_checkpoints(present);
  if (mutate && !report.removed_staging.empty()) root->sync();
  const ByName indexed = read_index(present);
  read_latest_pointer();
  reconcile_with_index(present, indexed);
  recover_pointers(present);
}

// A crash between create and rename leaves a staging file; it goes first.
void RunDirectory::Impl::remove_stale_staging_files() {
  for (const auto& name : root->list()) {
    if (io::is_staging_name(name)) {
      report.removed_staging.push_back(name);
      if (options.recover) root->unlink(name);
    }
  }
}

// Sorts checkpoints/ into generation files (`present`), shard directories,
// sidecars and earlier quarantines; removes its staging files and the
// sidecars whose generation is gone; quarantines what is not a regular file.
void RunDirectory::Impl::scan_checkpoints(ByStep& present) {
  const bool mutate = options.recover;
  const auto info = root->stat(std::string(kCheckpointsDirectory));
  if (!info) return;
  if (info->type != io::FileInfo::Type::directory) {
    fail(ErrorCode::run_directory_invalid, "checkpoints is not a directory (a symlink or a file)");
  }
  checkpoints = root->open_subdirectory(std::string(kCheckpointsDirectory), false);
  std::set<std::string> sidecars;
  std::vector<std::string> not_regular;
  for (const auto& name : checkpoints->list()) {
    if (io::is_staging_name(name)) {
      report.removed_staging.push_back(concat(kCheckpointsDirectory, "/", name));
      if (mutate) checkpoints->unlink(name);
    } else if (const auto step = parse_generation_name(name)) {
      const auto stat = checkpoints->stat(name);
      if (!stat || stat->type != io::FileInfo::Type::regular) {
        not_regular.push_back(name);
        continue;
      }
      GenerationInfo g;
      g.name = name;
      g.step = *step;
      g.size = stat->size;
      present.emplace(*step, std::move(g));
    } else if (const auto shard_step = parse_shard_directory_name(name)) {
      shard_directories.emplace(*shard_step, name);
    } else if (name.ends_with(kSidecarSuffix) && parse_generation_name(name.substr(0, name.size() - kSidecarSuffix.size()))) {
      sidecars.insert(name);
    } else if (name.find(kDamagedSuffix) != std::string::npos &&
               (parse_generation_name(name.substr(0, name.find(kDamagedSuffix))) ||
                parse_shard_directory_name(name.substr(0, name.find(kDamagedSuffix))))) {
      if (!name.ends_with(kSidecarSuffix)) report.previously_quarantined.push_back(name);
    }
  }
  for (const auto& name : not_regular) {
    report.damaged.push_back({name, false, ErrorCode::io_not_regular_file, "not a regular file (never followed)"});
    quarantine(name);
  }
  // Sidecars whose generation is gone (a crash inside retention).
  for (const auto& name : sidecars) {
    const std::string generation = name.substr(0, name.size() - kSidecarSuffix.size());
    if (!present.count(*parse_generation_name(generation)) &&
        std::find(not_regular.begin(), not_regular.end(), generation) == not_regular.end()) {
      report.removed_orphan_sidecars.push_back(name);
      if (mutate) checkpoints->unlink(name);
    }
  }
  if (mutate && (!report.removed_staging.empty() || !report.removed_orphan_sidecars.empty() || !not_regular.empty())) {
    checkpoints->sync();
  }
}

// The index: metadata of the generations; a cache that recovery can rebuild.
RunDirectory::Impl::ByName RunDirectory::Impl::read_index(const ByStep& present) {
  ByName indexed;
  try {
    if (const auto text = read_small(*root, std::string(kRunIndex))) {
      run::RunIndex index = run::parse_index(*text);
      indexed = std::move(index.generations);
      retired = std::move(index.retired);
    } else if (!present.empty()) {
      report.index_problem = "missing";
    }
  } catch (const Error& error) {
    // A symlink, FIFO or device in its place (io_not_regular_file), or a file
    // that does not open (io_open_failed), is a malformed index, replaced by
    // the rewrite, never followed.
    if (unreadable_here(error.code()) && error.code() != ErrorCode::io_open_failed) throw;
    report.index_problem = error.detail();
  }
  return indexed;
}

// LATEST is read once here; judge_latest_pointer and verify_latest judge it.
void RunDirectory::Impl::read_latest_pointer() {
  try {
    if (const auto text = read_small(*root, std::string(kLatestPointer))) {
      latest_pointer = run::parse_pointer(*text, kLatestPointer);
    }
  } catch (const Error& error) {
    latest_pointer_error = error;
  }
}

// Takes each generation file's metadata from the index, adopts files the
// index lacks, and quarantines what fails. Files newer than the generation
// LATEST names are left unread (pending_adoption): they are removed unread if
// LATEST verifies, and adopted only if recovery has to fall back to them.
void RunDirectory::Impl::reconcile_with_index(ByStep& present, const ByName& indexed) {
  const std::optional<std::int64_t> pointer_step =
      latest_pointer ? parse_generation_name(latest_pointer->first) : std::nullopt;
  std::vector<std::string> bad;
  for (auto& [step, g] : present) {
    if (pointer_step && step > *pointer_step && !indexed.count(g.name)) {
      pending_adoption.insert(g.name);
      continue;
    }
    const auto it = indexed.find(g.name);
    if (it != indexed.end()) {
      const std::uint64_t size = g.size;
      g = it->second;
      if (size != g.size) {
        report.damaged.push_back({g.name, false, ErrorCode::file_changed_during_read,
                                  concat("holds ", size, " bytes; index.json records ", g.size)});
        bad.push_back(g.name);
      }
      continue;
    }
    // Not in the index: read, hash and verify it before adopting it.
    GenerationCheck check = adopt(g);
    if (check.ok) {
      report.adopted.push_back(g.name);
    } else {
      report.damaged.push_back(std::move(check));
      bad.push_back(g.name);
    }
  }
  for (const auto& [name, g] : indexed) {
    if (!present.count(g.step)) report.dropped_from_index.push_back(name);
  }
  for (const auto& name : bad) {
    present.erase(*parse_generation_name(name));
    quarantine(name);
  }
}

// ---- open: what recovery decides -----------------------------------------------------------

void RunDirectory::Impl::recover_pointers(ByStep& present) {
  const bool mutate = options.recover;
  judge_latest_pointer(present);
  verify_latest(present);
  if (latest) {
    remove_uncommitted(present);
  } else {
    fall_back_to_newest_verified(present);
    adopt_pending(present);
  }
  if (mutate && checkpoints && (!report.removed_uncommitted.empty() || !report.quarantined.empty())) {
    checkpoints->sync();
  }
  committed = std::move(present);
  remove_uncommitted_shard_directories();
  decide_index_rewrite();
  if (latest) report.latest = committed.at(*latest).name;
  recover_best();
  rank_best_by_metric();
  if (mutate) write_recovered_pointers();
}

// A LATEST that could not be read stops recovery; one that is malformed or
// missing is a problem recovery repairs.
void RunDirectory::Impl::judge_latest_pointer(const ByStep& present) {
  if (latest_pointer_error) {
    const Error& error = *latest_pointer_error;
    if (unreadable_here(error.code()) && error.code() != ErrorCode::io_open_failed) throw error;
    report.latest_problem = error.detail();  // a symlink or FIFO in its place is a malformed pointer, not an I/O failure
  } else if (!latest_pointer && !present.empty()) {
    report.latest_problem = "missing";
  }
}

// LATEST's generation is verified in full, since resuming will trust it.
void RunDirectory::Impl::verify_latest(ByStep& present) {
  if (!latest_pointer) return;
  const auto& [name, digest] = *latest_pointer;
  const auto step = *parse_generation_name(name);
  const auto it = present.find(step);
  if (it == present.end()) {
    report.latest_problem = concat("names ", name, ", which is not on disk");
    return;
  }
  GenerationInfo& g = it->second;
  GenerationCheck check = g.sha256 == digest
                              ? this->check(g, true)
                              : GenerationCheck{g.name, false, ErrorCode::sha256_mismatch,
                                                concat("LATEST records ", digest.hex(), "; the file's "
                                                       "recorded digest is ", g.sha256.hex())};
  if (check.ok) {
    latest = step;
  } else {
    report.latest_problem = concat("names ", g.name, ", which does not verify");
    quarantine_failed(present, it, std::move(check));
  }
}

// Files newer than a verified LATEST are an interrupted save's: LATEST never
// moved to them.
void RunDirectory::Impl::remove_uncommitted(ByStep& present) {
  for (auto it = present.upper_bound(*latest); it != present.end();) {
    // Generations are signed only once committed: a newer one that carries a
    // trusted signature was committed, and LATEST was put back. Under a trust
    // policy the open has refused that already (judge_signatures_on_open);
    // without one, its signature stays and verify_signatures reports it.
    report.removed_uncommitted.push_back(it->second.name);
    if (options.recover) {
      checkpoints->unlink(it->second.name);
      if (checkpoints->stat(sidecar_name(it->second.name))) checkpoints->unlink(sidecar_name(it->second.name));
    }
    std::erase(report.adopted, it->second.name);
    it = present.erase(it);
  }
}

// No usable LATEST: the newest generation that verifies becomes it.
void RunDirectory::Impl::fall_back_to_newest_verified(ByStep& present) {
  while (!present.empty()) {
    auto it = std::prev(present.end());
    const bool unadopted = pending_adoption.erase(it->second.name) > 0;
    GenerationCheck check = unadopted ? adopt(it->second) : this->check(it->second, true);
    if (unadopted && check.ok) report.adopted.push_back(it->second.name);
    if (check.ok) {
      latest = it->first;
      break;
    }
    quarantine_failed(present, it, std::move(check));
  }
  if (latest) report.latest_rewritten = true;
}

// Older files that were left unread when LATEST looked usable.
void RunDirectory::Impl::adopt_pending(ByStep& present) {
  for (auto it = present.begin(); it != present.end();) {
    if (!pending_adoption.erase(it->second.name)) {
      ++it;
      continue;
    }
    GenerationCheck check = adopt(it->second);
    if (check.ok) {
      report.adopted.push_back(it->second.name);
      ++it;
    } else {
      const auto next = std::next(it);
      quarantine_failed(present, it, std::move(check));
      it = next;
    }
  }
}

// Shard directories without a committed step manifest: an interrupted
// sharded save (or retention interrupted after the manifest went).
void RunDirectory::Impl::remove_uncommitted_shard_directories() {
  bool removed_shards = false;
  for (const auto& [step, name] : shard_directories) {
    if (committed.count(step)) continue;
    const std::string manifest = generation_name(step);
    if (std::any_of(report.quarantined.begin(), report.quarantined.end(),
                    [&](const std::string& q) { return q.starts_with(manifest); })) {
      continue;  // moved aside with its damaged manifest
    }
    const auto info = checkpoints->stat(name);
    if (!info) continue;  // quarantined with its manifest
    if (info->type != io::FileInfo::Type::directory) continue;  // not ours to follow or delete
    report.removed_uncommitted.push_back(name + "/");
    if (options.recover) {
      remove_tree(name);
      removed_shards = true;
    }
  }
  if (removed_shards) checkpoints->sync();
}

void RunDirectory::Impl::decide_index_rewrite() {
  report.index_rewritten = (report.index_problem && !committed.empty()) || !report.adopted.empty() ||
                           !report.dropped_from_index.empty() || !report.damaged.empty() ||
                           std::any_of(report.removed_uncommitted.begin(), report.removed_uncommitted.end(),
                                       [](const std::string& n) { return !n.ends_with("/"); });
}

// BEST must name a committed generation with the same digest.
void RunDirectory::Impl::recover_best() {
  try {
    if (const auto text = read_small(*root, std::string(kBestPointer))) {
      const auto [name, digest] = run::parse_pointer(*text, kBestPointer);
      const auto it = committed.find(*parse_generation_name(name));
      if (it == committed.end()) {
        report.best_problem = concat("names ", name, ", which is not a committed generation");
      } else if (it->second.sha256 != digest) {
        report.best_problem = concat("names ", name, " with another digest");
      } else {
        best = it->first;
      }
    }
  } catch (const Error& error) {
    if (unreadable_here(error.code()) && error.code() != ErrorCode::io_open_failed) throw;
    report.best_problem = error.detail();
  }
}

// The metric decides: a crash between LATEST and BEST leaves BEST behind a
// better committed generation. A BEST whose generation has no recorded
// metric (re-adopted without its index entry) is kept.
void RunDirectory::Impl::rank_best_by_metric() {
  if (!options.best_metric) return;
  const BestMetric& metric = *options.best_metric;
  std::optional<std::int64_t> ranked;
  for (const auto& [step, g] : committed) {
    const auto value = g.metric(metric.name);
    if (!value || !std::isfinite(*value)) continue;
    if (!ranked || run::better(*value, *committed.at(*ranked).metric(metric.name), metric)) ranked = step;
  }
  const bool pointer_unranked = best && !committed.at(*best).metric(metric.name);
  if (!ranked || ranked == best || pointer_unranked) return;
  if (best && !report.best_problem) {
    report.best_problem = concat("names ", committed.at(*best).name, ", but ", committed.at(*ranked).name,
                                 " has the better ", metric.name);
  } else if (!best && !report.best_problem) {
    report.best_problem = "missing";
  }
  best = ranked;
  report.best_rewritten = true;
}

void RunDirectory::Impl::write_recovered_pointers() {
  if (report.index_rewritten) write_index();
  if (report.latest_rewritten) write_pointer(kLatestPointer, committed.at(*latest));
  if (report.best_rewritten) write_pointer(kBestPointer, committed.at(*best));
  if (report.best_problem && !best && root->stat(std::string(kBestPointer))) {
    // A BEST naming nothing usable, with no metric to rebuild it from, goes.
    root->unlink(std::string(kBestPointer));
    root->sync();
  }
}

// ---- adopting and quarantining -------------------------------------------------------------

GenerationCheck RunDirectory::Impl::adopt(GenerationInfo& g) const {
  GenerationCheck result;
  result.name = g.name;
  try {
    std::optional<Sha256Digest> sidecar_digest;
    if (const auto sidecar = read_small(*checkpoints, sidecar_name(g.name))) {
      sidecar_digest = format::parse_sidecar(*sidecar, g.name, ErrorCode::run_sidecar_invalid);
    }
    const io::Snapshot snapshot = checkpoints->read(g.name, options.limits.max_file_bytes);
    g.sha256 = snapshot.sha256;
    g.size = snapshot.buffer->size();
    if (sidecar_digest && *sidecar_digest != g.sha256) {
      fail(ErrorCode::sha256_mismatch, "checkpoints/", g.name, " hashes to ", g.sha256.hex(), "; its sidecar says ",
           sidecar_digest->hex());
    }
    g.world_size = verify_content(g, snapshot.buffer->bytes(), snapshot.buffer, true);
    result.ok = true;
  } catch (const Error& error) {
    if (unreadable_here(error.code())) {
      throw Error(ErrorCode::run_generation_unreadable,
                  concat("checkpoints/", g.name, " could not be checked (", error_code_name(error.code()), ": ",
                         error.detail(), ")"))
          .with_path(error.path());
    }
    result.code = error.code();
    result.detail = error.what();
  }
  return result;
}

void RunDirectory::Impl::quarantine_failed(ByStep& present, ByStep::iterator it, GenerationCheck check) {
  report.damaged.push_back(std::move(check));
  const std::string name = it->second.name;
  present.erase(it);
  quarantine(name);
}

void RunDirectory::Impl::quarantine(const std::string& name) {
  // Moving the newest signed generation aside would make recovery fall back
  // to an older one: under a trust policy that is a rollback, refused with
  // the generation left where it is.
  if (options.trust && signed_head_step && parse_generation_name(name) == signed_head_step) {
    std::string why = "it is not a regular file";
    for (const auto& check : report.damaged) {
      if (check.name == name) why = concat(check.code ? error_code_name(*check.code) : "unknown", ": ", check.detail);
    }
    Error refused(ErrorCode::signature_rollback,
                  concat("checkpoints/", name, " is the newest generation the run's signatures record, and it does "
                         "not verify (", why, "); falling back to an older generation would roll the run back"));
    if (options.recover) throw refused.with_path((path / kCheckpointsDirectory / name).string());
    if (!signature_verdict) signature_verdict = std::move(refused);  // a read-only open reports; load refuses
  }
  // A sharded generation's shards go aside with it, under the same suffix.
  const auto step = parse_generation_name(name);
  const std::string shards = step ? shard_directory_name(*step) : std::string();
  const auto shards_info = step ? checkpoints->stat(shards) : std::nullopt;
  const bool move_shards = shards_info && shards_info->type == io::FileInfo::Type::directory;
  std::string aside = name + std::string(kDamagedSuffix);
  const auto taken = [&](const std::string& candidate) {
    return checkpoints->stat(candidate) || checkpoints->stat(candidate + std::string(kSidecarSuffix)) ||
           (move_shards && checkpoints->stat(shards + candidate.substr(name.size())));
  };
  for (int n = 2; taken(aside); ++n) aside = concat(name, kDamagedSuffix, "-", n);
  report.quarantined.push_back(aside);
  const std::string shards_aside = shards + aside.substr(name.size());
  if (move_shards) report.quarantined.push_back(shards_aside);
  if (!options.recover) return;
  checkpoints->rename(name, aside, false);
  if (checkpoints->stat(sidecar_name(name))) checkpoints->rename(sidecar_name(name), aside + std::string(kSidecarSuffix), false);
  if (move_shards) checkpoints->rename(shards, shards_aside, false);
}

}  // namespace holdpoint
