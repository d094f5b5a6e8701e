// The strict zip reader: round trips with ZipWriter, benign variants it must
// accept, one malformed archive per check (each asserting its error code),
// and single-byte corruption and truncation sweeps.
#include "format/zip/zip_reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "format/zip/zip_writer.h"
#include "base/crc32.h"
#include "support/test_support.h"
#include "support/zip_builder.h"

namespace holdpoint::format {
namespace {

using testing::build_zip;
using testing::get_le;
using testing::put_le;
using testing::zip_entry;
using testing::zip_offsets;
using testing::ZipBuilderEntry;
using testing::ZipBuilderLayout;

// Like testing::bytes_of, but also for empty text (bytes_of memcpy's into the
// null data() of an empty vector, which UBSan reports).
std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* first = reinterpret_cast<const std::byte*>(text.data());
  return {first, first + text.size()};
}

std::string text_of(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::vector<std::byte> le_bytes(std::initializer_list<std::pair<std::uint64_t, int>> fields) {
  std::vector<std::byte> out;
  for (const auto& [value, width] : fields) {
    for (int i = 0; i < width; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xFF));
  }
  return out;
}

struct Record {
  std::string name;
  std::string payload;
};

std::vector<std::byte> write_archive(const std::vector<Record>& records, const std::string& archive_name = "archive") {
  io::MemorySink sink;
  ZipWriter writer(sink, archive_name);
  for (const Record& record : records) writer.add_record(record.name, bytes_of(record.payload));
  writer.finish();
  return sink.take();
}

// A three-record archive like torch.save's: pickle, an empty storage, data.
std::vector<std::byte> small_archive() {
  return write_archive({{"data.pkl", "\x80\x02}q\x01."}, {"data/0", ""}, {"data/1", "12345678"},
                        {"version", "3\n"}});
}

ZipArchive read_and_verify(std::span<const std::byte> bytes, const Limits& limits = Limits{}) {
  ZipArchive archive = read_zip_directory(bytes, limits);
  verify_zip_crcs(archive, bytes, limits);
  return archive;
}

ZipBuilderLayout layout_of(std::vector<ZipBuilderEntry> entries) {
  ZipBuilderLayout layout;
  layout.entries = std::move(entries);
  return layout;
}

// Two ordinary entries; tests break one thing in them.
ZipBuilderLayout two_entries() {
  return layout_of({zip_entry("archive/data.pkl", "pickle"), zip_entry("archive/data/0", "abcdefgh")});
}

// ---- round trips -----------------------------------------------------------------

TEST(ZipReaderRoundTrip, RecordsComeBackInOrderWithTheirBytes) {
  const std::vector<Record> records = {{"data.pkl", "\x80\x02}."}, {"byteorder", "little"},
                                       {"data/0", std::string(1000, 'x')}, {"data/1", ""},
                                       {"version", "3\n"}};
  const auto bytes = write_archive(records, "model.v1");
  const ZipArchive archive = read_and_verify(bytes);
  EXPECT_EQ(archive.archive_name, "model.v1");
  ASSERT_EQ(archive.entries.size(), records.size());
  std::uint64_t expected_offset = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const ZipEntry& entry = archive.entries[i];
    EXPECT_EQ(entry.name, "model.v1/" + records[i].name);
    EXPECT_EQ(entry.record(), records[i].name);
    EXPECT_EQ(text_of(zip_entry_bytes(bytes, entry)), records[i].payload);
    EXPECT_EQ(entry.crc32, io::crc32_of(bytes_of(records[i].payload)));
    EXPECT_EQ(entry.local_header_offset, expected_offset) << "entries tile the file";
    expected_offset = entry.end_offset;
    EXPECT_EQ(archive.find(records[i].name), &entry);
  }
  EXPECT_EQ(expected_offset, archive.central_directory_offset);
  EXPECT_EQ(archive.find("data/2"), nullptr);
  EXPECT_EQ(archive.find("DATA.PKL"), nullptr) << "find is exact, not case-folded";
  EXPECT_EQ(archive.find(""), nullptr);
}

TEST(ZipReaderRoundTrip, NamesLiveInOneArenaThatCopiesShare) {
  const std::vector<Record> records = {{"data.pkl", "p"}, {"data/0", "0123"}, {"version", "3\n"}};
  const auto bytes = write_archive(records, "a_rather_long_archive_folder_name");
  std::optional<ZipArchive> copy;
  {
    const ZipArchive original = read_and_verify(bytes);
    ASSERT_NE(original.names, nullptr);
    std::size_t total = 0;
    for (const ZipEntry& entry : original.entries) {
      // Each name is a view into the arena, back to back in directory order.
      EXPECT_EQ(entry.name.data(), original.names->data() + total);
      total += entry.name.size();
    }
    EXPECT_EQ(original.names->size(), total);
    copy = original;
  }
  // The original is gone; the copy's views still read the names.
  ASSERT_EQ(copy->entries.size(), records.size());
  for (std::size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(copy->entries[i].name, "a_rather_long_archive_folder_name/" + records[i].name);
    EXPECT_EQ(copy->find(records[i].name), &copy->entries[i]);
  }
}

TEST(ZipReaderRoundTrip, UnicodeRecordNames) {
  const std::vector<Record> records = {{"data.pkl", "p"}, {"données/é", "1"}, {"日本語/テンソル", "22"},
                                       {"emoji/\xF0\x9F\x98\x80", "333"}};
  const auto bytes = write_archive(records);
  const ZipArchive archive = read_and_verify(bytes);
  for (const Record& record : records) {
    ASSERT_NE(archive.find(record.name), nullptr) << record.name;
    EXPECT_EQ(text_of(zip_entry_bytes(bytes, *archive.find(record.name))), record.payload);
  }
}

