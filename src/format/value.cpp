#include "holdpoint/value.h"

#include <cstring>
#include <sstream>

#include "common/fail.h"
#include "holdpoint/error.h"

namespace holdpoint {

using detail::fail;

// ---- Storage -----------------------------------------------------------------------

Storage::Storage(const std::byte* data, std::size_t nbytes, std::shared_ptr<const void> owner, const void* identity)
    : data_(data), nbytes_(nbytes), owner_(std::move(owner)), identity_(identity) {}

std::shared_ptr<const Storage> Storage::copy_of(std::span<const std::byte> bytes) {
  auto buffer = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  const std::byte* data = buffer->data();
  return std::make_shared<const Storage>(data, buffer->size(), std::move(buffer));
}

// ---- TensorData --------------------------------------------------------------------

TensorData TensorData::from_bytes(DType dtype, std::vector<std::int64_t> sizes, std::span<const std::byte> bytes) {
  TensorData tensor;
  tensor.dtype = dtype;
  tensor.sizes = std::move(sizes);
  tensor.strides.assign(tensor.sizes.size(), 1);
  std::int64_t stride = 1;
  for (std::size_t i = tensor.sizes.size(); i-- > 0;) {
    tensor.strides[i] = stride;
    stride *= tensor.sizes[i];
  }
  if (static_cast<std::size_t>(tensor.numel()) * dtype_itemsize(dtype) != bytes.size()) {
    fail(ErrorCode::invalid_argument, "TensorData::from_bytes: ", bytes.size(), " bytes for ", tensor.numel(),
         " elements of ", dtype_name(dtype));
  }
  tensor.storage = Storage::copy_of(bytes);
  return tensor;
}

std::int64_t TensorData::numel() const noexcept {
  std::int64_t n = 1;
  for (auto size : sizes) n *= size;
  return n;
}

bool TensorData::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    if (sizes[i] != 1 && strides[i] != expected) return sizes[i] == 0 || numel() == 0;
    expected *= sizes[i];
  }
  return true;
}

