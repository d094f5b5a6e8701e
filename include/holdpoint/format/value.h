// Value: the validated, bounded mapping a checkpoint decodes to.
//
// A Value is one of None, bool, int64, double, str, bytes, list, tuple, dict,
// ordered dict or tensor: exactly what a weights-only PyTorch checkpoint can
// hold. Dict keys are strings or integers and keep insertion order (as Python
// dicts do).
//
// Sharing: containers, strings and tensors are held by shared pointer, so
// copying a Value is cheap and copies share their contents, like Python
// references. Readers never hand out a mutable container twice (the pickle VM
// rejects shared mutable containers), so trees from files are acyclic. Trees
// built by callers must be acyclic too; writers reject nesting deeper than
// Limits::max_nesting_depth.
//
// Tensors: TensorData describes a strided view (dtype, sizes, strides, offset)
// into a Storage, an untyped byte range kept alive by an owner. Tensors read
// from a file are zero-copy views into the loaded snapshot buffer and keep it
// alive; tensors captured from LibTorch (torch_tensor.h) keep the at::Storage
// alive; tensors from scan_checkpoint have sizes but no bytes
// (Storage::absent). Two views of one storage share one Storage object, which
// writers emit as a single record.
//
// Thread-safety: const access from several threads is safe; mutation is not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "holdpoint/format/dtype.h"

namespace holdpoint {

// An untyped, contiguous, immutable byte range that tensors view.
class Storage {
 public:
  // `owner` keeps `data` alive; `identity` tells writers which storages are the
  // same (defaults to this object's address).
  Storage(const std::byte* data, std::size_t nbytes, std::shared_ptr<const void> owner,
          const void* identity = nullptr);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // A storage that owns a private copy of `bytes`.
  static std::shared_ptr<const Storage> copy_of(std::span<const std::byte> bytes);
  // A storage of `nbytes` bytes that were checked but not kept: what
  // scan_checkpoint (holdpoint/format/scan.h) gives tensors. It has a size
  // and an identity; asking for its bytes (data(), bytes(), and so a
  // tensor's contiguous_bytes() or Value::as_number()) throws
  // Error(invalid_argument) instead of reading memory that is not there.
  static std::shared_ptr<const Storage> absent(std::size_t nbytes);

  bool has_bytes() const noexcept { return !absent_; }
  const std::byte* data() const {
    if (absent_) throw_absent();
    return data_;
  }
  std::size_t nbytes() const noexcept { return nbytes_; }
  std::span<const std::byte> bytes() const { return {data(), nbytes_}; }
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }
  const void* identity() const noexcept { return identity_ ? identity_ : this; }

  // True once hand_over_storages marked this storage: its bytes lie in a
  // private snapshot the loader gave up. Whoever holds the only reference to
  // it may write to its bytes (OptimizerState takes them as its live state
  // instead of copying them), and when it dies the memory pages wholly inside
  // it are returned to the kernel, while the rest of the snapshot lives on.
  bool handed_over() const noexcept { return handed_over_; }

 private:
  friend void hand_over_storages(const class Value& root, const std::shared_ptr<const void>& snapshot);
  [[noreturn]] void throw_absent() const;

  const std::byte* data_;
  std::size_t nbytes_;
  std::shared_ptr<const void> owner_;
  const void* identity_;
  bool absent_ = false;
  mutable bool handed_over_ = false;  // set once, before the storage is shared across threads
};

struct TensorData {
  DType dtype = DType::float32;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;  // in elements
  std::int64_t storage_offset = 0;    // in elements
  std::shared_ptr<const Storage> storage;
  bool requires_grad = false;
  bool is_parameter = false;  // rebuilt through torch._utils._rebuild_parameter

  // A contiguous tensor that owns a copy of `bytes` (which must hold
  // numel x dtype_bits / 8 bytes in C order).
  static TensorData from_bytes(DType dtype, std::vector<std::int64_t> sizes,
                               std::span<const std::byte> bytes);