TEST(ZipReaderRoundTrip, OnlyEmptyRecords) {
  const auto bytes = write_archive({{"data/0", ""}, {"data/1", ""}});
  const ZipArchive archive = read_and_verify(bytes);
  ASSERT_EQ(archive.entries.size(), 2u);
  for (const ZipEntry& entry : archive.entries) {
    EXPECT_EQ(entry.size, 0u);
    EXPECT_EQ(entry.crc32, 0u) << "an empty record's CRC is 0 and needs no allow_zero_crc";
    EXPECT_EQ(entry.end_offset, entry.data_offset);
  }
}

TEST(ZipReaderRoundTrip, MoreThan65535RecordsInMemory) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  constexpr std::size_t kRecords = 70'000;
  for (std::size_t i = 0; i < kRecords; ++i) {
    writer.add_record("data/" + std::to_string(i), bytes_of(std::string(i % 3, static_cast<char>('a' + i % 26))));
  }
  writer.finish();
  const ZipArchive archive = read_and_verify(sink.bytes());
  ASSERT_EQ(archive.entries.size(), kRecords);
  for (std::size_t i = 0; i < kRecords; i += 997) {
    const ZipEntry* entry = archive.find("data/" + std::to_string(i));
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry->size, i % 3);
  }
}

// The default Limits admit 2^20 records; reading that many must stay linear
// (or n log n) in time, including the duplicate check and the lookup index.
TEST(ZipReaderRoundTrip, MillionRecordsReadQuickly) {
  constexpr std::size_t kRecords = std::size_t{1} << 20;
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  for (std::size_t i = 0; i < kRecords; ++i) writer.add_record("data/" + std::to_string(i), {});
  writer.finish();
  const auto started = std::chrono::steady_clock::now();
  const ZipArchive archive = read_and_verify(sink.bytes());
  for (std::size_t i = 0; i < kRecords; ++i) {
    ASSERT_NE(archive.find("data/" + std::to_string(i)), nullptr);
  }
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(archive.entries.size(), kRecords);
  EXPECT_LT(seconds, 20.0) << "reading and looking up 2^20 records";
}

TEST(ZipReaderRoundTrip, FindScansWhenTheIndexIsAbsent) {
  const auto bytes = small_archive();
  ZipArchive archive = read_zip_directory(bytes, Limits{});
  archive.record_order.clear();
  ASSERT_NE(archive.find("data/1"), nullptr);
  EXPECT_EQ(archive.find("data/1")->size, 8u);
  EXPECT_EQ(archive.find("data/9"), nullptr);
}

// ---- benign variants the reader accepts --------------------------------------------

TEST(ZipReaderRoundTrip, FindSurvivesAnIndexEditedByHand) {
  const auto bytes = small_archive();
  ZipArchive archive = read_zip_directory(bytes, Limits{});
  // A full table of stale positions must neither loop forever nor reach
  // past `entries`.
  archive.record_order.assign(archive.record_order.size(), 1);
  EXPECT_EQ(archive.find("data/9"), nullptr);
  // Every slot names entry 0, under a tag that matches a hash or not.
  const ZipEntry* first = archive.find(archive.entries[0].record());
  EXPECT_TRUE(first == nullptr || first == &archive.entries[0]);
  EXPECT_EQ(archive.find(archive.entries[1].record()), nullptr);
  archive.record_order.assign(archive.record_order.size(), 1000);
  EXPECT_EQ(archive.find("data/1"), nullptr);
}

TEST(ZipReaderAccepts, BuilderDefaultsMatchTheWriter) {
  // The builder's default layout is PyTorch's; if it drifted, every negative
  // test below would test something else.
  auto layout = layout_of({zip_entry("archive/data.pkl", "\x80\x02}q\x01."), zip_entry("archive/data/0", ""),
                           zip_entry("archive/data/1", "12345678"), zip_entry("archive/version", "3\n")});
  EXPECT_EQ(build_zip(layout), small_archive());
}

TEST(ZipReaderAccepts, PlainEndRecordWithoutZip64) {
  auto layout = two_entries();
  layout.zip64_end = false;
  EXPECT_EQ(read_and_verify(build_zip(layout)).entries.size(), 2u);
}

TEST(ZipReaderAccepts, NoDataDescriptorsAndNoPadding) {
  auto layout = two_entries();
  for (auto& entry : layout.entries) {
    entry.flags = 0x0800;
    entry.local_extra = std::vector<std::byte>{};
  }
  const auto bytes = build_zip(layout);
  const ZipArchive archive = read_and_verify(bytes);
  EXPECT_EQ(text_of(zip_entry_bytes(bytes, archive.entries[1])), "abcdefgh");
  EXPECT_EQ(archive.entries[1].data_offset, archive.entries[1].local_header_offset + 30 + 14);
}

TEST(ZipReaderAccepts, DataDescriptorWithoutSignature) {
  auto layout = two_entries();
  layout.entries[1].descriptor_signature = false;
  const ZipArchive archive = read_and_verify(build_zip(layout));
  EXPECT_EQ(archive.entries[1].end_offset - archive.entries[1].data_offset, 8u + 12);
}

TEST(ZipReaderAccepts, NestedFolderBecomesPartOfTheRecordName) {
  const ZipArchive archive =
      read_and_verify(build_zip(layout_of({zip_entry("a/b/data.pkl", "x"), zip_entry("a/b/version", "3")})));
  EXPECT_EQ(archive.archive_name, "a");
  EXPECT_EQ(archive.entries[0].record(), "b/data.pkl");
}

TEST(ZipReaderAccepts, CentralZip64BlockForASaturatedOffset) {
  auto layout = two_entries();
  const auto offset = zip_offsets(build_zip(layout)).local_headers[1];
  layout.entries[1].central_offset = 0xFFFFFFFF;
  layout.entries[1].central_extra = le_bytes({{1, 2}, {8, 2}, {offset, 8}});
  EXPECT_EQ(read_and_verify(build_zip(layout)).entries[1].local_header_offset, offset);
}

