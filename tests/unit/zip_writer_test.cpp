// ZipWriter: byte fidelity with torch 1.13's PyTorchStreamWriter, streaming,
// zip64, and the misuse contract.
#include "format/zip/zip_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>

#include "format/zip/zip_reader.h"
#include "holdpoint/base/sha256.h"
#include "base/crc32.h"
#include "support/test_support.h"
#include "support/zip_builder.h"

namespace holdpoint::format {
namespace {

using testing::bytes_of;
using testing::get_le;
using testing::TempDir;

std::vector<std::byte> pattern_bytes(std::size_t size, unsigned seed) {
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed * 17 + 7) & 0xFF);
  return bytes;
}

// Compares what a writer emits against expected bytes as they arrive, so
// that multi-gigabyte archives need no second copy.
class ComparingSink final : public io::ByteSink {
 public:
  explicit ComparingSink(std::span<const std::byte> expected) : expected_(expected) {}
  void write(std::span<const std::byte> bytes) override {
    if (!first_mismatch_) {
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        if (position_ + i >= expected_.size() || bytes[i] != expected_[position_ + i]) {
          first_mismatch_ = position_ + i;
          break;
        }
      }
    }
    position_ += bytes.size();
  }
  std::uint64_t position() const override { return position_; }
  std::optional<std::uint64_t> first_mismatch() const { return first_mismatch_; }

 private:
  std::span<const std::byte> expected_;
  std::uint64_t position_ = 0;
  std::optional<std::uint64_t> first_mismatch_;
};

// Keeps every byte except payload writes from one known buffer, which it
// only counts: the headers of a multi-gigabyte archive, without the payload.
class HeaderOnlySink final : public io::ByteSink {
 public:
  explicit HeaderOnlySink(const std::byte* payload_buffer) : payload_buffer_(payload_buffer) {}
  void write(std::span<const std::byte> bytes) override {
    if (bytes.data() != payload_buffer_) kept_.push_back({position_, {bytes.begin(), bytes.end()}});
    position_ += bytes.size();
  }
  std::uint64_t position() const override { return position_; }
  // The kept write that starts at `offset`.
  const std::vector<std::byte>& at(std::uint64_t offset) const {
    for (const auto& [start, bytes] : kept_) {
      if (start == offset) return bytes;
    }
    throw std::runtime_error("no header write at offset " + std::to_string(offset));
  }
  // The kept write `k` places before the last one.
  const std::vector<std::byte>& from_end(std::size_t k) const { return kept_.at(kept_.size() - 1 - k).second; }

 private:
  const std::byte* payload_buffer_;
  std::vector<std::pair<std::uint64_t, std::vector<std::byte>>> kept_;
  std::uint64_t position_ = 0;
};

class FailingSink final : public io::ByteSink {
 public:
  explicit FailingSink(std::size_t writes_before_failure) : remaining_(writes_before_failure) {}
  void write(std::span<const std::byte> bytes) override {
    if (remaining_ == 0) throw Error(ErrorCode::io_write_failed, "injected failure");
    --remaining_;
    position_ += bytes.size();
  }
  std::uint64_t position() const override { return position_; }

 private:
  std::size_t remaining_;
  std::uint64_t position_ = 0;
};

// Records how each write arrived.
class RecordingSink final : public io::ByteSink {
 public:
  struct Call {
    const std::byte* data;
    std::size_t size;
    bool stable;
  };
  void write(std::span<const std::byte> bytes) override { calls.push_back({bytes.data(), bytes.size(), false}); }
  void write_stable(std::span<const std::byte> bytes) override {
    calls.push_back({bytes.data(), bytes.size(), true});
  }
  std::uint64_t position() const override {
    std::uint64_t total = 0;
    for (const Call& call : calls) total += call.size;
    return total;
  }
  std::vector<Call> calls;
};

