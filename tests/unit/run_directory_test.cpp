// Run directories: layout, commit, recovery, retention, symlink refusals, and
// the crash-consistency proofs (fault sweep, crash sweep, retention property
// test) on the fault-injecting file system.
#include "holdpoint/run/run_directory.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "format/pt_writer.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"
#include "base/publish.h"
#include "support/fault_file_system.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

// Opens a run to inspect it: nothing is recovered or changed.
RunDirectoryOptions inspect_only() {
  RunDirectoryOptions options;
  options.recover = false;
  return options;
}

using testing::CrashMode;
using testing::FaultFileSystem;
using testing::FaultKind;
using testing::SimulatedCrash;
using testing::TempDir;

// A valid generation: a holdpoint manifest and a payload that names its step.
std::string checkpoint_bytes(std::int64_t step) {
  Dict root;
  Manifest manifest;
  manifest.semantic_identity = "run-directory-test";
  root.insert(std::string(kManifestKey), manifest.to_value());
  std::vector<std::int64_t> payload(64);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = step * 1000 + static_cast<std::int64_t>(i);
  root.insert("payload", Value::tensor(TensorData::from_bytes(
                             DType::int64, {64}, std::as_bytes(std::span<const std::int64_t>(payload)))));
  root.insert("step", Value::integer(step));
  io::MemorySink sink;
  format::write_pt(sink, Value::dict(std::move(root)));
  const auto& bytes = sink.bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

RunDirectory::Writer writer_for(std::int64_t step) {
  return [bytes = checkpoint_bytes(step)](io::ByteSink& sink) {
    sink.write({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
  };
}

GenerationSpec spec(std::int64_t step, std::optional<double> loss = std::nullopt) {
  GenerationSpec s;
  s.step = step;
  s.epoch = step / 10;
  if (loss) s.metrics = {{"loss", *loss}};
  return s;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

RunDirectoryOptions with_best(RunDirectoryOptions options = {}) {
  options.best_metric = BestMetric{"loss", false};
  return options;
}

// ---- names ---------------------------------------------------------------------------------

TEST(GenerationNames, RoundTripWithEightOrMoreDigits) {
  EXPECT_EQ(generation_name(5), "step-00000005.pt");
  EXPECT_EQ(generation_name(123456789), "step-123456789.pt");
  for (std::int64_t step : {0L, 1L, 99999999L, 100000000L, 4611686018427387904L}) {
    EXPECT_EQ(parse_generation_name(generation_name(step)), step);
  }
}

TEST(GenerationNames, OtherNamesAreNotGenerations) {
  for (const char* name : {"step-1.pt", "step-0000001.pt", "step-000000001.pt", "step-00000001.pt.sha256",
                           "step-00000001.pth", "xstep-00000001.pt", "step--0000001.pt", "step--0000000.pt", "step-0000000a.pt",
                           ".step-00000001.pt.staging-1-2", "step-+0000001.pt", "STEP-00000001.pt", ""}) {
    EXPECT_FALSE(parse_generation_name(name)) << name;
  }
  EXPECT_ERROR_CODE(generation_name(-1), ErrorCode::invalid_argument);
}

// ---- layout and commit ----------------------------------------------------------------------

TEST(RunDirectoryLayout, CommitWritesGenerationSidecarIndexAndPointers) {
  TempDir tmp;
  const auto run_path = tmp / "run";
  RunDirectory run(run_path, with_best());
  EXPECT_TRUE(run.recovery().clean());
  EXPECT_FALSE(run.latest());
  run.commit(spec(1, 0.9), writer_for(1));
  run.commit(spec(2, 0.5), writer_for(2));
  const CommitResult third = run.commit(spec(3, 0.7), writer_for(3));
  EXPECT_FALSE(third.became_best);

  const GenerationInfo g = third.generation;
  EXPECT_EQ(g.name, "step-00000003.pt");
  EXPECT_EQ(g.size, checkpoint_bytes(3).size());
  EXPECT_EQ(g.sha256, Sha256::of(testing::bytes_of(checkpoint_bytes(3))));
  EXPECT_EQ(read_text(run_path / "checkpoints" / g.name), checkpoint_bytes(3));
  // sha256sum -c format, relative to checkpoints/.
  EXPECT_EQ(read_text(run_path / "checkpoints" / "step-00000003.pt.sha256"), g.sha256.hex() + "  step-00000003.pt\n");
  EXPECT_EQ(read_text(run_path / "LATEST"), "step-00000003.pt " + g.sha256.hex() + "\n");
  EXPECT_EQ(read_text(run_path / "BEST"), "step-00000002.pt " + run.best()->sha256.hex() + "\n");

  const auto index = nlohmann::json::parse(read_text(run_path / "index.json"));
  EXPECT_EQ(index["schema"], "holdpoint.run-index");
  EXPECT_EQ(index["schema_version"], 1);
  ASSERT_EQ(index["generations"].size(), 3u);
  EXPECT_EQ(index["generations"][2]["name"], "step-00000003.pt");
  EXPECT_EQ(index["generations"][2]["sha256"], g.sha256.hex());
  EXPECT_EQ(index["generations"][2]["size"], g.size);
  EXPECT_EQ(index["generations"][2]["metrics"]["loss"], 0.7);
  EXPECT_FALSE(index["generations"][2]["saved_at"].get<std::string>().empty());

  ASSERT_EQ(run.generations().size(), 3u);
  EXPECT_EQ(run.latest()->step, 3);
  EXPECT_EQ(run.best()->step, 2);
  EXPECT_EQ(run.find("step-00000001.pt")->metric("loss"), 0.9);
  for (const auto& check : run.verify_all()) EXPECT_TRUE(check.ok) << check.name << ": " << check.detail;

  // No staging files and nothing foreign left behind.
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(run_path / "checkpoints")) {
    names.insert(entry.path().filename().string());
  }
  EXPECT_EQ(names.size(), 6u);

  // A second writer is locked out while this one is open.
  EXPECT_ERROR_CODE(RunDirectory(run_path, {}), ErrorCode::run_directory_locked);
  // Reopening read-only finds the same run and nothing to recover.
  RunDirectory reopened(run_path, with_best(inspect_only()));
  EXPECT_TRUE(reopened.recovery().clean()) << ::testing::PrintToString(reopened.recovery().lines());
  EXPECT_EQ(reopened.latest()->sha256, g.sha256);
  EXPECT_EQ(reopened.best()->step, 2);
  EXPECT_EQ(reopened.generations().size(), 3u);
  const LoadedMapping loaded = reopened.load(*reopened.latest());
  EXPECT_EQ(loaded.root.as_dict().find("step")->as_int(), 3);
}

TEST(RunDirectoryLayout, ReopenedRunKeepsCommitting) {
  TempDir tmp;
  { RunDirectory(tmp / "run").commit(spec(4), writer_for(4)); }
  RunDirectory run(tmp / "run");
  run.commit(spec(8), writer_for(8));
  EXPECT_EQ(run.latest()->step, 8);
  EXPECT_EQ(RunDirectory(tmp / "run", inspect_only()).generations().size(), 2u);
}

TEST(RunDirectoryCommit, AStepAlreadyCommittedIsRefused) {
  TempDir tmp;
  RunDirectory run(tmp / "run");
  run.commit(spec(5), writer_for(5));
  EXPECT_ERROR_CODE(run.commit(spec(5), writer_for(5)), ErrorCode::run_generation_exists);
  EXPECT_EQ(run.generations().size(), 1u);
}

TEST(RunDirectoryCommit, AStepBeforeLatestIsRefused) {
  TempDir tmp;
  RunDirectory run(tmp / "run");
  run.commit(spec(5), writer_for(5));
  EXPECT_ERROR_CODE(run.commit(spec(3), writer_for(3)), ErrorCode::run_step_not_increasing);
  EXPECT_FALSE(std::filesystem::exists(tmp / "run" / "checkpoints" / "step-00000003.pt"));
}

TEST(RunDirectoryCommit, BytesThatDoNotVerifyAreNeverPublished) {
  TempDir tmp;
  RunDirectory run(tmp / "run");
  run.commit(spec(1), writer_for(1));
  const auto garbage = [](io::ByteSink& sink) { sink.write(testing::bytes_of("not a checkpoint at all")); };
  EXPECT_ERROR_CODE(run.commit(spec(2), garbage), ErrorCode::unknown_format);
  EXPECT_EQ(run.latest()->step, 1);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp / "run" / "checkpoints"), {}), 2);
  // A zip without a manifest fails the schema check.
  const auto no_manifest = [](io::ByteSink& sink) {
    Dict root;
    root.insert("x", Value::integer(1));
    format::write_pt(sink, Value::dict(std::move(root)));
  };
  EXPECT_ERROR_CODE(run.commit(spec(2), no_manifest), ErrorCode::schema_field_missing);
  EXPECT_EQ(RunDirectory(tmp / "run", inspect_only()).latest()->step, 1);
}

