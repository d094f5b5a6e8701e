#include "io/staged_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "common/fail.h"

namespace holdpoint::io {

using detail::fail;

namespace {

constexpr std::size_t kBlockBytes = std::size_t{1} << 20;
constexpr int kBlockCount = 4;
// Writeback is started every this many bytes so that the final fsync finds
// most of the file already on its way to the disk.
constexpr std::uint64_t kWritebackBytes = std::uint64_t{32} << 20;

std::filesystem::path directory_of(const std::filesystem::path& path) {
  auto parent = path.parent_path();
  return parent.empty() ? std::filesystem::path(".") : parent;
}

}  // namespace

void sync_directory_of(const std::filesystem::path& path) {
  const auto directory = directory_of(path);
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(ErrorCode::io_sync_failed, detail::concat("cannot open directory ", directory.string(), ": ",
                                                          std::strerror(errno)));
  }
  const int result = ::fsync(fd);
  const int error_number = errno;
  ::close(fd);
  if (result != 0) {
    throw Error(ErrorCode::io_sync_failed,
                detail::concat("fsync of directory ", directory.string(), " failed: ", std::strerror(error_number)));
  }
}

std::unique_ptr<StagedFile> StagedFile::create(const std::filesystem::path& target) {
  const auto name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw Error(ErrorCode::invalid_argument, detail::concat("not a file path: ", target.string()));
  }
  const auto directory = directory_of(target);
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd < 0) {
    throw Error(ErrorCode::io_open_failed,
                detail::concat("cannot open directory: ", std::strerror(errno))).with_path(directory.string());
  }
  std::random_device random;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string staging_name = detail::concat(".", name, kStagingMarker, ::getpid(), "-", random());
    const int fd = ::openat(directory_fd, staging_name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                            0644);
    if (fd >= 0) {
      return std::unique_ptr<StagedFile>(new StagedFile(target, directory / staging_name, directory_fd, fd));
    }
    if (errno != EEXIST) {
      const int error_number = errno;
      ::close(directory_fd);
      throw Error(ErrorCode::io_open_failed,
                  detail::concat("cannot create staging file: ", std::strerror(error_number)))
          .with_path((directory / staging_name).string());
    }
  }
  ::close(directory_fd);
  throw Error(ErrorCode::io_open_failed, "could not find a free staging name").with_path(target.string());
}

StagedFile::StagedFile(std::filesystem::path target, std::filesystem::path staging, int directory_fd, int fd)
    : target_(std::move(target)), staging_path_(std::move(staging)), directory_fd_(directory_fd), fd_(fd) {
  blocks_.assign(kBlockCount, std::vector<std::byte>(kBlockBytes));
  block_busy_.assign(kBlockCount, false);
  hash_thread_ = std::thread([this] { hash_loop(); });
}

StagedFile::~StagedFile() {
  stop_hasher();
  if (fd_ >= 0) ::close(fd_);
  if (directory_fd_ >= 0) ::close(directory_fd_);
}

void StagedFile::fail_io(int error_number, const char* what) const {
  const ErrorCode code = std::strcmp(what, "fsync") == 0 ? ErrorCode::io_sync_failed : ErrorCode::io_write_failed;
  throw Error(code, detail::concat(what, " failed at byte ", position_, ": ", std::strerror(error_number)))
      .with_path(staging_path_.string());
}

void StagedFile::write_to_file(const std::byte* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd_, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_io(errno, "write");
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void StagedFile::hash_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping with nothing left
    Piece piece = queue_.front();
    queue_.pop_front();
    hasher_busy_ = true;
    lock.unlock();
    hasher_.update(piece.data, piece.size);
    lock.lock();
    hasher_busy_ = false;
    if (piece.block >= 0) block_busy_[static_cast<std::size_t>(piece.block)] = false;
    work_done_.notify_all();
  }
}

void StagedFile::submit(Piece piece) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(piece);
  }
  work_ready_.notify_one();
}

