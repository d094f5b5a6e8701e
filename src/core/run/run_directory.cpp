#include "holdpoint/run/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/fail.h"
#include "base/utc_time.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/base/file_system.h"
#include "base/publish.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

constexpr std::string_view kSidecarSuffix = ".sha256";
constexpr std::string_view kDamagedSuffix = ".damaged";
constexpr std::string_view kLockFile = ".holdpoint-lock";

// Failures that say nothing about a file's content: it could not be read
// here (I/O), it is beyond this build's limits, or a newer holdpoint wrote it.
// Recovery stops on these instead of falling back past a good generation.
bool unreadable_here(ErrorCode code) {
  const std::string_view name = error_code_name(code);
  if (code == ErrorCode::io_not_regular_file) return false;
  return name.starts_with("io_") || name.ends_with("_limit") || name.ends_with("too_large") ||
         code == ErrorCode::schema_version_unsupported;
}
constexpr std::uint64_t kMaxSmallFile = 64ull << 20;  // pointers, sidecars, index
constexpr std::string_view kIndexSchema = "holdpoint.run-index";
constexpr std::int64_t kIndexSchemaVersion = 1;

std::string sidecar_name(const std::string& generation) { return generation + std::string(kSidecarSuffix); }


std::string pointer_text(const GenerationInfo& g) { return run_pointer_text(g); }
std::string sidecar_text(const GenerationInfo& g) { return concat(g.sha256.hex(), "  ", g.name, "\n"); }

std::string text_of(const io::Snapshot& snapshot) {
  const auto bytes = snapshot.buffer->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// "<name> <64 hex>\n"
std::pair<std::string, Sha256Digest> parse_pointer(const std::string& text, std::string_view which) {
  const auto space = text.find(' ');
  if (text.empty() || text.back() != '\n' || space == std::string::npos) {
    fail(ErrorCode::run_pointer_invalid, which, " is not '<generation> <sha256>\\n'");
  }
  std::string name = text.substr(0, space);
  const std::string hex = text.substr(space + 1, text.size() - space - 2);
  if (!parse_generation_name(name)) fail(ErrorCode::run_pointer_invalid, which, " names '", name, "', not a generation");
  const auto digest = Sha256Digest::from_hex(hex);
  if (!digest || hex != digest->hex()) fail(ErrorCode::run_pointer_invalid, which, " has no lowercase SHA-256 digest");
  return {std::move(name), *digest};
}

// sha256sum's format: "<64 hex>  <name>\n".
Sha256Digest parse_sidecar(const std::string& text, const std::string& name) {
  const std::string expected_tail = concat("  ", name, "\n");
  if (text.size() != 64 + expected_tail.size() || text.compare(64, std::string::npos, expected_tail) != 0) {
    fail(ErrorCode::run_sidecar_invalid, sidecar_name(name), " is not '<sha256>  ", name, "\\n'");
  }
  const auto digest = Sha256Digest::from_hex(std::string_view(text).substr(0, 64));
  if (!digest || text.substr(0, 64) != digest->hex()) {
    fail(ErrorCode::run_sidecar_invalid, sidecar_name(name), " has no lowercase SHA-256 digest");
  }
  return *digest;
}

nlohmann::json index_json(const std::map<std::int64_t, GenerationInfo>& generations) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [step, g] : generations) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [name, value] : g.metrics) {
      if (std::isfinite(value)) metrics[name] = value;
    }
    list.push_back({{"name", g.name},
                    {"step", g.step},
                    {"epoch", g.epoch},
                    {"kind", g.kind},
                    {"size", g.size},
                    {"sha256", g.sha256.hex()},
                    {"saved_at", g.saved_at},
                    {"metrics", std::move(metrics)}});
    if (g.world_size > 0) list.back()["world_size"] = g.world_size;
  }
  return {{"schema", kIndexSchema}, {"schema_version", kIndexSchemaVersion}, {"generations", std::move(list)}};
}

std::string index_text(const std::map<std::int64_t, GenerationInfo>& generations) {
  return index_json(generations).dump(1) + "\n";
}

