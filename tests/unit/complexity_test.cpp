// Algorithmic complexity: for each parser and structure check, the worst input
// that Limits admits, processed within a stated time and memory bound
// (issue 35; docs/testing.md, "Complexity suite", has the measured figures).
//
// A hostile file can make a reader work only in proportion to Limits; these
// tests show that the proportion is linear (or n log n) at the bound itself,
// where a quadratic path would take minutes. Each time bound is about ten
// times what was measured on the 2-core CI machine, and each memory bound
// about twice, so that a slow or busy runner passes and a superlinear path
// does not. Memory is the growth of the peak
// resident set (VmHWM, reset before each run) over the resident set at the
// start, with the input already built.
#include <malloc.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "format/pickle/pickle_reader.h"
#include "format/safetensors/safetensors.h"
#include "format/zip/zip_reader.h"
#include "format/zip/zip_writer.h"
#include "holdpoint/format/limits.h"
#include "pickle_builder.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::MemoryStorages;
using testing::PickleBuilder;
namespace op = format::pickle_op;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

std::uint64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::string(field).size()));
  }
  return 0;
}

struct Cost {
  double seconds = 0;
  std::uint64_t peak_bytes = 0;  // peak resident set growth while the work ran
};

// Runs `work` with the peak resident set reset first (Linux clear_refs 5).
template <typename F>
Cost measure(const char* what, F&& work) {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  const std::uint64_t start_kib = status_kib("VmRSS:");
  const auto start = std::chrono::steady_clock::now();
  work();
  Cost cost;
  cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::uint64_t peak_kib = status_kib("VmHWM:");
  cost.peak_bytes = peak_kib > start_kib ? (peak_kib - start_kib) << 10 : 0;
  std::printf("[complexity] %s: %.3f s, peak +%.1f MiB\n", what, cost.seconds,
              static_cast<double>(cost.peak_bytes) / static_cast<double>(kMiB));
  return cost;
}

format::PickleResult run_pickle(const std::vector<std::byte>& pickle, const Limits& limits = Limits{}) {
  MemoryStorages storages;
  storages.fabricate_missing(1 << 10);
  return format::read_pickle(pickle, storages, limits);
}

// ---- pickle VM -----------------------------------------------------------------

// max_opcodes opcodes in max_pickle_bytes: an empty list and MARK, APPENDS
// pairs that add nothing, so neither the stack nor any container grows and
// the cost is the VM's per-opcode cost alone.
TEST(Complexity, PickleOfMaxOpcodes) {
  const Limits limits;
  const std::uint64_t pairs = (limits.max_opcodes - 3) / 2;
  PickleBuilder pickle;
  pickle.proto(2).empty_list();
  for (std::uint64_t i = 0; i < pairs; ++i) pickle.mark().appends();
  pickle.stop();
  ASSERT_LE(pickle.size(), limits.max_pickle_bytes);
  const auto bytes = pickle.bytes();
  format::PickleResult result;
  const Cost cost = measure("pickle, 64 Mi opcodes", [&] { result = run_pickle(bytes, limits); });
  EXPECT_EQ(result.root.as_list().size(), 0u);
  EXPECT_LT(cost.seconds, 5.0);
  EXPECT_LT(cost.peak_bytes, 64 * kMiB);
}

// max_memo_entries entries (MEMOIZE is one byte, here of one None), then as
// many of them fetched again as the rest of max_pickle_bytes holds, each a
// list element (appended below max_stack_items at a time), so that every
// fetched entry is kept. The root is (None, list).
TEST(Complexity, PickleOfMaxMemoEntriesFetchedBack) {
  const Limits limits;
  PickleBuilder pickle;
  pickle.proto(4).none();
  for (std::uint64_t i = 0; i < limits.max_memo_entries; ++i) pickle.op(op::MEMOIZE);
  pickle.empty_list();
  const std::uint64_t room = limits.max_pickle_bytes - pickle.size() - 64;
  const std::uint64_t fetches = std::min<std::uint64_t>(room / 5, limits.max_memo_entries);
  std::uint64_t fetched = 0;
  while (fetched < fetches) {
    const std::uint64_t chunk = std::min<std::uint64_t>(fetches - fetched, limits.max_stack_items - 8);
    pickle.mark();
    for (std::uint64_t i = 0; i < chunk; ++i) pickle.long_binget(static_cast<std::uint32_t>(fetched + i));
    pickle.appends();
    fetched += chunk;
  }
  pickle.tuple2().stop();
  ASSERT_LE(pickle.size(), limits.max_pickle_bytes);
  const auto bytes = pickle.bytes();
  format::PickleResult result;
  const Cost cost = measure("pickle, 16 Mi memo entries, 10 Mi fetched", [&] { result = run_pickle(bytes, limits); });
  ASSERT_EQ(result.root.as_list().size(), 2u);
  EXPECT_EQ(result.root.as_list()[1].as_list().size(), fetches);
  EXPECT_LT(cost.seconds, 30.0);
  EXPECT_LT(cost.peak_bytes, 2048 * kMiB);
}

