// Integrity after the save/load performance work (XXH3 storage digests, the
// page-cache read-back, parse while hashing): nothing those changes skip may
// let a wrong byte through.
//
//   - read_snapshot with a SnapshotParser: a digest mismatch always wins, the
//     parser's result is never handed out, await_digest stops a parser before
//     it writes, and the digest is the file's whatever the parser did; on the
//     small (single-thread) and large (hashing thread) paths.
//   - load_checkpoint_mapping and RunDirectory::load on >= 16 MiB files.
//   - publish's read-back: a byte the file system returns wrong (planted by a
//     Directory decorator that flips it in the staging file just before the
//     read-back maps or reads it) fails the publication in ReadBack::cached
//     (whole-file CRC-32) and ReadBack::device (SHA-256) modes, leaving neither target
//     nor staging file; which calls each mode makes.
//   - a single-byte flip anywhere in a checkpoint is refused by the restricted
//     reader unless it lies in a zip header field no reader interprets
//     (versions, timestamps, attributes). The cached read-back also compares
//     the whole file's CRC-32 with the one computed while writing, so it
//     refuses those flips too (file_changed_during_read) before the rename.

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <tuple>

#include "base/publish.h"
#include "base/reader_thread.h"
#include "format/pt_writer.h"
#include "format/zip/zip_reader.h"
#include "format/zip/zip_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/tampering_file_system.h"
#include "support/test_support.h"
#include "support/zip_builder.h"

