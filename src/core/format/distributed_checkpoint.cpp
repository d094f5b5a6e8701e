// torch.distributed.checkpoint folders: `.metadata` through the restricted
// VM, every item's byte range parsed as an untrusted .pt archive.
#include "holdpoint/format/distributed_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "base/file_descriptor.h"
#include "base/file_stream.h"
#include "format/pickle/pickle_reader.h"
#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint {
namespace {

constexpr std::string_view kMetadataModule = "torch.distributed.checkpoint.metadata.";
constexpr std::string_view kStorageInfoClass = "torch.distributed.checkpoint.filesystem._StorageInfo";

class NoStorages final : public format::StorageResolver {
 public:
  std::shared_ptr<const Storage> resolve(const format::StorageRequest&) override {
    throw Error(ErrorCode::persistent_id_invalid, "a plain pickle has no storages to refer to");
  }
};

struct OpenFile {
  std::unique_ptr<io::FileDescriptor> fd;
  std::uint64_t size = 0;
};

OpenFile open_regular(const std::filesystem::path& path, ErrorCode when_absent) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const ErrorCode code = errno == ENOENT ? when_absent : ErrorCode::io_open_failed;
    throw Error(code, detail::concat("cannot open: ", std::strerror(errno))).with_path(path.string());
  }
  OpenFile file{std::make_unique<io::FileDescriptor>(fd), 0};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw Error(ErrorCode::io_open_failed, detail::concat("cannot stat: ", std::strerror(errno))).with_path(path.string());
  }
  if (!S_ISREG(info.st_mode)) throw Error(ErrorCode::io_not_regular_file, "not a regular file").with_path(path.string());
  file.size = static_cast<std::uint64_t>(info.st_size);
  return file;
}

// [offset, offset + length) of an open file, in private memory.
std::shared_ptr<std::vector<std::byte>> read_range(const OpenFile& file, const std::filesystem::path& path,
                                                   std::uint64_t offset, std::uint64_t length) {
  if (offset > file.size || length > file.size - offset) {
    throw Error(ErrorCode::dcp_range_invalid, detail::concat("bytes [", offset, ", ", offset, " + ", length,
                                                             ") lie outside the file's ", file.size, " bytes"))
        .with_path(path.string());
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(length));
  if (io::pread_fully(file.fd->get(), bytes->data(), bytes->size(), offset) != bytes->size()) {
    throw Error(ErrorCode::file_changed_during_read, "the file shrank while it was read").with_path(path.string());
  }
  return bytes;
}

// Checks of the decoded .metadata, each failure dcp_metadata_invalid naming where.
class MetadataView {
 public:
  explicit MetadataView(std::filesystem::path file) : file_(std::move(file)) {}

  [[noreturn]] void invalid(const std::string& where, const std::string& what) const {
    throw Error(ErrorCode::dcp_metadata_invalid, where + ": " + what).with_path(file_.string());
  }

  // The fields of a record of class `cls` ("Metadata", or the full name of _StorageInfo).
  const Dict& record(const Value& value, std::string_view cls, const std::string& where) const {
    const std::string wanted = cls.find('.') == std::string_view::npos ? std::string(kMetadataModule) + std::string(cls)
                                                                        : std::string(cls);
    const Value* name = value.is_dict() ? value.as_dict().find("__class__") : nullptr;
    if (!name || !name->is_string() || name->as_string() != wanted) {
      invalid(where, "not a " + wanted + " record");
    }
    return value.as_dict();
  }

  const std::filesystem::path& file() const noexcept { return file_; }

  std::string record_class(const Value& value) const {
    const Value* name = value.is_dict() ? value.as_dict().find("__class__") : nullptr;
    return name && name->is_string() ? name->as_string() : std::string();
  }

  const Value& field(const Dict& record, std::string_view name, const std::string& where) const {
    const Value* value = record.find(name);
    if (!value) invalid(where, "has no field '" + std::string(name) + "'");
    return *value;
  }

  std::vector<std::int64_t> ints(const Value& value, const std::string& where) const {
    if (!value.is_sequence()) invalid(where, "is a " + std::string(value_kind_name(value.kind())) + ", not a tuple of ints");
    std::vector<std::int64_t> out;
    for (const Value& item : value.as_list()) {
      if (!item.is_int() || item.as_int() < 0) invalid(where, "holds something other than a non-negative int");
      out.push_back(item.as_int());
    }
    return out;
  }

