// The restricted pickle VM. See pickle_reader.h for the contract and
// docs/format.md ("Pickle allowlist") / the format reference §7.3 for the rules.
//
// Shape of the machine: a stack of Items split into frames by MARK (as in
// CPython, an opcode sees only the items above the newest MARK), a memo of
// Items, and a table of storages by key. An Item is a scalar, a string, a
// tuple, a container or tensor, or one of the things only the VM handles: an
// allowlisted global or a storage from BINPERSID. Every Item carries the size
// of its subtree counted through shared references, its container nesting
// depth, and whether a mutable container is reachable from it; the first
// bounds BINGET expansion, the last forbids aliasing.
//
// Items are plain words, so that pushing, memoizing and BINGET cost a copy of
// 24 bytes. Scalars are held inline; everything else by position in arenas the
// machine owns (compact_arenas drops the tail that nothing refers to any more;
// the memo keeps only the entries a later BINGET names, fetched_memo_indices).
// Strings and bytes are views of the pickle and tuples are runs of Items;
// either becomes a Value only where the result needs
// one (a list element, a dict value, the root), and then once, so that every
// reference to one opcode's object shares one Value node as before. Most never
// do: persistent-id fields, dict keys, REDUCE arguments and tensor sizes are
// read straight from the Items, which is what keeps a state dict from costing
// a dozen allocations and frees per tensor. Likewise a list, dict or
// OrderedDict becomes a Value only when something is added to it or it is
// handed out (torch.save writes an empty OrderedDict of backward hooks for
// every tensor). Doing that in place on the stack is sound because a mutable
// container is never shared: memo_get refuses one, so the copy a memo slot
// keeps is only ever named in a message.
#include "format/pickle/pickle_reader.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <iterator>
#include <unordered_map>
#include <unordered_set>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "base/keyed_hash.h"
#include "format/pickle/pickle_opcodes.h"
#include "format/value/half_float.h"

namespace holdpoint::format {
namespace {

namespace op = pickle_op;
using detail::checked_add;
using detail::checked_mul;
using holdpoint::value::narrow_float_to_double;

enum class GlobalKind : std::uint8_t {
  ordered_dict,
  counter,  // collections.Counter: read as the dict of its counts
  rebuild_tensor_v2,
  rebuild_tensor_v3,
  rebuild_parameter,
  rebuild_meta_tensor,   // _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)
  rebuild_sparse_tensor, // _rebuild_sparse_tensor(layout, (parts..., size[, is_coalesced]))
  codecs_encode,
  empty_bytes,           // bytes(): how pickle protocol 2 writes b'' (a NumPy empty array's data)
  storage_type,          // torch.<X>Storage: a persistent-id tag, never called
  untyped_storage_type,  // torch.UntypedStorage: likewise
  dtype,                 // torch.<dtype>: only as _rebuild_tensor_v3's dtype
  // NumPy, decoded as data (docs/format.md, "NumPy values"); numpy._core.* and
  // numpy.core.* alike, as NumPy 2 and 1 write them:
  numpy_reconstruct,     // multiarray._reconstruct(ndarray, (0,), b'b'), then BUILD
  numpy_ndarray,         // numpy.ndarray: only as _reconstruct's first argument
  numpy_dtype,           // numpy.dtype('f8', False, True), then BUILD
  numpy_scalar,          // multiarray.scalar(dtype, bytes)
  // torch.distributed.checkpoint's .metadata, decoded as data (docs/format.md,
  // "Record objects"):
  record_class,          // a dataclass of kRecordClasses: NEWOBJ, then BUILD
  torch_size,            // torch.Size((ints...)): a tuple of ints
  torch_get_layout,      // torch.serialization._get_layout('torch.strided'): the name
  memory_format_code,    // DCP's _MEM_FORMAT_ENCODING(n): the memory format's name
  posix_path,            // pathlib.PosixPath(parts...): the joined path, a str
  // Python's and torch's own value types (docs/format.md §5.3):
  builtin_complex,       // complex(real, imag)
  builtin_set,           // set(), or set(list of the items)
  builtin_bytearray,     // bytearray(), or bytearray(bytes)
  torch_device,          // torch.device('cuda', 1) or torch.device('cpu')
};

// The dataclasses read as record objects: a dict of their fields under
// "__class__" = "module.Name". Only their own fields may be set, once, by one
// BUILD: a dict of fields (any subset: dataclass defaults stand for the rest)
// or, for a class that pickles a tuple (TensorProperties), exactly one value
// per field.
struct RecordClass {
  std::string_view module;
  std::string_view name;
  std::array<std::string_view, 5> fields;
  std::uint8_t field_count;
  bool tuple_state;
};
constexpr std::string_view kDcpMetadata = "torch.distributed.checkpoint.metadata";
constexpr RecordClass kRecordClasses[] = {
    {kDcpMetadata, "Metadata", {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"}, 5,
     false},
    {kDcpMetadata, "TensorStorageMetadata", {"properties", "size", "chunks"}, 3, false},
    {kDcpMetadata, "BytesStorageMetadata", {}, 0, false},
    {kDcpMetadata, "ChunkStorageMetadata", {"offsets", "sizes"}, 2, false},
    {kDcpMetadata, "TensorProperties", {"dtype", "layout", "requires_grad", "memory_format", "pin_memory"}, 5, true},
    {kDcpMetadata, "MetadataIndex", {"fqn", "offset", "index"}, 3, false},
    {kDcpMetadata, "StorageMeta", {"checkpoint_id", "save_id", "load_id", "modules"}, 4, false},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo",
     {"relative_path", "offset", "length", "transform_descriptors"}, 4, false},
};
constexpr std::string_view kRecordClassKey = "__class__";

std::string record_class_name(std::uint8_t record) {
  const RecordClass& cls = kRecordClasses[record];
  return std::string(cls.module) + "." + std::string(cls.name);
}

// The memory formats _MEM_FORMAT_ENCODING numbers (0, 1, 2), as torch
// writes them.
constexpr std::string_view kMemoryFormatNames[] = {"torch.contiguous_format", "torch.channels_last",
                                                   "torch.preserve_format"};

// Trivial (no member initializers) so that it can share a union in Item.
struct GlobalRef {
  GlobalKind kind;
  DType dtype;         // storage_type and dtype only
  std::uint8_t record;  // record_class only: into kRecordClasses
};

// What a BINPERSID declared and resolved. The key views the pickle, or, once
// the VM has left its bytes behind (Machine::spend), the machine's copy; a
// key found by its number has none then (Machine::storage_key). 32 bytes: a
// state dict may declare hundreds of thousands. The element count is the
// storage's size over the dtype's.
struct StorageRef {
  const char* key_data;
  std::shared_ptr<const Storage> storage;
  std::uint32_t key_size;  // keys are at most 64 bytes (checked before)
  DType dtype;
  bool untyped;

  std::string_view key() const { return {key_data, key_size}; }
  void set_key(std::string_view key) {
    key_data = key.data();
    key_size = static_cast<std::uint32_t>(key.size());
  }
};
static_assert(sizeof(StorageRef) <= 32);

enum class ItemKind : std::uint8_t {
  none,
  boolean,
  integer,
  floating,
  text,             // a str: texts_[index]
  bytes,            // texts_[index]
  tuple,            // tuples_[index]
  empty_container,  // a list, dict or OrderedDict (`container` says which) nothing was added to
  value,            // values_[index]: a list, dict, OrderedDict or tensor
  global,
  storage,          // storage_refs_[index]
  numpy_dtype,      // numpy_dtypes_[index]
  numpy_array,      // an ndarray before its BUILD: numpy_arrays_[index]
};

struct Item {
  union {
    std::int64_t integer = 0;
    double floating;
    bool boolean;
    std::size_t index;
    GlobalRef global;
    ValueKind container;
  };
  std::uint64_t nodes = 1;     // subtree size, shared references counted in full
  std::uint32_t depth = 0;     // containers nested in this item; 0 for scalars
  ItemKind kind = ItemKind::none;
  bool holds_mutable = false;  // a record or NumPy array still awaiting its BUILD is reachable
  bool vm_only = false;        // a global, a storage or a tuple holding one: never a Value
  bool torch_size = false;     // a tuple of ints that torch.Size made: a ValueKind::size
};
static_assert(std::is_trivially_copyable_v<Item> && sizeof(Item) == 24);

constexpr std::size_t kNoValue = std::numeric_limits<std::size_t>::max();

// A str or bytes operand: a view of the pickle (or, for bytes made by
// _codecs.encode, of the Value that owns them; or of the machine's copy once
// the pickle's bytes are spent) and the Value made of it, once one was
// needed.
struct Text {
  std::string_view text;
  std::size_t owned = kNoValue;  // into values_
};

// A tuple: tuple_elements_[first, first + count).
struct Tuple {
  std::size_t first;
  std::size_t count;
  std::size_t owned = kNoValue;  // into values_
};

Item integer_item(std::int64_t value) {
  Item item;
  item.kind = ItemKind::integer;
  item.integer = value;
  return item;
}

Item floating_item(double value) {
  Item item;
  item.kind = ItemKind::floating;
  item.floating = value;
  return item;
}

Item boolean_item(bool value) {
  Item item;
  item.kind = ItemKind::boolean;
  item.boolean = value;
  return item;
}

Item global_item(GlobalRef global) {
  Item item;
  item.kind = ItemKind::global;
  item.global = global;
  // A dtype is also a value (the str "torch.float32"), as torch's weights-only
  // loader admits it; every other global is only a callable or a tag.
  item.vm_only = global.kind != GlobalKind::dtype;
  return item;
}

Item empty_container_item(ValueKind container) {
  Item item;
  item.kind = ItemKind::empty_container;
  item.container = container;
  item.depth = 1;
  return item;
}

Value empty_container(ValueKind kind) {
  switch (kind) {
    case ValueKind::list: return Value::list();
    case ValueKind::dict: return Value::dict();
    default: return Value::ordered_dict();
  }
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return checked_add(a, b).value_or(std::numeric_limits<std::uint64_t>::max());
}

std::string global_name(const GlobalRef& global) {
  switch (global.kind) {
    case GlobalKind::ordered_dict: return "collections.OrderedDict";
    case GlobalKind::counter: return "collections.Counter";
    case GlobalKind::rebuild_tensor_v2: return "torch._utils._rebuild_tensor_v2";
    case GlobalKind::rebuild_tensor_v3: return "torch._utils._rebuild_tensor_v3";
    case GlobalKind::rebuild_parameter: return "torch._utils._rebuild_parameter";
    case GlobalKind::rebuild_meta_tensor: return "torch._utils._rebuild_meta_tensor_no_storage";
    case GlobalKind::rebuild_sparse_tensor: return "torch._utils._rebuild_sparse_tensor";
    case GlobalKind::codecs_encode: return "_codecs.encode";
    case GlobalKind::empty_bytes: return "builtins.bytes";
    case GlobalKind::storage_type: return "torch." + std::string(*dtype_storage_class(global.dtype));
    case GlobalKind::untyped_storage_type: return "torch.UntypedStorage";
    case GlobalKind::dtype: return "torch." + std::string(dtype_name(global.dtype));
    case GlobalKind::numpy_reconstruct: return "numpy._core.multiarray._reconstruct";
    case GlobalKind::numpy_ndarray: return "numpy.ndarray";
    case GlobalKind::numpy_dtype: return "numpy.dtype";
    case GlobalKind::numpy_scalar: return "numpy._core.multiarray.scalar";
    case GlobalKind::record_class: return record_class_name(global.record);
    case GlobalKind::torch_size: return "torch.Size";
    case GlobalKind::torch_get_layout: return "torch.serialization._get_layout";
    case GlobalKind::memory_format_code: return std::string(kDcpMetadata) + "._MEM_FORMAT_ENCODING";
    case GlobalKind::posix_path: return "pathlib.PosixPath";
    case GlobalKind::builtin_complex: return "builtins.complex";
    case GlobalKind::builtin_set: return "builtins.set";
    case GlobalKind::builtin_bytearray: return "builtins.bytearray";
    case GlobalKind::torch_device: return "torch.device";
  }
  return "unknown global";
}

// Names, keys and locations from the file, for messages: at most 64 bytes,
// anything outside printable ASCII as \xNN.
std::string printable(std::string_view text) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : text.substr(0, 64)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F && byte != '\\') {
      out.push_back(c);
    } else {
      out += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  if (text.size() > 64) out += "...";
  return out;
}

bool is_identifier_path(std::string_view text) {
  if (text.empty() || text.size() > op::kMaxGlobalPartBytes) return false;
  bool segment_start = true;
  for (char c : text) {
    const bool letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (c == '.') {
      if (segment_start) return false;
      segment_start = true;
    } else if (letter || (digit && !segment_start)) {
      segment_start = false;
    } else {
      return false;
    }
  }
  return !segment_start;
}

bool is_canonical_decimal(std::string_view text, std::size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return false;
  if (text.size() > 1 && text[0] == '0') return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Legacy streams key storages by str(storage._cdata) (a pointer printed in
// decimal); anything path-like is refused even there.
bool is_legacy_storage_key(std::string_view text) {
  if (text.empty() || text.size() > 64) return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  });
}

bool is_supported_location(std::string_view location) {
  if (location == "cpu" || location == "cuda" || location == "mps") return true;
  constexpr std::string_view kCuda = "cuda:";
  return location.substr(0, kCuda.size()) == kCuda && is_canonical_decimal(location.substr(kCuda.size()), 5);
}

// Storage classes torch has but that hold no plain dtype (quantized tensors).
bool is_quantized_storage_class(std::string_view name) {
  return name == "QUInt8Storage" || name == "QInt8Storage" || name == "QInt32Storage" || name == "QUInt4x2Storage" ||
         name == "QUInt2x4Storage";
}

// The memo indices that BINGET or LONG_BINGET anywhere before the first STOP
// name, sorted and unique, found by walking the opcodes without interpreting
// them; nullopt where the walk cannot go on (an opcode off the allowlist, a
// length past the end), and the machine then keeps every memo entry. torch.save
// memoizes about eight objects per tensor and fetches almost none of them again
// (the storage tag, 'storage', 'cpu' and the rebuild globals), so the machine
// keeps only the entries named here, and with them the arenas stop holding
// every tuple and string of the file. The walk decodes opcode boundaries as the
// machine does; should they ever differ, a fetch of an entry that was not kept
// is caught and the pickle is read again keeping every entry (MemoNotKept).
// An index at or past `max_entries` can never have been stored, so it is not
// collected (the machine refuses its fetch); the list is deduplicated as it
// grows, so it stays within twice the indices that can exist.
std::optional<std::vector<std::uint64_t>> fetched_memo_indices(const std::byte* data, std::size_t size,
                                                               std::uint64_t max_entries) {
  std::vector<std::uint64_t> fetched;
  // torch.save fetches the same few entries (the rebuild global, 'storage',
  // the storage class, the location) for every tensor: a small direct-mapped
  // table of indices already collected keeps those repeats out of the list,
  // which otherwise grows by four per tensor and is sorted again and again.
  struct {
    std::array<std::uint64_t, 256> slots;
    bool seen(std::uint64_t index) {
      std::uint64_t& slot = slots[index & 255];
      if (slot == index) return true;
      slot = index;
      return false;
    }
  } recently_fetched;
  recently_fetched.slots.fill(UINT64_MAX);
  std::size_t deduplicate_at = std::size_t{1} << 16;
  const auto deduplicate = [&fetched] {
    std::sort(fetched.begin(), fetched.end());
    fetched.erase(std::unique(fetched.begin(), fetched.end()), fetched.end());
  };
  std::size_t pos = 0;
  const auto le = [&](std::size_t n) -> std::optional<std::uint64_t> {
    if (n > size - pos) return std::nullopt;
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < n; ++i) value |= std::uint64_t{std::to_integer<std::uint8_t>(data[pos + i])} << (8 * i);
    pos += n;
    return value;
  };
  const auto skip = [&](std::optional<std::uint64_t> n) {
    if (!n || *n > size - pos) return false;
    pos += static_cast<std::size_t>(*n);
    return true;
  };
  const auto skip_line = [&] {
    const void* newline = std::memchr(data + pos, '\n', size - pos);
    if (!newline) return false;
    pos = static_cast<std::size_t>(static_cast<const std::byte*>(newline) - data) + 1;
    return true;
  };
  while (pos < size) {
    const std::uint8_t code = std::to_integer<std::uint8_t>(data[pos++]);
    bool ok = true;
    switch (code) {
      case op::STOP:
        deduplicate();
        return fetched;
      case op::MARK: case op::EMPTY_DICT: case op::EMPTY_LIST: case op::EMPTY_SET: case op::EMPTY_TUPLE: case op::TUPLE:
      case op::TUPLE1: case op::TUPLE2: case op::TUPLE3: case op::SETITEM: case op::SETITEMS: case op::APPEND:
      case op::APPENDS: case op::NONE: case op::NEWTRUE: case op::NEWFALSE: case op::MEMOIZE:
      case op::STACK_GLOBAL: case op::REDUCE: case op::BUILD: case op::BINPERSID: case op::NEWOBJ:
        break;
      case op::PROTO: case op::BININT1: case op::BINPUT: ok = skip(1); break;
      case op::BININT2: ok = skip(2); break;
      case op::BININT: case op::LONG_BINPUT: ok = skip(4); break;
      case op::FRAME: case op::BINFLOAT: ok = skip(8); break;
      case op::LONG1: case op::SHORT_BINUNICODE: case op::SHORT_BINSTRING: case op::SHORT_BINBYTES:
        ok = skip(le(1));
        break;
      case op::BINUNICODE: case op::BINSTRING: case op::BINBYTES: ok = skip(le(4)); break;
      case op::BINUNICODE8: ok = skip(le(8)); break;
      case op::INT: case op::LONG: ok = skip_line(); break;
      case op::GLOBAL: ok = skip_line() && skip_line(); break;
      case op::BINGET: case op::LONG_BINGET: {
        const auto index = le(code == op::BINGET ? 1 : 4);
        ok = index.has_value();
        if (ok && *index < max_entries && !recently_fetched.seen(*index)) {
          fetched.push_back(*index);
          if (fetched.size() >= deduplicate_at) {
            deduplicate();
            deduplicate_at = std::max(deduplicate_at, 2 * fetched.size());
          }
        }
        break;
      }
      default: ok = false;
    }
    if (!ok) return std::nullopt;
  }
  return std::nullopt;
}

// Thrown when a fetch names a memo entry the walk above did not foresee.
struct MemoNotKept {};

