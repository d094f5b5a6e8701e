// Reading a whole file once, in order, through a small ring of buffers, while
// SHA-256 is computed on a second thread: what read_snapshot does, without
// keeping the bytes. Memory is the ring (kStreamBuffers x kStreamChunkBytes),
// whatever the file size.
//
// Each chunk is handed to `consume` on the calling thread as soon as it is
// read (while the hasher works on it or on earlier chunks), so checks that
// need every byte (CRC-32, comparing bytes read earlier) overlap hashing. The
// digest covers exactly the bytes `consume` was given.
//
// Failure contract: throws holdpoint::Error naming `label`: io_read_failed,
// file_changed_during_read when the file ends before `size` bytes or grows
// past them; whatever `consume` or `progress` throw is rethrown once the
// hasher has stopped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "holdpoint/base/sha256.h"
#include "holdpoint/base/snapshot.h"

namespace holdpoint::io {

inline constexpr std::size_t kStreamChunkBytes = std::size_t{8} << 20;
inline constexpr std::size_t kStreamBuffers = 4;

// Called with the file offset of each chunk and its bytes, in file order.
using ChunkConsumer = std::function<void(std::uint64_t offset, std::span<const std::byte> bytes)>;

// Reads [0, size) of the open file `fd` with pread (the descriptor's offset is
// not used), then checks that nothing follows. `progress` is called with
// (bytes read, size) every 64 MiB and once at the end.
Sha256Digest stream_file(int fd, const std::string& label, std::uint64_t size, const ChunkConsumer& consume,
                         const ReadProgress& progress = {});

// pread of up to `size` bytes at `offset`, retrying short reads and EINTR;
// returns the bytes read, fewer only at the end of the file. io_read_failed
// on an error.
std::size_t pread_fully(int fd, std::byte* out, std::size_t size, std::uint64_t offset);

}  // namespace holdpoint::io
