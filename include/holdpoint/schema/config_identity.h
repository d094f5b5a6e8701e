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
// in Python yields the same bytes (docs/resume-contract.md). Keys sort as
// Python sorts them: int keys by value (2 before 10), str keys by code point;
// a dict mixing both, which Python's sort refuses, has its int keys first.
// Files written before version 2 sorted int keys by their text; their
// digests are checked with that rule (ConfigDigestVersion).
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

// How a canonical JSON orders dict keys. The manifest records the version
// when the two differ for its config (docs/resume-contract.md), so that a file
// written under the first rule is still checked against its own digests.
enum class ConfigDigestVersion : std::uint8_t {
  text_key_order = 1,    // every key by its decimal or string text ("10" before "2")
  python_key_order = 2,  // as json.dumps(sort_keys=True): 2 before 10
};
inline constexpr ConfigDigestVersion kConfigDigestVersion = ConfigDigestVersion::python_key_order;

class TrainingConfig {
 public:
  // Adds or replaces a field. Keys are plain names; values may nest.
  TrainingConfig& load_bearing(const std::string& key, Value value);
  TrainingConfig& operational(const std::string& key, Value value);
  TrainingConfig& max_epochs(std::int64_t epochs);

  const Dict& load_bearing_fields() const noexcept { return load_bearing_; }
  const Dict& operational_fields() const noexcept { return operational_; }
  std::optional<std::int64_t> max_epochs() const;

  std::string canonical_load_bearing(ConfigDigestVersion version = kConfigDigestVersion) const;
  std::string canonical_operational(ConfigDigestVersion version = kConfigDigestVersion) const;
  Sha256Digest load_bearing_digest(ConfigDigestVersion version = kConfigDigestVersion) const;
  Sha256Digest operational_digest(ConfigDigestVersion version = kConfigDigestVersion) const;
  // Whether the two key orders give this config different canonical texts
  // (an int-keyed dict whose text order is not its numeric order, or an int
  // and a str key with the same text).
  bool digest_depends_on_version() const;

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
std::string canonical_json(const Value& value, ConfigDigestVersion version = kConfigDigestVersion);

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
