// TrainingState: schema-qualified save and transactional load, and every way a
// load can be refused, each proven to leave the live state bit-identical.
#include <torch/version.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/serialize.h>

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>

#include "holdpoint/state/module_state.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "holdpoint/checkpoint/training_state.h"
#include "holdpoint/tensor/trusted_load.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

torch::nn::Sequential make_model(std::uint64_t seed) {
  at::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::Linear(3, 2));
  model->train();
  model->forward(at::randn({5, 4}));  // moves the running statistics
  return model;
}

// A small non-tensor component: counters with strict validation.
class Counters final : public Component {
 public:
  explicit Counters(std::string name = "progress") : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  Value capture(CaptureMode) const override {
    Dict d;
    d.insert("global_step", Value::integer(step));
    d.insert("epoch", Value::integer(epoch));
    return Value::dict(std::move(d));
  }
  void validate(const Value& state) const override {
    if (!state.is_dict() || !state.as_dict().find("global_step") || !state.as_dict().find("epoch")) {
      throw Error(ErrorCode::state_key_missing, "counters");
    }
    if (state.as_dict().at("global_step").as_int() < 0) throw Error(ErrorCode::state_value_invalid, "negative");
  }
  void apply(const Value& state) override {
    step = state.as_dict().at("global_step").as_int();
    epoch = state.as_dict().at("epoch").as_int();
  }
  std::int64_t step = 0;
  std::int64_t epoch = 0;

 private:
  std::string name_;
};

// Applies like Counters but throws on demand, for the rollback proof.
class Exploding final : public Component {
 public:
  const std::string& name() const override { return name_; }
  Value capture(CaptureMode) const override { return Value::integer(value); }
  void validate(const Value& state) const override {
    if (!state.is_int()) throw Error(ErrorCode::state_type_invalid, "exploding");
  }
  void apply(const Value& state) override {
    if (explode) throw std::runtime_error("injected failure");
    value = state.as_int();
  }
  std::int64_t value = 0;
  bool explode = false;

 private:
  std::string name_ = "zz_exploding";
};

// The whole live state of a fixture, for before/after comparisons.
struct Fixture {
  explicit Fixture(std::uint64_t seed) : model(make_model(seed)), model_state(*model) {
    state.add(model_state).add(counters);
    state.set_semantic_identity("test-run");
    TrainingConfig config;
    config.load_bearing("batch_size", Value::integer(5)).load_bearing("lr", Value::floating(0.1)).max_epochs(10);
    state.set_config(config);
    state.set_warning_sink([this](const std::string& message) { warnings.push_back(message); });
  }
  Value snapshot() const {
    Dict d;
    d.insert("model", model_state.capture(CaptureMode::copy));
    d.insert("counters", counters.capture(CaptureMode::copy));
    return Value::dict(std::move(d));
  }
  torch::nn::Sequential model;
  ModuleState model_state;
  Counters counters;
  TrainingState state;
  std::vector<std::string> warnings;
};

// Loads `path` into a fresh fixture and checks it is refused with `code` and
// that nothing changed.
void expect_refused(const std::filesystem::path& path, ErrorCode code,
                    const std::function<void(Fixture&)>& prepare = {}) {
  Fixture target(99);
  if (prepare) prepare(target);
  const Value before = target.snapshot();
  EXPECT_ERROR_CODE(target.state.load_checkpoint(path), code);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "") << "a refused load changed the live state";
}

// Re-saves a checkpoint after `edit` changed its mapping (the zip stays valid).
std::filesystem::path edited(const std::filesystem::path& path, const std::string& name,
                             const std::function<void(Dict&)>& edit) {
  LoadedMapping mapping = load_checkpoint_mapping(path);
  Dict root = mapping.root.as_dict();
  edit(root);
  const auto out = path.parent_path() / name;
  save_mapping(out, Value::dict(std::move(root)));
  return out;
}

Dict& manifest_of(Dict& root) { return const_cast<Value&>(*root.find("holdpoint")).mutable_dict(); }