// Copies of the strings the machine still views when it leaves the pickle's
// bytes behind (PickleOptions::on_spent). Chunks never move, so the views
// stay valid for the machine's life.
class TextCopies {
 public:
  std::string_view keep(std::string_view text) {
    if (text.empty()) return {};
    if (text.size() > chunk_size_ - used_) {
      chunk_size_ = std::max(kChunkBytes, text.size());
      chunks_.push_back(std::make_unique<char[]>(chunk_size_));
      used_ = 0;
    }
    char* out = chunks_.back().get() + used_;
    std::memcpy(out, text.data(), text.size());
    used_ += text.size();
    return {out, text.size()};
  }

 private:
  static constexpr std::size_t kChunkBytes = std::size_t{64} << 10;
  std::vector<std::unique_ptr<char[]>> chunks_;
  std::size_t chunk_size_ = 0;
  std::size_t used_ = 0;
};

// 128-bit keyed fingerprints (two SipHash-2-4 under secret keys), in an
// open-addressing table at most half full: 32 bytes per entry. Two different
// inputs share a fingerprint with probability about 2^-128 per pair, and a
// file cannot choose them without the keys.
class FingerprintSet {
 public:
  using Fingerprint = std::array<std::uint64_t, 2>;

  static Fingerprint of(std::string_view bytes) {
    static const detail::SipKey second{detail::process_sip_key().k1 ^ 0x9e3779b97f4a7c15u,
                                       detail::process_sip_key().k0 ^ 0xc2b2ae3d27d4eb4fu};
    Fingerprint f{detail::keyed_hash(bytes), detail::siphash24(second, bytes.data(), bytes.size())};
    if (f == Fingerprint{}) f[0] = 1;  // {0, 0} marks a free slot
    return f;
  }

  bool contains(const Fingerprint& f) const {
    if (slots_.empty()) return false;
    for (std::size_t slot = f[0] & (slots_.size() - 1);; slot = (slot + 1) & (slots_.size() - 1)) {
      if (slots_[slot] == f) return true;
      if (slots_[slot] == Fingerprint{}) return false;
    }
  }

  // False (and nothing added) when `f` is there already.
  bool insert(const Fingerprint& f) {
    if (contains(f)) return false;
    if (2 * (size_ + 1) > slots_.size()) grow();
    place(f);
    ++size_;
    return true;
  }

 private:
  void place(const Fingerprint& f) {
    std::size_t slot = f[0] & (slots_.size() - 1);
    while (slots_[slot] != Fingerprint{}) slot = (slot + 1) & (slots_.size() - 1);
    slots_[slot] = f;
  }
  void grow() {
    std::vector<Fingerprint> old(std::max<std::size_t>(64, 2 * slots_.size()));
    old.swap(slots_);
    for (const Fingerprint& f : old) {
      if (f != Fingerprint{}) place(f);
    }
  }

  std::vector<Fingerprint> slots_;
  std::size_t size_ = 0;
};

class Machine {
 public:
  Machine(std::span<const std::byte> pickle, StorageResolver& storages, const Limits& limits,
          const PickleOptions& options, bool allow_trailing_bytes, bool keep_fetched_memo_only)
      : data_(pickle.data()),
        size_(pickle.size()),
        storages_(storages),
        limits_(limits),
        options_(options),
        allow_trailing_bytes_(allow_trailing_bytes),
        keep_fetched_only_(keep_fetched_memo_only) {
    // Legacy streams hand over the rest of the file, storages included, so the
    // size bound applies to how far the pickle reaches, not to the span.
    window_end_ = allow_trailing_bytes
                      ? static_cast<std::size_t>(std::min<std::uint64_t>(size_, limits.max_pickle_bytes))
                      : size_;
  }

  PickleResult run();

 private:
  template <typename... Parts>
  [[noreturn]] void error(ErrorCode code, Parts&&... parts) const {
    detail::fail(code, "pickle offset ", op_offset_, ": ", op::name(op_), ": ", std::forward<Parts>(parts)...);
  }

  void reserve_for_dense_state_dict();

  // ---- input ----
  [[noreturn]] void out_of_input(std::size_t wanted) const;
  // Every read goes through take: it stays inside the current FRAME (CPython
  // refuses an opcode that straddles a frame end) and inside the window. The
  // common case, no frame and bytes to spare, is inline.
  const std::byte* take(std::size_t n) {
    if (in_frame_ || n > window_end_ - pos_) return take_checked(n);
    const std::byte* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  const std::byte* take_checked(std::size_t n);
  std::uint8_t take_u8() { return std::to_integer<std::uint8_t>(*take(1)); }
  std::uint64_t take_le(std::size_t n) {
    const std::byte* p = take(n);
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < n; ++i) value |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
    return value;
  }
  std::string_view take_line(std::size_t max_bytes, ErrorCode malformed, bool unterminated_is_malformed,
                             std::string_view what);
  Item take_string(std::uint64_t length, bool ascii_only);
  Item take_bytes(std::uint64_t length);
  void begin_frame();

  // ---- items ----
  Item text_item(ItemKind kind, std::string_view text);
  Item value_item(Value value);
  std::optional<ValueKind> value_kind(const Item& item) const;
  std::string describe(const Item& item) const;
  std::string_view text(const Item& item) const { return texts_[item.index].text; }
  const Item& element(const Item& tuple, std::size_t i) const {
    return tuple_elements_[tuples_[tuple.index].first + i];
  }
  std::size_t tuple_size(const Item& tuple) const { return tuples_[tuple.index].count; }
  const StorageRef& storage(const Item& item) const { return storage_refs_[item.index]; }
  Value take_value(const Item& item, std::string_view role);
  // take_value for what a container takes in (PickleOptions::drop_tensors).
  Value take_element(const Item& item, std::string_view role) {
    Value value = take_value(item, role);
    if (options_.drop_tensors && (value.is_tensor() || value.is_sparse_tensor())) return Value::none();
    return value;
  }
  // Whether a container drops `item` rather than take it (drop_tensors): a
  // tensor, sparse ones included (a meta tensor holds no data, and stays).
  bool drops(const Item& item) const {
    if (!options_.drop_tensors) return false;
    const auto kind = value_kind(item);
    return kind == ValueKind::tensor || kind == ValueKind::sparse_tensor;
  }
  Value& make_mutable(Item& container);
  bool is_empty_dict(const Item& item) const;

  // ---- stack ----
  std::size_t frame_base() const { return marks_.empty() ? 0 : marks_.back(); }
  void require(std::size_t n) const;
  Item pop();
  // Inline: most opcodes end here.
  void push(const Item& item) {
    if (stack_.size() >= limits_.max_stack_items) stack_limit_exceeded();
    stack_.push_back(item);
  }
  [[noreturn]] void stack_limit_exceeded() const;
  std::size_t pop_mark();
  void count_elements(std::uint64_t n);
  void add_child(Item& parent, const Item& child) const;
  // Shared containers (docs/format.md §5.6). A list or dict the memo hands
  // out is frozen: changing it afterwards is pickle_cycle, since pickle
  // writes a container whole before it refers to it again unless the
  // container holds itself. That keeps every tree acyclic, and keeps the
  // size a fetch counts (the container's size at the fetch) its final size.
  struct ContainerState {
    std::uint64_t nodes = 0;
    std::uint32_t depth = 0;
    bool fetched = false;
  };
  // A list or dict of values_ that is no record (records are never shared).
  bool is_plain_container(const Item& item) const {
    if (item.kind != ItemKind::value) return false;
    const Value& value = values_[item.index];
    return (value.is_list() || value.is_dict()) && !records_.contains(value.node_identity());
  }
  ContainerState& container_state(std::size_t index) {
    if (index >= containers_.size()) containers_.resize(index + 1);
    return containers_[index];
  }
  // Before `target` takes children: refused when the memo handed it out.
  void check_not_shared(const Item& target) const {
    if (target.kind == ItemKind::value && target.index < containers_.size() && containers_[target.index].fetched) {
      error(ErrorCode::pickle_cycle, "a ", describe(target),
            " is changed after the memo handed it out; pickle writes a container whole before it refers to it "
            "again unless the container holds itself, and holdpoint refuses cycles");
    }
  }
  // After `target` took children: its size, for a later fetch.
  void note_size(const Item& target) {
    if (target.kind != ItemKind::value) return;
    ContainerState& state = container_state(target.index);
    state.nodes = target.nodes;
    state.depth = target.depth;
  }

  // ---- opcodes ----
  void do_proto();
  void do_int_line();
  void do_long_line();
  void do_long1();
  void do_tuple(std::size_t count_from_stack, bool from_mark);
  void do_append(bool from_mark);
  void do_setitem(bool from_mark);
  void set_item(Item& target, const Item& key, const Item& value);
  FingerprintSet::Fingerprint dropped_key_fingerprint(const Dict& dict, const Item& key,
                                                      const std::optional<DictKey>& object_key);
  // Whether `dict` holds a tensor the read dropped (PickleOptions::drop_tensors):
  // what checks a dict's values asks, so that a dropped tensor fails them as
  // the tensor would.
  bool holds_dropped_tensor(const Dict& dict) const { return dicts_with_dropped_keys_.contains(&dict); }
  // With drop_tensors: whether `value`, a list or tuple (or one nested in
  // tuples of it), had a tensor element that became None.
  bool holds_dropped_tensor(const Value& value) const;
  // A dict key Python would take, judged the same whether tensors are kept or
  // dropped (a tuple that held a tensor is no key in either read).
  bool usable_dict_key(const Value& key) const { return valid_dict_key(key) && !holds_dropped_tensor(key); }
  void memo_put(std::uint64_t index);
  void memo_get(std::uint64_t index);
  // The kept memo slot of `index` (keep_fetched_only_), or nullptr when the
  // walk found no fetch of it.
  Item* kept_slot(std::uint64_t index) {
    const auto found = std::lower_bound(fetched_.begin(), fetched_.end(), index);
    return found != fetched_.end() && *found == index ? &kept_[static_cast<std::size_t>(found - fetched_.begin())]
                                                      : nullptr;
  }
  void compact_arenas();
  void maybe_compact() {
    if (keep_fetched_only_ && texts_.size() + tuples_.size() + tuple_elements_.size() >= compact_at_) {
      compact_arenas();
    }
  }
  void do_global();
  void do_stack_global();
  GlobalRef resolve_global(std::string_view module, std::string_view name) const;
  void do_reduce();
  void do_build();
  void do_newobj();
  void do_binpersid();
  Item storage_item(GlobalRef type, std::string_view key_text, std::string_view location, std::int64_t numel);
  bool try_tensor_fast_path();
  void spend();
  std::size_t spend_every() const { return std::max<std::size_t>(options_.spend_every_bytes, 1); }
  std::size_t find_storage(std::string_view key) const;
  void index_storage(std::size_t position);
  std::optional<std::uint64_t> storage_number(std::string_view key) const;
  bool found_by_number(std::size_t position) const;
  std::string storage_key(std::size_t position) const;
  std::string storage_key(const StorageRef& ref) const {
    return storage_key(static_cast<std::size_t>(&ref - storage_refs_.data()));
  }
  void place_hashed_storage(std::size_t position);

  // ---- callables ----
  Item reduce_ordered_dict(const Item& args);
  Item reduce_counter(const Item& args);
  Item reduce_codecs_encode(const Item& args);
  Item reduce_empty_bytes(const Item& args);
  Item reduce_tensor(const Item& args, bool v3);
  Item tensor_item(const StorageRef& storage_ref, DType dtype, std::int64_t storage_offset, bool requires_grad,
                   Dims sizes, Dims strides, bool conjugate = false, bool negative = false);
  void read_tensor_metadata(const Item& metadata, DType dtype, bool& conjugate, bool& negative) const;
  Item reduce_parameter(const Item& args);
  Item reduce_meta_tensor(const Item& args);
  Item reduce_sparse_tensor(const Item& args);
  Item reduce_numpy_dtype(const Item& args);
  Item reduce_numpy_reconstruct(const Item& args);
  Item reduce_numpy_scalar(const Item& args);
  Item reduce_torch_size(const Item& args);
  Item reduce_complex(const Item& args);
  Item reduce_set(const Item& args);
  Item reduce_bytearray(const Item& args);
  Item reduce_device(const Item& args);
  Item reduce_get_layout(const Item& args);
  Item reduce_memory_format_code(const Item& args);
  Item reduce_posix_path(const Item& args);
  // Record objects (kRecordClasses): the dicts NEWOBJ made, by node, with
  // their class and whether BUILD has set their fields; and the lists that
  // stand for dicts keyed by records (a list of (key, value) tuples).
  struct Record {
    std::uint8_t cls;
    bool built;
  };
  Record* record_of(const Item& item);
  bool is_record_keyed(const Item& item) const {
    return item.kind == ItemKind::value && record_keyed_.contains(values_[item.index].node_identity());
  }
  void build_record(Item& target, Record& record, const Item& state);
  void set_record_keyed_item(Item& target, const Item& key, const Item& value);
  void build_numpy_dtype(const Item& target, const Item& state);
  Item build_numpy_array(const Item& state);
  DType numpy_element_type(const Item& dtype, std::string_view what) const;
  void check_hooks(const Item& hooks, std::string_view what) const;
  Dims int_tuple(const Item& item, std::string_view what) const;
  void validate_metadata(const Value& state) const;

  const std::byte* data_;
  std::size_t size_;
  std::size_t window_end_ = 0;
  std::size_t pos_ = 0;
  std::size_t frame_end_ = 0;
  bool in_frame_ = false;
  std::size_t op_offset_ = 0;
  std::uint8_t op_ = 0;

  StorageResolver& storages_;
  const Limits& limits_;
  const PickleOptions& options_;
  bool allow_trailing_bytes_;

  std::vector<Item> stack_;
  std::vector<std::size_t> marks_;
  // The memo: every entry in memo_, or, when keep_fetched_only_, only the
  // entries whose index is in fetched_ (kept_[i] for fetched_[i]); memo_size_
  // counts every entry stored either way.
  bool keep_fetched_only_;
  std::vector<Item> memo_;
  std::vector<std::uint64_t> fetched_;
  std::vector<Item> kept_;
  std::uint64_t memo_size_ = 0;
  // When the arenas reach this many entries, compact_arenas drops the ones
  // nothing refers to any more (only when keep_fetched_only_).
  std::size_t compact_at_ = 0;

  // The arenas Items point into. compact_arenas cuts off the end of texts_,
  // tuples_, tuple_elements_ and values_ that no stack item, kept memo entry
  // or live tuple refers to; nothing else is ever removed.
  std::vector<Text> texts_;
  std::vector<Tuple> tuples_;
  std::vector<Item> tuple_elements_;
  std::vector<Value> values_;
  std::vector<ContainerState> containers_;  // by values_ index (ContainerState)
  std::vector<StorageRef> storage_refs_;
  // NumPy dtypes (BUILD sets the byte order of one, which every reference to
  // it sees, as in Python) and the ndarrays awaiting their BUILD.
  struct NumpyDType {
    std::optional<DType> dtype;  // nullopt: not a plain number type (refused where used)
    std::string code;            // as given, for messages: "f8", "O8", "U3"...
    char byte_order = '=';
  };
  std::vector<NumpyDType> numpy_dtypes_;
  std::vector<bool> numpy_arrays_built_;
  // (array, memo index) of each NumPy array memoized before its BUILD.
  std::vector<std::pair<std::size_t, std::uint64_t>> unbuilt_arrays_in_memo_;
  // Storages by key, as position in storage_refs_ + 1 (0: none). Zip archives
  // number storages 0, 1, 2, ... in order, so a canonical key below twice the
  // storages seen (plus 1024) goes in storages_by_number_, found without
  // hashing or a random access; any other key (or any storage past the
  // 2^32 - 1st) in the open-addressing table storage_slots_.
  std::vector<std::uint32_t> storages_by_number_;
  std::vector<std::size_t> storage_slots_;
  std::size_t hashed_storages_ = 0;

  // PickleOptions::on_spent: the bytes before spent_ are given up, and every
  // view the machine held into them now views text_copies_ instead (the keys
  // of storage_refs_ before keys_copied_ among them).
  std::size_t spent_ = 0;
  std::size_t next_spend_at_ = std::numeric_limits<std::size_t>::max();
  std::size_t keys_copied_ = 0;
  TextCopies text_copies_;

  // PickleOptions::drop_tensors: a dict takes no entry for a dropped tensor;
  // the fingerprint of (dict, key) stands in for it, so that the key used
  // again is still pickle_duplicate_key. The dicts stay referenced until the
  // end, so that no later dict reuses an address a fingerprint names.
  FingerprintSet dropped_keys_;
  std::unordered_map<const Dict*, Value> dicts_with_dropped_keys_;
  // Lists and tuples that had a tensor element dropped, kept alive so that
  // their addresses name them (drop_tensors only).
  std::unordered_map<const void*, Value> sequences_with_dropped_tensors_;
  std::string fingerprint_input_;

  std::unordered_map<const void*, Record> records_;
  std::unordered_set<const void*> record_keyed_;

  std::uint64_t opcode_count_ = 0;
  std::uint64_t expanded_nodes_ = 0;
  std::uint64_t container_elements_ = 0;
  std::uint64_t fast_path_tensors_ = 0;
  std::uint64_t tensor_count_ = 0;
  int protocol_ = 0;
  bool uses_binfloat_ = false;
};

// Reserves the memo and arenas for a state dict whose names are as short as
// they come (torch.save spends about 100 bytes of opcodes per tensor on 8 memo
// entries, 13 tuple elements, 4 tuples, 2 strings and a storage), so that they
// do not grow by doubling, which copies them and touches twice the memory,
// each page a fresh fault. Pages never used are never touched. When only
// fetched memo entries are kept, compact_arenas keeps the memo and the tuple
// and string arenas small, so only the values and storages are reserved. Called only
// for a span that is exactly the pickle and within max_pickle_bytes (a legacy
// stream's span runs on into its storages). A refused reservation costs only
// speed, so it is not an error.
void Machine::reserve_for_dense_state_dict() {
  try {
    if (!keep_fetched_only_) {  // otherwise compact_arenas keeps them small
      memo_.reserve(size_ / 8);
      tuple_elements_.reserve(size_ / 5);
      tuples_.reserve(size_ / 16);
      texts_.reserve(size_ / 32);
    }
    values_.reserve(size_ / 64);
    // A storage can take fewer than 64 bytes of pickle (holdpoint's writer
    // spends about 64 on a whole tensor), and a table that doubles near the
    // end of a large pickle holds both copies at the load's peak; pages
    // reserved and never used cost no memory.
    storage_refs_.reserve(size_ / 32);
    storages_by_number_.reserve(size_ / 32);
  } catch (const std::bad_alloc&) {
  }
}

// ---- input ----------------------------------------------------------------------------

