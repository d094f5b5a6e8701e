// Reader for PyTorch's legacy (non-zip) stream. See legacy_reader.h for the
// layout; torch/serialization.py (_legacy_save / _legacy_load) is the source.
//
// The storages follow the object pickle, and where each one starts depends on
// the key list and element counts that come after the object pickle. So the
// object pickle runs through the VM twice: pass 1 only learns which storages
// it declares (with placeholder storages), then the key list and the storage
// segments are checked, then pass 2 decodes it again with zero-copy views of
// the real bytes.
#include "format/pickle/legacy_reader.h"

#include <array>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "format/pickle/pickle_opcodes.h"

namespace holdpoint::format {
namespace {

namespace op = pickle_op;
using detail::checked_mul;
using detail::fail;

// torch.serialization.MAGIC_NUMBER = 0x1950a86a20f9469cfc6c exceeds int64, so
// the VM (rightly) refuses it; it is matched byte for byte instead.
constexpr std::array<std::uint8_t, 10> kMagicLittleEndian = {0x6c, 0xfc, 0x9c, 0x46, 0xf9,
                                                              0x20, 0x6a, 0xa8, 0x50, 0x19};
constexpr std::string_view kMagicTextLong = "119547037146038801333356L\n";  // protocol 0/1
constexpr std::int64_t kProtocolVersion = 1001;

// The length of the magic-number pickle at the start of `file` ([PROTO n]
// [FRAME len] LONG1 10 <magic> STOP, or the protocol 0/1 text form), 0 if absent.
std::size_t magic_pickle_length(std::span<const std::byte> file) noexcept {
  const auto at = [&](std::size_t i) -> int { return i < file.size() ? std::to_integer<int>(file[i]) : -1; };
  std::size_t pos = 0;
  if (at(0) == op::PROTO) {
    if (at(1) < 2 || at(1) > op::kHighestProtocol) return 0;
    pos = 2;
  }
  std::size_t frame_end = 0;
  if (at(pos) == op::FRAME) {
    if (file.size() < pos + 9) return 0;
    std::uint64_t length = 0;
    for (std::size_t i = 0; i < 8; ++i) length |= std::uint64_t(at(pos + 1 + i)) << (8 * i);
    pos += 9;
    if (length > file.size() - pos) return 0;
    frame_end = pos + static_cast<std::size_t>(length);
  }
  if (at(pos) == op::LONG1 && at(pos + 1) == static_cast<int>(kMagicLittleEndian.size())) {
    pos += 2;
    for (std::uint8_t byte : kMagicLittleEndian) {
      if (at(pos++) != byte) return 0;
    }
  } else if (at(pos) == op::LONG) {
    ++pos;
    for (char c : kMagicTextLong) {
      if (at(pos++) != static_cast<unsigned char>(c)) return 0;
    }
  } else {
    return 0;
  }
  if (at(pos) != op::STOP) return 0;
  ++pos;
  if (frame_end != 0 && frame_end != pos) return 0;
  return pos;
}

// For the pickles that must not name storages (protocol version, sys_info, keys).
class NoStorages final : public StorageResolver {
 public:
  std::shared_ptr<const Storage> resolve(const StorageRequest& request) override {
    fail(ErrorCode::persistent_id_invalid, "a persistent id (storage '", request.key,
         "') in a pickle that holds no tensors");
  }
};

// Pass 1: records what the object pickle declares. The placeholder storage
// points at the start of the file with the declared size, which is checked to
// fit in the file first, so even a stray read of it would stay in bounds.
class DeclaredStorages final : public StorageResolver {
 public:
  DeclaredStorages(std::span<const std::byte> file, std::size_t data_begin) : file_(file), data_begin_(data_begin) {}