TEST(TrainingState, SaveThenLoadRestoresEveryComponentBitExactly) {
  TempDir dir;
  Fixture source(1);
  source.counters.step = 42;
  source.counters.epoch = 3;
  const SaveResult saved = source.state.save(dir / "ckpt.pt");
  EXPECT_EQ(read_sha256_sidecar(dir / "ckpt.pt"), saved.sha256);

  Fixture target(2);
  EXPECT_NE(describe_difference(source.snapshot(), target.snapshot()), "");
  const LoadReport report = target.state.load_checkpoint(dir / "ckpt.pt");
  EXPECT_EQ(describe_difference(source.snapshot(), target.snapshot()), "");
  EXPECT_EQ(report.qualification, ResumeQualification::qualified);
  EXPECT_EQ(report.profile, "unqualified");
  EXPECT_EQ(report.restored, (std::vector<std::string>{"model", "progress"}));
}

TEST(TrainingState, FileIsAPlainDictThatPythonCanRead) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  const LoadedMapping mapping = load_checkpoint_mapping(dir / "ckpt.pt");
  const Dict& root = mapping.root.as_dict();
  ASSERT_TRUE(root.find("holdpoint"));
  EXPECT_EQ(root.at("holdpoint").as_dict().at("schema").as_string(), "holdpoint.checkpoint");
  EXPECT_TRUE(root.at("model").is_ordered_dict());
  EXPECT_EQ(root.at("model").as_dict().at_index(0).first.as_string(), "0.weight");
  // Tensor records come first and data.pkl after them, so the manifest could
  // carry digests computed while the tensors streamed.
  EXPECT_EQ(mapping.records.front().name.rfind("data/", 0), 0u);
}

TEST(TrainingState, ManifestRecordsIdentityVersionsAndDigests) {
  TempDir dir;
  Fixture source(1);
  source.state.set_code_identity("git:abc123").set_data_identity("dataset-v2");
  source.state.save(dir / "ckpt.pt");
  const LoadedMapping mapping = load_checkpoint_mapping(dir / "ckpt.pt");
  const Manifest manifest = Manifest::from_value(mapping.root.as_dict().at("holdpoint"));
  EXPECT_EQ(manifest.kind, CheckpointKind::resume);
  EXPECT_EQ(manifest.semantic_identity, "test-run");
  EXPECT_EQ(manifest.code_identity, "git:abc123");
  EXPECT_EQ(manifest.data_identity, "dataset-v2");
  EXPECT_EQ(manifest.libtorch_version, TORCH_VERSION);  // the LibTorch this test was built with
  ASSERT_NE(manifest.component("model"), nullptr);
  StorageDigests digests;
  EXPECT_EQ(component_digest(mapping.root.as_dict().at("model"), digests), manifest.component("model")->sha256);
  EXPECT_FALSE(manifest.last_resume_drift.has_value());
}

// ---- poison tests: every refusal leaves the live state bit-identical ------------------

TEST(TrainingStatePoison, EachDriftedLoadBearingFieldIsNamed) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  Fixture target(99);
  TrainingConfig drifted;
  drifted.load_bearing("batch_size", Value::integer(6)).load_bearing("lr", Value::floating(0.2)).max_epochs(10);
  drifted.load_bearing("new_field", Value::boolean(true));
  target.state.set_config(drifted);
  const Value before = target.snapshot();
  try {
    target.state.load_checkpoint(dir / "ckpt.pt");
    FAIL() << "drift accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::config_drift);
    for (const char* field : {"batch_size", "lr", "new_field"}) {
      EXPECT_NE(error.detail().find(field), std::string::npos) << field << " not named in: " << error.detail();
    }
  }
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");
  expect_refused(dir / "ckpt.pt", ErrorCode::config_drift,
                 [](Fixture& f) { f.state.set_semantic_identity("another-run"); });
}

TEST(TrainingStatePoison, MaxEpochsMayGrowButNotShrink) {
  TempDir dir;
  Fixture source(1);
  source.counters.step = 17;
  source.state.save(dir / "ckpt.pt");
  expect_refused(dir / "ckpt.pt", ErrorCode::config_drift, [](Fixture& f) {
    TrainingConfig c = f.state.config();
    f.state.set_config(c.max_epochs(9));
  });

  Fixture grown(3);
  TrainingConfig c = grown.state.config();
  grown.state.set_config(c.max_epochs(15));
  const LoadReport report = grown.state.load_checkpoint(dir / "ckpt.pt");
  ASSERT_TRUE(report.drift.has_value());
  EXPECT_EQ(report.drift->field, "max_epochs");
  EXPECT_EQ(report.drift->from, 10);
  EXPECT_EQ(report.drift->to, 15);
  // The next save records the accepted extension.
  grown.state.save(dir / "next.pt");
  const Manifest next = Manifest::from_value(load_checkpoint_mapping(dir / "next.pt").root.as_dict().at("holdpoint"));
  ASSERT_TRUE(next.last_resume_drift.has_value());
  EXPECT_EQ(next.last_resume_drift->to, 15);
}