void Machine::out_of_input(std::size_t wanted) const {
  if (window_end_ < size_) {
    error(ErrorCode::pickle_too_large, "the pickle continues past ", window_end_, " bytes (max_pickle_bytes ",
          limits_.max_pickle_bytes, ")");
  }
  error(ErrorCode::pickle_truncated, "needs ", wanted, " more bytes, ", window_end_ - pos_, " left");
}

const std::byte* Machine::take_checked(std::size_t n) {
  const std::size_t limit = in_frame_ ? frame_end_ : window_end_;
  if (n > limit - pos_) {
    if (in_frame_) {
      error(ErrorCode::pickle_frame_invalid, "needs ", n, " bytes but the frame ends at offset ", frame_end_);
    }
    out_of_input(n);
  }
  const std::byte* p = data_ + pos_;
  pos_ += n;
  if (in_frame_ && pos_ == frame_end_) in_frame_ = false;
  return p;
}

// A newline-terminated operand of at most `max_bytes`. A longer line is
// `malformed`; so is one the data ends inside when `unterminated_is_malformed`
// (a GLOBAL name must end in a newline), else that is truncation.
std::string_view Machine::take_line(std::size_t max_bytes, ErrorCode malformed, bool unterminated_is_malformed,
                                    std::string_view what) {
  const std::size_t limit = in_frame_ ? frame_end_ : window_end_;
  const std::size_t search_end = pos_ + std::min(limit - pos_, max_bytes + 1);
  const auto* begin = reinterpret_cast<const char*>(data_ + pos_);
  const auto* newline = static_cast<const char*>(std::memchr(begin, '\n', search_end - pos_));
  if (!newline) {
    if (search_end - pos_ == max_bytes + 1) error(malformed, what, " is longer than ", max_bytes, " bytes");
    if (in_frame_) error(ErrorCode::pickle_frame_invalid, what, " runs past the frame end at offset ", frame_end_);
    if (unterminated_is_malformed && window_end_ == size_) error(malformed, what, " has no terminating newline");
    out_of_input(search_end - pos_ + 1);
  }
  const std::size_t length = static_cast<std::size_t>(newline - begin);
  take(length + 1);
  return {begin, length};
}

Item Machine::take_string(std::uint64_t length, bool ascii_only) {
  if (length > limits_.max_string_bytes) {
    error(ErrorCode::pickle_string_too_long, "length ", length, " exceeds max_string_bytes ", limits_.max_string_bytes);
  }
  const auto* p = reinterpret_cast<const char*>(take(static_cast<std::size_t>(length)));
  std::string_view text(p, static_cast<std::size_t>(length));
  if (ascii_only) {
    const auto bad =
        std::find_if(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) > 0x7F; });
    if (bad != text.end()) {
      error(ErrorCode::pickle_string_invalid, "byte ", bad - text.begin(), " is not ASCII (Python 2 str)");
    }
  } else if (!op::is_strict_utf8(text)) {
    error(ErrorCode::pickle_string_invalid, "the ", length, " bytes are not strict UTF-8");
  }
  return text_item(ItemKind::text, text);
}

Item Machine::take_bytes(std::uint64_t length) {
  if (length > limits_.max_string_bytes) {
    error(ErrorCode::pickle_string_too_long, "length ", length, " exceeds max_string_bytes ", limits_.max_string_bytes);
  }
  const auto* p = reinterpret_cast<const char*>(take(static_cast<std::size_t>(length)));
  return text_item(ItemKind::bytes, std::string_view(p, static_cast<std::size_t>(length)));
}

void Machine::begin_frame() {
  if (in_frame_) {
    error(ErrorCode::pickle_frame_invalid, "a new frame starts before the current one ends at ", frame_end_);
  }
  const std::uint64_t length = take_le(8);
  if (length > size_ - pos_) {
    error(ErrorCode::pickle_frame_invalid, "length ", length, " exceeds the ", size_ - pos_, " bytes that follow");
  }
  if (length > window_end_ - pos_) out_of_input(static_cast<std::size_t>(length));
  frame_end_ = pos_ + static_cast<std::size_t>(length);
  in_frame_ = length > 0;
}

// ---- items ----------------------------------------------------------------------------

Item Machine::text_item(ItemKind kind, std::string_view text) {
  Item item;
  item.kind = kind;
  item.index = texts_.size();
  texts_.push_back({text});
  return item;
}

Item Machine::value_item(Value value) {
  Item item;
  item.kind = ItemKind::value;
  item.index = values_.size();
  values_.push_back(std::move(value));
  return item;
}

// The kind of Value `item` stands for; nullopt for a global, a storage or a
// tuple holding one.
std::optional<ValueKind> Machine::value_kind(const Item& item) const {
  if (item.vm_only) return std::nullopt;
  switch (item.kind) {
    case ItemKind::none: return ValueKind::none;
    case ItemKind::boolean: return ValueKind::boolean;
    case ItemKind::integer: return ValueKind::integer;
    case ItemKind::floating: return ValueKind::floating;
    case ItemKind::text: return ValueKind::string;
    case ItemKind::bytes: return ValueKind::bytes;
    case ItemKind::tuple: return item.torch_size ? ValueKind::size : ValueKind::tuple;
    case ItemKind::empty_container: return item.container;
    case ItemKind::value: return values_[item.index].kind();
    case ItemKind::global: return ValueKind::dtype;  // the only global that is not vm_only
    case ItemKind::storage:
    case ItemKind::numpy_dtype:
    case ItemKind::numpy_array: break;
  }
  return std::nullopt;
}

std::string Machine::describe(const Item& item) const {
  if (const auto kind = value_kind(item)) return std::string(value_kind_name(*kind));
  if (item.kind == ItemKind::global) return "global " + global_name(item.global);
  if (item.kind == ItemKind::storage) return "storage '" + storage_key(item.index) + "'";
  if (item.kind == ItemKind::numpy_dtype) return "NumPy dtype '" + numpy_dtypes_[item.index].code + "'";
  if (item.kind == ItemKind::numpy_array) return "NumPy array before its BUILD";
  return "tuple holding a global or storage";
}

// The Value `item` stands for, as `role` of its parent. Strings and tuples
// are made once and then shared, as one opcode's object is in Python.
Value Machine::take_value(const Item& item, std::string_view role) {
  switch (item.kind) {
    case ItemKind::none: return Value::none();
    case ItemKind::boolean: return Value::boolean(item.boolean);
    case ItemKind::integer: return Value::integer(item.integer);
    case ItemKind::floating: return Value::floating(item.floating);
    case ItemKind::text:
    case ItemKind::bytes: {
      Text& entry = texts_[item.index];
      if (entry.owned == kNoValue) {
        std::string copy(entry.text);
        values_.push_back(item.kind == ItemKind::text ? Value::string(std::move(copy)) : Value::bytes(std::move(copy)));
        entry.owned = values_.size() - 1;
      }
      return values_[entry.owned];
    }
    case ItemKind::tuple: {
      if (item.vm_only) break;
      if (item.torch_size) {
        // Made afresh: the tuple of ints torch.Size took may itself be a
        // plain tuple elsewhere (memoized before the call).
        const Tuple tuple = tuples_[item.index];
        Dims dims;
        for (std::size_t i = 0; i < tuple.count; ++i) dims.push_back(tuple_elements_[tuple.first + i].integer);
        return Value::size(dims);
      }
      if (tuples_[item.index].owned == kNoValue) {
        // Elements first: nested tuples and strings extend values_ as they go.
        const Tuple tuple = tuples_[item.index];
        Value::List elements;
        elements.reserve(tuple.count);
        bool dropped = false;
        for (std::size_t i = 0; i < tuple.count; ++i) {
          const Item& element = tuple_elements_[tuple.first + i];
          dropped = dropped || drops(element);
          elements.push_back(take_element(element, "a tuple element"));
        }
        values_.push_back(Value::tuple(std::move(elements)));
        tuples_[item.index].owned = values_.size() - 1;
        if (dropped) sequences_with_dropped_tensors_.try_emplace(values_.back().node_identity(), values_.back());
      }
      return values_[tuples_[item.index].owned];
    }
    case ItemKind::empty_container: return empty_container(item.container);
    case ItemKind::value: return values_[item.index];
    case ItemKind::global:
      if (!item.vm_only) return Value::dtype(item.global.dtype);
      break;
    case ItemKind::storage:
    case ItemKind::numpy_dtype:
    case ItemKind::numpy_array: break;
  }
  error(ErrorCode::pickle_type_invalid, "a ", describe(item), " cannot be ", role);
}

// The list, dict or OrderedDict `container` holds, made a Value if it was
// still empty. The reference lasts until values_ grows.
Value& Machine::make_mutable(Item& container) {
  if (container.kind == ItemKind::empty_container) {
    values_.push_back(empty_container(container.container));
    container.kind = ItemKind::value;
    container.index = values_.size() - 1;
  }
  return values_[container.index];
}

bool Machine::is_empty_dict(const Item& item) const {
  if (item.kind == ItemKind::empty_container) return true;
  const Dict& dict = values_[item.index].as_dict();
  return dict.empty() && !dict.metadata() && !holds_dropped_tensor(dict);
}

// ---- stack ----------------------------------------------------------------------------

void Machine::require(std::size_t n) const {
  const std::size_t available = stack_.size() - frame_base();
  if (available < n) {
    error(ErrorCode::pickle_stack_underflow, "needs ", n, " stack items, ", available, " above the last MARK");
  }
}

Item Machine::pop() {
  require(1);
  const Item item = stack_.back();
  stack_.pop_back();
  return item;
}

void Machine::stack_limit_exceeded() const {
  error(ErrorCode::pickle_stack_limit, "more than max_stack_items ", limits_.max_stack_items, " stack items");
}

std::size_t Machine::pop_mark() {
  if (marks_.empty()) error(ErrorCode::pickle_mark_missing, "no MARK is open");
  const std::size_t base = marks_.back();
  marks_.pop_back();
  return base;
}

void Machine::count_elements(std::uint64_t n) {
  container_elements_ = saturating_add(container_elements_, n);
  if (container_elements_ > limits_.max_container_elements) {
    error(ErrorCode::pickle_container_limit, "more than max_container_elements ", limits_.max_container_elements,
          " container elements");
  }
}

void Machine::add_child(Item& parent, const Item& child) const {
  parent.nodes = saturating_add(parent.nodes, child.nodes);
  parent.depth = std::max(parent.depth, child.depth + 1);
  parent.holds_mutable = parent.holds_mutable || child.holds_mutable;
  if (parent.depth > limits_.max_nesting_depth) {
    error(ErrorCode::pickle_nesting_limit, "containers nest deeper than max_nesting_depth ", limits_.max_nesting_depth);
  }
}

// ---- scalars ----------------------------------------------------------------------------

void Machine::do_proto() {
  const std::uint8_t version = take_u8();
  if (op_offset_ != 0) error(ErrorCode::pickle_opcode_forbidden, "PROTO is allowed only as the first opcode");
  if (version < 2 || version > op::kHighestProtocol) {
    error(ErrorCode::pickle_protocol_unsupported, "protocol ", int{version}, " is not 2..", int{op::kHighestProtocol});
  }
  protocol_ = version;
}

