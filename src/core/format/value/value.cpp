#include "holdpoint/format/value.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "base/fail.h"
#include "base/keyed_hash.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/snapshot.h"

namespace holdpoint {

using detail::fail;

// ---- Storage -----------------------------------------------------------------------

Storage::Storage(const std::byte* data, std::size_t nbytes, std::shared_ptr<const void> owner, const void* identity)
    : data_(data), nbytes_(nbytes), absent_(0), handed_over_(0), owner_(std::move(owner)), identity_(identity) {
  if (nbytes >= (std::uint64_t{1} << 62)) {
    fail(ErrorCode::invalid_argument, "a storage of ", nbytes, " bytes is larger than any memory can hold");
  }
}

Storage::~Storage() {
  if (handed_over_) io::release_whole_pages(data_, nbytes());
}

std::shared_ptr<const Storage> Storage::copy_of(std::span<const std::byte> bytes) {
  auto buffer = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  const std::byte* data = buffer->data();
  return std::make_shared<const Storage>(data, buffer->size(), std::move(buffer));
}

std::shared_ptr<const Storage> Storage::absent(std::size_t nbytes) {
  std::shared_ptr<Storage> storage(new Storage(nullptr, nbytes, nullptr));
  storage->absent_ = 1;
  return storage;
}

void Storage::throw_absent() const {
  fail(ErrorCode::invalid_argument, "this storage of ", nbytes(),
       " bytes has no bytes: it comes from scan_checkpoint, which checks tensor bytes without keeping them; "
       "read the file with load_checkpoint_mapping to use them");
}

// ---- Dims --------------------------------------------------------------------------

Dims::Dims(Dims&& other) noexcept : Dims() { *this = std::move(other); }

Dims& Dims::operator=(const Dims& other) {
  if (this != &other) assign(other.begin(), other.end());
  return *this;
}

Dims& Dims::operator=(Dims&& other) noexcept {
  if (this == &other) return *this;
  if (!other.on_heap()) {
    // Nothing to steal; copying two inline values cannot allocate, since
    // this object already holds at least as much room.
    std::copy(other.begin(), other.end(), data());
    size_ = other.size_;
    other.size_ = 0;
    return *this;
  }
  if (on_heap()) delete[] heap_;
  heap_ = other.heap_;
  size_ = other.size_;
  capacity_ = other.capacity_;
  other.inline_[0] = other.inline_[1] = 0;
  other.size_ = 0;
  other.capacity_ = kInline;
  return *this;
}

Dims::~Dims() {
  if (on_heap()) delete[] heap_;
}

void Dims::reserve(std::size_t capacity) {
  if (capacity <= capacity_) return;
  if (capacity > std::numeric_limits<std::uint32_t>::max()) {
    fail(ErrorCode::invalid_argument, "a tensor cannot have ", capacity, " dimensions");
  }
  auto* grown = new std::int64_t[capacity];
  std::copy(begin(), end(), grown);
  if (on_heap()) delete[] heap_;
  heap_ = grown;
  capacity_ = static_cast<std::uint32_t>(capacity);
}

void Dims::resize(std::size_t size, std::int64_t value) {
  reserve(size);
  for (std::size_t i = size_; i < size; ++i) data()[i] = value;
  size_ = static_cast<std::uint32_t>(size);
}

void Dims::push_back(std::int64_t value) {
  if (size_ == capacity_) reserve(2 * static_cast<std::size_t>(capacity_));
  data()[size_++] = value;
}

void Dims::assign(std::size_t count, std::int64_t value) {
  clear();
  resize(count, value);
}

// ---- TensorData --------------------------------------------------------------------

TensorData TensorData::from_bytes(DType dtype, Dims sizes, std::span<const std::byte> bytes) {
  TensorData tensor;
  tensor.dtype = dtype;
  tensor.sizes = std::move(sizes);
  tensor.strides.assign(tensor.sizes.size(), 1);
  std::int64_t stride = 1;
  for (std::size_t i = tensor.sizes.size(); i-- > 0;) {
    tensor.strides[i] = stride;
    stride *= tensor.sizes[i];
  }
  if (static_cast<std::size_t>(tensor.numel()) * dtype_bits(dtype) != bytes.size() * 8) {
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
  if (dtype_is_sub_byte(dtype)) {
    const std::size_t first_bit = static_cast<std::size_t>(storage_offset) * dtype_bits(dtype);
    if (!is_contiguous() || first_bit % 8 != 0) {
      fail(ErrorCode::tensor_geometry_invalid, "a ", dtype_name(dtype),
           " view that is strided or starts inside a byte cannot be copied out byte by byte");
    }
    std::memcpy(out, storage->data() + first_bit / 8, logical_bytes());
    return;
  }
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

std::string shape_text(std::span<const std::int64_t> sizes) {
  std::string text = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
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
    case ValueKind::big_integer: return "int";
    case ValueKind::complex_number: return "complex";
    case ValueKind::set: return "set";
    case ValueKind::bytearray: return "bytearray";
    case ValueKind::device: return "torch.device";
    case ValueKind::dtype: return "torch.dtype";
    case ValueKind::size: return "torch.Size";
    case ValueKind::layout: return "torch.layout";
    case ValueKind::meta_tensor: return "meta Tensor";
    case ValueKind::sparse_tensor: return "sparse Tensor";
  }
  return "unknown";
}

std::string big_integer_decimal(std::string_view little_endian) {
  if (little_endian.empty()) return "0";
  const bool negative = (static_cast<unsigned char>(little_endian.back()) & 0x80) != 0;
  // The magnitude, most significant byte first (two's complement negated when negative).
  std::vector<unsigned> magnitude(little_endian.size());
  unsigned carry = 1;
  for (std::size_t i = 0; i < little_endian.size(); ++i) {
    unsigned byte = static_cast<unsigned char>(little_endian[i]);
    if (negative) {
      byte = (~byte & 0xffu) + carry;
      carry = byte >> 8;
      byte &= 0xffu;
    }
    magnitude[little_endian.size() - 1 - i] = byte;
  }
  std::string digits;
  for (bool nonzero = true; nonzero;) {  // divide by 10 until nothing is left
    unsigned remainder = 0;
    nonzero = false;
    for (unsigned& byte : magnitude) {
      const unsigned value = remainder * 256 + byte;
      byte = value / 10;
      remainder = value % 10;
      nonzero = nonzero || byte != 0;
    }
    digits.push_back(static_cast<char>('0' + remainder));
  }
  if (negative) digits.push_back('-');
  return {digits.rbegin(), digits.rend()};
}

struct DictKey::Object {
  Value value;
  std::string canonical;
};

namespace {

void append_canonical_int(std::string& out, std::int64_t value) {
  out += 'I';
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(static_cast<std::uint64_t>(value) >> (8 * i)));
}

void append_canonical_text(std::string& out, char tag, std::string_view text) {
  out += tag;
  append_canonical_int(out, static_cast<std::int64_t>(text.size()));
  out.append(text);
}

// Python's equality classes of keys: bool and integral floats as the int
// they equal (-0.0 as 0), other floats by their bits. The one list of the kinds
// a key may have: false for any other kind (then `out`, when given, holds part
// of a form). With `out` null it only judges, and allocates nothing.
bool canonical_key(const Value& key, std::string* out) {
  switch (key.kind()) {
    case ValueKind::none:
      if (out) *out += 'N';
      return true;
    case ValueKind::boolean:
      if (out) append_canonical_int(*out, key.as_bool() ? 1 : 0);
      return true;
    case ValueKind::integer:
      if (out) append_canonical_int(*out, key.as_int());
      return true;
    case ValueKind::floating: {
      if (!out) return true;
      const double d = key.as_double();
      if (d == std::trunc(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
        append_canonical_int(*out, static_cast<std::int64_t>(d));
        return true;
      }
      *out += 'F';
      const auto bits = std::bit_cast<std::uint64_t>(d);
      for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(bits >> (8 * i)));
      return true;
    }
    case ValueKind::string:
      if (out) append_canonical_text(*out, 'S', key.as_string());
      return true;
    case ValueKind::bytes:
      if (out) append_canonical_text(*out, 'B', key.as_bytes());
      return true;
    case ValueKind::tuple:
      if (out) {
        *out += 'T';
        append_canonical_int(*out, static_cast<std::int64_t>(key.as_list().size()));
      }
      return std::all_of(key.as_list().begin(), key.as_list().end(),
                         [out](const Value& item) { return canonical_key(item, out); });
    default: return false;
  }
}

// Python's repr of a key, for messages (bounded by printable() where it names file data).
void append_key_text(std::string& out, const Value& key) {
  switch (key.kind()) {
    case ValueKind::none: out += "None"; return;
    case ValueKind::boolean: out += key.as_bool() ? "True" : "False"; return;
    case ValueKind::integer: out += std::to_string(key.as_int()); return;
    case ValueKind::floating: {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", key.as_double());
      out += text;
      return;
    }
    case ValueKind::string: out += "'" + key.as_string() + "'"; return;
    case ValueKind::bytes: {
      out += "b'";
      for (const char c : key.as_bytes()) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte >= 0x20 && byte < 0x7f && byte != '\\' && byte != '\'') {
          out.push_back(c);
        } else {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\x%02x", byte);
          out += escaped;
        }
      }
      out += "'";
      return;
    }
    case ValueKind::tuple: {
      out += "(";
      const auto& items = key.as_list();
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        append_key_text(out, items[i]);
      }
      out += items.size() == 1 ? ",)" : ")";
      return;
    }
    default: out += value_kind_name(key.kind()); return;
  }
}

}  // namespace

