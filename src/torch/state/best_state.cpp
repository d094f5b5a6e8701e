// Best-state capture: copies, storage diagnostics, witnesses, the selection
// record's layout and the comparison of a candidate with it. The fresh-module
// parts (record_selection, the gate) are in best_state_gate.cpp.
#include "holdpoint/state/best_state.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <map>
#include <set>

#include "base/fail.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "state/state_fields.h"

namespace holdpoint {

using detail::fail;

NamedTensors live_state(const torch::nn::Module& module) {
  NamedTensors entries;
  for (const auto& item : module.named_parameters()) entries.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers()) entries.emplace_back(item.key(), item.value());
  return entries;
}

NamedTensors snapshot(const NamedTensors& tensors) {
  NamedTensors copies;
  copies.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    copies.emplace_back(name, tensor.defined() ? tensor.detach().clone(at::MemoryFormat::Contiguous) : tensor);
  }
  return copies;
}

NamedTensors snapshot(const torch::nn::Module& module) { return snapshot(live_state(module)); }

// ---- diagnostics -----------------------------------------------------------------

namespace {

std::string dtype_text(const at::Tensor& tensor) {
  if (!tensor.defined()) return "undefined";
  try {
    return std::string(dtype_name(from_scalar_type(tensor.scalar_type())));
  } catch (const Error&) {
    return std::string(c10::toString(tensor.scalar_type()));
  }
}

// The storage bytes of both tensors intersect (views of one storage at
// different offsets included; an empty storage intersects nothing).
bool storages_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.has_storage() || !b.has_storage()) return false;
  if (a.device() != b.device()) return false;
  const auto* a_begin = static_cast<const std::byte*>(a.storage().data());
  const auto* b_begin = static_cast<const std::byte*>(b.storage().data());
  const std::size_t a_size = a.storage().nbytes();
  const std::size_t b_size = b.storage().nbytes();
  if (!a_begin || !b_begin || a_size == 0 || b_size == 0) return false;
  const std::less<const std::byte*> before;
  return before(a_begin, b_begin + b_size) && before(b_begin, a_begin + a_size);
}

}  // namespace

CandidateDiagnostics diagnose(const NamedTensors& candidate, const torch::nn::Module& module) {
  const NamedTensors live = live_state(module);
  std::map<std::string, const at::Tensor*> live_by_name;
  for (const auto& [name, tensor] : live) live_by_name.emplace(name, &tensor);

  CandidateDiagnostics out;
  std::set<std::string> names;
  bool all_handles = true;
  for (const auto& [name, tensor] : candidate) {
    TensorStorageDiagnostic d;
    d.name = name;
    d.dtype = dtype_text(tensor);
    if (tensor.defined()) d.shape = tensor.sizes().vec();
    const auto it = live_by_name.find(name);
    d.in_module = it != live_by_name.end();
    if (d.in_module && tensor.defined()) {
      const at::Tensor& own = *it->second;
      d.same_tensor = tensor.unsafeGetTensorImpl() == own.unsafeGetTensorImpl();
      d.same_data_pointer = tensor.has_storage() && own.has_storage() && tensor.data_ptr() == own.data_ptr();
    }
    for (const auto& [live_name, live_tensor] : live) {
      if (storages_overlap(tensor, live_tensor)) d.shares_storage_with.push_back(live_name);
    }
    out.shares_storage = out.shares_storage || d.shares_storage();
    const bool first_time = names.insert(name).second;
    all_handles = all_handles && d.same_tensor && first_time;
    if (!d.in_module) out.unexpected.push_back(name);
    out.tensors.push_back(std::move(d));
  }
  for (const auto& [name, tensor] : live) {
    if (!names.count(name)) out.missing.push_back(name);
  }
  out.is_live_mapping = all_handles && out.missing.empty() && out.unexpected.empty();
  return out;
}

// ---- witnesses -------------------------------------------------------------------

bool TensorWitness::same_content(const TensorWitness& other) const noexcept {
  return dtype == other.dtype && shape == other.shape && sha256 == other.sha256;
}

