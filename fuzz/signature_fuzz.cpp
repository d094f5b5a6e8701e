// Fuzz target for the signature file parser (SignatureFile::parse,
// holdpoint/base/signature.h): the `.sig` beside a checkpoint comes from
// wherever the checkpoint came from, and is read before the checkpoint.
//
// Oracles besides the sanitizers: only holdpoint::Error may escape, always
// signature_malformed; a file that parses is in its one canonical spelling
// (text() gives back the input byte for byte); and a policy with a key of
// each kind refuses it with a signature code (nothing random verifies), never
// anything else.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "holdpoint/base/error.h"
#include "holdpoint/base/signature.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace holdpoint;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  static const TrustPolicy policy = [] {
    TrustPolicy p;
    p.keys.push_back(SigningKey::generate(SignatureAlgorithm::ed25519).verifying_key());
    p.keys.push_back(SigningKey::generate(SignatureAlgorithm::hmac_sha256).verifying_key());
    return p;
  }();
  SignatureFile parsed;
  try {
    parsed = SignatureFile::parse(input);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::signature_malformed) std::abort();
    return 0;
  }
  if (parsed.text() != input) std::abort();
  try {
    policy.verify(parsed);
    std::abort();  // a fuzzed signature verified under a fresh key
  } catch (const Error& error) {
    if (error.code() != ErrorCode::signature_key_unknown && error.code() != ErrorCode::signature_invalid) std::abort();
  }
  return 0;
}
