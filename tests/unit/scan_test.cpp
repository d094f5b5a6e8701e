// scan_checkpoint against load_checkpoint_mapping: the same verdict, code and
// structure (root tree, markers, records, SHA-256) on every corpus and fuzz
// corpus file, on written checkpoints, on malformed archives, after every
// single-byte flip and every truncation of small files; tensors without bytes;
// and a file changed while it streams (through the progress callback, which
// runs on the reading thread between chunks).
#include "holdpoint/format/scan.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>

#include "base/reader_thread.h"
#include "format/pt_reader.h"
#include "format/zip/zip_reader.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "support/dropped_tensors.h"
#include "support/test_support.h"
#include "support/zip_builder.h"

namespace holdpoint {
namespace {

using testing::read_file_bytes;
using testing::TempDir;
using testing::write_file_bytes;

// ---- comparing two readings of one file ---------------------------------------------

// Everything a Value says except tensor bytes: kinds, keys, scalars, tensor
// geometry, and which tensors share a storage (storages are numbered in order
// of first appearance).
class StructureText {
 public:
  std::string of(const Value& value) {
    out_.str("");
    write(value);
    return out_.str();
  }

 private:
  void write(const Value& value) {
    out_ << value_kind_name(value.kind()) << '(';
    switch (value.kind()) {
      case ValueKind::none: break;
      case ValueKind::boolean: out_ << value.as_bool(); break;
      case ValueKind::integer: out_ << value.as_int(); break;
      case ValueKind::floating: {
        std::uint64_t bits;
        const double d = value.as_double();
        std::memcpy(&bits, &d, sizeof bits);
        out_ << std::hex << bits << std::dec;
        break;
      }
      case ValueKind::string: out_ << value.as_string().size() << ':' << value.as_string(); break;
      case ValueKind::bytes: out_ << value.as_bytes().size() << ':' << value.as_bytes(); break;
      case ValueKind::big_integer: out_ << big_integer_decimal(value.as_big_integer()); break;
      case ValueKind::bytearray: out_ << value.as_bytes().size() << ':' << value.as_bytes(); break;
      case ValueKind::complex_number:
      case ValueKind::device:
      case ValueKind::dtype:
      case ValueKind::layout:
      case ValueKind::meta_tensor:
      case ValueKind::sparse_tensor: out_ << typed_scalar_text(value); break;
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::set:
      case ValueKind::size:
        for (const Value& item : value.as_list()) write(item);
        break;
      case ValueKind::dict:
      case ValueKind::ordered_dict:
        for (const auto& [key, item] : value.as_dict()) {
          out_ << key.to_string() << '=';
          write(item);
        }
        if (const auto& metadata = value.as_dict().metadata()) {
          out_ << "metadata=";
          write(*metadata);
        }
        break;
      case ValueKind::tensor: {
        const TensorData& t = value.as_tensor();
        const auto [it, inserted] = storages_.emplace(t.storage->identity(), storages_.size());
        out_ << dtype_name(t.dtype) << shape_text(t.sizes) << shape_text(t.strides) << '+' << t.storage_offset
             << " grad=" << t.requires_grad << " param=" << t.is_parameter << " storage " << it->second << " of "
             << t.storage->nbytes();
        break;
      }
    }
    out_ << ')';
  }

