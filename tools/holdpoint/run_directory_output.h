// What the run-directory commands (ls, verify RUN, gc, export) share: opening
// a run directory with the CLI's error reporting, the JSON and text forms of
// generations, checks and recovery findings, and the error code that sums up
// a recovery report. docs/cli.md documents the JSON shapes.
#pragma once

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "holdpoint/run/run_directory.h"

namespace holdpoint::cli {

// Opens RUN (never creating it). On failure prints "error: <code>: <message>"
// on stderr, or with `json` the object {"run", "code", "message"} on stdout, and
// returns null: a run directory that cannot be opened is exit code 2.
std::unique_ptr<RunDirectory> open_run_directory(const std::string& run, bool recover, bool json,
                                                 std::optional<BestMetric> best_metric = std::nullopt);

// {"name", "step", "epoch", "kind", "size", "sha256", "saved_at", "metrics": {name: value},
//  "world_size"} (world_size: the ranks of a sharded generation, 0 for a single file)
nlohmann::ordered_json generation_json(const GenerationInfo& generation);
// {"name", "ok", "code" (null when ok), "detail"}
nlohmann::ordered_json check_json(const GenerationCheck& check);
// The RecoveryReport's fields, plus "clean" and "lines" (RecoveryReport::lines()).
nlohmann::ordered_json recovery_json(const RecoveryReport& report);

// The code that best names a report's first problem: a damaged generation's
// own code, run_pointer_invalid for LATEST or BEST, run_index_invalid for the
// index; nullopt for a clean report.
std::optional<ErrorCode> recovery_problem_code(const RecoveryReport& report);

// "sha256_mismatch: <detail>" or "ok".
std::string check_text(const GenerationCheck& check);

// Prints an error the way every command does: "invalid: " (exit 1) or "error: "
// (exit 2) then "<code>: <message>", on `out`; returns the exit code.
int report_error(std::ostream& out, ErrorCode code, const std::string& message);

// Now, UTC, ISO 8601 ("2025-01-31T12:00:00Z").
std::string utc_timestamp();

// `holdpoint verify RUN`: every generation, LATEST and BEST (verify_run.cpp).
int verify_run_directory(const std::string& run, bool json);

}  // namespace holdpoint::cli