// Decimal text as Python's repr(int) writes it: no sign but '-', no leading
// zeros, no spaces or underscores, and within int64.
std::optional<std::int64_t> parse_canonical_int(std::string_view text) {
  const std::string_view digits = !text.empty() && text[0] == '-' ? text.substr(1) : text;
  if (!is_canonical_decimal(digits, 19) || text == "-0") return std::nullopt;
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Text INT (protocol 0/1): "I<decimal>\n", where "I00" and "I01" are False and True.
void Machine::do_int_line() {
  constexpr std::size_t kMaxIntLine = 32;
  const std::string_view line = take_line(kMaxIntLine, ErrorCode::pickle_int_invalid, false, "the INT line");
  if (line == "00" || line == "01") {
    push(boolean_item(line == "01"));
    return;
  }
  const auto value = parse_canonical_int(line);
  if (!value) error(ErrorCode::pickle_int_invalid, "'", printable(line), "' is not a canonical decimal within int64");
  push(integer_item(*value));
}

// Text LONG (protocol 0/1): "L<decimal>L\n".
void Machine::do_long_line() {
  constexpr std::size_t kMaxLongLine = 32;
  const std::string_view line = take_line(kMaxLongLine, ErrorCode::pickle_int_invalid, false, "the LONG line");
  const auto value = !line.empty() && line.back() == 'L' ? parse_canonical_int(line.substr(0, line.size() - 1))
                                                          : std::nullopt;
  if (!value) {
    error(ErrorCode::pickle_int_invalid, "'", printable(line), "' is not a canonical decimal with an L within int64");
  }
  push(integer_item(*value));
}

void Machine::do_long1() {
  const std::uint8_t length = take_u8();
  if (length > 8) {
    // Python ints are unbounded: a 128-bit PCG64 state, a 64-bit unsigned seed.
    const auto* bytes = reinterpret_cast<const char*>(take(length));
    const Value value = Value::integer_of_bytes({bytes, length});
    push(value.is_int() ? integer_item(value.as_int()) : value_item(value));
    return;
  }
  std::uint64_t bits = take_le(length);
  // Sign-extend the two's-complement value from `length` bytes to 64 bits.
  if (length > 0 && length < 8 && (bits >> (8 * length - 1)) & 1u) bits |= ~std::uint64_t{0} << (8 * length);
  push(integer_item(static_cast<std::int64_t>(bits)));
}

// ---- containers -------------------------------------------------------------------------

void Machine::do_tuple(std::size_t count, bool from_mark) {
  std::size_t base;
  if (from_mark) {
    base = pop_mark();
  } else {
    require(count);
    base = stack_.size() - count;
  }
  const auto first = stack_.begin() + static_cast<std::ptrdiff_t>(base);
  const auto last = stack_.end();
  count_elements(static_cast<std::uint64_t>(last - first));
  Item tuple;
  tuple.kind = ItemKind::tuple;
  tuple.depth = 1;
  for (auto it = first; it != last; ++it) {
    add_child(tuple, *it);
    tuple.vm_only = tuple.vm_only || it->vm_only;
  }
  tuple.index = tuples_.size();
  tuples_.push_back({tuple_elements_.size(), static_cast<std::size_t>(last - first)});
  tuple_elements_.insert(tuple_elements_.end(), first, last);
  stack_.erase(first, last);
  push(tuple);
}

void Machine::do_append(bool from_mark) {
  std::size_t first;
  if (from_mark) {
    first = pop_mark();
    if (first == frame_base()) error(ErrorCode::pickle_stack_underflow, "no list below the MARK");
  } else {
    require(2);
    first = stack_.size() - 1;
  }
  Item& target = stack_[first - 1];
  if (value_kind(target) != ValueKind::list || is_record_keyed(target)) {
    error(ErrorCode::pickle_append_target, "the target is a ",
          is_record_keyed(target) ? "dict keyed by records" : describe(target), ", not a list");
  }
  count_elements(stack_.size() - first);
  if (first == stack_.size()) return;
  check_not_shared(target);
  auto& items = make_mutable(target).mutable_list();
  bool dropped = false;
  for (std::size_t i = first; i < stack_.size(); ++i) {
    add_child(target, stack_[i]);
    dropped = dropped || drops(stack_[i]);
    items.push_back(take_element(stack_[i], "a list element"));
  }
  if (dropped) sequences_with_dropped_tensors_.try_emplace(&items, values_[target.index]);
  note_size(target);
  stack_.resize(first);
}

void Machine::set_item(Item& target, const Item& key, const Item& value) {
  if (is_record_keyed(target) || (key.kind == ItemKind::value && records_.contains(values_[key.index].node_identity()))) {
    set_record_keyed_item(target, key, value);
    return;
  }
  if (record_of(target)) {
    error(ErrorCode::pickle_setitem_target, "the target is a ", record_class_name(record_of(target)->cls),
          " record, whose fields only BUILD sets");
  }
  const auto target_kind = value_kind(target);
  if (target_kind != ValueKind::dict && target_kind != ValueKind::ordered_dict) {
    error(ErrorCode::pickle_setitem_target, "the target is a ", describe(target), ", not a dict");
  }
  // A key other than str and int (None, bool, float, bytes, a tuple of keys):
  // made a Value and compared as Python compares keys.
  std::optional<DictKey> object_key;
  if (key.kind != ItemKind::text && key.kind != ItemKind::integer) {
    const auto kind = value_kind(key);
    if (kind == ValueKind::none || kind == ValueKind::boolean || kind == ValueKind::floating ||
        kind == ValueKind::bytes || kind == ValueKind::tuple) {
      const Value made = take_value(key, "a dict key");
      if (usable_dict_key(made)) object_key.emplace(made);
    }
    if (!object_key) {
      error(ErrorCode::pickle_dict_key_invalid, "a ", describe(key),
            " key; keys are str, int, None, bool, float, bytes or tuples of them");
    }
  }
  check_not_shared(target);
  count_elements(1);
  add_child(target, key);
  add_child(target, value);
  const auto dict_key = [&] {
    if (object_key) return *object_key;
    return key.kind == ItemKind::text ? DictKey(std::string(text(key))) : DictKey(key.integer);
  };
  const auto duplicate = [&] {
    error(ErrorCode::pickle_duplicate_key, "key ", printable(dict_key().to_string()), " occurs twice");
  };
  if (drops(value)) {
    Value& container = make_mutable(target);
    const Dict& dict = container.as_dict();
    const bool present = (object_key                 ? dict.find(*object_key)
                          : key.kind == ItemKind::text ? dict.find(text(key))
                                                       : dict.find(key.integer)) != nullptr;
    if (present || !dropped_keys_.insert(dropped_key_fingerprint(dict, key, object_key))) duplicate();
    dicts_with_dropped_keys_.try_emplace(&dict, container);
    note_size(target);
    return;
  }
  Value entry = take_element(value, "a dict value");
  Dict& dict = make_mutable(target).mutable_dict();
  // Only a dict that took a dropped key can hold its fingerprint; asking that
  // first spares the two SipHashes for every other insert.
  if (options_.drop_tensors && holds_dropped_tensor(dict) &&
      dropped_keys_.contains(dropped_key_fingerprint(dict, key, object_key))) {
    duplicate();
  }
  if (!dict.insert(dict_key(), std::move(entry))) duplicate();
  note_size(target);
}

// (dict address, key): the dict is kept alive, so its address names it for
// the whole parse. A key other than a str goes by its Python equality class
// (DictKey::canonical), so that 1, 1.0 and True are one key here as in Dict.
FingerprintSet::Fingerprint Machine::dropped_key_fingerprint(const Dict& dict, const Item& key,
                                                             const std::optional<DictKey>& object_key) {
  std::string& input = fingerprint_input_;
  const auto address = reinterpret_cast<std::uintptr_t>(&dict);
  input.assign(reinterpret_cast<const char*>(&address), sizeof address);
  if (key.kind == ItemKind::text) {
    input += 's';
    input += text(key);
  } else {
    input += 'k';
    input += object_key ? object_key->canonical() : DictKey(key.integer).canonical();
  }
  return FingerprintSet::of(input);
}

void Machine::do_setitem(bool from_mark) {
  std::size_t first;
  if (from_mark) {
    first = pop_mark();
    if (first == frame_base()) error(ErrorCode::pickle_stack_underflow, "no dict below the MARK");
    if ((stack_.size() - first) % 2 != 0) {
      error(ErrorCode::pickle_stack_underflow, "an odd number of items (", stack_.size() - first,
            ") for key/value pairs");
    }
  } else {
    require(3);
    first = stack_.size() - 2;
  }
  Item& target = stack_[first - 1];
  // The batch's keys are known at once (torch.save writes up to 1000): their
  // index slots are fetched together, not one cache miss per insert, which
  // at 200,000 keys is most of what an insert costs.
  const std::optional<ValueKind> target_kind = value_kind(target);
  if (target.kind == ItemKind::value && stack_.size() - first >= 4 &&
      (target_kind == ValueKind::dict || target_kind == ValueKind::ordered_dict)) {
    const Dict& dict = values_[target.index].as_dict();
    for (std::size_t i = first; i < stack_.size(); i += 2) {
      if (stack_[i].kind == ItemKind::text) dict.prefetch(text(stack_[i]));
    }
  }
  for (std::size_t i = first; i < stack_.size(); i += 2) set_item(target, stack_[i], stack_[i + 1]);
  stack_.resize(first);
}

// ---- memo -------------------------------------------------------------------------------

void Machine::memo_put(std::uint64_t index) {
  require(1);
  if (index > memo_size_) {
    error(ErrorCode::pickle_memo_index_invalid, "index ", index, " skips past the memo size ", memo_size_);
  }
  if (index == memo_size_) {
    if (memo_size_ >= limits_.max_memo_entries) {
      error(ErrorCode::pickle_memo_limit, "more than max_memo_entries ", limits_.max_memo_entries, " memo entries");
    }
    ++memo_size_;
  }
  // A container a fetch may share is made a Value now, so that the stack's
  // item and the memo's are one object, as in Python.
  if (stack_.back().kind == ItemKind::empty_container && (!keep_fetched_only_ || kept_slot(index))) {
    make_mutable(stack_.back());
    note_size(stack_.back());
  }
  if (stack_.back().kind == ItemKind::numpy_array) unbuilt_arrays_in_memo_.emplace_back(stack_.back().index, index);
  if (!keep_fetched_only_) {
    if (index < memo_.size()) {
      memo_[static_cast<std::size_t>(index)] = stack_.back();
    } else {
      memo_.push_back(stack_.back());
    }
    return;
  }
  if (Item* slot = kept_slot(index)) *slot = stack_.back();
}

void Machine::memo_get(std::uint64_t index) {
  if (index >= memo_size_) {
    error(ErrorCode::pickle_memo_missing, "index ", index, " was never stored (memo size ", memo_size_, ")");
  }
  const Item* slot = keep_fetched_only_ ? kept_slot(index) : &memo_[static_cast<std::size_t>(index)];
  if (!slot) {
    // The bytes a second reading would need may already be given back.
    if (spent_ > 0) {
      error(ErrorCode::pickle_memo_missing, "index ", index,
            " was not foreseen by the walk over the opcodes, and the pickle's first ", spent_,
            " bytes are already given back, so it cannot be read again keeping every entry");
    }
    throw MemoNotKept{};
  }
  Item entry = *slot;
  if (entry.holds_mutable) {
    error(ErrorCode::pickle_memo_mutable, "memo ", index, " is (or holds) ", describe(entry),
          " still awaiting its BUILD; sharing it would allow cycles and aliasing");
  }
  if (is_plain_container(entry)) {
    // Shared from now on, and frozen: its size now is its size for good.
    ContainerState& state = container_state(entry.index);
    state.fetched = true;
    entry.nodes = std::max(entry.nodes, state.nodes);
    entry.depth = std::max(entry.depth, state.depth);
  }
  expanded_nodes_ = saturating_add(expanded_nodes_, entry.nodes);
  if (expanded_nodes_ > limits_.max_expanded_nodes) {
    error(ErrorCode::pickle_expansion_limit, "shared references expand past max_expanded_nodes ",
          limits_.max_expanded_nodes);
  }
  push(entry);
}

// Items refer to arena entries made before them: a tuple's elements, and any
// tuple, string or value an element names, come before the tuple. So the
// entries past the last one that a stack item, a kept memo entry or an element
// of a live tuple names (or that a live string or tuple made its Value) are
// unreachable and are cut off; the arenas' memory is then reused, and a state
// dict no longer holds every tensor's tuples and strings until the end. The
// next compaction waits until the arenas have grown by what this one had to
// look at, so the work stays linear in the pickle.
void Machine::compact_arenas() {
  std::size_t tuples = 0, texts = 0, values = 0;
  const auto note = [&](const Item& item) {
    switch (item.kind) {
      case ItemKind::tuple: tuples = std::max(tuples, item.index + 1); break;
      case ItemKind::text:
      case ItemKind::bytes: texts = std::max(texts, item.index + 1); break;
      case ItemKind::value: values = std::max(values, item.index + 1); break;
      default: break;
    }
  };
  for (const Item& item : stack_) note(item);
  for (const Item& item : kept_) note(item);
  const std::size_t elements = tuples == 0 ? 0 : tuples_[tuples - 1].first + tuples_[tuples - 1].count;
  for (std::size_t i = 0; i < elements; ++i) note(tuple_elements_[i]);
  for (std::size_t i = 0; i < texts; ++i) {
    if (texts_[i].owned != kNoValue) values = std::max(values, texts_[i].owned + 1);
  }
  for (std::size_t i = 0; i < tuples; ++i) {
    if (tuples_[i].owned != kNoValue) values = std::max(values, tuples_[i].owned + 1);
  }
  texts_.resize(texts);
  tuples_.resize(tuples);
  tuple_elements_.resize(elements);
  values_.erase(values_.begin() + static_cast<std::ptrdiff_t>(values), values_.end());
  if (containers_.size() > values_.size()) containers_.resize(values_.size());
  compact_at_ = 2 * (texts + tuples + elements) + stack_.size() + kept_.size() + 8192;
}

// ---- globals ----------------------------------------------------------------------------

// Every allowlisted name is a dotted identifier, so the identifier check is
// needed only on the way to a rejection, where it picks the error.
GlobalRef Machine::resolve_global(std::string_view module, std::string_view name) const {
  constexpr DType kNoDType = DType::uint8;
  if (module == "collections" && name == "OrderedDict") return {GlobalKind::ordered_dict, kNoDType, 0};
  if (module == "collections" && name == "Counter") return {GlobalKind::counter, kNoDType, 0};
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor_v2") return {GlobalKind::rebuild_tensor_v2, kNoDType, 0};
    if (name == "_rebuild_tensor_v3") return {GlobalKind::rebuild_tensor_v3, kNoDType, 0};
    if (name == "_rebuild_parameter") return {GlobalKind::rebuild_parameter, kNoDType, 0};
    if (name == "_rebuild_meta_tensor_no_storage") return {GlobalKind::rebuild_meta_tensor, kNoDType, 0};
    if (name == "_rebuild_sparse_tensor") return {GlobalKind::rebuild_sparse_tensor, kNoDType, 0};
  }
  if (module == "_codecs" && name == "encode") return {GlobalKind::codecs_encode, kNoDType, 0};
  if ((module == "__builtin__" || module == "builtins") && name == "bytes") return {GlobalKind::empty_bytes, kNoDType, 0};
  if (module == "numpy._core.multiarray" || module == "numpy.core.multiarray") {
    if (name == "_reconstruct") return {GlobalKind::numpy_reconstruct, kNoDType, 0};
    if (name == "scalar") return {GlobalKind::numpy_scalar, kNoDType, 0};
  }
  if (module == "numpy" && name == "ndarray") return {GlobalKind::numpy_ndarray, kNoDType, 0};
  if (module == "numpy" && name == "dtype") return {GlobalKind::numpy_dtype, kNoDType, 0};
  for (std::size_t i = 0; i < std::size(kRecordClasses); ++i) {
    if (module == kRecordClasses[i].module && name == kRecordClasses[i].name) {
      return {GlobalKind::record_class, kNoDType, static_cast<std::uint8_t>(i)};
    }
  }
  if (module == kDcpMetadata && name == "_MEM_FORMAT_ENCODING") return {GlobalKind::memory_format_code, kNoDType, 0};
  if (module == "torch" && name == "Size") return {GlobalKind::torch_size, kNoDType, 0};
  if (module == "torch" && name == "device") return {GlobalKind::torch_device, kNoDType, 0};
  if (module == "__builtin__" || module == "builtins") {
    if (name == "complex") return {GlobalKind::builtin_complex, kNoDType, 0};
    if (name == "set") return {GlobalKind::builtin_set, kNoDType, 0};
    if (name == "bytearray") return {GlobalKind::builtin_bytearray, kNoDType, 0};
  }
  if (module == "torch.serialization" && name == "_get_layout") return {GlobalKind::torch_get_layout, kNoDType, 0};
  if ((module == "pathlib" && (name == "PosixPath" || name == "PurePosixPath"))) {
    return {GlobalKind::posix_path, kNoDType, 0};
  }
  if ((module == "torch" || module == "torch.storage") && name == "UntypedStorage") {
    return {GlobalKind::untyped_storage_type, kNoDType, 0};
  }
  if (module == "torch") {
    if (const auto dtype = dtype_from_storage_class(name)) return {GlobalKind::storage_type, *dtype, 0};
    if (const auto dtype = dtype_from_name(name); dtype && dtype_in_torch(*dtype)) return {GlobalKind::dtype, *dtype, 0};
  }
  if (!is_identifier_path(module) || !is_identifier_path(name)) {
    error(ErrorCode::pickle_global_malformed, "'", printable(module), "' '", printable(name),
          "' is not a dotted identifier of at most ", op::kMaxGlobalPartBytes, " bytes");
  }
  if (module == "torch" && is_quantized_storage_class(name)) {
    error(ErrorCode::storage_type_unsupported, "torch.", name, " holds quantized data, not a plain dtype");
  }
  error(ErrorCode::pickle_global_forbidden, module, ".", name, " is not on the allowlist");
}

void Machine::do_global() {
  const std::size_t max = op::kMaxGlobalPartBytes;
  const std::string_view module = take_line(max, ErrorCode::pickle_global_malformed, true, "the module name");
  const std::string_view name = take_line(max, ErrorCode::pickle_global_malformed, true, "the attribute name");
  push(global_item(resolve_global(module, name)));
}

void Machine::do_stack_global() {
  require(2);
  const Item name = pop();
  const Item module = pop();
  if (module.kind != ItemKind::text || name.kind != ItemKind::text) {
    error(ErrorCode::pickle_global_malformed, "module and name must be str, not ", describe(module), " and ",
          describe(name));
  }
  push(global_item(resolve_global(text(module), text(name))));
}

// ---- persistent ids ---------------------------------------------------------------------

// The number a zip archive's storage key stands for (canonical decimals of at
// most 19 digits, so it cannot overflow); nullopt for legacy keys.
std::optional<std::uint64_t> Machine::storage_number(std::string_view key) const {
  if (!options_.canonical_storage_keys) return std::nullopt;
  std::uint64_t number = 0;
  for (char digit : key) number = number * 10 + static_cast<std::uint64_t>(digit - '0');
  return number;
}

// Whether storage_refs_[position] is found through storages_by_number_.
bool Machine::found_by_number(std::size_t position) const {
  const auto number = storage_number(storage_refs_[position].key());
  return number && *number < storages_by_number_.size() && storages_by_number_[*number] == position + 1;
}

// The key of storage_refs_[position], for a message.
std::string Machine::storage_key(std::size_t position) const {
  const StorageRef& ref = storage_refs_[position];
  if (ref.key_data) return std::string(ref.key());
  for (std::size_t number = 0; number < storages_by_number_.size(); ++number) {
    if (storages_by_number_[number] == position + 1) return std::to_string(number);
  }
  return "?";
}

std::size_t Machine::find_storage(std::string_view key) const {
  if (const auto number = storage_number(key); number && *number < storages_by_number_.size()) {
    if (storages_by_number_[*number] != 0) return storages_by_number_[*number] - 1;
  }
  if (storage_slots_.empty()) return kNoValue;
  const std::size_t mask = storage_slots_.size() - 1;
  for (std::size_t slot = std::hash<std::string_view>{}(key) & mask; storage_slots_[slot] != 0;
       slot = (slot + 1) & mask) {
    const std::size_t position = storage_slots_[slot] - 1;
    if (storage_refs_[position].key() == key) return position;
  }
  return kNoValue;
}

void Machine::index_storage(std::size_t position) {
  const auto number = storage_number(storage_refs_[position].key());
  if (number && *number < 2 * storage_refs_.size() + 1024 && position < std::numeric_limits<std::uint32_t>::max()) {
    if (*number >= storages_by_number_.size()) storages_by_number_.resize(*number + 1, 0);
    storages_by_number_[*number] = static_cast<std::uint32_t>(position + 1);
    return;
  }
  // Keep the table at most half full, doubling it as needed.
  if (2 * (hashed_storages_ + 1) > storage_slots_.size()) {
    const std::vector<std::size_t> old =
        std::exchange(storage_slots_, std::vector<std::size_t>(std::max<std::size_t>(64, 2 * storage_slots_.size())));
    for (const std::size_t entry : old) {
      if (entry != 0) place_hashed_storage(entry - 1);
    }
  }
  place_hashed_storage(position);
  ++hashed_storages_;
}

void Machine::place_hashed_storage(std::size_t position) {
  const std::size_t mask = storage_slots_.size() - 1;
  std::size_t slot = std::hash<std::string_view>{}(storage_refs_[position].key()) & mask;
  while (storage_slots_[slot] != 0) slot = (slot + 1) & mask;
  storage_slots_[slot] = position + 1;
}

void Machine::do_binpersid() {
  const Item pid = pop();
  const bool legacy = options_.persistent_ids == PersistentIdForm::legacy;
  const std::size_t expected = legacy ? 6 : 5;
  const bool is_tuple = pid.kind == ItemKind::tuple;
  if (!is_tuple || tuple_size(pid) != expected) {
    error(ErrorCode::persistent_id_invalid, "the persistent id is a ", describe(pid),
          is_tuple ? " of " + std::to_string(tuple_size(pid)) + " items" : std::string(), ", not a ", expected,
          "-tuple ('storage', type, key, location, numel", legacy ? ", view_metadata)" : ")");
  }
  const Item& tag = element(pid, 0);
  if (tag.kind != ItemKind::text || text(tag) != "storage") {
    error(ErrorCode::persistent_id_invalid, "the first item is not the str 'storage'");
  }
  const Item& type = element(pid, 1);
  if (type.kind != ItemKind::global) {
    error(ErrorCode::persistent_id_invalid, "the storage type is a ", describe(type), ", not a global");
  }
  if (type.global.kind != GlobalKind::storage_type && type.global.kind != GlobalKind::untyped_storage_type) {
    error(ErrorCode::storage_type_unsupported, global_name(type.global), " is not a storage type");
  }
  const Item& key = element(pid, 2);
  const Item& location = element(pid, 3);
  const Item& numel = element(pid, 4);
  if (key.kind != ItemKind::text) error(ErrorCode::persistent_id_invalid, "the key is a ", describe(key));
  if (location.kind != ItemKind::text) {
    error(ErrorCode::persistent_id_invalid, "the location is a ", describe(location));
  }
  if (numel.kind != ItemKind::integer) error(ErrorCode::persistent_id_invalid, "numel is a ", describe(numel));
  if (legacy && element(pid, 5).kind != ItemKind::none) {
    error(ErrorCode::legacy_view_metadata_unsupported, "view_metadata is a ", describe(element(pid, 5)),
          ", not None");
  }
  push(storage_item(type.global, text(key), text(location), numel.integer));
}

// The storage a well-typed persistent id names: checked, and resolved the
// first time its key is seen.
Item Machine::storage_item(GlobalRef type, std::string_view key_text, std::string_view location,
                           std::int64_t numel) {
  const bool untyped = type.kind == GlobalKind::untyped_storage_type;
  const DType dtype = untyped ? DType::uint8 : type.dtype;
  const bool key_ok =
      options_.canonical_storage_keys ? is_canonical_decimal(key_text, 19) : is_legacy_storage_key(key_text);
  if (!key_ok) {
    error(ErrorCode::storage_key_invalid, "key '", printable(key_text), "' is not ",
          options_.canonical_storage_keys ? "a canonical decimal of at most 19 digits"
                                          : "1..64 characters of [0-9A-Za-z_]");
  }
  if (!is_supported_location(location)) {
    error(ErrorCode::storage_location_unsupported, "location '", printable(location),
          "' is not cpu, cuda, cuda:<n> or mps");
  }
  if (numel < 0) error(ErrorCode::storage_numel_invalid, "numel ", numel, " is negative");
  const auto count = static_cast<std::uint64_t>(numel);
  const auto nbytes = checked_mul<std::uint64_t>(count, dtype_itemsize(dtype));
  if (!nbytes || *nbytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    error(ErrorCode::storage_numel_invalid, "numel ", count, " x itemsize ", dtype_itemsize(dtype), " overflows");
  }

  Item item;
  item.kind = ItemKind::storage;
  item.vm_only = true;
  if (const std::size_t found = find_storage(key_text); found != kNoValue) {
    const StorageRef& first = storage_refs_[found];
    // Storage classes are whole-byte dtypes, so equal sizes mean equal counts.
    const std::uint64_t first_numel = first.storage->nbytes() / dtype_itemsize(first.dtype);
    if (first.untyped != untyped || first.dtype != dtype || first_numel != count) {
      error(ErrorCode::storage_redeclared, "storage '", key_text, "' was declared as ",
            first.untyped ? std::string("UntypedStorage") : std::string(dtype_name(first.dtype)), " x ", first_numel,
            " and now as ", untyped ? std::string("UntypedStorage") : std::string(dtype_name(dtype)), " x ", count);
    }
    item.index = found;
    return item;
  }
  if (storage_refs_.size() >= limits_.max_tensors) {
    error(ErrorCode::tensor_count_limit, "more than max_tensors ", limits_.max_tensors, " storages");
  }
  StorageRequest request;
  request.untyped = untyped;
  request.dtype = dtype;
  request.key = std::string(key_text);
  request.location = std::string(location);
  request.numel = count;
  auto resolved = storages_.resolve(request);
  if (!resolved || resolved->nbytes() != *nbytes) {
    error(ErrorCode::storage_size_mismatch, "storage '", key_text, "' has ", resolved ? resolved->nbytes() : 0,
          " bytes, expected ", *nbytes);
  }
  item.index = storage_refs_.size();
  storage_refs_.push_back({key_text.data(), std::move(resolved), static_cast<std::uint32_t>(key_text.size()), dtype,
                           untyped});
  index_storage(item.index);
  return item;
}

