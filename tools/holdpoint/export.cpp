// holdpoint export RUN DEST: parses the arguments, runs holdpoint::export_run
// (holdpoint/run/export.h: what an export does and in which order) and prints
// its result or error, as text or with --json (docs/cli.md).
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "holdpoint/run/export.h"

namespace holdpoint::cli {

namespace {

struct ExportArguments {
  std::string run;
  std::string destination;
  bool latest = false;
  bool best = false;
  bool all = false;
  bool json = false;
  std::vector<std::string> command_line;
};

int run_export(const ExportArguments& args) {
  ExportOptions options;
  options.selection = args.all ? ExportSelection::all : args.best ? ExportSelection::best : ExportSelection::latest;
  options.command_line = args.command_line;
  options.progress = terminal_progress;
  try {
    const ExportResult result = export_run(args.run, args.destination, options);
    if (args.json) {
      std::cout << result.proof_json;
      return kExitOk;
    }
    std::cout << "exported " << result.generations.size() << " generation(s) of " << args.run << " to "
              << args.destination << "; LATEST " << result.latest.name << " loaded back from the export (step "
              << result.latest.step << ")\n";
    for (const auto& skipped : result.skipped) {
      std::cout << "skipped " << skipped.name << ": it does not verify in the source ("
                << (skipped.code ? error_code_name(*skipped.code) : "unknown") << ")\n";
    }
    std::cout << "see " << args.destination << "/" << kExportLoadingFile << " and " << kExportProofFile << "\n";
    return kExitOk;
  } catch (const ExportError& error) {
    std::string message = error.what();
    if (error.destination_touched()) {
      message += " (the export did not finish: " + args.destination + " has no " + std::string(kExportProofFile) +
                 "; delete it before exporting again)";
    }
    const int exit_code = error.source_unopened() ? kExitUsage : exit_code_for(error.code());
    if (args.json) {
      nlohmann::ordered_json out;
      out["run"] = args.run;
      out["destination"] = args.destination;
      out["code"] = std::string(error_code_name(error.code()));
      out["message"] = message;
      std::cout << out.dump(2) << "\n";
      return exit_code;
    }
    std::cerr << (exit_code == kExitInvalid ? "invalid: " : "error: ") << error_code_name(error.code()) << ": "
              << message << "\n";
    return exit_code;
  }
}

}  // namespace

void add_export_command(CLI::App& app, int& exit_code, std::vector<std::string> command_line) {
  auto args = std::make_shared<ExportArguments>();
  args->command_line = std::move(command_line);
  CLI::App* command = app.add_subcommand(
      "export", "Copy generations of a run directory to DEST crash-safely, verify them there and write a recovery proof");
  command->add_option("run", args->run, "a run directory")->required();
  command->add_option("dest", args->destination, "a new or empty directory")->required();
  auto* latest = command->add_flag("--latest", args->latest, "export the generation LATEST names (the default)");
  auto* best = command->add_flag("--best", args->best, "export the generation BEST names");
  auto* all = command->add_flag("--all", args->all, "export every committed generation");
  latest->excludes(best)->excludes(all);
  best->excludes(all);
  command->add_flag("--json", args->json, "print the recovery proof as JSON");
  command->callback([args, &exit_code] { exit_code = run_export(*args); });
}

}  // namespace holdpoint::cli
