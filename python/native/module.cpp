// holdpoint._native: the Python package's bridge to the LibTorch-free core.
//
// It converts between holdpoint's Value tree and Python objects and nothing
// more; every rule (what is read, the limits, the digest, atomic publication)
// stays in the core. Tensors cross zero-copy in both directions:
//   - reading, each storage of the private snapshot is handed to Python as a
//     StorageBuffer (buffer protocol) that owns it; the tensor factory given
//     by holdpoint/_convert.py wraps it with torch.frombuffer or NumPy, so the
//     snapshot lives exactly as long as some view of it does;
//   - writing, a tensor arrives as (buffer, dtype, shape, stride, offset, ...)
//     from the same module, and the Storage written views the buffer, holding a
//     reference to it until the save returns.
// The GIL is released while files are read, hashed, parsed or written.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <type_traits>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/run/dcp_generation.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/run/provenance.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/verify/checkpoint_diff.h"
#include "holdpoint_version.h"

#include "holdpoint/schema/manifest.h"
#include "holdpoint/schema/resume_profile.h"

#include "base/fail.h"
#include "base/regular_file.h"
#include "schema/in_place_source.h"
#include "format/resume_scan.h"
#include "holdpoint/base/memory.h"
#include "format/pt_writer.h"
#include "format/value/half_float.h"
#include "format/publish_file.h"
#include "schema/checkpoint_bytes.h"
#include "schema/component_writer.h"
#include "schema/resume_checks.h"

namespace py = pybind11;

namespace holdpoint::python {
namespace {

// ---- errors -------------------------------------------------------------------------------

// holdpoint.Error (holdpoint/_errors.py), looked up once the module is imported.
py::object& error_class() {
  static py::object* cls = new py::object();  // never destroyed: outlives the interpreter's teardown order
  return *cls;
}

void translate_errors(std::exception_ptr pending) {
  try {
    if (pending) std::rethrow_exception(pending);
  } catch (const Error& error) {
    py::object exc = error_class()(std::string(error.what()), std::string(error_code_name(error.code())),
                                   error.path().empty() ? py::object(py::none()) : py::object(py::str(error.path())),
                                   error.detail());
    PyErr_SetObject(error_class().ptr(), exc.ptr());
  }
}

[[noreturn]] void fail_argument(const std::string& message) { throw Error(ErrorCode::invalid_argument, message); }

// ---- options ------------------------------------------------------------------------------

Limits limits_from(const py::object& given) {
  Limits limits;
  if (given.is_none()) return limits;
  if (!py::isinstance<py::dict>(given)) fail_argument("limits must be a dict of Limits fields, not " + std::string(py::str(given.get_type())));
  for (const auto& [key, value] : given.cast<py::dict>()) {
    const std::string name = py::str(key);
    if (name == "allow_zero_crc") {
      limits.allow_zero_crc = value.cast<bool>();
      continue;
    }
    const auto number = value.cast<std::uint64_t>();
    const auto set = [&](auto& field) {
      using Field = std::remove_reference_t<decltype(field)>;
      if (number > std::numeric_limits<Field>::max()) {
        fail_argument("limits['" + name + "'] = " + std::to_string(number) + " is above " +
                      std::to_string(std::numeric_limits<Field>::max()));
      }
      field = static_cast<Field>(number);
    };
#define HOLDPOINT_LIMIT(field) \
  if (name == #field) {        \
    set(limits.field);         \
    continue;                  \
  }
    HOLDPOINT_LIMIT(max_file_bytes)
    HOLDPOINT_LIMIT(max_records)
    HOLDPOINT_LIMIT(max_central_directory_bytes)
    HOLDPOINT_LIMIT(max_pickle_bytes)
    HOLDPOINT_LIMIT(max_opcodes)
    HOLDPOINT_LIMIT(max_stack_items)
    HOLDPOINT_LIMIT(max_mark_depth)
    HOLDPOINT_LIMIT(max_nesting_depth)
    HOLDPOINT_LIMIT(max_memo_entries)
    HOLDPOINT_LIMIT(max_string_bytes)
    HOLDPOINT_LIMIT(max_container_elements)
    HOLDPOINT_LIMIT(max_expanded_nodes)
    HOLDPOINT_LIMIT(max_tensors)
    HOLDPOINT_LIMIT(max_tensor_rank)
    HOLDPOINT_LIMIT(max_tensor_numel)
    HOLDPOINT_LIMIT(max_tensor_logical_bytes)
    HOLDPOINT_LIMIT(max_view_expansion)
    HOLDPOINT_LIMIT(max_distributed_checkpoint_bytes)
    HOLDPOINT_LIMIT(max_safetensors_header_bytes)
    HOLDPOINT_LIMIT(max_json_depth)
#undef HOLDPOINT_LIMIT
    fail_argument("limits has no field '" + name + "' (docs/format.md, section 9)");
  }
  return limits;
}

// holdpoint.TrustPolicy as the package hands it over: None, or
// {"keys": [paths], "revoked": [paths], "required": bool, "min_head_step": int
// or None, "expected_head": int (a step), str (a SHA-256) or None}.
std::optional<TrustPolicy> trust_from(const py::object& trust) {
  if (trust.is_none()) return std::nullopt;
  const py::dict fields = trust.cast<py::dict>();
  TrustPolicy policy;
  policy.required = fields["required"].cast<bool>();
  for (const auto& key_file : fields["keys"].cast<std::vector<std::string>>()) {
    for (VerifyingKey& key : VerifyingKey::read_file(key_file)) policy.keys.push_back(std::move(key));
  }
  for (const auto& list : fields["revoked"].cast<std::vector<std::string>>()) policy.read_revocation_list(list);
  if (fields.contains("min_head_step") && !fields["min_head_step"].is_none()) {
    policy.min_head_step = fields["min_head_step"].cast<std::int64_t>();
  }
  if (fields.contains("expected_head") && !fields["expected_head"].is_none()) {
    const py::object head = fields["expected_head"];
    if (py::isinstance<py::str>(head)) {
      policy.expected_head_sha256 = Sha256Digest::parse(head.cast<std::string>());
    } else {
      policy.expected_head_step = head.cast<std::int64_t>();
    }
  }
  return policy;
}

LoadOptions load_options(const py::object& expected_sha256, const py::object& limits,
                         const py::object& trust = py::none()) {
  LoadOptions options;
  options.limits = limits_from(limits);
  if (!expected_sha256.is_none()) options.expected_sha256 = Sha256Digest::parse(expected_sha256.cast<std::string>());
  options.trust = trust_from(trust);
  return options;
}

py::list checks_list(const std::vector<GenerationCheck>& checks) {
  py::list out;
  for (const GenerationCheck& check : checks) {
    py::dict entry;
    entry["name"] = check.name;
    entry["ok"] = check.ok;
    entry["code"] = check.code ? py::object(py::str(std::string(error_code_name(*check.code)))) : py::object(py::none());
    entry["detail"] = check.detail;
    out.append(entry);
  }
  return out;
}

// holdpoint.diff: (json, text) of diff_checkpoints.
py::tuple diff_files(const std::filesystem::path& a, const std::filesystem::path& b, double atol, double rtol,
                     const py::object& limits, const py::object& trust) {
  DiffOptions options;
  options.atol = atol;
  options.rtol = rtol;
  options.load = load_options(py::none(), limits, trust);
  CheckpointDiff result;
  {
    py::gil_scoped_release released;
    result = diff_checkpoints(a, b, options);
  }
  return py::make_tuple(result.json(), result.text());
}

// holdpoint.sign: FILE.sig for one checkpoint file.
py::dict sign_file(const std::filesystem::path& path, const std::filesystem::path& key_file,
                   const py::object& previous_sha256, const py::object& limits) {
  SignatureFile signature;
  {
    py::gil_scoped_release released;
    const SigningKey key = SigningKey::read_file(key_file);
    LoadOptions options;
    options.limits = limits_from(limits);
    SignedStatement statement = checkpoint_statement(path, options);
    if (!previous_sha256.is_none()) statement.previous_sha256 = Sha256Digest::parse(previous_sha256.cast<std::string>());
    signature = key.sign(statement);
    write_signature_file(path, signature);
  }
  py::dict out;
  out["signature"] = signature_path(path).string();
  out["key_id"] = signature.key_id;
  out["sha256"] = signature.statement.sha256.hex();
  out["bytes"] = signature.statement.size;
  return out;
}

// ---- Value -> Python ----------------------------------------------------------------------

// The bytes of one storage, exported read-write (they are the load's private
// copy) through the buffer protocol; the storage, and with it the snapshot,
// lives as long as this object.
struct StorageBuffer {
  std::shared_ptr<const Storage> storage;
};

// torch's value types (torch.dtype, torch.Size, torch.device, torch.layout),
// once torch is imported; holdpoint itself never imports it for them.
struct TorchTypes {
  py::object module, dtype, size, device, layout;