bool valid_dict_key(const Value& key) noexcept { return canonical_key(key, nullptr); }

DictKey::DictKey(const Value& key) {
  if (key.is_string()) {
    key_ = key.as_string();
  } else if (key.is_int()) {
    key_ = key.as_int();
  } else {
    std::string canonical;
    if (!canonical_key(key, &canonical)) {
      fail(ErrorCode::invalid_argument, "a ", value_kind_name(key.kind()),
           " cannot be a dict key (keys are str, int, None, bool, float, bytes or tuples of them)");
    }
    key_ = std::make_shared<const Object>(Object{key, std::move(canonical)});
  }
}

const std::string& DictKey::as_string() const {
  if (!is_string()) fail(ErrorCode::invalid_argument, "dict key ", to_string(), " is not a str");
  return std::get<std::string>(key_);
}

std::int64_t DictKey::as_int() const {
  if (!is_integer()) fail(ErrorCode::invalid_argument, "dict key ", to_string(), " is not an int");
  return std::get<std::int64_t>(key_);
}

Value DictKey::value() const {
  if (is_string()) return Value::string(std::get<std::string>(key_));
  if (is_integer()) return Value::integer(std::get<std::int64_t>(key_));
  return std::get<std::shared_ptr<const Object>>(key_)->value;
}

