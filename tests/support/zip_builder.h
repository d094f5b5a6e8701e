// A test-only zip builder that can write malformed archives.
//
// ZipWriter only produces correct archives; the reader's negative tests need
// archives with one field wrong at a time. build_zip writes PyTorch's layout
// (64-byte aligned payloads, data descriptors, zip64 end records) by default,
// and every override below breaks exactly one thing. Patch helpers edit
// fields of finished archives in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace holdpoint::testing {

struct ZipBuilderEntry {
  std::string name;  // as stored in the central directory
  std::vector<std::byte> payload;

  // Defaults: flags 0x0808 (0x0800 for an empty payload) in both headers.
  std::optional<std::uint16_t> flags;
  std::optional<std::uint16_t> local_flags;
  std::uint16_t method = 0;
  std::optional<std::uint16_t> local_method;
  std::optional<std::string> local_name;
  // Default: an "FB" block that aligns the payload to 64 bytes.
  std::optional<std::vector<std::byte>> local_extra;
  std::vector<std::byte> central_extra;

  // Raw central-directory fields; defaults are the true values.
  std::optional<std::uint32_t> crc;
  std::optional<std::uint32_t> central_compressed_size;
  std::optional<std::uint32_t> central_uncompressed_size;
  std::optional<std::uint32_t> central_offset;

  // Descriptor; written by default when flag bit 3 is set and the payload is
  // non-empty. Its CRC and sizes default to the true values.
  std::optional<bool> write_descriptor;
  bool descriptor_signature = true;
  bool descriptor64 = false;
  std::optional<std::uint32_t> descriptor_crc;
  std::optional<std::uint64_t> descriptor_size;

  std::size_t gap_before = 0;  // zero bytes written before the local header
  // Write no local header; the central entry points at this earlier entry's.
  std::optional<std::size_t> shares_local_header_of;
};

struct ZipBuilderLayout {
  std::vector<ZipBuilderEntry> entries;
  std::vector<std::byte> prefix;  // bytes before the first local header
  std::size_t gap_before_directory = 0;
  bool zip64_end = true;  // zip64 end record + locator, as PyTorch always writes
  std::optional<std::uint16_t> end_count;    // default min(entries, 0xFFFF)
  std::optional<std::uint64_t> zip64_count;  // default entries
  std::vector<std::byte> comment;            // end-record comment
  std::vector<std::byte> trailing;           // bytes after everything
};

std::vector<std::byte> build_zip(const ZipBuilderLayout& layout);

// Convenience: an entry with a text payload.
ZipBuilderEntry zip_entry(std::string name, std::string_view payload);

// Little-endian field access on archive bytes.
std::uint64_t get_le(const std::vector<std::byte>& bytes, std::size_t offset, int width);
void put_le(std::vector<std::byte>& bytes, std::size_t offset, std::uint64_t value, int width);

// Offsets inside a well-formed archive with a zip64 end record or a plain
// end record at the end.
struct ZipOffsets {
  std::size_t end_record = 0;
  std::optional<std::size_t> locator;
  std::optional<std::size_t> zip64_end_record;
  std::size_t central_directory = 0;
  std::vector<std::size_t> central_entries;
  std::vector<std::size_t> local_headers;
};
ZipOffsets zip_offsets(const std::vector<std::byte>& archive);

}  // namespace holdpoint::testing
