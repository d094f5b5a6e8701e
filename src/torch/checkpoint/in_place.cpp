#include "checkpoint/in_place.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <cerrno>
#include <cstring>

#include "base/fail.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/state/module_state.h"

namespace holdpoint::checkpoint {

using detail::fail;

namespace {

bool same_time(const struct timespec& a, const struct timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

// C-order strides of `sizes`.
bool is_whole_contiguous(const TensorData& tensor) {
  return tensor.is_contiguous() && tensor.storage_offset == 0 && tensor.storage &&
         tensor.logical_bytes() == tensor.storage->nbytes();
}

// Fresh memory for a storage the component adopts: its pages are returned to
// the kernel when the storage dies (handed-over storages do so).
struct FreshMemory {
  std::vector<std::shared_ptr<io::Buffer>> buffers;
};

Value rebuilt(const Value& value, const std::unordered_map<const void*, std::shared_ptr<const Storage>>& filled) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      const TensorData& tensor = value.as_tensor();
      if (!tensor.storage || tensor.storage->has_bytes()) return value;
      const auto it = filled.find(tensor.storage->identity());
      if (it == filled.end()) return value;
      TensorData copy = tensor;
      copy.storage = it->second;
      return Value::tensor(std::move(copy));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      items.reserve(value.as_list().size());
      for (const Value& item : value.as_list()) items.push_back(rebuilt(item, filled));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, rebuilt(item, filled));
      if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default: return value;
  }
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
         std::strerror(errno), " (CheckpointLoadOptions::journal_directory)");
  }
  return io::FileDescriptor(fd);
}

}  // namespace

InPlaceFill::InPlaceFill(const io::RegularFile& file, const struct stat& identity, std::filesystem::path path,
                         std::filesystem::path journal_directory)
    : file_(file), identity_(identity), path_(std::move(path)), journal_directory_(std::move(journal_directory)),
      journal_fd_(-1) {}

InPlaceFill::~InPlaceFill() {
  stop_background_ = true;  // the resume failed before fill(): the journal is not needed
  if (background_.joinable()) background_.join();
}

namespace {

void each_tensor(const Value& value, const std::function<void(const TensorData&)>& visit) {
  if (value.is_tensor()) {
    visit(value.as_tensor());
  } else if (value.is_sequence()) {
    for (const Value& item : value.as_list()) each_tensor(item, visit);
  } else if (value.is_dict()) {
    for (const auto& [key, item] : value.as_dict()) each_tensor(item, visit);
  }
}

}  // namespace

void InPlaceFill::journal_in_background(const std::vector<Component*>& components) {
  for (Component* component : components) {
    if (dynamic_cast<ModuleState*>(component)) journal_sources_.push_back(component->capture(CaptureMode::reference));
  }
  if (journal_sources_.empty()) return;
  background_ = std::thread([this] {
    try {
      for (const Value& source : journal_sources_) {
        each_tensor(source, [this](const TensorData& tensor) {
          if (stop_background_) return;
          if (!tensor.storage || !tensor.storage->has_bytes() || !tensor.is_contiguous() || tensor.itemsize() == 0) return;
          const std::uint64_t start = static_cast<std::uint64_t>(tensor.storage_offset) * tensor.itemsize();
          const std::uint64_t size = tensor.logical_bytes();
          if (size == 0 || start + size > tensor.storage->nbytes()) return;
          journal(const_cast<std::byte*>(tensor.storage->data()) + start, size);
        });
      }
    } catch (...) {
      background_failure_ = std::current_exception();
    }
  });
}

void InPlaceFill::finish_background_journal() {
  if (background_.joinable()) background_.join();
  if (background_failure_) std::rethrow_exception(std::exchange(background_failure_, nullptr));
}