  std::ostringstream out_;
  std::map<const void*, std::size_t> storages_;
};

std::string describe(const LoadedMapping& mapping) {
  std::ostringstream out;
  const FormatMarkers& m = mapping.markers;
  out << file_format_name(mapping.format) << ' ' << mapping.sha256->hex() << ' ' << mapping.file_bytes
      << " digest_checked=" << mapping.digest_checked << '\n'
      << "markers " << m.archive_name << ' ' << m.version.value_or(0) << ' ' << m.byteorder.value_or("-") << ' '
      << m.format_version.value_or(0) << ' ' << m.storage_alignment.value_or(0) << ' '
      << m.serialization_id.value_or("-") << ' ' << m.pickle_protocol << ' ' << m.legacy_protocol_version.value_or(0)
      << ' ' << m.uses_binfloat << ' ' << m.producer << '\n';
  for (const auto& [key, value] : m.safetensors_metadata) out << "metadata " << key << '=' << value << '\n';
  for (const RecordInfo& record : mapping.records) {
    out << "record " << record.name << ' ' << record.offset << ' ' << record.size << ' ' << record.crc32 << '\n';
  }
  out << StructureText().of(mapping.root) << '\n';
  return out.str();
}

// A reading's verdict: the error code, or the description of what it read.
struct Outcome {
  std::optional<ErrorCode> code;
  std::string description;
  bool operator==(const Outcome&) const = default;
};

std::ostream& operator<<(std::ostream& out, const Outcome& outcome) {
  if (outcome.code) return out << "error " << error_code_name(*outcome.code);
  return out << "accepted:\n" << outcome.description;
}

template <typename Read>
Outcome outcome_of(Read read) {
  try {
    return {std::nullopt, describe(read())};
  } catch (const Error& error) {
    return {error.code(), {}};
  }
}

Outcome scanned(const std::filesystem::path& path, const LoadOptions& options = {}) {
  return outcome_of([&] { return scan_checkpoint(path, options); });
}
// A scan always hashes the file; the load it is compared with is asked to as well.
LoadOptions hashing(LoadOptions options) {
  options.compute_sha256 = true;
  return options;
}

Outcome loaded(const std::filesystem::path& path, const LoadOptions& options = {}) {
  return outcome_of([&] { return load_checkpoint_mapping(path, hashing(options)); });
}

// A ScanKeeps::verdict scan of `path` gives the load's code, or its reading
// without records and with the tensors dropped (support/dropped_tensors.h).
void expect_verdict_as_load(const std::filesystem::path& path) {
  std::optional<ErrorCode> load_code, verdict_code;
  LoadedMapping full, verdict;
  try {
    full = load_checkpoint_mapping(path, hashing({}));
  } catch (const Error& error) {
    load_code = error.code();
  }
  try {
    verdict = scan_checkpoint(path, {}, ScanKeeps::verdict);
  } catch (const Error& error) {
    verdict_code = error.code();
  }
  EXPECT_EQ(verdict_code, load_code);
  if (load_code || verdict_code) return;
  EXPECT_TRUE(verdict.records.empty());
  EXPECT_TRUE(testing::reads_as_dropped(verdict.root, full.root));
  full.records.clear();
  full.root = verdict.root;  // compared above; describe compares the rest
  EXPECT_EQ(describe(verdict), describe(full));
}

// Every tensor of a scanned zip or safetensors file has a storage without
// bytes.
void expect_no_tensor_bytes(const Value& value) {
  if (value.is_tensor()) {
    EXPECT_FALSE(value.as_tensor().storage->has_bytes());
  } else if (value.is_sequence()) {
    for (const Value& item : value.as_list()) expect_no_tensor_bytes(item);
  } else if (value.is_dict()) {
    for (const auto& [key, item] : value.as_dict()) expect_no_tensor_bytes(item);
  }
}

// The file at `path` reads the same both ways (with and without its right
// digest); with a wrong digest both say sha256_mismatch.
void expect_same_reading(const std::filesystem::path& path) {
  SCOPED_TRACE(path.string());
  const Outcome expected = loaded(path);
  EXPECT_EQ(scanned(path), expected);
  expect_verdict_as_load(path);
  LoadOptions wrong;
  wrong.expected_sha256 = Sha256::of(testing::bytes_of("not this file"));
  EXPECT_EQ(scanned(path, wrong).code, std::optional<ErrorCode>(ErrorCode::sha256_mismatch));
  LoadOptions right;
  right.expected_sha256 = Sha256::of(read_file_bytes(path));
  EXPECT_EQ(scanned(path, right), loaded(path, right));
}

// ---- files to read --------------------------------------------------------------------

template <typename T>
TensorData tensor_of(DType dtype, std::vector<std::int64_t> sizes, const std::vector<T>& values) {
  return TensorData::from_bytes(dtype, std::move(sizes),
                                {reinterpret_cast<const std::byte*>(values.data()), values.size() * sizeof(T)});
}

std::vector<float> ramp(std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 1000) * 0.25f;
  return values;
}

// Views sharing a storage, a parameter, an empty tensor, nested containers,
// floats and bytes.
Value sample_mapping() {
  Dict model;
  TensorData weight = tensor_of<float>(DType::float32, {2, 3}, {1, 2, 3, 4, 5, 6});
  weight.is_parameter = true;
  weight.requires_grad = true;
  TensorData row = weight;
  row.is_parameter = false;
  row.requires_grad = false;
  row.sizes = {3};
  row.strides = {1};
  row.storage_offset = 3;
  model.insert("weight", Value::tensor(std::make_shared<const TensorData>(weight)));
  model.insert("row", Value::tensor(std::make_shared<const TensorData>(row)));
  model.insert("steps", Value::tensor(tensor_of<std::int64_t>(DType::int64, {}, {42})));
  model.insert("empty", Value::tensor(tensor_of<float>(DType::float32, {0}, {})));
  Dict root;
  root.insert("model", Value::ordered_dict(std::move(model)));
  root.insert("epoch", Value::integer(7));
  root.insert("lr", Value::floating(0.125));
  root.insert("tag", Value::bytes("\x01\x02"));
  root.insert("flags", Value::list({Value::boolean(true), Value::none(), Value::tuple({Value::integer(-1)})}));
  return Value::dict(std::move(root));
}

Value flat_mapping(std::size_t tensors, std::size_t floats_each) {
  Dict root;
  for (std::size_t i = 0; i < tensors; ++i) {
    root.insert("t" + std::to_string(i),
                Value::tensor(tensor_of<float>(DType::float32, {static_cast<std::int64_t>(floats_each)},
                                               ramp(floats_each))));
  }
  return Value::ordered_dict(std::move(root));
}

SaveOptions scratch_save(FileFormat format = FileFormat::pytorch_zip) {
  SaveOptions options;
  options.format = format;
  options.durable = false;
  options.write_sidecar = false;
  return options;
}

std::vector<std::filesystem::path> files_under(const std::filesystem::path& directory) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(directory)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// ---- the same reading --------------------------------------------------------------------

TEST(ScanMatchesLoad, EveryCorpusFile) {
  std::size_t accepted = 0;
  std::size_t rejected = 0;
  for (const auto& path : files_under(testing::corpus_dir())) {
    if (path.extension() == ".md" || path.extension() == ".tsv") continue;
    expect_same_reading(path);
    (loaded(path).code ? rejected : accepted) += 1;
  }
  // Both kinds are there: real checkpoints and hostile samples.
  EXPECT_GT(accepted, 30u);
  EXPECT_GT(rejected, 80u);
}

TEST(ScanMatchesLoad, EveryFuzzCorpusFile) {
  for (const char* corpus : {"zip", "reader", "safetensors", "pickle"}) {
    for (const auto& path : files_under(testing::source_dir() / "fuzz" / "corpus" / corpus)) {
      expect_same_reading(path);
    }
  }
}

TEST(ScanMatchesLoad, WrittenCheckpoints) {
  TempDir dir;
  struct Case {
    std::string name;
    Value root;
    SaveOptions options;
  };
  SaveOptions compat = scratch_save();
  compat.torch_1_13_compatible = true;
  std::vector<Case> cases = {
      {"sample.pt", sample_mapping(), scratch_save()},
      {"compat.pt", sample_mapping(), compat},
      {"flat.safetensors", flat_mapping(3, 5), scratch_save(FileFormat::safetensors)},
      // Storages that cross the 8 MiB chunks of the pass, and a header that
      // ends inside one.
      {"chunks.pt", flat_mapping(3, 3'000'000), scratch_save()},
      {"chunks.safetensors", flat_mapping(3, 3'000'000), scratch_save(FileFormat::safetensors)},
      // A central directory of ~250 KiB.
      {"many.pt", flat_mapping(3000, 1), scratch_save()},
  };
  for (const Case& c : cases) {
    const auto path = dir / c.name;
    save_mapping(path, c.root, c.options);
    expect_same_reading(path);
    const LoadedMapping mapping = scan_checkpoint(path);
    expect_no_tensor_bytes(mapping.root);
  }
}

// A tree scan says where each storage's bytes lie: read from there, they are
// the bytes the loaded tensor's storage holds (zip records with their CRC-32,
// safetensors extents without one); a verdict scan, and a load, list none.
TEST(ScanStorageLocations, PointAtEachStoragesBytesInTheFile) {
  TempDir dir;
  for (const FileFormat format : {FileFormat::pytorch_zip, FileFormat::safetensors}) {
    const auto path = dir / (format == FileFormat::safetensors ? "flat.safetensors" : "sample.pt");
    save_mapping(path, format == FileFormat::safetensors ? flat_mapping(4, 1000) : sample_mapping(),
                 scratch_save(format));
    const auto file = read_file_bytes(path);
    const LoadedMapping scanned_tree = scan_checkpoint(path);
    const LoadedMapping read = load_checkpoint_mapping(path);
    EXPECT_FALSE(scanned_tree.storage_locations.empty());
    EXPECT_TRUE(scan_checkpoint(path, {}, ScanKeeps::verdict).storage_locations.empty());
    EXPECT_TRUE(read.storage_locations.empty());
    std::map<const void*, StorageLocation> by_identity;
    for (const StorageLocation& location : scanned_tree.storage_locations) by_identity[location.identity] = location;
    // The two trees list their tensors in the same order.
    std::vector<const TensorData*> scanned_tensors;
    std::vector<const TensorData*> read_tensors;
    const auto collect = [](const Value& root, std::vector<const TensorData*>& out) {
      const std::function<void(const Value&)> walk = [&](const Value& value) {
        if (value.is_tensor()) out.push_back(&value.as_tensor());
        if (value.is_sequence()) for (const Value& item : value.as_list()) walk(item);
        if (value.is_dict()) for (const auto& [key, item] : value.as_dict()) walk(item);
      };
      walk(root);
    };
    collect(scanned_tree.root, scanned_tensors);
    collect(read.root, read_tensors);
    ASSERT_EQ(scanned_tensors.size(), read_tensors.size());
    ASSERT_FALSE(scanned_tensors.empty());
    for (std::size_t i = 0; i < scanned_tensors.size(); ++i) {
      const auto found = by_identity.find(scanned_tensors[i]->storage->identity());
      ASSERT_NE(found, by_identity.end()) << "tensor " << i;
      const StorageLocation& at = found->second;
      ASSERT_LE(at.offset + at.size, file.size());
      const auto expected = read_tensors[i]->storage->bytes();
      ASSERT_EQ(at.size, expected.size());
      EXPECT_EQ(std::memcmp(file.data() + at.offset, expected.data(), expected.size()), 0) << "tensor " << i;
      EXPECT_EQ(at.crc32.has_value(), format == FileFormat::pytorch_zip);
    }
  }
}

TEST(ScanMatchesLoad, MalformedArchiveLayouts) {
  using testing::zip_entry;
  TempDir dir;
  const auto pickle = [] {
    testing::ZipBuilderEntry entry = zip_entry("archive/data.pkl", "\x80\x02}.");
    return entry;
  };
  std::vector<testing::ZipBuilderLayout> layouts;
  const auto add = [&](std::vector<testing::ZipBuilderEntry> entries) {
    testing::ZipBuilderLayout layout;
    layout.entries = std::move(entries);
    layouts.push_back(layout);
    return &layouts.back();
  };
  add({pickle(), zip_entry("archive/version", "3\n")});  // a valid empty mapping
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.gap_before = 5;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.shares_local_header_of = 0;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.descriptor_signature = false;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.descriptor64 = true;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.write_descriptor = false;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.descriptor_crc = 1;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.crc = 0;
    add({pickle(), entry});
  }
  {
    auto entry = zip_entry("archive/version", "3\n");
    entry.local_name = "archive/versioN";
    add({pickle(), entry});
  }
  add({pickle(), zip_entry("archive/version", "3\n")})->gap_before_directory = 3;
  add({pickle(), zip_entry("archive/version", "3\n")})->prefix = testing::bytes_of("junk");
  add({pickle(), zip_entry("archive/version", "3\n")})->trailing = testing::bytes_of("junk");
  add({pickle(), zip_entry("archive/version", "3\n")})->zip64_end = false;
  add({pickle(), zip_entry("archive/version", "3\n")})->comment = testing::bytes_of("c");
  add({pickle(), zip_entry("archive/version", "3\n"), zip_entry("archive/data/0", "abcd")});
  add({pickle(), zip_entry("archive/version", std::string(70, '1'))});
  add({pickle(), zip_entry("archive/byteorder", "little-endian, as it happens, is what this record should say"),
       zip_entry("archive/version", "3\n")});
  add({pickle(), zip_entry("archive/version", "3\n"), zip_entry("archive/constants.pkl", "")});
  add({pickle(), zip_entry("archive/version", "3\n"), zip_entry("archive/notes.txt", "")});
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const auto path = dir / ("layout" + std::to_string(i) + ".pt");
    write_file_bytes(path, testing::build_zip(layouts[i]));
    expect_same_reading(path);
  }
  EXPECT_EQ(scanned(dir / "layout0.pt").code, std::nullopt) << "the unbroken layout reads";
}

