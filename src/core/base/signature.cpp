// Signed statements: Ed25519 and HMAC-SHA-256 through OpenSSL, and the strict
// line format of `.sig` files (holdpoint/base/signature.h).
#include "holdpoint/base/signature.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <utility>

#include "base/fail.h"
#include "base/file_descriptor.h"
#include "base/file_stream.h"
#include "base/regular_file.h"
#include "base/publish.h"
#include "base/utc_time.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/file_system.h"

namespace holdpoint {
namespace {

using detail::fail;

constexpr std::string_view kMagic = "holdpoint-signature 1";
constexpr std::string_view kHmacKeyMagic = "holdpoint-hmac-sha256-key 1";
constexpr std::size_t kKeyBytes = 32;

struct PkeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using Bio = std::unique_ptr<BIO, BioDeleter>;

std::string hex_of(std::string_view bytes) {
  constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::optional<std::string> bytes_of_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string out(hex.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    unsigned value = 0;
    for (std::size_t j = 0; j < 2; ++j) {
      const char c = hex[2 * i + j];
      value <<= 4;
      if (c >= '0' && c <= '9') value |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') value |= static_cast<unsigned>(c - 'a' + 10);
      else return std::nullopt;  // lowercase only: one spelling per signature
    }
    out[i] = static_cast<char>(value);
  }
  return out;
}

// The first 16 bytes of SHA-256 over a label and the key material, in hex:
// an Ed25519 key id names its public key, an HMAC key id reveals nothing of
// the secret.
std::string key_id_of(std::string_view label, std::string_view material) {
  Sha256 hasher;
  hasher.update(std::as_bytes(std::span(label.data(), label.size())));
  hasher.update(std::as_bytes(std::span(material.data(), material.size())));
  const Sha256Digest digest = hasher.finish();
  return digest.hex().substr(0, 32);
}

constexpr std::string_view kEd25519IdLabel = "holdpoint ed25519 public key\n";
constexpr std::string_view kHmacIdLabel = "holdpoint hmac-sha256 key id\n";

std::string read_small_file(const std::filesystem::path& path, std::size_t max_bytes, ErrorCode code,
                            std::string_view what) {
  // A FIFO or device planted as the file is io_not_regular_file, refused
  // before a read could block.
  std::optional<io::RegularFile> file;
  try {
    file = io::open_regular_for_reading(path, code);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::io_open_failed) throw;
    throw Error(code, detail::concat("cannot read the ", what, ": ", error.detail())).with_path(path.string());
  }
  if (file->size > max_bytes) {
    throw Error(code, detail::concat("the ", what, " is larger than ", max_bytes, " bytes")).with_path(path.string());
  }
  std::string text(max_bytes + 1, '\0');
  text.resize(io::pread_fully(file->fd.get(), reinterpret_cast<std::byte*>(text.data()), text.size(), 0));
  if (text.size() > max_bytes) {
    throw Error(code, detail::concat("the ", what, " is larger than ", max_bytes, " bytes")).with_path(path.string());
  }
  return text;
}

void write_new_private_file(const std::filesystem::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(ErrorCode::io_open_failed, detail::concat("cannot create the key file: ", std::strerror(errno)))
        .with_path(path.string());
  }
  io::FileDescriptor owner(fd);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(ErrorCode::io_write_failed, "writing the key file failed").with_path(path.string());
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) throw Error(ErrorCode::io_sync_failed, "fsync of the key file failed").with_path(path.string());
}

Pkey ed25519_private(std::string_view seed) {
  Pkey key(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(seed.data()),
                                        seed.size()));
  if (!key) fail(ErrorCode::key_file_invalid, "OpenSSL refused the Ed25519 private key");
  return key;
}

std::string raw_key(EVP_PKEY* key, bool private_part) {
  std::size_t size = kKeyBytes;
  std::string out(kKeyBytes, '\0');
  auto* data = reinterpret_cast<unsigned char*>(out.data());
  const int ok = private_part ? EVP_PKEY_get_raw_private_key(key, data, &size) : EVP_PKEY_get_raw_public_key(key, data, &size);
  if (ok != 1 || size != kKeyBytes) fail(ErrorCode::key_file_invalid, "not a 32-byte Ed25519 key");
  return out;
}

std::string pem_of(EVP_PKEY* key, bool private_part) {
  Bio bio(BIO_new(BIO_s_mem()));
  const int ok = private_part ? PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr)
                              : PEM_write_bio_PUBKEY(bio.get(), key);
  if (!bio || ok != 1) fail(ErrorCode::key_file_invalid, "OpenSSL could not write the key as PEM");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(size));
}

