// Best-state capture: the capture routes of seed 004's fixture classified by
// storage, the selection record's independence, and the publication gate's
// decisions, with every way it refuses (each leaving the previously accepted
// file's bytes unchanged and no staging file).
#include <ATen/ops/arange.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "../../examples/best-state/tiny_selection.h"
#include "holdpoint/checkpoint/best_state_gate.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/component.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "holdpoint/checkpoint/training_state.h"
#include "support/fault_file_system.h"
#include "support/tampering_file_system.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::FaultFileSystem;
using testing::FaultKind;
using testing::read_file_bytes;
using testing::Tamper;
using testing::TamperingFileSystem;
using testing::TempDir;
using namespace tiny_selection;

std::vector<float> values_of(const NamedTensors& tensors) {
  std::vector<float> values;
  for (const auto& [name, tensor] : tensors) values.push_back(tensor.item<float>());
  return values;
}

std::vector<std::string> staging_files(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".staging-") != std::string::npos) names.push_back(name);
  }
  return names;
}

// A strict load the test can watch: what the fresh module held just before.
void strict_load(torch::nn::Module& fresh, const NamedTensors& state) {
  Dict entries;
  for (const auto& [name, tensor] : state) entries.insert(name, tensor_value(tensor));
  ModuleState component(fresh);
  component.validate(Value::ordered_dict(entries));
  component.apply(Value::ordered_dict(entries));
}

class BestState : public ::testing::Test {
 protected:
  Tiny model;
  ModuleRecipe recipe = tiny_recipe();
  SelectionRecord record = record_selection(tiny_selection_info(), *model, recipe, probe_input());
  // Taken at the selection point, before any test updates the model.
  NamedTensors selected_copy = snapshot(*model);
  TempDir dir;

  SelectionCandidate snapshot_candidate() const { return {"snapshot", selected_copy, {}}; }

  // The previously accepted file, published from the selected state.
  std::filesystem::path publish_accepted() {
    const auto path = dir / "accepted.pt";
    const auto report = publish_selection(path, record, recipe, snapshot_candidate());
    EXPECT_EQ(report.decision, SelectionDecision::accept) << report.reason;
    return path;
  }
};

// ---- copies and diagnostics ----------------------------------------------------------

TEST_F(BestState, SnapshotKeepsTheSelectedValuesThroughAnInPlaceUpdate) {
  const NamedTensors copy = snapshot(*model);
  const CandidateDiagnostics diagnostics = diagnose(copy, *model);
  EXPECT_FALSE(diagnostics.is_live_mapping);
  EXPECT_FALSE(diagnostics.shares_storage);
  update_in_place(*model);
  EXPECT_EQ(output_at_probe(*model), 32.0f);
  EXPECT_EQ(values_of(live_state(*model)), (std::vector<float>{7, 11}));
  EXPECT_EQ(values_of(copy), (std::vector<float>{2, 1}));
  EXPECT_TRUE(compare_with_record(record, copy).matches);
}

TEST_F(BestState, DiagnosticsSeparateMappingIdentityFromStorageSharing) {
  const CapturedRoutes routes = capture_routes(model, record);
  update_in_place(*model);
  struct Expected {
    bool live_mapping, same_tensor, same_data_pointer, shares_storage;
  };
  const std::map<std::string, Expected> expected = {
      {"live_handles", {true, true, true, true}},     {"copied_container", {true, true, true, true}},
      {"parameters_only", {false, true, true, true}}, {"detached", {false, false, true, true}},
      {"cloned", {false, false, false, false}},       {"module_clone", {false, false, false, false}},
      {"snapshot", {false, false, false, false}},     {"serialized_before_update", {false, false, false, false}},
  };
  for (const RouteCandidate& route : route_candidates(routes)) {
    SCOPED_TRACE(route.candidate.route);
    const Expected& want = expected.at(route.candidate.route);
    const CandidateDiagnostics d = diagnose(route.candidate.tensors, *model);
    EXPECT_EQ(d.is_live_mapping, want.live_mapping);
    EXPECT_EQ(d.shares_storage, want.shares_storage);
    for (const auto& tensor : d.tensors) {
      EXPECT_TRUE(tensor.in_module);
      EXPECT_EQ(tensor.same_tensor, want.same_tensor) << tensor.name;
      EXPECT_EQ(tensor.same_data_pointer, want.same_data_pointer) << tensor.name;
      EXPECT_EQ(tensor.shares_storage_with,
                want.shares_storage ? std::vector<std::string>{tensor.name} : std::vector<std::string>{});
    }
  }
  const CandidateDiagnostics parameters_only = diagnose(routes.parameters_only, *model);
  EXPECT_EQ(parameters_only.missing, std::vector<std::string>{"offset"});
}

