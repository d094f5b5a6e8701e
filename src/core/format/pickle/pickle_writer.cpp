// The restricted pickle emitter. See pickle_writer.h for the contract and the
// format reference §2.1, §2.2 and §2.4 for why each encoding was chosen: every
// form here is one that Python's weights_only unpickler (1.13 in compatibility
// mode, 2.x otherwise) and holdpoint's own VM both accept.
#include "format/pickle/pickle_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "format/pickle/pickle_opcodes.h"

namespace holdpoint::format {
namespace {

namespace op = pickle_op;
using detail::checked_add;
using detail::checked_mul;
using detail::fail;

class Emitter {
 public:
  explicit Emitter(const PickleWriteOptions& options) : options_(options) {}

  PickleWriteResult write(const Value& root) {
    count_tensor_uses(root, 0);
    put(op::PROTO);
    put(2);
    emit(root, 0);
    put(op::STOP);
    PickleWriteResult result;
    result.pickle = std::move(out_);
    result.storages = std::move(storages_);
    result.tensor_count = tensor_count_;
    return result;
  }

 private:
  // `level` counts the containers around a value; a container is at level+1.
  void check_level(std::uint32_t level) const {
    if (level > options_.limits.max_nesting_depth) {
      fail(ErrorCode::pickle_nesting_limit, "pickle writer: containers nest deeper than max_nesting_depth ",
           options_.limits.max_nesting_depth);
    }
  }

  // Tied tensors (one TensorData object at two places) and shared containers
  // (one list, tuple, set or dict node at two places) are memoized, as
  // Python's pickler does, so the file keeps the sharing and a shared subtree
  // is written once. Each container is walked once; a cyclic tree stops at
  // the nesting bound when it is emitted.
  void count_tensor_uses(const Value& value, std::uint32_t level) {
    switch (value.kind()) {
      case ValueKind::tensor: ++tensor_uses_[value.tensor_ptr().get()]; return;
      case ValueKind::meta_tensor: ++tensor_uses_[&value.as_meta_tensor()]; return;
      case ValueKind::bytearray: ++container_uses_[value.node_identity()]; return;
      case ValueKind::sparse_tensor:
        if (++container_uses_[value.node_identity()] > 1) return;
        for (const Value& part : value.as_sparse_tensor().parts) count_tensor_uses(part, level + 1);
        return;
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::set:
        check_level(level + 1);
        if (++container_uses_[value.node_identity()] > 1) return;
        for (const Value& item : value.as_list()) count_tensor_uses(item, level + 1);
        return;
      case ValueKind::dict:
      case ValueKind::ordered_dict:
        check_level(level + 1);
        if (++container_uses_[value.node_identity()] > 1) return;
        for (const auto& entry : value.as_dict()) count_tensor_uses(entry.second, level + 1);
        return;
      default: return;
    }
  }

  // Emits a list, tuple, set, dict or bytearray, or fetches it if it was
  // emitted before.
  void emit_container(const Value& value, std::uint32_t level) {
    const void* identity = value.node_identity();
    if (const auto found = container_memo_.find(identity); found != container_memo_.end()) {
      emit_memo_get(found->second);
      return;
    }
    switch (value.kind()) {
      case ValueKind::list: emit_sequence(value.as_list(), true, level); break;
      case ValueKind::tuple: emit_sequence(value.as_list(), false, level); break;
      case ValueKind::set: emit_set(value.as_list(), level); break;
      case ValueKind::dict: emit_dict(value.as_dict(), false, level); break;
      case ValueKind::bytearray: emit_bytearray(value.as_bytes()); break;
      case ValueKind::sparse_tensor: emit_sparse_tensor(value.as_sparse_tensor(), level); break;
      default: emit_dict(value.as_dict(), true, level); break;
    }
    // Memoized once whole: readers (holdpoint's among them) freeze a
    // container the memo hands out.
    const auto uses = container_uses_.find(identity);
    if (uses != container_uses_.end() && uses->second > 1) {
      const std::uint32_t index = memo_count_++;
      container_memo_.emplace(identity, index);
      emit_memo_put(index);
    }
  }

