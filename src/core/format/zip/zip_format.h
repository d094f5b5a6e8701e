// Constants of the zip container as PyTorch writes it, shared by ZipWriter and
// the strict reader so that the two cannot drift apart.
//
// The byte tables (offsets and sizes of every field) are in docs/format.md;
// the names here follow them. All multi-byte fields are little-endian.
#pragma once

#include <cstddef>
#include <cstdint>

namespace holdpoint::format::zip {

// Record signatures, as read with a little-endian u32 load ("PK\3\4" etc.).
inline constexpr std::uint32_t kLocalHeaderSignature = 0x04034b50;
inline constexpr std::uint32_t kCentralHeaderSignature = 0x02014b50;
inline constexpr std::uint32_t kDataDescriptorSignature = 0x08074b50;
inline constexpr std::uint32_t kZip64EndSignature = 0x06064b50;
inline constexpr std::uint32_t kZip64LocatorSignature = 0x07064b50;
inline constexpr std::uint32_t kEndSignature = 0x06054b50;

// Fixed sizes of the records, without their variable-length tails.
inline constexpr std::size_t kLocalHeaderSize = 30;
inline constexpr std::size_t kCentralHeaderSize = 46;
inline constexpr std::size_t kZip64EndSize = 56;
inline constexpr std::size_t kZip64LocatorSize = 20;
inline constexpr std::size_t kEndSize = 22;
// The zip64 end record stores its own size minus the 12 bytes of signature
// and size field.
inline constexpr std::uint64_t kZip64EndSizeField = 44;
inline constexpr std::uint64_t kZip64EndLeadingBytes = 12;
// Data descriptor: signature + CRC + two sizes, 32- or 64-bit.
inline constexpr std::size_t kDescriptor32Size = 16;
inline constexpr std::size_t kDescriptor64Size = 24;

// General-purpose flag bits.
inline constexpr std::uint16_t kFlagEncrypted = 1u << 0;
inline constexpr std::uint16_t kFlagDataDescriptor = 1u << 3;
inline constexpr std::uint16_t kFlagStrongEncryption = 1u << 6;
inline constexpr std::uint16_t kFlagUtf8Name = 1u << 11;
inline constexpr std::uint16_t kFlagMaskedHeaders = 1u << 13;
inline constexpr std::uint16_t kEncryptionFlags = kFlagEncrypted | kFlagStrongEncryption | kFlagMaskedHeaders;
inline constexpr std::uint16_t kAllowedFlags = kFlagDataDescriptor | kFlagUtf8Name;

// miniz flags every record UTF-8; only records with a payload get a descriptor.
inline constexpr std::uint16_t kWriterFlags = kFlagDataDescriptor | kFlagUtf8Name;
inline constexpr std::uint16_t kWriterFlagsEmptyRecord = kFlagUtf8Name;

inline constexpr std::uint16_t kMethodStored = 0;

// Version fields of the zip64 end record as miniz writes them ("made by"
// 0x031E = Unix, spec 3.0; "needed" 45 = zip64). Every other version field
// PyTorch writes is 0.
inline constexpr std::uint16_t kZip64EndVersionMadeBy = 0x031E;
inline constexpr std::uint16_t kZip64EndVersionNeeded = 45;

// Extra-field block ids: the zip64 block, and PyTorch's "FB" padding block
// whose payload is kPaddingByte repeated.
inline constexpr std::uint16_t kZip64ExtraId = 0x0001;
inline constexpr std::uint16_t kPaddingExtraId = 0x4246;  // bytes 'F' 'B'
inline constexpr std::byte kPaddingByte{'Z'};
inline constexpr std::size_t kExtraBlockHeaderSize = 4;

// A 32-bit size or offset at or above this value moves into the zip64 block
// and its 32-bit slot holds this value instead (miniz compares with >=).
inline constexpr std::uint64_t kZip64Threshold = 0xFFFFFFFF;
// The end record's 16-bit entry counts saturate at this value.
inline constexpr std::uint64_t kEndCountCap = 0xFFFF;

// Full entry names ("archive/data/0") are at most this long: miniz's name
// buffer is 512 bytes including the terminator.
inline constexpr std::size_t kMaxNameBytes = 511;

// Payloads start at a multiple of this, so they can be memory-mapped as
// tensor storage.
inline constexpr std::uint64_t kPayloadAlignment = 64;

// A record needs the zip64 block in its local header (and 64-bit sizes in its
// data descriptor) when its size or its local header offset overflows 32 bits.
constexpr bool needs_zip64(std::uint64_t local_header_offset, std::uint64_t size) {
  return size >= kZip64Threshold || local_header_offset >= kZip64Threshold;
}

// Size of the local header's zip64 block, header included; 0 when absent.
// miniz writes the uncompressed size, a zero compressed size, then the offset.
constexpr std::uint64_t local_zip64_block_size(std::uint64_t local_header_offset, std::uint64_t size) {
  if (!needs_zip64(local_header_offset, size)) return 0;
  return kExtraBlockHeaderSize + (size >= kZip64Threshold ? 16 : 0) +
         (local_header_offset >= kZip64Threshold ? 8 : 0);
}

// Number of 'Z' bytes in the FB block so that the payload of a record whose
// local header starts at `local_header_offset` lands on kPayloadAlignment.
// Callers pass names of at most kMaxNameBytes, so nothing here can overflow.
constexpr std::uint64_t padding_size(std::uint64_t local_header_offset, std::uint64_t name_size, std::uint64_t size) {
  const std::uint64_t unpadded = local_header_offset + kLocalHeaderSize + name_size +
                                 local_zip64_block_size(local_header_offset, size) + kExtraBlockHeaderSize;
  return (kPayloadAlignment - unpadded % kPayloadAlignment) % kPayloadAlignment;
}

}  // namespace holdpoint::format::zip
