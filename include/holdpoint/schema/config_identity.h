// Configuration identity: which settings a checkpoint's trajectory depends on.
//
// A TrainingConfig holds two groups of fields:
//   load-bearing  any change makes a resumed run a different run (model schema,
//                 optimizer type and hyperparameters, scheduler, loss, batch and
//                 sampling contract, generator seeds, gradient accumulation,
//                 precision, clipping, device/profile, curriculum, cadence, and
//                 whatever the caller adds); drift in any of them rejects resume
//                 and every drifted field is named;
//   operational   may change between runs (log paths, save cadence, ...);
//                 `max_epochs` may grow (recorded as last_resume_drift) but not
//                 shrink.
// Each group is identified by the SHA-256 of its canonical JSON: keys sorted,
// no whitespace, ints as decimals, floats as Python's repr writes them, so
// `json.dumps(fields, sort_keys=True, separators=(',', ':'), ensure_ascii=False)`
// in Python yields the same bytes (docs/resume-contract.md).
//
// Values are None, bool, int, float, str, and lists/tuples/dicts of them; no
// tensors (config_invalid otherwise).
//
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/format/value.h"

namespace holdpoint {

class TrainingConfig {
 public:
  // Adds or replaces a field. Keys are plain names; values may nest.
  TrainingConfig& load_bearing(const std::string& key, Value value);
  TrainingConfig& operational(const std::string& key, Value value);
  TrainingConfig& max_epochs(std::int64_t epochs);

  const Dict& load_bearing_fields() const noexcept { return load_bearing_; }
  const Dict& operational_fields() const noexcept { return operational_; }
  std::optional<std::int64_t> max_epochs() const;

  std::string canonical_load_bearing() const;
  std::string canonical_operational() const;
  Sha256Digest load_bearing_digest() const;
  Sha256Digest operational_digest() const;

  // {"load_bearing": {...}, "operational": {...}} as stored in the manifest.
  Value to_value() const;
  // Throws config_invalid naming the field for anything but the layout above.
  static TrainingConfig from_value(const Value& value, const std::string& path = "config");

 private:
  Dict load_bearing_;
  Dict operational_;
};

// The canonical JSON text of a config value (see above); config_invalid for
// tensors or bytes.
std::string canonical_json(const Value& value);

struct MaxEpochsChange {
  std::int64_t saved = 0;
  std::int64_t live = 0;
};

struct ConfigComparison {
  // Dotted paths of every load-bearing field that was added, removed or
  // changed ("optimizer.defaults.lr"), in sorted order.
  std::vector<std::string> drifted;
  // Set when max_epochs differs (in either direction).
  std::optional<MaxEpochsChange> max_epochs;
};

ConfigComparison compare_configs(const TrainingConfig& saved, const TrainingConfig& live);

}  // namespace holdpoint
