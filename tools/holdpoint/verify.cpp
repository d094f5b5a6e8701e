#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "holdpoint/checkpoint_mapping.h"
#include "run_directory_output.h"

namespace holdpoint::cli {

namespace {

struct VerifyArguments {
  std::string file;
  std::string sha256;
  bool sidecar = false;
  bool json = false;
};

// A directory holding LATEST, index.json or checkpoints/ is a run directory
// (through a symlink too, which opening it then refuses); any other directory
// is refused as before, as not a regular file.
bool is_run_directory(const std::filesystem::path& path) {
  std::error_code ignored;
  if (!std::filesystem::is_directory(path, ignored)) return false;
  for (const std::string_view name : {kLatestPointer, kRunIndex, kCheckpointsDirectory}) {
    if (std::filesystem::symlink_status(path / name, ignored).type() != std::filesystem::file_type::not_found) {
      return true;
    }
  }
  return false;
}

int run_verify(const VerifyArguments& args) {
  if (is_run_directory(args.file)) {
    if (!args.sha256.empty() || args.sidecar) {
      std::cerr << "error: invalid_argument: --sha256 and --sidecar check one file; " << args.file
                << " is a directory (its generations are checked against their own records)\n";
      return kExitUsage;
    }
    return verify_run_directory(args.file, args.json);
  }
  nlohmann::ordered_json report;
  report["file"] = args.file;
  try {
    LoadOptions options;
    options.progress = terminal_progress("reading " + args.file);
    if (!args.sha256.empty()) options.expected_sha256 = args.sha256;
    if (args.sidecar) options.expected_sha256 = read_sha256_sidecar(args.file).hex();
    const LoadedMapping mapping = load_checkpoint_mapping(args.file, options);
    report["valid"] = true;
    report["format"] = std::string(file_format_name(mapping.format));
    report["sha256"] = mapping.sha256.hex();
    report["digest_checked"] = options.expected_sha256.has_value();
    if (args.json) {
      std::cout << report.dump(2) << "\n";
    } else {
      std::cout << "valid: " << args.file << " (" << file_format_name(mapping.format) << ", sha256 "
                << mapping.sha256.hex() << (options.expected_sha256 ? ", digest matches" : "") << ")\n";
    }
    return kExitOk;
  } catch (const Error& error) {
    const int exit_code = exit_code_for(error.code());
    report["valid"] = false;
    report["code"] = std::string(error_code_name(error.code()));
    report["message"] = error.what();
    if (args.json) {
      std::cout << report.dump(2) << "\n";
    } else {
      std::cout << (exit_code == kExitInvalid ? "invalid: " : "error: ") << error_code_name(error.code()) << ": "
                << error.what() << "\n";
    }
    return exit_code;
  }
}

}  // namespace

void add_verify_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<VerifyArguments>();
  CLI::App* command = app.add_subcommand(
      "verify",
      "Check that FILE is a well-formed checkpoint, or that every generation of the run directory RUN verifies "
      "(exit 0 valid, 1 invalid, 2 usage/IO error)");
  command->add_option("file", args->file, "a .pt or .safetensors file, or a run directory")->required();
  auto* sha = command->add_option("--sha256", args->sha256, "expected SHA-256 (64 hex digits) from a trusted source");
  auto* sidecar = command->add_flag("--sidecar", args->sidecar, "check FILE against FILE.sha256 (sha256sum format)");
  sha->excludes(sidecar);
  command->add_flag("--json", args->json, "print a JSON report");
  command->callback([args, &exit_code] { exit_code = run_verify(*args); });
}

}  // namespace holdpoint::cli
