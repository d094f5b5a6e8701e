#include "support/fault_file_system.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <type_traits>
#include <utility>

#include "base/fail.h"

namespace holdpoint::testing {

namespace {

// Linux's limit on symlinks followed while resolving one path (ELOOP).
constexpr int kMaxSymlinkHops = 40;
constexpr std::size_t kSectorBytes = 512;

int errno_of(FaultKind kind) {
  switch (kind) {
    case FaultKind::io_error: return EIO;
    case FaultKind::no_space: return ENOSPC;
    case FaultKind::quota_exceeded: return EDQUOT;
  }
  return EIO;
}

const char* errno_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::io_error: return "EIO";
    case FaultKind::no_space: return "ENOSPC";
    case FaultKind::quota_exceeded: return "EDQUOT";
  }
  return "EIO";
}

// The message posix_file_system.cpp builds for a failed system call.
[[noreturn]] void fail_errno(ErrorCode code, const std::filesystem::path& path, std::string_view what, int error,
                             std::string_view suffix = {}) {
  std::string detail = detail::concat(what, ": ", std::strerror(error));
  if (error == ELOOP) detail += " (a symlink, which holdpoint never follows here)";
  detail += suffix;
  throw Error(code, std::move(detail)).with_path(path.string());
}

void require_plain_name(const std::string& name, const std::filesystem::path& directory) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    detail::fail(ErrorCode::invalid_argument, "FaultFileSystem: '", name, "' in ", directory.string(),
                 " is not a plain file name");
  }
}

}  // namespace

struct FaultFileSystem::State {
  struct Entry {
    enum class Kind : std::uint8_t { file, directory, symlink };
    Kind kind = Kind::file;
    std::size_t node = 0;  // index into files or directories; unused for a symlink
    std::string target;    // symlink target
  };

  using Entries = std::map<std::string, Entry>;

  struct DirectoryNode {
    Entries current;
    Entries durable;
  };

  struct FileNode {
    std::string current;
    std::string durable;
  };

  struct Fault {
    std::uint64_t first = 0;  // operation number
    FaultKind kind = FaultKind::io_error;
    bool persistent = false;
  };

  struct CrashPoint {
    std::uint64_t after = 0;  // operation number
    CrashMode mode = CrashMode::drop_unsynced;
  };

  // What one operation is called in the log and how an injected failure of it
  // reads: the code, path and wording of the matching POSIX failure.
  struct Operation {
    std::string description;
    ErrorCode code;
    std::filesystem::path path;
    std::string what;
  };

  explicit State(std::uint64_t seed) : random(seed) { directories.emplace_back(); }

  mutable std::mutex mutex;
  std::vector<DirectoryNode> directories;  // [0] is the root
  std::vector<FileNode> files;
  // Handles remember the epoch they were opened in; a crash starts a new one.
  std::uint64_t epoch = 0;
  bool crashed = false;
  std::uint64_t operations = 0;
  std::vector<std::string> log;
  std::optional<Fault> fault;
  std::optional<CrashPoint> crash_point;
  std::mt19937_64 random;

  // Runs one operation with the mutex held: refuses it after a crash, counts
  // and logs it, injects the armed failure, runs `body`, and crashes after it
  // when that is armed.
  template <typename Body>
  auto perform(std::uint64_t handle_epoch, const Operation& operation, Body&& body) {
    if (crashed) throw SimulatedCrash("the file system has crashed; call restart(): " + operation.description);
    if (handle_epoch != epoch) {
      throw SimulatedCrash("a handle opened before a simulated crash was used: " + operation.description);
    }
    const std::uint64_t number = ++operations;
    log.push_back(operation.description);
    try {
      inject(number, operation);
      if constexpr (std::is_void_v<std::invoke_result_t<Body>>) {
        body();
        crash_if_armed(number);
      } else {
        auto result = body();
        crash_if_armed(number);
        return result;
      }
    } catch (const Error&) {
      crash_if_armed(number);
      throw;
    }
  }

