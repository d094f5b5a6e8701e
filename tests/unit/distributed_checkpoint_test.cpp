// load_distributed_checkpoint over a folder two Gloo ranks of torch 2.13 wrote
// with dcp.save (tests/unit/fixtures/dcp_two_ranks, made by
// tests/python/make_dcp_fixture.py, which states its values), and over
// copies of it with one thing broken, each refused with its own code.
#include "holdpoint/format/distributed_checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

std::filesystem::path fixture() { return testing::source_dir() / "tests" / "unit" / "fixtures" / "dcp_two_ranks"; }

// The fixture copied into `dir`, ready to be broken.
std::filesystem::path copy_of_fixture(const TempDir& dir) {
  const auto folder = dir / "dcp";
  std::filesystem::copy(fixture(), folder, std::filesystem::copy_options::recursive);
  return folder;
}

template <typename T>
std::vector<T> elements(const Value& value) {
  const std::vector<std::byte> bytes = value.as_tensor().contiguous_bytes();
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Replaces `from` by `to` (of the same length) once in the file: the pickle stays well formed.
void replace_in_file(const std::filesystem::path& file, std::string_view from, std::string_view to) {
  ASSERT_EQ(from.size(), to.size());
  std::vector<std::byte> bytes = testing::read_file_bytes(file);
  const auto* begin = reinterpret_cast<const char*>(bytes.data());
  const std::string_view text(begin, bytes.size());
  const auto at = text.find(from);
  ASSERT_NE(at, std::string_view::npos) << from;
  std::memcpy(bytes.data() + at, to.data(), to.size());
  testing::write_file_bytes(file, bytes);
}

TEST(DistributedCheckpoint, ReadsTheStateDictTwoRanksSaved) {
  ASSERT_TRUE(is_distributed_checkpoint(fixture()));
  const Value state = load_distributed_checkpoint(fixture());
  const Dict& root = state.as_dict();

  const Value& rows = root.at("rows");  // dim-0 shards of arange(30).reshape(6, 5)
  EXPECT_EQ(rows.as_tensor().dtype, DType::float32);
  EXPECT_EQ(rows.as_tensor().sizes, (std::vector<std::int64_t>{6, 5}));
  const auto row_values = elements<float>(rows);
  for (std::size_t i = 0; i < row_values.size(); ++i) EXPECT_EQ(row_values[i], static_cast<float>(i)) << i;

  const Value& cols = root.at("layer").as_dict().at("cols");  // dim-1 shards of arange(28).reshape(4, 7) / 4
  EXPECT_EQ(cols.as_tensor().dtype, DType::float64);
  EXPECT_EQ(cols.as_tensor().sizes, (std::vector<std::int64_t>{4, 7}));
  const auto col_values = elements<double>(cols);
  for (std::size_t i = 0; i < col_values.size(); ++i) EXPECT_EQ(col_values[i], static_cast<double>(i) / 4) << i;

  EXPECT_EQ(elements<std::int64_t>(root.at("replicated")), (std::vector<std::int64_t>{7, 8, 9}));
  EXPECT_EQ(root.at("epoch").as_int(), 3);
  const Value& names = root.at("names");
  ASSERT_TRUE(names.is_list());
  EXPECT_EQ(names.as_list().at(1).as_string(), "b");
}

TEST(DistributedCheckpoint, DecodesTheMetadataAsRecords) {
  const Value metadata = read_distributed_checkpoint_metadata(fixture() / ".metadata");
  EXPECT_EQ(metadata.as_dict().at("__class__").as_string(), "torch.distributed.checkpoint.metadata.Metadata");
  const Value& cols = metadata.as_dict().at("state_dict_metadata").as_dict().at("layer.cols");
  const Value::List& chunks = cols.as_dict().at("chunks").as_list();
  ASSERT_EQ(chunks.size(), 2u);
  const Value::List& offsets = chunks[1].as_dict().at("offsets").as_list();
  EXPECT_EQ(offsets.at(1).as_int(), 4);
  // storage_data, keyed by MetadataIndex records, is a list of (key, value) pairs.
  const Value& storage_data = metadata.as_dict().at("storage_data");
  ASSERT_TRUE(storage_data.is_list());
  EXPECT_EQ(storage_data.as_list().size(), 7u);  // rows x2, cols x2, replicated, epoch, names
}

TEST(DistributedCheckpoint, RefusesAFileNameThatLeavesTheFolder) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  replace_in_file(folder / ".metadata", "__1_0.distcp", "../1_0.distc");
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::dcp_range_invalid);
}

