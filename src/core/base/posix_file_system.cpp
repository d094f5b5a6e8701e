#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/fail.h"
#include "base/file_descriptor.h"
#include "base/regular_file.h"
#include "holdpoint/base/file_system.h"

namespace holdpoint::io {

namespace {

[[noreturn]] void fail_errno(ErrorCode code, const std::filesystem::path& path, std::string_view what, int error) {
  std::string detail = detail::concat(what, ": ", std::strerror(error));
  if (error == ELOOP) detail += " (a symlink, which holdpoint never follows here)";
  throw Error(code, std::move(detail)).with_path(path.string());
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void write(std::span<const std::byte> bytes) override {
    const std::byte* data = bytes.data();
    std::size_t left = bytes.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, data, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_errno(ErrorCode::io_write_failed, path_, "write", errno);
      }
      data += n;
      left -= static_cast<std::size_t>(n);
    }
  }

  void start_writeback(std::uint64_t offset, std::uint64_t size) override {
    ::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(size), SYNC_FILE_RANGE_WRITE);
  }

  void sync() override {
    if (::fsync(fd_) != 0) fail_errno(ErrorCode::io_sync_failed, path_, "fsync", errno);
  }

  void close() override {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail_errno(ErrorCode::io_write_failed, path_, "close", errno);
  }

 private:
  int fd_;
  std::filesystem::path path_;
};

