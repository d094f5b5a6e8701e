#include "schema/checkpoint_bytes.h"

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint::schema {

void verify_checkpoint_bytes(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner,
                             const Limits& limits) {
  Manifest::of_root(parse_checkpoint_bytes(bytes, owner, limits).root);
}

}  // namespace holdpoint::schema
