// DCP generations of a run directory, below Python: the range-digesting
// publication, write_dcp_file, the step manifest's "dcp" field, and the
// checks of verify_dcp_generation and read_dcp_ranges, each refusal by code.
// The folder is the two-rank fixture DCP itself wrote
// (tests/unit/fixtures/dcp_two_ranks), republished item by item.
#include "holdpoint/run/dcp_generation.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "base/hashing_writer.h"
#include "base/publish.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// Tests need no fsync.
const DcpWriteOptions kNoSync = [] {
  DcpWriteOptions options;
  options.durable = false;
  return options;
}();

std::filesystem::path fixture() { return testing::source_dir() / "tests" / "unit" / "fixtures" / "dcp_two_ranks"; }

std::vector<std::byte> pattern(std::size_t size, unsigned seed) {
  std::vector<std::byte> out(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return out;
}

// A run's checkpoints/ with the fixture republished as step 5's DCP folder.
struct Generation {
  TempDir dir;
  std::filesystem::path checkpoints = dir / "checkpoints";
  std::filesystem::path folder = checkpoints / shard_directory_name(5);
  Manifest manifest;

  Generation() {
    std::filesystem::create_directories(folder);
    DcpLayout layout;
    layout.step = 5;
    layout.world_size = 2;
    const Value metadata = read_distributed_checkpoint_metadata(fixture());
    std::map<std::string, std::vector<DcpItemLocation>> by_file;
    for (auto& item : distributed_checkpoint_item_locations(metadata, fixture() / ".metadata")) {
      by_file[item.file].push_back(item);
    }
    for (auto& [name, items] : by_file) {
      std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
      const std::vector<std::byte> bytes = testing::read_file_bytes(fixture() / name);
      std::vector<DcpItem> plan;
      for (const auto& item : items) plan.push_back({std::span(bytes).subspan(item.offset, item.length), nullptr});
      layout.files.push_back(write_dcp_file(folder, name, plan, kNoSync));
    }
    const std::vector<std::byte> metadata_bytes = testing::read_file_bytes(fixture() / ".metadata");
    const DcpItem whole{metadata_bytes, nullptr};
    layout.files.push_back(write_dcp_file(folder, ".metadata", std::span(&whole, 1), kNoSync));
    std::sort(layout.files.begin(), layout.files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    manifest.kind = CheckpointKind::dcp;
    manifest.dcp = std::move(layout);
  }

  void verify(bool hash_data = true) const {
    auto directory = io::posix_file_system().open_directory(checkpoints, false);
    verify_dcp_generation(*directory, manifest, {}, hash_data);
  }
  const DcpFile& file(std::string_view name) const { return *manifest.dcp->file(name); }
};

void flip_byte(const std::filesystem::path& file, std::uint64_t at) {
  std::vector<std::byte> bytes = testing::read_file_bytes(file);
  bytes.at(at) ^= std::byte{0x20};
  testing::write_file_bytes(file, bytes);
}

// ---- the range-digesting publication ---------------------------------------------------

TEST(DcpPublication, EachRangeGetsTheSha256OfItsOwnBytes) {
  TempDir dir;
  auto directory = io::posix_file_system().open_directory(dir.path(), false);
  // Small ranges that share a block, one that crosses blocks, and stable
  // spans large enough to go straight to the file.
  const std::vector<std::vector<std::byte>> items = {pattern(10, 1), pattern(3, 2),  pattern(3 << 20, 3),
                                                     pattern(1, 4),  pattern(700000, 5), pattern(9 << 20, 6)};
  io::PublishOptions options;
  options.durable = false;
  options.range_digests = true;
  const auto result = io::publish(*directory, "ranges.bin", options, [&](io::ByteSink& sink) {
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i % 2) {
        sink.write_stable(items[i]);
      } else {
        sink.write(items[i]);
      }
      io::end_range(sink);
    }
  });
  ASSERT_EQ(result.range_digests.size(), items.size());
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    end += items[i].size();
    EXPECT_EQ(result.range_digests[i], Sha256::of(items[i])) << "range " << i;
    EXPECT_EQ(result.range_ends[i], end) << "range " << i;
  }
  EXPECT_EQ(result.size, end);
  EXPECT_EQ(std::filesystem::file_size(dir / "ranges.bin"), end);
}