  // ---- bytes ----
  void put(std::uint8_t byte) { out_.push_back(std::byte{byte}); }
  void put_le(std::uint64_t value, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) put(static_cast<std::uint8_t>(value >> (8 * i)));
  }
  void put_text(std::string_view text) {
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    out_.insert(out_.end(), p, p + text.size());
  }

  // ---- scalars ----
  void emit_int(std::int64_t value) {
    if (value >= 0 && value <= 0xFF) {
      put(op::BININT1);
      put_le(static_cast<std::uint64_t>(value), 1);
    } else if (value >= 0 && value <= 0xFFFF) {
      put(op::BININT2);
      put_le(static_cast<std::uint64_t>(value), 2);
    } else if (value >= std::numeric_limits<std::int32_t>::min() && value <= std::numeric_limits<std::int32_t>::max()) {
      put(op::BININT);
      put_le(static_cast<std::uint32_t>(static_cast<std::int32_t>(value)), 4);
    } else {
      // Always 8 bytes: LibTorch's unpickler accepts no other LONG1 length.
      put(op::LONG1);
      put(8);
      put_le(static_cast<std::uint64_t>(value), 8);
    }
  }

  // An int outside int64: LONG1 with its shortest bytes, as Python pickles it
  // (torch.load reads it; LibTorch's own unpickler reads no such int).
  void emit_big_int(std::string_view little_endian) {
    put(op::LONG1);
    put(static_cast<std::uint8_t>(little_endian.size()));
    for (const char byte : little_endian) put(static_cast<std::uint8_t>(byte));
  }

  void emit_bool(bool value) { put(value ? op::NEWTRUE : op::NEWFALSE); }