namespace holdpoint {
namespace {

using testing::flip_on_disk;
using testing::in_record_payload;
using testing::Tamper;
using testing::TamperingDirectory;
using testing::TamperingFileSystem;
using testing::TempDir;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// ---- helpers -----------------------------------------------------------------------------

// Deterministic bytes that are not all alike (xorshift64*).
std::vector<std::byte> pattern_bytes(std::size_t size, std::uint64_t seed) {
  std::vector<std::byte> bytes(size);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const std::uint64_t word = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(bytes.data() + i, &word, 8);
  }
  for (; i < size; ++i) bytes[i] = static_cast<std::byte>(i * 131 + seed);
  return bytes;
}

std::vector<std::byte> read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<std::byte> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

void write_all(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

LoadOptions expecting(const Sha256Digest& digest) {
  LoadOptions options;
  options.expected_sha256 = digest;
  return options;
}

GenerationSpec at_step(std::int64_t step) {
  GenerationSpec spec;
  spec.step = step;
  return spec;
}

Sha256Digest wrong(Sha256Digest digest) {
  digest.bytes[17] ^= 0x01;
  return digest;
}

std::vector<std::byte> bytes_in(const io::Snapshot& snapshot) {
  return {snapshot.buffer->data(), snapshot.buffer->data() + snapshot.buffer->size()};
}

// A tensor of `size` pattern bytes as float32 (size a multiple of 4).
Value pattern_tensor(std::size_t size, std::uint64_t seed) {
  const auto bytes = pattern_bytes(size, seed);
  return Value::tensor(TensorData::from_bytes(DType::float32, {static_cast<std::int64_t>(size / 4)}, bytes));
}

// A checkpoint with a holdpoint manifest (what the run directory's verifier
// wants), a large tensor and a small one.
Value checkpoint_value(std::size_t tensor_bytes, std::uint64_t seed = 1) {
  Dict root;
  Manifest manifest;
  manifest.semantic_identity = "integrity-test";
  root.insert(std::string(kManifestKey), manifest.to_value());
  root.insert("big", pattern_tensor(tensor_bytes, seed));
  root.insert("small", pattern_tensor(64, seed + 1));
  root.insert("step", Value::integer(static_cast<std::int64_t>(seed)));
  return Value::dict(std::move(root));
}

std::vector<std::byte> file_of(const Value& root) {
  io::MemorySink sink;
  format::write_pt(sink, root);
  return sink.take();
}

const format::ZipEntry& entry_named(const format::ZipArchive& archive, std::string_view record) {
  const format::ZipEntry* entry = archive.find(record);
  if (!entry) throw std::runtime_error("no record " + std::string(record));
  return *entry;
}

// ---- read_snapshot with a parser ---------------------------------------------------------

// A test code no read path raises on its own, so that "the parser's error"
// cannot be confused with anything else.
constexpr ErrorCode kParserCode = ErrorCode::pickle_opcode_forbidden;

// Sizes, with a large file read by a thread of its own or by the parser's.
class SnapshotParserContract : public ::testing::TestWithParam<std::tuple<std::size_t, io::ReaderThread>> {
 protected:
  void SetUp() override {
    io::reader_thread_mode = std::get<1>(GetParam());
    const std::size_t size = std::get<0>(GetParam());
    bytes_ = pattern_bytes(size, size + 7);
    path_ = dir_ / "file.bin";
    write_all(path_, bytes_);
    digest_ = Sha256::of(bytes_);
  }
  void TearDown() override { io::reader_thread_mode = io::ReaderThread::by_cores; }
  io::Snapshot read(const std::optional<Sha256Digest>& expected, const io::SnapshotParser& parse = {}) {
    return io::read_snapshot(path_, bytes_.size() + 1, expected, {}, parse);
  }

  TempDir dir_;
  std::filesystem::path path_;
  std::vector<std::byte> bytes_;
  Sha256Digest digest_;
};

TEST_P(SnapshotParserContract, DigestIsTheFilesWithOrWithoutAParserAndTheParserSeesEveryByte) {
  const io::Snapshot plain = read(std::nullopt);
  EXPECT_EQ(plain.sha256, digest_);
  EXPECT_TRUE(bytes_in(plain) == bytes_);

  std::optional<Sha256Digest> seen;
  const io::Snapshot parsed =
      read(std::nullopt, [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
        // The parser may run while the file is still read: it awaits what it reads.
        reading.await_bytes(0, buffer->size());
        seen = Sha256::of(buffer->bytes());
      });
  ASSERT_TRUE(seen);
  EXPECT_EQ(*seen, digest_);
  EXPECT_EQ(parsed.sha256, digest_);

  const io::Snapshot checked = read(digest_, [](const auto&, const auto&) {});
  EXPECT_EQ(checked.sha256, digest_);
  EXPECT_TRUE(bytes_in(checked) == bytes_);
}

TEST_P(SnapshotParserContract, WithTheHashSkippedEveryByteIsReadAndNoDigestIsMade) {
  // Hashing::when_expected with no expected digest: read only.
  std::vector<std::size_t> hashed_reports;
  bool awaited = false;
  const io::Snapshot skipped = io::read_snapshot(
      path_, bytes_.size() + 1, std::nullopt, {},
      [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
        hashed_reports.push_back(reading.bytes_hashed());
        reading.await_bytes(0, buffer->size());
        hashed_reports.push_back(reading.bytes_hashed());
        reading.await_digest();
        awaited = true;
        hashed_reports.push_back(reading.bytes_hashed());
      },
      io::Hashing::when_expected);
  EXPECT_FALSE(skipped.hashed);
  EXPECT_EQ(skipped.sha256, Sha256Digest{}) << "no digest is made up";
  EXPECT_TRUE(bytes_in(skipped) == bytes_);
  EXPECT_TRUE(awaited);
  ASSERT_EQ(hashed_reports.size(), 3u);
  // bytes_hashed follows the read in order, never past what is in.
  EXPECT_TRUE(std::is_sorted(hashed_reports.begin(), hashed_reports.end()));
  EXPECT_LE(hashed_reports[0], bytes_.size());
  EXPECT_EQ(hashed_reports[2], bytes_.size()) << "every byte is in once await_digest returns";
  // Without a parser, too.
  const io::Snapshot plain = io::read_snapshot(path_, bytes_.size() + 1, std::nullopt, {}, {}, io::Hashing::when_expected);
  EXPECT_FALSE(plain.hashed);
  EXPECT_TRUE(bytes_in(plain) == bytes_);
  // An expected digest is always checked, whatever the mode.
  const io::Snapshot checked = io::read_snapshot(path_, bytes_.size() + 1, digest_, {}, {}, io::Hashing::when_expected);
  EXPECT_TRUE(checked.hashed);
  EXPECT_EQ(checked.sha256, digest_);
  EXPECT_ERROR_CODE(io::read_snapshot(path_, bytes_.size() + 1, wrong(digest_), {}, [](const auto&, const auto&) {},
                                      io::Hashing::when_expected),
                    ErrorCode::sha256_mismatch);
  // The default mode hashes with nothing to check the digest against.
  EXPECT_TRUE(read(std::nullopt).hashed);
}

TEST_P(SnapshotParserContract, ASucceedingParserDoesNotHideADigestMismatch) {
  bool ran = false;
  EXPECT_ERROR_CODE(read(wrong(digest_), [&](const auto&, const auto&) { ran = true; }), ErrorCode::sha256_mismatch);
  EXPECT_TRUE(ran) << "the parser was meant to run (and succeed) before the mismatch was found";
}

TEST_P(SnapshotParserContract, ADigestMismatchWinsOverTheParsersError) {
  const io::SnapshotParser failing = [](const auto&, const auto&) { throw Error(kParserCode, "parser failed"); };
  EXPECT_ERROR_CODE(read(wrong(digest_), failing), ErrorCode::sha256_mismatch);
  // Something that is not a holdpoint::Error, too.
  EXPECT_ERROR_CODE(read(wrong(digest_), [](const auto&, const auto&) { throw std::runtime_error("boom"); }),
                    ErrorCode::sha256_mismatch);
  // With the right digest, or none, the parser's own error comes out.
  EXPECT_ERROR_CODE(read(digest_, failing), kParserCode);
  EXPECT_ERROR_CODE(read(std::nullopt, failing), kParserCode);
}

TEST_P(SnapshotParserContract, AwaitDigestStopsTheParserBeforeItWritesWhenTheDigestIsWrong) {
  bool after_await = false;
  EXPECT_ERROR_CODE(read(wrong(digest_),
                         [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
                           const auto& await_digest = reading.await_digest;
                           await_digest();
                           after_await = true;
                           if (buffer->size() > 0) buffer->data()[0] ^= std::byte{1};
                         }),
                    ErrorCode::sha256_mismatch);
  EXPECT_FALSE(after_await);

  // A parser that swallows await_digest's error gains nothing: the read
  // still fails with the mismatch.
  bool swallowed = false;
  EXPECT_ERROR_CODE(read(wrong(digest_),
                         [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
                           const auto& await_digest = reading.await_digest;
                           try {
                             await_digest();
                           } catch (const Error& error) {
                             swallowed = error.code() == ErrorCode::sha256_mismatch;
                           }
                           if (buffer->size() > 0) buffer->data()[0] ^= std::byte{1};
                         }),
                    ErrorCode::sha256_mismatch);
  EXPECT_TRUE(swallowed);
}

TEST_P(SnapshotParserContract, AWriteAfterAwaitDigestDoesNotChangeTheDigest) {
  bool wrote = false;
  const io::Snapshot snapshot =
      read(digest_, [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
                           const auto& await_digest = reading.await_digest;
        await_digest();
        await_digest();  // idempotent
        if (buffer->size() == 0) return;
        for (std::byte& b : buffer->bytes()) b ^= std::byte{0x5A};
        wrote = true;
      });
  EXPECT_EQ(snapshot.sha256, digest_) << "the digest is of the bytes read, not of the parser's rewrite";
  if (wrote) {
    EXPECT_EQ(snapshot.buffer->data()[0], bytes_[0] ^ std::byte{0x5A});
    EXPECT_EQ(snapshot.buffer->data()[bytes_.size() - 1], bytes_.back() ^ std::byte{0x5A});
  }
  // Without an expected digest await_digest checks nothing, and still waits.
  const io::Snapshot unchecked =
      read(std::nullopt, [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
                           const auto& await_digest = reading.await_digest;
        await_digest();
        if (buffer->size() > 0) buffer->data()[buffer->size() / 2] ^= std::byte{0xFF};
      });
  EXPECT_EQ(unchecked.sha256, digest_);
}

TEST_P(SnapshotParserContract, BytesHashedOnlyGrowsStaysInTheBufferAndIsAllOfItOnceTheDigestIsKnown) {
  std::vector<std::size_t> seen;
  std::size_t size = 0;
  const io::Snapshot snapshot =
      read(digest_, [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
        const auto& await_digest = reading.await_digest;
        const auto& bytes_hashed = reading.bytes_hashed;
        size = buffer->size();
        for (int i = 0; i < 1000; ++i) seen.push_back(bytes_hashed());
        await_digest();
        seen.push_back(bytes_hashed());
      });
  EXPECT_EQ(snapshot.sha256, digest_);
  ASSERT_EQ(seen.size(), 1001u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_LE(seen.front(), size);
  EXPECT_EQ(seen.back(), size) << "once the digest is known, every byte has been hashed";
}

TEST_P(SnapshotParserContract, AwaitedBytesAreTheFilesInWhateverOrderTheParserAsksForThem) {
  bool same = true;
  const io::Snapshot snapshot =
      read(digest_, [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
        const std::size_t size = buffer->size();
        // The end first, as a zip reader asks for it.
        reading.read_ahead_from(size / 2);
        const std::vector<std::pair<std::size_t, std::size_t>> ranges = {
            {size - std::min<std::size_t>(size, 100), 100},
            {size / 2, std::min<std::size_t>(size - size / 2, 5000)},
            {0, std::min<std::size_t>(size, 64)},
            {size / 3, 1},
            {0, size}};
        for (const auto& [offset, length] : ranges) {
          reading.await_bytes(offset, length);
          const std::size_t n = std::min(length, size - offset);
          same = same && std::memcmp(buffer->data() + offset, bytes_.data() + offset, n) == 0;
        }
        // Ranges past the end, or running past it, are cut there.
        reading.await_bytes(size + 5, 10);
        reading.await_bytes(size / 4, UINT64_MAX);
        reading.read_ahead_from(UINT64_MAX);
      });
  EXPECT_TRUE(same) << "an awaited range held other bytes than the file's";
  EXPECT_EQ(snapshot.sha256, digest_) << "reading the end first must not change what is hashed";
  EXPECT_TRUE(bytes_in(snapshot) == bytes_);
}

TEST(SnapshotParserContract, AFileThatShrinksWhileTheParserAwaitsItFailsTheReadAndNeverHangs) {
  for (const auto mode : {io::ReaderThread::always, io::ReaderThread::never}) {
  io::reader_thread_mode = mode;
  SCOPED_TRACE(mode == io::ReaderThread::always ? "reader thread" : "parser reads");
  TempDir dir;
  const auto bytes = pattern_bytes(64 * kMiB, 11);
  const auto path = dir / "f.bin";
  write_all(path, bytes);
  bool awaited_end = false;
  EXPECT_ERROR_CODE(io::read_snapshot(path, 128 * kMiB, Sha256::of(bytes), {},
                                      [&](const std::shared_ptr<io::Buffer>& buffer, const io::SnapshotReading& reading) {
                                        // The reader is still near the start: the rest is gone.
                                        std::filesystem::resize_file(path, 1 * kMiB);
                                        reading.await_bytes(buffer->size() - 1, 1);
                                        awaited_end = true;
                                      }),
                    ErrorCode::file_changed_during_read);
  EXPECT_FALSE(awaited_end) << "await_bytes returned bytes the reader never read";
  }
  io::reader_thread_mode = io::ReaderThread::by_cores;
}

// 0 and small sizes hash on the reading thread; from 8 MiB a second thread
// hashes behind the reader. 16 MiB + 3 ends in a partial chunk.
INSTANTIATE_TEST_SUITE_P(Sizes, SnapshotParserContract,
                         ::testing::Combine(::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{4096 + 7},
                                                              8 * kMiB - 1, 8 * kMiB, 16 * kMiB + 3),
                                            ::testing::Values(io::ReaderThread::always, io::ReaderThread::never)),
                         [](const auto& info) {
                           return "bytes_" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == io::ReaderThread::always ? "_reader_thread"
                                                                                       : "_parser_reads");
                         });

TEST(SnapshotParserContract, DirectoryReadKeepsTheContract) {
  TempDir dir;
  const auto bytes = pattern_bytes(16 * kMiB, 3);
  write_all(dir / "f.bin", bytes);
  const Sha256Digest digest = Sha256::of(bytes);
  auto directory = io::posix_file_system().open_directory(dir.path(), false);
  bool ran = false;
  EXPECT_ERROR_CODE(directory->read("f.bin", 32 * kMiB, wrong(digest), {},
                                    [&](const auto&, const auto&) { ran = true; }),
                    ErrorCode::sha256_mismatch);
  EXPECT_TRUE(ran);
  EXPECT_ERROR_CODE(directory->read("f.bin", 32 * kMiB, wrong(digest), {},
                                    [](const auto&, const auto&) { throw Error(kParserCode, "x"); }),
                    ErrorCode::sha256_mismatch);
  EXPECT_ERROR_CODE(directory->read("f.bin", 32 * kMiB, digest, {},
                                    [](const auto&, const auto&) { throw Error(kParserCode, "x"); }),
                    kParserCode);
  EXPECT_EQ(directory->read("f.bin", 32 * kMiB, digest, {}, [](const auto&, const auto&) {}).sha256, digest);
}

// ---- load_checkpoint_mapping / RunDirectory::load on large files -------------------------

TEST(LargeCheckpointDigest, AWrongExpectedDigestIsRefusedOnTheThreadedPath) {
  TempDir dir;
  const auto path = dir / "big.pt";
  const Value root = checkpoint_value(16 * kMiB + 64);
  const SaveResult saved = save_mapping(path, root, {.durable = false, .write_sidecar = false});
  ASSERT_GE(saved.file_bytes, 16 * kMiB);
  EXPECT_EQ(saved.sha256, Sha256::of(read_all(path)));

  EXPECT_ERROR_CODE(load_checkpoint_mapping(path, expecting(wrong(saved.sha256))),
                    ErrorCode::sha256_mismatch);

  const LoadedMapping checked = load_checkpoint_mapping(path, expecting(saved.sha256));
  EXPECT_TRUE(checked.digest_checked);
  EXPECT_EQ(checked.sha256, saved.sha256);
  EXPECT_EQ(describe_difference(checked.root, root), "");

  const LoadedMapping unchecked = load_checkpoint_mapping(path);
  EXPECT_FALSE(unchecked.digest_checked) << "no digest was given, so none was checked";
  EXPECT_EQ(unchecked.sha256, std::nullopt) << "and none was computed, on the threaded path either";
  LoadOptions hashing;
  hashing.compute_sha256 = true;
  EXPECT_EQ(load_checkpoint_mapping(path, hashing).sha256, std::optional<Sha256Digest>(saved.sha256));
}

TEST(LargeCheckpointDigest, AFlippedByteIsADigestMismatchWithADigestAndACrcMismatchWithout) {
  TempDir dir;
  const auto path = dir / "big.pt";
  const SaveResult saved =
      save_mapping(path, checkpoint_value(16 * kMiB + 64), {.durable = false, .write_sidecar = false});
  const auto file = read_all(path);
  const auto archive = format::read_zip_directory(file, Limits{});
  const format::ZipEntry& big = *std::max_element(
      archive.entries.begin(), archive.entries.end(), [](const auto& a, const auto& b) { return a.size < b.size; });
  // Near the end of the file: the reader is done long before the hasher.
  for (const std::uint64_t offset : {big.data_offset + 5, big.data_offset + big.size - 3}) {
    SCOPED_TRACE(offset);
    write_all(path, file);
    flip_on_disk(path, offset);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path, expecting(saved.sha256)), ErrorCode::sha256_mismatch);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path), ErrorCode::zip_crc_mismatch);
  }
}

