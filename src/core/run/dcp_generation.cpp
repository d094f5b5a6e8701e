#include "holdpoint/run/dcp_generation.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "base/fail.h"
#include "base/file_stream.h"
#include "base/publish.h"
#include "base/regular_file.h"
#include "format/pt_writer.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/run/sharded_checkpoint.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

constexpr std::size_t kReadPiece = std::size_t{8} << 20;

// The SHA-256 of [offset, offset + length) of an open file, read in pieces.
Sha256Digest digest_range(const io::RegularFile& file, const std::filesystem::path& label, std::uint64_t offset,
                          std::uint64_t length, std::vector<std::byte>& buffer) {
  Sha256 hasher;
  while (length > 0) {
    const std::size_t piece = static_cast<std::size_t>(std::min<std::uint64_t>(length, kReadPiece));
    buffer.resize(std::max(buffer.size(), piece));
    if (io::pread_fully(file.fd.get(), buffer.data(), piece, offset) != piece) {
      throw Error(ErrorCode::file_changed_during_read, "the file shrank while it was read").with_path(label.string());
    }
    hasher.update(buffer.data(), piece);
    offset += piece;
    length -= piece;
  }
  return hasher.finish();
}

io::RegularFile open_listed(int folder_fd, const std::filesystem::path& folder, const DcpFile& file) {
  io::RegularFile opened =
      io::open_regular_for_reading_at(folder_fd, file.name, folder / file.name, ErrorCode::run_shards_invalid);
  if (opened.size != file.size) {
    fail(ErrorCode::shard_size_mismatch, (folder / file.name).string(), " holds ", opened.size, " bytes; ", file.size,
         " were recorded");
  }
  return opened;
}

[[noreturn]] void digest_mismatch(const std::filesystem::path& path, const DcpRange& range, std::size_t index) {
  fail(ErrorCode::shard_digest_mismatch, path.string(), ": bytes [", range.offset, ", ", range.offset + range.length,
       ") (range ", index, ") differ from the digest recorded in the step manifest");
}

}  // namespace

DcpFile write_dcp_file(const std::filesystem::path& folder, const std::string& name, std::span<const DcpItem> items,
                       const DcpWriteOptions& options) {
  if (!is_dcp_file_name(name)) fail(ErrorCode::invalid_argument, "'", name, "' is not a file name a DCP folder holds");
  const std::unique_ptr<io::Directory> directory = io::posix_file_system().open_directory(folder, false);
  io::PublishOptions publish;
  publish.durable = options.durable;
  publish.range_digests = true;
  // publish() compares the whole file's CRC-32 as read back with the one of
  // the bytes written: every byte is checked without a second SHA-256 pass.
  publish.verifier_checks_content = true;
  format::PtWriteOptions archive;
  archive.limits = options.limits;
  const io::PublishResult result = io::publish(
      *directory, name, publish,
      [&](io::ByteSink& sink) {
        for (const DcpItem& item : items) {
          const std::uint64_t start = sink.position();
          if (item.archive) {
            format::write_pt(sink, *item.archive, archive);
          } else {
            sink.write(item.bytes);
          }
          if (sink.position() == start) fail(ErrorCode::write_value_unsupported, "an empty DCP item for ", name);
          io::end_range(sink);
        }
      },
      [](std::span<std::byte>, const std::shared_ptr<const void>&) {});
  DcpFile file;
  file.name = name;
  file.size = result.size;
  std::uint64_t start = 0;
  for (std::size_t i = 0; i < result.range_digests.size(); ++i) {
    file.ranges.push_back({start, result.range_ends[i] - start, result.range_digests[i]});
    start = result.range_ends[i];
  }
  return file;
}

