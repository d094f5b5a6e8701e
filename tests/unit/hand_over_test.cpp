// hand_over_storages and Storage page release (holdpoint/format/value.h), the
// snapshot a load reports (LoadedMapping::snapshot) and the pages of it a load
// gives back once spent (ParseContext::release_spent_bytes), without LibTorch.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "holdpoint/base/snapshot.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

const std::size_t kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

// A buffer of four pages filled with 0xAB and a tensor over pages 1 and 2
// plus a few bytes on each side.
struct Fixture {
  Fixture() : buffer(io::Buffer::allocate(4 * kPage)) {
    std::memset(buffer->data(), 0xAB, buffer->size());
    auto storage = std::make_shared<const Storage>(buffer->data() + kPage - 8, 2 * kPage + 16, buffer);
    TensorData tensor;
    tensor.dtype = DType::uint8;
    tensor.sizes = {static_cast<std::int64_t>(storage->nbytes())};
    tensor.strides = {1};
    tensor.storage = std::move(storage);
    Dict root;
    root.insert("t", Value::tensor(std::move(tensor)));
    tree = Value::dict(std::move(root));
  }
  bool all(std::size_t from, std::size_t to, std::byte value) const {
    return std::all_of(buffer->data() + from, buffer->data() + to, [value](std::byte b) { return b == value; });
  }
  std::shared_ptr<io::Buffer> buffer;
  Value tree;
};

TEST(HandOver, AHandedOverStorageReleasesItsWholePagesWhenItDies) {
  Fixture f;
  hand_over_storages(f.tree, f.buffer);
  EXPECT_TRUE(f.tree.as_dict().at("t").as_tensor().storage->handed_over());
  f.tree = Value();
  EXPECT_TRUE(f.all(kPage, 3 * kPage, std::byte{0})) << "the whole pages were not released";
  // Bytes of the storage outside whole pages, and the other pages, are kept.
  EXPECT_TRUE(f.all(0, kPage, std::byte{0xAB}));
  EXPECT_TRUE(f.all(3 * kPage, 4 * kPage, std::byte{0xAB}));
}

TEST(HandOver, AStorageNotHandedOverKeepsItsBytes) {
  Fixture f;
  f.tree = Value();
  EXPECT_TRUE(f.all(0, 4 * kPage, std::byte{0xAB}));
}

TEST(HandOver, AStorageOfAnotherOwnerIsNotHandedOver) {
  Fixture f;
  const auto other = io::Buffer::allocate(kPage);
  hand_over_storages(f.tree, other);
  EXPECT_FALSE(f.tree.as_dict().at("t").as_tensor().storage->handed_over());
  hand_over_storages(f.tree, nullptr);
  EXPECT_FALSE(f.tree.as_dict().at("t").as_tensor().storage->handed_over());
  f.tree = Value();
  EXPECT_TRUE(f.all(0, 4 * kPage, std::byte{0xAB}));
}

TEST(HandOver, AHolderKeepsTheBytesUntilItLetsGo) {
  Fixture f;
  hand_over_storages(f.tree, f.buffer);
  Value held = f.tree.as_dict().at("t");
  f.tree = Value();
  EXPECT_TRUE(f.all(0, 4 * kPage, std::byte{0xAB})) << "released while a Value still held the storage";
  held = Value();
  EXPECT_TRUE(f.all(kPage, 3 * kPage, std::byte{0}));
}

TEST(HandOver, ALoadReportsItsPrivateSnapshot) {
  TempDir dir;
  Dict root;
  root.insert("w", Value::tensor(TensorData::from_bytes(DType::uint8, {4096}, std::vector<std::byte>(4096))));
  save_mapping(dir / "m.pt", Value::dict(std::move(root)));
  const LoadedMapping loaded = load_checkpoint_mapping(dir / "m.pt");
  ASSERT_NE(loaded.snapshot, nullptr);
  const Storage& storage = *loaded.root.as_dict().at("w").as_tensor().storage;
  EXPECT_FALSE(storage.owner().owner_before(loaded.snapshot) || loaded.snapshot.owner_before(storage.owner()));
  EXPECT_FALSE(storage.handed_over()) << "a plain load must not hand anything over";
}

// ---- pages a load gives back ------------------------------------------------------------