// A file of 8 MiB or more is parsed while it is still being read: its end
// first, then the records the pickle reads, then each storage's local header
// when the pickle names it. Damaged in several places, it must still give the
// error a reading in file order gives: the scan's, and that of a parse of the
// whole file in memory.
TEST(ScanMatchesLoad, LargeFilesParsedWhileReadReportTheDamageAReadingInOrderFindsFirst) {
  TempDir dir;
  const auto clean = dir / "clean.pt";
  save_mapping(clean, flat_mapping(9000, 300), scratch_save());
  const auto bytes = read_file_bytes(clean);
  ASSERT_GE(bytes.size(), std::size_t{9} << 20) << "the file must be large enough to be read on a thread of its own";
  const format::ZipArchive archive = format::read_zip_directory(bytes, Limits{});
  const auto entry = [&](std::string_view record) {
    const format::ZipEntry* found = archive.find(record);
    EXPECT_NE(found, nullptr) << record;
    return *found;
  };
  const auto header = [&](std::string_view record) { return entry(record).local_header_offset; };
  const auto payload = [&](std::string_view record) { return entry(record).data_offset + entry(record).size / 2; };
  ASSERT_GT(header("version"), header("data/8999")) << "as in torch's layout, the version record comes last";
  struct Damage {
    std::string name;
    std::vector<std::uint64_t> flips;
    std::optional<ErrorCode> code;  // when the code is plain
  };
  const std::vector<Damage> damages = {
      {"a storage's local header", {header("data/4500")}, ErrorCode::zip_local_header_invalid},
      {"the pickle's payload", {payload("data.pkl")}, ErrorCode::zip_crc_mismatch},
      {"a storage's local header and the pickle", {payload("data.pkl"), header("data/4500")},
       ErrorCode::zip_local_header_invalid},
      {"the last storage's payload and the pickle", {payload("data/8999"), payload("data.pkl")},
       ErrorCode::zip_crc_mismatch},
      {"the version record's local header and an early storage's", {header("version"), header("data/5")},
       ErrorCode::zip_local_header_invalid},
      {"the last storage's local name", {header("data/8999") + 30 + 6}, std::nullopt},
      {"a storage's local name and the pickle", {header("data/6000") + 30 + 6, payload("data.pkl")}, std::nullopt},
  };
  // Parsed as it arrives (as on three cores or more), and after the read.
  // With a reader thread or with the parser's thread reading.
  struct ModeReset {
    ~ModeReset() {
      format::parse_while_read_mode = format::ParseWhileRead::by_cores;
      io::reader_thread_mode = io::ReaderThread::by_cores;
    }
  } reset;
  for (const int way : {0, 1, 2}) {
  format::parse_while_read_mode = way == 2 ? format::ParseWhileRead::never : format::ParseWhileRead::always;
  io::reader_thread_mode = way == 0 ? io::ReaderThread::always : io::ReaderThread::never;
  SCOPED_TRACE(way == 0 ? "parsed while a reader thread reads" : way == 1 ? "parsed as the parser reads" : "parsed after the read");
  EXPECT_EQ(loaded(clean).code, std::nullopt) << "the undamaged file reads";
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    std::vector<std::byte> damaged = bytes;
    for (const std::uint64_t at : damage.flips) damaged[at] ^= std::byte{0x40};
    const auto path = dir / "damaged.pt";
    write_file_bytes(path, damaged);
    const Outcome load = loaded(path);
    ASSERT_TRUE(load.code.has_value()) << "the damage was meant to be refused";
    if (damage.code) {
      EXPECT_EQ(load.code, damage.code);
    }
    Outcome in_memory;
    try {
      parse_checkpoint_bytes(damaged, nullptr);
    } catch (const Error& error) {
      in_memory.code = error.code();
    }
    EXPECT_EQ(load.code, in_memory.code) << "the parse of the whole file in memory";
    expect_same_reading(path);
  }
  }
}

