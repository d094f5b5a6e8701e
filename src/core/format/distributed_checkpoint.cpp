// torch.distributed.checkpoint folders: `.metadata` through the restricted
// VM, every item's byte range parsed as an untrusted .pt archive.
#include "holdpoint/format/distributed_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "base/file_descriptor.h"
#include "base/file_stream.h"
#include "base/regular_file.h"
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

// [offset, offset + length) of an open file, in private memory.
std::shared_ptr<std::vector<std::byte>> read_range(const io::RegularFile& file, const std::filesystem::path& path,
                                                   std::uint64_t offset, std::uint64_t length) {
  if (offset > file.size || length > file.size - offset) {
    throw Error(ErrorCode::dcp_range_invalid, detail::concat("bytes [", offset, ", ", offset, " + ", length,
                                                             ") lie outside the file's ", file.size, " bytes"))
        .with_path(path.string());
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(length));
  if (io::pread_fully(file.fd.get(), bytes->data(), bytes->size(), offset) != bytes->size()) {
    throw Error(ErrorCode::file_changed_during_read, "the file shrank while it was read").with_path(path.string());
  }
  return bytes;
}

// The decoded `.metadata` of the folder open at `folder_fd`: a name inside
// the folder, never followed through a symlink.
Value read_metadata_at(int folder_fd, const std::filesystem::path& folder, const Limits& limits) {
  const std::filesystem::path metadata_file = folder / ".metadata";
  const io::RegularFile file = io::open_regular_for_reading_at(folder_fd, ".metadata", metadata_file);
  if (file.size > limits.max_pickle_bytes) {
    throw Error(ErrorCode::pickle_too_large, detail::concat("the pickle has ", file.size,
                                                            " bytes, more than max_pickle_bytes ", limits.max_pickle_bytes))
        .with_path(metadata_file.string());
  }
  const auto bytes = read_range(file, metadata_file, 0, file.size);
  return decode_distributed_checkpoint_metadata(*bytes, metadata_file, limits);
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
    if (!value.is_sequence() && !value.is_size()) {
      invalid(where, "is a " + std::string(value_kind_name(value.kind())) + ", not a tuple of ints");
    }
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

// Reads items for their references. Each (file, offset, length) range is
// read and parsed once and its Value handed to every reference, so tensors
// that name one range share its storage; every reference is still charged
// at the range's full length against max_distributed_checkpoint_bytes, as
// are assembled tensors (charge), since whoever consumes the state dict may
// expand each reference into a copy of its own.
class ItemReader {
 public:
  ItemReader(int folder_fd, std::filesystem::path folder, const std::map<std::string, ItemLocation>& index,
             const Limits& limits)
      : folder_fd_(folder_fd), folder_(std::move(folder)), index_(index), limits_(limits) {}

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
    charge(location.length, "item '" + fqn + "' (" + std::to_string(location.length) + " bytes of " + location.file + ")");
    auto& parsed = parsed_[std::tuple(location.file, location.offset, location.length)];
    if (parsed) return *parsed;
    auto& file = files_[location.file];
    if (!file) {
      file = io::open_regular_for_reading_at(folder_fd_, location.file, path, ErrorCode::dcp_item_missing);
    }
    auto bytes = read_range(*file, path, location.offset, location.length);
    try {
      parsed = parse_checkpoint_bytes(*bytes, bytes, limits_).root;
    } catch (Error& error) {
      throw error.with_path(path.string() + " (item '" + fqn + "' at byte " + std::to_string(location.offset) + ")");
    }
    return *parsed;
  }

  // Counts `bytes` more against Limits::max_distributed_checkpoint_bytes.
  void charge(std::uint64_t bytes, const std::string& what) {
    const auto total = detail::checked_add(charged_, bytes);
    if (!total || *total > limits_.max_distributed_checkpoint_bytes) {
      throw Error(ErrorCode::dcp_expanded_bytes_limit,
                  detail::concat(what, " brings the bytes the folder's items expand to, each reference counted, "
                                       "past Limits::max_distributed_checkpoint_bytes (",
                                 limits_.max_distributed_checkpoint_bytes, "); ", charged_, " were counted before it"))
          .with_path((folder_ / ".metadata").string());
    }
    charged_ = *total;
  }

 private:
  int folder_fd_;
  std::filesystem::path folder_;
  const std::map<std::string, ItemLocation>& index_;
  const Limits& limits_;
  std::map<std::string, std::optional<io::RegularFile>> files_;
  std::map<std::tuple<std::string, std::uint64_t, std::uint64_t>, std::optional<Value>> parsed_;
  std::uint64_t charged_ = 0;
};