TEST(BestStateDiagnostics, AViewAtAnotherOffsetSharesStorageThoughItsDataPointerDiffers) {
  torch::nn::Module module;
  module.register_buffer("running", at::arange(4.0));
  const at::Tensor tail = module.named_buffers()["running"].narrow(0, 2, 2);
  const CandidateDiagnostics d = diagnose({{"running", tail}, {"extra", at::zeros({2})}}, module);
  EXPECT_FALSE(d.tensors[0].same_data_pointer);
  EXPECT_EQ(d.tensors[0].shares_storage_with, std::vector<std::string>{"running"});
  EXPECT_FALSE(d.tensors[1].shares_storage());
  EXPECT_EQ(d.unexpected, std::vector<std::string>{"extra"});
  EXPECT_FALSE(d.is_live_mapping);
}

// ---- the selection record ------------------------------------------------------------

TEST_F(BestState, RecordWitnessesTheSelectionAndItsOutput) {
  EXPECT_EQ(record.info.label, "synthetic-best-step-0");
  EXPECT_EQ(record.info.metric_value, 0.125);
  ASSERT_EQ(record.tensors.size(), 2u);
  EXPECT_EQ(record.tensors[0].name, "w");
  EXPECT_EQ(record.tensors[0].values_as_doubles(), std::vector<double>{2.0});
  EXPECT_EQ(record.tensors[1].name, "offset");
  EXPECT_EQ(record.tensors[1].values_as_doubles(), std::vector<double>{1.0});
  EXPECT_EQ(record.tensors[1].dtype, DType::float32);
  EXPECT_EQ(record.tensors[1].shape, std::vector<std::int64_t>{1});
  EXPECT_EQ(record.buffer_names, std::vector<std::string>{"offset"});
  EXPECT_EQ(record.probe_output.values_as_doubles(), std::vector<double>{7.0});
  EXPECT_FALSE(record.runtime.libtorch_version.empty());
  EXPECT_EQ(record.runtime.selected_at.size(), 20u);
}

TEST_F(BestState, LargeTensorsAreWitnessedByDigestOnly) {
  const TensorWitness small = witness_of("small", at::arange(16.0));
  const TensorWitness large = witness_of("large", at::arange(17.0));
  EXPECT_TRUE(small.values.has_value());
  EXPECT_FALSE(large.values.has_value());
  EXPECT_EQ(large.content_text(), "sha256 " + large.sha256.hex());
  EXPECT_FALSE(witness_of("large", at::arange(17.0) + 1).same_content(large));
}

TEST_F(BestState, LaterWritesToTheModuleOrTheCandidateCannotChangeTheRecord) {
  const Value before = record.to_value();
  NamedTensors handles = live_state(*model);
  const SelectionRecord from_handles = record_selection(tiny_selection_info(), handles, recipe, probe_input());
  update_in_place(*model);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, tensor] : handles) tensor.fill_(-1.0);
  }
  EXPECT_EQ(describe_difference(before, record.to_value()), "");
  EXPECT_EQ(from_handles.tensors[0].values_as_doubles(), std::vector<double>{2.0});
  EXPECT_EQ(from_handles.tensors[1].values_as_doubles(), std::vector<double>{1.0});
  EXPECT_EQ(from_handles.probe_output.values_as_doubles(), std::vector<double>{7.0});
}

TEST_F(BestState, RecordSurvivesItsValueLayout) {
  EXPECT_EQ(describe_record_difference(record, SelectionRecord::from_value(record.to_value())), "");
}

TEST_F(BestState, RecordLayoutFailsClosed) {
  const auto edited = [&](const std::function<void(Dict&)>& edit) {
    Dict copy = record.to_value().as_dict();
    edit(copy);
    return Value::dict(std::move(copy));
  };
  EXPECT_ERROR_CODE(SelectionRecord::from_value(edited([](Dict& d) { d.insert("extra", Value::integer(1)); })),
                    ErrorCode::selection_record_invalid);
  EXPECT_ERROR_CODE(SelectionRecord::from_value(Value::integer(3)), ErrorCode::selection_record_invalid);
  Dict without_label;
  const Value complete = record.to_value();
  for (const auto& [key, value] : complete.as_dict()) {
    if (key.as_string() != "label") without_label.insert(key, value);
  }
  EXPECT_ERROR_CODE(SelectionRecord::from_value(Value::dict(without_label)), ErrorCode::selection_record_invalid);
  // Witness values that disagree with the witness's digest.
  EXPECT_ERROR_CODE(SelectionRecord::from_value(edited([&](Dict& d) {
                      Dict witness = d.at("tensors").as_list()[0].as_dict();
                      witness.insert_or_assign("values", tensor_value(at::tensor({7.0f})));
                      d.insert_or_assign("tensors", Value::list({Value::dict(witness), d.at("tensors").as_list()[1]}));
                    })),
                    ErrorCode::selection_record_invalid);
}

