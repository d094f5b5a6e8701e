// The restricted pickle VM. See pickle_reader.h for the contract and
// docs/format.md ("Pickle allowlist") / the format reference §7.3 for the rules.
//
// Shape of the machine: a stack of Items split into frames by MARK (as in
// CPython, an opcode sees only the items above the newest MARK), a memo of
// Items, and a cache of storages by key. An Item is a Value, or one of the
// things only the VM handles: an allowlisted global, a storage from BINPERSID,
// or a tuple that holds such things (persistent ids and REDUCE arguments).
// Every Item carries the size of its subtree counted through shared references,
// its container nesting depth, and whether a mutable container is reachable
// from it; the first bounds BINGET expansion, the last forbids aliasing.
#include "format/pickle_reader.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "common/checked_arithmetic.h"
#include "common/fail.h"
#include "format/pickle_opcodes.h"

namespace holdpoint::format {
namespace {

namespace op = pickle_op;
using detail::checked_add;
using detail::checked_mul;

enum class GlobalKind : std::uint8_t {
  ordered_dict,
  rebuild_tensor_v2,
  rebuild_tensor_v3,
  rebuild_parameter,
  codecs_encode,
  storage_type,          // torch.<X>Storage: a persistent-id tag, never called
  untyped_storage_type,  // torch.UntypedStorage: likewise
  dtype,                 // torch.<dtype>: only as _rebuild_tensor_v3's dtype
};

struct GlobalRef {
  GlobalKind kind = GlobalKind::ordered_dict;
  DType dtype = DType::uint8;  // storage_type and dtype only
};

struct StorageRef {
  StorageRequest request;
  std::shared_ptr<const Storage> storage;
};

struct Item;
using RawTuple = std::vector<Item>;

struct Item {
  std::variant<Value, GlobalRef, std::shared_ptr<const StorageRef>, std::shared_ptr<const RawTuple>> content;
  std::uint64_t nodes = 1;    // subtree size, shared references counted in full
  std::uint32_t depth = 0;    // containers nested in this item; 0 for scalars
  bool holds_mutable = false;  // a list, dict or OrderedDict is reachable

  const Value* value() const { return std::get_if<Value>(&content); }
  Value* value() { return std::get_if<Value>(&content); }
  const GlobalRef* global() const { return std::get_if<GlobalRef>(&content); }
  const StorageRef* storage() const {
    const auto* p = std::get_if<std::shared_ptr<const StorageRef>>(&content);
    return p ? p->get() : nullptr;
  }
  const RawTuple* raw_tuple() const {
    const auto* p = std::get_if<std::shared_ptr<const RawTuple>>(&content);
    return p ? p->get() : nullptr;
  }
};

Item scalar_item(Value value) {
  Item item;
  item.content = std::move(value);
  return item;
}

Item empty_container_item(Value value) {
  Item item;
  item.content = std::move(value);
  item.depth = 1;
  item.holds_mutable = true;
  return item;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return checked_add(a, b).value_or(std::numeric_limits<std::uint64_t>::max());
}

std::string global_name(const GlobalRef& global) {
  switch (global.kind) {
    case GlobalKind::ordered_dict: return "collections.OrderedDict";
    case GlobalKind::rebuild_tensor_v2: return "torch._utils._rebuild_tensor_v2";
    case GlobalKind::rebuild_tensor_v3: return "torch._utils._rebuild_tensor_v3";
    case GlobalKind::rebuild_parameter: return "torch._utils._rebuild_parameter";
    case GlobalKind::codecs_encode: return "_codecs.encode";
    case GlobalKind::storage_type: return "torch." + std::string(*dtype_storage_class(global.dtype));
    case GlobalKind::untyped_storage_type: return "torch.UntypedStorage";
    case GlobalKind::dtype: return "torch." + std::string(dtype_name(global.dtype));
  }
  return "unknown global";
}

std::string describe(const Item& item) {
  if (const Value* value = item.value()) return std::string(value_kind_name(value->kind()));
  if (const GlobalRef* global = item.global()) return "global " + global_name(*global);
  if (const StorageRef* storage = item.storage()) return "storage '" + storage->request.key + "'";
  return "tuple holding a global or storage";
}

// Read-only access to a tuple Item, whether it became a Value (all elements
// are Values) or stayed a RawTuple.
class TupleView {
 public:
  static std::optional<TupleView> of(const Item& item) {
    TupleView view;
    if (const Value* value = item.value()) {
      if (!value->is_tuple()) return std::nullopt;
      view.values_ = &value->as_list();
    } else if (const RawTuple* raw = item.raw_tuple()) {
      view.items_ = raw;
    } else {
      return std::nullopt;
    }
    return view;
  }

