// Poly1305 (Bernstein), a one-time message authenticator, through OpenSSL's
// EVP_MAC: 12 GB/s on one core here with AVX2, against 1.4 GB/s for SHA-256.
//
// A resume in place (docs/resume-contract.md, "Resuming in place") reads a
// large tensor's bytes twice: once while the file's SHA-256 is computed, and
// again into the live tensor. Each such record gets a tag under a key drawn
// for it alone on the first pass; the second pass checks the bytes it copied
// against that tag. The key never leaves the process, so a change to the file
// between the passes cannot be made to match: under a one-time key a forgery
// succeeds with probability below 2^-90 for records under 2^40 bytes.
//
// Failure contract: OpenSSL failures throw holdpoint::Error(invalid_argument), as for SHA-256.
// Thread-safety: one object per thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace holdpoint::io {

using Poly1305Key = std::array<std::uint8_t, 32>;
using Poly1305Tag = std::array<std::uint8_t, 16>;

// A key from OpenSSL's random generator; each is for one message.
Poly1305Key random_poly1305_key();

class Poly1305 {
 public:
  explicit Poly1305(const Poly1305Key& key);
  ~Poly1305();
  Poly1305(Poly1305&&) noexcept;
  Poly1305& operator=(Poly1305&&) noexcept;
  void update(std::span<const std::byte> bytes);
  Poly1305Tag finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Tags compared in time independent of where they differ.
bool same_tag(const Poly1305Tag& a, const Poly1305Tag& b) noexcept;

}  // namespace holdpoint::io
