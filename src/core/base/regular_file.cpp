#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "base/fail.h"

namespace holdpoint::io {

namespace {

constexpr int kOpenFlags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;

[[noreturn]] void fail_open(int error, const std::filesystem::path& label, ErrorCode when_absent, bool in_folder) {
  if (error == ENOENT) {
    throw Error(when_absent, detail::concat("cannot open: ", std::strerror(error))).with_path(label.string());
  }
  // With O_NOFOLLOW, ELOOP means the name itself is a symlink.
  if (in_folder && error == ELOOP) {
    throw Error(ErrorCode::io_not_regular_file, "a symlink, which holdpoint never follows inside a folder")
        .with_path(label.string());
  }
  // A directory opens for reading; O_NONBLOCK cannot say EISDIR. Kept for
  // file systems that refuse it at open.
  if (error == EISDIR) throw Error(ErrorCode::io_not_regular_file, "a directory").with_path(label.string());
  throw Error(ErrorCode::io_open_failed, detail::concat("cannot open: ", std::strerror(error))).with_path(label.string());
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

RegularFile checked_regular(FileDescriptor fd, const std::filesystem::path& label) {
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    throw Error(ErrorCode::io_open_failed, detail::concat("cannot stat: ", std::strerror(errno))).with_path(label.string());
  }
  if (!S_ISREG(info.st_mode)) {
    throw Error(ErrorCode::io_not_regular_file, detail::concat(kind_of(info.st_mode), ", not a regular file"))
        .with_path(label.string());
  }
  // Regular files ignore O_NONBLOCK today; cleared so that no later read
  // depends on that.
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    throw Error(ErrorCode::io_open_failed, detail::concat("cannot clear O_NONBLOCK: ", std::strerror(errno)))
        .with_path(label.string());
  }
  return RegularFile{std::move(fd), static_cast<std::uint64_t>(info.st_size)};
}

}  // namespace

RegularFile open_regular_for_reading(const std::filesystem::path& path, ErrorCode when_absent) {
  const int fd = ::open(path.c_str(), kOpenFlags);
  if (fd < 0) fail_open(errno, path, when_absent, false);
  return checked_regular(FileDescriptor(fd), path);
}

RegularFile open_regular_for_reading_at(int directory_fd, const std::string& name, const std::filesystem::path& label,
                                        ErrorCode when_absent) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    throw Error(ErrorCode::invalid_argument, "'" + name + "' is not a single name inside the folder")
        .with_path(label.string());
  }
  const int fd = ::openat(directory_fd, name.c_str(), kOpenFlags | O_NOFOLLOW);
  if (fd < 0) fail_open(errno, label, when_absent, true);
  return checked_regular(FileDescriptor(fd), label);
}

FileDescriptor open_directory_for_reading(const std::filesystem::path& path, ErrorCode when_absent) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) return FileDescriptor(fd);
  const int error = errno;
  if (error == ENOENT) {
    throw Error(when_absent, detail::concat("cannot open: ", std::strerror(error))).with_path(path.string());
  }
  throw Error(ErrorCode::io_open_failed, detail::concat("cannot open directory: ", std::strerror(error)))
      .with_path(path.string());
}

}  // namespace holdpoint::io