// A big-endian archive is byte-swapped in place; the swap must wait for the
// digest, or the digest would be of swapped bytes.
TEST(LargeCheckpointDigest, ABigEndianArchiveIsSwappedOnlyAfterItsDigest) {
  Dict plain;
  plain.insert("w", pattern_tensor(16 * kMiB, 9));
  const Value root = Value::dict(std::move(plain));
  const auto little = file_of(root);
  const auto archive = format::read_zip_directory(little, Limits{});
  io::MemorySink sink;
  format::ZipWriter zip(sink, archive.archive_name);
  for (const auto& entry : archive.entries) {
    const auto payload = format::zip_entry_bytes(little, entry);
    std::vector<std::byte> bytes(payload.begin(), payload.end());
    if (entry.record() == "byteorder") {
      bytes = testing::bytes_of("big");
    } else if (entry.record().starts_with("data/")) {
      for (std::size_t i = 0; i + 4 <= bytes.size(); i += 4) std::reverse(bytes.begin() + i, bytes.begin() + i + 4);
    }
    zip.add_record(entry.record(), bytes);
  }
  zip.finish();
  const auto big_endian = sink.take();
  TempDir dir;
  const auto path = dir / "big_endian.pt";
  write_all(path, big_endian);
  const Sha256Digest digest = Sha256::of(big_endian);

  for (int round = 0; round < 3; ++round) {
    const LoadedMapping loaded = load_checkpoint_mapping(path, expecting(digest));
    EXPECT_EQ(loaded.markers.byteorder, std::optional<std::string>("big"));
    EXPECT_EQ(loaded.sha256, digest);
    EXPECT_EQ(describe_difference(loaded.root, root), "");
    LoadOptions hashing;
    hashing.compute_sha256 = true;
    EXPECT_EQ(load_checkpoint_mapping(path, hashing).sha256, digest);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path, expecting(wrong(digest))), ErrorCode::sha256_mismatch);
  }
}