  // The types, if torch is in sys.modules (or `import_it` and it imports);
  // nullptr otherwise.
  static const TorchTypes* get(bool import_it) {
    static TorchTypes* types = nullptr;
    if (types) return types;
    py::object torch;
    py::dict modules = py::module_::import("sys").attr("modules");
    if (modules.contains("torch")) {
      torch = modules["torch"];
    } else if (import_it) {
      try {
        torch = py::module_::import("torch");
      } catch (const py::error_already_set&) {
        return nullptr;
      }
    } else {
      return nullptr;
    }
    types = new TorchTypes{torch, torch.attr("dtype"), torch.attr("Size"), torch.attr("device"), torch.attr("layout")};
    return types;
  }
};

class ToPython {
 public:
  // `absent`, for a resume in place: the record index of each storage the
  // first pass left out; its tensors get ("absent", index, bytes) as buffer.
  explicit ToPython(py::object make_tensor, const std::unordered_map<const void*, std::size_t>* absent = nullptr)
      : make_tensor_(std::move(make_tensor)), absent_(absent) {}

  // A container, tensor or bytearray the file shares (one object referenced
  // twice, docs/format.md §5.6) becomes one Python object referenced twice, as
  // torch.load gives it.
  py::object convert(const Value& value) {
    switch (value.kind()) {
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::dict:
      case ValueKind::ordered_dict:
      case ValueKind::set:
      case ValueKind::tensor:
      case ValueKind::meta_tensor:
      case ValueKind::sparse_tensor:
      case ValueKind::bytearray: {
        const void* identity = value.node_identity();
        if (const auto found = shared_.find(identity); found != shared_.end()) return found->second;
        py::object object = value.kind() == ValueKind::tensor          ? tensor(value.as_tensor())
                            : value.kind() == ValueKind::meta_tensor   ? meta_tensor(value.as_meta_tensor())
                            : value.kind() == ValueKind::sparse_tensor ? sparse_tensor(value.as_sparse_tensor())
                            : value.kind() == ValueKind::bytearray     ? scalar(value)
                                                                       : container(value);
        shared_.emplace(identity, object);
        return object;
      }
      default: return scalar(value);
    }
  }

 private:
  py::object container(const Value& value) {
    switch (value.kind()) {
      case ValueKind::list: {
        py::list out(value.as_list().size());
        std::size_t i = 0;
        for (const Value& item : value.as_list()) out[i++] = convert(item);
        return out;
      }
      case ValueKind::tuple: {
        py::tuple out(value.as_list().size());
        std::size_t i = 0;
        for (const Value& item : value.as_list()) out[i++] = convert(item);
        return out;
      }
      case ValueKind::set: {
        py::set out;
        for (const Value& item : value.as_list()) out.add(convert(item));
        return out;
      }
      default: {  // dict or OrderedDict
        py::object out = value.is_ordered_dict() ? ordered_dict()() : py::dict();
        for (const auto& [key, item] : value.as_dict()) {
          py::object py_key = key.is_string()    ? py::object(py::str(key.as_string()))
                              : key.is_integer() ? py::object(py::int_(key.as_int()))
                                                 : convert(key.value());
          out[py_key] = convert(item);
        }
        if (const auto& metadata = value.as_dict().metadata()) out.attr("_metadata") = convert(*metadata);
        return out;
      }
    }
  }

  py::object scalar(const Value& value) {
    if (const auto numpy = value.numpy_scalar_dtype()) return numpy_scalar(*numpy, value, plain_scalar(value));
    return plain_scalar(value);
  }

  // numpy.<dtype>(plain), as NumPy's own unpickling gives it; the plain value
  // where NumPy does not import. float32 and complex64 scalars, and float16
  // NaNs, are rebuilt from their bits: the reader keeps a NaN's whole mantissa
  // in the double's top bits, so its payload (and a signaling NaN) survive.
  static py::object numpy_scalar(DType dtype, const Value& value, py::object plain) {
    static py::object* numpy = [] {
      try {
        return new py::object(py::module_::import("numpy"));
      } catch (const py::error_already_set&) {
        return new py::object();
      }
    }();
    if (!*numpy) return plain;
    const std::string name(dtype_name(dtype));
    // A double the reader made from a float32, back to that float's bits.
    const auto narrow = [](double wide) -> std::uint32_t {
      return std::isnan(wide) ? holdpoint::value::narrow_nan_bits(wide, 23)
                              : std::bit_cast<std::uint32_t>(static_cast<float>(wide));
    };
    std::string raw;
    const auto append = [&raw](auto bits) { raw.append(reinterpret_cast<const char*>(&bits), sizeof bits); };
    if (dtype == DType::float32 && value.is_double()) {
      append(narrow(value.as_double()));
    } else if (dtype == DType::complex64 && value.is_complex()) {
      append(narrow(value.as_complex().real()));
      append(narrow(value.as_complex().imag()));
    } else if (dtype == DType::float16 && value.is_double() && std::isnan(value.as_double())) {
      append(static_cast<std::uint16_t>(holdpoint::value::narrow_nan_bits(value.as_double(), 10)));
    } else {
      return numpy->attr("dtype")(name).attr("type")(plain);
    }
    return numpy->attr("frombuffer")(py::bytes(raw), name)[py::int_(0)];
  }

  py::object plain_scalar(const Value& value) {
    switch (value.kind()) {
      case ValueKind::none: return py::none();
      case ValueKind::boolean: return py::bool_(value.as_bool());
      case ValueKind::integer: return py::int_(value.as_int());
      case ValueKind::big_integer: {
        static py::object* from_bytes = new py::object(py::module_::import("builtins").attr("int").attr("from_bytes"));
        return (*from_bytes)(py::bytes(std::string(value.as_big_integer())), "little", py::arg("signed") = true);
      }
      case ValueKind::floating: return py::float_(value.as_double());
      case ValueKind::string: return py::str(value.as_string());
      case ValueKind::bytes: return py::bytes(value.as_bytes());
      case ValueKind::tensor:
      case ValueKind::meta_tensor:
      case ValueKind::sparse_tensor: return convert(value);
      case ValueKind::complex_number: {
        const std::complex<double> z = value.as_complex();
        return py::reinterpret_steal<py::object>(PyComplex_FromDoubles(z.real(), z.imag()));
      }
      case ValueKind::bytearray: {
        const std::string_view bytes = value.as_bytes();
        return py::reinterpret_steal<py::object>(
            PyByteArray_FromStringAndSize(bytes.data(), static_cast<Py_ssize_t>(bytes.size())));
      }
      // torch's own types come back as themselves where torch imports, as
      // torch.load returns them; without torch, as their plain data.
      case ValueKind::device: {
        const TorchTypes* torch = TorchTypes::get(true);
        return torch ? torch->device(value.as_device()) : py::object(py::str(value.as_device()));
      }
      case ValueKind::dtype: {
        const std::string name(dtype_name(value.as_dtype()));
        const TorchTypes* torch = TorchTypes::get(true);
        return torch ? torch->module.attr(name.c_str()) : py::object(py::str("torch." + name));
      }
      case ValueKind::size: {
        py::tuple dims(value.as_list().size());
        std::size_t i = 0;
        for (const Value& item : value.as_list()) dims[i++] = py::int_(item.as_int());
        const TorchTypes* torch = TorchTypes::get(true);
        return torch ? torch->size(dims) : py::object(dims);
      }
      case ValueKind::layout: {
        const TorchTypes* torch = TorchTypes::get(true);
        if (!torch) return py::str(value.as_layout());
        return torch->module.attr(value.as_layout().substr(std::string_view("torch.").size()).c_str());
      }
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::dict:
      case ValueKind::ordered_dict:
      case ValueKind::set: return convert(value);
    }
    return py::none();
  }