// `count` tensors of 16 float32 each (distinct, non-zero values), so that the
// pickle and the central directory span many whole pages.
Value many_small_tensors(bool with_manifest = false, int count = 3000) {
  Dict root;
  if (with_manifest) {  // what a run directory's default verifier asks of a generation
    Manifest manifest;
    manifest.semantic_identity = "spent-pages-test";
    root.insert(std::string(kManifestKey), manifest.to_value());
  }
  for (int i = 0; i < count; ++i) {
    std::vector<float> values(16);
    for (int k = 0; k < 16; ++k) values[static_cast<std::size_t>(k)] = static_cast<float>(i * 16 + k + 1);
    const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
    root.insert("layer" + std::to_string(i) + ".weight",
                Value::tensor(TensorData::from_bytes(DType::float32, {16}, {bytes, bytes + 64})));
  }
  return Value::dict(std::move(root));
}

std::vector<std::byte> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// The central directory's offset, from the end of central directory record
// (the file has no comment and no zip64 records: it is small).
std::size_t central_directory_offset(const std::vector<std::byte>& file) {
  const std::size_t end_record = file.size() - 22;
  std::uint32_t offset = 0;
  std::memcpy(&offset, file.data() + end_record + 16, 4);
  return offset;
}

// The whole pages of [from, to) in `buffer`, as (first, last) byte offsets.
std::pair<std::size_t, std::size_t> whole_pages(const io::Buffer& buffer, std::size_t from, std::size_t to) {
  const auto base = reinterpret_cast<std::uintptr_t>(buffer.data());
  const std::size_t first = ((base + from + kPage - 1) / kPage * kPage) - base;
  const std::size_t last = ((base + to) / kPage * kPage) - base;
  return {first, std::max(first, last)};
}

bool all_zero(const io::Buffer& buffer, std::size_t from, std::size_t to) {
  return std::all_of(buffer.data() + from, buffer.data() + to, [](std::byte b) { return b == std::byte{0}; });
}

void expect_tensors_intact(const Value& root) {
  ASSERT_GE(root.as_dict().size(), 3000u);
  for (int i = 0; i < 3000; i += 1) {
    const TensorData& t = root.as_dict().at("layer" + std::to_string(i) + ".weight").as_tensor();
    std::vector<float> values(16);
    t.copy_contiguous_bytes(reinterpret_cast<std::byte*>(values.data()));
    for (int k = 0; k < 16; ++k) {
      ASSERT_EQ(values[static_cast<std::size_t>(k)], static_cast<float>(i * 16 + k + 1)) << "tensor " << i;
    }
  }
}

void expect_spent_pages_released(const LoadedMapping& loaded, const std::vector<std::byte>& file) {
  ASSERT_NE(loaded.snapshot, nullptr);
  const auto& buffer = *std::static_pointer_cast<const io::Buffer>(loaded.snapshot);
  ASSERT_EQ(buffer.size(), file.size());
  const auto pickle = std::find_if(loaded.records.begin(), loaded.records.end(),
                                   [](const RecordInfo& r) { return r.name == "data.pkl"; });
  ASSERT_NE(pickle, loaded.records.end());
  const auto [pickle_first, pickle_last] = whole_pages(buffer, pickle->offset, pickle->offset + pickle->size);
  const auto [directory_first, directory_last] = whole_pages(buffer, central_directory_offset(file), file.size());
  ASSERT_GE(pickle_last - pickle_first, 8 * kPage) << "the fixture's pickle is too small to test";
  ASSERT_GE(directory_last - directory_first, 8 * kPage) << "the fixture's directory is too small to test";
  ASSERT_FALSE(std::all_of(file.begin() + static_cast<std::ptrdiff_t>(pickle_first),
                           file.begin() + static_cast<std::ptrdiff_t>(pickle_last),
                           [](std::byte b) { return b == std::byte{0}; }));
  EXPECT_TRUE(all_zero(buffer, pickle_first, pickle_last)) << "the pickle's whole pages were kept";
  EXPECT_TRUE(all_zero(buffer, directory_first, directory_last)) << "the central directory's whole pages were kept";
  // Everything else is the file, byte for byte: the tensors, the local
  // headers, and the pickle's and the directory's partial pages.
  EXPECT_TRUE(std::equal(buffer.data(), buffer.data() + pickle_first, file.data()));
  EXPECT_TRUE(std::equal(buffer.data() + pickle_last, buffer.data() + directory_first, file.data() + pickle_last));
  EXPECT_TRUE(std::equal(buffer.data() + directory_last, buffer.data() + file.size(), file.data() + directory_last));
  expect_tensors_intact(loaded.root);
}

