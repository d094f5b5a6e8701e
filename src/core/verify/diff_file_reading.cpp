// Reading the two sides of holdpoint diff: diff_file_reading.h.
#include "verify/diff_file_reading.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "base/crc32.h"
#include "base/fail.h"
#include "base/regular_file.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "verify/diff_elements.h"

namespace holdpoint::diff {

using detail::fail;

namespace {

bool same_time(const struct stat& a, const struct stat& b) {
  return a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

}  // namespace

// Through open_regular_for_reading, so that a FIFO or device named as a side
// is refused at once instead of blocking the open.
OpenedFile::OpenedFile(std::filesystem::path path)
    : path_(std::move(path)), fd_(io::open_regular_for_reading(path_).fd) {
  if (::fstat(fd_.get(), &opened_) != 0) fail(ErrorCode::io_open_failed, "cannot stat: ", std::strerror(errno));
}

void OpenedFile::check_scanned(const LoadedMapping& mapping) const {
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0 || now.st_dev != opened_.st_dev || now.st_ino != opened_.st_ino) {
    fail(ErrorCode::file_changed_during_read, "the path names another file than the one opened before the scan");
  }
  check_unchanged(mapping.file_bytes);
}

void OpenedFile::check_unchanged(std::uint64_t scanned_bytes) const {
  struct stat now {};
  if (::fstat(fd_.get(), &now) != 0) fail(ErrorCode::io_read_failed, "cannot stat: ", std::strerror(errno));
  if (static_cast<std::uint64_t>(now.st_size) != scanned_bytes || !same_time(now, opened_)) {
    fail(ErrorCode::file_changed_during_read, "the file was ", scanned_bytes, " bytes when scanned and is now ",
         now.st_size, " bytes", same_time(now, opened_) ? "" : ", modified since it was opened");
  }
}

void OpenedFile::read(std::uint64_t offset, std::byte* out, std::size_t size) const {
  while (size > 0) {
    const ssize_t got = ::pread(fd_.get(), out, size, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(ErrorCode::io_read_failed, "read at offset ", offset, ": ", std::strerror(errno));
    }
    if (got == 0) fail(ErrorCode::file_changed_during_read, "the file ends at ", offset, ", before bytes it held when scanned");
    out += got;
    offset += static_cast<std::uint64_t>(got);
    size -= static_cast<std::size_t>(got);
  }
}

ScannedFile scan_side(const std::filesystem::path& path, const LoadOptions& given,
                      const std::optional<Sha256Digest>& expected) {
  try {
    ScannedFile side;
    side.file = std::make_unique<OpenedFile>(path);
    LoadOptions options = given;
    options.expected_sha256 = expected;
    side.mapping = scan_checkpoint(path, options, ScanKeeps::tree);
    side.file->check_scanned(side.mapping);
    if (is_sharded_manifest(side.mapping)) {
      // A step manifest is small; reading its manifest may need tensor bytes
      // (floats of a torch 1.13-compatible file are 0-d tensors).
      options.expected_sha256 = side.mapping.sha256;
      side.mapping = load_checkpoint_mapping(path, options);
      side.file->check_scanned(side.mapping);
    }
    for (const StorageLocation& location : side.mapping.storage_locations) {
      side.locations.emplace(location.identity, location);
    }
    return side;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

StorageBytes::StorageBytes(const ScannedFile& side, const Storage& storage) : side_(side), storage_(storage) {
  if (storage.has_bytes()) return;
  const auto found = side.locations.find(storage.identity());
  if (found == side.locations.end()) {
    fail(ErrorCode::invalid_argument, "a tensor's storage has neither bytes nor a location in the file");
  }
  location_ = &found->second;
}

void StorageBytes::read(std::uint64_t offset, std::byte* out, std::size_t size) {
  if (offset > storage_.nbytes() || size > storage_.nbytes() - offset) {
    fail(ErrorCode::tensor_out_of_bounds, "bytes ", offset, "..", offset + size, " of a storage of ",
         storage_.nbytes());
  }
  if (!location_) {
    std::memcpy(out, storage_.data() + offset, size);
    return;
  }
  side_.file->read(location_->offset + offset, out, size);
  // A record read whole, in order, is checked against its CRC-32: the bytes
  // compared are the bytes the scan verified.
  if (location_->crc32 && offset == crc_next_) {
    crc_ = io::crc32_update(crc_, out, size);
    crc_next_ += size;
    if (crc_next_ == storage_.nbytes() && crc_ != *location_->crc32) {
      fail(ErrorCode::file_changed_during_read, "the record at offset ", location_->offset,
           " no longer has the CRC-32 it had when the file was scanned");
    }
  }
}

ViewReader::ViewReader(const ScannedFile& side, const TensorData& tensor, std::size_t unit,
                       std::size_t whole_storage_bytes)
    : tensor_(tensor), bytes_(side, *tensor.storage), unit_(unit) {
  if (dtype_is_sub_byte(tensor.dtype)) {
    const std::uint64_t bits = static_cast<std::uint64_t>(tensor.storage_offset) * dtype_bits(tensor.dtype);
    if (!tensor.is_contiguous() || bits % 8 != 0) {
      fail(ErrorCode::tensor_geometry_invalid, "a ", dtype_name(tensor.dtype),
           " tensor must be contiguous and start on a byte boundary to be compared");
    }
    contiguous_start_ = bits / 8;
    contiguous_ = true;
  } else if (tensor.is_contiguous()) {
    contiguous_ = true;
    contiguous_start_ = static_cast<std::uint64_t>(tensor.storage_offset) * unit_;
  } else if (bytes_.size() <= whole_storage_bytes) {
    window_.resize(bytes_.size());
    bytes_.read(0, window_.data(), window_.size());
    window_size_ = window_.size();
  } else {
    window_.resize(kWindowBytes);
    window_start_ = bytes_.size();  // nothing held yet
  }
}

void ViewReader::gather(std::uint64_t first, std::size_t count, std::byte* out) {
  if (contiguous_) {
    bytes_.read(contiguous_start_ + first * unit_, out, count * unit_);
    return;
  }
  std::vector<std::int64_t> index = index_of(first, tensor_.sizes);
  const std::size_t rank = index.size();
  for (std::size_t i = 0; i < count; ++i) {
    std::int64_t element = tensor_.storage_offset;
    for (std::size_t d = 0; d < rank; ++d) element += index[d] * tensor_.strides[d];
    copy_element(static_cast<std::uint64_t>(element) * unit_, out + i * unit_);
    for (std::size_t d = rank; d-- > 0;) {
      if (++index[d] < tensor_.sizes[d]) break;
      index[d] = 0;
    }
  }
}

void ViewReader::copy_element(std::uint64_t offset, std::byte* out) {
  if (offset < window_start_ || offset + unit_ > window_start_ + window_size_) {
    window_start_ = offset - std::min<std::uint64_t>(offset, kWindowBytes / 2);
    window_size_ = static_cast<std::size_t>(std::min<std::uint64_t>(window_.size(), bytes_.size() - window_start_));
    bytes_.read(window_start_, window_.data(), window_size_);
  }
  std::memcpy(out, window_.data() + (offset - window_start_), unit_);
}

}  // namespace holdpoint::diff
