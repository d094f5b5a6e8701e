// holdpoint diff: two checkpoints compared tree by tree and tensor by tensor,
// reading the tensors' bytes from the files in bounded chunks after both files
// were verified by scan_checkpoint (holdpoint/verify/checkpoint_diff.h).
#include "holdpoint/verify/checkpoint_diff.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "base/checked_arithmetic.h"
#include "base/crc32.h"
#include "base/fail.h"
#include "base/file_descriptor.h"
#include "format/value/half_float.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/schema/manifest.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

// ---- renderings ------------------------------------------------------------------

std::string number_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[40];
  const auto result = std::to_chars(text, text + sizeof text, value);
  std::string out(text, result.ptr);
  // As Python writes a float: 3.0, not 3.
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

std::string tensor_text(const TensorData& tensor) {
  return concat(dtype_name(tensor.dtype), ' ', shape_text(tensor.sizes));
}

std::string value_text(const Value& value) {
  switch (value.kind()) {
    case ValueKind::none: return "None";
    case ValueKind::boolean: return value.as_bool() ? "True" : "False";
    case ValueKind::integer: return std::to_string(value.as_int());
    case ValueKind::big_integer: return big_integer_decimal(value.as_big_integer());
    case ValueKind::floating: return number_text(value.as_double());
    case ValueKind::string: {
      const std::string& s = value.as_string();
      return "'" + (s.size() > 80 ? s.substr(0, 77) + "..." : s) + "'";
    }
    case ValueKind::bytes: return concat("bytes(", value.as_bytes().size(), ")");
    case ValueKind::list: return concat("list(", value.as_list().size(), ")");
    case ValueKind::tuple: return concat("tuple(", value.as_list().size(), ")");
    case ValueKind::dict: return concat("dict(", value.as_dict().size(), ")");
    case ValueKind::ordered_dict: return concat("OrderedDict(", value.as_dict().size(), ")");
    case ValueKind::tensor: return tensor_text(value.as_tensor());
  }
  return {};
}

// Containers of one family compare their contents even when the exact kind
// differs (dict vs OrderedDict, list vs tuple); the kind change is reported.
int kind_family(ValueKind kind) {
  switch (kind) {
    case ValueKind::dict:
    case ValueKind::ordered_dict: return 1;
    case ValueKind::list:
    case ValueKind::tuple: return 2;
    default: return 0;
  }
}

std::string join_path(const std::string& path, const std::string& key) { return path.empty() ? key : path + "/" + key; }

std::vector<std::int64_t> index_of(std::uint64_t linear, const Dims& sizes) {
  std::vector<std::int64_t> index(sizes.size(), 0);
  for (std::size_t d = sizes.size(); d-- > 0;) {
    const auto size = static_cast<std::uint64_t>(sizes[d]);
    if (size == 0) break;
    index[d] = static_cast<std::int64_t>(linear % size);
    linear /= size;
  }
  return index;
}

// ---- files -------------------------------------------------------------------------