  void emit_str(std::string_view text) {
    if (!op::is_strict_utf8(text)) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: a str of ", text.size(), " bytes is not strict UTF-8");
    }
    if (text.size() > std::numeric_limits<std::uint32_t>::max()) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: a str of ", text.size(), " bytes exceeds 4 GiB");
    }
    put(op::BINUNICODE);
    put_le(text.size(), 4);
    put_text(text);
  }

  // Globals, and the persistent id's "storage" and location, are written once
  // and fetched from the memo after that, as torch.save does: a state dict
  // then takes about 60 bytes of pickle per tensor instead of 150, which every
  // reader parses and holds.
  template <typename Write>
  void emit_constant(std::string key, Write write) {
    if (const auto found = constant_memo_.find(key); found != constant_memo_.end()) {
      emit_memo_get(found->second);
      return;
    }
    write();
    const std::uint32_t index = memo_count_++;
    constant_memo_.emplace(std::move(key), index);
    emit_memo_put(index);
  }

  void emit_global(std::string_view module, std::string_view name) {
    std::string key;
    key.reserve(module.size() + name.size() + 2);
    key.append("g").append(module).append("\n").append(name);
    emit_constant(std::move(key), [&] {
      put(op::GLOBAL);
      put_text(module);
      put('\n');
      put_text(name);
      put('\n');
    });
  }

  // module.name(*args), as pickle calls it: the global, what `emit_args` pushes,
  // `tuple` to pack it (TUPLE1..TUPLE3, EMPTY_TUPLE, or TUPLE after a MARK that
  // emit_args put), then REDUCE.
  template <typename EmitArgs>
  void emit_call(std::string_view module, std::string_view name, std::uint8_t tuple, EmitArgs&& emit_args) {
    emit_global(module, name);
    emit_args();
    put(tuple);
    put(op::REDUCE);
  }

  void emit_constant_str(std::string_view text) {
    emit_constant("s" + std::string(text), [&] { emit_str(text); });
  }

  void emit_empty_ordered_dict() {
    emit_call("collections", "OrderedDict", op::EMPTY_TUPLE, [] {});
  }

  void emit_memo_put(std::uint32_t index) {
    if (index <= 0xFF) {
      put(op::BINPUT);
      put_le(index, 1);
    } else {
      put(op::LONG_BINPUT);
      put_le(index, 4);
    }
  }

  void emit_memo_get(std::uint32_t index) {
    if (index <= 0xFF) {
      put(op::BINGET);
      put_le(index, 1);
    } else {
      put(op::LONG_BINGET);
      put_le(index, 4);
    }
  }

  void emit_float(double value) {
    if (options_.torch_1_13_compatible) {
      refuse_synthesized_key("a float");
      // torch 1.13's weights_only unpickler has no BINFLOAT: a 0-d float64 tensor
      // (Value::as_number reads it back as the number).
      std::byte bytes[sizeof value];
      std::memcpy(bytes, &value, sizeof value);
      synthesizing_ = true;
      emit_tensor(std::make_shared<const TensorData>(TensorData::from_bytes(DType::float64, {}, bytes)), false);
      synthesizing_ = false;
      return;
    }
    put(op::BINFLOAT);
    const auto bits = std::bit_cast<std::uint64_t>(value);
    for (int shift = 56; shift >= 0; shift -= 8) put(static_cast<std::uint8_t>(bits >> shift));  // big-endian
  }

  void emit_bytes(std::string_view bytes) {
    if (options_.torch_1_13_compatible) {
      refuse_synthesized_key("bytes");
      // 1.13 does not allowlist _codecs.encode: a 1-d uint8 tensor instead.
      const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
      synthesizing_ = true;
      emit_tensor(std::make_shared<const TensorData>(TensorData::from_bytes(
                      DType::uint8, {static_cast<std::int64_t>(bytes.size())}, std::span(p, bytes.size()))),
                  false);
      synthesizing_ = false;
      return;
    }
    // As Python pickles bytes below protocol 3: _codecs.encode(latin1 text, 'latin1').
    std::string text;
    text.reserve(bytes.size() * 2);
    for (char c : bytes) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte < 0x80) {
        text.push_back(static_cast<char>(byte));
      } else {
        text.push_back(static_cast<char>(0xC0 | (byte >> 6)));
        text.push_back(static_cast<char>(0x80 | (byte & 0x3F)));
      }
    }
    emit_call("_codecs", "encode", op::TUPLE2, [&] {
      emit_str(text);
      emit_str("latin1");
    });
  }

  // ---- containers ----
  void emit_sequence(const Value::List& items, bool is_list, std::uint32_t level) {
    check_level(level + 1);
    if (!is_list) {
      if (items.empty()) {
        put(op::EMPTY_TUPLE);
        return;
      }
      if (items.size() <= 3) {
        for (const Value& item : items) emit(item, level + 1);
        put(items.size() == 1 ? op::TUPLE1 : items.size() == 2 ? op::TUPLE2 : op::TUPLE3);
        return;
      }
      put(op::MARK);
      for (const Value& item : items) emit(item, level + 1);
      put(op::TUPLE);
      return;
    }
    // MARK..APPENDS even for one item: LibTorch 1.13 cannot read APPEND.
    put(op::EMPTY_LIST);
    for (std::size_t start = 0; start < items.size(); start += op::kBatchSize) {
      put(op::MARK);
      const std::size_t end = std::min(items.size(), start + op::kBatchSize);
      for (std::size_t i = start; i < end; ++i) emit(items[i], level + 1);
      put(op::APPENDS);
    }
  }

  // ---- Python's and torch's own value types, as torch.save pickles them ----
  // None of them is on torch 1.13's weights_only allowlist but torch.Size,
  // layouts and some dtypes.
  void refuse_in_torch_1_13(std::string_view what) const {
    if (options_.torch_1_13_compatible) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: torch 1.13's weights_only loader cannot read a ", what);
    }
  }

  void emit_complex(std::complex<double> value) {
    refuse_in_torch_1_13("complex");
    emit_call("__builtin__", "complex", op::TUPLE2, [&] {
      emit_float(value.real());
      emit_float(value.imag());
    });
  }

  void emit_set(const Value::List& items, std::uint32_t level) {
    refuse_in_torch_1_13("set");
    for (const Value& item : items) {
      if (!valid_set_item(item)) {
        fail(ErrorCode::write_value_unsupported, "pickle writer: a set holds a ", value_kind_name(item.kind()),
             "; a set holds only scalars, str, bytes and tuples of them");
      }
    }
    emit_call("__builtin__", "set", op::TUPLE1, [&] { emit_sequence(items, true, level); });
  }

  void emit_bytearray(std::string_view bytes) {
    refuse_in_torch_1_13("bytearray");
    emit_call("__builtin__", "bytearray", op::TUPLE1, [&] { emit_bytes(bytes); });
  }

  void emit_device(std::string_view name) {
    refuse_in_torch_1_13("torch.device");
    const std::size_t colon = name.find(':');
    emit_call("torch", "device", colon == std::string_view::npos ? op::TUPLE1 : op::TUPLE2, [&] {
      emit_str(name.substr(0, colon));
      if (colon == std::string_view::npos) return;
      std::int64_t index = 0;
      for (const char c : name.substr(colon + 1)) index = index * 10 + (c - '0');
      emit_int(index);
    });
  }

  void emit_dtype(DType dtype) {
    if (!dtype_in_torch(dtype)) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: torch has no ", dtype_name(dtype), " dtype");
    }
    // torch 1.13's weights_only loader allowlists ten dtypes as globals.
    static constexpr DType kTorch113Dtypes[] = {DType::complex32, DType::complex64, DType::complex128,
                                                DType::float16,   DType::float32,   DType::float64,
                                                DType::int8,      DType::int16,     DType::int32,
                                                DType::int64};
    if (options_.torch_1_13_compatible &&
        std::find(std::begin(kTorch113Dtypes), std::end(kTorch113Dtypes), dtype) == std::end(kTorch113Dtypes)) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: torch 1.13's weights_only loader cannot read torch.",
           dtype_name(dtype), " as a value (it allowlists only the complex, float and signed int dtypes)");
    }
    emit_global("torch", dtype_name(dtype));
  }

  void emit_size(const Value::List& items) {
    Dims dims;
    for (const Value& item : items) dims.push_back(item.as_int());
    emit_call("torch", "Size", op::TUPLE1, [&] { emit_int_tuple(dims); });
  }

  void emit_layout(std::string_view name) {
    emit_call("torch.serialization", "_get_layout", op::TUPLE1, [&] { emit_str(name); });
  }

  void emit_key(const DictKey& key, std::uint32_t level) {
    if (key.is_string()) {
      emit_str(key.as_string());
    } else if (key.is_integer()) {
      emit_int(key.as_int());
    } else {
      // None, bool, float, bytes or a tuple of them. The 1.13 mode writes a float
      // or bytes as a tensor, which no reader takes as a key: refused here.
      ++in_key_;
      emit(key.value(), level);
      --in_key_;
    }
  }

  void refuse_synthesized_key(std::string_view what) const {
    if (in_key_ > 0) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: a dict key holds ", what,
           ", which the torch-1.13-compatible mode writes as a tensor; a tensor cannot be a key");
    }
  }

  void emit_dict(const Dict& dict, bool ordered, std::uint32_t level) {
    check_level(level + 1);
    if (ordered) {
      emit_empty_ordered_dict();
    } else {
      if (dict.metadata()) {
        fail(ErrorCode::write_value_unsupported,
             "pickle writer: a plain dict carries _metadata; only an OrderedDict can");
      }
      put(op::EMPTY_DICT);
    }
    // MARK..SETITEMS even for one pair: LibTorch 1.13 cannot read SETITEM.
    for (std::size_t start = 0; start < dict.size(); start += op::kBatchSize) {
      put(op::MARK);
      const std::size_t end = std::min(dict.size(), start + op::kBatchSize);
      for (std::size_t i = start; i < end; ++i) {
        emit_key(dict.at_index(i).first, level + 1);
        emit(dict.at_index(i).second, level + 1);
      }
      put(op::SETITEMS);
    }
    if (ordered && dict.metadata()) emit_metadata(*dict.metadata(), level + 1);
  }

  // BUILD with state {'_metadata': {prefix: {name: int}}}, as nn.Module.state_dict()
  // output carries it. Readers accept exactly this shape, so check it here.
  void emit_metadata(const Value& metadata, std::uint32_t level) {
    bool valid = metadata.is_dict();
    if (valid) {
      for (const auto& [prefix, entry] : metadata.as_dict()) {
        valid = valid && prefix.is_string() && entry.is_dict() && !entry.as_dict().metadata();
        if (!valid) break;
        for (const auto& [name, number] : entry.as_dict()) valid = valid && name.is_string() && number.is_int();
      }
    }
    if (!valid) {
      fail(ErrorCode::write_value_unsupported,
           "pickle writer: OrderedDict _metadata must map str to dicts of str to int");
    }
    check_level(level + 1);  // the state dict around it
    put(op::EMPTY_DICT);
    put(op::MARK);
    emit_str("_metadata");
    emit(metadata, level + 1);
    put(op::SETITEMS);
    put(op::BUILD);
  }

  // ---- tensors ----
  // The bounds the reader enforces (format reference §7.3), so that nothing
  // this writer emits is refused when read back with the same Limits.
  void check_geometry(const TensorData& tensor) const {
    if (!tensor.storage) fail(ErrorCode::invalid_argument, "pickle writer: a tensor has no storage");
    if (tensor.sizes.size() != tensor.strides.size()) {
      fail(ErrorCode::invalid_argument, "pickle writer: a tensor has ", tensor.sizes.size(), " sizes and ",
           tensor.strides.size(), " strides");
    }
    const std::uint64_t storage_numel = tensor.storage->nbytes() / tensor.itemsize();
    bool empty = false;
    for (std::size_t d = 0; d < tensor.sizes.size(); ++d) {
      if (tensor.sizes[d] < 0 || tensor.strides[d] < 0) {
        fail(ErrorCode::invalid_argument, "pickle writer: a tensor has a negative size or stride");
      }
      empty = empty || tensor.sizes[d] == 0;
    }
    if (tensor.storage_offset < 0) fail(ErrorCode::invalid_argument, "pickle writer: negative storage offset");
    std::optional<std::uint64_t> last = static_cast<std::uint64_t>(tensor.storage_offset);
    for (std::size_t d = 0; d < tensor.sizes.size() && !empty && last; ++d) {
      const auto step = checked_mul<std::uint64_t>(static_cast<std::uint64_t>(tensor.sizes[d] - 1),
                                                   static_cast<std::uint64_t>(tensor.strides[d]));
      last = step ? checked_add(*last, *step) : std::nullopt;
    }
    if (!last || (empty ? *last > storage_numel : *last >= storage_numel)) {
      fail(ErrorCode::invalid_argument, "pickle writer: a ", dtype_name(tensor.dtype),
           " tensor view reaches outside its storage of ", tensor.storage->nbytes(), " bytes");
    }
    // In bounds with non-negative strides, so the element count fits: each
    // dimension's size is at most storage_numel unless its stride is 0.
    std::optional<std::uint64_t> numel = empty ? 0 : 1;
    for (std::size_t d = 0; d < tensor.sizes.size() && numel; ++d) {
      numel = checked_mul<std::uint64_t>(*numel, static_cast<std::uint64_t>(tensor.sizes[d]));
    }
    const Limits& limits = options_.limits;
    const auto bytes = numel ? checked_mul<std::uint64_t>(*numel, tensor.itemsize()) : std::nullopt;
    const auto expansion = checked_mul<std::uint64_t>(tensor.storage->nbytes(), limits.max_view_expansion);
    const auto bound = expansion ? checked_add<std::uint64_t>(*expansion, 4096) : std::nullopt;
    if (!numel || *numel > limits.max_tensor_numel) {
      fail(ErrorCode::tensor_numel_limit, "pickle writer: a ", dtype_name(tensor.dtype),
           " view has more elements than Limits::max_tensor_numel (", limits.max_tensor_numel, ")");
    }
    if (!bytes || *bytes > limits.max_tensor_logical_bytes || (bound && *bytes > *bound)) {
      fail(ErrorCode::tensor_bytes_limit, "pickle writer: a ", dtype_name(tensor.dtype),
           " view describes more elements than the Limits allow over a storage of ", tensor.storage->nbytes(),
           " bytes");
    }
  }

  // ('storage', torch.<X>Storage | torch.storage.UntypedStorage, key, 'cpu', numel)
  void emit_persistent_id(const TensorData& tensor, std::optional<std::string_view> storage_class) {
    const Storage& storage = *tensor.storage;
    const std::size_t itemsize = storage_class ? tensor.itemsize() : 1;
    if (storage.nbytes() % itemsize != 0) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: a storage of ", storage.nbytes(),
           " bytes is not a whole number of ", dtype_name(tensor.dtype), " elements");
    }
    std::string key;
    if (auto found = storage_keys_.find(storage.identity()); found != storage_keys_.end()) {
      const PickledStorage& first = storages_[found->second.index];
      if (found->second.dtype != tensor.dtype) {
        fail(ErrorCode::write_storage_dtype_conflict, "pickle writer: storage '", first.key, "' is viewed as ",
             dtype_name(found->second.dtype), " and as ", dtype_name(tensor.dtype));
      }
      if (first.nbytes != storage.nbytes()) {
        fail(ErrorCode::write_value_unsupported, "pickle writer: two Storage objects with one identity have ",
             first.nbytes, " and ", storage.nbytes(), " bytes");
      }
      key = first.key;
    } else {
      // Made-up storages count from 10^12 (record names must be decimal), so
      // they never shift the keys of the value's own storages.
      key = std::to_string(synthesizing_ ? kSynthesizedKeyBase + synthesized_count_++ : real_count_++);
      storage_keys_.emplace(storage.identity(), StorageKey{storages_.size(), tensor.dtype});
      storages_.push_back(PickledStorage{key, tensor.storage, storage.nbytes(), synthesizing_});
    }
    put(op::MARK);
    emit_constant_str("storage");
    // torch.UntypedStorage is the same class, but Python's weights_only loader
    // (2.13) allowlists it only under its defining module, as torch.save names it.
    if (storage_class) {
      emit_global("torch", *storage_class);
    } else {
      emit_global("torch.storage", "UntypedStorage");
    }
    emit_str(key);
    emit_constant_str("cpu");
    emit_int(static_cast<std::int64_t>(storage.nbytes() / itemsize));
    put(op::TUPLE);
    put(op::BINPERSID);
  }

  void emit_int_tuple(std::span<const std::int64_t> values) {
    if (values.empty()) {
      put(op::EMPTY_TUPLE);
      return;
    }
    if (values.size() > 3) put(op::MARK);
    for (std::int64_t v : values) emit_int(v);
    const std::uint8_t close[] = {op::TUPLE, op::TUPLE1, op::TUPLE2, op::TUPLE3};
    put(close[values.size() <= 3 ? values.size() : 0]);
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, OrderedDict()),
  // v3 with a trailing dtype for dtypes without a storage class, the conj/neg
  // bits as a last metadata dict where one is set, and
  // _rebuild_parameter(tensor, requires_grad, OrderedDict()) around it for
  // nn.Parameter.
  void emit_tensor(const std::shared_ptr<const TensorData>& pointer, bool memoizable) {
    const TensorData& tensor = *pointer;
    if (memoizable && emit_tensor_memo_get(tensor)) return;
    // Before any itemsize arithmetic: the sub-byte dtypes have no itemsize.
    if (!dtype_in_torch(tensor.dtype)) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: torch has no ", dtype_name(tensor.dtype),
           " dtype, so a .pt file cannot hold this tensor");
    }
    check_geometry(tensor);
    check_rank_and_requires_grad(tensor, "tensor");
    const auto storage_class = dtype_storage_class(tensor.dtype);
    if (!storage_class && options_.torch_1_13_compatible) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: torch 1.13 has no ", dtype_name(tensor.dtype),
           " tensors (no storage class)");
    }
    if (tensor.conjugate && !dtype_is_complex(tensor.dtype)) {
      fail(ErrorCode::tensor_metadata_unsupported, "pickle writer: the conj bit on a ", dtype_name(tensor.dtype),
           " tensor; only complex tensors have conjugate views");
    }
    if ((tensor.conjugate || tensor.negative) && options_.torch_1_13_compatible) {
      fail(ErrorCode::write_value_unsupported, "pickle writer: torch 1.13 cannot rebuild a ",
           tensor.conjugate ? "conjugate" : "negative", " view (its _rebuild_tensor_v2 takes no metadata); ",
           "resolve the view first");
    }
    if (tensor.is_parameter) emit_global("torch._utils", "_rebuild_parameter");
    emit_call("torch._utils", storage_class ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3", op::TUPLE, [&] {
      put(op::MARK);
      emit_persistent_id(tensor, storage_class);
      emit_int(tensor.storage_offset);
      emit_int_tuple(tensor.sizes);
      emit_int_tuple(tensor.strides);
      emit_bool(tensor.is_parameter ? false : tensor.requires_grad);
      emit_empty_ordered_dict();
      if (!storage_class) emit_global("torch", dtype_name(tensor.dtype));
      if (tensor.conjugate || tensor.negative) {
        // torch._utils.get_tensor_metadata's dict, in its order.
        put(op::EMPTY_DICT);
        put(op::MARK);
        if (tensor.negative) {
          emit_str("neg");
          emit_bool(true);
        }
        if (tensor.conjugate) {
          emit_str("conj");
          emit_bool(true);
        }
        put(op::SETITEMS);
      }
    });
    close_tensor(tensor, memoizable);
  }

  // The memo index of a tensor written before, where there is one.
  bool emit_tensor_memo_get(const TensorData& tensor) {
    const auto found = tensor_memo_.find(&tensor);
    if (found == tensor_memo_.end()) return false;
    emit_memo_get(found->second);
    return true;
  }

  void check_rank_and_requires_grad(const TensorData& tensor, std::string_view what) {
    if (tensor.sizes.size() > options_.limits.max_tensor_rank) {
      fail(ErrorCode::tensor_rank_limit, "pickle writer: a ", what, " of rank ", tensor.sizes.size(),
           " exceeds max_tensor_rank ", options_.limits.max_tensor_rank);
    }
    if (tensor.requires_grad && !dtype_is_differentiable(tensor.dtype)) {
      fail(ErrorCode::tensor_requires_grad_invalid, "pickle writer: requires_grad on a ", dtype_name(tensor.dtype),
           " ", what);
    }
  }

  // After a rebuild call's REDUCE: the _rebuild_parameter wrap's arguments for an
  // nn.Parameter (whose global went before the rebuild call's).
  void close_parameter(bool is_parameter, bool requires_grad) {
    if (!is_parameter) return;
    emit_bool(requires_grad);
    emit_empty_ordered_dict();
    put(op::TUPLE3);
    put(op::REDUCE);
  }

  // close_parameter, the count, and a memo slot for a tensor the tree holds twice.
  void close_tensor(const TensorData& tensor, bool memoizable) {
    close_parameter(tensor.is_parameter, tensor.requires_grad);
    ++tensor_count_;
    if (memoizable && tensor_uses_[&tensor] > 1) {
      const std::uint32_t index = memo_count_++;
      tensor_memo_.emplace(&tensor, index);
      emit_memo_put(index);
    }
  }

  // _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad), in
  // _rebuild_parameter(...) for an nn.Parameter, as torch.save writes a tensor
  // on the meta device.
  void emit_meta_tensor(const TensorData& tensor) {
    if (emit_tensor_memo_get(tensor)) return;
    check_rank_and_requires_grad(tensor, "meta tensor");
    if (tensor.is_parameter) emit_global("torch._utils", "_rebuild_parameter");
    emit_call("torch._utils", "_rebuild_meta_tensor_no_storage", op::TUPLE, [&] {
      put(op::MARK);
      emit_dtype(tensor.dtype);
      emit_int_tuple(tensor.sizes);
      emit_int_tuple(tensor.strides);
      emit_bool(tensor.is_parameter ? false : tensor.requires_grad);
    });
    close_tensor(tensor, true);
  }

  // _rebuild_sparse_tensor(_get_layout(layout), (parts..., torch.Size(size)[, is_coalesced])),
  // in _rebuild_parameter(...) for an nn.Parameter, as torch.save writes a
  // sparse tensor (it writes is_coalesced for every COO tensor; a tensor read
  // from the older three-part form is written back in that form). Memoized by
  // emit_container.
  void emit_sparse_tensor(const SparseTensor& sparse, std::uint32_t level) {
    // Valid already: Value::sparse_tensor is the only way to make one.
    refuse_in_torch_1_13("sparse tensor (holdpoint writes sparse tensors only for torch 2.x)");
    if (sparse.is_parameter) emit_global("torch._utils", "_rebuild_parameter");
    emit_call("torch._utils", "_rebuild_sparse_tensor", op::TUPLE2, [&] {
      emit_layout(sparse.layout);
      put(op::MARK);
      for (const Value& part : sparse.parts) emit(part, level + 1);
      emit_call("torch", "Size", op::TUPLE1, [&] { emit_int_tuple(sparse.sizes); });
      if (sparse.coalesced) emit_bool(*sparse.coalesced);
      put(op::TUPLE);
    });
    close_parameter(sparse.is_parameter, sparse.requires_grad);
    ++tensor_count_;
  }

  void emit(const Value& value, std::uint32_t level) {
    switch (value.kind()) {
      case ValueKind::none: put(op::NONE); return;
      case ValueKind::boolean: emit_bool(value.as_bool()); return;
      case ValueKind::integer: emit_int(value.as_int()); return;
      case ValueKind::big_integer: emit_big_int(value.as_big_integer()); return;
      case ValueKind::floating: emit_float(value.as_double()); return;
      case ValueKind::string: emit_str(value.as_string()); return;
      case ValueKind::bytes: emit_bytes(value.as_bytes()); return;
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::dict:
      case ValueKind::ordered_dict:
      case ValueKind::set: emit_container(value, level); return;
      case ValueKind::tensor: emit_tensor(value.tensor_ptr(), true); return;
      case ValueKind::complex_number: emit_complex(value.as_complex()); return;
      case ValueKind::bytearray: emit_container(value, level); return;
      case ValueKind::device: emit_device(value.as_device()); return;
      case ValueKind::dtype: emit_dtype(value.as_dtype()); return;
      case ValueKind::size: emit_size(value.as_list()); return;
      case ValueKind::layout: emit_layout(value.as_layout()); return;
      case ValueKind::meta_tensor: emit_meta_tensor(value.as_meta_tensor()); return;
      case ValueKind::sparse_tensor: emit_container(value, level); return;
    }
    fail(ErrorCode::write_value_unsupported, "pickle writer: unknown value kind");
  }

  struct StorageKey {
    std::size_t index;  // into storages_
    DType dtype;        // of the first tensor that viewed it
  };

  const PickleWriteOptions& options_;
  std::vector<std::byte> out_;
  std::unordered_map<const TensorData*, std::uint32_t> tensor_uses_;
  std::unordered_map<const TensorData*, std::uint32_t> tensor_memo_;
  std::unordered_map<const void*, std::uint32_t> container_uses_;
  std::unordered_map<const void*, std::uint32_t> container_memo_;
  std::unordered_map<std::string, std::uint32_t> constant_memo_;  // emit_constant
  std::uint32_t memo_count_ = 0;
  std::unordered_map<const void*, StorageKey> storage_keys_;
  std::vector<PickledStorage> storages_;
  static constexpr std::uint64_t kSynthesizedKeyBase = 1'000'000'000'000;
  bool synthesizing_ = false;
  std::uint32_t in_key_ = 0;  // > 0 while a dict key is written
  std::uint64_t real_count_ = 0;
  std::uint64_t synthesized_count_ = 0;
  std::uint64_t tensor_count_ = 0;
};

}  // namespace

PickleWriteResult write_pickle(const Value& root, const PickleWriteOptions& options) {
  Emitter emitter(options);
  return emitter.write(root);
}

}  // namespace holdpoint::format
