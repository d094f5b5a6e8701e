// holdpoint diff's library (holdpoint/verify/checkpoint_diff.h): each kind of
// planted change reported by path with its figures, tolerances as
// numpy.isclose, strided views (whole and through the window), safetensors and
// legacy files; and the refusals: a file changed after the scan (bytes with the
// same size and time: the CRC-32; a truncation), a corrupt or hostile file, a
// missing file, a FIFO, a digest that does not match, bad tolerances.
#include "holdpoint/verify/checkpoint_diff.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/scan.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

Value floats(const std::vector<float>& values, Dims sizes = {}) {
  if (sizes.empty()) sizes = {static_cast<std::int64_t>(values.size())};
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return Value::tensor(TensorData::from_bytes(DType::float32, sizes, bytes));
}

Value int64s(const std::vector<std::int64_t>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(std::int64_t));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return Value::tensor(TensorData::from_bytes(DType::int64, {static_cast<std::int64_t>(values.size())}, bytes));
}

Value dict(std::initializer_list<std::pair<std::string, Value>> entries) {
  Dict out;
  for (const auto& [key, value] : entries) out.insert(key, value);
  return Value::dict(std::move(out));
}

std::filesystem::path save(const TempDir& dir, const std::string& name, const Value& root,
                           FileFormat format = FileFormat::pytorch_zip) {
  SaveOptions options;
  options.write_sidecar = false;
  options.durable = false;
  options.format = format;
  save_mapping(dir / name, root, options);
  return dir / name;
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(i) * 0.25f;
  return out;
}

// A checkpoint shaped like holdpoint's own: a manifest with a config, and components.
Value checkpoint(const std::vector<float>& weight, double lr = 0.1, const std::string& log_dir = "/tmp/log",
                 std::int64_t step = 5) {
  return dict({{"holdpoint", dict({{"kind", Value::string("resume")},
                                   {"config", dict({{"load_bearing", dict({{"lr", Value::floating(lr)}})},
                                                    {"operational", dict({{"log_dir", Value::string(log_dir)}})}})}})},
               {"model", dict({{"fc.weight", floats(weight, {4, 4})}})},
               {"optimizer", dict({{"state", dict({{"0", dict({{"step", Value::integer(step)}})}})}})},
               {"rng", dict({{"torch.cpu", int64s({1, 2, 3, 4})}})}});
}

const DiffEntry* find(const CheckpointDiff& diff, const std::string& path) {
  for (const DiffEntry& entry : diff.entries) {
    if (entry.path == path) return &entry;
  }
  return nullptr;
}

TEST(CheckpointDiff, IdenticalFilesHaveNoEntries) {
  TempDir dir;
  const auto a = save(dir, "a.pt", checkpoint(ramp(16)));
  const auto b = save(dir, "b.pt", checkpoint(ramp(16)));
  const CheckpointDiff diff = diff_checkpoints(a, b);
  EXPECT_TRUE(diff.entries.empty()) << diff.text();
  EXPECT_TRUE(diff.same());
  EXPECT_EQ(diff.tensors_compared, 2u);
  EXPECT_EQ(diff.bytes_compared, 2u * (16 * 4 + 4 * 8));
  EXPECT_EQ(diff.a.sha256, diff.b.sha256);
  EXPECT_NE(diff.text().find("same: "), std::string::npos);
}

TEST(CheckpointDiff, OneElementChangedIsCountedOnceWithItsExactDeviation) {
  TempDir dir;
  std::vector<float> changed = ramp(16);
  changed[9] += 0.5f;  // element [2, 1]
  const auto a = save(dir, "a.pt", checkpoint(ramp(16)));
  const auto b = save(dir, "b.pt", checkpoint(changed));
  const CheckpointDiff diff = diff_checkpoints(a, b);
  ASSERT_EQ(diff.entries.size(), 1u) << diff.text();
  const DiffEntry& entry = diff.entries[0];
  EXPECT_EQ(entry.path, "model/fc.weight");
  EXPECT_EQ(entry.section, "model");
  EXPECT_EQ(entry.change, DiffChange::value_changed);
  ASSERT_TRUE(entry.deviation);
  EXPECT_EQ(entry.deviation->numel, 16u);
  EXPECT_EQ(entry.deviation->differing, 1u);
  EXPECT_EQ(entry.deviation->max_abs_deviation, 0.5);
  EXPECT_EQ(entry.deviation->max_rel_deviation, 0.5 / (9 * 0.25 + 0.5));
  EXPECT_EQ(entry.deviation->max_abs_index, (std::vector<std::int64_t>{2, 1}));
  EXPECT_FALSE(entry.within_tolerance);
  EXPECT_FALSE(diff.same());
}

