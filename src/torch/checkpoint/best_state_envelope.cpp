// Selection envelopes: a holdpoint checkpoint of kind "selection" holding the
// model state and the selection record (docs/best-state.md).
#include "checkpoint/best_state_envelope.h"

#include <torch/version.h>

#include <set>

#include "base/fail.h"
#include "format/pt_writer.h"
#include "schema/component_writer.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/state/component.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "holdpoint_version.h"

namespace holdpoint {

using detail::fail;

namespace selection {

namespace {

constexpr std::string_view kModelComponent = "model";
constexpr std::string_view kSelectionComponent = "selection";

Value state_value(const NamedTensors& state) {
  Dict entries;
  for (const auto& [name, tensor] : state) {
    if (!tensor.defined()) fail(ErrorCode::invalid_argument, "the state's tensor '", name, "' is undefined");
    if (!entries.insert(name, tensor_value(tensor.detach()))) {
      fail(ErrorCode::invalid_argument, "the state names '", name, "' twice");
    }
  }
  return Value::ordered_dict(std::move(entries));
}

// torch 1.13's weights_only loader has no BINFLOAT, so floats travel as 0-d
// float64 tensors (docs/format.md; Value::as_number reads them back). They
// are made once, here: the pickle writer's own conversion makes a new storage
// on every pass, and the storages-first writer pickles the root twice.
Value floats_as_tensors(const Value& value) {
  switch (value.kind()) {
    case ValueKind::floating: {
      const double number = value.as_double();
      return Value::tensor(TensorData::from_bytes(
          DType::float64, {}, std::span(reinterpret_cast<const std::byte*>(&number), sizeof number)));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : value.as_list()) items.push_back(floats_as_tensors(item));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, floats_as_tensors(item));
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default:
      return value;
  }
}

SelectionEnvelope envelope_from_root(const Value& root) {
  if (!root.is_dict()) {
    fail(ErrorCode::selection_envelope_invalid, "the file holds a ", value_kind_name(root.kind()),
         ", not a selection envelope");
  }
  const Dict& top = root.as_dict();
  const Manifest manifest = Manifest::of_root(root);
  if (manifest.kind != CheckpointKind::selection) {
    fail(ErrorCode::checkpoint_kind_mismatch, "the checkpoint's kind is '", checkpoint_kind_name(manifest.kind),
         "'; a selection envelope has kind 'selection'");
  }
  for (const auto name : {kModelComponent, kSelectionComponent}) {
    if (!top.find(name) || !manifest.component(std::string(name))) {
      fail(ErrorCode::component_missing, "the envelope has no '", name, "' component");
    }
  }
  for (const auto& [key, value] : top) {
    const bool known = key.is_string() && (key.as_string() == kManifestKey || key.as_string() == kModelComponent ||
                                           key.as_string() == kSelectionComponent);
    if (!known) fail(ErrorCode::component_unknown, "the envelope holds ", key.to_string(), ", which it never has");
  }
  if (manifest.components.size() != 2) {
    fail(ErrorCode::component_unknown, "the manifest records ", manifest.components.size(),
         " components; an envelope has 'model' and 'selection'");
  }
  StorageDigests digests(manifest.storage_digest);
  for (const auto& record : manifest.components) {
    const Value& state = top.at(record.name);
    if (component_digest(state, digests) != record.sha256) {
      fail(ErrorCode::component_digest_mismatch, "component '", record.name,
           "' does not match the digest its manifest records");
    }
    if (!equal_content(contract_of(state), record.contract)) {
      fail(ErrorCode::component_contract_mismatch, "component '", record.name,
           "' does not have the structure its manifest records");
    }
  }

  SelectionEnvelope envelope;
  const Value& model = top.at(std::string(kModelComponent));
  if (!model.is_dict()) fail(ErrorCode::selection_envelope_invalid, "'model' is not a mapping of names to tensors");
  for (const auto& [key, value] : model.as_dict()) {
    if (!key.is_string() || !value.is_tensor()) {
      fail(ErrorCode::selection_envelope_invalid, "'model' entry ", key.to_string(), " is not a named tensor");
    }
    envelope.state.emplace_back(key.as_string(), to_at_tensor(value.as_tensor()));
  }
  const Value& selection = top.at(std::string(kSelectionComponent));
  if (!selection.is_dict() || selection.as_dict().size() != 2 || !selection.as_dict().find("record") ||
      !selection.as_dict().find("artifact_route") || !selection.as_dict().at("artifact_route").is_string()) {
    fail(ErrorCode::selection_envelope_invalid, "'selection' is not {record, artifact_route: str}");
  }
  envelope.record = SelectionRecord::from_value(selection.as_dict().at("record"));
  envelope.route = selection.as_dict().at("artifact_route").as_string();
  return envelope;
}

}  // namespace

void write_envelope(io::ByteSink& sink, const SelectionRecord& record, const std::string& route,
                    const NamedTensors& state) {
  Dict selection;
  selection.insert("record", record.to_value());
  selection.insert("artifact_route", Value::string(route));
  const schema::NamedComponents components = {
      {std::string(kModelComponent), state_value(state)},
      {std::string(kSelectionComponent), floats_as_tensors(Value::dict(std::move(selection)))}};

  Manifest manifest;
  manifest.kind = CheckpointKind::selection;
  manifest.semantic_identity = record.info.source;
  manifest.holdpoint_version = HOLDPOINT_VERSION;
  manifest.libtorch_version = TORCH_VERSION;
  manifest.compiler = __VERSION__;
  format::PtWriteOptions options;
  // The envelope is a handoff, often to Python: torch 1.13's weights_only
  // loader must read it too (docs/format.md).
  options.torch_1_13_compatible = true;
  schema::write_components(sink, std::move(manifest), components, options);
}

SelectionEnvelope parse_envelope(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
  return envelope_from_root(parse_checkpoint_bytes(bytes, owner).root);
}

}  // namespace selection

std::vector<std::byte> encode_selection_envelope(const SelectionRecord& record, const SelectionCandidate& candidate) {
  io::MemorySink sink;
  selection::write_envelope(sink, record, candidate.route, candidate.tensors);
  return sink.take();
}

SelectionEnvelope decode_selection_envelope(std::vector<std::byte> bytes) {
  auto owner = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  return selection::parse_envelope(*owner, owner);
}

SelectionEnvelope read_selection_envelope(const std::filesystem::path& path) {
  try {
    return selection::envelope_from_root(load_checkpoint_mapping(path).root);
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

}  // namespace holdpoint