void StagedFile::flush_block() {
  if (block_fill_ == 0) return;
  const auto index = static_cast<std::size_t>(current_block_);
  write_to_file(blocks_[index].data(), block_fill_);
  {
    std::lock_guard lock(mutex_);
    block_busy_[index] = true;
  }
  submit({blocks_[index].data(), block_fill_, current_block_});
  current_block_ = (current_block_ + 1) % kBlockCount;
  block_fill_ = 0;
  std::unique_lock lock(mutex_);
  work_done_.wait(lock, [this] { return !block_busy_[static_cast<std::size_t>(current_block_)]; });
}

void StagedFile::write(std::span<const std::byte> bytes) {
  if (state_ != State::open) fail(ErrorCode::write_state_invalid, "write after finish or abandon");
  while (!bytes.empty()) {
    auto& block = blocks_[static_cast<std::size_t>(current_block_)];
    const std::size_t take = std::min(bytes.size(), block.size() - block_fill_);
    std::memcpy(block.data() + block_fill_, bytes.data(), take);
    block_fill_ += take;
    position_ += take;
    bytes = bytes.subspan(take);
    if (block_fill_ == block.size()) flush_block();
  }
}

void StagedFile::write_stable(std::span<const std::byte> bytes) {
  if (state_ != State::open) fail(ErrorCode::write_state_invalid, "write after finish or abandon");
  if (bytes.size() < kBlockBytes / 4) {
    write(bytes);
    return;
  }
  flush_block();
  // Large spans go to the kernel straight from the caller's memory and are
  // hashed in place by the worker, in order with everything before them.
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t piece = std::min<std::size_t>(bytes.size() - done, std::size_t{8} << 20);
    write_to_file(bytes.data() + done, piece);
    submit({bytes.data() + done, piece, -1});
    done += piece;
    position_ += piece;
    if (position_ - writeback_started_ >= kWritebackBytes) {
      ::sync_file_range(fd_, static_cast<off64_t>(writeback_started_),
                        static_cast<off64_t>(position_ - writeback_started_), SYNC_FILE_RANGE_WRITE);
      writeback_started_ = position_;
    }
  }
}

Sha256Digest StagedFile::finish(bool durable) {
  if (state_ != State::open) fail(ErrorCode::write_state_invalid, "finish after finish or abandon");
  flush_block();
  {
    std::unique_lock lock(mutex_);
    work_done_.wait(lock, [this] { return queue_.empty() && !hasher_busy_; });
  }
  stop_hasher();
  if (durable && ::fsync(fd_) != 0) fail_io(errno, "fsync");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_io(errno, "close");
  state_ = State::finished;
  return hasher_.finish();
}

void StagedFile::commit(bool durable) {
  if (state_ != State::finished) fail(ErrorCode::write_state_invalid, "commit before finish");
  const auto staging_name = staging_path_.filename().string();
  const auto target_name = target_.filename().string();
  if (::renameat(directory_fd_, staging_name.c_str(), directory_fd_, target_name.c_str()) != 0) {
    throw Error(ErrorCode::io_rename_failed,
                detail::concat("rename from ", staging_name, " failed: ", std::strerror(errno)))
        .with_path(target_.string());
  }
  state_ = State::committed;
  if (durable && ::fsync(directory_fd_) != 0) {
    throw Error(ErrorCode::io_sync_failed, detail::concat("fsync of the directory failed: ", std::strerror(errno)))
        .with_path(target_.string());
  }
}

void StagedFile::stop_hasher() noexcept {
  if (!hash_thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  work_ready_.notify_all();
  hash_thread_.join();
}

void StagedFile::abandon() noexcept {
  if (state_ == State::committed || state_ == State::abandoned) return;
  stop_hasher();
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  ::unlinkat(directory_fd_, staging_path_.filename().c_str(), 0);
  state_ = State::abandoned;
}

}  // namespace holdpoint::io
