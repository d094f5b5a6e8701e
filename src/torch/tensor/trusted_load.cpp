#include "holdpoint/tensor/trusted_load.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/pickle.h>


#include "base/fail.h"
#include "base/file_stream.h"
#include "base/regular_file.h"
#include "holdpoint/tensor/torch_tensor.h"

namespace holdpoint {

namespace {

Value value_from_ivalue(const c10::IValue& value, int depth) {
  if (depth > 64) detail::fail(ErrorCode::trusted_load_failed, "LibTorch's result nests deeper than 64 levels");
  if (value.isNone()) return Value();
  if (value.isBool()) return Value::boolean(value.toBool());
  if (value.isInt()) return Value::integer(value.toInt());
  if (value.isDouble()) return Value::floating(value.toDouble());
  if (value.isString()) return Value::string(value.toStringRef());
  if (value.isTensor()) return tensor_value(value.toTensor());
  if (value.isTuple()) {
    Value::List items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(value_from_ivalue(item, depth + 1));
    return Value::tuple(std::move(items));
  }
  if (value.isList()) {
    Value::List items;
    for (const c10::IValue& item : value.toListRef()) items.push_back(value_from_ivalue(item, depth + 1));
    return Value::list(std::move(items));
  }
  if (value.isGenericDict()) {
    Dict entries;
    for (const auto& entry : value.toGenericDict()) {
      const c10::IValue& key = entry.key();
      Value item = value_from_ivalue(entry.value(), depth + 1);
      if (key.isString()) {
        entries.insert_or_assign(key.toStringRef(), std::move(item));
      } else if (key.isInt()) {
        entries.insert_or_assign(key.toInt(), std::move(item));
      } else {
        detail::fail(ErrorCode::trusted_load_failed, "a dict key of type ", key.tagKind(), " has no holdpoint form");
      }
    }
    return Value::dict(std::move(entries));
  }
  detail::fail(ErrorCode::trusted_load_failed, "a value of type ", value.tagKind(), " has no holdpoint form");
}

// A TorchScript archive becomes an OrderedDict of its parameters and buffers by
// dotted name; another zip pickle is read with torch::pickle_load and converted.
// Throws Error(trusted_load_failed) with LibTorch's message when it cannot.
LoadedMapping load_with_libtorch(const std::filesystem::path& path) {
  LoadedMapping mapping;
  mapping.via_libtorch = true;
  std::string torchscript_error;
  try {
    torch::jit::Module module = torch::jit::load(path.string());
    Dict entries;
    for (const auto& item : module.named_parameters()) entries.insert_or_assign(item.name, tensor_value(item.value.detach()));
    for (const auto& item : module.named_buffers()) entries.insert_or_assign(item.name, tensor_value(item.value.detach()));
    mapping.root = Value::ordered_dict(std::move(entries));
    mapping.format = FileFormat::pytorch_zip;
    return mapping;
  } catch (const c10::Error& error) {
    torchscript_error = error.what_without_backtrace();
  }
  try {
    // The same open as every reader's: load_checkpoint_mapping refused a
    // FIFO or device already, but the name may have changed since.
    const io::RegularFile file = io::open_regular_for_reading(path);
    std::vector<char> bytes(static_cast<std::size_t>(file.size));
    bytes.resize(io::pread_fully(file.fd.get(), reinterpret_cast<std::byte*>(bytes.data()), bytes.size(), 0));
    mapping.root = value_from_ivalue(torch::jit::pickle_load(bytes), 0);
    mapping.format = FileFormat::pytorch_zip;
    return mapping;
  } catch (const c10::Error& error) {
    throw Error(ErrorCode::trusted_load_failed,
                detail::concat("LibTorch cannot read the file either: as TorchScript: ", torchscript_error,
                               "; as a pickle: ", error.what_without_backtrace()))
        .with_path(path.string());
  }
}

}  // namespace

LoadedMapping load_trusted_mapping(const std::filesystem::path& path, const LoadOptions& options) {
  try {
    return load_checkpoint_mapping(path, options);
  } catch (const Error& error) {
    // Only what the file is, never how it was read, is a reason to try LibTorch:
    // I/O errors and digest mismatches stand.
    switch (error.code()) {
      case ErrorCode::io_open_failed:
      case ErrorCode::io_read_failed:
      case ErrorCode::io_not_regular_file:
      case ErrorCode::file_too_large:
      case ErrorCode::file_changed_during_read:
      case ErrorCode::sha256_mismatch:
      case ErrorCode::sha256_invalid:
      case ErrorCode::file_empty:
      // A signature the trust policy refuses is never a reason to read the
      // file some other way.
      case ErrorCode::signature_missing:
      case ErrorCode::signature_malformed:
      case ErrorCode::signature_invalid:
      case ErrorCode::signature_key_unknown:
      case ErrorCode::signature_key_revoked:
      case ErrorCode::signature_statement_mismatch:
      case ErrorCode::key_file_invalid:
        throw;
      default: break;
    }
    LoadedMapping mapping = load_with_libtorch(path);
    mapping.warnings.push_back(detail::concat(
        path.string(), ": the restricted reader refused this file (", error_code_name(error.code()),
        "); it was read with LibTorch's deserializer because the caller marked it trusted"));
    return mapping;
  }
}

}  // namespace holdpoint