TEST(CheckpointDiff, DtypeAndShapeChangesAreNamedWithoutComparingElements) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"x", floats({1, 2, 3})}, {"y", floats({1, 2, 3})}}));
  const auto b = save(dir, "b.pt", dict({{"x", int64s({1, 2, 3})}, {"y", floats({1, 2, 3, 4})}}));
  const CheckpointDiff diff = diff_checkpoints(a, b);
  ASSERT_EQ(diff.entries.size(), 2u) << diff.text();
  EXPECT_EQ(diff.entries[0].change, DiffChange::dtype_changed);
  EXPECT_EQ(diff.entries[0].a, "float32 [3]");
  EXPECT_EQ(diff.entries[0].b, "int64 [3]");
  EXPECT_EQ(diff.entries[1].change, DiffChange::shape_changed);
  EXPECT_EQ(diff.entries[1].b, "float32 [4]");
  EXPECT_EQ(diff.tensors_compared, 0u);
  // A plain state dict: top-level tensors are the model.
  EXPECT_EQ(diff.entries[0].section, "model");
}

TEST(CheckpointDiff, KeysAddedAndRemovedAreNamed) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"kept", floats({1})}, {"old", floats({2})}}));
  const auto b = save(dir, "b.pt", dict({{"kept", floats({1})}, {"new", Value::integer(3)}}));
  const CheckpointDiff diff = diff_checkpoints(a, b);
  ASSERT_EQ(diff.entries.size(), 2u) << diff.text();
  EXPECT_EQ(diff.entries[0].path, "old");
  EXPECT_EQ(diff.entries[0].change, DiffChange::removed);
  EXPECT_EQ(diff.entries[1].path, "new");
  EXPECT_EQ(diff.entries[1].change, DiffChange::added);
  EXPECT_EQ(diff.entries[1].b, "3");
}

TEST(CheckpointDiff, ConfigFieldsAreNamedLoadBearingOrOperational) {
  TempDir dir;
  const auto a = save(dir, "a.pt", checkpoint(ramp(16), 0.1, "/tmp/log"));
  const auto b = save(dir, "b.pt", checkpoint(ramp(16), 0.2, "/tmp/other"));
  const CheckpointDiff diff = diff_checkpoints(a, b);
  const DiffEntry* lr = find(diff, "holdpoint/config/load_bearing/lr");
  const DiffEntry* log = find(diff, "holdpoint/config/operational/log_dir");
  ASSERT_TRUE(lr && log) << diff.text();
  EXPECT_EQ(lr->section, "config");
  EXPECT_EQ(lr->config_field, ConfigFieldClass::load_bearing);
  EXPECT_EQ(lr->a, "0.1");
  EXPECT_EQ(lr->b, "0.2");
  EXPECT_EQ(log->config_field, ConfigFieldClass::operational);
  EXPECT_NE(diff.text().find("(config, load-bearing)"), std::string::npos);
  EXPECT_NE(diff.json().find("\"config_field\": \"operational\""), std::string::npos);
}

TEST(CheckpointDiff, OptimizerStepAndRngStateAreReportedInTheirSections) {
  TempDir dir;
  Value changed = checkpoint(ramp(16), 0.1, "/tmp/log", 6);
  const auto a = save(dir, "a.pt", checkpoint(ramp(16)));
  const auto b = save(dir, "b.pt", changed);
  const CheckpointDiff diff = diff_checkpoints(a, b);
  const DiffEntry* step = find(diff, "optimizer/state/0/step");
  ASSERT_TRUE(step) << diff.text();
  EXPECT_EQ(step->section, "optimizer");
  EXPECT_EQ(step->a, "5");
  EXPECT_EQ(step->b, "6");
  EXPECT_EQ(step->deviation->max_abs_deviation, 1.0);
}

TEST(CheckpointDiff, ToleranceAsNumpyIsclose) {
  TempDir dir;
  std::vector<float> changed = ramp(16);
  changed[4] += 0.001f;  // 1.0 -> 1.001
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(16))}}));
  const auto b = save(dir, "b.pt", dict({{"w", floats(changed)}}));
  DiffOptions options;
  options.atol = 0.01;
  CheckpointDiff diff = diff_checkpoints(a, b, options);
  ASSERT_EQ(diff.entries.size(), 1u);
  EXPECT_TRUE(diff.entries[0].within_tolerance);
  EXPECT_EQ(diff.entries[0].deviation->differing, 0u);
  EXPECT_EQ(diff.entries[0].deviation->unequal, 1u);
  EXPECT_TRUE(diff.same());
  options.atol = 0;
  options.rtol = 0.01;  // |a - b| <= rtol * |b|
  EXPECT_TRUE(diff_checkpoints(a, b, options).same());
  options.rtol = 1e-4;
  EXPECT_FALSE(diff_checkpoints(a, b, options).same());
}