std::string hmac_sha256(std::string_view secret, std::string_view message) {
  std::array<unsigned char, 32> out{};
  std::size_t size = 0;
  if (!EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(), secret.size(),
                 reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), out.size(), &size) ||
      size != out.size()) {
    fail(ErrorCode::invalid_argument, "OpenSSL could not compute HMAC-SHA-256");
  }
  return std::string(reinterpret_cast<const char*>(out.data()), out.size());
}

std::string ed25519_sign(std::string_view seed, std::string_view message) {
  const Pkey key = ed25519_private(seed);
  const std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> context(EVP_MD_CTX_new());
  std::size_t size = 64;
  std::string signature(size, '\0');
  if (!context || EVP_DigestSignInit(context.get(), nullptr, nullptr, nullptr, key.get()) != 1 ||
      EVP_DigestSign(context.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      size != 64) {
    fail(ErrorCode::invalid_argument, "OpenSSL could not sign with Ed25519");
  }
  return signature;
}

// ---- the line format ------------------------------------------------------------------

bool is_decimal(std::string_view text) {
  if (text.empty() || text.size() > 19 || (text.size() > 1 && text[0] == '0')) return false;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool is_plain_name(std::string_view text, bool allow_slash) {
  if (text.empty() || text.size() > 255 || text == "-") return false;
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b <= 0x20 || b >= 0x7f || (!allow_slash && c == '/')) return false;
  }
  return !allow_slash ? (text != "." && text != "..") : true;
}

bool is_utc_time(std::string_view text) {
  // 2026-12-05T06:00:00Z
  if (text.size() != 20) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char want = i == 4 || i == 7 ? '-' : i == 10 ? 'T' : i == 13 || i == 16 ? ':' : i == 19 ? 'Z' : '0';
    if (want == '0' ? (c < '0' || c > '9') : c != want) return false;
  }
  return true;
}

class LineReader {
 public:
  explicit LineReader(std::string_view text) : text_(text) {}

  // The value of the next line, which must be "<key> <value>".
  std::string_view field(std::string_view key) {
    ++line_;
    const auto end = text_.find('\n', pos_);
    if (end == std::string_view::npos) malformed(key, "is missing or does not end with a newline");
    const std::string_view line = text_.substr(pos_, end - pos_);
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ' ') {
      malformed(key, "is not the next field");
    }
    pos_ = end + 1;
    return line.substr(key.size() + 1);
  }

  void exact(std::string_view line) {
    ++line_;
    const auto end = text_.find('\n', pos_);
    if (end == std::string_view::npos || text_.substr(pos_, end - pos_) != line) {
      fail(ErrorCode::signature_malformed, "line ", line_, " is not '", line, "'");
    }
    pos_ = end + 1;
  }

  [[noreturn]] void malformed(std::string_view key, std::string_view what) const {
    fail(ErrorCode::signature_malformed, "line ", line_, ": the field '", key, "' ", what);
  }

  std::size_t position() const noexcept { return pos_; }
  bool at_end() const noexcept { return pos_ == text_.size(); }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
  int line_ = 0;
};

std::optional<Sha256Digest> digest_or_none(LineReader& lines, std::string_view key) {
  const std::string_view value = lines.field(key);
  if (value == "-") return std::nullopt;
  if (value.size() != 64 || !bytes_of_hex(value)) lines.malformed(key, "is not 64 lowercase hex digits or '-'");
  return Sha256Digest::from_hex(value);
}

std::uint64_t decimal(LineReader& lines, std::string_view key, std::string_view value) {
  std::uint64_t number = 0;
  if (!is_decimal(value) || std::from_chars(value.data(), value.data() + value.size(), number).ec != std::errc()) {
    lines.malformed(key, "is not a decimal number");
  }
  return number;
}

}  // namespace

std::string_view signature_algorithm_name(SignatureAlgorithm algorithm) noexcept {
  return algorithm == SignatureAlgorithm::ed25519 ? "ed25519" : "hmac-sha256";
}

// ---- SignatureFile ----------------------------------------------------------------------

