// Export of a run directory's generations (holdpoint/run/export.h): the order
// of work and the reasons for it are in the header.
#include "holdpoint/run/export.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/fail.h"
#include "base/publish.h"
#include "base/utc_time.h"
#include "holdpoint/base/file_system.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/dcp_generation.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint_version.h"
#include "run/run_files.h"

namespace holdpoint {

namespace {

using detail::fail;

constexpr std::string_view kProofSchema = "holdpoint.export-proof";
constexpr std::int64_t kProofSchemaVersion = 1;
constexpr std::uint64_t kCopyChunk = std::uint64_t{64} << 20;

void require_empty_destination(const std::filesystem::path& destination) {
  std::error_code error;
  const auto status = std::filesystem::symlink_status(destination, error);
  if (error && error != std::errc::no_such_file_or_directory) {
    fail(ErrorCode::io_open_failed, destination.string() + ": " + error.message());
  }
  if (status.type() == std::filesystem::file_type::not_found) return;
  if (status.type() != std::filesystem::file_type::directory) {
    fail(ErrorCode::export_destination_invalid,
         destination.string() + " exists and is not a directory (symlinks are not followed)");
  }
  if (std::filesystem::directory_iterator(destination, error) != std::filesystem::directory_iterator() || error) {
    fail(ErrorCode::export_destination_invalid,
         destination.string() + " is not an empty directory; export writes only into a new or empty one");
  }
}

// The code that best names a recovery report's first problem: a damaged
// generation's own code, run_pointer_invalid for LATEST or BEST,
// run_index_invalid for the index; nullopt for a clean report.
std::optional<ErrorCode> recovery_problem_code(const RecoveryReport& report) {
  for (const auto& check : report.damaged) {
    if (check.code) return check.code;
  }
  if (!report.damaged.empty() || report.latest_problem || report.best_problem) return ErrorCode::run_pointer_invalid;
  if (report.index_problem || !report.adopted.empty() || !report.dropped_from_index.empty()) {
    return ErrorCode::run_index_invalid;
  }
  return std::nullopt;
}

struct ProofCheck {
  std::string check;
  std::string subject;
  std::string detail;
};

class Exporter {
 public:
  Exporter(const std::filesystem::path& run, const std::filesystem::path& destination, const ExportOptions& options)
      : run_(run.string()), destination_(destination.string()), options_(options), selection_(options.selection) {}

  // Throws ExportError, which says whether RUN opened and whether DEST was touched.
  ExportResult run() {
    try {
      return run_steps();
    } catch (const Error& error) {
      throw ExportError(error, source_unopened_, destination_touched_);
    }
  }

 private:
  ExportResult run_steps() {
    require_empty_destination(destination_);
    const auto source = open_source();
    select(*source);
    copy(*source);
    verify_destination();
    ExportResult result;
    result.proof_json = proof_json().dump(2) + "\n";
    io::PublishOptions options;
    options.replace = false;
    io::publish_text(*destination_root_, std::string(kExportLoadingFile), loading_text(), options);
    io::publish_text(*destination_root_, std::string(kExportProofFile), result.proof_json, options);
    result.generations = selected_;
    result.latest = latest_;
    result.best = best_;
    result.skipped = skipped_;
    return result;
  }

  io::ReadProgress progress_for(const std::string& label) const {
    return options_.progress ? options_.progress(label) : io::ReadProgress();
  }

  std::unique_ptr<RunDirectory> open_source() {
    RunDirectoryOptions options;
    options.create = false;
    options.recover = false;  // exporting never changes the source
    try {
      return std::make_unique<RunDirectory>(run_, options);
    } catch (const Error&) {
      source_unopened_ = true;
      throw;
    }
  }

  void require_verified_latest(const RunDirectory& source) {
    const RecoveryReport& report = source.recovery();
    if (report.latest_problem || !source.latest()) {
      std::string findings;
      for (const auto& line : report.lines()) findings += "\n  " + line;
      fail(ErrorCode::run_pointer_invalid,
           run_ + ": LATEST: " + report.latest_problem.value_or("the run has no generation") +
               "; export copies only a verified LATEST (holdpoint ls " + run_ +
               " shows what recovery would do):" + findings);
    }
  }

