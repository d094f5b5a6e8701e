#include "holdpoint/format/scan.h"


#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "base/crc32.h"
#include "base/fail.h"
#include "holdpoint/base/sha256.h"
#include "base/regular_file.h"
#include "base/file_stream.h"
#include "format/signed_digest.h"
#include "format/pt_reader.h"
#include "format/safetensors/safetensors.h"
#include "format/zip/zip_reader.h"
#include "format/zip/zip_stream_checker.h"
#include "format/resume_scan.h"

namespace holdpoint {

using detail::fail;

namespace {

// Reading failed or saw the file change: reported at once, ahead of any
// verdict on the bytes (as read_snapshot reports them).
bool is_read_error(ErrorCode code) {
  return code == ErrorCode::io_read_failed || code == ErrorCode::file_changed_during_read;
}

void read_exactly(int fd, std::byte* out, std::size_t size, std::uint64_t offset, std::uint64_t file_size) {
  const std::size_t got = io::pread_fully(fd, out, size, offset);
  if (got != size) {
    fail(ErrorCode::file_changed_during_read, "file shrank from ", file_size, " to ", offset + got,
         " bytes while being read");
  }
}

// Bytes read before the streaming pass. The pass compares each region with
// the bytes it hashes, so that what was parsed from them is what was hashed.
// Once parsed, the regions are sealed: each keeps only its SHA-256, and the
// pass hashes its bytes of the region to compare (a central directory of a
// million entries is tens of MiB, and nothing needs it after the parse).
class PreReadBytes {
 public:
  PreReadBytes(int fd, std::uint64_t file_size) : fd_(fd), file_size_(file_size) {}

  // [offset, offset + length), inside the file; valid until seal().
  std::span<const std::byte> read(std::uint64_t offset, std::size_t length) {
    Region& region = regions_.emplace_back();
    region.offset = offset;
    region.length = length;
    region.bytes.resize(length);
    read_exactly(fd_, region.bytes.data(), length, offset, file_size_);
    return region.bytes;
  }

  // Replaces each region's bytes by their SHA-256; spans read() returned die.
  void seal() {
    for (Region& region : regions_) {
      region.sealed = Sha256::of(region.bytes);
      std::vector<std::byte>().swap(region.bytes);
    }
    sealed_ = true;
  }

  // The pass's bytes at `offset`, in file order. Regions are compared by
  // digest only, so the first call seals them if the caller has not.
  void compare(std::uint64_t offset, std::span<const std::byte> bytes) {
    if (!sealed_) seal();
    const std::uint64_t end = offset + bytes.size();
    for (Region& region : regions_) {
      const std::uint64_t from = std::max(offset, region.offset);
      const std::uint64_t to = std::min<std::uint64_t>(end, region.offset + region.length);
      if (from >= to) continue;
      const auto size = static_cast<std::size_t>(to - from);
      region.hasher.update(bytes.data() + (from - offset), size);
      region.hashed += size;
      if (region.hashed == region.length && !(region.hasher.finish() == region.sealed)) {
        changed(region.offset, region.offset + region.length);
      }
    }
  }

 private:
  struct Region {
    std::uint64_t offset = 0;
    std::size_t length = 0;
    std::vector<std::byte> bytes;          // until seal()
    Sha256Digest sealed;                   // after it
    Sha256 hasher;                         // of the pass's bytes of the region
    std::size_t hashed = 0;
  };

  [[noreturn]] static void changed(std::uint64_t from, std::uint64_t to) {
    fail(ErrorCode::file_changed_during_read, "bytes [", from, ", ", to,
         ") differ between the read that parsed them and the pass that hashed them");
  }

  int fd_;
  std::uint64_t file_size_;
  std::deque<Region> regions_;  // a deque: adding a region moves no other
  bool sealed_ = false;
};

// The zip reader's view of the file before the pass: every read is kept for
// the comparison.
class PreReadZipSource final : public format::ZipByteSource {
 public:
  PreReadZipSource(PreReadBytes& bytes, std::uint64_t file_size) : bytes_(bytes), file_size_(file_size) {}
  std::uint64_t size() const override { return file_size_; }
  std::span<const std::byte> read(std::uint64_t offset, std::size_t length) override {
    return bytes_.read(offset, length);
  }