std::string DictKey::canonical() const {
  if (is_object()) return std::get<std::shared_ptr<const Object>>(key_)->canonical;
  std::string out;
  if (is_string()) {
    append_canonical_text(out, 'S', std::get<std::string>(key_));
  } else {
    append_canonical_int(out, std::get<std::int64_t>(key_));
  }
  return out;
}

bool DictKey::operator==(const DictKey& other) const {
  if (!is_object() && !other.is_object()) return key_ == other.key_;
  if (is_string() || other.is_string()) return false;  // an object key is never a str
  return canonical() == other.canonical();
}

std::string DictKey::to_string() const {
  if (is_string()) return "'" + std::get<std::string>(key_) + "'";
  if (is_integer()) return std::to_string(std::get<std::int64_t>(key_));
  std::string out;
  append_key_text(out, std::get<std::shared_ptr<const Object>>(key_)->value);
  return out;
}

// ---- Dict ----------------------------------------------------------------------------

namespace {

// Below this many entries a linear scan beats hashing.
constexpr std::size_t kIndexThreshold = 16;

// Keyed (base/keyed_hash.h): a file cannot pick keys that share a slot.
std::uint64_t key_hash(std::string_view key) { return detail::keyed_hash(key); }
std::uint64_t key_hash(std::int64_t key) {
  return detail::siphash24(detail::process_sip_key(), &key, sizeof key);
}
std::uint64_t key_hash(const DictKey& key) {
  if (key.is_string()) return key_hash(std::string_view(key.as_string()));
  if (key.is_integer()) return key_hash(key.as_int());
  // An object key equal to an int (True, 2.0) hashes as that int.
  const std::string canonical = key.canonical();
  if (canonical.size() == 9 && canonical[0] == 'I') {
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits |= std::uint64_t{static_cast<unsigned char>(canonical[1 + i])} << (8 * i);
    return key_hash(static_cast<std::int64_t>(bits));
  }
  return detail::keyed_hash(canonical);
}

bool key_equals(const DictKey& stored, std::string_view key) { return stored.is_string() && stored.as_string() == key; }
bool key_equals(const DictKey& stored, std::int64_t key) {
  if (stored.is_integer()) return stored.as_int() == key;
  return stored.is_object() && stored == DictKey(key);
}
bool key_equals(const DictKey& stored, const DictKey& key) { return stored == key; }

}  // namespace