std::optional<std::vector<double>> TensorWitness::values_as_doubles() const {
  if (!values) return std::nullopt;
  if (dtype == DType::complex32 || dtype == DType::complex64 || dtype == DType::complex128) return std::nullopt;
  if (!to_scalar_type(dtype)) return std::nullopt;
  const at::Tensor as_double = to_at_tensor(*values).to(at::kDouble).contiguous();
  const double* data = as_double.data_ptr<double>();
  return std::vector<double>(data, data + as_double.numel());
}

std::string TensorWitness::content_text() const {
  const auto doubles = values_as_doubles();
  if (!doubles) return "sha256 " + sha256.hex();
  std::string text = "[";
  for (std::size_t i = 0; i < doubles->size(); ++i) {
    char buffer[32];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, (*doubles)[i]).ptr;
    text += (i ? ", " : "") + std::string(buffer, end);
  }
  return text + "]";
}

TensorWitness witness_of(std::string name, const at::Tensor& tensor) {
  if (!tensor.defined()) fail(ErrorCode::invalid_argument, "tensor '", name, "' is undefined");
  at::Tensor cpu = tensor.detach();
  if (!cpu.device().is_cpu()) cpu = cpu.to(at::kCPU);
  if (cpu.is_conj() || cpu.is_neg()) cpu = cpu.resolve_conj().resolve_neg();
  cpu = cpu.contiguous();
  TensorWitness witness;
  witness.name = std::move(name);
  witness.dtype = from_scalar_type(cpu.scalar_type());
  witness.shape = cpu.sizes().vec();
  const std::size_t nbytes = static_cast<std::size_t>(cpu.numel()) * dtype_itemsize(witness.dtype);
  const std::span<const std::byte> bytes(nbytes ? static_cast<const std::byte*>(cpu.data_ptr()) : nullptr, nbytes);
  witness.sha256 = Sha256::of(bytes);
  if (cpu.numel() <= kWitnessValueLimit) witness.values = TensorData::from_bytes(witness.dtype, witness.shape, bytes);
  return witness;
}

// ---- the record's layout -----------------------------------------------------------

const TensorWitness* SelectionRecord::tensor(std::string_view name) const noexcept {
  for (const auto& witness : tensors) {
    if (witness.name == name) return &witness;
  }
  return nullptr;
}

namespace {

Value int_list(const std::vector<std::int64_t>& items) {
  Value::List list;
  for (auto item : items) list.push_back(Value::integer(item));
  return Value::list(std::move(list));
}

Value witness_value(const TensorWitness& witness) {
  Dict d;
  d.insert("name", Value::string(witness.name));
  d.insert("dtype", Value::string(std::string(dtype_name(witness.dtype))));
  d.insert("shape", int_list(witness.shape));
  d.insert("sha256", Value::string(witness.sha256.hex()));
  d.insert("values", witness.values ? Value::tensor(*witness.values) : Value::none());
  return Value::dict(std::move(d));
}

// Field readers raise state_* codes naming the field path; a record reports
// them all as selection_record_invalid with that path.
TensorWitness witness_from(const state::FieldReader& fields) {
  fields.allow_only({"name", "dtype", "shape", "sha256", "values"});
  TensorWitness witness;
  witness.name = fields.string("name");
  const auto dtype = dtype_from_name(fields.string("dtype"));
  if (!dtype) fail(ErrorCode::selection_record_invalid, fields.path_of("dtype"), " is not a dtype name");
  witness.dtype = *dtype;
  std::int64_t numel = 1;
  for (const Value& size : fields.sequence("shape")) {
    const std::int64_t n = state::integer_of(size, fields.path_of("shape"));
    if (n < 0 || (n > 0 && numel > std::numeric_limits<std::int64_t>::max() / n)) {
      fail(ErrorCode::selection_record_invalid, fields.path_of("shape"), " has a negative or overflowing size");
    }
    numel *= n;
    witness.shape.push_back(n);
  }
  const auto digest = Sha256Digest::from_hex(fields.string("sha256"));
  if (!digest) fail(ErrorCode::selection_record_invalid, fields.path_of("sha256"), " is not 64 hexadecimal digits");
  witness.sha256 = *digest;
  const Value& values = fields.required("values");
  if (numel <= kWitnessValueLimit) {
    if (!values.is_tensor()) {
      fail(ErrorCode::selection_record_invalid, fields.path_of("values"), " must hold the ", numel,
           " elements of a tensor of at most ", kWitnessValueLimit);
    }
    const TensorData& data = values.as_tensor();
    if (data.dtype != witness.dtype || data.sizes != witness.shape ||
        Sha256::of(data.contiguous_bytes()) != witness.sha256) {
      fail(ErrorCode::selection_record_invalid, fields.path_of("values"),
           " disagrees with the witness's dtype, shape or sha256");
    }
    witness.values = data;
  } else if (!values.is_none()) {
    fail(ErrorCode::selection_record_invalid, fields.path_of("values"), " must be None for a tensor of ", numel,
         " elements");
  }
  return witness;
}

}  // namespace