TEST(LargeCheckpointDigest, RunDirectoryLoadRefusesAGenerationChangedAfterItsCommit) {
  TempDir dir;
  RunDirectoryOptions options;
  options.durable = false;
  options.log = [](const std::string&) {};
  RunDirectory run(dir / "run", options);
  const auto bytes = file_of(checkpoint_value(16 * kMiB + 128, 5));
  run.commit(at_step(1), [&](io::ByteSink& sink) { sink.write(bytes); });
  const GenerationInfo latest = *run.latest();
  EXPECT_EQ(latest.sha256, Sha256::of(bytes));
  const LoadedMapping loaded = run.load(latest);
  EXPECT_TRUE(loaded.digest_checked);
  EXPECT_EQ(describe_difference(loaded.root, checkpoint_value(16 * kMiB + 128, 5)), "");

  const auto archive = format::read_zip_directory(bytes, Limits{});
  const auto offsets = testing::zip_offsets(bytes);
  // A payload byte, a central directory timestamp (no reader interprets it),
  // and a byte of data.pkl.
  for (const std::uint64_t offset : {entry_named(archive, "data/0").data_offset + 1000,
                                     std::uint64_t{offsets.central_entries[0] + 12},
                                     entry_named(archive, "data.pkl").data_offset + 3}) {
    SCOPED_TRACE(offset);
    flip_on_disk(run.file_path(latest), offset);
    EXPECT_ERROR_CODE(run.load(latest), ErrorCode::sha256_mismatch);
    flip_on_disk(run.file_path(latest), offset);  // and back
    EXPECT_NO_THROW(run.load(latest));
  }
}