void Dict::index_entry(std::uint32_t position, std::uint64_t hash) {
  const std::size_t mask = slots_.size() - 1;
  std::size_t slot = hash & mask;
  while (slots_[slot] != 0) slot = (slot + 1) & mask;
  slots_[slot] = detail::SlotCode(slots_.size()).encode(position, hash);
}

void Dict::rebuild_index() {
  std::size_t capacity = 64;
  while (capacity < 2 * entries_.size()) capacity *= 2;
  slots_.assign(capacity, 0);
  detail::for_each_hashed_ahead(
      entries_.size(), slots_.data(), capacity - 1, [&](std::size_t i) { return key_hash(entries_[i].first); },
      [&](std::size_t i, std::uint64_t hash) { index_entry(static_cast<std::uint32_t>(i), hash); });
}

template <typename Key>
std::ptrdiff_t Dict::indexed_position_of(const Key& key, std::uint64_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  const detail::SlotCode code(slots_.size());
  for (std::size_t slot = hash & mask; slots_[slot] != 0; slot = (slot + 1) & mask) {
    if (!code.may_hold(slots_[slot], hash)) continue;
    const std::uint32_t position = code.position(slots_[slot]);
    if (key_equals(entries_[position].first, key)) return position;
  }
  return -1;
}

template <typename Key>
std::ptrdiff_t Dict::position_of(const Key& key) const {
  if (slots_.empty()) {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (key_equals(entries_[i].first, key)) return static_cast<std::ptrdiff_t>(i);
    }
    return -1;
  }
  return indexed_position_of(key, key_hash(key));
}

const Value* Dict::find(const DictKey& key) const {
  const auto i = position_of(key);
  return i < 0 ? nullptr : &entries_[static_cast<std::size_t>(i)].second;
}

const Value* Dict::find(std::string_view key) const {
  const auto i = position_of(key);
  return i < 0 ? nullptr : &entries_[static_cast<std::size_t>(i)].second;
}

const Value* Dict::find(std::int64_t key) const {
  const auto i = position_of(key);
  return i < 0 ? nullptr : &entries_[static_cast<std::size_t>(i)].second;
}

const Value& Dict::at(const DictKey& key) const {
  const Value* value = find(key);
  if (!value) fail(ErrorCode::invalid_argument, "dict has no key ", key.to_string());
  return *value;
}

bool Dict::insert(DictKey key, Value value) {
  // Hashed once, for the lookup and for the index.
  const std::uint64_t hash = slots_.empty() ? 0 : key_hash(key);
  if ((slots_.empty() ? position_of(key) : indexed_position_of(key, hash)) >= 0) return false;
  if (entries_.size() >= UINT32_MAX - 1) fail(ErrorCode::invalid_argument, "dict is full");
  entries_.emplace_back(std::move(key), std::move(value));
  // The index is maintained here, never by lookups, so that const access
  // stays free of writes (and safe from several threads). Doubling keeps the
  // rebuilds amortised O(1) per insert.
  if (entries_.size() >= kIndexThreshold) {
    if (slots_.size() < 2 * entries_.size()) {
      rebuild_index();
    } else {
      index_entry(static_cast<std::uint32_t>(entries_.size() - 1), hash);
    }
  }
  return true;
}

void Dict::prefetch(std::string_view key) const noexcept {
  if (slots_.empty()) return;
  __builtin_prefetch(&slots_[key_hash(key) & (slots_.size() - 1)]);
}