TEST_F(BestState, RecordSelectionRefusesAnIncompleteRecipe) {
  EXPECT_ERROR_CODE(record_selection(tiny_selection_info(), *model, {recipe.make, {}}, probe_input()),
                    ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(record_selection(tiny_selection_info(), *model, recipe, at::Tensor()), ErrorCode::invalid_argument);
  EXPECT_ERROR_CODE(publish_selection(dir / "x.pt", record, {}, snapshot_candidate()), ErrorCode::invalid_argument);
}

// ---- the gate: every route of the fixture ----------------------------------------------

TEST_F(BestState, EveryRouteGetsTheDecisionItsStorageDictates) {
  const CapturedRoutes routes = capture_routes(model, record);
  update_in_place(*model);
  const SelectionCandidate faithful = snapshot_candidate();
  for (const RouteCandidate& route : route_candidates(routes)) {
    SCOPED_TRACE(route.candidate.route);
    const auto target = dir / (route.candidate.route + ".pt");
    const SelectionGateReport report = publish_selection(target, record, recipe, route.candidate, &faithful);
    EXPECT_EQ(report.decision, route.expected) << report.reason;
    // Whatever was published holds the selection, read back as a consumer would.
    ASSERT_TRUE(std::filesystem::exists(target));
    const SelectionEnvelope published = read_selection_envelope(target);
    EXPECT_TRUE(compare_with_record(record, published.state).matches);
    EXPECT_EQ(values_of(published.state), (std::vector<float>{2, 1}));
    EXPECT_EQ(published.route, report.decision == SelectionDecision::repair ? "snapshot" : route.candidate.route);
    const PublicationAttempt& passed = report.faithful_copy ? *report.faithful_copy : report.candidate;
    EXPECT_TRUE(passed.poisoned && passed.reloaded && passed.verified && passed.published);
    EXPECT_EQ(passed.output->values_as_doubles(), std::vector<double>{7.0});
    if (route.expected == SelectionDecision::repair) {
      EXPECT_FALSE(report.candidate.candidate.matches);
      EXPECT_FALSE(report.candidate.published);
    }
  }
  EXPECT_TRUE(staging_files(dir.path()).empty());
}

TEST_F(BestState, AliasingRoutesShowTheLaterValuesAndNameEveryMovedTensor) {
  const CapturedRoutes routes = capture_routes(model, record);
  update_in_place(*model);
  const StateComparison comparison = compare_with_record(record, routes.live_handles);
  EXPECT_FALSE(comparison.matches);
  EXPECT_EQ(comparison.first_mismatch, ErrorCode::selection_content_mismatch);
  EXPECT_EQ(comparison.detail,
            "'w' holds [7], the selection record [2]; 'offset' holds [11], the selection record [1]");
  EXPECT_ERROR_CODE(check_matches_record(record, routes.detached), ErrorCode::selection_content_mismatch);
}

TEST_F(BestState, AliasingRoutesWithoutAFaithfulCopyAreHeldAndPublishNothing) {
  const CapturedRoutes routes = capture_routes(model, record);
  update_in_place(*model);
  const std::map<std::string, ErrorCode> expected_code = {{"live_handles", ErrorCode::selection_content_mismatch},
                                                          {"copied_container", ErrorCode::selection_content_mismatch},
                                                          {"parameters_only", ErrorCode::selection_key_missing},
                                                          {"detached", ErrorCode::selection_content_mismatch}};
  for (const RouteCandidate& route : route_candidates(routes)) {
    if (route.expected != SelectionDecision::repair) continue;
    SCOPED_TRACE(route.candidate.route);
    const auto target = dir / (route.candidate.route + ".pt");
    const SelectionGateReport report = publish_selection(target, record, recipe, route.candidate);
    EXPECT_EQ(report.decision, SelectionDecision::hold) << report.reason;
    EXPECT_EQ(report.candidate.candidate.first_mismatch, expected_code.at(route.candidate.route));
    // The staged envelope itself was refused, with the same code.
    EXPECT_TRUE(report.candidate.staged);
    EXPECT_EQ(report.candidate.failure, expected_code.at(route.candidate.route));
    EXPECT_FALSE(std::filesystem::exists(target));
  }
  EXPECT_TRUE(staging_files(dir.path()).empty());
}

TEST_F(BestState, AFaithfulCopyThatAlsoLostTheSelectionIsHeld) {
  const CapturedRoutes routes = capture_routes(model, record);
  update_in_place(*model);
  const SelectionCandidate stale{"detached", routes.detached, {}};
  const SelectionGateReport report =
      publish_selection(dir / "best.pt", record, recipe, {"live_handles", routes.live_handles, {}}, &stale);
  EXPECT_EQ(report.decision, SelectionDecision::hold) << report.reason;
  ASSERT_TRUE(report.faithful_copy.has_value());
  EXPECT_EQ(report.faithful_copy->candidate.first_mismatch, ErrorCode::selection_content_mismatch);
  EXPECT_FALSE(std::filesystem::exists(dir / "best.pt"));
}

// The seed's arithmetic counterexample: w=1, offset=4 also gives 7 at x=3.
TEST_F(BestState, EqualOutputFromOtherTensorsIsStillAContentMismatch) {
  const SelectionCandidate impostor{"impostor", {{"w", at::tensor({1.0f})}, {"offset", at::tensor({4.0f})}}, {}};
  const SelectionGateReport report = publish_selection(dir / "best.pt", record, recipe, impostor);
  EXPECT_EQ(report.decision, SelectionDecision::hold);
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_content_mismatch);
}