TEST(RunDirectoryCommit, TheWriterSeesTheFailureAndNothingMoves) {
  TempDir tmp;
  RunDirectory run(tmp / "run");
  run.commit(spec(1), writer_for(1));
  const auto failing = [](io::ByteSink& sink) {
    sink.write(testing::bytes_of("partial"));
    throw Error(ErrorCode::state_apply_failed, "writer failed");
  };
  EXPECT_ERROR_CODE(run.commit(spec(2), failing), ErrorCode::state_apply_failed);
  EXPECT_EQ(read_text(tmp / "run" / "LATEST"), "step-00000001.pt " + run.latest()->sha256.hex() + "\n");
  // Retention refuses until a save succeeds again.
  EXPECT_ERROR_CODE(run.collect_garbage({.keep_last = 1}), ErrorCode::run_gc_refused);
  EXPECT_TRUE(std::filesystem::exists(tmp / "run" / "checkpoints" / "step-00000001.pt"));
  run.commit(spec(2), writer_for(2));
  EXPECT_EQ(run.collect_garbage({.keep_last = 1}), std::vector<std::string>{"step-00000001.pt"});
}

TEST(RunDirectoryCommit, ReadOnlyRunsRefuseToCommit) {
  TempDir tmp;
  { RunDirectory(tmp / "run").commit(spec(1), writer_for(1)); }
  RunDirectory run(tmp / "run", inspect_only());
  EXPECT_ERROR_CODE(run.commit(spec(2), writer_for(2)), ErrorCode::invalid_argument);
}

// ---- recovery -------------------------------------------------------------------------------

