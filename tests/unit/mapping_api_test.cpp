// The public mapping API end to end: save_mapping -> file -> load_checkpoint_mapping,
// digests and sidecars, staging-file hygiene, zero-copy views into the snapshot,
// and the reader's record-level policy on whole archives.
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <numeric>

#include "format/pt_reader.h"
#include "format/zip/zip_reader.h"
#include "format/zip/zip_writer.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/byte_sink.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::bytes_of;
using testing::read_file_bytes;
using testing::TempDir;
using testing::write_file_bytes;

template <typename T>
TensorData make_tensor(DType dtype, std::vector<std::int64_t> sizes, const std::vector<T>& values) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(T));
  return TensorData::from_bytes(dtype, std::move(sizes), bytes);
}

Value sample_mapping() {
  Dict model;
  model.insert("w", Value::tensor(make_tensor<float>(DType::float32, {2, 3}, {1, 2, 3, 4, 5, 6})));
  model.insert("b", Value::tensor(make_tensor<double>(DType::float64, {3}, {0.5, -1.5, 2.5})));
  model.insert("steps", Value::tensor(make_tensor<std::int64_t>(DType::int64, {}, {42})));
  Dict root;
  root.insert("model", Value::ordered_dict(std::move(model)));
  root.insert("epoch", Value::integer(7));
  root.insert("name", Value::string("h\xc3\xa9llo"));
  root.insert("flags", Value::list({Value::boolean(true), Value::none(), Value::tuple({Value::integer(-1)})}));
  return Value::dict(std::move(root));
}

std::size_t count_files(const std::filesystem::path& directory) {
  return static_cast<std::size_t>(std::distance(std::filesystem::directory_iterator(directory),
                                                std::filesystem::directory_iterator()));
}

TEST(MappingApi, SaveThenLoadRoundTripsContentAndDigest) {
  TempDir dir;
  const auto path = dir / "state.pt";
  const Value original = sample_mapping();
  const SaveResult saved = save_mapping(path, original);
  EXPECT_EQ(saved.tensor_count, 3u);
  EXPECT_EQ(saved.storage_count, 3u);
  EXPECT_EQ(saved.file_bytes, std::filesystem::file_size(path));
  EXPECT_EQ(saved.sha256, Sha256::of(read_file_bytes(path)));

  const LoadedMapping loaded = load_checkpoint_mapping(path);
  EXPECT_EQ(loaded.format, FileFormat::pytorch_zip);
  // No digest expected, none asked for: the load computes none.
  EXPECT_EQ(loaded.sha256, std::nullopt);
  EXPECT_FALSE(loaded.digest_checked);
  LoadOptions hashing;
  hashing.compute_sha256 = true;
  const LoadedMapping hashed = load_checkpoint_mapping(path, hashing);
  EXPECT_EQ(hashed.sha256, std::optional<Sha256Digest>(saved.sha256));
  EXPECT_FALSE(hashed.digest_checked);
  EXPECT_EQ(describe_difference(original, loaded.root), "");
  EXPECT_EQ(loaded.markers.archive_name, "archive");
  EXPECT_EQ(loaded.markers.version, std::optional<std::uint64_t>(3));
  EXPECT_EQ(loaded.markers.byteorder, std::optional<std::string>("little"));
  // The file and its sidecar (written by default), and no staging file.
  EXPECT_EQ(count_files(dir.path()), 2u) << "no staging file may remain";
  EXPECT_TRUE(std::filesystem::exists(dir / "state.pt.sha256"));
}

