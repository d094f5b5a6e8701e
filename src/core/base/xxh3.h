// XXH3-128: a fast non-cryptographic digest of storage bytes (about 20x the
// speed of SHA-256 here), used where a checkpoint needs the identity of a
// component's tensors but the whole-file SHA-256 already authenticates the
// bytes (docs/format.md, "What each digest proves"). Header-only xxHash
// (Debian's libxxhash-dev), inlined so nothing extra is linked.
//
// Thread-safety: one Xxh3_128 object per thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace holdpoint::io {

using Xxh3Digest = std::array<std::uint8_t, 16>;

class Xxh3_128 {
 public:
  Xxh3_128() { XXH3_128bits_reset(&state_); }
  void update(std::span<const std::byte> bytes) { XXH3_128bits_update(&state_, bytes.data(), bytes.size()); }
  // The digest in xxHash's canonical (big-endian) byte order; resets the state.
  Xxh3Digest finish() {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(&state_));
    XXH3_128bits_reset(&state_);
    Xxh3Digest out;
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = canonical.digest[i];
    return out;
  }
  static Xxh3Digest of(std::span<const std::byte> bytes) {
    Xxh3_128 hasher;
    hasher.update(bytes);
    return hasher.finish();
  }

 private:
  XXH3_state_t state_;
};

}  // namespace holdpoint::io