TEST(SpentPages, ALoadGivesBackItsPickleAndCentralDirectoryAndKeepsEveryTensorByte) {
  TempDir dir;
  const SaveResult saved = save_mapping(dir / "m.pt", many_small_tensors());
  const std::vector<std::byte> file = file_bytes(dir / "m.pt");
  LoadOptions options;
  expect_spent_pages_released(load_checkpoint_mapping(dir / "m.pt", options), file);
  options.expected_sha256 = saved.sha256;  // the digest-checked path releases the same pages
  expect_spent_pages_released(load_checkpoint_mapping(dir / "m.pt", options), file);
}

TEST(SpentPages, ARunDirectoryLoadGivesThemBackToo) {
  TempDir dir;
  RunDirectory run(dir / "run");
  io::MemorySink sink;
  format::write_pt(sink, many_small_tensors(/*with_manifest=*/true));
  GenerationSpec spec;
  spec.step = 1;
  const GenerationInfo generation =
      run.commit(spec, [&](io::ByteSink& out) { out.write(sink.bytes()); }).generation;
  const std::vector<std::byte> file = file_bytes(run.file_path(generation));
  ASSERT_TRUE(std::equal(file.begin(), file.end(), sink.bytes().begin(), sink.bytes().end()));
  expect_spent_pages_released(run.load(generation), file);
}

TEST(SpentPages, AParseOfBytesTheCallerKeepsReleasesNothing) {
  // parse_checkpoint_bytes without release_spent_bytes (how export and
  // recovery parse a snapshot whose bytes they write or check afterwards)
  // leaves every byte in place.
  TempDir dir;
  save_mapping(dir / "m.pt", many_small_tensors());
  const std::vector<std::byte> file = file_bytes(dir / "m.pt");
  const io::Snapshot snapshot = io::read_snapshot(dir / "m.pt", Limits{}.max_file_bytes);
  const LoadedMapping parsed = parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, Limits{});
  expect_tensors_intact(parsed.root);
  EXPECT_TRUE(std::equal(file.begin(), file.end(), snapshot.buffer->data()));
}

// 40,000 tensors make a pickle of more than 2 MiB, which the pickle VM
// reports spent 256 KiB at a time while it runs (PickleOptions::on_spent).
constexpr int kLargePickleTensors = 40000;

TEST(SpentPages, APicklesPagesGoBackWhileItIsReadButNeverAheadOfTheHasher) {
  TempDir dir;
  save_mapping(dir / "m.pt", many_small_tensors(false, kLargePickleTensors));
  const std::vector<std::byte> file = file_bytes(dir / "m.pt");
  // Where the pickle's first whole page lies (buffers are page-aligned).
  const io::Snapshot plain = io::read_snapshot(dir / "m.pt", Limits{}.max_file_bytes);
  const LoadedMapping reference = parse_checkpoint_bytes(plain.buffer->bytes(), plain.buffer, Limits{});
  const auto pickle = std::find_if(reference.records.begin(), reference.records.end(),
                                   [](const RecordInfo& r) { return r.name == "data.pkl"; });
  ASSERT_NE(pickle, reference.records.end());
  ASSERT_GT(pickle->size, std::uint64_t{2} << 20);
  const std::size_t first_page = whole_pages(*plain.buffer, pickle->offset, pickle->offset + pickle->size).first;

  for (const bool hasher_passed : {true, false}) {
    SCOPED_TRACE(hasher_passed ? "the hasher is past the pickle" : "the hasher has not started");
    const io::Snapshot snapshot = io::read_snapshot(dir / "m.pt", Limits{}.max_file_bytes);
    const io::Buffer& buffer = *snapshot.buffer;
    std::vector<bool> first_page_given_back;  // at each question the load asks
    ParseContext context;
    context.release_spent_bytes = true;
    context.bytes_hashed = [&]() -> std::size_t {
      first_page_given_back.push_back(all_zero(buffer, first_page, first_page + kPage));
      return hasher_passed ? buffer.size() : 0;
    };
    LoadedMapping loaded = parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, Limits{}, context);
    loaded.snapshot = snapshot.buffer;  // what load_checkpoint_mapping reports
    ASSERT_GE(first_page_given_back.size(), 2u) << "one question per 256 KiB of pickle";
    EXPECT_FALSE(first_page_given_back[0]);
    if (hasher_passed) {
      EXPECT_TRUE(first_page_given_back[1]) << "given back at the first report, while the pickle VM still ran";
    } else {
      EXPECT_EQ(std::count(first_page_given_back.begin(), first_page_given_back.end(), true), 0)
          << "a page went back before the hasher had read it";
    }
    // Either way the load ends with the pickle's pages given back.
    expect_spent_pages_released(loaded, file);
    EXPECT_EQ(loaded.root.as_dict().size(), static_cast<std::size_t>(kLargePickleTensors));
    // The record list, made while the entry table's pages go back, is the
    // one a parse that keeps every byte makes.
    ASSERT_EQ(loaded.records.size(), reference.records.size());
    for (std::size_t i = 0; i < loaded.records.size(); ++i) {
      const RecordInfo& got = loaded.records[i];
      const RecordInfo& want = reference.records[i];
      ASSERT_TRUE(got.name == want.name && got.offset == want.offset && got.size == want.size &&
                  got.crc32 == want.crc32)
          << "record " << i << ": " << got.name << " vs " << want.name;
    }
  }
  // The same through load_checkpoint_mapping, whose hasher runs on its own
  // thread for a file this size.
  const LoadedMapping loaded = load_checkpoint_mapping(dir / "m.pt");
  expect_spent_pages_released(loaded, file);
  EXPECT_EQ(loaded.root.as_dict().size(), static_cast<std::size_t>(kLargePickleTensors));
}