// The local zip64 layouts honest writers produce (docs/format.md §3.3), on
// entry 1 ("abcdefgh", 8 bytes) of two_entries().
ZipBuilderLayout with_local_zip64(std::vector<std::byte> block, bool descriptor = true) {
  auto layout = two_entries();
  layout.entries[1].local_extra = std::move(block);
  layout.entries[1].descriptor64 = true;
  if (!descriptor) layout.entries[1].flags = 0x0800;
  return layout;
}

std::uint64_t second_local_header(const ZipBuilderLayout& layout) {
  return zip_offsets(build_zip(layout)).local_headers[1];
}

TEST(ZipReaderAccepts, LocalZip64BlocksAsMinizWritesThem) {
  // A record of 4 GiB or more: the size, then 0 as the compressed size.
  EXPECT_EQ(read_and_verify(build_zip(with_local_zip64(le_bytes({{1, 2}, {16, 2}, {8, 8}, {0, 8}})))).entries[1].size,
            8u);
  // A header at or past 4 GiB: its own offset, alone or after the sizes.
  const std::uint64_t offset = second_local_header(two_entries());
  EXPECT_NO_THROW(read_and_verify(build_zip(with_local_zip64(le_bytes({{1, 2}, {8, 2}, {offset, 8}})))));
  EXPECT_NO_THROW(
      read_and_verify(build_zip(with_local_zip64(le_bytes({{1, 2}, {24, 2}, {8, 8}, {0, 8}, {offset, 8}})))));
}

TEST(ZipReaderAccepts, LocalZip64BlocksAsPythonZipfileWritesThem) {
  // Seekable output: 32-bit sizes 0xFFFFFFFF and the true sizes in the block,
  // no descriptor.
  auto bytes = build_zip(with_local_zip64(le_bytes({{1, 2}, {16, 2}, {8, 8}, {8, 8}}), false));
  const std::size_t local = zip_offsets(bytes).local_headers[1];
  put_le(bytes, local + 18, 0xFFFFFFFF, 4);
  put_le(bytes, local + 22, 0xFFFFFFFF, 4);
  EXPECT_NO_THROW(read_and_verify(bytes));
  // Unseekable output: a descriptor, and zeros in the block.
  bytes = build_zip(with_local_zip64(le_bytes({{1, 2}, {16, 2}, {0, 8}, {0, 8}})));
  put_le(bytes, local + 18, 0xFFFFFFFF, 4);
  put_le(bytes, local + 22, 0xFFFFFFFF, 4);
  EXPECT_NO_THROW(read_and_verify(bytes));
}

TEST(ZipReaderAccepts, SentinelEndCountDefersToZip64) {
  auto layout = two_entries();
  layout.end_count = 0xFFFF;
  EXPECT_EQ(read_and_verify(build_zip(layout)).entries.size(), 2u);
}

TEST(ZipReaderAccepts, ZeroCrcOnlyWhenAllowed) {
  auto layout = two_entries();
  layout.entries[1].crc = 0;
  layout.entries[1].descriptor_crc = 0;
  const auto bytes = build_zip(layout);
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  EXPECT_ERROR_CODE(verify_zip_crcs(archive, bytes, Limits{}), ErrorCode::zip_crc_missing);
  Limits lenient;
  lenient.allow_zero_crc = true;
  EXPECT_NO_THROW(verify_zip_crcs(archive, bytes, lenient));
}

// ---- end records -------------------------------------------------------------------

TEST(ZipReaderRejects, JunkPrefix) {
  auto bytes = small_archive();
  bytes.insert(bytes.begin(), 16, std::byte{'#'});
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_local_header_invalid);
}

TEST(ZipReaderRejects, FileShorterThanASignature) {
  EXPECT_ERROR_CODE(read_zip_directory(bytes_of("PK\x03"), Limits{}), ErrorCode::zip_local_header_invalid);
  EXPECT_ERROR_CODE(read_zip_directory({}, Limits{}), ErrorCode::zip_local_header_invalid);
}

TEST(ZipReaderRejects, NoEndRecord) {
  EXPECT_ERROR_CODE(read_zip_directory(bytes_of("PK\x03\x04 but nothing else"), Limits{}),
                    ErrorCode::zip_eocd_missing);
  auto bytes = small_archive();
  bytes.pop_back();
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_eocd_missing);
}

TEST(ZipReaderRejects, TrailingGarbage) {
  auto layout = two_entries();
  layout.trailing = bytes_of("<html>polyglot</html>");
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_trailing_data);
}

TEST(ZipReaderRejects, EndRecordComment) {
  auto layout = two_entries();
  layout.comment = bytes_of("a comment");
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_trailing_data);
}

TEST(ZipReaderRejects, CommentLengthWithoutComment) {
  auto bytes = small_archive();
  put_le(bytes, bytes.size() - 2, 5, 2);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_trailing_data);
}

TEST(ZipReaderRejects, MultiDiskEndRecord) {
  for (const std::size_t field : {4, 6, 8}) {
    auto bytes = small_archive();
    put_le(bytes, bytes.size() - 22 + field, 1, 2);
    SCOPED_TRACE(::testing::Message() << "field " << field);
    EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_multi_disk);
  }
}

TEST(ZipReaderRejects, CentralEntryOnAnotherDisk) {
  auto bytes = small_archive();
  put_le(bytes, zip_offsets(bytes).central_entries[1] + 34, 1, 2);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_multi_disk);
}

TEST(ZipReaderRejects, Zip64LocatorDiskFields) {
  for (const auto& [field, value] : {std::pair{4, 1}, std::pair{16, 2}, std::pair{16, 0}}) {
    auto bytes = small_archive();
    put_le(bytes, *zip_offsets(bytes).locator + field, value, 4);
    SCOPED_TRACE(::testing::Message() << field);
    EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip64_locator_invalid);
  }
}

TEST(ZipReaderRejects, Zip64LocatorPointsAtGarbage) {
  auto bytes = small_archive();
  const std::size_t locator = *zip_offsets(bytes).locator;
  put_le(bytes, locator + 8, 8, 8);  // inside the first local header
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip64_eocd_invalid);
  put_le(bytes, locator + 8, bytes.size(), 8);  // past the end
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip64_eocd_invalid);
}