// ---- the gate: strict keys, dtypes and shapes ----------------------------------------------

TEST_F(BestState, MissingBufferIsRefusedWithKeyMissing) {
  const SelectionCandidate candidate{"parameters_only", {{"w", at::tensor({2.0f})}}, {}};
  EXPECT_ERROR_CODE(check_matches_record(record, candidate.tensors), ErrorCode::selection_key_missing);
  const SelectionGateReport report = publish_selection(dir / "best.pt", record, recipe, candidate);
  EXPECT_EQ(report.decision, SelectionDecision::hold);
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_key_missing);
}

TEST_F(BestState, UnexpectedTensorIsRefusedWithKeyUnexpected) {
  NamedTensors tensors = selected_copy;
  tensors.emplace_back("scale", at::tensor({1.0f}));
  EXPECT_ERROR_CODE(check_matches_record(record, tensors), ErrorCode::selection_key_unexpected);
  const SelectionGateReport report = publish_selection(dir / "best.pt", record, recipe, {"extra", tensors, {}});
  EXPECT_EQ(report.decision, SelectionDecision::hold);
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_key_unexpected);
}

TEST_F(BestState, RepeatedNameIsRefusedWithKeyUnexpected) {
  NamedTensors tensors = selected_copy;
  tensors.push_back(selected_copy[0]);
  EXPECT_ERROR_CODE(check_matches_record(record, tensors), ErrorCode::selection_key_unexpected);
}

TEST_F(BestState, OtherDtypeOrShapeIsRefusedWithItsOwnCode) {
  EXPECT_ERROR_CODE(check_matches_record(record, {{"w", at::tensor({2.0})}, {"offset", at::tensor({1.0f})}}),
                    ErrorCode::selection_dtype_mismatch);
  EXPECT_ERROR_CODE(check_matches_record(record, {{"w", at::tensor({2.0f, 2.0f})}, {"offset", at::tensor({1.0f})}}),
                    ErrorCode::selection_shape_mismatch);
}

// A receiving module of another definition: the strict load refuses it, and
// since the candidate does hold the selection, the verdict is RERUN.
struct WiderImpl : torch::nn::Cloneable<WiderImpl> {
  WiderImpl() { reset(); }
  void reset() override {
    w = register_parameter("w", at::tensor({0.0f}));
    offset = register_buffer("offset", at::tensor({0.0f}));
    scale = register_buffer("scale", at::tensor({1.0f}));
  }
  at::Tensor w, offset, scale;
};

struct NarrowerImpl : torch::nn::Cloneable<NarrowerImpl> {
  NarrowerImpl() { reset(); }
  void reset() override { w = register_parameter("w", at::tensor({0.0f})); }
  at::Tensor w;
};