 private:
  PreReadBytes& bytes_;
  std::uint64_t file_size_;
};

// Random access into the file, one piece at a time, for the exact error of an
// archive the pass found malformed.
class PreadZipSource final : public format::ZipByteSource {
 public:
  PreadZipSource(int fd, std::uint64_t file_size) : fd_(fd), file_size_(file_size) {}
  std::uint64_t size() const override { return file_size_; }
  std::span<const std::byte> read(std::uint64_t offset, std::size_t length) override {
    scratch_.resize(length);
    read_exactly(fd_, scratch_.data(), length, offset, file_size_);
    return scratch_;
  }

 private:
  int fd_;
  std::uint64_t file_size_;
  std::vector<std::byte> scratch_;
};

// Records come from the pass; tensors get storages without bytes. For a
// verdict, which returns no tensor, storages of one size share one object.
// What a resume's pass keeps and learns besides a tree (format/resume_scan.h).
struct ResumeKeeps {
  std::uint64_t keep_budget = 0;
  const format::ZipEntry* entries = nullptr;  // the archive's, to index records
  std::vector<char> kept;                     // by entry index: a storage record that keeps its bytes
  std::unordered_map<std::size_t, format::AbsentRecord> digests;  // by entry index
  std::unordered_map<const void*, format::AbsentRecord> absent;   // by storage identity
};

// Chooses the storage records that keep their bytes: at most
// kKeptRecordBytes each, smallest first, within the budget.
void choose_kept_records(const format::ZipArchive& archive, ResumeKeeps& resume) {
  std::vector<std::size_t> storages;
  for (std::size_t i = 0; i < archive.entries.size(); ++i) {
    const auto& entry = archive.entries[i];
    if (entry.record().starts_with("data/") && entry.size <= format::kKeptRecordBytes) storages.push_back(i);
  }
  std::sort(storages.begin(), storages.end(),
            [&](std::size_t a, std::size_t b) { return archive.entries[a].size < archive.entries[b].size; });
  resume.kept.assign(archive.entries.size(), 0);
  std::uint64_t total = 0;
  for (const std::size_t i : storages) {
    if (total + archive.entries[i].size > resume.keep_budget) break;
    total += archive.entries[i].size;
    resume.kept[i] = 1;
  }
  resume.entries = archive.entries.data();
}

// Digests every payload that does not keep its bytes as it streams by: the
// entries arrive one after the other, so one state at a time.
class AbsentDigester {
 public:
  explicit AbsentDigester(ResumeKeeps& resume) : resume_(resume) {}
  void operator()(std::size_t index, std::span<const std::byte> piece, bool last) {
    if (resume_.kept[index] || !resume_.entries[index].record().starts_with("data/")) return;
    if (!mac_ || index != index_) {
      index_ = index;
      key_ = io::random_poly1305_key();
      mac_.emplace(key_);
      xxh3_ = io::Xxh3_128();
    }
    mac_->update(piece);
    xxh3_.update(piece);
    if (!last) return;
    format::AbsentRecord& record = resume_.digests[index];
    record.key = key_;
    record.tag = mac_->finish();
    record.xxh3 = xxh3_.finish();
    mac_.reset();
  }

