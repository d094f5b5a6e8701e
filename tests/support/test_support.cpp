#include <exception>
#include <csignal>
#include "support/test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

std::string oracle_python() {
  const std::string path = HOLDPOINT_ORACLE_PYTHON;
  if (path.empty() || !std::filesystem::exists(path)) {
    ADD_FAILURE() << "the oracle Python '" << path << "' is missing: run scripts/install-deps.sh";
  }
  return path;
}

std::string compat_python() { return HOLDPOINT_COMPAT_PYTHON; }

std::vector<std::vector<double>> number_rows(const Value& rows) {
  std::vector<std::vector<double>> out;
  for (const Value& row : rows.as_list()) {
    out.emplace_back();
    for (const Value& item : row.as_list()) out.back().push_back(item.as_number());
  }
  return out;
}

PythonRun run_python(const std::string& interpreter, const std::filesystem::path& script, const std::string& arguments,
                     const std::filesystem::path& stdin_path) {
  std::string command = "cd /tmp && '" + interpreter + "' '" + script.string() + "' " + arguments;
  if (!stdin_path.empty()) command += " < '" + stdin_path.string() + "'";
  command += " 2>&1";
  PythonRun run;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return run;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) run.output.append(buffer, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

std::string outcome_in_child(const std::function<std::string()>& action, unsigned seconds) {
  int channel[2];
  if (::pipe(channel) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(channel[0]);
    ::alarm(seconds);
    std::string outcome;
    try {
      outcome = action();
    } catch (const Error& error) {
      outcome = std::string(error_code_name(error.code()));
    } catch (const std::exception& error) {
      outcome = std::string("another exception: ") + error.what();
    } catch (...) {
      outcome = "another exception";
    }
    (void)!::write(channel[1], outcome.data(), outcome.size());
    ::_exit(0);
  }
  ::close(channel[1]);
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = ::read(channel[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(channel[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? "hang" : text;
}

}  // namespace holdpoint::testing

namespace holdpoint {
void PrintTo(ErrorCode code, std::ostream* os) { *os << error_code_name(code); }
}  // namespace holdpoint