// More than 65,535 storages means more than 65,535 zip records: the end
// record's 16-bit counts saturate and only the zip64 records hold the truth.
// Keys are unicode and the values nest, so the whole path is exercised.
TEST(MappingApi, MoreThan65535RecordsWithUnicodeKeysRoundTrip) {
  TempDir dir;
  constexpr int kTensors = 65'600;
  Dict layers;
  for (int i = 0; i < kTensors; ++i) {
    const std::int32_t values[2] = {i, -i};
    layers.insert("couche_\xc3\xa9_" + std::to_string(i),
                  Value::tensor(TensorData::from_bytes(
                      DType::int32, {2}, std::span<const std::byte>(reinterpret_cast<const std::byte*>(values), 8))));
  }
  Dict root;
  root.insert("\xe6\xa8\xa1\xe5\x9e\x8b", Value::ordered_dict(std::move(layers)));
  root.insert("nested", Value::list({Value::tuple({Value::dict(), Value::list({Value::string("\xf0\x9f\x98\x80")})})}));
  const Value original = Value::dict(std::move(root));
  const auto path = dir / "many.pt";
  const SaveResult saved = save_mapping(path, original);
  EXPECT_EQ(saved.storage_count, static_cast<std::uint64_t>(kTensors));
  const LoadedMapping loaded = load_checkpoint_mapping(path);
  EXPECT_EQ(loaded.records.size(), static_cast<std::size_t>(kTensors) + 3);
  EXPECT_EQ(describe_difference(original, loaded.root), "");
}

TEST(MappingApi, LoadedTensorsAreViewsIntoOneSnapshotThatOutlivesTheMapping) {
  TempDir dir;
  const auto path = dir / "state.pt";
  save_mapping(path, sample_mapping());
  std::shared_ptr<const TensorData> w;
  std::shared_ptr<const TensorData> b;
  {
    const LoadedMapping loaded = load_checkpoint_mapping(path);
    const Dict& model = loaded.root.as_dict().at("model").as_dict();
    w = model.at("w").tensor_ptr();
    b = model.at("b").tensor_ptr();
  }
  // Both storages point into the same private buffer, at their record offsets.
  EXPECT_EQ(w->storage->owner(), b->storage->owner());
  ASSERT_EQ(w->storage->nbytes(), 24u);
  float values[6];
  std::memcpy(values, w->storage->data(), sizeof values);
  EXPECT_EQ(values[5], 6.0f);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w->storage->data()) % 64, 0u) << "records are 64-byte aligned";
}

TEST(MappingApi, ExpectedDigestIsCheckedBeforeParsing) {
  TempDir dir;
  const auto path = dir / "state.pt";
  const SaveResult saved = save_mapping(path, sample_mapping());
  LoadOptions options;
  options.expected_sha256 = saved.sha256;
  EXPECT_NO_THROW(load_checkpoint_mapping(path, options));

  // A digest mismatch wins over every parse error: the bytes are never parsed.
  write_file_bytes(path, bytes_of("not a checkpoint at all"));
  EXPECT_ERROR_CODE(load_checkpoint_mapping(path, options), ErrorCode::sha256_mismatch);
  // A digest that is not 64 hex digits is refused where it is read (the
  // options carry a typed digest).
  EXPECT_ERROR_CODE(Sha256Digest::parse(std::string(64, 'z')), ErrorCode::sha256_invalid);
  EXPECT_ERROR_CODE(Sha256Digest::parse("abc"), ErrorCode::sha256_invalid);
}

TEST(MappingApi, ProgressIsReportedUpToTheWholeFile) {
  TempDir dir;
  // 24 MiB: large enough for the threaded read path and several reports.
  std::vector<float> big(6 << 20, 1.5f);
  Dict root;
  root.insert("big", Value::tensor(make_tensor<float>(DType::float32, {6 << 20}, big)));
  const auto path = dir / "big.pt";
  const SaveResult saved = save_mapping(path, Value::dict(std::move(root)));
  for (const bool large : {true, false}) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> reports;
    LoadOptions options;
    options.progress = [&](std::uint64_t done, std::uint64_t total) { reports.emplace_back(done, total); };
    if (large) {
      load_checkpoint_mapping(path, options);
      ASSERT_FALSE(reports.empty());
      EXPECT_EQ(reports.back(), std::make_pair(saved.file_bytes, saved.file_bytes));
      EXPECT_TRUE(std::is_sorted(reports.begin(), reports.end()));
    } else {
      save_mapping(dir / "small.pt", sample_mapping());
      load_checkpoint_mapping(dir / "small.pt", options);
      ASSERT_EQ(reports.size(), 1u);
      EXPECT_EQ(reports[0].first, reports[0].second);
    }
  }
}