 private:
  ResumeKeeps& resume_;
  std::size_t index_ = 0;
  io::Poly1305Key key_{};
  std::optional<io::Poly1305> mac_;
  io::Xxh3_128 xxh3_;
};

class ScanRecordSource final : public format::ZipRecordSource {
 public:
  ScanRecordSource(const format::ZipStreamChecker& checker, ScanKeeps keeps, ResumeKeeps* resume = nullptr)
      : checker_(checker), keeps_(keeps), resume_(resume) {}
  std::span<const std::byte> record_bytes(const format::ZipEntry& entry) override { return checker_.kept(entry); }
  std::shared_ptr<const Storage> storage(const format::ZipEntry& entry, const format::StorageRequest& request,
                                         bool big_endian) override {
    const auto size = static_cast<std::size_t>(entry.size);
    if (resume_) return resume_storage(entry, big_endian);
    if (keeps_ == ScanKeeps::tree) {
      auto storage = Storage::absent(size);
      locations_.push_back({storage->identity(), entry.data_offset, entry.size, entry.crc32});
      index_records_.emplace(storage->identity(), &entry);
      return storage;
    }
    // Integer storages may hold a sparse tensor's indices, which read_absent
    // reads back: each its own, so that its identity names its record.
    if (request.dtype == DType::int64 || request.dtype == DType::int32) {
      auto storage = Storage::absent(size);
      index_records_.emplace(storage->identity(), &entry);
      kept_absent_.push_back(storage);
      return storage;
    }
    std::shared_ptr<const Storage>& shared = by_size_[size];
    if (!shared) shared = Storage::absent(size);
    return shared;
  }
  std::vector<StorageLocation> take_locations() { return std::move(locations_); }

  // PickleOptions::read_absent: a record's bytes read again from the file,
  // which must still have the CRC-32 the stream checked.
  std::shared_ptr<const Storage> read_absent(int fd, std::uint64_t file_size, const Storage& absent) const {
    const auto found = index_records_.find(absent.identity());
    if (found == index_records_.end()) {
      fail(ErrorCode::invalid_argument, "scan: a storage without bytes that names no record of this archive");
    }
    const format::ZipEntry& entry = *found->second;
    std::vector<std::byte> bytes(static_cast<std::size_t>(entry.size));
    read_exactly(fd, bytes.data(), bytes.size(), entry.data_offset, file_size);
    if (io::crc32_of(bytes) != entry.crc32) {
      fail(ErrorCode::file_changed_during_read, "record ", entry.record(), " changed after the scan streamed it");
    }
    return Storage::copy_of(bytes);
  }

 private:
  std::shared_ptr<const Storage> resume_storage(const format::ZipEntry& entry, bool big_endian) {
    if (big_endian) {
      fail(ErrorCode::byteorder_unsupported, "a resume in place reads little-endian archives only; record ",
           entry.record(), " is big-endian");
    }
    const auto index = static_cast<std::size_t>(&entry - resume_->entries);
    if (resume_->kept[index]) return Storage::copy_of(checker_.kept(entry));
    auto storage = Storage::absent(static_cast<std::size_t>(entry.size));
    format::AbsentRecord record = resume_->digests.at(index);
    record.offset = entry.data_offset;
    record.size = entry.size;
    resume_->absent.emplace(storage->identity(), record);
    return storage;
  }