void verify_dcp_generation(io::Directory& checkpoints, const Manifest& step_manifest, const Limits& limits,
                           bool hash_data) {
  if (!step_manifest.dcp) fail(ErrorCode::invalid_argument, "verify_dcp_generation: the manifest is not of kind dcp");
  const DcpLayout& layout = *step_manifest.dcp;
  const std::string folder_name = shard_directory_name(layout.step);
  const auto info = checkpoints.stat(folder_name);
  if (!info || info->type != io::FileInfo::Type::directory) {
    fail(ErrorCode::run_shards_invalid, "checkpoints/", folder_name, info ? " is not a directory (never followed)"
                                                                          : " is missing");
  }
  const std::filesystem::path folder = checkpoints.path() / folder_name;
  const io::FileDescriptor folder_fd = io::open_directory_for_reading(folder, ErrorCode::run_shards_invalid);
  const std::unique_ptr<io::Directory> listing = checkpoints.open_subdirectory(folder_name, false);
  for (const std::string& entry : listing->list()) {
    if (!layout.file(entry)) {
      fail(ErrorCode::dcp_file_unlisted, (folder / entry).string(), " is not listed in the step manifest");
    }
  }
  std::vector<std::byte> buffer;
  std::vector<std::byte> metadata_bytes;
  for (const DcpFile& file : layout.files) {
    const io::RegularFile opened = open_listed(folder_fd.get(), folder, file);
    for (std::size_t i = 0; i < file.ranges.size(); ++i) {
      const DcpRange& range = file.ranges[i];
      if (file.name == ".metadata") {
        if (file.size > limits.max_pickle_bytes) {
          fail(ErrorCode::pickle_too_large, (folder / file.name).string(), " has ", file.size,
               " bytes, more than max_pickle_bytes ", limits.max_pickle_bytes);
        }
        metadata_bytes.resize(static_cast<std::size_t>(file.size));
        if (io::pread_fully(opened.fd.get(), metadata_bytes.data(), metadata_bytes.size(), 0) != metadata_bytes.size()) {
          fail(ErrorCode::file_changed_during_read, (folder / file.name).string(), " shrank while it was read");
        }
        // The bytes checked are the bytes decoded below.
        if (file.ranges.size() != 1 || Sha256::of(metadata_bytes) != range.sha256) {
          digest_mismatch(folder / file.name, range, i);
        }
        break;
      }
      if (!hash_data) break;
      if (digest_range(opened, folder / file.name, range.offset, range.length, buffer) != range.sha256) {
        digest_mismatch(folder / file.name, range, i);
      }
    }
  }
  const Value metadata = decode_distributed_checkpoint_metadata(metadata_bytes, folder / ".metadata", limits);
  std::set<std::tuple<std::string, std::uint64_t, std::uint64_t>> listed;
  for (const DcpFile& file : layout.files) {
    for (const DcpRange& range : file.ranges) listed.emplace(file.name, range.offset, range.length);
  }
  for (const DcpItemLocation& item : distributed_checkpoint_item_locations(metadata, folder / ".metadata")) {
    if (item.file == ".metadata" || !listed.count({item.file, item.offset, item.length})) {
      fail(ErrorCode::dcp_range_unlisted, (folder / ".metadata").string(), " places '", item.fqn, "' at bytes [",
           item.offset, ", +", item.length, ") of ", item.file, ", which the step manifest does not list as a range");
    }
  }
}

bool is_dcp_manifest(const LoadedMapping& mapping) {
  const Value* manifest = find_manifest_entry(mapping.root);
  if (!manifest || !manifest->is_dict()) return false;
  const Value* kind = manifest->as_dict().find(std::string_view("kind"));
  return kind && kind->is_string() && kind->as_string() == "dcp";
}

std::vector<DcpRangeBytes> read_dcp_ranges(const std::filesystem::path& folder, const DcpFile& file,
                                           std::span<const std::size_t> wanted) {
  const io::FileDescriptor folder_fd = io::open_directory_for_reading(folder, ErrorCode::run_shards_invalid);
  const io::RegularFile opened = open_listed(folder_fd.get(), folder, file);
  std::uint64_t total = 0;
  for (const std::size_t index : wanted) {
    if (index >= file.ranges.size()) {
      fail(ErrorCode::invalid_argument, "read_dcp_ranges: ", file.name, " has ", file.ranges.size(),
           " ranges, not ", index + 1);
    }
    total += file.ranges[index].length;  // each length is at most the file's recorded size
  }
  const std::shared_ptr<io::Buffer> buffer = io::Buffer::allocate(static_cast<std::size_t>(total));
  std::vector<DcpRangeBytes> out;
  out.reserve(wanted.size());
  std::size_t at = 0;
  for (const std::size_t index : wanted) {
    const DcpRange& range = file.ranges[index];
    const auto length = static_cast<std::size_t>(range.length);
    buffer->populate(at, length);
    std::byte* destination = buffer->data() + at;
    if (io::pread_fully(opened.fd.get(), destination, length, range.offset) != length) {
      fail(ErrorCode::file_changed_during_read, (folder / file.name).string(), " shrank while it was read");
    }
    const std::span<std::byte> bytes(destination, length);
    if (Sha256::of(bytes) != range.sha256) digest_mismatch(folder / file.name, range, index);
    out.push_back({bytes, buffer});
    at += length;
  }
  return out;
}

}  // namespace holdpoint