std::map<std::string, GenerationInfo> parse_index(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) fail(ErrorCode::run_index_invalid, "index.json is not a JSON object");
  // Not json.value("schema", ""): it throws nlohmann's type_error when schema is not a string.
  if (!json.contains("schema") || !json["schema"].is_string() || json["schema"].get<std::string>() != kIndexSchema) {
    fail(ErrorCode::run_index_invalid, "index.json: schema is not '", kIndexSchema, "'");
  }
  if (!json.contains("schema_version") || !json["schema_version"].is_number_integer() ||
      json["schema_version"].get<std::int64_t>() != kIndexSchemaVersion) {
    fail(ErrorCode::run_index_invalid, "index.json: schema_version is not ", kIndexSchemaVersion);
  }
  if (!json.contains("generations") || !json["generations"].is_array()) {
    fail(ErrorCode::run_index_invalid, "index.json: 'generations' is not an array");
  }
  std::map<std::string, GenerationInfo> out;
  std::size_t position = 0;
  for (const auto& entry : json["generations"]) {
    const auto where = concat("index.json: generations[", position++, "]");
    if (!entry.is_object()) fail(ErrorCode::run_index_invalid, where, " is not an object");
    const auto field = [&](const char* key, auto check, const char* type) -> const nlohmann::json& {
      if (!entry.contains(key) || !check(entry[key])) fail(ErrorCode::run_index_invalid, where, ".", key, " is not ", type);
      return entry[key];
    };
    const auto is_string = [](const nlohmann::json& j) { return j.is_string(); };
    const auto is_int = [](const nlohmann::json& j) { return j.is_number_integer(); };
    const auto is_uint = [](const nlohmann::json& j) { return j.is_number_unsigned(); };
    GenerationInfo g;
    g.name = field("name", is_string, "a string").get<std::string>();
    g.step = field("step", is_int, "an integer").get<std::int64_t>();
    g.epoch = field("epoch", is_int, "an integer").get<std::int64_t>();
    g.kind = field("kind", is_string, "a string").get<std::string>();
    g.size = field("size", is_uint, "an unsigned integer").get<std::uint64_t>();
    g.saved_at = field("saved_at", is_string, "a string").get<std::string>();
    const auto digest = Sha256Digest::from_hex(field("sha256", is_string, "a string").get<std::string>());
    if (!digest) fail(ErrorCode::run_index_invalid, where, ".sha256 is not a SHA-256 digest");
    g.sha256 = *digest;
    const auto& metrics = field("metrics", [](const nlohmann::json& j) { return j.is_object(); }, "an object");
    for (const auto& [name, value] : metrics.items()) {
      if (!value.is_number()) fail(ErrorCode::run_index_invalid, where, ".metrics.", name, " is not a number");
      g.metrics.emplace_back(name, value.get<double>());
    }
    if (entry.contains("world_size")) {
      const auto& world = entry["world_size"];
      if (!world.is_number_integer() || world.get<std::int64_t>() < 1) {
        fail(ErrorCode::run_index_invalid, where, ".world_size is not a positive integer");
      }
      g.world_size = world.get<std::int64_t>();
    }
    if (parse_generation_name(g.name) != g.step) {
      fail(ErrorCode::run_index_invalid, where, ": name '", g.name, "' does not match step ", g.step);
    }
    if (!out.emplace(g.name, g).second) fail(ErrorCode::run_index_invalid, where, ": '", g.name, "' is listed twice");
  }
  return out;
}

bool better(double candidate, double incumbent, const BestMetric& metric) {
  return metric.higher_is_better ? candidate > incumbent : candidate < incumbent;
}

}  // namespace

// ---- names -----------------------------------------------------------------------------

std::string generation_name(std::int64_t step) {
  if (step < 0) fail(ErrorCode::invalid_argument, "a generation's step must not be negative (got ", step, ")");
  std::string digits = std::to_string(step);
  if (digits.size() < 8) digits.insert(0, 8 - digits.size(), '0');
  return concat("step-", digits, ".pt");
}

std::optional<std::int64_t> parse_generation_name(std::string_view name) noexcept {
  constexpr std::string_view prefix = "step-", suffix = ".pt";
  if (name.size() < prefix.size() + 8 + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix)) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  // Digits only: from_chars would take "-0000000" as step 0, a second spelling.
  if (digits.size() > 19 || digits.front() < '0' || digits.front() > '9') return std::nullopt;
  std::int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  // One spelling per step: exactly what generation_name writes.
  if (digits.size() > 8 && digits.front() == '0') return std::nullopt;
  return step;
}

std::string run_pointer_text(const GenerationInfo& generation) {
  return concat(generation.name, " ", generation.sha256.hex(), "\n");
}

std::string run_index_text(const std::vector<GenerationInfo>& generations) {
  std::map<std::int64_t, GenerationInfo> by_step;
  for (const auto& g : generations) by_step.emplace(g.step, g);
  return index_json(by_step).dump(1) + "\n";
}

std::optional<double> GenerationInfo::metric(std::string_view metric_name) const {
  for (const auto& [name, value] : metrics) {
    if (name == metric_name) return value;
  }
  return std::nullopt;
}

bool RecoveryReport::clean() const noexcept {
  return removed_staging.empty() && removed_uncommitted.empty() && damaged.empty() && adopted.empty() &&
         removed_orphan_sidecars.empty() &&
         dropped_from_index.empty() && !latest_problem && !best_problem && !index_problem;
}

std::optional<std::string> RecoveryReport::lost_generations() const {
  if (damaged.empty() && previously_quarantined.empty() && dropped_from_index.empty() &&
      !(latest_problem && *latest_problem != "missing")) {
    return std::nullopt;
  }
  return concat(damaged.size() + previously_quarantined.size(), " damaged generations moved aside as *.damaged, ",
                dropped_from_index.size(), " indexed generations missing",
                latest_problem ? ", LATEST " + *latest_problem : std::string());
}

std::vector<std::string> RecoveryReport::lines() const {
  const std::string verb = read_only ? "would remove" : "removed";
  std::vector<std::string> out;
  for (const auto& name : removed_staging) out.push_back(concat(verb, " stale staging file ", name));
  for (const auto& name : removed_uncommitted) {
    out.push_back(name.ends_with("/") ? concat(verb, " shard directory ", name, " (no committed step manifest)")
                                      : concat(verb, " uncommitted generation ", name, " (newer than LATEST)"));
  }
  for (const auto& check : damaged) {
    out.push_back(concat("generation ", check.name, " does not verify (",
                         check.code ? error_code_name(*check.code) : "unknown", "): ", check.detail));
  }
  for (const auto& name : quarantined) out.push_back(concat(read_only ? "would move" : "moved", " a damaged generation aside as ", name));
  for (const auto& name : previously_quarantined) out.push_back(concat("damaged generation kept aside from before: ", name));
  for (const auto& name : removed_orphan_sidecars) out.push_back(concat(verb, " orphaned sidecar ", name));
  for (const auto& name : adopted) out.push_back(concat("adopted ", name, " (missing from index.json; verified)"));
  for (const auto& name : dropped_from_index) out.push_back(concat("index.json listed ", name, ", which is not on disk"));
  if (index_problem) out.push_back(concat("index.json: ", *index_problem));
  if (latest_problem) out.push_back(concat("LATEST: ", *latest_problem));
  if (best_problem) out.push_back(concat("BEST: ", *best_problem));
  const std::string rewrote = read_only ? "would rewrite" : "rewrote";
  if (latest_rewritten) out.push_back(concat(rewrote, " LATEST -> ", latest.value_or("(none)")));
  if (best_rewritten) out.push_back(concat(rewrote, " BEST"));
  if (index_rewritten) out.push_back(concat(rewrote, " index.json"));
  return out;
}