StorageDigests InPlaceFill::storage_digests(StorageDigestKind kind) const {
  StorageDigests digests(kind);
  std::vector<std::byte> piece;
  for (const auto& [identity, record] : absent_) {
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
  return digests;
}

void InPlaceFill::plan(const Value& file, const Value& live,
                       std::unordered_map<const void*, Destination>& destinations) const {
  if (file.is_tensor()) {
    const TensorData& tensor = file.as_tensor();
    if (!tensor.storage || tensor.storage->has_bytes() || !absent_.count(tensor.storage->identity())) return;
    Destination& destination = destinations[tensor.storage->identity()];  // fresh memory unless the live tensor fits
    if (destination.live || !live.is_tensor() || !is_whole_contiguous(tensor)) return;
    const TensorData& target = live.as_tensor();
    if (target.dtype != tensor.dtype || target.sizes.vec() != tensor.sizes.vec() || !target.is_contiguous() ||
        !target.storage || !target.storage->has_bytes() || target.itemsize() == 0) {
      return;
    }
    const std::uint64_t start = static_cast<std::uint64_t>(target.storage_offset) * target.itemsize();
    if (start + tensor.storage->nbytes() > target.storage->nbytes()) return;
    destination.live = const_cast<std::byte*>(target.storage->data()) + start;
    destination.owner = target.storage;
    return;
  }
  if (file.is_dict() && live.is_dict()) {
    for (const auto& [key, item] : file.as_dict()) {
      const Value* counterpart = live.as_dict().find(key);
      plan(item, counterpart ? *counterpart : Value::none(), destinations);
    }
    return;
  }
  if (file.is_sequence()) {
    const bool paired = live.is_sequence() && live.as_list().size() == file.as_list().size();
    for (std::size_t i = 0; i < file.as_list().size(); ++i) {
      plan(file.as_list()[i], paired ? live.as_list()[i] : Value::none(), destinations);
    }
    return;
  }
  if (file.is_dict()) {
    for (const auto& [key, item] : file.as_dict()) plan(item, Value::none(), destinations);
  }
}

void InPlaceFill::check_identity() const {
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

void InPlaceFill::journal(std::byte* live, std::uint64_t size) {
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

void InPlaceFill::read_into(std::byte* destination, const format::AbsentRecord& record, io::Buffer* fresh) {
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

Value InPlaceFill::fill(const Value& root, const std::vector<std::pair<Component*, const Value*>>& states) {
  std::unordered_map<const void*, Destination> destinations;
  for (const auto& [component, state] : states) {
    // Only a model's apply is known to copy every tensor into the live one
    // it replaces (ModuleState); an optimizer adopts fresh memory as its new
    // state, and other components get fresh memory they copy from.
    const bool into_live = dynamic_cast<ModuleState*>(component) != nullptr;
    plan(*state, into_live ? component->capture(CaptureMode::reference) : Value::none(), destinations);
  }
  // Storages elsewhere in the tree (not under a component) stay absent; no
  // component reads them.
  struct Step {
    const void* identity;
    const format::AbsentRecord* record;
    Destination* destination;
  };
  std::vector<Step> order;
  for (auto& [identity, destination] : destinations) order.push_back({identity, &absent_.at(identity), &destination});
  std::sort(order.begin(), order.end(), [](const Step& a, const Step& b) { return a.record->offset < b.record->offset; });

  auto fresh = std::make_shared<FreshMemory>();
  std::unordered_map<const void*, std::shared_ptr<const Storage>> filled;
  try {
    finish_background_journal();
    check_identity();
    std::unordered_map<const std::byte*, std::uint64_t> journaled;  // live start -> bytes
    for (const Journaled& entry : journaled_) journaled.emplace(entry.live, entry.size);
    // Every destination first: the live bytes not journaled yet go to the
    // journal, fresh memory is mapped.
    struct Read {
      std::byte* to;
      const format::AbsentRecord* record;
      io::Buffer* fresh;
    };
    std::vector<Read> reads;
    std::uint64_t total = 0;
    for (auto& [identity, record, destination] : order) {
      if (destination->live) {
        const auto found = journaled.find(destination->live);
        if (found == journaled.end() || found->second < record->size) journal(destination->live, record->size);
        reads.push_back({destination->live, record, nullptr});
      } else {
        fresh->buffers.push_back(io::Buffer::allocate(static_cast<std::size_t>(record->size)));
        reads.push_back({fresh->buffers.back()->data(), record, fresh->buffers.back().get()});
      }
      total += record->size;
    }
    // Then the reads, on two threads: reading from the page cache, the tags
    // and faulting in fresh memory each take a core's time. This thread takes
    // the records up to half the bytes, a helper the rest.
    std::size_t split = 0;
    for (std::uint64_t running = 0; split < reads.size() && running < total / 2; ++split) running += reads[split].record->size;
    std::exception_ptr helper_failure;
    std::thread helper;
    if (split < reads.size() && total >= kParallelReadBytes) {
      helper = std::thread([&] {
        try {
          for (std::size_t i = split; i < reads.size(); ++i) read_into(reads[i].to, *reads[i].record, reads[i].fresh);
        } catch (...) {
          helper_failure = std::current_exception();
        }
      });
    } else {
      split = reads.size();
    }
    std::exception_ptr own_failure;
    try {
      for (std::size_t i = 0; i < split; ++i) read_into(reads[i].to, *reads[i].record, reads[i].fresh);
    } catch (...) {
      own_failure = std::current_exception();
    }
    if (helper.joinable()) helper.join();
    if (own_failure) std::rethrow_exception(own_failure);
    if (helper_failure) std::rethrow_exception(helper_failure);
    // The tree's tensors view the destinations. Fresh memory is handed over
    // (the component may take it as its live state); live memory is not.
    std::size_t next_fresh = 0;
    std::shared_ptr<const void> fresh_owner = fresh;
    for (auto& [identity, record, destination] : order) {
      if (destination->live) {
        filled[identity] = std::make_shared<const Storage>(destination->live, static_cast<std::size_t>(record->size),
                                                           destination->owner);
      } else {
        const std::shared_ptr<io::Buffer>& buffer = fresh->buffers[next_fresh++];
        filled[identity] = std::make_shared<const Storage>(
            buffer->data(), static_cast<std::size_t>(record->size), std::shared_ptr<const void>(fresh_owner, buffer.get()));
      }
    }
  } catch (...) {
    restore();
    throw;
  }
  Value result = rebuilt(root, filled);
  filled.clear();
  destinations.clear();
  hand_over_storages(result, fresh);
  return result;
}

std::string InPlaceFill::restore() noexcept {
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
  return failures;
}

}  // namespace holdpoint::checkpoint
