// What the run-directory commands (ls, verify RUN, gc) share: opening
// a run directory with the CLI's error reporting, the JSON forms of
// generations, checks and recovery findings, and how every command prints an
// error. docs/cli.md documents the JSON shapes.
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

// to_json (holdpoint/run/run_directory.h) as values to build on:
// {"name", "step", "epoch", "kind", "size", "sha256", "saved_at", "metrics": {name: value},
//  "world_size"} (world_size: the ranks of a sharded generation, 0 for a single file)
nlohmann::ordered_json generation_json(const GenerationInfo& generation);
// {"name", "ok", "code" (null when ok), "detail"}
nlohmann::ordered_json check_json(const GenerationCheck& check);
// The RecoveryReport's fields, plus "clean" and "lines" (RecoveryReport::lines()).
nlohmann::ordered_json recovery_json(const RecoveryReport& report);

// Prints an error the way every command does: "invalid: " (exit 1) or "error: "
// (exit 2) then "<code>: <message>", on `out`; returns the exit code.
int report_error(std::ostream& out, ErrorCode code, const std::string& message);

// `holdpoint verify RUN`: every generation, LATEST and BEST (verify_run.cpp).
// With `trust`, also every signature of the run (RunDirectory::verify_signatures).
int verify_run_directory(const std::string& run, bool json, const std::optional<TrustPolicy>& trust = std::nullopt);

}  // namespace holdpoint::cli
