#include "schema/in_place_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/fail.h"
#include "holdpoint/base/sha256.h"

namespace holdpoint::schema {

using detail::fail;

namespace {

bool same_time(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

io::FileDescriptor open_journal(const std::filesystem::path& directory) {
  int fd = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // A file system without O_TMPFILE: a named file, unlinked at once.
    std::string name = (directory / ".holdpoint-journal-XXXXXX").string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  if (fd < 0) {
    fail(ErrorCode::io_write_failed, "cannot create the resume journal in ", directory.string(), ": ",
         std::strerror(errno), " (the journal directory option)");
  }
  return io::FileDescriptor(fd);
}

}  // namespace

InPlaceSource::InPlaceSource(const io::RegularFile& file, const struct stat& identity,
                             std::filesystem::path journal_directory)
    : file_(file), identity_(identity), journal_directory_(std::move(journal_directory)), journal_fd_(-1) {}

InPlaceSource::~InPlaceSource() {
  stop_background_ = true;  // the resume ended before begin(): the journal is not needed
  if (background_.joinable()) background_.join();
}

void InPlaceSource::journal_in_background(std::vector<std::pair<std::byte*, std::uint64_t>> ranges) {
  if (ranges.empty()) return;
  background_ = std::thread([this, ranges = std::move(ranges)] {
    try {
      for (const auto& [live, size] : ranges) {
        if (stop_background_) return;
        journal(live, size);
      }
    } catch (...) {
      background_failure_ = std::current_exception();
    }
  });
}

StorageDigests InPlaceSource::storage_digests(StorageDigestKind kind) const {
  StorageDigests digests(kind);
  add_storage_digests(digests);
  return digests;
}

void InPlaceSource::add_storage_digests(StorageDigests& digests) const {
  const StorageDigestKind kind = digests.kind();
  std::vector<std::byte> piece;
  for (const auto& [identity, record] : records_) {
    StorageDigest digest;
    if (kind == StorageDigestKind::xxh3_128) {
      std::copy(record.xxh3.begin(), record.xxh3.end(), digest.bytes.begin());
      digest.size = 16;
    } else {
      // Files that predate "storage_digest": their digests are SHA-256, read
      // again here (the second pass checks the bytes it copies regardless).
      piece.resize(kPieceBytes);
      Sha256 hasher;
      for (std::uint64_t done = 0; done < record.size;) {
        const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(kPieceBytes, record.size - done));
        const ssize_t got = ::pread(file_.fd.get(), piece.data(), size, static_cast<off_t>(record.offset + done));
        if (got <= 0) fail(ErrorCode::io_read_failed, "reading ", size, " bytes at ", record.offset + done, " failed");
        hasher.update(piece.data(), static_cast<std::size_t>(got));
        done += static_cast<std::uint64_t>(got);
      }
      const Sha256Digest sha = hasher.finish();
      std::copy(sha.bytes.begin(), sha.bytes.end(), digest.bytes.begin());
      digest.size = 32;
    }
    digests.set(identity, digest);
  }
}

void InPlaceSource::check_identity() const {
  struct stat now {};
  if (::fstat(file_.fd.get(), &now) != 0) {
    fail(ErrorCode::io_read_failed, "fstat failed: ", std::strerror(errno));
  }
  // Not the change time: unlinking or renaming over the name changes it,
  // while the descriptor still reads the very bytes verified. A write that
  // put the modification time back is caught by the tags.
  if (now.st_dev != identity_.st_dev || now.st_ino != identity_.st_ino || now.st_size != identity_.st_size ||
      !same_time(now.st_mtim, identity_.st_mtim)) {
    fail(ErrorCode::file_changed_during_read,
         "the file changed between the pass that verified it and the pass that applies it (its size or "
         "modification time); nothing was applied");
  }
}

void InPlaceSource::begin() {
  if (background_.joinable()) background_.join();
  if (background_failure_) std::rethrow_exception(std::exchange(background_failure_, nullptr));
  for (const Journaled& entry : journaled_) held_.emplace(entry.live, entry.size);
  check_identity();
}

void InPlaceSource::journal_unless_held(std::byte* live, std::uint64_t size) {
  const auto found = held_.find(live);
  if (found != held_.end() && found->second >= size) return;
  journal(live, size);
  held_[live] = size;
}

void InPlaceSource::journal(std::byte* live, std::uint64_t size) {
  if (journal_fd_.get() < 0) journal_fd_ = open_journal(journal_directory_);
  for (std::uint64_t done = 0; done < size;) {
    const ssize_t put = ::pwrite(journal_fd_.get(), live + done, static_cast<std::size_t>(size - done),
                                 static_cast<off_t>(journal_end_ + done));
    if (put <= 0) {
      fail(ErrorCode::io_write_failed, "writing the resume journal in ", journal_directory_.string(), " failed: ",
           put < 0 ? std::strerror(errno) : "no space", " (nothing was applied)");
    }
    done += static_cast<std::uint64_t>(put);
  }
  // No writeback is started: the journal is dropped when the resume returns,
  // and pages that never reached the disk cost no I/O. Where memory is short
  // (a cgroup's limit) the kernel writes them back and reclaims them.
  journaled_.push_back({live, size, journal_end_});
  journal_end_ += size;
}

void InPlaceSource::read_into(std::byte* destination, const format::AbsentRecord& record, io::Buffer* fresh) {
  io::Poly1305 mac(record.key);
  for (std::uint64_t done = 0; done < record.size;) {
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(kPieceBytes, record.size - done));
    // Fresh memory is faulted in a piece at a time (and leaves huge pages
    // that come back slowly from the host, Buffer::populate).
    if (fresh) fresh->populate(static_cast<std::size_t>(done), size);
    const ssize_t got = ::pread(file_.fd.get(), destination + done, size, static_cast<off_t>(record.offset + done));
    if (got < 0) {
      fail(ErrorCode::io_read_failed, "reading ", size, " bytes at offset ", record.offset + done,
           " failed: ", std::strerror(errno));
    }
    if (got == 0) {
      fail(ErrorCode::file_changed_during_read, "the file ended at ", record.offset + done,
           " while its tensors were applied: it shrank after it was verified");
    }
    mac.update({destination + done, static_cast<std::size_t>(got)});
    done += static_cast<std::uint64_t>(got);
  }
  if (!io::same_tag(mac.finish(), record.tag)) {
    fail(ErrorCode::file_changed_during_read, "the ", record.size, " bytes at offset ", record.offset,
         " differ from those the verifying pass read: the file was changed after it was verified");
  }
  bytes_filled_.fetch_add(record.size);
}

std::string InPlaceSource::restore() noexcept {
  std::string failures;
  for (auto it = journaled_.rbegin(); it != journaled_.rend(); ++it) {
    for (std::uint64_t done = 0; done < it->size;) {
      const ssize_t got = ::pread(journal_fd_.get(), it->live + done, static_cast<std::size_t>(it->size - done),
                                  static_cast<off_t>(it->at + done));
      if (got <= 0) {
        failures += "; the journal could not be read back at " + std::to_string(it->at + done);
        break;
      }
      done += static_cast<std::uint64_t>(got);
    }
  }
  journaled_.clear();
  held_.clear();
  return failures;
}

}  // namespace holdpoint::schema
