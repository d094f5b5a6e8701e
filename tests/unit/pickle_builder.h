// Test-side helpers for the pickle tests: a byte builder for hand-made
// pickles and a StorageResolver over in-memory records.
//
// The builder writes opcodes exactly as asked (no validation), so tests can
// make both honest and hostile streams.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/fail.h"
#include "format/pickle/pickle_opcodes.h"
#include "format/pickle/pickle_reader.h"

namespace holdpoint::testing {

class PickleBuilder {
 public:
  PickleBuilder& op(std::uint8_t code) { return u8(code); }
  PickleBuilder& u8(std::uint8_t value) {
    bytes_.push_back(std::byte{value});
    return *this;
  }
  PickleBuilder& le(std::uint64_t value, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) u8(static_cast<std::uint8_t>(value >> (8 * i)));
    return *this;
  }
  PickleBuilder& raw(std::string_view text) {
    for (char c : text) u8(static_cast<std::uint8_t>(c));
    return *this;
  }
  PickleBuilder& repeat(std::uint8_t code, std::size_t count) {
    bytes_.insert(bytes_.end(), count, std::byte{code});
    return *this;
  }

  PickleBuilder& proto(int version = 2) { return op(format::pickle_op::PROTO).u8(static_cast<std::uint8_t>(version)); }
  PickleBuilder& stop() { return op(format::pickle_op::STOP); }
  PickleBuilder& mark() { return op(format::pickle_op::MARK); }
  PickleBuilder& none() { return op(format::pickle_op::NONE); }
  PickleBuilder& boolean(bool v) { return op(v ? format::pickle_op::NEWTRUE : format::pickle_op::NEWFALSE); }
  PickleBuilder& empty_dict() { return op(format::pickle_op::EMPTY_DICT); }
  PickleBuilder& empty_list() { return op(format::pickle_op::EMPTY_LIST); }
  PickleBuilder& empty_tuple() { return op(format::pickle_op::EMPTY_TUPLE); }
  PickleBuilder& tuple() { return op(format::pickle_op::TUPLE); }
  PickleBuilder& tuple1() { return op(format::pickle_op::TUPLE1); }
  PickleBuilder& tuple2() { return op(format::pickle_op::TUPLE2); }
  PickleBuilder& tuple3() { return op(format::pickle_op::TUPLE3); }
  PickleBuilder& setitem() { return op(format::pickle_op::SETITEM); }
  PickleBuilder& setitems() { return op(format::pickle_op::SETITEMS); }
  PickleBuilder& append() { return op(format::pickle_op::APPEND); }
  PickleBuilder& appends() { return op(format::pickle_op::APPENDS); }
  PickleBuilder& reduce() { return op(format::pickle_op::REDUCE); }
  PickleBuilder& build() { return op(format::pickle_op::BUILD); }
  PickleBuilder& binpersid() { return op(format::pickle_op::BINPERSID); }
  PickleBuilder& binput(std::uint8_t i) { return op(format::pickle_op::BINPUT).u8(i); }
  PickleBuilder& binget(std::uint8_t i) { return op(format::pickle_op::BINGET).u8(i); }
  PickleBuilder& long_binput(std::uint32_t i) { return op(format::pickle_op::LONG_BINPUT).le(i, 4); }
  PickleBuilder& long_binget(std::uint32_t i) { return op(format::pickle_op::LONG_BINGET).le(i, 4); }

  // The shortest of BININT1 / BININT2 / BININT / 8-byte LONG1, as the writer does.
  PickleBuilder& integer(std::int64_t v) {
    if (v >= 0 && v <= 0xFF) return op(format::pickle_op::BININT1).u8(static_cast<std::uint8_t>(v));
    if (v >= 0 && v <= 0xFFFF) return op(format::pickle_op::BININT2).le(static_cast<std::uint64_t>(v), 2);
    if (v >= INT32_MIN && v <= INT32_MAX) return op(format::pickle_op::BININT).le(static_cast<std::uint32_t>(v), 4);
    return op(format::pickle_op::LONG1).u8(8).le(static_cast<std::uint64_t>(v), 8);
  }
  PickleBuilder& long1(std::int64_t v, std::size_t n) {
    return op(format::pickle_op::LONG1).u8(static_cast<std::uint8_t>(n)).le(static_cast<std::uint64_t>(v), n);
  }
  PickleBuilder& str(std::string_view s) { return op(format::pickle_op::BINUNICODE).le(s.size(), 4).raw(s); }
  PickleBuilder& global(std::string_view module, std::string_view name) {
    return op(format::pickle_op::GLOBAL).raw(module).raw("\n").raw(name).raw("\n");
  }
  PickleBuilder& ordered_dict() { return global("collections", "OrderedDict").empty_tuple().reduce(); }

