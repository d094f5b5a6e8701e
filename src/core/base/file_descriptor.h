// FileDescriptor: closes a POSIX file descriptor when it goes out of scope.
//
// Failure contract: close errors in the destructor are ignored (use an
// explicit close where they matter, as WritableFile::close does).
//
// Thread-safety: a plain owning handle; one owner at a time.
#pragma once

#include <unistd.h>

#include <utility>

namespace holdpoint::io {

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

}  // namespace holdpoint::io