bool same_time(const struct stat& a, const struct stat& b) {
  return a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// A file opened before it is scanned, so that the bytes read later are those
// of the file that was scanned: after the scan the path must still name it,
// and at the end it must still have the size and modification time it had.
class OpenedFile {
 public:
  explicit OpenedFile(std::filesystem::path path)
      : path_(std::move(path)), fd_(::open(path_.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) fail(ErrorCode::io_open_failed, "cannot open: ", std::strerror(errno));
    if (::fstat(fd_.get(), &opened_) != 0) fail(ErrorCode::io_open_failed, "cannot stat: ", std::strerror(errno));
  }

  const std::filesystem::path& path() const noexcept { return path_; }

  // After the scan, which opened the path again.
  void check_scanned(const LoadedMapping& mapping) const {
    struct stat now {};
    if (::stat(path_.c_str(), &now) != 0 || now.st_dev != opened_.st_dev || now.st_ino != opened_.st_ino) {
      fail(ErrorCode::file_changed_during_read, "the path names another file than the one opened before the scan");
    }
    check_unchanged(mapping.file_bytes);
  }

  void check_unchanged(std::uint64_t scanned_bytes) const {
    struct stat now {};
    if (::fstat(fd_.get(), &now) != 0) fail(ErrorCode::io_read_failed, "cannot stat: ", std::strerror(errno));
    if (static_cast<std::uint64_t>(now.st_size) != scanned_bytes || !same_time(now, opened_)) {
      fail(ErrorCode::file_changed_during_read, "the file was ", scanned_bytes, " bytes when scanned and is now ",
           now.st_size, " bytes", same_time(now, opened_) ? "" : ", modified since it was opened");
    }
  }

  void read(std::uint64_t offset, std::byte* out, std::size_t size) const {
    while (size > 0) {
      const ssize_t got = ::pread(fd_.get(), out, size, static_cast<off_t>(offset));
      if (got < 0) {
        if (errno == EINTR) continue;
        fail(ErrorCode::io_read_failed, "read at offset ", offset, ": ", std::strerror(errno));
      }
      if (got == 0) fail(ErrorCode::file_changed_during_read, "the file ends at ", offset, ", before bytes it held when scanned");
      out += got;
      offset += static_cast<std::uint64_t>(got);
      size -= static_cast<std::size_t>(got);
    }
  }

 private:
  std::filesystem::path path_;
  io::FileDescriptor fd_;
  struct stat opened_ {};
};

// One side of a comparison: the file, its verified tree and where its
// storages lie.
struct ScannedFile {
  std::unique_ptr<OpenedFile> file;
  LoadedMapping mapping;
  std::unordered_map<const void*, StorageLocation> locations;
};

ScannedFile scan_side(const std::filesystem::path& path, const LoadOptions& given,
                      const std::optional<Sha256Digest>& expected) {
  try {
    ScannedFile side;
    side.file = std::make_unique<OpenedFile>(path);
    LoadOptions options = given;
    options.expected_sha256 = expected;
    side.mapping = scan_checkpoint(path, options, ScanKeeps::tree);
    side.file->check_scanned(side.mapping);
    if (is_sharded_manifest(side.mapping)) {
      // A step manifest is small; reading its manifest may need tensor bytes
      // (floats of a torch 1.13-compatible file are 0-d tensors).
      options.expected_sha256 = side.mapping.sha256;
      side.mapping = load_checkpoint_mapping(path, options);
      side.file->check_scanned(side.mapping);
    }
    for (const StorageLocation& location : side.mapping.storage_locations) {
      side.locations.emplace(location.identity, location);
    }
    return side;
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

// The bytes of one storage, from memory (legacy streams, step manifests) or
// from the file.
class StorageBytes {
 public:
  StorageBytes(const ScannedFile& side, const Storage& storage) : side_(side), storage_(storage) {
    if (storage.has_bytes()) return;
    const auto found = side.locations.find(storage.identity());
    if (found == side.locations.end()) {
      fail(ErrorCode::invalid_argument, "a tensor's storage has neither bytes nor a location in the file");
    }
    location_ = &found->second;
  }

  std::uint64_t size() const noexcept { return storage_.nbytes(); }

  void read(std::uint64_t offset, std::byte* out, std::size_t size) {
    if (offset > storage_.nbytes() || size > storage_.nbytes() - offset) {
      fail(ErrorCode::tensor_out_of_bounds, "bytes ", offset, "..", offset + size, " of a storage of ",
           storage_.nbytes());
    }
    if (!location_) {
      std::memcpy(out, storage_.data() + offset, size);
      return;
    }
    side_.file->read(location_->offset + offset, out, size);
    // A record read whole, in order, is checked against its CRC-32: the bytes
    // compared are the bytes the scan verified.
    if (location_->crc32 && offset == crc_next_) {
      crc_ = io::crc32_update(crc_, out, size);
      crc_next_ += size;
      if (crc_next_ == storage_.nbytes() && crc_ != *location_->crc32) {
        fail(ErrorCode::file_changed_during_read, "the record at offset ", location_->offset,
             " no longer has the CRC-32 it had when the file was scanned");
      }
    }
  }

 private:
  const ScannedFile& side_;
  const Storage& storage_;
  const StorageLocation* location_ = nullptr;
  std::uint32_t crc_ = 0;
  std::uint64_t crc_next_ = 0;
};

// Copies a tensor's elements in C order, `count` at a time, reading its
// storage in order when the view is contiguous, and otherwise from a copy of
// the whole storage (up to DiffOptions::whole_storage_bytes) or through a
// window.
class ViewReader {
 public:
  ViewReader(const ScannedFile& side, const TensorData& tensor, std::size_t unit, std::size_t whole_storage_bytes)
      : tensor_(tensor), bytes_(side, *tensor.storage), unit_(unit) {
    if (dtype_is_sub_byte(tensor.dtype)) {
      const std::uint64_t bits = static_cast<std::uint64_t>(tensor.storage_offset) * dtype_bits(tensor.dtype);
      if (!tensor.is_contiguous() || bits % 8 != 0) {
        fail(ErrorCode::tensor_geometry_invalid, "a ", dtype_name(tensor.dtype),
             " tensor must be contiguous and start on a byte boundary to be compared");
      }
      contiguous_start_ = bits / 8;
      contiguous_ = true;
    } else if (tensor.is_contiguous()) {
      contiguous_ = true;
      contiguous_start_ = static_cast<std::uint64_t>(tensor.storage_offset) * unit_;
    } else if (bytes_.size() <= whole_storage_bytes) {
      window_.resize(bytes_.size());
      bytes_.read(0, window_.data(), window_.size());
      window_size_ = window_.size();
    } else {
      window_.resize(kWindowBytes);
      window_start_ = bytes_.size();  // nothing held yet
    }
  }

  void gather(std::uint64_t first, std::size_t count, std::byte* out) {
    if (contiguous_) {
      bytes_.read(contiguous_start_ + first * unit_, out, count * unit_);
      return;
    }
    std::vector<std::int64_t> index = index_of(first, tensor_.sizes);
    const std::size_t rank = index.size();
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t element = tensor_.storage_offset;
      for (std::size_t d = 0; d < rank; ++d) element += index[d] * tensor_.strides[d];
      copy_element(static_cast<std::uint64_t>(element) * unit_, out + i * unit_);
      for (std::size_t d = rank; d-- > 0;) {
        if (++index[d] < tensor_.sizes[d]) break;
        index[d] = 0;
      }
    }
  }

 private:
  static constexpr std::size_t kWindowBytes = std::size_t{64} << 10;

  void copy_element(std::uint64_t offset, std::byte* out) {
    if (offset < window_start_ || offset + unit_ > window_start_ + window_size_) {
      window_start_ = offset - std::min<std::uint64_t>(offset, kWindowBytes / 2);
      window_size_ = static_cast<std::size_t>(std::min<std::uint64_t>(window_.size(), bytes_.size() - window_start_));
      bytes_.read(window_start_, window_.data(), window_size_);
    }
    std::memcpy(out, window_.data() + (offset - window_start_), unit_);
  }

  const TensorData& tensor_;
  StorageBytes bytes_;
  std::size_t unit_;
  bool contiguous_ = false;
  std::uint64_t contiguous_start_ = 0;
  std::vector<std::byte> window_;
  std::uint64_t window_start_ = 0;
  std::size_t window_size_ = 0;
};

// ---- element comparison -------------------------------------------------------------

enum class ElementClass : std::uint8_t { floating, complex, signed_integer, unsigned_integer, bitwise };

ElementClass element_class(DType dtype) {
  switch (dtype) {
    case DType::float64:
    case DType::float32:
    case DType::float16:
    case DType::bfloat16: return ElementClass::floating;
    case DType::complex32:
    case DType::complex64:
    case DType::complex128: return ElementClass::complex;
    case DType::int64:
    case DType::int32:
    case DType::int16:
    case DType::int8: return ElementClass::signed_integer;
    case DType::uint8:
    case DType::uint16:
    case DType::uint32:
    case DType::uint64:
    case DType::boolean: return ElementClass::unsigned_integer;
    default: return ElementClass::bitwise;
  }
}

template <typename T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

// One real number of a floating dtype (or one part of a complex one).
double load_real(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::float64:
    case DType::complex128: return load<double>(p);
    case DType::float32:
    case DType::complex64: return load<float>(p);
    case DType::float16:
    case DType::complex32: return value::half_to_double(load<std::uint16_t>(p));
    case DType::bfloat16: return value::bfloat16_to_double(load<std::uint16_t>(p));
    default: return 0;
  }
}

std::int64_t load_signed(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::int64: return load<std::int64_t>(p);
    case DType::int32: return load<std::int32_t>(p);
    case DType::int16: return load<std::int16_t>(p);
    default: return load<std::int8_t>(p);
  }
}