TEST(TrainingStatePoison, MissingUnknownAndInvalidManifestFields) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  const auto path = dir / "ckpt.pt";
  for (const char* field : {"kind", "profile", "config", "components", "versions", "code_identity",
                            "data_identity", "last_resume_drift", "config_identity", "semantic_identity"}) {
    SCOPED_TRACE(field);
    const auto out = edited(path, std::string("missing_") + field + ".pt", [&](Dict& root) {
      Dict copy;
      for (const auto& [key, value] : manifest_of(root)) {
        if (!(key.is_string() && key.as_string() == field)) copy.insert(key, value);
      }
      root.insert_or_assign("holdpoint", Value::dict(std::move(copy)));
    });
    expect_refused(out, ErrorCode::schema_field_missing);
  }
  expect_refused(edited(path, "unknown.pt", [](Dict& root) { manifest_of(root).insert("surprise", Value::integer(1)); }),
                 ErrorCode::schema_field_unknown);
  expect_refused(edited(path, "badkind.pt",
                        [](Dict& root) { manifest_of(root).insert_or_assign("kind", Value::string("bogus")); }),
                 ErrorCode::schema_field_invalid);
  expect_refused(edited(path, "typed.pt",
                        [](Dict& root) { manifest_of(root).insert_or_assign("profile", Value::integer(3)); }),
                 ErrorCode::schema_field_invalid);
  expect_refused(edited(path, "schema.pt",
                        [](Dict& root) { manifest_of(root).insert_or_assign("schema_version", Value::integer(2)); }),
                 ErrorCode::schema_version_unsupported);
  expect_refused(edited(path, "model_kind.pt",
                        [](Dict& root) { manifest_of(root).insert_or_assign("kind", Value::string("model")); }),
                 ErrorCode::checkpoint_kind_mismatch);
  expect_refused(edited(path, "profile.pt",
                        [](Dict& root) { manifest_of(root).insert_or_assign("profile", Value::string("cpu-basic-v9")); }),
                 ErrorCode::profile_unknown);
  // Editing the config without its digest is noticed; editing both is drift.
  expect_refused(edited(path, "config_only.pt",
                        [](Dict& root) {
                          Dict config = manifest_of(root).at("config").as_dict();
                          Dict fields = config.at("load_bearing").as_dict();
                          fields.insert_or_assign("batch_size", Value::integer(7));
                          config.insert_or_assign("load_bearing", Value::dict(fields));
                          manifest_of(root).insert_or_assign("config", Value::dict(config));
                        }),
                 ErrorCode::schema_field_invalid);
  expect_refused(edited(path, "nomanifest.pt",
                        [](Dict& root) {
                          Dict copy;
                          for (const auto& [key, value] : root) {
                            if (key.as_string() != "holdpoint") copy.insert(key, value);
                          }
                          root = copy;
                        }),
                 ErrorCode::schema_field_missing);
}

TEST(TrainingStatePoison, TamperedComponentIsCaughtByItsDigest) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  const auto out = edited(dir / "ckpt.pt", "tampered.pt", [](Dict& root) {
    Dict model = root.at("model").as_dict();
    TensorData weight = model.at("0.weight").as_tensor();
    auto bytes = weight.contiguous_bytes();
    bytes[0] ^= std::byte{1};
    model.insert_or_assign("0.weight", Value::tensor(TensorData::from_bytes(weight.dtype, weight.sizes, bytes)));
    root.insert_or_assign("model", Value::ordered_dict(model));
  });
  expect_refused(out, ErrorCode::component_digest_mismatch);
  const auto counters = edited(dir / "ckpt.pt", "counters.pt", [](Dict& root) {
    Dict c = root.at("progress").as_dict();
    c.insert_or_assign("global_step", Value::integer(1000));
    root.insert_or_assign("progress", Value::dict(c));
  });
  expect_refused(counters, ErrorCode::component_digest_mismatch);
}

