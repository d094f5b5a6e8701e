#include "format/pt_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "base/reader_thread.h"
#include "format/pickle/legacy_reader.h"
#include "format/pickle/pickle_reader.h"
#include "format/safetensors/safetensors.h"
#include "format/zip/zip_reader.h"
#include "holdpoint/base/snapshot.h"

namespace holdpoint::format {

using detail::fail;

std::atomic<ParseWhileRead> parse_while_read_mode{ParseWhileRead::by_cores};

namespace {

std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

bool starts_with(std::span<const std::byte> file, std::string_view prefix) {
  return file.size() >= prefix.size() && std::memcmp(file.data(), prefix.data(), prefix.size()) == 0;
}

// Records that only TorchScript or torch.package archives have. torch.load on
// torch <= 2.5 hands such archives to the TorchScript unpickler even with
// weights_only=True (CVE-2025-32434), so they get their own code.
bool is_torchscript_record(std::string_view record) {
  return record == "constants.pkl" || record == "bytecode.pkl" || record == "model.json" ||
         record.starts_with("code/") || record.starts_with("constants/") || record.starts_with("extra/") ||
         record.ends_with(".debug_pkl") || (record.starts_with(".data/") && record.ends_with(".pkl"));
}

bool is_canonical_decimal(std::string_view text, std::size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return false;
  if (text.size() > 1 && text[0] == '0') return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The records other than data.pkl and data/<key>: each holds a short text.
bool is_small_record(std::string_view record) {
  return record == "version" || record == ".data/version" || record == "byteorder" || record == ".format_version" ||
         record == ".storage_alignment" || record == ".data/serialization_id";
}

// The text of a small record, refused by its size (with `code`, the code its
// content check would give) before its bytes are read.
std::string_view small_record_text(ZipRecordSource& source, const ZipEntry& entry, ErrorCode code) {
  if (entry.size > kMaxSmallRecordBytes) {
    fail(code, "record '", entry.record(), "' is ", entry.size, " bytes; a valid one has at most ", kMaxSmallRecordBytes);
  }
  return as_text(source.record_bytes(entry));
}

// "3" or "3\n" as torch writes the version records; the value must fit 64 bits.
std::uint64_t parse_decimal_record(std::string_view text, ErrorCode code, std::string_view record) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  if (text.empty() || text.size() > 19 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    fail(code, "record '", record, "' is not a decimal number (", text.size(), " bytes)");
  }
  std::uint64_t value = 0;
  for (char c : text) value = value * 10 + static_cast<std::uint64_t>(c - '0');
  return value;
}

// Elements are stored in the writer's byte order; the snapshot is private,
// so a big-endian archive is swapped in place once per storage.
void swap_to_little_endian(std::span<std::byte> bytes, std::size_t element_bytes) {
  if (element_bytes <= 1) return;
  for (std::size_t i = 0; i + element_bytes <= bytes.size(); i += element_bytes) {
    std::reverse(bytes.begin() + static_cast<std::ptrdiff_t>(i),
                 bytes.begin() + static_cast<std::ptrdiff_t>(i + element_bytes));
  }
}

std::size_t swap_unit(DType dtype) {
  switch (dtype) {
    case DType::complex32:
    case DType::complex64:
    case DType::complex128: return dtype_itemsize(dtype) / 2;
    default: return dtype_itemsize(dtype);
  }
}

// The file in memory: records are read in place, storages are zero-copy views
// that keep `owner` alive. The snapshot is private, so a big-endian archive's
// storages are swapped to little-endian in place, once per storage.
class MemoryRecordSource final : public ZipRecordSource {
 public:
  MemoryRecordSource(std::span<std::byte> file, const std::shared_ptr<const void>& owner)
      : file_(file), owner_(owner) {}

  std::span<const std::byte> record_bytes(const ZipEntry& entry) override {
    return file_.subspan(entry.data_offset, entry.size);
  }

  std::shared_ptr<const Storage> storage(const ZipEntry& entry, const StorageRequest& request,
                                         bool big_endian) override {
    auto bytes = file_.subspan(entry.data_offset, entry.size);
    if (big_endian) swap_to_little_endian(bytes, swap_unit(request.dtype));
    return std::make_shared<const Storage>(bytes.data(), bytes.size(), owner_);
  }