// A file written with plain POSIX calls, for archives too big for memory.
class FileSink final : public io::ByteSink {
 public:
  explicit FileSink(const std::filesystem::path& path) : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600)) {
    if (fd_ < 0) throw Error(ErrorCode::io_open_failed, "cannot create " + path.string());
  }
  ~FileSink() override { ::close(fd_); }
  void write(std::span<const std::byte> bytes) override {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) throw Error(ErrorCode::io_write_failed, "write failed");
      done += static_cast<std::size_t>(n);
    }
    position_ += bytes.size();
  }
  std::uint64_t position() const override { return position_; }

 private:
  int fd_;
  std::uint64_t position_ = 0;
};

// A read-only mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("cannot open " + path.string());
    struct stat info {};
    ::fstat(fd, &info);
    size_ = static_cast<std::size_t>(info.st_size);
    data_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (data_ == MAP_FAILED) throw std::runtime_error("cannot map " + path.string());
  }
  ~MappedFile() { ::munmap(data_, size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

bool large_tests_enabled() {
  const char* value = std::getenv("HOLDPOINT_LARGE_TESTS");
  return value != nullptr && std::string_view(value) == "1";
}

// Runs `script` with the oracle Python (torch 2.13); sys.argv[1] is `output`.
void run_torch_script(const TempDir& dir, const std::string& script, const std::filesystem::path& output) {
  const auto script_path = dir / "make_fixture.py";
  std::ofstream(script_path) << "import sys, collections, torch\n" << script << "\n";
  const auto run = testing::run_python(testing::oracle_python(), script_path, output.string());
  ASSERT_EQ(run.status, 0) << run.output;
}

// Reads an archive and writes its records again, in order, under the same
// archive name; the result must be the original, byte for byte.
void expect_reemitted_identically(std::span<const std::byte> original) {
  const ZipArchive archive = read_zip_directory(original, Limits{});
  verify_zip_crcs(archive, original, Limits{});
  ComparingSink sink(original);
  ZipWriter writer(sink, archive.archive_name);
  for (const ZipEntry& entry : archive.entries) {
    const auto payload = zip_entry_bytes(original, entry);
    writer.begin_record(entry.record(), payload.size());
    // Slices of at most 1 GiB, so a 4 GiB record crosses several writes.
    for (std::size_t done = 0; done < payload.size();) {
      const std::size_t slice = std::min<std::size_t>(payload.size() - done, std::size_t{1} << 30);
      writer.write_stable(payload.subspan(done, slice));
      done += slice;
    }
    writer.end_record();
  }
  writer.finish();
  EXPECT_EQ(sink.first_mismatch(), std::nullopt) << "first differing byte";
  EXPECT_EQ(sink.position(), original.size());
}

void expect_torch_file_reemitted_identically(const std::string& fixture_name, const std::string& script) {
  TempDir dir;
  const auto path = dir / (fixture_name + ".pt");
  run_torch_script(dir, script, path);
  const auto bytes = testing::read_file_bytes(path);
  // torch names the archive folder after the file.
  EXPECT_EQ(read_zip_directory(bytes, Limits{}).archive_name, fixture_name);
  expect_reemitted_identically(bytes);
}

// ---- byte fidelity -----------------------------------------------------------

// golden_min.pt (docs/format.md): OrderedDict(w=tensor([1., 2.])) with a
// byteorder record, as the project's reference writer emits it; torch 1.13
// loads it.
TEST(ZipWriterFidelity, ReproducesGoldenMinByteForByte) {
  std::string pickle = "\x80\x02" "ccollections\nOrderedDict\n)R";
  pickle += std::string("X\x01\x00\x00\x00w", 6);
  pickle += "ctorch._utils\n_rebuild_tensor_v2\n((";
  pickle += std::string("X\x07\x00\x00\x00storage", 12) + "ctorch\nFloatStorage\n";
  pickle += std::string("X\x01\x00\x00\x00" "0", 6) + std::string("X\x03\x00\x00\x00" "cpu", 8) + "K\x02tQ";
  pickle += std::string("K\x00K\x02\x85K\x01\x85\x89", 9);
  pickle += "ccollections\nOrderedDict\n)RtRs.";
  ASSERT_EQ(pickle.size(), 160u);
  const float values[] = {1.0f, 2.0f};
  std::vector<std::byte> storage(sizeof values);
  std::memcpy(storage.data(), values, sizeof values);

  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.add_record("data.pkl", bytes_of(pickle));
  writer.add_record("byteorder", bytes_of("little"));
  writer.add_record("data/0", storage);
  writer.add_record("version", bytes_of("3\n"));
  writer.finish();

  const auto& bytes = sink.bytes();
  ASSERT_EQ(bytes.size(), 938u);
  EXPECT_EQ(Sha256::of(bytes).hex(), "0d7db2926c3e352a1a0edde3257d2064f0196b4065134ec3abd0cc35add67a1a");
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  const std::uint64_t expected_headers[] = {0, 240, 342, 472};
  const std::uint64_t expected_data[] = {64, 320, 448, 576};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(archive.entries[i].local_header_offset, expected_headers[i]);
    EXPECT_EQ(archive.entries[i].data_offset, expected_data[i]);
  }
  EXPECT_EQ(archive.central_directory_offset, 594u);
  EXPECT_EQ(archive.central_directory_size, 246u);
  EXPECT_EQ(get_le(bytes, 840, 4), 0x06064b50u);
  EXPECT_EQ(get_le(bytes, 896, 4), 0x07064b50u);
  EXPECT_EQ(get_le(bytes, 916, 4), 0x06054b50u);
}

TEST(ZipWriterFidelity, EmptyRecordHasUtf8FlagOnlyAndNoDescriptor) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.add_record("data/0", {});
  writer.add_record("version", bytes_of("3\n"));
  writer.finish();
  const auto& bytes = sink.bytes();
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  const ZipEntry& empty = archive.entries[0];
  EXPECT_EQ(get_le(bytes, 6, 2), 0x0800u);
  EXPECT_EQ(empty.flags, 0x0800);
  EXPECT_EQ(empty.crc32, 0u);
  EXPECT_EQ(empty.end_offset, empty.data_offset) << "no data descriptor after an empty payload";
  EXPECT_EQ(archive.entries[1].local_header_offset, empty.data_offset);
  EXPECT_EQ(archive.entries[1].flags, 0x0808);
}