  void select(const RunDirectory& source) {
    const RecoveryReport& report = source.recovery();
    source_latest_ = report.latest_problem ? std::nullopt : source.latest();
    source_best_ = report.best_problem ? std::nullopt : source.best();
    switch (selection_) {
      case ExportSelection::latest:
        require_verified_latest(source);
        selected_ = {*source_latest_};
        break;
      case ExportSelection::all:
        require_verified_latest(source);
        selected_ = source.generations();
        // Generations found damaged on opening are not committed; the proof lists them.
        skipped_ = report.damaged;
        break;
      case ExportSelection::best:
        if (!source_best_) {
          fail(ErrorCode::run_pointer_invalid,
               run_ + ": BEST: " + report.best_problem.value_or("the run has no BEST pointer"));
        }
        selected_ = {*source_best_};
        break;
    }
    // DEST's LATEST names its newest generation, so DEST opens without recovery
    // (for --best, that is the BEST generation); BEST is kept when exported.
    latest_ = selected_.back();
    if (source_best_) {
      for (const auto& g : selected_) {
        if (g.name == source_best_->name) best_ = g;
      }
    }
  }

  void copy(const RunDirectory& source) {
    io::FileSystem& fs = io::posix_file_system();
    const auto source_checkpoints =
        fs.open_directory(run_, false)->open_subdirectory(std::string(kCheckpointsDirectory), false);
    destination_touched_ = true;
    destination_root_ = fs.open_directory(destination_, true);
    destination_checkpoints_ = destination_root_->open_subdirectory(std::string(kCheckpointsDirectory), true);
    const Limits limits = source.options().limits;

    std::vector<GenerationInfo> copied;
    for (const auto& g : selected_) {
      try {
        copy_generation(*source_checkpoints, g, limits);
        copied.push_back(g);
      } catch (const Error& error) {
        // --all skips an older generation that does not verify (read-only
        // opening checked only LATEST); I/O errors, and LATEST, stop the export.
        if (selection_ != ExportSelection::all || g.name == latest_.name || is_environment_error(error.code())) {
          throw;
        }
        skipped_.push_back({g.name, false, error.code(), error.what()});
        if (best_ && best_->name == g.name) best_.reset();
      }
    }
    selected_ = std::move(copied);

    io::PublishOptions options;
    options.replace = false;
    io::publish_text(*destination_root_, std::string(kRunIndex), index_text(), options);
    if (best_) io::publish_text(*destination_root_, std::string(kBestPointer), pointer_text(*best_), options);
    // Last, as in a commit: LATEST is what makes DEST a run directory.
    io::publish_text(*destination_root_, std::string(kLatestPointer), pointer_text(latest_), options);
  }

  // Publishes `bytes` as `name` in `directory` (staged, fsynced, re-read and
  // checked by `verify`, renamed without replacing, directory fsynced).
  io::PublishResult publish_copy(io::Directory& directory, const std::string& name, const std::string& label,
                                 std::span<std::byte> bytes, const Limits& limits,
                                 const io::PublishVerifier& verify) const {
    io::PublishOptions options;
    options.replace = false;
    options.max_bytes = limits.max_file_bytes;
    const io::ReadProgress progress = progress_for("writing " + label);
    return io::publish(
        directory, name, options,
        [&](io::ByteSink& sink) {
          for (std::uint64_t done = 0; done < bytes.size();) {
            const std::uint64_t chunk = std::min<std::uint64_t>(kCopyChunk, bytes.size() - done);
            sink.write_stable(bytes.subspan(done, chunk));
            done += chunk;
            if (progress) progress(done, bytes.size());
          }
        },
        verify);
  }

  static Manifest manifest_of(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner,
                              const Limits& limits) {
    return Manifest::of_root(parse_checkpoint_bytes(bytes, owner, limits).root);
  }