TEST(ZipReaderRejects, Zip64EndRecordFields) {
  // record size below 44, record size past the locator, disk, directory
  // disk, entries on this disk.
  const std::pair<std::size_t, std::uint64_t> patches[] = {{4, 40}, {4, 52}, {16, 1}, {20, 1}, {24, 9}};
  for (const auto& [field, value] : patches) {
    auto bytes = small_archive();
    put_le(bytes, *zip_offsets(bytes).zip64_end_record + field, value, field >= 24 || field == 4 ? 8 : 4);
    SCOPED_TRACE(::testing::Message() << field);
    EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip64_eocd_invalid);
  }
}

TEST(ZipReaderRejects, EndCountDiffersFromZip64Count) {
  auto layout = two_entries();
  layout.end_count = 1;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_entry_count_mismatch);
}

TEST(ZipReaderRejects, EndRecordDirectoryDisagreesWithZip64) {
  auto bytes = small_archive();
  put_le(bytes, bytes.size() - 22 + 12, get_le(bytes, bytes.size() - 22 + 12, 4) - 1, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, EmptyArchive) {
  // What zipfile writes for an empty archive: the end record alone.
  const auto bare = le_bytes({{0x06054b50, 4}, {0, 2}, {0, 2}, {0, 2}, {0, 2}, {0, 4}, {0, 4}, {0, 2}});
  EXPECT_ERROR_CODE(read_zip_directory(bare, Limits{}), ErrorCode::zip_empty);
  // Zero entries behind a local header signature.
  auto layout = layout_of({});
  layout.prefix = le_bytes({{0x04034b50, 4}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_empty);
}

TEST(ZipReaderRejects, CentralDirectoryOffsetBeyondEndOfFile) {
  auto layout = two_entries();
  layout.zip64_end = false;
  auto bytes = build_zip(layout);
  put_le(bytes, bytes.size() - 22 + 16, bytes.size() + 100, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, DirectorySizeAndOffsetThatWrap) {
  auto bytes = small_archive();
  const std::size_t zip64_end = *zip_offsets(bytes).zip64_end_record;
  put_le(bytes, zip64_end + 40, ~std::uint64_t{0} - 10, 8);
  put_le(bytes, bytes.size() - 22 + 12, 0xFFFFFFFF, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, TruncatedCentralDirectory) {
  // The end records count one entry more than the directory holds.
  auto layout = two_entries();
  layout.end_count = 3;
  layout.zip64_count = 3;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, CentralEntryRunsPastTheDirectory) {
  auto bytes = small_archive();
  const auto offsets = zip_offsets(bytes);
  put_le(bytes, offsets.central_entries.back() + 30, 200, 2);  // extra length
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

// No byte of an accepted archive is left unchecked: padding must be PyTorch's
// 'Z' bytes, central entries carry no comments or padding, and the zip64 end
// record has no extensible data. Each would otherwise hide a payload.
TEST(ZipReaderRejects, PaddingBytesOtherThanZ) {
  auto bytes = small_archive();
  const std::size_t local = zip_offsets(bytes).local_headers[0];
  const std::size_t name_size = get_le(bytes, local + 26, 2);
  const std::size_t extra_size = get_le(bytes, local + 28, 2);
  ASSERT_GT(extra_size, 4u);
  bytes[local + 30 + name_size + extra_size - 1] = std::byte{'!'};
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, PaddingBlockInTheCentralDirectory) {
  auto layout = two_entries();
  layout.entries[0].central_extra = le_bytes({{0x4246, 2}, {0, 2}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, CentralEntryComment) {
  auto bytes = small_archive();
  const auto offsets = zip_offsets(bytes);
  // Claim a 2-byte comment that takes the next entry's first bytes: the
  // comment check comes before any parse of what follows.
  put_le(bytes, offsets.central_entries[0] + 32, 2, 2);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, Zip64EndRecordExtensibleData) {
  auto bytes = small_archive();
  const std::size_t zip64_end = *zip_offsets(bytes).zip64_end_record;
  // Insert 4 bytes of "extensible data" and make every size and offset agree.
  bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(zip64_end + 56), 4, std::byte{0});
  put_le(bytes, zip64_end + 4, 48, 8);
  const std::size_t locator = zip64_end + 60;
  EXPECT_EQ(get_le(bytes, locator, 4), 0x07064b50u);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip64_eocd_invalid);
}

TEST(ZipReaderRejects, BytesAfterTheLastCentralEntry) {
  // The end records count one entry fewer than the directory holds.
  auto layout = two_entries();
  layout.end_count = 1;
  layout.zip64_count = 1;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, CentralEntryWithoutSignature) {
  auto bytes = small_archive();
  put_le(bytes, zip_offsets(bytes).central_entries[2], 0x04034b50, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

TEST(ZipReaderRejects, MoreEntriesThanLimits) {
  Limits limits;
  limits.max_records = 3;
  EXPECT_ERROR_CODE(read_zip_directory(small_archive(), limits), ErrorCode::zip_too_many_entries);
  limits.max_records = 4;
  EXPECT_NO_THROW(read_zip_directory(small_archive(), limits));
}

TEST(ZipReaderRejects, CentralDirectoryLargerThanLimits) {
  const auto bytes = small_archive();
  Limits limits;
  limits.max_central_directory_bytes = read_zip_directory(bytes, Limits{}).central_directory_size - 1;
  EXPECT_ERROR_CODE(read_zip_directory(bytes, limits), ErrorCode::zip_central_directory_too_large);
}

TEST(ZipReaderRejects, CountLargerThanTheDirectoryCanHold) {
  // Claims 10^6 entries in a 300-byte directory: refused before allocating.
  auto bytes = small_archive();
  const std::size_t zip64_end = *zip_offsets(bytes).zip64_end_record;
  put_le(bytes, zip64_end + 24, 1'000'000, 8);
  put_le(bytes, zip64_end + 32, 1'000'000, 8);
  put_le(bytes, bytes.size() - 22 + 8, 0xFFFF, 2);
  put_le(bytes, bytes.size() - 22 + 10, 0xFFFF, 2);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_central_directory_invalid);
}

// ---- central entries -------------------------------------------------------------

TEST(ZipReaderRejects, EncryptedEntry) {
  for (const std::uint16_t bit : {0, 6, 13}) {
    auto layout = two_entries();
    layout.entries[1].flags = static_cast<std::uint16_t>(0x0808 | (1u << bit));
    SCOPED_TRACE(::testing::Message() << bit);
    EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_encrypted);
  }
}

TEST(ZipReaderRejects, UnsupportedFlags) {
  for (const std::uint16_t bit : {1, 2, 4, 5, 12, 15}) {
    auto layout = two_entries();
    layout.entries[1].flags = static_cast<std::uint16_t>(0x0808 | (1u << bit));
    SCOPED_TRACE(::testing::Message() << bit);
    EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_unsupported_flags);
  }
}

TEST(ZipReaderRejects, DeflatedEntry) {
  auto layout = two_entries();
  layout.entries[1].method = 8;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_compressed);
}

TEST(ZipReaderRejects, CompressedSizeDiffersFromUncompressed) {
  auto layout = two_entries();
  layout.entries[1].central_compressed_size = 4;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_size_mismatch);
}

TEST(ZipReaderRejects, ExtraFieldWithStrayBytes) {
  auto layout = two_entries();
  layout.entries[1].central_extra = le_bytes({{0x4246, 2}, {0, 2}, {0x5A, 1}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, ExtraBlockLongerThanTheField) {
  auto layout = two_entries();
  layout.entries[1].central_extra = le_bytes({{0x4246, 2}, {9, 2}, {0, 4}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, UnknownExtraBlocks) {
  auto layout = two_entries();
  layout.entries[1].local_extra = le_bytes({{0x5455, 2}, {5, 2}, {1, 1}, {0, 4}});  // a Unix timestamp
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
  layout = two_entries();
  layout.entries[1].central_extra = le_bytes({{0x7875, 2}, {0, 2}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, RepeatedExtraBlock) {
  auto layout = two_entries();
  layout.entries[1].local_extra = le_bytes({{0x4246, 2}, {0, 2}, {0x4246, 2}, {0, 2}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, Zip64BlockWithFieldsNoSlotCallsFor) {
  auto layout = two_entries();
  layout.entries[1].central_extra = le_bytes({{1, 2}, {8, 2}, {8, 8}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, SaturatedSizeWithoutZip64Block) {
  auto layout = two_entries();
  layout.entries[1].central_compressed_size = 0xFFFFFFFF;
  layout.entries[1].central_uncompressed_size = 0xFFFFFFFF;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

TEST(ZipReaderRejects, Zip64BlockMissingOneSaturatedField) {
  auto layout = two_entries();
  layout.entries[1].central_compressed_size = 0xFFFFFFFF;
  layout.entries[1].central_uncompressed_size = 0xFFFFFFFF;
  layout.entries[1].central_extra = le_bytes({{1, 2}, {8, 2}, {8, 8}});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_extra_field_invalid);
}

// Issue 35: a local zip64 block was never compared, so a local header could
// give a size or an offset other than the central directory's.
TEST(ZipReaderRejects, LocalZip64SizeDisagreesWithCentralDirectory) {
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(with_local_zip64(le_bytes({{1, 2}, {16, 2}, {0xDEAD, 8}, {0, 8}}))),
                                       Limits{}),
                    ErrorCode::zip_local_zip64_mismatch);
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(with_local_zip64(le_bytes({{1, 2}, {16, 2}, {8, 8}, {9, 8}}))),
                                       Limits{}),
                    ErrorCode::zip_local_zip64_mismatch);
  // 0 stands for "in the descriptor" only when there is one.
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(with_local_zip64(le_bytes({{1, 2}, {16, 2}, {8, 8}, {0, 8}}), false)),
                                       Limits{}),
                    ErrorCode::zip_local_zip64_mismatch);
}

TEST(ZipReaderRejects, LocalZip64OffsetDisagreesWithCentralDirectory) {
  const std::uint64_t offset = second_local_header(two_entries());
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(with_local_zip64(le_bytes({{1, 2}, {8, 2}, {offset + 64, 8}}))),
                                       Limits{}),
                    ErrorCode::zip_local_zip64_mismatch);
  EXPECT_ERROR_CODE(
      read_zip_directory(build_zip(with_local_zip64(le_bytes({{1, 2}, {24, 2}, {8, 8}, {0, 8}, {0, 8}}))), Limits{}),
      ErrorCode::zip_local_zip64_mismatch);
}

TEST(ZipReaderRejects, SaturatedLocalSizeWithoutLocalZip64Sizes) {
  auto bytes = small_archive();
  const std::size_t local = zip_offsets(bytes).local_headers[2];
  put_le(bytes, local + 22, 0xFFFFFFFF, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_local_zip64_mismatch);
  // An offset-only block carries no sizes either.
  auto layout = with_local_zip64(le_bytes({{1, 2}, {8, 2}, {second_local_header(two_entries()), 8}}));
  bytes = build_zip(layout);
  put_le(bytes, zip_offsets(bytes).local_headers[1] + 18, 0xFFFFFFFF, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_local_zip64_mismatch);
}

TEST(ZipReaderRejects, LocalZip64BlockOfNoKnownLayout) {
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(with_local_zip64(le_bytes({{1, 2}, {12, 2}, {8, 8}, {0, 4}}))),
                                       Limits{}),
                    ErrorCode::zip_extra_field_invalid);
}

// ---- names -------------------------------------------------------------------------

void expect_name_rejected(const std::string& name, ErrorCode code) {
  auto layout = layout_of({zip_entry("archive/data.pkl", "p"), zip_entry(name, "x")});
  SCOPED_TRACE(::testing::Message() << ::testing::PrintToString(name));
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), code);
}

