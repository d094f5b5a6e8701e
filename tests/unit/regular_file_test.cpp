// io::open_regular_for_reading(_at), the one way a reader opens a file:
// everything but a regular file refused before a read (a FIFO used to block
// open() forever), and names inside a folder never followed through a
// symlink (issue 35, points 3 and 6).
#include "base/regular_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <string>

#include "holdpoint/base/file_system.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/format/scan.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;
using testing::error_code_in_child;

class RegularFile : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_file_bytes(dir_ / "file", testing::bytes_of("twelve bytes"));
    ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0644), 0);
    std::filesystem::create_directory(dir_ / "directory");
    ASSERT_EQ(::mknod((dir_ / "device").c_str(), S_IFCHR | 0644, ::makedev(1, 5)), 0);  // /dev/zero
    std::filesystem::create_symlink("file", dir_ / "link");
    std::filesystem::create_symlink("/dev/zero", dir_ / "link_to_device");
    folder_ = ::open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(folder_, 0);
  }
  void TearDown() override { ::close(folder_); }

  std::optional<ErrorCode> code_at(const std::string& name) {
    return testing::error_code_of([&] { io::open_regular_for_reading_at(folder_, name, dir_ / name); });
  }

  TempDir dir_;
  int folder_ = -1;
};

TEST_F(RegularFile, OpensARegularFileBlockingWithItsSize) {
  const io::RegularFile file = io::open_regular_for_reading(dir_ / "file");
  EXPECT_EQ(file.size, 12u);
  EXPECT_EQ(::fcntl(file.fd.get(), F_GETFL) & O_NONBLOCK, 0) << "O_NONBLOCK is cleared once the file is known regular";
  EXPECT_NE(::fcntl(file.fd.get(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_EQ(io::open_regular_for_reading_at(folder_, "file", dir_ / "file").size, 12u);
}

TEST_F(RegularFile, RefusesAFifoADirectoryAndADeviceWithoutBlocking) {
  for (const std::string name : {"fifo", "directory", "device", "link_to_device"}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_CODE(io::open_regular_for_reading(dir_ / name), ErrorCode::io_not_regular_file);
    EXPECT_EQ(code_at(name), ErrorCode::io_not_regular_file) << name;
  }
  try {
    io::open_regular_for_reading(dir_ / "fifo");
  } catch (const Error& error) {
    EXPECT_EQ(error.path(), (dir_ / "fifo").string());
    EXPECT_EQ(error.detail(), "a FIFO, not a regular file");
  }
}

// The path a user names may be a symlink; a name inside a folder may not.
TEST_F(RegularFile, FollowsASymlinkTheUserNamesButNeverOneInsideAFolder) {
  EXPECT_EQ(io::open_regular_for_reading(dir_ / "link").size, 12u);
  EXPECT_EQ(code_at("link"), ErrorCode::io_not_regular_file);
}

TEST_F(RegularFile, AtTakesOnlyASingleNameInsideTheFolder) {
  std::filesystem::create_directory(dir_ / "sub");
  testing::write_file_bytes(dir_ / "sub" / "file", testing::bytes_of("x"));
  for (const std::string name : {"sub/file", "../file", "..", ".", ""}) {
    EXPECT_EQ(code_at(name), ErrorCode::invalid_argument) << name;
  }
}

TEST_F(RegularFile, AnAbsentFileGetsTheCallersCode) {
  EXPECT_ERROR_CODE(io::open_regular_for_reading(dir_ / "missing"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(io::open_regular_for_reading(dir_ / "missing", ErrorCode::dcp_item_missing),
                    ErrorCode::dcp_item_missing);
  EXPECT_ERROR_CODE(io::open_regular_for_reading_at(folder_, "missing", dir_ / "missing", ErrorCode::dcp_item_missing),
                    ErrorCode::dcp_item_missing);
}

// Every C++ reader of a file the user names opens it through
// open_regular_for_reading: a FIFO or device there is refused at once.
TEST_F(RegularFile, EveryReaderRefusesAFifoOrDeviceAtOnce) {
  for (const std::string name : {"fifo", "device", "link_to_device"}) {
    SCOPED_TRACE(name);
    const auto path = dir_ / name;
    EXPECT_EQ(error_code_in_child([&] { load_checkpoint_mapping(path); }), "io_not_regular_file");
    EXPECT_EQ(error_code_in_child([&] { scan_checkpoint(path, {}, ScanKeeps::verdict); }), "io_not_regular_file");
    EXPECT_EQ(error_code_in_child([&] { scan_checkpoint(path, {}, ScanKeeps::tree); }), "io_not_regular_file");
    EXPECT_EQ(error_code_in_child([&] { io::read_snapshot(path, 1 << 20); }), "io_not_regular_file");
    EXPECT_EQ(error_code_in_child([&] { VerifyingKey::read_file(path); }), "io_not_regular_file");
  }
  // Names inside a folder: a run directory's and a DCP folder's.
  const auto directory = io::posix_file_system().open_directory(dir_.path(), false);
  EXPECT_EQ(error_code_in_child([&] { directory->read("fifo", 1 << 20); }), "io_not_regular_file");
  EXPECT_EQ(error_code_in_child([&] { directory->map("device", 1 << 20); }), "io_not_regular_file");
  EXPECT_EQ(error_code_in_child([&] { directory->read("link", 1 << 20); }), "io_not_regular_file");
  std::filesystem::create_directory(dir_ / "dcp");
  ASSERT_EQ(::mkfifo((dir_ / "dcp" / ".metadata").c_str(), 0644), 0);
  EXPECT_EQ(error_code_in_child([&] { load_distributed_checkpoint(dir_ / "dcp"); }), "io_not_regular_file");
}

// A FIFO planted as the `.sig` a trust policy reads before the file.
TEST_F(RegularFile, ASignatureThatIsAFifoIsRefusedAtOnce) {
  ASSERT_EQ(::mkfifo((dir_ / "file.sig").c_str(), 0644), 0);
  EXPECT_EQ(error_code_in_child([&] { read_signature_file(dir_ / "file"); }), "io_not_regular_file");
  LoadOptions options;
  options.trust = TrustPolicy{};
  EXPECT_EQ(error_code_in_child([&] { load_checkpoint_mapping(dir_ / "file", options); }), "io_not_regular_file");
  EXPECT_EQ(error_code_in_child([&] { scan_checkpoint(dir_ / "file", options, ScanKeeps::verdict); }), "io_not_regular_file");
}

}  // namespace
}  // namespace holdpoint
