// The run directory's own small files (holdpoint/run/run_directory.h), as
// commit() writes them and open() parses them:
//
//   LATEST, BEST                     "<generation> <sha256>\n"
//   checkpoints/<generation>.sha256  sha256sum's "<sha256>  <generation>\n"
//   index.json                       schema holdpoint.run-index, version 1;
//                                    "retired": the signed generations that
//                                    retention removed (docs/threat-model.md,
//                                    "Signing a run"), absent when none
//
// Each parser accepts exactly what the writer writes and rejects anything
// else with its own code: run_pointer_invalid,
// run_index_invalid.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/run/run_directory.h"

namespace holdpoint {

// Exactly as commit() writes them, also for export, which assembles a run
// directory elsewhere.
std::string run_pointer_text(const GenerationInfo& generation);
std::string run_index_text(const std::vector<GenerationInfo>& generations);

namespace run {

// A signed generation that retention removed: its signature stays in
// checkpoints/, and this record in the (signed) index says the file's absence
// is retention's doing, not an attacker's.
struct RetiredGeneration {
  std::string name;
  std::int64_t step = 0;
  Sha256Digest sha256;
};

using RetiredByStep = std::map<std::int64_t, RetiredGeneration>;

struct RunIndex {
  std::map<std::string, GenerationInfo> generations;  // by name
  RetiredByStep retired;
};

// `which` names the pointer in errors ("LATEST", "BEST").
std::pair<std::string, Sha256Digest> parse_pointer(const std::string& text, std::string_view which);

std::string index_text(const std::map<std::int64_t, GenerationInfo>& by_step, const RetiredByStep& retired = {});
RunIndex parse_index(const std::string& text);

}  // namespace run
}  // namespace holdpoint
