// The selection envelope's byte layout, shared by the envelope API and the
// publication gate (which writes into publish()'s staging sink and verifies
// the re-read bytes). Layout in docs/best-state.md.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "holdpoint/checkpoint/best_state_gate.h"
#include "holdpoint/base/byte_sink.h"

namespace holdpoint::selection {

// Streams the envelope: the model state, then the selection component
// ({record, artifact_route}), then the manifest with both components' digests.
// The tensors must stay alive and unchanged until the sink is finished.
void write_envelope(io::ByteSink& sink, const SelectionRecord& record, const std::string& route,
                    const NamedTensors& state);

// Parses bytes with the restricted reader and checks the envelope (see
// decode_selection_envelope). The state's tensors view `bytes` and hold `owner`.
SelectionEnvelope parse_envelope(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner);

}  // namespace holdpoint::selection
