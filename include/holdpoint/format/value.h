// Value: the validated, bounded mapping a checkpoint decodes to.
//
// A Value is one of None, bool, int64, a larger int, double, complex, str,
// bytes, bytearray, list, tuple, set, dict, ordered dict, tensor, or one of
// torch's own value types (torch.dtype, torch.Size, torch.device,
// torch.layout): what a weights-only PyTorch checkpoint can hold. Dict keys
// are strings or integers and keep insertion order (as Python dicts do).
//
// Sharing: containers, strings and tensors are held by shared pointer, so
// copying a Value is cheap and copies share their contents, like Python
// references. A container a file references twice is one shared node, as
// Python builds it; the pickle VM refuses cycles (pickle_cycle) and counts
// shared nodes in full against Limits::max_expanded_nodes, so trees from files
// are acyclic and bounded however they are walked. Trees built by callers must
// be acyclic too; writers memoize a shared container and reject nesting
// deeper than Limits::max_nesting_depth.
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

#include <algorithm>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <optional>
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

  bool has_bytes() const noexcept { return absent_ == 0; }
  const std::byte* data() const {
    if (absent_) throw_absent();
    return data_;
  }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(nbytes_); }
  std::span<const std::byte> bytes() const { return {data(), nbytes()}; }
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }
  const void* identity() const noexcept { return identity_ ? identity_ : this; }

  // True once hand_over_storages marked this storage: its bytes lie in a
  // private snapshot the loader gave up. Whoever holds the only reference to
  // it may write to its bytes (OptimizerState takes them as its live state
  // instead of copying them), and when it dies the memory pages wholly inside
  // it are returned to the kernel, while the rest of the snapshot lives on.
  bool handed_over() const noexcept { return handed_over_ != 0; }

 private:
  friend void hand_over_storages(const class Value& root, const std::shared_ptr<const void>& snapshot);
  [[noreturn]] void throw_absent() const;

  // 40 bytes in all, so that one with its shared_ptr control block takes a
  // 64-byte allocation: a state dict may hold hundreds of thousands. A size
  // needs 62 bits at most (the constructor checks it).
  const std::byte* data_;
  std::uint64_t nbytes_ : 62;
  std::uint64_t absent_ : 1;
  mutable std::uint64_t handed_over_ : 1;  // set once, before the storage is shared across threads
  std::shared_ptr<const void> owner_;
  const void* identity_;
};

// A tensor's sizes or strides, in elements. Up to two dimensions are held in
// the object itself and more on the heap, so the vectors and matrices that
// make up most of a model cost no allocation for their geometry (a state dict
// of 200,000 tensors saves 400,000). Reads like a std::vector<std::int64_t>,
// converts to one (vec()) and to a span, and is built from one, from a span
// or from a braced list.
class Dims {
 public:
  using value_type = std::int64_t;
  using size_type = std::size_t;
  using reference = std::int64_t&;
  using const_reference = const std::int64_t&;
  using iterator = std::int64_t*;
  using const_iterator = const std::int64_t*;

  Dims() noexcept : inline_{0, 0} {}
  Dims(std::initializer_list<std::int64_t> values) : Dims() { assign(values.begin(), values.end()); }
  Dims(const std::vector<std::int64_t>& values) : Dims() { assign(values.begin(), values.end()); }
  Dims(std::span<const std::int64_t> values) : Dims() { assign(values.begin(), values.end()); }
  template <std::input_iterator It>
  Dims(It first, It last) : Dims() {
    assign(first, last);
  }
  Dims(const Dims& other) : Dims() { assign(other.begin(), other.end()); }
  Dims(Dims&& other) noexcept;
  Dims& operator=(const Dims& other);
  Dims& operator=(Dims&& other) noexcept;
  ~Dims();

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::int64_t* data() noexcept { return on_heap() ? heap_ : inline_; }
  const std::int64_t* data() const noexcept { return on_heap() ? heap_ : inline_; }
  iterator begin() noexcept { return data(); }
  iterator end() noexcept { return data() + size_; }
  const_iterator begin() const noexcept { return data(); }
  const_iterator end() const noexcept { return data() + size_; }
  std::int64_t& operator[](std::size_t i) noexcept { return data()[i]; }
  const std::int64_t& operator[](std::size_t i) const noexcept { return data()[i]; }
  std::int64_t& back() noexcept { return data()[size_ - 1]; }
  const std::int64_t& back() const noexcept { return data()[size_ - 1]; }

