#include "base/crc32.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace holdpoint::io {

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t size) noexcept {
  // ISA-L takes a 64-bit length but is documented for uint64_t; feed in bounded
  // pieces so that the loop is obviously correct for any size_t.
  const auto* bytes = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const std::size_t piece = std::min<std::size_t>(size, std::size_t{1} << 30);
    crc = crc32_gzip_refl(crc, bytes, piece);
    bytes += piece;
    size -= piece;
  }
  return crc;
}

}  // namespace holdpoint::io