  std::uint64_t count(const Value& value, const std::string& where) const {
    if (!value.is_int() || value.as_int() < 0) invalid(where, "is not a non-negative int");
    return static_cast<std::uint64_t>(value.as_int());
  }

 private:
  std::filesystem::path file_;
};

struct ItemLocation {
  std::string file;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// storage_data's key: the fqn and, for a tensor chunk, its offsets.
std::string location_key(std::string_view fqn, const std::optional<std::vector<std::int64_t>>& offsets) {
  std::string key(fqn);
  key += '\0';
  if (offsets) {
    key += 'o';
    for (const std::int64_t offset : *offsets) key += std::to_string(offset) + ",";
  }
  return key;
}

std::map<std::string, ItemLocation> index_storage_data(const Value& storage_data, const MetadataView& view) {
  std::map<std::string, ItemLocation> index;
  if (storage_data.is_dict() && storage_data.as_dict().empty()) return index;
  if (!storage_data.is_list()) view.invalid("storage_data", "is not a dict keyed by MetadataIndex records");
  std::size_t i = 0;
  for (const Value& pair : storage_data.as_list()) {
    const std::string where = "storage_data[" + std::to_string(i++) + "]";
    if (!pair.is_tuple() || pair.as_list().size() != 2) view.invalid(where, "is not a (MetadataIndex, _StorageInfo) pair");
    const Dict& key = view.record(pair.as_list().at(0), "MetadataIndex", where + " key");
    const Dict& info = view.record(pair.as_list().at(1), kStorageInfoClass, where);
    const Value& fqn = view.field(key, "fqn", where + " key");
    if (!fqn.is_string()) view.invalid(where + " key", "its fqn is not a str");
    std::optional<std::vector<std::int64_t>> offsets;
    if (const Value* offset = key.find("offset"); offset && !offset->is_none()) {
      offsets = view.ints(*offset, where + " key offset");
    }
    if (const Value* transforms = info.find("transform_descriptors");
        transforms && !transforms->is_none() && !(transforms->is_sequence() && transforms->as_list().empty())) {
      throw Error(ErrorCode::dcp_transform_unsupported,
                  where + " ('" + fqn.as_string() + "') was written through stream transforms")
          .with_path(view.file().string());
    }
    ItemLocation location;
    const Value& file = view.field(info, "relative_path", where);
    if (!file.is_string()) view.invalid(where, "relative_path is not a str");
    location.file = file.as_string();
    location.offset = view.count(view.field(info, "offset", where), where + " offset");
    location.length = view.count(view.field(info, "length", where), where + " length");
    const std::string_view name = location.file;
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
        name.find('\0') != std::string_view::npos) {
      throw Error(ErrorCode::dcp_range_invalid, where + ": relative_path '" + location.file +
                                                    "' is not a file name inside the checkpoint folder")
          .with_path(view.file().string());
    }
    if (!index.emplace(location_key(fqn.as_string(), offsets), std::move(location)).second) {
      view.invalid(where, "names the item '" + fqn.as_string() + "' at offsets already listed");
    }
  }
  return index;
}

class ItemReader {
 public:
  ItemReader(std::filesystem::path folder, const std::map<std::string, ItemLocation>& index, const Limits& limits)
      : folder_(std::move(folder)), index_(index), limits_(limits) {}

  // The root of the archive stored for (fqn, offsets).
  Value read(const std::string& fqn, const std::optional<std::vector<std::int64_t>>& offsets) {
    const auto found = index_.find(location_key(fqn, offsets));
    if (found == index_.end()) {
      throw Error(ErrorCode::dcp_item_missing,
                  "storage_data lists no bytes for '" + fqn + "'" +
                      (offsets ? " at offsets " + shape_text(*offsets) : std::string()))
          .with_path((folder_ / ".metadata").string());
    }
    const ItemLocation& location = found->second;
    const std::filesystem::path path = folder_ / location.file;
    auto& file = files_[location.file];
    if (!file.fd) file = open_regular(path, ErrorCode::dcp_item_missing);
    auto bytes = read_range(file, path, location.offset, location.length);
    try {
      return parse_checkpoint_bytes(*bytes, bytes, limits_).root;
    } catch (Error& error) {
      throw error.with_path(path.string() + " (item '" + fqn + "' at byte " + std::to_string(location.offset) + ")");
    }
  }