  static py::object& ordered_dict() {
    static py::object* cls = new py::object(py::module_::import("collections").attr("OrderedDict"));
    return *cls;
  }

  py::object tensor(const TensorData& t) {
    // One buffer per storage, so that views of one storage share it in Python too.
    // A scan (inspect) keeps no bytes: the factory then gets None.
    py::object& buffer = buffers_[t.storage->identity()];
    if (!buffer) {
      if (t.storage->has_bytes()) {
        buffer = py::cast(StorageBuffer{t.storage});
      } else if (absent_ && absent_->count(t.storage->identity())) {
        buffer = py::make_tuple("absent", absent_->at(t.storage->identity()), t.storage->nbytes());
      } else {
        buffer = py::none();
      }
    }
    py::tuple shape(t.sizes.size()), stride(t.strides.size());
    for (std::size_t d = 0; d < t.sizes.size(); ++d) {
      shape[d] = py::int_(t.sizes[d]);
      stride[d] = py::int_(t.strides[d]);
    }
    return make_tensor_(buffer, py::str(std::string(dtype_name(t.dtype))), shape, stride, t.storage_offset,
                        t.requires_grad, t.is_parameter, t.from_numpy, t.conjugate, t.negative);
  }

  // A tensor on the meta device: the factory gets "meta" as its buffer.
  py::object meta_tensor(const TensorData& t) {
    py::tuple shape(t.sizes.size()), stride(t.strides.size());
    for (std::size_t d = 0; d < t.sizes.size(); ++d) {
      shape[d] = py::int_(t.sizes[d]);
      stride[d] = py::int_(t.strides[d]);
    }
    return make_tensor_(py::str("meta"), py::str(std::string(dtype_name(t.dtype))), shape, stride, 0,
                        t.requires_grad, t.is_parameter, false, false, false);
  }

  // A sparse tensor: its parts made as the tensors they are, then
  // holdpoint._convert.sparse_tensor builds torch's (or, without torch or in
  // an inspect tree, a description holding the parts).
  py::object sparse_tensor(const SparseTensor& sparse) {
    static py::object* build = new py::object(py::module_::import("holdpoint._convert").attr("sparse_tensor"));
    py::tuple parts(sparse.parts.size());
    for (std::size_t i = 0; i < sparse.parts.size(); ++i) parts[i] = convert(sparse.parts[i]);
    py::tuple size(sparse.sizes.size());
    for (std::size_t d = 0; d < sparse.sizes.size(); ++d) size[d] = py::int_(sparse.sizes[d]);
    return (*build)(py::str(sparse.layout), parts, size,
                    sparse.coalesced ? py::object(py::bool_(*sparse.coalesced)) : py::object(py::none()),
                    sparse.requires_grad, sparse.is_parameter);
  }

  py::object make_tensor_;
  const std::unordered_map<const void*, std::size_t>* absent_;
  std::unordered_map<const void*, py::object> buffers_;
  std::unordered_map<const void*, py::object> shared_;  // by Value::node_identity()
};

py::dict mapping_info(const LoadedMapping& mapping) {
  py::dict info;
  info["format"] = std::string(file_format_name(mapping.format));
  info["sha256"] = mapping.sha256 ? py::object(py::str(mapping.sha256->hex())) : py::object(py::none());
  info["digest_checked"] = mapping.digest_checked;
  info["bytes"] = mapping.file_bytes;
  info["warnings"] = mapping.warnings;
  return info;
}

// ---- Python -> Value ----------------------------------------------------------------------

// Holds a Python object for a Storage; released under the GIL from any thread.
struct PythonOwner {
  py::object object;
  ~PythonOwner() {
    py::gil_scoped_acquire gil;
    object = py::object();
  }
};

class FromPython {
 public:
  explicit FromPython(py::object tensor_parts) : tensor_parts_(std::move(tensor_parts)) {
    ordered_dict_ = py::module_::import("collections").attr("OrderedDict");
  }

  // A container, bytearray or tensor met twice becomes one shared Value, which
  // the writer memoizes, so the file keeps the sharing as torch.save's does
  // (immutable scalars need no identity). A container that holds itself is
  // refused: no reader of holdpoint's takes a cycle (docs/format.md §5.6).
  Value convert(const py::handle& object, int depth = 0) {
    PyObject* raw = object.ptr();
    if (raw == Py_None || PyBool_Check(raw) || PyLong_CheckExact(raw) || PyFloat_CheckExact(raw) ||
        PyUnicode_CheckExact(raw) || PyBytes_CheckExact(raw) || PyComplex_CheckExact(raw)) {
      return convert_one(object, depth);
    }
    if (const auto found = converted_.find(raw); found != converted_.end()) return found->second;
    if (!in_progress_.insert(raw).second) {
      throw Error(ErrorCode::write_value_unsupported,
                  "save: a " + std::string(py::str(object.get_type().attr("__name__"))) +
                      " holds itself (a cycle); holdpoint writes and reads only acyclic data");
    }
    Value value = convert_one(object, depth);
    in_progress_.erase(raw);
    converted_.emplace(raw, value);
    // Held until the save ends, so that no address in converted_ is reused by
    // another object: a sparse tensor's parts are temporaries the next one's
    // could otherwise take the place of.
    alive_.push_back(py::reinterpret_borrow<py::object>(object));
    return value;
  }