TEST(ZipWriterFidelity, EveryPayloadStartsOn64ByteBoundary) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  for (std::size_t length = 1; length <= 130; ++length) {
    const std::string record = std::to_string(length) + "_" + std::string(length, 'n');
    writer.add_record(record, pattern_bytes(length % 7, static_cast<unsigned>(length)));
  }
  writer.finish();
  const ZipArchive archive = read_zip_directory(sink.bytes(), Limits{});
  verify_zip_crcs(archive, sink.bytes(), Limits{});
  for (const ZipEntry& entry : archive.entries) EXPECT_EQ(entry.data_offset % 64, 0u) << entry.name;
}

TEST(ZipWriterFidelity, EndRecordCountsSaturateAbove65535Records) {
  constexpr std::size_t kRecords = 65'540;
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  for (std::size_t i = 0; i < kRecords; ++i) writer.add_record("data/" + std::to_string(i), pattern_bytes(1, i));
  writer.finish();
  const auto& bytes = sink.bytes();
  const std::size_t end = bytes.size() - 22;
  EXPECT_EQ(get_le(bytes, end + 8, 2), 0xFFFFu);
  EXPECT_EQ(get_le(bytes, end + 10, 2), 0xFFFFu);
  const std::size_t zip64_end = get_le(bytes, bytes.size() - 42 + 8, 8);
  EXPECT_EQ(get_le(bytes, zip64_end + 24, 8), kRecords);
  EXPECT_EQ(get_le(bytes, zip64_end + 32, 8), kRecords);
  const ZipArchive archive = read_zip_directory(bytes, Limits{});
  EXPECT_EQ(archive.entries.size(), kRecords);
}