std::string SignatureFile::signed_text() const {
  const SignedStatement& s = statement;
  std::string out;
  const auto line = [&out](std::string_view key, std::string_view value) {
    out.append(key).append(" ").append(value).append("\n");
  };
  out.append(kMagic).append("\n");
  line("algorithm", signature_algorithm_name(algorithm));
  line("key-id", key_id);
  line("file", s.file);
  line("size", std::to_string(s.size));
  line("sha256", s.sha256.hex());
  line("step", s.step ? std::to_string(*s.step) : "-");
  line("config-identity", s.config_identity ? s.config_identity->hex() : "-");
  line("profile", s.profile.empty() ? "-" : s.profile);
  line("created", s.created);
  line("previous-sha256", s.previous_sha256 ? s.previous_sha256->hex() : "-");
  return out;
}

std::string SignatureFile::text() const { return signed_text() + "signature " + hex_of(signature) + "\n"; }

SignatureFile SignatureFile::parse(std::string_view text) {
  if (text.size() > kMaxSignatureFileBytes) {
    fail(ErrorCode::signature_malformed, "the signature file has ", text.size(), " bytes, more than ", kMaxSignatureFileBytes);
  }
  LineReader lines(text);
  lines.exact(kMagic);
  SignatureFile out;
  const std::string_view algorithm = lines.field("algorithm");
  if (algorithm == "ed25519") out.algorithm = SignatureAlgorithm::ed25519;
  else if (algorithm == "hmac-sha256") out.algorithm = SignatureAlgorithm::hmac_sha256;
  else lines.malformed("algorithm", "is neither ed25519 nor hmac-sha256");
  out.key_id = std::string(lines.field("key-id"));
  if (out.key_id.size() != 32 || !bytes_of_hex(out.key_id)) lines.malformed("key-id", "is not 32 lowercase hex digits");
  SignedStatement& s = out.statement;
  s.file = std::string(lines.field("file"));
  if (!is_plain_name(s.file, false)) lines.malformed("file", "is not a file name (printable ASCII, no '/', no spaces)");
  s.size = decimal(lines, "size", lines.field("size"));
  const auto digest = digest_or_none(lines, "sha256");
  if (!digest) lines.malformed("sha256", "is '-': a statement names its file's digest");
  s.sha256 = *digest;
  if (const std::string_view step = lines.field("step"); step != "-") s.step = decimal(lines, "step", step);
  s.config_identity = digest_or_none(lines, "config-identity");
  const std::string_view profile = lines.field("profile");
  if (profile != "-") {
    if (!is_plain_name(profile, true)) lines.malformed("profile", "is not a profile name");
    s.profile = std::string(profile);
  }
  s.created = std::string(lines.field("created"));
  if (!is_utc_time(s.created)) lines.malformed("created", "is not a UTC time as 2026-12-05T06:00:00Z");
  s.previous_sha256 = digest_or_none(lines, "previous-sha256");
  const std::size_t signed_end = lines.position();
  const std::string_view signature = lines.field("signature");
  const std::size_t want = out.algorithm == SignatureAlgorithm::ed25519 ? 64 : 32;
  const auto bytes = bytes_of_hex(signature);
  if (!bytes || bytes->size() != want) {
    lines.malformed("signature", detail::concat("is not ", want * 2, " lowercase hex digits"));
  }
  out.signature = *bytes;
  if (!lines.at_end()) fail(ErrorCode::signature_malformed, "bytes follow the signature line");
  // One spelling per statement: what was parsed writes back byte for byte.
  if (out.signed_text() != text.substr(0, signed_end)) {
    fail(ErrorCode::signature_malformed, "the statement is not in its one canonical spelling");
  }
  return out;
}

// ---- keys -------------------------------------------------------------------------------

bool VerifyingKey::verifies(std::string_view message, std::string_view signature) const {
  if (algorithm_ == SignatureAlgorithm::hmac_sha256) {
    const std::string expected = hmac_sha256(material_, message);
    return signature.size() == expected.size() && CRYPTO_memcmp(expected.data(), signature.data(), expected.size()) == 0;
  }
  const Pkey key(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr,
                                             reinterpret_cast<const unsigned char*>(material_.data()), material_.size()));
  const std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> context(EVP_MD_CTX_new());
  if (!key || !context || EVP_DigestVerifyInit(context.get(), nullptr, nullptr, nullptr, key.get()) != 1) return false;
  return EVP_DigestVerify(context.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                          reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
}