TEST(DcpPublication, BytesAfterTheLastRangeAreRefusedAndNothingIsPublished) {
  TempDir dir;
  auto directory = io::posix_file_system().open_directory(dir.path(), false);
  io::PublishOptions options;
  options.durable = false;
  options.range_digests = true;
  EXPECT_ERROR_CODE(io::publish(*directory, "open.bin", options,
                                [&](io::ByteSink& sink) {
                                  sink.write(pattern(5, 1));
                                  io::end_range(sink);
                                  sink.write(pattern(5, 2));
                                }),
                    ErrorCode::write_state_invalid);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(DcpPublication, EndRangeOnAWholeFileDigestIsRefused) {
  TempDir dir;
  auto directory = io::posix_file_system().open_directory(dir.path(), false);
  io::PublishOptions options;
  options.durable = false;
  EXPECT_ERROR_CODE(io::publish(*directory, "whole.bin", options, [&](io::ByteSink& sink) { io::end_range(sink); }),
                    ErrorCode::write_state_invalid);
  io::MemorySink memory;
  EXPECT_ERROR_CODE(io::end_range(memory), ErrorCode::write_state_invalid);
}

// ---- write_dcp_file ------------------------------------------------------------------------

TEST(DcpFileWriter, TensorItemsAreArchivesTheReaderOpensAndRangesTileTheFile) {
  TempDir dir;
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  const Value tensor =
      Value::tensor(TensorData::from_bytes(DType::float32, {10, 100}, std::as_bytes(std::span(values))));
  const std::vector<std::byte> raw = pattern(77, 9);
  const std::vector<DcpItem> items = {{raw, nullptr}, {{}, &tensor}};
  const DcpFile file = write_dcp_file(dir.path(), "__0_0.distcp", items, kNoSync);
  ASSERT_EQ(file.ranges.size(), 2u);
  EXPECT_EQ(file.ranges[0].offset, 0u);
  EXPECT_EQ(file.ranges[0].length, raw.size());
  EXPECT_EQ(file.ranges[1].offset, raw.size());
  EXPECT_EQ(file.ranges[0].offset + file.ranges[0].length + file.ranges[1].length, file.size);
  const std::vector<std::byte> bytes = testing::read_file_bytes(dir / "__0_0.distcp");
  ASSERT_EQ(bytes.size(), file.size);
  EXPECT_EQ(file.ranges[0].sha256, Sha256::of(std::span(bytes).first(raw.size())));
  const std::size_t wanted = 1;
  auto ranges = read_dcp_ranges(dir.path(), file, std::span(&wanted, 1));
  const LoadedMapping archive = parse_checkpoint_bytes(ranges[0].bytes, ranges[0].owner);
  ASSERT_TRUE(archive.root.is_tensor());
  EXPECT_EQ(archive.root.as_tensor().sizes, (std::vector<std::int64_t>{10, 100}));
  EXPECT_EQ(archive.root.as_tensor().contiguous_bytes(), std::vector<std::byte>(std::as_bytes(std::span(values)).begin(),
                                                                                 std::as_bytes(std::span(values)).end()));
}

TEST(DcpFileWriter, NamesThatLeaveOrHideInTheFolderAndEmptyItemsAreRefused) {
  TempDir dir;
  const std::vector<std::byte> raw = pattern(8, 1);
  const DcpItem item{raw, nullptr};
  for (const char* name : {"../x.distcp", "a/b", ".hidden", "", ".", ".."}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_CODE(write_dcp_file(dir.path(), name, std::span(&item, 1), kNoSync),
                      ErrorCode::invalid_argument);
  }
  const DcpItem empty{{}, nullptr};
  EXPECT_ERROR_CODE(write_dcp_file(dir.path(), "__0_0.distcp", std::span(&empty, 1), kNoSync),
                    ErrorCode::write_value_unsupported);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(DcpFileWriter, AnExistingFileIsNeverReplaced) {
  TempDir dir;
  const std::vector<std::byte> raw = pattern(8, 1);
  const DcpItem item{raw, nullptr};
  write_dcp_file(dir.path(), "__0_0.distcp", std::span(&item, 1), kNoSync);
  const std::vector<std::byte> other = pattern(9, 2);
  const DcpItem second{other, nullptr};
  EXPECT_ERROR_CODE(write_dcp_file(dir.path(), "__0_0.distcp", std::span(&second, 1), kNoSync),
                    ErrorCode::io_rename_failed);
  EXPECT_EQ(testing::read_file_bytes(dir / "__0_0.distcp"), raw);
}

// ---- the step manifest's "dcp" field ---------------------------------------------------------

TEST(DcpManifest, RoundTripsThroughTheManifestValue) {
  const Generation g;
  const Manifest read = Manifest::from_value(g.manifest.to_value());
  ASSERT_TRUE(read.dcp.has_value());
  EXPECT_EQ(read.kind, CheckpointKind::dcp);
  EXPECT_EQ(read.dcp->step, 5);
  EXPECT_EQ(read.dcp->world_size, 2);
  ASSERT_EQ(read.dcp->files.size(), g.manifest.dcp->files.size());
  for (std::size_t i = 0; i < read.dcp->files.size(); ++i) {
    const DcpFile& a = read.dcp->files[i];
    const DcpFile& b = g.manifest.dcp->files[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.size, b.size);
    ASSERT_EQ(a.ranges.size(), b.ranges.size());
    for (std::size_t r = 0; r < a.ranges.size(); ++r) EXPECT_EQ(a.ranges[r].sha256, b.ranges[r].sha256);
  }
}

// `dict` with `key` set to `value` (or removed, for nullopt): Dict has no erase.
Value with(const Value& dict, std::string_view key, std::optional<Value> value) {
  Dict out;
  bool seen = false;
  for (const auto& [k, v] : dict.as_dict()) {
    if (k.is_string() && k.as_string() == key) {
      seen = true;
      if (value) out.insert(k, *value);
    } else {
      out.insert(k, v);
    }
  }
  if (!seen && value) out.insert(std::string(key), *value);
  return Value::dict(std::move(out));
}

// The manifest value of `g` with its dcp.files[file] changed: `key` set to `value`.
Value edited(const Generation& g, std::size_t file, std::string_view key, std::optional<Value> value) {
  const Value manifest = g.manifest.to_value();
  const Value& dcp = *manifest.as_dict().find("dcp");
  Value::List files = dcp.as_dict().find("files")->as_list();
  files.at(file) = with(files.at(file), key, std::move(value));
  return with(manifest, "dcp", with(dcp, "files", Value::list(std::move(files))));
}

Value range(std::int64_t offset, std::int64_t length) {
  return Value::list({Value::integer(offset), Value::integer(length), Value::string(std::string(64, 'a'))});
}

TEST(DcpManifest, RangesThatDoNotTileTheFileAreRefused) {
  const Generation g;
  const std::size_t data = 1;  // "__0_0.distcp" (".metadata" sorts first)
  const std::int64_t size = static_cast<std::int64_t>(g.manifest.dcp->files[data].size);
  const std::vector<Value::List> bad = {
      {range(0, 10), range(11, size - 11)},      // a gap
      {range(0, 10), range(9, size - 9)},        // an overlap
      {range(0, size - 1)},                      // short of the end
      {range(0, size + 1)},                      // past the end
      {range(0, 0), range(0, size)},             // an empty range
      {range(10, size - 10), range(0, 10)},      // out of order
      {range(-1, size + 1)},                     // negative
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_ERROR_CODE(Manifest::from_value(edited(g, data, "ranges", Value::list(bad[i]))),
                      ErrorCode::schema_field_invalid);
  }
  const Value two_fields = Value::list({Value::list({Value::integer(0), Value::integer(size)})});
  EXPECT_ERROR_CODE(Manifest::from_value(edited(g, data, "ranges", two_fields)), ErrorCode::schema_field_invalid);
  const Value bad_digest =
      Value::list({Value::list({Value::integer(0), Value::integer(size), Value::string("zz")})});
  EXPECT_ERROR_CODE(Manifest::from_value(edited(g, data, "ranges", bad_digest)), ErrorCode::schema_field_invalid);
}

TEST(DcpManifest, FileNamesMustStayInTheFolderBeSortedAndIncludeTheMetadata) {
  const Generation g;
  for (const char* name : {"../escape", "a/b", ".staging", "", "x\n"}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR_CODE(Manifest::from_value(edited(g, 1, "name", Value::string(name))), ErrorCode::schema_field_invalid);
  }
  // A name listed twice (files are listed by name, each once).
  EXPECT_ERROR_CODE(Manifest::from_value(edited(g, 1, "name", Value::string(".metadata"))),
                    ErrorCode::schema_field_invalid);
  // No .metadata ("__0_00.distcp" still sorts before "__0_0.distcp"'s successor).
  EXPECT_ERROR_CODE(Manifest::from_value(edited(g, 0, "name", Value::string("_0.distcp"))),
                    ErrorCode::schema_field_invalid);
  EXPECT_ERROR_CODE(Manifest::from_value(edited(g, 1, "extra", Value::none())), ErrorCode::schema_field_unknown);
}

TEST(DcpManifest, TheFieldBelongsToKindDcpOnly) {
  const Generation g;
  const Value manifest = g.manifest.to_value();
  EXPECT_ERROR_CODE(Manifest::from_value(with(manifest, "dcp", std::nullopt)), ErrorCode::schema_field_missing);
  EXPECT_ERROR_CODE(Manifest::from_value(with(manifest, "kind", Value::string("resume"))),
                    ErrorCode::schema_field_unknown);
  const Value& dcp = *manifest.as_dict().find("dcp");
  EXPECT_ERROR_CODE(Manifest::from_value(with(manifest, "dcp", with(dcp, "world_size", Value::integer(0)))),
                    ErrorCode::schema_field_invalid);
}

// ---- verify_dcp_generation and read_dcp_ranges -------------------------------------------------

TEST(DcpGeneration, AFolderWrittenItemByItemVerifiesAndStaysADcpFolder) {
  const Generation g;
  EXPECT_NO_THROW(g.verify(true));
  EXPECT_NO_THROW(g.verify(false));
  // Stock layout: holdpoint's own DCP reader assembles the same state from it.
  const Value ours = load_distributed_checkpoint(g.folder);
  const Value stock = load_distributed_checkpoint(fixture());
  EXPECT_EQ(ours.as_dict().size(), stock.as_dict().size());
}

TEST(DcpGeneration, AFlippedDataByteIsFoundByTheFullCheckAndByTheRead) {
  const Generation g;
  const DcpFile& data = g.file("__1_0.distcp");
  ASSERT_GE(data.ranges.size(), 2u);
  const DcpRange& second = data.ranges[1];
  flip_byte(g.folder / data.name, second.offset + second.length / 2);
  EXPECT_ERROR_CODE(g.verify(true), ErrorCode::shard_digest_mismatch);
  EXPECT_NO_THROW(g.verify(false));  // left to the reads
  const std::size_t first = 0;
  const std::size_t flipped = 1;
  EXPECT_NO_THROW(read_dcp_ranges(g.folder, data, std::span(&first, 1)));
  EXPECT_ERROR_CODE(read_dcp_ranges(g.folder, data, std::span(&flipped, 1)), ErrorCode::shard_digest_mismatch);
}

TEST(DcpGeneration, ATruncatedFileIsFoundWithoutReadingIt) {
  const Generation g;
  const DcpFile& data = g.file("__0_0.distcp");
  std::vector<std::byte> bytes = testing::read_file_bytes(g.folder / data.name);
  bytes.resize(bytes.size() - 1);
  testing::write_file_bytes(g.folder / data.name, bytes);
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::shard_size_mismatch);
  const std::size_t first = 0;
  EXPECT_ERROR_CODE(read_dcp_ranges(g.folder, data, std::span(&first, 1)), ErrorCode::shard_size_mismatch);
}

TEST(DcpGeneration, AnEditedMetadataIsRefusedBeforeItIsDecoded) {
  const Generation g;
  flip_byte(g.folder / ".metadata", 40);
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::shard_digest_mismatch);
}

