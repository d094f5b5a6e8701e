// ZipStreamChecker against read_zip_directory: fed the same archive in pieces
// of every size (so that each header, descriptor and payload is split at
// every place), it fills the same offsets, computes the CRCs verify_zip_crcs
// checks, keeps the payloads asked for, and gives up exactly on archives the
// random-access reader refuses in its local stage.
#include "format/zip/zip_stream_checker.h"

#include <algorithm>

#include "base/crc32.h"
#include "format/zip/zip_writer.h"
#include "support/test_support.h"
#include "support/zip_builder.h"

namespace holdpoint::format {
namespace {

using testing::zip_entry;
using testing::ZipBuilderEntry;
using testing::ZipBuilderLayout;

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* first = reinterpret_cast<const std::byte*>(text.data());
  return {first, first + text.size()};
}

std::vector<std::byte> written_archive() {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.add_record("data.pkl", bytes_of("\x80\x02}q\x01."));
  writer.add_record("data/0", bytes_of(""));
  writer.add_record("data/1", bytes_of(std::string(300, 'x')));
  writer.add_record("version", bytes_of("3\n"));
  writer.finish();
  return sink.take();
}

bool keep_pickle(const ZipEntry& entry) { return entry.record() == "data.pkl" || entry.record() == "data/0"; }

// Streams `file` through a checker in pieces of `piece` bytes.
struct Streamed {
  ZipArchive archive;
  bool ok = false;
};
Streamed stream(std::span<const std::byte> file, std::size_t piece) {
  ZipMemorySource source(file);
  Streamed result{read_zip_central_directory(source, Limits{}), false};
  ZipStreamChecker checker(result.archive, file.size(), keep_pickle);
  for (std::size_t at = 0; at < file.size(); at += piece) {
    checker.consume(at, file.subspan(at, std::min(piece, file.size() - at)));
  }
  result.ok = checker.local_entries_ok();
  if (result.ok) {
    checker.check_crcs(Limits{});
    for (const ZipEntry& entry : result.archive.entries) {
      if (!keep_pickle(entry)) continue;
      const auto kept = checker.kept(entry);
      const auto expected = zip_entry_bytes(file, entry);
      EXPECT_TRUE(std::equal(kept.begin(), kept.end(), expected.begin(), expected.end())) << entry.record();
    }
  }
  return result;
}

void expect_streams_like_random_access(std::span<const std::byte> file) {
  bool accepted = true;
  ZipArchive expected;
  try {
    expected = read_zip_directory(file, Limits{});
  } catch (const Error&) {
    accepted = false;
  }
  for (std::size_t piece : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{29},
                            std::size_t{64}, std::size_t{1000}, file.size()}) {
    SCOPED_TRACE("pieces of " + std::to_string(piece));
    const Streamed streamed = stream(file, piece);
    ASSERT_EQ(streamed.ok, accepted);
    if (!accepted) continue;
    for (std::size_t i = 0; i < expected.entries.size(); ++i) {
      EXPECT_EQ(streamed.archive.entries[i].data_offset, expected.entries[i].data_offset);
      EXPECT_EQ(streamed.archive.entries[i].end_offset, expected.entries[i].end_offset);
    }
  }
}

TEST(ZipStreamChecker, WrittenArchiveInPiecesOfEverySize) { expect_streams_like_random_access(written_archive()); }

TEST(ZipStreamChecker, BenignVariants) {
  std::vector<ZipBuilderLayout> layouts(4);
  for (auto& layout : layouts) {
    layout.entries = {zip_entry("archive/data.pkl", "pickle"), zip_entry("archive/data/0", "abcdefgh"),
                      zip_entry("archive/version", "3\n")};
  }
  layouts[1].entries[1].descriptor_signature = false;
  layouts[2].entries[1].descriptor64 = true;
  layouts[2].entries[2].write_descriptor = false;
  layouts[2].entries[2].flags = 0x0800;
  layouts[3].zip64_end = false;
  layouts[3].entries[0].local_extra = std::vector<std::byte>{};
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE(i);
    expect_streams_like_random_access(testing::build_zip(layouts[i]));
  }
}

// Archives whose central directory reads but whose local stage fails: the
// checker stops, as the random-access reader refuses them.
TEST(ZipStreamChecker, GivesUpWhereTheLocalStageFails) {
  const auto base = [] {
    ZipBuilderLayout layout;
    layout.entries = {zip_entry("archive/data.pkl", "pickle"), zip_entry("archive/data/0", "abcdefgh")};
    return layout;
  };
  std::vector<ZipBuilderLayout> layouts;
  layouts.push_back(base());
  layouts.back().entries[1].gap_before = 3;
  layouts.push_back(base());
  layouts.back().entries[1].shares_local_header_of = 0;
  layouts.push_back(base());
  layouts.back().gap_before_directory = 2;
  layouts.push_back(base());
  layouts.back().entries[1].descriptor_crc = 7;
  layouts.push_back(base());
  layouts.back().entries[0].local_name = "archive/data.pkL";
  layouts.push_back(base());
  layouts.back().entries[1].local_flags = 0x0800;
  layouts.push_back(base());
  layouts.back().entries[1].local_extra = std::vector<std::byte>{std::byte{1}, std::byte{2}, std::byte{3}};
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE(i);
    const auto file = testing::build_zip(layouts[i]);
    EXPECT_ANY_THROW(read_zip_directory(file, Limits{}));
    expect_streams_like_random_access(file);
  }
}

TEST(ZipStreamChecker, CrcOfEveryEntryInDirectoryOrder) {
  auto file = written_archive();
  ZipMemorySource source(file);
  ZipArchive archive = read_zip_directory(source, Limits{});
  // Damage the second storage's payload: the first entry in directory order
  // that fails is the one reported.
  file[archive.entries[2].data_offset + 10] ^= std::byte{1};
  ZipArchive streamed = read_zip_central_directory(source, Limits{});
  ZipStreamChecker checker(streamed, file.size(), keep_pickle);
  checker.consume(0, file);
  ASSERT_TRUE(checker.local_entries_ok());
  EXPECT_ERROR_CODE(checker.check_crcs(Limits{}), ErrorCode::zip_crc_mismatch);
  EXPECT_ERROR_CODE(verify_zip_crcs(archive, file, Limits{}), ErrorCode::zip_crc_mismatch);
}

TEST(ZipStreamChecker, BytesOutOfOrderAreACallerError) {
  const auto file = written_archive();
  ZipMemorySource source(file);
  ZipArchive archive = read_zip_central_directory(source, Limits{});
  ZipStreamChecker checker(archive, file.size(), keep_pickle);
  EXPECT_ERROR_CODE(checker.consume(5, file), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(checker.kept(archive.entries[0]), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace holdpoint::format