std::uint64_t load_unsigned(DType dtype, const std::byte* p) {
  switch (dtype) {
    case DType::uint64: return load<std::uint64_t>(p);
    case DType::uint32: return load<std::uint32_t>(p);
    case DType::uint16: return load<std::uint16_t>(p);
    default: return load<std::uint8_t>(p);
  }
}

// Accumulates a Deviation over elements, chunk by chunk.
class DeviationCounter {
 public:
  DeviationCounter(double atol, double rtol, const Dims* sizes) : atol_(atol), rtol_(rtol), sizes_(sizes) {}

  // A pair of reals.
  void reals(double a, double b, std::uint64_t at) {
    bool unequal_pair = false;
    bool differs = false;
    part(a, b, at, unequal_pair, differs);
    if (unequal_pair) unequal(at, differs);
  }

  // One pair of reals of an element (a complex element has two): notes the
  // deviation and whether the pair is unequal, or beyond tolerance.
  void part(double a, double b, std::uint64_t at, bool& unequal_pair, bool& differs) {
    if (a == b) return;
    const bool a_nan = std::isnan(a);
    const bool b_nan = std::isnan(b);
    if (a_nan && b_nan) return;
    unequal_pair = true;
    if (a_nan || b_nan) {
      differs = true;
      return;
    }
    const double deviation = std::fabs(a - b);
    if (!(deviation <= atol_ + rtol_ * std::fabs(b))) differs = true;
    if (!max_abs_ || deviation > *max_abs_) {
      max_abs_ = deviation;
      max_abs_at_ = at;
    }
    if (b != 0) {
      const double relative = deviation / std::fabs(b);
      if (!max_rel_ || relative > *max_rel_) max_rel_ = relative;
    }
  }

  void integers(std::int64_t a, std::int64_t b, std::uint64_t at) {
    if (a == b) return;
    const std::uint64_t distance = a > b ? static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b)
                                         : static_cast<std::uint64_t>(b) - static_cast<std::uint64_t>(a);
    integer_distance(static_cast<double>(distance), b == 0 ? 0.0 : std::fabs(static_cast<double>(b)), at);
  }

  void integers(std::uint64_t a, std::uint64_t b, std::uint64_t at) {
    if (a == b) return;
    integer_distance(static_cast<double>(a > b ? a - b : b - a), static_cast<double>(b), at);
  }

  void bitwise(bool equal, std::uint64_t at) {
    if (!equal) unequal(at, true);
  }

  // The pair at `at` is unequal: beyond tolerance or not.
  void unequal(std::uint64_t at, bool differs) {
    if (deviation_.unequal++ == 0) first_unequal_ = at;
    if (differs && deviation_.differing++ == 0) first_differing_ = at;
  }

  void add_numel(std::uint64_t count) { deviation_.numel += count; }

  Deviation finish() {
    Deviation out = deviation_;
    out.max_abs_deviation = max_abs_;
    out.max_rel_deviation = max_rel_;
    if (sizes_) {
      if (max_abs_) out.max_abs_index = index_of(max_abs_at_, *sizes_);
      if (out.unequal > 0) out.first_index = index_of(out.differing > 0 ? first_differing_ : first_unequal_, *sizes_);
    }
    return out;
  }

 private:
  void integer_distance(double distance, double magnitude, std::uint64_t at) {
    if (!max_abs_ || distance > *max_abs_) {
      max_abs_ = distance;
      max_abs_at_ = at;
    }
    if (magnitude != 0 && (!max_rel_ || distance / magnitude > *max_rel_)) max_rel_ = distance / magnitude;
    unequal(at, true);
  }

  double atol_;
  double rtol_;
  const Dims* sizes_;
  Deviation deviation_;
  std::optional<double> max_abs_;
  std::optional<double> max_rel_;
  std::uint64_t max_abs_at_ = 0;
  std::uint64_t first_unequal_ = 0;
  std::uint64_t first_differing_ = 0;
};