  // Copies the shards of a sharded generation into DEST/checkpoints/step-N.shards/,
  // after checking them whole in the source; on failure removes what it wrote,
  // so DEST never holds a partial shard directory.
  void copy_shards(io::Directory& source_checkpoints, const GenerationInfo& g, const Manifest& manifest,
                   const Limits& limits) {
    const Sharding& sharding = *manifest.sharding;
    const std::string directory = shard_directory_name(sharding.step);
    // Every shard's size, SHA-256, identity and components, against the step
    // manifest read against the run's record: nothing is written for a
    // generation whose shards do not verify.
    ShardedReadOptions read_options;
    read_options.limits = limits;
    read_options.expected_sha256 = g.sha256;
    read_sharded_checkpoint(source_checkpoints, g.name, read_options);
    const auto source_shards = source_checkpoints.open_subdirectory(directory, false);
    auto destination_shards = destination_checkpoints_->open_subdirectory(directory, true);
    std::vector<std::string> written;
    try {
      for (const ShardRecord& record : sharding.shards) {
        const std::string name = shard_file_name(record.rank);
        const std::string source_label = run_ + "/checkpoints/" + directory + "/" + name;
        const std::string destination_label = destination_ + "/checkpoints/" + directory + "/" + name;
        // Read again against the step manifest's digest: what is copied is what was checked.
        const io::Snapshot snapshot = source_shards->read(name, limits.max_file_bytes, record.sha256,
                                                          progress_for("reading " + source_label));
        if (snapshot.buffer->size() != record.size) {
          fail(ErrorCode::shard_size_mismatch, source_label + " holds " + std::to_string(snapshot.buffer->size()) +
                                                   " bytes; the step manifest records " + std::to_string(record.size));
        }
        written.push_back(name);
        const auto published = publish_copy(
            *destination_shards, name, destination_label, snapshot.buffer->bytes(), limits,
            [&limits](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
              parse_checkpoint_bytes(bytes, owner, limits);
            });
        if (published.sha256 != record.sha256) {
          fail(ErrorCode::shard_digest_mismatch, destination_label + " was written with SHA-256 " +
                                                     published.sha256.hex() + "; the step manifest records " +
                                                     record.sha256.hex());
        }
      }
    } catch (const Error&) {
      destination_shards.reset();
      remove_destination_shards(directory);
      throw;
    }
    add_check("source_shards_verify", g.name,
              std::to_string(sharding.world_size) + " shards in " + directory +
                  "/: sizes, SHA-256, identity and component digests as the step manifest records");
    add_check("shards_copied", g.name,
              std::to_string(sharding.world_size) + " shards published into DEST/checkpoints/" + directory +
                  "/ before the step manifest, each re-read and parsed before its rename");
    sharded_[g.name] = sharding;
  }

  // Copies the folder of a DCP generation into DEST/checkpoints/step-N.shards/:
  // every file checked whole in the source against its range digests (the
  // bytes copied are the bytes checked), each copy's ranges checked again as
  // read back before its rename; on failure removes what it wrote.
  void copy_dcp_folder(io::Directory& source_checkpoints, const GenerationInfo& g, const Manifest& manifest,
                       const Limits& limits) {
    const DcpLayout& layout = *manifest.dcp;
    const std::string directory = shard_directory_name(layout.step);
    verify_dcp_generation(source_checkpoints, manifest, limits, false);
    const auto source_folder = source_checkpoints.open_subdirectory(directory, false);
    auto destination_folder = destination_checkpoints_->open_subdirectory(directory, true);
    const auto check_ranges = [](const DcpFile& file, std::span<const std::byte> bytes, const std::string& label) {
      if (bytes.size() != file.size) {
        fail(ErrorCode::shard_size_mismatch,
             label + " holds " + std::to_string(bytes.size()) + " bytes; the step manifest records " +
                 std::to_string(file.size));
      }
      for (std::size_t i = 0; i < file.ranges.size(); ++i) {
        const DcpRange& range = file.ranges[i];
        if (Sha256::of(bytes.subspan(range.offset, range.length)) != range.sha256) {
          fail(ErrorCode::shard_digest_mismatch, label + ": range " + std::to_string(i) + " at byte " +
                                                     std::to_string(range.offset) +
                                                     " differs from the digest the step manifest records");
        }
      }
    };
    std::uint64_t bytes_copied = 0;
    try {
      for (const DcpFile& file : layout.files) {
        const std::string source_label = run_ + "/checkpoints/" + directory + "/" + file.name;
        const std::string destination_label = destination_ + "/checkpoints/" + directory + "/" + file.name;
        const io::Snapshot snapshot = source_folder->read(file.name, limits.max_file_bytes, std::nullopt,
                                                          progress_for("reading " + source_label));
        check_ranges(file, snapshot.buffer->bytes(), source_label);
        publish_copy(*destination_folder, file.name, destination_label, snapshot.buffer->bytes(), limits,
                     [&](std::span<std::byte> bytes, const std::shared_ptr<const void>&) {
                       check_ranges(file, bytes, destination_label);
                     });
        bytes_copied += file.size;
      }
    } catch (const Error&) {
      destination_folder.reset();
      remove_destination_shards(directory);
      throw;
    }
    add_check("source_dcp_folder_verifies", g.name,
              std::to_string(layout.files.size()) + " files in " + directory +
                  "/: each a regular file of its recorded size, every range's SHA-256 as the step manifest records");
    add_check("dcp_folder_copied", g.name,
              std::to_string(bytes_copied) + " bytes published into DEST/checkpoints/" + directory +
                  "/ before the step manifest, each file's ranges re-checked as read back before its rename");
  }

