// CRC-32 (the zip / gzip polynomial, reflected), via ISA-L.
//
// crc32_update(0, data, n) gives the zip CRC of data; feeding pieces in order
// with the previous result gives the CRC of the concatenation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace holdpoint::io {

std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t size) noexcept;

inline std::uint32_t crc32_of(std::span<const std::byte> bytes) noexcept {
  return crc32_update(0, bytes.data(), bytes.size());
}

}  // namespace holdpoint::io