class RunRecovery : public ::testing::Test {
 protected:
  void SetUp() override {
    RunDirectory run(path(), with_best());
    for (std::int64_t step : {1, 2, 3}) run.commit(spec(step, 1.0 / step), writer_for(step));
  }
  std::filesystem::path path() const { return tmp_ / "run"; }
  std::filesystem::path gen(std::int64_t step) const { return path() / "checkpoints" / generation_name(step); }
  TempDir tmp_;
};

TEST_F(RunRecovery, StaleStagingFilesAreRemoved) {
  write_text(path() / "checkpoints" / ".step-00000004.pt.staging-12-34", "half a file");
  write_text(path() / ".LATEST.staging-12-35", "step-0000");
  RunDirectory run(path(), with_best());
  EXPECT_EQ(run.recovery().removed_staging.size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(path() / "checkpoints" / ".step-00000004.pt.staging-12-34"));
  EXPECT_FALSE(std::filesystem::exists(path() / ".LATEST.staging-12-35"));
  EXPECT_EQ(run.latest()->step, 3);
}

TEST_F(RunRecovery, ReadOnlyOpenChangesNothingAndSaysWhatItWouldDo) {
  write_text(path() / "checkpoints" / ".step-00000004.pt.staging-12-34", "half a file");
  std::filesystem::copy_file(gen(3), gen(9));
  RunDirectory run(path(), with_best(inspect_only()));
  EXPECT_TRUE(run.recovery().read_only);
  EXPECT_EQ(run.recovery().removed_staging.size(), 1u);
  EXPECT_EQ(run.recovery().removed_uncommitted, std::vector<std::string>{"step-00000009.pt"});
  EXPECT_TRUE(std::filesystem::exists(path() / "checkpoints" / ".step-00000004.pt.staging-12-34"));
  EXPECT_TRUE(std::filesystem::exists(gen(9)));
  EXPECT_NE(run.recovery().lines().at(0).find("would remove"), std::string::npos);
}

TEST_F(RunRecovery, GenerationsNewerThanLatestAreUncommittedAndRemoved) {
  std::filesystem::copy_file(gen(3), gen(4));
  write_text(path() / "checkpoints" / "step-00000004.pt.sha256", "x");
  RunDirectory run(path(), with_best());
  EXPECT_EQ(run.recovery().removed_uncommitted, std::vector<std::string>{"step-00000004.pt"});
  EXPECT_FALSE(std::filesystem::exists(gen(4)));
  EXPECT_FALSE(std::filesystem::exists(path() / "checkpoints" / "step-00000004.pt.sha256"));
  EXPECT_EQ(run.latest()->step, 3);
  EXPECT_EQ(run.generations().size(), 3u);
}

TEST_F(RunRecovery, MalformedLatestFallsBackToTheNewestGenerationThatVerifies) {
  write_text(path() / "LATEST", "garbage");
  {
    RunDirectory run(path(), with_best());
    ASSERT_TRUE(run.recovery().latest_problem);
    EXPECT_TRUE(run.recovery().latest_rewritten);
    EXPECT_EQ(run.latest()->step, 3);
    EXPECT_EQ(read_text(path() / "LATEST"), "step-00000003.pt " + run.latest()->sha256.hex() + "\n");
  }
  EXPECT_TRUE(RunDirectory(path(), with_best()).recovery().clean());
}

TEST_F(RunRecovery, MissingLatestFallsBackToo) {
  std::filesystem::remove(path() / "LATEST");
  RunDirectory run(path(), with_best());
  EXPECT_EQ(run.recovery().latest_problem, "missing");
  EXPECT_EQ(run.latest()->step, 3);
}