TEST(ZipReaderRejects, DotDotComponent) {
  expect_name_rejected("archive/../version", ErrorCode::zip_name_invalid);
  expect_name_rejected("archive/data/..", ErrorCode::zip_name_invalid);
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout_of({zip_entry("../data.pkl", "p")})), Limits{}),
                    ErrorCode::zip_name_invalid);
}

TEST(ZipReaderRejects, DotAndEmptyComponents) {
  expect_name_rejected("archive/./version", ErrorCode::zip_name_invalid);
  expect_name_rejected("archive//version", ErrorCode::zip_name_invalid);
  expect_name_rejected("archive/data/", ErrorCode::zip_name_invalid);
}

TEST(ZipReaderRejects, AbsoluteName) { expect_name_rejected("/archive/version", ErrorCode::zip_name_invalid); }

TEST(ZipReaderRejects, NulInName) {
  expect_name_rejected(std::string("archive/ver\0sion", 16), ErrorCode::zip_name_invalid);
}

TEST(ZipReaderRejects, BackslashInName) { expect_name_rejected("archive\\version", ErrorCode::zip_name_invalid); }

TEST(ZipReaderRejects, ControlCharactersInName) {
  expect_name_rejected("archive/ver\x01sion", ErrorCode::zip_name_invalid);
  expect_name_rejected("archive/version\n", ErrorCode::zip_name_invalid);
  expect_name_rejected("archive/ver\x7Fsion", ErrorCode::zip_name_invalid);
  expect_name_rejected("archive/ver\xC2\x85sion", ErrorCode::zip_name_invalid);  // U+0085, C1
}