TEST(SpentPages, APickleGivenBackEarlyIsStillCheckedAgainstItsCrc) {
  // A key renamed inside the pickle still parses; only its CRC-32 tells. The
  // pickle's CRC is taken before its pages go, so the damage is found.
  TempDir dir;
  save_mapping(dir / "m.pt", many_small_tensors(false, kLargePickleTensors));
  std::vector<std::byte> file = file_bytes(dir / "m.pt");
  const std::string key = "layer39999.weight";
  const auto* begin = reinterpret_cast<const char*>(file.data());
  const std::string_view text(begin, file.size());
  const std::size_t at = text.find(key);
  ASSERT_NE(at, std::string_view::npos);
  file[at] = std::byte{'m'};
  {
    std::ofstream out(dir / "damaged.pt", std::ios::binary);
    out.write(begin, static_cast<std::streamsize>(file.size()));
  }
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "damaged.pt"), ErrorCode::zip_crc_mismatch);
  // Parsed with a hasher already past it, too.
  const io::Snapshot snapshot = io::read_snapshot(dir / "damaged.pt", Limits{}.max_file_bytes);
  ParseContext context;
  context.release_spent_bytes = true;
  context.bytes_hashed = [size = file.size()] { return size; };
  EXPECT_ERROR_CODE(parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, Limits{}, context),
                    ErrorCode::zip_crc_mismatch);
}

TEST(SpentPages, AMismatchedDigestIsStillRefusedWithItsCode) {
  TempDir dir;
  save_mapping(dir / "m.pt", many_small_tensors());
  LoadOptions options;
  options.expected_sha256 = Sha256::of(std::span<const std::byte>{});  // the empty file's
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "m.pt", options), ErrorCode::sha256_mismatch);
}

// ---- huge pages for large buffers (io::Buffer::allocate) ---------------------------------

constexpr std::size_t kHuge = std::size_t{2} << 20;

TEST(FreeHugeBlocks, CountsOnlyBlocksOfAtLeastTheBlockSize) {
  // Orders 0..10 of 4 KiB pages: order 9 is 2 MiB, order 10 is 4 MiB.
  const std::string buddyinfo =
      "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3\n"
      "Node 0, zone    DMA32      4      1      2      2      2      2      1      4      4      2    752\n"
      "Node 0, zone   Normal  14611   6449   3339   1617    900   6299   3987   2289   1051    287   3483\n";
  const std::uint64_t expected = (1 + 2 + 287) * std::uint64_t{kHuge} + (3 + 752 + 3483) * std::uint64_t{2 * kHuge};
  EXPECT_EQ(io::free_bytes_in_blocks_of(buddyinfo, kHuge, 4096), expected);
  // Order 10 only.
  EXPECT_EQ(io::free_bytes_in_blocks_of(buddyinfo, 2 * kHuge, 4096), (3 + 752 + 3483) * std::uint64_t{2 * kHuge});
  // Every block counts when the block asked for is one page.
  EXPECT_GT(io::free_bytes_in_blocks_of(buddyinfo, 4096, 4096), expected);
}