  // Removes DEST/checkpoints/<directory>/ and the shard files in it, best
  // effort: a crash here leaves a shard directory without a committed
  // manifest, which DEST's recovery removes.
  void remove_destination_shards(const std::string& directory) noexcept {
    try {
      if (const auto info = destination_checkpoints_->stat(directory);
          !info || info->type != io::FileInfo::Type::directory) {
        return;
      }
      {
        const auto shards = destination_checkpoints_->open_subdirectory(directory, false);
        for (const auto& name : shards->list()) shards->unlink(name);
      }
      destination_checkpoints_->remove_directory(directory);
    } catch (const Error&) {
    }
  }

  // The generation's signature goes with it, verbatim, when it names exactly
  // these bytes: the statement holds for the copy (same name, size, digest),
  // so `verify FILE --trust` and loads under a trust policy accept it at DEST.
  // One that does not parse or names other bytes stays behind, listed.
  void copy_signature(io::Directory& source_checkpoints, const GenerationInfo& g, const io::PublishOptions& options) {
    const std::string name = g.name + ".sig";
    const auto info = source_checkpoints.stat(name);
    if (!info || info->type != io::FileInfo::Type::regular) return;
    try {
      const SignatureFile signature = *read_signature(source_checkpoints, name);
      const std::string text = signature.text();
      if (signature.statement.file != g.name || signature.statement.sha256 != g.sha256 ||
          signature.statement.size != g.size) {
        add_check("signature_not_copied", g.name, name + " names other bytes than the generation's");
        return;
      }
      io::publish_text(*destination_checkpoints_, name, text, options);
      add_check("signature_copied", g.name, name + " (key " + signature.key_id + "), verbatim");
    } catch (const Error& error) {
      add_check("signature_not_copied", g.name, name + ": " + std::string(error_code_name(error.code())));
    }
  }

