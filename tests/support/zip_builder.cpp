#include "support/zip_builder.h"

#include <algorithm>
#include <stdexcept>

#include "base/crc32.h"

namespace holdpoint::testing {
namespace {

// Deliberately spelled out here rather than taken from format/zip_format.h,
// so that a wrong constant there cannot make the builder agree with it.
constexpr std::uint32_t kLocalSignature = 0x04034b50;
constexpr std::uint32_t kCentralSignature = 0x02014b50;
constexpr std::uint32_t kDescriptorSignature = 0x08074b50;
constexpr std::uint32_t kZip64EndSignature = 0x06064b50;
constexpr std::uint32_t kLocatorSignature = 0x07064b50;
constexpr std::uint32_t kEndSignature = 0x06054b50;

class Out {
 public:
  void le(std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xFF));
  }
  void append(std::string_view text) {
    for (char c : text) bytes.push_back(static_cast<std::byte>(c));
  }
  void append(const std::vector<std::byte>& more) { bytes.insert(bytes.end(), more.begin(), more.end()); }
  void zeros(std::size_t count) { bytes.insert(bytes.end(), count, std::byte{0}); }
  std::size_t size() const { return bytes.size(); }

  std::vector<std::byte> bytes;
};

std::uint16_t default_flags(const ZipBuilderEntry& entry) {
  return entry.flags.value_or(entry.payload.empty() ? 0x0800 : 0x0808);
}

}  // namespace

ZipBuilderEntry zip_entry(std::string name, std::string_view payload) {
  ZipBuilderEntry entry;
  entry.name = std::move(name);
  for (char c : payload) entry.payload.push_back(static_cast<std::byte>(c));
  return entry;
}

std::uint64_t get_le(const std::vector<std::byte>& bytes, std::size_t offset, int width) {
  if (offset + width > bytes.size()) throw std::out_of_range("get_le past the end");
  std::uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<std::uint8_t>(bytes[offset + i]);
  return value;
}

void put_le(std::vector<std::byte>& bytes, std::size_t offset, std::uint64_t value, int width) {
  if (offset + width > bytes.size()) throw std::out_of_range("put_le past the end");
  for (int i = 0; i < width; ++i) bytes[offset + i] = static_cast<std::byte>((value >> (8 * i)) & 0xFF);
}

