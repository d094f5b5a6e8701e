// Resuming in place (ResumeMemory::in_place, docs/resume-contract.md): the
// file is verified in one pass and its large tensors copied straight into
// live memory in a second. The result must be bit-identical to the private
// copy's; every refusal and every failure must leave the live state as it was,
// including a file changed between the passes and a failure after the bytes
// were written.
#include <fcntl.h>
#include <unistd.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>

#include <fstream>

#include "checkpoint/in_place.h"
#include "format/resume_scan.h"
#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// Counters whose validate can run an action: the moment between the two
// passes, after every check and before any byte moves.
class Counters final : public Component {
 public:
  const std::string& name() const override { return name_; }
  Value capture(CaptureMode) const override {
    Dict d;
    d.insert("global_step", Value::integer(step));
    return Value::dict(std::move(d));
  }
  void validate(const Value& state) const override {
    if (!state.is_dict() || !state.as_dict().find("global_step")) throw Error(ErrorCode::state_key_missing, "counters");
    if (between_passes) between_passes();
  }
  void apply(const Value& state) override {
    if (explode) throw std::runtime_error("injected failure after the tensors were written");
    step = state.as_dict().at("global_step").as_int();
  }
  std::int64_t step = 0;
  bool explode = false;
  std::function<void()> between_passes;

 private:
  std::string name_ = "progress";
};

// A model with a 24 MiB weight (absent from the first pass; with Adam's two
// moments the second pass reads 72 MiB, on two threads) and small tensors
// (kept), and Adam over it.
struct Trainee {
  explicit Trainee(std::uint64_t seed)
      : model([seed] {
          at::manual_seed(seed);
          return torch::nn::Sequential(torch::nn::Linear(4096, 1536), torch::nn::Linear(1536, 16));
        }()),
        adam(model->parameters(), torch::optim::AdamOptions(1e-3)),
        model_state(*model),
        optimizer_state("optimizer", adam) {
    state.add(model_state).add(optimizer_state).add(counters);
    state.set_semantic_identity("in-place-test");
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      adam.zero_grad();
      model->forward(at::randn({8, 4096})).pow(2).sum().backward();
      adam.step();
      ++counters.step;
    }
  }
  // Everything a resume restores, as one Value (tensors copied).
  Value snapshot() const {
    Dict d;
    d.insert("model", model_state.capture(CaptureMode::copy));
    d.insert("optimizer", optimizer_state.capture(CaptureMode::copy));
    d.insert("progress", counters.capture(CaptureMode::copy));
    return Value::dict(std::move(d));
  }
  torch::nn::Sequential model;
  torch::optim::Adam adam;
  ModuleState model_state;
  OptimizerState optimizer_state;
  Counters counters;
  TrainingState state;
};

CheckpointLoadOptions in_place() {
  CheckpointLoadOptions options;
  options.memory = ResumeMemory::in_place;
  return options;
}

CheckpointLoadOptions private_copy() {
  CheckpointLoadOptions options;
  options.memory = ResumeMemory::private_copy;
  return options;
}

std::filesystem::path saved_run(const TempDir& dir, int steps = 3) {
  Trainee source(1);
  source.train(steps);
  const auto path = dir / "ckpt.pt";
  source.state.save(path);
  return path;
}

