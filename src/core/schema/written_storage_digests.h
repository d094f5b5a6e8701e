// The storage digests write_pt_storages_first computed while it streamed, as
// the StorageDigests a manifest's component digests are computed from.
#pragma once

#include <algorithm>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint::schema {

inline StorageDigests written_storage_digests(const std::vector<format::WrittenStorage>& written) {
  StorageDigests digests(StorageDigestKind::xxh3_128);
  for (const auto& storage : written) {
    StorageDigest digest;
    std::copy(storage.xxh3.begin(), storage.xxh3.end(), digest.bytes.begin());
    digest.size = static_cast<std::uint8_t>(storage.xxh3.size());
    digests.set(storage.identity, digest);
  }
  return digests;
}

}  // namespace holdpoint::schema
