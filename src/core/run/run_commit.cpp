// RunDirectory's writes after open: commit, shard directories, retention
// (holdpoint/run/run_directory.h; docs/publication.md argues each step).
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/fail.h"
#include "format/sidecar.h"
#include "base/publish.h"
#include "base/utc_time.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "run/run_directory_impl.h"
#include "run/run_files.h"
#include "run/run_names.h"

namespace holdpoint {

using detail::concat;
using detail::fail;
using run::sidecar_name;

// ---- commit --------------------------------------------------------------------------------

CommitResult RunDirectory::commit(const GenerationSpec& spec, const Writer& write, const Verifier& verify) {
  Impl& d = *impl_;
  d.require_writable();
  CommitResult result;
  GenerationInfo& g = result.generation;
  g.name = generation_name(spec.step);
  g.step = spec.step;
  g.epoch = spec.epoch;
  g.kind = spec.kind;
  g.metrics = spec.metrics;
  g.world_size = spec.world_size;
  g.saved_at = detail::utc_timestamp();
  if (d.committed.count(spec.step)) {
    fail(ErrorCode::run_generation_exists, d.path.string(), ": step ", spec.step, " is already committed as ", g.name);
  }
  if (d.latest && spec.step < *d.latest) {
    fail(ErrorCode::run_step_not_increasing, d.path.string(), ": step ", spec.step, " is before LATEST's step ",
         *d.latest, "; generations after LATEST would read as uncommitted");
  }
  bool latest_moved = false;
  bool published = false;
  try {
    io::Directory& dir = d.checkpoints_dir();
    // A file under this name that is not committed is a failed earlier
    // attempt of this process: roll it back before publishing again.
    if (const auto existing = dir.stat(g.name)) {
      if (existing->type != io::FileInfo::Type::regular) {
        fail(ErrorCode::io_not_regular_file, "checkpoints/", g.name,
             " exists and is not a regular file (a symlink?); it is neither followed nor replaced");
      }
      dir.unlink(g.name);
    }
    io::PublishOptions generation_options;
    generation_options.replace = false;  // generations are never overwritten
    generation_options.durable = d.options.durable;
    generation_options.max_bytes = d.options.limits.max_file_bytes;
    generation_options.read_back = d.options.read_back;
    // The default verifier parses the generation, checking every record's CRC-32.
    generation_options.verifier_checks_content = !verify;
    const auto published_file =
        io::publish(dir, g.name, generation_options, write,
                    verify ? verify : Verifier([&d](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
                      d.verify_bytes(bytes, owner);
                    }));
    published = true;
    g.size = published_file.size;
    g.sha256 = published_file.sha256;
    io::publish_text(dir, sidecar_name(g.name), format::sidecar_text(g.sha256, g.name), d.publish_options(true));
    if (d.options.commit_observer) d.options.commit_observer("published");
    auto next = d.committed;
    next.emplace(g.step, g);
    io::publish_text(*d.root, std::string(kRunIndex), run::index_text(next, d.retired), d.publish_options(true));
    // The commit point. If LATEST's publish fails after its rename (the
    // directory fsync), LATEST already names the new generation: it counts
    // as committed here, and the next open decides from what is durable.
    try {
      d.write_pointer(kLatestPointer, g);
    } catch (const Error&) {
      std::optional<std::string> now;
      try {
        now = d.read_small(*d.root, std::string(kLatestPointer));
      } catch (const Error&) {
      }
      if (now != run_pointer_text(g)) throw;  // LATEST did not move: roll back below
      latest_moved = true;
      d.committed = std::move(next);
      d.latest = g.step;
      d.report.latest = g.name;
      throw;
    }
    latest_moved = true;
    d.committed = std::move(next);
    d.latest = g.step;
    d.report.latest = g.name;
    result.became_best = d.offer_best(g);
  } catch (const Error& error) {
    d.failed = true;
    if (!latest_moved && published) d.roll_back(g);
    if (latest_moved) {
      throw Error(error.code(), concat(d.path.string(), ": ", g.name, " is committed (LATEST names it), but a later step failed: ",
                                       error.detail()))
          .with_path(error.path());
    }
    d.rethrow_with_run(error);
  }
  // A commit that verified and moved LATEST clears an earlier failure.
  d.failed = false;
  // Signed once committed: a signed generation newer than LATEST is then
  // never a crash's leftover (run_signatures.cpp). Signed before retention,
  // so that retention's record of what it removes is signed over this head.
  if (d.options.signing_key) {
    try {
      d.sign_commit(*d.options.signing_key, g);
    } catch (const Error& error) {
      throw Error(error.code(), concat(g.name, " is committed (LATEST names it), but signing it failed: ",
                                       error.detail()))
          .with_path(error.path());
    }
  }
  if (d.options.retention.enabled()) {
    try {
      result.deleted = collect_garbage(d.options.retention);
    } catch (const Error& error) {
      throw Error(error.code(), concat(g.name, " is committed (LATEST names it), but retention failed: ", error.detail()))
          .with_path(error.path());
    }
  }
  return result;
}

bool RunDirectory::Impl::offer_best(const GenerationInfo& g) {
  if (!options.best_metric) return false;
  const auto& metric = *options.best_metric;
  const auto value = g.metric(metric.name);
  // A BEST without a recorded metric (re-adopted) stays, as recovery keeps it.
  const auto incumbent = best ? committed.at(*best).metric(metric.name) : std::nullopt;
  if (!value || !std::isfinite(*value) || (best && !(incumbent && run::better(*value, *incumbent, metric)))) {
    return false;
  }
  write_pointer(kBestPointer, g);
  best = g.step;
  return true;
}

void RunDirectory::Impl::roll_back(const GenerationInfo& g) {
  // Recovery would remove it anyway: a failure here is not reported.
  try {
    io::Directory& dir = checkpoints_dir();
    if (dir.stat(sidecar_name(g.name))) dir.unlink(sidecar_name(g.name));
    dir.unlink(g.name);
  } catch (const Error&) {
  }
}

// ---- shard directories ---------------------------------------------------------------------

std::filesystem::path RunDirectory::prepare_shard_directory(std::int64_t step) {
  Impl& d = *impl_;
  d.require_writable();
  const std::string name = shard_directory_name(step);
  if (d.committed.count(step)) {
    fail(ErrorCode::run_generation_exists, d.path.string(), ": step ", step, " is already committed");
  }
  if (d.latest && step < *d.latest) {
    // Refused before any rank writes a shard, not at the commit.
    fail(ErrorCode::run_step_not_increasing, d.path.string(), ": step ", step, " is before LATEST's step ", *d.latest);
  }
  try {
    io::Directory& dir = d.checkpoints_dir();
    if (const auto info = dir.stat(name)) {
      if (info->type != io::FileInfo::Type::directory) {
        fail(ErrorCode::run_shards_invalid, "checkpoints/", name, " exists and is not a directory (never followed)");
      }
      d.remove_tree(name);
    }
    dir.open_subdirectory(name, true);
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
  return d.path / kCheckpointsDirectory / name;
}

void RunDirectory::discard_shard_directory(std::int64_t step) {
  Impl& d = *impl_;
  if (d.report.read_only || d.committed.count(step) || !d.checkpoints) return;
  const std::string name = shard_directory_name(step);
  try {
    if (const auto info = d.checkpoints->stat(name); info && info->type == io::FileInfo::Type::directory) {
      d.remove_tree(name);
      if (d.options.durable) d.checkpoints->sync();
    }
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
}

// ---- retention -----------------------------------------------------------------------------

GcPlan RunDirectory::plan_gc(const RetentionPolicy& policy) const {
  const Impl& d = *impl_;
  GcPlan plan;
  std::map<std::int64_t, std::vector<std::string>> reasons;
  if (d.latest) reasons[*d.latest].push_back("LATEST");
  if (d.best) reasons[*d.best].push_back("BEST");
  std::size_t newest = 0;
  for (auto it = d.committed.rbegin(); it != d.committed.rend(); ++it, ++newest) {
    if (policy.keep_last == 0 || newest < policy.keep_last) reasons[it->first].push_back("newest");
    if (policy.keep_every > 0 && it->first % policy.keep_every == 0) reasons[it->first].push_back("every");
  }
  if (policy.keep_best > 0 && d.options.best_metric) {
    std::vector<std::pair<double, std::int64_t>> ranked;
    for (const auto& [step, g] : d.committed) {
      if (const auto value = g.metric(d.options.best_metric->name); value && std::isfinite(*value)) {
        ranked.emplace_back(d.options.best_metric->higher_is_better ? -*value : *value, step);
      }
    }
    std::sort(ranked.begin(), ranked.end());
    for (std::size_t i = 0; i < ranked.size() && i < policy.keep_best; ++i) reasons[ranked[i].second].push_back("best");
  }
  for (const auto& [step, g] : d.committed) {
    const auto it = reasons.find(step);
    if (it == reasons.end()) {
      plan.remove.push_back(g.name);
      continue;
    }
    plan.keep.push_back(g.name);
    std::string why;
    for (const auto& r : it->second) why += (why.empty() ? "" : ",") + r;
    plan.reasons.emplace_back(g.name, why);
  }
  return plan;
}

std::vector<std::string> RunDirectory::collect_garbage(const RetentionPolicy& policy, bool dry_run) {
  Impl& d = *impl_;
  GcPlan plan = plan_gc(policy);
  if (dry_run) return plan.remove;
  d.require_writable();
  if (d.failed) {
    fail(ErrorCode::run_gc_refused, d.path.string(), ": an earlier operation failed; nothing is deleted until a save succeeds");
  }
  if (!d.latest && !d.committed.empty()) {
    fail(ErrorCode::run_gc_refused, d.path.string(), ": no verified LATEST; nothing is deleted");
  }
  if (plan.remove.empty()) return plan.remove;
  try {
    // The index forgets them first: a crash in between leaves files that
    // recovery re-adopts, never an index naming missing files as committed.
    // A signed generation is recorded as retired, and that record is signed
    // before its file goes: its signature stays, and a trusting open accepts
    // its absence only on this record (docs/threat-model.md, "Signing a run").
    auto next = d.committed;
    auto retired = d.retired;
    for (const auto& name : plan.remove) {
      const std::int64_t step = *parse_generation_name(name);
      if (d.checkpoints_dir().stat(run::signature_name(name))) {
        retired[step] = {name, step, next.at(step).sha256};
      }
      next.erase(step);
    }
    io::publish_text(*d.root, std::string(kRunIndex), run::index_text(next, retired), d.publish_options(true));
    d.committed = std::move(next);
    d.retired = std::move(retired);
    if (d.options.signing_key && d.chain_head) {
      std::vector<std::string> written;
      d.sign_small_file(*d.options.signing_key, kRunIndex, d.latest, *d.chain_head, written);
    }
    io::Directory& dir = d.checkpoints_dir();
    for (const auto& name : plan.remove) {
      dir.unlink(name);
      if (dir.stat(sidecar_name(name))) dir.unlink(sidecar_name(name));
      // The manifest goes first (durably): a crash then leaves shards that
      // recovery removes, never a manifest without its shards.
      const std::string shards = shard_directory_name(*parse_generation_name(name));
      if (const auto info = dir.stat(shards); info && info->type == io::FileInfo::Type::directory) {
        if (d.options.durable) dir.sync();
        d.remove_tree(shards);
      }
      d.log(concat(d.path.string(), ": retention removed ", name));
    }
    if (d.options.durable) dir.sync();
  } catch (const Error& error) {
    d.failed = true;
    d.rethrow_with_run(error);
  }
  return plan.remove;
}

}  // namespace holdpoint
