// Export of a run directory (holdpoint/run/export.h): what DEST holds after a
// successful export, and the failure contract the CLI builds its exit codes
// and messages on (tests/python/test_cli_run.py covers the CLI's output).
#include "holdpoint/run/export.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/schema/manifest.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// A generation that verifies: a holdpoint manifest and the step.
RunDirectory::Writer writer_for(std::int64_t step) {
  return [step](io::ByteSink& sink) {
    Dict root;
    Manifest manifest;
    manifest.semantic_identity = "run-export-test";
    root.insert(std::string(kManifestKey), manifest.to_value());
    root.insert("step", Value::integer(step));
    format::write_pt(sink, Value::dict(std::move(root)));
  };
}

RunDirectoryOptions read_only() {
  RunDirectoryOptions options;
  options.create = false;
  options.recover = false;
  return options;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs export_run, which must throw ExportError; returns it.
ExportError export_error(const std::filesystem::path& run, const std::filesystem::path& destination,
                         const ExportOptions& options = {}) {
  try {
    export_run(run, destination, options);
  } catch (const ExportError& error) {
    return error;
  }
  ADD_FAILURE() << "export_run(" << run << ", " << destination << ") did not throw ExportError";
  return ExportError(Error(ErrorCode::invalid_argument, "no error"), false, false);
}

class RunExport : public ::testing::Test {
 protected:
  // Steps 1, 2, 3 with losses 0.9, 0.5, 0.7: LATEST step 3, BEST step 2.
  void SetUp() override {
    RunDirectory run(run_path(), options());
    const double losses[] = {0.9, 0.5, 0.7};
    for (std::int64_t step = 1; step <= 3; ++step) {
      GenerationSpec spec;
      spec.step = step;
      spec.metrics = {{"loss", losses[step - 1]}};
      run.commit(spec, writer_for(step));
    }
  }
  static RunDirectoryOptions options() {
    RunDirectoryOptions options;
    options.best_metric = BestMetric{"loss", false};
    return options;
  }
  std::filesystem::path run_path() const { return tmp_ / "run"; }
  std::filesystem::path dest_path() const { return tmp_ / "dest"; }
  TempDir tmp_;
};

TEST_F(RunExport, AllCopiesEveryGenerationBothPointersAndWritesTheProof) {
  ExportOptions options;
  options.selection = ExportSelection::all;
  options.command_line = {"holdpoint", "export", "--all"};
  const ExportResult result = export_run(run_path(), dest_path(), options);

  ASSERT_EQ(result.generations.size(), 3u);
  EXPECT_EQ(result.latest.step, 3);
  ASSERT_TRUE(result.best);
  EXPECT_EQ(result.best->step, 2);
  EXPECT_TRUE(result.skipped.empty());
  EXPECT_EQ(read_text(dest_path() / kExportProofFile), result.proof_json);
  EXPECT_TRUE(std::filesystem::exists(dest_path() / kExportLoadingFile));

  const auto proof = nlohmann::ordered_json::parse(result.proof_json);
  EXPECT_EQ(proof["selection"], "all");
  EXPECT_EQ(proof["command"], nlohmann::ordered_json(options.command_line));
  EXPECT_EQ(proof["pointers"]["LATEST"], "step-00000003.pt");
  EXPECT_EQ(proof["pointers"]["BEST"], "step-00000002.pt");
  EXPECT_EQ(proof["recovered"]["step"], 3);
  EXPECT_EQ(proof["generations"][0], nlohmann::ordered_json::parse(to_json(result.generations[0])));

  // DEST is a run directory that needs no recovery, with the same files.
  RunDirectory exported(dest_path(), read_only());
  EXPECT_TRUE(exported.recovery().clean()) << ::testing::PrintToString(exported.recovery().lines());
  EXPECT_EQ(exported.latest()->sha256, RunDirectory(run_path(), read_only()).latest()->sha256);
}

TEST_F(RunExport, BestBecomesTheLatestOfTheExport) {
  ExportOptions options;
  options.selection = ExportSelection::best;
  const ExportResult result = export_run(run_path(), dest_path(), options);
  ASSERT_EQ(result.generations.size(), 1u);
  EXPECT_EQ(result.latest.step, 2);
  ASSERT_TRUE(result.best);
  EXPECT_EQ(result.best->step, 2);
}

TEST_F(RunExport, AllSkipsAnOlderGenerationThatDoesNotVerifyAndListsItsCode) {
  const auto older = run_path() / "checkpoints" / generation_name(1);
  std::string bytes = read_text(older);
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(older, std::ios::binary | std::ios::trunc) << bytes;

  ExportOptions options;
  options.selection = ExportSelection::all;
  const ExportResult result = export_run(run_path(), dest_path(), options);
  ASSERT_EQ(result.generations.size(), 2u);
  EXPECT_EQ(result.generations[0].step, 2);
  ASSERT_EQ(result.skipped.size(), 1u);
  EXPECT_EQ(result.skipped[0].name, generation_name(1));
  EXPECT_EQ(result.skipped[0].code, ErrorCode::sha256_mismatch);
}

TEST_F(RunExport, AMissingRunIsSourceUnopenedAndTouchesNothing) {
  const ExportError error = export_error(tmp_ / "no-such-run", dest_path());
  EXPECT_TRUE(error.source_unopened());
  EXPECT_FALSE(error.destination_touched());
  EXPECT_FALSE(std::filesystem::exists(dest_path()));
}

TEST_F(RunExport, ANonEmptyDestinationIsRefusedUntouched) {
  std::filesystem::create_directory(dest_path());
  std::ofstream(dest_path() / "notes.txt") << "mine";
  const ExportError error = export_error(run_path(), dest_path());
  EXPECT_EQ(error.code(), ErrorCode::export_destination_invalid);
  EXPECT_TRUE(is_environment_error(error.code()));
  EXPECT_FALSE(error.source_unopened());
  EXPECT_FALSE(error.destination_touched());
  EXPECT_EQ(read_text(dest_path() / "notes.txt"), "mine");
}

TEST_F(RunExport, ADamagedLatestIsNeverExported) {
  const auto latest = run_path() / "checkpoints" / generation_name(3);
  std::string bytes = read_text(latest);
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(latest, std::ios::binary | std::ios::trunc) << bytes;

  for (const ExportSelection selection : {ExportSelection::latest, ExportSelection::all}) {
    ExportOptions options;
    options.selection = selection;
    const ExportError error = export_error(run_path(), dest_path(), options);
    EXPECT_EQ(error.code(), ErrorCode::run_pointer_invalid) << export_selection_name(selection);
    EXPECT_FALSE(error.source_unopened());
    EXPECT_FALSE(error.destination_touched());
    EXPECT_FALSE(std::filesystem::exists(dest_path()));
  }
}

TEST(RunJson, GenerationAndCheckFieldsInTheDocumentedOrder) {
  GenerationInfo g;
  g.name = "step-00000005.pt";
  g.step = 5;
  g.epoch = 1;
  g.size = 1234;
  g.saved_at = "2026-01-31T12:00:00Z";
  g.metrics = {{"loss", 0.25}};
  EXPECT_EQ(to_json(g), R"({"name":"step-00000005.pt","step":5,"epoch":1,"kind":"resume","size":1234,"sha256":")" +
                            g.sha256.hex() +
                            R"(","saved_at":"2026-01-31T12:00:00Z","metrics":{"loss":0.25},"world_size":0})");

  const GenerationCheck damaged{"step-00000005.pt", false, ErrorCode::sha256_mismatch, "differs"};
  EXPECT_EQ(to_json(damaged), R"({"name":"step-00000005.pt","ok":false,"code":"sha256_mismatch","detail":"differs"})");
  EXPECT_EQ(to_text(damaged), "sha256_mismatch: differs");
  const GenerationCheck ok{"step-00000005.pt", true, std::nullopt, ""};
  EXPECT_EQ(to_json(ok), R"({"name":"step-00000005.pt","ok":true,"code":null,"detail":""})");
  EXPECT_EQ(to_text(ok), "ok");
}

}  // namespace
}  // namespace holdpoint