// A record of 4 GiB + 100 bytes through a sink that keeps only the headers:
// checks miniz's zip64 blocks without writing 4 GiB anywhere.
TEST(ZipWriterFidelity, RecordOver4GiBGetsMinizZip64Blocks) {
  constexpr std::uint64_t kBig = 0x100000064;  // 4,294,967,396 bytes
  const std::vector<std::byte> chunk(std::size_t{1} << 24, std::byte{0x5A});
  HeaderOnlySink sink(chunk.data());
  ZipWriter writer(sink, "archive");
  writer.begin_record("data/0", kBig);
  std::uint32_t crc = 0;
  for (std::uint64_t done = 0; done < kBig;) {
    const std::size_t slice = static_cast<std::size_t>(std::min<std::uint64_t>(kBig - done, chunk.size()));
    writer.write({chunk.data(), slice});
    crc = io::crc32_update(crc, chunk.data(), slice);
    done += slice;
  }
  writer.end_record();
  const std::uint64_t second_offset = sink.position();
  writer.add_record("data/1", bytes_of("after"));
  const std::uint64_t third_offset = sink.position();
  writer.add_record("version", {});
  writer.finish();

  // Local header 0: zip64 block = size, then a zero compressed size.
  const auto& first = sink.at(0);
  const std::size_t zip64_at = 30 + std::string("archive/data/0").size();
  EXPECT_EQ(get_le(first, 28, 2), 4u + 16 + 4 + get_le(first, zip64_at + 22, 2));
  EXPECT_EQ(get_le(first, zip64_at, 2), 1u);
  EXPECT_EQ(get_le(first, zip64_at + 2, 2), 16u);
  EXPECT_EQ(get_le(first, zip64_at + 4, 8), kBig);
  EXPECT_EQ(get_le(first, zip64_at + 12, 8), 0u);
  EXPECT_EQ(get_le(first, zip64_at + 20, 2), 0x4246u);
  EXPECT_EQ(first.size() % 64, 0u);
  // 24-byte descriptor with 64-bit sizes.
  const auto& descriptor = sink.at(first.size() + kBig);
  ASSERT_EQ(descriptor.size(), 24u);
  EXPECT_EQ(get_le(descriptor, 4, 4), crc);
  EXPECT_EQ(get_le(descriptor, 8, 8), kBig);
  EXPECT_EQ(get_le(descriptor, 16, 8), kBig);
  // Later local headers carry only their offset.
  const auto& second = sink.at(second_offset);
  const std::size_t second_zip64_at = 30 + std::string("archive/data/1").size();
  EXPECT_EQ(get_le(second, second_zip64_at + 2, 2), 8u);
  EXPECT_EQ(get_le(second, second_zip64_at + 4, 8), second_offset);
  EXPECT_EQ(get_le(sink.at(second_offset + second.size() + 5), 0, 4), 0x08074b50u);
  EXPECT_EQ(sink.at(second_offset + second.size() + 5).size(), 24u) << "zip64 local header => 64-bit descriptor";
  const auto& third = sink.at(third_offset);
  EXPECT_EQ(get_le(third, 6, 2), 0x0800u);

  // finish() writes the (small) central directory, then the three end records.
  const auto& ends = sink.from_end(0);
  ASSERT_EQ(ends.size(), 56u + 20 + 22);
  EXPECT_EQ(get_le(ends, 76 + 16, 4), 0xFFFFFFFFu) << "end record's directory offset saturates";
  EXPECT_EQ(get_le(ends, 48, 8), sink.position() - ends.size() - sink.from_end(1).size());
  const auto& directory = sink.from_end(1);
  const std::size_t name_size = std::string("archive/data/0").size();
  EXPECT_EQ(get_le(directory, 20, 4), 0xFFFFFFFFu);
  EXPECT_EQ(get_le(directory, 24, 4), 0xFFFFFFFFu);
  EXPECT_EQ(get_le(directory, 42, 4), 0u);
  EXPECT_EQ(get_le(directory, 30, 2), 20u);
  const std::size_t extra0 = 46 + name_size;
  EXPECT_EQ(get_le(directory, extra0, 2), 1u);
  EXPECT_EQ(get_le(directory, extra0 + 2, 2), 16u);
  EXPECT_EQ(get_le(directory, extra0 + 4, 8), kBig);
  EXPECT_EQ(get_le(directory, extra0 + 12, 8), kBig);
  const std::size_t central1 = extra0 + 20;
  EXPECT_EQ(get_le(directory, central1 + 20, 4), 5u);
  EXPECT_EQ(get_le(directory, central1 + 42, 4), 0xFFFFFFFFu);
  EXPECT_EQ(get_le(directory, central1 + 30, 2), 12u);
  EXPECT_EQ(get_le(directory, central1 + 46 + name_size + 2, 2), 8u);
  EXPECT_EQ(get_le(directory, central1 + 46 + name_size + 4, 8), second_offset);
}

