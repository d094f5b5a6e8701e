#include "holdpoint/run/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "format/sidecar.h"
#include "format/snapshot_parser.h"
#include "base/fail.h"
#include "holdpoint/run/dcp_generation.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/schema/manifest.h"
#include "run/run_directory_impl.h"
#include "run/run_files.h"
#include "run/run_names.h"
#include "run/step_manifest.h"
#include "schema/checkpoint_bytes.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

constexpr std::uint64_t kMaxSmallFile = 64ull << 20;  // pointers, sidecars, index

std::string text_of(const io::Snapshot& snapshot) {
  const auto bytes = snapshot.buffer->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

namespace run {

bool unreadable_here(ErrorCode code) {
  const std::string_view name = error_code_name(code);
  if (code == ErrorCode::io_not_regular_file) return false;
  return name.starts_with("io_") || name.ends_with("_limit") || name.ends_with("too_large") ||
         code == ErrorCode::schema_version_unsupported;
}

}  // namespace run

std::optional<double> GenerationInfo::metric(std::string_view metric_name) const {
  for (const auto& [name, value] : metrics) {
    if (name == metric_name) return value;
  }
  return std::nullopt;
}


// ---- RunDirectory::Impl: the plumbing the other units share ----------------------------------

RunDirectory::Impl::~Impl() {
  if (lock_fd >= 0) ::close(lock_fd);
}

void RunDirectory::Impl::require_writable() const {
  if (report.read_only) fail(ErrorCode::invalid_argument, path.string(), " was opened read-only (recover = false)");
}

void RunDirectory::Impl::log(const std::string& line) const {
  if (options.log) options.log(line);
}

void RunDirectory::Impl::rethrow_with_run(const Error& error) const {
  throw Error(error.code(), concat(path.string(), ": ", error.detail())).with_path(error.path());
}

io::Directory& RunDirectory::Impl::checkpoints_dir() {
  if (!checkpoints) checkpoints = root->open_subdirectory(std::string(kCheckpointsDirectory), true);
  return *checkpoints;
}

std::optional<std::string> RunDirectory::Impl::read_small(io::Directory& dir, const std::string& name) const {
  const auto info = dir.stat(name);
  if (!info) return std::nullopt;
  return text_of(dir.read(name, kMaxSmallFile));
}

io::PublishOptions RunDirectory::Impl::publish_options(bool replace) const {
  io::PublishOptions o;
  o.replace = replace;
  o.durable = options.durable;
  o.max_bytes = kMaxSmallFile;
  return o;
}

void RunDirectory::Impl::write_index() {
  io::publish_text(*root, std::string(kRunIndex), run::index_text(committed, retired), publish_options(true));
}

void RunDirectory::Impl::write_pointer(std::string_view which, const GenerationInfo& g) {
  io::publish_text(*root, std::string(which), run_pointer_text(g), publish_options(true));
}

void RunDirectory::Impl::verify_bytes(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) const {
  schema::verify_checkpoint_bytes(bytes, owner, options.limits);
}

std::int64_t RunDirectory::Impl::verify_content(const GenerationInfo& g, std::span<std::byte> bytes,
                                                const std::shared_ptr<const void>& owner, bool at_open) const {
  const LoadedMapping mapping = parse_checkpoint_bytes(bytes, owner, options.limits);
  const Manifest manifest = Manifest::of_root(mapping.root);
  if (manifest.kind == CheckpointKind::dcp) {
    require_manifest_only(mapping.root, concat("checkpoints/", g.name));
    if (manifest.dcp->step != g.step) {
      fail(ErrorCode::shard_identity_mismatch, "checkpoints/", g.name, " is the step manifest of step ",
           manifest.dcp->step, ", not of step ", g.step);
    }
    verify_dcp_generation(*checkpoints, manifest, options.limits, !at_open);
    return manifest.dcp->world_size;
  }
  if (manifest.kind != CheckpointKind::sharded) return 0;
  require_manifest_only(mapping.root, concat("checkpoints/", g.name));
  if (manifest.sharding->step != g.step) {
    fail(ErrorCode::shard_identity_mismatch, "checkpoints/", g.name, " is the step manifest of step ",
         manifest.sharding->step, ", not of step ", g.step);
  }
  verify_shards(*checkpoints, manifest, options.limits);
  return manifest.sharding->world_size;
}

GenerationCheck RunDirectory::Impl::check(const GenerationInfo& g, bool unreadable_throws) const {
  GenerationCheck result;
  result.name = g.name;
  try {
    if (!checkpoints) fail(ErrorCode::run_generation_missing, "there is no checkpoints/ directory");
    const auto info = checkpoints->stat(g.name);
    if (!info) fail(ErrorCode::run_generation_missing, "checkpoints/", g.name, " is not on disk");
    if (info->type != io::FileInfo::Type::regular) {
      fail(ErrorCode::io_not_regular_file, "checkpoints/", g.name, " is not a regular file (never followed)");
    }
    if (const auto sidecar = read_small(*checkpoints, run::sidecar_name(g.name))) {
      if (format::parse_sidecar(*sidecar, g.name, ErrorCode::run_sidecar_invalid) != g.sha256) {
        fail(ErrorCode::sha256_mismatch, "the sidecar's digest differs from the recorded one ", g.sha256.hex());
      }
    }
    const io::Snapshot snapshot = checkpoints->read(g.name, options.limits.max_file_bytes, g.sha256);
    if (g.size != 0 && snapshot.buffer->size() != g.size) {
      fail(ErrorCode::file_changed_during_read, "checkpoints/", g.name, " holds ", snapshot.buffer->size(),
           " bytes; ", g.size, " were recorded");
    }
    verify_content(g, snapshot.buffer->bytes(), snapshot.buffer, unreadable_throws);
    result.ok = true;
  } catch (const Error& error) {
    if (unreadable_throws && run::unreadable_here(error.code())) {
      throw Error(ErrorCode::run_generation_unreadable,
                  concat("checkpoints/", g.name, " could not be checked (", error_code_name(error.code()), ": ",
                         error.detail(), "); recovery stops instead of falling back past it"))
          .with_path(error.path());
    }
    result.code = error.code();
    result.detail = error.what();
  }
  return result;
}

void RunDirectory::Impl::remove_tree(const std::string& name) { remove_tree(*checkpoints, name); }

void RunDirectory::Impl::remove_tree(io::Directory& parent, const std::string& name) {
  {
    auto directory = parent.open_subdirectory(name, false);
    for (const auto& entry : directory->list()) {
      const auto info = directory->stat(entry);
      if (info && info->type == io::FileInfo::Type::directory) {
        remove_tree(*directory, entry);
      } else {
        directory->unlink(entry);
      }
    }
  }
  parent.remove_directory(name);
}

void RunDirectory::Impl::lock() {
  // Two writers would remove each other's staging files and uncommitted
  // generations; an advisory lock keeps them apart (POSIX file system only:
  // the test double has no other processes).
  if ((options.file_system && options.file_system != &io::posix_file_system()) || !options.recover) return;
  const auto lock_path = path / std::string(run::kLockFile);
  lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    throw Error(ErrorCode::io_open_failed, concat("cannot open the lock file: ", std::strerror(errno)))
        .with_path(lock_path.string());
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(lock_fd);
    lock_fd = -1;
    if (error == EWOULDBLOCK) {
      fail(ErrorCode::run_directory_locked, "another process has it open for writing (", run::kLockFile,
           " is locked); open it read-only to inspect it");
    }
    throw Error(ErrorCode::io_open_failed, concat("cannot lock: ", std::strerror(error))).with_path(lock_path.string());
  }
}