// ---- REDUCE -----------------------------------------------------------------------------

void Machine::do_reduce() {
  require(2);
  const Item args = pop();
  const Item callable = pop();
  if (callable.kind != ItemKind::global) {
    error(ErrorCode::pickle_call_forbidden, "a ", describe(callable), " is not callable");
  }
  if (args.kind != ItemKind::tuple) {
    error(ErrorCode::pickle_call_args_invalid, "the arguments are a ", describe(args), ", not a tuple");
  }
  switch (callable.global.kind) {
    case GlobalKind::ordered_dict: push(reduce_ordered_dict(args)); return;
    case GlobalKind::counter: push(reduce_counter(args)); return;
    case GlobalKind::rebuild_tensor_v2: push(reduce_tensor(args, false)); return;
    case GlobalKind::rebuild_tensor_v3: push(reduce_tensor(args, true)); return;
    case GlobalKind::rebuild_parameter: push(reduce_parameter(args)); return;
    case GlobalKind::rebuild_meta_tensor: push(reduce_meta_tensor(args)); return;
    case GlobalKind::rebuild_sparse_tensor: push(reduce_sparse_tensor(args)); return;
    case GlobalKind::codecs_encode: push(reduce_codecs_encode(args)); return;
    case GlobalKind::empty_bytes: push(reduce_empty_bytes(args)); return;
    case GlobalKind::numpy_dtype: push(reduce_numpy_dtype(args)); return;
    case GlobalKind::numpy_reconstruct: push(reduce_numpy_reconstruct(args)); return;
    case GlobalKind::numpy_scalar: push(reduce_numpy_scalar(args)); return;
    case GlobalKind::torch_size: push(reduce_torch_size(args)); return;
    case GlobalKind::torch_get_layout: push(reduce_get_layout(args)); return;
    case GlobalKind::memory_format_code: push(reduce_memory_format_code(args)); return;
    case GlobalKind::posix_path: push(reduce_posix_path(args)); return;
    case GlobalKind::builtin_complex: push(reduce_complex(args)); return;
    case GlobalKind::builtin_set: push(reduce_set(args)); return;
    case GlobalKind::builtin_bytearray: push(reduce_bytearray(args)); return;
    case GlobalKind::torch_device: push(reduce_device(args)); return;
    case GlobalKind::record_class:
      error(ErrorCode::pickle_call_forbidden, global_name(callable.global),
            " is a record class: made by NEWOBJ and BUILD, never called");
    case GlobalKind::storage_type:
    case GlobalKind::untyped_storage_type:
    case GlobalKind::numpy_ndarray:
    case GlobalKind::dtype: break;
  }
  error(ErrorCode::pickle_call_forbidden, global_name(callable.global), " is a type tag, never called");
}

// OrderedDict() or, as Python 2 reduced it, OrderedDict([[key, value], ...]).
Item Machine::reduce_ordered_dict(const Item& args) {
  if (tuple_size(args) == 0) return empty_container_item(ValueKind::ordered_dict);
  const auto items_kind = tuple_size(args) == 1 ? value_kind(element(args, 0)) : std::nullopt;
  if (items_kind != ValueKind::list && items_kind != ValueKind::tuple) {
    error(ErrorCode::pickle_call_args_invalid, "OrderedDict takes () or one list of [key, value] pairs");
  }
  const Value items = take_value(element(args, 0), "the OrderedDict items");
  Dict dict;
  count_elements(items.as_list().size());
  for (const Value& pair : items.as_list()) {
    if (!pair.is_sequence() || pair.as_list().size() != 2) {
      error(ErrorCode::pickle_call_args_invalid, "an OrderedDict item is a ", value_kind_name(pair.kind()),
            ", not a [key, value] pair");
    }
    const Value& key = pair.as_list()[0];
    if (!usable_dict_key(key)) {
      error(ErrorCode::pickle_dict_key_invalid, "a ", value_kind_name(key.kind()),
            " key; keys are str, int, None, bool, float, bytes or tuples of them");
    }
    const std::optional<DictKey> dict_key(std::in_place, key);
    if (!dict.insert(*dict_key, pair.as_list()[1])) {
      error(ErrorCode::pickle_duplicate_key, "key ", printable(dict_key->to_string()), " occurs twice");
    }
  }
  Item item = value_item(Value::ordered_dict(std::move(dict)));
  // args = (items,) with items = [(key, value), ...]: the dict sits two levels
  // shallower than the argument tuple and holds the same nodes.
  item.depth = std::max<std::uint32_t>(1, args.depth - 2);
  item.nodes = args.nodes;
  item.holds_mutable = args.holds_mutable;
  note_size(item);
  return item;
}

// Counter() or Counter({key: count, ...}): how torch 2.x pickles MultiStepLR's
// milestones. Read as a plain dict of int counts (docs/format.md).
Item Machine::reduce_counter(const Item& args) {
  if (tuple_size(args) == 0) return empty_container_item(ValueKind::dict);
  if (tuple_size(args) != 1 || value_kind(element(args, 0)) != ValueKind::dict) {
    error(ErrorCode::pickle_call_args_invalid, "collections.Counter takes () or one dict of counts");
  }
  const Value counts = take_value(element(args, 0), "the Counter's counts");
  if (holds_dropped_tensor(counts.as_dict())) {
    error(ErrorCode::pickle_call_args_invalid, "a Counter count is a tensor, not an int");
  }
  for (const auto& [key, count] : counts.as_dict()) {
    if (!count.is_int()) {
      error(ErrorCode::pickle_call_args_invalid, "the Counter count of key ", printable(key.to_string()), " is a ",
            value_kind_name(count.kind()), ", not an int");
    }
  }
  Item item = value_item(Value::dict(counts.as_dict()));
  // args = (counts,): the dict sits one level shallower and holds the same nodes.
  item.depth = std::max<std::uint32_t>(1, args.depth - 1);
  item.nodes = args.nodes;
  item.holds_mutable = args.holds_mutable;
  note_size(item);
  return item;
}

// _codecs.encode(text, 'latin1'): how Python pickles bytes at protocol 2.
Item Machine::reduce_codecs_encode(const Item& args) {
  const bool pair = tuple_size(args) == 2;
  if (!pair || element(args, 0).kind != ItemKind::text || element(args, 1).kind != ItemKind::text ||
      text(element(args, 1)) != "latin1") {
    error(ErrorCode::pickle_call_args_invalid, "_codecs.encode takes exactly (str, 'latin1')");
  }
  const std::string_view utf8 = text(element(args, 0));  // strict UTF-8, checked when read
  std::string bytes;
  bytes.reserve(utf8.size());
  for (std::size_t i = 0; i < utf8.size();) {
    const auto lead = static_cast<unsigned char>(utf8[i]);
    if (lead < 0x80) {
      bytes.push_back(static_cast<char>(lead));
      ++i;
    } else if (lead == 0xC2 || lead == 0xC3) {
      bytes.push_back(static_cast<char>(((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(utf8[i + 1]) & 0x3Fu)));
      i += 2;
    } else {
      error(ErrorCode::pickle_call_args_invalid, "_codecs.encode: a code point above U+00FF at byte ", i,
            " has no latin1 encoding");
    }
  }
  const Value owned = Value::bytes(std::move(bytes));
  Item item = text_item(ItemKind::bytes, owned.as_bytes());
  texts_[item.index].owned = values_.size();
  values_.push_back(owned);
  return item;
}

// bytes(), with no arguments: b''. Pickle protocol 2 writes an empty bytes
// object so (Python 3's save_bytes), and a NumPy empty array's data with it.
// Any argument would make bytes from something else, so none is taken.
Item Machine::reduce_empty_bytes(const Item& args) {
  if (tuple_size(args) != 0) {
    error(ErrorCode::pickle_call_args_invalid, "bytes() is read only without arguments (an empty bytes object), not ",
          tuple_size(args), " of them");
  }
  const Value owned = Value::bytes(std::string());
  Item item = text_item(ItemKind::bytes, owned.as_bytes());
  texts_[item.index].owned = values_.size();
  values_.push_back(owned);
  return item;
}

// hooks: None, or an empty dict/OrderedDict that nothing has written to.
void Machine::check_hooks(const Item& hooks, std::string_view what) const {
  const auto kind = value_kind(hooks);
  if (!kind) error(ErrorCode::pickle_call_args_invalid, what, " is not a value");
  if (*kind == ValueKind::none) return;
  if (*kind != ValueKind::dict && *kind != ValueKind::ordered_dict) {
    error(ErrorCode::pickle_call_args_invalid, what, " is a ", value_kind_name(*kind), ", not a dict");
  }
  if (!is_empty_dict(hooks)) error(ErrorCode::tensor_hooks_not_empty, what, " is not an empty dict");
}

Dims Machine::int_tuple(const Item& item, std::string_view what) const {
  if (item.kind != ItemKind::tuple || item.vm_only) {
    error(ErrorCode::pickle_call_args_invalid, what, " is not a tuple");
  }
  const std::size_t count = tuple_size(item);
  if (count > limits_.max_tensor_rank) {
    error(ErrorCode::tensor_rank_limit, what, " has ", count, " dimensions, more than max_tensor_rank ",
          limits_.max_tensor_rank);
  }
  Dims out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const Item& dimension = element(item, i);
    if (dimension.kind != ItemKind::integer) {
      error(ErrorCode::pickle_call_args_invalid, what, " holds a ", describe(dimension));
    }
    out.push_back(dimension.integer);
  }
  return out;
}

// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
// _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
Item Machine::reduce_tensor(const Item& args, bool v3) {
  const std::size_t required = v3 ? 7 : 6;
  const char* callable = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
  if (tuple_size(args) != required && tuple_size(args) != required + 1) {
    error(ErrorCode::pickle_call_args_invalid, callable, " takes ", required, " or ", required + 1, " arguments, not ",
          tuple_size(args));
  }
  const Item& storage_item = element(args, 0);
  if (storage_item.kind != ItemKind::storage || storage(storage_item).untyped != v3) {
    error(ErrorCode::pickle_call_args_invalid, "argument 0 is a ", describe(storage_item), ", not ",
          v3 ? "an UntypedStorage" : "a typed storage");
  }
  const StorageRef& storage_ref = storage(storage_item);
  DType dtype = storage_ref.dtype;
  if (v3) {
    const Item& dtype_tag = element(args, 6);
    if (dtype_tag.kind != ItemKind::global || dtype_tag.global.kind != GlobalKind::dtype) {
      error(ErrorCode::pickle_call_args_invalid, "argument 6 is a ", describe(dtype_tag), ", not a torch dtype");
    }
    dtype = dtype_tag.global.dtype;
  }
  const Item& offset_value = element(args, 1);
  if (offset_value.kind != ItemKind::integer) {
    error(ErrorCode::pickle_call_args_invalid, "the storage offset is a ", describe(offset_value), ", not an int");
  }
  const Item& requires_grad = element(args, 4);
  if (requires_grad.kind != ItemKind::boolean) {
    error(ErrorCode::pickle_call_args_invalid, "requires_grad is a ", describe(requires_grad), ", not a bool");
  }
  Dims sizes = int_tuple(element(args, 2), "size");
  Dims strides = int_tuple(element(args, 3), "stride");
  check_hooks(element(args, 5), "backward_hooks");
  bool conjugate = false, negative = false;
  if (tuple_size(args) == required + 1) {
    // torch 2.x passes the tensor's metadata (its conj and neg bits) only when
    // one is set.
    const Item& metadata = element(args, required);
    const auto metadata_kind = value_kind(metadata);
    if (metadata_kind != ValueKind::dict && metadata_kind != ValueKind::ordered_dict) {
      error(ErrorCode::pickle_call_args_invalid, "the rebuild metadata is a ", describe(metadata), ", not a dict");
    }
    if (!is_empty_dict(metadata)) read_tensor_metadata(metadata, dtype, conjugate, negative);
  }
  return tensor_item(storage_ref, dtype, offset_value.integer, requires_grad.boolean, std::move(sizes),
                     std::move(strides), conjugate, negative);
}

// torch._utils.get_tensor_metadata's dict: {"neg": True, "conj": True}, either
// key alone. Any other key would change what the tensor means in a way this
// reader cannot know, so it is refused rather than ignored (torch ignores it).
void Machine::read_tensor_metadata(const Item& metadata, DType dtype, bool& conjugate, bool& negative) const {
  if (metadata.kind != ItemKind::value) {
    error(ErrorCode::pickle_call_args_invalid, "the rebuild metadata is a ", describe(metadata), ", not a dict");
  }
  const Dict& dict = values_[metadata.index].as_dict();
  if (dict.metadata() || holds_dropped_tensor(dict)) {
    error(ErrorCode::tensor_metadata_unsupported, "the rebuild metadata holds more than the conj and neg bits");
  }
  for (const auto& [key, bit] : dict) {
    const bool known = key.is_string() && (key.as_string() == "conj" || key.as_string() == "neg");
    if (!known) {
      error(ErrorCode::tensor_metadata_unsupported, "the rebuild metadata sets ",
            key.is_string() ? "'" + std::string(key.as_string()) + "'" : std::string("a non-str key"),
            "; only 'conj' and 'neg' are known");
    }
    if (!bit.is_bool()) {
      error(ErrorCode::pickle_call_args_invalid, "the rebuild metadata's '", key.as_string(), "' is a ",
            value_kind_name(bit.kind()), ", not a bool");
    }
    (key.as_string() == "conj" ? conjugate : negative) = bit.as_bool();
  }
  if (conjugate && !dtype_is_complex(dtype)) {
    error(ErrorCode::tensor_metadata_unsupported, "the conj bit on a ", dtype_name(dtype),
          " tensor; only complex tensors have conjugate views");
  }
}

// A tensor over `storage_ref` whose arguments have their types: the geometry
// and the limits are checked here.
Item Machine::tensor_item(const StorageRef& storage_ref, DType dtype, std::int64_t storage_offset,
                          bool requires_grad, Dims sizes, Dims strides, bool conjugate, bool negative) {
  TensorData tensor;
  tensor.dtype = dtype;
  tensor.conjugate = conjugate;
  tensor.negative = negative;
  tensor.sizes = std::move(sizes);
  tensor.strides = std::move(strides);
  tensor.storage_offset = storage_offset;
  tensor.requires_grad = requires_grad;
  tensor.storage = storage_ref.storage;
  // Geometry, mirroring ATen's set_() but stricter (format reference §7.3).
  if (tensor.sizes.size() != tensor.strides.size()) {
    error(ErrorCode::tensor_geometry_invalid, "size has ", tensor.sizes.size(), " dimensions, stride ",
          tensor.strides.size());
  }
  bool empty = false;
  for (std::size_t d = 0; d < tensor.sizes.size(); ++d) {
    if (tensor.sizes[d] < 0 || tensor.strides[d] < 0) {
      error(ErrorCode::tensor_geometry_invalid, "dimension ", d, " has size ", tensor.sizes[d], " and stride ",
            tensor.strides[d]);
    }
    empty = empty || tensor.sizes[d] == 0;
  }
  // As in ATen, any zero-size dimension makes the tensor empty, whatever the
  // other sizes multiply to.
  std::uint64_t numel = empty ? 0 : 1;
  for (std::size_t d = 0; d < tensor.sizes.size() && !empty; ++d) {
    const auto product = checked_mul<std::uint64_t>(numel, static_cast<std::uint64_t>(tensor.sizes[d]));
    if (!product) error(ErrorCode::tensor_numel_limit, "the element count overflows 64 bits");
    numel = *product;
  }
  if (numel > limits_.max_tensor_numel) {
    error(ErrorCode::tensor_numel_limit, numel, " elements exceed max_tensor_numel ", limits_.max_tensor_numel);
  }
  if (tensor.storage_offset < 0) {
    error(ErrorCode::tensor_geometry_invalid, "storage offset ", tensor.storage_offset, " is negative");
  }
  const std::size_t itemsize = dtype_itemsize(dtype);
  const std::uint64_t storage_bytes = storage_ref.storage->nbytes();
  if (storage_bytes % itemsize != 0) {
    error(ErrorCode::storage_size_mismatch, "storage '",
          storage_key(storage_ref), "' of ", storage_bytes,
          " bytes is not a whole number of ", dtype_name(dtype), " elements");
  }
  const std::uint64_t storage_numel = storage_bytes / itemsize;
  const auto offset = static_cast<std::uint64_t>(tensor.storage_offset);
  if (numel > 0) {
    std::optional<std::uint64_t> last = offset;
    for (std::size_t d = 0; d < tensor.sizes.size() && last; ++d) {
      const auto step = checked_mul<std::uint64_t>(static_cast<std::uint64_t>(tensor.sizes[d] - 1),
                                                   static_cast<std::uint64_t>(tensor.strides[d]));
      last = step ? checked_add(*last, *step) : std::nullopt;
    }
    if (!last || *last >= storage_numel) {
      error(ErrorCode::tensor_out_of_bounds, "the view reaches element ",
            last ? std::to_string(*last) : std::string("past 2^64"), " of storage '",
            storage_key(storage_ref), "' of ", storage_numel,
            " elements");
    }
  } else if (offset > storage_numel) {
    error(ErrorCode::tensor_out_of_bounds, "an empty view at offset ", offset, " of storage '",
          storage_key(storage_ref), "' of ", storage_numel,
          " elements");
  }
  const auto logical_bytes = checked_mul<std::uint64_t>(numel, itemsize);
  const auto expansion_bound =
      checked_add<std::uint64_t>(checked_mul<std::uint64_t>(storage_bytes, limits_.max_view_expansion)
                                     .value_or(std::numeric_limits<std::uint64_t>::max()),
                                 4096)
          .value_or(std::numeric_limits<std::uint64_t>::max());
  if (!logical_bytes || *logical_bytes > limits_.max_tensor_logical_bytes || *logical_bytes > expansion_bound) {
    error(ErrorCode::tensor_bytes_limit, numel, " elements of ", itemsize, " bytes exceed max_tensor_logical_bytes ",
          limits_.max_tensor_logical_bytes, " or ", limits_.max_view_expansion, " x the storage's ", storage_bytes,
          " bytes + 4096");
  }
  if (tensor.requires_grad && !dtype_is_differentiable(dtype)) {
    error(ErrorCode::tensor_requires_grad_invalid, "requires_grad on a ", dtype_name(dtype), " tensor");
  }
  if (++tensor_count_ > limits_.max_tensors) {
    error(ErrorCode::tensor_count_limit, "more than max_tensors ", limits_.max_tensors, " tensors");
  }
  return value_item(Value::tensor(std::move(tensor)));
}