TEST(TrainingStatePoison, InventoryMustMatchExactly) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  expect_refused(dir / "ckpt.pt", ErrorCode::component_missing, [](Fixture& f) {
    static Counters extra("early_stop");
    f.state.add(extra);
  });
  expect_refused(edited(dir / "ckpt.pt", "extra.pt", [](Dict& root) { root.insert("sampler", Value::integer(1)); }),
                 ErrorCode::component_unknown);
  Fixture model_only(4);
  TrainingState only;
  only.add(model_only.model_state).set_semantic_identity("test-run").set_config(model_only.state.config());
  const Value before = model_only.snapshot();
  EXPECT_ERROR_CODE(only.load_checkpoint(dir / "ckpt.pt"), ErrorCode::component_unknown);
  EXPECT_EQ(describe_difference(before, model_only.snapshot()), "");
}

TEST(TrainingStatePoison, WrongShapeDtypeOrKeyIsRefusedBeforeAnythingChanges) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  // Models of another architecture: validation names the first difference.
  Fixture other(5);
  torch::nn::Sequential wide(torch::nn::Linear(4, 5), torch::nn::BatchNorm1d(5), torch::nn::Linear(5, 2));
  ModuleState wide_state(*wide);
  Counters counters;
  TrainingState state;
  state.add(wide_state).add(counters).set_semantic_identity("test-run").set_config(other.state.config());
  const Value before = wide_state.capture(CaptureMode::copy);
  EXPECT_ERROR_CODE(state.load_checkpoint(dir / "ckpt.pt"), ErrorCode::state_shape_mismatch);
  EXPECT_EQ(describe_difference(before, wide_state.capture(CaptureMode::copy)), "");

  torch::nn::Sequential doubled(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3), torch::nn::Linear(3, 2));
  doubled->to(at::kDouble);
  ModuleState doubled_state(*doubled);
  TrainingState state2;
  Counters counters2;
  state2.add(doubled_state).add(counters2).set_semantic_identity("test-run").set_config(other.state.config());
  EXPECT_ERROR_CODE(state2.load_checkpoint(dir / "ckpt.pt"), ErrorCode::state_dtype_mismatch);

  torch::nn::Sequential shorter(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3));
  ModuleState shorter_state(*shorter);
  TrainingState state3;
  Counters counters3;
  state3.add(shorter_state).add(counters3).set_semantic_identity("test-run").set_config(other.state.config());
  EXPECT_ERROR_CODE(state3.load_checkpoint(dir / "ckpt.pt"), ErrorCode::state_key_unknown);
}

TEST(ModuleStateApply, AModelOfManyMegabytesIsCopiedWhole) {
  // 40 MiB of parameters and buffers of mixed sizes: past the size where a
  // second thread copies half of the bytes. Every element must arrive.
  torch::nn::Sequential source, target;
  for (int i = 0; i < 10; ++i) {
    source->push_back(torch::nn::Linear(1024, 1024 - 8 * i));
    target->push_back(torch::nn::Linear(1024, 1024 - 8 * i));
  }
  source->push_back(torch::nn::BatchNorm1d(17));
  target->push_back(torch::nn::BatchNorm1d(17));
  {
    at::NoGradGuard no_grad;
    for (auto& buffer : source->buffers()) buffer.copy_(at::randn(buffer.sizes()));
  }
  ModuleState from(*source), to(*target);
  const Value state = from.capture(CaptureMode::copy);
  to.validate(state);
  to.apply(state);
  const auto expected = source->named_parameters(), actual = target->named_parameters();
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& item : expected) EXPECT_TRUE(at::equal(item.value(), actual[item.key()])) << item.key();
  const auto expected_buffers = source->named_buffers(), actual_buffers = target->named_buffers();
  for (const auto& item : expected_buffers) {
    EXPECT_TRUE(at::equal(item.value(), actual_buffers[item.key()])) << item.key();
  }
  EXPECT_EQ(describe_difference(state, to.capture(CaptureMode::copy)), "");
}