TEST_F(BestState, ReceivingModuleWithAnotherDefinitionFailsTheStrictLoad) {
  const auto forward = [](torch::nn::Module&, const at::Tensor& x) { return x; };
  const ModuleRecipe wider{[] { return std::static_pointer_cast<torch::nn::Module>(std::make_shared<WiderImpl>()); },
                           forward};
  const ModuleRecipe narrower{
      [] { return std::static_pointer_cast<torch::nn::Module>(std::make_shared<NarrowerImpl>()); }, forward};
  const std::filesystem::path accepted = publish_accepted();
  const auto before = read_file_bytes(accepted);
  for (const auto& [recipe_under_test, code] :
       {std::pair{wider, ErrorCode::state_key_missing}, std::pair{narrower, ErrorCode::state_key_unknown}}) {
    const SelectionGateReport report = publish_selection(accepted, record, recipe_under_test, snapshot_candidate());
    EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
    EXPECT_TRUE(report.candidate.candidate.matches);
    EXPECT_EQ(report.candidate.failure, code);
    EXPECT_EQ(read_file_bytes(accepted), before);
  }
  EXPECT_ERROR_CODE(record_selection(tiny_selection_info(), *model, wider, probe_input()),
                    ErrorCode::state_key_missing);
  EXPECT_TRUE(staging_files(dir.path()).empty());
}

// ---- the gate: the fresh module and the output witness -------------------------------------

TEST_F(BestState, FreshModuleIsPoisonedBeforeTheLoad) {
  SelectionGateOptions options;
  std::vector<bool> poisoned_before_load;
  options.load = [&](torch::nn::Module& fresh, const NamedTensors& state) {
    for (const auto& [name, tensor] : live_state(fresh))
      poisoned_before_load.push_back(tensor.isnan().all().item<bool>());
    strict_load(fresh, state);
  };
  const SelectionGateReport report =
      publish_selection(dir / "best.pt", record, recipe, snapshot_candidate(), nullptr, options);
  EXPECT_EQ(report.decision, SelectionDecision::accept) << report.reason;
  EXPECT_EQ(poisoned_before_load, (std::vector<bool>{true, true}));
}

TEST_F(BestState, LoadThatDoesNothingLeavesThePoisonAndIsCaught) {
  const std::filesystem::path accepted = publish_accepted();
  const auto before = read_file_bytes(accepted);
  SelectionGateOptions options;
  options.load = [](torch::nn::Module&, const NamedTensors&) {};
  const SelectionGateReport report =
      publish_selection(accepted, record, recipe, snapshot_candidate(), nullptr, options);
  EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_reload_mismatch);
  EXPECT_TRUE(report.candidate.poisoned);
  EXPECT_FALSE(report.candidate.reloaded_state.matches);
  ASSERT_TRUE(report.candidate.reloaded_state.tensors[0].observed.has_value());
  EXPECT_TRUE(std::isnan(report.candidate.reloaded_state.tensors[0].observed->values_as_doubles()->at(0)));
  EXPECT_EQ(read_file_bytes(accepted), before);
  EXPECT_TRUE(staging_files(dir.path()).empty());
}

TEST_F(BestState, LoadThatWritesOnlySomeTensorsIsCaught) {
  SelectionGateOptions options;
  options.load = [](torch::nn::Module& fresh, const NamedTensors& state) {
    at::NoGradGuard no_grad;
    live_state(fresh)[0].second.copy_(state[0].second);  // forgets the buffer
  };
  const SelectionGateReport report =
      publish_selection(dir / "best.pt", record, recipe, snapshot_candidate(), nullptr, options);
  EXPECT_EQ(report.decision, SelectionDecision::rerun);
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_reload_mismatch);
  EXPECT_FALSE(std::filesystem::exists(dir / "best.pt"));
}

TEST_F(BestState, OutputWitnessCatchesAForwardTheStateDoesNotExplain) {
  ModuleRecipe drifted = recipe;
  drifted.forward = [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<TinyImpl&>(m).forward(x) + 1; };
  const SelectionGateReport report = publish_selection(dir / "best.pt", record, drifted, snapshot_candidate());
  EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_output_mismatch);
  EXPECT_TRUE(report.candidate.reloaded_state.matches);
  EXPECT_EQ(report.candidate.output->values_as_doubles(), std::vector<double>{8.0});
  EXPECT_FALSE(std::filesystem::exists(dir / "best.pt"));
}

// ---- the gate: records carried by envelopes --------------------------------------------