// _rebuild_parameter(tensor, requires_grad, OrderedDict()): nn.Parameter, of a
// tensor, a meta tensor or a sparse tensor.
Item Machine::reduce_parameter(const Item& args) {
  const bool triple = tuple_size(args) == 3;
  const auto data_kind = triple ? value_kind(element(args, 0)) : std::nullopt;
  if ((data_kind != ValueKind::tensor && data_kind != ValueKind::meta_tensor &&
       data_kind != ValueKind::sparse_tensor) ||
      element(args, 1).kind != ItemKind::boolean) {
    error(ErrorCode::pickle_call_args_invalid, "_rebuild_parameter takes exactly (Tensor, bool, OrderedDict())");
  }
  check_hooks(element(args, 2), "backward_hooks");
  const Value& data = values_[element(args, 0).index];
  if (data.is_sparse_tensor()) {
    SparseTensor parameter = data.as_sparse_tensor();
    parameter.is_parameter = true;
    parameter.requires_grad = element(args, 1).boolean;
    if (parameter.requires_grad && !dtype_is_differentiable(parameter.values().dtype)) {
      error(ErrorCode::tensor_requires_grad_invalid, "requires_grad on a sparse parameter of ",
            dtype_name(parameter.values().dtype), " values");
    }
    return value_item(Value::sparse_tensor(std::move(parameter)));
  }
  TensorData parameter = data.is_tensor() ? data.as_tensor() : data.as_meta_tensor();
  parameter.is_parameter = true;
  parameter.requires_grad = element(args, 1).boolean;
  if (parameter.requires_grad && !dtype_is_differentiable(parameter.dtype)) {
    error(ErrorCode::tensor_requires_grad_invalid, "requires_grad on a ", dtype_name(parameter.dtype), " parameter");
  }
  return value_item(data.is_tensor() ? Value::tensor(std::move(parameter)) : Value::meta_tensor(std::move(parameter)));
}

// _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad): a tensor
// on the meta device, which has a geometry and no elements. The geometry is
// checked as a stored tensor's is, but no storage bounds it: it holds nothing.
Item Machine::reduce_meta_tensor(const Item& args) {
  constexpr const char* kCallable = "_rebuild_meta_tensor_no_storage";
  if (tuple_size(args) != 4) {
    error(ErrorCode::pickle_call_args_invalid, kCallable, " takes (dtype, size, stride, requires_grad), not ",
          tuple_size(args), " arguments");
  }
  const Item& dtype_tag = element(args, 0);
  if (dtype_tag.kind != ItemKind::global || dtype_tag.global.kind != GlobalKind::dtype) {
    error(ErrorCode::pickle_call_args_invalid, kCallable, "'s argument 0 is a ", describe(dtype_tag),
          ", not a torch dtype");
  }
  const Item& requires_grad = element(args, 3);
  if (requires_grad.kind != ItemKind::boolean) {
    error(ErrorCode::pickle_call_args_invalid, "requires_grad is a ", describe(requires_grad), ", not a bool");
  }
  TensorData tensor;
  tensor.dtype = dtype_tag.global.dtype;
  tensor.sizes = int_tuple(element(args, 1), "size");
  tensor.strides = int_tuple(element(args, 2), "stride");
  tensor.requires_grad = requires_grad.boolean;
  if (tensor.sizes.size() != tensor.strides.size()) {
    error(ErrorCode::tensor_geometry_invalid, "size has ", tensor.sizes.size(), " dimensions, stride ",
          tensor.strides.size());
  }
  std::uint64_t numel = 1;
  bool overflow = false;
  for (std::size_t d = 0; d < tensor.sizes.size(); ++d) {
    if (tensor.sizes[d] < 0 || tensor.strides[d] < 0) {
      error(ErrorCode::tensor_geometry_invalid, "dimension ", d, " has size ", tensor.sizes[d], " and stride ",
            tensor.strides[d]);
    }
    const auto product = checked_mul<std::uint64_t>(numel, static_cast<std::uint64_t>(tensor.sizes[d]));
    overflow = overflow || !product;
    numel = product.value_or(0);
  }
  const bool empty = std::find(tensor.sizes.begin(), tensor.sizes.end(), 0) != tensor.sizes.end();
  if (!empty && overflow) error(ErrorCode::tensor_numel_limit, "the element count overflows 64 bits");
  if (!empty && numel > limits_.max_tensor_numel) {
    error(ErrorCode::tensor_numel_limit, numel, " elements exceed max_tensor_numel ", limits_.max_tensor_numel);
  }
  if (tensor.requires_grad && !dtype_is_differentiable(tensor.dtype)) {
    error(ErrorCode::tensor_requires_grad_invalid, "requires_grad on a ", dtype_name(tensor.dtype), " tensor");
  }
  if (++tensor_count_ > limits_.max_tensors) {
    error(ErrorCode::tensor_count_limit, "more than max_tensors ", limits_.max_tensors, " tensors");
  }
  return value_item(Value::meta_tensor(std::move(tensor)));
}

// _rebuild_sparse_tensor(layout, data): a sparse tensor, with data
// (indices, values, size[, is_coalesced]) for COO and (compressed indices,
// plain indices, values, size) for CSR, CSC, BSR and BSC. torch builds it
// unchecked and validates it after the load only when asked
// (torch.sparse.check_sparse_tensor_invariants); here validate_sparse_tensor
// runs on every one. Only the parts' own tensors hold data; the sparse tensor
// counts against max_tensors besides them.
Item Machine::reduce_sparse_tensor(const Item& args) {
  constexpr const char* kCallable = "_rebuild_sparse_tensor";
  if (tuple_size(args) != 2 || value_kind(element(args, 0)) != ValueKind::layout ||
      element(args, 1).kind != ItemKind::tuple) {
    error(ErrorCode::pickle_call_args_invalid, kCallable, " takes (layout, (parts..., size)), not ",
          describe(args));
  }
  SparseTensor sparse;
  sparse.layout = values_[element(args, 0).index].as_layout();
  if (!is_sparse_layout(sparse.layout)) {
    error(ErrorCode::pickle_call_args_invalid, kCallable, " of layout ", sparse.layout, ", which is not sparse");
  }
  const Item& data = element(args, 1);
  const std::size_t count = tuple_size(data);
  // COO: 3 (indices, values, size) or 4 (+ is_coalesced); compressed: 4.
  const std::size_t tensors = sparse.is_coo() ? 2 : 3;
  const bool flag = sparse.is_coo() && count == 4;
  if (count != tensors + 1 + (flag ? 1 : 0)) {
    error(ErrorCode::pickle_call_args_invalid, kCallable, " of ", sparse.layout, " takes ",
          sparse.is_coo() ? "(indices, values, size[, is_coalesced])"
                          : "(compressed_indices, plain_indices, values, size)",
          ", not ", count, " items");
  }
  for (std::size_t i = 0; i < tensors; ++i) {
    const Item& part = element(data, i);
    if (value_kind(part) != ValueKind::tensor) {
      error(ErrorCode::pickle_call_args_invalid, kCallable, "'s part ", i, " is a ", describe(part), ", not a tensor");
    }
    sparse.parts.push_back(values_[part.index]);
  }
  const Item& size = element(data, tensors);
  const auto size_kind = value_kind(size);
  if (size_kind != ValueKind::size && size_kind != ValueKind::tuple) {
    error(ErrorCode::pickle_call_args_invalid, kCallable, "'s size is a ", describe(size), ", not a torch.Size");
  }
  sparse.sizes = int_tuple(size, "size");
  if (sparse.sizes.size() > limits_.max_tensor_rank) {
    error(ErrorCode::tensor_rank_limit, "a sparse tensor of rank ", sparse.sizes.size(), " exceeds max_tensor_rank ",
          limits_.max_tensor_rank);
  }
  if (flag) {
    const Item& coalesced = element(data, tensors + 1);
    if (coalesced.kind != ItemKind::boolean && coalesced.kind != ItemKind::none) {
      error(ErrorCode::pickle_call_args_invalid, kCallable, "'s is_coalesced is a ", describe(coalesced),
            ", not a bool");
    }
    if (coalesced.kind == ItemKind::boolean) sparse.coalesced = coalesced.boolean;
  }
  if (++tensor_count_ > limits_.max_tensors) {
    error(ErrorCode::tensor_count_limit, "more than max_tensors ", limits_.max_tensors, " tensors");
  }
  try {
    // A scan's parts have no bytes: their index values are checked on a copy
    // with the bytes read back (read_absent), then let go.
    const auto absent = [](const Value& part) {
      const TensorData& t = part.as_tensor();
      return t.numel() != 0 && t.storage && !t.storage->has_bytes();
    };
    // The index parts: all but the values, the last.
    if (options_.read_absent && std::any_of(sparse.parts.begin(), sparse.parts.end() - 1, absent)) {
      SparseTensor readable = sparse;
      for (auto part = readable.parts.begin(); part != readable.parts.end() - 1; ++part) {
        if (!absent(*part)) continue;
        TensorData copy = part->as_tensor();
        copy.storage = options_.read_absent(*copy.storage);
        *part = Value::tensor(std::move(copy));
      }
      validate_sparse_tensor(readable);
    }
    return value_item(Value::sparse_tensor(std::move(sparse)));
  } catch (const Error& refused) {
    error(refused.code(), refused.detail());
  }
}

// ---- BUILD ------------------------------------------------------------------------------

constexpr std::string_view kMetadataKey = "_metadata";

// state = {'_metadata': {prefix: {name: int}}}, what nn.Module.state_dict() sets.
void Machine::validate_metadata(const Value& state) const {
  const Value* metadata = state.is_dict() && state.as_dict().size() == 1 && !holds_dropped_tensor(state.as_dict())
                              ? state.as_dict().find(kMetadataKey)
                              : nullptr;
  if (!metadata) error(ErrorCode::pickle_build_forbidden, "the state is not a dict whose only key is '_metadata'");
  if (!metadata->is_dict()) error(ErrorCode::pickle_build_forbidden, "_metadata is not a dict");
  if (holds_dropped_tensor(metadata->as_dict())) {
    error(ErrorCode::pickle_build_forbidden, "_metadata maps a prefix to a tensor, not a dict of str to int");
  }
  for (const auto& [prefix, entry] : metadata->as_dict()) {
    if (!prefix.is_string() || !entry.is_dict()) {
      error(ErrorCode::pickle_build_forbidden, "_metadata maps ", prefix.to_string(), " to a ",
            value_kind_name(entry.kind()), ", not a dict of str to int");
    }
    if (holds_dropped_tensor(entry.as_dict())) {
      error(ErrorCode::pickle_build_forbidden, "_metadata[", prefix.to_string(), "] maps a name to a tensor, not an int");
    }
    for (const auto& [name, number] : entry.as_dict()) {
      if (!name.is_string() || !number.is_int()) {
        error(ErrorCode::pickle_build_forbidden, "_metadata[", prefix.to_string(), "] maps ", name.to_string(),
              " to a ", value_kind_name(number.kind()), ", not an int");
      }
    }
  }
}


// ---- NumPy values -----------------------------------------------------------------------
//
// NumPy pickles an array as
//   _reconstruct(numpy.ndarray, (0,), b'b')  BUILD (version, shape, dtype, fortran, raw bytes)
// and its dtype as numpy.dtype('f8', False, True) BUILD (3, '<', None, None, None, -1, -1, 0).
// Only plain number types are read; the array becomes a tensor over a copy of
// its bytes (TensorData::from_numpy), in native byte order. Nothing of NumPy
// runs: these are the shapes of data it writes, checked like any other.

namespace {
// The array-protocol type code of a plain number dtype: kind letter and size.
std::optional<DType> numpy_type_code(std::string_view code) {
  static constexpr std::pair<std::string_view, DType> kCodes[] = {
      {"b1", DType::boolean}, {"i1", DType::int8},     {"i2", DType::int16},     {"i4", DType::int32},
      {"i8", DType::int64},   {"u1", DType::uint8},    {"u2", DType::uint16},    {"u4", DType::uint32},
      {"u8", DType::uint64},  {"f2", DType::float16},  {"f4", DType::float32},   {"f8", DType::float64},
      {"c8", DType::complex64}, {"c16", DType::complex128},
  };
  for (const auto& [name, dtype] : kCodes) {
    if (name == code) return dtype;
  }
  return std::nullopt;
}
}  // namespace

// numpy.dtype(code, align, copy)
Item Machine::reduce_numpy_dtype(const Item& args) {
  const bool triple = tuple_size(args) == 3;
  if (!triple || element(args, 0).kind != ItemKind::text || element(args, 1).kind != ItemKind::boolean ||
      element(args, 2).kind != ItemKind::boolean) {
    error(ErrorCode::pickle_call_args_invalid, "numpy.dtype takes exactly (str, bool, bool)");
  }
  const std::string_view code = text(element(args, 0));
  Item item;
  item.kind = ItemKind::numpy_dtype;
  item.index = numpy_dtypes_.size();
  item.vm_only = true;
  numpy_dtypes_.push_back({numpy_type_code(code), std::string(printable(code)), '='});
  return item;
}

// BUILD (version, byte order, subarray, names, fields, element size, alignment, flags[, metadata])
void Machine::build_numpy_dtype(const Item& target, const Item& state) {
  const std::size_t size = state.kind == ItemKind::tuple ? tuple_size(state) : 0;
  if (size != 8 && size != 9) {
    error(ErrorCode::pickle_call_args_invalid, "a NumPy dtype's state is a ", describe(state),
          " of ", size, " items, not the 8 or 9 of (version, byte order, subarray, names, fields, ...)");
  }
  const Item& version = element(state, 0);
  const Item& order = element(state, 1);
  if (version.kind != ItemKind::integer || (version.integer != 3 && version.integer != 4) ||
      order.kind != ItemKind::text) {
    error(ErrorCode::pickle_call_args_invalid, "a NumPy dtype's state does not start with version 3 or 4 and a byte order");
  }
  NumpyDType& dtype = numpy_dtypes_[target.index];
  for (std::size_t i = 2; i < 5; ++i) {
    if (element(state, i).kind != ItemKind::none) {
      error(ErrorCode::numpy_dtype_unsupported, "NumPy dtype '", dtype.code,
            "' has a subarray, field names or fields: only plain number types are read");
    }
  }
  for (std::size_t i = 5; i < 8; ++i) {
    if (element(state, i).kind != ItemKind::integer) {
      error(ErrorCode::pickle_call_args_invalid, "a NumPy dtype's state item ", i, " is a ",
            describe(element(state, i)), ", not an int");
    }
  }
  const std::string_view byte_order = text(order);
  if (byte_order != "<" && byte_order != ">" && byte_order != "|" && byte_order != "=") {
    error(ErrorCode::pickle_call_args_invalid, "NumPy byte order '", printable(byte_order), "' is not <, >, | or =");
  }
  dtype.byte_order = byte_order[0];
}

DType Machine::numpy_element_type(const Item& dtype, std::string_view what) const {
  if (dtype.kind != ItemKind::numpy_dtype) {
    error(ErrorCode::pickle_call_args_invalid, what, " is a ", describe(dtype), ", not a NumPy dtype");
  }
  const NumpyDType& entry = numpy_dtypes_[dtype.index];
  if (!entry.dtype) {
    error(ErrorCode::numpy_dtype_unsupported, what, " has NumPy dtype '", entry.code,
          "': only booleans, integers, floats and complex numbers are read (never objects, text or records)");
  }
  return *entry.dtype;
}

// _reconstruct(numpy.ndarray, (0,), b'b'): an empty array that BUILD fills.
Item Machine::reduce_numpy_reconstruct(const Item& args) {
  const bool triple = tuple_size(args) == 3;
  const bool tagged = triple && element(args, 0).kind == ItemKind::global &&
                      element(args, 0).global.kind == GlobalKind::numpy_ndarray;
  if (!tagged || element(args, 1).kind != ItemKind::tuple || element(args, 1).vm_only ||
      (element(args, 2).kind != ItemKind::bytes && element(args, 2).kind != ItemKind::text)) {
    error(ErrorCode::pickle_call_args_invalid, "_reconstruct takes exactly (numpy.ndarray, shape, type code)");
  }
  Item item;
  item.kind = ItemKind::numpy_array;
  item.index = numpy_arrays_built_.size();
  item.vm_only = true;
  item.holds_mutable = true;  // filled by BUILD: never shared before that
  numpy_arrays_built_.push_back(false);
  return item;
}