// ---- the read-back of publish -----------------------------------------------------------

const io::PublishVerifier kParseVerifier = [](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
  parse_checkpoint_bytes(bytes, owner);
};

std::vector<std::string> staging_files(const std::filesystem::path& directory) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (io::is_staging_name(entry.path().filename().string())) out.push_back(entry.path().filename().string());
  }
  return out;
}

class PublishReadBack : public ::testing::Test {
 protected:
  // Publishes `bytes` as "ckpt.pt" through a tampering directory.
  void publish(const std::vector<std::byte>& bytes, io::PublishOptions options,
               const io::PublishVerifier& verify = kParseVerifier) {
    auto directory = std::make_unique<TamperingDirectory>(
        io::posix_file_system().open_directory(dir_.path(), false), tamper_);
    io::publish(*directory, "ckpt.pt", options, [&](io::ByteSink& sink) { sink.write_stable(bytes); }, verify);
  }
  void expect_nothing_published() {
    EXPECT_FALSE(std::filesystem::exists(dir_ / "ckpt.pt")) << "a refused read-back must not publish the target";
    EXPECT_EQ(staging_files(dir_.path()), std::vector<std::string>{}) << "the staging file must be removed";
  }

  TempDir dir_;
  std::shared_ptr<Tamper> tamper_ = std::make_shared<Tamper>();
  const std::vector<std::byte> checkpoint_ = file_of(checkpoint_value(4 * kMiB));
};

TEST_F(PublishReadBack, CachedModeMapsAndParsesALargeCheckpointWithoutReadingIt) {
  publish(checkpoint_, {.durable = false, .read_back = ReadBack::cached, .verifier_checks_content = true});
  EXPECT_EQ(tamper_->staging_map_calls, 1);
  EXPECT_EQ(tamper_->read_calls, 0) << "cached mode maps the staging file instead of re-reading it";
  EXPECT_EQ(tamper_->drop_calls, 0);
  EXPECT_TRUE(read_all(dir_ / "ckpt.pt") == checkpoint_);
}