void Dict::insert_or_assign(DictKey key, Value value) {
  const auto i = position_of(key);
  if (i >= 0) {
    entries_[static_cast<std::size_t>(i)].second = std::move(value);
    return;
  }
  insert(std::move(key), std::move(value));
}

void Dict::set_metadata(Value metadata) { metadata_ = std::make_shared<const Value>(std::move(metadata)); }

// ---- Value ---------------------------------------------------------------------------

Value Value::boolean(bool v) { return Value(ValueKind::boolean, v); }
Value Value::integer(std::int64_t v) { return Value(ValueKind::integer, v); }
Value Value::floating(double v) { return Value(ValueKind::floating, v); }
Value Value::integer_of_bytes(std::string_view little_endian) {
  if (little_endian.empty() || little_endian.size() > 255) {
    fail(ErrorCode::invalid_argument, "Value::integer_of_bytes: ", little_endian.size(), " bytes (1 to 255)");
  }
  // Drop sign-extension bytes: the shortest encoding is the canonical one.
  std::size_t size = little_endian.size();
  while (size > 1) {
    const auto top = static_cast<unsigned char>(little_endian[size - 1]);
    const auto next = static_cast<unsigned char>(little_endian[size - 2]);
    if (!((top == 0x00 && !(next & 0x80)) || (top == 0xff && (next & 0x80)))) break;
    --size;
  }
  if (size <= 8) {
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < size; ++i) bits |= std::uint64_t{static_cast<unsigned char>(little_endian[i])} << (8 * i);
    if (size < 8 && (static_cast<unsigned char>(little_endian[size - 1]) & 0x80)) bits |= ~std::uint64_t{0} << (8 * size);
    return integer(static_cast<std::int64_t>(bits));
  }
  return Value(ValueKind::big_integer, std::make_shared<const std::string>(little_endian.substr(0, size)));
}
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
Value Value::meta_tensor(TensorData tensor) {
  if (tensor.storage || tensor.storage_offset != 0 || tensor.conjugate || tensor.negative || tensor.from_numpy) {
    fail(ErrorCode::invalid_argument, "Value::meta_tensor: a meta tensor has no storage, offset, conj/neg bits or NumPy origin");
  }
  if (tensor.sizes.size() != tensor.strides.size()) {
    fail(ErrorCode::invalid_argument, "Value::meta_tensor: ", tensor.sizes.size(), " sizes but ", tensor.strides.size(),
         " strides");
  }
  return Value(ValueKind::meta_tensor, std::make_shared<const TensorData>(std::move(tensor)));
}
Value Value::complex_number(std::complex<double> v) { return Value(ValueKind::complex_number, v); }
Value Value::numpy_scalar(DType dtype, Value plain) {
  switch (plain.kind()) {
    case ValueKind::boolean:
    case ValueKind::integer:
    case ValueKind::big_integer:
    case ValueKind::floating:
    case ValueKind::complex_number: break;
    default:
      fail(ErrorCode::invalid_argument, "Value::numpy_scalar: a ", value_kind_name(plain.kind()),
           " is not a NumPy scalar's value");
  }
  plain.numpy_dtype_ = static_cast<std::uint8_t>(dtype);
  return plain;
}
Value Value::set(List items) { return Value(ValueKind::set, std::make_shared<List>(std::move(items))); }
Value Value::bytearray(std::string v) {
  return Value(ValueKind::bytearray, std::make_shared<const std::string>(std::move(v)));
}
Value Value::device(std::string name) {
  if (!valid_device_name(name)) {
    fail(ErrorCode::invalid_argument, "'", name.substr(0, 64), "' is not a torch.device (a type such as 'cuda', ",
         "then ':index' or nothing)");
  }
  return Value(ValueKind::device, std::make_shared<const std::string>(std::move(name)));
}
Value Value::dtype(DType v) { return Value(ValueKind::dtype, static_cast<std::int64_t>(v)); }
Value Value::size(std::span<const std::int64_t> dims) {
  List items;
  items.reserve(dims.size());
  for (const std::int64_t d : dims) items.push_back(integer(d));
  return Value(ValueKind::size, std::make_shared<List>(std::move(items)));
}
Value Value::layout(std::string name) {
  if (!valid_layout_name(name)) fail(ErrorCode::invalid_argument, "'", name.substr(0, 64), "' is not a torch layout");
  return Value(ValueKind::layout, std::make_shared<const std::string>(std::move(name)));
}