 private:
  std::span<std::byte> file_;
  std::shared_ptr<const void> owner_;
};

class ZipStorageResolver final : public StorageResolver {
 public:
  ZipStorageResolver(const ZipArchive& archive, ZipRecordSource& source, bool big_endian,
                     const std::function<void(std::size_t)>& before_storage)
      : archive_(archive), source_(source), big_endian_(big_endian), before_storage_(before_storage),
        referenced_(archive.entries.size()) {}

  std::shared_ptr<const Storage> resolve(const StorageRequest& request) override {
    const std::string record = "data/" + request.key;
    // Writers store the records in the order the pickle names them: try the
    // entry after the last one first, which stays in cache where a hash probe
    // into a table of many records would miss.
    const auto& entries = archive_.entries;
    const ZipEntry* entry =
        next_ < entries.size() && entries[next_].record() == record ? &entries[next_] : archive_.find(record);
    if (!entry) fail(ErrorCode::storage_record_missing, "storage key '", request.key, "' has no record ", record);
    const auto expected = detail::checked_mul<std::uint64_t>(request.numel, dtype_itemsize(request.dtype));
    if (!expected) {
      fail(ErrorCode::storage_numel_invalid, "storage '", request.key, "': ", request.numel, " x ",
           dtype_itemsize(request.dtype), " bytes overflows");
    }
    if (*expected != entry->size) {
      fail(ErrorCode::storage_size_mismatch, "storage '", request.key, "' declares ", request.numel, " ",
           dtype_name(request.dtype), " elements (", *expected, " bytes) but record ", record, " holds ", entry->size,
           " bytes");
    }
    // An untyped storage learns its dtype only at _rebuild_tensor_v3, too
    // late to swap it once; torch writes big-endian archives only on
    // big-endian hosts, so this combination is refused rather than guessed.
    if (big_endian_ && request.untyped) {
      fail(ErrorCode::byteorder_unsupported, "storage '", request.key,
           "': big-endian archives with untyped storages are not supported");
    }
    const auto index = static_cast<std::size_t>(entry - entries.data());
    if (before_storage_) before_storage_(index);
    auto storage = source_.storage(*entry, request, big_endian_);
    referenced_[index] = true;
    next_ = index + 1;
    return storage;
  }

  bool referenced(std::size_t entry_index) const { return referenced_[entry_index]; }

 private:
  const ZipArchive& archive_;
  ZipRecordSource& source_;
  bool big_endian_;
  const std::function<void(std::size_t)>& before_storage_;
  std::vector<bool> referenced_;  // by entry index
  std::size_t next_ = 0;          // the entry after the last one resolved
};

// list_zip_records for an archive nothing reads afterwards, which it leaves
// empty. At a million records the list is as large as the entry table, and it
// is the load's last allocation, made while the whole tree is held: so the
// lookup table goes first, and the whole pages of the entry table and of the
// name arena (unless a copy of the archive shares it) that are already listed
// go back to the kernel as the list grows. Entries are trivially destructible,
// and a page wholly inside an allocation holds nothing the allocator reads.
std::vector<RecordInfo> take_zip_records(ZipArchive& archive) {
  archive.record_order = std::vector<std::uint32_t>();
  const std::vector<ZipEntry>& entries = archive.entries;
  const bool names_private = archive.names && archive.names.use_count() == 1;
  const auto* entry_bytes = reinterpret_cast<const std::byte*>(entries.data());
  constexpr std::size_t kBatch = 8192;
  std::vector<RecordInfo> records;
  records.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& entry = entries[i];
    records.push_back({std::string(entry.record()), entry.data_offset, entry.size, entry.crc32});
    if ((i + 1) % kBatch != 0 && i + 1 != entries.size()) continue;
    io::release_whole_pages(entry_bytes, (i + 1) * sizeof(ZipEntry));
    if (names_private) {  // the arena holds the names in directory order
      const char* arena = archive.names->data();
      io::release_whole_pages(reinterpret_cast<const std::byte*>(arena),
                              static_cast<std::size_t>(entry.name.data() + entry.name.size() - arena));
    }
  }
  archive = ZipArchive();
  return records;
}

std::string describe_producer(const FormatMarkers& markers) {
  if (markers.format_version) return "torch >= 2.7 (.format_version record)";
  if (markers.serialization_id) return "torch >= 2.1 (.data/serialization_id record)";
  if (markers.byteorder) return "torch >= 2.1 or holdpoint (byteorder record)";
  if (markers.version && *markers.version < 3) return "torch 1.4-1.5 (opt-in zip, archive version < 3)";
  return "torch 1.6-2.0, or another writer that omits byteorder (LibTorch pickle_save)";
}

// Whether `entry` is a storage record (after check_record_names).
bool is_storage_record(const ZipEntry& entry) { return entry.record().starts_with("data/"); }

// Checks the local headers of the records the pickle reads before any storage
// (data.pkl and the small records) and waits for their bytes. Torch writes
// data.pkl first and its version records last, after the storages: those are
// asked for ahead of the storages, so that the pickle can run while the
// storages are still being read.
void check_records_ahead_of_the_pickle(const ZipArchive& archive, ZipLocalEntries& locals, ZipByteSource& bytes,
                                       const Limits& limits, const ParseContext& context) {
  const auto& entries = archive.entries;
  std::uint64_t last_storage = 0;
  for (const ZipEntry& entry : entries) {
    if (is_storage_record(entry)) last_storage = std::max(last_storage, entry.local_header_offset);
  }
  std::uint64_t after_storages = UINT64_MAX;
  for (const ZipEntry& entry : entries) {
    if (!is_storage_record(entry) && entry.local_header_offset >= last_storage) {
      after_storages = std::min(after_storages, entry.local_header_offset);
    }
  }
  if (after_storages != UINT64_MAX) bytes.read_ahead_from(after_storages);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (is_storage_record(entries[i])) continue;
    locals.check(i);
    if (context.await_bytes && record_bytes_needed(entries[i], limits)) {
      context.await_bytes(entries[i].data_offset, entries[i].size);
    }
  }
}