// Compares `count` elements (units) of two chunks; `first` is the linear
// index of the first one.
void compare_chunk(DType dtype, std::size_t unit, const std::byte* a, const std::byte* b, std::size_t count,
                   std::uint64_t first, DeviationCounter& counter) {
  counter.add_numel(count);
  // Whole equal stretches cost one memcmp: most tensors compared are equal.
  if (std::memcmp(a, b, count * unit) == 0) return;
  switch (element_class(dtype)) {
    case ElementClass::floating:
      for (std::size_t i = 0; i < count; ++i) {
        counter.reals(load_real(dtype, a + i * unit), load_real(dtype, b + i * unit), first + i);
      }
      return;
    case ElementClass::complex: {
      // One element differs when either part is beyond tolerance; deviations
      // are over the parts.
      const std::size_t half = unit / 2;
      for (std::size_t i = 0; i < count; ++i) {
        const std::byte* pa = a + i * unit;
        const std::byte* pb = b + i * unit;
        bool unequal_pair = false;
        bool differs = false;
        counter.part(load_real(dtype, pa), load_real(dtype, pb), first + i, unequal_pair, differs);
        counter.part(load_real(dtype, pa + half), load_real(dtype, pb + half), first + i, unequal_pair, differs);
        if (unequal_pair) counter.unequal(first + i, differs);
      }
      return;
    }
    case ElementClass::signed_integer:
      for (std::size_t i = 0; i < count; ++i) {
        counter.integers(load_signed(dtype, a + i * unit), load_signed(dtype, b + i * unit), first + i);
      }
      return;
    case ElementClass::unsigned_integer:
      for (std::size_t i = 0; i < count; ++i) {
        counter.integers(load_unsigned(dtype, a + i * unit), load_unsigned(dtype, b + i * unit), first + i);
      }
      return;
    case ElementClass::bitwise:
      for (std::size_t i = 0; i < count; ++i) {
        counter.bitwise(std::memcmp(a + i * unit, b + i * unit, unit) == 0, first + i);
      }
      return;
  }
}

// The one element of a 1-element tensor, as text.
std::string element_text(DType dtype, const std::byte* p) {
  switch (element_class(dtype)) {
    case ElementClass::floating: return number_text(load_real(dtype, p));
    case ElementClass::complex: {
      const std::size_t half = dtype_itemsize(dtype) / 2;
      return concat("(", number_text(load_real(dtype, p)), "+", number_text(load_real(dtype, p + half)), "j)");
    }
    case ElementClass::signed_integer: return std::to_string(load_signed(dtype, p));
    case ElementClass::unsigned_integer:
      if (dtype == DType::boolean) return load_unsigned(dtype, p) ? "True" : "False";
      return std::to_string(load_unsigned(dtype, p));
    case ElementClass::bitwise: {
      static constexpr char kHex[] = "0123456789abcdef";
      std::string out = "0x";
      for (std::size_t i = dtype_itemsize(dtype); i-- > 0;) {
        const auto byte = static_cast<unsigned>(p[i]);
        out += kHex[byte >> 4];
        out += kHex[byte & 15];
      }
      return out;
    }
  }
  return {};
}

// ---- the tree walk -------------------------------------------------------------------

struct Where {
  std::string section;
  std::optional<ConfigFieldClass> config_field;
};

// A pair of tensors of equal dtype and shape, compared after the walk (when
// the total of bytes to read is known).
struct TensorPair {
  std::string path;
  Where where;
  std::shared_ptr<const TensorData> a;
  std::shared_ptr<const TensorData> b;
};

using WalkItem = std::variant<DiffEntry, TensorPair>;

const std::vector<std::string_view>& component_sections() {
  static const std::vector<std::string_view> names = {"model",   "optimizer", "scheduler",  "scaler", "rng",
                                                      "sampler", "progress",  "early_stop", "history"};
  return names;
}

class TreeWalk {
 public:
  TreeWalk(const Value& a, const Value& b, double atol, double rtol, std::string prefix)
      : atol_(atol), rtol_(rtol), prefix_(std::move(prefix)) {
    has_manifest_ = find_manifest_entry(a) != nullptr || find_manifest_entry(b) != nullptr;
    for (const Value* root : {&a, &b}) {
      const Value* manifest = find_manifest_entry(*root);
      if (!manifest || !manifest->is_dict()) continue;
      const Value* components = manifest->as_dict().find(std::string_view("components"));
      if (!components || !components->is_dict()) continue;
      for (const auto& [key, value] : components->as_dict()) {
        if (key.is_string()) manifest_components_.push_back(key.as_string());
      }
    }
  }

