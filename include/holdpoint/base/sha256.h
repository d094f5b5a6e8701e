// SHA-256 digests: a typed digest value and a streaming hasher.
//
// Sha256 wraps OpenSSL's EVP interface (SHA-NI where the CPU has it). The
// digest type prints and parses as the 64 lowercase hex digits `sha256sum`
// uses, so sidecar files interoperate with coreutils.
//
// Thread-safety: a Sha256 object is used by one thread at a time; digests are
// plain values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace holdpoint {

struct Sha256Digest {
  std::array<std::uint8_t, 32> bytes{};

  std::string hex() const;
  // Accepts exactly 64 hex digits (either case); nullopt otherwise.
  static std::optional<Sha256Digest> from_hex(std::string_view hex);
  // Like from_hex, for digests a user typed or a file carried: throws
  // holdpoint::Error(sha256_invalid) quoting `hex` when it is not 64 hex digits.
  static Sha256Digest parse(std::string_view hex);
  bool operator==(const Sha256Digest&) const = default;
};

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void update(const void* data, std::size_t size);
  void update(std::span<const std::byte> bytes) { update(bytes.data(), bytes.size()); }
  // Returns the digest and resets the hasher for reuse.
  Sha256Digest finish();

  static Sha256Digest of(std::span<const std::byte> bytes);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace holdpoint