// Whether the pickle runs while the file is still being read: where a core
// is free for each of the reader, the hasher and the parser. On fewer, the
// snapshot is read by the parser's own thread (io::SnapshotReading), so
// reading and parsing would only alternate there, and measured slower than
// reading first and checking every local header in one prefetched pass.
bool parse_while_read() {
  switch (parse_while_read_mode.load(std::memory_order_relaxed)) {
    case ParseWhileRead::always: return true;
    case ParseWhileRead::never: return false;
    case ParseWhileRead::by_cores: break;
  }
  return io::cores_for_reading_while_parsing();
}

ParsedFile read_zip_checkpoint(std::span<std::byte> file, const std::shared_ptr<const void>& owner,
                               const Limits& limits, const ParseContext& context) {
  // The file may still be arriving (ParseContext::await_bytes): the end
  // records and the central directory are asked for first, then the records
  // the pickle reads first, and each storage's local header is checked when
  // the pickle names it. Errors found meanwhile wait for the local stage to
  // complete (ZipLocalEntries::finish), whose own errors come first, as they
  // would had every local header been checked before anything else.
  // Where the pickle is to wait for the read anyway, nothing is asked for
  // ahead of its turn: that would only hold the hasher up.
  const bool overlap = context.await_bytes && parse_while_read();
  ZipMemorySource bytes(file, context.await_bytes, overlap ? context.read_ahead_from : nullptr);
  // TorchScript archives are named as such even when they would fail a zip
  // check first (their code/ records are often deflated).
  ZipArchive archive = read_zip_central_directory(bytes, limits, screen_torchscript_record);
  ZipLocalEntries locals(bytes, archive);
  MemoryRecordSource source(file, owner);
  if (!overlap) {
    // Every byte first, then every local header in one pass (which prefetches
    // ahead), as read_zip_directory checks them.
    if (context.await_bytes) context.await_bytes(0, file.size());
    locals.finish();
  }
  bool swaps_in_place = false;
  try {
    check_record_names(archive);
    check_records_ahead_of_the_pickle(archive, locals, bytes, limits, context);
    const ZipEntry* byteorder = archive.find("byteorder");
    swaps_in_place = byteorder && byteorder->size == 3 && as_text(zip_entry_bytes(file, *byteorder)) == "big";
  } catch (...) {
    locals.finish();
    throw;
  }

  // CRC-32 verification reads every payload byte while the records are
  // interpreted and the pickle runs; neither reads what the other writes, with
  // one exception: a big-endian archive is byte-swapped in place, so it is
  // checked first. A CRC failure is always reported ahead of anything the
  // records said, so a damaged record is reported as damage, not as a strange
  // value.
  if (swaps_in_place) {
    locals.finish();
    if (context.before_in_place_write) context.before_in_place_write();
    if (context.await_bytes) context.await_bytes(0, file.size());
    verify_zip_crcs(archive, file, limits);
    return interpret_zip_records(archive, source, limits);
  }
  ZipCrcWork crcs(archive, file, limits);
  // The pickle's pages go back as the VM leaves them behind, once the hasher
  // has passed them; its CRC-32 is therefore checked first, on this thread.
  InterpretOptions interpret;
  const ZipEntry* pickle = archive.find("data.pkl");
  // The central directory and the end records after it are spent once
  // hashed: the entries were copied out (read_zip_central_directory checked
  // that no record lies past the directory's start).
  // Either the pickle's thread or the CRC helper gets there first.
  std::atomic<bool> directory_released{false};
  const auto release_directory = [&] {
    if (!context.release_spent_bytes || directory_released.exchange(true)) return;
    io::release_whole_pages(file.data() + archive.central_directory_offset,
                            file.size() - archive.central_directory_offset);
  };
  if (context.release_spent_bytes && pickle && pickle->size <= limits.max_pickle_bytes) {
    crcs.check_now(static_cast<std::size_t>(pickle - archive.entries.data()));
    const std::byte* pickle_bytes = file.data() + pickle->data_offset;
    const std::uint64_t pickle_offset = pickle->data_offset;
    interpret.on_pickle_spent = [&context, &release_directory, pickle_bytes, pickle_offset,
                                 size = file.size()](std::size_t spent) {
      const std::size_t hashed = context.bytes_hashed ? context.bytes_hashed() : size;
      // The directory is at the end, so it is hashed once every byte is.
      if (hashed == size) release_directory();
      // Not hashed yet: the next report, or the end of the load, gives them back.
      if (hashed < pickle_offset + spent) return;
      io::release_whole_pages(pickle_bytes, spent);
    };
  }
  interpret.before_storage = [&locals](std::size_t index) { locals.check(index); };
  // The record list is made last, once the pickle's pages are given back: at
  // a million records it is as large as they are.
  interpret.list_records = false;

  // The rest of the records' CRC-32s are shared out between a helper thread,
  // which starts work once the file's SHA-256 is done (where another thread
  // still computes it, that thread is the critical path and has a core of its
  // own), and this thread once the pickle is done. The helper starts with the
  // pickle where every byte is in and every local header checked (placing
  // each payload); otherwise once the pickle has checked them.
  std::exception_ptr digest_failure;
  const auto check_crcs_after_the_digest = [&] {
    try {
      if (context.await_digest) context.await_digest();
    } catch (...) {
      digest_failure = std::current_exception();  // the caller reports the mismatch itself
      return;
    }
    release_directory();
    crcs.work();
  };
  std::jthread crc_helper;
  if (!overlap) crc_helper = std::jthread(check_crcs_after_the_digest);
  ParsedFile parsed;
  std::exception_ptr parse_failure;
  try {
    parsed = interpret_zip_records(archive, source, limits, interpret);
  } catch (...) {
    parse_failure = std::current_exception();
  }
  if (overlap) {
    locals.finish();
    // The CRCs read every payload byte.
    if (context.await_bytes) context.await_bytes(0, file.size());
    crc_helper = std::jthread(check_crcs_after_the_digest);
  }
  crcs.work();
  crc_helper.join();
  if (digest_failure) std::rethrow_exception(digest_failure);
  crcs.finish();
  if (parse_failure) std::rethrow_exception(parse_failure);
  // The pickle has been parsed (every string copied into the tree) and its
  // CRC-32 checked; no tensor views it.
  if (context.release_spent_bytes) {
    io::release_whole_pages(file.data() + pickle->data_offset, static_cast<std::size_t>(pickle->size));
  }
  parsed.records = context.release_spent_bytes ? take_zip_records(archive) : list_zip_records(archive);
  return parsed;
}

}  // namespace