Value SelectionRecord::to_value() const {
  Dict run;
  run.insert("holdpoint", Value::string(runtime.holdpoint_version));
  run.insert("libtorch", Value::string(runtime.libtorch_version));
  run.insert("compiler", Value::string(runtime.compiler));
  run.insert("selected_at", Value::string(runtime.selected_at));
  run.insert("intra_op_threads", Value::integer(runtime.intra_op_threads));
  Value::List witnesses;
  for (const auto& witness : tensors) witnesses.push_back(witness_value(witness));
  Value::List buffers;
  for (const auto& name : buffer_names) buffers.push_back(Value::string(name));
  Dict probe;
  probe.insert("input", Value::tensor(probe_input));
  probe.insert("output", witness_value(probe_output));

  Dict d;
  d.insert("label", Value::string(info.label));
  d.insert("step", Value::integer(info.step));
  d.insert("metric_name", Value::string(info.metric_name));
  d.insert("metric_value", Value::floating(info.metric_value));
  d.insert("source", Value::string(info.source));
  d.insert("runtime", Value::dict(std::move(run)));
  d.insert("tensors", Value::list(std::move(witnesses)));
  d.insert("buffers", Value::list(std::move(buffers)));
  d.insert("probe", Value::dict(std::move(probe)));
  return Value::dict(std::move(d));
}

SelectionRecord SelectionRecord::from_value(const Value& value) {
  try {
    if (!value.is_dict()) fail(ErrorCode::selection_record_invalid, "selection.record is not a dict");
    const state::FieldReader fields(value, "selection.record");
    fields.allow_only(
        {"label", "step", "metric_name", "metric_value", "source", "runtime", "tensors", "buffers", "probe"});
    SelectionRecord record;
    record.info.label = fields.string("label");
    record.info.step = fields.integer("step");
    record.info.metric_name = fields.string("metric_name");
    record.info.metric_value = fields.number("metric_value");
    record.info.source = fields.string("source");

    const state::FieldReader run = fields.child("runtime");
    run.allow_only({"holdpoint", "libtorch", "compiler", "selected_at", "intra_op_threads"});
    record.runtime = {run.string("holdpoint"), run.string("libtorch"), run.string("compiler"),
                      run.string("selected_at"), run.integer("intra_op_threads")};

    std::set<std::string> names;
    const Value::List& witnesses = fields.sequence("tensors");
    for (std::size_t i = 0; i < witnesses.size(); ++i) {
      const std::string path = detail::concat(fields.path_of("tensors"), "[", i, "]");
      if (!witnesses[i].is_dict()) fail(ErrorCode::selection_record_invalid, path, " is not a dict");
      record.tensors.push_back(witness_from(state::FieldReader(witnesses[i], path)));
      if (!names.insert(record.tensors.back().name).second) {
        fail(ErrorCode::selection_record_invalid, path, " repeats the name '", record.tensors.back().name, "'");
      }
    }
    for (const Value& name : fields.sequence("buffers")) {
      if (!name.is_string() || !names.count(name.as_string())) {
        fail(ErrorCode::selection_record_invalid, fields.path_of("buffers"), " names a tensor the record lacks");
      }
      record.buffer_names.push_back(name.as_string());
    }
    const state::FieldReader probe = fields.child("probe");
    probe.allow_only({"input", "output"});
    record.probe_input = probe.tensor("input");
    if (!probe.required("output").is_dict()) {
      fail(ErrorCode::selection_record_invalid, probe.path_of("output"), " is not a dict");
    }
    record.probe_output = witness_from(probe.child("output"));
    return record;
  } catch (const Error& error) {
    if (error.code() == ErrorCode::selection_record_invalid) throw;
    fail(ErrorCode::selection_record_invalid, error.detail());
  }
}