TEST(CheckpointDiff, IntegersCompareExactlyWhateverTheTolerance) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"n", int64s({1, 2, 3})}}));
  const auto b = save(dir, "b.pt", dict({{"n", int64s({1, 2, 4})}}));
  DiffOptions options;
  options.atol = 10;
  const CheckpointDiff diff = diff_checkpoints(a, b, options);
  ASSERT_EQ(diff.entries.size(), 1u);
  EXPECT_FALSE(diff.entries[0].within_tolerance);
  EXPECT_EQ(diff.entries[0].deviation->max_abs_deviation, 1.0);
  EXPECT_FALSE(diff.same());
}

TEST(CheckpointDiff, NanAgainstNanIsEqualAndNanAgainstANumberDiffers) {
  TempDir dir;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto a = save(dir, "a.pt", dict({{"x", floats({nan, inf, 1})}, {"y", floats({nan, 2})}}));
  const auto b = save(dir, "b.pt", dict({{"x", floats({nan, inf, 1})}, {"y", floats({1, 2})}}));
  DiffOptions options;
  options.atol = 1e9;
  const CheckpointDiff diff = diff_checkpoints(a, b, options);
  ASSERT_EQ(diff.entries.size(), 1u) << diff.text();
  EXPECT_EQ(diff.entries[0].path, "y");
  EXPECT_EQ(diff.entries[0].deviation->differing, 1u);
  EXPECT_FALSE(diff.entries[0].deviation->max_abs_deviation);  // no pair without NaN differs
}

// A transposed view of a 3 x 4 storage, with element [r, c] of the view = base[c * 3 + r].
Value transposed(const std::vector<float>& base) {
  std::vector<std::byte> bytes(base.size() * sizeof(float));
  std::memcpy(bytes.data(), base.data(), bytes.size());
  TensorData t = TensorData::from_bytes(DType::float32, {4, 3}, bytes);
  t.sizes = {3, 4};
  t.strides = {1, 3};
  return Value::tensor(std::move(t));
}

TEST(CheckpointDiff, StridedViewsCompareInViewOrderWholeAndThroughTheWindow) {
  TempDir dir;
  std::vector<float> changed = ramp(12);
  changed[1 * 3 + 2] = 100;  // view element [2, 1]
  const auto a = save(dir, "a.pt", dict({{"t", transposed(ramp(12))}}));
  const auto b = save(dir, "b.pt", dict({{"t", transposed(changed)}}));
  for (const std::size_t whole : {kDiffWholeStorageBytes, std::size_t{0}}) {
    DiffOptions options;
    options.whole_storage_bytes = whole;
    const CheckpointDiff diff = diff_checkpoints(a, b, options);
    ASSERT_EQ(diff.entries.size(), 1u) << diff.text();
    EXPECT_EQ(diff.entries[0].deviation->differing, 1u);
    EXPECT_EQ(diff.entries[0].deviation->first_index, (std::vector<std::int64_t>{2, 1}));
    EXPECT_EQ(diff.entries[0].deviation->max_abs_deviation, 100 - 5 * 0.25);
  }
}

TEST(CheckpointDiff, SafetensorsFilesCompare) {
  TempDir dir;
  std::vector<float> changed = ramp(8);
  changed[7] = -1;
  const auto a = save(dir, "a.safetensors", dict({{"w", floats(ramp(8))}}), FileFormat::safetensors);
  const auto b = save(dir, "b.safetensors", dict({{"w", floats(changed)}}), FileFormat::safetensors);
  const CheckpointDiff diff = diff_checkpoints(a, b);
  ASSERT_EQ(diff.entries.size(), 1u) << diff.text();
  EXPECT_EQ(diff.entries[0].deviation->first_index, (std::vector<std::int64_t>{7}));
  EXPECT_EQ(diff.a.format, FileFormat::safetensors);
}

TEST(CheckpointDiff, LegacyStreamsCompareFromMemory) {
  const auto legacy = testing::corpus_dir() / "real_pt" / "gopickle_t1.5_legacy_float64_proto1.pt";
  const auto zip = testing::corpus_dir() / "real_pt" / "gopickle_t1.5_zip_v2_float32_proto2.pt";
  const CheckpointDiff same = diff_checkpoints(legacy, legacy);
  EXPECT_TRUE(same.entries.empty()) << same.text();
  EXPECT_GT(same.tensors_compared, 0u);
  EXPECT_EQ(same.a.format, FileFormat::pytorch_legacy);
  const CheckpointDiff other = diff_checkpoints(legacy, zip);
  EXPECT_FALSE(other.same());
}

// ---- refusals ----------------------------------------------------------------------