TEST(FreeHugeBlocks, TextItCannotReadCountsNothing) {
  EXPECT_EQ(io::free_bytes_in_blocks_of("", kHuge, 4096), 0u);
  EXPECT_EQ(io::free_bytes_in_blocks_of("no zones here\n1 2 3 4 5 6 7 8 9 10 11\n", kHuge, 4096), 0u);
  // A zone line cut short before order 9 has no huge blocks.
  EXPECT_EQ(io::free_bytes_in_blocks_of("Node 0, zone Normal 5 5 5 5 5 5 5 5 5\n", kHuge, 4096), 0u);
  // A count that is not a number ends the line.
  EXPECT_EQ(io::free_bytes_in_blocks_of("Node 0, zone Normal 1 1 1 1 1 1 1 1 1 x 7\n", kHuge, 4096), 0u);
}

// The mapping of /proc/self/smaps that holds `address`: its "Rss:" and
// "AnonHugePages:" in KiB.
struct Residency {
  std::uint64_t rss_kib = 0, anon_huge_kib = 0;
  bool found = false;
};

Residency residency_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  Residency out;
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long long begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      if (inside) break;
      inside = at >= begin && at < end;
      out.found = out.found || inside;
      continue;
    }
    if (!inside) continue;
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "Rss: %llu kB", &kib) == 1) out.rss_kib = kib;
    if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kib) == 1) out.anon_huge_kib = kib;
  }
  return out;
}

std::string text_of(const std::string& path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// Transparent huge pages of 2 MiB are on, for madvised memory at least.
bool huge_pages_enabled() {
  const std::string modes = text_of("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string size_modes = text_of("/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled");
  return !modes.empty() && modes.find("[never]") == std::string::npos &&
         size_modes.find("[never]") == std::string::npos &&
         text_of("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").rfind("2097152", 0) == 0;
}

// A buffer that will get huge pages for every whole huge page it has, or
// nullptr where this machine cannot give them (the test then skips).
std::shared_ptr<io::Buffer> buffer_in_huge_pages(std::size_t size) {
  const std::string buddyinfo = text_of("/proc/buddyinfo");
  // Ample room, so that another process taking some meanwhile changes nothing.
  if (!huge_pages_enabled() || io::free_bytes_in_blocks_of(buddyinfo, kHuge, kPage) < 8 * size) return nullptr;
  return io::Buffer::allocate(size);
}

TEST(LargeBuffer, EveryByteIsItsOwnAndTheResidentSizeIsNotRoundedUp) {
  // Four whole huge pages and a partial one: large enough for huge pages.
  const std::size_t size = 4 * kHuge + kHuge / 2 + 123;
  const auto buffer = io::Buffer::allocate(size);
  ASSERT_EQ(buffer->size(), size);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer->data()) % kPage, 0u);
  for (std::size_t i = 0; i < size; ++i) buffer->data()[i] = static_cast<std::byte>(i * 7 + 1);
  for (std::size_t i = 0; i < size; i += 4099) {
    ASSERT_EQ(buffer->data()[i], static_cast<std::byte>(i * 7 + 1)) << "at " << i;
  }
  EXPECT_EQ(buffer->data()[size - 1], static_cast<std::byte>((size - 1) * 7 + 1));
  const Residency resident = residency_of(buffer->data());
  ASSERT_TRUE(resident.found);
  // The mapping holds the buffer's pages and nothing more: the partial huge
  // page at the end is not rounded up to a whole one.
  EXPECT_LE(resident.rss_kib * 1024, (size + kPage - 1) / kPage * kPage);
  EXPECT_LE(resident.anon_huge_kib * 1024, 4 * kHuge);
}