TEST_F(RunRecovery, CorruptLatestTargetFallsBackToThePreviousGenerationAndIsKept) {
  {
    std::fstream file(gen(3), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    file.put('\x7f');
  }
  {
    RunDirectory run(path(), with_best());
    ASSERT_EQ(run.recovery().damaged.size(), 1u);
    EXPECT_EQ(run.recovery().damaged[0].name, "step-00000003.pt");
    EXPECT_EQ(run.recovery().damaged[0].code, ErrorCode::sha256_mismatch);
    EXPECT_EQ(run.recovery().quarantined, std::vector<std::string>{"step-00000003.pt.damaged"});
    EXPECT_EQ(run.latest()->step, 2);
    EXPECT_FALSE(std::filesystem::exists(gen(3)));
    EXPECT_TRUE(std::filesystem::exists(path() / "checkpoints" / "step-00000003.pt.damaged"))
        << "evidence is moved aside, never deleted";
    EXPECT_TRUE(std::filesystem::exists(path() / "checkpoints" / "step-00000003.pt.damaged.sha256"));
    EXPECT_EQ(read_text(path() / "LATEST").substr(0, 17), "step-00000002.pt ");
  }
  // The next open does not take the moved file for a generation, uncommitted or otherwise.
  RunDirectory again(path(), with_best());
  EXPECT_EQ(again.recovery().previously_quarantined, std::vector<std::string>{"step-00000003.pt.damaged"});
  EXPECT_TRUE(again.recovery().removed_uncommitted.empty());
  EXPECT_TRUE(std::filesystem::exists(path() / "checkpoints" / "step-00000003.pt.damaged"));
  again.commit(spec(3, 0.2), writer_for(3));
  EXPECT_EQ(again.latest()->step, 3);
}

TEST_F(RunRecovery, EveryGenerationDamagedMeansNoLatest) {
  for (std::int64_t step : {1, 2, 3}) write_text(gen(step), "PK\x05\x06 truncated");
  {
    RunDirectory run(path(), with_best());
    EXPECT_FALSE(run.latest());
    EXPECT_EQ(run.recovery().damaged.size(), 3u);
    EXPECT_EQ(run.recovery().quarantined.size(), 3u);
    EXPECT_TRUE(run.generations().empty());
  }
  RunDirectory again(path(), with_best());
  EXPECT_EQ(again.recovery().previously_quarantined.size(), 3u) << "the evidence stays visible";
}

TEST_F(RunRecovery, AGenerationBeyondTheLimitsStopsRecoveryInsteadOfFallingBack) {
  RunDirectoryOptions options = with_best();
  options.limits.max_file_bytes = 100;  // every generation is larger
  EXPECT_ERROR_CODE(RunDirectory(path(), options), ErrorCode::run_generation_unreadable);
  // Nothing was moved or rewritten.
  EXPECT_TRUE(std::filesystem::exists(gen(3)));
  RunDirectory run(path(), with_best());
  EXPECT_TRUE(run.recovery().clean());
  EXPECT_EQ(run.latest()->step, 3);
}

TEST_F(RunRecovery, UncommittedLeftoversAreRemovedUnreadAndAdoptedOnlyOnFallback) {
  std::filesystem::copy_file(gen(3), gen(5));
  write_text(path() / "LATEST", "nonsense");
  std::filesystem::remove(path() / "index.json");
  RunDirectory run(path(), with_best());
  EXPECT_EQ(run.latest()->step, 5) << "without a usable LATEST the newest verifying file is it";
  EXPECT_EQ(run.recovery().adopted.size(), 4u);
  for (const auto& g : run.generations()) EXPECT_TRUE(run.verify(g).ok) << g.name;
}

TEST(RunDirectoryStaging, OnlyNamesPublishCreatesAreStagingNames) {
  EXPECT_TRUE(io::is_staging_name(".step-00000001.pt.staging-12-345"));
  EXPECT_TRUE(io::is_staging_name(".LATEST.staging-1-2"));
  for (const char* name : {".staging-1-2", "LATEST.staging-1-2", ".x.staging-", ".x.staging-1", ".x.staging-1-",
                           ".x.staging-a-2", ".my.staging-notes", ".bashrc"}) {
    EXPECT_FALSE(io::is_staging_name(name)) << name;
  }
}

TEST_F(RunRecovery, MissingIndexIsRebuiltFromTheFilesAndSidecars) {
  const auto before = RunDirectory(path(), with_best()).generations();
  std::filesystem::remove(path() / "index.json");
  RunDirectory run(path(), with_best());
  EXPECT_EQ(run.recovery().index_problem, "missing");
  EXPECT_EQ(run.recovery().adopted.size(), 3u);
  EXPECT_TRUE(run.recovery().index_rewritten);
  ASSERT_EQ(run.generations().size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(run.generations()[i].sha256, before[i].sha256);
  EXPECT_TRUE(std::filesystem::exists(path() / "index.json"));
  for (const auto& check : run.verify_all()) EXPECT_TRUE(check.ok) << check.detail;
}

TEST_F(RunRecovery, MalformedIndexIsReportedAndRebuilt) {
  write_text(path() / "index.json", R"({"schema": "holdpoint.run-index", "schema_version": 1, "generations": [{"name": 3}]})");
  {
    RunDirectory run(path(), with_best());
    ASSERT_TRUE(run.recovery().index_problem);
    EXPECT_NE(run.recovery().index_problem->find("generations[0].name"), std::string::npos);
    EXPECT_EQ(run.generations().size(), 3u);
  }
  EXPECT_TRUE(RunDirectory(path(), with_best()).recovery().clean());
}

TEST_F(RunRecovery, IndexEntriesWithoutFilesAreDropped) {
  std::filesystem::remove(gen(1));
  RunDirectory run(path(), with_best());
  EXPECT_EQ(run.recovery().dropped_from_index, std::vector<std::string>{"step-00000001.pt"});
  EXPECT_EQ(run.generations().size(), 2u);
}

TEST_F(RunRecovery, BestNamingAnUnknownGenerationIsRebuiltFromTheMetric) {
  write_text(path() / "BEST", "step-00000077.pt " + std::string(64, 'a') + "\n");
  RunDirectory run(path(), with_best());
  ASSERT_TRUE(run.recovery().best_problem);
  EXPECT_TRUE(run.recovery().best_rewritten);
  EXPECT_EQ(run.best()->step, 3);  // loss 1/3 is the lowest
}

TEST_F(RunRecovery, ASidecarThatDisagreesFailsVerification) {
  write_text(path() / "checkpoints" / "step-00000002.pt.sha256", std::string(64, '0') + "  step-00000002.pt\n");
  RunDirectory run(path(), with_best());
  const auto check = run.verify(*run.find("step-00000002.pt"));
  EXPECT_FALSE(check.ok);
  EXPECT_EQ(check.code, ErrorCode::sha256_mismatch);
  write_text(path() / "checkpoints" / "step-00000002.pt.sha256", "nonsense\n");
  EXPECT_EQ(run.verify(*run.find("step-00000002.pt")).code, ErrorCode::run_sidecar_invalid);
}

// ---- symlinks are refused, never followed -----------------------------------------------------

TEST(RunDirectorySymlinks, ARunDirectoryThatIsASymlinkIsRefused) {
  TempDir tmp;
  { RunDirectory(tmp / "real").commit(spec(1), writer_for(1)); }
  std::filesystem::create_directory_symlink(tmp / "real", tmp / "link");
  EXPECT_ERROR_CODE(RunDirectory(tmp / "link"), ErrorCode::io_open_failed);
  EXPECT_ERROR_CODE(RunDirectory(tmp / "link", inspect_only()), ErrorCode::io_open_failed);
}

TEST(RunDirectorySymlinks, ACheckpointsSymlinkIsRefused) {
  TempDir tmp;
  std::filesystem::create_directories(tmp / "run");
  std::filesystem::create_directories(tmp / "elsewhere");
  std::filesystem::create_directory_symlink(tmp / "elsewhere", tmp / "run" / "checkpoints");
  EXPECT_ERROR_CODE(RunDirectory(tmp / "run"), ErrorCode::run_directory_invalid);
}

TEST(RunDirectorySymlinks, ASymlinkAtTheGenerationNameIsNeitherFollowedNorReplaced) {
  TempDir tmp;
  RunDirectory run(tmp / "run");
  run.commit(spec(1), writer_for(1));
  write_text(tmp / "victim", "precious");
  std::filesystem::create_symlink(tmp / "victim", tmp / "run" / "checkpoints" / "step-00000002.pt");
  EXPECT_ERROR_CODE(run.commit(spec(2), writer_for(2)), ErrorCode::io_not_regular_file);
  EXPECT_EQ(read_text(tmp / "victim"), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(tmp / "run" / "checkpoints" / "step-00000002.pt"));
  // Recovery reports it as damaged, moves the link itself aside and does not read through it.
  RunDirectory inspected(tmp / "run", inspect_only());
  ASSERT_EQ(inspected.recovery().damaged.size(), 1u);
  EXPECT_EQ(inspected.recovery().damaged[0].code, ErrorCode::io_not_regular_file);
  EXPECT_EQ(inspected.latest()->step, 1);
  EXPECT_EQ(read_text(tmp / "victim"), "precious");
}

TEST(RunDirectorySymlinks, ASymlinkedLatestIsNotFollowed) {
  TempDir tmp;
  { RunDirectory(tmp / "run").commit(spec(1), writer_for(1)); }
  const std::string latest = read_text(tmp / "run" / "LATEST");
  std::filesystem::remove(tmp / "run" / "LATEST");
  write_text(tmp / "elsewhere", latest);
  std::filesystem::create_symlink(tmp / "elsewhere", tmp / "run" / "LATEST");
  RunDirectory run(tmp / "run");
  ASSERT_TRUE(run.recovery().latest_problem);
  EXPECT_TRUE(run.recovery().latest_rewritten);
  EXPECT_FALSE(std::filesystem::is_symlink(tmp / "run" / "LATEST")) << "the link itself was replaced";
  EXPECT_EQ(read_text(tmp / "elsewhere"), latest);
}

TEST(RunDirectorySymlinks, ASymlinkedIndexIsReplacedNotFollowed) {
  TempDir tmp;
  { RunDirectory(tmp / "run").commit(spec(1), writer_for(1)); }
  const std::string index = read_text(tmp / "run" / "index.json");
  std::filesystem::remove(tmp / "run" / "index.json");
  write_text(tmp / "outside.json", index);
  std::filesystem::create_symlink(tmp / "outside.json", tmp / "run" / "index.json");
  RunDirectory run(tmp / "run");
  ASSERT_TRUE(run.recovery().index_problem);
  EXPECT_TRUE(run.recovery().index_rewritten);
  EXPECT_FALSE(std::filesystem::is_symlink(tmp / "run" / "index.json"));
  EXPECT_EQ(read_text(tmp / "outside.json"), index) << "the link's target is untouched";
  EXPECT_EQ(run.latest()->step, 1);
}

TEST(RunDirectoryLock, ASecondWriterIsRefusedAndReadersAreNot) {
  TempDir tmp;
  RunDirectory writer(tmp / "run");
  writer.commit(spec(1), writer_for(1));
  EXPECT_ERROR_CODE(RunDirectory(tmp / "run", {}), ErrorCode::run_directory_locked);
  RunDirectoryOptions explicit_posix;
  explicit_posix.file_system = &io::posix_file_system();
  EXPECT_ERROR_CODE(RunDirectory(tmp / "run", explicit_posix), ErrorCode::run_directory_locked);
  RunDirectory reader(tmp / "run", inspect_only());
  EXPECT_EQ(reader.latest()->step, 1);
}

// ---- retention --------------------------------------------------------------------------------

std::vector<std::int64_t> steps_of(const std::vector<GenerationInfo>& generations) {
  std::vector<std::int64_t> out;
  for (const auto& g : generations) out.push_back(g.step);
  return out;
}

TEST(RunRetention, KeepLastEveryAndBestCombine) {
  TempDir tmp;
  RunDirectory run(tmp / "run", with_best());
  // Loss is lowest at step 3, then 7.
  const std::map<std::int64_t, double> loss = {{1, 0.9}, {2, 0.8}, {3, 0.1}, {4, 0.7}, {5, 0.6},
                                               {6, 0.5}, {7, 0.2}, {8, 0.4}, {9, 0.35}, {10, 0.3}};
  for (const auto& [step, value] : loss) run.commit(spec(step, value), writer_for(step));
  const GcPlan plan = run.plan_gc({.keep_last = 2, .keep_every = 4, .keep_best = 2});
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"step-00000001.pt", "step-00000002.pt", "step-00000005.pt",
                                                   "step-00000006.pt"}));
  const auto removed = run.collect_garbage({.keep_last = 2, .keep_every = 4, .keep_best = 2});
  EXPECT_EQ(removed, plan.remove);
  EXPECT_EQ(steps_of(run.generations()), (std::vector<std::int64_t>{3, 4, 7, 8, 9, 10}));
  for (const auto& name : removed) {
    EXPECT_FALSE(std::filesystem::exists(tmp / "run" / "checkpoints" / name));
    EXPECT_FALSE(std::filesystem::exists(tmp / "run" / "checkpoints" / (name + ".sha256")));
  }
  RunDirectory reopened(tmp / "run", with_best(inspect_only()));
  EXPECT_TRUE(reopened.recovery().clean());
  EXPECT_EQ(steps_of(reopened.generations()), (std::vector<std::int64_t>{3, 4, 7, 8, 9, 10}));
}