std::vector<VerifyingKey> VerifyingKey::read_file(const std::filesystem::path& path) {
  const std::string text = read_small_file(path, 64 << 10, ErrorCode::key_file_invalid, "key file");
  std::vector<VerifyingKey> keys;
  if (text.starts_with(kHmacKeyMagic)) {
    keys.push_back(SigningKey::read_file(path).verifying_key());
    return keys;
  }
  Bio bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
  for (;;) {  // one or more PEM public keys, one after another
    Pkey key(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
    if (!key) break;
    if (EVP_PKEY_get_base_id(key.get()) != EVP_PKEY_ED25519) {
      throw Error(ErrorCode::key_file_invalid, "a public key that is not Ed25519").with_path(path.string());
    }
    VerifyingKey verifier;
    verifier.algorithm_ = SignatureAlgorithm::ed25519;
    verifier.material_ = raw_key(key.get(), false);
    verifier.key_id_ = key_id_of(kEd25519IdLabel, verifier.material_);
    keys.push_back(std::move(verifier));
  }
  if (keys.empty()) {
    throw Error(ErrorCode::key_file_invalid, "no Ed25519 PEM public key or holdpoint HMAC key in the file")
        .with_path(path.string());
  }
  return keys;
}

SigningKey SigningKey::generate(SignatureAlgorithm algorithm) {
  SigningKey key;
  key.verifier_.algorithm_ = algorithm;
  key.secret_.resize(kKeyBytes);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.secret_.data()), static_cast<int>(kKeyBytes)) != 1) {
    fail(ErrorCode::invalid_argument, "OpenSSL's random generator failed");
  }
  if (algorithm == SignatureAlgorithm::hmac_sha256) {
    key.verifier_.material_ = key.secret_;
    key.verifier_.key_id_ = key_id_of(kHmacIdLabel, key.secret_);
  } else {
    key.verifier_.material_ = raw_key(ed25519_private(key.secret_).get(), false);
    key.verifier_.key_id_ = key_id_of(kEd25519IdLabel, key.verifier_.material_);
  }
  return key;
}

SigningKey SigningKey::read_file(const std::filesystem::path& path) {
  const std::string text = read_small_file(path, 64 << 10, ErrorCode::key_file_invalid, "key file");
  SigningKey key;
  if (text.starts_with(kHmacKeyMagic)) {
    // "holdpoint-hmac-sha256-key 1\n<64 hex>\n"
    const std::string_view rest = std::string_view(text).substr(kHmacKeyMagic.size());
    const auto secret = rest.size() == 66 && rest.front() == '\n' && rest.back() == '\n'
                            ? bytes_of_hex(rest.substr(1, 64))
                            : std::nullopt;
    if (!secret) throw Error(ErrorCode::key_file_invalid, "a holdpoint HMAC key file holds 64 hex digits").with_path(path.string());
    key.secret_ = *secret;
    key.verifier_.algorithm_ = SignatureAlgorithm::hmac_sha256;
    key.verifier_.material_ = key.secret_;
    key.verifier_.key_id_ = key_id_of(kHmacIdLabel, key.secret_);
    return key;
  }
  Bio bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
  Pkey pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!pkey || EVP_PKEY_get_base_id(pkey.get()) != EVP_PKEY_ED25519) {
    throw Error(ErrorCode::key_file_invalid, "not an unencrypted Ed25519 PEM private key or holdpoint HMAC key")
        .with_path(path.string());
  }
  key.secret_ = raw_key(pkey.get(), true);
  key.verifier_.algorithm_ = SignatureAlgorithm::ed25519;
  key.verifier_.material_ = raw_key(pkey.get(), false);
  key.verifier_.key_id_ = key_id_of(kEd25519IdLabel, key.verifier_.material_);
  return key;
}

void SigningKey::write_private_file(const std::filesystem::path& path) const {
  if (algorithm() == SignatureAlgorithm::hmac_sha256) {
    write_new_private_file(path, std::string(kHmacKeyMagic) + "\n" + hex_of(secret_) + "\n");
  } else {
    write_new_private_file(path, pem_of(ed25519_private(secret_).get(), true));
  }
}

void SigningKey::write_public_file(const std::filesystem::path& path) const {
  if (algorithm() == SignatureAlgorithm::hmac_sha256) {
    fail(ErrorCode::invalid_argument, "an HMAC key has no public part: verifiers hold the same secret");
  }
  const std::string pem = pem_of(ed25519_private(secret_).get(), false);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << pem;
  if (!out.flush()) throw Error(ErrorCode::io_write_failed, "writing the public key failed").with_path(path.string());
}

SignatureFile SigningKey::sign(const SignedStatement& statement) const {
  SignatureFile out;
  out.algorithm = algorithm();
  out.key_id = key_id();
  out.statement = statement;
  if (out.statement.created.empty()) out.statement.created = detail::utc_timestamp();
  const std::string message = out.signed_text();
  out.signature = algorithm() == SignatureAlgorithm::hmac_sha256 ? hmac_sha256(secret_, message)
                                                                 : ed25519_sign(secret_, message);
  SignatureFile::parse(out.text());  // a statement signed is one that reads back
  return out;
}