void verify_generation_bytes(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner,
                             const Limits& limits) {
  Manifest::of_root(parse_checkpoint_bytes(bytes, owner, limits).root);
}

// ---- RunDirectory ------------------------------------------------------------------------

struct RunDirectory::Impl {
  std::filesystem::path path;
  RunDirectoryOptions options;
  io::FileSystem* fs = nullptr;
  std::unique_ptr<io::Directory> root;
  std::unique_ptr<io::Directory> checkpoints;  // null while the run has none
  std::map<std::int64_t, GenerationInfo> committed;
  std::optional<std::int64_t> latest;
  std::optional<std::int64_t> best;
  RecoveryReport report;
  bool failed = false;
  int lock_fd = -1;
  std::optional<std::pair<std::string, Sha256Digest>> latest_pointer;  // as read on open
  std::optional<Error> latest_pointer_error;
  std::set<std::string> pending_adoption;  // generation files not yet read (newer than LATEST's)
  std::map<std::int64_t, std::string> shard_directories;  // found on open

  void log(const std::string& line) const {
    if (options.log) options.log(line);
  }

  [[noreturn]] void rethrow_with_run(const Error& error) const {
    throw Error(error.code(), concat(path.string(), ": ", error.detail())).with_path(error.path());
  }

  io::Directory& checkpoints_dir() {
    if (!checkpoints) checkpoints = root->open_subdirectory(std::string(kCheckpointsDirectory), true);
    return *checkpoints;
  }

  std::optional<std::string> read_small(io::Directory& dir, const std::string& name) const {
    const auto info = dir.stat(name);
    if (!info) return std::nullopt;
    return text_of(dir.read(name, kMaxSmallFile));
  }

  io::PublishOptions publish_options(bool replace) const {
    io::PublishOptions o;
    o.replace = replace;
    o.durable = options.durable;
    o.max_bytes = kMaxSmallFile;
    return o;
  }

  void write_index() {
    io::publish_text(*root, std::string(kRunIndex), index_text(committed), publish_options(true));
  }

  void write_pointer(std::string_view which, const GenerationInfo& g) {
    io::publish_text(*root, std::string(which), pointer_text(g), publish_options(true));
  }

  void verify_bytes(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) const {
    verify_generation_bytes(bytes, owner, options.limits);
  }

  // verify_bytes, and for a step manifest every shard it names.
  // Returns the ranks of a sharded generation (0 for a single file).
  std::int64_t verify_content(const GenerationInfo& g, std::span<std::byte> bytes,
                              const std::shared_ptr<const void>& owner) const {
    const LoadedMapping mapping = parse_checkpoint_bytes(bytes, owner, options.limits);
    const Manifest manifest = Manifest::of_root(mapping.root);
    if (manifest.kind != CheckpointKind::sharded) return 0;
    require_manifest_only(mapping.root, concat("checkpoints/", g.name));
    if (manifest.sharding->step != g.step) {
      fail(ErrorCode::shard_identity_mismatch, "checkpoints/", g.name, " is the step manifest of step ",
           manifest.sharding->step, ", not of step ", g.step);
    }
    verify_shards(*checkpoints, manifest, options.limits);
    return manifest.sharding->world_size;
  }

