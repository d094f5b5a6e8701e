// holdpoint diff: two checkpoints compared tree by tree and tensor by tensor,
// reading the tensors' bytes from the files in bounded chunks after both files
// were verified by scan_checkpoint (holdpoint/verify/checkpoint_diff.h).
// This file drives one comparison: a pair of files, then a sharded step's
// shards rank by rank. Its parts: diff_file_reading (the files and their
// bytes), diff_tree_walk (the trees), diff_elements (the numbers) and
// diff_report.cpp (the text and JSON reports).
#include "holdpoint/verify/checkpoint_diff.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <variant>

#include "base/fail.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/schema/manifest.h"
#include "verify/diff_elements.h"
#include "verify/diff_file_reading.h"
#include "verify/diff_tree_walk.h"

namespace holdpoint {

using detail::concat;
using detail::fail;
using diff::compare_chunk;
using diff::DeviationCounter;
using diff::element_text;
using diff::scan_side;
using diff::ScannedFile;
using diff::tensor_text;
using diff::TensorPair;
using diff::ViewReader;
using diff::WalkItem;

namespace {

// Runs `action`, naming `side`'s file in the error it throws.
template <typename F>
auto with_path(const ScannedFile& side, F&& action) -> decltype(action()) {
  try {
    return action();
  } catch (const Error& error) {
    throw error.with_path(side.file->path().string());
  }
}

class PairComparison {
 public:
  PairComparison(const ScannedFile& a, const ScannedFile& b, const DiffOptions& options, CheckpointDiff& out)
      : a_(a), b_(b), options_(options), out_(out) {}

  void run(const Value& root_a, const Value& root_b, const std::string& prefix) {
    std::vector<WalkItem> items = diff::walk_trees(root_a, root_b, options_.atol, options_.rtol, prefix);
    std::uint64_t total = 0;
    for (const WalkItem& item : items) {
      if (const auto* pair = std::get_if<TensorPair>(&item)) total += 2 * pair->a->logical_bytes();
    }
    std::uint64_t done = 0;
    if (options_.progress) options_.progress(0, total);
    for (WalkItem& item : items) {
      if (auto* pair = std::get_if<TensorPair>(&item)) {
        try {
          compare_pair(*pair, done, total);
        } catch (const Error& error) {
          throw Error(error.code(), concat(pair->path, ": ", error.detail())).with_path(error.path());
        }
      } else {
        out_.entries.push_back(std::move(std::get<DiffEntry>(item)));
      }
    }
    a_.file->check_unchanged(a_.mapping.file_bytes);
    b_.file->check_unchanged(b_.mapping.file_bytes);
  }

 private:
  std::byte* buffer(std::vector<std::byte>& buffer, std::size_t bytes) {
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }

  void compare_pair(const TensorPair& pair, std::uint64_t& done, std::uint64_t total) {
    const TensorData& x = *pair.a;
    const TensorData& y = *pair.b;
    const bool sub_byte = dtype_is_sub_byte(x.dtype);
    const std::size_t unit = sub_byte ? 1 : x.itemsize();
    const std::uint64_t units = sub_byte ? x.logical_bytes() : static_cast<std::uint64_t>(x.numel());
    DeviationCounter counter(options_.atol, options_.rtol, sub_byte ? nullptr : &x.sizes);
    ++out_.tensors_compared;
    std::string a_value, b_value;
    if (units > 0) {
      ViewReader reader_a = with_path(a_, [&] { return ViewReader(a_, x, unit, options_.whole_storage_bytes); });
      ViewReader reader_b = with_path(b_, [&] { return ViewReader(b_, y, unit, options_.whole_storage_bytes); });
      const std::size_t per_chunk = std::max<std::size_t>(1, kDiffChunkBytes / unit);
      for (std::uint64_t first = 0; first < units; first += per_chunk) {
        const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, units - first));
        std::byte* chunk_a = buffer(buffer_a_, count * unit);
        std::byte* chunk_b = buffer(buffer_b_, count * unit);
        with_path(a_, [&] { reader_a.gather(first, count, chunk_a); });
        with_path(b_, [&] { reader_b.gather(first, count, chunk_b); });
        compare_chunk(x.dtype, unit, chunk_a, chunk_b, count, first, counter);
        if (units == 1 && !sub_byte) {
          a_value = element_text(x.dtype, chunk_a);
          b_value = element_text(y.dtype, chunk_b);
        }
        out_.bytes_compared += 2 * count * unit;
        done += 2 * count * unit;
        if (options_.progress) options_.progress(std::min(done, total), total);
      }
    }
    Deviation deviation = counter.finish();
    if (deviation.unequal == 0) return;
    DiffEntry e;
    e.path = pair.path;
    e.section = pair.where.section;
    e.config_field = pair.where.config_field;
    e.change = DiffChange::value_changed;
    e.a = tensor_text(x) + (a_value.empty() ? "" : " = " + a_value);
    e.b = tensor_text(y) + (b_value.empty() ? "" : " = " + b_value);
    e.within_tolerance = deviation.differing == 0;
    e.deviation = std::move(deviation);
    out_.entries.push_back(std::move(e));
  }

