#include "base/poly1305.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "base/fail.h"

namespace holdpoint::io {

using detail::fail;

Poly1305Key random_poly1305_key() {
  Poly1305Key key;
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) {
    fail(ErrorCode::invalid_argument, "OpenSSL could not draw a random Poly1305 key");
  }
  return key;
}

struct Poly1305::State {
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* context = nullptr;
  ~State() {
    EVP_MAC_CTX_free(context);
    EVP_MAC_free(mac);
  }
};

Poly1305::Poly1305(const Poly1305Key& key) : state_(std::make_unique<State>()) {
  state_->mac = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
  if (state_->mac) state_->context = EVP_MAC_CTX_new(state_->mac);
  if (!state_->context || EVP_MAC_init(state_->context, key.data(), key.size(), nullptr) != 1) {
    fail(ErrorCode::invalid_argument, "OpenSSL has no usable POLY1305 MAC");
  }
}

Poly1305::~Poly1305() = default;
Poly1305::Poly1305(Poly1305&&) noexcept = default;
Poly1305& Poly1305::operator=(Poly1305&&) noexcept = default;

void Poly1305::update(std::span<const std::byte> bytes) {
  if (!bytes.empty() &&
      EVP_MAC_update(state_->context, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()) != 1) {
    fail(ErrorCode::invalid_argument, "OpenSSL's POLY1305 update failed");
  }
}

Poly1305Tag Poly1305::finish() {
  Poly1305Tag tag{};
  std::size_t length = 0;
  if (EVP_MAC_final(state_->context, tag.data(), &length, tag.size()) != 1 || length != tag.size()) {
    fail(ErrorCode::invalid_argument, "OpenSSL's POLY1305 final failed");
  }
  return tag;
}

bool same_tag(const Poly1305Tag& a, const Poly1305Tag& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace holdpoint::io