 private:
  Value convert_one(const py::handle& object, int depth) {
    if (depth > 64) throw Error(ErrorCode::write_value_unsupported, "save: containers nest deeper than 64 levels");
    if (object.is_none()) return Value::none();
    if (py::isinstance<py::bool_>(object)) return Value::boolean(object.cast<bool>());
    if (PyLong_CheckExact(object.ptr()) || py::isinstance<py::int_>(object)) {
      try {
        return Value::integer(object.cast<std::int64_t>());
      } catch (const py::cast_error&) {
        // Beyond int64: its two's-complement bytes, as pickle's LONG1 holds them (at most 255).
        const auto length = (object.attr("bit_length")().cast<std::size_t>() + 8) / 8;
        if (length > 255) {
          throw Error(ErrorCode::write_value_unsupported, "save: an int of " + std::to_string(length) +
                                                              " bytes; pickle's LONG1 holds at most 255");
        }
        const auto bytes = object.attr("to_bytes")(length, "little", py::arg("signed") = true).cast<std::string>();
        return Value::integer_of_bytes(bytes);
      }
    }
    if (py::isinstance<py::float_>(object)) return Value::floating(object.cast<double>());
    if (py::isinstance<py::str>(object)) return Value::string(object.cast<std::string>());
    if (py::isinstance<py::bytes>(object)) return Value::bytes(object.cast<std::string>());
    if (PyComplex_Check(object.ptr())) {
      return Value::complex_number({PyComplex_RealAsDouble(object.ptr()), PyComplex_ImagAsDouble(object.ptr())});
    }
    if (PyByteArray_Check(object.ptr())) {
      const char* data = PyByteArray_AsString(object.ptr());
      return Value::bytearray(std::string(data, static_cast<std::size_t>(PyByteArray_Size(object.ptr()))));
    }
    if (PySet_Check(object.ptr())) {
      Value::List items;
      for (const auto& item : object) items.push_back(convert(item, depth + 1));
      return Value::set(std::move(items));
    }
    if (PyFrozenSet_Check(object.ptr())) {
      throw Error(ErrorCode::write_value_unsupported,
                  "save: a frozenset; torch.load(weights_only=True) refuses frozenset (save a set or a tuple)");
    }
    if (const TorchTypes* torch = TorchTypes::get(false)) {
      if (py::isinstance(object, torch->size)) {
        Dims dims;
        for (const auto& item : object) dims.push_back(item.cast<std::int64_t>());
        return Value::size(dims);
      }
      if (py::isinstance(object, torch->dtype)) {
        const std::string name = py::str(object).cast<std::string>().substr(std::string_view("torch.").size());
        const auto dtype = dtype_from_name(name);
        if (!dtype) throw Error(ErrorCode::write_value_unsupported, "save: dtype torch." + name);
        return Value::dtype(*dtype);
      }
      if (py::isinstance(object, torch->device)) return Value::device(py::str(object).cast<std::string>());
      if (py::isinstance(object, torch->layout)) return Value::layout(py::str(object).cast<std::string>());
    }
    if (py::isinstance<py::dict>(object)) {
      Dict entries;
      for (const auto& [key, item] : object.cast<py::dict>()) {
        std::optional<DictKey> dict_key;
        if (py::isinstance<py::str>(key)) {
          dict_key.emplace(key.cast<std::string>());
        } else {
          // int, None, bool, float, bytes or a tuple of them; an int beyond
          // int64 or anything else is refused.
          const Value made = convert(key, depth + 1);
          if (valid_dict_key(made)) dict_key.emplace(made);
        }
        if (!dict_key) {
          throw Error(ErrorCode::write_value_unsupported, "save: a dict key of type " +
                                                              std::string(py::str(key.get_type().attr("__name__"))) +
                                                              "; keys are str, int, None, bool, float, bytes or "
                                                              "tuples of them");
        }
        entries.insert(*dict_key, convert(item, depth + 1));
      }
      const bool ordered = py::isinstance(object, ordered_dict_);
      if (ordered && py::hasattr(object, "_metadata")) entries.set_metadata(convert(object.attr("_metadata"), depth + 1));
      return ordered ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    if (py::isinstance<py::list>(object) || py::isinstance<py::tuple>(object)) {
      Value::List items;
      for (const auto& item : object) items.push_back(convert(item, depth + 1));
      return py::isinstance<py::list>(object) ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    // Tensors, arrays and NumPy scalars: holdpoint/_convert.py says what they hold.
    py::object parts = tensor_parts_(object);
    if (parts.is_none()) {
      throw Error(ErrorCode::write_value_unsupported,
                  "save: a value of type " + std::string(py::str(object.get_type().attr("__qualname__"))) +
                      " (only None, bool, int, float, complex, str, bytes, bytearray, list, tuple, set, dict, torch.dtype, "
                      "torch.Size, torch.device, torch.layout, tensors and NumPy values)");
    }
    if (!py::isinstance<py::tuple>(parts)) return convert(parts, depth);  // a NumPy scalar's plain value
    return tensor(parts.cast<py::tuple>(), depth);
  }

 private:
  // (buffer, dtype name, shape, stride, offset, requires_grad, is_parameter, identity[, conj, neg]);
  // buffer "meta" for a tensor on the meta device (no elements).
  Value tensor(const py::tuple& parts, int depth) {
    // ("sparse", layout, (part tensors...), size, is_coalesced or None, requires_grad, is_parameter)
    if (py::isinstance<py::str>(parts[0]) && parts[0].cast<std::string>() == "sparse") {
      SparseTensor sparse;
      sparse.layout = parts[1].cast<std::string>();
      for (const auto& part : parts[2]) sparse.parts.push_back(convert(part, depth + 1));
      sparse.sizes = parts[3].cast<std::vector<std::int64_t>>();
      if (!parts[4].is_none()) sparse.coalesced = parts[4].cast<bool>();
      sparse.requires_grad = parts[5].cast<bool>();
      sparse.is_parameter = parts[6].cast<bool>();
      return Value::sparse_tensor(std::move(sparse));
    }
    if (py::isinstance<py::str>(parts[0]) && parts[0].cast<std::string>() == "meta") {
      const auto dtype = dtype_from_name(parts[1].cast<std::string>());
      if (!dtype) throw Error(ErrorCode::write_value_unsupported, "save: dtype " + parts[1].cast<std::string>());
      TensorData t;
      t.dtype = *dtype;
      t.sizes = parts[2].cast<std::vector<std::int64_t>>();
      t.strides = parts[3].cast<std::vector<std::int64_t>>();
      t.requires_grad = parts[5].cast<bool>();
      t.is_parameter = parts[6].cast<bool>();
      return Value::meta_tensor(std::move(t));
    }
    py::buffer buffer = parts[0];
    py::buffer_info info = buffer.request();
    const std::size_t nbytes = static_cast<std::size_t>(info.size * info.itemsize);
    const auto dtype = dtype_from_name(parts[1].cast<std::string>());
    if (!dtype) throw Error(ErrorCode::write_value_unsupported, "save: dtype " + parts[1].cast<std::string>());
    auto owner = std::make_shared<PythonOwner>();
    owner->object = buffer;
    const auto identity = reinterpret_cast<const void*>(parts[7].cast<std::uintptr_t>());
    TensorData t;
    t.dtype = *dtype;
    t.sizes = parts[2].cast<std::vector<std::int64_t>>();
    t.strides = parts[3].cast<std::vector<std::int64_t>>();
    t.storage_offset = parts[4].cast<std::int64_t>();
    t.requires_grad = parts[5].cast<bool>();
    t.is_parameter = parts[6].cast<bool>();
    if (parts.size() >= 10) {  // a torch tensor's lazy conj/neg bits
      t.conjugate = parts[8].cast<bool>();
      t.negative = parts[9].cast<bool>();
    }
    // Storages the writer sees twice under one identity must be one object.
    // Memory reached two ways (a NumPy array over part of a torch tensor's
    // storage) is written twice rather than under a wrong size.
    const auto* data = static_cast<const std::byte*>(info.ptr);
    auto& storage = storages_[identity ? identity : info.ptr];
    if (!storage) {
      storage = std::make_shared<const Storage>(data, nbytes, owner, identity ? identity : info.ptr);
      t.storage = storage;
    } else if (storage->nbytes() == nbytes && (nbytes == 0 || storage->data() == data)) {
      t.storage = storage;
    } else {
      t.storage = std::make_shared<const Storage>(data, nbytes, owner, owner.get());
    }
    return Value::tensor(std::move(t));
  }

  py::object tensor_parts_;
  py::object ordered_dict_;
  std::unordered_map<const void*, std::shared_ptr<const Storage>> storages_;
  std::unordered_map<const PyObject*, Value> converted_;  // containers, by identity
  std::unordered_set<const PyObject*> in_progress_;       // containers being converted
  std::vector<py::object> alive_;                         // what converted_ names
};

// ---- entry points ---------------------------------------------------------------------------

py::tuple load(const std::filesystem::path& path, const py::object& expected_sha256, const py::object& limits,
               const py::object& make_tensor, const py::object& trust, bool compute_sha256) {
  LoadOptions options = load_options(expected_sha256, limits, trust);
  options.compute_sha256 = compute_sha256;
  LoadedMapping mapping;
  {
    py::gil_scoped_release released;
    mapping = load_checkpoint_mapping(path, options);
  }
  ToPython to_python(make_tensor);
  return py::make_tuple(to_python.convert(mapping.root), mapping_info(mapping));
}

// A torch.distributed.checkpoint folder's state dict (or, with `metadata_only`,
// its decoded .metadata), every item read by the restricted reader.
py::object load_dcp_folder(const std::filesystem::path& folder, const py::object& limits,
                                       const py::object& make_tensor, bool metadata_only) {
  const Limits bounds = limits_from(limits);
  Value root;
  {
    py::gil_scoped_release released;
    root = metadata_only ? read_distributed_checkpoint_metadata(folder, bounds)
                         : holdpoint::load_distributed_checkpoint(folder, bounds);
  }
  ToPython to_python(make_tensor);
  return to_python.convert(root);
}

// ---- torch.distributed.checkpoint generations (holdpoint/dcp.py) ---------------------------

py::dict dcp_file_dict(const DcpFile& file) {
  py::list ranges;
  for (const DcpRange& range : file.ranges) ranges.append(py::make_tuple(range.offset, range.length, range.sha256.hex()));
  py::dict out;
  out["name"] = file.name;
  out["size"] = file.size;
  out["ranges"] = ranges;
  return out;
}

DcpFile dcp_file_from(const py::handle& record) {
  const py::dict dict = py::reinterpret_borrow<py::dict>(record);
  DcpFile file;
  file.name = dict["name"].cast<std::string>();
  file.size = dict["size"].cast<std::uint64_t>();
  for (const py::handle& range : dict["ranges"]) {
    const py::tuple fields = py::reinterpret_borrow<py::object>(range).cast<py::tuple>();
    const auto digest = Sha256Digest::from_hex(fields[2].cast<std::string>());
    if (!digest) fail_argument("a DCP range's sha256 is not 64 hexadecimal digits");
    file.ranges.push_back({fields[0].cast<std::uint64_t>(), fields[1].cast<std::uint64_t>(), *digest});
  }
  return file;
}

// Publishes one data file of a DCP generation: each item is a bytes-like
// object (written as it is) or a tensor (written as a PyTorch archive of it).
py::dict write_dcp_file_py(const std::filesystem::path& folder, const std::string& name, const py::list& items,
                           bool durable, const py::object& tensor_parts) {
  FromPython from_python(tensor_parts);
  std::vector<py::buffer_info> buffers;  // keep the bytes alive while the GIL is released
  std::vector<Value> archives;
  buffers.reserve(items.size());
  archives.reserve(items.size());
  std::vector<DcpItem> plan;
  plan.reserve(items.size());
  for (const py::handle& item : items) {
    if (PyObject_CheckBuffer(item.ptr()) && !py::hasattr(item, "untyped_storage")) {
      buffers.push_back(py::reinterpret_borrow<py::buffer>(item).request());
      const py::buffer_info& info = buffers.back();
      plan.push_back({{static_cast<const std::byte*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)},
                      nullptr});
    } else {
      archives.push_back(from_python.convert(item));
      plan.push_back({{}, &archives.back()});
    }
  }
  DcpFile file;
  {
    py::gil_scoped_release released;
    DcpWriteOptions options;
    options.durable = durable;
    file = write_dcp_file(folder, name, plan, options);
  }
  return dcp_file_dict(file);
}

// Reads items of a listed file of a DCP generation, each range checked
// against its digest, then decoded by the restricted reader: every range is
// read and checked before any is decoded.
py::list read_dcp_items(const std::filesystem::path& folder, const py::dict& record, const std::vector<std::size_t>& wanted,
                        const py::object& limits, const py::object& make_tensor) {
  const DcpFile file = dcp_file_from(record);
  const Limits bounds = limits_from(limits);
  std::vector<LoadedMapping> decoded;
  {
    py::gil_scoped_release released;
    auto ranges = read_dcp_ranges(folder, file, wanted);
    decoded.reserve(ranges.size());
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      try {
        decoded.push_back(parse_checkpoint_bytes(ranges[i].bytes, ranges[i].owner, bounds));
      } catch (Error& error) {
        throw error.with_path(detail::concat((folder / file.name).string(), " bytes [", file.ranges[wanted[i]].offset,
                                             ", +", file.ranges[wanted[i]].length, ")"));
      }
    }
  }
  ToPython to_python(make_tensor);
  py::list out;
  for (const LoadedMapping& mapping : decoded) out.append(to_python.convert(mapping.root));
  return out;
}

// The `.metadata` of a DCP generation, checked against its digest, decoded as data.
py::object read_dcp_metadata(const std::filesystem::path& folder, const py::dict& record, const py::object& limits) {
  const DcpFile file = dcp_file_from(record);
  const Limits bounds = limits_from(limits);
  Value metadata;
  {
    py::gil_scoped_release released;
    if (file.name != ".metadata" || file.ranges.size() != 1) fail_argument("read_dcp_metadata: not the .metadata record");
    if (file.size > bounds.max_pickle_bytes) {
      throw Error(ErrorCode::pickle_too_large, detail::concat("the pickle has ", file.size,
                                                              " bytes, more than max_pickle_bytes ", bounds.max_pickle_bytes))
          .with_path((folder / file.name).string());
    }
    const std::size_t first = 0;
    const auto ranges = read_dcp_ranges(folder, file, std::span(&first, 1));
    metadata = decode_distributed_checkpoint_metadata(ranges[0].bytes, folder / file.name, bounds);
  }
  ToPython to_python{py::none()};
  return to_python.convert(metadata);
}

// What `holdpoint inspect` shows: the tree with tensors as (dtype, shape)
// and no bytes, the records and the format markers; streams the file.
py::dict inspect(const std::filesystem::path& path, const py::object& expected_sha256, const py::object& limits,
                 const py::object& describe_tensor, const py::object& trust) {
  const LoadOptions options = load_options(expected_sha256, limits, trust);
  LoadedMapping mapping;
  {
    py::gil_scoped_release released;
    mapping = scan_checkpoint(path, options, ScanKeeps::tree);
  }
  ToPython to_python(describe_tensor);
  py::dict info = mapping_info(mapping);
  info["tree"] = to_python.convert(mapping.root);
  py::list records;
  for (const RecordInfo& record : mapping.records) {
    py::dict entry;
    entry["name"] = record.name;
    entry["offset"] = record.offset;
    entry["size"] = record.size;
    entry["crc32"] = record.crc32;
    records.append(entry);
  }
  info["records"] = records;
  py::dict markers;
  markers["archive_name"] = mapping.markers.archive_name;
  markers["version"] = mapping.markers.version;
  markers["byteorder"] = mapping.markers.byteorder;
  markers["pickle_protocol"] = mapping.markers.pickle_protocol;
  markers["producer"] = mapping.markers.producer;
  info["markers"] = markers;
  return info;
}

py::dict verify(const std::filesystem::path& path, const py::object& expected_sha256, bool sidecar,
                const py::object& limits, const py::object& trust) {
  LoadOptions options = load_options(expected_sha256, limits, trust);
  if (sidecar) {
    if (options.expected_sha256) fail_argument("verify: give expected_sha256 or sidecar=True, not both");
    options.expected_sha256 = read_sha256_sidecar(path);
  }
  LoadedMapping mapping;
  {
    py::gil_scoped_release released;
    mapping = scan_checkpoint(path, options, ScanKeeps::verdict);
  }
  py::dict info = mapping_info(mapping);
  info["valid"] = true;
  info["digest_checked"] = mapping.digest_checked;
  return info;
}

py::dict save_result_dict(const SaveResult& result) {
  py::dict out;
  out["sha256"] = result.sha256.hex();
  out["bytes"] = result.file_bytes;
  out["tensors"] = result.tensor_count;
  out["storages"] = result.storage_count;
  return out;
}

py::dict save(const std::filesystem::path& path, const py::handle& root, bool sidecar, bool durable,
              bool torch_1_13_compatible, const py::object& tensor_parts) {
  SaveOptions options;
  options.write_sidecar = sidecar;
  options.durable = durable;
  options.torch_1_13_compatible = torch_1_13_compatible;
  FromPython from_python(tensor_parts);
  const Value value = from_python.convert(root);
  SaveResult result;
  {
    py::gil_scoped_release released;
    result = save_mapping(path, value, options);
  }
  return save_result_dict(result);
}

// ---- training states -------------------------------------------------------------------------

// What holdpoint.TrainingState (holdpoint/_training.py) says about the run, as
// a dict: semantic_identity, profile, load_bearing, operational, code_identity,
// data_identity, torch_version, facts (the ProfileFacts the profiles check)
// and last_resume_drift.
struct RunSpec {
  std::string semantic_identity;
  ResumeProfile profile = ResumeProfile::unqualified;
  TrainingConfig config;  // effective: semantic identity and profile included
  std::string code_identity;
  std::string data_identity;
  std::string torch_version;
  ProfileFacts facts;
  std::optional<ResumeDrift> last_resume_drift;
};

template <typename T>
T spec_field(const py::dict& spec, const char* key) {
  if (!spec.contains(key)) fail_argument(std::string("training state spec: no '") + key + "'");
  try {
    return spec[key].cast<T>();
  } catch (const py::cast_error&) {
    fail_argument(std::string("training state spec: '") + key + "' has the wrong type");
  }
}

RunSpec run_spec(const py::dict& spec, FromPython& from_python) {
  RunSpec out;
  out.semantic_identity = spec_field<std::string>(spec, "semantic_identity");
  const auto profile_name = spec_field<std::string>(spec, "profile");
  const auto profile = resume_profile_from_name(profile_name);
  if (!profile) throw Error(ErrorCode::profile_unknown, "resume profile '" + profile_name + "' is not known");
  out.profile = *profile;
  TrainingConfig config;
  for (const auto& [key, value] : spec_field<py::dict>(spec, "load_bearing")) {
    config.load_bearing(py::str(key), from_python.convert(value));
  }
  for (const auto& [key, value] : spec_field<py::dict>(spec, "operational")) {
    config.operational(py::str(key), from_python.convert(value));
  }
  out.config = schema::effective_config(config, out.semantic_identity, out.profile);
  out.code_identity = spec_field<std::string>(spec, "code_identity");
  out.data_identity = spec_field<std::string>(spec, "data_identity");
  out.torch_version = spec_field<std::string>(spec, "torch_version");
  const auto facts = spec_field<py::dict>(spec, "facts");
  const auto fact = [&](const char* key, auto fallback) {
    return facts.contains(key) ? facts[key].cast<decltype(fallback)>() : fallback;
  };
  out.facts.model_on_cpu = fact("model_on_cpu", true);
  out.facts.loader_workers = fact("loader_workers", 0);
  out.facts.distributed = fact("distributed", false);
  out.facts.external_randomness = fact("external_randomness", false);
  out.facts.cpu_generator_registered = fact("cpu_generator_registered", false);
  out.facts.sampler_kind = fact("sampler_kind", std::string());
  out.facts.sampler_generator_registered = fact("sampler_generator_registered", false);
  if (spec.contains("last_resume_drift") && !spec["last_resume_drift"].is_none()) {
    const auto drift = spec["last_resume_drift"].cast<py::dict>();
    out.last_resume_drift = ResumeDrift{drift["field"].cast<std::string>(), drift["from"].cast<std::int64_t>(),
                                        drift["to"].cast<std::int64_t>(), drift["at_step"].cast<std::int64_t>()};
  }
  return out;
}

// The manifest a save under `spec` writes (component records are filled in
// by schema::write_components). The profile is a claim: its preconditions
// must hold before it is written down.
Manifest manifest_of(const RunSpec& spec) {
  check_profile(spec.profile, spec.facts);
  Manifest manifest;
  manifest.kind = CheckpointKind::resume;
  manifest.semantic_identity = spec.semantic_identity;
  manifest.profile = std::string(resume_profile_name(spec.profile));
  manifest.config = spec.config;
  manifest.holdpoint_version = HOLDPOINT_VERSION;
  manifest.libtorch_version = spec.torch_version;
  manifest.compiler = __VERSION__;
  manifest.code_identity = spec.code_identity;
  manifest.data_identity = spec.data_identity;
  manifest.last_resume_drift = spec.last_resume_drift;
  return manifest;
}

schema::NamedComponents named_components(const Value& value, const char* what) {
  if (!value.is_dict() || value.as_dict().empty()) {
    fail_argument(std::string(what) + ": the components must be a non-empty dict (\"model\", \"optimizer\", ...)");
  }
  schema::NamedComponents components;
  for (const auto& [key, state] : value.as_dict()) {
    if (!key.is_string() || key.as_string() == kManifestKey) {
      fail_argument(std::string(what) + ": component names are str, and '" + std::string(kManifestKey) +
                    "' is the manifest's");
    }
    components.emplace_back(key.as_string(), state);
  }
  return components;
}

py::dict save_training_state(const std::filesystem::path& path, const py::handle& components, const py::dict& spec,
                             bool sidecar, bool durable, const py::object& tensor_parts) {
  FromPython from_python(tensor_parts);
  const RunSpec run = run_spec(spec, from_python);
  const schema::NamedComponents named = named_components(from_python.convert(components), "TrainingState.save");
  const Manifest manifest = manifest_of(run);
  SaveResult result;
  {
    py::gil_scoped_release released;
    result = detail::publish_file(
        path, {.durable = durable, .write_sidecar = sidecar},
        [&](io::ByteSink& sink, SaveResult& counts) {
          const auto written = schema::write_components(sink, manifest, named);
          counts.tensor_count = written.tensor_count;
          counts.storage_count = written.storage_count;
        },
        [](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
          schema::verify_checkpoint_bytes(bytes, owner);
        });
  }
  return save_result_dict(result);
}

// (components, report) of a checked resume: each named component's state
// through `to_python`, and what the file and its manifest say.
py::tuple resumed_components(const LoadedMapping& mapping, const schema::ResumeCheck& check,
                             const std::vector<std::string>& names, ToPython& to_python) {
  py::dict components;
  for (const std::string& name : names) components[py::str(name)] = to_python.convert(mapping.root.as_dict().at(name));
  py::dict report = mapping_info(mapping);
  report["profile"] = check.manifest.profile;
  report["step"] = schema::progress_step_of(mapping.root);
  if (check.max_epochs_growth) {
    py::dict drift;
    drift["field"] = "max_epochs";
    drift["from"] = check.max_epochs_growth->saved;
    drift["to"] = check.max_epochs_growth->live;
    drift["at_step"] = schema::progress_step_of(mapping.root);
    report["drift"] = drift;
  } else {
    report["drift"] = py::none();
  }
  report["versions"] = py::make_tuple(check.manifest.holdpoint_version, check.manifest.libtorch_version);
  return py::make_tuple(components, report);
}

// Reads a resume checkpoint for `spec`'s run and runs every check that needs
// no live object (schema::check_resume_root); returns (components, report).
py::tuple load_training_state(const std::filesystem::path& path, const py::object& expected_sha256,
                              const py::object& limits, const py::dict& spec, const std::vector<std::string>& names,
                              const py::object& make_tensor, const py::object& trust) {
  // A run's configuration holds no tensors: the converter refuses any.
  FromPython from_python(py::cpp_function([](const py::handle&) { return py::none(); }));
  const RunSpec run = run_spec(spec, from_python);
  LoadOptions options = load_options(expected_sha256, limits, trust);
  options.compute_sha256 = true;  // the report names the file's digest, as the C++ TrainingState's does
  LoadedMapping mapping;
  schema::ResumeCheck check;
  {
    py::gil_scoped_release released;
    mapping = load_checkpoint_mapping(path, options);
    schema::ResumeExpectation expectation;
    expectation.config = run.config;
    expectation.components = names;
    expectation.facts = run.facts;
    expectation.digest_checked = mapping.digest_checked;
    try {
      check = schema::check_resume_root(mapping.root, expectation);
    } catch (const Error& error) {
      throw error.with_path(path.string());
    }
  }
  ToPython to_python(make_tensor);
  return resumed_components(mapping, check, names, to_python);
}

// ---- resume in place ----------------------------------------------------------------------

// TrainingState.load(memory="in_place") (docs/python.md): the first pass
// (format::scan_for_resume) and the checks that need no live object, then
// the second pass record by record into memory Python chose
// (schema::InPlaceSource).
class InPlaceResume {
 public:
  InPlaceResume(const std::filesystem::path& path, const std::filesystem::path& journal_directory)
      : path_(path), file_(io::open_regular_for_reading(path)) {
    ::fstat(file_.fd.get(), &identity_);
    source_.emplace(file_, identity_, journal_directory);
  }