std::string describe_record_difference(const SelectionRecord& trusted, const SelectionRecord& other) {
  return describe_difference(trusted.to_value(), other.to_value());
}

// ---- comparing with the record -------------------------------------------------------

namespace {

// Key problems are reported before layout problems, layout before content: a
// missing buffer says more than the digest of a tensor that is there.
int severity(ErrorCode code) {
  switch (code) {
    case ErrorCode::selection_key_missing:
      return 0;
    case ErrorCode::selection_key_unexpected:
      return 1;
    case ErrorCode::selection_dtype_mismatch:
      return 2;
    case ErrorCode::selection_shape_mismatch:
      return 3;
    default:
      return 4;
  }
}

}  // namespace

StateComparison compare_with_record(const SelectionRecord& record, const NamedTensors& tensors) {
  StateComparison out;
  std::map<std::string, const at::Tensor*> by_name;
  std::vector<std::string> repeated;
  for (const auto& [name, tensor] : tensors) {
    if (!by_name.emplace(name, &tensor).second) repeated.push_back(name);
  }
  for (const auto& expected : record.tensors) {
    WitnessComparison c;
    c.name = expected.name;
    const auto it = by_name.find(expected.name);
    if (it == by_name.end()) {
      c.mismatch = ErrorCode::selection_key_missing;
      c.detail = detail::concat("the candidate lacks '", expected.name, "', which the selection record holds");
    } else if (!it->second->defined()) {
      c.mismatch = ErrorCode::selection_content_mismatch;
      c.detail = detail::concat("'", expected.name, "' is an undefined tensor");
    } else {
      c.observed = witness_of(expected.name, *it->second);
      if (c.observed->dtype != expected.dtype) {
        c.mismatch = ErrorCode::selection_dtype_mismatch;
        c.detail = detail::concat("'", expected.name, "' has dtype ", dtype_name(c.observed->dtype),
                                  ", the selection record ", dtype_name(expected.dtype));
      } else if (c.observed->shape != expected.shape) {
        c.mismatch = ErrorCode::selection_shape_mismatch;
        c.detail = detail::concat("'", expected.name, "' has shape ", shape_text(c.observed->shape),
                                  ", the selection record ", shape_text(expected.shape));
      } else if (c.observed->sha256 != expected.sha256) {
        c.mismatch = ErrorCode::selection_content_mismatch;
        c.detail = detail::concat("'", expected.name, "' holds ", c.observed->content_text(), ", the selection record ",
                                  expected.content_text());
      }
    }
    c.matches = !c.mismatch;
    out.tensors.push_back(std::move(c));
  }
  for (const auto& [name, tensor] : tensors) {
    if (record.tensor(name)) continue;
    WitnessComparison c;
    c.name = name;
    c.mismatch = ErrorCode::selection_key_unexpected;
    c.detail = detail::concat("the candidate holds '", name, "', which the selection record does not");
    out.tensors.push_back(std::move(c));
  }
  for (const auto& name : repeated) {
    WitnessComparison c;
    c.name = name;
    c.mismatch = ErrorCode::selection_key_unexpected;
    c.detail = detail::concat("the candidate holds '", name, "' twice");
    out.tensors.push_back(std::move(c));
  }

  // The first mismatch of the most telling kind; content mismatches are all
  // listed, so a message shows every tensor that moved.
  const WitnessComparison* first = nullptr;
  std::string content_detail;
  for (const auto& c : out.tensors) {
    if (!c.mismatch) continue;
    if (!first || severity(*c.mismatch) < severity(*first->mismatch)) first = &c;
    if (*c.mismatch == ErrorCode::selection_content_mismatch) {
      content_detail += (content_detail.empty() ? "" : "; ") + c.detail;
    }
  }
  out.matches = !first;
  if (first) {
    out.first_mismatch = first->mismatch;
    out.detail = *first->mismatch == ErrorCode::selection_content_mismatch ? content_detail : first->detail;
  }
  return out;
}

void check_matches_record(const SelectionRecord& record, const NamedTensors& tensors) {
  const StateComparison comparison = compare_with_record(record, tensors);
  if (!comparison.matches) fail(*comparison.first_mismatch, comparison.detail);
}

}  // namespace holdpoint
