// Helpers shared by the unit tests: error-code matchers, temporary
// directories, corpus paths and small file utilities.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/format/value.h"

namespace holdpoint::testing {

// Runs `action` and returns the ErrorCode of the holdpoint::Error it throws.
// Fails the test (and returns nullopt) if it throws nothing or something else.
std::optional<ErrorCode> error_code_of(const std::function<void()>& action);

// EXPECT_ERROR_CODE(statement, ErrorCode::zip_crc_mismatch): the statement must
// throw holdpoint::Error with exactly that code.
#define EXPECT_ERROR_CODE(statement, expected_code)                                         \
  do {                                                                                      \
    auto holdpoint_actual_code = ::holdpoint::testing::error_code_of([&] { statement; });   \
    EXPECT_EQ(holdpoint_actual_code, std::optional<::holdpoint::ErrorCode>(expected_code))  \
        << "statement: " #statement;                                                        \
  } while (0)

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const noexcept { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::vector<std::byte> read_file_bytes(const std::filesystem::path& path);
void write_file_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes);
std::vector<std::byte> bytes_of(std::string_view text);

std::filesystem::path source_dir();  // the repository root
std::filesystem::path corpus_dir();  // tests/corpus (a copy of the shared corpus)

// The Python interpreters of the interop tests (CMake's HOLDPOINT_ORACLE_PYTHON
// and HOLDPOINT_COMPAT_PYTHON; docs/build.md). The oracle (torch 2.13, the
// project's .venv) is required: a test that needs it fails when it is missing.
// The compatibility interpreter (Debian's python3-torch 1.x) is optional:
// empty when none was found, and the tests that need it skip.
std::string oracle_python();
std::string compat_python();

// A list of lists of numbers (as Python's torch.save writes rows of learning
// rates or scales) as doubles; ints and 0-d float64 tensors included.
std::vector<std::vector<double>> number_rows(const Value& rows);

struct PythonRun {
  int status = -1;     // the exit status (-1: could not run)
  std::string output;  // stdout and stderr together
};
// Runs `interpreter script arguments` (arguments are passed to the shell as
// they are) in /tmp, with `stdin_path` as standard input when it is not empty.
PythonRun run_python(const std::string& interpreter, const std::filesystem::path& script,
                     const std::string& arguments = "", const std::filesystem::path& stdin_path = {});

// Runs `action` in a child process stopped by an alarm after `seconds`, so
// that an open that blocks (a FIFO) fails a test instead of hanging it.
// Returns what `action` returned, the name of the holdpoint::Error it threw,
// "another exception: <what>", or "hang".
std::string outcome_in_child(const std::function<std::string()>& action, unsigned seconds = 10);
// The same for an action that returns nothing: "no error" when it returns.
inline std::string error_code_in_child(const std::function<void()>& action, unsigned seconds = 10) {
  return outcome_in_child([&] { action(); return std::string("no error"); }, seconds);
}

}  // namespace holdpoint::testing

namespace holdpoint {
// Lets gtest print ErrorCode values by name.
void PrintTo(ErrorCode code, std::ostream* os);
}  // namespace holdpoint