// One tuple of a million ints (the VM fetches only immutable values from the
// memo) referenced again until max_expanded_nodes is reached, and twice as
// often: counting shared references at their expanded size must cost one step
// per reference, not one per node.
TEST(Complexity, PickleSharedReferencesAtMaxExpandedNodes) {
  const Limits limits;
  constexpr std::uint64_t kItems = 1 << 20;
  PickleBuilder pickle;
  pickle.proto(2).empty_list().mark().mark();
  for (std::uint64_t i = 0; i < kItems; ++i) pickle.integer(static_cast<std::int64_t>(i & 0xFF));
  pickle.tuple().long_binput(0);
  const std::uint64_t references = limits.max_expanded_nodes / (kItems + 1) - 1;
  const auto build = [&](std::uint64_t count) {
    PickleBuilder copy = pickle;
    for (std::uint64_t i = 1; i < count; ++i) copy.long_binget(0);
    copy.appends().stop();
    return copy.bytes();
  };
  const auto admitted = build(references);
  format::PickleResult result;
  const Cost cost = measure("pickle, 1 Mi-int tuple referenced up to max_expanded_nodes",
                            [&] { result = run_pickle(admitted, limits); });
  EXPECT_EQ(result.root.as_list().size(), references);
  EXPECT_LT(cost.seconds, 2.0);
  EXPECT_LT(cost.peak_bytes, 256 * kMiB);
  const auto refused = build(2 * references);
  const Cost refusal = measure("pickle, twice as many references", [&] {
    EXPECT_ERROR_CODE(run_pickle(refused, limits), ErrorCode::pickle_expansion_limit);
  });
  EXPECT_LT(refusal.seconds, 2.0);
}

// Tuples nested up to max_nesting_depth deep, each level the tuple below it
// twice (fetched from the memo), so the expanded size doubles per level: the
// expansion bound stops it, in time linear in the pickle, not in 2^64.
TEST(Complexity, PickleDoublingSharedNestingAtMaxDepth) {
  const Limits limits;
  PickleBuilder pickle;
  pickle.proto(2).integer(1).tuple1().long_binput(0);
  for (std::uint32_t level = 1; level < limits.max_nesting_depth; ++level) {
    pickle.long_binget(level - 1).long_binget(level - 1).tuple2().long_binput(level);
  }
  pickle.stop();
  const auto bytes = pickle.bytes();
  const Cost cost = measure("pickle, shared tuples doubling 64 levels deep", [&] {
    EXPECT_ERROR_CODE(run_pickle(bytes, limits), ErrorCode::pickle_expansion_limit);
  });
  EXPECT_LT(cost.seconds, 1.0);
}

// max_container_elements ints in one list at the bottom of lists nested
// max_nesting_depth deep.
TEST(Complexity, PickleOfMaxContainerElementsAtMaxDepth) {
  const Limits limits;
  PickleBuilder pickle;
  pickle.proto(2);
  const std::uint32_t outer = limits.max_nesting_depth - 1;
  for (std::uint32_t level = 0; level < outer; ++level) pickle.empty_list();
  pickle.empty_list();
  const std::uint64_t elements = limits.max_container_elements - outer;
  std::uint64_t added = 0;
  while (added < elements) {
    const std::uint64_t chunk = std::min<std::uint64_t>(elements - added, limits.max_stack_items - outer - 8);
    pickle.mark();
    for (std::uint64_t i = 0; i < chunk; ++i) pickle.integer(static_cast<std::int64_t>(i & 0xFF));
    pickle.appends();
    added += chunk;
  }
  for (std::uint32_t level = 0; level < outer; ++level) pickle.append();
  pickle.stop();
  ASSERT_LE(pickle.size(), limits.max_pickle_bytes);
  const auto bytes = pickle.bytes();
  format::PickleResult result;
  const Cost cost = measure("pickle, 16 Mi elements 64 lists deep", [&] { result = run_pickle(bytes, limits); });
  const Value* bottom = &result.root;
  for (std::uint32_t level = 0; level < outer; ++level) bottom = &bottom->as_list().at(0);
  EXPECT_EQ(bottom->as_list().size(), elements);
  EXPECT_LT(cost.seconds, 10.0);
  EXPECT_LT(cost.peak_bytes, 1536 * kMiB);
}

