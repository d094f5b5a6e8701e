#include "schema/component_writer.h"

#include <algorithm>

#include "base/fail.h"

namespace holdpoint::schema {

using detail::fail;

namespace {

// The XXH3-128 digests write_pt_storages_first computed while the storages
// streamed, as the StorageDigests that component digests are computed from.
StorageDigests written_storage_digests(const std::vector<format::WrittenStorage>& written) {
  StorageDigests digests(StorageDigestKind::xxh3_128);
  for (const auto& storage : written) {
    StorageDigest digest;
    std::copy(storage.xxh3.begin(), storage.xxh3.end(), digest.bytes.begin());
    digest.size = static_cast<std::uint8_t>(storage.xxh3.size());
    digests.set(storage.identity, digest);
  }
  return digests;
}

}  // namespace

format::PtWriteResult write_components(io::ByteSink& sink, Manifest manifest, const NamedComponents& components,
                                       const format::PtWriteOptions& options) {
  manifest.components.clear();
  Dict body;
  body.insert(std::string(kManifestKey), manifest.to_value());
  for (const auto& [name, state] : components) {
    if (name == kManifestKey || body.find(name) != nullptr) {
      fail(ErrorCode::invalid_argument, "component name '", name,
           name == kManifestKey ? "' is the manifest's key" : "' appears twice");
    }
    body.insert(name, state);
  }
  const auto finish_root = [&](const std::vector<format::WrittenStorage>& written) {
    StorageDigests digests = written_storage_digests(written);
    for (const auto& [name, state] : components) {
      manifest.components.push_back({name, component_digest(state, digests), contract_of(state)});
    }
    Dict root = body;
    root.insert_or_assign(std::string(kManifestKey), manifest.to_value());
    return Value::dict(std::move(root));
  };
  return format::write_pt_storages_first(sink, Value::dict(body), finish_root, options);
}

}  // namespace holdpoint::schema
