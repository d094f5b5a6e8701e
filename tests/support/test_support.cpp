#include "support/test_support.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

namespace holdpoint::testing {

std::optional<ErrorCode> error_code_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.code();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "threw a non-holdpoint exception: " << error.what();
    return std::nullopt;
  }
  ADD_FAILURE() << "expected a holdpoint::Error, but nothing was thrown";
  return std::nullopt;
}

TempDir::TempDir() {
  std::random_device device;
  const auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / ("holdpoint-test-" + std::to_string(::getpid()) + "-" + std::to_string(device()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("could not create a temporary directory");
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void write_file_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> bytes(text.size());
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

std::filesystem::path source_dir() { return HOLDPOINT_SOURCE_DIR; }
std::filesystem::path corpus_dir() { return HOLDPOINT_CORPUS_DIR; }

}  // namespace holdpoint::testing

namespace holdpoint {
void PrintTo(ErrorCode code, std::ostream* os) { *os << error_code_name(code); }
}  // namespace holdpoint