  const format::ZipStreamChecker& checker_;
  ScanKeeps keeps_;
  ResumeKeeps* resume_;
  std::vector<StorageLocation> locations_;
  std::unordered_map<const void*, const format::ZipEntry*> index_records_;  // by storage identity
  std::vector<std::shared_ptr<const Storage>> kept_absent_;  // so that no identity is reused
  std::unordered_map<std::size_t, std::shared_ptr<const Storage>> by_size_;
};

// The tree a verdict returns, as PickleOptions::drop_tensors reads it: no
// dict entry for a tensor, None for one in a list or tuple (for the
// safetensors and legacy paths, which build the tree first).
Value without_tensors(const Value& value, bool root = true) {
  if (value.is_tensor() || value.is_sparse_tensor()) return root ? value : Value::none();
  if (value.is_sequence()) {
    Value::List items;
    items.reserve(value.as_list().size());
    for (const Value& item : value.as_list()) items.push_back(without_tensors(item, false));
    return value.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  if (value.is_dict()) {
    Dict entries;
    for (const auto& [key, item] : value.as_dict()) {
      if (!item.is_tensor() && !item.is_sparse_tensor()) entries.insert(key, without_tensors(item, false));
    }
    if (const auto& metadata = value.as_dict().metadata()) entries.set_metadata(*metadata);
    return value.kind() == ValueKind::ordered_dict ? Value::ordered_dict(std::move(entries))
                                                   : Value::dict(std::move(entries));
  }
  return value;
}

// What a verdict keeps of a legacy stream, read whole.
LoadedMapping verdict_of(LoadedMapping mapping) {
  mapping.root = without_tensors(mapping.root);
  mapping.records.clear();
  mapping.snapshot.reset();
  return mapping;
}

// detect_format could not decide from the head: the header length fits the
// file and the header starts with more whitespace than the head holds. The
// run is followed with pread, a piece at a time; a '{' makes it safetensors,
// anything else unknown_format. Only the verdict is kept: a safetensors
// header is read again (and compared with the pass) to be parsed.
FileFormat detect_past_head(int fd, std::uint64_t file_size, std::span<const std::byte> head) {
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | std::to_integer<std::uint64_t>(head[i]);
  const std::uint64_t end = 8 + header_bytes;  // <= file_size, or detect_format would have decided
  std::vector<std::byte> piece(std::size_t{1} << 20);
  for (std::uint64_t at = head.size(); at < end;) {
    const auto size = static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), end - at));
    read_exactly(fd, piece.data(), size, at, file_size);
    if (const auto verdict = format::safetensors_whitespace_verdict({piece.data(), size})) {
      if (*verdict) return FileFormat::safetensors;
      format::fail_unknown_format(head);
    }
    at += size;
  }
  format::fail_unknown_format(head);
}

