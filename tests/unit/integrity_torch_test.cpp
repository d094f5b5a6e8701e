// Integrity of TrainingState loads after the save/load performance work
// (XXH3 storage digests; component digests skipped once the whole-file
// SHA-256 matched; parse while hashing):
//
//   - a flipped byte anywhere in a model + optimizer checkpoint (tensor
//     payload, data.pkl, the manifest's bytes, a local header, the central
//     directory, the end records) is refused by load_checkpoint_mapping,
//     TrainingState::load_checkpoint and load_model_state, with and without
//     an expected digest, and by CheckpointManager::resume;
//   - every refusal leaves the live parameters and optimizer state
//     bit-identical, and a damaged LATEST is never applied (resume falls
//     back to the newest generation that verifies, or refuses);
//   - a manifest without "storage_digest" (SHA-256 storage digests, as files
//     from before XXH3 have) still loads, and a wrong storage digest in it is
//     still refused.
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "format/zip/zip_reader.h"
#include "holdpoint/checkpoint/checkpoint_manager.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/state/optimizer_state.h"
#include "support/test_support.h"
#include "support/zip_builder.h"

namespace holdpoint {
namespace {

using testing::TempDir;

// A model, an Adam optimizer with state (it has stepped) and their
// TrainingState.
struct Live {
  Live(std::uint64_t seed, int steps) {
    at::manual_seed(seed);
    model = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2));
    optimizer = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(0.01));
    train(steps);
    model_state = std::make_unique<ModuleState>(*model);
    optimizer_state = std::make_unique<OptimizerState>("optimizer", *optimizer);
    state.add(*model_state).add(*optimizer_state);
    state.set_semantic_identity("integrity-torch-test");
    TrainingConfig config;
    config.load_bearing("lr", Value::floating(0.01)).max_epochs(3);
    state.set_config(config);
  }

  void train(int steps) {
    for (int step = 0; step < steps; ++step) {
      const at::Tensor x = (at::arange(6 * 4, at::kFloat) * 0.13 + step).cos().reshape({6, 4});
      const at::Tensor y = (at::arange(6 * 2, at::kFloat) * 0.21 - step).sin().reshape({6, 2});
      optimizer->zero_grad();
      (model->forward(x) - y).pow(2).mean().backward();
      optimizer->step();
    }
  }

  // Everything a load may change, copied.
  Value snapshot() const {
    Dict d;
    d.insert("model", model_state->capture(CaptureMode::copy));
    d.insert("optimizer", optimizer_state->capture(CaptureMode::copy));
    return Value::dict(std::move(d));
  }

  // The parameters' raw bytes, for a bitwise comparison independent of the
  // components' capture.
  std::vector<std::vector<std::byte>> parameter_bytes() const {
    std::vector<std::vector<std::byte>> out;
    for (const at::Tensor& p : model->parameters()) {
      const at::Tensor c = p.detach().contiguous();
      const auto* data = static_cast<const std::byte*>(c.data_ptr());
      out.emplace_back(data, data + c.numel() * c.element_size());
    }
    return out;
  }

  torch::nn::Sequential model{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::unique_ptr<ModuleState> model_state;
  std::unique_ptr<OptimizerState> optimizer_state;
  TrainingState state;
};

// Checks that `action` leaves `live` bit-identical.
struct Unchanged {
  explicit Unchanged(const Live& live) : live(live), before(live.snapshot()), bytes(live.parameter_bytes()) {}
  void check(const std::string& what) const {
    EXPECT_EQ(describe_difference(before, live.snapshot()), "") << what << " changed the live state";
    EXPECT_TRUE(live.parameter_bytes() == bytes) << what << " changed the live parameters";
  }
  const Live& live;
  Value before;
  std::vector<std::vector<std::byte>> bytes;
};