// BUILD ([version,] shape, dtype, fortran order, raw bytes)
Item Machine::build_numpy_array(const Item& state) {
  const std::size_t size = state.kind == ItemKind::tuple ? tuple_size(state) : 0;
  if (size != 4 && size != 5) {
    error(ErrorCode::pickle_call_args_invalid, "a NumPy array's state is a ", describe(state), " of ", size,
          " items, not ([version,] shape, dtype, fortran, data)");
  }
  const std::size_t first = size - 4;
  if (first == 1 && (element(state, 0).kind != ItemKind::integer || element(state, 0).integer != 1)) {
    error(ErrorCode::pickle_call_args_invalid, "a NumPy array's state has version ", describe(element(state, 0)),
          ", not 1");
  }
  Dims sizes = int_tuple(element(state, first), "the NumPy array's shape");
  const DType dtype = numpy_element_type(element(state, first + 1), "the NumPy array");
  const Item& fortran = element(state, first + 2);
  const Item& data = element(state, first + 3);
  if (fortran.kind != ItemKind::boolean) {
    error(ErrorCode::pickle_call_args_invalid, "a NumPy array's order flag is a ", describe(fortran), ", not a bool");
  }
  // NumPy 1 pickled raw bytes at protocol 2 as a latin-1 str (Python 2's str).
  if (data.kind != ItemKind::bytes) {
    error(ErrorCode::numpy_array_invalid, "a NumPy array's data is a ", describe(data), ", not bytes");
  }
  std::uint64_t numel = 1;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0) error(ErrorCode::numpy_array_invalid, "NumPy array dimension ", d, " is ", sizes[d]);
    numel = checked_mul<std::uint64_t>(numel, static_cast<std::uint64_t>(sizes[d]))
                .value_or(std::numeric_limits<std::uint64_t>::max());
  }
  if (numel > limits_.max_tensor_numel) {
    error(ErrorCode::tensor_numel_limit, numel, " elements exceed max_tensor_numel ", limits_.max_tensor_numel);
  }
  const std::size_t itemsize = dtype_itemsize(dtype);
  const std::string_view bytes = text(data);
  if (numel * itemsize != bytes.size()) {
    error(ErrorCode::numpy_array_invalid, "a NumPy array of shape ", shape_text(sizes), " and dtype ",
          dtype_name(dtype), " needs ", numel * itemsize, " bytes, its data has ", bytes.size());
  }
  if (++tensor_count_ > limits_.max_tensors) {
    error(ErrorCode::tensor_count_limit, "more than max_tensors ", limits_.max_tensors, " tensors");
  }
  std::vector<std::byte> copy(reinterpret_cast<const std::byte*>(bytes.data()),
                              reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
  if (numpy_dtypes_[element(state, first + 1).index].byte_order == '>' && itemsize > 1) {
    // Complex numbers swap each half.
    const std::size_t unit = dtype == DType::complex64 || dtype == DType::complex128 ? itemsize / 2 : itemsize;
    for (std::size_t at = 0; at < copy.size(); at += unit) std::reverse(copy.begin() + at, copy.begin() + at + unit);
  }
  TensorData tensor;
  tensor.dtype = dtype;
  tensor.storage = Storage::copy_of(copy);
  tensor.from_numpy = true;
  // Row-major strides, or column-major for a Fortran-ordered array.
  Dims strides;
  strides.assign(sizes.size(), 1);
  std::int64_t step = 1;
  if (fortran.boolean) {
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      strides[d] = step;
      step *= std::max<std::int64_t>(sizes[d], 1);
    }
  } else {
    for (std::size_t d = sizes.size(); d-- > 0;) {
      strides[d] = step;
      step *= std::max<std::int64_t>(sizes[d], 1);
    }
  }
  tensor.sizes = std::move(sizes);
  tensor.strides = std::move(strides);
  Item item = value_item(Value::tensor(std::move(tensor)));
  item.nodes = state.nodes;
  return item;
}

// multiarray.scalar(dtype, bytes): a NumPy scalar, read as its plain value
// tagged with its dtype (Value::numpy_scalar).
Item Machine::reduce_numpy_scalar(const Item& args) {
  if (tuple_size(args) != 2 || element(args, 1).kind != ItemKind::bytes) {
    error(ErrorCode::pickle_call_args_invalid, "numpy scalar takes exactly (dtype, bytes)");
  }
  const DType dtype = numpy_element_type(element(args, 0), "a NumPy scalar");
  std::string bytes(text(element(args, 1)));
  if (bytes.size() != dtype_itemsize(dtype)) {
    error(ErrorCode::numpy_array_invalid, "a NumPy ", dtype_name(dtype), " scalar has ", bytes.size(),
          " bytes, not ", dtype_itemsize(dtype));
  }
  if (numpy_dtypes_[element(args, 0).index].byte_order == '>') {
    // A complex number is two floats, each in the file's byte order.
    const bool complex = dtype == DType::complex64 || dtype == DType::complex128;
    const std::size_t unit = complex ? bytes.size() / 2 : bytes.size();
    for (std::size_t at = 0; at < bytes.size(); at += unit) std::reverse(bytes.begin() + at, bytes.begin() + at + unit);
  }
  const auto load = [&bytes]<typename T>(T) {
    T out;
    std::memcpy(&out, bytes.data(), sizeof out);
    return out;
  };
  const auto scalar = [&](Value plain) { return value_item(Value::numpy_scalar(dtype, std::move(plain))); };
  switch (dtype) {
    case DType::boolean: return scalar(Value::boolean(bytes[0] != 0));
    case DType::int8: return scalar(Value::integer(load(std::int8_t{})));
    case DType::int16: return scalar(Value::integer(load(std::int16_t{})));
    case DType::int32: return scalar(Value::integer(load(std::int32_t{})));
    case DType::int64: return scalar(Value::integer(load(std::int64_t{})));
    case DType::uint8: return scalar(Value::integer(load(std::uint8_t{})));
    case DType::uint16: return scalar(Value::integer(load(std::uint16_t{})));
    case DType::uint32: return scalar(Value::integer(load(std::uint32_t{})));
    case DType::uint64: {
      const std::uint64_t value = load(std::uint64_t{});
      if (value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return scalar(Value::integer(static_cast<std::int64_t>(value)));
      }
      // 2^63 and above: a Python int, as NumPy's own unpickling gives (the
      // little-endian bytes and a zero byte for the sign).
      std::string little_endian(9, '\0');
      for (std::size_t i = 0; i < 8; ++i) little_endian[i] = static_cast<char>((value >> (8 * i)) & 0xff);
      return scalar(Value::integer_of_bytes(little_endian));
    }
    case DType::float32: return scalar(Value::floating(narrow_float_to_double(load(std::uint32_t{}), 23)));
    case DType::float64: return scalar(Value::floating(load(double{})));
    case DType::float16: return scalar(Value::floating(narrow_float_to_double(load(std::uint16_t{}), 10)));
    case DType::complex64: {
      const auto parts = load(std::array<std::uint32_t, 2>{});
      return scalar(Value::complex_number({narrow_float_to_double(parts[0], 23), narrow_float_to_double(parts[1], 23)}));
    }
    case DType::complex128: {
      const auto parts = load(std::array<double, 2>{});
      return scalar(Value::complex_number({parts[0], parts[1]}));
    }
    default: break;
  }
  error(ErrorCode::numpy_dtype_unsupported, "a NumPy ", dtype_name(dtype), " scalar has no plain Python value");
}

// ---- record objects ----------------------------------------------------------------------

// NEWOBJ (cls, args): cls.__new__(cls, *args), which is how pickle makes a
// dataclass (copyreg.__newobj__ with no arguments). Only a record class.
void Machine::do_newobj() {
  require(2);
  const Item args = pop();
  const Item cls = pop();
  if (cls.kind != ItemKind::global || cls.global.kind != GlobalKind::record_class) {
    error(ErrorCode::pickle_call_forbidden, "NEWOBJ of a ", describe(cls),
          "; only the record classes of docs/format.md are made");
  }
  const std::string name = record_class_name(cls.global.record);
  if (args.kind != ItemKind::tuple || tuple_size(args) != 0) {
    error(ErrorCode::pickle_record_invalid, name, " takes no arguments, not a ", describe(args),
          args.kind == ItemKind::tuple ? " of " + std::to_string(tuple_size(args)) : std::string());
  }
  count_elements(1);
  Dict fields;
  fields.insert(DictKey(std::string(kRecordClassKey)), Value::string(name));
  Item item = value_item(Value::dict(std::move(fields)));
  item.depth = 1;
  item.nodes = 2;
  item.holds_mutable = true;
  records_.emplace(values_[item.index].node_identity(), Record{cls.global.record, false});
  push(item);
}

Machine::Record* Machine::record_of(const Item& item) {
  if (item.kind != ItemKind::value || !values_[item.index].is_dict()) return nullptr;
  const auto found = records_.find(values_[item.index].node_identity());
  return found == records_.end() ? nullptr : &found->second;
}

// BUILD on a record: its fields, once. A dict names any of them (dataclass
// defaults stand for the rest); a class that pickles a tuple gives all of
// them in order.
void Machine::build_record(Item& target, Record& record, const Item& state) {
  const RecordClass& cls = kRecordClasses[record.cls];
  const std::string name = record_class_name(record.cls);
  if (record.built) error(ErrorCode::pickle_record_invalid, name, " is built twice");
  if (state.vm_only) error(ErrorCode::pickle_record_invalid, "the state of ", name, " is a ", describe(state));
  const Value fields = take_value(state, "a record's state");
  record.built = true;
  add_child(target, state);
  const auto fields_named = std::span(cls.fields.data(), cls.field_count);
  if (cls.tuple_state) {
    if (!fields.is_tuple() || fields.as_list().size() != cls.field_count) {
      error(ErrorCode::pickle_record_invalid, name, " takes a tuple of ", int{cls.field_count},
            " values as its state, not a ", value_kind_name(fields.kind()),
            fields.is_sequence() ? " of " + std::to_string(fields.as_list().size()) : std::string());
    }
    count_elements(cls.field_count);
    Dict& out = make_mutable(target).mutable_dict();
    for (std::size_t i = 0; i < cls.field_count; ++i) out.insert(DictKey(std::string(fields_named[i])), fields.as_list()[i]);
    return;
  }
  if (fields.kind() != ValueKind::dict) {
    error(ErrorCode::pickle_record_invalid, name, " takes a dict of its fields as its state, not a ",
          value_kind_name(fields.kind()));
  }
  count_elements(fields.as_dict().size());
  Dict& out = make_mutable(target).mutable_dict();
  for (const auto& [key, value] : fields.as_dict()) {
    if (!key.is_string() || std::find(fields_named.begin(), fields_named.end(), key.as_string()) == fields_named.end()) {
      error(ErrorCode::pickle_record_invalid, name, " has no field ", printable(key.to_string()));
    }
    out.insert(key, value);
  }
}

// A dict keyed by records (DCP's storage_data, keyed by MetadataIndex) is
// read as a list of (key, value) tuples, since a Value's dict keys are str or
// int. Its keys are all records: the first one turns the empty dict into the
// list, which then takes nothing else.
void Machine::set_record_keyed_item(Item& target, const Item& key, const Item& value) {
  if (!is_record_keyed(target)) {
    const auto kind = value_kind(target);
    if (kind != ValueKind::dict || record_of(target)) {
      error(ErrorCode::pickle_setitem_target, "the target is a ",
            record_of(target) ? record_class_name(record_of(target)->cls) + " record" : describe(target),
            ", not a dict");
    }
    if (!is_empty_dict(target)) {
      error(ErrorCode::pickle_dict_key_invalid, "a ", describe(key),
            " key in a dict that has other keys; a dict's keys are all records or none is");
    }
    check_not_shared(target);
    Value& container = make_mutable(target);
    container = Value::list();
    record_keyed_.insert(container.node_identity());
  }
  if (key.kind != ItemKind::value || !records_.contains(values_[key.index].node_identity())) {
    error(ErrorCode::pickle_dict_key_invalid, "a ", describe(key), " key in a dict keyed by records");
  }
  check_not_shared(target);
  count_elements(1);
  add_child(target, key);
  add_child(target, value);
  Value pair = Value::tuple({take_value(key, "a dict key"), take_element(value, "a dict value")});
  make_mutable(target).mutable_list().push_back(std::move(pair));
  note_size(target);
}

// torch.Size((n, ...)): the tuple of ints itself.
Item Machine::reduce_torch_size(const Item& args) {
  if (tuple_size(args) != 1 || element(args, 0).kind != ItemKind::tuple) {
    error(ErrorCode::pickle_call_args_invalid, "torch.Size takes one tuple of ints");
  }
  const Item& sizes = element(args, 0);
  for (std::size_t i = 0; i < tuple_size(sizes); ++i) {
    if (element(sizes, i).kind != ItemKind::integer) {
      error(ErrorCode::pickle_call_args_invalid, "torch.Size element ", i, " is a ", describe(element(sizes, i)),
            ", not an int");
    }
  }
  Item size = sizes;
  size.torch_size = true;
  return size;
}

// complex(real, imag): how Python pickles a complex number (two floats; ints
// are taken too, as complex() takes them).
Item Machine::reduce_complex(const Item& args) {
  const auto part = [&](std::size_t i) -> double {
    const Item& item = element(args, i);
    if (item.kind == ItemKind::floating) return item.floating;
    if (item.kind == ItemKind::integer) return static_cast<double>(item.integer);
    error(ErrorCode::pickle_call_args_invalid, "complex takes (real, imag) as floats, not a ", describe(item));
  };
  if (tuple_size(args) != 2) error(ErrorCode::pickle_call_args_invalid, "complex takes exactly (real, imag)");
  return value_item(Value::complex_number({part(0), part(1)}));
}

// set() or set([items...]), as Python pickles a set at protocol 2 (a list of
// its items). The items are kept in the file's order; Python's set() drops
// any that compare equal. Only hashable items (valid_set_item).
Item Machine::reduce_set(const Item& args) {
  if (tuple_size(args) == 0) return value_item(Value::set());
  if (tuple_size(args) != 1 || value_kind(element(args, 0)) != ValueKind::list) {
    error(ErrorCode::pickle_call_args_invalid, "set takes () or one list of items");
  }
  const Value items = take_value(element(args, 0), "the set's items");
  // The same words whether tensors are kept or dropped (a scan), since the
  // dropped ones read as None.
  const bool hashable = !holds_dropped_tensor(items) &&
                        std::all_of(items.as_list().begin(), items.as_list().end(),
                                    [](const Value& item) { return valid_set_item(item); });
  if (!hashable) {
    error(ErrorCode::pickle_call_args_invalid, "a set item is a list, dict or tensor, or a tuple holding one; a set ",
          "holds only scalars, str, bytes and tuples of them");
  }
  Item item = value_item(Value::set(items.as_list()));
  // args = (items,): the set sits one level shallower and holds the same nodes.
  item.depth = std::max<std::uint32_t>(1, args.depth - 1);
  item.nodes = args.nodes;
  return item;
}

bool Machine::holds_dropped_tensor(const Value& value) const {
  if (!options_.drop_tensors || !(value.is_list() || value.is_tuple())) return false;
  if (sequences_with_dropped_tensors_.contains(value.node_identity())) return true;
  return std::any_of(value.as_list().begin(), value.as_list().end(),
                     [this](const Value& item) { return holds_dropped_tensor(item); });
}

// bytearray() or bytearray(bytes): the bytes pickled as bytes at protocol 2
// (_codecs.encode or bytes()).
Item Machine::reduce_bytearray(const Item& args) {
  if (tuple_size(args) == 0) return value_item(Value::bytearray(std::string()));
  if (tuple_size(args) != 1 || element(args, 0).kind != ItemKind::bytes) {
    error(ErrorCode::pickle_call_args_invalid, "bytearray takes () or one bytes object");
  }
  return value_item(Value::bytearray(std::string(text(element(args, 0)))));
}

// torch.device(type) or torch.device(type, index), as torch pickles a device;
// also torch.device('cuda:1').
Item Machine::reduce_device(const Item& args) {
  const std::size_t count = tuple_size(args);
  if (count < 1 || count > 2 || element(args, 0).kind != ItemKind::text) {
    error(ErrorCode::pickle_call_args_invalid, "torch.device takes (type) or (type, index)");
  }
  std::string name(text(element(args, 0)));
  if (count == 2) {
    const Item& index = element(args, 1);
    if (index.kind == ItemKind::integer && name.find(':') == std::string::npos) {
      name += ":" + std::to_string(index.integer);
    } else if (index.kind != ItemKind::none) {
      error(ErrorCode::pickle_call_args_invalid, "torch.device's index is a ", describe(index), ", not an int");
    }
  }
  if (!valid_device_name(name)) {
    error(ErrorCode::pickle_call_args_invalid, "'", printable(name), "' is not a torch.device");
  }
  return value_item(Value::device(std::move(name)));
}

// torch.serialization._get_layout('torch.strided'): the layout's name.
Item Machine::reduce_get_layout(const Item& args) {
  const bool named = tuple_size(args) == 1 && element(args, 0).kind == ItemKind::text &&
                     valid_layout_name(text(element(args, 0)));
  if (!named) error(ErrorCode::pickle_call_args_invalid, "_get_layout takes one torch layout name, as 'torch.strided'");
  return value_item(Value::layout(std::string(text(element(args, 0)))));
}

// DCP's _MEM_FORMAT_ENCODING(n), n in 0..2: the memory format's name.
Item Machine::reduce_memory_format_code(const Item& args) {
  const bool coded = tuple_size(args) == 1 && element(args, 0).kind == ItemKind::integer &&
                     element(args, 0).integer >= 0 &&
                     element(args, 0).integer < static_cast<std::int64_t>(std::size(kMemoryFormatNames));
  if (!coded) error(ErrorCode::pickle_call_args_invalid, "_MEM_FORMAT_ENCODING takes one int in 0..2");
  return text_item(ItemKind::text, kMemoryFormatNames[element(args, 0).integer]);
}

// pathlib.PosixPath('a', 'b'): the joined path, as a str ("a/b").
Item Machine::reduce_posix_path(const Item& args) {
  std::string joined;
  for (std::size_t i = 0; i < tuple_size(args); ++i) {
    if (element(args, i).kind != ItemKind::text) {
      error(ErrorCode::pickle_call_args_invalid, "PosixPath takes str parts, not a ", describe(element(args, i)));
    }
    const std::string_view part = text(element(args, i));
    if (part.starts_with('/')) joined.clear();
    else if (!joined.empty() && !joined.ends_with('/')) joined += '/';
    joined += part;
    if (joined.size() > limits_.max_string_bytes) {
      error(ErrorCode::pickle_string_too_long, "a path longer than max_string_bytes ", limits_.max_string_bytes);
    }
  }
  return value_item(Value::string(joined.empty() ? "." : std::move(joined)));
}

void Machine::do_build() {
  require(2);
  const Item state = pop();
  Item& target = stack_.back();
  if (target.kind == ItemKind::numpy_dtype) {
    build_numpy_dtype(target, state);
    return;
  }
  if (target.kind == ItemKind::numpy_array) {
    const std::size_t array = target.index;
    target = build_numpy_array(state);
    // pickle memoizes the array before its BUILD and BUILD fills that same
    // object, so the memo's entry is the built array from now on (a fetch
    // shares it, as torch.load does).
    std::erase_if(unbuilt_arrays_in_memo_, [&](const std::pair<std::size_t, std::uint64_t>& entry) {
      if (entry.first != array) return false;
      Item* slot = keep_fetched_only_ ? kept_slot(entry.second)
                   : entry.second < memo_.size() ? &memo_[static_cast<std::size_t>(entry.second)]
                                                 : nullptr;
      if (slot && slot->kind == ItemKind::numpy_array && slot->index == array) *slot = target;
      return true;
    });
    return;
  }
  if (Record* record = record_of(target)) {
    build_record(target, *record, state);
    return;
  }
  if (value_kind(target) != ValueKind::ordered_dict) {
    error(ErrorCode::pickle_build_forbidden, "BUILD on a ", describe(target),
          "; only an OrderedDict (its _metadata), a NumPy dtype or a NumPy array take a state");
  }
  if (target.kind == ItemKind::value && values_[target.index].as_dict().metadata()) {
    error(ErrorCode::pickle_build_forbidden, "the OrderedDict already has _metadata");
  }
  if (state.vm_only) error(ErrorCode::pickle_build_forbidden, "the state is a ", describe(state));
  check_not_shared(target);
  const Value state_value = take_value(state, "the state");
  validate_metadata(state_value);
  add_child(target, state);
  make_mutable(target).mutable_dict().set_metadata(*state_value.as_dict().find(kMetadataKey));
  note_size(target);
}

