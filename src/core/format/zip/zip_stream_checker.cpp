#include "format/zip/zip_stream_checker.h"

#include <algorithm>
#include <utility>

#include "base/crc32.h"
#include "base/fail.h"
#include "format/zip/zip_format.h"

namespace holdpoint::format {

using detail::fail;

ZipStreamChecker::ZipStreamChecker(ZipArchive& archive, std::uint64_t file_size,
                                   std::function<bool(const ZipEntry&)> keep)
    : archive_(archive),
      file_size_(file_size),
      keep_(std::move(keep)),
      by_offset_(archive.entries.size()),
      crcs_(archive.entries.size()) {
  for (std::uint32_t i = 0; i < by_offset_.size(); ++i) by_offset_[i] = i;
  const auto& entries = archive_.entries;
  std::stable_sort(by_offset_.begin(), by_offset_.end(), [&](std::uint32_t a, std::uint32_t b) {
    return entries[a].local_header_offset < entries[b].local_header_offset;
  });
  if (by_offset_.empty()) {
    step_ = Step::failed;
  } else {
    begin_entry();
  }
}

bool ZipStreamChecker::gather(std::span<const std::byte>& bytes, std::size_t wanted) {
  const std::size_t take = std::min(wanted - scratch_.size(), bytes.size());
  scratch_.insert(scratch_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(take));
  bytes = bytes.subspan(take);
  position_ += take;
  return scratch_.size() == wanted;
}

// An entry's local header must start where the previous entry ended and fit
// before the central directory; anything else is not a strict tiling.
void ZipStreamChecker::begin_entry() {
  const ZipEntry& entry = archive_.entries[by_offset_[current_]];
  scratch_.clear();
  step_ = entry.local_header_offset == position_ &&
                  archive_.central_directory_offset - position_ >= zip::kLocalHeaderSize
              ? Step::header_start
              : Step::failed;
}

void ZipStreamChecker::end_entry() {
  if (++current_ == by_offset_.size()) {
    step_ = position_ == archive_.central_directory_offset ? Step::done : Step::failed;
    return;
  }
  begin_entry();
}

// After the payload: the data descriptor, if one follows, else the next entry.
void ZipStreamChecker::end_payload() {
  if (descriptor_width_ == 0) {
    end_entry();
    return;
  }
  scratch_.clear();
  step_ = archive_.central_directory_offset - position_ >= 4 ? Step::descriptor_start : Step::failed;
}

void ZipStreamChecker::consume(std::uint64_t offset, std::span<const std::byte> bytes) {
  if (offset != position_) fail(ErrorCode::invalid_argument, "zip stream: bytes at ", offset, ", expected ", position_);
  while (!bytes.empty() && step_ != Step::done && step_ != Step::failed) {
    const std::size_t index = by_offset_[current_];
    ZipEntry& entry = archive_.entries[index];
    try {
      switch (step_) {
        case Step::header_start:
          if (!gather(bytes, zip::kLocalHeaderSize)) break;
          header_size_ = check_local_header_start(scratch_, file_size_, index, entry);
          step_ = entry.local_header_offset + header_size_ <= archive_.central_directory_offset ? Step::header_rest
                                                                                                 : Step::failed;
          break;
        case Step::header_rest:
          if (!gather(bytes, header_size_)) break;
          descriptor_width_ = check_local_header(scratch_, archive_.central_directory_offset, index, entry);
          payload_left_ = entry.size;
          keeping_ = nullptr;
          if (keep_(entry)) {
            keeping_ = &kept_[static_cast<std::uint32_t>(index)];
            keeping_->reserve(static_cast<std::size_t>(entry.size));
          }
          step_ = Step::payload;
          if (payload_left_ == 0) {
            if (observe_) observe_(index, {}, true);
            end_payload();
          }
          break;
        case Step::payload: {
          const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(payload_left_, bytes.size()));
          const auto piece = bytes.first(take);
          crcs_[index] = io::crc32_update(crcs_[index], piece.data(), piece.size());
          if (keeping_) keeping_->insert(keeping_->end(), piece.begin(), piece.end());
          if (observe_) observe_(index, piece, take == payload_left_);
          bytes = bytes.subspan(take);
          position_ += take;
          payload_left_ -= take;
          if (payload_left_ == 0) end_payload();
          break;
        }
        case Step::descriptor_start: {
          // Its first 4 bytes tell whether the optional signature is there,
          // and so how long the descriptor is.
          if (!gather(bytes, 4)) break;
          std::uint32_t first = 0;
          for (int i = 3; i >= 0; --i) first = (first << 8) | std::to_integer<std::uint32_t>(scratch_[i]);
          descriptor_size_ = max_data_descriptor_bytes(descriptor_width_) -
                             (first == zip::kDataDescriptorSignature ? 0 : 4);
          step_ = entry.end_offset + descriptor_size_ <= archive_.central_directory_offset ? Step::descriptor_rest
                                                                                           : Step::failed;
          break;
        }
        case Step::descriptor_rest:
          if (!gather(bytes, descriptor_size_)) break;
          check_data_descriptor(scratch_, descriptor_width_, archive_.central_directory_offset, index, entry);
          end_entry();
          break;
        case Step::done:
        case Step::failed: break;
      }
    } catch (const Error&) {
      step_ = Step::failed;
    }
  }
  // Past the last entry (the central directory and end records, which the
  // caller checks) or past a failure, bytes are only counted.
  position_ += bytes.size();
}

void ZipStreamChecker::check_crcs(const Limits& limits) const {
  if (step_ != Step::done) fail(ErrorCode::invalid_argument, "zip stream: the local entries did not check out");
  for (std::size_t i = 0; i < archive_.entries.size(); ++i) check_zip_entry_crc(archive_, i, crcs_[i], limits);
}

std::span<const std::byte> ZipStreamChecker::kept(const ZipEntry& entry) const {
  const std::size_t index = static_cast<std::size_t>(&entry - archive_.entries.data());
  const auto found = index < archive_.entries.size() ? kept_.find(static_cast<std::uint32_t>(index)) : kept_.end();
  if (step_ != Step::done || found == kept_.end()) {
    fail(ErrorCode::invalid_argument, "zip stream: the payload of '", entry.record(), "' was not kept");
  }
  return found->second;
}

}  // namespace holdpoint::format