  std::int64_t numel() const noexcept;
  // 0 for a sub-byte dtype (see dtype.h); logical_bytes covers every dtype.
  std::size_t itemsize() const noexcept { return dtype_itemsize(dtype); }
  // numel x bits / 8, rounded up for a sub-byte tensor whose bits end inside
  // a byte (which no reader produces and every writer refuses).
  std::size_t logical_bytes() const noexcept {
    return (static_cast<std::size_t>(numel()) * dtype_bits(dtype) + 7) / 8;
  }
  bool is_contiguous() const noexcept;
  // Elements in C order, copied out of the (possibly strided) view. A
  // sub-byte tensor must be contiguous and start on a byte boundary
  // (tensor_geometry_invalid otherwise): its elements cannot be gathered
  // byte by byte.
  std::vector<std::byte> contiguous_bytes() const;
  void copy_contiguous_bytes(std::byte* out) const;
};

// Tensor sizes (or an element index) as messages and listings print them:
// "[2, 3]", and "[]" for a 0-d tensor.
std::string shape_text(std::span<const std::int64_t> sizes);

enum class ValueKind : std::uint8_t {
  none,
  boolean,
  integer,
  floating,
  string,
  bytes,
  list,
  tuple,
  dict,
  ordered_dict,
  tensor,
};

std::string_view value_kind_name(ValueKind kind) noexcept;

class Value;

// A dict key: a string or an integer (PyTorch optimizer state is keyed by int).
class DictKey {
 public:
  DictKey(std::string key) : key_(std::move(key)) {}
  DictKey(const char* key) : key_(std::string(key)) {}
  DictKey(std::int64_t key) : key_(key) {}
  DictKey(int key) : key_(std::int64_t{key}) {}

  bool is_string() const noexcept { return std::holds_alternative<std::string>(key_); }
  bool is_integer() const noexcept { return !is_string(); }
  const std::string& as_string() const;
  std::int64_t as_int() const;
  bool operator==(const DictKey& other) const = default;
  // "'name'" or "3", for messages.
  std::string to_string() const;

 private:
  std::variant<std::int64_t, std::string> key_;
};

// Insertion-ordered mapping with string or integer keys and unique keys.
class Dict {
 public:
  using Entry = std::pair<DictKey, Value>;

  // Defined after Value (below), which must be complete for std::pair<DictKey, Value>.
  std::size_t size() const noexcept;
  bool empty() const noexcept;
  std::vector<Entry>::const_iterator begin() const noexcept;
  std::vector<Entry>::const_iterator end() const noexcept;
  const Entry& at_index(std::size_t i) const;

  const Value* find(const DictKey& key) const;
  const Value* find(std::string_view key) const;
  const Value* find(const std::string& key) const { return find(std::string_view(key)); }
  const Value* find(const char* key) const { return find(std::string_view(key)); }
  const Value* find(std::int64_t key) const;
  bool contains(const DictKey& key) const { return find(key) != nullptr; }
  // The value for `key`; throws Error(invalid_argument) naming the key if absent.
  const Value& at(const DictKey& key) const;

  // Appends a new key. Returns false (and changes nothing) if the key exists.
  bool insert(DictKey key, Value value);
  // Replaces the value of an existing key in place, or appends a new key.
  void insert_or_assign(DictKey key, Value value);

  // Python attributes set by BUILD on an OrderedDict: state dicts carry
  // `_metadata` (module prefix -> {"version": int}). Empty when absent.
  const std::shared_ptr<const Value>& metadata() const noexcept { return metadata_; }
  void set_metadata(Value metadata);

 private:
  template <typename Key>
  std::ptrdiff_t position_of(const Key& key) const;
  void index_entry(std::uint32_t position);
  void rebuild_index();

  std::vector<Entry> entries_;
  // Open-addressing table of entry positions + 1 (0 = empty slot), built once
  // the dict is large enough for scans to matter. It stores no keys of its
  // own, so indexing a state dict of 100k tensors copies no strings.
  std::vector<std::uint32_t> slots_;
  std::shared_ptr<const Value> metadata_;
};

class Value {
 public:
  using List = std::vector<Value>;