TEST(ScanMatchesLoad, LimitsApplyAlike) {
  TempDir dir;
  const auto path = dir / "sample.pt";
  save_mapping(path, sample_mapping(), scratch_save());
  for (int variant = 0; variant < 4; ++variant) {
    LoadOptions options;
    if (variant == 0) options.limits.max_pickle_bytes = 16;  // data.pkl is not kept: pickle_too_large
    if (variant == 1) options.limits.max_file_bytes = 100;
    if (variant == 2) options.limits.max_records = 3;
    if (variant == 3) options.limits.max_central_directory_bytes = 100;
    SCOPED_TRACE(variant);
    const Outcome expected = loaded(path, options);
    EXPECT_TRUE(expected.code.has_value());
    EXPECT_EQ(scanned(path, options), expected);
  }
}

// Whitespace before a safetensors header's '{' is valid JSON; a run longer
// than the bytes format detection looks at is followed past them.
TEST(ScanMatchesLoad, SafetensorsHeaderWithLongLeadingWhitespace) {
  TempDir dir;
  const std::string header = std::string(3000, ' ') + R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::vector<std::byte> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
  const auto text = testing::bytes_of(header);
  file.insert(file.end(), text.begin(), text.end());
  file.resize(file.size() + 8, std::byte{0x3F});
  const auto good = dir / "spaces.safetensors";
  write_file_bytes(good, file);
  EXPECT_EQ(scanned(good).code, std::nullopt);
  expect_same_reading(good);
  // The same run ending in something other than '{': not safetensors.
  file[8 + 2999] = std::byte{'x'};
  const auto bad = dir / "spaces-then-x.safetensors";
  write_file_bytes(bad, file);
  EXPECT_EQ(scanned(bad).code, std::optional<ErrorCode>(ErrorCode::unknown_format));
  expect_same_reading(bad);
}