  void inject(std::uint64_t number, const Operation& operation) {
    if (!fault || number < fault->first || (!fault->persistent && number != fault->first)) return;
    log.back() += detail::concat(" -> injected ", errno_name(fault->kind));
    fail_errno(operation.code, operation.path, operation.what, errno_of(fault->kind),
               detail::concat(" (injected at operation ", number, ")"));
  }

  void crash_if_armed(std::uint64_t number) {
    if (!crash_point || crash_point->after != number) return;
    const CrashMode mode = crash_point->mode;
    crash_point.reset();
    log.back() += " -> crash";
    crash_now(mode);
    crashed = true;
    throw SimulatedCrash(detail::concat("simulated crash after operation ", number, ": ", log.back()));
  }

  void crash_now(CrashMode mode) {
    ++epoch;
    for (DirectoryNode& directory : directories) directory.current = directory.durable;
    for (FileNode& file : files) {
      if (file.current == file.durable) continue;
      // Files only grow by appending, so the unsynced bytes are a suffix
      // whenever the current data extends the durable data.
      const bool appended = file.current.size() > file.durable.size() && file.current.starts_with(file.durable);
      if (mode == CrashMode::drop_unsynced || !appended) {
        file.current = file.durable;
        continue;
      }
      const std::size_t synced = file.durable.size();
      const std::size_t unsynced = file.current.size() - synced;
      const std::size_t kept = std::uniform_int_distribution<std::size_t>(0, unsynced)(random);
      file.current.resize(synced + kept);
      if (kept > 0 && std::bernoulli_distribution(0.5)(random)) {
        const std::size_t at = synced + std::uniform_int_distribution<std::size_t>(0, kept - 1)(random);
        const std::size_t begin = std::max(synced, at / kSectorBytes * kSectorBytes);
        const std::size_t end = std::min(file.current.size(), begin + kSectorBytes);
        std::fill(file.current.begin() + static_cast<std::ptrdiff_t>(begin),
                  file.current.begin() + static_cast<std::ptrdiff_t>(end), '\0');
      }
      // What survived is now on the medium.
      file.durable = file.current;
    }
  }

  std::size_t new_directory() {
    directories.emplace_back();
    return directories.size() - 1;
  }

  std::size_t new_file() {
    files.emplace_back();
    return files.size() - 1;
  }

  // --- helpers' strict resolution: no symlink is followed ---

  std::optional<Entry> find(const std::filesystem::path& path) const {
    Entry at{Entry::Kind::directory, 0, {}};
    for (const auto& component : path.relative_path()) {
      const std::string name = component.string();
      if (name.empty() || name == ".") continue;
      if (at.kind != Entry::Kind::directory) return std::nullopt;
      const Entries& entries = directories[at.node].current;
      const auto found = entries.find(name);
      if (found == entries.end()) return std::nullopt;
      at = found->second;
    }
    return at;
  }

  std::size_t directory_at(const std::filesystem::path& path) const {
    const auto entry = find(path);
    if (!entry || entry->kind != Entry::Kind::directory) {
      detail::fail(ErrorCode::invalid_argument, "FaultFileSystem: ", path.string(), " is not a directory");
    }
    return entry->node;
  }

  std::size_t file_at(const std::filesystem::path& path) const {
    const auto entry = find(path);
    if (!entry || entry->kind != Entry::Kind::file) {
      detail::fail(ErrorCode::invalid_argument, "FaultFileSystem: ", path.string(), " is not a regular file");
    }
    return entry->node;
  }

  // Creates the missing directories of `path`, each durable in its parent.
  std::size_t make_directories(const std::filesystem::path& path) {
    std::size_t node = 0;
    for (const auto& component : path.relative_path()) {
      const std::string name = component.string();
      if (name.empty() || name == ".") continue;
      DirectoryNode& parent = directories[node];
      const auto found = parent.current.find(name);
      if (found == parent.current.end()) {
        const std::size_t child = new_directory();
        const Entry entry{Entry::Kind::directory, child, {}};
        directories[node].current[name] = entry;
        directories[node].durable[name] = entry;
        node = child;
      } else if (found->second.kind == Entry::Kind::directory) {
        node = found->second.node;
      } else {
        detail::fail(ErrorCode::invalid_argument, "FaultFileSystem: a component of ", path.string(),
                     " is not a directory");
      }
    }
    return node;
  }
};