TEST(DistributedCheckpoint, RefusesARangePastTheEndOfItsFile) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  std::vector<std::byte> bytes = testing::read_file_bytes(folder / "__1_0.distcp");
  bytes.resize(bytes.size() / 2);
  testing::write_file_bytes(folder / "__1_0.distcp", bytes);
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::dcp_range_invalid);
}

TEST(DistributedCheckpoint, RefusesAMissingDistcpFile) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  std::filesystem::remove(folder / "__1_0.distcp");
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::dcp_item_missing);
}

// The second chunk of 'rows' starts at row 3: torch.Size((3, 0)) is pickled
// twice, first as the chunk's offsets, last in the MetadataIndex that names
// its bytes. Moves one of them to row 2 (BININT1 3 -> 2).
void move_second_rows_chunk(const std::filesystem::path& metadata, bool in_storage_key) {
  std::vector<std::byte> bytes = testing::read_file_bytes(metadata);
  const std::string_view pickle(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const std::string_view size_3_0("K\x03K\x00", 4);
  const auto first = pickle.find(size_3_0), last = pickle.rfind(size_3_0);
  ASSERT_NE(first, std::string_view::npos);
  ASSERT_LT(first, last);
  bytes[(in_storage_key ? last : first) + 1] = std::byte{2};
  testing::write_file_bytes(metadata, bytes);
}

TEST(DistributedCheckpoint, RefusesAnItemStorageDataDoesNotList) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  move_second_rows_chunk(folder / ".metadata", /*in_storage_key=*/true);  // the chunk at (3, 0) has no bytes listed
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::dcp_item_missing);
}

TEST(DistributedCheckpoint, RefusesAChunkWhoseArchiveIsCorrupt) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  std::vector<std::byte> bytes = testing::read_file_bytes(folder / "__0_0.distcp");
  // The first archive's first tensor bytes sit after its data.pkl; flip one
  // in the middle of the file: some record's CRC-32 no longer matches.
  bytes[bytes.size() / 3] ^= std::byte{0x40};
  testing::write_file_bytes(folder / "__0_0.distcp", bytes);
  try {
    load_distributed_checkpoint(folder);
    ADD_FAILURE() << "a corrupt item was read";
  } catch (const Error& error) {
    // Whatever the reader finds first in the damaged archive; the message names the file and item.
    EXPECT_NE(error.path().find("__0_0.distcp"), std::string::npos) << error.path();
  }
}

TEST(DistributedCheckpoint, RefusesChunksThatDoNotTileTheirTensor) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  move_second_rows_chunk(folder / ".metadata", /*in_storage_key=*/false);  // rows 2-5 overlap rows 0-2
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::dcp_metadata_invalid);
}

TEST(DistributedCheckpoint, RefusesAMetadataPickleWithAForbiddenGlobal) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  replace_in_file(folder / ".metadata", "torch.distributed.checkpoint.metadata\x94\x8c\x08Metadata",
                  "torch.distributed.checkpoint.metadata\x94\x8c\x08Metadatb");
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::pickle_global_forbidden);
}

TEST(DistributedCheckpoint, RefusesAFolderWithoutMetadata) {
  TempDir dir;
  const auto folder = copy_of_fixture(dir);
  std::filesystem::remove(folder / ".metadata");
  EXPECT_FALSE(is_distributed_checkpoint(folder));
  EXPECT_ERROR_CODE(load_distributed_checkpoint(folder), ErrorCode::io_open_failed);
}

}  // namespace
}  // namespace holdpoint