std::vector<std::byte> read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<std::byte> bytes(static_cast<std::size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

void write_all(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void flip_on_disk(const std::filesystem::path& path, std::uint64_t offset) {
  auto bytes = read_all(path);
  bytes.at(offset) ^= std::byte{0xFF};
  // In place: the run directory's files keep their inode.
  std::fstream out(path, std::ios::binary | std::ios::in | std::ios::out);
  out.seekp(static_cast<std::streamoff>(offset));
  out.write(reinterpret_cast<const char*>(&bytes[offset]), 1);
}

CheckpointSaveOptions scratch_save() {
  CheckpointSaveOptions options;
  options.durable = false;
  options.write_sidecar = false;
  return options;
}

SaveOptions scratch_mapping() {
  SaveOptions options;
  options.durable = false;
  options.write_sidecar = false;
  return options;
}

CheckpointLoadOptions expecting(const Sha256Digest& digest) {
  CheckpointLoadOptions options;
  options.expected_sha256 = digest;
  return options;
}

LoadOptions mapping_expecting(const Sha256Digest& digest) {
  LoadOptions options;
  options.expected_sha256 = digest;
  return options;
}

// One single-byte flip and what the restricted reader says about it when no
// digest is given.
struct Flip {
  std::string where;
  std::uint64_t offset = 0;
  ErrorCode code = ErrorCode::zip_crc_mismatch;
};

// Positions in every part of a checkpoint archive.
std::vector<Flip> flips_of(const std::vector<std::byte>& file, const std::string& manifest_text) {
  const auto archive = format::read_zip_directory(file, Limits{});
  const auto offsets = testing::zip_offsets(file);
  const format::ZipEntry& pickle = *archive.find("data.pkl");
  const format::ZipEntry& first_storage = *archive.find("data/0");
  const format::ZipEntry* last_storage = &first_storage;
  for (const auto& entry : archive.entries) {
    if (entry.record().starts_with("data/") && entry.data_offset > last_storage->data_offset) last_storage = &entry;
  }
  std::size_t pickle_index = 0;
  while (archive.entries[pickle_index].record() != "data.pkl") ++pickle_index;
  const std::size_t pickle_central = offsets.central_entries[pickle_index];

  // The manifest's bytes: a text only the manifest holds, inside data.pkl.
  const std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  const std::size_t manifest_at = text.find(manifest_text, pickle.data_offset);
  if (manifest_at == std::string_view::npos || manifest_at >= pickle.data_offset + pickle.size) {
    throw std::runtime_error("the manifest text is not in data.pkl");
  }

  return {
      {"first tensor payload", first_storage.data_offset + first_storage.size / 2, ErrorCode::zip_crc_mismatch},
      {"last tensor payload", last_storage->data_offset + last_storage->size - 1, ErrorCode::zip_crc_mismatch},
      {"data.pkl protocol byte", pickle.data_offset + 1, ErrorCode::zip_crc_mismatch},
      {"manifest bytes in data.pkl", manifest_at + manifest_text.size() / 2, ErrorCode::zip_crc_mismatch},
      {"local header name", pickle.local_header_offset + 30 + 3, ErrorCode::zip_local_header_mismatch},
      {"local header CRC", first_storage.local_header_offset + 14, ErrorCode::zip_local_header_mismatch},
      {"central directory CRC", pickle_central + 16, ErrorCode::zip_descriptor_mismatch},
      {"central directory size", pickle_central + 24, ErrorCode::zip_size_mismatch},
      {"central directory local header offset", pickle_central + 42, ErrorCode::zip_local_header_invalid},
      {"zip64 end record directory offset", *offsets.zip64_end_record + 48, ErrorCode::zip_central_directory_invalid},
      {"end record entry count", offsets.end_record + 10, ErrorCode::zip_multi_disk},
  };
}

std::uint64_t offset_of(const std::vector<Flip>& flips, std::string_view where) {
  for (const Flip& flip : flips) {
    if (flip.where == where) return flip.offset;
  }
  throw std::runtime_error("no flip named " + std::string(where));
}

// A central directory timestamp: the one kind of byte no reader
// interprets (see integrity_test's EveryByteFlip); only a digest sees it.
std::uint64_t uninterpreted_offset(const std::vector<std::byte>& file) {
  return testing::zip_offsets(file).central_entries[0] + 12;
}

class FlippedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = source_.state.save(dir_ / "ckpt.pt", scratch_save());
    file_ = read_all(dir_ / "ckpt.pt");
    ASSERT_EQ(Sha256::of(file_), saved_.sha256);
    const Manifest manifest = Manifest::of_root(load_checkpoint_mapping(dir_ / "ckpt.pt").root);
    flips_ = flips_of(file_, manifest.component("model")->sha256.hex());
  }

  TempDir dir_;
  Live source_{1, 3};
  SaveResult saved_;
  std::vector<std::byte> file_;
  std::vector<Flip> flips_;
};