  // (address, bytes) of live tensors a fill may write over, journaled while scan() runs.
  void journal_in_background(const std::vector<std::pair<std::uintptr_t, std::uint64_t>>& ranges) {
    std::vector<std::pair<std::byte*, std::uint64_t>> live;
    for (const auto& [address, size] : ranges) live.emplace_back(reinterpret_cast<std::byte*>(address), size);
    source_->journal_in_background(std::move(live));
  }

  py::tuple scan(const py::object& expected_sha256, const py::object& limits, const py::dict& spec,
                 const std::vector<std::string>& names, const py::object& make_tensor, const py::object& trust) {
    FromPython from_python(py::cpp_function([](const py::handle&) { return py::none(); }));
    const RunSpec run = run_spec(spec, from_python);
    const LoadOptions options = load_options(expected_sha256, limits, trust);
    format::ResumeScan scanned;
    schema::ResumeCheck check;
    {
      py::gil_scoped_release released;
      try {
        scanned = format::scan_for_resume(file_, path_, options, kKeptRecordBudget);
        source_->set_records(std::move(scanned.absent));
        schema::ResumeExpectation expectation;
        expectation.config = run.config;
        expectation.components = names;
        expectation.facts = run.facts;
        expectation.digest_checked = scanned.mapping.digest_checked;
        expectation.known_storage_digests = [this](StorageDigestKind kind) { return source_->storage_digests(kind); };
        check = schema::check_resume_root(scanned.mapping.root, expectation);
      } catch (const Error& error) {
        throw error.with_path(path_.string());
      }
    }
    std::unordered_map<const void*, std::size_t> absent;
    for (const auto& [identity, record] : source_->records()) {
      absent.emplace(identity, records_.size());
      records_.push_back(&record);
    }
    ToPython to_python(make_tensor, &absent);
    mapping_ = std::move(scanned.mapping);  // the kept records' bytes live on in the StorageBuffers
    return resumed_components(mapping_, check, names, to_python);
  }