namespace {

using State = FaultFileSystem::State;
using Entry = State::Entry;
using Entries = State::Entries;
using DirectoryNode = State::DirectoryNode;
using FileNode = State::FileNode;
using Operation = State::Operation;

class FaultWritableFile final : public io::WritableFile {
 public:
  FaultWritableFile(std::shared_ptr<State> state, std::size_t file, std::filesystem::path path)
      : state_(std::move(state)), epoch_(state_->epoch), file_(file), path_(std::move(path)) {}

  void write(std::span<const std::byte> bytes) override {
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_,
                    {detail::concat("write ", path_.string(), " ", bytes.size()), ErrorCode::io_write_failed, path_,
                     "write"},
                    [&] {
                      if (closed_) fail_errno(ErrorCode::io_write_failed, path_, "write", EBADF);
                      state_->files[file_].current.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
                    });
  }

  void sync() override {
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_, {"sync " + path_.string(), ErrorCode::io_sync_failed, path_, "fsync"}, [&] {
      if (closed_) fail_errno(ErrorCode::io_sync_failed, path_, "fsync", EBADF);
      FileNode& file = state_->files[file_];
      file.durable = file.current;
    });
  }

  void close() override {
    std::lock_guard lock(state_->mutex);
    // close(2) releases the descriptor even when it reports an error.
    const bool was_closed = closed_;
    closed_ = true;
    state_->perform(epoch_, {"close " + path_.string(), ErrorCode::io_write_failed, path_, "close"}, [&] {
      if (was_closed) fail_errno(ErrorCode::io_write_failed, path_, "close", EBADF);
    });
  }

 private:
  std::shared_ptr<State> state_;
  std::uint64_t epoch_;
  std::size_t file_;
  std::filesystem::path path_;
  bool closed_ = false;
};

class FaultDirectory final : public io::Directory {
 public:
  FaultDirectory(std::shared_ptr<State> state, std::size_t node, std::filesystem::path path)
      : state_(std::move(state)), epoch_(state_->epoch), node_(node), path_(std::move(path)) {}

  const std::filesystem::path& path() const override { return path_; }

  std::unique_ptr<io::WritableFile> create_exclusive(const std::string& name) override {
    require_plain_name(name, path_);
    const auto target = path_ / name;
    std::lock_guard lock(state_->mutex);
    return state_->perform(
        epoch_, {"create_exclusive " + target.string(), ErrorCode::io_open_failed, target, "cannot create exclusively"},
        [&]() -> std::unique_ptr<io::WritableFile> {
          if (entries().contains(name)) {
            fail_errno(ErrorCode::io_open_failed, target, "cannot create exclusively", EEXIST);
          }
          const std::size_t file = state_->new_file();
          entries()[name] = Entry{Entry::Kind::file, file, {}};
          return std::make_unique<FaultWritableFile>(state_, file, target);
        });
  }

  io::Snapshot read(const std::string& name, std::uint64_t max_bytes, const std::optional<Sha256Digest>& expected,
                    const io::ReadProgress& progress, const io::SnapshotParser& parse) override {
    require_plain_name(name, path_);
    const auto target = path_ / name;
    io::Snapshot snapshot;
    {
      std::lock_guard lock(state_->mutex);
      snapshot = state_->perform(epoch_, {"read " + target.string(), ErrorCode::io_read_failed, target, "read"}, [&] {
        const auto found = entries().find(name);
        if (found == entries().end()) fail_errno(ErrorCode::io_open_failed, target, "cannot open", ENOENT);
        if (found->second.kind == Entry::Kind::symlink) {
          // As io::open_regular_for_reading_at refuses it.
          throw Error(ErrorCode::io_not_regular_file, "a symlink, which holdpoint never follows inside a folder")
              .with_path(target.string());
        }
        try {
          if (found->second.kind != Entry::Kind::file) detail::fail(ErrorCode::io_not_regular_file, "not a regular file");
          return snapshot_of(state_->files[found->second.node].current, max_bytes, expected);
        } catch (const Error& error) {
          throw error.with_path(target.string());
        }
      });
    }
    // Outside the mutex, so a progress callback may use the file system.
    if (progress) progress(snapshot.buffer->size(), snapshot.buffer->size());
    // The digest was checked above, so the parser runs after it here.
    if (parse) {
      parse(snapshot.buffer, io::SnapshotReading::complete(snapshot.buffer->size()));
    }
    return snapshot;
  }