std::vector<std::byte> build_zip(const ZipBuilderLayout& layout) {
  Out out;
  out.append(layout.prefix);
  std::vector<std::uint64_t> local_offsets;
  for (const ZipBuilderEntry& entry : layout.entries) {
    if (entry.shares_local_header_of) {
      local_offsets.push_back(local_offsets.at(*entry.shares_local_header_of));
      continue;
    }
    out.zeros(entry.gap_before);
    const std::uint64_t offset = out.size();
    local_offsets.push_back(offset);
    const std::string& name = entry.local_name ? *entry.local_name : entry.name;
    const std::uint16_t flags = entry.local_flags.value_or(default_flags(entry));
    const std::uint32_t crc = io::crc32_of(entry.payload);
    const bool descriptor = entry.write_descriptor.value_or((flags & 0x0008) != 0 && !entry.payload.empty());

    std::vector<std::byte> extra;
    if (entry.local_extra) {
      extra = *entry.local_extra;
    } else {
      const std::size_t unpadded = offset + 30 + name.size() + 4;
      const std::size_t padding = (64 - unpadded % 64) % 64;
      Out block;
      block.le(0x4246, 2);
      block.le(padding, 2);
      block.bytes.insert(block.bytes.end(), padding, std::byte{'Z'});
      extra = block.bytes;
    }

    out.le(kLocalSignature, 4);
    out.le(0, 2);
    out.le(flags, 2);
    out.le(entry.local_method.value_or(entry.method), 2);
    out.le(0, 4);
    // With a descriptor the CRC and sizes live there and these are zero.
    out.le(descriptor ? 0 : crc, 4);
    out.le(descriptor ? 0 : entry.payload.size(), 4);
    out.le(descriptor ? 0 : entry.payload.size(), 4);
    out.le(name.size(), 2);
    out.le(extra.size(), 2);
    out.append(name);
    out.append(extra);
    out.append(entry.payload);
    if (descriptor) {
      if (entry.descriptor_signature) out.le(kDescriptorSignature, 4);
      out.le(entry.descriptor_crc.value_or(crc), 4);
      const std::uint64_t size = entry.descriptor_size.value_or(entry.payload.size());
      out.le(size, entry.descriptor64 ? 8 : 4);
      out.le(size, entry.descriptor64 ? 8 : 4);
    }
  }
  out.zeros(layout.gap_before_directory);

  const std::uint64_t directory_offset = out.size();
  for (std::size_t i = 0; i < layout.entries.size(); ++i) {
    const ZipBuilderEntry& entry = layout.entries[i];
    const ZipBuilderEntry& data_entry =
        entry.shares_local_header_of ? layout.entries[*entry.shares_local_header_of] : entry;
    const std::uint64_t size = data_entry.payload.size();
    out.le(kCentralSignature, 4);
    out.le(0, 2);
    out.le(0, 2);
    out.le(default_flags(entry), 2);
    out.le(entry.method, 2);
    out.le(0, 4);
    out.le(entry.crc.value_or(io::crc32_of(data_entry.payload)), 4);
    out.le(entry.central_compressed_size.value_or(size), 4);
    out.le(entry.central_uncompressed_size.value_or(size), 4);
    out.le(entry.name.size(), 2);
    out.le(entry.central_extra.size(), 2);
    out.le(0, 2);
    out.le(0, 2);
    out.le(0, 2);
    out.le(0, 4);
    out.le(entry.central_offset.value_or(local_offsets[i]), 4);
    out.append(entry.name);
    out.append(entry.central_extra);
  }
  const std::uint64_t directory_size = out.size() - directory_offset;
  const std::uint64_t count = layout.entries.size();

  if (layout.zip64_end) {
    const std::uint64_t zip64_end_offset = out.size();
    out.le(kZip64EndSignature, 4);
    out.le(44, 8);
    out.le(0x031E, 2);
    out.le(45, 2);
    out.le(0, 4);
    out.le(0, 4);
    out.le(layout.zip64_count.value_or(count), 8);
    out.le(layout.zip64_count.value_or(count), 8);
    out.le(directory_size, 8);
    out.le(directory_offset, 8);
    out.le(kLocatorSignature, 4);
    out.le(0, 4);
    out.le(zip64_end_offset, 8);
    out.le(1, 4);
  }
  const std::uint16_t end_count = layout.end_count.value_or(static_cast<std::uint16_t>(std::min<std::uint64_t>(count, 0xFFFF)));
  out.le(kEndSignature, 4);
  out.le(0, 2);
  out.le(0, 2);
  out.le(end_count, 2);
  out.le(end_count, 2);
  out.le(std::min<std::uint64_t>(directory_size, 0xFFFFFFFF), 4);
  out.le(std::min<std::uint64_t>(directory_offset, 0xFFFFFFFF), 4);
  out.le(layout.comment.size(), 2);
  out.append(layout.comment);
  out.append(layout.trailing);
  return std::move(out.bytes);
}

ZipOffsets zip_offsets(const std::vector<std::byte>& archive) {
  ZipOffsets offsets;
  offsets.end_record = archive.size() - 22;
  std::uint64_t count = get_le(archive, offsets.end_record + 10, 2);
  offsets.central_directory = get_le(archive, offsets.end_record + 16, 4);
  if (archive.size() >= 42 && get_le(archive, archive.size() - 42, 4) == kLocatorSignature) {
    offsets.locator = archive.size() - 42;
    offsets.zip64_end_record = get_le(archive, *offsets.locator + 8, 8);
    count = get_le(archive, *offsets.zip64_end_record + 32, 8);
    offsets.central_directory = get_le(archive, *offsets.zip64_end_record + 48, 8);
  }
  std::size_t pos = offsets.central_directory;
  for (std::uint64_t i = 0; i < count; ++i) {
    offsets.central_entries.push_back(pos);
    offsets.local_headers.push_back(get_le(archive, pos + 42, 4));
    pos += 46 + get_le(archive, pos + 28, 2) + get_le(archive, pos + 30, 2) + get_le(archive, pos + 32, 2);
  }
  return offsets;
}

}  // namespace holdpoint::testing