// The offset of the first tensor record of a zip file.
std::uint64_t first_storage_offset(const std::filesystem::path& path) {
  const LoadedMapping mapping = scan_checkpoint(path);
  return mapping.storage_locations.at(0).offset;
}

void flip_byte_keeping_time(const std::filesystem::path& path, std::uint64_t offset) {
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  auto bytes = testing::read_file_bytes(path);
  bytes.at(offset) ^= std::byte{1};
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data() + offset, 1, static_cast<off_t>(offset)), 1);
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
}

TEST(CheckpointDiff, BytesChangedAfterTheScanAreCaughtByTheRecordsCrc) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(64))}}));
  const auto b = save(dir, "b.pt", dict({{"w", floats(ramp(64))}}));
  const std::uint64_t offset = first_storage_offset(a);
  DiffOptions options;
  // Called once both files were scanned, before a tensor byte is read.
  bool flipped = false;
  options.progress = [&](std::uint64_t done, std::uint64_t) {
    if (done == 0 && !flipped) {
      flipped = true;
      flip_byte_keeping_time(a, offset + 5);
    }
  };
  EXPECT_ERROR_CODE(diff_checkpoints(a, b, options), ErrorCode::file_changed_during_read);
  EXPECT_TRUE(flipped);
}

TEST(CheckpointDiff, AFileTruncatedAfterTheScanIsRefused) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(64))}}));
  const auto b = save(dir, "b.pt", dict({{"w", floats(ramp(64))}}));
  const std::uint64_t offset = first_storage_offset(b);
  DiffOptions options;
  options.progress = [&](std::uint64_t done, std::uint64_t) {
    if (done == 0) std::filesystem::resize_file(b, offset + 8);
  };
  EXPECT_ERROR_CODE(diff_checkpoints(a, b, options), ErrorCode::file_changed_during_read);
}

TEST(CheckpointDiff, ACorruptFileIsRefusedWithTheReadersCode) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(64))}}));
  const auto b = save(dir, "b.pt", dict({{"w", floats(ramp(64))}}));
  auto bytes = testing::read_file_bytes(b);
  bytes.at(first_storage_offset(b) + 3) ^= std::byte{0x40};
  testing::write_file_bytes(b, bytes);
  EXPECT_ERROR_CODE(diff_checkpoints(a, b), ErrorCode::zip_crc_mismatch);
}

TEST(CheckpointDiff, HostileFilesAreRefusedAsTheScanRefusesThem) {
  TempDir dir;
  const auto good = save(dir, "a.pt", dict({{"w", floats(ramp(4))}}));
  for (const char* name : {"coldwaterq__billionLaughs.pt", "modelscan__unsafe_zip_pytorch.pt", "burn__broken.pt"}) {
    const auto hostile = testing::corpus_dir() / "malicious" / name;
    const auto expected = testing::error_code_of([&] { scan_checkpoint(hostile); });
    ASSERT_TRUE(expected) << name;
    EXPECT_ERROR_CODE(diff_checkpoints(good, hostile), *expected);
    EXPECT_ERROR_CODE(diff_checkpoints(hostile, good), *expected);
  }
}

TEST(CheckpointDiff, AMissingFileIsAnOpenError) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(4))}}));
  EXPECT_ERROR_CODE(diff_checkpoints(a, dir / "missing.pt"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(diff_checkpoints(dir.path(), a), ErrorCode::io_not_regular_file);
}

// Issue 35: a FIFO named as a side blocked the diff in open() forever.
TEST(CheckpointDiff, AFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(4))}}));
  const auto fifo = dir / "fifo.pt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_ERROR_CODE(diff_checkpoints(a, fifo), ErrorCode::io_not_regular_file);
  EXPECT_ERROR_CODE(diff_checkpoints(fifo, a), ErrorCode::io_not_regular_file);
}

TEST(CheckpointDiff, AnExpectedDigestThatDiffersIsRefused) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(4))}}));
  DiffOptions options;
  options.expected_sha256_b = Sha256Digest::parse(std::string(64, '0'));
  EXPECT_ERROR_CODE(diff_checkpoints(a, a, options), ErrorCode::sha256_mismatch);
}

TEST(CheckpointDiff, NegativeOrNonFiniteTolerancesAreRefused) {
  TempDir dir;
  const auto a = save(dir, "a.pt", dict({{"w", floats(ramp(4))}}));
  DiffOptions options;
  options.atol = -1;
  EXPECT_ERROR_CODE(diff_checkpoints(a, a, options), ErrorCode::invalid_argument);
  options.atol = 0;
  options.rtol = std::numeric_limits<double>::quiet_NaN();
  EXPECT_ERROR_CODE(diff_checkpoints(a, a, options), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace holdpoint
