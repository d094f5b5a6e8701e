// FileSystem: the fault-injecting double (crash, tear, fault injection), its
// parity with the POSIX implementation on every refusal, and publish() under
// each injected failure and each crash point (SQLite-style sweeps).
#include "support/fault_file_system.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <type_traits>

#include "base/publish.h"
#include "support/test_support.h"

namespace holdpoint::testing {
namespace {

std::span<const std::byte> as_bytes(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

std::string text_of(const io::Snapshot& snapshot) {
  return {reinterpret_cast<const char*>(snapshot.buffer->data()), snapshot.buffer->size()};
}

// Runs `action` and returns the holdpoint::Error it throws (failing the test
// when it throws nothing).
Error error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error;
  }
  ADD_FAILURE() << "expected a holdpoint::Error, but nothing was thrown";
  return Error(ErrorCode::invalid_argument, "nothing thrown");
}

#define EXPECT_SIMULATED_CRASH(statement) EXPECT_THROW(statement, SimulatedCrash)

constexpr FaultKind kAllKinds[] = {FaultKind::io_error, FaultKind::no_space, FaultKind::quota_exceeded};

std::string strerror_of(FaultKind kind) {
  switch (kind) {
    case FaultKind::io_error: return "Input/output error";
    case FaultKind::no_space: return "No space left on device";
    case FaultKind::quota_exceeded: return "Disk quota exceeded";
  }
  return {};
}

std::string kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::io_error: return "EIO";
    case FaultKind::no_space: return "ENOSPC";
    case FaultKind::quota_exceeded: return "EDQUOT";
  }
  return {};
}

// ---------------------------------------------------------------------------
// The double's own semantics

TEST(FaultFileSystem, CrashDropsUnsyncedDataAndUnsyncedNames) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  auto kept = dir->create_exclusive("kept");
  kept->write(as_bytes("durable"));
  kept->sync();
  dir->sync();
  kept->write(as_bytes(" lost"));  // written, never synced
  auto unnamed = dir->create_exclusive("unnamed");
  unnamed->write(as_bytes("synced data under an unsynced name"));
  unnamed->sync();
  dir->rename("kept", "renamed", false);  // never made durable
  EXPECT_EQ(fs.contents("/run/renamed"), "durable lost");

  fs.crash();

  EXPECT_EQ(fs.list("/run"), std::vector<std::string>{"kept"});
  EXPECT_EQ(fs.contents("/run/kept"), "durable");
  // Handles from before the crash belong to a process that died with it.
  EXPECT_SIMULATED_CRASH(kept->write(as_bytes("x")));
  EXPECT_SIMULATED_CRASH(unnamed->close());
  EXPECT_SIMULATED_CRASH(dir->list());
  // crash() is a power cut and reboot in one: new handles work at once.
  auto reopened = fs.open_directory("/run", false);
  EXPECT_EQ(text_of(reopened->read("kept", 1 << 20)), "durable");
}

TEST(FaultFileSystem, CrashKeepsSyncedDataOfAFileWhoseNameIsDurable) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  auto file = dir->create_exclusive("model.bin");
  file->write(as_bytes("all of it"));
  file->sync();
  file->close();
  dir->sync();
  fs.crash();
  EXPECT_EQ(fs.contents("/run/model.bin"), "all of it");
}

TEST(FaultFileSystem, CreatedDirectoriesAreDurableAtOnce) {
  FaultFileSystem fs;
  auto run = fs.open_directory("/run/a/b", true);
  auto sub = run->open_subdirectory("checkpoints", true);
  fs.crash();
  EXPECT_TRUE(fs.exists("/run/a/b/checkpoints"));
  EXPECT_NO_THROW(fs.open_directory("/run/a/b/checkpoints", false));
}

TEST(FaultFileSystem, TearModeKeepsATornPrefixOfTheUnsyncedBytes) {
  const std::string synced(1000, 's');
  std::string unsynced(4000, 'u');
  for (std::size_t i = 0; i < unsynced.size(); ++i) unsynced[i] = static_cast<char>('a' + i % 26);
  bool saw_partial = false;
  bool saw_zeroed_sector = false;
  for (std::uint64_t seed = 1; seed <= 32; ++seed) {
    SCOPED_TRACE(seed);
    auto torn_contents = [&] {
      FaultFileSystem fs(seed);
      auto dir = fs.open_directory("/run", true);
      auto file = dir->create_exclusive("file");
      file->write(as_bytes(synced));
      file->sync();
      dir->sync();
      file->write(as_bytes(unsynced));
      fs.crash(CrashMode::tear_unsynced);
      return fs.contents("/run/file");
    };
    const std::string torn = torn_contents();
    EXPECT_EQ(torn, torn_contents()) << "a seed must replay the same tear";
    ASSERT_GE(torn.size(), synced.size());
    ASSERT_LE(torn.size(), synced.size() + unsynced.size());
    EXPECT_EQ(torn.substr(0, synced.size()), synced) << "synced bytes are never torn";
    const std::size_t kept = torn.size() - synced.size();
    saw_partial |= kept > 0 && kept < unsynced.size();
    std::size_t first_zero = torn.size();
    std::size_t last_zero = 0;
    for (std::size_t i = synced.size(); i < torn.size(); ++i) {
      if (torn[i] == '\0') {
        first_zero = std::min(first_zero, i);
        last_zero = i;
      } else {
        EXPECT_EQ(torn[i], unsynced[i - synced.size()]) << "offset " << i;
      }
    }
    if (first_zero < torn.size()) {
      saw_zeroed_sector = true;
      EXPECT_LT(last_zero - first_zero, 512u) << "at most one sector is zeroed";
      EXPECT_EQ(first_zero / 512, last_zero / 512) << "the zeroed span lies in one sector";
    }
  }
  EXPECT_TRUE(saw_partial);
  EXPECT_TRUE(saw_zeroed_sector);
}