DType tensor_dtype(const Dict& properties, const MetadataView& view, const std::string& where) {
  const Value& dtype = view.field(properties, "dtype", where);
  if (!dtype.is_dtype()) view.invalid(where, "dtype is not a torch dtype");
  if (const Value* layout = properties.find("layout"); layout && !(layout->is_layout() && layout->as_layout() == "torch.strided")) {
    throw Error(ErrorCode::dcp_transform_unsupported, where + ": a tensor whose layout is not torch.strided")
        .with_path(view.file().string());
  }
  return dtype.as_dtype();
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

struct ChunkBox {
  std::vector<std::int64_t> offsets, sizes;
};

// The tiling check's bound on corners, 2^(dimensions split) per chunk: 16 Mi
// corners sort in about a second here. Honest tensors are split along one
// to three dimensions, so this admits millions of chunks.
constexpr std::uint64_t kMaxChunkCorners = std::uint64_t{1} << 24;

// Checks that chunks lying inside a tensor of `sizes`, whose element counts
// sum to its numel, tile it: that no two share an element.
//
// Why corners: write 1_B for the indicator function of a half-open box B on
// the integer lattice, and D for the mixed finite difference over every
// dimension, a linear map that sends 1_B to +-1 at each of B's 2^r corners
// (the points whose every coordinate is the box's offset or offset + size)
// and that is injective on functions of finite support (prefix sums undo
// it). Taken mod 2, D(sum of 1_B) is the set of points that are a corner of
// an odd number of chunks. If that set is exactly the tensor's own 2^r
// corners, then sum of 1_B = 1_tensor mod 2: every element is covered an odd
// number of times, so at least once. The counts add up to numel, so every
// element is covered exactly once: a tiling. Conversely a tiling satisfies
// it, since D is linear and D(1_tensor) is the tensor's corners. An empty
// chunk's corners pair up and cancel, as it covers nothing. The check sorts
// n * 2^r corners: O(n log n) in the number of chunks for a given rank, where
// comparing every pair (as before) took 19 s for 40,000 chunks.
//
// Dimensions that every non-empty chunk spans whole are left out (the chunks
// then tile the tensor if and only if their projections tile its
// projection), so that r counts only the dimensions the chunks split.
void check_chunks_tile(const std::vector<std::int64_t>& sizes, const std::vector<ChunkBox>& boxes,
                       std::uint64_t numel, const MetadataView& view, const std::string& where) {
  if (numel == 0) return;  // the counts add up to 0: every chunk is empty
  std::vector<const ChunkBox*> filled;
  for (const ChunkBox& box : boxes) {
    if (std::find(box.sizes.begin(), box.sizes.end(), 0) == box.sizes.end()) filled.push_back(&box);
  }
  std::vector<std::size_t> split;  // the dimensions some chunk does not span whole
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    for (const ChunkBox* box : filled) {
      if (box->offsets[d] != 0 || box->sizes[d] != sizes[d]) {
        split.push_back(d);
        break;
      }
    }
  }
  const std::size_t rank = split.size();
  const std::uint64_t corners_per_chunk = std::uint64_t{1} << std::min<std::size_t>(rank, 63);
  if (rank >= 63 || filled.size() > kMaxChunkCorners / corners_per_chunk) {
    throw Error(ErrorCode::dcp_chunk_corners_limit,
                detail::concat(where, ": ", filled.size(), " chunks split along ", rank, " dimensions have more than ",
                               kMaxChunkCorners, " corners to check"))
        .with_path(view.file().string());
  }
  const std::size_t count = filled.size() * static_cast<std::size_t>(corners_per_chunk);
  std::vector<std::int64_t> corners(count * rank);
  std::size_t at = 0;
  for (const ChunkBox* box : filled) {
    for (std::uint64_t mask = 0; mask < corners_per_chunk; ++mask) {
      for (std::size_t k = 0; k < rank; ++k) {
        const std::size_t d = split[k];
        corners[at++] = box->offsets[d] + ((mask >> k) & 1 ? box->sizes[d] : 0);
      }
    }
  }
  std::vector<std::uint32_t> order(count);
  std::iota(order.begin(), order.end(), 0u);
  const auto corner = [&](std::uint32_t i) { return corners.data() + std::size_t{i} * rank; };
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return std::lexicographical_compare(corner(a), corner(a) + rank, corner(b), corner(b) + rank);
  });
  std::uint64_t odd = 0;
  for (std::size_t i = 0; i < count;) {
    std::size_t j = i + 1;
    while (j < count && std::equal(corner(order[i]), corner(order[i]) + rank, corner(order[j]))) ++j;
    if ((j - i) % 2 == 1) {
      // The tensor's corners are distinct (each split dimension has a size
      // above 0), so 2^r odd corners, each one of them, are all of them.
      for (std::size_t k = 0; k < rank; ++k) {
        const std::int64_t value = corner(order[i])[k];
        if (value != 0 && value != sizes[split[k]]) view.invalid(where, "has chunks that overlap");
      }
      ++odd;
    }
    i = j;
  }
  if (odd != corners_per_chunk) view.invalid(where, "has chunks that overlap");
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
  std::vector<ChunkBox> boxes;
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < chunks.as_list().size(); ++i) {
    const std::string at = where + ".chunks[" + std::to_string(i) + "]";
    const Dict& chunk = view.record(chunks.as_list()[i], "ChunkStorageMetadata", at);
    ChunkBox box{view.ints(view.field(chunk, "offsets", at), at + ".offsets"),
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
    // Each count is at most numel (inside the tensor); a sum past it
    // overflows nothing and already fails the test below.
    covered = std::min(covered + chunk_numel, numel + 1);
    boxes.push_back(std::move(box));
  }
  if (covered != numel) {
    view.invalid(where + ".chunks", (covered > numel ? std::string("cover more than") : "cover " + std::to_string(covered) + " of") +
                                        " the tensor's " + std::to_string(numel) + " elements");
  }
  check_chunks_tile(sizes, boxes, numel, view, where + ".chunks");
  std::vector<Value> parts;
  for (const ChunkBox& box : boxes) {
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
  reader.charge(*nbytes, "assembling '" + fqn + "' (" + std::to_string(*nbytes) + " bytes)");
  std::vector<std::byte> whole(static_cast<std::size_t>(*nbytes));
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::vector<std::byte> chunk = parts[i].as_tensor().contiguous_bytes();
    place_block(whole.data(), sizes, chunk.data(), boxes[i].sizes, boxes[i].offsets, itemsize);
  }
  return Value::tensor(TensorData::from_bytes(dtype, sizes, whole));
}

