// libFuzzer target: the restricted pickle VM (zip and legacy persistent-id
// forms) and the legacy stream reader, over the same bytes.
//
// Oracles besides the sanitizers: only holdpoint::Error may escape a reader;
// every tensor of an accepted value is read in full (out-of-bounds views show
// up under ASan); and whatever the VM accepts, the emitter writes and the VM
// reads back to an equal value; and the plain VM (every memo entry kept, no
// arena compaction, no tensor fast path) gives the same verdict: an equal
// value or the same error code, and without the fast path the same message;
// so does a read whose spent bytes (PickleOptions::on_spent) are zeroed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <span>
#include <vector>

#include "base/fail.h"
#include "format/pickle/legacy_reader.h"
#include "format/pickle/pickle_reader.h"
#include "format/pickle/pickle_writer.h"
#include "holdpoint/base/error.h"
#include "support/dropped_tensors.h"

namespace {

using namespace holdpoint;

// Tight bounds so that the fuzzer spends its time on rejection paths, not on
// legitimately large inputs.
Limits fuzz_limits() {
  Limits limits;
  limits.max_pickle_bytes = 1 << 20;
  limits.max_opcodes = 1 << 17;
  limits.max_stack_items = 1 << 14;
  limits.max_memo_entries = 1 << 14;
  limits.max_string_bytes = 1 << 16;
  limits.max_container_elements = 1 << 17;
  limits.max_expanded_nodes = 1 << 17;
  limits.max_tensors = 1 << 10;
  limits.max_tensor_numel = 1 << 20;
  limits.max_tensor_logical_bytes = 1 << 20;
  return limits;
}

// Zero-filled storages of the requested size, as the zip reader would hand
// out records, within a per-input budget.
class FabricatedStorages final : public format::StorageResolver {
 public:
  std::shared_ptr<const Storage> resolve(const format::StorageRequest& request) override {
    const std::uint64_t nbytes = request.numel * dtype_itemsize(request.dtype);  // checked by the VM
    if (nbytes > kBudgetBytes - used_) {
      detail::fail(ErrorCode::storage_size_mismatch, "fuzz: storage '", request.key, "' exceeds the budget");
    }
    used_ += nbytes;
    auto buffer = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(nbytes));
    return std::make_shared<const Storage>(buffer->data(), buffer->size(), buffer);
  }

 private:
  static constexpr std::uint64_t kBudgetBytes = 4 << 20;
  std::uint64_t used_ = 0;
};

// Serves the storages a write_pickle result names.
class WrittenStorages final : public format::StorageResolver {
 public:
  explicit WrittenStorages(const format::PickleWriteResult& written) : written_(written) {}
  std::shared_ptr<const Storage> resolve(const format::StorageRequest& request) override {
    for (const auto& storage : written_.storages) {
      if (storage.key == request.key) return storage.storage;
    }
    detail::fail(ErrorCode::storage_record_missing, "fuzz: no storage ", request.key);
  }

 private:
  const format::PickleWriteResult& written_;
};

// Reads every element of every tensor.
void touch(const Value& value) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      const auto bytes = value.as_tensor().contiguous_bytes();
      volatile std::byte sink{};
      for (std::byte b : bytes) sink = sink ^ b;
      return;
    }
    case ValueKind::list:
    case ValueKind::tuple:
      for (const Value& item : value.as_list()) touch(item);
      return;
    case ValueKind::dict:
    case ValueKind::ordered_dict:
      for (const auto& entry : value.as_dict()) touch(entry.second);
      if (value.as_dict().metadata()) touch(*value.as_dict().metadata());
      return;
    default: return;
  }
}