TEST_F(FlippedCheckpoint, EveryLoadPathRefusesItAndLeavesTheLiveStateBitIdentical) {
  const auto path = dir_ / "flipped.pt";
  Live target(99, 2);
  const Unchanged unchanged(target);
  for (const Flip& flip : flips_) {
    SCOPED_TRACE(flip.where);
    auto bytes = file_;
    bytes[flip.offset] ^= std::byte{0xFF};
    write_all(path, bytes);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path), flip.code);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path, mapping_expecting(saved_.sha256)), ErrorCode::sha256_mismatch);
    EXPECT_ERROR_CODE(target.state.load_checkpoint(path), flip.code);
    EXPECT_ERROR_CODE(target.state.load_checkpoint(path, expecting(saved_.sha256)), ErrorCode::sha256_mismatch);
    EXPECT_ERROR_CODE(target.state.load_model_state(path), flip.code);
    EXPECT_ERROR_CODE(target.state.load_model_state(path, expecting(saved_.sha256)), ErrorCode::sha256_mismatch);
    // A digest of the flipped bytes themselves gets past the digest check and
    // is refused by the reader all the same.
    EXPECT_ERROR_CODE(target.state.load_checkpoint(path, expecting(Sha256::of(bytes))), flip.code);
    unchanged.check(flip.where);
  }
  // The same file unflipped loads through every path: the refusals above
  // were the flips'.
  write_all(path, file_);
  EXPECT_NO_THROW(target.state.load_checkpoint(path, expecting(saved_.sha256)));
  EXPECT_EQ(describe_difference(target.snapshot(), source_.snapshot()), "");
}

TEST_F(FlippedCheckpoint, AFlipInAnUninterpretedHeaderByteIsSeenOnlyByTheDigestAndChangesNothing) {
  const auto path = dir_ / "flipped.pt";
  auto bytes = file_;
  bytes[uninterpreted_offset(file_)] ^= std::byte{0xFF};
  write_all(path, bytes);
  Live target(99, 2);
  const Unchanged unchanged(target);
  EXPECT_ERROR_CODE(target.state.load_checkpoint(path, expecting(saved_.sha256)), ErrorCode::sha256_mismatch);
  EXPECT_ERROR_CODE(target.state.load_model_state(path, expecting(saved_.sha256)), ErrorCode::sha256_mismatch);
  unchanged.check("a refused load");
  // Without a digest the reader accepts it, and what it restores is exactly
  // what was saved.
  target.state.load_checkpoint(path);
  EXPECT_EQ(describe_difference(target.snapshot(), source_.snapshot()), "");
}

// A file saved by save_mapping (with its sidecar), on the mapping API's paths.
TEST(FlippedMapping, IsRefusedWithAndWithoutItsDigest) {
  TempDir dir;
  Live source(3, 2);
  Dict root;
  root.insert("model", source.model_state->capture(CaptureMode::reference));
  root.insert("optimizer", source.optimizer_state->capture(CaptureMode::reference));
  root.insert("note", Value::string("a manifest-free mapping: model and optimizer state"));
  const auto path = dir / "mapping.pt";
  const SaveResult saved = save_mapping(path, Value::dict(root));
  EXPECT_EQ(read_sha256_sidecar(path), saved.sha256);
  const auto file = read_all(path);
  for (const Flip& flip : flips_of(file, "a manifest-free mapping")) {
    SCOPED_TRACE(flip.where);
    auto bytes = file;
    bytes[flip.offset] ^= std::byte{0xFF};
    write_all(path, bytes);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path), flip.code);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path, mapping_expecting(saved.sha256)), ErrorCode::sha256_mismatch);
    EXPECT_ERROR_CODE(load_checkpoint_mapping(path, mapping_expecting(read_sha256_sidecar(path))),
                      ErrorCode::sha256_mismatch);
  }
  auto bytes = file;
  bytes[uninterpreted_offset(file)] ^= std::byte{0xFF};
  write_all(path, bytes);
  EXPECT_ERROR_CODE(load_checkpoint_mapping(path, mapping_expecting(saved.sha256)), ErrorCode::sha256_mismatch);
  EXPECT_EQ(describe_difference(load_checkpoint_mapping(path).root, Value::dict(root)), "");
}