TEST_F(BestState, EnvelopeFromAnotherSelectionIsRefusedThoughItsTensorsMatch) {
  SelectionInfo other = tiny_selection_info();
  other.label = "synthetic-best-step-3";
  other.step = 3;
  const SelectionRecord other_record = record_selection(other, *model, recipe, probe_input());
  const SelectionEnvelope envelope =
      decode_selection_envelope(encode_selection_envelope(other_record, {"serialized", selected_copy, {}}));
  const SelectionGateReport report = publish_selection(dir / "best.pt", record, recipe, envelope.candidate());
  EXPECT_EQ(report.decision, SelectionDecision::hold) << report.reason;
  EXPECT_EQ(report.candidate.candidate.first_mismatch, ErrorCode::selection_record_mismatch);
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_record_mismatch);
  EXPECT_FALSE(std::filesystem::exists(dir / "best.pt"));
}

TEST_F(BestState, EnvelopeOfAnotherKindIsRefused) {
  TrainingState state;
  ModuleState component(*model);
  state.add(component);
  state.save(dir / "resume.pt");
  const auto bytes = read_file_bytes(dir / "resume.pt");
  EXPECT_ERROR_CODE(decode_selection_envelope(bytes), ErrorCode::checkpoint_kind_mismatch);
  EXPECT_ERROR_CODE(read_selection_envelope(dir / "resume.pt"), ErrorCode::checkpoint_kind_mismatch);
}

// An envelope-shaped file with the given components, digests computed as the
// writer computes them (or one bit off).
void write_envelope_like(const std::filesystem::path& path,
                         const std::vector<std::pair<std::string, Value>>& components, bool wrong_digest = false) {
  Manifest manifest;
  manifest.kind = CheckpointKind::selection;
  StorageDigests digests;
  Dict root;
  for (const auto& [name, value] : components) {
    Sha256Digest digest = component_digest(value, digests);
    if (wrong_digest) digest.bytes[0] ^= 1;
    manifest.components.push_back({name, digest, contract_of(value)});
    root.insert(name, value);
  }
  root.insert(std::string(kManifestKey), manifest.to_value());
  save_mapping(path, Value::dict(std::move(root)), {.durable = false});
}

TEST_F(BestState, MalformedEnvelopesAreRefusedWithTheirOwnCodes) {
  auto bytes =
      std::make_shared<std::vector<std::byte>>(encode_selection_envelope(record, {"snapshot", selected_copy, {}}));
  const Value root = parse_checkpoint_bytes(*bytes, bytes).root;
  const Value& model_state = root.as_dict().at("model");
  const Value& selection = root.as_dict().at("selection");
  const auto path = dir / "envelope.pt";

  write_envelope_like(path, {{"model", model_state}, {"selection", selection}});
  EXPECT_TRUE(compare_with_record(record, read_selection_envelope(path).state).matches);

  write_envelope_like(path, {{"model", model_state}, {"selection", selection}}, true);
  EXPECT_ERROR_CODE(read_selection_envelope(path), ErrorCode::component_digest_mismatch);
  write_envelope_like(path, {{"model", model_state}});
  EXPECT_ERROR_CODE(read_selection_envelope(path), ErrorCode::component_missing);
  write_envelope_like(path, {{"model", model_state}, {"selection", selection}, {"optimizer", Value::dict()}});
  EXPECT_ERROR_CODE(read_selection_envelope(path), ErrorCode::component_unknown);
  write_envelope_like(path, {{"model", Value::list({model_state})}, {"selection", selection}});
  EXPECT_ERROR_CODE(read_selection_envelope(path), ErrorCode::selection_envelope_invalid);
  Dict with_count = model_state.as_dict();
  with_count.insert("num_batches_tracked", Value::integer(3));
  write_envelope_like(path, {{"model", Value::ordered_dict(with_count)}, {"selection", selection}});
  EXPECT_ERROR_CODE(read_selection_envelope(path), ErrorCode::selection_envelope_invalid);
  Dict no_route = selection.as_dict();
  no_route.insert_or_assign("artifact_route", Value::integer(6));
  write_envelope_like(path, {{"model", model_state}, {"selection", Value::dict(no_route)}});
  EXPECT_ERROR_CODE(read_selection_envelope(path), ErrorCode::selection_envelope_invalid);
}

// ---- publication negative controls ------------------------------------------------------