  std::vector<WalkItem> run(const Value& a, const Value& b) {
    compare(a, b, "", Where{a.is_dict() || b.is_dict() ? "manifest" : "other", std::nullopt}, 0);
    return std::move(items_);
  }

 private:
  std::string key_text(const DictKey& key) const { return key.is_string() ? key.as_string() : std::to_string(key.as_int()); }

  // Where a child of `where` at `depth` (the child's depth) lies.
  Where child_where(const Where& where, const std::string& path, const std::string& key, const Value& child,
                    int depth) const {
    if (depth == 1) {
      if (key == kManifestKey) return {"manifest", std::nullopt};
      for (std::string_view name : component_sections()) {
        if (key == name) return {key, std::nullopt};
      }
      for (const std::string& name : manifest_components_) {
        if (key == name) return {key, std::nullopt};
      }
      if (!has_manifest_ && child.is_tensor()) return {"model", std::nullopt};
      return {"other", std::nullopt};
    }
    const std::string manifest(kManifestKey);
    if (depth == 2 && path == manifest && key == "config") return {"config", std::nullopt};
    if (depth == 3 && path == manifest + "/config") {
      if (key == "load_bearing") return {"config", ConfigFieldClass::load_bearing};
      if (key == "operational") return {"config", ConfigFieldClass::operational};
    }
    return where;
  }

  std::string full(const std::string& path) const {
    if (prefix_.empty()) return path;
    return path.empty() ? prefix_ : prefix_ + "/" + path;
  }

  DiffEntry entry(const std::string& path, const Where& where, DiffChange change, std::string a, std::string b) {
    DiffEntry e;
    e.path = full(path);
    e.section = where.section;
    e.config_field = where.config_field;
    e.change = change;
    e.a = std::move(a);
    e.b = std::move(b);
    return e;
  }

  void add(DiffEntry e) { items_.emplace_back(std::move(e)); }

  void compare(const Value& a, const Value& b, const std::string& path, const Where& where, int depth) {
    if (a.kind() != b.kind()) {
      add(entry(path, where, DiffChange::type_changed, value_text(a), value_text(b)));
      if (kind_family(a.kind()) == 0 || kind_family(a.kind()) != kind_family(b.kind())) return;
    }
    switch (a.kind()) {
      case ValueKind::dict:
      case ValueKind::ordered_dict: compare_dicts(a.as_dict(), b.as_dict(), path, where, depth); return;
      case ValueKind::list:
      case ValueKind::tuple: compare_lists(a.as_list(), b.as_list(), path, where, depth); return;
      case ValueKind::tensor: compare_tensors(a, b, path, where); return;
      case ValueKind::floating: {
        const double x = a.as_double(), y = b.as_double();
        if (std::memcmp(&x, &y, sizeof x) == 0) return;
        DeviationCounter counter(atol_, rtol_, nullptr);
        counter.add_numel(1);
        counter.reals(x, y, 0);
        const Deviation deviation = counter.finish();
        if (deviation.unequal == 0) return;  // -0.0 against 0.0, or NaN payloads
        DiffEntry e = entry(path, where, DiffChange::value_changed, value_text(a), value_text(b));
        e.within_tolerance = deviation.differing == 0;
        e.deviation = deviation;
        add(std::move(e));
        return;
      }
      case ValueKind::integer: {
        if (a.as_int() == b.as_int()) return;
        DeviationCounter counter(atol_, rtol_, nullptr);
        counter.add_numel(1);
        counter.integers(a.as_int(), b.as_int(), 0);
        DiffEntry e = entry(path, where, DiffChange::value_changed, value_text(a), value_text(b));
        e.deviation = counter.finish();
        add(std::move(e));
        return;
      }
      case ValueKind::bytes: {
        const std::string_view x = a.as_bytes(), y = b.as_bytes();
        if (x == y) return;
        DiffEntry e = entry(path, where, DiffChange::value_changed, value_text(a), value_text(b));
        if (x.size() == y.size()) {
          std::size_t differing = 0;
          std::size_t first = x.size();
          for (std::size_t i = 0; i < x.size(); ++i) {
            if (x[i] != y[i] && differing++ == 0) first = i;
          }
          e.detail = concat(differing, " of ", x.size(), " bytes differ, the first at offset ", first);
        } else {
          e.detail = concat(x.size(), " -> ", y.size(), " bytes");
        }
        add(std::move(e));
        return;
      }
      case ValueKind::none: return;
      case ValueKind::boolean:
        if (a.as_bool() != b.as_bool()) add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        return;
      case ValueKind::big_integer:
        if (a.as_big_integer() != b.as_big_integer()) {
          add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        }
        return;
      case ValueKind::string:
        if (a.as_string() != b.as_string()) {
          add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        }
        return;
    }
  }

  void compare_dicts(const Dict& a, const Dict& b, const std::string& path, const Where& where, int depth) {
    for (const auto& [key, value] : a) {
      const std::string name = key_text(key);
      const std::string child = join_path(path, name);
      const Value* other = b.find(key);
      const Where child_at = child_where(where, path, name, value, depth + 1);
      if (other) {
        compare(value, *other, child, child_at, depth + 1);
      } else {
        add(entry(child, child_at, DiffChange::removed, value_text(value), ""));
      }
    }
    for (const auto& [key, value] : b) {
      if (a.find(key)) continue;
      const std::string name = key_text(key);
      add(entry(join_path(path, name), child_where(where, path, name, value, depth + 1), DiffChange::added, "",
                value_text(value)));
    }
  }

