// Writes a holdpoint checkpoint from its components: the root is the manifest
// entry ("holdpoint") followed by one entry per component, and the manifest
// records each component's digest and contract. One pass over the tensor
// bytes: the storages stream first, each digested as it goes, then the root
// with the completed manifest is pickled (format::write_pt_storages_first).
//
// Every writer of component checkpoints calls this: the C++ TrainingState,
// the best-state envelope and the Python package's RunDirectory.commit, so a
// generation written by one is read by the others with the same checks.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint::schema {

using NamedComponents = std::vector<std::pair<std::string, Value>>;

// `manifest` is written as given, with its components list replaced by one
// record per entry of `components` (name, component_digest, contract_of), in
// order. Component names must be distinct and not the manifest's key
// (invalid_argument).
format::PtWriteResult write_components(io::ByteSink& sink, Manifest manifest, const NamedComponents& components,
                                       const format::PtWriteOptions& options = {});

}  // namespace holdpoint::schema