void TensorData::copy_contiguous_bytes(std::byte* out) const {
  const std::size_t item = itemsize();
  const std::int64_t count = numel();
  if (count == 0) return;
  const std::byte* base = storage->data() + static_cast<std::size_t>(storage_offset) * item;
  if (is_contiguous()) {
    std::memcpy(out, base, static_cast<std::size_t>(count) * item);
    return;
  }
  // Odometer over the index space; the innermost dimension is copied element by
  // element (strided) or as one run (stride 1).
  const std::size_t rank = sizes.size();
  std::vector<std::int64_t> index(rank, 0);
  const std::int64_t inner = sizes[rank - 1];
  const std::int64_t inner_stride = strides[rank - 1];
  std::int64_t done = 0;
  while (done < count) {
    std::int64_t offset = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) offset += index[d] * strides[d];
    const std::byte* row = base + static_cast<std::size_t>(offset) * item;
    if (inner_stride == 1) {
      std::memcpy(out, row, static_cast<std::size_t>(inner) * item);
      out += static_cast<std::size_t>(inner) * item;
    } else {
      for (std::int64_t j = 0; j < inner; ++j) {
        std::memcpy(out, row + static_cast<std::size_t>(j * inner_stride) * item, item);
        out += item;
      }
    }
    done += inner;
    for (std::size_t d = rank - 1; d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

std::vector<std::byte> TensorData::contiguous_bytes() const {
  std::vector<std::byte> out(logical_bytes());
  copy_contiguous_bytes(out.data());
  return out;
}

// ---- ValueKind, DictKey --------------------------------------------------------------

std::string_view value_kind_name(ValueKind kind) noexcept {
  switch (kind) {
    case ValueKind::none: return "None";
    case ValueKind::boolean: return "bool";
    case ValueKind::integer: return "int";
    case ValueKind::floating: return "float";
    case ValueKind::string: return "str";
    case ValueKind::bytes: return "bytes";
    case ValueKind::list: return "list";
    case ValueKind::tuple: return "tuple";
    case ValueKind::dict: return "dict";
    case ValueKind::ordered_dict: return "OrderedDict";
    case ValueKind::tensor: return "Tensor";
  }
  return "unknown";
}

const std::string& DictKey::as_string() const {
  if (!is_string()) fail(ErrorCode::invalid_argument, "dict key ", to_string(), " is an int, not a str");
  return std::get<std::string>(key_);
}

std::int64_t DictKey::as_int() const {
  if (!is_integer()) fail(ErrorCode::invalid_argument, "dict key ", to_string(), " is a str, not an int");
  return std::get<std::int64_t>(key_);
}

std::string DictKey::to_string() const {
  if (is_string()) return "'" + std::get<std::string>(key_) + "'";
  return std::to_string(std::get<std::int64_t>(key_));
}

// ---- Dict ----------------------------------------------------------------------------

namespace {
constexpr std::size_t kIndexThreshold = 16;
}

void Dict::index_entry(std::size_t i) const {
  const DictKey& key = entries_[i].first;
  if (key.is_string()) {
    string_index_.emplace(key.as_string(), i);
  } else {
    int_index_.emplace(key.as_int(), i);
  }
}

std::size_t* Dict::index_of(const DictKey& key) const {
  if (!indexed_) {
    if (entries_.size() < kIndexThreshold) return nullptr;
    for (std::size_t i = 0; i < entries_.size(); ++i) index_entry(i);
    indexed_ = true;
  }
  if (key.is_string()) {
    auto it = string_index_.find(key.as_string());
    return it == string_index_.end() ? nullptr : &it->second;
  }
  auto it = int_index_.find(key.as_int());
  return it == int_index_.end() ? nullptr : &it->second;
}

const Value* Dict::find(const DictKey& key) const {
  if (entries_.size() < kIndexThreshold && !indexed_) {
    for (const auto& entry : entries_) {
      if (entry.first == key) return &entry.second;
    }
    return nullptr;
  }
  const std::size_t* i = index_of(key);
  return i ? &entries_[*i].second : nullptr;
}

const Value* Dict::find(std::string_view key) const { return find(DictKey(std::string(key))); }

const Value& Dict::at(const DictKey& key) const {
  const Value* value = find(key);
  if (!value) fail(ErrorCode::invalid_argument, "dict has no key ", key.to_string());
  return *value;
}

bool Dict::insert(DictKey key, Value value) {
  if (find(key)) return false;
  entries_.emplace_back(std::move(key), std::move(value));
  if (indexed_) index_entry(entries_.size() - 1);
  return true;
}

void Dict::insert_or_assign(DictKey key, Value value) {
  if (const Value* existing = find(key)) {
    const_cast<Value&>(*existing) = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (indexed_) index_entry(entries_.size() - 1);
}

void Dict::set_metadata(Value metadata) { metadata_ = std::make_shared<const Value>(std::move(metadata)); }

// ---- Value ---------------------------------------------------------------------------

Value Value::boolean(bool v) { return Value(ValueKind::boolean, v); }
Value Value::integer(std::int64_t v) { return Value(ValueKind::integer, v); }
Value Value::floating(double v) { return Value(ValueKind::floating, v); }
Value Value::string(std::string v) {
  return Value(ValueKind::string, std::make_shared<const std::string>(std::move(v)));
}
Value Value::bytes(std::string v) { return Value(ValueKind::bytes, std::make_shared<const std::string>(std::move(v))); }
Value Value::list(List items) { return Value(ValueKind::list, std::make_shared<List>(std::move(items))); }
Value Value::tuple(List items) { return Value(ValueKind::tuple, std::make_shared<List>(std::move(items))); }
Value Value::dict(Dict entries) { return Value(ValueKind::dict, std::make_shared<Dict>(std::move(entries))); }
Value Value::ordered_dict(Dict entries) {
  return Value(ValueKind::ordered_dict, std::make_shared<Dict>(std::move(entries)));
}
Value Value::tensor(TensorData tensor) {
  return Value(ValueKind::tensor, std::make_shared<const TensorData>(std::move(tensor)));
}
Value Value::tensor(std::shared_ptr<const TensorData> tensor) {
  if (!tensor) fail(ErrorCode::invalid_argument, "Value::tensor: null tensor");
  return Value(ValueKind::tensor, std::move(tensor));
}

namespace {
[[noreturn]] void wrong_kind(ValueKind actual, std::string_view wanted) {
  fail(ErrorCode::invalid_argument, "value is a ", value_kind_name(actual), ", not a ", wanted);
}
}  // namespace

bool Value::as_bool() const {
  if (kind_ != ValueKind::boolean) wrong_kind(kind_, "bool");
  return std::get<bool>(node_);
}

std::int64_t Value::as_int() const {
  if (kind_ != ValueKind::integer) wrong_kind(kind_, "int");
  return std::get<std::int64_t>(node_);
}

double Value::as_double() const {
  if (kind_ != ValueKind::floating) wrong_kind(kind_, "float");
  return std::get<double>(node_);
}

double Value::as_number() const {
  switch (kind_) {
    case ValueKind::floating: return std::get<double>(node_);
    case ValueKind::integer: return static_cast<double>(std::get<std::int64_t>(node_));
    case ValueKind::tensor: {
      const TensorData& t = as_tensor();
      if (t.dtype == DType::float64 && t.sizes.empty()) {
        double v;
        std::memcpy(&v, t.storage->data() + t.storage_offset * 8, sizeof v);
        return v;
      }
      break;
    }
    default: break;
  }
  wrong_kind(kind_, "number (float, int or 0-d float64 tensor)");
}

const std::string& Value::as_string() const {
  if (kind_ != ValueKind::string) wrong_kind(kind_, "str");
  return *std::get<std::shared_ptr<const std::string>>(node_);
}

std::string_view Value::as_bytes() const {
  if (kind_ != ValueKind::bytes) wrong_kind(kind_, "bytes");
  return *std::get<std::shared_ptr<const std::string>>(node_);
}

const Value::List& Value::as_list() const {
  if (!is_sequence()) wrong_kind(kind_, "list or tuple");
  return *std::get<std::shared_ptr<List>>(node_);
}

const Dict& Value::as_dict() const {
  if (!is_dict()) wrong_kind(kind_, "dict");
  return *std::get<std::shared_ptr<Dict>>(node_);
}

const TensorData& Value::as_tensor() const { return *tensor_ptr(); }

const std::shared_ptr<const TensorData>& Value::tensor_ptr() const {
  if (kind_ != ValueKind::tensor) wrong_kind(kind_, "Tensor");
  return std::get<std::shared_ptr<const TensorData>>(node_);
}

Value::List& Value::mutable_list() {
  if (!is_sequence()) wrong_kind(kind_, "list or tuple");
  return *std::get<std::shared_ptr<List>>(node_);
}

Dict& Value::mutable_dict() {
  if (!is_dict()) wrong_kind(kind_, "dict");
  return *std::get<std::shared_ptr<Dict>>(node_);
}

const void* Value::node_identity() const noexcept {
  return std::visit(
      [](const auto& node) -> const void* {
        using T = std::decay_t<decltype(node)>;
        if constexpr (std::is_same_v<T, std::monostate> || std::is_same_v<T, bool> ||
                      std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>) {
          return nullptr;
        } else {
          return node.get();
        }
      },
      node_);
}

// ---- comparison ----------------------------------------------------------------------

namespace {

std::string sizes_text(const std::vector<std::int64_t>& sizes) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << ']';
  return out.str();
}

// Empty result: equal. Otherwise a description of the first difference at `path`.
std::string first_difference(const Value& a, const Value& b, const std::string& path) {
  const std::string where = path.empty() ? "<root>" : path;
  if (a.kind() != b.kind()) {
    return where + ": " + std::string(value_kind_name(a.kind())) + " vs " + std::string(value_kind_name(b.kind()));
  }
  switch (a.kind()) {
    case ValueKind::none: return {};
    case ValueKind::boolean:
      return a.as_bool() == b.as_bool() ? std::string() : where + ": bool differs";
    case ValueKind::integer:
      return a.as_int() == b.as_int()
                 ? std::string()
                 : where + ": " + std::to_string(a.as_int()) + " vs " + std::to_string(b.as_int());
    case ValueKind::floating: {
      const double x = a.as_double(), y = b.as_double();
      return std::memcmp(&x, &y, sizeof x) == 0 ? std::string() : where + ": float differs";
    }
    case ValueKind::string:
      return a.as_string() == b.as_string() ? std::string() : where + ": '" + a.as_string() + "' vs '" + b.as_string() + "'";
    case ValueKind::bytes: return a.as_bytes() == b.as_bytes() ? std::string() : where + ": bytes differ";
    case ValueKind::list:
    case ValueKind::tuple: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) {
        return where + ": length " + std::to_string(x.size()) + " vs " + std::to_string(y.size());
      }
      for (std::size_t i = 0; i < x.size(); ++i) {
        auto d = first_difference(x[i], y[i], path + "[" + std::to_string(i) + "]");
        if (!d.empty()) return d;
      }
      return {};
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.size() != y.size()) {
        return where + ": " + std::to_string(x.size()) + " keys vs " + std::to_string(y.size());
      }
      for (std::size_t i = 0; i < x.size(); ++i) {
        const auto& [kx, vx] = x.at_index(i);
        const auto& [ky, vy] = y.at_index(i);
        if (!(kx == ky)) return where + ": key #" + std::to_string(i) + " " + kx.to_string() + " vs " + ky.to_string();
        auto d = first_difference(vx, vy, path + "[" + kx.to_string() + "]");
        if (!d.empty()) return d;
      }
      return {};
    }
    case ValueKind::tensor: {
      const TensorData& x = a.as_tensor();
      const TensorData& y = b.as_tensor();
      if (x.dtype != y.dtype) {
        return where + ": dtype " + std::string(dtype_name(x.dtype)) + " vs " + std::string(dtype_name(y.dtype));
      }
      if (x.sizes != y.sizes) return where + ": sizes " + sizes_text(x.sizes) + " vs " + sizes_text(y.sizes);
      if (x.requires_grad != y.requires_grad) return where + ": requires_grad differs";
      if (x.contiguous_bytes() != y.contiguous_bytes()) return where + ": tensor elements differ";
      return {};
    }
  }
  return where + ": unknown kind";
}

}  // namespace

bool equal_content(const Value& a, const Value& b) { return first_difference(a, b, "").empty(); }

std::string describe_difference(const Value& a, const Value& b) { return first_difference(a, b, ""); }

}  // namespace holdpoint
