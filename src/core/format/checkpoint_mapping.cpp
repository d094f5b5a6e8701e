#include "holdpoint/format/checkpoint_mapping.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/fail.h"
#include "format/signed_digest.h"
#include "format/pt_reader.h"
#include "format/pt_writer.h"
#include "format/sidecar.h"
#include "format/snapshot_parser.h"
#include "format/safetensors/safetensors.h"
#include "holdpoint/base/snapshot.h"
#include "format/publish_file.h"
#include "holdpoint/base/file_system.h"

namespace holdpoint {

using detail::fail;

std::string_view file_format_name(FileFormat format) noexcept {
  switch (format) {
    case FileFormat::pytorch_zip: return "pytorch_zip";
    case FileFormat::pytorch_legacy: return "pytorch_legacy";
    case FileFormat::safetensors: return "safetensors";
  }
  return "unknown";
}

LoadedMapping parse_checkpoint_bytes(std::span<std::byte> bytes, std::shared_ptr<const void> owner,
                                     const Limits& limits, const ParseContext& context) {
  format::ParsedFile parsed = format::read_checkpoint_file(bytes, owner, limits, context);
  LoadedMapping mapping;
  mapping.root = std::move(parsed.root);
  mapping.format = parsed.format;
  mapping.file_bytes = bytes.size();
  mapping.markers = std::move(parsed.markers);
  mapping.records = std::move(parsed.records);
  return mapping;
}

LoadedMapping load_checkpoint_mapping(const std::filesystem::path& path, const LoadOptions& options) {
  LoadedMapping mapping;
  const std::optional<Sha256Digest> expected = format::expected_digest(path, options);
  try {
    const io::Snapshot snapshot = io::read_snapshot(
        path, options.limits.max_file_bytes, expected, options.progress, format::checkpoint_parser(mapping, options.limits),
        options.compute_sha256 ? io::Hashing::always : io::Hashing::when_expected);
    if (snapshot.hashed) mapping.sha256 = snapshot.sha256;
    mapping.digest_checked = expected.has_value();
    return mapping;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

std::string sha256_sidecar_line(const Sha256Digest& digest, const std::filesystem::path& file) {
  return format::sidecar_text(digest, file.filename().string());
}

namespace {

std::filesystem::path sidecar_path(const std::filesystem::path& path) {
  return std::filesystem::path(path.string() + std::string(format::kSidecarSuffix));
}

// The parent directory of `path`, opened without following a symlink there.
std::unique_ptr<io::Directory> parent_directory(const std::filesystem::path& path) {
  const auto parent = path.parent_path();
  return io::posix_file_system().open_directory(parent.empty() ? std::filesystem::path(".") : parent, false);
}

}  // namespace

Sha256Digest read_sha256_sidecar(const std::filesystem::path& path) {
  const auto sidecar = sidecar_path(path);
  io::Snapshot snapshot;
  try {
    snapshot = parent_directory(path)->read(sidecar.filename().string(), format::kMaxSidecarBytes);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::file_too_large) throw error.with_path(sidecar.string());
    throw Error(ErrorCode::sidecar_invalid, detail::concat("the sidecar is larger than ", format::kMaxSidecarBytes,
                                                           " bytes; it is one line"))
        .with_path(sidecar.string());
  }
  const auto bytes = snapshot.buffer->bytes();
  try {
    return format::parse_sidecar({reinterpret_cast<const char*>(bytes.data()), bytes.size()},
                                 path.filename().string(), ErrorCode::sidecar_invalid);
  } catch (const Error& error) {
    throw error.with_path(sidecar.string());
  }
}

namespace detail {

SaveResult publish_file(const std::filesystem::path& path, const PublishOptions& options,
                        const std::function<void(io::ByteSink&, SaveResult&)>& write,
                        const io::PublishVerifier& verify) {
  const std::string name = path.filename().string();
  try {
    auto directory = parent_directory(path);
    SaveResult result;
    io::PublishOptions publish_options;
    publish_options.replace = options.replace;
    publish_options.durable = options.durable;
    publish_options.read_back = options.read_back;
    publish_options.verifier_checks_content = options.zip_records;
    const io::PublishVerifier default_verify = [](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
      parse_checkpoint_bytes(bytes, owner);
    };
    const auto published = io::publish(*directory, name, publish_options,
                                       [&](io::ByteSink& sink) { write(sink, result); }, verify ? verify : default_verify);
    result.sha256 = published.sha256;
    result.file_bytes = published.size;
    if (options.write_sidecar) {
      io::PublishOptions sidecar_options;
      sidecar_options.replace = true;
      sidecar_options.durable = options.durable;
      io::publish_text(*directory, name + ".sha256", sha256_sidecar_line(result.sha256, path), sidecar_options);
    }
    return result;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

}  // namespace detail

SaveResult save_mapping(const std::filesystem::path& path, const Value& root, const SaveOptions& options) {
  if (options.format == FileFormat::pytorch_legacy) {
    throw Error(ErrorCode::invalid_argument, "the legacy PyTorch stream is read-only; save as pytorch_zip")
        .with_path(path.string());
  }
  detail::PublishOptions publish_options;
  publish_options.durable = options.durable;
  publish_options.write_sidecar = options.write_sidecar;
  publish_options.read_back = options.read_back;
  publish_options.zip_records = options.format == FileFormat::pytorch_zip;
  return detail::publish_file(path, publish_options, [&](io::ByteSink& sink, SaveResult& result) {
    if (options.format == FileFormat::safetensors) {
      format::write_safetensors(sink, root);
      result.tensor_count = root.as_dict().size();
      result.storage_count = result.tensor_count;
    } else {
      format::PtWriteOptions write_options;
      write_options.torch_1_13_compatible = options.torch_1_13_compatible;
      write_options.archive_name = options.archive_name;
      const auto written = format::write_pt(sink, root, write_options);
      result.tensor_count = written.tensor_count;
      result.storage_count = written.storage_count;
    }
  });
}

}  // namespace holdpoint