void screen_torchscript_record(std::string_view name) {
  const std::size_t slash = name.find('/');
  const std::string_view record = slash == std::string_view::npos ? name : name.substr(slash + 1);
  if (is_torchscript_record(record)) {
    fail(ErrorCode::torchscript_archive, "record '", record.substr(0, 128),
         "' marks a TorchScript/torch.package archive; it holds code, not just weights");
  }
}

void check_record_names(const ZipArchive& archive) {
  for (const ZipEntry& entry : archive.entries) {
    const std::string_view record = entry.record();
    if (is_small_record(record) || record == "data.pkl") continue;
    if (record.starts_with("data/") && is_canonical_decimal(record.substr(5), 19)) continue;
    fail(ErrorCode::record_unknown, "record '", record, "' (entry ", &entry - archive.entries.data(),
         ") is not one a weights checkpoint has");
  }
}

bool record_bytes_needed(const ZipEntry& entry, const Limits& limits) {
  if (entry.record() == "data.pkl") return entry.size <= limits.max_pickle_bytes;
  return is_small_record(entry.record()) && entry.size <= kMaxSmallRecordBytes;
}

// Everything after the zip structure: record values, the pickle, and the
// storages it references.
ParsedFile interpret_zip_records(const ZipArchive& archive, ZipRecordSource& source, const Limits& limits,
                                 const InterpretOptions& options) {
  ParsedFile parsed;
  parsed.format = FileFormat::pytorch_zip;
  FormatMarkers& markers = parsed.markers;
  markers.archive_name = archive.archive_name;

  // PyTorch prefers .data/version when both exist; both must be sane.
  const ZipEntry* data_version = archive.find(".data/version");
  const ZipEntry* plain_version = archive.find("version");
  if (!data_version && !plain_version) fail(ErrorCode::record_missing, "the archive has no 'version' record");
  for (const ZipEntry* version : {plain_version, data_version}) {
    if (!version) continue;
    markers.version = parse_decimal_record(small_record_text(source, *version, ErrorCode::version_invalid),
                                           ErrorCode::version_invalid, version->record());
    if (*markers.version < 1 || *markers.version > 10) {
      fail(ErrorCode::version_unsupported, "record '", version->record(), "': archive version ", *markers.version,
           " is outside 1..10");
    }
  }
  bool big_endian = false;
  if (const ZipEntry* byteorder = archive.find("byteorder")) {
    const std::string_view value = small_record_text(source, *byteorder, ErrorCode::byteorder_invalid);
    if (value != "little" && value != "big") {
      fail(ErrorCode::byteorder_invalid, "byteorder record is '", value.substr(0, 16), "', not 'little' or 'big'");
    }
    markers.byteorder = std::string(value);
    big_endian = value == "big";
  }
  if (const ZipEntry* entry = archive.find(".format_version")) {
    markers.format_version = parse_decimal_record(
        small_record_text(source, *entry, ErrorCode::format_version_invalid), ErrorCode::format_version_invalid,
        entry->record());
  }
  if (const ZipEntry* entry = archive.find(".storage_alignment")) {
    markers.storage_alignment = parse_decimal_record(
        small_record_text(source, *entry, ErrorCode::format_version_invalid), ErrorCode::format_version_invalid,
        entry->record());
  }
  if (const ZipEntry* entry = archive.find(".data/serialization_id")) {
    const std::string_view value = small_record_text(source, *entry, ErrorCode::format_version_invalid);
    if (value.empty() || value.size() > 64 ||
        !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      fail(ErrorCode::format_version_invalid, "record '.data/serialization_id' is not up to 64 decimal digits");
    }
    markers.serialization_id = std::string(value);
  }

  const ZipEntry* pickle = archive.find("data.pkl");
  if (!pickle) fail(ErrorCode::record_missing, "the archive has no 'data.pkl' record");
  if (pickle->size > limits.max_pickle_bytes) {
    fail(ErrorCode::pickle_too_large, "data.pkl is ", pickle->size, " bytes, above the limit of ",
         limits.max_pickle_bytes, " (Limits::max_pickle_bytes)");
  }
  ZipStorageResolver resolver(archive, source, big_endian, options.before_storage);
  PickleOptions pickle_options;
  pickle_options.drop_tensors = options.drop_tensors;
  pickle_options.read_absent = options.read_absent;
  pickle_options.on_spent = options.on_pickle_spent;
  PickleResult result = read_pickle(source.record_bytes(*pickle), resolver, limits, pickle_options);

  // PyTorch writes exactly the storages its pickle references; anything else
  // is data smuggled past the pickle.
  for (std::size_t i = 0; i < archive.entries.size(); ++i) {
    const ZipEntry& entry = archive.entries[i];
    if (entry.record().starts_with("data/") && !resolver.referenced(i)) {
      fail(ErrorCode::record_unreferenced, "record '", entry.record(), "' is not referenced by data.pkl");
    }
  }

  parsed.root = std::move(result.root);
  parsed.tensor_count = result.tensor_count;
  parsed.storage_count = result.storage_count;
  markers.pickle_protocol = result.protocol;
  markers.uses_binfloat = result.uses_binfloat;
  markers.producer = describe_producer(markers);
  if (options.list_records) parsed.records = list_zip_records(archive);
  return parsed;
}