// ---- CheckpointManager::resume -----------------------------------------------------------

CheckpointManagerOptions quiet() {
  CheckpointManagerOptions options;
  options.run.durable = false;
  options.run.log = [](const std::string&) {};
  return options;
}

GenerationSpec at_step(std::int64_t step) {
  GenerationSpec spec;
  spec.step = step;
  return spec;
}

// The run's generation file at `step` after saves from `source`.
std::filesystem::path generation_path(const std::filesystem::path& run, std::int64_t step) {
  return run / "checkpoints" / generation_name(step);
}

TEST(FlippedGeneration, ResumeRefusesAGenerationChangedOnDiskAfterTheRunWasOpened) {
  TempDir dir;
  const auto run = dir / "run";
  Live source(5, 3);
  {
    CheckpointManager manager(run, source.state, quiet());
    manager.save(at_step(3));
  }
  const auto path = generation_path(run, 3);
  const auto file = read_all(path);
  const Manifest manifest = Manifest::of_root(load_checkpoint_mapping(path).root);
  auto flips = flips_of(file, manifest.component("optimizer")->sha256.hex());
  flips.push_back({"central directory timestamp", uninterpreted_offset(file), ErrorCode::sha256_mismatch});

  Live target(99, 1);
  const Unchanged unchanged(target);
  // Opened (and recovered) while the generation verified.
  CheckpointManager manager(run, target.state, quiet());
  ASSERT_TRUE(manager.run().recovery().damaged.empty());
  for (const Flip& flip : flips) {
    SCOPED_TRACE(flip.where);
    flip_on_disk(path, flip.offset);
    // The run index's digest no longer matches: refused before anything is
    // parsed, let alone applied (component digests are skipped on this path,
    // so the digest is all that stands between the bytes and the model).
    EXPECT_ERROR_CODE(manager.resume(), ErrorCode::sha256_mismatch);
    unchanged.check("a refused resume");
    flip_on_disk(path, flip.offset);  // back
  }
  const auto report = manager.resume();
  ASSERT_TRUE(report);
  EXPECT_EQ(describe_difference(target.snapshot(), source.snapshot()), "");
}

TEST(FlippedGeneration, ADamagedLatestIsQuarantinedAndResumeFallsBackWithoutApplyingIt) {
  TempDir dir;
  // Where the damage is: a payload, the manifest in data.pkl, a header byte
  // no reader interprets.
  for (const std::string where : {"payload", "manifest", "timestamp"}) {
    SCOPED_TRACE(where);
    const auto run = dir / ("run-" + where);
    Live source(7, 2);
    Value at_1, at_2;
    {
      CheckpointManager manager(run, source.state, quiet());
      manager.save(at_step(1));
      at_1 = source.snapshot();
      source.train(2);
      manager.save(at_step(2));
      at_2 = source.snapshot();
    }
    ASSERT_NE(describe_difference(at_1, at_2), "");
    const auto path = generation_path(run, 2);
    const auto file = read_all(path);
    const Manifest manifest = Manifest::of_root(load_checkpoint_mapping(path).root);
    const auto flips = flips_of(file, manifest.component("model")->sha256.hex());
    const std::uint64_t offset = where == "payload"    ? offset_of(flips, "first tensor payload")
                                 : where == "manifest" ? offset_of(flips, "manifest bytes in data.pkl")
                                                       : uninterpreted_offset(file);
    flip_on_disk(path, offset);

    Live target(99, 1);
    CheckpointManager manager(run, target.state, quiet());
    const RecoveryReport& recovery = manager.run().recovery();
    ASSERT_EQ(recovery.damaged.size(), 1u);
    EXPECT_EQ(recovery.damaged[0].name, generation_name(2));
    EXPECT_FALSE(recovery.damaged[0].ok);
    EXPECT_EQ(recovery.damaged[0].code, std::optional<ErrorCode>(ErrorCode::sha256_mismatch))
        << recovery.damaged[0].detail;
    EXPECT_EQ(recovery.quarantined, std::vector<std::string>{generation_name(2) + ".damaged"});
    EXPECT_EQ(recovery.latest, std::optional<std::string>(generation_name(1)));
    const auto report = manager.resume();
    ASSERT_TRUE(report);
    EXPECT_EQ(report->path.filename().string(), generation_name(1));
    EXPECT_EQ(describe_difference(target.snapshot(), at_1), "") << "resumed from step 1, not the damaged step 2";
    EXPECT_FALSE(std::filesystem::exists(path));
  }
}