TEST(RunRetention, DryRunDeletesNothing) {
  TempDir tmp;
  RunDirectory run(tmp / "run");
  for (std::int64_t step = 1; step <= 4; ++step) run.commit(spec(step), writer_for(step));
  EXPECT_EQ(run.collect_garbage({.keep_last = 1}, true).size(), 3u);
  EXPECT_EQ(run.generations().size(), 4u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp / "run" / "checkpoints"), {}), 8);
}

TEST(RunRetention, BestIsNeverDeletedEvenWithKeepLastOne) {
  TempDir tmp;
  RunDirectoryOptions options = with_best();
  options.retention = {.keep_last = 1};
  RunDirectory run(tmp / "run", options);
  run.commit(spec(1, 0.1), writer_for(1));
  for (std::int64_t step = 2; step <= 5; ++step) {
    const auto result = run.commit(spec(step, 1.0), writer_for(step));
    EXPECT_EQ(result.deleted.size(), step == 2 ? 0u : 1u);
  }
  EXPECT_EQ(steps_of(run.generations()), (std::vector<std::int64_t>{1, 5}));
  EXPECT_EQ(run.best()->step, 1);
  EXPECT_EQ(run.latest()->step, 5);
}

TEST(RunRetention, ForeignFilesAreNeverTouched) {
  TempDir tmp;
  RunDirectoryOptions options;
  options.retention = {.keep_last = 1};
  RunDirectory run(tmp / "run", options);
  run.commit(spec(1), writer_for(1));
  for (const char* name : {"notes.txt", "step-1.pt", "step-00000001.pth", "model.safetensors"}) {
    write_text(tmp / "run" / "checkpoints" / name, name);
  }
  for (std::int64_t step = 2; step <= 4; ++step) run.commit(spec(step), writer_for(step));
  for (const char* name : {"notes.txt", "step-1.pt", "step-00000001.pth", "model.safetensors"}) {
    EXPECT_EQ(read_text(tmp / "run" / "checkpoints" / name), name);
  }
  EXPECT_EQ(steps_of(run.generations()), std::vector<std::int64_t>{4});
}

