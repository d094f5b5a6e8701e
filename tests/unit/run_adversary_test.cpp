// A run directory against a file-system adversary (issue 35): at each name the
// run expects to be a file (LATEST, BEST, index.json, a generation, its
// sidecar, its signature) something else is planted: a FIFO, a symlink inside
// the run, a symlink leaving it, a directory, a character device, a hard link
// to a file outside. Every entry point (a recovering open, a read-only open,
// verify, load, export, verify_signatures, each with and without a trust
// policy) must come back promptly (a child process, killed if it blocks), and
// nothing outside the run may be read as its own, changed or removed.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/export.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"
#include "support/generation_writer.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

RunDirectory::Writer writer_for(std::int64_t step) { return testing::generation_writer(step, "run-adversary-test"); }

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Regular files under `root`, by relative path, with their bytes; other
// entries by their kind. Links are never followed.
std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const auto status = it->symlink_status();
    const std::string name = fs::relative(it->path(), root).string();
    if (name.ends_with(".holdpoint-lock")) continue;
    if (fs::is_symlink(status)) out[name] = "symlink -> " + fs::read_symlink(it->path()).string();
    else if (fs::is_regular_file(status)) out[name] = read_bytes(it->path());
    else if (!fs::is_directory(status)) out[name] = "special";
  }
  return out;
}

struct Plant {
  std::string kind;
  std::function<void(const fs::path& at, const fs::path& run, const fs::path& outside)> make;
};

const std::vector<Plant>& plants() {
  static const std::vector<Plant> all = {
      {"a FIFO", [](const fs::path& at, const fs::path&, const fs::path&) { ASSERT_EQ(::mkfifo(at.c_str(), 0644), 0); }},
      {"a symlink inside the run",
       [](const fs::path& at, const fs::path& run, const fs::path&) {
         fs::create_symlink(fs::relative(run / "checkpoints/step-00000001.pt", at.parent_path()), at);
       }},
      {"a symlink leaving the run",
       [](const fs::path& at, const fs::path&, const fs::path& outside) { fs::create_symlink(outside / "secret.pt", at); }},
      {"a directory", [](const fs::path& at, const fs::path&, const fs::path&) { fs::create_directory(at); }},
      {"a character device",
       [](const fs::path& at, const fs::path&, const fs::path&) {
         ASSERT_EQ(::mknod(at.c_str(), S_IFCHR | 0644, ::makedev(1, 5)), 0);  // /dev/zero's numbers
       }},
      {"a hard link to a file outside",
       [](const fs::path& at, const fs::path&, const fs::path& outside) { fs::create_hard_link(outside / "secret.pt", at); }},
  };
  return all;
}

const std::vector<std::string>& positions() {
  static const std::vector<std::string> all = {
      "LATEST", "BEST", "index.json", "LATEST.sig", "index.json.sig",
      "checkpoints/step-00000003.pt",  // LATEST's generation
      "checkpoints/step-00000002.pt", "checkpoints/step-00000002.pt.sha256", "checkpoints/step-00000003.pt.sig",
      "checkpoints/step-00000004.pt",  // newer than LATEST: recovery's to remove
  };
  return all;
}

class RunAdversary : public ::testing::TestWithParam<std::string> {};

TEST_P(RunAdversary, EveryEntryPointReturnsPromptlyAndNothingOutsideIsTouched) {
  const std::string position = GetParam();
  for (const Plant& plant : plants()) {
    SCOPED_TRACE(plant.kind + " at " + position);
    TempDir tmp;
    const fs::path run = tmp / "run";
    const fs::path outside = tmp / "outside";
    fs::create_directories(outside);
    const auto key = std::make_shared<const SigningKey>(SigningKey::generate(SignatureAlgorithm::ed25519));
    {
      RunDirectoryOptions options;
      options.signing_key = key;
      options.best_metric = BestMetric{"loss", false};
      RunDirectory writer(run, options);
      for (int step = 1; step <= 3; ++step) {
        GenerationSpec spec;
        spec.step = step;
        spec.metrics = {{"loss", step == 2 ? 0.1 : 1.0}};
        writer.commit(spec, writer_for(step));
      }
    }
    // A valid checkpoint of another run, outside: never to be read as this run's.
    {
      io::MemorySink sink;
      writer_for(99)(sink);
      std::ofstream(outside / "secret.pt", std::ios::binary)
          .write(reinterpret_cast<const char*>(sink.bytes().data()), static_cast<std::streamsize>(sink.bytes().size()));
    }
    const fs::path at = run / position;
    fs::remove(at);
    plant.make(at, run, outside);
    const auto outside_before = tree(outside);
    TrustPolicy trust;
    trust.keys.push_back(key->verifying_key());

    const auto loaded_step = [](const LoadedMapping& mapping) {
      return std::to_string(mapping.root.as_dict().at("payload").as_tensor().contiguous_bytes().at(0) == std::byte{99}
                                ? 99
                                : 0);
    };
    const std::vector<std::pair<std::string, std::function<std::string()>>> entry_points = {
        {"read-only open, verify_all, load LATEST", [&] {
           RunDirectoryOptions options;
           options.recover = false;
           RunDirectory reader(run, options);
           for (const auto& check : reader.verify_all()) (void)check;
           return reader.latest() ? loaded_step(reader.load(*reader.latest())) : std::string("no latest");
         }},
        {"trusting read-only open, verify_signatures, load", [&] {
           RunDirectoryOptions options;
           options.recover = false;
           options.trust = trust;
           RunDirectory reader(run, options);
           (void)reader.verify_signatures(trust);
           return reader.latest() ? loaded_step(reader.load(*reader.latest())) : std::string("no latest");
         }},
        {"export LATEST", [&] {
           ExportOptions options;
           (void)export_run(run, tmp / "exported", options);
           return std::string("ok");
         }},
        {"trusting recovering open, load", [&] {
           RunDirectoryOptions options;
           options.trust = trust;
           RunDirectory reader(run, options);
           return reader.latest() ? loaded_step(reader.load(*reader.latest())) : std::string("no latest");
         }},
        {"recovering open, load", [&] {
           RunDirectory reader(run);
           return reader.latest() ? loaded_step(reader.load(*reader.latest())) : std::string("no latest");
         }},
    };
    for (const auto& [what, body] : entry_points) {
      SCOPED_TRACE(what);
      const std::string result = testing::outcome_in_child(body, 20);
      EXPECT_NE(result, "timeout");
      EXPECT_NE(result, "99") << "a checkpoint outside the run was loaded as its own";
      EXPECT_FALSE(result.starts_with("another exception")) << result;
      EXPECT_EQ(tree(outside), outside_before) << "something outside the run changed";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Positions, RunAdversary, ::testing::ValuesIn(positions()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name;
                           for (const char c : info.param) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace holdpoint