// ---- differential tests against torch 1.13 -------------------------------------

TEST(ZipWriterTorchDifferential, SmallDict) {
  expect_torch_file_reemitted_identically("small_dict", R"(
torch.save({'weight': torch.arange(6, dtype=torch.float32).reshape(2, 3),
            'bias': torch.ones(3, dtype=torch.int64), 'step': 7}, sys.argv[1]))");
}

TEST(ZipWriterTorchDifferential, EmptyTensorGivesZeroByteRecord) {
  expect_torch_file_reemitted_identically("empty_tensor", R"(
torch.save(collections.OrderedDict(empty=torch.zeros(0), after=torch.ones(2)), sys.argv[1]))");
}

TEST(ZipWriterTorchDifferential, MoreThanTenStoragesInLexicographicOrder) {
  expect_torch_file_reemitted_identically("twelve", R"(
torch.save({f't{i}': torch.full((i + 1,), float(i)) for i in range(12)}, sys.argv[1]))");
}

TEST(ZipWriterTorchDifferential, MoreThan65535Records) {
  expect_torch_file_reemitted_identically("many", R"(
torch.save({str(i): torch.zeros(1, dtype=torch.uint8) for i in range(65540)}, sys.argv[1]))");
}

// ---- streaming -----------------------------------------------------------------

TEST(ZipWriterStreaming, StablePayloadReachesSinkUncopied) {
  const auto payload = pattern_bytes(1000, 3);
  RecordingSink sink;
  ZipWriter writer(sink, "archive");
  writer.begin_record("data/0", payload.size());
  writer.write_stable({payload.data(), 600});
  writer.write({payload.data() + 600, 400});
  ASSERT_EQ(sink.calls.size(), 3u) << "header, then each payload slice as it came";
  EXPECT_EQ(sink.calls[1].data, payload.data());
  EXPECT_EQ(sink.calls[1].size, 600u);
  EXPECT_TRUE(sink.calls[1].stable);
  EXPECT_EQ(sink.calls[2].data, payload.data() + 600);
  EXPECT_FALSE(sink.calls[2].stable);
  writer.end_record();
  writer.finish();
}

TEST(ZipWriterStreaming, DestructorWritesNothing) {
  RecordingSink sink;
  {
    ZipWriter writer(sink, "archive");
    writer.begin_record("data/0", 10);
    writer.write(bytes_of("12345"));
  }
  EXPECT_EQ(sink.calls.size(), 2u);
}

// ---- misuse ----------------------------------------------------------------------

TEST(ZipWriterMisuse, MorePayloadThanDeclaredIsRejected) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.begin_record("data/0", 4);
  EXPECT_ERROR_CODE(writer.write(bytes_of("12345")), ErrorCode::invalid_argument);
  writer.write(bytes_of("1234"));  // still usable: nothing was written
  writer.end_record();
  writer.finish();
  EXPECT_NO_THROW(read_zip_directory(sink.bytes(), Limits{}));
}

TEST(ZipWriterMisuse, EndingRecordEarlyIsRejected) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.begin_record("data/0", 4);
  writer.write(bytes_of("12"));
  EXPECT_ERROR_CODE(writer.end_record(), ErrorCode::write_state_invalid);
}