bool valid_device_name(std::string_view name) noexcept {
  const std::size_t colon = name.find(':');
  const std::string_view type = name.substr(0, colon);
  if (type.empty() || type.size() > 32) return false;
  for (const char c : type) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  if (colon == std::string_view::npos) return true;
  const std::string_view index = name.substr(colon + 1);
  // A device index is an int8 in torch (c10::DeviceIndex), written without sign or leading zeros.
  if (index.empty() || index.size() > 3 || (index.size() > 1 && index[0] == '0')) return false;
  int value = 0;
  for (const char c : index) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  return value <= 127;
}

std::string typed_scalar_text(const Value& value) {
  switch (value.kind()) {
    case ValueKind::complex_number: {
      const std::complex<double> z = value.as_complex();
      char text[80];
      std::snprintf(text, sizeof text, "complex(%.17g, %.17g)", z.real(), z.imag());
      return text;
    }
    case ValueKind::device: return "device('" + value.as_device() + "')";
    case ValueKind::dtype: return "torch." + std::string(dtype_name(value.as_dtype()));
    case ValueKind::layout: return value.as_layout();
    case ValueKind::meta_tensor: {
      const TensorData& t = value.as_meta_tensor();
      return std::string(t.is_parameter ? "Parameter" : "tensor") + "(meta, " + std::string(dtype_name(t.dtype)) +
             ", size=" + shape_text(t.sizes) + ", stride=" + shape_text(t.strides) +
             (t.requires_grad ? ", requires_grad" : "") + ")";
    }
    case ValueKind::sparse_tensor: {
      const SparseTensor& s = value.as_sparse_tensor();
      const Dims& index_sizes = s.parts[s.is_coo() ? 0 : 1].as_tensor().sizes;
      const std::int64_t nnz = index_sizes.size() ? index_sizes[index_sizes.size() - 1] : 0;
      return std::string(s.is_parameter ? "Parameter" : "tensor") + "(" + s.layout.substr(s.layout.find('.') + 1) +
             ", " + std::string(dtype_name(s.values().dtype)) + ", size=" + shape_text(s.sizes) +
             ", nnz=" + std::to_string(nnz) + (s.coalesced.value_or(false) ? ", coalesced" : "") +
             (s.requires_grad ? ", requires_grad" : "") + ")";
    }
    default: break;
  }
  fail(ErrorCode::invalid_argument, "typed_scalar_text: a ", value_kind_name(value.kind()));
}

std::string float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[40];
  const auto result = std::to_chars(text, text + sizeof text, value);
  std::string out(text, result.ptr);
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

std::string scalar_text(const Value& value, std::size_t max_string_chars) {
  const auto counted = [](std::string_view kind, std::size_t count) {
    return std::string(kind) + "(" + std::to_string(count) + ")";
  };
  switch (value.kind()) {
    case ValueKind::none: return "None";
    case ValueKind::boolean: return value.as_bool() ? "True" : "False";
    case ValueKind::integer: return std::to_string(value.as_int());
    case ValueKind::big_integer: return big_integer_decimal(value.as_big_integer());
    case ValueKind::floating: return float_text(value.as_double());
    case ValueKind::string: {
      const std::string& s = value.as_string();
      const std::size_t keep = max_string_chars > 3 ? max_string_chars - 3 : 0;
      return "'" + (s.size() > max_string_chars ? s.substr(0, keep) + "..." : s) + "'";
    }
    case ValueKind::bytes: return counted("bytes", value.as_bytes().size());
    case ValueKind::bytearray: return counted("bytearray", value.as_bytes().size());
    case ValueKind::set: return counted("set", value.as_list().size());
    case ValueKind::size: {
      Dims dims;
      for (const Value& item : value.as_list()) dims.push_back(item.as_int());
      return "torch.Size(" + shape_text(dims) + ")";
    }
    case ValueKind::complex_number:
    case ValueKind::device:
    case ValueKind::dtype:
    case ValueKind::layout:
    case ValueKind::meta_tensor:
    case ValueKind::sparse_tensor: return typed_scalar_text(value);
    case ValueKind::list:
    case ValueKind::tuple:
    case ValueKind::dict:
    case ValueKind::ordered_dict:
    case ValueKind::tensor: return {};
  }
  return {};
}

