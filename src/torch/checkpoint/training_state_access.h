// What the loaders above TrainingState (CheckpointManager, the sharded loader
// of holdpoint/dist/distributed.h) need from it and users do not: loading a
// mapping they read and checked themselves.
#pragma once

#include <filesystem>
#include <functional>
#include <vector>

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

// What a resume in place's first pass keeps of the small storage records,
// in all (format::scan_for_resume's keep_budget; split over a sharded
// checkpoint's files).
inline constexpr std::uint64_t kInPlaceKeptBytes = std::uint64_t{64} << 20;

struct TrainingStateAccess {
  // The registered components (a resume in place journals the models').
  static const std::vector<Component*>& components(const TrainingState& state) { return state.components_; }

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