TEST(MappingApi, ErrorsNameTheFile) {
  TempDir dir;
  const auto path = dir / "bad.pt";
  write_file_bytes(path, bytes_of("garbage!"));
  try {
    load_checkpoint_mapping(path);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::unknown_format);
    EXPECT_EQ(error.path(), path.string());
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos);
  }
}

TEST(MappingApi, FileSystemErrorsHaveTheirOwnCodes) {
  TempDir dir;
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "missing.pt"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir.path()), ErrorCode::io_not_regular_file);
  write_file_bytes(dir / "empty.pt", {});
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "empty.pt"), ErrorCode::file_empty);
  EXPECT_ERROR_CODE(save_mapping(dir / "no-such-dir" / "x.pt", sample_mapping()), ErrorCode::io_open_failed);
}

TEST(MappingApi, FileLargerThanTheLimitIsRefusedBeforeReading) {
  TempDir dir;
  const auto path = dir / "state.pt";
  save_mapping(path, sample_mapping());
  LoadOptions options;
  options.limits.max_file_bytes = 100;
  EXPECT_ERROR_CODE(load_checkpoint_mapping(path, options), ErrorCode::file_too_large);
}

TEST(MappingApi, FailedSaveLeavesTheOldFileAndNoStagingFile) {
  TempDir dir;
  const auto path = dir / "state.pt";
  save_mapping(path, sample_mapping(), {.write_sidecar = false});  // one file to count
  const auto before = read_file_bytes(path);

  // Complex32 has no legacy storage class: compatibility mode cannot write it,
  // and the failure comes after the staging file was created.
  Dict root;
  root.insert("c", Value::tensor(make_tensor<std::uint16_t>(DType::complex32, {1}, {0, 0})));
  SaveOptions options;
  options.torch_1_13_compatible = true;
  options.write_sidecar = false;
  EXPECT_ERROR_CODE(save_mapping(path, Value::dict(std::move(root)), options), ErrorCode::write_value_unsupported);
  EXPECT_EQ(read_file_bytes(path), before);
  EXPECT_EQ(count_files(dir.path()), 1u);
}

TEST(MappingApi, SidecarIsSha256sumCompatible) {
  TempDir dir;
  const auto path = dir / "state.pt";
  const SaveResult saved = save_mapping(path, sample_mapping());  // writes the sidecar by default
  EXPECT_EQ(read_sha256_sidecar(path), saved.sha256);
  const auto text = read_file_bytes(dir / "state.pt.sha256");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(text.data()), text.size()), saved.sha256.hex() + "  state.pt\n");
  const std::string command = "cd '" + dir.path().string() + "' && sha256sum --status -c state.pt.sha256";
  EXPECT_EQ(std::system(command.c_str()), 0);
}

TEST(MappingApi, MalformedSidecarsAreRejected) {
  TempDir dir;
  const auto path = dir / "state.pt";
  const SaveResult saved = save_mapping(path, sample_mapping(), {.write_sidecar = false});
  const auto sidecar = dir / "state.pt.sha256";
  EXPECT_ERROR_CODE(read_sha256_sidecar(path), ErrorCode::io_open_failed);
  write_file_bytes(sidecar, bytes_of(saved.sha256.hex() + "  other.pt\n"));
  EXPECT_ERROR_CODE(read_sha256_sidecar(path), ErrorCode::sidecar_invalid);
  write_file_bytes(sidecar, bytes_of(saved.sha256.hex() + "  state.pt"));
  EXPECT_ERROR_CODE(read_sha256_sidecar(path), ErrorCode::sidecar_invalid);
  write_file_bytes(sidecar, bytes_of(saved.sha256.hex().substr(1) + "x  state.pt\n"));
  EXPECT_ERROR_CODE(read_sha256_sidecar(path), ErrorCode::sidecar_invalid);
  write_file_bytes(sidecar, bytes_of(saved.sha256.hex() + "  state.pt\n" + saved.sha256.hex() + "  state.pt\n"));
  EXPECT_ERROR_CODE(read_sha256_sidecar(path), ErrorCode::sidecar_invalid);
  write_file_bytes(sidecar, bytes_of(saved.sha256.hex() + " *state.pt\n"));
  EXPECT_EQ(read_sha256_sidecar(path), saved.sha256);
}