TEST(DcpGeneration, FilesTheManifestDoesNotListAreRefused) {
  const Generation g;
  testing::write_file_bytes(g.folder / "__2_0.distcp", pattern(10, 1));
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::dcp_file_unlisted);
  std::filesystem::remove(g.folder / "__2_0.distcp");
  std::filesystem::create_symlink(g.folder / "__0_0.distcp", g.folder / "link.distcp");
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::dcp_file_unlisted);
  std::filesystem::remove(g.folder / "link.distcp");
  EXPECT_NO_THROW(g.verify(true));
}

TEST(DcpGeneration, AListedFileMissingOrReplacedByASymlinkOrFifoIsRefused) {
  const Generation g;
  std::filesystem::rename(g.folder / "__0_0.distcp", g.dir / "aside");
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::run_shards_invalid);
  std::filesystem::create_symlink(g.dir / "aside", g.folder / "__0_0.distcp");
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::io_not_regular_file);
  const std::size_t first = 0;
  EXPECT_ERROR_CODE(read_dcp_ranges(g.folder, g.file("__0_0.distcp"), std::span(&first, 1)),
                    ErrorCode::io_not_regular_file);
  // A FIFO in its place is refused without blocking on it.
  std::filesystem::remove(g.folder / "__0_0.distcp");
  ASSERT_EQ(::mkfifo((g.folder / "__0_0.distcp").c_str(), 0600), 0);
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::io_not_regular_file);
  EXPECT_ERROR_CODE(read_dcp_ranges(g.folder, g.file("__0_0.distcp"), std::span(&first, 1)),
                    ErrorCode::io_not_regular_file);
  // The folder itself a symlink to a copy: never followed.
  std::filesystem::remove(g.folder / "__0_0.distcp");
  std::filesystem::rename(g.dir / "aside", g.folder / "__0_0.distcp");
  std::filesystem::rename(g.folder, g.dir / "folder-elsewhere");
  std::filesystem::create_directory_symlink(g.dir / "folder-elsewhere", g.folder);
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::run_shards_invalid);
  std::filesystem::remove(g.folder);
  EXPECT_ERROR_CODE(g.verify(false), ErrorCode::run_shards_invalid);
}

TEST(DcpGeneration, MetadataPlacingItemsWhereTheManifestHasNoRangeIsRefused) {
  Generation g;
  // Split the first range of a data file in two: the digests stay true, but
  // the item .metadata places there is no longer one listed range.
  DcpFile& data = g.manifest.dcp->files[1];
  const DcpRange first = data.ranges.front();
  const std::vector<std::byte> bytes = testing::read_file_bytes(g.folder / data.name);
  const std::uint64_t half = first.length / 2;
  data.ranges.front() = {0, half, Sha256::of(std::span(bytes).first(half))};
  data.ranges.insert(data.ranges.begin() + 1,
                     {half, first.length - half, Sha256::of(std::span(bytes).subspan(half, first.length - half))});
  EXPECT_ERROR_CODE(g.verify(true), ErrorCode::dcp_range_unlisted);
}

}  // namespace
}  // namespace holdpoint
