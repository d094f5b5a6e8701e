#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"

namespace holdpoint::cli {

void add_codes_command(CLI::App& app, int& exit_code) {
  auto json = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand("codes", "List every error code with its one-line meaning");
  command->add_flag("--json", *json, "print a JSON array of {code, meaning}");
  command->callback([json, &exit_code] {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < error_code_count(); ++i) {
      const auto code = static_cast<ErrorCode>(i);
      if (*json) {
        list.push_back({{"code", std::string(error_code_name(code))},
                        {"meaning", std::string(error_code_description(code))}});
      } else {
        std::cout << error_code_name(code) << "\t" << error_code_description(code) << "\n";
      }
    }
    if (*json) std::cout << list.dump(2) << "\n";
    exit_code = kExitOk;
  });
}

}  // namespace holdpoint::cli