  void copy_generation(io::Directory& source_checkpoints, const GenerationInfo& g, const Limits& limits) {
    const std::string source_label = run_ + "/checkpoints/" + g.name;
    const std::string destination_label = destination_ + "/checkpoints/" + g.name;
    // Read against the recorded digest: a copy of a damaged file is refused here.
    const io::Snapshot snapshot =
        source_checkpoints.read(g.name, limits.max_file_bytes, g.sha256, progress_for("reading " + source_label));
    if (g.size != 0 && snapshot.buffer->size() != g.size) {
      fail(ErrorCode::file_changed_during_read, source_label + " holds " + std::to_string(snapshot.buffer->size()) +
                                                    " bytes; the run recorded " + std::to_string(g.size));
    }
    // A sharded generation: its shards first, as a sharded commit publishes them.
    const Manifest manifest = manifest_of(snapshot.buffer->bytes(), snapshot.buffer, limits);
    const bool sharded = manifest.kind == CheckpointKind::sharded;
    const bool dcp = manifest.kind == CheckpointKind::dcp;
    if (sharded) copy_shards(source_checkpoints, g, manifest, limits);
    if (dcp) copy_dcp_folder(source_checkpoints, g, manifest, limits);
    io::PublishOptions options;
    options.replace = false;
    options.max_bytes = limits.max_file_bytes;
    io::PublishResult published;
    try {
      published = publish_copy(
          *destination_checkpoints_, g.name, destination_label, snapshot.buffer->bytes(), limits,
          [this, &limits](std::span<std::byte> written, const std::shared_ptr<const void>& owner) {
            const Manifest copied = manifest_of(written, owner, limits);
            // The step manifest's shards must verify at DEST before it appears there.
            if (copied.kind == CheckpointKind::sharded) verify_shards(*destination_checkpoints_, copied, limits);
            if (copied.kind == CheckpointKind::dcp) {
              verify_dcp_generation(*destination_checkpoints_, copied, limits, false);
            }
          });
    } catch (const Error&) {
      if (sharded) {
        sharded_.erase(g.name);
        remove_destination_shards(shard_directory_name(manifest.sharding->step));
      }
      if (dcp) remove_destination_shards(shard_directory_name(manifest.dcp->step));
      throw;
    }
    if (published.sha256 != g.sha256) {
      fail(ErrorCode::sha256_mismatch, destination_label + " was written with SHA-256 " + published.sha256.hex() +
                                           "; the source's is " + g.sha256.hex());
    }
    io::publish_text(*destination_checkpoints_, g.name + ".sha256", sha256_sidecar_line(g.sha256, g.name), options);
    copy_signature(source_checkpoints, g, options);
    add_check("source_sha256_matches_record", g.name,
              "read from " + source_label + "; SHA-256 " + g.sha256.hex() + " as the run records");
    add_check("copy_verified_before_publish", g.name,
              "staged, fsynced, re-read, parsed by the restricted reader and its manifest read before the rename");
  }

