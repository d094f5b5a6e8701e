// The names of a run directory's files (holdpoint/run/run_directory.h): one
// spelling of a step, shared by generations ("step-00000005.pt") and shard
// directories ("step-00000005.shards"), and the suffixes of the files that
// sit beside them. Retention and recovery touch only names that parse here.
//
// Kept apart from run_directory.h so that sharded_checkpoint.cpp can spell a
// shard directory without depending on RunDirectory (which depends on it).
//
// Thread-safety: plain functions and constants.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "format/sidecar.h"

namespace holdpoint::run {

inline constexpr std::string_view kGenerationSuffix = ".pt";
inline constexpr std::string_view kShardDirectorySuffix = ".shards";
inline constexpr std::string_view kSidecarSuffix = format::kSidecarSuffix;  // format/sidecar.h
inline constexpr std::string_view kDamagedSuffix = ".damaged";
inline constexpr std::string_view kSignatureSuffix = ".sig";
inline constexpr std::string_view kLockFile = ".holdpoint-lock";

// "step-<at least 8 digits><suffix>"; invalid_argument for a negative step.
std::string step_name(std::int64_t step, std::string_view suffix);
// Its inverse: nullopt for any name step_name would not write for this suffix.
std::optional<std::int64_t> parse_step_name(std::string_view name, std::string_view suffix) noexcept;

// "<generation>.sha256", the sidecar beside a generation file.
std::string sidecar_name(const std::string& generation);
// "<file>.sig", the signature beside a generation, LATEST, BEST or index.json.
std::string signature_name(std::string_view file);

}  // namespace holdpoint::run