TEST(ZipWriterMisuse, CallsOutOfOrderAreRejected) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  EXPECT_ERROR_CODE(writer.write(bytes_of("x")), ErrorCode::write_state_invalid);
  EXPECT_ERROR_CODE(writer.end_record(), ErrorCode::write_state_invalid);
  EXPECT_ERROR_CODE(writer.finish(), ErrorCode::write_state_invalid);  // no records
  writer.begin_record("data/0", 1);
  EXPECT_ERROR_CODE(writer.begin_record("data/1", 1), ErrorCode::write_state_invalid);
  EXPECT_ERROR_CODE(writer.finish(), ErrorCode::write_state_invalid);
  writer.write(bytes_of("x"));
  writer.end_record();
  writer.finish();
  EXPECT_ERROR_CODE(writer.add_record("data/1", bytes_of("y")), ErrorCode::write_state_invalid);
  EXPECT_ERROR_CODE(writer.finish(), ErrorCode::write_state_invalid);
}

TEST(ZipWriterMisuse, UseAfterAbandonIsRejected) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.add_record("data/0", bytes_of("x"));
  writer.abandon();
  const auto written = sink.bytes().size();
  EXPECT_ERROR_CODE(writer.add_record("data/1", bytes_of("y")), ErrorCode::write_state_invalid);
  EXPECT_ERROR_CODE(writer.finish(), ErrorCode::write_state_invalid);
  EXPECT_EQ(sink.bytes().size(), written);
}

TEST(ZipWriterMisuse, DuplicateNamesAreRejectedInAnyCase) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  writer.add_record("data/0", bytes_of("x"));
  EXPECT_ERROR_CODE(writer.add_record("data/0", bytes_of("y")), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(writer.add_record("DATA/0", bytes_of("y")), ErrorCode::invalid_argument);
  writer.add_record("data/1", bytes_of("y"));
  writer.finish();
  EXPECT_EQ(read_zip_directory(sink.bytes(), Limits{}).entries.size(), 2u);
}

TEST(ZipWriterMisuse, EveryEarlierNameIsStillFoundAfterTheIndexGrew) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  for (int i = 0; i < 3000; ++i) writer.add_record("data/K" + std::to_string(i), bytes_of("x"));
  for (int i = 0; i < 3000; i += 7) {
    EXPECT_ERROR_CODE(writer.add_record("DATA/k" + std::to_string(i), bytes_of("y")), ErrorCode::invalid_argument);
  }
  writer.add_record("data/K3000", bytes_of("z"));
  writer.finish();
  EXPECT_EQ(read_zip_directory(sink.bytes(), Limits{}).entries.size(), 3001u);
}