// ---- fault sweep, crash sweep, property test (fault-injecting file system) ------------------

constexpr const char* kRun = "/run";

RunDirectoryOptions sweep_options(FaultFileSystem& fs) {
  RunDirectoryOptions options = with_best();
  options.file_system = &fs;
  options.retention = {.keep_last = 1};
  return options;
}

std::vector<std::string> staging_left(FaultFileSystem& fs) {
  std::vector<std::string> out;
  for (const auto& dir : {std::string(kRun), std::string(kRun) + "/checkpoints"}) {
    if (!fs.exists(dir)) continue;
    for (const auto& name : fs.list(dir)) {
      if (io::is_staging_name(name)) out.push_back(dir + "/" + name);
    }
  }
  return out;
}

// After any failure or crash: a fresh open yields the previous generation or
// the new one, byte for byte, and it verifies; never nothing, never a mixture;
// no staging file survives recovery. Returns the recovered step.
std::int64_t check_recovered(FaultFileSystem& fs, std::int64_t previous, std::int64_t next) {
  RunDirectory run(kRun, sweep_options(fs));
  const auto latest = run.latest();
  EXPECT_TRUE(latest.has_value()) << "a committed generation existed; recovery must find one";
  if (!latest) return -1;
  EXPECT_TRUE(latest->step == previous || latest->step == next) << latest->step;
  const std::string bytes = fs.contents(std::string(kRun) + "/checkpoints/" + latest->name);
  EXPECT_EQ(bytes, checkpoint_bytes(latest->step)) << "the recovered generation must be the whole file it was";
  const GenerationCheck check = run.verify(*latest);
  EXPECT_TRUE(check.ok) << check.detail;
  EXPECT_EQ(fs.contents(std::string(kRun) + "/LATEST"), latest->name + " " + latest->sha256.hex() + "\n");
  EXPECT_TRUE(staging_left(fs).empty()) << ::testing::PrintToString(staging_left(fs));
  for (const auto& g : run.generations()) EXPECT_TRUE(run.verify(g).ok) << g.name;
  if (const auto best = run.best()) {
    EXPECT_TRUE(fs.exists(std::string(kRun) + "/checkpoints/" + best->name));
  }
  // The recovered run accepts the next save.
  const std::int64_t after = std::max(latest->step, next) + 1;
  run.commit(spec(after, 0.01), writer_for(after));
  EXPECT_TRUE(RunDirectory(kRun, sweep_options(fs)).recovery().clean());
  return latest->step;
}

