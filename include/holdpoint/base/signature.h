// Signed statements about checkpoint files: who vouches for which bytes.
//
// A SHA-256 beside a file proves nothing about who wrote it. A signature
// file (`step-N.pt.sig`) carries a small statement (the file's name, size and
// SHA-256, its step, config identity and profile, when it was signed, by
// which key, and the digest of the generation before it) and a signature over
// exactly those bytes:
//   - Ed25519 (OpenSSL): a private key signs, anyone with the public key
//     verifies;
//   - HMAC-SHA-256: one shared secret does both, for clusters without PKI.
// A TrustPolicy says which keys a reader trusts, which key ids are revoked
// and whether a signature is required. LoadOptions::trust (checkpoint_mapping.h)
// applies it before a byte of the file is parsed: the statement's digest then
// becomes the digest the file must have.
//
// The signature file, in this order, one field a line (docs/threat-model.md,
// "Signatures"):
//   holdpoint-signature 1
//   algorithm ed25519|hmac-sha256
//   key-id <32 hex>
//   file <name, no '/'>
//   size <decimal>
//   sha256 <64 hex>
//   step <decimal or ->
//   config-identity <64 hex or ->
//   profile <name or ->
//   created <UTC, 2026-12-05T06:00:00Z>
//   previous-sha256 <64 hex or ->
//   signature <128 hex (Ed25519) or 64 hex (HMAC)>
// The signature covers every byte before the `signature` line. Anything else
// (another order, a field twice, a character out of place, more than 4 KiB)
// is signature_malformed.
//
// Secrets: a private key or HMAC secret is held only in memory by SigningKey;
// it is never written into a checkpoint, a signature, an index, a log or an
// error message (errors name key ids, which are digests of public keys or of
// the secret under a fixed label).
//
// Thread-safety: SigningKey, VerifyingKey and TrustPolicy are immutable after
// construction and safe to share.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/sha256.h"

namespace holdpoint {

namespace io {
class Directory;
}  // namespace io

// The most bytes a signature file may have; a larger one is signature_malformed
// before it is read.
inline constexpr std::uint64_t kMaxSignatureFileBytes = 4096;

enum class SignatureAlgorithm : std::uint8_t { ed25519, hmac_sha256 };

std::string_view signature_algorithm_name(SignatureAlgorithm algorithm) noexcept;

// What a signature vouches for.
struct SignedStatement {
  std::string file;  // the file's name, without directories
  std::uint64_t size = 0;
  Sha256Digest sha256;
  std::optional<std::uint64_t> step;
  std::optional<Sha256Digest> config_identity;
  std::string profile;  // empty when the file names none
  std::string created;  // UTC, "2026-12-05T06:00:00Z"
  // The digest of the generation signed before this one in a run (the chain
  // that exposes a gap or a rolled-back LATEST); none for the first or a lone file.
  std::optional<Sha256Digest> previous_sha256;
};

// A statement with its signature, as stored in a `.sig` file.
struct SignatureFile {
  SignatureAlgorithm algorithm = SignatureAlgorithm::ed25519;
  std::string key_id;
  SignedStatement statement;
  std::string signature;  // raw bytes: 64 (Ed25519) or 32 (HMAC)

  // The exact bytes the signature covers (every line before `signature`).
  std::string signed_text() const;
  // The whole file: signed_text() and the signature line.
  std::string text() const;
  // Parses a signature file strictly; Error(signature_malformed) naming the
  // line and field otherwise. Never verifies: see TrustPolicy::verify.
  static SignatureFile parse(std::string_view text);
};

// A key that verifies: an Ed25519 public key or an HMAC secret.
class VerifyingKey {
 public:
  // A PEM public key ("-----BEGIN PUBLIC KEY-----", Ed25519) or an HMAC key file.
  static std::vector<VerifyingKey> read_file(const std::filesystem::path& path);
  SignatureAlgorithm algorithm() const noexcept { return algorithm_; }
  const std::string& key_id() const noexcept { return key_id_; }
  bool verifies(std::string_view message, std::string_view signature) const;