  const ScannedFile& a_;
  const ScannedFile& b_;
  const DiffOptions& options_;
  CheckpointDiff& out_;
  std::vector<std::byte> buffer_a_;
  std::vector<std::byte> buffer_b_;
};

std::filesystem::path shard_path(const std::filesystem::path& manifest, const Sharding& sharding, std::int64_t rank) {
  return manifest.parent_path() / shard_directory_name(sharding.step) / shard_file_name(rank);
}

const ShardRecord* shard_record(const Sharding& sharding, std::int64_t rank) {
  for (const ShardRecord& record : sharding.shards) {
    if (record.rank == rank) return &record;
  }
  return nullptr;
}

Manifest step_manifest(const ScannedFile& side) {
  try {
    Manifest manifest = Manifest::of_root(side.mapping.root);
    if (!manifest.sharding) fail(ErrorCode::schema_field_missing, "the step manifest has no sharding");
    return manifest;
  } catch (const Error& error) {
    throw error.with_path(side.file->path().string());
  }
}

// The shards of two step manifests, rank by rank.
void compare_shards(const ScannedFile& a, const ScannedFile& b, const DiffOptions& options, CheckpointDiff& out) {
  const Manifest manifest_a = step_manifest(a);
  const Manifest manifest_b = step_manifest(b);
  const Sharding& sharding_a = *manifest_a.sharding;
  const Sharding& sharding_b = *manifest_b.sharding;
  const std::int64_t ranks = std::max(sharding_a.world_size, sharding_b.world_size);
  for (std::int64_t rank = 0; rank < ranks; ++rank) {
    const ShardRecord* record_a = shard_record(sharding_a, rank);
    const ShardRecord* record_b = shard_record(sharding_b, rank);
    const std::string prefix = concat("shards/", rank);
    if (!record_a || !record_b) {
      DiffEntry e;
      e.path = prefix;
      e.section = "manifest";
      e.change = record_a ? DiffChange::removed : DiffChange::added;
      const std::string name = shard_directory_name(record_a ? sharding_a.step : sharding_b.step) + "/" +
                               shard_file_name(rank);
      (record_a ? e.a : e.b) = name;
      out.entries.push_back(std::move(e));
      continue;
    }
    const ScannedFile shard_a = scan_side(shard_path(a.file->path(), sharding_a, rank), options.load, record_a->sha256);
    const ScannedFile shard_b = scan_side(shard_path(b.file->path(), sharding_b, rank), options.load, record_b->sha256);
    out.files_compared += 2;
    PairComparison(shard_a, shard_b, options, out).run(shard_a.mapping.root, shard_b.mapping.root, prefix);
  }
}

}  // namespace

CheckpointDiff diff_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b,
                                const DiffOptions& options) {
  if (!(options.atol >= 0) || !(options.rtol >= 0) || std::isinf(options.atol) || std::isinf(options.rtol)) {
    fail(ErrorCode::invalid_argument, "atol and rtol must be finite and not negative (atol ", options.atol, ", rtol ",
         options.rtol, ")");
  }
  const ScannedFile side_a = scan_side(a, options.load, options.expected_sha256_a);
  const ScannedFile side_b = scan_side(b, options.load, options.expected_sha256_b);
  CheckpointDiff out;
  // A scan hashes every file it reads.
  out.a = {a, side_a.mapping.file_bytes, *side_a.mapping.sha256, side_a.mapping.format};
  out.b = {b, side_b.mapping.file_bytes, *side_b.mapping.sha256, side_b.mapping.format};
  out.atol = options.atol;
  out.rtol = options.rtol;
  out.files_compared = 2;
  PairComparison(side_a, side_b, options, out).run(side_a.mapping.root, side_b.mapping.root, "");
  if (is_sharded_manifest(side_a.mapping) && is_sharded_manifest(side_b.mapping)) {
    out.sharded = true;
    compare_shards(side_a, side_b, options, out);
  }
  return out;
}

}  // namespace holdpoint