bool valid_set_item(const Value& value) noexcept {
  switch (value.kind()) {
    case ValueKind::none:
    case ValueKind::boolean:
    case ValueKind::integer:
    case ValueKind::big_integer:
    case ValueKind::floating:
    case ValueKind::complex_number:
    case ValueKind::string:
    case ValueKind::bytes:
    case ValueKind::device:
    case ValueKind::dtype:
    case ValueKind::layout:
      return true;
    case ValueKind::tuple:
    case ValueKind::size: {
      const Value::List& items = *std::get<std::shared_ptr<Value::List>>(value.node_);
      return std::all_of(items.begin(), items.end(), [](const Value& item) { return valid_set_item(item); });
    }
    default: return false;
  }
}

bool valid_layout_name(std::string_view name) noexcept {
  return std::find(std::begin(kTorchLayoutNames), std::end(kTorchLayoutNames), name) != std::end(kTorchLayoutNames);
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
  if (kind_ != ValueKind::bytes && kind_ != ValueKind::bytearray) wrong_kind(kind_, "bytes");
  return *std::get<std::shared_ptr<const std::string>>(node_);
}

std::complex<double> Value::as_complex() const {
  if (kind_ != ValueKind::complex_number) wrong_kind(kind_, "complex");
  return std::get<std::complex<double>>(node_);
}

const std::string& Value::as_device() const {
  if (kind_ != ValueKind::device) wrong_kind(kind_, "torch.device");
  return *std::get<std::shared_ptr<const std::string>>(node_);
}

DType Value::as_dtype() const {
  if (kind_ != ValueKind::dtype) wrong_kind(kind_, "torch.dtype");
  return static_cast<DType>(std::get<std::int64_t>(node_));
}

const std::string& Value::as_layout() const {
  if (kind_ != ValueKind::layout) wrong_kind(kind_, "torch.layout");
  return *std::get<std::shared_ptr<const std::string>>(node_);
}

std::string_view Value::as_big_integer() const {
  if (kind_ != ValueKind::big_integer) wrong_kind(kind_, "int outside int64");
  return *std::get<std::shared_ptr<const std::string>>(node_);
}

const Value::List& Value::as_list() const {
  if (!is_sequence() && !is_set() && !is_size()) wrong_kind(kind_, "list or tuple");
  return *std::get<std::shared_ptr<List>>(node_);
}

const Dict& Value::as_dict() const {
  if (!is_dict()) wrong_kind(kind_, "dict");
  return *std::get<std::shared_ptr<Dict>>(node_);
}

const TensorData& Value::as_tensor() const { return *tensor_ptr(); }

const TensorData& Value::as_meta_tensor() const {
  if (kind_ != ValueKind::meta_tensor) wrong_kind(kind_, "meta Tensor");
  return *std::get<std::shared_ptr<const TensorData>>(node_);
}

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
                      std::is_same_v<T, std::int64_t> || std::is_same_v<T, double> ||
                      std::is_same_v<T, std::complex<double>>) {
          return nullptr;
        } else {
          return node.get();
        }
      },
      node_);
}

// ---- comparison ----------------------------------------------------------------------

