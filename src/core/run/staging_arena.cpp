#include "run/staging_arena.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "holdpoint/base/snapshot.h"

namespace holdpoint::run {

namespace {

constexpr std::size_t kAlignment = 64;
// Below this a second thread costs more than it saves.
constexpr std::size_t kMinBytesPerThread = std::size_t{4} << 20;

struct Piece {
  std::byte* destination;
  const std::byte* source;
  std::size_t size;
};

void gather(const Value& value, std::unordered_map<const void*, std::shared_ptr<const Storage>>& found,
            std::vector<const Storage*>& order) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      const auto& storage = value.as_tensor().storage;
      if (storage && found.emplace(storage->identity(), nullptr).second) order.push_back(storage.get());
      break;
    }
    case ValueKind::list:
    case ValueKind::tuple:
      for (const Value& item : value.as_list()) gather(item, found, order);
      break;
    case ValueKind::dict:
    case ValueKind::ordered_dict:
      for (const auto& [key, item] : value.as_dict()) gather(item, found, order);
      break;
    case ValueKind::sparse_tensor:
      for (const Value& part : value.as_sparse_tensor().parts) gather(part, found, order);
      break;
    default: break;
  }
}

Value rewrite(const Value& value, const std::unordered_map<const void*, std::shared_ptr<const Storage>>& staged) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      TensorData copy = value.as_tensor();
      if (copy.storage) copy.storage = staged.at(copy.storage->identity());
      return Value::tensor(std::move(copy));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : value.as_list()) items.push_back(rewrite(item, staged));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, rewrite(item, staged));
      if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    case ValueKind::sparse_tensor: {
      SparseTensor copy = value.as_sparse_tensor();
      for (Value& part : copy.parts) part = rewrite(part, staged);
      return Value::sparse_tensor(std::move(copy));
    }
    default: return value;
  }
}

void copy_pieces(const std::vector<Piece>& pieces, unsigned threads) {
  std::size_t total = 0;
  for (const auto& p : pieces) total += p.size;
  threads = static_cast<unsigned>(std::clamp<std::size_t>(total / kMinBytesPerThread, 1, threads));
  if (threads <= 1) {
    for (const auto& p : pieces) std::memcpy(p.destination, p.source, p.size);
    return;
  }
  // Cut the concatenated pieces into `threads` equal byte ranges.
  const std::size_t share = (total + threads - 1) / threads;
  std::vector<std::vector<Piece>> work(threads);
  std::size_t filled = 0;
  unsigned worker = 0;
  for (Piece p : pieces) {
    while (p.size > 0) {
      const std::size_t room = share - filled;
      const std::size_t take = std::min(room, p.size);
      work[worker].push_back({p.destination, p.source, take});
      p.destination += take;
      p.source += take;
      p.size -= take;
      filled += take;
      if (filled == share && worker + 1 < threads) {
        ++worker;
        filled = 0;
      }
    }
  }
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) {
    helpers.emplace_back([&work, t] {
      for (const auto& p : work[t]) std::memcpy(p.destination, p.source, p.size);
    });
  }
  for (const auto& p : work[0]) std::memcpy(p.destination, p.source, p.size);
  for (auto& h : helpers) h.join();
}

}  // namespace

void parallel_copy(std::byte* destination, const std::byte* source, std::size_t size, unsigned threads) {
  copy_pieces({{destination, source, size}}, std::max(1u, threads));
}

StagingArena::StagingArena(unsigned threads)
    : threads_(threads ? threads : std::clamp(std::thread::hardware_concurrency(), 1u, 8u)) {}

StagingArena::~StagingArena() = default;

void StagingArena::reserve(std::uint64_t bytes) {
  if ((buffer_ && buffer_->size() >= bytes) || (buffer_ && buffer_.use_count() > 1) || bytes == 0) return;
  buffer_.reset();
  buffer_ = io::Buffer::allocate(bytes);
  std::memset(buffer_->data(), 0, buffer_->size());
}

std::uint64_t StagingArena::capacity() const noexcept { return buffer_ ? buffer_->size() : 0; }

StageStats StagingArena::stage(std::vector<std::pair<std::string, Value>>& states) {
  std::unordered_map<const void*, std::shared_ptr<const Storage>> staged;
  std::vector<const Storage*> order;
  for (const auto& [name, state] : states) gather(state, staged, order);

  StageStats stats;
  stats.storages = order.size();
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (const Storage* s : order) {
    offsets.push_back(total);
    total += (s->nbytes() + kAlignment - 1) / kAlignment * kAlignment;
  }
  stats.reused = buffer_ && buffer_->size() >= total && buffer_.use_count() == 1;
  if (!stats.reused) {
    buffer_.reset();  // release the old one before mapping a new one
    buffer_ = io::Buffer::allocate(std::max<std::size_t>(total, 1));
  }
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < order.size(); ++i) {
    pieces.push_back({buffer_->data() + offsets[i], order[i]->data(), order[i]->nbytes()});
    stats.bytes += order[i]->nbytes();
  }
  stats.threads = threads_;
  copy_pieces(pieces, threads_);

  const std::shared_ptr<const void> owner = buffer_;
  for (std::size_t i = 0; i < order.size(); ++i) {
    staged[order[i]->identity()] =
        std::make_shared<const Storage>(buffer_->data() + offsets[i], order[i]->nbytes(), owner);
  }
  for (auto& [name, state] : states) state = rewrite(state, staged);
  return stats;
}

}  // namespace holdpoint::run
