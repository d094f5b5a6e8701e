#include "holdpoint/base/error.h"

#include <array>

namespace holdpoint {
namespace {

struct CodeInfo {
  std::string_view name;
  std::string_view description;
};

constexpr std::array kCodes = {
#define HOLDPOINT_X(name, description) CodeInfo{#name, description},
    HOLDPOINT_ERROR_CODES(HOLDPOINT_X)
#undef HOLDPOINT_X
};

std::string compose(const std::string& path, const std::string& detail, ErrorCode code) {
  std::string message;
  if (!path.empty()) message.append(path).append(": ");
  message.append(detail).append(" [").append(error_code_name(code)).append("]");
  return message;
}

}  // namespace

std::string_view error_code_name(ErrorCode code) noexcept {
  const auto index = static_cast<std::size_t>(code);
  return index < kCodes.size() ? kCodes[index].name : std::string_view("unknown");
}

std::string_view error_code_description(ErrorCode code) noexcept {
  const auto index = static_cast<std::size_t>(code);
  return index < kCodes.size() ? kCodes[index].description : std::string_view();
}

std::optional<ErrorCode> error_code_from_name(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kCodes.size(); ++i) {
    if (kCodes[i].name == name) return static_cast<ErrorCode>(i);
  }
  return std::nullopt;
}

std::size_t error_code_count() noexcept { return kCodes.size(); }

bool is_environment_error(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument:
    case ErrorCode::io_open_failed:
    case ErrorCode::io_read_failed:
    case ErrorCode::io_write_failed:
    case ErrorCode::io_sync_failed:
    case ErrorCode::io_rename_failed:
    case ErrorCode::io_not_regular_file:
    case ErrorCode::sha256_invalid:
    case ErrorCode::key_file_invalid:
    case ErrorCode::export_destination_invalid: return true;
    default: return false;
  }
}

Error::Error(ErrorCode code, std::string detail) : Error(code, std::move(detail), std::string()) {}

Error::Error(ErrorCode code, std::string detail, std::string path)
    : std::runtime_error(compose(path, detail, code)), code_(code), detail_(std::move(detail)), path_(std::move(path)) {}

Error Error::with_path(std::string path) const {
  if (!path_.empty()) return *this;
  return Error(code_, detail_, std::move(path));
}

}  // namespace holdpoint