// ---- RunDirectory --------------------------------------------------------------------------

RunDirectory::RunDirectory(const std::filesystem::path& path, RunDirectoryOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->options = std::move(options);
  impl_->fs = impl_->options.file_system ? impl_->options.file_system : &io::posix_file_system();
  try {
    impl_->open();
    // What a crash between a commit and its signatures left unsigned.
    if (impl_->options.signing_key && impl_->options.recover) {
      for (const auto& name : impl_->sign_run(*impl_->options.signing_key)) {
        impl_->log(concat(path.string(), ": signed ", name));
      }
    }
  } catch (const Error& error) {
    impl_->rethrow_with_run(error);
  }
  for (const auto& line : impl_->report.lines()) impl_->log(concat(path.string(), ": ", line));
}

RunDirectory::~RunDirectory() = default;

const std::filesystem::path& RunDirectory::path() const noexcept { return impl_->path; }
const RunDirectoryOptions& RunDirectory::options() const noexcept { return impl_->options; }
const RecoveryReport& RunDirectory::recovery() const noexcept { return impl_->report; }

std::vector<GenerationInfo> RunDirectory::generations() const {
  std::vector<GenerationInfo> out;
  for (const auto& [step, g] : impl_->committed) out.push_back(g);
  return out;
}

std::optional<GenerationInfo> RunDirectory::latest() const {
  if (!impl_->latest) return std::nullopt;
  return impl_->committed.at(*impl_->latest);
}

std::optional<GenerationInfo> RunDirectory::best() const {
  if (!impl_->best) return std::nullopt;
  return impl_->committed.at(*impl_->best);
}

std::optional<GenerationInfo> RunDirectory::find(std::string_view name) const {
  const auto step = parse_generation_name(name);
  if (!step) return std::nullopt;
  const auto it = impl_->committed.find(*step);
  if (it == impl_->committed.end()) return std::nullopt;
  return it->second;
}

std::filesystem::path RunDirectory::file_path(const GenerationInfo& generation) const {
  return impl_->path / kCheckpointsDirectory / generation.name;
}

LoadedMapping RunDirectory::load(const GenerationInfo& generation) const {
  const Impl& d = *impl_;
  try {
    if (!d.checkpoints) fail(ErrorCode::run_generation_missing, "there is no checkpoints/ directory");
    d.check_generation_signature(generation);
    if (d.signature_verdict) throw *d.signature_verdict;  // what a read-only open under the policy judged
    LoadedMapping mapping;
    const io::Snapshot snapshot = d.checkpoints->read(generation.name, d.options.limits.max_file_bytes,
                                                      generation.sha256, {}, format::checkpoint_parser(mapping, d.options.limits));
    mapping.sha256 = snapshot.sha256;
    mapping.digest_checked = true;  // against the run index's record
    return mapping;
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
}

GenerationCheck RunDirectory::verify(const GenerationInfo& generation) const {
  // Recovery never applies the trust policy: an unsigned generation is not a
  // damaged one, and is never moved aside for it.
  try {
    impl_->check_generation_signature(generation);
  } catch (const Error& error) {
    return {generation.name, false, error.code(), error.detail()};
  }
  return impl_->check(generation, false);
}

std::vector<GenerationCheck> RunDirectory::verify_all() const {
  std::vector<GenerationCheck> out;
  for (const auto& [step, g] : impl_->committed) out.push_back(verify(g));
  return out;
}

}  // namespace holdpoint