TEST(FlippedGeneration, ARunWhoseOnlyGenerationIsDamagedIsRefusedAndNothingIsApplied) {
  TempDir dir;
  const auto run = dir / "run";
  Live source(11, 2);
  {
    CheckpointManager manager(run, source.state, quiet());
    manager.save(at_step(2));
  }
  const auto path = generation_path(run, 2);
  const auto file = read_all(path);
  const Manifest manifest = Manifest::of_root(load_checkpoint_mapping(path).root);
  flip_on_disk(path, offset_of(flips_of(file, manifest.component("model")->sha256.hex()), "first tensor payload"));
  Live target(99, 1);
  const Unchanged unchanged(target);
  CheckpointManager manager(run, target.state, quiet());
  EXPECT_ERROR_CODE(manager.resume(), ErrorCode::run_no_generation);
  unchanged.check("a refused resume");
}

// ---- files from before storage_digest ----------------------------------------------------

// A fake storage digest, for "one storage digest is wrong".
StorageDigest bogus_digest() {
  StorageDigest digest;
  digest.bytes.fill(0xAB);
  digest.size = 32;
  return digest;
}

// The storage of the first tensor in `state`, depth first.
const Storage* find_first_storage(const Value& state) {
  if (state.is_tensor()) return state.as_tensor().storage.get();
  if (state.is_dict() || state.is_ordered_dict()) {
    for (const auto& [key, value] : state.as_dict()) {
      if (const Storage* found = find_first_storage(value)) return found;
    }
  }
  if (state.is_list() || state.is_tuple()) {
    for (const Value& value : state.as_list()) {
      if (const Storage* found = find_first_storage(value)) return found;
    }
  }
  return nullptr;
}

const Storage& first_storage_of(const Value& state) {
  const Storage* found = find_first_storage(state);
  if (!found) throw std::runtime_error("no tensor in the state");
  return *found;
}

class PreStorageDigestFile : public ::testing::Test {
 protected:
  void SetUp() override {
    source_.state.save(dir_ / "current.pt", scratch_save());
    current_ = load_checkpoint_mapping(dir_ / "current.pt");
    ASSERT_EQ(Manifest::of_root(current_.root).storage_digest, StorageDigestKind::xxh3_128)
        << "current writers use XXH3-128 storage digests";
  }

  // Re-saves the checkpoint with a manifest of `kind` whose component
  // digests are computed with `digests_for(component)`.
  std::filesystem::path rewrite(const std::string& name, StorageDigestKind kind,
                                const std::function<StorageDigests(const std::string&)>& digests_for) {
    Dict root = current_.root.as_dict();
    Manifest manifest = Manifest::of_root(current_.root);
    manifest.storage_digest = kind;
    for (ComponentRecord& record : manifest.components) {
      StorageDigests digests = digests_for(record.name);
      record.sha256 = component_digest(root.at(record.name), digests);
    }
    root.insert_or_assign(std::string(kManifestKey), manifest.to_value());
    const auto path = dir_ / name;
    save_mapping(path, Value::dict(std::move(root)), scratch_mapping());
    return path;
  }
  static StorageDigests sha256_digests(const std::string&) { return StorageDigests(StorageDigestKind::sha256); }

  TempDir dir_;
  Live source_{13, 3};
  LoadedMapping current_;
};

TEST_F(PreStorageDigestFile, LoadsWithItsSha256StorageDigestsChecked) {
  const auto path = rewrite("old.pt", StorageDigestKind::sha256, sha256_digests);
  const LoadedMapping old = load_checkpoint_mapping(path);
  const Value* manifest = find_manifest_entry(old.root);
  ASSERT_NE(manifest, nullptr);
  EXPECT_FALSE(manifest->as_dict().find(std::string_view("storage_digest"))) << "old files have no such field";
  EXPECT_EQ(Manifest::of_root(old.root).storage_digest, StorageDigestKind::sha256);

  Live target(99, 1);
  EXPECT_NE(describe_difference(target.snapshot(), source_.snapshot()), "");
  const LoadReport report = target.state.load_checkpoint(path);  // no digest: component digests are checked
  EXPECT_EQ(report.restored, (std::vector<std::string>{"model", "optimizer"}));
  EXPECT_EQ(describe_difference(target.snapshot(), source_.snapshot()), "");

  Live model_only(98, 1);
  model_only.state.load_model_state(path);
  EXPECT_EQ(describe_difference(model_only.model_state->capture(CaptureMode::copy),
                                source_.model_state->capture(CaptureMode::copy)),
            "");
}