  // Before the first byte moves: the background journal, the file's identity.
  void begin() {
    py::gil_scoped_release released;
    try {
      source_->begin();
    } catch (const Error& error) {
      throw error.with_path(path_.string());
    }
  }

  // Reads record `index` into the `bytes` at `address` (exactly its size),
  // journaling them first when they are live.
  void fill(std::size_t index, std::uintptr_t address, std::uint64_t bytes, bool live) {
    if (index >= records_.size() || records_[index]->size != bytes) {
      fail_argument("fill: record " + std::to_string(index) + " of " + std::to_string(bytes) + " bytes does not exist");
    }
    auto* destination = reinterpret_cast<std::byte*>(address);
    py::gil_scoped_release released;
    try {
      if (live) source_->journal_unless_held(destination, bytes);
      source_->read_into(destination, *records_[index]);
    } catch (const Error& error) {
      throw error.with_path(path_.string());
    }
  }

  std::string restore() {
    py::gil_scoped_release released;
    return source_->restore();
  }

  std::uint64_t bytes_journaled() const { return source_->bytes_journaled(); }

 private:
  // What the first pass keeps of the small records (format/resume_scan.h).
  static constexpr std::uint64_t kKeptRecordBudget = std::uint64_t{64} << 20;

  std::filesystem::path path_;
  io::RegularFile file_;
  struct stat identity_ {};
  std::optional<schema::InPlaceSource> source_;
  std::vector<const format::AbsentRecord*> records_;
  LoadedMapping mapping_;
};

// ---- run directories ------------------------------------------------------------------------

py::dict generation_dict(const GenerationInfo& g) {
  py::dict out;
  out["name"] = g.name;
  out["step"] = g.step;
  out["epoch"] = g.epoch;
  out["kind"] = g.kind;
  out["bytes"] = g.size;
  out["sha256"] = g.sha256.hex();
  out["saved_at"] = g.saved_at;
  py::dict metrics;
  for (const auto& [name, value] : g.metrics) metrics[py::str(name)] = value;
  out["metrics"] = metrics;
  out["world_size"] = g.world_size;
  return out;
}

class PyRunDirectory {
 public:
  PyRunDirectory(const std::filesystem::path& path, bool recover, bool create, const py::object& limits,
                 const py::object& best_metric, bool higher_is_better, const py::object& trust,
                 const py::object& signing_key) {
    RunDirectoryOptions options;
    options.recover = recover;
    options.create = create;
    options.limits = limits_from(limits);
    options.trust = trust_from(trust);
    if (!signing_key.is_none()) {
      options.signing_key =
          std::make_shared<const SigningKey>(SigningKey::read_file(signing_key.cast<std::filesystem::path>()));
    }
    if (!best_metric.is_none()) options.best_metric = BestMetric{best_metric.cast<std::string>(), higher_is_better};
    py::gil_scoped_release released;
    run_ = std::make_unique<RunDirectory>(path, std::move(options));
  }