// ---- TrustPolicy ------------------------------------------------------------------------

void TrustPolicy::read_revocation_list(const std::filesystem::path& path) {
  const std::string text = read_small_file(path, 1 << 20, ErrorCode::key_file_invalid, "revocation list");
  std::size_t pos = 0;
  int line_number = 0;
  while (pos < text.size()) {
    const auto end = std::min(text.find('\n', pos), text.size());
    std::string_view line = std::string_view(text).substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty()) continue;
    if (line.size() != 32 || !bytes_of_hex(line)) {
      throw Error(ErrorCode::key_file_invalid,
                  detail::concat("line ", line_number, " is not a key id (32 lowercase hex digits)"))
          .with_path(path.string());
    }
    revoked_key_ids.emplace(line);
  }
}

const VerifyingKey& TrustPolicy::verify(const SignatureFile& signature) const {
  if (revoked_key_ids.contains(signature.key_id)) {
    fail(ErrorCode::signature_key_revoked, "key ", signature.key_id, " is revoked");
  }
  for (const VerifyingKey& key : keys) {
    if (key.key_id() != signature.key_id) continue;
    if (key.algorithm() != signature.algorithm) {
      fail(ErrorCode::signature_invalid, "key ", signature.key_id, " is an ", signature_algorithm_name(key.algorithm()),
           " key, the signature says ", signature_algorithm_name(signature.algorithm));
    }
    if (!key.verifies(signature.signed_text(), signature.signature)) {
      fail(ErrorCode::signature_invalid, "the signature does not verify under key ", signature.key_id);
    }
    return key;
  }
  fail(ErrorCode::signature_key_unknown, "key ", signature.key_id, " is not among the ", keys.size(), " trusted keys");
}

std::filesystem::path signature_path(const std::filesystem::path& file) {
  std::filesystem::path out = file;
  out += ".sig";
  return out;
}

std::optional<SignatureFile> read_signature_file(const std::filesystem::path& file) {
  const std::filesystem::path path = signature_path(file);
  std::error_code missing;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, missing))) return std::nullopt;
  try {
    return SignatureFile::parse(read_small_file(path, kMaxSignatureFileBytes, ErrorCode::signature_malformed, "signature"));
  } catch (const Error& error) {
    throw error.with_path(path.string());
  }
}

std::optional<SignatureFile> read_signature(io::Directory& directory, const std::string& name) {
  const auto info = directory.stat(name);
  if (!info) return std::nullopt;
  if (info->type != io::FileInfo::Type::regular) fail(ErrorCode::signature_malformed, name, " is not a regular file");
  if (info->size > kMaxSignatureFileBytes) {
    fail(ErrorCode::signature_malformed, name, " is ", info->size, " bytes, above the ", kMaxSignatureFileBytes,
         " a signature file may have");
  }
  const io::Snapshot snapshot = directory.read(name, kMaxSignatureFileBytes);
  const auto bytes = snapshot.buffer->bytes();
  return SignatureFile::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

void write_signature_file(const std::filesystem::path& file, const SignatureFile& signature) {
  const std::filesystem::path directory = file.parent_path().empty() ? std::filesystem::path(".") : file.parent_path();
  io::PublishOptions options;
  options.replace = true;
  const auto opened = io::posix_file_system().open_directory(directory, false);
  io::publish_text(*opened, signature_path(file).filename().string(), signature.text(), options);
}

std::optional<SignedStatement> check_signature(const std::filesystem::path& file, const TrustPolicy& policy) {
  const std::optional<SignatureFile> signature = read_signature_file(file);
  if (!signature) {
    if (!policy.required) return std::nullopt;
    throw Error(ErrorCode::signature_missing,
                "the trust policy requires a signature and there is no " + signature_path(file).filename().string())
        .with_path(file.string());
  }
  try {
    policy.verify(*signature);
  } catch (const Error& error) {
    throw error.with_path(signature_path(file).string());
  }
  if (signature->statement.file != file.filename().string()) {
    throw Error(ErrorCode::signature_statement_mismatch,
                "the signed statement names '" + signature->statement.file + "', not '" + file.filename().string() + "'")
        .with_path(signature_path(file).string());
  }
  return signature->statement;
}

}  // namespace holdpoint