TEST(ZipReaderRejects, NameLongerThan511Bytes) {
  expect_name_rejected("archive/" + std::string(504, 'x'), ErrorCode::zip_name_invalid);
  const auto ok = layout_of({zip_entry("archive/data.pkl", "p"), zip_entry("archive/" + std::string(503, 'x'), "x")});
  EXPECT_NO_THROW(read_zip_directory(build_zip(ok), Limits{}));
}

TEST(ZipReaderRejects, EmptyName) { expect_name_rejected("", ErrorCode::zip_name_invalid); }

TEST(ZipReaderRejects, InvalidUtf8InName) {
  expect_name_rejected("archive/\xFF", ErrorCode::zip_name_invalid);          // not a lead byte
  expect_name_rejected("archive/\xC0\xAF", ErrorCode::zip_name_invalid);      // overlong '/'
  expect_name_rejected("archive/\xED\xA0\x80", ErrorCode::zip_name_invalid);  // surrogate
  expect_name_rejected("archive/\xF4\x90\x80\x80", ErrorCode::zip_name_invalid);  // past U+10FFFF
  expect_name_rejected("archive/\xE6\x97", ErrorCode::zip_name_invalid);      // truncated
  expect_name_rejected("archive/\xE6(x", ErrorCode::zip_name_invalid);        // bad continuation
}

TEST(ZipReaderRejects, NoArchiveFolder) {
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout_of({zip_entry("data.pkl", "p")})), Limits{}),
                    ErrorCode::zip_archive_folder_invalid);
}

TEST(ZipReaderRejects, MixedArchiveFolders) {
  expect_name_rejected("evil/constants.pkl", ErrorCode::zip_archive_folder_invalid);
  expect_name_rejected("archive2/version", ErrorCode::zip_archive_folder_invalid);
  expect_name_rejected("archiv/version", ErrorCode::zip_archive_folder_invalid);
  expect_name_rejected("archive", ErrorCode::zip_archive_folder_invalid);
}

TEST(ZipReaderRejects, DirectoryEntryFirst) {
  const auto layout = layout_of({zip_entry("archive/", ""), zip_entry("archive/data.pkl", "p")});
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_archive_folder_invalid);
  expect_name_rejected("archive/", ErrorCode::zip_archive_folder_invalid);
}

TEST(ZipReaderRejects, ExactDuplicateNames) {
  expect_name_rejected("archive/data.pkl", ErrorCode::zip_name_duplicate);
}

TEST(ZipReaderRejects, NamesThatDifferOnlyInCase) {
  expect_name_rejected("archive/DATA.PKL", ErrorCode::zip_name_case_duplicate);
  expect_name_rejected("archive/Data.pkl", ErrorCode::zip_name_case_duplicate);
}

TEST(ZipReaderRejects, RepeatedNamesAmongManyRecords) {
  for (const auto& [repeat, code] : {std::pair{"archive/data/123", ErrorCode::zip_name_duplicate},
                                     std::pair{"archive/DATA/17", ErrorCode::zip_name_case_duplicate},
                                     std::pair{"archive/Data.Pkl", ErrorCode::zip_name_case_duplicate}}) {
    SCOPED_TRACE(repeat);
    std::vector<ZipBuilderEntry> entries = {zip_entry("archive/data.pkl", "p")};
    for (int i = 0; i < 300; ++i) entries.push_back(zip_entry("archive/data/" + std::to_string(i), ""));
    entries.push_back(zip_entry(repeat, ""));
    EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout_of(std::move(entries))), Limits{}), code);
  }
}

TEST(ZipReaderRejects, RepeatedNamesReportTheFirstEntryThatRepeatsAnEarlierOne) {
  // Entry 2 differs only in case from entry 1 before entry 3 repeats entry 0.
  const auto layout = layout_of({zip_entry("archive/a", ""), zip_entry("archive/B", ""), zip_entry("archive/b", ""),
                                 zip_entry("archive/a", "")});
  try {
    read_zip_directory(build_zip(layout), Limits{});
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::zip_name_case_duplicate);
    EXPECT_NE(error.detail().find("zip entry 2 'archive/b'"), std::string::npos) << error.detail();
    EXPECT_NE(error.detail().find("zip entry 1 'archive/B'"), std::string::npos) << error.detail();
  }
}

// ---- local headers -----------------------------------------------------------------

TEST(ZipReaderRejects, LocalHeaderOffsetOutsideTheFile) {
  auto layout = two_entries();
  layout.entries[1].central_offset = 0x7FFFFFF0;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_local_header_invalid);
}