// ---- damage ------------------------------------------------------------------------------

std::vector<std::byte> flipped(std::vector<std::byte> bytes, std::size_t offset) {
  bytes[offset] ^= std::byte{0x5A};
  return bytes;
}

// Every single-byte flip of a small file reads the same both ways, and with
// the original's digest every one is refused as sha256_mismatch.
void sweep_flips(const std::filesystem::path& original, const TempDir& dir) {
  const auto bytes = read_file_bytes(original);
  LoadOptions pinned;
  pinned.expected_sha256 = Sha256::of(bytes);
  const auto path = dir / "flipped";
  for (std::size_t offset = 0; offset < bytes.size(); ++offset) {
    write_file_bytes(path, flipped(bytes, offset));
    SCOPED_TRACE("flip at " + std::to_string(offset));
    EXPECT_EQ(scanned(path), loaded(path));
    expect_verdict_as_load(path);
    EXPECT_EQ(scanned(path, pinned).code, std::optional<ErrorCode>(ErrorCode::sha256_mismatch));
  }
}

void sweep_truncations(const std::filesystem::path& original, const TempDir& dir) {
  const auto bytes = read_file_bytes(original);
  const auto path = dir / "truncated";
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    write_file_bytes(path, {bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size)});
    SCOPED_TRACE("truncated to " + std::to_string(size));
    const Outcome outcome = scanned(path);
    EXPECT_TRUE(outcome.code.has_value());
    EXPECT_EQ(outcome, loaded(path));
    expect_verdict_as_load(path);
  }
}