  std::filesystem::path path() const { return run_->path(); }
  py::list generations() const {
    py::list out;
    for (const GenerationInfo& g : run_->generations()) out.append(generation_dict(g));
    return out;
  }
  py::object latest() const {
    const auto g = run_->latest();
    return g ? py::object(generation_dict(*g)) : py::object(py::none());
  }
  py::object best() const {
    const auto g = run_->best();
    return g ? py::object(generation_dict(*g)) : py::object(py::none());
  }
  std::filesystem::path file_path(const std::string& name) const { return run_->file_path(find(name)); }
  // Generations recovery found damaged (moved aside, or that would be): name, code, detail.
  py::list damaged() const { return checks_list(run_->recovery().damaged); }
  py::list recovery() const {
    py::list out;
    for (const std::string& line : run_->recovery().lines()) out.append(line);
    return out;
  }

  // Loads a generation by name, verified against the run's own records.
  py::tuple load(const std::string& name, const py::object& make_tensor) const {
    const GenerationInfo generation = find(name);
    LoadedMapping mapping;
    {
      py::gil_scoped_release released;
      mapping = run_->load(generation);
    }
    ToPython to_python(make_tensor);
    return py::make_tuple(to_python.convert(mapping.root), mapping_info(mapping));
  }

  // Signs what is not signed yet (RunDirectory::sign); the files written.
  std::vector<std::string> sign(const std::filesystem::path& key_file) {
    py::gil_scoped_release released;
    const SigningKey key = SigningKey::read_file(key_file);
    return run_->sign(key);
  }

  py::list verify_signatures(const py::object& trust) const {
    const std::optional<TrustPolicy> policy = trust_from(trust);
    if (!policy) fail_argument("verify_signatures: a TrustPolicy is needed");
    std::vector<GenerationCheck> checks;
    {
      py::gil_scoped_release released;
      checks = run_->verify_signatures(*policy);
    }
    return checks_list(checks);
  }

  py::dict verify(const std::string& name) const {
    const GenerationInfo generation = find(name);
    GenerationCheck check;
    {
      py::gil_scoped_release released;
      check = run_->verify(generation);
    }
    py::dict out;
    out["name"] = check.name;
    out["ok"] = check.ok;
    out["code"] = check.code ? py::object(py::str(std::string(error_code_name(*check.code)))) : py::object(py::none());
    out["detail"] = check.detail;
    return out;
  }

  // DCP generations (holdpoint/dcp.py): the folder the ranks write into.
  std::filesystem::path prepare_dcp_folder(std::int64_t step) {
    py::gil_scoped_release released;
    return run_->prepare_shard_directory(step);
  }
  void discard_dcp_folder(std::int64_t step) {
    py::gil_scoped_release released;
    run_->discard_shard_directory(step);
  }

  // Commits a DCP generation whose files are all published: its step
  // manifest lists them (kind dcp), and LATEST moves to it.
  py::dict commit_dcp(std::int64_t step, std::int64_t epoch, std::int64_t world_size, const py::list& files,
                      const py::dict& metrics, const py::dict& spec) {
    GenerationSpec generation;
    generation.step = step;
    generation.epoch = epoch;
    generation.kind = "dcp";
    generation.world_size = world_size;
    for (const auto& [name, value] : metrics) generation.metrics.emplace_back(py::str(name), value.cast<double>());
    FromPython from_python{py::none()};
    Manifest manifest = manifest_of(run_spec(spec, from_python));
    manifest.kind = CheckpointKind::dcp;
    DcpLayout layout;
    layout.world_size = world_size;
    layout.step = step;
    for (const py::handle& file : files) layout.files.push_back(dcp_file_from(file));
    std::sort(layout.files.begin(), layout.files.end(),
              [](const DcpFile& a, const DcpFile& b) { return a.name < b.name; });
    manifest.dcp = std::move(layout);
    const Limits limits = run_->options().limits;
    const std::filesystem::path folder = run_->path() / std::string(kCheckpointsDirectory) / shard_directory_name(step);
    CommitResult result;
    {
      py::gil_scoped_release released;
      // Read back, the manifest must be the one written (its ranges tile
      // each file) and every file must be there at its size (each was read
      // back by the rank that published it).
      const auto verify = [&](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
        const Manifest read = Manifest::of_root(parse_checkpoint_bytes(bytes, owner, limits).root);
        if (read.kind != CheckpointKind::dcp || read.dcp->files.size() != manifest.dcp->files.size()) {
          throw Error(ErrorCode::schema_field_invalid, "the step manifest read back is not the one written");
        }
        auto directory = io::posix_file_system().open_directory(folder, false);
        for (const DcpFile& file : manifest.dcp->files) {
          const auto info = directory->stat(file.name);
          if (!info || info->type != io::FileInfo::Type::regular || info->size != file.size) {
            throw Error(ErrorCode::run_shards_invalid, detail::concat(shard_directory_name(step), "/", file.name,
                                                                      " is missing or not of its reported size ",
                                                                      file.size));
          }
        }
      };
      result = run_->commit(generation, [&](io::ByteSink& sink) { schema::write_components(sink, manifest, {}); },
                            verify);
    }
    py::dict out = generation_dict(result.generation);
    out["became_best"] = result.became_best;
    out["deleted"] = result.deleted;
    return out;
  }