TEST(MappingApi, SafetensorsRoundTripThroughTheSameApi) {
  TempDir dir;
  const auto path = dir / "weights.safetensors";
  Dict flat;
  flat.insert("a", Value::tensor(make_tensor<float>(DType::float32, {2}, {1, 2})));
  flat.insert("b", Value::tensor(make_tensor<std::int64_t>(DType::int64, {1, 1}, {9})));
  SaveOptions options;
  options.format = FileFormat::safetensors;
  save_mapping(path, Value::dict(flat), options);
  const LoadedMapping loaded = load_checkpoint_mapping(path);
  EXPECT_EQ(loaded.format, FileFormat::safetensors);
  ASSERT_TRUE(loaded.root.is_dict());
  EXPECT_TRUE(equal_content(loaded.root.as_dict().at("a"), flat.at("a")));
  EXPECT_TRUE(equal_content(loaded.root.as_dict().at("b"), flat.at("b")));
}

TEST(MappingApi, LegacyFormatIsReadOnly) {
  TempDir dir;
  SaveOptions options;
  options.format = FileFormat::pytorch_legacy;
  EXPECT_ERROR_CODE(save_mapping(dir / "x.pt", sample_mapping(), options), ErrorCode::invalid_argument);
}

// ---- record policy on whole archives -----------------------------------------------------

// Writes a valid archive of `root` and returns its records by name.
std::vector<std::pair<std::string, std::vector<std::byte>>> records_of(const Value& root) {
  TempDir dir;
  save_mapping(dir / "x.pt", root);
  auto file = read_file_bytes(dir / "x.pt");
  const auto archive = format::read_zip_directory(file, Limits{});
  std::vector<std::pair<std::string, std::vector<std::byte>>> records;
  for (const auto& entry : archive.entries) {
    const auto bytes = format::zip_entry_bytes(file, entry);
    records.emplace_back(entry.record(), std::vector<std::byte>(bytes.begin(), bytes.end()));
  }
  return records;
}

std::vector<std::byte> archive_of(const std::vector<std::pair<std::string, std::vector<std::byte>>>& records) {
  io::MemorySink sink;
  format::ZipWriter zip(sink, "archive");
  for (const auto& [name, bytes] : records) zip.add_record(name, bytes);
  zip.finish();
  return sink.take();
}

// Parses `file`, whose bytes the result's tensors keep alive.
LoadedMapping parse(std::vector<std::byte> file) {
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(file));
  return parse_checkpoint_bytes(*owned, owned);
}

ErrorCode parse_error(std::vector<std::byte> file) {
  try {
    parse(std::move(file));
  } catch (const Error& error) {
    return error.code();
  }
  ADD_FAILURE() << "the archive was accepted";
  return ErrorCode::invalid_argument;
}

void replace_record(std::vector<std::pair<std::string, std::vector<std::byte>>>& records, const std::string& name,
                    std::string_view value) {
  for (auto& [record, bytes] : records) {
    if (record == name) bytes = bytes_of(value);
  }
}

TEST(RecordPolicy, RebuiltArchiveOfTheSameRecordsIsAccepted) {
  const Value root = sample_mapping();
  const LoadedMapping loaded = parse(archive_of(records_of(root)));
  EXPECT_TRUE(equal_content(loaded.root, root));
}

TEST(RecordPolicy, TorchScriptArchivesAreNamedAsSuch) {
  for (const char* record : {"constants.pkl", "code/__torch__.py", "code/__torch__.py.debug_pkl", "bytecode.pkl",
                             "extra/producer_info.json", ".data/0.pkl", "constants/0"}) {
    auto records = records_of(sample_mapping());
    records.emplace_back(record, bytes_of("x"));
    EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::torchscript_archive) << record;
  }
}

