// What the loaders above TrainingState (CheckpointManager, the sharded loader
// of holdpoint/dist/distributed.h) need from it and users do not: loading a
// mapping they read and checked themselves.
#pragma once

#include <filesystem>
#include <functional>

#include "holdpoint/checkpoint/training_state.h"

namespace holdpoint {

namespace checkpoint {
class InPlaceFill;
}

// How a load treats a mapping another layer assembled.
struct ParsedLoadOptions {
  // Compare each component with the digest and contract its manifest
  // records. Off only when the caller verified the bytes another way (each
  // shard against its own manifest and the step manifest's digests).
  bool check_component_records = true;
  // Called after every check passed and before the first component is
  // applied; a throw rejects the load with nothing changed (the ranks'
  // collective agreement).
  std::function<void()> before_apply;
  // Accept a checkpoint of another profile when the live profile is
  // unqualified (a world-size change); the profile is then not load-bearing.
  bool allow_unqualified_profile_change = false;
  // A resume in place: the mapping's large storages are absent, and this
  // fills them after every check (checkpoint/in_place.h).
  checkpoint::InPlaceFill* in_place = nullptr;
};

struct TrainingStateAccess {
  // TrainingState::load_checkpoint's checks and transactional apply, on a
  // mapping already read and parsed by the restricted reader (RunDirectory::load,
  // the sharded reader); `path` labels the report and errors. The caller gives
  // the mapping up: its tensors are handed over (hand_over_storages in
  // holdpoint/format/value.h), so it must not read them after this call.
  static LoadReport load_parsed(TrainingState& state, const LoadedMapping& mapping, const std::filesystem::path& path,
                                const ParsedLoadOptions& options = {}) {
    return state.load_parsed_checkpoint(mapping, path, options);
  }
};

}  // namespace holdpoint