TEST(ZipWriterMisuse, EmptyAndOverlongNamesAreRejected) {
  io::MemorySink sink;
  ZipWriter writer(sink, "archive");
  EXPECT_ERROR_CODE(writer.begin_record("", 0), ErrorCode::invalid_argument);
  const std::string longest(511 - std::string("archive/").size(), 'r');
  EXPECT_ERROR_CODE(writer.begin_record(longest + "r", 0), ErrorCode::invalid_argument);
  writer.add_record(longest, bytes_of("x"));
  writer.finish();
  EXPECT_EQ(read_zip_directory(sink.bytes(), Limits{}).entries[0].name.size(), 511u);
  EXPECT_ERROR_CODE(ZipWriter(sink, ""), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(ZipWriter(sink, "a/b"), ErrorCode::invalid_argument);
}

// The writer applies the reader's naming rules, so it can never produce an
// archive that holdpoint itself would reject.
TEST(ZipWriterMisuse, NamesTheReaderWouldRejectAreRefused) {
  for (std::string_view record : {"../version", "data/./0", "data//0", "a\\b", "tab\there", "bad\xff", "x/"}) {
    io::MemorySink sink;
    ZipWriter writer(sink, "archive");
    SCOPED_TRACE(std::string(record));
    EXPECT_ERROR_CODE(writer.begin_record(record, 0), ErrorCode::invalid_argument);
  }
  io::MemorySink sink;
  EXPECT_ERROR_CODE(ZipWriter(sink, ".."), ErrorCode::invalid_argument);
  ZipWriter writer(sink, "archive");
  writer.add_record("data/\xc3\xa9t\xc3\xa9", bytes_of("ok"));
  writer.finish();
  EXPECT_EQ(read_zip_directory(sink.bytes(), Limits{}).entries[0].record(), "data/\xc3\xa9t\xc3\xa9");
}

TEST(ZipWriterMisuse, SinkFailureAbandonsTheWriter) {
  FailingSink sink(2);  // local header and one payload write succeed
  ZipWriter writer(sink, "archive");
  writer.begin_record("data/0", 2);
  writer.write(bytes_of("a"));
  EXPECT_ERROR_CODE(writer.write(bytes_of("b")), ErrorCode::io_write_failed);
  EXPECT_ERROR_CODE(writer.end_record(), ErrorCode::write_state_invalid);
  EXPECT_ERROR_CODE(writer.finish(), ErrorCode::write_state_invalid);
}

// ---- beyond 4 GiB (opt-in: HOLDPOINT_LARGE_TESTS=1) --------------------------------

class ZipWriterLarge : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!large_tests_enabled()) GTEST_SKIP() << "set HOLDPOINT_LARGE_TESTS=1 to write 4 GiB files";
    if (std::filesystem::space(dir_.path()).available < (std::uint64_t{10} << 30)) {
      GTEST_SKIP() << "needs 10 GB free under " << dir_.path();
    }
  }
  TempDir dir_;
};

TEST_F(ZipWriterLarge, RecordOver4GiBRoundTripsThroughAFile) {
  constexpr std::uint64_t kBig = 0x100000064;
  const auto path = dir_ / "big.zip";
  const auto chunk = pattern_bytes(std::size_t{1} << 24, 9);
  std::uint32_t crc = 0;
  {
    FileSink sink(path);
    ZipWriter writer(sink, "archive");
    writer.add_record("data.pkl", bytes_of("pickle"));
    writer.begin_record("data/0", kBig);
    for (std::uint64_t done = 0; done < kBig;) {
      const std::size_t slice = static_cast<std::size_t>(std::min<std::uint64_t>(kBig - done, chunk.size()));
      writer.write_stable({chunk.data(), slice});
      crc = io::crc32_update(crc, chunk.data(), slice);
      done += slice;
    }
    writer.end_record();
    writer.add_record("data/1", bytes_of("after"));
    writer.add_record("version", bytes_of("3\n"));
    writer.finish();
  }
  const MappedFile file(path);
  const ZipArchive archive = read_zip_directory(file.bytes(), Limits{});
  verify_zip_crcs(archive, file.bytes(), Limits{});
  ASSERT_EQ(archive.entries.size(), 4u);
  const ZipEntry& big = *archive.find("data/0");
  EXPECT_EQ(big.size, kBig);
  EXPECT_EQ(big.crc32, crc);
  EXPECT_EQ(big.end_offset - big.data_offset - kBig, 24u);
  const ZipEntry& after = *archive.find("data/1");
  EXPECT_GT(after.local_header_offset, 0xFFFFFFFFu);
  const auto tail = zip_entry_bytes(file.bytes(), after);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(tail.data()), tail.size()), "after");
  EXPECT_GT(archive.central_directory_offset, 0xFFFFFFFFu);
}

TEST_F(ZipWriterLarge, TorchRecordOver4GiBIsReproduced) {
  const auto path = dir_ / "big_torch.pt";
  run_torch_script(dir_, R"(
big = torch.full((4294967396,), 7, dtype=torch.uint8)
torch.save({'big': big, 'after': torch.ones(3)}, sys.argv[1]))", path);
  const MappedFile file(path);
  expect_reemitted_identically(file.bytes());
}

}  // namespace
}  // namespace holdpoint::format