TEST_F(BestState, LaterStateUnderTheSelectedRecordLeavesTheAcceptedBytesUnchanged) {
  const std::filesystem::path accepted = publish_accepted();
  const auto before = read_file_bytes(accepted);
  update_in_place(*model);
  const SelectionEnvelope later =
      decode_selection_envelope(encode_selection_envelope(record, {"serialized_after_update", live_state(*model), {}}));
  EXPECT_EQ(describe_record_difference(record, later.record), "");
  const SelectionGateReport report = publish_selection(accepted, record, recipe, later.candidate());
  EXPECT_EQ(report.decision, SelectionDecision::hold) << report.reason;
  EXPECT_EQ(report.candidate.failure, ErrorCode::selection_content_mismatch);
  EXPECT_EQ(read_file_bytes(accepted), before);
  EXPECT_TRUE(staging_files(dir.path()).empty());
}

TEST_F(BestState, FailureAfterValidationBeforePublishLeavesTheAcceptedBytesUnchanged) {
  const std::filesystem::path accepted = publish_accepted();
  const auto before = read_file_bytes(accepted);
  SelectionGateOptions options;
  options.before_publish = [] { throw Error(ErrorCode::io_rename_failed, "injected before the rename"); };
  const SelectionGateReport report =
      publish_selection(accepted, record, recipe, snapshot_candidate(), nullptr, options);
  EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
  EXPECT_TRUE(report.candidate.verified);
  EXPECT_FALSE(report.candidate.published);
  EXPECT_EQ(report.candidate.failure, ErrorCode::io_rename_failed);
  EXPECT_EQ(read_file_bytes(accepted), before);
  EXPECT_TRUE(staging_files(dir.path()).empty());
}

// The gate's read-back modes: a byte the file system returns wrong after the
// staged envelope was written (planted just before the read-back maps or
// re-reads it) is refused in both, and the accepted file keeps its bytes.
TEST_F(BestState, EachReadBackModeRefusesAWrongByteInTheStagedEnvelope) {
  const std::filesystem::path accepted = publish_accepted();
  const auto before = read_file_bytes(accepted);
  for (const ReadBack mode : {ReadBack::cached, ReadBack::device}) {
    const bool device = mode == ReadBack::device;
    SCOPED_TRACE(device ? "device" : "cached");
    auto tamper = std::make_shared<Tamper>();
    TamperingFileSystem fs(tamper);
    SelectionGateOptions options;
    options.file_system = &fs;
    options.read_back = mode;

    // Untouched, the mode's calls are made and the candidate is published.
    const SelectionCandidate again{"snapshot_again", selected_copy, {}};
    const SelectionGateReport clean = publish_selection(dir / "clean.pt", record, recipe, again, nullptr, options);
    EXPECT_EQ(clean.decision, SelectionDecision::accept) << clean.reason;
    EXPECT_EQ(tamper->drop_calls, device ? 1 : 0);
    if (device) {
      EXPECT_EQ(tamper->order, (std::vector<std::string>{"drop", "read"}));
    }

    tamper->order.clear();
    tamper->on_map = true;
    tamper->on_read = true;
    tamper->offset = testing::in_record_payload("data/0");
    const SelectionGateReport report = publish_selection(accepted, record, recipe, again, nullptr, options);
    EXPECT_EQ(tamper->flipped.size(), 1u) << "the flip was planted";
    EXPECT_NE(report.decision, SelectionDecision::accept) << report.reason;
    EXPECT_FALSE(report.candidate.published);
    ASSERT_TRUE(report.candidate.failure.has_value());
    EXPECT_EQ(*report.candidate.failure, device ? ErrorCode::sha256_mismatch : ErrorCode::file_changed_during_read);
    EXPECT_EQ(read_file_bytes(accepted), before);
    EXPECT_TRUE(staging_files(dir.path()).empty());
  }
}

class BestStateOnFaultFileSystem : public BestState {
 protected:
  FaultFileSystem fs;
  const std::filesystem::path target = "/run/best.pt";
  SelectionGateOptions options;

  std::string publish_accepted_on_fault_fs() {
    fs.open_directory("/run", true);
    options.file_system = &fs;
    const SelectionGateReport report =
        publish_selection(target, record, recipe, snapshot_candidate(), nullptr, options);
    EXPECT_EQ(report.decision, SelectionDecision::accept) << report.reason;
    return fs.contents(target);
  }
};