LoadedMapping scan_open_file(int fd, std::uint64_t file_size, const std::filesystem::path& path,
                             const LoadOptions& options, ScanKeeps keeps, ResumeKeeps* resume = nullptr) {
  const Limits& limits = options.limits;
  PreReadBytes pre_read(fd, file_size);
  std::optional<format::ZipArchive> archive;
  std::optional<format::SafetensorsFile> safetensors;
  std::vector<StorageLocation> locations;  // of the tensors a tree keeps
  bool legacy = false;
  // A verdict reached before the pass waits for the digest check when a digest
  // is expected, as load_checkpoint_mapping checks the digest before parsing;
  // without one, the file is refused at once.
  std::optional<Error> malformed;
  try {
    const auto head = pre_read.read(
        0, static_cast<std::size_t>(std::min<std::uint64_t>(file_size, format::kFormatDetectionBytes)));
    std::optional<FileFormat> detected = format::detect_format(head, file_size);
    if (!detected) detected = detect_past_head(fd, file_size, head);
    switch (*detected) {
      case FileFormat::pytorch_legacy: legacy = true; break;
      case FileFormat::pytorch_zip: {
        PreReadZipSource source(pre_read, file_size);
        archive = format::read_zip_central_directory(source, limits, format::screen_torchscript_record);
        break;
      }
      case FileFormat::safetensors: {
        const auto header_end = format::safetensors_head_bytes(head, file_size, limits);
        const auto header = pre_read.read(0, static_cast<std::size_t>(header_end));
        safetensors = format::read_safetensors_header(
            header, file_size,
            [&locations](std::uint64_t offset, std::uint64_t size) {
              auto storage = Storage::absent(static_cast<std::size_t>(size));
              locations.push_back({storage->identity(), offset, size, std::nullopt});
              return storage;
            },
            limits);
        break;
      }
    }
  } catch (const Error& error) {
    if (is_read_error(error.code()) || !options.expected_sha256) throw;
    malformed = error;
  }
  if (legacy) {
    LoadOptions hashing = options;
    hashing.compute_sha256 = true;  // a scan always reports the file's digest
    LoadedMapping mapping = load_checkpoint_mapping(path, hashing);
    return keeps == ScanKeeps::verdict ? verdict_of(std::move(mapping)) : mapping;
  }
  pre_read.seal();

  std::optional<format::ZipStreamChecker> checker;
  std::optional<AbsentDigester> digester;
  if (archive) {
    if (resume) choose_kept_records(*archive, *resume);
    checker.emplace(*archive, file_size, [&limits, resume, first = archive->entries.data()](const format::ZipEntry& entry) {
      return format::record_bytes_needed(entry, limits) || (resume && resume->kept[&entry - first]);
    });
    if (resume) {
      digester.emplace(*resume);
      checker->observe_payloads(std::ref(*digester));
    }
  }
  const Sha256Digest digest = io::stream_file(
      fd, path.string(), file_size,
      [&](std::uint64_t offset, std::span<const std::byte> bytes) {
        pre_read.compare(offset, bytes);
        if (checker) checker->consume(offset, bytes);
      },
      options.progress);
  if (options.expected_sha256 && !(*options.expected_sha256 == digest)) {
    fail(ErrorCode::sha256_mismatch, "SHA-256 is ", digest.hex(), ", expected ", options.expected_sha256->hex());
  }
  if (malformed) throw *malformed;

  format::ParsedFile parsed;
  if (archive) {
    if (!checker->local_entries_ok()) {
      // The archive is malformed; the checks of the in-memory reader over
      // random access name how, in the order it would.
      PreadZipSource source(fd, file_size);
      format::read_zip_local_entries(source, *archive);
      fail(ErrorCode::file_changed_during_read,
           "the local headers read as the file streamed by differ from those read again afterwards");
    }
    format::check_record_names(*archive);
    checker->check_crcs(limits);
    ScanRecordSource source(*checker, keeps, resume);
    format::InterpretOptions interpret;
    interpret.drop_tensors = keeps == ScanKeeps::verdict;
    interpret.list_records = keeps == ScanKeeps::tree;
    interpret.read_absent = [&source, fd, file_size](const Storage& absent) {
      return source.read_absent(fd, file_size, absent);
    };
    parsed = format::interpret_zip_records(*archive, source, limits, interpret);
    locations = source.take_locations();
  } else {
    parsed = format::parsed_safetensors(std::move(*safetensors));
    if (keeps == ScanKeeps::verdict) {  // the header was small next to the file: drop what it built
      parsed.root = without_tensors(parsed.root);
      parsed.records.clear();
      locations.clear();
    }
  }
  LoadedMapping mapping;
  mapping.root = std::move(parsed.root);
  mapping.format = parsed.format;
  mapping.sha256 = digest;
  mapping.digest_checked = options.expected_sha256.has_value();
  mapping.file_bytes = file_size;
  mapping.markers = std::move(parsed.markers);
  mapping.records = std::move(parsed.records);
  mapping.storage_locations = std::move(locations);
  return mapping;
}

}  // namespace

format::ResumeScan format::scan_for_resume(const io::RegularFile& file, const std::filesystem::path& path,
                                           const LoadOptions& given, std::uint64_t keep_budget) {
  LoadOptions options = given;
  options.expected_sha256 = format::expected_digest(path, given);
  try {
    if (file.size > options.limits.max_file_bytes) {
      fail(ErrorCode::file_too_large, "file is ", file.size, " bytes, above the limit of ",
           options.limits.max_file_bytes, " (Limits::max_file_bytes)");
    }
    ResumeKeeps resume;
    resume.keep_budget = keep_budget;
    ResumeScan result;
    result.mapping = scan_open_file(file.fd.get(), file.size, path, options, ScanKeeps::tree, &resume);
    result.absent = std::move(resume.absent);
    return result;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

LoadedMapping scan_checkpoint(const std::filesystem::path& path, const LoadOptions& given, ScanKeeps keeps) {
  LoadOptions options = given;
  options.expected_sha256 = format::expected_digest(path, given);
  const io::RegularFile file = io::open_regular_for_reading(path);
  try {
    const std::uint64_t size = file.size;
    if (size > options.limits.max_file_bytes) {
      fail(ErrorCode::file_too_large, "file is ", size, " bytes, above the limit of ", options.limits.max_file_bytes,
           " (Limits::max_file_bytes)");
    }
    return scan_open_file(file.fd.get(), size, path, options, keeps);
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

}  // namespace holdpoint