TEST(LargeBuffer, ItGetsHugePagesWhenTheKernelHasThemFree) {
  const std::size_t size = 16 * kHuge;
  const auto buffer = buffer_in_huge_pages(size);
  if (!buffer) GTEST_SKIP() << "transparent huge pages off or too few free huge blocks here";
  EXPECT_EQ(buffer->huge_page_bytes(), kHuge);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer->data()) % kHuge, 0u) << "not on a huge-page boundary";
  std::memset(buffer->data(), 0x5A, size);
  const Residency resident = residency_of(buffer->data());
  ASSERT_TRUE(resident.found);
  EXPECT_GT(resident.anon_huge_kib, 0u) << "no huge page backs a 32 MiB buffer";
  // A released range inside a huge page reads as zeros; its neighbours keep
  // their bytes.
  io::release_whole_pages(buffer->data() + kHuge + kPage, 3 * kPage);
  EXPECT_EQ(buffer->data()[kHuge + kPage], std::byte{0});
  EXPECT_EQ(buffer->data()[kHuge + 4 * kPage - 1], std::byte{0});
  EXPECT_EQ(buffer->data()[kHuge + kPage - 1], std::byte{0x5A});
  EXPECT_EQ(buffer->data()[kHuge + 4 * kPage], std::byte{0x5A});
}

TEST(LargeBuffer, HugePagesThatFillTooSlowlyHandTheRestToSmallPages) {
  const std::size_t size = 16 * kHuge;
  const auto buffer = buffer_in_huge_pages(size);
  if (!buffer) GTEST_SKIP() << "transparent huge pages off or too few free huge blocks here";
  ASSERT_EQ(buffer->huge_page_bytes(), kHuge);
  // No fill is fast enough for this bound: the first range is the last in
  // huge pages.
  buffer->populate(0, kHuge / 8, 1e30);
  EXPECT_EQ(buffer->huge_page_bytes(), 0u);
  buffer->populate(kHuge / 8, size - kHuge / 8, 1e30);
  std::memset(buffer->data(), 0x33, size);
  // MADV_NOHUGEPAGE splits the mapping: the rest is a mapping of its own.
  const Residency first = residency_of(buffer->data());
  const Residency rest = residency_of(buffer->data() + kHuge);
  ASSERT_TRUE(first.found && rest.found);
  EXPECT_LE(first.anon_huge_kib * 1024, kHuge);
  EXPECT_EQ(rest.anon_huge_kib, 0u) << "the pages after the first huge one are still huge";
  EXPECT_GE(rest.rss_kib * 1024, size - kHuge);
  EXPECT_EQ(buffer->data()[size - 1], std::byte{0x33});
}

TEST(LargeBuffer, HugePagesThatFillFastEnoughStay) {
  const std::size_t size = 16 * kHuge;
  const auto buffer = buffer_in_huge_pages(size);
  if (!buffer) GTEST_SKIP() << "transparent huge pages off or too few free huge blocks here";
  // Every fill is fast enough for this bound, in range after range.
  for (std::size_t at = 0; at < size; at += 3 * kHuge) buffer->populate(at, 3 * kHuge, 0);
  EXPECT_EQ(buffer->huge_page_bytes(), kHuge);
  const Residency resident = residency_of(buffer->data() + size - 1);
  ASSERT_TRUE(resident.found);
  EXPECT_GT(resident.anon_huge_kib * 1024, kHuge) << "one huge page at most in a 32 MiB buffer";
}

TEST(LargeBuffer, PopulateStopsAtTheBufferEnd) {
  const auto buffer = io::Buffer::allocate(kHuge + 100);
  buffer->populate(kHuge, 10 * kHuge);  // clamped to the buffer's 100 last bytes
  buffer->populate(kHuge + 100, kHuge);  // past the end: nothing
  buffer->data()[kHuge + 99] = std::byte{7};
  EXPECT_EQ(buffer->data()[kHuge + 99], std::byte{7});
  EXPECT_EQ(buffer->data()[kHuge], std::byte{0});
}

TEST(LargeBuffer, SmallBuffersStayInSmallPages) {
  // With THP on for all memory, the kernel may back any aligned 2 MiB itself.
  if (text_of("/sys/kernel/mm/transparent_hugepage/enabled").find("[always]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are on for all memory here";
  }
  const auto buffer = io::Buffer::allocate(kHuge + 1);
  EXPECT_EQ(buffer->huge_page_bytes(), 0u);
  std::memset(buffer->data(), 1, buffer->size());
  const Residency resident = residency_of(buffer->data());
  ASSERT_TRUE(resident.found);
  EXPECT_EQ(resident.anon_huge_kib, 0u);
}

}  // namespace
}  // namespace holdpoint