  void compare_lists(const Value::List& a, const Value::List& b, const std::string& path, const Where& where,
                     int depth) {
    const std::size_t common = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string name = std::to_string(i);
      const std::string child = join_path(path, name);
      const Value& present = i < a.size() ? a[i] : b[i];
      const Where child_at = child_where(where, path, name, present, depth + 1);
      if (i < common) {
        compare(a[i], b[i], child, child_at, depth + 1);
      } else if (i < a.size()) {
        add(entry(child, child_at, DiffChange::removed, value_text(a[i]), ""));
      } else {
        add(entry(child, child_at, DiffChange::added, "", value_text(b[i])));
      }
    }
  }

  void compare_tensors(const Value& a, const Value& b, const std::string& path, const Where& where) {
    const TensorData& x = a.as_tensor();
    const TensorData& y = b.as_tensor();
    if (x.requires_grad != y.requires_grad || x.is_parameter != y.is_parameter) {
      DiffEntry e = entry(path, where, DiffChange::attribute_changed, tensor_text(x), tensor_text(y));
      e.detail = concat("requires_grad ", x.requires_grad ? "True" : "False", " -> ", y.requires_grad ? "True" : "False",
                        ", Parameter ", x.is_parameter ? "True" : "False", " -> ", y.is_parameter ? "True" : "False");
      add(std::move(e));
    }
    if (x.dtype != y.dtype) {
      add(entry(path, where, DiffChange::dtype_changed, tensor_text(x), tensor_text(y)));
      return;
    }
    if (!(x.sizes == y.sizes)) {
      add(entry(path, where, DiffChange::shape_changed, tensor_text(x), tensor_text(y)));
      return;
    }
    items_.emplace_back(TensorPair{full(path), where, a.tensor_ptr(), b.tensor_ptr()});
  }

  double atol_;
  double rtol_;
  std::string prefix_;
  bool has_manifest_ = false;
  std::vector<std::string> manifest_components_;
  std::vector<WalkItem> items_;
};

// ---- comparing one file pair -------------------------------------------------------

// Runs `action`, naming `side`'s file in the error it throws.
template <typename F>
auto with_path(const ScannedFile& side, F&& action) -> decltype(action()) {
  try {
    return action();
  } catch (const Error& error) {
    throw error.with_path(side.file->path().string());
  }
}

class PairComparison {
 public:
  PairComparison(const ScannedFile& a, const ScannedFile& b, const DiffOptions& options, CheckpointDiff& out)
      : a_(a), b_(b), options_(options), out_(out) {}

  void run(const Value& root_a, const Value& root_b, const std::string& prefix) {
    std::vector<WalkItem> items = TreeWalk(root_a, root_b, options_.atol, options_.rtol, prefix).run(root_a, root_b);
    std::uint64_t total = 0;
    for (const WalkItem& item : items) {
      if (const auto* pair = std::get_if<TensorPair>(&item)) total += 2 * pair->a->logical_bytes();
    }
    std::uint64_t done = 0;
    if (options_.progress) options_.progress(0, total);
    for (WalkItem& item : items) {
      if (auto* pair = std::get_if<TensorPair>(&item)) {
        try {
          compare_pair(*pair, done, total);
        } catch (const Error& error) {
          throw Error(error.code(), concat(pair->path, ": ", error.detail())).with_path(error.path());
        }
      } else {
        out_.entries.push_back(std::move(std::get<DiffEntry>(item)));
      }
    }
    a_.file->check_unchanged(a_.mapping.file_bytes);
    b_.file->check_unchanged(b_.mapping.file_bytes);
  }

 private:
  std::byte* buffer(std::vector<std::byte>& buffer, std::size_t bytes) {
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }

  void compare_pair(const TensorPair& pair, std::uint64_t& done, std::uint64_t total) {
    const TensorData& x = *pair.a;
    const TensorData& y = *pair.b;
    const bool sub_byte = dtype_is_sub_byte(x.dtype);
    const std::size_t unit = sub_byte ? 1 : x.itemsize();
    const std::uint64_t units = sub_byte ? x.logical_bytes() : static_cast<std::uint64_t>(x.numel());
    DeviationCounter counter(options_.atol, options_.rtol, sub_byte ? nullptr : &x.sizes);
    ++out_.tensors_compared;
    std::string a_value, b_value;
    if (units > 0) {
      ViewReader reader_a = with_path(a_, [&] { return ViewReader(a_, x, unit, options_.whole_storage_bytes); });
      ViewReader reader_b = with_path(b_, [&] { return ViewReader(b_, y, unit, options_.whole_storage_bytes); });
      const std::size_t per_chunk = std::max<std::size_t>(1, kDiffChunkBytes / unit);
      for (std::uint64_t first = 0; first < units; first += per_chunk) {
        const auto count = static_cast<std::size_t>(std::min<std::uint64_t>(per_chunk, units - first));
        std::byte* chunk_a = buffer(buffer_a_, count * unit);
        std::byte* chunk_b = buffer(buffer_b_, count * unit);
        with_path(a_, [&] { reader_a.gather(first, count, chunk_a); });
        with_path(b_, [&] { reader_b.gather(first, count, chunk_b); });
        compare_chunk(x.dtype, unit, chunk_a, chunk_b, count, first, counter);
        if (units == 1 && !sub_byte) {
          a_value = element_text(x.dtype, chunk_a);
          b_value = element_text(y.dtype, chunk_b);
        }
        out_.bytes_compared += 2 * count * unit;
        done += 2 * count * unit;
        if (options_.progress) options_.progress(std::min(done, total), total);
      }
    }
    Deviation deviation = counter.finish();
    if (deviation.unequal == 0) return;
    DiffEntry e;
    e.path = pair.path;
    e.section = pair.where.section;
    e.config_field = pair.where.config_field;
    e.change = DiffChange::value_changed;
    e.a = tensor_text(x) + (a_value.empty() ? "" : " = " + a_value);
    e.b = tensor_text(y) + (b_value.empty() ? "" : " = " + b_value);
    e.within_tolerance = deviation.differing == 0;
    e.deviation = std::move(deviation);
    out_.entries.push_back(std::move(e));
  }