TEST(FaultFileSystem, RenameWithoutReplaceRefusesAndChangesNothing) {
  FaultFileSystem fs;
  fs.write_file("/run/a", "A");
  fs.write_file("/run/b", "B");
  auto dir = fs.open_directory("/run", false);
  EXPECT_ERROR_CODE(dir->rename("a", "b", false), ErrorCode::io_rename_failed);
  EXPECT_EQ(fs.contents("/run/a"), "A");
  EXPECT_EQ(fs.contents("/run/b"), "B");
  EXPECT_ERROR_CODE(dir->rename("missing", "c", true), ErrorCode::io_rename_failed);
  dir->rename("a", "b", true);
  EXPECT_FALSE(fs.exists("/run/a"));
  EXPECT_EQ(fs.contents("/run/b"), "A");
}

TEST(FaultFileSystem, HardLinksShareTheirData) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  auto file = dir->create_exclusive("first");
  dir->link("first", "second");
  file->write(as_bytes("shared"));
  EXPECT_EQ(fs.contents("/run/second"), "shared");
  dir->unlink("first");
  file->write(as_bytes(" after unlink"));  // an unlinked file stays writable
  EXPECT_EQ(fs.contents("/run/second"), "shared after unlink");
}

TEST(FaultFileSystem, CorruptFlipsOneByteOnTheMedium) {
  FaultFileSystem fs;
  fs.write_file("/run/model.bin", "abc");
  auto dir = fs.open_directory("/run", false);
  const Sha256Digest digest = dir->read("model.bin", 100).sha256;
  fs.corrupt("/run/model.bin", 1);
  EXPECT_EQ(fs.contents("/run/model.bin"), std::string("a") + static_cast<char>(~'b') + "c");
  EXPECT_ERROR_CODE(dir->read("model.bin", 100, digest), ErrorCode::sha256_mismatch);
  fs.crash();
  EXPECT_NE(fs.contents("/run/model.bin"), "abc") << "corruption is durable";
  EXPECT_ERROR_CODE(fs.corrupt("/run/model.bin", 3), ErrorCode::invalid_argument);
}

TEST(FaultFileSystem, ReadReturnsTheSnapshotReadSnapshotWould) {
  FaultFileSystem fs;
  fs.write_file("/run/model.bin", "contents");
  auto dir = fs.open_directory("/run", false);
  std::uint64_t reported = 0;
  const io::Snapshot snapshot =
      dir->read("model.bin", 8, std::nullopt, [&](std::uint64_t done, std::uint64_t total) { reported = done; });
  EXPECT_EQ(text_of(snapshot), "contents");
  EXPECT_EQ(snapshot.sha256, Sha256::of(as_bytes("contents")));
  EXPECT_EQ(reported, 8u);
  EXPECT_ERROR_CODE(dir->read("model.bin", 7), ErrorCode::file_too_large);
  EXPECT_ERROR_CODE(dir->read("model.bin", 8, Sha256::of(as_bytes("other"))), ErrorCode::sha256_mismatch);
}