  std::shared_ptr<const Storage> resolve(const StorageRequest& request) override {
    const std::uint64_t nbytes = request.numel * dtype_itemsize(request.dtype);  // checked by the VM
    if (nbytes > file_.size() - data_begin_) {
      fail(ErrorCode::pickle_truncated, "legacy stream: storage '", request.key, "' declares ", nbytes,
           " bytes but only ", file_.size() - data_begin_, " bytes follow the object pickle");
    }
    requests.emplace(request.key, request);
    return std::make_shared<const Storage>(file_.data(), static_cast<std::size_t>(nbytes), nullptr);
  }

  std::unordered_map<std::string, StorageRequest> requests;

 private:
  std::span<const std::byte> file_;
  std::size_t data_begin_;
};

// Pass 2: zero-copy views of the storage segments, holding the file's owner.
class SegmentStorages final : public StorageResolver {
 public:
  SegmentStorages(std::span<const std::byte> file, std::shared_ptr<const void> owner) : file_(file), owner_(owner) {}

  void add(const std::string& key, std::size_t offset, std::size_t nbytes) { segments_[key] = {offset, nbytes}; }

  std::shared_ptr<const Storage> resolve(const StorageRequest& request) override {
    const auto found = segments_.find(request.key);
    if (found == segments_.end()) {
      fail(ErrorCode::storage_record_missing, "legacy stream: storage '", request.key, "' has no segment");
    }
    const auto [offset, nbytes] = found->second;
    return std::make_shared<const Storage>(file_.data() + offset, nbytes, owner_);
  }