TEST_F(PreStorageDigestFile, OneWrongStorageDigestIsRefusedOnEveryUncheckedLoad) {
  for (const std::string component : {"model", "optimizer"}) {
    SCOPED_TRACE(component);
    const auto path = rewrite("bad-" + component + ".pt", StorageDigestKind::sha256, [&](const std::string& name) {
      StorageDigests digests(StorageDigestKind::sha256);
      if (name == component) {
        digests.set(first_storage_of(current_.root.as_dict().at(component)).identity(), bogus_digest());
      }
      return digests;
    });
    Live target(99, 1);
    const Unchanged unchanged(target);
    EXPECT_ERROR_CODE(target.state.load_checkpoint(path), ErrorCode::component_digest_mismatch);
    if (component == "model") {
      EXPECT_ERROR_CODE(target.state.load_model_state(path), ErrorCode::component_digest_mismatch);
    } else {
      EXPECT_NO_THROW(target.state.load_model_state(path)) << "load_model_state checks the model's digest only";
      continue;
    }
    unchanged.check("a refused load");
  }
}

TEST_F(PreStorageDigestFile, StorageDigestKindsAreNotInterchangeable) {
  // The field removed but the XXH3 digests kept, and SHA-256 digests under
  // the XXH3 label: either way every component mismatches.
  const auto unlabelled = rewrite("unlabelled.pt", StorageDigestKind::sha256,
                                  [](const std::string&) { return StorageDigests(StorageDigestKind::xxh3_128); });
  const auto mislabelled = rewrite("mislabelled.pt", StorageDigestKind::xxh3_128, sha256_digests);
  Live target(99, 1);
  const Unchanged unchanged(target);
  for (const auto& path : {unlabelled, mislabelled}) {
    SCOPED_TRACE(path.filename().string());
    EXPECT_ERROR_CODE(target.state.load_checkpoint(path), ErrorCode::component_digest_mismatch);
    EXPECT_ERROR_CODE(target.state.load_model_state(path), ErrorCode::component_digest_mismatch);
  }
  unchanged.check("a refused load");
  // The XXH3 rewrite itself is the current file's content: it loads.
  const auto current = rewrite("xxh3.pt", StorageDigestKind::xxh3_128,
                               [](const std::string&) { return StorageDigests(StorageDigestKind::xxh3_128); });
  EXPECT_NO_THROW(target.state.load_checkpoint(current));
}

// The documented trade of change 2: once the whole-file SHA-256 matched an
// expected digest the component digests are not re-computed (they add no
// integrity then), so a file whose manifest digests are wrong loads only
// when the caller vouches for the exact bytes; the wrong digest is refused.
TEST_F(PreStorageDigestFile, AMatchedFileDigestSkipsComponentDigestsButAWrongOneIsRefused) {
  const auto path = rewrite("bad-model.pt", StorageDigestKind::sha256, [&](const std::string& name) {
    StorageDigests digests(StorageDigestKind::sha256);
    if (name == "model") digests.set(first_storage_of(current_.root.as_dict().at("model")).identity(), bogus_digest());
    return digests;
  });
  const Sha256Digest digest = Sha256::of(read_all(path));
  Live target(99, 1);
  const Unchanged unchanged(target);
  Sha256Digest other = digest;
  other.bytes[0] ^= 1;
  EXPECT_ERROR_CODE(target.state.load_checkpoint(path, expecting(other)), ErrorCode::sha256_mismatch);
  EXPECT_ERROR_CODE(target.state.load_checkpoint(path), ErrorCode::component_digest_mismatch);
  unchanged.check("a refused load");
  EXPECT_NO_THROW(target.state.load_checkpoint(path, expecting(digest)));
  EXPECT_EQ(describe_difference(target.snapshot(), source_.snapshot()), "");
}

}  // namespace
}  // namespace holdpoint