 private:
  friend class SigningKey;
  SignatureAlgorithm algorithm_ = SignatureAlgorithm::ed25519;
  std::string key_id_;
  std::string material_;  // the raw 32-byte Ed25519 public key, or the HMAC secret
};

// A key that signs: an Ed25519 private key or an HMAC secret.
class SigningKey {
 public:
  static SigningKey generate(SignatureAlgorithm algorithm);
  // A PEM private key (PKCS#8, as `openssl genpkey -algorithm ed25519` writes)
  // or an HMAC key file ("holdpoint-hmac-sha256-key 1" and 64 hex digits).
  static SigningKey read_file(const std::filesystem::path& path);
  // Writes the key, readable by its owner only (0600), refusing to replace a file.
  void write_private_file(const std::filesystem::path& path) const;
  // Writes what verifies its signatures: the PEM public key (Ed25519). An HMAC
  // secret has no public part: invalid_argument.
  void write_public_file(const std::filesystem::path& path) const;

  SignatureAlgorithm algorithm() const noexcept { return verifier_.algorithm_; }
  const std::string& key_id() const noexcept { return verifier_.key_id_; }
  const VerifyingKey& verifying_key() const noexcept { return verifier_; }

  // Signs `statement` into a signature file.
  SignatureFile sign(const SignedStatement& statement) const;

 private:
  VerifyingKey verifier_;
  std::string secret_;  // the raw 32-byte Ed25519 seed, or the HMAC secret
};

// Which signatures a reader accepts.
struct TrustPolicy {
  std::vector<VerifyingKey> keys;
  std::set<std::string> revoked_key_ids;
  // A file without a signature is refused (signature_missing) when true, read
  // unsigned when false. A signature that is there is always checked.
  bool required = true;

  // An outside witness of a run directory's progress (docs/threat-model.md,
  // "Outside witness"). Nothing inside a directory can show that the whole of
  // it, signatures included, was put back to an earlier state; a step or
  // digest recorded elsewhere (a scheduler's log, a model registry) can.
  // Each is checked against the run's signed head, the newest generation its
  // signatures name; a head that falls short is signature_rollback.
  //   min_head_step: the head is this step or a later one;
  //   expected_head_step / expected_head_sha256: the head is exactly that
  //   generation (a finished run, a published one).
  // They apply to run directories (RunDirectoryOptions::trust and
  // verify_signatures); a single file has no head.
  std::optional<std::int64_t> min_head_step;
  std::optional<std::int64_t> expected_head_step;
  std::optional<Sha256Digest> expected_head_sha256;

  // Adds the key ids of a revocation list: one 32-hex key id a line, '#' comments.
  void read_revocation_list(const std::filesystem::path& path);

  // Checks `signature` against the keys: signature_key_revoked, then
  // signature_key_unknown (no trusted key has its id), then
  // signature_invalid. Returns the key that verified it.
  const VerifyingKey& verify(const SignatureFile& signature) const;
};

// `<file>.sig`
std::filesystem::path signature_path(const std::filesystem::path& file);

// Writes `<file>.sig` atomically (staged, fsynced, renamed), replacing an older one.
void write_signature_file(const std::filesystem::path& file, const SignatureFile& signature);

// The signature beside `file`, read and parsed (signature_malformed when it
// does not parse, nullopt when there is none), bounded to kMaxSignatureFileBytes.
std::optional<SignatureFile> read_signature_file(const std::filesystem::path& file);

// The signature file `name` of `directory` (a name inside a run directory or
// a sharded step, never followed through a symlink), read and parsed:
// nullopt when there is none; signature_malformed when it is not a regular
// file of at most kMaxSignatureFileBytes or does not parse. Errors name no
// path: the caller adds it.
std::optional<SignatureFile> read_signature(io::Directory& directory, const std::string& name);

// Reads and checks the signature of `file` under `policy`, and that its
// statement names this file (its name; signature_statement_mismatch
// otherwise). Returns the statement, whose size and sha256 the caller then
// holds the file's bytes to, or nullopt for an unsigned file under a policy
// that does not require one. Throws signature_missing when one is required.
std::optional<SignedStatement> check_signature(const std::filesystem::path& file, const TrustPolicy& policy);

}  // namespace holdpoint