// Each operation, failed by injection, throws the code the POSIX
// implementation uses for that system call, names the errno, and changes
// nothing.
TEST(FaultFileSystem, InjectedFailureOfEachOperationHasItsPosixCodeAndChangesNothing) {
  struct Case {
    std::string name;
    ErrorCode code;
    std::function<void(io::Directory&, io::WritableFile&)> operation;
    std::function<void(FaultFileSystem&)> check_unchanged;
    std::uint64_t fault_at = 1;  // the operation's place in `operation`
  };
  const std::vector<Case> cases = {
      {"create_exclusive", ErrorCode::io_open_failed, [](auto& dir, auto&) { dir.create_exclusive("new"); },
       [](auto& fs) { EXPECT_FALSE(fs.exists("/run/new")); }},
      {"write", ErrorCode::io_write_failed, [](auto&, auto& file) { file.write(as_bytes("more")); },
       [](auto& fs) { EXPECT_EQ(fs.contents("/run/open"), "data"); }},
      {"sync", ErrorCode::io_sync_failed, [](auto&, auto& file) { file.sync(); },
       [](auto& fs) {
         fs.crash();
         EXPECT_EQ(fs.contents("/run/open"), "");
       }},
      {"close", ErrorCode::io_write_failed, [](auto&, auto& file) { file.close(); }, [](auto&) {}},
      {"read", ErrorCode::io_read_failed, [](auto& dir, auto&) { dir.read("old", 100); }, [](auto&) {}},
      {"rename", ErrorCode::io_rename_failed, [](auto& dir, auto&) { dir.rename("old", "moved", false); },
       [](auto& fs) { EXPECT_EQ(fs.list("/run"), (std::vector<std::string>{"old", "open"})); }},
      {"link", ErrorCode::io_rename_failed, [](auto& dir, auto&) { dir.link("old", "linked"); },
       [](auto& fs) { EXPECT_EQ(fs.list("/run"), (std::vector<std::string>{"old", "open"})); }},
      {"unlink", ErrorCode::io_write_failed, [](auto& dir, auto&) { dir.unlink("old"); },
       [](auto& fs) { EXPECT_TRUE(fs.exists("/run/old")); }},
      {"list", ErrorCode::io_read_failed, [](auto& dir, auto&) { dir.list(); }, [](auto&) {}},
      {"stat", ErrorCode::io_read_failed, [](auto& dir, auto&) { dir.stat("old"); }, [](auto&) {}},
      {"sync_directory", ErrorCode::io_sync_failed,
       [](auto& dir, auto&) {
         dir.create_exclusive("unsynced");
         dir.sync();
       },
       [](auto& fs) {
         fs.crash();
         EXPECT_EQ(fs.list("/run"), (std::vector<std::string>{"old", "open"}));
       },
       2},
      {"open_subdirectory", ErrorCode::io_open_failed, [](auto& dir, auto&) { dir.open_subdirectory("sub", true); },
       [](auto& fs) { EXPECT_FALSE(fs.exists("/run/sub")); }},
  };
  for (const FaultKind kind : kAllKinds) {
    for (const Case& test : cases) {
      SCOPED_TRACE(test.name + " " + kind_name(kind));
      FaultFileSystem fs;
      fs.write_file("/run/old", "old");
      auto dir = fs.open_directory("/run", false);
      auto file = dir->create_exclusive("open");
      dir->sync();
      file->write(as_bytes("data"));
      fs.fail_at(test.fault_at, kind, false);
      const Error error = error_of([&] { test.operation(*dir, *file); });
      EXPECT_EQ(error.code(), test.code);
      EXPECT_NE(error.detail().find(strerror_of(kind)), std::string::npos) << error.what();
      EXPECT_FALSE(error.path().empty());
      const auto log = fs.operation_log();
      EXPECT_EQ(log.back().substr(0, test.name.size() + 1), test.name + " ") << log.back();
      EXPECT_NE(log.back().find("-> injected " + kind_name(kind)), std::string::npos) << log.back();
      test.check_unchanged(fs);
    }
    SCOPED_TRACE("open_directory " + kind_name(kind));
    FaultFileSystem fs;
    fs.fail_at(1, kind, false);
    const Error error = error_of([&] { fs.open_directory("/run", true); });
    EXPECT_EQ(error.code(), ErrorCode::io_open_failed);
    EXPECT_NE(error.detail().find(strerror_of(kind)), std::string::npos) << error.what();
    EXPECT_FALSE(fs.exists("/run"));
  }
}

TEST(FaultFileSystem, TransientFaultFailsOnlyTheNthOperation) {
  for (const FaultKind kind : kAllKinds) {
    SCOPED_TRACE(kind_name(kind));
    FaultFileSystem fs;
    auto dir = fs.open_directory("/run", true);
    fs.fail_at(2, kind, false);
    EXPECT_NO_THROW(dir->list());                                               // 1
    EXPECT_ERROR_CODE(dir->create_exclusive("x"), ErrorCode::io_open_failed);  // 2
    EXPECT_NO_THROW(dir->create_exclusive("x"));                                // 3
    EXPECT_NO_THROW(dir->sync());                                               // 4
    EXPECT_EQ(fs.operation_count(), 5u);
  }
}

TEST(FaultFileSystem, PersistentFaultFailsEveryOperationFromTheNthUntilCleared) {
  for (const FaultKind kind : kAllKinds) {
    SCOPED_TRACE(kind_name(kind));
    FaultFileSystem fs;
    auto dir = fs.open_directory("/run", true);
    auto file = dir->create_exclusive("x");
    fs.fail_at(2, kind, true);
    EXPECT_NO_THROW(file->write(as_bytes("a")));
    EXPECT_ERROR_CODE(file->write(as_bytes("b")), ErrorCode::io_write_failed);
    EXPECT_ERROR_CODE(file->sync(), ErrorCode::io_sync_failed);
    EXPECT_ERROR_CODE(dir->sync(), ErrorCode::io_sync_failed);
    EXPECT_ERROR_CODE(dir->list(), ErrorCode::io_read_failed);
    EXPECT_EQ(fs.contents("/run/x"), "a") << "a failed write appends nothing";
    fs.clear_faults();
    EXPECT_NO_THROW(file->write(as_bytes("c")));
    EXPECT_EQ(fs.contents("/run/x"), "ac");
  }
}

TEST(FaultFileSystem, FailedCloseStillReleasesTheHandle) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  auto file = dir->create_exclusive("x");
  fs.fail_at(1, FaultKind::io_error, false);
  EXPECT_ERROR_CODE(file->close(), ErrorCode::io_write_failed);
  EXPECT_ERROR_CODE(file->write(as_bytes("late")), ErrorCode::io_write_failed);
  EXPECT_ERROR_CODE(file->close(), ErrorCode::io_write_failed);
  EXPECT_EQ(fs.contents("/run/x"), "");
}