TEST_F(PublishReadBack, CachedModeRefusesAByteThePageCacheReturnsWrong) {
  tamper_->on_map = true;
  tamper_->offset = in_record_payload("data/0");
  // The whole file's CRC-32 sees it before the parse would (zip_crc_mismatch).
  EXPECT_ERROR_CODE(
      publish(checkpoint_, {.durable = false, .read_back = ReadBack::cached, .verifier_checks_content = true}),
      ErrorCode::file_changed_during_read);
  EXPECT_EQ(tamper_->flipped.size(), 1u) << "the flip was planted";
  EXPECT_EQ(tamper_->read_calls, 0);
  expect_nothing_published();
}

TEST_F(PublishReadBack, DeviceModeDropsTheCacheRereadsAndRefusesAByteTheDeviceReturnsWrong) {
  tamper_->on_read = true;
  tamper_->offset = in_record_payload("data/0");
  for (const bool durable : {false, true}) {
    SCOPED_TRACE(durable);
    tamper_->order.clear();
    tamper_->flipped.clear();
    EXPECT_ERROR_CODE(
        publish(checkpoint_, {.durable = durable, .read_back = ReadBack::device, .verifier_checks_content = true}),
        ErrorCode::sha256_mismatch);
    EXPECT_EQ(tamper_->flipped.size(), 1u);
    EXPECT_EQ(tamper_->order, (std::vector<std::string>{"drop", "read"}))
        << "device mode drops the cached pages, then re-reads (and never maps)";
    expect_nothing_published();
  }
  EXPECT_EQ(tamper_->staging_map_calls, 0);
}

TEST_F(PublishReadBack, DeviceModeRefusesAFlipInAByteNoParserLooksAt) {
  // The central directory's timestamp of the first entry: the zip reader
  // does not interpret it, only the re-hash can see it.
  tamper_->on_read = true;
  tamper_->offset = [](const std::vector<std::byte>& file) -> std::optional<std::uint64_t> {
    return testing::zip_offsets(file).central_entries[0] + 12;
  };
  EXPECT_ERROR_CODE(
      publish(checkpoint_, {.durable = false, .read_back = ReadBack::device, .verifier_checks_content = true}),
      ErrorCode::sha256_mismatch);
  expect_nothing_published();
}

TEST_F(PublishReadBack, DeviceModeSucceedsAndCallsDropOnceWhenNothingIsWrong) {
  publish(checkpoint_, {.durable = false, .read_back = ReadBack::device, .verifier_checks_content = true});
  EXPECT_EQ(tamper_->order, (std::vector<std::string>{"drop", "read"}));
  EXPECT_EQ(tamper_->drop_calls, 1);
  EXPECT_TRUE(read_all(dir_ / "ckpt.pt") == checkpoint_);
}

TEST_F(PublishReadBack, CachedModeRereadsAndRehashesWhenTheVerifierDoesNotCheckContent) {
  tamper_->on_read = true;
  tamper_->on_map = true;
  tamper_->offset = in_record_payload("data/0");
  EXPECT_ERROR_CODE(
      publish(checkpoint_, {.durable = false, .read_back = ReadBack::cached, .verifier_checks_content = false}),
      ErrorCode::sha256_mismatch);
  EXPECT_EQ(tamper_->staging_map_calls, 0);
  EXPECT_EQ(tamper_->order, (std::vector<std::string>{"read"}));
  expect_nothing_published();

  // Without a verifier at all, too, even when the caller says it checks content.
  tamper_->order.clear();
  tamper_->flipped.clear();
  EXPECT_ERROR_CODE(publish(checkpoint_,
                            {.durable = false, .read_back = ReadBack::cached, .verifier_checks_content = true},
                            io::PublishVerifier{}),
                    ErrorCode::sha256_mismatch);
  EXPECT_EQ(tamper_->order, (std::vector<std::string>{"read"}));
  expect_nothing_published();
}

TEST_F(PublishReadBack, SmallFilesAreAlwaysRereadAndRehashed) {
  tamper_->on_read = true;
  tamper_->on_map = true;
  tamper_->offset = [](const std::vector<std::byte>& file) -> std::optional<std::uint64_t> { return file.size() / 2; };
  auto directory = std::make_unique<TamperingDirectory>(io::posix_file_system().open_directory(dir_.path(), false),
                                                        tamper_);
  EXPECT_ERROR_CODE(io::publish_text(*directory, "LATEST", "step-00000001.pt 0123\n",
                                     {.durable = false, .verifier_checks_content = true},
                                     [](auto, const auto&) {}),
                    ErrorCode::sha256_mismatch);
  EXPECT_EQ(tamper_->order, (std::vector<std::string>{"read"}));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "LATEST"));
  EXPECT_EQ(staging_files(dir_.path()), std::vector<std::string>{});
}

// The run directory's commit: the default verifier parses (so cached mode
// maps), a caller's verifier makes it re-read and re-hash.
class CommitReadBack : public ::testing::TestWithParam<holdpoint::ReadBack> {
 protected:
  RunDirectoryOptions options() {
    RunDirectoryOptions o;
    o.file_system = &fs_;
    o.durable = false;
    o.read_back = GetParam();
    o.log = [](const std::string&) {};
    return o;
  }
  TempDir dir_;
  std::shared_ptr<Tamper> tamper_ = std::make_shared<Tamper>();
  TamperingFileSystem fs_{tamper_};
};