std::vector<RecordInfo> list_zip_records(const ZipArchive& archive) {
  std::vector<RecordInfo> records;
  records.reserve(archive.entries.size());
  for (const ZipEntry& entry : archive.entries) {
    records.push_back({std::string(entry.record()), entry.data_offset, entry.size, entry.crc32});
  }
  return records;
}

ParsedFile parsed_safetensors(SafetensorsFile safetensors) {
  ParsedFile parsed;
  parsed.format = FileFormat::safetensors;
  parsed.root = std::move(safetensors.root);
  parsed.tensor_count = safetensors.tensors.size();
  parsed.storage_count = safetensors.tensors.size();
  parsed.markers.safetensors_metadata = std::move(safetensors.metadata);
  parsed.markers.producer = "safetensors";
  parsed.records = std::move(safetensors.tensors);
  return parsed;
}

FileFormat detect_format(std::span<const std::byte> file) { return *detect_format(file, file.size()); }

// Every rule but the safetensors one looks at fewer than kFormatDetectionBytes
// bytes; the legacy magic pickle, FRAME included, ends within the first 64.
std::optional<FileFormat> detect_format(std::span<const std::byte> head, std::uint64_t file_size) {
  if (file_size == 0) fail(ErrorCode::file_empty, "the file is empty");
  if (starts_with(head, "PK\x03\x04")) return FileFormat::pytorch_zip;
  if (starts_with(head, "PYTORCH1")) {
    fail(ErrorCode::pytorch1_prerelease_format, "the file starts with PYTORCH1, a pre-release container");
  }
  if (starts_with(head, "version https://git-lfs.github.com/spec/")) {
    fail(ErrorCode::git_lfs_pointer, "the file is a Git LFS pointer, not the checkpoint it points to");
  }
  if (head.size() >= 262 && std::memcmp(head.data() + 257, "ustar", 5) == 0) {
    fail(ErrorCode::legacy_tar_format, "the file is a tar archive (torch < 0.1.10 checkpoints), not supported");
  }
  if (looks_like_legacy_stream(head)) return FileFormat::pytorch_legacy;
  const std::optional<bool> safetensors = looks_like_safetensors(head, file_size);
  if (!safetensors) return std::nullopt;
  if (*safetensors) return FileFormat::safetensors;
  fail_unknown_format(head);
}

