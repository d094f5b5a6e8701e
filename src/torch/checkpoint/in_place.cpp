#include "checkpoint/in_place.h"

#include <algorithm>
#include <functional>

#include "base/fail.h"
#include "holdpoint/base/snapshot.h"
#include "holdpoint/state/module_state.h"

namespace holdpoint::checkpoint {

using detail::fail;

namespace {

// C-order strides of `sizes`.
bool is_whole_contiguous(const TensorData& tensor) {
  return tensor.is_contiguous() && tensor.storage_offset == 0 && tensor.storage &&
         tensor.logical_bytes() == tensor.storage->nbytes();
}

// Fresh memory for a storage the component adopts: its pages are returned to
// the kernel when the storage dies (handed-over storages do so).
struct FreshMemory {
  std::vector<std::shared_ptr<io::Buffer>> buffers;
};

Value rebuilt(const Value& value, const std::unordered_map<const void*, std::shared_ptr<const Storage>>& filled) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      const TensorData& tensor = value.as_tensor();
      if (!tensor.storage || tensor.storage->has_bytes()) return value;
      const auto it = filled.find(tensor.storage->identity());
      if (it == filled.end()) return value;
      TensorData copy = tensor;
      copy.storage = it->second;
      return Value::tensor(std::move(copy));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      items.reserve(value.as_list().size());
      for (const Value& item : value.as_list()) items.push_back(rebuilt(item, filled));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, rebuilt(item, filled));
      if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default: return value;
  }
}

}  // namespace

InPlaceFill::InPlaceFill(const io::RegularFile& file, const struct stat& identity,
                         std::filesystem::path journal_directory)
    : source_(file, identity, std::move(journal_directory)) {}

InPlaceFill::~InPlaceFill() = default;

void InPlaceFill::add_file(const io::RegularFile& file, const struct stat& identity,
                           std::unordered_map<const void*, format::AbsentRecord> absent) {
  // An added source never journals; its folder is not used.
  more_.push_back(std::make_unique<schema::InPlaceSource>(file, identity, std::filesystem::path()));
  more_.back()->set_records(std::move(absent));
}

StorageDigests InPlaceFill::storage_digests(StorageDigestKind kind) const {
  StorageDigests digests = source_.storage_digests(kind);
  for (const auto& source : more_) source->add_storage_digests(digests);
  return digests;
}

bool InPlaceFill::holds(const void* identity) const {
  if (source_.records().count(identity)) return true;
  for (const auto& source : more_) {
    if (source->records().count(identity)) return true;
  }
  return false;
}

schema::InPlaceSource* InPlaceFill::source_of(const void* identity) {
  if (source_.records().count(identity)) return &source_;
  for (const auto& source : more_) {
    if (source->records().count(identity)) return source.get();
  }
  return nullptr;
}

namespace {

void each_tensor(const Value& value, const std::function<void(const TensorData&)>& visit) {
  if (value.is_tensor()) {
    visit(value.as_tensor());
  } else if (value.is_sequence()) {
    for (const Value& item : value.as_list()) each_tensor(item, visit);
  } else if (value.is_dict()) {
    for (const auto& [key, item] : value.as_dict()) each_tensor(item, visit);
  }
}

}  // namespace

void InPlaceFill::journal_in_background(const std::vector<Component*>& components) {
  for (Component* component : components) {
    if (dynamic_cast<ModuleState*>(component)) journal_sources_.push_back(component->capture(CaptureMode::reference));
  }
  std::vector<std::pair<std::byte*, std::uint64_t>> ranges;
  for (const Value& source : journal_sources_) {
    each_tensor(source, [&ranges](const TensorData& tensor) {
      if (!tensor.storage || !tensor.storage->has_bytes() || !tensor.is_contiguous() || tensor.itemsize() == 0) return;
      const std::uint64_t start = static_cast<std::uint64_t>(tensor.storage_offset) * tensor.itemsize();
      const std::uint64_t size = tensor.logical_bytes();
      if (size == 0 || start + size > tensor.storage->nbytes()) return;
      ranges.emplace_back(const_cast<std::byte*>(tensor.storage->data()) + start, size);
    });
  }
  source_.journal_in_background(std::move(ranges));
}

void InPlaceFill::plan(const Value& file, const Value& live,
                       std::unordered_map<const void*, Destination>& destinations) const {
  if (file.is_tensor()) {
    const TensorData& tensor = file.as_tensor();
    if (!tensor.storage || tensor.storage->has_bytes() || !holds(tensor.storage->identity())) return;
    Destination& destination = destinations[tensor.storage->identity()];  // fresh memory unless the live tensor fits
    if (destination.live || !live.is_tensor() || !is_whole_contiguous(tensor)) return;
    const TensorData& target = live.as_tensor();
    if (target.dtype != tensor.dtype || target.sizes.vec() != tensor.sizes.vec() || !target.is_contiguous() ||
        !target.storage || !target.storage->has_bytes() || target.itemsize() == 0) {
      return;
    }
    const std::uint64_t start = static_cast<std::uint64_t>(target.storage_offset) * target.itemsize();
    if (start + tensor.storage->nbytes() > target.storage->nbytes()) return;
    destination.live = const_cast<std::byte*>(target.storage->data()) + start;
    destination.owner = target.storage;
    return;
  }
  if (file.is_dict() && live.is_dict()) {
    for (const auto& [key, item] : file.as_dict()) {
      const Value* counterpart = live.as_dict().find(key);
      plan(item, counterpart ? *counterpart : Value::none(), destinations);
    }
    return;
  }
  if (file.is_sequence()) {
    const bool paired = live.is_sequence() && live.as_list().size() == file.as_list().size();
    for (std::size_t i = 0; i < file.as_list().size(); ++i) {
      plan(file.as_list()[i], paired ? live.as_list()[i] : Value::none(), destinations);
    }
    return;
  }
  if (file.is_dict()) {
    for (const auto& [key, item] : file.as_dict()) plan(item, Value::none(), destinations);
  }
}