  const ScannedFile& a_;
  const ScannedFile& b_;
  const DiffOptions& options_;
  CheckpointDiff& out_;
  std::vector<std::byte> buffer_a_;
  std::vector<std::byte> buffer_b_;
};

std::filesystem::path shard_path(const std::filesystem::path& manifest, const Sharding& sharding, std::int64_t rank) {
  return manifest.parent_path() / shard_directory_name(sharding.step) / shard_file_name(rank);
}

const ShardRecord* shard_record(const Sharding& sharding, std::int64_t rank) {
  for (const ShardRecord& record : sharding.shards) {
    if (record.rank == rank) return &record;
  }
  return nullptr;
}

Manifest step_manifest(const ScannedFile& side) {
  try {
    Manifest manifest = Manifest::of_root(side.mapping.root);
    if (!manifest.sharding) fail(ErrorCode::schema_field_missing, "the step manifest has no sharding");
    return manifest;
  } catch (const Error& error) {
    throw error.with_path(side.file->path().string());
  }
}

// The shards of two step manifests, rank by rank.
void compare_shards(const ScannedFile& a, const ScannedFile& b, const DiffOptions& options, CheckpointDiff& out) {
  const Manifest manifest_a = step_manifest(a);
  const Manifest manifest_b = step_manifest(b);
  const Sharding& sharding_a = *manifest_a.sharding;
  const Sharding& sharding_b = *manifest_b.sharding;
  const std::int64_t ranks = std::max(sharding_a.world_size, sharding_b.world_size);
  for (std::int64_t rank = 0; rank < ranks; ++rank) {
    const ShardRecord* record_a = shard_record(sharding_a, rank);
    const ShardRecord* record_b = shard_record(sharding_b, rank);
    const std::string prefix = concat("shards/", rank);
    if (!record_a || !record_b) {
      DiffEntry e;
      e.path = prefix;
      e.section = "manifest";
      e.change = record_a ? DiffChange::removed : DiffChange::added;
      const std::string name = shard_directory_name(record_a ? sharding_a.step : sharding_b.step) + "/" +
                               shard_file_name(rank);
      (record_a ? e.a : e.b) = name;
      out.entries.push_back(std::move(e));
      continue;
    }
    const ScannedFile shard_a = scan_side(shard_path(a.file->path(), sharding_a, rank), options.load, record_a->sha256);
    const ScannedFile shard_b = scan_side(shard_path(b.file->path(), sharding_b, rank), options.load, record_b->sha256);
    out.files_compared += 2;
    PairComparison(shard_a, shard_b, options, out).run(shard_a.mapping.root, shard_b.mapping.root, prefix);
  }
}

}  // namespace

std::string_view diff_change_name(DiffChange change) noexcept {
  switch (change) {
    case DiffChange::added: return "added";
    case DiffChange::removed: return "removed";
    case DiffChange::type_changed: return "type changed";
    case DiffChange::dtype_changed: return "dtype changed";
    case DiffChange::shape_changed: return "shape changed";
    case DiffChange::attribute_changed: return "attribute changed";
    case DiffChange::value_changed: return "value changed";
  }
  return "unknown";
}

std::string_view config_field_class_name(ConfigFieldClass field_class) noexcept {
  return field_class == ConfigFieldClass::load_bearing ? "load-bearing" : "operational";
}

std::size_t CheckpointDiff::beyond_tolerance() const noexcept {
  std::size_t count = 0;
  for (const DiffEntry& entry : entries) count += entry.within_tolerance ? 0 : 1;
  return count;
}

bool CheckpointDiff::same() const noexcept { return beyond_tolerance() == 0; }