TEST(ZipReaderRejects, LocalHeaderWithoutSignature) {
  auto bytes = small_archive();
  put_le(bytes, zip_offsets(bytes).local_headers[2], 0x02014b50, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_local_header_invalid);
}

TEST(ZipReaderRejects, LocalHeaderRunsPastTheFile) {
  auto bytes = small_archive();
  put_le(bytes, zip_offsets(bytes).local_headers[3] + 28, 0xFFFF, 2);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_local_header_invalid);
}

TEST(ZipReaderRejects, LocalNameDiffersFromCentralName) {
  auto layout = two_entries();
  layout.entries[1].local_name = "archive/data/1";
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_local_header_mismatch);
}

TEST(ZipReaderRejects, LocalFlagsOrMethodDiffer) {
  auto layout = two_entries();
  layout.entries[1].local_flags = 0x0800;
  layout.entries[1].write_descriptor = true;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_local_header_mismatch);
  layout = two_entries();
  layout.entries[1].local_method = 8;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_local_header_mismatch);
}

TEST(ZipReaderRejects, LocalCrcDiffersWithoutDescriptor) {
  auto layout = two_entries();
  layout.entries[1].flags = 0x0800;
  layout.entries[1].crc = 0x12345678;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_local_header_mismatch);
}

TEST(ZipReaderRejects, LocalSizeDiffersWithDescriptor) {
  // With a descriptor the local CRC and sizes may be zero (miniz) or the
  // true values; anything else is a third, conflicting copy.
  auto bytes = small_archive();
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  const ZipEntry& entry = *archive.find("data/1");
  put_le(bytes, entry.local_header_offset + 14, entry.crc32, 4);
  put_le(bytes, entry.local_header_offset + 18, 8, 4);
  put_le(bytes, entry.local_header_offset + 22, 8, 4);
  EXPECT_NO_THROW(read_and_verify(bytes));
  put_le(bytes, entry.local_header_offset + 22, 9, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_local_header_mismatch);
}

TEST(ZipReaderRejects, DescriptorCrcDiffers) {
  auto layout = two_entries();
  layout.entries[1].descriptor_crc = 0x12345678;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_descriptor_mismatch);
}

TEST(ZipReaderRejects, DescriptorSizeDiffers) {
  auto layout = two_entries();
  layout.entries[1].descriptor_size = 7;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_descriptor_mismatch);
}

TEST(ZipReaderRejects, Descriptor64WithoutLocalZip64Block) {
  // Without a local zip64 block the sizes are u32: a u64 pair reads as
  // (size, 0) ...
  auto layout = two_entries();
  layout.entries[0].descriptor64 = true;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_descriptor_mismatch);
  // ... and one crafted to read as (size, size) leaves 8 bytes unaccounted.
  layout.entries[0].descriptor_size = std::uint64_t{6} << 32 | 6;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_gap);
}

TEST(ZipReaderRejects, TwoCentralEntriesShareOneLocalHeader) {
  auto layout = two_entries();
  ZipBuilderEntry alias = zip_entry("archive/data/0", "");
  alias.shares_local_header_of = 1;
  layout.entries.push_back(alias);
  layout.entries[2].name = "archive/data/1";
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_local_header_mismatch);
  // Same central and local name is caught as the exact duplicate it is.
  layout.entries[2].name = "archive/data/0";
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_name_duplicate);
}

TEST(ZipReaderRejects, OverlappingEntries) {
  // Entry 1's local header lies inside entry 0's payload, where a complete,
  // valid local header, payload and descriptor for it have been planted.
  const auto planted_zip = build_zip(layout_of({zip_entry("archive/data/0", "abcdefgh")}));
  const std::size_t planted_size = zip_offsets(planted_zip).central_directory;
  std::string carrier(64, 'c');
  carrier.append(reinterpret_cast<const char*>(planted_zip.data()), planted_size);
  auto layout = layout_of({zip_entry("archive/data.pkl", carrier)});
  ZipBuilderEntry planted = zip_entry("archive/data/0", "");
  planted.shares_local_header_of = 0;
  planted.flags = 0x0808;
  planted.central_offset = 64 + 64;  // entry 0's payload starts at 64
  planted.crc = io::crc32_of(bytes_of("abcdefgh"));
  planted.central_compressed_size = 8;
  planted.central_uncompressed_size = 8;
  layout.entries.push_back(planted);
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_entries_overlap);
}

TEST(ZipReaderRejects, PayloadRunsIntoTheCentralDirectory) {
  auto layout = two_entries();
  layout.entries[1].flags = 0x0800;
  layout.entries[1].central_compressed_size = 20;
  layout.entries[1].central_uncompressed_size = 20;
  layout.entries[1].local_extra = std::vector<std::byte>{};
  auto bytes = build_zip(layout);
  // Keep the local header consistent with the central sizes.
  put_le(bytes, zip_offsets(bytes).local_headers[1] + 18, 20, 4);
  put_le(bytes, zip_offsets(bytes).local_headers[1] + 22, 20, 4);
  EXPECT_ERROR_CODE(read_zip_directory(bytes, Limits{}), ErrorCode::zip_entries_overlap);
}

TEST(ZipReaderRejects, GapBetweenEntries) {
  auto layout = two_entries();
  layout.entries[1].gap_before = 64;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_gap);
}

TEST(ZipReaderRejects, GapBeforeTheCentralDirectory) {
  auto layout = two_entries();
  layout.gap_before_directory = 1;
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_gap);
}

TEST(ZipReaderRejects, FirstLocalHeaderUnreferenced) {
  // The directory lists only the second record, so the first record's bytes
  // are hidden from it.
  const auto full = build_zip(two_entries());
  const std::size_t second = zip_offsets(full).local_headers[1];
  auto layout = layout_of({zip_entry("archive/data/0", "abcdefgh")});
  layout.prefix.assign(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(second));
  EXPECT_ERROR_CODE(read_zip_directory(build_zip(layout), Limits{}), ErrorCode::zip_gap);
}

