#include <iostream>

#include "commands.h"
#include "holdpoint/checkpoint_mapping.h"

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

int run_convert(const ConvertArguments& args) {
  try {
    LoadOptions load_options;
    load_options.progress = terminal_progress("reading " + args.input);
    const LoadedMapping input = load_checkpoint_mapping(args.input, load_options);
    require_flat_tensor_mapping(input.root);
    SaveOptions options;
    options.format = format_for_output(args.output);
    options.write_sidecar = args.sidecar;
    const SaveResult saved = save_mapping(args.output, input.root, options);
    // Read the result back and compare element for element before reporting success.
    const LoadedMapping check = load_checkpoint_mapping(args.output);
    const std::string difference = describe_difference(input.root, check.root);
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