  void rename(const std::string& from, const std::string& to, bool replace) override {
    require_plain_name(from, path_);
    require_plain_name(to, path_);
    const auto target = path_ / to;
    const std::string what = (replace ? "rename from " : "rename (no replace) from ") + from;
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_,
                    {detail::concat("rename ", (path_ / from).string(), " -> ", target.string(),
                                    replace ? " (replace)" : ""),
                     ErrorCode::io_rename_failed, target, what},
                    [&] {
                      Entries& names = entries();
                      const auto source = names.find(from);
                      if (source == names.end()) fail_errno(ErrorCode::io_rename_failed, target, what, ENOENT);
                      const auto existing = names.find(to);
                      if (existing != names.end()) {
                        if (!replace) fail_errno(ErrorCode::io_rename_failed, target, what, EEXIST);
                        if (from == to) return;
                        const bool source_is_directory = source->second.kind == Entry::Kind::directory;
                        const bool target_is_directory = existing->second.kind == Entry::Kind::directory;
                        if (target_is_directory && !source_is_directory) {
                          fail_errno(ErrorCode::io_rename_failed, target, what, EISDIR);
                        }
                        if (source_is_directory && !target_is_directory) {
                          fail_errno(ErrorCode::io_rename_failed, target, what, ENOTDIR);
                        }
                        if (target_is_directory && !state_->directories[existing->second.node].current.empty()) {
                          fail_errno(ErrorCode::io_rename_failed, target, what, ENOTEMPTY);
                        }
                      }
                      const Entry moved = source->second;
                      names.erase(source);
                      names[to] = moved;
                    });
  }

  void link(const std::string& from, const std::string& to) override {
    require_plain_name(from, path_);
    require_plain_name(to, path_);
    const auto target = path_ / to;
    const std::string what = "link from " + from;
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_,
                    {detail::concat("link ", (path_ / from).string(), " -> ", target.string()),
                     ErrorCode::io_rename_failed, target, what},
                    [&] {
                      Entries& names = entries();
                      const auto source = names.find(from);
                      if (source == names.end()) fail_errno(ErrorCode::io_rename_failed, target, what, ENOENT);
                      if (names.contains(to)) fail_errno(ErrorCode::io_rename_failed, target, what, EEXIST);
                      if (source->second.kind == Entry::Kind::directory) {
                        fail_errno(ErrorCode::io_rename_failed, target, what, EPERM);
                      }
                      // linkat(2) without AT_SYMLINK_FOLLOW links a symlink itself.
                      names[to] = source->second;
                    });
  }

  void unlink(const std::string& name) override {
    require_plain_name(name, path_);
    const auto target = path_ / name;
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_, {"unlink " + target.string(), ErrorCode::io_write_failed, target, "unlink"}, [&] {
      const auto found = entries().find(name);
      if (found == entries().end()) fail_errno(ErrorCode::io_write_failed, target, "unlink", ENOENT);
      if (found->second.kind == Entry::Kind::directory) {
        fail_errno(ErrorCode::io_write_failed, target, "unlink", EISDIR);
      }
      entries().erase(found);
    });
  }

  void remove_directory(const std::string& name) override {
    require_plain_name(name, path_);
    const auto target = path_ / name;
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_, {"rmdir " + target.string(), ErrorCode::io_write_failed, target, "rmdir"}, [&] {
      const auto found = entries().find(name);
      if (found == entries().end()) fail_errno(ErrorCode::io_write_failed, target, "rmdir", ENOENT);
      if (found->second.kind != Entry::Kind::directory) fail_errno(ErrorCode::io_write_failed, target, "rmdir", ENOTDIR);
      if (!state_->directories[found->second.node].current.empty()) {
        fail_errno(ErrorCode::io_write_failed, target, "rmdir", ENOTEMPTY);
      }
      entries().erase(found);
    });
  }

  std::vector<std::string> list() override {
    std::lock_guard lock(state_->mutex);
    return state_->perform(epoch_, {"list " + path_.string(), ErrorCode::io_read_failed, path_, "list"}, [&] {
      std::vector<std::string> names;
      for (const auto& [name, entry] : entries()) names.push_back(name);
      return names;
    });
  }

  std::optional<io::FileInfo> stat(const std::string& name) override {
    require_plain_name(name, path_);
    const auto target = path_ / name;
    std::lock_guard lock(state_->mutex);
    return state_->perform(epoch_, {"stat " + target.string(), ErrorCode::io_read_failed, target, "stat"},
                           [&]() -> std::optional<io::FileInfo> {
                             const auto found = entries().find(name);
                             if (found == entries().end()) return std::nullopt;
                             io::FileInfo info;
                             switch (found->second.kind) {
                               case Entry::Kind::file:
                                 info.type = io::FileInfo::Type::regular;
                                 info.size = state_->files[found->second.node].current.size();
                                 break;
                               case Entry::Kind::directory:
                                 info.type = io::FileInfo::Type::directory;
                                 break;
                               case Entry::Kind::symlink:
                                 // lstat(2) reports a symlink's size as its target's length.
                                 info.type = io::FileInfo::Type::symlink;
                                 info.size = found->second.target.size();
                                 break;
                             }
                             return info;
                           });
  }

  void sync() override {
    std::lock_guard lock(state_->mutex);
    state_->perform(epoch_,
                    {"sync_directory " + path_.string(), ErrorCode::io_sync_failed, path_, "fsync of the directory"},
                    [&] { directory().durable = directory().current; });
  }

  std::unique_ptr<io::Directory> open_subdirectory(const std::string& name, bool create) override {
    require_plain_name(name, path_);
    const auto target = path_ / name;
    std::lock_guard lock(state_->mutex);
    return state_->perform(
        epoch_,
        {"open_subdirectory " + target.string() + (create ? " (create)" : ""), ErrorCode::io_open_failed, target,
         "cannot open directory"},
        [&]() -> std::unique_ptr<io::Directory> {
          if (create && !entries().contains(name)) {
            const std::size_t child = state_->new_directory();
            entries()[name] = Entry{Entry::Kind::directory, child, {}};
            // As the POSIX implementation fsyncs the parent after mkdir.
            directory().durable = directory().current;
          }
          const auto found = entries().find(name);
          if (found == entries().end()) fail_errno(ErrorCode::io_open_failed, target, "cannot open directory", ENOENT);
          switch (found->second.kind) {
            case Entry::Kind::symlink: fail_errno(ErrorCode::io_open_failed, target, "cannot open directory", ELOOP);
            case Entry::Kind::file: fail_errno(ErrorCode::io_open_failed, target, "cannot open directory", ENOTDIR);
            case Entry::Kind::directory: break;
          }
          return std::make_unique<FaultDirectory>(state_, found->second.node, target);
        });
  }

 private:
  DirectoryNode& directory() { return state_->directories[node_]; }
  Entries& entries() { return directory().current; }

  // What read_snapshot_from_fd returns and checks, from memory.
  static io::Snapshot snapshot_of(const std::string& data, std::uint64_t max_bytes,
                                  const std::optional<Sha256Digest>& expected) {
    if (data.size() > max_bytes) {
      detail::fail(ErrorCode::file_too_large, "file is ", data.size(), " bytes, above the limit of ", max_bytes,
                   " (Limits::max_file_bytes)");
    }
    io::Snapshot snapshot;
    snapshot.buffer = io::Buffer::allocate(data.size());
    if (!data.empty()) std::memcpy(snapshot.buffer->data(), data.data(), data.size());
    snapshot.sha256 = Sha256::of(snapshot.buffer->bytes());
    if (expected && !(*expected == snapshot.sha256)) {
      detail::fail(ErrorCode::sha256_mismatch, "SHA-256 is ", snapshot.sha256.hex(), ", expected ", expected->hex());
    }
    return snapshot;
  }

  std::shared_ptr<State> state_;
  std::uint64_t epoch_;
  std::size_t node_;
  std::filesystem::path path_;
};

}  // namespace

