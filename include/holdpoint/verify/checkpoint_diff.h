// Comparing two checkpoint files, tensor by tensor, in bounded memory
// (`holdpoint diff`, docs/cli.md "diff").
//
// diff_checkpoints verifies both files with scan_checkpoint
// (holdpoint/format/scan.h: the whole file streamed, digest, CRC-32s,
// structure, through the restricted reader; nothing is executed), compares
// the two trees, and then reads the elements of each pair of tensors of
// equal dtype and shape from the two files in chunks of at most
// kDiffChunkBytes, so that memory stays bounded whatever the files' sizes:
// besides the two trees, two chunk buffers, and for a strided view whose
// storage is at most DiffOptions::whole_storage_bytes a copy of that storage.
// A strided view of a larger storage (rare: torch.save writes the whole
// storage of a view) is read through a 64 KiB window: bounded, but slow when
// its strides jump far. A legacy stream (torch < 1.6) is held in memory by
// the scan and compared there.
//
// What is reported: one DiffEntry per path (dict keys and list indices joined
// by '/': "model/fc.weight", "optimizer/state/3/step") where the trees
// differ: a key or item added or removed, a value whose type, a tensor whose
// dtype or shape, or a value whose content changed. Each entry names its
// section: the top-level key for the components (model, optimizer,
// scheduler, scaler, rng, sampler, progress, early_stop, history), "config"
// for a field of the manifest's configuration (with whether it is
// load-bearing or operational: holdpoint/schema/config_identity.h),
// "manifest" for the rest of the "holdpoint" entry, "model" for a top-level
// tensor of a plain state dict or safetensors file, and "other" otherwise.
//
// Tolerance, as numpy.isclose: a pair of numbers differs when
// |a - b| > atol + rtol * |b| (b is the second file's value). NaN against NaN
// at the same place is equal; NaN against a number differs; an infinity
// equals only the same infinity. float16, bfloat16, float32, float64 tensors
// and float scalars compare as doubles (complex: real and imaginary parts,
// both within tolerance); integer and bool tensors, ints, strings, bytes,
// None and bools compare exactly; float8, bit and sub-byte dtypes compare
// bitwise, element by element (sub-byte ones byte by byte). A value that is
// not identical but within tolerance is still reported, marked
// within_tolerance; same() is true when no entry is beyond tolerance.
//
// Sharded steps (docs/distributed.md): when both files are step manifests,
// the manifests are compared, then each rank's shard file pairwise, under
// "shards/<rank>/" (each shard pinned to the digest its step manifest
// records); a rank on one side only is an added or removed entry.
//
// Failure contract: throws holdpoint::Error naming the file: the reader's
// codes for a file that does not verify (and io_* for one that cannot be
// read), and file_changed_during_read when a file changes after it was
// scanned (a size, modification time or inode that differs, a short read, or
// a zip record whose CRC-32 differs when its whole storage is read).
// Differences are results, never errors.
//
// Thread-safety: independent calls may run concurrently; options.progress is
// called on the calling thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/loaded_mapping.h"

namespace holdpoint {

inline constexpr std::size_t kDiffChunkBytes = std::size_t{16} << 20;          // per side
inline constexpr std::size_t kDiffWholeStorageBytes = std::size_t{64} << 20;   // per side

struct DiffOptions {
  double atol = 0;
  double rtol = 0;
  // Limits, the trust policy and the progress of each file's scan (of each
  // shard's too). Its expected_sha256 is not used: see below.
  LoadOptions load;
  // Digests the files must have (a run directory's records), checked before
  // anything is parsed (sha256_mismatch).
  std::optional<Sha256Digest> expected_sha256_a;
  std::optional<Sha256Digest> expected_sha256_b;
  // (bytes of tensor elements compared, total) over both files' tensors of
  // equal dtype and shape, after the scans.
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
  // The largest storage a strided view is compared from whole (per side);
  // larger ones go through the window (tests set 0 to exercise it).
  std::size_t whole_storage_bytes = kDiffWholeStorageBytes;
};

enum class DiffChange : std::uint8_t {
  added,              // only in the second file
  removed,            // only in the first file
  type_changed,       // int -> float, list -> tuple, tensor -> None, ...
  dtype_changed,      // tensors of different dtypes (elements not compared)
  shape_changed,      // tensors of different shapes (elements not compared)
  attribute_changed,  // a tensor's requires_grad, Parameter, conj or neg flag
  value_changed,      // the content differs
};

std::string_view diff_change_name(DiffChange change) noexcept;  // "value changed", ...

enum class ConfigFieldClass : std::uint8_t { load_bearing, operational };
std::string_view config_field_class_name(ConfigFieldClass field_class) noexcept;  // "load-bearing"

// How far two numbers, or two tensors of equal dtype and shape, are apart.
struct Deviation {
  std::uint64_t numel = 0;      // elements compared (bytes for a sub-byte dtype)
  std::uint64_t unequal = 0;    // not identical (NaN against NaN is identical)
  std::uint64_t differing = 0;  // beyond tolerance
  // Over the unequal pairs where neither is NaN; unset for bitwise dtypes and
  // when no such pair exists. Relative: |a - b| / |b| over those with b != 0.
  std::optional<double> max_abs_deviation;
  std::optional<double> max_rel_deviation;
  std::vector<std::int64_t> max_abs_index;  // element (C-order dims) of max_abs_deviation
  std::vector<std::int64_t> first_index;    // first differing element (or first unequal one)
};

struct DiffEntry {
  std::string path;     // "model/fc.weight"; "" for the roots themselves
  std::string section;  // see above
  std::optional<ConfigFieldClass> config_field;  // section "config" only
  DiffChange change = DiffChange::value_changed;
  std::string a;  // short renderings ("float32 [4, 4]", "0.03", "'adam'"); empty on the missing side
  std::string b;
  std::string detail;  // what else there is to say ("12 of 6700 bytes differ, first at 8")
  std::optional<Deviation> deviation;  // numbers and tensors of equal dtype and shape
  bool within_tolerance = false;       // value_changed only: not identical, all within tolerance
};

struct DiffSide {
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  Sha256Digest sha256;
  FileFormat format = FileFormat::pytorch_zip;
};

struct CheckpointDiff {
  DiffSide a;
  DiffSide b;
  double atol = 0;
  double rtol = 0;
  std::vector<DiffEntry> entries;
  std::uint64_t files_compared = 0;    // 2 for a file pair; more with shards
  std::uint64_t tensors_compared = 0;  // pairs of equal dtype and shape
  std::uint64_t bytes_compared = 0;    // tensor bytes read, both sides
  bool sharded = false;

  // No entry beyond tolerance.
  bool same() const noexcept;
  std::size_t beyond_tolerance() const noexcept;
  // One line per entry and a summary line (docs/cli.md "diff").
  std::string text() const;
  // One JSON document (docs/cli.md "diff").
  std::string json() const;
};

CheckpointDiff diff_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b,
                                const DiffOptions& options = {});

}  // namespace holdpoint
