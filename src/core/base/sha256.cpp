#include "holdpoint/base/sha256.h"

#include <openssl/evp.h>

#include "base/fail.h"

namespace holdpoint {

namespace {
constexpr char kHexDigits[] = "0123456789abcdef";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string Sha256Digest::hex() const {
  std::string out(64, '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kHexDigits[bytes[i] >> 4];
    out[2 * i + 1] = kHexDigits[bytes[i] & 15];
  }
  return out;
}

std::optional<Sha256Digest> Sha256Digest::from_hex(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  Sha256Digest digest;
  for (std::size_t i = 0; i < 32; ++i) {
    const int hi = hex_value(hex[2 * i]);
    const int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    digest.bytes[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return digest;
}

Sha256Digest Sha256Digest::parse(std::string_view hex) {
  if (auto digest = from_hex(hex)) return *digest;
  detail::fail(ErrorCode::sha256_invalid, "SHA-256 '", hex, "' is not 64 hexadecimal digits");
}

struct Sha256::State {
  EVP_MD_CTX* context = nullptr;
  ~State() { EVP_MD_CTX_free(context); }
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->context = EVP_MD_CTX_new();
  if (!state_->context || EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr) != 1) {
    detail::fail(ErrorCode::invalid_argument, "OpenSSL could not initialise SHA-256");
  }
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, std::size_t size) {
  if (size > 0) EVP_DigestUpdate(state_->context, data, size);
}

Sha256Digest Sha256::finish() {
  Sha256Digest digest;
  unsigned int length = 0;
  EVP_DigestFinal_ex(state_->context, digest.bytes.data(), &length);
  EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr);
  return digest;
}

Sha256Digest Sha256::of(std::span<const std::byte> bytes) {
  Sha256 hasher;
  hasher.update(bytes);
  return hasher.finish();
}

}  // namespace holdpoint