// As many tensors as max_pickle_bytes holds, each over its own storage, in
// the layout torch.save writes (globals and repeated strings memoized).
TEST(Complexity, PickleOfTheMostTensorsMaxPickleBytesHolds) {
  const Limits limits;
  PickleBuilder pickle;
  pickle.proto(2).empty_dict().mark();
  std::uint64_t tensors = 0;
  const auto memoized = [&](std::uint32_t slot, auto&& first) {
    if (tensors == 0) {
      first();
      pickle.long_binput(slot);
    } else {
      pickle.long_binget(slot);
    }
  };
  constexpr std::uint64_t kPerSetitems = 1000;
  while (pickle.size() + 256 < limits.max_pickle_bytes) {
    const std::string name = "t" + std::to_string(tensors);
    pickle.str(name);
    memoized(0, [&] { pickle.global("torch._utils", "_rebuild_tensor_v2"); });
    pickle.mark().mark();
    memoized(1, [&] { pickle.str("storage"); });
    memoized(2, [&] { pickle.global("torch", "FloatStorage"); });
    pickle.str(std::to_string(tensors));
    memoized(3, [&] { pickle.str("cpu"); });
    pickle.integer(1).tuple().binpersid().integer(0).int_tuple({1}).int_tuple({1}).boolean(false);
    memoized(4, [&] { pickle.global("collections", "OrderedDict"); });
    pickle.empty_tuple().reduce().tuple().reduce();
    ++tensors;
    if (tensors % kPerSetitems == 0) pickle.setitems().mark();
  }
  pickle.setitems().stop();
  ASSERT_LE(pickle.size(), limits.max_pickle_bytes);
  const auto bytes = pickle.bytes();
  format::PickleResult result;
  const Cost cost = measure("pickle, the most tensors in 64 MiB", [&] { result = run_pickle(bytes, limits); });
  EXPECT_EQ(result.tensor_count, tensors);
  std::printf("[complexity] %llu tensors\n", static_cast<unsigned long long>(tensors));
  EXPECT_LT(cost.seconds, 15.0);
  EXPECT_LT(cost.peak_bytes, 1024 * kMiB);
}

// ---- zip central directory ---------------------------------------------------------

std::vector<std::byte> archive_of(std::uint64_t records, std::size_t name_bytes) {
  io::MemorySink sink;
  format::ZipWriter writer(sink, "archive");
  const std::string padding(name_bytes, 'n');
  for (std::uint64_t i = 0; i < records; ++i) {
    std::string name = "data/" + std::to_string(i);
    if (name.size() < name_bytes) name += "_" + padding.substr(0, name_bytes - name.size() - 1);
    writer.add_record(name, {});
  }
  writer.finish();
  return sink.take();
}

// max_records entries: the count bound.
TEST(Complexity, ZipDirectoryOfMaxRecords) {
  const Limits limits;
  const auto bytes = archive_of(limits.max_records, 0);
  format::ZipArchive archive;
  const Cost cost = measure("zip, 1 Mi records", [&] { archive = format::read_zip_directory(bytes, limits); });
  EXPECT_EQ(archive.entries.size(), limits.max_records);
  EXPECT_LT(cost.seconds, 3.0);
  EXPECT_LT(cost.peak_bytes, 256 * kMiB);
}

// max_central_directory_bytes of entries with the longest names (511 bytes,
// miniz's bound): the bytes bound, every name hashed, lower-cased and checked.
TEST(Complexity, ZipDirectoryOfMaxBytesWithLongestNames) {
  const Limits limits;
  constexpr std::size_t kRecordName = 511 - sizeof("archive/") + 1;
  const std::uint64_t records = limits.max_central_directory_bytes / (46 + 511);
  const auto bytes = archive_of(records, kRecordName);
  format::ZipArchive archive;
  const Cost cost =
      measure("zip, 128 MiB directory of 511-byte names", [&] { archive = format::read_zip_directory(bytes, limits); });
  EXPECT_EQ(archive.entries.size(), records);
  EXPECT_LT(cost.seconds, 4.0);
  EXPECT_LT(cost.peak_bytes, 384 * kMiB);
}

// ---- safetensors header --------------------------------------------------------------

// A header of max_safetensors_header_bytes holding the most tensors it can:
// one-byte tensors with short names, each checked, sorted by offset and
// checked to tile the data.
TEST(Complexity, SafetensorsHeaderOfMaxBytesWithTheMostTensors) {
  const Limits limits;
  std::string header = "{";
  std::uint64_t tensors = 0;
  std::string entry;
  while (true) {
    entry = (tensors ? "," : "") + std::string("\"") + std::to_string(tensors) +
            R"(":{"dtype":"U8","shape":[1],"data_offsets":[)" + std::to_string(tensors) + "," +
            std::to_string(tensors + 1) + "]}";
    if (header.size() + entry.size() + 1 > limits.max_safetensors_header_bytes) break;
    header += entry;
    ++tensors;
  }
  header += "}";
  header.append(limits.max_safetensors_header_bytes - header.size(), ' ');
  auto file = std::make_shared<std::vector<std::byte>>();
  file->reserve(8 + header.size() + tensors);
  for (int i = 0; i < 8; ++i) file->push_back(static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF));
  for (char c : header) file->push_back(static_cast<std::byte>(c));
  file->resize(file->size() + tensors);
  header.clear();
  header.shrink_to_fit();
  format::SafetensorsFile parsed;
  const Cost cost = measure("safetensors, 100 MB header",
                            [&] { parsed = format::read_safetensors(*file, file, limits); });
  EXPECT_EQ(parsed.tensors.size(), tensors);
  std::printf("[complexity] %llu tensors\n", static_cast<unsigned long long>(tensors));
  EXPECT_LT(cost.seconds, 16.0);
  EXPECT_LT(cost.peak_bytes, 1536 * kMiB);
}

}  // namespace
}  // namespace holdpoint