TEST_F(BestStateOnFaultFileSystem, RenameFailureLeavesTheAcceptedBytesUnchanged) {
  const std::string before = publish_accepted_on_fault_fs();
  options.before_publish = [&] { fs.fail_at(1, FaultKind::io_error, false); };  // the rename
  const SelectionGateReport report = publish_selection(target, record, recipe, snapshot_candidate(), nullptr, options);
  EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
  EXPECT_EQ(report.candidate.failure, ErrorCode::io_rename_failed);
  EXPECT_FALSE(report.candidate.published);
  EXPECT_EQ(fs.contents(target), before);
  EXPECT_EQ(fs.list("/run"), std::vector<std::string>{"best.pt"});
}

// SQLite's method: fail the N-th I/O operation of a publication, for every N,
// and check the directory after each: the accepted bytes, or the new file
// whole, and never a staging file.
TEST_F(BestStateOnFaultFileSystem, EveryFailedOperationLeavesTheAcceptedBytesOrPublishesWhole) {
  const std::string before = publish_accepted_on_fault_fs();
  const SelectionCandidate again{"snapshot_again", selected_copy, {}};  // other bytes than the accepted file's
  fs.reset_counter();
  ASSERT_EQ(publish_selection(target, record, recipe, again, nullptr, options).decision, SelectionDecision::accept);
  const std::string after = fs.contents(target);
  const std::uint64_t operations = fs.operation_count();
  int refused = 0;
  for (std::uint64_t n = 1; n <= operations; ++n) {
    SCOPED_TRACE("failing operation " + std::to_string(n) + " of " + std::to_string(operations));
    publish_accepted_on_fault_fs();
    fs.reset_counter();
    fs.fail_at(n, FaultKind::io_error, false);
    const SelectionGateReport report = publish_selection(target, record, recipe, again, nullptr, options);
    fs.clear_faults();
    EXPECT_EQ(fs.list("/run"), std::vector<std::string>{"best.pt"});
    if (report.decision == SelectionDecision::accept) {  // a staging name collision is retried
      EXPECT_EQ(fs.contents(target), after);
      continue;
    }
    ++refused;
    EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
    EXPECT_TRUE(report.candidate.failure.has_value());
    EXPECT_TRUE(report.candidate.candidate.matches);
    if (report.candidate.published) {
      EXPECT_EQ(report.candidate.failure, ErrorCode::io_sync_failed);
      EXPECT_EQ(fs.contents(target), after);
    } else {
      EXPECT_EQ(fs.contents(target), before);
    }
  }
  EXPECT_GE(refused, 5);
}

TEST_F(BestStateOnFaultFileSystem, DirectorySyncFailureAfterTheRenameIsReportedAsPublished) {
  publish_accepted_on_fault_fs();
  options.before_publish = [&] { fs.fail_at(2, FaultKind::io_error, false); };  // rename, then directory fsync
  const SelectionGateReport report = publish_selection(target, record, recipe, snapshot_candidate(), nullptr, options);
  EXPECT_EQ(report.decision, SelectionDecision::rerun) << report.reason;
  EXPECT_EQ(report.candidate.failure, ErrorCode::io_sync_failed);
  EXPECT_TRUE(report.candidate.published);
  EXPECT_EQ(fs.list("/run"), std::vector<std::string>{"best.pt"});
}

// ---- evidence ------------------------------------------------------------------------

TEST_F(BestState, EvidenceIsJson) {
  const CapturedRoutes routes = capture_routes(model, record);
  update_in_place(*model);
  const SelectionGateReport report =
      publish_selection(dir / "best.pt", record, recipe, {"live_handles", routes.live_handles, {}});
  const auto evidence = nlohmann::json::parse(to_json(report));
  EXPECT_EQ(evidence["decision"], "HOLD");
  EXPECT_EQ(evidence["candidate"]["candidate"]["first_mismatch"], "selection_content_mismatch");
  EXPECT_EQ(evidence["candidate"]["candidate"]["tensors"][0]["observed"]["values"], nlohmann::json::array({7.0}));
  EXPECT_EQ(evidence["faithful_copy"], nullptr);
  const auto selection = nlohmann::json::parse(to_json(record));
  EXPECT_EQ(selection["tensors"][1]["name"], "offset");
  EXPECT_EQ(selection["tensors"][1]["values"], nlohmann::json::array({1.0}));
  EXPECT_EQ(selection["probe"]["output"]["values"], nlohmann::json::array({7.0}));
  const auto diagnostics = nlohmann::json::parse(to_json(diagnose(routes.detached, *model)));
  EXPECT_EQ(diagnostics["shares_storage"], true);
  EXPECT_EQ(diagnostics["tensors"][0]["same_tensor"], false);
}

}  // namespace
}  // namespace holdpoint