  // ('storage', torch.<type>, key, location, numel) BINPERSID
  PickleBuilder& pid(std::string_view type, std::string_view key, std::int64_t numel,
                     std::string_view location = "cpu") {
    return mark().str("storage").global("torch", type).str(key).str(location).integer(numel).tuple().binpersid();
  }

  PickleBuilder& int_tuple(std::initializer_list<std::int64_t> values) {
    mark();
    for (std::int64_t v : values) integer(v);
    return tuple();
  }

  // torch._utils._rebuild_tensor_v2(pid, offset, size, stride, requires_grad, OrderedDict())
  PickleBuilder& tensor(std::string_view type, std::string_view key, std::int64_t numel, std::int64_t offset,
                        std::initializer_list<std::int64_t> size, std::initializer_list<std::int64_t> stride,
                        bool requires_grad = false) {
    global("torch._utils", "_rebuild_tensor_v2").mark().pid(type, key, numel).integer(offset);
    int_tuple(size).int_tuple(stride).boolean(requires_grad).ordered_dict();
    return tuple().reduce();
  }

  // A 1-d tensor over the whole storage `key`, stored at `location`.
  PickleBuilder& tensor_over(std::string_view type, std::string_view key, std::int64_t numel,
                             std::string_view location = "cpu") {
    global("torch._utils", "_rebuild_tensor_v2").mark().pid(type, key, numel, location).integer(0);
    mark().integer(numel).tuple().mark().integer(1).tuple();
    return boolean(false).ordered_dict().tuple().reduce();
  }

  std::vector<std::byte> bytes() const { return bytes_; }
  std::size_t size() const { return bytes_.size(); }

 private:
  std::vector<std::byte> bytes_;
};

// Storage records by key, checked the way the zip reader's resolver checks
// them: a missing record and a size other than numel x itemsize are refused.
class MemoryStorages : public format::StorageResolver {
 public:
  void add(const std::string& key, std::vector<std::byte> bytes) { records_[key] = std::move(bytes); }
  void add_zeros(const std::string& key, std::size_t nbytes) { records_[key] = std::vector<std::byte>(nbytes); }
  // Make up zero records of the requested size (up to `max_bytes`) for keys not added.
  void fabricate_missing(std::uint64_t max_bytes) { fabricate_bytes_ = max_bytes; }

  std::shared_ptr<const Storage> resolve(const format::StorageRequest& request) override {
    ++resolve_calls;
    const std::uint64_t nbytes = request.numel * dtype_itemsize(request.dtype);  // checked by the VM
    auto found = records_.find(request.key);
    if (found == records_.end()) {
      if (nbytes > fabricate_bytes_) {
        detail::fail(ErrorCode::storage_record_missing, "no record data/", request.key);
      }
      found = records_.emplace(request.key, std::vector<std::byte>(static_cast<std::size_t>(nbytes))).first;
    }
    if (found->second.size() != nbytes) {
      detail::fail(ErrorCode::storage_size_mismatch, "record data/", request.key, " has ", found->second.size(),
                   " bytes, the pickle declares ", nbytes);
    }
    return Storage::copy_of(found->second);
  }

  int resolve_calls = 0;

 private:
  std::map<std::string, std::vector<std::byte>> records_;
  std::uint64_t fabricate_bytes_ = 0;
};

template <typename T>
std::vector<std::byte> bytes_of_values(std::initializer_list<T> values) {
  std::vector<std::byte> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

}  // namespace holdpoint::testing
