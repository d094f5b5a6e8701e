// What a sharded generation's step manifest must hold besides its manifest:
// nothing (holdpoint/run/sharded_checkpoint.h). Checked by the sharded reader
// and by the run directory's verification of a sharded generation.
//
// Thread-safety: a plain function.
#pragma once

#include <string>

#include "holdpoint/format/value.h"

namespace holdpoint {

// component_unknown naming `label` when `root` holds any component state.
void require_manifest_only(const Value& root, const std::string& label);

}  // namespace holdpoint
