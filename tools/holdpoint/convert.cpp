#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint::cli {

namespace {

struct ConvertArguments {
  std::string input;
  std::string output;
  bool sidecar = false;
};

FileFormat format_for_output(const std::string& path) {
  return path.ends_with(".safetensors") ? FileFormat::safetensors : FileFormat::pytorch_zip;
}

// A flat mapping is a dict of str -> tensor (a state_dict); nothing else has
// a faithful counterpart in both formats.
void require_flat_tensor_mapping(const Value& root) {
  if (!root.is_dict()) {
    throw Error(ErrorCode::convert_not_flat,
                std::string("the top level is a ") + std::string(value_kind_name(root.kind())) +
                    ", not a dict of str -> tensor");
  }
  for (const auto& [key, value] : root.as_dict()) {
    if (!key.is_string() || !value.is_tensor()) {
      throw Error(ErrorCode::convert_not_flat, "entry " + key.to_string() + " is a " +
                                                   std::string(value_kind_name(value.kind())) +
                                                   "; only str -> tensor entries convert");
    }
  }
}

std::vector<std::int64_t> with_last_size(const std::vector<std::int64_t>& sizes, std::int64_t last) {
  std::vector<std::int64_t> out = sizes;
  out.back() = last;
  return out;
}

// Refusals name the input file, as the readers' errors do.
[[noreturn]] void refuse(ErrorCode code, const std::string& input, std::string detail) {
  throw Error(code, std::move(detail)).with_path(input);
}

// safetensors F4 and torch.float4_e2m1fn_x2 hold the same bytes: the reference's
// torch loader reads an F4 tensor as float4_e2m1fn_x2 with the last dimension
// halved (two 4-bit elements per byte) and its writer doubles it back. F4
// shapes that do not pair up, and 0-d pairs, have no counterpart (the
// reference refuses them too).
TensorData float4_for_pytorch(const std::string& input, const std::string& key, const TensorData& tensor) {
  if (tensor.sizes.empty() || tensor.sizes.back() % 2 != 0) {
    refuse(ErrorCode::convert_float4_shape_invalid, input,
           "tensor " + key + " is F4 (float4_e2m1fn) of shape " + shape_text(tensor.sizes) +
               "; torch.float4_e2m1fn_x2 holds two elements per byte along the last dimension, so it needs "
               "rank >= 1 and an even last dimension");
  }
  return TensorData::from_bytes(DType::float4_e2m1fn_x2, with_last_size(tensor.sizes, tensor.sizes.back() / 2),
                                tensor.contiguous_bytes());
}

TensorData float4_for_safetensors(const std::string& input, const std::string& key, const TensorData& tensor) {
  if (tensor.sizes.empty()) {
    refuse(ErrorCode::convert_float4_shape_invalid, input,
           "tensor " + key + " is a 0-d float4_e2m1fn_x2 (one byte, two elements), which has no F4 shape");
  }
  return TensorData::from_bytes(DType::float4_e2m1fn, with_last_size(tensor.sizes, tensor.sizes.back() * 2),
                                tensor.contiguous_bytes());
}

// The tensor as the destination format stores it, or a refusal naming the
// input file, the key and the dtype. An unchanged tensor stays the same Value,
// so tensors tied in the input stay tied. What safetensors has no place for
// (requires_grad, Parameter) is dropped here, so that the written file can be
// compared with the result exactly.
Value for_destination(const ConvertArguments& args, FileFormat destination, const std::string& key,
                      const Value& value) {
  const TensorData& tensor = value.as_tensor();
  const std::string dtype(dtype_name(tensor.dtype));
  if (destination == FileFormat::safetensors) {
    if (tensor.dtype == DType::float4_e2m1fn_x2) return Value::tensor(float4_for_safetensors(args.input, key, tensor));
    if (!dtype_safetensors_name(tensor.dtype)) {
      refuse(ErrorCode::convert_dtype_unsupported, args.input,
             "tensor " + key + " is " + dtype + ", which safetensors has no dtype for; " + args.output +
                 " not written");
    }
    if (!tensor.requires_grad && !tensor.is_parameter) return value;
    TensorData stored = tensor;
    stored.requires_grad = false;
    stored.is_parameter = false;
    return Value::tensor(std::move(stored));
  }
  if (tensor.dtype == DType::float4_e2m1fn) return Value::tensor(float4_for_pytorch(args.input, key, tensor));
  if (!dtype_in_torch(tensor.dtype)) {
    refuse(ErrorCode::convert_dtype_unsupported, args.input,
           "tensor " + key + " is " + dtype + " (safetensors " +
               std::string(dtype_safetensors_name(tensor.dtype).value_or("?")) + "), which torch has no dtype for; " +
               args.output + " not written");
  }
  return value;
}

// The mapping the destination will hold. safetensors has one mapping type,
// which reads back as an OrderedDict, so a plain dict root is no difference,
// and no place for an OrderedDict's _metadata; a .pt file keeps both.
Value for_destination(const ConvertArguments& args, FileFormat destination, const Value& root) {
  if (destination == FileFormat::safetensors) {
    Dict converted;
    for (const auto& [key, value] : root.as_dict()) {
      converted.insert(key, for_destination(args, destination, key.to_string(), value));
    }
    return Value::ordered_dict(std::move(converted));
  }
  Dict converted = root.as_dict();
  for (const auto& [key, value] : root.as_dict()) {
    converted.insert_or_assign(key, for_destination(args, destination, key.to_string(), value));
  }
  return root.is_ordered_dict() ? Value::ordered_dict(std::move(converted)) : Value::dict(std::move(converted));
}

int run_convert(const ConvertArguments& args) {
  try {
    LoadOptions load_options;
    load_options.progress = terminal_progress("reading " + args.input);
    const LoadedMapping input = load_checkpoint_mapping(args.input, load_options);
    require_flat_tensor_mapping(input.root);
    SaveOptions options;
    options.format = format_for_output(args.output);
    options.write_sidecar = args.sidecar;
    const Value converted = for_destination(args, options.format, input.root);
    const SaveResult saved = save_mapping(args.output, converted, options);
    // Read the result back and compare element for element before reporting success.
    const LoadedMapping check = load_checkpoint_mapping(args.output);
    const std::string difference = describe_difference(converted, check.root);
    if (!difference.empty()) {
      std::cerr << "error: converted file differs from the input: " << difference << "\n";
      return kExitInvalid;
    }
    std::cout << "converted " << saved.tensor_count << " tensors: " << args.input << " ("
              << file_format_name(input.format) << ") -> " << args.output << " (" << file_format_name(options.format)
              << ", " << saved.file_bytes << " bytes, sha256 " << saved.sha256.hex() << "), verified by re-reading\n";
    return kExitOk;
  } catch (const Error& error) {
    std::cerr << (exit_code_for(error.code()) == kExitInvalid ? "invalid: " : "error: ")
              << error_code_name(error.code()) << ": " << error.what() << "\n";
    return exit_code_for(error.code());
  }
}

}  // namespace

void add_convert_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConvertArguments>();
  CLI::App* command = app.add_subcommand(
      "convert", "Convert a flat tensor mapping between .pt and .safetensors (format chosen by OUT's extension)");
  command->add_option("input", args->input, "a .pt or .safetensors file")->required();
  command->add_option("output", args->output, "OUT.safetensors, or any other name for a .pt zip archive")->required();
  command->add_flag("--sidecar", args->sidecar, "also write OUT.sha256");
  command->callback([args, &exit_code] { exit_code = run_convert(*args); });
}

}  // namespace holdpoint::cli