FaultFileSystem::FaultFileSystem(std::uint64_t seed) : state_(std::make_shared<State>(seed)) {}

FaultFileSystem::~FaultFileSystem() = default;

std::unique_ptr<io::Directory> FaultFileSystem::open_directory(const std::filesystem::path& path, bool create) {
  std::lock_guard lock(state_->mutex);
  State& state = *state_;
  return state.perform(
      state.epoch,
      {"open_directory " + path.string() + (create ? " (create)" : ""), ErrorCode::io_open_failed, path,
       "cannot open directory"},
      [&]() -> std::unique_ptr<io::Directory> {
        // Like open(2) with O_NOFOLLOW (and create_directories before it):
        // symlinks are followed in every component but the last.
        std::vector<std::string> left;
        for (const auto& component : path.lexically_normal().relative_path()) {
          if (!component.empty() && component != ".") left.push_back(component.string());
        }
        std::reverse(left.begin(), left.end());  // a stack: back() is the next component
        std::size_t node = 0;
        std::filesystem::path walked = "/";
        int hops = 0;
        while (!left.empty()) {
          const std::string name = left.back();
          left.pop_back();
          if (name == "..") {
            // Resolved lexically: the double keeps no parent pointers.
            walked = walked.parent_path();
            node = state.directory_at(walked);
            continue;
          }
          Entries& entries = state.directories[node].current;
          auto found = entries.find(name);
          if (found == entries.end()) {
            if (!create) fail_errno(ErrorCode::io_open_failed, path, "cannot open directory", ENOENT);
            const std::size_t child = state.new_directory();
            const Entry entry{Entry::Kind::directory, child, {}};
            state.directories[node].current[name] = entry;
            state.directories[node].durable[name] = entry;
            found = state.directories[node].current.find(name);
          }
          const Entry entry = found->second;
          if (entry.kind == Entry::Kind::file) fail_errno(ErrorCode::io_open_failed, path, "cannot open directory", ENOTDIR);
          if (entry.kind == Entry::Kind::symlink) {
            if (left.empty() || ++hops > kMaxSymlinkHops) {
              fail_errno(ErrorCode::io_open_failed, path, "cannot open directory", ELOOP);
            }
            const std::filesystem::path target = entry.target;
            std::vector<std::string> pieces;
            for (const auto& component : target.lexically_normal().relative_path()) {
              if (!component.empty() && component != ".") pieces.push_back(component.string());
            }
            for (auto piece = pieces.rbegin(); piece != pieces.rend(); ++piece) left.push_back(*piece);
            if (target.is_absolute()) {
              node = 0;
              walked = "/";
            }
            continue;
          }
          node = entry.node;
          walked /= name;
        }
        return std::make_unique<FaultDirectory>(state_, node, path);
      });
}