void fail_unknown_format(std::span<const std::byte> head) {
  if (starts_with(head, "PK")) {
    fail(ErrorCode::unknown_format, "the file starts like a zip archive but not with a local file header");
  }
  fail(ErrorCode::unknown_format,
       "the file is neither a PyTorch zip archive, a legacy PyTorch stream nor a safetensors file");
}

ParsedFile read_checkpoint_file(std::span<std::byte> file, const std::shared_ptr<const void>& owner,
                                const Limits& limits,
                                const ParseContext& context) {
  if (file.size() > limits.max_file_bytes) {
    fail(ErrorCode::file_too_large, "file is ", file.size(), " bytes, above the limit of ", limits.max_file_bytes);
  }
  // A file still arriving: a zip archive is read as it comes; the other
  // formats are parsed once every byte is in.
  if (context.await_bytes) {
    context.await_bytes(0, 4);
    if (!starts_with(file, "PK\x03\x04")) context.await_bytes(0, file.size());
  }
  switch (detect_format(file)) {
    case FileFormat::pytorch_zip: return read_zip_checkpoint(file, owner, limits, context);
    case FileFormat::pytorch_legacy: {
      LegacyStream stream = read_legacy_stream(file, owner, limits);
      ParsedFile parsed;
      parsed.format = FileFormat::pytorch_legacy;
      parsed.root = std::move(stream.root);
      parsed.tensor_count = stream.object.tensor_count;
      parsed.storage_count = stream.object.storage_count;
      parsed.markers.pickle_protocol = stream.object.protocol;
      parsed.markers.uses_binfloat = stream.object.uses_binfloat;
      parsed.markers.legacy_protocol_version = stream.protocol_version;
      parsed.markers.producer = "torch < 1.6, or _use_new_zipfile_serialization=False (legacy stream)";
      parsed.records = std::move(stream.storages);
      return parsed;
    }
    case FileFormat::safetensors: return parsed_safetensors(read_safetensors(file, owner, limits));
  }
  fail(ErrorCode::unknown_format, "unreachable format");
}

}  // namespace holdpoint::format