void seed_run(FaultFileSystem& fs) {
  RunDirectory run(kRun, sweep_options(fs));
  run.commit(spec(1, 0.5), writer_for(1));
  run.commit(spec(2, 0.9), writer_for(2));  // BEST stays at 1, retention keeps 1 and 2
}

struct SweepCase {
  FaultKind kind;
  bool persistent;
};

class RunFaultSweep : public ::testing::TestWithParam<SweepCase> {};

// SQLite style: fail the N-th file operation of a commit, N = 1, 2, ...,
// until the commit runs past every fault.
TEST_P(RunFaultSweep, RecoveryYieldsThePreviousOrTheNewGenerationWhole) {
  const SweepCase c = GetParam();
  std::uint64_t failures = 0;
  std::set<std::int64_t> outcomes;
  bool completed = false;
  for (std::uint64_t n = 1; n < 400 && !completed; ++n) {
    SCOPED_TRACE(n);
    FaultFileSystem fs(n);
    seed_run(fs);
    bool threw = false;
    {
      RunDirectory run(kRun, sweep_options(fs));
      fs.reset_counter();
      fs.fail_at(n, c.kind, c.persistent);
      try {
        run.commit(spec(3, 0.1), writer_for(3));
      } catch (const Error& error) {
        threw = true;
        ++failures;
        EXPECT_NE(error_code_name(error.code()).substr(0, 3), "unk");
      }
      completed = fs.operation_log().size() < n;
      fs.clear_faults();
      if (threw && run.latest()->step == 2) {
        // The same object retries in-process after the fault cleared.
        EXPECT_NO_THROW(run.commit(spec(3, 0.1), writer_for(3)));
        EXPECT_EQ(RunDirectory(kRun, sweep_options(fs)).latest()->step, 3);
        continue;
      }
    }
    if (!threw) {
      fs.crash();
      EXPECT_EQ(check_recovered(fs, 3, 3), 3) << "commit returned, so step 3 is durable";
    } else {
      outcomes.insert(check_recovered(fs, 2, 3));
    }
  }
  EXPECT_TRUE(completed);
  EXPECT_GE(failures, 20u);
}

// The same, reopening without an in-process retry: a fresh process after the
// failure (the crash after a failure loses what was not synced).
TEST_P(RunFaultSweep, AFreshProcessAfterTheFailureRecovers) {
  const SweepCase c = GetParam();
  std::set<std::int64_t> outcomes;
  bool completed = false;
  for (std::uint64_t n = 1; n < 400 && !completed; ++n) {
    SCOPED_TRACE(n);
    FaultFileSystem fs(n);
    seed_run(fs);
    bool threw = false;
    {
      RunDirectory run(kRun, sweep_options(fs));
      fs.reset_counter();
      fs.fail_at(n, c.kind, c.persistent);
      try {
        run.commit(spec(3, 0.1), writer_for(3));
      } catch (const Error&) {
        threw = true;
      }
      completed = fs.operation_log().size() < n;
      fs.clear_faults();
    }
    fs.crash();
    const std::int64_t step = check_recovered(fs, threw ? 2 : 3, 3);
    if (!threw) {
      EXPECT_EQ(step, 3);
    }
    outcomes.insert(step);
  }
  EXPECT_TRUE(completed);
  EXPECT_EQ(outcomes, (std::set<std::int64_t>{2, 3})) << "both outcomes occur over the sweep";
}

INSTANTIATE_TEST_SUITE_P(KindsAndPersistence, RunFaultSweep,
                         ::testing::Values(SweepCase{FaultKind::io_error, false}, SweepCase{FaultKind::io_error, true},
                                           SweepCase{FaultKind::no_space, false}, SweepCase{FaultKind::no_space, true},
                                           SweepCase{FaultKind::quota_exceeded, false},
                                           SweepCase{FaultKind::quota_exceeded, true}),
                         [](const auto& info) {
                           const char* kind = info.param.kind == FaultKind::io_error   ? "EIO"
                                              : info.param.kind == FaultKind::no_space ? "ENOSPC"
                                                                                       : "EDQUOT";
                           return std::string(kind) + (info.param.persistent ? "_persistent" : "_transient");
                         });

class RunCrashSweep : public ::testing::TestWithParam<CrashMode> {};

// leveldb style: crash after every operation of a commit (with BEST and
// retention), dropping or tearing unsynced data and undoing unsynced
// directory entries, then reboot and reopen.
TEST_P(RunCrashSweep, RecoveryYieldsThePreviousOrTheNewGenerationWhole) {
  std::set<std::int64_t> outcomes;
  bool completed = false;
  std::uint64_t crashes = 0;
  for (std::uint64_t n = 1; n < 400 && !completed; ++n) {
    SCOPED_TRACE(n);
    FaultFileSystem fs(n);
    seed_run(fs);
    {
      RunDirectory run(kRun, sweep_options(fs));
      fs.reset_counter();
      fs.crash_after(n, GetParam());
      try {
        run.commit(spec(3, 0.1), writer_for(3));
        completed = true;
        fs.clear_faults();
        fs.crash(GetParam());  // power cut right after commit() returned
      } catch (const SimulatedCrash&) {
        ++crashes;
      }
    }
    fs.restart();
    const std::int64_t step = check_recovered(fs, completed ? 3 : 2, 3);
    outcomes.insert(step);
  }
  EXPECT_TRUE(completed);
  EXPECT_GE(crashes, 30u);
  EXPECT_EQ(outcomes, (std::set<std::int64_t>{2, 3}));
}