void FaultFileSystem::fail_at(std::uint64_t n, FaultKind kind, bool persistent) {
  if (n == 0) detail::fail(ErrorCode::invalid_argument, "fail_at: operations are counted from 1");
  std::lock_guard lock(state_->mutex);
  state_->fault = State::Fault{state_->operations + n, kind, persistent};
}

void FaultFileSystem::crash_after(std::uint64_t n, CrashMode mode) {
  if (n == 0) detail::fail(ErrorCode::invalid_argument, "crash_after: operations are counted from 1");
  std::lock_guard lock(state_->mutex);
  state_->crash_point = State::CrashPoint{state_->operations + n, mode};
}

void FaultFileSystem::clear_faults() {
  std::lock_guard lock(state_->mutex);
  state_->fault.reset();
  state_->crash_point.reset();
}

void FaultFileSystem::crash(CrashMode mode) {
  std::lock_guard lock(state_->mutex);
  state_->crash_now(mode);
}

void FaultFileSystem::restart() {
  std::lock_guard lock(state_->mutex);
  state_->crashed = false;
}

bool FaultFileSystem::crashed() const {
  std::lock_guard lock(state_->mutex);
  return state_->crashed;
}

std::uint64_t FaultFileSystem::operation_count() const {
  std::lock_guard lock(state_->mutex);
  return state_->operations;
}