namespace {

std::string index_text(const std::vector<std::int64_t>& index) { return shape_text(index); }

std::string entry_line(const DiffEntry& e) {
  std::string line = concat(diff_change_name(e.change), ": ", e.path.empty() ? "(root)" : e.path, " (", e.section);
  if (e.config_field) line += concat(", ", config_field_class_name(*e.config_field));
  line += ") ";
  if (e.change == DiffChange::added) {
    line += e.b;
  } else if (e.change == DiffChange::removed) {
    line += e.a;
  } else if (e.a == e.b) {
    line += e.a;
  } else {
    line += e.a + " -> " + e.b;
  }
  if (e.deviation) {
    const Deviation& d = *e.deviation;
    if (d.numel > 1) {
      line += concat(": ", d.differing, " of ", d.numel, " elements differ");
      if (d.unequal != d.differing) line += concat(" (", d.unequal, " unequal)");
      if (!d.first_index.empty()) line += concat(", first at ", index_text(d.first_index));
    }
    if (d.max_abs_deviation) {
      line += concat(d.numel > 1 ? ", " : ": ", "max abs ", number_text(*d.max_abs_deviation));
      if (d.numel > 1 && !d.max_abs_index.empty()) line += " at " + index_text(d.max_abs_index);
    }
    if (d.max_rel_deviation) line += concat(", max rel ", number_text(*d.max_rel_deviation));
  }
  if (!e.detail.empty()) line += "; " + e.detail;
  if (e.within_tolerance) line += " (within tolerance)";
  return line;
}

nlohmann::ordered_json optional_number(const std::optional<double>& value) {
  if (!value) return nullptr;
  if (std::isinf(*value)) return *value > 0 ? "inf" : "-inf";
  return *value;
}

nlohmann::ordered_json side_json(const DiffSide& side) {
  return {{"path", side.path.string()},
          {"bytes", side.bytes},
          {"sha256", side.sha256.hex()},
          {"format", std::string(file_format_name(side.format))}};
}

}  // namespace

std::string CheckpointDiff::text() const {
  std::string out;
  for (const DiffEntry& e : entries) out += entry_line(e) + "\n";
  const std::size_t beyond = beyond_tolerance();
  const std::size_t within = entries.size() - beyond;
  out += concat(same() ? "same" : "different", ": ", a.path.string(), " and ", b.path.string(), ": ");
  if (entries.empty()) {
    out += "no difference";
  } else {
    out += concat(beyond, beyond == 1 ? " difference" : " differences", " beyond tolerance");
    if (within > 0) out += concat(", ", within, " within tolerance");
  }
  out += concat(" (atol ", number_text(atol), ", rtol ", number_text(rtol), "; ", tensors_compared,
                " tensor pairs, ", bytes_compared, " bytes compared in ", files_compared, " files)\n");
  return out;
}

std::string CheckpointDiff::json() const {
  nlohmann::ordered_json out;
  out["a"] = side_json(a);
  out["b"] = side_json(b);
  out["sharded"] = sharded;
  out["atol"] = atol;
  out["rtol"] = rtol;
  out["same"] = same();
  out["summary"] = {{"differences", entries.size()},
                    {"beyond_tolerance", beyond_tolerance()},
                    {"within_tolerance", entries.size() - beyond_tolerance()},
                    {"files_compared", files_compared},
                    {"tensors_compared", tensors_compared},
                    {"bytes_compared", bytes_compared}};
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const DiffEntry& e : entries) {
    nlohmann::ordered_json item;
    item["path"] = e.path;
    item["section"] = e.section;
    item["config_field"] =
        e.config_field ? nlohmann::ordered_json(std::string(config_field_class_name(*e.config_field))) : nullptr;
    item["change"] = std::string(diff_change_name(e.change));
    item["a"] = e.change == DiffChange::added ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.a);
    item["b"] = e.change == DiffChange::removed ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.b);
    item["within_tolerance"] = e.within_tolerance;
    item["detail"] = e.detail;
    if (e.deviation) {
      const Deviation& d = *e.deviation;
      item["deviation"] = {{"numel", d.numel},
                           {"unequal", d.unequal},
                           {"differing", d.differing},
                           {"max_abs_deviation", optional_number(d.max_abs_deviation)},
                           {"max_rel_deviation", optional_number(d.max_rel_deviation)},
                           {"max_abs_index", d.max_abs_index},
                           {"first_index", d.first_index}};
    } else {
      item["deviation"] = nullptr;
    }
    list.push_back(std::move(item));
  }
  out["entries"] = std::move(list);
  return out.dump(2) + "\n";
}

CheckpointDiff diff_checkpoints(const std::filesystem::path& a, const std::filesystem::path& b,
                                const DiffOptions& options) {
  if (!(options.atol >= 0) || !(options.rtol >= 0) || std::isinf(options.atol) || std::isinf(options.rtol)) {
    fail(ErrorCode::invalid_argument, "atol and rtol must be finite and not negative (atol ", options.atol, ", rtol ",
         options.rtol, ")");
  }
  const ScannedFile side_a = scan_side(a, options.load, options.expected_sha256_a);
  const ScannedFile side_b = scan_side(b, options.load, options.expected_sha256_b);
  CheckpointDiff out;
  out.a = {a, side_a.mapping.file_bytes, side_a.mapping.sha256, side_a.mapping.format};
  out.b = {b, side_b.mapping.file_bytes, side_b.mapping.sha256, side_b.mapping.format};
  out.atol = options.atol;
  out.rtol = options.rtol;
  out.files_compared = 2;
  PairComparison(side_a, side_b, options, out).run(side_a.mapping.root, side_b.mapping.root, "");
  if (is_sharded_manifest(side_a.mapping) && is_sharded_manifest(side_b.mapping)) {
    out.sharded = true;
    compare_shards(side_a, side_b, options, out);
  }
  return out;
}

}  // namespace holdpoint