INSTANTIATE_TEST_SUITE_P(Modes, RunCrashSweep, ::testing::Values(CrashMode::drop_unsynced, CrashMode::tear_unsynced),
                         [](const auto& info) {
                           return std::string(info.param == CrashMode::drop_unsynced ? "drop" : "tear");
                         });

// Crashing while recovery itself runs (after a crash mid-commit) is safe too.
TEST(RunCrashDuringRecovery, RecoveryIsRestartable) {
  for (std::uint64_t first = 5; first < 80; first += 11) {
    for (std::uint64_t second = 1; second < 16; ++second) {
      SCOPED_TRACE(::testing::Message() << first << "/" << second);
      FaultFileSystem fs(first * 100 + second);
      seed_run(fs);
      {
        RunDirectory run(kRun, sweep_options(fs));
        fs.reset_counter();
        fs.crash_after(first);
        try {
          run.commit(spec(3, 0.1), writer_for(3));
        } catch (const SimulatedCrash&) {
        }
      }
      fs.restart();
      fs.reset_counter();
      fs.crash_after(second);
      try {
        RunDirectory recovering(kRun, sweep_options(fs));
      } catch (const SimulatedCrash&) {
      }
      fs.clear_faults();
      fs.restart();
      check_recovered(fs, 2, 3);
    }
  }
}

// Random sequences of commits (with metrics), retention and reopenings (some
// after a crash at a random point) never delete LATEST, BEST or the newest
// verified generation, and never touch a foreign file.
TEST(RunRetentionProperty, RandomSequencesKeepLatestBestAndTheNewestVerifiedGeneration) {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937_64 random(seed);
    FaultFileSystem fs(seed);
    fs.write_file(std::string(kRun) + "/checkpoints/notes.txt", "mine");
    fs.write_file(std::string(kRun) + "/checkpoints/step-7.pt", "not a generation name");
    RunDirectoryOptions options = with_best();
    options.file_system = &fs;
    auto run = std::make_unique<RunDirectory>(kRun, options);
    std::int64_t step = 0;
    std::optional<std::int64_t> committed_latest;
    for (int op = 0; op < 60; ++op) {
      const auto choice = random() % 10;
      if (choice < 6) {
        step += 1 + static_cast<std::int64_t>(random() % 3);
        const double loss = static_cast<double>(random() % 1000) / 1000.0;
        run->commit(spec(step, loss), writer_for(step));
        committed_latest = step;
      } else if (choice < 8) {
        RetentionPolicy policy;
        policy.keep_last = 1 + random() % 3;
        policy.keep_every = static_cast<std::int64_t>(random() % 4) * 5;
        policy.keep_best = random() % 3;
        const GcPlan plan = run->plan_gc(policy);
        const auto latest = run->latest();
        const auto best = run->best();
        for (const auto& name : plan.remove) {
          EXPECT_NE(name, latest->name);
          if (best) {
            EXPECT_NE(name, best->name);
          }
        }
        run->collect_garbage(policy, random() % 4 == 0);
      } else if (choice < 9) {
        run.reset();
        run = std::make_unique<RunDirectory>(kRun, options);
      } else {
        // A crash at a random point of the next commit, then a reboot.
        run.reset();
        run = std::make_unique<RunDirectory>(kRun, options);
        fs.reset_counter();
        fs.crash_after(1 + random() % 60, random() % 2 ? CrashMode::drop_unsynced : CrashMode::tear_unsynced);
        const std::int64_t next = step + 1;
        try {
          run->commit(spec(next, 0.5), writer_for(next));
          committed_latest = next;
          fs.clear_faults();
        } catch (const SimulatedCrash&) {
        }
        step = next;
        run.reset();
        fs.restart();
        run = std::make_unique<RunDirectory>(kRun, options);
        committed_latest = run->latest() ? std::optional(run->latest()->step) : std::nullopt;
      }
      // Invariants after every operation.
      const auto latest = run->latest();
      ASSERT_EQ(latest.has_value(), committed_latest.has_value());
      if (!latest) continue;
      EXPECT_EQ(latest->step, *committed_latest);
      EXPECT_EQ(latest->step, run->generations().back().step) << "LATEST is the newest committed generation";
      EXPECT_TRUE(run->verify(*latest).ok);
      if (const auto best = run->best()) {
        EXPECT_TRUE(fs.exists(std::string(kRun) + "/checkpoints/" + best->name));
        for (const auto& g : run->generations()) {
          if (const auto loss = g.metric("loss")) {
            EXPECT_LE(*best->metric("loss"), *loss);
          }
        }
      }
      for (const auto& g : run->generations()) EXPECT_TRUE(fs.exists(std::string(kRun) + "/checkpoints/" + g.name));
    }
    EXPECT_EQ(fs.contents(std::string(kRun) + "/checkpoints/notes.txt"), "mine");
    EXPECT_EQ(fs.contents(std::string(kRun) + "/checkpoints/step-7.pt"), "not a generation name");
  }
}

}  // namespace
}  // namespace holdpoint