TEST(FaultFileSystem, FaultsCountFromTheCallOrFromResetCounter) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  dir->list();
  EXPECT_EQ(fs.operation_count(), 2u);
  fs.fail_at(2, FaultKind::io_error, false);  // the 4th operation overall
  dir->list();
  fs.reset_counter();
  EXPECT_EQ(fs.operation_count(), 0u);
  EXPECT_TRUE(fs.operation_log().empty());
  EXPECT_ERROR_CODE(dir->list(), ErrorCode::io_read_failed);
  EXPECT_EQ(fs.operation_count(), 1u);
  EXPECT_ERROR_CODE(fs.fail_at(0, FaultKind::io_error, false), ErrorCode::invalid_argument);
}

TEST(FaultFileSystem, OperationLogNamesEachOperation) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  auto file = dir->create_exclusive(".x.staging-1-2");
  file->write(std::vector<std::byte>(4096));
  file->start_writeback(0, 4096);  // a hint, not an operation
  file->sync();
  file->close();
  dir->read(".x.staging-1-2", 1 << 20);
  dir->rename(".x.staging-1-2", "x", false);
  dir->link("x", "y");
  dir->stat("y");
  dir->unlink("y");
  dir->list();
  dir->sync();
  dir->open_subdirectory("sub", true);
  fs.fail_at(1, FaultKind::no_space, false);
  EXPECT_ERROR_CODE(dir->create_exclusive("z"), ErrorCode::io_open_failed);
  const std::vector<std::string> expected = {
      "open_directory /run (create)",
      "create_exclusive /run/.x.staging-1-2",
      "write /run/.x.staging-1-2 4096",
      "sync /run/.x.staging-1-2",
      "close /run/.x.staging-1-2",
      "read /run/.x.staging-1-2",
      "rename /run/.x.staging-1-2 -> /run/x",
      "link /run/x -> /run/y",
      "stat /run/y",
      "unlink /run/y",
      "list /run",
      "sync_directory /run",
      "open_subdirectory /run/sub (create)",
      "create_exclusive /run/z -> injected ENOSPC",
  };
  EXPECT_EQ(fs.operation_log(), expected);
  EXPECT_EQ(fs.operation_count(), expected.size());
}

static_assert(!std::is_base_of_v<Error, SimulatedCrash>, "I/O error handling must not be able to catch a power cut");

TEST(FaultFileSystem, CrashAfterNthOperationThrowsSimulatedCrashUntilRestart) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  fs.crash_after(3);
  auto file = dir->create_exclusive("x");  // 1
  file->write(as_bytes("data"));           // 2
  // The 3rd operation completes (the directory entry becomes durable) and
  // then the machine goes down.
  EXPECT_SIMULATED_CRASH(dir->sync());
  EXPECT_TRUE(fs.crashed());
  EXPECT_SIMULATED_CRASH(file->sync());
  EXPECT_SIMULATED_CRASH(fs.open_directory("/run", false));
  EXPECT_EQ(fs.operation_count(), 4u) << "refused operations are not counted";

  fs.restart();
  EXPECT_FALSE(fs.crashed());
  EXPECT_SIMULATED_CRASH(file->write(as_bytes("more"))) << "handles from before the crash stay dead";
  EXPECT_SIMULATED_CRASH(dir->list());
  auto rebooted = fs.open_directory("/run", false);
  EXPECT_EQ(rebooted->list(), std::vector<std::string>{"x"});
  EXPECT_EQ(text_of(rebooted->read("x", 100)), "") << "the unsynced data is gone";
}

TEST(FaultFileSystem, CrashAfterAFailedOperationStillCrashes) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  fs.fail_at(1, FaultKind::io_error, false);
  fs.crash_after(1);
  EXPECT_SIMULATED_CRASH(dir->sync());
  EXPECT_TRUE(fs.crashed());
}