TEST(RecordPolicy, UnknownRecordsAreRejected) {
  for (const char* record : {"notes.txt", "data/00", "data/1x", "data/-1", "DATA.PKL2", "data/0/extra", "data.pkl.bak"}) {
    auto records = records_of(sample_mapping());
    records.emplace_back(record, bytes_of("x"));
    EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::record_unknown) << record;
  }
}

TEST(RecordPolicy, UnreferencedStorageRecordIsRejected) {
  auto records = records_of(sample_mapping());
  records.emplace_back("data/99", bytes_of("smuggled"));
  EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::record_unreferenced);
}

TEST(RecordPolicy, MissingRecordsAreRejected) {
  for (const char* missing : {"data.pkl", "version"}) {
    auto records = records_of(sample_mapping());
    std::erase_if(records, [&](const auto& record) { return record.first == missing; });
    EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::record_missing) << missing;
  }
  auto records = records_of(sample_mapping());
  std::erase_if(records, [](const auto& record) { return record.first == "data/1"; });
  EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::storage_record_missing);
}

TEST(RecordPolicy, VersionRecordIsStrict) {
  const std::vector<std::pair<std::string_view, ErrorCode>> cases = {
      {"abc", ErrorCode::version_invalid},     {"", ErrorCode::version_invalid},
      {" 3", ErrorCode::version_invalid},      {"3\n\n", ErrorCode::version_invalid},
      {"0", ErrorCode::version_unsupported},   {"11", ErrorCode::version_unsupported},
      {"99999999999999999999", ErrorCode::version_invalid}};
  for (const auto& [value, code] : cases) {
    auto records = records_of(sample_mapping());
    replace_record(records, "version", value);
    EXPECT_EQ(parse_error(archive_of(records)), code) << "'" << value << "'";
  }
  for (std::string_view value : {"1", "10", "3", "3\n"}) {
    auto records = records_of(sample_mapping());
    replace_record(records, "version", value);
    EXPECT_NO_THROW(parse(archive_of(records))) << value;
  }
}

TEST(RecordPolicy, DotDataVersionTakesPrecedence) {
  auto records = records_of(sample_mapping());
  records.emplace_back(".data/version", bytes_of("11\n"));
  EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::version_unsupported);
}

TEST(RecordPolicy, ByteorderMustBeLittleOrBig) {
  for (std::string_view value : {"little\n", "LITTLE", "", "middle"}) {
    auto records = records_of(sample_mapping());
    replace_record(records, "byteorder", value);
    EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::byteorder_invalid) << value;
  }
}

TEST(RecordPolicy, BigEndianArchivesAreSwappedOnRead) {
  const Value root = sample_mapping();
  auto records = records_of(root);
  replace_record(records, "byteorder", "big");
  for (auto& [name, bytes] : records) {
    if (!name.starts_with("data/")) continue;
    // Storages here are float32 (w), float64 (b), int64 (steps): keyed 0, 1, 2.
    const std::size_t unit = name == "data/0" ? 4 : 8;
    for (std::size_t i = 0; i < bytes.size(); i += unit) std::reverse(bytes.begin() + i, bytes.begin() + i + unit);
  }
  const LoadedMapping loaded = parse(archive_of(records));
  EXPECT_EQ(describe_difference(loaded.root, root), "");
}

// CRCs are verified while the pickle runs; a damaged record must still be
// reported as damage, ahead of whatever the damaged bytes make the pickle VM
// or the record checks say.
TEST(RecordPolicy, CrcFailureWinsOverEveryLaterError) {
  TempDir dir;
  save_mapping(dir / "x.pt", sample_mapping());
  auto file = read_file_bytes(dir / "x.pt");
  const auto archive = format::read_zip_directory(file, Limits{});
  for (const char* record : {"data.pkl", "version", "byteorder", "data/0"}) {
    auto damaged = file;
    const auto* entry = archive.find(record);
    ASSERT_NE(entry, nullptr);
    damaged[entry->data_offset] ^= std::byte{0x55};
    SCOPED_TRACE(record);
    EXPECT_EQ(parse_error(damaged), ErrorCode::zip_crc_mismatch);
  }
}