  void clear() noexcept { size_ = 0; }
  void reserve(std::size_t capacity);
  void resize(std::size_t size, std::int64_t value = 0);
  void push_back(std::int64_t value);
  void assign(std::size_t count, std::int64_t value);
  template <std::input_iterator It>
  void assign(It first, It last) {
    clear();
    if constexpr (std::forward_iterator<It>) reserve(static_cast<std::size_t>(std::distance(first, last)));
    for (; first != last; ++first) push_back(static_cast<std::int64_t>(*first));
  }

  std::vector<std::int64_t> vec() const { return {begin(), end()}; }
  operator std::vector<std::int64_t>() const { return vec(); }
  operator std::span<const std::int64_t>() const noexcept { return {data(), size_}; }

  friend bool operator==(const Dims& a, const Dims& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator==(const Dims& a, const std::vector<std::int64_t>& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  static constexpr std::uint32_t kInline = 2;
  bool on_heap() const noexcept { return capacity_ > kInline; }

  union {
    std::int64_t inline_[kInline];
    std::int64_t* heap_;
  };
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = kInline;
};

struct TensorData {
  DType dtype = DType::float32;
  Dims sizes;
  Dims strides;  // in elements
  std::int64_t storage_offset = 0;    // in elements
  std::shared_ptr<const Storage> storage;
  bool requires_grad = false;
  bool is_parameter = false;  // rebuilt through torch._utils._rebuild_parameter
  // Pickled as a numpy.ndarray (a NumPy RNG state, say) and decoded as data;
  // its bytes are the reader's own copy. Writers write it as a tensor.
  bool from_numpy = false;
  // torch's lazy views, Tensor.conj() of a complex tensor and _neg_view(): the
  // storage holds the plain elements, and the tensor's elements are their
  // conjugates (negations). torch.save keeps the bits (its rebuild metadata,
  // docs/format.md §5.3); so do holdpoint's reader and .pt writer.
  bool conjugate = false;
  bool negative = false;

  // A contiguous tensor that owns a copy of `bytes` (which must hold
  // numel x dtype_bits / 8 bytes in C order).
  static TensorData from_bytes(DType dtype, Dims sizes,
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
  // An int outside int64, as Python's unbounded ints allow (a NumPy
  // Generator's 128-bit PCG64 state, a 64-bit unsigned seed): kept as the
  // shortest two's-complement little-endian bytes, the payload of pickle's
  // LONG1 (at most 255 bytes). Ints that fit int64 are always `integer`.
  big_integer,
  // Python's complex (builtins.complex(real, imag)), and a NumPy complex
  // scalar read as one.
  complex_number,
  // A Python set (builtins.set(list)), its items in the file's order. Items
  // are hashable: scalars, str, bytes and tuples of them; never a tensor.
  set,
  // Python's bytearray: bytes that were mutable in Python.
  bytearray,
  // torch.device: "cpu", "cuda", "cuda:1" (its str()).
  device,
  // torch.dtype (torch.float16 as a value, not a tensor's): a DType.
  dtype,
  // torch.Size: a tuple of ints that Python gives back as torch.Size.
  size,
  // torch.layout: its name, as torch.serialization._get_layout takes it
  // ("torch.strided", "torch.sparse_coo", ...).
  layout,
  // A tensor on torch's "meta" device: a dtype, sizes, strides and
  // requires_grad (maybe an nn.Parameter), and no elements, as
  // torch._utils._rebuild_meta_tensor_no_storage rebuilds it. Its TensorData
  // has no storage (and offset 0); as_tensor() refuses it, so code that reads
  // elements never meets one.
  meta_tensor,
  // A sparse tensor (layout COO, CSR, CSC, BSR or BSC), as
  // torch._utils._rebuild_sparse_tensor rebuilds it: a SparseTensor whose
  // parts are ordinary tensor Values (as_sparse_tensor()).
  sparse_tensor,
};

std::string_view value_kind_name(ValueKind kind) noexcept;

// torch's layouts by the names torch.serialization._get_layout takes.
inline constexpr std::string_view kTorchLayoutNames[] = {"torch.strided",    "torch.sparse_coo", "torch.sparse_csr",
                                                         "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                                                         "torch._mkldnn",    "torch.jagged"};
// Whether `name` is a torch.device as str() prints it (Value::device).
bool valid_device_name(std::string_view name) noexcept;
bool valid_layout_name(std::string_view name) noexcept;

class Value;
// Whether a set (ValueKind::set) may hold `value`: what Python can hash and a
// file can describe without object identity: None, bool, int, float, complex,
// str, bytes, a torch.device, dtype or layout, and tuples (or torch.Size) of
// those. Readers and writers refuse any other item.
bool valid_set_item(const Value& value) noexcept;

// How messages and listings print a complex, torch.device, torch.dtype,
// torch.layout, meta tensor or sparse tensor value: "complex(1, -2)",
// "device('cuda:1')", "torch.float16", "torch.strided", "tensor(meta, float32,
// size=[2, 3], stride=[3, 1])", "tensor(sparse_coo, float32, size=[2, 3],
// nnz=3, coalesced)" (a sparse tensor's header, not its elements). Throws
// Error(invalid_argument) for any other kind.
std::string typed_scalar_text(const class Value& value);

// A float as Python's repr writes it: the shortest text that reads back to the
// same double, "3.0" rather than "3", and "nan", "inf", "-inf".
std::string float_text(double value);

// A one-line summary of any value but a container or tensor, for listings and
// diffs: None, True, 42, 0.1, 'text' (cut past max_string_chars), bytes(12),
// bytearray(3), set(4), torch.Size([2, 3]) and typed_scalar_text's forms.
// Empty for a list, tuple, dict, OrderedDict or dense tensor (their callers
// print those their own way).
std::string scalar_text(const class Value& value, std::size_t max_string_chars = 80);

// The decimal text of a big_integer's bytes ("-340282366920938463463374607431768211456").
std::string big_integer_decimal(std::string_view little_endian);

class Value;

// A dict key: a string or an integer (PyTorch optimizer state is keyed by
// int), or any other key a Python dict in a checkpoint may have: None, bool,
// float, bytes, or a tuple of keys. Keys compare as Python compares them:
// 1, 1.0 and True are one key (the first kept), so a dict never holds two
// keys Python would merge; a float NaN equals a NaN of the same bits.
class DictKey {
 public:
  DictKey(std::string key) : key_(std::move(key)) {}
  DictKey(const char* key) : key_(std::string(key)) {}
  DictKey(std::int64_t key) : key_(key) {}
  DictKey(int key) : key_(std::int64_t{key}) {}
  // A str or int Value makes the plain key; None, bool, float, bytes and
  // tuples of keys an object key. Anything else throws
  // Error(invalid_argument) (valid_dict_key says which).
  explicit DictKey(const class Value& key);

  bool is_string() const noexcept { return std::holds_alternative<std::string>(key_); }
  bool is_integer() const noexcept { return std::holds_alternative<std::int64_t>(key_); }
  // None, bool, float, bytes or a tuple.
  bool is_object() const noexcept { return std::holds_alternative<std::shared_ptr<const Object>>(key_); }
  const std::string& as_string() const;
  std::int64_t as_int() const;
  // The key as a Value, whatever its kind (a str or int Value for those).
  class Value value() const;
  bool operator==(const DictKey& other) const;
  // "'name'", "3", or Python's way for the others ("(1, None)", "2.5",
  // "True", "b'..'"), for messages.
  std::string to_string() const;
  // Python-equality classes as bytes: two keys are equal exactly when these
  // are (an int and an integral float or bool share one).
  std::string canonical() const;

 private:
  struct Object;
  std::variant<std::int64_t, std::string, std::shared_ptr<const Object>> key_;
};

// Whether `key` may be a dict key (DictKey(const Value&)): str, int, None,
// bool, float, bytes, or a tuple of those.
bool valid_dict_key(const class Value& key) noexcept;

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
  // A hint that `key` is inserted or looked up soon: brings its index slot
  // into cache. Only speed; for a reader that knows a batch of keys ahead.
  void prefetch(std::string_view key) const noexcept;
  // Replaces the value of an existing key in place, or appends a new key.
  void insert_or_assign(DictKey key, Value value);

  // Python attributes set by BUILD on an OrderedDict: state dicts carry
  // `_metadata` (module prefix -> {"version": int}). Empty when absent.
  const std::shared_ptr<const Value>& metadata() const noexcept { return metadata_; }
  void set_metadata(Value metadata);

 private:
  template <typename Key>
  std::ptrdiff_t position_of(const Key& key) const;
  // The same, in an indexed dict, with the key's hash already known.
  template <typename Key>
  std::ptrdiff_t indexed_position_of(const Key& key, std::uint64_t hash) const;
  void index_entry(std::uint32_t position, std::uint64_t hash);
  void rebuild_index();

  std::vector<Entry> entries_;
  // Open-addressing table of entry positions + 1 under a hash tag (0 = empty
  // slot; detail::SlotCode in base/keyed_hash.h), built once the dict is
  // large enough for scans to matter. It stores no keys of its own, so
  // indexing a state dict of 100k tensors copies no strings, and the tag
  // spares a probe comparing keys that only share a slot.
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
  // An int given as two's-complement little-endian bytes (1 to 255): an
  // `integer` when it fits int64, else a big_integer of the shortest bytes.
  static Value integer_of_bytes(std::string_view little_endian);
  static Value floating(double v);
  static Value string(std::string v);
  static Value bytes(std::string v);
  static Value list(List items = {});
  static Value tuple(List items = {});
  static Value dict(Dict entries = {});
  static Value ordered_dict(Dict entries = {});
  static Value tensor(TensorData tensor);
  static Value tensor(std::shared_ptr<const TensorData> tensor);
  static Value complex_number(std::complex<double> v);
  static Value set(List items = {});
  static Value bytearray(std::string v);
  // `name` as str(torch.device) prints it: a type ("cpu", "cuda", "meta",
  // ...; lower-case letters, digits and '_') and an optional ":index".
  // Throws Error(invalid_argument) otherwise.
  static Value device(std::string name);
  static Value dtype(DType v);
  static Value size(std::span<const std::int64_t> dims);
  // One of torch's layout names ("torch.strided", ...); throws
  // Error(invalid_argument) for any other.
  static Value layout(std::string name);
  // A NumPy scalar (numpy.float32(1.5), numpy.uint64(2**63), numpy.bool_):
  // `plain` is its value as a boolean, integer, big_integer, floating or
  // complex_number, tagged with the NumPy dtype it had, so that Python gets
  // the NumPy type back. Everything else (equal_content, digests, writers)
  // sees the plain value: numpy.int64(1) == 1, as in Python.
  static Value numpy_scalar(DType dtype, Value plain);
  // A meta tensor (ValueKind::meta_tensor): `tensor`'s dtype, sizes, strides,
  // requires_grad and is_parameter; it must have no storage, no offset and no
  // conj/neg/NumPy marks (Error(invalid_argument) otherwise).
  static Value meta_tensor(TensorData tensor);
  // A sparse tensor (ValueKind::sparse_tensor); validate_sparse_tensor must
  // pass (its Error otherwise).
  static Value sparse_tensor(struct SparseTensor sparse);

  ValueKind kind() const noexcept { return kind_; }
  // The NumPy dtype of a value read from a NumPy scalar; nullopt otherwise.
  std::optional<DType> numpy_scalar_dtype() const noexcept {
    return numpy_dtype_ == kNotNumpy ? std::nullopt : std::optional<DType>(static_cast<DType>(numpy_dtype_));
  }
  bool is_none() const noexcept { return kind_ == ValueKind::none; }
  bool is_bool() const noexcept { return kind_ == ValueKind::boolean; }
  bool is_int() const noexcept { return kind_ == ValueKind::integer; }
  bool is_big_int() const noexcept { return kind_ == ValueKind::big_integer; }
  bool is_double() const noexcept { return kind_ == ValueKind::floating; }
  bool is_string() const noexcept { return kind_ == ValueKind::string; }
  bool is_bytes() const noexcept { return kind_ == ValueKind::bytes; }
  bool is_list() const noexcept { return kind_ == ValueKind::list; }
  bool is_tuple() const noexcept { return kind_ == ValueKind::tuple; }
  bool is_sequence() const noexcept { return is_list() || is_tuple(); }
  bool is_dict() const noexcept { return kind_ == ValueKind::dict || kind_ == ValueKind::ordered_dict; }
  bool is_ordered_dict() const noexcept { return kind_ == ValueKind::ordered_dict; }
  bool is_tensor() const noexcept { return kind_ == ValueKind::tensor; }
  bool is_complex() const noexcept { return kind_ == ValueKind::complex_number; }
  bool is_set() const noexcept { return kind_ == ValueKind::set; }
  bool is_bytearray() const noexcept { return kind_ == ValueKind::bytearray; }
  bool is_device() const noexcept { return kind_ == ValueKind::device; }
  bool is_dtype() const noexcept { return kind_ == ValueKind::dtype; }
  bool is_size() const noexcept { return kind_ == ValueKind::size; }
  bool is_layout() const noexcept { return kind_ == ValueKind::layout; }
  bool is_meta_tensor() const noexcept { return kind_ == ValueKind::meta_tensor; }
  bool is_sparse_tensor() const noexcept { return kind_ == ValueKind::sparse_tensor; }

  // Accessors throw Error(invalid_argument) naming both kinds on a mismatch.
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_double() const;
  // A double from a float, an int, or a 0-d float64 tensor (the torch 1.13
  // compatibility encoding of floats).
  double as_number() const;
  const std::string& as_string() const;
  std::string_view as_bytes() const;  // bytes or bytearray
  std::complex<double> as_complex() const;
  const std::string& as_device() const;
  DType as_dtype() const;
  const std::string& as_layout() const;
  // A big_integer's shortest two's-complement little-endian bytes.
  std::string_view as_big_integer() const;
  const List& as_list() const;  // list, tuple, set or torch.Size (a tuple of ints)
  const Dict& as_dict() const;  // dict or ordered dict
  const TensorData& as_tensor() const;
  // A meta tensor's geometry (its storage is null).
  const TensorData& as_meta_tensor() const;
  const struct SparseTensor& as_sparse_tensor() const;
  const std::shared_ptr<const TensorData>& tensor_ptr() const;

  // Builders: mutable access to a list or dict this Value holds.
  List& mutable_list();
  Dict& mutable_dict();

  // Identity of the shared node (containers, strings, tensors); nullptr for scalars.
  const void* node_identity() const noexcept;

 private:
  using Node = std::variant<std::monostate, bool, std::int64_t, double, std::shared_ptr<const std::string>,
                            std::shared_ptr<List>, std::shared_ptr<Dict>, std::shared_ptr<const TensorData>,
                            std::complex<double>, std::shared_ptr<const struct SparseTensor>>;
  Value(ValueKind kind, Node node) : kind_(kind), node_(std::move(node)) {}
  friend bool valid_set_item(const Value& value) noexcept;

  static constexpr std::uint8_t kNotNumpy = 0xFF;
  ValueKind kind_ = ValueKind::none;
  std::uint8_t numpy_dtype_ = kNotNumpy;  // a DType, for a NumPy scalar
  Node node_;
};

// A sparse tensor, as torch.save writes one (torch._utils._rebuild_sparse_tensor
// with the layout and its parts) and torch.sparse_coo_tensor /
// torch.sparse_compressed_tensor build it.
struct SparseTensor {
  // "torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
  // "torch.sparse_bsr" or "torch.sparse_bsc".
  std::string layout;
  Dims sizes;
  // COO only: the is_coalesced flag torch.save writes; nullopt for the older
  // three-part form, and always for the compressed layouts.
  std::optional<bool> coalesced;
  // Tensor Values. COO: indices (int64, sparse_dim x nnz) and values
  // (nnz x dense sizes). Compressed: compressed indices (batch x (n + 1)),
  // plain indices (batch x nnz), both int32 or both int64, and values
  // (batch x nnz [x block] x dense sizes).
  std::vector<Value> parts;
  bool is_parameter = false;   // rebuilt through _rebuild_parameter
  bool requires_grad = false;  // only an nn.Parameter keeps it (torch.save drops it otherwise)

  bool is_coo() const noexcept { return layout == "torch.sparse_coo"; }
  const TensorData& values() const { return parts.back().as_tensor(); }
};

// Whether `layout` is one of the five sparse layouts' names.
bool is_sparse_layout(std::string_view layout) noexcept;

// torch's invariants of a sparse tensor, those torch._validate_sparse_coo_tensor_args
// and torch._validate_sparse_compressed_tensor_args check (which torch.load applies
// only when torch.sparse.check_sparse_tensor_invariants is on; holdpoint always
// does): part count and kinds, index dtypes and ranks, the agreement of size,
// indices and values, every index inside the size, compressed indices that
// start at 0, end at nnz and never decrease or step past the plain dimension,
// plain indices sorted and distinct within each compressed slice, and, for a
// COO tensor marked coalesced, indices in strictly increasing order. Reads the
// index tensors' elements; where their storage has no bytes (a scan's
// Storage::absent), checks only the rest. Throws Error with one sparse_* code per failure
// (pickle_call_args_invalid for a wrong layout or parts that are not tensors).
void validate_sparse_tensor(const SparseTensor& sparse);

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
// sizes, requires_grad, conj/neg bits and logical elements (bitwise), meta tensors with
// equal dtype, sizes, strides, requires_grad and parameter-ness. Strides, offsets and
// storage sharing of other tensors are not compared; use same_storage_layout for that.
bool equal_content(const Value& a, const Value& b);

// Explains the first difference equal_content finds ("['model']['w']: sizes [2] vs [3]"),
// or returns an empty string when the values are equal.
std::string describe_difference(const Value& a, const Value& b);

}  // namespace holdpoint