  // A generation is a holdpoint checkpoint: each top-level entry of the
  // mapping is a component, whose digest the manifest ("holdpoint") records,
  // as the C++ TrainingState writes it (docs/resume-contract.md).
  py::dict commit(const py::handle& root, std::int64_t step, std::int64_t epoch, const std::string& kind,
                  const py::dict& metrics, const py::dict& spec, const py::object& tensor_parts) {
    GenerationSpec generation;
    generation.step = step;
    generation.epoch = epoch;
    generation.kind = kind;
    for (const auto& [name, value] : metrics) generation.metrics.emplace_back(py::str(name), value.cast<double>());
    FromPython from_python(tensor_parts);
    const Manifest manifest = manifest_of(run_spec(spec, from_python));
    const schema::NamedComponents components = named_components(from_python.convert(root), "commit");
    CommitResult result;
    {
      py::gil_scoped_release released;
      result = run_->commit(generation, [&](io::ByteSink& sink) {
        schema::write_components(sink, manifest, components);
      });
    }
    py::dict out = generation_dict(result.generation);
    out["became_best"] = result.became_best;
    out["deleted"] = result.deleted;
    return out;
  }

 private:
  GenerationInfo find(const std::string& name) const {
    if (name == "latest" || name == "best") {
      const auto g = name == "latest" ? run_->latest() : run_->best();
      if (!g) throw Error(ErrorCode::invalid_argument, "run " + run_->path().string() + " has no " + name + " generation");
      return *g;
    }
    const auto g = run_->find(name);
    if (!g) throw Error(ErrorCode::invalid_argument, "run " + run_->path().string() + " has no generation '" + name + "'");
    return *g;
  }

  std::unique_ptr<RunDirectory> run_;
};

}  // namespace
}  // namespace holdpoint::python

PYBIND11_MODULE(_native, m) {
  using namespace holdpoint;
  using namespace holdpoint::python;
  m.doc() = "holdpoint's core, for the holdpoint package (use the functions of holdpoint, not these)";
  m.attr("__version__") = HOLDPOINT_VERSION;
  error_class() = py::module_::import("holdpoint._errors").attr("Error");
  py::register_exception_translator(&translate_errors);

  py::class_<StorageBuffer>(m, "StorageBuffer", py::buffer_protocol())
      .def_buffer([](StorageBuffer& buffer) {
        // Zero-size storages have no pointer to export; a one-byte dummy keeps
        // the buffer valid (its length stays 0).
        static std::byte empty{};
        auto* data = buffer.storage->nbytes() ? const_cast<std::byte*>(buffer.storage->data()) : &empty;
        return py::buffer_info(data, 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(buffer.storage->nbytes())}, {1}, /*readonly=*/false);
      })
      .def("__len__", [](const StorageBuffer& buffer) { return buffer.storage->nbytes(); });

  m.def("load", &load, py::arg("path"), py::arg("expected_sha256"), py::arg("limits"), py::arg("make_tensor"),
        py::arg("trust") = py::none(), py::arg("compute_sha256") = false);
  m.def("diff", &diff_files, py::arg("a"), py::arg("b"), py::arg("atol"), py::arg("rtol"), py::arg("limits"),
        py::arg("trust"));
  m.def("sign", &sign_file, py::arg("path"), py::arg("key"), py::arg("previous_sha256"), py::arg("limits"));
  m.def("load_distributed_checkpoint", &load_dcp_folder, py::arg("folder"), py::arg("limits"),
        py::arg("make_tensor"), py::arg("metadata_only"));
  m.def("write_dcp_file", &write_dcp_file_py, py::arg("folder"), py::arg("name"), py::arg("items"),
        py::arg("durable"), py::arg("tensor_parts"));
  m.def("read_dcp_items", &read_dcp_items, py::arg("folder"), py::arg("record"), py::arg("wanted"), py::arg("limits"),
        py::arg("make_tensor"));
  m.def("read_dcp_metadata", &read_dcp_metadata, py::arg("folder"), py::arg("record"), py::arg("limits"));
  m.def("is_distributed_checkpoint", [](const std::filesystem::path& folder) { return is_distributed_checkpoint(folder); });
  m.def("inspect", &inspect, py::arg("path"), py::arg("expected_sha256"), py::arg("limits"),
        py::arg("describe_tensor"), py::arg("trust") = py::none());
  m.def("verify", &verify, py::arg("path"), py::arg("expected_sha256"), py::arg("sidecar"), py::arg("limits"),
        py::arg("trust") = py::none());
  m.def("save", &save, py::arg("path"), py::arg("root"), py::arg("sidecar"), py::arg("durable"),
        py::arg("torch_1_13_compatible"), py::arg("tensor_parts"));
  m.def("save_training_state", &save_training_state, py::arg("path"), py::arg("components"), py::arg("spec"),
        py::arg("sidecar"), py::arg("durable"), py::arg("tensor_parts"));
  m.def("load_training_state", &load_training_state, py::arg("path"), py::arg("expected_sha256"), py::arg("limits"),
        py::arg("spec"), py::arg("names"), py::arg("make_tensor"), py::arg("trust") = py::none());
  m.def("available_memory_bytes", &available_memory_bytes);
  py::class_<InPlaceResume>(m, "InPlaceResume")
      .def(py::init<const std::filesystem::path&, const std::filesystem::path&>(), py::arg("path"),
           py::arg("journal_directory"))
      .def("journal_in_background", &InPlaceResume::journal_in_background, py::arg("ranges"))
      .def("scan", &InPlaceResume::scan, py::arg("expected_sha256"), py::arg("limits"), py::arg("spec"),
           py::arg("names"), py::arg("make_tensor"), py::arg("trust") = py::none())
      .def("begin", &InPlaceResume::begin)
      .def("fill", &InPlaceResume::fill, py::arg("index"), py::arg("address"), py::arg("bytes"), py::arg("live"))
      .def("restore", &InPlaceResume::restore)
      .def_property_readonly("bytes_journaled", &InPlaceResume::bytes_journaled);
  m.def("error_codes", [] {
    py::dict out;
    for (std::size_t i = 0; i < error_code_count(); ++i) {
      const auto code = static_cast<ErrorCode>(i);
      out[py::str(std::string(error_code_name(code)))] = std::string(error_code_description(code));
    }
    return out;
  });
  m.def("is_environment_error", [](const std::string& name) {
    const auto code = error_code_from_name(name);
    return code && is_environment_error(*code);
  });

  py::class_<PyRunDirectory>(m, "RunDirectory")
      .def(py::init<const std::filesystem::path&, bool, bool, const py::object&, const py::object&, bool,
                    const py::object&, const py::object&>(),
           py::arg("path"), py::arg("recover"), py::arg("create"), py::arg("limits"), py::arg("best_metric"),
           py::arg("higher_is_better"), py::arg("trust") = py::none(), py::arg("signing_key") = py::none())
      .def_property_readonly("path", &PyRunDirectory::path)
      .def("generations", &PyRunDirectory::generations)
      .def("latest", &PyRunDirectory::latest)
      .def("best", &PyRunDirectory::best)
      .def("file_path", &PyRunDirectory::file_path)
      .def("recovery", &PyRunDirectory::recovery)
      .def("damaged", &PyRunDirectory::damaged)
      .def("load", &PyRunDirectory::load)
      .def("verify", &PyRunDirectory::verify)
      .def("sign", &PyRunDirectory::sign, py::arg("key"))
      .def("verify_signatures", &PyRunDirectory::verify_signatures, py::arg("trust"))
      .def("commit", &PyRunDirectory::commit)
      .def("prepare_dcp_folder", &PyRunDirectory::prepare_dcp_folder, py::arg("step"))
      .def("discard_dcp_folder", &PyRunDirectory::discard_dcp_folder, py::arg("step"))
      .def("commit_dcp", &PyRunDirectory::commit_dcp, py::arg("step"), py::arg("epoch"), py::arg("world_size"),
           py::arg("files"), py::arg("metrics"), py::arg("spec"));
}