namespace {

// What any two tensors, with or without storage, must share to be equal: dtype,
// sizes and requires_grad. Empty when they do.
std::string tensor_header_difference(const TensorData& x, const TensorData& y, const std::string& where) {
  if (x.dtype != y.dtype) {
    return where + ": dtype " + std::string(dtype_name(x.dtype)) + " vs " + std::string(dtype_name(y.dtype));
  }
  if (x.sizes != y.sizes) return where + ": sizes " + shape_text(x.sizes) + " vs " + shape_text(y.sizes);
  if (x.requires_grad != y.requires_grad) return where + ": requires_grad differs";
  return {};
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
    case ValueKind::bytes:
    case ValueKind::bytearray: return a.as_bytes() == b.as_bytes() ? std::string() : where + ": bytes differ";
    case ValueKind::complex_number: {
      const std::complex<double> x = a.as_complex(), y = b.as_complex();
      return std::memcmp(&x, &y, sizeof x) == 0 ? std::string() : where + ": complex differs";
    }
    case ValueKind::device:
      return a.as_device() == b.as_device() ? std::string() : where + ": " + a.as_device() + " vs " + b.as_device();
    case ValueKind::layout:
      return a.as_layout() == b.as_layout() ? std::string() : where + ": " + a.as_layout() + " vs " + b.as_layout();
    case ValueKind::dtype:
      return a.as_dtype() == b.as_dtype() ? std::string()
                                          : where + ": " + std::string(dtype_name(a.as_dtype())) + " vs " +
                                                std::string(dtype_name(b.as_dtype()));
    case ValueKind::big_integer:
      return a.as_big_integer() == b.as_big_integer()
                 ? std::string()
                 : where + ": " + big_integer_decimal(a.as_big_integer()) + " vs " + big_integer_decimal(b.as_big_integer());
    case ValueKind::list:
    case ValueKind::tuple:
    case ValueKind::set:
    case ValueKind::size: {
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
      if (auto d = tensor_header_difference(x, y, where); !d.empty()) return d;
      if (x.conjugate != y.conjugate || x.negative != y.negative) return where + ": conj/neg view bits differ";
      if (x.contiguous_bytes() != y.contiguous_bytes()) return where + ": tensor elements differ";
      return {};
    }
    case ValueKind::meta_tensor: {
      const TensorData& x = a.as_meta_tensor();
      const TensorData& y = b.as_meta_tensor();
      if (auto d = tensor_header_difference(x, y, where); !d.empty()) return d;
      // A meta tensor is nothing but its geometry: the strides are its content.
      if (x.strides != y.strides) return where + ": strides " + shape_text(x.strides) + " vs " + shape_text(y.strides);
      if (x.is_parameter != y.is_parameter) return where + ": nn.Parameter vs plain meta tensor";
      return {};
    }
    case ValueKind::sparse_tensor: {
      const SparseTensor& x = a.as_sparse_tensor();
      const SparseTensor& y = b.as_sparse_tensor();
      if (x.layout != y.layout) return where + ": " + x.layout + " vs " + y.layout;
      if (x.sizes != y.sizes) return where + ": sizes " + shape_text(x.sizes) + " vs " + shape_text(y.sizes);
      if (x.coalesced != y.coalesced) return where + ": is_coalesced differs";
      if (x.requires_grad != y.requires_grad) return where + ": requires_grad differs";
      if (x.is_parameter != y.is_parameter) return where + ": nn.Parameter vs plain sparse tensor";
      for (std::size_t i = 0; i < x.parts.size() && i < y.parts.size(); ++i) {
        auto d = first_difference(x.parts[i], y.parts[i], path + ".part" + std::to_string(i));
        if (!d.empty()) return d;
      }
      return x.parts.size() == y.parts.size() ? std::string() : where + ": part count differs";
    }
  }
  return where + ": unknown kind";
}

}  // namespace

bool equal_content(const Value& a, const Value& b) { return first_difference(a, b, "").empty(); }

std::string describe_difference(const Value& a, const Value& b) { return first_difference(a, b, ""); }

void hand_over_storages(const Value& root, const std::shared_ptr<const void>& snapshot) {
  if (!snapshot) return;
  const auto same_owner = [&snapshot](const std::shared_ptr<const void>& owner) {
    return owner && !owner.owner_before(snapshot) && !snapshot.owner_before(owner);
  };
  std::vector<const Value*> pending{&root};
  while (!pending.empty()) {
    const Value& value = *pending.back();
    pending.pop_back();
    if (value.is_tensor()) {
      const Storage* storage = value.as_tensor().storage.get();
      if (storage && storage->has_bytes() && same_owner(storage->owner())) storage->handed_over_ = 1;
    } else if (value.is_sequence()) {
      for (const Value& item : value.as_list()) pending.push_back(&item);
    } else if (value.is_dict()) {
      for (const auto& [key, item] : value.as_dict()) pending.push_back(&item);
    } else if (value.is_sparse_tensor()) {
      for (const Value& part : value.as_sparse_tensor().parts) pending.push_back(&part);
    }
  }
}

}  // namespace holdpoint
