#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <vector>

#include "commands.h"

namespace holdpoint::cli {

void add_doctor_command(CLI::App& app, int& exit_code) {
  auto json = std::make_shared<bool>(false);
  CLI::App* command =
      app.add_subcommand("doctor", "Print this build's capability matrix (LibTorch, CUDA, load APIs, profiles)");
  command->add_flag("--json", *json, "print JSON");
  command->callback([json, &exit_code] {
    // The matrix comes from holdpoint-doctor, built beside this program.
    std::error_code error;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
    const auto doctor = self.parent_path() / "holdpoint-doctor";
    std::vector<char*> args = {const_cast<char*>(doctor.c_str())};
    if (*json) args.push_back(const_cast<char*>("--json"));
    args.push_back(nullptr);
    std::cout.flush();
    ::execv(doctor.c_str(), args.data());
    std::cerr << "error: cannot run " << doctor << " (built with HOLDPOINT_WITH_TORCH)\n";
    exit_code = kExitUsage;
  });
}

}  // namespace holdpoint::cli
