// The holdpoint command-line tool: one function per subcommand, each a thin
// layer over the public API. Exit codes: 0 success/valid, 1 the file is
// invalid (the error code is printed), 2 usage or I/O error.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/base/signature.h"

namespace holdpoint::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitUsage = 2;

// Registers a subcommand on `app`; the callback stores its exit code in `exit_code`.
void add_inspect_command(CLI::App& app, int& exit_code);
void add_verify_command(CLI::App& app, int& exit_code);
void add_convert_command(CLI::App& app, int& exit_code);
void add_codes_command(CLI::App& app, int& exit_code);
void add_doctor_command(CLI::App& app, int& exit_code);
// The run-directory commands (docs/cli.md). `verify` also takes a run directory.
void add_ls_command(CLI::App& app, int& exit_code);
void add_gc_command(CLI::App& app, int& exit_code);
// `command_line` is recorded in the export's recovery proof.
void add_export_command(CLI::App& app, int& exit_code, std::vector<std::string> command_line);
// Resume verification of a trainer program (docs/verification.md); exits 0
// all checks passed, 1 a comparison failed, 2 could not complete.
void add_verify_resume_command(CLI::App& app, int& exit_code);
// Two checkpoints compared (docs/cli.md "diff"); exits 0 same within
// tolerance, 1 different, 2 a file could not be read or does not verify.
void add_diff_command(CLI::App& app, int& exit_code);

// Signing (docs/cli.md "Signatures"): keygen writes a key pair (or an HMAC
// secret), sign writes FILE.sig.
void add_keygen_command(CLI::App& app, int& exit_code);
void add_sign_command(CLI::App& app, int& exit_code);
// The trust policy of --trust key files and --revoked lists.
TrustPolicy trust_policy(const std::vector<std::string>& key_files, const std::vector<std::string>& revocation_lists,
                         bool required);

// Prints "reading FILE: 37% (...)" on stderr for files of 256 MiB and more,
// when stderr is a terminal; an empty function otherwise.
std::function<void(std::uint64_t, std::uint64_t)> terminal_progress(const std::string& label);

// 2 for errors about the environment (files that cannot be opened, bad
// arguments, an export destination in use), 1 for everything that says the
// file itself is invalid.
int exit_code_for(ErrorCode code);

}  // namespace holdpoint::cli