Value InPlaceFill::fill(const Value& root, const std::vector<std::pair<Component*, const Value*>>& states) {
  std::unordered_map<const void*, Destination> destinations;
  for (const auto& [component, state] : states) {
    // Only a model's apply is known to copy every tensor into the live one
    // it replaces (ModuleState); an optimizer adopts fresh memory as its new
    // state, and other components get fresh memory they copy from.
    const bool into_live = dynamic_cast<ModuleState*>(component) != nullptr;
    plan(*state, into_live ? component->capture(CaptureMode::reference) : Value::none(), destinations);
  }
  // Storages elsewhere in the tree (not under a component) stay absent; no
  // component reads them.
  struct Step {
    const void* identity;
    schema::InPlaceSource* source;
    const format::AbsentRecord* record;
    Destination* destination;
  };
  std::vector<Step> order;
  std::unordered_map<const schema::InPlaceSource*, std::size_t> source_index{{&source_, 0}};
  for (std::size_t i = 0; i < more_.size(); ++i) source_index[more_[i].get()] = i + 1;
  for (auto& [identity, destination] : destinations) {
    schema::InPlaceSource* source = source_of(identity);
    order.push_back({identity, source, &source->records().at(identity), &destination});
  }
  // File by file, each in the order of its bytes.
  std::sort(order.begin(), order.end(), [&](const Step& a, const Step& b) {
    const std::size_t fa = source_index.at(a.source), fb = source_index.at(b.source);
    return fa != fb ? fa < fb : a.record->offset < b.record->offset;
  });

  auto fresh = std::make_shared<FreshMemory>();
  std::unordered_map<const void*, std::shared_ptr<const Storage>> filled;
  try {
    source_.begin();
    for (const auto& source : more_) source->begin();
    // Every destination first: the live bytes not journaled yet go to the
    // journal, fresh memory is mapped.
    struct Read {
      std::byte* to;
      schema::InPlaceSource* source;
      const format::AbsentRecord* record;
      io::Buffer* fresh;
    };
    std::vector<Read> reads;
    std::uint64_t total = 0;
    for (auto& [identity, source, record, destination] : order) {
      if (destination->live) {
        source_.journal_unless_held(destination->live, record->size);
        reads.push_back({destination->live, source, record, nullptr});
      } else {
        fresh->buffers.push_back(io::Buffer::allocate(static_cast<std::size_t>(record->size)));
        reads.push_back({fresh->buffers.back()->data(), source, record, fresh->buffers.back().get()});
      }
      total += record->size;
    }
    // Then the reads, on two threads: reading from the page cache, the tags
    // and faulting in fresh memory each take a core's time. This thread takes
    // the records up to half the bytes, a helper the rest.
    std::size_t split = 0;
    for (std::uint64_t running = 0; split < reads.size() && running < total / 2; ++split) running += reads[split].record->size;
    std::exception_ptr helper_failure;
    std::thread helper;
    if (split < reads.size() && total >= kParallelReadBytes) {
      helper = std::thread([&] {
        try {
          for (std::size_t i = split; i < reads.size(); ++i) {
            reads[i].source->read_into(reads[i].to, *reads[i].record, reads[i].fresh);
          }
        } catch (...) {
          helper_failure = std::current_exception();
        }
      });
    } else {
      split = reads.size();
    }
    std::exception_ptr own_failure;
    try {
      for (std::size_t i = 0; i < split; ++i) reads[i].source->read_into(reads[i].to, *reads[i].record, reads[i].fresh);
    } catch (...) {
      own_failure = std::current_exception();
    }
    if (helper.joinable()) helper.join();
    if (own_failure) std::rethrow_exception(own_failure);
    if (helper_failure) std::rethrow_exception(helper_failure);
    // The tree's tensors view the destinations. Fresh memory is handed over
    // (the component may take it as its live state); live memory is not.
    std::size_t next_fresh = 0;
    std::shared_ptr<const void> fresh_owner = fresh;
    for (auto& [identity, source, record, destination] : order) {
      if (destination->live) {
        filled[identity] = std::make_shared<const Storage>(destination->live, static_cast<std::size_t>(record->size),
                                                           destination->owner);
      } else {
        const std::shared_ptr<io::Buffer>& buffer = fresh->buffers[next_fresh++];
        filled[identity] = std::make_shared<const Storage>(
            buffer->data(), static_cast<std::size_t>(record->size), std::shared_ptr<const void>(fresh_owner, buffer.get()));
      }
    }
  } catch (...) {
    source_.restore();
    throw;
  }
  Value result = rebuilt(root, filled);
  filled.clear();
  destinations.clear();
  hand_over_storages(result, fresh);
  return result;
}

}  // namespace holdpoint::checkpoint