TEST(ScanRejects, EveryFlippedByteOfAZipCheckpointAsTheLoadDoes) {
  TempDir dir;
  const auto path = dir / "sample.pt";
  save_mapping(path, sample_mapping(), scratch_save());
  sweep_flips(path, dir);
}

TEST(ScanRejects, EveryFlippedByteOfASafetensorsFileAsTheLoadDoes) {
  TempDir dir;
  const auto path = dir / "flat.safetensors";
  save_mapping(path, flat_mapping(3, 4), scratch_save(FileFormat::safetensors));
  sweep_flips(path, dir);
}

TEST(ScanRejects, EveryTruncation) {
  TempDir dir;
  const auto zip = dir / "sample.pt";
  save_mapping(zip, sample_mapping(), scratch_save());
  sweep_truncations(zip, dir);
  const auto safetensors = dir / "flat.safetensors";
  save_mapping(safetensors, flat_mapping(3, 4), scratch_save(FileFormat::safetensors));
  sweep_truncations(safetensors, dir);
}

// The named places: each flip is refused, and for the reason the load gives.
TEST(ScanRejects, FlipsInHeaderPickleStorageAndCentralDirectory) {
  TempDir dir;
  const auto original = dir / "sample.pt";
  save_mapping(original, sample_mapping(), scratch_save());
  const LoadedMapping mapping = load_checkpoint_mapping(original);
  const auto bytes = read_file_bytes(original);
  const auto record = [&](std::string_view name) {
    for (const RecordInfo& r : mapping.records) {
      if (r.name == name) return r;
    }
    ADD_FAILURE() << "no record " << name;
    return RecordInfo{};
  };
  const std::uint64_t directory = record("version").offset + record("version").size + 16;  // after its descriptor
  const struct {
    const char* where;
    std::size_t offset;
    ErrorCode code;
  } cases[] = {
      {"first bytes", 0, ErrorCode::unknown_format},
      {"local header name", 30, ErrorCode::zip_local_header_mismatch},
      {"second local header signature", record("data.pkl").offset + record("data.pkl").size + 16,
       ErrorCode::zip_local_header_invalid},
      {"pickle", record("data.pkl").offset + 5, ErrorCode::zip_crc_mismatch},
      {"storage payload", record("data/0").offset + 1, ErrorCode::zip_crc_mismatch},
      {"data descriptor CRC", record("data/0").offset + record("data/0").size + 4, ErrorCode::zip_descriptor_mismatch},
      {"central directory signature", directory, ErrorCode::zip_central_directory_invalid},
      {"central directory record name", directory + 46 + 9, ErrorCode::zip_local_header_mismatch},
      {"end record", bytes.size() - 22, ErrorCode::zip_eocd_missing},
  };
  const auto path = dir / "flipped.pt";
  for (const auto& c : cases) {
    SCOPED_TRACE(c.where);
    write_file_bytes(path, flipped(bytes, c.offset));
    EXPECT_EQ(scanned(path).code, std::optional<ErrorCode>(c.code));
    EXPECT_EQ(loaded(path).code, std::optional<ErrorCode>(c.code));
  }
}

// safetensors has no checksum: a flipped tensor byte reads (as it does in
// memory) and only an expected digest catches it.
TEST(ScanRejects, FlippedSafetensorsPayloadOnlyByDigest) {
  TempDir dir;
  const auto original = dir / "flat.safetensors";
  const SaveResult saved = save_mapping(original, flat_mapping(2, 4), scratch_save(FileFormat::safetensors));
  const auto bytes = read_file_bytes(original);
  const auto path = dir / "flipped.safetensors";
  write_file_bytes(path, flipped(bytes, bytes.size() - 1));
  EXPECT_EQ(scanned(path).code, std::nullopt);
  LoadOptions pinned;
  pinned.expected_sha256 = saved.sha256;
  EXPECT_EQ(scanned(path, pinned).code, std::optional<ErrorCode>(ErrorCode::sha256_mismatch));
}

