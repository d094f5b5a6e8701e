// holdpoint: inspect, verify and convert checkpoint files without executing them,
// list, verify, prune and export run directories, and verify that a trainer's
// resume reproduces its uninterrupted run.
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "holdpoint_version.h"

int main(int argc, char** argv) {
  CLI::App app{"holdpoint: trustworthy PyTorch/LibTorch checkpoints (.pt and .safetensors)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("holdpoint ") + HOLDPOINT_VERSION);
  int exit_code = holdpoint::cli::kExitOk;
  holdpoint::cli::add_inspect_command(app, exit_code);
  holdpoint::cli::add_verify_command(app, exit_code);
  holdpoint::cli::add_keygen_command(app, exit_code);
  holdpoint::cli::add_sign_command(app, exit_code);
  holdpoint::cli::add_convert_command(app, exit_code);
  holdpoint::cli::add_codes_command(app, exit_code);
  holdpoint::cli::add_doctor_command(app, exit_code);
  holdpoint::cli::add_ls_command(app, exit_code);
  holdpoint::cli::add_gc_command(app, exit_code);
  holdpoint::cli::add_export_command(app, exit_code, std::vector<std::string>(argv, argv + argc));
  holdpoint::cli::add_verify_resume_command(app, exit_code);
  holdpoint::cli::add_diff_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : holdpoint::cli::kExitUsage;
  }
  return exit_code;
}