TEST(FaultFileSystem, HelpersRefuseWhatTheyCannotName) {
  FaultFileSystem fs;
  fs.plant_symlink("/run", "link", "/elsewhere");
  EXPECT_TRUE(fs.exists("/run/link"));
  EXPECT_ERROR_CODE(fs.contents("/run/link"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(fs.contents("/run/missing"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(fs.write_file("/run/link/x", ""), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(fs.plant_symlink("/run", "link", "again"), ErrorCode::invalid_argument);
  auto dir = fs.open_directory("/run", false);
  EXPECT_ERROR_CODE(dir->create_exclusive("a/b"), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(dir->read("..", 1), ErrorCode::invalid_argument);
}

// ---------------------------------------------------------------------------
// Parity: the same refusals, code for code, on the real file system and on
// the double.

class Backend {
 public:
  virtual ~Backend() = default;
  virtual io::FileSystem& file_system() = 0;
  // An existing, empty directory to play in.
  virtual std::filesystem::path root() const = 0;
  virtual void write_file(const std::string& name, std::string_view text) = 0;
  virtual void make_directory(const std::string& name) = 0;
  virtual void plant_symlink(const std::string& name, const std::string& target) = 0;
};

class PosixBackend final : public Backend {
 public:
  io::FileSystem& file_system() override { return io::posix_file_system(); }
  std::filesystem::path root() const override { return temp_.path(); }
  void write_file(const std::string& name, std::string_view text) override {
    write_file_bytes(temp_ / name, bytes_of(text));
  }
  void make_directory(const std::string& name) override { std::filesystem::create_directory(temp_ / name); }
  void plant_symlink(const std::string& name, const std::string& target) override {
    std::filesystem::create_symlink(target, temp_ / name);
  }

 private:
  TempDir temp_;
};

class FaultBackend final : public Backend {
 public:
  FaultBackend() { fs_.open_directory(root(), true); }
  io::FileSystem& file_system() override { return fs_; }
  std::filesystem::path root() const override { return "/run"; }
  void write_file(const std::string& name, std::string_view text) override { fs_.write_file(root() / name, text); }
  void make_directory(const std::string& name) override { fs_.open_directory(root() / name, true); }
  void plant_symlink(const std::string& name, const std::string& target) override {
    fs_.plant_symlink(root(), name, target);
  }

 private:
  FaultFileSystem fs_;
};

// What a name in `dir` is, seen through the interface: "absent",
// "symlink(<target length>)", "directory" or the file's contents.
std::string describe(io::Directory& dir, const std::string& name) {
  const auto info = dir.stat(name);
  if (!info) return "absent";
  switch (info->type) {
    case io::FileInfo::Type::symlink: return "symlink(" + std::to_string(info->size) + ")";
    case io::FileInfo::Type::directory: return "directory";
    case io::FileInfo::Type::regular: return text_of(dir.read(name, 1 << 20));
    case io::FileInfo::Type::other: return "other";
  }
  return "?";
}

std::vector<std::string> staging_names(io::Directory& dir) {
  std::vector<std::string> names;
  for (const std::string& name : dir.list()) {
    if (io::is_staging_name(name)) names.push_back(name);
  }
  return names;
}

class FileSystemParity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "posix") {
      backend_ = std::make_unique<PosixBackend>();
    } else {
      backend_ = std::make_unique<FaultBackend>();
    }
    backend_->write_file("victim", "victim's bytes");
    backend_->make_directory("real");
    backend_->plant_symlink("link_to_file", "victim");
    backend_->plant_symlink("dangling", "never_created");
    backend_->plant_symlink("link_to_directory", "real");
    dir_ = backend_->file_system().open_directory(backend_->root(), false);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<io::Directory> dir_;
};

TEST_P(FileSystemParity, CreateExclusiveOnASymlinkRefusesAndDoesNotWriteThroughIt) {
  EXPECT_ERROR_CODE(dir_->create_exclusive("link_to_file"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->create_exclusive("dangling"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->create_exclusive("victim"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->create_exclusive("real"), ErrorCode::io_open_failed);
  EXPECT_EQ(describe(*dir_, "victim"), "victim's bytes");
  EXPECT_EQ(describe(*dir_, "never_created"), "absent");
  EXPECT_EQ(describe(*dir_, "dangling"), "symlink(13)");
}

TEST_P(FileSystemParity, ReadRefusesSymlinksDirectoriesAndMissingNames) {
  const Error symlink = error_of([&] { dir_->read("link_to_file", 1 << 20); });
  EXPECT_EQ(symlink.code(), ErrorCode::io_not_regular_file);
  EXPECT_EQ(symlink.detail(), "a symlink, which holdpoint never follows inside a folder");
  EXPECT_ERROR_CODE(dir_->read("real", 1 << 20), ErrorCode::io_not_regular_file);
  EXPECT_ERROR_CODE(dir_->read("missing", 1 << 20), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->read("victim", 3), ErrorCode::file_too_large);
  EXPECT_ERROR_CODE(dir_->read("victim", 1 << 20, Sha256::of(as_bytes("other"))), ErrorCode::sha256_mismatch);
  EXPECT_EQ(text_of(dir_->read("victim", 1 << 20)), "victim's bytes");
}

TEST_P(FileSystemParity, DirectoriesAreNeverOpenedThroughASymlinkAtTheLastComponent) {
  EXPECT_ERROR_CODE(dir_->open_subdirectory("link_to_directory", false), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->open_subdirectory("link_to_directory", true), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->open_subdirectory("dangling", true), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->open_subdirectory("victim", true), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(dir_->open_subdirectory("missing", false), ErrorCode::io_open_failed);
  auto& fs = backend_->file_system();
  const auto root = backend_->root();
  EXPECT_ERROR_CODE(fs.open_directory(root / "link_to_directory", false), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(fs.open_directory(root / "link_to_directory", true), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(fs.open_directory(root / "dangling", true), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(fs.open_directory(root / "victim", false), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(fs.open_directory(root / "missing", false), ErrorCode::io_open_failed);
  EXPECT_EQ(describe(*dir_, "never_created"), "absent");
  // Components before the last are resolved as open(2) resolves them.
  auto through = fs.open_directory(root / "link_to_directory" / "sub", true);
  EXPECT_EQ(describe(*dir_->open_subdirectory("real", false), "sub"), "directory");
}

TEST_P(FileSystemParity, NameOperationsRefuseWhatPosixRefuses) {
  EXPECT_ERROR_CODE(dir_->rename("victim", "link_to_file", false), ErrorCode::io_rename_failed);
  EXPECT_ERROR_CODE(dir_->rename("victim", "real", true), ErrorCode::io_rename_failed);
  EXPECT_ERROR_CODE(dir_->rename("missing", "other", true), ErrorCode::io_rename_failed);
  EXPECT_ERROR_CODE(dir_->link("victim", "dangling"), ErrorCode::io_rename_failed);
  EXPECT_ERROR_CODE(dir_->link("missing", "other"), ErrorCode::io_rename_failed);
  EXPECT_ERROR_CODE(dir_->link("real", "other"), ErrorCode::io_rename_failed);
  EXPECT_ERROR_CODE(dir_->unlink("missing"), ErrorCode::io_write_failed);
  EXPECT_ERROR_CODE(dir_->unlink("real"), ErrorCode::io_write_failed);
  EXPECT_EQ(dir_->list(), (std::vector<std::string>{"dangling", "link_to_directory", "link_to_file", "real", "victim"}));
  EXPECT_EQ(describe(*dir_, "link_to_file"), "symlink(6)");
  EXPECT_EQ(describe(*dir_, "real"), "directory");
  // A symlink is a name like any other: it can be renamed and removed.
  dir_->rename("dangling", "moved", false);
  dir_->unlink("moved");
  EXPECT_EQ(describe(*dir_, "moved"), "absent");
  EXPECT_EQ(describe(*dir_, "victim"), "victim's bytes");
}

TEST_P(FileSystemParity, PublishDoesNotReplaceASymlinkAtTheTarget) {
  EXPECT_ERROR_CODE(io::publish_text(*dir_, "link_to_file", "new", {.replace = false}), ErrorCode::io_rename_failed);
  EXPECT_EQ(describe(*dir_, "link_to_file"), "symlink(6)");
  EXPECT_EQ(describe(*dir_, "victim"), "victim's bytes");
  EXPECT_TRUE(staging_names(*dir_).empty());
}

TEST_P(FileSystemParity, PublishWithReplaceReplacesTheSymlinkItselfNotItsTarget) {
  io::publish_text(*dir_, "link_to_file", "new", {.replace = true});
  EXPECT_EQ(describe(*dir_, "link_to_file"), "new");
  EXPECT_EQ(describe(*dir_, "victim"), "victim's bytes");
  EXPECT_TRUE(staging_names(*dir_).empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, FileSystemParity, ::testing::Values("posix", "fault"),
                         [](const auto& info) { return info.param; });

// A FIFO planted at a name the reader opens must be refused, not waited on
// for a writer that never comes.
TEST(PosixFileSystem, ReadOfAPlantedFifoIsRefusedWithoutBlocking) {
  TempDir temp;
  ASSERT_EQ(::mkfifo((temp / "fifo").c_str(), 0644), 0);
  auto dir = io::posix_file_system().open_directory(temp.path(), false);
  EXPECT_ERROR_CODE(dir->read("fifo", 1 << 20), ErrorCode::io_not_regular_file);
  EXPECT_EQ(dir->stat("fifo")->type, io::FileInfo::Type::other);
  EXPECT_ERROR_CODE(dir->open_subdirectory("fifo", false), ErrorCode::io_open_failed);
}

// ---------------------------------------------------------------------------
// publish() under every failure and every crash point

constexpr std::size_t kStableBytes = 256 << 10;

// A payload that reaches the file in three writes: the buffered head (flushed
// when the large span arrives), the large span itself, and the buffered tail.
const std::string& new_content() {
  static const std::string content = [] {
    std::string text = "head:";
    for (std::size_t i = 0; i < kStableBytes; ++i) text += static_cast<char>('A' + i % 23);
    return text + ":tail";
  }();
  return content;
}

void write_new_content(io::ByteSink& sink) {
  const std::string& content = new_content();
  const auto bytes = as_bytes(content);
  sink.write(bytes.first(5));
  sink.write_stable(bytes.subspan(5, kStableBytes));
  sink.write(bytes.last(5));
}

const std::string kOldContent = "the previous pointer";
const std::filesystem::path kTarget = "/run/model.bin";

// The code the POSIX implementation gives a failure of the logged operation.
ErrorCode code_of_operation(const std::string& line) {
  const std::string name = line.substr(0, line.find(' '));
  if (name == "create_exclusive" || name == "open_subdirectory" || name == "open_directory") {
    return ErrorCode::io_open_failed;
  }
  if (name == "write" || name == "close" || name == "unlink") return ErrorCode::io_write_failed;
  if (name == "sync" || name == "sync_directory") return ErrorCode::io_sync_failed;
  if (name == "rename" || name == "link") return ErrorCode::io_rename_failed;
  return ErrorCode::io_read_failed;
}

bool injected(const std::string& line) { return line.find("-> injected") != std::string::npos; }

// Publishes new_content() as /run/model.bin. With `checked`, a verifier that
// checks every byte takes the cached read-back, whose check runs while a
// second thread fsyncs; without, the file is re-read after the fsync.
void publish_new_content(io::Directory& dir, bool replace, bool checked) {
  io::PublishOptions options{.replace = replace};
  io::PublishVerifier verify;
  if (checked) {
    options.verifier_checks_content = true;
    verify = [](std::span<std::byte> bytes, const std::shared_ptr<const void>&) {
      if (std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()) != new_content()) {
        throw Error(ErrorCode::file_changed_during_read, "the staging file reads back wrong");
      }
    };
  }
  io::publish(dir, "model.bin", options, write_new_content, verify);
}

struct FaultSweep {
  FaultKind kind;
  bool persistent;
  bool replace;  // over an older file; otherwise into an empty directory
  bool checked = false;  // publish_new_content
};

class PublishFaultSweep : public ::testing::TestWithParam<FaultSweep> {};

// SQLite's method: fail operation N for N = 1, 2, ... until publish() runs
// past the fault, and check the directory after every failure.
TEST_P(PublishFaultSweep, TargetIsOldOrNewAndNoStagingFileIsLeftUnlessItsUnlinkFailed) {
  const FaultSweep sweep = GetParam();
  const std::string old_or_absent = sweep.replace ? kOldContent : "absent";
  std::uint64_t failures = 0;
  bool completed = false;
  for (std::uint64_t n = 1; n <= 64 && !completed; ++n) {
    SCOPED_TRACE(n);
    FaultFileSystem fs;
    if (sweep.replace) fs.write_file(kTarget, kOldContent);
    auto dir = fs.open_directory("/run", true);
    fs.reset_counter();
    fs.fail_at(n, sweep.kind, sweep.persistent);
    std::optional<Error> error;
    try {
      publish_new_content(*dir, sweep.replace, sweep.checked);
    } catch (const Error& thrown) {
      error = thrown;
    }
    fs.clear_faults();
    const std::vector<std::string> log = fs.operation_log();
    completed = log.size() < n;  // the fault was never reached
    const std::string state = describe(*dir, "model.bin");
    const std::vector<std::string> leftovers = staging_names(*dir);
    const bool unlink_failed = std::any_of(log.begin(), log.end(), [](const std::string& line) {
      return line.starts_with("unlink ") && injected(line);
    });
    if (!error) {
      // A transient failure of create_exclusive is retried under a new name.
      EXPECT_TRUE(completed || (!sweep.persistent && log[n - 1].starts_with("create_exclusive ")))
          << log[n - 1];
      EXPECT_EQ(state, new_content());
      EXPECT_TRUE(leftovers.empty());
      fs.crash();
      EXPECT_EQ(fs.contents(kTarget), new_content()) << "publish() returned, so the target is durable";
      continue;
    }
    ++failures;
    ASSERT_FALSE(completed) << error->what();
    ASSERT_TRUE(injected(log[n - 1])) << log[n - 1];
    EXPECT_EQ(error->code(), code_of_operation(log[n - 1])) << error->what();
    EXPECT_NE(error->detail().find(strerror_of(sweep.kind)), std::string::npos) << error->what();
    if (log[n - 1].starts_with("sync_directory ")) {
      // The rename happened; only its durability is unknown, and the caller
      // is told so.
      EXPECT_EQ(state, new_content());
    } else {
      EXPECT_EQ(state, old_or_absent) << log[n - 1];
    }
    if (unlink_failed) {
      EXPECT_EQ(leftovers.size(), 1u);
    } else {
      EXPECT_TRUE(leftovers.empty()) << log[n - 1];
    }
    for (const std::string& name : dir->list()) {
      EXPECT_TRUE(name == "model.bin" || io::is_staging_name(name)) << name;
    }
  }
  EXPECT_TRUE(completed);
  EXPECT_GE(failures, 6u);
}

INSTANTIATE_TEST_SUITE_P(
    KindsAndPersistence, PublishFaultSweep,
    ::testing::Values(FaultSweep{FaultKind::io_error, false, false}, FaultSweep{FaultKind::io_error, true, false},
                      FaultSweep{FaultKind::no_space, false, false}, FaultSweep{FaultKind::no_space, true, false},
                      FaultSweep{FaultKind::quota_exceeded, false, false},
                      FaultSweep{FaultKind::quota_exceeded, true, false}, FaultSweep{FaultKind::io_error, false, true},
                      FaultSweep{FaultKind::io_error, true, true}, FaultSweep{FaultKind::no_space, false, true},
                      FaultSweep{FaultKind::no_space, true, true}, FaultSweep{FaultKind::quota_exceeded, false, true},
                      FaultSweep{FaultKind::quota_exceeded, true, true},
                      FaultSweep{FaultKind::io_error, false, false, true},
                      FaultSweep{FaultKind::io_error, true, false, true},
                      FaultSweep{FaultKind::no_space, false, true, true},
                      FaultSweep{FaultKind::no_space, true, true, true}),
    [](const auto& info) {
      return kind_name(info.param.kind) + (info.param.persistent ? "_persistent" : "_transient") +
             (info.param.replace ? "_replacing" : "_fresh") + (info.param.checked ? "_checked_while_syncing" : "");
    });

// The cached read-back's check runs while a second thread fsyncs. The file
// system still sees one order (the mapping, then the fsync, then the close),
// and the errors keep the order of the steps.
TEST(PublishCheckedWhileSyncing, TheFileSystemSeesTheMappingThenTheFsyncThenTheClose) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  fs.reset_counter();
  publish_new_content(*dir, false, true);
  std::vector<std::string> names;
  for (const std::string& line : fs.operation_log()) names.push_back(line.substr(0, line.find(' ')));
  EXPECT_EQ(names, (std::vector<std::string>{"create_exclusive", "write", "write", "write", "read", "sync", "close",
                                             "rename", "sync_directory"}));
}

TEST(PublishCheckedWhileSyncing, AFailedFsyncIsReportedAheadOfAFailedCheck) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  fs.reset_counter();
  fs.fail_at(6, FaultKind::io_error, false);  // the sync, as above
  bool checked = false;
  io::PublishOptions options{.verifier_checks_content = true};
  const auto refuse = [&](std::span<std::byte>, const std::shared_ptr<const void>&) {
    checked = true;
    throw Error(ErrorCode::file_changed_during_read, "refused by the test");
  };
  EXPECT_ERROR_CODE(io::publish(*dir, "model.bin", options, write_new_content, refuse), ErrorCode::io_sync_failed);
  EXPECT_TRUE(checked) << "the check ran beside the fsync";
  EXPECT_FALSE(fs.exists(kTarget));
  EXPECT_TRUE(staging_names(*dir).empty());
  // Without the fsync failure, the check's own error.
  EXPECT_ERROR_CODE(io::publish(*dir, "model.bin", options, write_new_content, refuse),
                    ErrorCode::file_changed_during_read);
  EXPECT_FALSE(fs.exists(kTarget));
  EXPECT_TRUE(staging_names(*dir).empty());
}

TEST(PublishCheckedWhileSyncing, BeforeRenameRunsOnceTheFileIsSyncedClosedAndCheckedAndCanStillRefuse) {
  FaultFileSystem fs;
  auto dir = fs.open_directory("/run", true);
  fs.reset_counter();
  io::PublishOptions options{.verifier_checks_content = true};
  bool verified = false;
  const auto verify = [&](std::span<std::byte>, const std::shared_ptr<const void>&) { verified = true; };
  std::vector<std::string> seen;
  options.before_rename = [&] {
    EXPECT_TRUE(verified);
    for (const std::string& line : fs.operation_log()) seen.push_back(line.substr(0, line.find(' ')));
    throw Error(ErrorCode::invalid_argument, "refused before the rename");
  };
  EXPECT_ERROR_CODE(io::publish(*dir, "model.bin", options, write_new_content, verify), ErrorCode::invalid_argument);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(seen.end() - 2, seen.end()), (std::vector<std::string>{"sync", "close"}));
  EXPECT_FALSE(fs.exists(kTarget));
  EXPECT_TRUE(staging_names(*dir).empty());
  options.before_rename = [] {};
  io::publish(*dir, "model.bin", options, write_new_content, verify);
  EXPECT_EQ(fs.contents(kTarget), new_content());
}

struct CrashSweep {
  CrashMode mode;
  bool replace;
  bool checked = false;  // publish_new_content
};

class PublishCrashSweep : public ::testing::TestWithParam<CrashSweep> {};

// Crash after operation N for every N: after the reboot the target is the
// old file (or absent) or the whole new file, never a torn mixture, and
// anything else in the directory is a staging file recovery can recognise.
TEST_P(PublishCrashSweep, TargetIsOldOrWholeNewAfterACrashAtAnyPoint) {
  const CrashSweep sweep = GetParam();
  const std::string old_or_absent = sweep.replace ? kOldContent : "absent";
  std::set<std::string> outcomes;
  bool completed = false;
  for (std::uint64_t n = 1; n <= 64 && !completed; ++n) {
    SCOPED_TRACE(n);
    FaultFileSystem fs(n);
    if (sweep.replace) fs.write_file(kTarget, kOldContent);
    auto dir = fs.open_directory("/run", true);
    fs.reset_counter();
    fs.crash_after(n, sweep.mode);
    try {
      publish_new_content(*dir, sweep.replace, sweep.checked);
      completed = true;
      fs.clear_faults();
      fs.crash(sweep.mode);  // a crash just after publish() returned
    } catch (const SimulatedCrash&) {
      EXPECT_TRUE(fs.crashed());
      EXPECT_SIMULATED_CRASH(dir->list());
      fs.restart();
    } catch (const Error& error) {
      FAIL() << "a crash must not surface as an I/O error: " << error.what();
    }
    EXPECT_SIMULATED_CRASH(dir->list()) << "the handle died with the crash";
    auto rebooted = fs.open_directory("/run", false);
    const std::string state = describe(*rebooted, "model.bin");
    if (completed) {
      EXPECT_EQ(state, new_content());
    } else if (state != old_or_absent) {
      EXPECT_EQ(state, new_content()) << "torn target: " << state.size() << " bytes";
    }
    outcomes.insert(state == old_or_absent ? "old" : "new");
    // Recovery: remove what it recognises as staging files; nothing else may
    // be left.
    for (const std::string& name : rebooted->list()) {
      if (io::is_staging_name(name)) {
        rebooted->unlink(name);
      } else {
        EXPECT_EQ(name, "model.bin");
      }
    }
  }
  EXPECT_TRUE(completed);
  EXPECT_EQ(outcomes, (std::set<std::string>{"old", "new"}));
}

INSTANTIATE_TEST_SUITE_P(Modes, PublishCrashSweep,
                         ::testing::Values(CrashSweep{CrashMode::drop_unsynced, false},
                                           CrashSweep{CrashMode::drop_unsynced, true},
                                           CrashSweep{CrashMode::tear_unsynced, false},
                                           CrashSweep{CrashMode::tear_unsynced, true},
                                           CrashSweep{CrashMode::drop_unsynced, true, true},
                                           CrashSweep{CrashMode::tear_unsynced, false, true}),
                         [](const auto& info) {
                           return std::string(info.param.mode == CrashMode::drop_unsynced ? "drop" : "tear") +
                                  (info.param.replace ? "_replacing" : "_fresh") +
                                  (info.param.checked ? "_checked_while_syncing" : "");
                         });

}  // namespace
}  // namespace holdpoint::testing
