// StagingArena: reusable host memory that asynchronous saves copy the state
// into on the training thread, so the background writer never reads live
// tensors.
//
// stage() walks captured states, gathers each distinct storage once (views of
// one storage stay views of one staged storage), copies them into one
// page-aligned buffer with several threads, and rewrites the states to point
// at the copies. The buffer is kept and reused by the next stage() when it is
// large enough and no staged state still holds it (the manager stages again
// only after the previous save finished); otherwise a new one is allocated.
//
// Failure contract: allocation failure throws std::bad_alloc or
// holdpoint::Error (io_*); the states are left unchanged then.
//
// Thread-safety: one thread calls stage() at a time; the copy threads are
// internal.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "holdpoint/format/value.h"

namespace holdpoint::io {
class Buffer;
}

namespace holdpoint::run {

struct StageStats {
  std::uint64_t bytes = 0;     // copied
  std::size_t storages = 0;
  bool reused = false;         // the previous buffer was reused
  unsigned threads = 1;
};

class StagingArena {
 public:
  // threads == 0: one per hardware thread, at most 8.
  explicit StagingArena(unsigned threads = 0);
  ~StagingArena();
  StagingArena(const StagingArena&) = delete;
  StagingArena& operator=(const StagingArena&) = delete;

  StageStats stage(std::vector<std::pair<std::string, Value>>& states);
  // Makes the buffer at least `bytes` large, touching every page, unless a
  // staged state still holds the current one.
  void reserve(std::uint64_t bytes);
  std::uint64_t capacity() const noexcept;

 private:
  std::shared_ptr<io::Buffer> buffer_;
  unsigned threads_;
};

// Copies `size` bytes with up to `threads` threads (the caller's included).
void parallel_copy(std::byte* destination, const std::byte* source, std::size_t size, unsigned threads);

}  // namespace holdpoint::run