  void verify_destination() {
    const Limits limits = RunDirectoryOptions{}.limits;
    for (const auto& g : selected_) {
      const std::string label = destination_ + "/checkpoints/" + g.name;
      const io::Snapshot copy = destination_checkpoints_->read(g.name, limits.max_file_bytes, std::nullopt,
                                                               progress_for("verifying " + label));
      if (copy.buffer->size() != g.size) {
        fail(ErrorCode::file_changed_during_read, label + " holds " + std::to_string(copy.buffer->size()) +
                                                      " bytes; the source holds " + std::to_string(g.size));
      }
      add_check("copy_size_matches_source", g.name, std::to_string(g.size) + " bytes, re-read from DEST");
      if (copy.sha256 != g.sha256) {
        fail(ErrorCode::sha256_mismatch,
             label + " has SHA-256 " + copy.sha256.hex() + "; the source's is " + g.sha256.hex());
      }
      add_check("copy_sha256_matches_source", g.name, g.sha256.hex() + ", re-read from DEST");
      const io::Snapshot sidecar = destination_checkpoints_->read(g.name + ".sha256", 4096);
      const auto sidecar_bytes = sidecar.buffer->bytes();
      if (std::string(reinterpret_cast<const char*>(sidecar_bytes.data()), sidecar_bytes.size()) !=
          sha256_sidecar_line(g.sha256, g.name)) {
        fail(ErrorCode::sidecar_invalid, label + ".sha256 does not read back as written");
      }
      add_check("sidecar_matches", g.name + ".sha256", "'<sha256>  " + g.name + "', the line sha256sum -c checks");
      if (const auto it = sharded_.find(g.name); it != sharded_.end()) verify_shard_copies(g, it->second, limits);
    }

    // DEST as a run directory, inspected without recovery: it must need none.
    RunDirectoryOptions options;
    options.create = false;
    options.recover = false;
    const RunDirectory exported(destination_, options);
    const RecoveryReport& report = exported.recovery();
    if (!report.clean()) {
      std::string findings;
      for (const auto& line : report.lines()) findings += "\n  " + line;
      fail(recovery_problem_code(report).value_or(ErrorCode::export_destination_invalid),
           destination_ + " would need recovery after the export (was it written to concurrently?):" + findings);
    }
    const auto latest = exported.latest();
    if (!latest || latest->name != latest_.name || latest->sha256 != latest_.sha256) {
      fail(ErrorCode::run_pointer_invalid, destination_ + ": LATEST does not name " + latest_.name);
    }
    const auto best = exported.best();
    if (best_.has_value() != best.has_value() || (best && best->name != best_->name)) {
      fail(ErrorCode::run_pointer_invalid, destination_ + ": BEST does not name the exported BEST");
    }
    std::vector<std::string> names;
    for (const auto& g : exported.generations()) names.push_back(g.name);
    std::vector<std::string> expected;
    for (const auto& g : selected_) expected.push_back(g.name);
    if (names != expected) fail(ErrorCode::run_index_invalid, destination_ + " lists other generations than were exported");
    add_check("destination_opens_clean", destination_,
              "RunDirectory(DEST, {.recover = false}) finds nothing to recover; LATEST " + latest_.name +
                  (best_ ? ", BEST " + best_->name : std::string()) + ", " + std::to_string(names.size()) +
                  (names.size() == 1 ? " generation" : " generations"));

    // The recovery itself: load LATEST back from DEST through the restricted reader.
    const LoadedMapping mapping = exported.load(*latest);
    if (mapping.sha256 != latest_.sha256) {
      fail(ErrorCode::sha256_mismatch, destination_ + ": the loaded " + latest_.name + " has another SHA-256");
    }
    const Manifest read = Manifest::of_root(mapping.root);
    recovered_ = {{"generation", latest->name},
                  {"step", latest->step},
                  {"epoch", latest->epoch},
                  {"sha256", latest_.sha256.hex()},
                  {"format", std::string(file_format_name(mapping.format))},
                  {"manifest_kind", std::string(checkpoint_kind_name(read.kind))},
                  {"uses_binfloat", mapping.markers.uses_binfloat}};
    add_check("load_back", latest->name,
              "RunDirectory(DEST).load() read it against its SHA-256 and parsed it with the restricted reader; step " +
                  std::to_string(latest->step));
    add_check("manifest_reads", latest->name, "the 'holdpoint' manifest reads (kind " +
                                                  std::string(checkpoint_kind_name(read.kind)) + ")");
    if (read.kind == CheckpointKind::sharded) {
      // A sharded LATEST is recovered only with every shard: read it whole from DEST.
      ShardedReadOptions options;
      options.expected_sha256 = latest_.sha256;
      const ShardedCheckpoint sharded = read_sharded_checkpoint(*destination_checkpoints_, latest_.name, options);
      const Value view = sharded.combined_view();
      recovered_["world_size"] = sharded.sharding().world_size;
      nlohmann::ordered_json shards = nlohmann::ordered_json::array();
      for (const ShardRecord& record : sharded.sharding().shards) {
        shards.push_back({{"name", shard_directory_name(sharded.sharding().step) + "/" + shard_file_name(record.rank)},
                          {"rank", record.rank},
                          {"size", record.size},
                          {"sha256", record.sha256.hex()}});
      }
      recovered_["shards"] = std::move(shards);
      add_check("sharded_load_back", latest->name,
                "read_sharded_checkpoint(DEST) read the step manifest and all " +
                    std::to_string(sharded.sharding().world_size) +
                    " shards (sizes, SHA-256, identity, component digests) and merged " +
                    std::to_string(view.as_dict().size()) + " components");
    }
  }

  void verify_shard_copies(const GenerationInfo& g, const Sharding& sharding, const Limits& limits) {
    const std::string directory = shard_directory_name(sharding.step);
    const auto shards = destination_checkpoints_->open_subdirectory(directory, false);
    for (const ShardRecord& record : sharding.shards) {
      const std::string name = shard_file_name(record.rank);
      const std::string label = destination_ + "/checkpoints/" + directory + "/" + name;
      const io::Snapshot copy =
          shards->read(name, limits.max_file_bytes, std::nullopt, progress_for("verifying " + label));
      if (copy.buffer->size() != record.size) {
        fail(ErrorCode::shard_size_mismatch, label + " holds " + std::to_string(copy.buffer->size()) +
                                                 " bytes; the step manifest records " + std::to_string(record.size));
      }
      if (copy.sha256 != record.sha256) {
        fail(ErrorCode::shard_digest_mismatch,
             label + " has SHA-256 " + copy.sha256.hex() + "; the step manifest records " + record.sha256.hex());
      }
    }
    add_check("shard_copies_match", g.name,
              std::to_string(sharding.world_size) + " shards in " + directory +
                  "/ re-read from DEST: sizes and SHA-256 as the step manifest records");
  }

