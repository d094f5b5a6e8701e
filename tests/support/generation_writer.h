// A small, valid generation for run-directory tests, fuzz targets and
// benchmarks: a holdpoint manifest (semantic identity `identity`) and an
// int64 tensor "payload" of `elements` values, each `step`, so that a loaded
// generation tells which step wrote it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint::testing {

inline RunDirectory::Writer generation_writer(std::int64_t step, const std::string& identity,
                                              std::int64_t elements = 8) {
  Dict root;
  Manifest manifest;
  manifest.semantic_identity = identity;
  root.insert(std::string(kManifestKey), manifest.to_value());
  const std::vector<std::int64_t> payload(static_cast<std::size_t>(elements), step);
  root.insert("payload", Value::tensor(TensorData::from_bytes(DType::int64, {elements},
                                                              std::as_bytes(std::span<const std::int64_t>(payload)))));
  io::MemorySink sink;
  format::write_pt(sink, Value::dict(std::move(root)));
  return [bytes = sink.bytes()](io::ByteSink& out) { out.write(bytes); };
}

}  // namespace holdpoint::testing