 private:
  std::filesystem::path folder_;
  const std::map<std::string, ItemLocation>& index_;
  const Limits& limits_;
  std::map<std::string, OpenFile> files_;
};

DType tensor_dtype(const Dict& properties, const MetadataView& view, const std::string& where) {
  const Value& dtype = view.field(properties, "dtype", where);
  const std::string_view name = dtype.is_string() ? std::string_view(dtype.as_string()) : std::string_view();
  const auto parsed = name.starts_with("torch.") ? dtype_from_name(name.substr(6)) : std::nullopt;
  if (!parsed) view.invalid(where, "dtype is not a torch dtype");
  if (const Value* layout = properties.find("layout"); layout && !(layout->is_string() && layout->as_string() == "torch.strided")) {
    throw Error(ErrorCode::dcp_transform_unsupported, where + ": a tensor whose layout is not torch.strided")
        .with_path(view.file().string());
  }
  return *parsed;
}

// Copies a C-order block (`chunk`, of sizes `chunk_sizes`) into a C-order
// tensor of sizes `sizes` at `offsets`, one innermost row at a time.
void place_block(std::byte* out, const std::vector<std::int64_t>& sizes, const std::byte* chunk,
                 const std::vector<std::int64_t>& chunk_sizes, const std::vector<std::int64_t>& offsets,
                 std::size_t itemsize) {
  const std::size_t rank = sizes.size();
  if (rank == 0) {
    std::memcpy(out, chunk, itemsize);
    return;
  }
  std::vector<std::int64_t> strides(rank, 1);  // in elements
  for (std::size_t d = rank - 1; d > 0; --d) strides[d - 1] = strides[d] * sizes[d];
  for (const std::int64_t size : chunk_sizes) {
    if (size == 0) return;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(chunk_sizes.back()) * itemsize;
  std::vector<std::int64_t> index(rank, 0);  // within the chunk, the last dimension fixed at 0
  for (;;) {
    std::int64_t at = 0;
    for (std::size_t d = 0; d < rank; ++d) at += (offsets[d] + index[d]) * strides[d];
    std::memcpy(out + static_cast<std::size_t>(at) * itemsize, chunk, row_bytes);
    chunk += row_bytes;
    std::size_t d = rank - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++index[d] < chunk_sizes[d]) break;
      index[d] = 0;
    }
  }
}