void check_round_trip(const Value& value) {
  format::PickleWriteResult written;
  try {
    written = format::write_pickle(value);
  } catch (const Error& error) {
    // v3 views of one untyped storage may legitimately differ in dtype; torch
    // itself refuses to save that, and so does the emitter.
    if (error.code() == ErrorCode::write_storage_dtype_conflict) return;
    std::abort();
  }
  try {
    WrittenStorages storages(written);
    const Value back = format::read_pickle(written.pickle, storages, {}).root;
    if (!equal_content(value, back)) std::abort();
  } catch (const Error&) {
    std::abort();  // the emitter wrote something the VM refuses
  }
}

// The verdict of reading with `options`: the value, or the error code and
// message.
struct Verdict {
  std::optional<Value> value;
  ErrorCode code{};
  std::string message;
};

Verdict read_verdict(std::span<const std::byte> bytes, const Limits& limits, const format::PickleOptions& options) {
  Verdict verdict;
  try {
    FabricatedStorages storages;
    verdict.value = format::read_pickle(bytes, storages, limits, options).root;
  } catch (const Error& error) {
    verdict.code = error.code();
    verdict.message = error.what();
  }
  return verdict;
}

// Keeping only the fetched memo entries, and decoding tensors in one step,
// change how the VM works, never what it reads: each must give the value, or
// the error, of the plain opcode-by-opcode VM that keeps every entry. The fast
// path also keeps the error's message (its offset and opcode).
void check_same_as_the_plain_vm(std::span<const std::byte> bytes, const Limits& limits,
                                const format::PickleOptions& options) {
  format::PickleOptions plain = options;
  plain.keep_fetched_memo_only = false;
  plain.tensor_fast_path = false;
  const Verdict reference = read_verdict(bytes, limits, plain);
  format::PickleOptions no_fast_path = options;
  no_fast_path.tensor_fast_path = false;
  const Verdict fast = read_verdict(bytes, limits, options);
  const Verdict slow = read_verdict(bytes, limits, no_fast_path);
  for (const Verdict* verdict : {&fast, &slow}) {
    if (verdict->value.has_value() != reference.value.has_value()) std::abort();
    if (verdict->value ? !equal_content(*verdict->value, *reference.value) : verdict->code != reference.code) {
      std::abort();
    }
  }
  if (!fast.value && fast.message != slow.message) std::abort();
  // Bytes the VM reports spent are never read again: zeroing them as they are
  // reported changes nothing (PickleOptions::on_spent).
  {
    std::vector<std::byte> copy(bytes.begin(), bytes.end());
    format::PickleOptions spending = options;
    spending.spend_every_bytes = 64;
    spending.on_spent = [&copy](std::size_t spent) {
      std::fill(copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(spent), std::byte{0});
    };
    const Verdict spent = read_verdict(copy, limits, spending);
    if (spent.value.has_value() != reference.value.has_value()) std::abort();
    if (spent.value ? !equal_content(*spent.value, *reference.value) : spent.code != reference.code) std::abort();
  }
  // Dropping tensors keeps every verdict and everything but the tensors.
  format::PickleOptions drop = options;
  drop.drop_tensors = true;
  const Verdict dropped = read_verdict(bytes, limits, drop);
  if (dropped.value.has_value() != reference.value.has_value()) std::abort();
  if (dropped.value ? !holdpoint::testing::reads_as_dropped(*dropped.value, *reference.value)
                    : dropped.code != reference.code) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const Limits limits = fuzz_limits();
  for (const bool legacy : {false, true}) {
    format::PickleOptions options;
    if (legacy) {
      options.persistent_ids = format::PersistentIdForm::legacy;
      options.canonical_storage_keys = false;
    }
    try {
      FabricatedStorages storages;
      const format::PickleResult result = format::read_pickle(bytes, storages, limits, options);
      touch(result.root);
      check_round_trip(result.root);
    } catch (const Error&) {
    }
    check_same_as_the_plain_vm(bytes, limits, options);
  }
  try {
    auto owner = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
    const format::LegacyStream stream = format::read_legacy_stream(*owner, owner, limits);
    touch(stream.root);
  } catch (const Error&) {
  }
  return 0;
}