std::vector<std::string> FaultFileSystem::operation_log() const {
  std::lock_guard lock(state_->mutex);
  return state_->log;
}

void FaultFileSystem::reset_counter() {
  std::lock_guard lock(state_->mutex);
  State& state = *state_;
  // Armed faults are stored as absolute operation numbers; shift them so
  // they still wait for the same number of operations.
  if (state.fault) state.fault->first = state.fault->first > state.operations ? state.fault->first - state.operations : 1;
  if (state.crash_point) {
    state.crash_point->after =
        state.crash_point->after > state.operations ? state.crash_point->after - state.operations : 1;
  }
  state.operations = 0;
  state.log.clear();
}

bool FaultFileSystem::exists(const std::filesystem::path& path) const {
  std::lock_guard lock(state_->mutex);
  return state_->find(path).has_value();
}

std::string FaultFileSystem::contents(const std::filesystem::path& path) const {
  std::lock_guard lock(state_->mutex);
  return state_->files[state_->file_at(path)].current;
}

void FaultFileSystem::write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::lock_guard lock(state_->mutex);
  State& state = *state_;
  const std::size_t parent = state.make_directories(path.parent_path());
  const std::string name = path.filename().string();
  require_plain_name(name, path.parent_path());
  const auto existing = state.directories[parent].current.find(name);
  if (existing != state.directories[parent].current.end() && existing->second.kind != Entry::Kind::file) {
    detail::fail(ErrorCode::invalid_argument, "FaultFileSystem: ", path.string(), " exists and is not a regular file");
  }
  const std::size_t file = state.new_file();
  state.files[file].current = std::string(bytes);
  state.files[file].durable = std::string(bytes);
  const Entry entry{Entry::Kind::file, file, {}};
  state.directories[parent].current[name] = entry;
  state.directories[parent].durable[name] = entry;
}

void FaultFileSystem::corrupt(const std::filesystem::path& path, std::uint64_t offset) {
  std::lock_guard lock(state_->mutex);
  FileNode& file = state_->files[state_->file_at(path)];
  if (offset >= file.current.size()) {
    detail::fail(ErrorCode::invalid_argument, "corrupt: offset ", offset, " is past the end of ", path.string(), " (",
                 file.current.size(), " bytes)");
  }
  file.current[offset] = static_cast<char>(~static_cast<unsigned char>(file.current[offset]));
  if (offset < file.durable.size()) {
    file.durable[offset] = static_cast<char>(~static_cast<unsigned char>(file.durable[offset]));
  }
}

std::vector<std::string> FaultFileSystem::list(const std::filesystem::path& directory) const {
  std::lock_guard lock(state_->mutex);
  std::vector<std::string> names;
  for (const auto& [name, entry] : state_->directories[state_->directory_at(directory)].current) names.push_back(name);
  return names;
}

void FaultFileSystem::plant_symlink(const std::filesystem::path& directory, const std::string& name,
                                    const std::string& target) {
  require_plain_name(name, directory);
  std::lock_guard lock(state_->mutex);
  State& state = *state_;
  const std::size_t parent = state.make_directories(directory);
  if (state.directories[parent].current.contains(name)) {
    detail::fail(ErrorCode::invalid_argument, "plant_symlink: ", (directory / name).string(), " already exists");
  }
  const Entry entry{Entry::Kind::symlink, 0, target};
  state.directories[parent].current[name] = entry;
  state.directories[parent].durable[name] = entry;
}

}  // namespace holdpoint::testing
