// Reader for whole checkpoint files in memory: routes PyTorch zip archives,
// legacy PyTorch streams and safetensors files to their parsers and applies
// the record-level policy of a weights checkpoint (docs/format.md, "Records").
//
// The bytes must be private (a snapshot): a big-endian archive is byte-swapped
// in place, and tensors of the result are zero-copy views that keep `owner`
// alive.
//
// Failure contract: throws holdpoint::Error with the specific code of the
// first check that fails; never executes anything from the file.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "format/pickle/pickle_reader.h"
#include "format/safetensors/safetensors.h"
#include "format/zip/zip_reader.h"
#include "holdpoint/format/loaded_mapping.h"
#include "holdpoint/format/limits.h"

namespace holdpoint::format {

struct ParsedFile {
  Value root;
  FileFormat format = FileFormat::pytorch_zip;
  FormatMarkers markers;
  std::vector<RecordInfo> records;
  std::uint64_t tensor_count = 0;
  std::uint64_t storage_count = 0;
};

// Which parser `file` belongs to; throws the specific code for files that are
// recognisably something else (empty, TorchScript-era containers, tar, Git LFS
// pointers) and unknown_format for anything unrecognised.
FileFormat detect_format(std::span<const std::byte> file);

// The same from the first bytes of a file of `file_size` bytes: `head` holds
// at least min(file_size, kFormatDetectionBytes) of them. nullopt when they
// do not decide (a safetensors-like file whose header starts with more
// whitespace than `head` holds); never a different answer than
// detect_format(file).
inline constexpr std::size_t kFormatDetectionBytes = 512;
std::optional<FileFormat> detect_format(std::span<const std::byte> head, std::uint64_t file_size);
// The unknown_format verdict of detect_format, for a caller that settled the
// undecided case (safetensors_whitespace_verdict false) itself.
[[noreturn]] void fail_unknown_format(std::span<const std::byte> head);

// `context` (holdpoint/format/loaded_mapping.h): a hook before the one
// in-place write (a big-endian byte swap).
ParsedFile read_checkpoint_file(std::span<std::byte> file, const std::shared_ptr<const void>& owner,
                                const Limits& limits, const ParseContext& context = {});

// The ParsedFile of a safetensors file (read_safetensors or
// read_safetensors_header).
ParsedFile parsed_safetensors(SafetensorsFile safetensors);

// ---- the zip path in its steps, for a reader that streams the file ---------------
// read_checkpoint_file runs, for a zip archive: read_zip_directory with
// screen_torchscript_record, check_record_names, verify_zip_crcs, then
// interpret_zip_records. scan_checkpoint (holdpoint/format/scan.h) runs the
// same steps over a file it reads once as a stream.

// The EntryNameScreen naming TorchScript and torch.package archives
// (torchscript_archive) as soon as their directory entry is read.
void screen_torchscript_record(std::string_view name);
// record_unknown for the first record a weights checkpoint does not have.
void check_record_names(const ZipArchive& archive);

// Whether a zip archive still being read into memory (ParseContext::
// await_bytes) is parsed as it arrives: by default where the machine has
// three cores or more (docs/format.md §11). Tests set it to take either way.
enum class ParseWhileRead { by_cores, always, never };
extern std::atomic<ParseWhileRead> parse_while_read_mode;

// Records other than data/<key> hold at most this many bytes; longer ones are
// refused by their size before their bytes are read (each with the code its
// content check would give).
inline constexpr std::uint64_t kMaxSmallRecordBytes = 64;
// Whether interpret_zip_records reads the bytes of `entry`: data.pkl up to
// Limits::max_pickle_bytes, and the other records but data/<key> up to
// kMaxSmallRecordBytes.
bool record_bytes_needed(const ZipEntry& entry, const Limits& limits);

// What interpret_zip_records takes from the file.
class ZipRecordSource {
 public:
  virtual ~ZipRecordSource() = default;
  // The payload of a record for which record_bytes_needed is true.
  virtual std::span<const std::byte> record_bytes(const ZipEntry& entry) = 0;
  // The storage of record `entry` (data/<key>), whose size was checked
  // against `request`. `big_endian`: the archive's byteorder record says big
  // (typed storages only).
  virtual std::shared_ptr<const Storage> storage(const ZipEntry& entry, const StorageRequest& request,
                                                 bool big_endian) = 0;
};

// What interpret_zip_records keeps beyond the verdict.
struct InterpretOptions {
  bool drop_tensors = false;  // PickleOptions::drop_tensors
  // PickleOptions::read_absent, for a source whose storages come without bytes.
  std::function<std::shared_ptr<const Storage>(const Storage& absent)> read_absent;
  bool list_records = true;   // fill ParsedFile::records
  // PickleOptions::on_spent, for data.pkl.
  std::function<void(std::size_t spent_bytes)> on_pickle_spent;
  // Called with a storage record's entry index before the storage is made
  // from it: where the local stage runs entry by entry (ZipLocalEntries),
  // this checks the entry's local header, which sets its data_offset. Empty:
  // every entry was checked before.
  std::function<void(std::size_t entry_index)> before_storage;
};

// The record policy of docs/format.md §4 after the zip checks and CRCs: record
// values, the pickle, the storages it references (none left unreferenced).
ParsedFile interpret_zip_records(const ZipArchive& archive, ZipRecordSource& source, const Limits& limits,
                                 const InterpretOptions& options = {});

// ParsedFile::records for a zip archive: one per entry, in directory order.
std::vector<RecordInfo> list_zip_records(const ZipArchive& archive);

}  // namespace holdpoint::format
