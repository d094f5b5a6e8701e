// The first pass of a resume in place (docs/resume-contract.md, "Resuming in
// place"): scan_checkpoint's pass (holdpoint/format/scan.h), with what the
// second pass needs.
//
// TrainingState resumes a large checkpoint without a private copy of it: this
// pass reads the file once, in order, hashes it, checks every structural rule
// and builds the tree, as scan_checkpoint does; the second pass then copies
// each large tensor from the file straight into the memory it ends up in. It
// differs from scan_checkpoint's tree in two ways:
//   - storage records of at most kKeptRecordBytes keep their bytes, smallest
//     first, while their sum stays within `keep_budget`: the scalars and small
//     tensors that components read while they validate (steps, generator
//     states, sampler positions);
//   - every other storage record is absent from the tree, and gets, as its
//     payload streams by, its XXH3-128 (the storage digest current manifests
//     record, for component digests when no expected digest was given) and a
//     Poly1305 tag under a key drawn for that record alone (base/poly1305.h).
//     The second pass checks the bytes it copied against that tag, so that a
//     file changed after this pass cannot slip bytes past the digest.
// The same checks, in the same order, refuse the same files with the same
// codes as scan_checkpoint. Only zip archives have absent records; a legacy
// stream is read whole (scan_checkpoint's exception) and safetensors keeps
// every tensor absent without a tag, which no resume accepts (no manifest).
//
// Memory: scan_checkpoint's, plus the kept records and, per absent record,
// 100 bytes.
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <unordered_map>

#include "base/poly1305.h"
#include "base/regular_file.h"
#include "base/xxh3.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint::format {

inline constexpr std::uint64_t kKeptRecordBytes = std::uint64_t{1} << 20;

struct AbsentRecord {
  std::uint64_t offset = 0;  // of the payload in the file
  std::uint64_t size = 0;
  io::Xxh3Digest xxh3{};
  io::Poly1305Key key{};
  io::Poly1305Tag tag{};
};

struct ResumeScan {
  LoadedMapping mapping;
  // By Storage::identity() of the absent storages in mapping.root.
  std::unordered_map<const void*, AbsentRecord> absent;
};

// `file` stays open for the second pass, which reads the same inode. The
// expected digest and the trust policy of `options` apply as for
// scan_checkpoint; errors name `path`.
ResumeScan scan_for_resume(const io::RegularFile& file, const std::filesystem::path& path, const LoadOptions& options,
                           std::uint64_t keep_budget);

}  // namespace holdpoint::format