// With an expected digest, a wrong one is reported ahead of any structural
// verdict, as by the load, which checks the digest before parsing.
TEST(ScanRejects, DigestMismatchComesBeforeStructure) {
  TempDir dir;
  const auto path = dir / "junk.pt";
  write_file_bytes(path, testing::bytes_of("PK\x03\x04 and nothing like an archive"));
  EXPECT_EQ(scanned(path).code, std::optional<ErrorCode>(ErrorCode::zip_eocd_missing));
  LoadOptions wrong;
  wrong.expected_sha256 = Sha256::of(testing::bytes_of("x"));
  EXPECT_EQ(scanned(path, wrong).code, std::optional<ErrorCode>(ErrorCode::sha256_mismatch));
  EXPECT_EQ(loaded(path, wrong).code, std::optional<ErrorCode>(ErrorCode::sha256_mismatch));
  LoadOptions right;
  right.expected_sha256 = Sha256::of(read_file_bytes(path));
  EXPECT_EQ(scanned(path, right).code, std::optional<ErrorCode>(ErrorCode::zip_eocd_missing));
}

TEST(ScanRejects, WhatTheFileSystemRefuses) {
  TempDir dir;
  EXPECT_EQ(scanned(dir / "missing.pt").code, std::optional<ErrorCode>(ErrorCode::io_open_failed));
  EXPECT_EQ(scanned(dir.path()).code, std::optional<ErrorCode>(ErrorCode::io_not_regular_file));
  write_file_bytes(dir / "empty.pt", {});
  EXPECT_EQ(scanned(dir / "empty.pt").code, std::optional<ErrorCode>(ErrorCode::file_empty));
  try {
    scan_checkpoint(dir / "missing.pt");
  } catch (const Error& error) {
    EXPECT_EQ(error.path(), (dir / "missing.pt").string());
  }
}

// ---- tensors without bytes -------------------------------------------------------------

TEST(ScanTensors, HaveSizesAndSharingButNoBytes) {
  TempDir dir;
  const auto path = dir / "compat.pt";
  SaveOptions compat = scratch_save();
  compat.torch_1_13_compatible = true;
  save_mapping(path, sample_mapping(), compat);
  const LoadedMapping mapping = scan_checkpoint(path);
  const Dict& model = mapping.root.as_dict().at("model").as_dict();
  const TensorData& weight = model.at("weight").as_tensor();
  const TensorData& row = model.at("row").as_tensor();
  EXPECT_EQ(weight.storage.get(), row.storage.get()) << "two views of one storage share it";
  EXPECT_EQ(weight.storage->nbytes(), 24u);
  EXPECT_FALSE(weight.storage->has_bytes());
  EXPECT_ERROR_CODE(weight.storage->data(), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(weight.contiguous_bytes(), ErrorCode::invalid_argument);
  // A float of a 1.13-compatible file is a 0-d tensor: its number is bytes.
  EXPECT_ERROR_CODE(mapping.root.as_dict().at("lr").as_number(), ErrorCode::invalid_argument);
  // Writing them back needs the bytes too.
  EXPECT_ERROR_CODE(save_mapping(dir / "copy.pt", mapping.root, scratch_save()), ErrorCode::invalid_argument);
  // An empty tensor's storage has nothing to miss.
  EXPECT_EQ(model.at("empty").as_tensor().contiguous_bytes().size(), 0u);
}

// The legacy stream is read in memory (documented): its tensors keep bytes.
TEST(ScanTensors, LegacyStreamIsReadInMemory) {
  const auto path = testing::corpus_dir() / "real_pt" / "burn_legacy_uncloned_views.pt";
  const LoadedMapping mapping = scan_checkpoint(path);
  EXPECT_EQ(mapping.format, FileFormat::pytorch_legacy);
  const auto& first = mapping.root.as_dict().begin()->second;
  ASSERT_TRUE(first.is_tensor());
  EXPECT_TRUE(first.as_tensor().storage->has_bytes());
}

// ---- progress and a file that changes while it streams ---------------------------------

// A checkpoint of ~68 MiB: the progress callback first runs at 64 MiB, with
// the last storage bytes, the version record and the central directory still
// to come.
std::filesystem::path write_streamed_checkpoint(const TempDir& dir) {
  const auto path = dir / "streamed.pt";
  save_mapping(path, flat_mapping(1, 17 << 20), scratch_save());
  return path;
}

void overwrite(const std::filesystem::path& path, std::uint64_t offset, std::byte value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &value, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

TEST(ScanProgress, ReportsAsTheFileStreams) {
  TempDir dir;
  const auto path = write_streamed_checkpoint(dir);
  const std::uint64_t size = std::filesystem::file_size(path);
  std::vector<std::uint64_t> reports;
  LoadOptions options;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, size);
    reports.push_back(done);
  };
  scan_checkpoint(path, options);
  EXPECT_EQ(reports, (std::vector<std::uint64_t>{std::uint64_t{64} << 20, size}));
}

TEST(ScanDetectsChange, CentralDirectoryRewrittenWhileStreaming) {
  TempDir dir;
  const auto path = write_streamed_checkpoint(dir);
  const LoadedMapping before = scan_checkpoint(path);
  const RecordInfo& version = before.records.back();
  ASSERT_EQ(version.name, "version");
  const std::uint64_t directory = version.offset + version.size + 16;
  LoadOptions options;
  bool changed = false;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    if (changed || done == total) return;
    // A name byte of the first central entry: read (and parsed) before the
    // pass, now different when the pass gets there.
    overwrite(path, directory + 46 + 2, std::byte{'X'});
    changed = true;
  };
  EXPECT_ERROR_CODE(scan_checkpoint(path, options), ErrorCode::file_changed_during_read);
  EXPECT_TRUE(changed);
}