  Value() noexcept = default;  // None
  static Value none() { return Value(); }
  static Value boolean(bool v);
  static Value integer(std::int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value bytes(std::string v);
  static Value list(List items = {});
  static Value tuple(List items = {});
  static Value dict(Dict entries = {});
  static Value ordered_dict(Dict entries = {});
  static Value tensor(TensorData tensor);
  static Value tensor(std::shared_ptr<const TensorData> tensor);

  ValueKind kind() const noexcept { return kind_; }
  bool is_none() const noexcept { return kind_ == ValueKind::none; }
  bool is_bool() const noexcept { return kind_ == ValueKind::boolean; }
  bool is_int() const noexcept { return kind_ == ValueKind::integer; }
  bool is_double() const noexcept { return kind_ == ValueKind::floating; }
  bool is_string() const noexcept { return kind_ == ValueKind::string; }
  bool is_bytes() const noexcept { return kind_ == ValueKind::bytes; }
  bool is_list() const noexcept { return kind_ == ValueKind::list; }
  bool is_tuple() const noexcept { return kind_ == ValueKind::tuple; }
  bool is_sequence() const noexcept { return is_list() || is_tuple(); }
  bool is_dict() const noexcept { return kind_ == ValueKind::dict || kind_ == ValueKind::ordered_dict; }
  bool is_ordered_dict() const noexcept { return kind_ == ValueKind::ordered_dict; }
  bool is_tensor() const noexcept { return kind_ == ValueKind::tensor; }

  // Accessors throw Error(invalid_argument) naming both kinds on a mismatch.
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_double() const;
  // A double from a float, an int, or a 0-d float64 tensor (the torch 1.13
  // compatibility encoding of floats).
  double as_number() const;
  const std::string& as_string() const;
  std::string_view as_bytes() const;
  const List& as_list() const;  // list or tuple
  const Dict& as_dict() const;  // dict or ordered dict
  const TensorData& as_tensor() const;
  const std::shared_ptr<const TensorData>& tensor_ptr() const;

  // Builders: mutable access to a list or dict this Value holds.
  List& mutable_list();
  Dict& mutable_dict();

  // Identity of the shared node (containers, strings, tensors); nullptr for scalars.
  const void* node_identity() const noexcept;

 private:
  using Node = std::variant<std::monostate, bool, std::int64_t, double, std::shared_ptr<const std::string>,
                            std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<const TensorData>>;
  Value(ValueKind kind, Node node) : kind_(kind), node_(std::move(node)) {}

  ValueKind kind_ = ValueKind::none;
  Node node_;
};

// Hands the tensors of `root` that view `snapshot` (a private buffer the
// caller's reader made, LoadedMapping::snapshot) over to whoever applies
// them: see Storage::handed_over. Call it only on a tree nothing else will
// read after it is applied, as TrainingState's loads do with the mapping
// they read themselves; a storage another reader still holds is never
// written (a component writes only to a storage it holds the only
// reference to) and never released (pages are released when the storage
// dies). Storages with other owners are left as they are.
void hand_over_storages(const Value& root, const std::shared_ptr<const void>& snapshot);

inline std::size_t Dict::size() const noexcept { return entries_.size(); }
inline bool Dict::empty() const noexcept { return entries_.empty(); }
inline std::vector<Dict::Entry>::const_iterator Dict::begin() const noexcept { return entries_.begin(); }
inline std::vector<Dict::Entry>::const_iterator Dict::end() const noexcept { return entries_.end(); }
inline const Dict::Entry& Dict::at_index(std::size_t i) const { return entries_.at(i); }

// Deep structural equality: same kinds, same keys in the same order, equal
// scalars (doubles compared bitwise, so NaN == NaN), tensors with equal dtype,
// sizes, requires_grad and logical elements (bitwise). Strides, offsets and
// storage sharing are not compared; use same_storage_layout for that.
bool equal_content(const Value& a, const Value& b);

// Explains the first difference equal_content finds ("['model']['w']: sizes [2] vs [3]"),
// or returns an empty string when the values are equal.
std::string describe_difference(const Value& a, const Value& b);

}  // namespace holdpoint
