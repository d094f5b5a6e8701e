// Loading and saving checkpoint files as Value mappings.
//
// load_checkpoint_mapping reads a PyTorch `.pt` file (zip archive or legacy
// stream) or a safetensors file that may be hostile. The file is read once into
// private memory while it is hashed; when an expected SHA-256 is given it is
// checked before any byte is parsed, and the bytes parsed are exactly the bytes
// hashed. Parsing never executes pickle code: a restricted pickle VM accepts an
// allowlist of opcodes and globals and checks every size against Limits before
// allocating. Tensors in the result are zero-copy views into the private
// snapshot and keep it alive.
//
// save_mapping writes a Value as a PyTorch zip archive (loadable by Python's
// torch.load(f, weights_only=True)) or as safetensors. Tensor bytes stream
// from tensor memory to the file while SHA-256 and CRC-32 are computed; the
// file appears under its final name only after it was fsynced (write to a
// staging file beside it, fsync, rename, fsync the directory).
//
// Failure contract: both functions throw holdpoint::Error with a specific
// ErrorCode and a message naming the file. A failed save leaves no staging file
// and does not touch an existing file at the target path.
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/base/file_system.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

struct LoadOptions {
  Limits limits;
  // Checked before any byte is parsed. Should come from an authenticated
  // source: a digest stored beside an attacker-controlled file authenticates
  // nothing. Sha256Digest::parse reads one from text.
  std::optional<Sha256Digest> expected_sha256;
  // Signatures the reader accepts (holdpoint/base/signature.h). When set, the
  // file's `.sig` is checked before any byte is read (a required signature
  // that is missing, malformed, by an unknown or revoked key, or that does
  // not verify is refused with its own signature_* code), and the SHA-256 it
  // vouches for is then the digest the file must have, as expected_sha256.
  std::optional<TrustPolicy> trust;
  // Compute the file's SHA-256 even with no digest to check it against
  // (LoadedMapping::sha256). Off by default: a load with nothing to compare
  // a digest to checks every zip CRC-32 and structural rule, and skips the
  // hash pass, which costs more than reading the file (docs/format.md §11).
  // With an expected digest or a trust policy the file is always hashed.
  bool compute_sha256 = false;
  // Reports reading progress of large files as (bytes read, file size), on
  // the calling thread; reading is the only phase that takes seconds.
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
};

LoadedMapping load_checkpoint_mapping(const std::filesystem::path& path, const LoadOptions& options = {});

// Parses a file already in memory (the fuzz targets and the CLI use this).
// `bytes` must stay alive and unchanged while the result is used, unless
// `owner` keeps it alive: tensors in the result hold `owner`. See
// ParseContext for parsing while the bytes are still being hashed.
LoadedMapping parse_checkpoint_bytes(std::span<std::byte> bytes, std::shared_ptr<const void> owner,
                                     const Limits& limits = {}, const ParseContext& context = {});

struct SaveOptions {
  FileFormat format = FileFormat::pytorch_zip;  // pytorch_legacy is not writable
  // Python's torch 1.13 weights_only loader has no BINFLOAT: write floats as
  // 0-d float64 tensors and bytes as 1-d uint8 tensors instead (docs/format.md).
  bool torch_1_13_compatible = false;
  // Zip folder name inside the archive ("archive" is what torch.save to a buffer uses).
  std::string archive_name = "archive";
  // fsync the file and its directory before returning. Off only for scratch files.
  bool durable = true;
  // Also write `<path>.sha256` in sha256sum format (the default, as for every
  // save of holdpoint: a copy then carries its own corruption check).
  bool write_sidecar = true;
  // How the written file is checked before it becomes visible (ReadBack in
  // holdpoint/base/file_system.h; docs/publication.md).
  ReadBack read_back = ReadBack::cached;
};

struct SaveResult {
  Sha256Digest sha256;
  std::uint64_t file_bytes = 0;
  std::uint64_t tensor_count = 0;
  std::uint64_t storage_count = 0;
};

SaveResult save_mapping(const std::filesystem::path& path, const Value& root, const SaveOptions& options = {});

// "<64 hex>  <file name>\n", the line sha256sum -c accepts.
std::string sha256_sidecar_line(const Sha256Digest& digest, const std::filesystem::path& file);
// Reads `<path>.sha256` and returns the digest it names for `path`.
Sha256Digest read_sha256_sidecar(const std::filesystem::path& path);

}  // namespace holdpoint