TEST(RecordPolicy, CrcFailureOfABigEndianArchiveIsFoundBeforeSwapping) {
  auto records = records_of(sample_mapping());
  replace_record(records, "byteorder", "big");
  auto file = archive_of(records);
  const auto archive = format::read_zip_directory(file, Limits{});
  file[archive.find("data/1")->data_offset + 3] ^= std::byte{1};
  EXPECT_EQ(parse_error(file), ErrorCode::zip_crc_mismatch);
}

TEST(RecordPolicy, ModernMarkersAreReportedAndValidated) {
  auto records = records_of(sample_mapping());
  records.emplace_back(".format_version", bytes_of("1"));
  records.emplace_back(".storage_alignment", bytes_of("64"));
  records.emplace_back(".data/serialization_id", bytes_of("1234567890123456789012345678901234567890"));
  const LoadedMapping loaded = parse(archive_of(records));
  EXPECT_EQ(loaded.markers.format_version, std::optional<std::uint64_t>(1));
  EXPECT_EQ(loaded.markers.storage_alignment, std::optional<std::uint64_t>(64));
  EXPECT_TRUE(loaded.markers.serialization_id.has_value());
  EXPECT_NE(loaded.markers.producer.find("2.7"), std::string::npos);

  replace_record(records, ".storage_alignment", "sixty-four");
  EXPECT_EQ(parse_error(archive_of(records)), ErrorCode::format_version_invalid);
}

TEST(FormatDetection, RecognisableNonCheckpointsGetTheirOwnCodes) {
  EXPECT_EQ(parse_error({}), ErrorCode::file_empty);
  EXPECT_EQ(parse_error(bytes_of("PYTORCH1 and then some")), ErrorCode::pytorch1_prerelease_format);
  EXPECT_EQ(parse_error(bytes_of("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")),
            ErrorCode::git_lfs_pointer);
  std::vector<std::byte> tar(1024, std::byte{0});
  std::memcpy(tar.data() + 257, "ustar", 5);
  EXPECT_EQ(parse_error(tar), ErrorCode::legacy_tar_format);
  EXPECT_EQ(parse_error(bytes_of("hello world")), ErrorCode::unknown_format);
  EXPECT_EQ(parse_error(bytes_of("PK\x05\x06 empty zip")), ErrorCode::unknown_format);
  // A junk prefix before a valid archive: PyTorch would route it to the legacy
  // loader; holdpoint refuses to guess.
  auto file = archive_of(records_of(sample_mapping()));
  file.insert(file.begin(), std::byte{'x'});
  EXPECT_EQ(parse_error(file), ErrorCode::unknown_format);
}

// ---- corruption sweep --------------------------------------------------------------------

// Every single-byte change and every truncation of a small valid file is
// either rejected with a holdpoint::Error or decodes to identical content
// (bytes that do not matter, such as padding). Never a crash or another
// exception type.
TEST(CorruptionSweep, EveryByteFlipAndTruncationIsRejectedOrHarmless) {
  const Value root = sample_mapping();
  TempDir dir;
  save_mapping(dir / "x.pt", root);
  const auto original = read_file_bytes(dir / "x.pt");
  std::size_t rejected = 0;
  std::size_t harmless = 0;
  auto check = [&](std::vector<std::byte> bytes, const std::string& what) {
    try {
      const LoadedMapping loaded = parse_checkpoint_bytes(bytes, nullptr);
      EXPECT_EQ(describe_difference(loaded.root, root), "") << what << " was accepted with different content";
      ++harmless;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& error) {
      ADD_FAILURE() << what << " threw a non-holdpoint exception: " << error.what();
    }
  };
  for (std::size_t i = 0; i < original.size(); ++i) {
    auto bytes = original;
    bytes[i] ^= std::byte{0xFF};
    check(std::move(bytes), "flip at " + std::to_string(i));
  }
  for (std::size_t length = 0; length < original.size(); ++length) {
    check(std::vector<std::byte>(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(length)),
          "truncation to " + std::to_string(length));
  }
  EXPECT_EQ(rejected + harmless, 2 * original.size());
  EXPECT_GT(rejected, original.size()) << "most mutations must be caught";
}

}  // namespace
}  // namespace holdpoint
