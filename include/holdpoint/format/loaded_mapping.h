// The result of reading a checkpoint file: its Value tree and what the file
// says about itself (format, writer markers, records, whole-file SHA-256).
//
// Every reader of the format layer (zip .pt, legacy stream, safetensors)
// fills one; load_checkpoint_mapping (holdpoint/format/checkpoint_mapping.h)
// returns it.
//
// Thread-safety: a plain value; tensors in `root` share the file's snapshot.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

enum class FileFormat : std::uint8_t {
  pytorch_zip,     // torch.save since 1.6 (and the opt-in zip of 1.4/1.5)
  pytorch_legacy,  // torch.save before 1.6, or _use_new_zipfile_serialization=False
  safetensors,
};

std::string_view file_format_name(FileFormat format) noexcept;

// One zip record (or one storage of a legacy stream), for inspection.
struct RecordInfo {
  std::string name;  // without the archive folder: "data.pkl", "data/0"
  std::uint64_t offset = 0;  // of the payload in the file
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;  // 0 for legacy storages and safetensors tensors
};

// Where a storage's bytes lie in the file it was scanned from.
struct StorageLocation {
  const void* identity = nullptr;  // Storage::identity() of the tensors' storage
  std::uint64_t offset = 0;        // of the first byte in the file
  std::uint64_t size = 0;
  std::optional<std::uint32_t> crc32;  // the zip record's CRC-32; none for safetensors
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

// How a checkpoint already in memory is parsed (parse_checkpoint_bytes).
struct ParseContext {
  // Called before the parser writes into the bytes, which it does only to
  // byte-swap a big-endian archive: a caller parsing while another thread
  // still hashes the bytes waits there.
  std::function<void()> before_in_place_write;
  // Returns once the bytes' SHA-256 is known (throwing sha256_mismatch where
  // it differs from the expected one); callable from any thread. A helper
  // thread waits here before it checks record CRC-32s, so that on two cores
  // it takes no CPU from the hasher. Empty: nothing to wait for.
  std::function<void()> await_digest;
  // How many bytes from the start the hasher has taken in so far, callable
  // from any thread (SnapshotParser's bytes_hashed). Empty: nothing hashes
  // the bytes while they are parsed.
  std::function<std::size_t()> bytes_hashed;
  // Returns once [offset, offset + size) of the bytes is in memory, for a
  // parse that starts while the file is still being read
  // (SnapshotReading::await_bytes); throws the read's error if it failed.
  // Empty: every byte is there.
  std::function<void(std::uint64_t offset, std::uint64_t size)> await_bytes;
  // Asks for [offset, end) to be read ahead of the bytes before it
  // (SnapshotReading::read_ahead_from); a zip archive's central directory is
  // at the end. Empty: nothing to ask.
  std::function<void(std::uint64_t offset)> read_ahead_from;
  // The bytes are a private snapshot that nothing reads after the parse
  // except through the returned tensors (load_checkpoint_mapping,
  // RunDirectory::load). A zip archive's pages that hold no tensor byte are
  // then given back to the kernel as soon as they are spent: the central
  // directory once the digest is known, the pickle piece by piece as the
  // pickle VM leaves it behind (once hashed; its CRC-32 is checked first).
  // Only whole pages go; a tensor's bytes never do.
  bool release_spent_bytes = false;
};

struct LoadedMapping {
  Value root;
  // Set when LibTorch's deserializer produced the mapping (trusted loads).
  bool via_libtorch = false;
  std::vector<std::string> warnings;
  FileFormat format = FileFormat::pytorch_zip;
  // The file's SHA-256, when the load computed it: always where a digest was
  // expected (`digest_checked`), and on request (LoadOptions::compute_sha256)
  // otherwise.
  std::optional<Sha256Digest> sha256;
  // True when `sha256` matched an expected digest (the caller's, a sidecar's
  // or a run index's) before anything was parsed. The manifest's component
  // digests then add no integrity and loads skip re-computing them.
  bool digest_checked = false;
  std::uint64_t file_bytes = 0;
  // The private buffer the tensors of `root` view, when the load read the
  // file into one (load_checkpoint_mapping, RunDirectory::load); null
  // otherwise. See hand_over_storages (value.h). Pages that hold only a zip
  // archive's pickle or central directory have been given back and read as
  // zeros (ParseContext::release_spent_bytes, docs/format.md §11).
  std::shared_ptr<const void> snapshot;
  FormatMarkers markers;
  std::vector<RecordInfo> records;
  // scan_checkpoint with ScanKeeps::tree only: where the bytes of each
  // tensor storage lie in the file, by Storage::identity(), so that a reader
  // can fetch one tensor's bytes at a time later (holdpoint diff streams two
  // files so). Empty for every other read.
  std::vector<StorageLocation> storage_locations;
};

}  // namespace holdpoint