TEST(TrainingStatePoison, ProfilePreconditionsAreCheckedAtSaveAndLoad) {
  TempDir dir;
  Fixture source(1);
  source.state.set_profile(ResumeProfile::cpu_basic_v1);
  // No sampler and no CPU generator registered: the claim cannot be made.
  EXPECT_ERROR_CODE(source.state.save(dir / "basic.pt"), ErrorCode::profile_precondition_violated);
  EXPECT_FALSE(std::filesystem::exists(dir / "basic.pt"));
  source.state.set_profile(ResumeProfile::cuda_single_device_v1);
  EXPECT_ERROR_CODE(source.state.save(dir / "cuda.pt"), ErrorCode::profile_precondition_violated);

  // A file that claims a profile whose preconditions the loading setup breaks.
  source.state.set_profile(ResumeProfile::unqualified);
  source.state.save(dir / "ckpt.pt");
  const auto claimed = edited(dir / "ckpt.pt", "claimed.pt", [](Dict& root) {
    manifest_of(root).insert_or_assign("profile", Value::string("cpu-basic-v1"));
  });
  expect_refused(claimed, ErrorCode::profile_precondition_violated);
  // The profile is load-bearing: resuming under another one is drift.
  expect_refused(dir / "ckpt.pt", ErrorCode::config_drift,
                 [](Fixture& f) { f.state.set_profile(ResumeProfile::cuda_single_device_v1); });
}

TEST(TrainingStatePoison, DigestOfTheWholeFileIsCheckedFirst) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  Fixture target(2);
  const Value before = target.snapshot();
  CheckpointLoadOptions options;
  options.expected_sha256 = Sha256Digest::parse(std::string(64, '0'));
  EXPECT_ERROR_CODE(target.state.load_checkpoint(dir / "ckpt.pt", options), ErrorCode::sha256_mismatch);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");
}

// ---- rollback ------------------------------------------------------------------------------

TEST(TrainingStateRollback, AFailingApplyRestoresEveryComponentAlreadyApplied) {
  TempDir dir;
  Fixture source(1);
  Exploding exploding;
  exploding.value = 7;
  source.state.add(exploding);
  source.counters.step = 5;
  source.state.save(dir / "ckpt.pt");

  Fixture target(2);
  Exploding target_exploding;
  target_exploding.explode = true;
  target.state.add(target_exploding);
  const Value before = target.snapshot();
  EXPECT_ERROR_CODE(target.state.load_checkpoint(dir / "ckpt.pt"), ErrorCode::state_apply_failed);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");
  EXPECT_EQ(target_exploding.value, 0);

  // The same through the after-apply hook, failing after the model was applied.
  Fixture hooked(3);
  Exploding quiet;
  hooked.state.add(quiet);
  const Value hooked_before = hooked.snapshot();
  hooked.state.set_after_apply_hook([](const std::string& name) {
    if (name == "progress") throw Error(ErrorCode::state_apply_failed, "injected after progress");
  });
  EXPECT_ERROR_CODE(hooked.state.load_checkpoint(dir / "ckpt.pt"), ErrorCode::state_apply_failed);
  EXPECT_EQ(describe_difference(hooked_before, hooked.snapshot()), "");
}

// ---- trust matrix ---------------------------------------------------------------------------

TEST(TrainingStateTrust, TorchScriptArchiveNeedsTheTrustedLoader) {
  TempDir dir;
  Fixture source(1);
  torch::save(source.model, (dir / "libtorch.pt").string());

  Fixture target(2);
  const Value before = target.snapshot();
  try {
    target.state.load_checkpoint(dir / "libtorch.pt");
    FAIL() << "an untrusted load used LibTorch's deserializer";
  } catch (const UnsafeCheckpointLoadUnavailable& error) {
    EXPECT_EQ(error.code(), ErrorCode::unsafe_checkpoint_load_unavailable);
    EXPECT_EQ(error.reason(), ErrorCode::torchscript_archive);
  }
  EXPECT_ERROR_CODE(target.state.load_model_state(dir / "libtorch.pt"), ErrorCode::unsafe_checkpoint_load_unavailable);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");

  const LoadReport report = target.state.load_trusted_checkpoint(dir / "libtorch.pt");
  EXPECT_EQ(report.qualification, ResumeQualification::legacy_unqualified);
  EXPECT_EQ(report.layout, "torchscript");
  EXPECT_FALSE(target.warnings.empty());
  EXPECT_EQ(describe_difference(source.model_state.capture(CaptureMode::copy),
                                target.model_state.capture(CaptureMode::copy)),
            "");
}