  void add_check(std::string check, std::string subject, std::string detail) {
    checks_.push_back({std::move(check), std::move(subject), std::move(detail)});
  }

  static std::string pointer_text(const GenerationInfo& g) { return run_pointer_text(g); }

  std::string index_text() const { return run_index_text(selected_); }

  nlohmann::ordered_json proof_json() {
    nlohmann::ordered_json proof;
    proof["schema"] = kProofSchema;
    proof["schema_version"] = kProofSchemaVersion;
    proof["command"] = options_.command_line;
    proof["created_at"] = created_at_;
    proof["holdpoint_version"] = HOLDPOINT_VERSION;
    proof["source"] = {{"run", std::filesystem::absolute(run_).lexically_normal().string()},
                       {"latest", source_latest_ ? nlohmann::ordered_json(source_latest_->name) : nullptr},
                       {"best", source_best_ ? nlohmann::ordered_json(source_best_->name) : nullptr}};
    proof["destination"] = std::filesystem::absolute(destination_).lexically_normal().string();
    proof["selection"] = export_selection_name(selection_);
    nlohmann::ordered_json generations = nlohmann::ordered_json::array();
    for (const auto& g : selected_) generations.push_back(nlohmann::ordered_json::parse(to_json(g)));
    proof["generations"] = std::move(generations);
    nlohmann::ordered_json skipped = nlohmann::ordered_json::array();
    for (const auto& check : skipped_) skipped.push_back(nlohmann::ordered_json::parse(to_json(check)));
    proof["skipped"] = std::move(skipped);
    proof["pointers"] = {{"LATEST", latest_.name}, {"BEST", best_ ? nlohmann::ordered_json(best_->name) : nullptr}};
    proof["recovered"] = recovered_;
    nlohmann::ordered_json checks = nlohmann::ordered_json::array();
    for (const auto& c : checks_) checks.push_back({{"check", c.check}, {"subject", c.subject}, {"detail", c.detail}});
    proof["checks"] = std::move(checks);
    return proof;
  }