 private:
  std::span<const std::byte> file_;
  std::shared_ptr<const void> owner_;
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> segments_;
};

// Runs one pickle of the stream, naming it and its file offset in errors.
PickleResult read_part(std::span<const std::byte> file, std::size_t offset, std::size_t length, const char* part,
                       StorageResolver& storages, const Limits& limits, bool allow_trailing_bytes) {
  PickleOptions options;
  options.persistent_ids = PersistentIdForm::legacy;
  options.canonical_storage_keys = false;
  try {
    return read_pickle(file.subspan(offset, length), storages, limits, options, allow_trailing_bytes);
  } catch (const Error& error) {
    throw Error(error.code(), detail::concat("legacy stream, ", part, " pickle at file offset ", offset, ": ",
                                             error.detail()));
  }
}

void check_sys_info(const Value& sys_info) {
  if (!sys_info.is_dict()) {
    fail(ErrorCode::legacy_sys_info_invalid, "legacy stream: sys_info is a ", value_kind_name(sys_info.kind()),
         ", not a dict");
  }
  const Dict& dict = sys_info.as_dict();
  const Value* version = dict.find(std::string_view("protocol_version"));
  if (!version || !version->is_int() || version->as_int() != kProtocolVersion) {
    fail(ErrorCode::legacy_sys_info_invalid, "legacy stream: sys_info['protocol_version'] is not ", kProtocolVersion);
  }
  const Value* little_endian = dict.find(std::string_view("little_endian"));
  if (!little_endian || !little_endian->is_bool() || !little_endian->as_bool()) {
    fail(ErrorCode::legacy_sys_info_invalid,
         "legacy stream: sys_info['little_endian'] is not True (big-endian storages are not supported)");
  }
}

}  // namespace

bool looks_like_legacy_stream(std::span<const std::byte> file) noexcept { return magic_pickle_length(file) != 0; }

LegacyStream read_legacy_stream(std::span<const std::byte> file, const std::shared_ptr<const void>& owner,
                                const Limits& limits) {
  std::size_t pos = magic_pickle_length(file);
  if (pos == 0) {
    fail(ErrorCode::legacy_magic_invalid, "legacy stream: the file does not start with PyTorch's magic number pickle");
  }
  NoStorages no_storages;
  const auto rest = [&] { return file.size() - pos; };

  const PickleResult version = read_part(file, pos, rest(), "protocol version", no_storages, limits, true);
  if (!version.root.is_int() || version.root.as_int() != kProtocolVersion) {
    fail(ErrorCode::legacy_protocol_unsupported, "legacy stream: the protocol version is ",
         version.root.is_int() ? std::to_string(version.root.as_int())
                               : std::string(value_kind_name(version.root.kind())),
         ", not ", kProtocolVersion);
  }
  pos += version.consumed;

  const PickleResult sys_info = read_part(file, pos, rest(), "sys_info", no_storages, limits, true);
  check_sys_info(sys_info.root);
  pos += sys_info.consumed;

  const std::size_t object_begin = pos;
  DeclaredStorages declared(file, object_begin);
  const std::size_t object_size = read_part(file, pos, rest(), "object", declared, limits, true).consumed;
  pos += object_size;

  const PickleResult key_list = read_part(file, pos, rest(), "storage key list", no_storages, limits, true);
  pos += key_list.consumed;
  if (!key_list.root.is_list()) {
    fail(ErrorCode::legacy_storage_keys_invalid, "legacy stream: the storage key list is a ",
         value_kind_name(key_list.root.kind()), ", not a list");
  }
  const Value::List& keys = key_list.root.as_list();
  if (keys.size() != declared.requests.size()) {
    fail(ErrorCode::legacy_storage_keys_invalid, "legacy stream: the key list names ", keys.size(),
         " storages, the object pickle declares ", declared.requests.size());
  }

  LegacyStream stream;
  stream.protocol_version = static_cast<std::uint64_t>(kProtocolVersion);
  SegmentStorages segments(file, owner);
  std::unordered_set<std::string> seen;
  for (const Value& key_value : keys) {
    if (!key_value.is_string()) {
      fail(ErrorCode::legacy_storage_keys_invalid, "legacy stream: a storage key is a ",
           value_kind_name(key_value.kind()), ", not a str");
    }
    const std::string& key = key_value.as_string();
    const auto request = declared.requests.find(key);
    if (request == declared.requests.end() || !seen.insert(key).second) {
      fail(ErrorCode::legacy_storage_keys_invalid, "legacy stream: storage key '", key.substr(0, 64), "' is ",
           request == declared.requests.end() ? "not declared by the object pickle" : "listed twice");
    }
    // Segment: u64 little-endian element count, then numel x itemsize bytes.
    if (rest() < 8) {
      fail(ErrorCode::pickle_truncated, "legacy stream: the file ends inside the header of storage '", key,
           "' at offset ", pos);
    }
    std::uint64_t numel = 0;
    for (std::size_t i = 0; i < 8; ++i) numel |= std::uint64_t{std::to_integer<std::uint8_t>(file[pos + i])} << (8 * i);
    if (numel != request->second.numel) {
      fail(ErrorCode::legacy_storage_header_invalid, "legacy stream: storage '", key, "' at offset ", pos, " holds ",
           numel, " elements, the pickle declares ", request->second.numel);
    }
    pos += 8;
    const auto nbytes = checked_mul<std::uint64_t>(numel, dtype_itemsize(request->second.dtype));
    if (!nbytes || *nbytes > rest()) {
      fail(ErrorCode::pickle_truncated, "legacy stream: storage '", key, "' needs ", numel, " elements at offset ",
           pos, ", only ", rest(), " bytes remain");
    }
    segments.add(key, pos, static_cast<std::size_t>(*nbytes));
    stream.storages.push_back(RecordInfo{"storage/" + key, pos, *nbytes, 0});
    pos += static_cast<std::size_t>(*nbytes);
  }
  if (pos != file.size()) {
    fail(ErrorCode::legacy_trailing_data, "legacy stream: ", file.size() - pos,
         " bytes follow the last storage at offset ", pos);
  }

  stream.object = read_part(file, object_begin, object_size, "object", segments, limits, false);
  stream.root = std::move(stream.object.root);
  stream.object.root = Value();
  return stream;
}

}  // namespace holdpoint::format
