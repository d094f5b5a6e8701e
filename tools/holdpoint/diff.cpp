// holdpoint diff A B: two checkpoints compared in bounded memory
// (holdpoint/verify/checkpoint_diff.h; docs/cli.md "diff"). Exit 0 the same
// within tolerance, 1 different, 2 a file could not be read or does not verify.
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/verify/checkpoint_diff.h"

namespace holdpoint::cli {

namespace {

struct DiffArguments {
  std::string a;
  std::string b;
  double atol = 0;
  double rtol = 0;
  bool json = false;
};

// A side of the comparison: a file, or a run directory's generation.
struct DiffInput {
  std::filesystem::path path;
  std::optional<Sha256Digest> sha256;  // the run's record of the generation
};

// RUN@LATEST, RUN@BEST, RUN@<step> or RUN@step-<digits>.pt names a committed
// generation of a run directory, read against the digest the run recorded.
// Anything else, and a path that exists as it is, is a file.
DiffInput resolve_input(const std::string& argument) {
  std::error_code ignored;
  const std::size_t at = argument.rfind('@');
  if (at == std::string::npos ||
      std::filesystem::symlink_status(argument, ignored).type() != std::filesystem::file_type::not_found) {
    return {argument, std::nullopt};
  }
  const std::filesystem::path run = argument.substr(0, at);
  const std::string which = argument.substr(at + 1);
  if (!std::filesystem::is_directory(run, ignored)) return {argument, std::nullopt};
  RunDirectoryOptions options;
  options.create = false;
  options.recover = false;
  const RunDirectory directory(run, options);
  std::optional<GenerationInfo> generation;
  if (which == "LATEST") {
    generation = directory.latest();
  } else if (which == "BEST") {
    generation = directory.best();
  } else if (!which.empty() && which.find_first_not_of("0123456789") == std::string::npos && which.size() <= 18) {
    generation = directory.find(generation_name(std::stoll(which)));
  } else if (parse_generation_name(which)) {
    generation = directory.find(which);
  } else {
    throw Error(ErrorCode::invalid_argument,
                argument + ": after '@' comes LATEST, BEST, a step or a generation name (step-00000005.pt)");
  }
  if (!generation) {
    throw Error(ErrorCode::run_generation_missing, argument + ": the run directory has no such committed generation");
  }
  return {directory.file_path(*generation), generation->sha256};
}

int run_diff(const DiffArguments& args) {
  try {
    DiffOptions options;
    options.atol = args.atol;
    options.rtol = args.rtol;
    const DiffInput a = resolve_input(args.a);
    const DiffInput b = resolve_input(args.b);
    options.expected_sha256_a = a.sha256;
    options.expected_sha256_b = b.sha256;
    options.load.progress = terminal_progress("verifying");
    options.progress = terminal_progress("comparing " + args.a + " and " + args.b);
    const CheckpointDiff diff = diff_checkpoints(a.path, b.path, options);
    std::cout << (args.json ? diff.json() : diff.text());
    return diff.same() ? kExitOk : kExitInvalid;
  } catch (const Error& error) {
    // A file that cannot be compared is an error, whatever the reason: exit 1
    // says "different".
    std::cerr << (exit_code_for(error.code()) == kExitInvalid ? "invalid: " : "error: ")
              << error_code_name(error.code()) << ": " << error.what() << "\n";
    if (args.json) {
      nlohmann::ordered_json out;
      out["error"] = {{"code", std::string(error_code_name(error.code()))}, {"message", error.what()}};
      std::cout << out.dump(2) << "\n";
    }
    return kExitUsage;
  }
}

}  // namespace

void add_diff_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<DiffArguments>();
  CLI::App* command = app.add_subcommand(
      "diff",
      "Compare two checkpoints tensor by tensor in bounded memory (exit 0 same within tolerance, 1 different, "
      "2 a file could not be read or does not verify)");
  command->add_option("a", args->a, "a .pt or .safetensors file, or RUN@LATEST, RUN@BEST, RUN@<step>")->required();
  command->add_option("b", args->b, "the same, compared against A (tolerances are relative to B)")->required();
  command->add_option("--atol", args->atol, "absolute tolerance (default 0)");
  command->add_option("--rtol", args->rtol, "relative tolerance, times |B's value| (default 0)");
  command->add_flag("--json", args->json, "print one JSON document");
  command->callback([args, &exit_code] { exit_code = run_diff(*args); });
}

}  // namespace holdpoint::cli