TEST_P(CommitReadBack, AWrongByteFromTheFileSystemIsNeverCommitted) {
  const bool device = GetParam() == holdpoint::ReadBack::device;
  RunDirectory run(dir_ / "run", options());
  const auto first = file_of(checkpoint_value(2 * kMiB, 1));
  run.commit(at_step(1), [&](io::ByteSink& sink) { sink.write(first); });
  EXPECT_EQ(tamper_->staging_map_calls, device ? 0 : 1);
  EXPECT_EQ(tamper_->drop_calls, device ? 1 : 0);

  tamper_->on_map = true;
  tamper_->on_read = true;
  tamper_->offset = in_record_payload("data/0");
  const auto second = file_of(checkpoint_value(2 * kMiB, 2));
  EXPECT_ERROR_CODE(run.commit(at_step(2), [&](io::ByteSink& sink) { sink.write(second); }),
                    device ? ErrorCode::sha256_mismatch : ErrorCode::file_changed_during_read);
  EXPECT_EQ(tamper_->flipped.size(), 1u);
  EXPECT_EQ(run.latest()->step, 1);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run" / "checkpoints" / "step-00000002.pt"));
  EXPECT_EQ(staging_files(dir_ / "run" / "checkpoints"), std::vector<std::string>{});

  // With a caller's verifier (which may not check content) the commit
  // re-reads and re-hashes in either mode.
  tamper_->flipped.clear();
  tamper_->order.clear();
  EXPECT_ERROR_CODE(run.commit(at_step(3), [&](io::ByteSink& sink) { sink.write(second); },
                               [](std::span<std::byte>, const std::shared_ptr<const void>&) {}),
                    ErrorCode::sha256_mismatch);
  EXPECT_EQ(tamper_->order, device ? (std::vector<std::string>{"drop", "read"}) : (std::vector<std::string>{"read"}));
  EXPECT_EQ(run.latest()->step, 1);
  EXPECT_EQ(staging_files(dir_ / "run" / "checkpoints"), std::vector<std::string>{});

  // A reopened directory still resumes the first generation, byte for byte.
  tamper_->offset = nullptr;
  RunDirectory reopened(dir_ / "run", options());
  EXPECT_EQ(reopened.latest()->step, 1);
  EXPECT_TRUE(read_all(reopened.file_path(*reopened.latest())) == first);
}

// A wrong byte in a zip header field no reader interprets (here the first
// central entry's timestamp) is invisible to the parse; the cached read-back
// sees it through the whole file's CRC-32, so the commit fails before the
// rename and LATEST keeps the previous generation.
TEST(CommitReadBackCached, AnUninterpretedHeaderByteFailsTheCommit) {
  TempDir dir;
  auto tamper = std::make_shared<Tamper>();
  TamperingFileSystem fs(tamper);
  RunDirectoryOptions options;
  options.file_system = &fs;
  options.durable = false;
  options.log = [](const std::string&) {};
  const auto first = file_of(checkpoint_value(64 * 1024, 1));
  const auto second = file_of(checkpoint_value(64 * 1024, 2));
  {
    RunDirectory run(dir / "run", options);
    run.commit(at_step(1), [&](io::ByteSink& sink) { sink.write(first); });
    tamper->on_map = true;
    tamper->offset = [](const std::vector<std::byte>& file) -> std::optional<std::uint64_t> {
      return testing::zip_offsets(file).central_entries[0] + 12;
    };
    EXPECT_ERROR_CODE(run.commit(at_step(2), [&](io::ByteSink& sink) { sink.write(second); }),
                      ErrorCode::file_changed_during_read);
    ASSERT_EQ(tamper->flipped.size(), 1u);
    tamper->offset = nullptr;
    EXPECT_EQ(run.latest()->step, 1);
  }
  RunDirectory reopened(dir / "run", options);
  EXPECT_EQ(reopened.latest()->step, 1);
  EXPECT_TRUE(reopened.recovery().damaged.empty());
  EXPECT_TRUE(read_all(reopened.file_path(*reopened.latest())) == first);
}

INSTANTIATE_TEST_SUITE_P(Modes, CommitReadBack,
                         ::testing::Values(holdpoint::ReadBack::cached, holdpoint::ReadBack::device),
                         [](const auto& info) {
                           return std::string(info.param == holdpoint::ReadBack::cached ? "cached" : "device");
                         });

// ---- every single-byte flip --------------------------------------------------------------