// ---- CRCs --------------------------------------------------------------------------

TEST(ZipReaderRejects, PayloadCrcMismatch) {
  auto bytes = small_archive();
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  bytes[archive.find("data/1")->data_offset + 3] ^= std::byte{0x01};
  EXPECT_ERROR_CODE(verify_zip_crcs(read_zip_directory(bytes, Limits{}), bytes, Limits{}),
                    ErrorCode::zip_crc_mismatch);
}

TEST(ZipReaderRejects, SharedCrcWorkReportsTheFirstFailureInDirectoryOrder) {
  // 64 records, two damaged, checked by three threads that take records as
  // they come: whichever thread finds which, the failure reported is the
  // first in directory order, as a sequential check would report it.
  std::vector<Record> records;
  for (int i = 0; i < 64; ++i) records.push_back({"data/" + std::to_string(i), std::string(1000 + i, 'a' + i % 26)});
  auto bytes = write_archive(records);
  const ZipArchive clean = read_zip_directory(bytes, Limits{});
  for (const char* damaged : {"data/40", "data/17"}) bytes[clean.find(damaged)->data_offset + 9] ^= std::byte{0x10};
  for (int round = 0; round < 20; ++round) {
    const ZipArchive archive = read_zip_directory(bytes, Limits{});
    ZipCrcWork work(archive, bytes, Limits{});
    std::thread a([&] { work.work(); });
    std::thread b([&] { work.work(); });
    work.work();
    a.join();
    b.join();
    try {
      work.finish();
      ADD_FAILURE() << "two damaged records passed";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::zip_crc_mismatch);
      EXPECT_NE(std::string(error.what()).find("data/17"), std::string::npos) << error.what();
    }
  }
  // Undamaged, the shared check passes; every record was taken once.
  const auto intact = write_archive(records);
  const ZipArchive archive = read_zip_directory(intact, Limits{});
  ZipCrcWork work(archive, intact, Limits{});
  std::thread helper([&] { work.work(); });
  work.work();
  helper.join();
  EXPECT_NO_THROW(work.finish());
}

TEST(ZipReaderRejects, VerifyingAgainstOtherBytes) {
  const auto bytes = small_archive();
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  const std::span<const std::byte> shorter(bytes.data(), 100);
  EXPECT_ERROR_CODE(verify_zip_crcs(archive, shorter, Limits{}), ErrorCode::invalid_argument);
}

// ---- fuzz seeds ------------------------------------------------------------------

// fuzz/corpus/zip doubles as a set of fixtures: valid_* seeds must read and
// verify, and bad__<error code>__<what> seeds must be rejected with that code.
// Other seeds (crash regressions) only must not crash; fuzz.zip.replay runs
// them all.
TEST(ZipReaderFuzzSeeds, SeedsMeetTheExpectationsTheirNamesState) {
  std::size_t valid = 0;
  std::size_t bad = 0;
  for (const auto& file : std::filesystem::directory_iterator(testing::source_dir() / "fuzz" / "corpus" / "zip")) {
    const std::string name = file.path().filename().string();
    SCOPED_TRACE(name);
    const auto bytes = testing::read_file_bytes(file.path());
    if (name.starts_with("valid_")) {
      EXPECT_NO_THROW(read_and_verify(bytes));
      ++valid;
    } else if (name.starts_with("bad__")) {
      const std::string code_name = name.substr(5, name.find("__", 5) - 5);
      const auto code = error_code_from_name(code_name);
      ASSERT_TRUE(code.has_value()) << code_name;
      EXPECT_ERROR_CODE(read_and_verify(bytes), *code);
      ++bad;
    }
  }
  EXPECT_GE(valid, 5u);
  EXPECT_GE(bad, 10u);
}

// ---- corruption sweeps -------------------------------------------------------------

// Every single-byte corruption and every truncation of a small archive is
// either rejected with a holdpoint::Error or reads back as the same records
// (a byte of padding, a version field): never a crash, never other content.
class ZipReaderCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    original_ = small_archive();
    archive_ = read_and_verify(original_);
  }

  void expect_rejected_or_unchanged(const std::vector<std::byte>& bytes, const std::string& what) {
    try {
      const ZipArchive archive = read_and_verify(bytes);
      ASSERT_EQ(archive.entries.size(), archive_.entries.size()) << what;
      for (std::size_t i = 0; i < archive.entries.size(); ++i) {
        const ZipEntry& got = archive.entries[i];
        const ZipEntry& want = archive_.entries[i];
        EXPECT_EQ(got.name, want.name) << what;
        EXPECT_EQ(got.size, want.size) << what;
        EXPECT_EQ(got.crc32, want.crc32) << what;
        EXPECT_TRUE(std::ranges::equal(zip_entry_bytes(bytes, got), zip_entry_bytes(original_, want))) << what;
      }
      ++accepted_;
    } catch (const Error&) {
      ++rejected_;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": non-holdpoint exception " << e.what();
    }
  }

  std::vector<std::byte> original_;
  ZipArchive archive_;
  std::size_t accepted_ = 0;
  std::size_t rejected_ = 0;
};

TEST_F(ZipReaderCorruption, EverySingleByteFlip) {
  for (std::size_t i = 0; i < original_.size(); ++i) {
    auto bytes = original_;
    bytes[i] ^= std::byte{0xFF};
    expect_rejected_or_unchanged(bytes, "flip at " + std::to_string(i));
  }
  EXPECT_GT(rejected_, original_.size() / 2);
}

TEST_F(ZipReaderCorruption, EveryTruncation) {
  for (std::size_t size = 0; size < original_.size(); ++size) {
    expect_rejected_or_unchanged({original_.begin(), original_.begin() + static_cast<std::ptrdiff_t>(size)},
                                 "truncated to " + std::to_string(size));
  }
  EXPECT_EQ(accepted_, 0u);
}

}  // namespace
}  // namespace holdpoint::format