TEST(TrainingStateTrust, TrustedMappingFallsBackToLibTorchAndWarns) {
  TempDir dir;
  Fixture source(1);
  torch::save(source.model, (dir / "libtorch.pt").string());
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "libtorch.pt"), ErrorCode::torchscript_archive);
  LoadOptions options;
  const LoadedMapping mapping = load_trusted_mapping(dir / "libtorch.pt", options);
  EXPECT_TRUE(mapping.via_libtorch);
  ASSERT_FALSE(mapping.warnings.empty());
  EXPECT_TRUE(mapping.root.as_dict().find("0.weight"));
  // I/O problems and digest mismatches are never a reason to try LibTorch.
  options.expected_sha256 = Sha256Digest::parse(std::string(64, '0'));
  EXPECT_ERROR_CODE(load_trusted_mapping(dir / "libtorch.pt", options), ErrorCode::sha256_mismatch);
}

TEST(TrainingStateModelOnly, LoadsHoldpointAndLegacyLayouts) {
  TempDir dir;
  Fixture source(1);
  source.state.save(dir / "ckpt.pt");
  Dict bare;
  const Value captured = source.model_state.capture(CaptureMode::reference);
  for (const auto& [key, value] : captured.as_dict()) bare.insert(key, value);
  save_mapping(dir / "bare.pt", Value::ordered_dict(bare));
  Dict tutorial;
  tutorial.insert("model_state_dict", Value::ordered_dict(bare));
  tutorial.insert("optimizer_state_dict", Value::dict());
  tutorial.insert("epoch", Value::integer(4));
  tutorial.insert("loss", Value::floating(0.25));
  save_mapping(dir / "tutorial.pt", Value::dict(tutorial));
  Dict lightning;
  lightning.insert("state_dict", Value::ordered_dict(bare));
  lightning.insert("epoch", Value::integer(4));
  lightning.insert("global_step", Value::integer(40));
  save_mapping(dir / "lightning.pt", Value::dict(lightning));

  for (const auto& [file, layout] : std::vector<std::pair<std::string, std::string>>{
           {"ckpt.pt", "holdpoint"}, {"bare.pt", "state_dict"}, {"tutorial.pt", "tutorial"}, {"lightning.pt", "lightning"}}) {
    SCOPED_TRACE(file);
    Fixture target(7);
    const LoadReport report = target.state.load_model_state(dir / file);
    EXPECT_EQ(report.layout, layout);
    EXPECT_EQ(report.qualification,
              layout == "holdpoint" ? ResumeQualification::qualified : ResumeQualification::legacy_unqualified);
    EXPECT_EQ(describe_difference(source.model_state.capture(CaptureMode::copy),
                                  target.model_state.capture(CaptureMode::copy)),
              "");
  }
  Dict unrelated;
  unrelated.insert("weights", Value::integer(1));
  save_mapping(dir / "unrelated.pt", Value::dict(unrelated));
  Fixture target(8);
  const Value before = target.snapshot();
  EXPECT_ERROR_CODE(target.state.load_model_state(dir / "unrelated.pt"), ErrorCode::legacy_layout_unrecognized);
  EXPECT_EQ(describe_difference(before, target.snapshot()), "");
}

TEST(TrainingStateModelOnly, PythonStateDictLoadsIntoTheEquivalentLibTorchModel) {
  TempDir dir;
  const auto script = dir / "make.py";
  testing::write_file_bytes(script, testing::bytes_of(
      "import sys, torch\n"
      "torch.manual_seed(3)\n"
      "m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))\n"
      "m(torch.randn(5, 4))\n"
      "torch.save(m.state_dict(), sys.argv[1])\n"
      "torch.save({k: v for k, v in m.state_dict().items()}, sys.argv[2])\n"));
  const auto run = testing::run_python(testing::oracle_python(), script,
                                       (dir / "py.pt").string() + " " + (dir / "py_plain.pt").string());
  ASSERT_EQ(run.status, 0) << run.output;
  Fixture target(9);
  const LoadReport report = target.state.load_model_state(dir / "py.pt");
  EXPECT_EQ(report.layout, "state_dict");
  const LoadedMapping python = load_checkpoint_mapping(dir / "py.pt");
  const Value restored = target.model_state.capture(CaptureMode::copy);
  for (const auto& [key, value] : python.root.as_dict()) {
    EXPECT_TRUE(equal_content(value, restored.as_dict().at(key))) << key.to_string();
  }
}

}  // namespace
}  // namespace holdpoint