// DCP's unflatten_state_dict: `path` (str and int keys) leads from the root
// to the value; a container made on the way is a list when the next key is
// an int, a dict otherwise; a list grows with None up to an index. A path
// leads only through containers made here (`made`, the root among them),
// never through an item's value: items that share a byte range share their
// Value (ItemReader), and placing one inside another would make a cycle.
void place_value(Value& root, const Value& path, Value value, const std::string& fqn, const MetadataView& view,
                 std::set<const void*>& made) {
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
  const auto identity = [](const Value& container) -> const void* {
    return container.is_dict() ? static_cast<const void*>(&container.as_dict()) : &container.as_list();
  };
  Value container = root;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    Value fresh = keys[i + 1].is_int() ? Value::list() : Value::dict();
    const void* fresh_identity = identity(fresh);
    container = slot(container, keys[i], &fresh);
    if (!container.is_dict() && !container.is_list()) view.invalid(where, "leads through a value that is not a container");
    if (identity(container) == fresh_identity) made.insert(fresh_identity);
    if (!made.count(identity(container))) view.invalid(where, "leads through the value of another item");
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

Value decode_distributed_checkpoint_metadata(std::span<const std::byte> bytes, const std::filesystem::path& label,
                                             const Limits& limits) {
  if (bytes.size() > limits.max_pickle_bytes) {
    throw Error(ErrorCode::pickle_too_large, detail::concat("the pickle has ", bytes.size(),
                                                            " bytes, more than max_pickle_bytes ", limits.max_pickle_bytes))
        .with_path(label.string());
  }
  NoStorages no_storages;
  try {
    return format::read_pickle(bytes, no_storages, limits, {}, false).root;
  } catch (Error& error) {
    throw error.with_path(label.string());
  }
}

std::vector<DcpItemLocation> distributed_checkpoint_item_locations(const Value& metadata,
                                                                   const std::filesystem::path& label) {
  const MetadataView view(label);
  const Dict& root = view.record(metadata, "Metadata", "the root");
  const Value* storage_data = root.find("storage_data");
  std::vector<DcpItemLocation> out;
  for (auto& [key, location] : index_storage_data(storage_data ? *storage_data : Value::dict(), view)) {
    out.push_back({key.substr(0, key.find('\0')), std::move(location.file), location.offset, location.length});
  }
  return out;
}

bool is_distributed_checkpoint(const std::filesystem::path& folder) {
  // Any entry named .metadata, a symlink or a FIFO too: the folder is then
  // read as the DCP folder it claims to be, and that entry refused by name.
  std::error_code ignored;
  if (!std::filesystem::is_directory(folder, ignored)) return false;
  const auto type = std::filesystem::symlink_status(folder / ".metadata", ignored).type();
  return type != std::filesystem::file_type::not_found && type != std::filesystem::file_type::none;
}

Value read_distributed_checkpoint_metadata(const std::filesystem::path& folder, const Limits& limits) {
  const io::FileDescriptor folder_fd = io::open_directory_for_reading(folder);
  return read_metadata_at(folder_fd.get(), folder, limits);
}

Value load_distributed_checkpoint(const std::filesystem::path& folder, const Limits& limits) {
  // Every name inside is opened relative to this descriptor, so the folder
  // read is the one opened here even if `folder` is renamed meanwhile.
  const io::FileDescriptor folder_fd = io::open_directory_for_reading(folder);
  const std::filesystem::path metadata_file = folder / ".metadata";
  const Value metadata = read_metadata_at(folder_fd.get(), folder, limits);
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
  ItemReader reader(folder_fd.get(), folder, index, limits);
  Value state = Value::dict();
  std::set<const void*> made{&state.as_dict()};
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
    place_value(state, *path, std::move(value), fqn, view, made);
  }
  return state;
}

}  // namespace holdpoint