TEST(ScanDetectsChange, LastCentralDirectoryByteRewrittenWhileStreaming) {
  // The directory is kept only as its SHA-256 once parsed: the whole of it is
  // compared, to its last byte, for either kind of scan.
  TempDir dir;
  const auto path = write_streamed_checkpoint(dir);
  const auto original = read_file_bytes(path);
  const std::uint64_t size = original.size();
  // The end of central directory record (22 bytes, no comment) gives the
  // directory's size and offset.
  const std::uint64_t end_record = size - 22;
  ASSERT_EQ(std::to_integer<int>(original[end_record]), 0x50);
  const auto le32 = [&](std::uint64_t at) {
    std::uint64_t value = 0;
    for (int i = 3; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint64_t>(original[at + i]);
    return value;
  };
  const std::uint64_t directory_size = le32(end_record + 12), directory_offset = le32(end_record + 16);
  ASSERT_LT(directory_offset, 0xFFFFFFFFu);
  const std::uint64_t last_directory_byte = directory_offset + directory_size - 1;
  ASSERT_GT(last_directory_byte, std::uint64_t{64} << 20);  // past the first progress report
  for (const ScanKeeps keeps : {ScanKeeps::tree, ScanKeeps::verdict}) {
    write_file_bytes(path, original);
    LoadOptions options;
    bool changed = false;
    options.progress = [&](std::uint64_t done, std::uint64_t total) {
      if (changed || done == total) return;
      overwrite(path, last_directory_byte, std::byte{'X'});
      changed = true;
    };
    EXPECT_ERROR_CODE(scan_checkpoint(path, options, keeps), ErrorCode::file_changed_during_read);
    EXPECT_TRUE(changed);
  }
}

TEST(ScanTensors, AVerdictKeepsNoTensorAndNoRecord) {
  TempDir dir;
  const auto path = write_streamed_checkpoint(dir);
  const LoadedMapping tree = scan_checkpoint(path);
  const LoadedMapping verdict = scan_checkpoint(path, {}, ScanKeeps::verdict);
  EXPECT_FALSE(tree.records.empty());
  EXPECT_TRUE(verdict.records.empty());
  EXPECT_EQ(verdict.sha256, tree.sha256);
  EXPECT_EQ(verdict.file_bytes, tree.file_bytes);
  EXPECT_TRUE(testing::reads_as_dropped(verdict.root, tree.root));
  // The file is one dict of tensors: the verdict keeps none of its entries.
  ASSERT_FALSE(tree.root.as_dict().empty());
  EXPECT_TRUE(tree.root.as_dict().at_index(0).second.is_tensor());
  EXPECT_TRUE(verdict.root.as_dict().empty());
}

TEST(ScanDetectsChange, StoragePayloadRewrittenAheadOfThePassIsDamage) {
  TempDir dir;
  const auto path = write_streamed_checkpoint(dir);
  const LoadedMapping before = scan_checkpoint(path);
  const RecordInfo& storage = before.records.at(2);
  ASSERT_EQ(storage.name, "data/0");
  LoadOptions options;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    if (done == total) return;
    // Bytes not read yet: the pass hashes and checks the new ones, which no
    // longer match their CRC.
    overwrite(path, storage.offset + storage.size - 1, std::byte{0x7F});
  };
  EXPECT_ERROR_CODE(scan_checkpoint(path, options), ErrorCode::zip_crc_mismatch);
}

TEST(ScanDetectsChange, FileGrowsOrShrinksWhileStreaming) {
  TempDir dir;
  const auto path = write_streamed_checkpoint(dir);
  const std::uint64_t size = std::filesystem::file_size(path);
  const auto original = read_file_bytes(path);
  LoadOptions grow;
  grow.progress = [&](std::uint64_t done, std::uint64_t total) {
    if (done == total) return;
    std::FILE* file = std::fopen(path.c_str(), "ab");
    ASSERT_NE(file, nullptr);
    std::fputs("more", file);
    std::fclose(file);
  };
  EXPECT_ERROR_CODE(scan_checkpoint(path, grow), ErrorCode::file_changed_during_read);
  write_file_bytes(path, original);
  LoadOptions shrink;
  shrink.progress = [&](std::uint64_t done, std::uint64_t total) {
    if (done == total) return;
    std::filesystem::resize_file(path, size - 1000);
  };
  EXPECT_ERROR_CODE(scan_checkpoint(path, shrink), ErrorCode::file_changed_during_read);
}

}  // namespace
}  // namespace holdpoint