Value load_tensor(const std::string& fqn, const Dict& metadata, ItemReader& reader, const MetadataView& view,
                  const Limits& limits) {
  const std::string where = "state_dict_metadata['" + fqn + "']";
  const Dict& properties = view.record(view.field(metadata, "properties", where), "TensorProperties", where + ".properties");
  const DType dtype = tensor_dtype(properties, view, where + ".properties");
  const std::vector<std::int64_t> sizes = view.ints(view.field(metadata, "size", where), where + ".size");
  const Value& chunks = view.field(metadata, "chunks", where);
  if (!chunks.is_list()) view.invalid(where + ".chunks", "is not a list");
  std::uint64_t numel = 1;
  for (const std::int64_t size : sizes) {
    const auto product = detail::checked_mul(numel, static_cast<std::uint64_t>(size));
    if (!product || *product > limits.max_tensor_numel) {
      view.invalid(where + ".size", "has more elements than Limits::max_tensor_numel");
    }
    numel = *product;
  }
  struct Chunk {
    std::vector<std::int64_t> offsets, sizes;
  };
  std::vector<Chunk> boxes;
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < chunks.as_list().size(); ++i) {
    const std::string at = where + ".chunks[" + std::to_string(i) + "]";
    const Dict& chunk = view.record(chunks.as_list()[i], "ChunkStorageMetadata", at);
    Chunk box{view.ints(view.field(chunk, "offsets", at), at + ".offsets"),
              view.ints(view.field(chunk, "sizes", at), at + ".sizes")};
    if (box.offsets.size() != sizes.size() || box.sizes.size() != sizes.size()) {
      view.invalid(at, "has a rank other than its tensor's " + std::to_string(sizes.size()));
    }
    std::uint64_t chunk_numel = 1;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      if (box.offsets[d] > sizes[d] || box.sizes[d] > sizes[d] - box.offsets[d]) {
        view.invalid(at, "reaches outside the tensor's size " + shape_text(sizes));
      }
      chunk_numel *= static_cast<std::uint64_t>(box.sizes[d]);
    }
    for (const Chunk& other : boxes) {
      bool overlap = chunk_numel > 0;
      for (std::size_t d = 0; d < sizes.size() && overlap; ++d) {
        overlap = box.offsets[d] < other.offsets[d] + other.sizes[d] && other.offsets[d] < box.offsets[d] + box.sizes[d];
      }
      if (overlap) view.invalid(at, "overlaps an earlier chunk");
    }
    covered += chunk_numel;
    boxes.push_back(std::move(box));
  }
  if (covered != numel) {
    view.invalid(where + ".chunks", "cover " + std::to_string(covered) + " of the tensor's " + std::to_string(numel) +
                                        " elements");
  }
  std::vector<Value> parts;
  for (const Chunk& box : boxes) {
    Value part = reader.read(fqn, box.offsets);
    if (!part.is_tensor() || part.as_tensor().dtype != dtype || part.as_tensor().sizes != box.sizes) {
      throw Error(ErrorCode::dcp_metadata_invalid,
                  where + ": the chunk at offsets " + shape_text(box.offsets) + " holds a " +
                      (part.is_tensor() ? std::string(dtype_name(part.as_tensor().dtype)) + " tensor of sizes " +
                                              shape_text(part.as_tensor().sizes)
                                        : std::string(value_kind_name(part.kind()))) +
                      ", not the " + std::string(dtype_name(dtype)) + " " + shape_text(box.sizes) +
                      " the metadata lists")
          .with_path(view.file().string());
    }
    parts.push_back(std::move(part));
  }
  if (parts.size() == 1) return parts.front();  // the whole tensor, as saved: no copy
  const std::size_t itemsize = dtype_itemsize(dtype);
  if (itemsize == 0) {
    throw Error(ErrorCode::dcp_transform_unsupported, where + ": a sub-byte dtype saved in several chunks")
        .with_path(view.file().string());
  }
  const auto nbytes = detail::checked_mul(numel, std::uint64_t{itemsize});
  if (!nbytes || *nbytes > limits.max_tensor_logical_bytes) {
    view.invalid(where + ".size", "has more bytes than Limits::max_tensor_logical_bytes");
  }
  std::vector<std::byte> whole(static_cast<std::size_t>(*nbytes));
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::vector<std::byte> chunk = parts[i].as_tensor().contiguous_bytes();
    place_block(whole.data(), sizes, chunk.data(), boxes[i].sizes, boxes[i].offsets, itemsize);
  }
  return Value::tensor(TensorData::from_bytes(dtype, sizes, whole));
}

// DCP's unflatten_state_dict: `path` (str and int keys) leads from the root
// to the value; a container made on the way is a list when the next key is
// an int, a dict otherwise; a list grows with None up to an index.
void place_value(Value& root, const Value& path, Value value, const std::string& fqn, const MetadataView& view) {
  const std::string where = "planner_data['" + fqn + "']";
  if (!path.is_sequence() || path.as_list().empty()) view.invalid(where, "is not a non-empty tuple of str and int keys");
  const Value::List& keys = path.as_list();
  for (const Value& key : keys) {
    if (!key.is_string() && !(key.is_int() && key.as_int() >= 0 && key.as_int() < (std::int64_t{1} << 24))) {
      view.invalid(where, "holds a key that is neither a str nor an int index");
    }
  }
  const auto dict_key = [](const Value& key) { return key.is_string() ? DictKey(key.as_string()) : DictKey(key.as_int()); };
  // The child of `container` under `key`, made (with `made`) when absent.
  const auto slot = [&](Value& container, const Value& key, Value* made) -> Value {
    if (container.is_dict()) {
      if (const Value* child = container.as_dict().find(dict_key(key))) return *child;
      if (!made) return Value();
      container.mutable_dict().insert(dict_key(key), *made);
      return *made;
    }
    if (!container.is_list() || !key.is_int()) view.invalid(where, "indexes a " + std::string(value_kind_name(container.kind())) + " with a " + std::string(value_kind_name(key.kind())));
    Value::List& items = container.mutable_list();
    const auto index = static_cast<std::size_t>(key.as_int());
    if (items.size() <= index) items.resize(index + 1);
    if (items[index].is_none() && made) items[index] = *made;
    return items[index];
  };
  Value container = root;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    Value made = keys[i + 1].is_int() ? Value::list() : Value::dict();
    container = slot(container, keys[i], &made);
    if (!container.is_dict() && !container.is_list()) view.invalid(where, "leads through a value that is not a container");
  }
  const Value& last = keys.back();
  if (container.is_dict()) {
    container.mutable_dict().insert_or_assign(dict_key(last), std::move(value));
    return;
  }
  slot(container, last, nullptr);
  container.mutable_list()[static_cast<std::size_t>(last.as_int())] = std::move(value);
}

}  // namespace