// ---- the tensor fast path ---------------------------------------------------------------

// torch.save and holdpoint's writer pickle every tensor as the same run of
// about twenty opcodes:
//
//   rebuild MARK MARK 'storage' type key location numel TUPLE BINPERSID
//     offset size stride requires_grad OrderedDict EMPTY_TUPLE REDUCE TUPLE REDUCE
//
// where `rebuild` is torch._utils._rebuild_tensor_v2 and `type` a storage
// class (each a GLOBAL, or a BINGET of one), 'storage' and the location are
// str (or BINGETs of them), size and stride are tuples of small ints, and
// torch.save follows most objects with a BINPUT. Stepping through it one stack
// operation at a time is most of what a state dict costs to read, so this
// reads the run ahead without changing any state. Only when every opcode is
// one it expects, no limit would be reached on the way, and no BINPUT stores
// an entry the pickle fetches again, does it apply the run's effects at once:
// the memo and the counters, then the storage and the tensor through the very
// checks BINPERSID and REDUCE run (storage_item, tensor_item), with
// op_offset_ at those opcodes so that errors read the same. Otherwise it
// returns false and the loop decodes the run opcode by opcode, so the result,
// and the first error, are those of the ordinary VM (pickle_fuzz compares the
// two).
bool Machine::try_tensor_fast_path() {
  if (in_frame_ || options_.persistent_ids != PersistentIdForm::zip) return false;
  if (marks_.size() + 3 > limits_.max_mark_depth || limits_.max_nesting_depth < 2) return false;
  const std::size_t end = window_end_;
  std::size_t p = pos_;
  std::uint64_t ops = 0;
  std::uint64_t memo_size = memo_size_;
  std::uint64_t expanded = expanded_nodes_;

  const auto code_at_p = [&]() -> int { return p < end ? std::to_integer<std::uint8_t>(data_[p]) : -1; };
  const auto opcode = [&](std::uint8_t code) {
    if (code_at_p() != code) return false;
    ++p;
    ++ops;
    return true;
  };
  const auto le = [&](std::size_t n, std::uint64_t& out) {
    if (n > end - p) return false;
    out = 0;
    for (std::size_t i = 0; i < n; ++i) out |= std::uint64_t{std::to_integer<std::uint8_t>(data_[p + i])} << (8 * i);
    p += n;
    return true;
  };
  // An optional BINPUT, LONG_BINPUT or MEMOIZE, of an entry nothing fetches.
  const auto put = [&] {
    const int code = code_at_p();
    std::uint64_t index = memo_size;
    if (code == op::BINPUT || code == op::LONG_BINPUT) {
      ++p;
      if (!le(code == op::BINPUT ? 1 : 4, index)) return false;
    } else if (code == op::MEMOIZE) {
      ++p;
    } else {
      return true;
    }
    ++ops;
    if (index > memo_size) return false;
    if (index == memo_size) {
      if (memo_size >= limits_.max_memo_entries) return false;
      ++memo_size;
    }
    return keep_fetched_only_ && kept_slot(index) == nullptr;
  };
  // A BINGET or LONG_BINGET of an entry that may be shared; nullptr otherwise.
  const auto get = [&]() -> const Item* {
    const int code = code_at_p();
    if (code != op::BINGET && code != op::LONG_BINGET) return nullptr;
    ++p;
    std::uint64_t index = 0;
    if (!le(code == op::BINGET ? 1 : 4, index)) return nullptr;
    ++ops;
    if (index >= memo_size) return nullptr;
    const Item* slot = keep_fetched_only_ ? kept_slot(index)
                                          : (index < memo_.size() ? &memo_[static_cast<std::size_t>(index)] : nullptr);
    if (!slot || slot->holds_mutable) return nullptr;
    expanded = saturating_add(expanded, slot->nodes);
    return expanded <= limits_.max_expanded_nodes ? slot : nullptr;
  };
  const auto line = [&](std::string_view& out) {
    const std::size_t limit = std::min(end - p, op::kMaxGlobalPartBytes + 1);
    const void* newline = std::memchr(data_ + p, '\n', limit);
    if (!newline) return false;
    const auto length = static_cast<std::size_t>(static_cast<const std::byte*>(newline) - (data_ + p));
    out = {reinterpret_cast<const char*>(data_ + p), length};
    p += length + 1;
    return true;
  };
  // The global `kind` (a storage class for storage_type), as a GLOBAL or a
  // BINGET, and its BINPUT.
  const auto global = [&](GlobalKind kind, GlobalRef& out) {
    if (code_at_p() != op::GLOBAL) {
      const Item* item = get();
      if (!item || item->kind != ItemKind::global || item->global.kind != kind) return false;
      out = item->global;
      return put();
    }
    ++p;
    ++ops;
    std::string_view module, name;
    if (!line(module) || !line(name)) return false;
    constexpr DType kNoDType = DType::uint8;
    switch (kind) {
      case GlobalKind::rebuild_tensor_v2:
        if (module != "torch._utils" || name != "_rebuild_tensor_v2") return false;
        out = {kind, kNoDType, 0};
        break;
      case GlobalKind::ordered_dict:
        if (module != "collections" || name != "OrderedDict") return false;
        out = {kind, kNoDType, 0};
        break;
      case GlobalKind::storage_type: {
        const auto dtype = module == "torch" ? dtype_from_storage_class(name) : std::nullopt;
        if (!dtype) return false;
        out = {kind, *dtype, 0};
        break;
      }
      default: return false;
    }
    return put();
  };
  // A str of at most 64 printable ASCII bytes, or a BINGET of a str, and its
  // BINPUT.
  const auto str = [&](std::string_view& out) {
    const int code = code_at_p();
    if (code != op::SHORT_BINUNICODE && code != op::BINUNICODE) {
      const Item* item = get();
      if (!item || item->kind != ItemKind::text) return false;
      out = text(*item);
      return put();
    }
    ++p;
    ++ops;
    std::uint64_t length = 0;
    if (!le(code == op::SHORT_BINUNICODE ? 1 : 4, length)) return false;
    if (length > 64 || length > limits_.max_string_bytes || length > end - p) return false;
    const auto* chars = reinterpret_cast<const char*>(data_ + p);
    for (std::size_t i = 0; i < length; ++i) {
      if (chars[i] < 0x20 || chars[i] > 0x7E) return false;
    }
    out = {chars, static_cast<std::size_t>(length)};
    p += static_cast<std::size_t>(length);
    return put();
  };
  const auto integer = [&](std::int64_t& out) {
    const int code = code_at_p();
    std::uint64_t bits = 0;
    if (code == op::BININT1 || code == op::BININT2) {
      ++p;
      if (!le(code == op::BININT1 ? 1 : 2, bits)) return false;
      out = static_cast<std::int64_t>(bits);
    } else if (code == op::BININT) {
      ++p;
      if (!le(4, bits)) return false;
      out = static_cast<std::int32_t>(static_cast<std::uint32_t>(bits));
    } else {
      return false;
    }
    ++ops;
    return true;
  };
  const auto is_integer = [&] {
    const int code = code_at_p();
    return code == op::BININT1 || code == op::BININT2 || code == op::BININT;
  };
  // () or a tuple of ints (TUPLE1..3, or MARK ... TUPLE), and its BINPUT.
  const auto int_tuple = [&](Dims& out) {
    if (opcode(op::EMPTY_TUPLE)) return put();
    const bool marked = opcode(op::MARK);
    std::int64_t value = 0;
    while (is_integer()) {
      if (out.size() >= limits_.max_tensor_rank || !integer(value)) return false;
      out.push_back(value);
    }
    const bool closed = marked ? opcode(op::TUPLE)
                               : (out.size() == 1 && opcode(op::TUPLE1)) || (out.size() == 2 && opcode(op::TUPLE2)) ||
                                     (out.size() == 3 && opcode(op::TUPLE3));
    return closed && put();
  };

  GlobalRef rebuild{}, type{}, hooks{};
  std::string_view tag, key, location;
  std::int64_t numel = 0, offset = 0;
  Dims sizes, strides;
  if (!global(GlobalKind::rebuild_tensor_v2, rebuild) || !opcode(op::MARK) || !opcode(op::MARK)) return false;
  if (!str(tag) || tag != "storage" || !global(GlobalKind::storage_type, type) || !str(key) || !str(location) ||
      !integer(numel) || !opcode(op::TUPLE) || !put()) {
    return false;
  }
  const std::size_t persid_at = p;
  if (!opcode(op::BINPERSID) || !integer(offset) || !int_tuple(sizes) || !int_tuple(strides)) return false;
  const bool requires_grad = code_at_p() == op::NEWTRUE;
  if (!opcode(requires_grad ? op::NEWTRUE : op::NEWFALSE)) return false;
  if (!global(GlobalKind::ordered_dict, hooks) || !opcode(op::EMPTY_TUPLE) || !opcode(op::REDUCE) || !put() ||
      !opcode(op::TUPLE) || !put()) {
    return false;
  }
  const std::size_t reduce_at = p;
  if (!opcode(op::REDUCE)) return false;

  // The ordinary VM would hold at most this many items and count these
  // container elements (the persistent id, size, stride, the hooks'
  // arguments and the rebuild arguments) on the way.
  const std::uint64_t elements = 5 + sizes.size() + strides.size() + 0 + 6;
  if (opcode_count_ + ops > limits_.max_opcodes ||
      stack_.size() + 10 + sizes.size() + strides.size() >= limits_.max_stack_items ||
      saturating_add(container_elements_, elements) > limits_.max_container_elements) {
    return false;
  }
  opcode_count_ += ops;
  memo_size_ = memo_size;
  expanded_nodes_ = expanded;
  count_elements(elements);
  op_offset_ = persid_at;
  op_ = op::BINPERSID;
  const Item storage = storage_item(type, key, location, numel);
  op_offset_ = reduce_at;
  op_ = op::REDUCE;
  const Item tensor =
      tensor_item(storage_refs_[storage.index], type.dtype, offset, requires_grad, std::move(sizes), std::move(strides));
  pos_ = p;
  push(tensor);
  ++fast_path_tensors_;
  return true;
}

// Between two opcodes every view the machine holds into the pickle is a
// string in texts_ or a key in storage_refs_ (stack items, kept memo entries
// and tuple elements name texts_ entries by index). The ones into bytes not
// yet spent are copied out, and everything before the read position is
// reported spent. Views made from here on see bytes at or past it: the
// machine only reads forward.
void Machine::spend() {
  const auto begin = reinterpret_cast<std::uintptr_t>(data_);
  const auto copy_if_spent = [&](std::string_view& view) {
    const auto at = reinterpret_cast<std::uintptr_t>(view.data());
    if (at >= begin + spent_ && at < begin + pos_) view = text_copies_.keep(view);
  };
  for (Text& text : texts_) copy_if_spent(text.text);
  // A key found by its number is never compared again; storage_key rebuilds
  // it for a message.
  for (; keys_copied_ < storage_refs_.size(); ++keys_copied_) {
    StorageRef& ref = storage_refs_[keys_copied_];
    std::string_view key = found_by_number(keys_copied_) ? std::string_view() : ref.key();
    copy_if_spent(key);
    ref.set_key(key);
  }
  spent_ = pos_;
  next_spend_at_ = pos_ + spend_every();
  options_.on_spent(spent_);
}

// ---- the loop ---------------------------------------------------------------------------

PickleResult Machine::run() {
  if (!allow_trailing_bytes_) {
    if (size_ > limits_.max_pickle_bytes) {
      detail::fail(ErrorCode::pickle_too_large, "the pickle has ", size_, " bytes, more than max_pickle_bytes ",
                   limits_.max_pickle_bytes);
    }
  }
  if (keep_fetched_only_) {
    if (auto fetched = fetched_memo_indices(data_, window_end_, limits_.max_memo_entries)) {
      fetched_ = std::move(*fetched);
      kept_.resize(fetched_.size());
      compact_at_ = 8192;
    } else {
      keep_fetched_only_ = false;
    }
  }
  if (!allow_trailing_bytes_) reserve_for_dense_state_dict();
  if (options_.on_spent && keep_fetched_only_ && !allow_trailing_bytes_) next_spend_at_ = spend_every();
  for (;;) {
    if (pos_ >= next_spend_at_) spend();
    op_offset_ = pos_;
    if (pos_ >= window_end_) {
      if (window_end_ < size_) {
        detail::fail(ErrorCode::pickle_too_large, "pickle offset ", pos_, ": no STOP within max_pickle_bytes ",
                     limits_.max_pickle_bytes);
      }
      detail::fail(ErrorCode::pickle_truncated, "pickle offset ", pos_, ": the pickle ends before STOP");
    }
    if (options_.tensor_fast_path) {
      const auto code = std::to_integer<std::uint8_t>(data_[pos_]);
      if ((code == op::GLOBAL || code == op::BINGET || code == op::LONG_BINGET) && try_tensor_fast_path()) continue;
    }
    op_ = take_u8();
    if (++opcode_count_ > limits_.max_opcodes) {
      error(ErrorCode::pickle_opcode_limit, "more than max_opcodes ", limits_.max_opcodes, " opcodes");
    }
    switch (op_) {
      case op::PROTO: do_proto(); break;
      case op::FRAME: begin_frame(); break;
      case op::STOP: {
        if (!marks_.empty() || stack_.size() != 1) {
          error(ErrorCode::pickle_stop_invalid, stack_.size(), " stack items and ", marks_.size(),
                " open MARKs; expected one item and none");
        }
        Value root = take_value(stack_.back(), "the pickled object");
        if (!allow_trailing_bytes_ && pos_ != size_) {
          error(ErrorCode::pickle_trailing_bytes, size_ - pos_, " bytes follow STOP");
        }
        PickleResult result;
        result.root = std::move(root);
        result.consumed = pos_;
        result.protocol = protocol_;
        result.uses_binfloat = uses_binfloat_;
        result.tensor_count = tensor_count_;
        result.storage_count = storage_refs_.size();
        result.fast_path_tensors = fast_path_tensors_;
        return result;
      }
      case op::MARK:
        if (marks_.size() >= limits_.max_mark_depth) {
          error(ErrorCode::pickle_mark_limit, "more than max_mark_depth ", limits_.max_mark_depth, " open MARKs");
        }
        marks_.push_back(stack_.size());
        break;
      case op::EMPTY_DICT: push(empty_container_item(ValueKind::dict)); break;
      case op::EMPTY_LIST: push(empty_container_item(ValueKind::list)); break;
      // An empty set (protocol 4). torch's safe loader has no ADDITEMS, so
      // it stays empty: a value, not a container to fill.
      case op::EMPTY_SET: push(value_item(Value::set())); break;
      case op::EMPTY_TUPLE: do_tuple(0, false); break;
      case op::TUPLE: do_tuple(0, true); break;
      case op::TUPLE1: do_tuple(1, false); break;
      case op::TUPLE2: do_tuple(2, false); break;
      case op::TUPLE3: do_tuple(3, false); break;
      // A container just took in what was above it: the moment the stack
      // refers least to recent arena entries.
      case op::SETITEM: do_setitem(false); maybe_compact(); break;
      case op::SETITEMS: do_setitem(true); maybe_compact(); break;
      case op::APPEND: do_append(false); maybe_compact(); break;
      case op::APPENDS: do_append(true); maybe_compact(); break;
      case op::NONE: push(Item()); break;
      case op::NEWTRUE: push(boolean_item(true)); break;
      case op::NEWFALSE: push(boolean_item(false)); break;
      case op::BININT1: push(integer_item(static_cast<std::int64_t>(take_le(1)))); break;
      case op::BININT2: push(integer_item(static_cast<std::int64_t>(take_le(2)))); break;
      case op::BININT:
        push(integer_item(static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4)))));
        break;
      case op::LONG1: do_long1(); break;
      case op::INT: do_int_line(); break;
      case op::LONG: do_long_line(); break;
      case op::BINFLOAT: {
        const std::byte* p = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | std::to_integer<std::uint8_t>(p[i]);  // big-endian
        uses_binfloat_ = true;
        push(floating_item(std::bit_cast<double>(bits)));
        break;
      }
      case op::SHORT_BINUNICODE: push(take_string(take_le(1), false)); break;
      case op::BINUNICODE: push(take_string(take_le(4), false)); break;
      case op::BINUNICODE8: push(take_string(take_le(8), false)); break;
      case op::SHORT_BINSTRING: push(take_string(take_le(1), true)); break;
      case op::BINSTRING: {
        const auto length = static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4)));
        if (length < 0) error(ErrorCode::pickle_string_invalid, "negative length ", length);
        push(take_string(static_cast<std::uint64_t>(length), true));
        break;
      }
      case op::SHORT_BINBYTES: push(take_bytes(take_le(1))); break;
      case op::BINBYTES: push(take_bytes(take_le(4))); break;
      case op::BINPUT: memo_put(take_le(1)); break;
      case op::LONG_BINPUT: memo_put(take_le(4)); break;
      case op::MEMOIZE: memo_put(memo_size_); break;
      case op::BINGET: memo_get(take_le(1)); break;
      case op::LONG_BINGET: memo_get(take_le(4)); break;
      case op::GLOBAL: do_global(); break;
      case op::STACK_GLOBAL: do_stack_global(); break;
      case op::REDUCE: do_reduce(); break;
      case op::BUILD: do_build(); break;
      case op::NEWOBJ: do_newobj(); break;
      case op::BINPERSID: do_binpersid(); break;
      default: {
        constexpr char kHex[] = "0123456789abcdef";
        const std::string hex = {'0', 'x', kHex[op_ >> 4], kHex[op_ & 15]};
        error(ErrorCode::pickle_opcode_forbidden, "opcode ", hex, " is not on the allowlist");
      }
    }
  }
}

}  // namespace

PickleResult read_pickle(std::span<const std::byte> pickle, StorageResolver& storages, const Limits& limits,
                         const PickleOptions& options, bool allow_trailing_bytes) {
  try {
    Machine machine(pickle, storages, limits, options, allow_trailing_bytes, options.keep_fetched_memo_only);
    return machine.run();
  } catch (const MemoNotKept&) {
    Machine machine(pickle, storages, limits, options, allow_trailing_bytes, false);
    return machine.run();
  }
}

}  // namespace holdpoint::format