// Overwrites one byte at `offset` in place (same inode, same size).
void poke(const std::filesystem::path& path, std::uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  byte = static_cast<char>(byte ^ 0x5a);
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

// The offset of some byte inside the largest storage record.
std::uint64_t inside_largest_record(const std::filesystem::path& path) {
  const LoadedMapping mapping = load_checkpoint_mapping(path);
  const RecordInfo* largest = nullptr;
  for (const RecordInfo& record : mapping.records) {
    if (!largest || record.size > largest->size) largest = &record;
  }
  return largest->offset + largest->size / 2;
}

TEST(ResumeInPlace, FreshProcessResumeIsBitIdenticalToThePrivateCopy) {
  TempDir dir;
  const auto path = saved_run(dir);
  Trainee copied(7);
  const LoadReport copy_report = copied.state.load_checkpoint(path, private_copy());
  EXPECT_FALSE(copy_report.in_place);
  Trainee streamed(8);  // other weights, no optimizer state yet: a fresh process
  const LoadReport report = streamed.state.load_checkpoint(path, in_place());
  EXPECT_TRUE(report.in_place);
  EXPECT_GE(report.bytes_journaled, 4096u * 1536 * 4) << "the model's weights were not written in place";
  EXPECT_EQ(report.sha256, copy_report.sha256);
  EXPECT_EQ(describe_difference(copied.snapshot(), streamed.snapshot()), "");
  EXPECT_EQ(streamed.counters.step, 3);
  // And training goes on identically.
  at::manual_seed(5);
  copied.train(2);
  at::manual_seed(5);
  streamed.train(2);
  EXPECT_EQ(describe_difference(copied.snapshot(), streamed.snapshot()), "");
}

TEST(ResumeInPlace, ResumeIntoARunningProcessReplacesItsOptimizerState) {
  TempDir dir;
  const auto path = saved_run(dir, 4);
  Trainee copied(7);
  copied.train(2);
  copied.state.load_checkpoint(path, private_copy());
  Trainee streamed(7);
  streamed.train(2);
  streamed.state.load_checkpoint(path, in_place());
  EXPECT_EQ(describe_difference(copied.snapshot(), streamed.snapshot()), "");
}

TEST(ResumeInPlace, WithAnExpectedDigestTheComponentDigestsAreNotRecomputed) {
  TempDir dir;
  const auto path = saved_run(dir);
  CheckpointLoadOptions options = in_place();
  options.expected_sha256 = read_sha256_sidecar(path);
  Trainee copied(7);
  copied.state.load_checkpoint(path, private_copy());
  Trainee streamed(8);
  EXPECT_TRUE(streamed.state.load_checkpoint(path, options).in_place);
  EXPECT_EQ(describe_difference(copied.snapshot(), streamed.snapshot()), "");
}

TEST(ResumeInPlace, AutomaticChoosesThePrivateCopyWhereItFits) {
  TempDir dir;
  const auto path = saved_run(dir);
  ASSERT_LT(std::filesystem::file_size(path), kInPlaceResumeBytes);
  Trainee target(8);
  EXPECT_FALSE(target.state.load_checkpoint(path).in_place);
  EXPECT_FALSE(target.state.resumes_in_place(kInPlaceResumeBytes - 1, ResumeMemory::automatic));
  EXPECT_FALSE(target.state.resumes_in_place(kInPlaceResumeBytes, ResumeMemory::automatic))
      << "a 256 MiB file fits in this machine's memory";
  EXPECT_TRUE(target.state.resumes_in_place(available_memory_bytes(), ResumeMemory::automatic));
  EXPECT_TRUE(target.state.resumes_in_place(1, ResumeMemory::in_place));
  EXPECT_FALSE(target.state.resumes_in_place(std::uint64_t{1} << 50, ResumeMemory::private_copy));
}

TEST(ResumeInPlace, AvailableMemoryIsBoundedByTheMachine) {
  const std::uint64_t available = available_memory_bytes();
  EXPECT_GT(available, 0u);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  std::uint64_t total = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:") total = kib * 1024;
  }
  EXPECT_LE(available, total);
}

TEST(ResumeInPlace, ACheckpointManagerResumesLatestInPlaceAgainstTheRunIndex) {
  TempDir dir;
  {
    Trainee source(1);
    source.train(2);
    CheckpointManager manager(dir / "run", source.state);
    GenerationSpec spec;
    spec.step = source.counters.step;
    manager.save(spec);
    manager.wait();
  }
  Trainee copied(7);
  CheckpointManagerOptions copy_options;
  copy_options.resume_memory = ResumeMemory::private_copy;
  const auto copy_report = CheckpointManager(dir / "run", copied.state, copy_options).resume();
  ASSERT_TRUE(copy_report.has_value());
  EXPECT_FALSE(copy_report->in_place);

  Trainee streamed(8);
  CheckpointManagerOptions options;
  options.resume_memory = ResumeMemory::in_place;
  options.journal_directory = dir.path();
  const auto report = CheckpointManager(dir / "run", streamed.state, options).resume();
  ASSERT_TRUE(report.has_value());
  EXPECT_TRUE(report->in_place);
  EXPECT_EQ(report->sha256, copy_report->sha256);
  EXPECT_EQ(describe_difference(copied.snapshot(), streamed.snapshot()), "");

  // LATEST's bytes changed after the run was opened (its recovery checked
  // them): the resume refuses them against the digest the index records.
  Trainee refused(9);
  CheckpointManager manager(dir / "run", refused.state, options);
  poke(report->path, inside_largest_record(report->path));
  const Value before = refused.snapshot();
  EXPECT_ERROR_CODE(manager.resume(), ErrorCode::sha256_mismatch);
  EXPECT_EQ(describe_difference(before, refused.snapshot()), "");
}

// ---- refusals: the live state stays exactly as it was ----------------------

void expect_unchanged_after(Trainee& target, const std::function<void()>& load, ErrorCode code) {
  const Value before = target.snapshot();
  EXPECT_ERROR_CODE(load(), code);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "") << "a refused resume changed the live state";
}