  // Removes checkpoints/<name>/ and the files in it (shard directories hold
  // only shard and staging files).
  void remove_tree(const std::string& name) { remove_tree(*checkpoints, name); }
  // Subdirectories are descended (a stray one must not block recovery);
  // symlinks are unlinked, never followed.
  static void remove_tree(io::Directory& parent, const std::string& name) {
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

  // Full verification of a recorded generation: sidecar, size, SHA-256,
  // bounded parse, manifest. Failures of the content come back as a failed
  // check; failures to read it at all (I/O, limits, a newer schema) are
  // thrown when `unreadable_throws`, so recovery never falls back over them.
  GenerationCheck check(const GenerationInfo& g, bool unreadable_throws) const {
    GenerationCheck result;
    result.name = g.name;
    try {
      if (!checkpoints) fail(ErrorCode::run_generation_missing, "there is no checkpoints/ directory");
      const auto info = checkpoints->stat(g.name);
      if (!info) fail(ErrorCode::run_generation_missing, "checkpoints/", g.name, " is not on disk");
      if (info->type != io::FileInfo::Type::regular) {
        fail(ErrorCode::io_not_regular_file, "checkpoints/", g.name, " is not a regular file (never followed)");
      }
      if (const auto sidecar = read_small(*checkpoints, sidecar_name(g.name))) {
        if (parse_sidecar(*sidecar, g.name) != g.sha256) {
          fail(ErrorCode::sha256_mismatch, "the sidecar's digest differs from the recorded one ", g.sha256.hex());
        }
      }
      const io::Snapshot snapshot = checkpoints->read(g.name, options.limits.max_file_bytes, g.sha256);
      if (g.size != 0 && snapshot.buffer->size() != g.size) {
        fail(ErrorCode::file_changed_during_read, "checkpoints/", g.name, " holds ", snapshot.buffer->size(),
             " bytes; ", g.size, " were recorded");
      }
      verify_content(g, snapshot.buffer->bytes(), snapshot.buffer);
      result.ok = true;
    } catch (const Error& error) {
      if (unreadable_throws && unreadable_here(error.code())) {
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

  // A generation file the index does not list: read whole, digest computed,
  // verified; its sidecar, if any, must agree.
  GenerationCheck adopt(GenerationInfo& g) const {
    GenerationCheck result;
    result.name = g.name;
    try {
      std::optional<Sha256Digest> sidecar_digest;
      if (const auto sidecar = read_small(*checkpoints, sidecar_name(g.name))) sidecar_digest = parse_sidecar(*sidecar, g.name);
      const io::Snapshot snapshot = checkpoints->read(g.name, options.limits.max_file_bytes);
      g.sha256 = snapshot.sha256;
      g.size = snapshot.buffer->size();
      if (sidecar_digest && *sidecar_digest != g.sha256) {
        fail(ErrorCode::sha256_mismatch, "checkpoints/", g.name, " hashes to ", g.sha256.hex(), "; its sidecar says ",
             sidecar_digest->hex());
      }
      g.world_size = verify_content(g, snapshot.buffer->bytes(), snapshot.buffer);
      result.ok = true;
    } catch (const Error& error) {
      if (unreadable_here(error.code())) {
        throw Error(ErrorCode::run_generation_unreadable,
                    concat("checkpoints/", g.name, " could not be checked (", error_code_name(error.code()), ": ",
                           error.detail(), ")"))
            .with_path(error.path());
      }
      result.code = error.code();
      result.detail = error.what();
    }
    return result;
  }

  // Moves a damaged generation (and its sidecar) aside under a name that is
  // not a generation's, so nothing here deletes or re-adopts it.
  void quarantine(const std::string& name) {
    // A sharded generation's shards go aside with it, under the same suffix.
    const auto step = parse_generation_name(name);
    const std::string shards = step ? shard_directory_name(*step) : std::string();
    const auto shards_info = step ? checkpoints->stat(shards) : std::nullopt;
    const bool move_shards = shards_info && shards_info->type == io::FileInfo::Type::directory;
    std::string aside = name + std::string(kDamagedSuffix);
    const auto taken = [&](const std::string& candidate) {
      return checkpoints->stat(candidate) || checkpoints->stat(candidate + std::string(kSidecarSuffix)) ||
             (move_shards && checkpoints->stat(shards + candidate.substr(name.size())));
    };
    for (int n = 2; taken(aside); ++n) aside = concat(name, kDamagedSuffix, "-", n);
    report.quarantined.push_back(aside);
    const std::string shards_aside = shards + aside.substr(name.size());
    if (move_shards) report.quarantined.push_back(shards_aside);
    if (!options.recover) return;
    checkpoints->rename(name, aside, false);
    if (checkpoints->stat(sidecar_name(name))) checkpoints->rename(sidecar_name(name), aside + std::string(kSidecarSuffix), false);
    if (move_shards) checkpoints->rename(shards, shards_aside, false);
  }

  void lock();
  void open();
  void recover_pointers(std::map<std::int64_t, GenerationInfo>& present, const std::map<std::string, GenerationInfo>& indexed);
  ~Impl();
};

void RunDirectory::Impl::lock() {
  // Two writers would remove each other's staging files and uncommitted
  // generations; an advisory lock keeps them apart (POSIX file system only:
  // the test double has no other processes).
  if ((options.file_system && options.file_system != &io::posix_file_system()) || !options.recover) return;
  const auto lock_path = path / std::string(kLockFile);
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
      fail(ErrorCode::run_directory_locked, "another process has it open for writing (", kLockFile,
           " is locked); open it read-only to inspect it");
    }
    throw Error(ErrorCode::io_open_failed, concat("cannot lock: ", std::strerror(error))).with_path(lock_path.string());
  }
}

RunDirectory::Impl::~Impl() {
  if (lock_fd >= 0) ::close(lock_fd);
}

void RunDirectory::Impl::open() {
  report.read_only = !options.recover;
  const bool mutate = options.recover;
  root = fs->open_directory(path, options.create && mutate);
  lock();

  // Stale staging files (a crash between create and rename) go first.
  for (const auto& name : root->list()) {
    if (io::is_staging_name(name)) {
      report.removed_staging.push_back(name);
      if (mutate) root->unlink(name);
    }
  }
  std::map<std::int64_t, GenerationInfo> present;
  std::set<std::string> sidecars;
  std::vector<std::string> not_regular;
  if (const auto info = root->stat(std::string(kCheckpointsDirectory))) {
    if (info->type != io::FileInfo::Type::directory) {
      fail(ErrorCode::run_directory_invalid, "checkpoints is not a directory (a symlink or a file)");
    }
    checkpoints = root->open_subdirectory(std::string(kCheckpointsDirectory), false);
    for (const auto& name : checkpoints->list()) {
      if (io::is_staging_name(name)) {
        report.removed_staging.push_back(concat(kCheckpointsDirectory, "/", name));
        if (mutate) checkpoints->unlink(name);
      } else if (const auto step = parse_generation_name(name)) {
        const auto stat = checkpoints->stat(name);
        if (!stat || stat->type != io::FileInfo::Type::regular) {
          not_regular.push_back(name);
          continue;
        }
        GenerationInfo g;
        g.name = name;
        g.step = *step;
        g.size = stat->size;
        present.emplace(*step, std::move(g));
      } else if (const auto shard_step = parse_shard_directory_name(name)) {
        shard_directories.emplace(*shard_step, name);
      } else if (name.ends_with(kSidecarSuffix) && parse_generation_name(name.substr(0, name.size() - kSidecarSuffix.size()))) {
        sidecars.insert(name);
      } else if (name.find(kDamagedSuffix) != std::string::npos &&
                 (parse_generation_name(name.substr(0, name.find(kDamagedSuffix))) ||
                  parse_shard_directory_name(name.substr(0, name.find(kDamagedSuffix))))) {
        if (!name.ends_with(kSidecarSuffix)) report.previously_quarantined.push_back(name);
      }
    }
    for (const auto& name : not_regular) {
      report.damaged.push_back({name, false, ErrorCode::io_not_regular_file, "not a regular file (never followed)"});
      quarantine(name);
    }
    // Sidecars whose generation is gone (a crash inside retention).
    for (const auto& name : sidecars) {
      const auto step = parse_generation_name(name.substr(0, name.size() - kSidecarSuffix.size()));
      if (!present.count(*step) && std::find(not_regular.begin(), not_regular.end(), name.substr(0, name.size() - kSidecarSuffix.size())) == not_regular.end()) {
        report.removed_orphan_sidecars.push_back(name);
        if (mutate) checkpoints->unlink(name);
      }
    }
    if (mutate && (!report.removed_staging.empty() || !report.removed_orphan_sidecars.empty() || !not_regular.empty())) {
      checkpoints->sync();
    }
  }
  if (mutate && !report.removed_staging.empty()) root->sync();

  // The index: metadata of the generations; a cache that recovery can rebuild.
  std::map<std::string, GenerationInfo> indexed;
  try {
    if (const auto text = read_small(*root, std::string(kRunIndex))) {
      indexed = parse_index(*text);
    } else if (!present.empty()) {
      report.index_problem = "missing";
    }
  } catch (const Error& error) {
    // A symlink in its place (ELOOP: io_open_failed) is a malformed index,
    // replaced by the rewrite, never followed.
    if (unreadable_here(error.code()) && error.code() != ErrorCode::io_open_failed) throw;
    report.index_problem = error.detail();
  }
  // Files newer than the generation LATEST names are removed unread if LATEST
  // verifies; they are adopted only if recovery has to fall back to them.
  // LATEST is read once here; recover_pointers judges it.
  try {
    if (const auto text = read_small(*root, std::string(kLatestPointer))) {
      latest_pointer = parse_pointer(*text, kLatestPointer);
    }
  } catch (const Error& error) {
    latest_pointer_error = error;
  }
  const std::optional<std::int64_t> pointer_step =
      latest_pointer ? parse_generation_name(latest_pointer->first) : std::nullopt;
  std::vector<std::string> bad;
  for (auto& [step, g] : present) {
    if (pointer_step && step > *pointer_step && !indexed.count(g.name)) {
      pending_adoption.insert(g.name);
      continue;
    }
    const auto it = indexed.find(g.name);
    if (it != indexed.end()) {
      const std::uint64_t size = g.size;
      g = it->second;
      if (size != g.size) {
        report.damaged.push_back({g.name, false, ErrorCode::file_changed_during_read,
                                  concat("holds ", size, " bytes; index.json records ", g.size)});
        bad.push_back(g.name);
      }
      continue;
    }
    // Not in the index: read, hash and verify it before adopting it.
    GenerationCheck check = adopt(g);
    if (check.ok) {
      report.adopted.push_back(g.name);
    } else {
      report.damaged.push_back(std::move(check));
      bad.push_back(g.name);
    }
  }
  for (const auto& [name, g] : indexed) {
    if (!present.count(g.step)) report.dropped_from_index.push_back(name);
  }
  for (const auto& name : bad) {
    present.erase(*parse_generation_name(name));
    quarantine(name);
  }
  recover_pointers(present, indexed);
}

void RunDirectory::Impl::recover_pointers(std::map<std::int64_t, GenerationInfo>& present,
                                          const std::map<std::string, GenerationInfo>& indexed) {
  const bool mutate = options.recover;
  // LATEST: verified in full, since resuming will trust it.
  const std::optional<std::pair<std::string, Sha256Digest>>& pointer = latest_pointer;
  if (latest_pointer_error) {
    const Error& error = *latest_pointer_error;
    if (unreadable_here(error.code()) && error.code() != ErrorCode::io_open_failed) throw error;
    report.latest_problem = error.detail();  // a symlink (ELOOP) is a malformed pointer, not an I/O failure
  } else if (!pointer && !present.empty()) {
    report.latest_problem = "missing";
  }
  const auto quarantine_failed = [&](std::map<std::int64_t, GenerationInfo>::iterator it, GenerationCheck check) {
    report.damaged.push_back(std::move(check));
    const std::string name = it->second.name;
    present.erase(it);
    quarantine(name);
  };
  if (pointer) {
    const auto step = *parse_generation_name(pointer->first);
    const auto it = present.find(step);
    if (it == present.end()) {
      report.latest_problem = concat("names ", pointer->first, ", which is not on disk");
    } else {
      GenerationInfo& g = it->second;
      GenerationCheck check = g.sha256 == pointer->second
                                  ? this->check(g, true)
                                  : GenerationCheck{g.name, false, ErrorCode::sha256_mismatch,
                                                    concat("LATEST records ", pointer->second.hex(), "; the file's "
                                                           "recorded digest is ", g.sha256.hex())};
      if (check.ok) {
        latest = step;
      } else {
        report.latest_problem = concat("names ", g.name, ", which does not verify");
        quarantine_failed(it, std::move(check));
      }
    }
  }
  if (latest) {
    // Newer files are an interrupted save's: LATEST never moved to them.
    for (auto it = present.upper_bound(*latest); it != present.end();) {
      report.removed_uncommitted.push_back(it->second.name);
      if (mutate) {
        checkpoints->unlink(it->second.name);
        if (checkpoints->stat(sidecar_name(it->second.name))) checkpoints->unlink(sidecar_name(it->second.name));
      }
      std::erase(report.adopted, it->second.name);
      it = present.erase(it);
    }
  } else {
    // No usable LATEST: the newest generation that verifies becomes it.
    while (!present.empty()) {
      auto it = std::prev(present.end());
      const bool unadopted = pending_adoption.erase(it->second.name) > 0;
      GenerationCheck check = unadopted ? adopt(it->second) : this->check(it->second, true);
      if (unadopted && check.ok) report.adopted.push_back(it->second.name);
      if (check.ok) {
        latest = it->first;
        break;
      }
      quarantine_failed(it, std::move(check));
    }
    if (latest) report.latest_rewritten = true;
    // Older files that were left unread when LATEST looked usable.
    for (auto it = present.begin(); it != present.end();) {
      if (!pending_adoption.erase(it->second.name)) {
        ++it;
        continue;
      }
      GenerationCheck check = adopt(it->second);
      if (check.ok) {
        report.adopted.push_back(it->second.name);
        ++it;
      } else {
        const auto next = std::next(it);
        quarantine_failed(it, std::move(check));
        it = next;
      }
    }
  }
  if (mutate && checkpoints && (!report.removed_uncommitted.empty() || !report.quarantined.empty())) {
    checkpoints->sync();
  }
  committed = std::move(present);
  // Shard directories without a committed step manifest: an interrupted
  // sharded save (or retention interrupted after the manifest went).
  bool removed_shards = false;
  for (const auto& [step, name] : shard_directories) {
    if (committed.count(step)) continue;
    const std::string manifest = generation_name(step);
    if (std::any_of(report.quarantined.begin(), report.quarantined.end(),
                    [&](const std::string& q) { return q.starts_with(manifest); })) {
      continue;  // moved aside with its damaged manifest
    }
    const auto info = checkpoints->stat(name);
    if (!info) continue;  // quarantined with its manifest
    if (info->type != io::FileInfo::Type::directory) continue;  // not ours to follow or delete
    report.removed_uncommitted.push_back(name + "/");
    if (mutate) {
      remove_tree(name);
      removed_shards = true;
    }
  }
  if (removed_shards) checkpoints->sync();
  report.index_rewritten = (report.index_problem && !committed.empty()) || !report.adopted.empty() ||
                           !report.dropped_from_index.empty() || !report.damaged.empty() ||
                           std::any_of(report.removed_uncommitted.begin(), report.removed_uncommitted.end(),
                                       [](const std::string& n) { return !n.ends_with("/"); });
  if (latest) report.latest = committed.at(*latest).name;

  // BEST: must name a committed generation with the same digest.
  try {
    if (const auto text = read_small(*root, std::string(kBestPointer))) {
      const auto [name, digest] = parse_pointer(*text, kBestPointer);
      const auto it = committed.find(*parse_generation_name(name));
      if (it == committed.end()) {
        report.best_problem = concat("names ", name, ", which is not a committed generation");
      } else if (it->second.sha256 != digest) {
        report.best_problem = concat("names ", name, " with another digest");
      } else {
        best = it->first;
      }
    }
  } catch (const Error& error) {
    if (unreadable_here(error.code()) && error.code() != ErrorCode::io_open_failed) throw;
    report.best_problem = error.detail();
  }
  if (options.best_metric) {
    // The metric decides: a crash between LATEST and BEST leaves BEST behind
    // a better committed generation. A BEST whose generation has no recorded
    // metric (re-adopted without its index entry) is kept.
    std::optional<std::int64_t> ranked;
    for (const auto& [step, g] : committed) {
      const auto value = g.metric(options.best_metric->name);
      if (!value || !std::isfinite(*value)) continue;
      if (!ranked || better(*value, *committed.at(*ranked).metric(options.best_metric->name), *options.best_metric)) {
        ranked = step;
      }
    }
    const bool pointer_unranked = best && !committed.at(*best).metric(options.best_metric->name);
    if (ranked && ranked != best && !pointer_unranked) {
      if (best && !report.best_problem) {
        report.best_problem = concat("names ", committed.at(*best).name, ", but ", committed.at(*ranked).name,
                                     " has the better ", options.best_metric->name);
      } else if (!best && !report.best_problem) {
        report.best_problem = "missing";
      }
      best = ranked;
      report.best_rewritten = true;
    }
  }

  if (!mutate) return;
  if (report.index_rewritten) write_index();
  if (report.latest_rewritten) write_pointer(kLatestPointer, committed.at(*latest));
  if (report.best_rewritten) write_pointer(kBestPointer, committed.at(*best));
  if (report.best_problem && !best && root->stat(std::string(kBestPointer))) {
    // A BEST naming nothing usable, with no metric to rebuild it from, goes.
    root->unlink(std::string(kBestPointer));
    root->sync();
  }
}

RunDirectory::RunDirectory(const std::filesystem::path& path, RunDirectoryOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->options = std::move(options);
  impl_->fs = impl_->options.file_system ? impl_->options.file_system : &io::posix_file_system();
  try {
    impl_->open();
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

CommitResult RunDirectory::commit(const GenerationSpec& spec, const Writer& write, const Verifier& verify) {
  Impl& d = *impl_;
  if (d.report.read_only) fail(ErrorCode::invalid_argument, d.path.string(), " was opened read-only (recover = false)");
  CommitResult result;
  GenerationInfo& g = result.generation;
  g.name = generation_name(spec.step);
  g.step = spec.step;
  g.epoch = spec.epoch;
  g.kind = spec.kind;
  g.metrics = spec.metrics;
  g.world_size = spec.world_size;
  g.saved_at = detail::utc_timestamp();
  if (d.committed.count(spec.step)) {
    fail(ErrorCode::run_generation_exists, d.path.string(), ": step ", spec.step, " is already committed as ", g.name);
  }
  if (d.latest && spec.step < *d.latest) {
    fail(ErrorCode::run_step_not_increasing, d.path.string(), ": step ", spec.step, " is before LATEST's step ",
         *d.latest, "; generations after LATEST would read as uncommitted");
  }
  bool latest_moved = false;
  bool published = false;
  try {
    io::Directory& dir = d.checkpoints_dir();
    // A file under this name that is not committed is a failed earlier
    // attempt of this process: roll it back before publishing again.
    if (const auto existing = dir.stat(g.name)) {
      if (existing->type != io::FileInfo::Type::regular) {
        fail(ErrorCode::io_not_regular_file, "checkpoints/", g.name,
             " exists and is not a regular file (a symlink?); it is neither followed nor replaced");
      }
      dir.unlink(g.name);
    }
    io::PublishOptions generation_options;
    generation_options.replace = false;  // generations are never overwritten
    generation_options.durable = d.options.durable;
    generation_options.max_bytes = d.options.limits.max_file_bytes;
    const auto published_file =
        io::publish(dir, g.name, generation_options, write,
                    verify ? verify : Verifier([&d](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
                      d.verify_bytes(bytes, owner);
                    }));
    published = true;
    g.size = published_file.size;
    g.sha256 = published_file.sha256;
    io::publish_text(dir, sidecar_name(g.name), sidecar_text(g), d.publish_options(true));
    if (d.options.commit_observer) d.options.commit_observer("published");
    auto next = d.committed;
    next.emplace(g.step, g);
    io::publish_text(*d.root, std::string(kRunIndex), index_text(next), d.publish_options(true));
    // The commit point. If LATEST's publish fails after its rename (the
    // directory fsync), LATEST already names the new generation: it counts
    // as committed here, and the next open decides from what is durable.
    try {
      d.write_pointer(kLatestPointer, g);
    } catch (const Error&) {
      std::optional<std::string> now;
      try {
        now = d.read_small(*d.root, std::string(kLatestPointer));
      } catch (const Error&) {
      }
      if (now != pointer_text(g)) throw;  // LATEST did not move: roll back below
      latest_moved = true;
      d.committed = std::move(next);
      d.latest = g.step;
      d.report.latest = g.name;
      throw;
    }
    latest_moved = true;
    d.committed = std::move(next);
    d.latest = g.step;
    d.report.latest = g.name;

    if (d.options.best_metric) {
      const auto& metric = *d.options.best_metric;
      const auto value = g.metric(metric.name);
      // A BEST without a recorded metric (re-adopted) stays, as recovery keeps it.
      const auto incumbent = d.best ? d.committed.at(*d.best).metric(metric.name) : std::nullopt;
      if (value && std::isfinite(*value) && (!d.best || (incumbent && better(*value, *incumbent, metric)))) {
        d.write_pointer(kBestPointer, g);
        d.best = g.step;
        result.became_best = true;
      }
    }
  } catch (const Error& error) {
    d.failed = true;
    if (!latest_moved && published) {
      // Roll back the uncommitted file, so it is never mistaken for a
      // committed one (recovery would remove it anyway).
      try {
        io::Directory& dir = d.checkpoints_dir();
        if (dir.stat(sidecar_name(g.name))) dir.unlink(sidecar_name(g.name));
        dir.unlink(g.name);
      } catch (const Error&) {
      }
    }
    if (latest_moved) {
      throw Error(error.code(), concat(d.path.string(), ": ", g.name, " is committed (LATEST names it), but a later step failed: ",
                                       error.detail()))
          .with_path(error.path());
    }
    d.rethrow_with_run(error);
  }
  // A commit that verified and moved LATEST clears an earlier failure.
  d.failed = false;
  if (d.options.retention.enabled()) {
    try {
      result.deleted = collect_garbage(d.options.retention);
    } catch (const Error& error) {
      throw Error(error.code(), concat(g.name, " is committed (LATEST names it), but retention failed: ", error.detail()))
          .with_path(error.path());
    }
  }
  return result;
}

std::filesystem::path RunDirectory::prepare_shard_directory(std::int64_t step) {
  Impl& d = *impl_;
  if (d.report.read_only) fail(ErrorCode::invalid_argument, d.path.string(), " was opened read-only (recover = false)");
  const std::string name = shard_directory_name(step);
  if (d.committed.count(step)) {
    fail(ErrorCode::run_generation_exists, d.path.string(), ": step ", step, " is already committed");
  }
  if (d.latest && step < *d.latest) {
    // Refused before any rank writes a shard, not at the commit.
    fail(ErrorCode::run_step_not_increasing, d.path.string(), ": step ", step, " is before LATEST's step ", *d.latest);
  }
  try {
    io::Directory& dir = d.checkpoints_dir();
    if (const auto info = dir.stat(name)) {
      if (info->type != io::FileInfo::Type::directory) {
        fail(ErrorCode::run_shards_invalid, "checkpoints/", name, " exists and is not a directory (never followed)");
      }
      d.remove_tree(name);
    }
    dir.open_subdirectory(name, true);
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
  return d.path / kCheckpointsDirectory / name;
}

void RunDirectory::discard_shard_directory(std::int64_t step) {
  Impl& d = *impl_;
  if (d.report.read_only || d.committed.count(step) || !d.checkpoints) return;
  const std::string name = shard_directory_name(step);
  try {
    if (const auto info = d.checkpoints->stat(name); info && info->type == io::FileInfo::Type::directory) {
      d.remove_tree(name);
      if (d.options.durable) d.checkpoints->sync();
    }
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
}

LoadedMapping RunDirectory::load(const GenerationInfo& generation) const {
  const Impl& d = *impl_;
  try {
    if (!d.checkpoints) fail(ErrorCode::run_generation_missing, "there is no checkpoints/ directory");
    io::Snapshot snapshot = d.checkpoints->read(generation.name, d.options.limits.max_file_bytes, generation.sha256);
    LoadedMapping mapping = parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, d.options.limits);
    mapping.sha256 = snapshot.sha256;
    return mapping;
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
}

GenerationCheck RunDirectory::verify(const GenerationInfo& generation) const { return impl_->check(generation, false); }

std::vector<GenerationCheck> RunDirectory::verify_all() const {
  std::vector<GenerationCheck> out;
  for (const auto& [step, g] : impl_->committed) out.push_back(impl_->check(g, false));
  return out;
}

GcPlan RunDirectory::plan_gc(const RetentionPolicy& policy) const {
  const Impl& d = *impl_;
  GcPlan plan;
  std::map<std::int64_t, std::vector<std::string>> reasons;
  if (d.latest) reasons[*d.latest].push_back("LATEST");
  if (d.best) reasons[*d.best].push_back("BEST");
  std::size_t newest = 0;
  for (auto it = d.committed.rbegin(); it != d.committed.rend(); ++it, ++newest) {
    if (policy.keep_last == 0 || newest < policy.keep_last) reasons[it->first].push_back("newest");
    if (policy.keep_every > 0 && it->first % policy.keep_every == 0) reasons[it->first].push_back("every");
  }
  if (policy.keep_best > 0 && d.options.best_metric) {
    std::vector<std::pair<double, std::int64_t>> ranked;
    for (const auto& [step, g] : d.committed) {
      if (const auto value = g.metric(d.options.best_metric->name); value && std::isfinite(*value)) {
        ranked.emplace_back(d.options.best_metric->higher_is_better ? -*value : *value, step);
      }
    }
    std::sort(ranked.begin(), ranked.end());
    for (std::size_t i = 0; i < ranked.size() && i < policy.keep_best; ++i) reasons[ranked[i].second].push_back("best");
  }
  for (const auto& [step, g] : d.committed) {
    const auto it = reasons.find(step);
    if (it == reasons.end()) {
      plan.remove.push_back(g.name);
      continue;
    }
    plan.keep.push_back(g.name);
    std::string why;
    for (const auto& r : it->second) why += (why.empty() ? "" : ",") + r;
    plan.reasons.emplace_back(g.name, why);
  }
  return plan;
}

std::vector<std::string> RunDirectory::collect_garbage(const RetentionPolicy& policy, bool dry_run) {
  Impl& d = *impl_;
  GcPlan plan = plan_gc(policy);
  if (dry_run) return plan.remove;
  if (d.report.read_only) fail(ErrorCode::invalid_argument, d.path.string(), " was opened read-only (recover = false)");
  if (d.failed) {
    fail(ErrorCode::run_gc_refused, d.path.string(), ": an earlier operation failed; nothing is deleted until a save succeeds");
  }
  if (!d.latest && !d.committed.empty()) {
    fail(ErrorCode::run_gc_refused, d.path.string(), ": no verified LATEST; nothing is deleted");
  }
  if (plan.remove.empty()) return plan.remove;
  try {
    // The index forgets them first: a crash in between leaves files that
    // recovery re-adopts, never an index naming missing files as committed.
    auto next = d.committed;
    for (const auto& name : plan.remove) next.erase(*parse_generation_name(name));
    io::publish_text(*d.root, std::string(kRunIndex), index_text(next), d.publish_options(true));
    d.committed = std::move(next);
    io::Directory& dir = d.checkpoints_dir();
    for (const auto& name : plan.remove) {
      dir.unlink(name);
      if (dir.stat(sidecar_name(name))) dir.unlink(sidecar_name(name));
      // The manifest goes first (durably): a crash then leaves shards that
      // recovery removes, never a manifest without its shards.
      const std::string shards = shard_directory_name(*parse_generation_name(name));
      if (const auto info = dir.stat(shards); info && info->type == io::FileInfo::Type::directory) {
        if (d.options.durable) dir.sync();
        d.remove_tree(shards);
      }
      d.log(concat(d.path.string(), ": retention removed ", name));
    }
    if (d.options.durable) dir.sync();
  } catch (const Error& error) {
    d.failed = true;
    d.rethrow_with_run(error);
  }
  return plan.remove;
}

}  // namespace holdpoint