  std::string loading_text() const {
    const std::string latest_file = "checkpoints/" + latest_.name;
    std::ostringstream out;
    out << "# Loading this export\n\n"
        << "`holdpoint export` copied " << selected_.size() << " generation" << (selected_.size() == 1 ? "" : "s")
        << " (`--" << export_selection_name(selection_) << "`) of the run directory `"
        << std::filesystem::absolute(run_).lexically_normal().string() << "` here on " << created_at_
        << ".\nThis directory is itself a holdpoint run directory: `checkpoints/step-NNNNNNNN.pt`, each with a\n"
        << "`sha256sum` sidecar, `index.json`, `LATEST`" << (best_ ? " and `BEST`" : "") << ".\n\n"
        << "| generation | step | epoch | bytes | SHA-256 |\n| --- | --- | --- | --- | --- |\n";
    for (const auto& g : selected_) {
      out << "| `" << g.name << "`" << (g.name == latest_.name ? " (LATEST)" : "")
          << (best_ && g.name == best_->name ? " (BEST)" : "") << " | " << g.step << " | " << g.epoch << " | " << g.size
          << " | `" << g.sha256.hex() << "` |\n";
    }
    if (!sharded_.empty()) {
      out << "\nSharded generations (written by several ranks; docs/distributed.md): their `.pt` is the step\n"
          << "manifest, which holds no state but records each shard's size and SHA-256; the state is in\n"
          << "`checkpoints/step-NNNNNNNN.shards/rank-NNNNN.pt`, one file per rank:\n\n";
      for (const auto& [name, sharding] : sharded_) {
        out << "- `" << name << "`: world size " << sharding.world_size << ", shards in `checkpoints/"
            << shard_directory_name(sharding.step) << "/`\n";
      }
      out << "\nShards have no sidecars: `holdpoint verify checkpoints/step-NNNNNNNN.pt` checks every shard\n"
          << "against its step manifest. Load them with `DistributedCheckpointer` (every rank) or\n"
          << "`holdpoint::read_sharded_checkpoint` (holdpoint/run/sharded_checkpoint.h); `torch.load` of a step\n"
          << "manifest returns only the manifest.\n";
    }
    out << "\n## Check the files\n\n"
        << "```sh\ncd checkpoints && sha256sum -c *.sha256\nholdpoint verify .   # from this directory: every generation, LATEST and BEST\n```\n\n"
        << "A sidecar beside its file detects corruption, not tampering: compare the digests above\n"
        << "with RECOVERY-PROOF.json kept somewhere the files' sender does not control.\n\n"
        << "## C++ (holdpoint)\n\n"
        << "```cpp\n// Resume a training state (TrainingState, LibTorch build), digest checked first:\n"
        << "state.load_checkpoint(\"" << latest_file << "\", {.expected_sha256 = \"" << latest_.sha256.hex()
        << "\"});\n\n"
        << "// Or open the export as a run directory; recover = false changes nothing:\n"
        << "holdpoint::RunDirectory run(\"EXPORT_DIR\", {.create = false, .recover = false});\n"
        << "holdpoint::LoadedMapping mapping = run.load(*run.latest());  // restricted reader, digest checked\n```\n\n"
        << "## Python\n\n"
        << "```python\nimport torch\nstate = torch.load(\"" << latest_file << "\", weights_only=True)\n```\n\n"
        << "torch 1.13's `weights_only` loader reads files saved torch-1.13-compatible\n"
        << "(`SaveOptions::torch_1_13_compatible`: no `BINFLOAT`); torch 2.x reads either (docs/format.md §6.1). "
        << "`" << latest_.name << "` " << (recovered_.value("uses_binfloat", false) ? "uses" : "does not use")
        << " `BINFLOAT`.\n\n"
        << "## Recovery proof\n\n"
        << "Written by `" << join_command() << "`. After copying, the export re-read every file at\n"
        << "the destination and loaded `" << latest_.name << "` (step " << latest_.step
        << ") back from it. Checks passed:\n\n";
    for (const auto& c : checks_) out << "- `" << c.check << "` " << c.subject << ": " << c.detail << "\n";
    if (!skipped_.empty()) {
      out << "\nNot exported, because they do not verify in the source run:\n\n";
      for (const auto& check : skipped_) out << "- `" << check.name << "`: " << to_text(check) << "\n";
    }
    out << "\n`" << kExportProofFile << "` holds the same in JSON; it is written last, so an export\n"
        << "directory without it is incomplete.\n";
    return out.str();
  }

  std::string join_command() const {
    std::string out;
    for (const auto& arg : options_.command_line) out += (out.empty() ? "" : " ") + arg;
    return out;
  }

  const std::string run_;
  const std::string destination_;
  const ExportOptions& options_;
  const ExportSelection selection_;
  bool source_unopened_ = false;
  bool destination_touched_ = false;
  std::string created_at_ = detail::utc_timestamp();
  std::optional<GenerationInfo> source_latest_;
  std::optional<GenerationInfo> source_best_;
  std::vector<GenerationInfo> selected_;
  std::vector<GenerationCheck> skipped_;
  GenerationInfo latest_;
  std::optional<GenerationInfo> best_;
  std::unique_ptr<io::Directory> destination_root_;
  std::unique_ptr<io::Directory> destination_checkpoints_;
  std::vector<ProofCheck> checks_;
  std::map<std::string, Sharding> sharded_;  // copied sharded generations, by name
  nlohmann::ordered_json recovered_ = nlohmann::ordered_json::object();
};

}  // namespace

std::string_view export_selection_name(ExportSelection selection) noexcept {
  switch (selection) {
    case ExportSelection::latest: return "latest";
    case ExportSelection::best: return "best";
    case ExportSelection::all: return "all";
  }
  return "latest";
}

ExportResult export_run(const std::filesystem::path& run, const std::filesystem::path& destination,
                        const ExportOptions& options) {
  return Exporter(run, destination, options).run();
}

}  // namespace holdpoint
