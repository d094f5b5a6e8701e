// Reading the two sides of holdpoint diff (holdpoint/verify/checkpoint_diff.h):
// each file opened before it is scanned, scanned with scan_checkpoint, and its
// tensors' bytes read back afterwards in bounded pieces, checked against what
// the scan saw (same file, same size and time, same CRC-32 per record).
//
// Failure contract: throws holdpoint::Error; file_changed_during_read when the
// file read back is not the file scanned, io_* for the system's refusals.
//
// Thread-safety: one ScannedFile and its readers belong to one thread.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/file_descriptor.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/format/value.h"

namespace holdpoint::diff {

// A file opened before it is scanned, so that the bytes read later are those
// of the file that was scanned: after the scan the path must still name it,
// and at the end it must still have the size and modification time it had.
class OpenedFile {
 public:
  explicit OpenedFile(std::filesystem::path path);

  const std::filesystem::path& path() const noexcept { return path_; }

  // After the scan, which opened the path again.
  void check_scanned(const LoadedMapping& mapping) const;
  void check_unchanged(std::uint64_t scanned_bytes) const;
  void read(std::uint64_t offset, std::byte* out, std::size_t size) const;

 private:
  std::filesystem::path path_;
  io::FileDescriptor fd_;
  struct stat opened_ {};
};

// One side of a comparison: the file, its verified tree and where its
// storages lie.
struct ScannedFile {
  std::unique_ptr<OpenedFile> file;
  LoadedMapping mapping;
  std::unordered_map<const void*, StorageLocation> locations;
};

ScannedFile scan_side(const std::filesystem::path& path, const LoadOptions& given,
                      const std::optional<Sha256Digest>& expected);

// The bytes of one storage, from memory (legacy streams, step manifests) or
// from the file.
class StorageBytes {
 public:
  StorageBytes(const ScannedFile& side, const Storage& storage);

  std::uint64_t size() const noexcept { return storage_.nbytes(); }

  void read(std::uint64_t offset, std::byte* out, std::size_t size);

 private:
  const ScannedFile& side_;
  const Storage& storage_;
  const StorageLocation* location_ = nullptr;
  std::uint32_t crc_ = 0;
  std::uint64_t crc_next_ = 0;
};

// Copies a tensor's elements in C order, `count` at a time, reading its
// storage in order when the view is contiguous, and otherwise from a copy of
// the whole storage (up to DiffOptions::whole_storage_bytes) or through a
// window.
class ViewReader {
 public:
  ViewReader(const ScannedFile& side, const TensorData& tensor, std::size_t unit, std::size_t whole_storage_bytes);

  void gather(std::uint64_t first, std::size_t count, std::byte* out);

 private:
  static constexpr std::size_t kWindowBytes = std::size_t{64} << 10;

  void copy_element(std::uint64_t offset, std::byte* out);

  const TensorData& tensor_;
  StorageBytes bytes_;
  std::size_t unit_;
  bool contiguous_ = false;
  std::uint64_t contiguous_start_ = 0;
  std::vector<std::byte> window_;
  std::uint64_t window_start_ = 0;
  std::size_t window_size_ = 0;
};

}  // namespace holdpoint::diff