TEST(ResumeInPlace, AFileChangedBetweenThePassesIsRefusedWithNothingApplied) {
  TempDir dir;
  const auto path = saved_run(dir);
  const std::uint64_t offset = inside_largest_record(path);
  Trainee target(8);
  target.train(1);
  target.counters.between_passes = [&] { poke(path, offset); };
  expect_unchanged_after(target, [&] { target.state.load_checkpoint(path, in_place()); },
                         ErrorCode::file_changed_during_read);
}

TEST(ResumeInPlace, AFileReplacedBetweenThePassesIsStillReadAsVerified) {
  // An atomic replacement (a new inode under the name) does not reach the
  // open descriptor: the resume applies the file it verified.
  TempDir dir;
  const auto path = saved_run(dir);
  Trainee other(3);
  other.train(5);
  other.state.save(dir / "other.pt");
  Trainee copied(7);
  copied.state.load_checkpoint(path, private_copy());
  Trainee target(8);
  target.counters.between_passes = [&] { std::filesystem::rename(dir / "other.pt", path); };
  target.state.load_checkpoint(path, in_place());
  EXPECT_EQ(describe_difference(copied.snapshot(), target.snapshot()), "");
}

TEST(ResumeInPlace, AFailureAfterTheBytesWereWrittenPutsTheLiveStateBack) {
  TempDir dir;
  const auto path = saved_run(dir);
  Trainee target(8);
  target.train(1);
  target.counters.explode = true;
  expect_unchanged_after(target, [&] { target.state.load_checkpoint(path, in_place()); },
                         ErrorCode::state_apply_failed);
}

TEST(ResumeInPlace, AWrongExpectedDigestIsRefusedBeforeAnything) {
  TempDir dir;
  const auto path = saved_run(dir);
  CheckpointLoadOptions options = in_place();
  options.expected_sha256 = Sha256::of(std::span<const std::byte>());
  Trainee target(8);
  expect_unchanged_after(target, [&] { target.state.load_checkpoint(path, options); }, ErrorCode::sha256_mismatch);
}

TEST(ResumeInPlace, ADamagedLargeRecordIsRefused) {
  TempDir dir;
  const auto path = saved_run(dir);
  poke(path, inside_largest_record(path));
  Trainee target(8);
  expect_unchanged_after(target, [&] { target.state.load_checkpoint(path, in_place()); }, ErrorCode::zip_crc_mismatch);
}

TEST(ResumeInPlace, AJournalThatCannotBeCreatedRefusesWithNothingApplied) {
  TempDir dir;
  const auto path = saved_run(dir);
  CheckpointLoadOptions options = in_place();
  options.journal_directory = dir / "no-such-folder";
  Trainee target(8);
  expect_unchanged_after(target, [&] { target.state.load_checkpoint(path, options); }, ErrorCode::io_write_failed);
}

TEST(ResumeInPlace, ATruncatedFileIsRefused) {
  TempDir dir;
  const auto path = saved_run(dir);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  Trainee target(8);
  expect_unchanged_after(target, [&] { target.state.load_checkpoint(path, in_place()); }, ErrorCode::zip_eocd_missing);
}

// The second pass alone: bytes that differ from the first pass's tag (a
// change the identity check could not see) are refused after some tensors
// were already written, and the journal puts them back.
TEST(ResumeInPlace, BytesThatDifferFromTheFirstPassAreRefusedAndTheJournalRestores) {
  TempDir dir;
  const auto path = saved_run(dir);
  const io::RegularFile file = io::open_regular_for_reading(path);
  struct stat identity {};
  ASSERT_EQ(::fstat(file.fd.get(), &identity), 0);
  format::ResumeScan scan = format::scan_for_resume(file, path, {}, std::uint64_t{64} << 20);
  ASSERT_GE(scan.absent.size(), 2u);
  // Spoil the tag of the record that comes last in the file, so that the
  // others are written before it is found.
  auto last = scan.absent.begin();
  for (auto it = scan.absent.begin(); it != scan.absent.end(); ++it) {
    if (it->second.offset > last->second.offset) last = it;
  }
  last->second.tag[0] ^= 1;

  Trainee target(8);
  target.train(1);
  const Value before = target.snapshot();
  checkpoint::InPlaceFill fill(file, identity, dir.path());
  fill.set_records(std::move(scan.absent));
  std::vector<std::pair<Component*, const Value*>> states;
  const Value& root = scan.mapping.root;
  states.emplace_back(&target.model_state, &root.as_dict().at("model"));
  states.emplace_back(&target.optimizer_state, &root.as_dict().at("optimizer"));
  EXPECT_ERROR_CODE(fill.fill(root, states), ErrorCode::file_changed_during_read);
  EXPECT_GT(fill.bytes_journaled(), 0u) << "nothing was written before the bad record: the test proves nothing";
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");
}

}  // namespace
}  // namespace holdpoint