// Header bytes the zip reader does not interpret: a local header's "version
// needed" and modification time/date, a central entry's "version made by",
// "version needed", time/date and internal/external attributes, and the
// zip64 end record's versions. A flip there changes nothing any reader
// uses; only a SHA-256 (an expected digest, or device read-back) sees it.
std::set<std::uint64_t> uninterpreted_header_bytes(const std::vector<std::byte>& file) {
  const auto offsets = testing::zip_offsets(file);
  std::set<std::uint64_t> out;
  const auto add = [&](std::uint64_t from, std::uint64_t to) {
    for (std::uint64_t i = from; i < to; ++i) out.insert(i);
  };
  for (const std::size_t local : offsets.local_headers) {
    add(local + 4, local + 6);
    add(local + 10, local + 14);
  }
  for (const std::size_t central : offsets.central_entries) {
    add(central + 4, central + 8);
    add(central + 12, central + 16);
    add(central + 36, central + 42);
  }
  if (offsets.zip64_end_record) add(*offsets.zip64_end_record + 12, *offsets.zip64_end_record + 16);
  return out;
}

// The restricted reader, on every single-byte flip of a small checkpoint:
// refused, or (only in an uninterpreted header byte) read as exactly the
// original. This is all the cached read-back can see (it does not re-hash).
TEST(EveryByteFlip, IsRefusedByTheParserOrLiesInAnUninterpretedHeaderByte) {
  const Value root = checkpoint_value(256);
  const auto file = file_of(root);
  const auto uninterpreted = uninterpreted_header_bytes(file);
  std::vector<std::uint64_t> accepted;
  std::map<ErrorCode, int> codes;
  for (std::uint64_t offset = 0; offset < file.size(); ++offset) {
    auto flipped = std::make_shared<std::vector<std::byte>>(file);
    (*flipped)[offset] ^= std::byte{0xFF};
    try {
      const LoadedMapping mapping = parse_checkpoint_bytes(*flipped, flipped);
      accepted.push_back(offset);
      EXPECT_TRUE(uninterpreted.contains(offset)) << "a flip at " << offset << " was accepted";
      EXPECT_EQ(describe_difference(mapping.root, root), "") << "a flip at " << offset << " changed the content";
    } catch (const Error& error) {
      ++codes[error.code()];
    }
  }
  std::string summary;
  for (const auto& [code, count] : codes) {
    summary += std::string(error_code_name(code)) + "=" + std::to_string(count) + " ";
  }
  std::cout << "[ flips    ] " << file.size() << " bytes; refused: " << summary << "; accepted "
            << accepted.size() << " (uninterpreted header bytes: " << uninterpreted.size() << ")\n";
  EXPECT_GT(codes[ErrorCode::zip_crc_mismatch], 0);
}

// The cached read-back over the same sweep, through publish itself; device
// mode refuses every flip.
TEST(EveryByteFlip, CachedAndDeviceReadBackRefuseEveryFlip) {
  TempDir dir;
  const Value root = checkpoint_value(256);
  const auto file = file_of(root);
  const auto uninterpreted = uninterpreted_header_bytes(file);
  auto tamper = std::make_shared<Tamper>();
  TamperingDirectory directory(io::posix_file_system().open_directory(dir.path(), false), tamper);
  tamper->on_map = true;
  tamper->on_read = true;
  // Every uninterpreted byte and every 16th other one (the parser sweep
  // above covers each byte; a publish costs a few milliseconds).
  std::vector<std::uint64_t> published_with_flip;
  std::size_t tried = 0;
  int device_runs = 0;
  for (std::uint64_t offset = 0; offset < file.size(); ++offset) {
    if (!uninterpreted.contains(offset) && offset % 16 != 0) continue;
    ++tried;
    for (const auto mode : {holdpoint::ReadBack::cached, holdpoint::ReadBack::device}) {
      // Device mode fsyncs: only the first byte of each run of uninterpreted
      // bytes in the first records' headers, and a few others (each costs an fsync).
      const bool run_start = uninterpreted.contains(offset) && !uninterpreted.contains(offset - 1);
      if (mode == holdpoint::ReadBack::device && !(run_start && device_runs < 6) && offset % 512 != 0) continue;
      if (mode == holdpoint::ReadBack::device && run_start) ++device_runs;
      tamper->offset = [offset](const std::vector<std::byte>&) { return std::optional<std::uint64_t>(offset); };
      tamper->flipped.clear();
      bool published = true;
      try {
        io::publish(directory, "ckpt.pt",
                    {.durable = false, .read_back = mode, .verifier_checks_content = true},
                    [&](io::ByteSink& sink) { sink.write(file); }, kParseVerifier);
      } catch (const Error& error) {
        published = false;
        if (mode == holdpoint::ReadBack::device) {
          EXPECT_EQ(error.code(), ErrorCode::sha256_mismatch) << offset;
        } else if (uninterpreted.contains(offset)) {
          // Only the whole file's CRC-32 sees these.
          EXPECT_EQ(error.code(), ErrorCode::file_changed_during_read) << offset;
        }
      }
      ASSERT_EQ(tamper->flipped.size(), 1u);
      if (published) {
        ADD_FAILURE() << (mode == holdpoint::ReadBack::cached ? "cached" : "device")
                      << " read-back published a flip at " << offset;
        published_with_flip.push_back(offset);
        std::filesystem::remove(dir / "ckpt.pt");
      }
      EXPECT_TRUE(staging_files(dir.path()).empty());
    }
  }
  EXPECT_TRUE(published_with_flip.empty());
  EXPECT_GT(tried, file.size() / 16);
}

}  // namespace
}  // namespace holdpoint