class PosixDirectory final : public Directory {
 public:
  PosixDirectory(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  ~PosixDirectory() override { ::close(fd_); }

  const std::filesystem::path& path() const override { return path_; }

  std::unique_ptr<WritableFile> create_exclusive(const std::string& name) override {
    const int fd = ::openat(fd_, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) fail_errno(ErrorCode::io_open_failed, path_ / name, "cannot create exclusively", errno);
    return std::make_unique<PosixWritableFile>(fd, path_ / name);
  }

  Snapshot read(const std::string& name, std::uint64_t max_bytes, const std::optional<Sha256Digest>& expected,
                const ReadProgress& progress, const SnapshotParser& parse) override {
    const FileDescriptor fd = open_to_read(name);
    return read_snapshot_from_fd(fd.get(), (path_ / name).string(), max_bytes, expected, progress, parse);
  }

  Snapshot map(const std::string& name, std::uint64_t max_bytes) override {
    const RegularFile file = open_regular_for_reading_at(fd_, name, path_ / name);
    const std::uint64_t size = file.size;
    if (size > max_bytes) {
      throw Error(ErrorCode::file_too_large, detail::concat("file is ", size, " bytes, above the limit of ", max_bytes))
          .with_path((path_ / name).string());
    }
    Snapshot snapshot;
    try {
      snapshot.buffer = Buffer::map_file(file.fd.get(), static_cast<std::size_t>(size));
    } catch (const Error& error) {
      throw error.with_path((path_ / name).string());
    }
    return snapshot;
  }

  void drop_cached_pages(const std::string& name) override {
    const FileDescriptor fd = open_to_read(name);
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }

  void rename(const std::string& from, const std::string& to, bool replace) override {
    if (replace) {
      if (::renameat(fd_, from.c_str(), fd_, to.c_str()) != 0) {
        fail_errno(ErrorCode::io_rename_failed, path_ / to, "rename from " + from, errno);
      }
      return;
    }
    if (::renameat2(fd_, from.c_str(), fd_, to.c_str(), RENAME_NOREPLACE) == 0) return;
    if (errno != EINVAL && errno != ENOSYS) {
      fail_errno(ErrorCode::io_rename_failed, path_ / to, "rename (no replace) from " + from, errno);
    }
    // File systems without RENAME_NOREPLACE: a hard link fails if the target
    // exists, which gives the same guarantee (docs/publication.md).
    if (::linkat(fd_, from.c_str(), fd_, to.c_str(), 0) != 0) {
      fail_errno(ErrorCode::io_rename_failed, path_ / to, "link from " + from, errno);
    }
    if (::unlinkat(fd_, from.c_str(), 0) != 0) fail_errno(ErrorCode::io_rename_failed, path_ / from, "unlink", errno);
  }

  void link(const std::string& from, const std::string& to) override {
    if (::linkat(fd_, from.c_str(), fd_, to.c_str(), 0) != 0) {
      fail_errno(ErrorCode::io_rename_failed, path_ / to, "link from " + from, errno);
    }
  }

  void unlink(const std::string& name) override {
    if (::unlinkat(fd_, name.c_str(), 0) != 0) fail_errno(ErrorCode::io_write_failed, path_ / name, "unlink", errno);
  }

  void remove_directory(const std::string& name) override {
    if (::unlinkat(fd_, name.c_str(), AT_REMOVEDIR) != 0) {
      fail_errno(ErrorCode::io_write_failed, path_ / name, "rmdir", errno);
    }
  }

  std::vector<std::string> list() override {
    const int copy = ::dup(fd_);
    if (copy < 0) fail_errno(ErrorCode::io_read_failed, path_, "dup", errno);
    DIR* dir = ::fdopendir(copy);
    if (!dir) {
      const int error = errno;
      ::close(copy);
      fail_errno(ErrorCode::io_read_failed, path_, "list", error);
    }
    ::rewinddir(dir);
    std::vector<std::string> names;
    while (const dirent* entry = ::readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  std::optional<FileInfo> stat(const std::string& name) override {
    struct stat info {};
    if (::fstatat(fd_, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return std::nullopt;
      fail_errno(ErrorCode::io_read_failed, path_ / name, "stat", errno);
    }
    FileInfo result;
    result.size = static_cast<std::uint64_t>(info.st_size);
    result.type = S_ISREG(info.st_mode)   ? FileInfo::Type::regular
                  : S_ISDIR(info.st_mode) ? FileInfo::Type::directory
                  : S_ISLNK(info.st_mode) ? FileInfo::Type::symlink
                                          : FileInfo::Type::other;
    return result;
  }

  void sync() override {
    if (::fsync(fd_) != 0) fail_errno(ErrorCode::io_sync_failed, path_, "fsync of the directory", errno);
  }

  std::unique_ptr<Directory> open_subdirectory(const std::string& name, bool create) override {
    if (create) {
      if (::mkdirat(fd_, name.c_str(), 0755) == 0) {
        sync();
      } else if (errno != EEXIST) {
        fail_errno(ErrorCode::io_open_failed, path_ / name, "mkdir", errno);
      }
    }
    const int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail_errno(ErrorCode::io_open_failed, path_ / name, "cannot open directory", errno);
    return std::make_unique<PosixDirectory>(fd, path_ / name);
  }

 private:
  // `name` opened for reading the one way every reader opens a file: never
  // through a symlink, refused unless regular before a read can block
  // (io_not_regular_file).
  FileDescriptor open_to_read(const std::string& name) const {
    return open_regular_for_reading_at(fd_, name, path_ / name).fd;
  }

  int fd_;
  std::filesystem::path path_;
};

class PosixFileSystem final : public FileSystem {
 public:
  std::unique_ptr<Directory> open_directory(const std::filesystem::path& path, bool create) override {
    if (create) {
      // Create missing components one by one, fsyncing each parent, so that
      // a new run directory survives a crash together with what is
      // published in it.
      std::vector<std::filesystem::path> missing;
      for (auto p = path; !p.empty() && !std::filesystem::exists(std::filesystem::symlink_status(p)); p = p.parent_path()) {
        missing.push_back(p);
        if (p == p.parent_path()) break;
      }
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        if (::mkdir(it->c_str(), 0755) != 0 && errno != EEXIST) {
          fail_errno(ErrorCode::io_open_failed, *it, "cannot create directory", errno);
        }
        const auto parent = it->has_parent_path() ? it->parent_path() : std::filesystem::path(".");
        const int parent_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (parent_fd >= 0) {
          const int synced = ::fsync(parent_fd);
          const int error = errno;
          ::close(parent_fd);
          if (synced != 0) fail_errno(ErrorCode::io_sync_failed, parent, "fsync of the directory", error);
        }
      }
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail_errno(ErrorCode::io_open_failed, path, "cannot open directory", errno);
    return std::make_unique<PosixDirectory>(fd, path);
  }
};

}  // namespace

FileSystem& posix_file_system() {
  static PosixFileSystem instance;
  return instance;
}

}  // namespace holdpoint::io
