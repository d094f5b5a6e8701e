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
#include "holdpoint/format/limits.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

enum class FileFormat : std::uint8_t {
  pytorch_zip,     // torch.save since 1.6 (and the opt-in zip of 1.4/1.5)
  pytorch_legacy,  // torch.save before 1.6, or _use_new_zipfile_serialization=False
  safetensors,
};

std::string_view file_format_name(FileFormat format) noexcept;

struct LoadOptions {
  Limits limits;
  // 64 hex digits. Should come from an authenticated source: a digest stored
  // beside an attacker-controlled file authenticates nothing.
  std::optional<std::string> expected_sha256;
  // Reports reading progress of large files as (bytes read, file size), on
  // the calling thread; reading is the only phase that takes seconds.
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
  // The caller vouches for the file's producer and custody. When the
  // restricted reader refuses the file, LibTorch's own deserializer is tried
  // (a TorchScript archive, a torch::pickle_save pickle) and the result carries
  // a warning. Needs the LibTorch bridge (holdpoint_torch, which enables it;
  // see holdpoint/tensor/trusted_load.h); LibTorch's unpickler is never used otherwise.
  bool trusted = false;
};

// One zip record (or one storage of a legacy stream), for inspection.
struct RecordInfo {
  std::string name;  // without the archive folder: "data.pkl", "data/0"
  std::uint64_t offset = 0;  // of the payload in the file
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;  // 0 for legacy storages and safetensors tensors
};

// What the file says about the writer that produced it.
struct FormatMarkers {
  std::string archive_name;               // zip folder name
  std::optional<std::uint64_t> version;   // `version` / `.data/version`
  std::optional<std::string> byteorder;   // `byteorder` record (torch >= 2.1)
  std::optional<std::uint64_t> format_version;     // `.format_version` (torch >= 2.7)
  std::optional<std::uint64_t> storage_alignment;  // `.storage_alignment` (torch >= 2.7)
  std::optional<std::string> serialization_id;     // `.data/serialization_id` (torch >= 2.1)
  int pickle_protocol = 0;                 // of data.pkl (0 when none, e.g. safetensors)
  std::optional<std::uint64_t> legacy_protocol_version;  // 1001 for legacy streams
  bool uses_binfloat = false;              // torch 1.13 weights_only cannot read BINFLOAT
  std::map<std::string, std::string> safetensors_metadata;
  // A human-readable guess at the producing torch version range.
  std::string producer;
};

struct LoadedMapping {
  Value root;
  // Set when LibTorch's deserializer produced the mapping (trusted loads).
  bool via_libtorch = false;
  std::vector<std::string> warnings;
  FileFormat format = FileFormat::pytorch_zip;
  Sha256Digest sha256;
  std::uint64_t file_bytes = 0;
  FormatMarkers markers;
  std::vector<RecordInfo> records;
};

LoadedMapping load_checkpoint_mapping(const std::filesystem::path& path, const LoadOptions& options = {});

namespace detail {
// The LibTorch fallback of trusted loads, installed by holdpoint_torch.
using TrustedLoader = LoadedMapping (*)(const std::filesystem::path& path, const LoadOptions& options,
                                        const Error& restricted_failure);
void set_trusted_loader(TrustedLoader loader) noexcept;
}  // namespace detail

// Parses a file already in memory (the fuzz targets and the CLI use this).
// `bytes` must stay alive and unchanged while the result is used, unless
// `owner` keeps it alive: tensors in the result hold `owner`.
LoadedMapping parse_checkpoint_bytes(std::span<std::byte> bytes, std::shared_ptr<const void> owner,
                                     const Limits& limits = {});

struct SaveOptions {
  FileFormat format = FileFormat::pytorch_zip;  // pytorch_legacy is not writable
  // Python's torch 1.13 weights_only loader has no BINFLOAT: write floats as
  // 0-d float64 tensors and bytes as 1-d uint8 tensors instead (docs/format.md).
  bool torch_1_13_compatible = false;
  // Zip folder name inside the archive ("archive" is what torch.save to a buffer uses).
  std::string archive_name = "archive";
  // fsync the file and its directory before returning. Off only for scratch files.
  bool durable = true;
  // Also write `<path>.sha256` in sha256sum format.
  bool write_sidecar = false;
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