bool is_distributed_checkpoint(const std::filesystem::path& folder) {
  std::error_code ignored;
  return std::filesystem::is_directory(folder, ignored) &&
         std::filesystem::is_regular_file(folder / ".metadata", ignored);
}

Value read_distributed_checkpoint_metadata(const std::filesystem::path& metadata_file, const Limits& limits) {
  const OpenFile file = open_regular(metadata_file, ErrorCode::io_open_failed);
  if (file.size > limits.max_pickle_bytes) {
    throw Error(ErrorCode::pickle_too_large, detail::concat("the pickle has ", file.size,
                                                            " bytes, more than max_pickle_bytes ", limits.max_pickle_bytes))
        .with_path(metadata_file.string());
  }
  const auto bytes = read_range(file, metadata_file, 0, file.size);
  NoStorages no_storages;
  try {
    return format::read_pickle(*bytes, no_storages, limits, {}, false).root;
  } catch (Error& error) {
    throw error.with_path(metadata_file.string());
  }
}

Value load_distributed_checkpoint(const std::filesystem::path& folder, const Limits& limits) {
  const std::filesystem::path metadata_file = folder / ".metadata";
  const Value metadata = read_distributed_checkpoint_metadata(metadata_file, limits);
  const MetadataView view(metadata_file);
  const Dict& root = view.record(metadata, "Metadata", "the root");
  const Value& items = view.field(root, "state_dict_metadata", "Metadata");
  if (!items.is_dict()) view.invalid("state_dict_metadata", "is not a dict");
  const Value* storage_data = root.find("storage_data");
  const auto index = index_storage_data(storage_data ? *storage_data : Value::dict(), view);
  const Value* planner_data = root.find("planner_data");
  if (planner_data && !planner_data->is_none() && !planner_data->is_dict()) {
    view.invalid("planner_data", "is not a dict of paths");
  }
  const bool nested = planner_data && planner_data->is_dict();
  ItemReader reader(folder, index, limits);
  Value state = Value::dict();
  for (const auto& [key, item] : items.as_dict()) {
    if (!key.is_string()) view.invalid("state_dict_metadata", "has a key that is not a str");
    const std::string& fqn = key.as_string();
    const std::string cls = view.record_class(item);
    Value value;
    if (cls == std::string(kMetadataModule) + "TensorStorageMetadata") {
      value = load_tensor(fqn, item.as_dict(), reader, view, limits);
    } else if (cls == std::string(kMetadataModule) + "BytesStorageMetadata") {
      value = reader.read(fqn, std::nullopt);
    } else {
      view.invalid("state_dict_metadata['" + fqn + "']", "is neither a TensorStorageMetadata nor a BytesStorageMetadata record");
    }
    if (!nested) {
      state.mutable_dict().insert_or_assign(fqn, std::move(value));
      continue;
    }
    const Value* path = planner_data->as_dict().find(fqn);
    if (!path) view.invalid("planner_data", "has no path for '" + fqn + "'");
    place_value(state, *path, std::move(value), fqn, view);
  }
  return state;
}

}  // namespace holdpoint