  std::size_t size() const { return values_ ? values_->size() : items_->size(); }
  const Value* value(std::size_t i) const { return values_ ? &(*values_)[i] : (*items_)[i].value(); }
  const GlobalRef* global(std::size_t i) const { return items_ ? (*items_)[i].global() : nullptr; }
  const StorageRef* storage(std::size_t i) const { return items_ ? (*items_)[i].storage() : nullptr; }
  std::string describe(std::size_t i) const {
    return values_ ? std::string(value_kind_name((*values_)[i].kind())) : holdpoint::format::describe((*items_)[i]);
  }

 private:
  const Value::List* values_ = nullptr;
  const RawTuple* items_ = nullptr;
};

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

class Machine {
 public:
  Machine(std::span<const std::byte> pickle, StorageResolver& storages, const Limits& limits,
          const PickleOptions& options, bool allow_trailing_bytes)
      : data_(pickle.data()),
        size_(pickle.size()),
        storages_(storages),
        limits_(limits),
        options_(options),
        allow_trailing_bytes_(allow_trailing_bytes) {
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

  // ---- input ----
  [[noreturn]] void out_of_input(std::size_t wanted) const;
  const std::byte* take(std::size_t n);
  std::uint8_t take_u8() { return std::to_integer<std::uint8_t>(*take(1)); }
  std::uint64_t take_le(std::size_t n);
  std::string_view take_line(std::size_t max_bytes, ErrorCode malformed, bool unterminated_is_malformed,
                             std::string_view what);
  std::string take_string(std::uint64_t length, bool ascii_only);
  std::string take_bytes(std::uint64_t length);
  void begin_frame();

  // ---- stack ----
  std::size_t frame_base() const { return marks_.empty() ? 0 : marks_.back(); }
  void require(std::size_t n) const;
  Item pop();
  void push(Item item);
  std::size_t pop_mark();
  void count_elements(std::uint64_t n);
  void add_child(Item& parent, const Item& child) const;
  Value take_value(Item item, std::string_view role) const;

  // ---- opcodes ----
  void do_proto();
  void do_int_line();
  void do_long_line();
  void do_long1();
  void do_tuple(std::size_t count_from_stack, bool from_mark);
  void do_append(bool from_mark);
  void do_setitem(bool from_mark);
  void set_item(Item& target, Item key, Item value);
  void memo_put(std::uint64_t index);
  void memo_get(std::uint64_t index);
  void do_global();
  void do_stack_global();
  GlobalRef resolve_global(std::string_view module, std::string_view name) const;
  void do_reduce();
  void do_build();
  void do_binpersid();

  // ---- callables ----
  Item reduce_ordered_dict(const Item& args);
  Item reduce_codecs_encode(const TupleView& args);
  Item reduce_tensor(const TupleView& args, bool v3);
  Item reduce_parameter(const TupleView& args);
  void check_hooks(const Value* hooks, std::string_view what) const;
  std::vector<std::int64_t> int_tuple(const Value* value, std::string_view what) const;
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
  std::vector<Item> memo_;
  std::unordered_map<std::string, std::shared_ptr<const StorageRef>> storage_cache_;

  std::uint64_t opcode_count_ = 0;
  std::uint64_t expanded_nodes_ = 0;
  std::uint64_t container_elements_ = 0;
  std::uint64_t tensor_count_ = 0;
  int protocol_ = 0;
  bool uses_binfloat_ = false;
};

// ---- input ----------------------------------------------------------------------------

void Machine::out_of_input(std::size_t wanted) const {
  if (window_end_ < size_) {
    error(ErrorCode::pickle_too_large, "the pickle continues past ", window_end_, " bytes (max_pickle_bytes ",
          limits_.max_pickle_bytes, ")");
  }
  error(ErrorCode::pickle_truncated, "needs ", wanted, " more bytes, ", window_end_ - pos_, " left");
}

// Every read goes through here: it stays inside the current FRAME (CPython
// refuses an opcode that straddles a frame end) and inside the window.
const std::byte* Machine::take(std::size_t n) {
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

std::uint64_t Machine::take_le(std::size_t n) {
  const std::byte* p = take(n);
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < n; ++i) value |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return value;
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

std::string Machine::take_string(std::uint64_t length, bool ascii_only) {
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
  return std::string(text);
}

std::string Machine::take_bytes(std::uint64_t length) {
  if (length > limits_.max_string_bytes) {
    error(ErrorCode::pickle_string_too_long, "length ", length, " exceeds max_string_bytes ", limits_.max_string_bytes);
  }
  const auto* p = reinterpret_cast<const char*>(take(static_cast<std::size_t>(length)));
  return std::string(p, static_cast<std::size_t>(length));
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

// ---- stack ----------------------------------------------------------------------------

void Machine::require(std::size_t n) const {
  const std::size_t available = stack_.size() - frame_base();
  if (available < n) {
    error(ErrorCode::pickle_stack_underflow, "needs ", n, " stack items, ", available, " above the last MARK");
  }
}

Item Machine::pop() {
  require(1);
  Item item = std::move(stack_.back());
  stack_.pop_back();
  return item;
}

void Machine::push(Item item) {
  if (stack_.size() >= limits_.max_stack_items) {
    error(ErrorCode::pickle_stack_limit, "more than max_stack_items ", limits_.max_stack_items, " stack items");
  }
  stack_.push_back(std::move(item));
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

Value Machine::take_value(Item item, std::string_view role) const {
  if (Value* value = item.value()) return std::move(*value);
  error(ErrorCode::pickle_type_invalid, "a ", describe(item), " cannot be ", role);
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
    push(scalar_item(Value::boolean(line == "01")));
    return;
  }
  const auto value = parse_canonical_int(line);
  if (!value) error(ErrorCode::pickle_int_invalid, "'", printable(line), "' is not a canonical decimal within int64");
  push(scalar_item(Value::integer(*value)));
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
  push(scalar_item(Value::integer(*value)));
}

void Machine::do_long1() {
  const std::uint8_t length = take_u8();
  if (length > 8) error(ErrorCode::pickle_int_invalid, "length ", int{length}, " exceeds 8 bytes (int64)");
  std::uint64_t bits = take_le(length);
  // Sign-extend the two's-complement value from `length` bytes to 64 bits.
  if (length > 0 && length < 8 && (bits >> (8 * length - 1)) & 1u) bits |= ~std::uint64_t{0} << (8 * length);
  push(scalar_item(Value::integer(static_cast<std::int64_t>(bits))));
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
  tuple.depth = 1;
  bool all_values = true;
  for (auto it = first; it != last; ++it) {
    add_child(tuple, *it);
    all_values = all_values && it->value() != nullptr;
  }
  if (all_values) {
    Value::List values;
    values.reserve(static_cast<std::size_t>(last - first));
    for (auto it = first; it != last; ++it) values.push_back(std::move(*it->value()));
    tuple.content = Value::tuple(std::move(values));
  } else {
    tuple.content = std::make_shared<const RawTuple>(std::make_move_iterator(first), std::make_move_iterator(last));
  }
  stack_.erase(first, last);
  push(std::move(tuple));
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
  Value* list = target.value();
  if (!list || !list->is_list()) {
    error(ErrorCode::pickle_append_target, "the target is a ", describe(target), ", not a list");
  }
  count_elements(stack_.size() - first);
  auto& items = list->mutable_list();
  for (std::size_t i = first; i < stack_.size(); ++i) {
    add_child(target, stack_[i]);
    items.push_back(take_value(std::move(stack_[i]), "a list element"));
  }
  stack_.resize(first);
}

void Machine::set_item(Item& target, Item key, Item value) {
  Value* dict = target.value();
  if (!dict || !dict->is_dict()) {
    error(ErrorCode::pickle_setitem_target, "the target is a ", describe(target), ", not a dict");
  }
  const Value* key_value = key.value();
  std::optional<DictKey> dict_key;
  if (key_value && key_value->is_string()) dict_key.emplace(key_value->as_string());
  if (key_value && key_value->is_int()) dict_key.emplace(key_value->as_int());
  if (!dict_key) error(ErrorCode::pickle_dict_key_invalid, "a ", describe(key), " key; keys are str or int");
  count_elements(1);
  add_child(target, key);
  add_child(target, value);
  if (!dict->mutable_dict().insert(*dict_key, take_value(std::move(value), "a dict value"))) {
    error(ErrorCode::pickle_duplicate_key, "key ", printable(dict_key->to_string()), " occurs twice");
  }
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
  for (std::size_t i = first; i < stack_.size(); i += 2) {
    set_item(target, std::move(stack_[i]), std::move(stack_[i + 1]));
  }
  stack_.resize(first);
}

// ---- memo -------------------------------------------------------------------------------

void Machine::memo_put(std::uint64_t index) {
  require(1);
  if (index > memo_.size()) {
    error(ErrorCode::pickle_memo_index_invalid, "index ", index, " skips past the memo size ", memo_.size());
  }
  if (index < memo_.size()) {
    memo_[static_cast<std::size_t>(index)] = stack_.back();
    return;
  }
  if (memo_.size() >= limits_.max_memo_entries) {
    error(ErrorCode::pickle_memo_limit, "more than max_memo_entries ", limits_.max_memo_entries, " memo entries");
  }
  memo_.push_back(stack_.back());
}

void Machine::memo_get(std::uint64_t index) {
  if (index >= memo_.size()) {
    error(ErrorCode::pickle_memo_missing, "index ", index, " was never stored (memo size ", memo_.size(), ")");
  }
  const Item& entry = memo_[static_cast<std::size_t>(index)];
  if (entry.holds_mutable) {
    error(ErrorCode::pickle_memo_mutable, "memo ", index, " is (or holds) a mutable ", describe(entry),
          "; sharing it would allow cycles and aliasing");
  }
  expanded_nodes_ = saturating_add(expanded_nodes_, entry.nodes);
  if (expanded_nodes_ > limits_.max_expanded_nodes) {
    error(ErrorCode::pickle_expansion_limit, "shared references expand past max_expanded_nodes ",
          limits_.max_expanded_nodes);
  }
  push(entry);
}

// ---- globals ----------------------------------------------------------------------------

GlobalRef Machine::resolve_global(std::string_view module, std::string_view name) const {
  if (!is_identifier_path(module) || !is_identifier_path(name)) {
    error(ErrorCode::pickle_global_malformed, "'", printable(module), "' '", printable(name),
          "' is not a dotted identifier of at most ", op::kMaxGlobalPartBytes, " bytes");
  }
  if (module == "collections" && name == "OrderedDict") return {GlobalKind::ordered_dict};
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor_v2") return {GlobalKind::rebuild_tensor_v2};
    if (name == "_rebuild_tensor_v3") return {GlobalKind::rebuild_tensor_v3};
    if (name == "_rebuild_parameter") return {GlobalKind::rebuild_parameter};
  }
  if (module == "_codecs" && name == "encode") return {GlobalKind::codecs_encode};
  if ((module == "torch" || module == "torch.storage") && name == "UntypedStorage") {
    return {GlobalKind::untyped_storage_type};
  }
  if (module == "torch") {
    if (const auto dtype = dtype_from_storage_class(name)) return {GlobalKind::storage_type, *dtype};
    if (const auto dtype = dtype_from_name(name)) return {GlobalKind::dtype, *dtype};
    if (is_quantized_storage_class(name)) {
      error(ErrorCode::storage_type_unsupported, "torch.", name, " holds quantized data, not a plain dtype");
    }
  }
  error(ErrorCode::pickle_global_forbidden, module, ".", name, " is not on the allowlist");
}

void Machine::do_global() {
  const std::size_t max = op::kMaxGlobalPartBytes;
  const std::string_view module = take_line(max, ErrorCode::pickle_global_malformed, true, "the module name");
  const std::string_view name = take_line(max, ErrorCode::pickle_global_malformed, true, "the attribute name");
  Item item;
  item.content = resolve_global(module, name);
  push(std::move(item));
}

void Machine::do_stack_global() {
  require(2);
  Item name = pop();
  Item module = pop();
  const Value* module_value = module.value();
  const Value* name_value = name.value();
  if (!module_value || !module_value->is_string() || !name_value || !name_value->is_string()) {
    error(ErrorCode::pickle_global_malformed, "module and name must be str, not ", describe(module), " and ",
          describe(name));
  }
  Item item;
  item.content = resolve_global(module_value->as_string(), name_value->as_string());
  push(std::move(item));
}

// ---- persistent ids ---------------------------------------------------------------------

void Machine::do_binpersid() {
  const Item pid = pop();
  const auto tuple = TupleView::of(pid);
  const bool legacy = options_.persistent_ids == PersistentIdForm::legacy;
  const std::size_t expected = legacy ? 6 : 5;
  if (!tuple || tuple->size() != expected) {
    error(ErrorCode::persistent_id_invalid, "the persistent id is a ", describe(pid),
          tuple ? " of " + std::to_string(tuple->size()) + " items" : std::string(), ", not a ", expected,
          "-tuple ('storage', type, key, location, numel", legacy ? ", view_metadata)" : ")");
  }
  const Value* tag = tuple->value(0);
  if (!tag || !tag->is_string() || tag->as_string() != "storage") {
    error(ErrorCode::persistent_id_invalid, "the first item is not the str 'storage'");
  }
  const GlobalRef* type = tuple->global(1);
  if (!type) error(ErrorCode::persistent_id_invalid, "the storage type is a ", tuple->describe(1), ", not a global");
  if (type->kind != GlobalKind::storage_type && type->kind != GlobalKind::untyped_storage_type) {
    error(ErrorCode::storage_type_unsupported, global_name(*type), " is not a storage type");
  }
  const Value* key = tuple->value(2);
  const Value* location = tuple->value(3);
  const Value* numel = tuple->value(4);
  if (!key || !key->is_string()) error(ErrorCode::persistent_id_invalid, "the key is a ", tuple->describe(2));
  if (!location || !location->is_string()) {
    error(ErrorCode::persistent_id_invalid, "the location is a ", tuple->describe(3));
  }
  if (!numel || !numel->is_int()) error(ErrorCode::persistent_id_invalid, "numel is a ", tuple->describe(4));
  if (legacy) {
    const Value* view_metadata = tuple->value(5);
    if (!view_metadata || !view_metadata->is_none()) {
      error(ErrorCode::legacy_view_metadata_unsupported, "view_metadata is a ", tuple->describe(5), ", not None");
    }
  }

  StorageRequest request;
  request.untyped = type->kind == GlobalKind::untyped_storage_type;
  request.dtype = request.untyped ? DType::uint8 : type->dtype;
  request.key = key->as_string();
  request.location = location->as_string();
  const std::string_view key_text = request.key;
  const bool key_ok =
      options_.canonical_storage_keys ? is_canonical_decimal(key_text, 19) : is_legacy_storage_key(key_text);
  if (!key_ok) {
    error(ErrorCode::storage_key_invalid, "key '", printable(key_text), "' is not ",
          options_.canonical_storage_keys ? "a canonical decimal of at most 19 digits"
                                          : "1..64 characters of [0-9A-Za-z_]");
  }
  if (!is_supported_location(request.location)) {
    error(ErrorCode::storage_location_unsupported, "location '", printable(request.location),
          "' is not cpu, cuda, cuda:<n> or mps");
  }
  if (numel->as_int() < 0) error(ErrorCode::storage_numel_invalid, "numel ", numel->as_int(), " is negative");
  request.numel = static_cast<std::uint64_t>(numel->as_int());
  const auto nbytes = checked_mul<std::uint64_t>(request.numel, dtype_itemsize(request.dtype));
  if (!nbytes || *nbytes > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    error(ErrorCode::storage_numel_invalid, "numel ", request.numel, " x itemsize ", dtype_itemsize(request.dtype),
          " overflows");
  }

  Item item;
  if (auto found = storage_cache_.find(request.key); found != storage_cache_.end()) {
    const StorageRequest& first = found->second->request;
    if (first.untyped != request.untyped || first.dtype != request.dtype || first.numel != request.numel) {
      error(ErrorCode::storage_redeclared, "storage '", request.key, "' was declared as ",
            first.untyped ? std::string("UntypedStorage") : std::string(dtype_name(first.dtype)), " x ", first.numel,
            " and now as ", request.untyped ? std::string("UntypedStorage") : std::string(dtype_name(request.dtype)),
            " x ", request.numel);
    }
    item.content = found->second;
    push(std::move(item));
    return;
  }
  if (storage_cache_.size() >= limits_.max_tensors) {
    error(ErrorCode::tensor_count_limit, "more than max_tensors ", limits_.max_tensors, " storages");
  }
  auto storage = storages_.resolve(request);
  if (!storage || storage->nbytes() != *nbytes) {
    error(ErrorCode::storage_size_mismatch, "storage '", request.key, "' has ", storage ? storage->nbytes() : 0,
          " bytes, expected ", *nbytes);
  }
  auto ref = std::make_shared<const StorageRef>(StorageRef{std::move(request), std::move(storage)});
  storage_cache_.emplace(ref->request.key, ref);
  item.content = std::move(ref);
  push(std::move(item));
}

// ---- REDUCE -----------------------------------------------------------------------------

void Machine::do_reduce() {
  require(2);
  Item args = pop();
  const Item callable = pop();
  const GlobalRef* global = callable.global();
  if (!global) error(ErrorCode::pickle_call_forbidden, "a ", describe(callable), " is not callable");
  const auto tuple = TupleView::of(args);
  if (!tuple) error(ErrorCode::pickle_call_args_invalid, "the arguments are a ", describe(args), ", not a tuple");
  switch (global->kind) {
    case GlobalKind::ordered_dict: push(reduce_ordered_dict(args)); return;
    case GlobalKind::rebuild_tensor_v2: push(reduce_tensor(*tuple, false)); return;
    case GlobalKind::rebuild_tensor_v3: push(reduce_tensor(*tuple, true)); return;
    case GlobalKind::rebuild_parameter: push(reduce_parameter(*tuple)); return;
    case GlobalKind::codecs_encode: push(reduce_codecs_encode(*tuple)); return;
    case GlobalKind::storage_type:
    case GlobalKind::untyped_storage_type:
    case GlobalKind::dtype: break;
  }
  error(ErrorCode::pickle_call_forbidden, global_name(*global), " is a type tag, never called");
}

// OrderedDict() or, as Python 2 reduced it, OrderedDict([[key, value], ...]).
Item Machine::reduce_ordered_dict(const Item& args) {
  const auto tuple = TupleView::of(args);
  if (tuple->size() == 0) return empty_container_item(Value::ordered_dict());
  const Value* items = tuple->size() == 1 ? tuple->value(0) : nullptr;
  if (!items || !items->is_sequence()) {
    error(ErrorCode::pickle_call_args_invalid, "OrderedDict takes () or one list of [key, value] pairs");
  }
  Dict dict;
  count_elements(items->as_list().size());
  for (const Value& pair : items->as_list()) {
    if (!pair.is_sequence() || pair.as_list().size() != 2) {
      error(ErrorCode::pickle_call_args_invalid, "an OrderedDict item is a ", value_kind_name(pair.kind()),
            ", not a [key, value] pair");
    }
    const Value& key = pair.as_list()[0];
    std::optional<DictKey> dict_key;
    if (key.is_string()) dict_key.emplace(key.as_string());
    if (key.is_int()) dict_key.emplace(key.as_int());
    if (!dict_key) error(ErrorCode::pickle_dict_key_invalid, "a ", value_kind_name(key.kind()), " key");
    if (!dict.insert(*dict_key, pair.as_list()[1])) {
      error(ErrorCode::pickle_duplicate_key, "key ", printable(dict_key->to_string()), " occurs twice");
    }
  }
  Item item = empty_container_item(Value::ordered_dict(std::move(dict)));
  // args = (items,) with items = [(key, value), ...]: the dict sits two levels
  // shallower than the argument tuple and holds the same nodes.
  item.depth = std::max<std::uint32_t>(1, args.depth - 2);
  item.nodes = args.nodes;
  return item;
}

// _codecs.encode(text, 'latin1'): how Python pickles bytes at protocol 2.
Item Machine::reduce_codecs_encode(const TupleView& args) {
  const Value* text = args.size() == 2 ? args.value(0) : nullptr;
  const Value* encoding = args.size() == 2 ? args.value(1) : nullptr;
  if (!text || !text->is_string() || !encoding || !encoding->is_string() || encoding->as_string() != "latin1") {
    error(ErrorCode::pickle_call_args_invalid, "_codecs.encode takes exactly (str, 'latin1')");
  }
  const std::string& utf8 = text->as_string();  // strict UTF-8, checked when read
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
  return scalar_item(Value::bytes(std::move(bytes)));
}

// hooks: None, or an empty dict/OrderedDict that nothing has written to.
void Machine::check_hooks(const Value* hooks, std::string_view what) const {
  if (!hooks) error(ErrorCode::pickle_call_args_invalid, what, " is not a value");
  if (hooks->is_none()) return;
  if (!hooks->is_dict()) {
    error(ErrorCode::pickle_call_args_invalid, what, " is a ", value_kind_name(hooks->kind()), ", not a dict");
  }
  if (!hooks->as_dict().empty() || hooks->as_dict().metadata()) {
    error(ErrorCode::tensor_hooks_not_empty, what, " is not an empty dict");
  }
}

std::vector<std::int64_t> Machine::int_tuple(const Value* value, std::string_view what) const {
  if (!value || !value->is_tuple()) error(ErrorCode::pickle_call_args_invalid, what, " is not a tuple");
  const auto& items = value->as_list();
  if (items.size() > limits_.max_tensor_rank) {
    error(ErrorCode::tensor_rank_limit, what, " has ", items.size(), " dimensions, more than max_tensor_rank ",
          limits_.max_tensor_rank);
  }
  std::vector<std::int64_t> out;
  out.reserve(items.size());
  for (const Value& item : items) {
    if (!item.is_int()) error(ErrorCode::pickle_call_args_invalid, what, " holds a ", value_kind_name(item.kind()));
    out.push_back(item.as_int());
  }
  return out;
}

// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
// _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata])
Item Machine::reduce_tensor(const TupleView& args, bool v3) {
  const std::size_t required = v3 ? 7 : 6;
  const char* callable = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
  if (args.size() != required && args.size() != required + 1) {
    error(ErrorCode::pickle_call_args_invalid, callable, " takes ", required, " or ", required + 1, " arguments, not ",
          args.size());
  }
  const StorageRef* storage = args.storage(0);
  if (!storage || storage->request.untyped != v3) {
    error(ErrorCode::pickle_call_args_invalid, "argument 0 is a ", args.describe(0), ", not ",
          v3 ? "an UntypedStorage" : "a typed storage");
  }
  DType dtype = storage->request.dtype;
  if (v3) {
    const GlobalRef* dtype_tag = args.global(6);
    if (!dtype_tag || dtype_tag->kind != GlobalKind::dtype) {
      error(ErrorCode::pickle_call_args_invalid, "argument 6 is a ", args.describe(6), ", not a torch dtype");
    }
    dtype = dtype_tag->dtype;
  }
  const Value* offset_value = args.value(1);
  if (!offset_value || !offset_value->is_int()) {
    error(ErrorCode::pickle_call_args_invalid, "the storage offset is a ", args.describe(1), ", not an int");
  }
  const Value* requires_grad = args.value(4);
  if (!requires_grad || !requires_grad->is_bool()) {
    error(ErrorCode::pickle_call_args_invalid, "requires_grad is a ", args.describe(4), ", not a bool");
  }
  TensorData tensor;
  tensor.dtype = dtype;
  tensor.sizes = int_tuple(args.value(2), "size");
  tensor.strides = int_tuple(args.value(3), "stride");
  tensor.storage_offset = offset_value->as_int();
  tensor.requires_grad = requires_grad->as_bool();
  tensor.storage = storage->storage;
  check_hooks(args.value(5), "backward_hooks");
  if (args.size() == required + 1) {
    // torch 2.x passes tensor metadata (conj/neg bits...) only when non-empty.
    const Value* metadata = args.value(required);
    if (!metadata || !metadata->is_dict()) {
      error(ErrorCode::pickle_call_args_invalid, "the rebuild metadata is a ", args.describe(required), ", not a dict");
    }
    check_hooks(metadata, "the rebuild metadata");
  }

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
  const std::uint64_t storage_bytes = storage->storage->nbytes();
  if (storage_bytes % itemsize != 0) {
    error(ErrorCode::storage_size_mismatch, "storage '", storage->request.key, "' of ", storage_bytes,
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
            last ? std::to_string(*last) : std::string("past 2^64"), " of a storage of ", storage_numel, " elements");
    }
  } else if (offset > storage_numel) {
    error(ErrorCode::tensor_out_of_bounds, "an empty view at offset ", offset, " of a storage of ", storage_numel,
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
  return scalar_item(Value::tensor(std::move(tensor)));
}

// _rebuild_parameter(tensor, requires_grad, OrderedDict()): nn.Parameter.
Item Machine::reduce_parameter(const TupleView& args) {
  const Value* tensor = args.size() == 3 ? args.value(0) : nullptr;
  const Value* requires_grad = args.size() == 3 ? args.value(1) : nullptr;
  if (!tensor || !tensor->is_tensor() || !requires_grad || !requires_grad->is_bool()) {
    error(ErrorCode::pickle_call_args_invalid, "_rebuild_parameter takes exactly (Tensor, bool, OrderedDict())");
  }
  check_hooks(args.value(2), "backward_hooks");
  TensorData parameter = tensor->as_tensor();
  parameter.is_parameter = true;
  parameter.requires_grad = requires_grad->as_bool();
  if (parameter.requires_grad && !dtype_is_differentiable(parameter.dtype)) {
    error(ErrorCode::tensor_requires_grad_invalid, "requires_grad on a ", dtype_name(parameter.dtype), " parameter");
  }
  return scalar_item(Value::tensor(std::move(parameter)));
}

// ---- BUILD ------------------------------------------------------------------------------

constexpr std::string_view kMetadataKey = "_metadata";

// state = {'_metadata': {prefix: {name: int}}}, what nn.Module.state_dict() sets.
void Machine::validate_metadata(const Value& state) const {
  const Value* metadata = state.is_dict() && state.as_dict().size() == 1 ? state.as_dict().find(kMetadataKey) : nullptr;
  if (!metadata) error(ErrorCode::pickle_build_forbidden, "the state is not a dict whose only key is '_metadata'");
  if (!metadata->is_dict()) error(ErrorCode::pickle_build_forbidden, "_metadata is not a dict");
  for (const auto& [prefix, entry] : metadata->as_dict()) {
    if (!prefix.is_string() || !entry.is_dict()) {
      error(ErrorCode::pickle_build_forbidden, "_metadata maps ", prefix.to_string(), " to a ",
            value_kind_name(entry.kind()), ", not a dict of str to int");
    }
    for (const auto& [name, number] : entry.as_dict()) {
      if (!name.is_string() || !number.is_int()) {
        error(ErrorCode::pickle_build_forbidden, "_metadata[", prefix.to_string(), "] maps ", name.to_string(),
              " to a ", value_kind_name(number.kind()), ", not an int");
      }
    }
  }
}

void Machine::do_build() {
  require(2);
  Item state = pop();
  Item& target = stack_.back();
  Value* dict = target.value();
  if (!dict || !dict->is_ordered_dict()) {
    error(ErrorCode::pickle_build_forbidden, "BUILD on a ", describe(target), "; only an OrderedDict takes _metadata");
  }
  if (dict->as_dict().metadata()) error(ErrorCode::pickle_build_forbidden, "the OrderedDict already has _metadata");
  const Value* state_value = state.value();
  if (!state_value) error(ErrorCode::pickle_build_forbidden, "the state is a ", describe(state));
  validate_metadata(*state_value);
  add_child(target, state);
  dict->mutable_dict().set_metadata(*state_value->as_dict().find(kMetadataKey));
}

// ---- the loop ---------------------------------------------------------------------------

PickleResult Machine::run() {
  if (!allow_trailing_bytes_ && size_ > limits_.max_pickle_bytes) {
    detail::fail(ErrorCode::pickle_too_large, "the pickle has ", size_, " bytes, more than max_pickle_bytes ",
                 limits_.max_pickle_bytes);
  }
  for (;;) {
    op_offset_ = pos_;
    if (pos_ >= window_end_) {
      if (window_end_ < size_) {
        detail::fail(ErrorCode::pickle_too_large, "pickle offset ", pos_, ": no STOP within max_pickle_bytes ",
                     limits_.max_pickle_bytes);
      }
      detail::fail(ErrorCode::pickle_truncated, "pickle offset ", pos_, ": the pickle ends before STOP");
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
        Value root = take_value(std::move(stack_.back()), "the pickled object");
        if (!allow_trailing_bytes_ && pos_ != size_) {
          error(ErrorCode::pickle_trailing_bytes, size_ - pos_, " bytes follow STOP");
        }
        PickleResult result;
        result.root = std::move(root);
        result.consumed = pos_;
        result.protocol = protocol_;
        result.uses_binfloat = uses_binfloat_;
        result.tensor_count = tensor_count_;
        result.storage_count = storage_cache_.size();
        return result;
      }
      case op::MARK:
        if (marks_.size() >= limits_.max_mark_depth) {
          error(ErrorCode::pickle_mark_limit, "more than max_mark_depth ", limits_.max_mark_depth, " open MARKs");
        }
        marks_.push_back(stack_.size());
        break;
      case op::EMPTY_DICT: push(empty_container_item(Value::dict())); break;
      case op::EMPTY_LIST: push(empty_container_item(Value::list())); break;
      case op::EMPTY_TUPLE: do_tuple(0, false); break;
      case op::TUPLE: do_tuple(0, true); break;
      case op::TUPLE1: do_tuple(1, false); break;
      case op::TUPLE2: do_tuple(2, false); break;
      case op::TUPLE3: do_tuple(3, false); break;
      case op::SETITEM: do_setitem(false); break;
      case op::SETITEMS: do_setitem(true); break;
      case op::APPEND: do_append(false); break;
      case op::APPENDS: do_append(true); break;
      case op::NONE: push(scalar_item(Value::none())); break;
      case op::NEWTRUE: push(scalar_item(Value::boolean(true))); break;
      case op::NEWFALSE: push(scalar_item(Value::boolean(false))); break;
      case op::BININT1: push(scalar_item(Value::integer(static_cast<std::int64_t>(take_le(1))))); break;
      case op::BININT2: push(scalar_item(Value::integer(static_cast<std::int64_t>(take_le(2))))); break;
      case op::BININT:
        push(scalar_item(Value::integer(static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4))))));
        break;
      case op::LONG1: do_long1(); break;
      case op::INT: do_int_line(); break;
      case op::LONG: do_long_line(); break;
      case op::BINFLOAT: {
        const std::byte* p = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | std::to_integer<std::uint8_t>(p[i]);  // big-endian
        uses_binfloat_ = true;
        push(scalar_item(Value::floating(std::bit_cast<double>(bits))));
        break;
      }
      case op::SHORT_BINUNICODE: push(scalar_item(Value::string(take_string(take_le(1), false)))); break;
      case op::BINUNICODE: push(scalar_item(Value::string(take_string(take_le(4), false)))); break;
      case op::BINUNICODE8: push(scalar_item(Value::string(take_string(take_le(8), false)))); break;
      case op::SHORT_BINSTRING: push(scalar_item(Value::string(take_string(take_le(1), true)))); break;
      case op::BINSTRING: {
        const auto length = static_cast<std::int32_t>(static_cast<std::uint32_t>(take_le(4)));
        if (length < 0) error(ErrorCode::pickle_string_invalid, "negative length ", length);
        push(scalar_item(Value::string(take_string(static_cast<std::uint64_t>(length), true))));
        break;
      }
      case op::SHORT_BINBYTES: push(scalar_item(Value::bytes(take_bytes(take_le(1))))); break;
      case op::BINBYTES: push(scalar_item(Value::bytes(take_bytes(take_le(4))))); break;
      case op::BINPUT: memo_put(take_le(1)); break;
      case op::LONG_BINPUT: memo_put(take_le(4)); break;
      case op::MEMOIZE: memo_put(memo_.size()); break;
      case op::BINGET: memo_get(take_le(1)); break;
      case op::LONG_BINGET: memo_get(take_le(4)); break;
      case op::GLOBAL: do_global(); break;
      case op::STACK_GLOBAL: do_stack_global(); break;
      case op::REDUCE: do_reduce(); break;
      case op::BUILD: do_build(); break;
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
  Machine machine(pickle, storages, limits, options, allow_trailing_bytes);
  return machine.run();
}

}  // namespace holdpoint::format
