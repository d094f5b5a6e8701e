// Signed statements (holdpoint/base/signature.h): Ed25519 and HMAC round
// trips, OpenSSL interoperability, every refusal with its own code, and
// LoadOptions::trust refusing before a byte of the file is parsed.
#include "holdpoint/base/signature.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/run/provenance.h"
#include "support/test_support.h"

namespace holdpoint {
namespace {

using testing::TempDir;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// A small checkpoint file, saved by holdpoint.
std::filesystem::path checkpoint(const TempDir& dir, const std::string& name = "step-00000005.pt") {
  Dict entries;
  entries.insert("w", Value::tensor(TensorData::from_bytes(DType::uint8, {3}, testing::bytes_of("abc"))));
  entries.insert("step", Value::integer(5));
  SaveOptions options;
  options.write_sidecar = false;
  save_mapping(dir / name, Value::dict(std::move(entries)), options);
  return dir / name;
}

TrustPolicy trusting(const SigningKey& key) {
  TrustPolicy policy;
  policy.keys.push_back(key.verifying_key());
  return policy;
}

SignedStatement statement_of(const std::filesystem::path& file) { return checkpoint_statement(file); }

class Algorithms : public ::testing::TestWithParam<SignatureAlgorithm> {};

TEST_P(Algorithms, ASignatureReadsBackAndVerifiesUnderItsKeyOnly) {
  TempDir dir;
  const auto file = checkpoint(dir);
  const SigningKey key = SigningKey::generate(GetParam());
  SignedStatement statement = statement_of(file);
  statement.previous_sha256 = Sha256Digest::parse(std::string(64, 'a'));
  const SignatureFile signed_file = key.sign(statement);
  const SignatureFile parsed = SignatureFile::parse(signed_file.text());
  EXPECT_EQ(parsed.text(), signed_file.text());
  EXPECT_EQ(parsed.key_id, key.key_id());
  EXPECT_EQ(parsed.statement.sha256, statement.sha256);
  EXPECT_EQ(parsed.statement.size, std::filesystem::file_size(file));
  EXPECT_EQ(parsed.statement.previous_sha256, statement.previous_sha256);
  EXPECT_EQ(trusting(key).verify(parsed).key_id(), key.key_id());
  // Any other key of either kind does not verify it.
  TrustPolicy others;
  others.keys.push_back(SigningKey::generate(SignatureAlgorithm::ed25519).verifying_key());
  others.keys.push_back(SigningKey::generate(SignatureAlgorithm::hmac_sha256).verifying_key());
  EXPECT_ERROR_CODE(others.verify(parsed), ErrorCode::signature_key_unknown);
}

TEST_P(Algorithms, KeysWrittenToFilesReadBackToTheSameKey) {
  TempDir dir;
  const SigningKey key = SigningKey::generate(GetParam());
  key.write_private_file(dir / "key");
  struct stat info {};
  ASSERT_EQ(::stat((dir / "key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  const SigningKey again = SigningKey::read_file(dir / "key");
  EXPECT_EQ(again.key_id(), key.key_id());
  const auto statement = statement_of(checkpoint(dir));
  const std::filesystem::path verifier = GetParam() == SignatureAlgorithm::ed25519 ? dir / "key.pub" : dir / "key";
  if (GetParam() == SignatureAlgorithm::ed25519) key.write_public_file(verifier);
  else EXPECT_ERROR_CODE(key.write_public_file(dir / "key.pub"), ErrorCode::invalid_argument);
  TrustPolicy policy;
  policy.keys = VerifyingKey::read_file(verifier);
  EXPECT_NO_THROW(policy.verify(again.sign(statement)));
  // A key file is never replaced.
  EXPECT_ERROR_CODE(key.write_private_file(dir / "key"), ErrorCode::io_open_failed);
}

INSTANTIATE_TEST_SUITE_P(Signature, Algorithms,
                         ::testing::Values(SignatureAlgorithm::ed25519, SignatureAlgorithm::hmac_sha256),
                         [](const auto& info) { return std::string(signature_algorithm_name(info.param)) == "ed25519"
                                                           ? std::string("Ed25519")
                                                           : std::string("HmacSha256"); });

TEST(Signature, TheSecretAppearsInNoSignatureAndNoError) {
  TempDir dir;
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::hmac_sha256);
  key.write_private_file(dir / "secret");
  const std::string key_file = read_text(dir / "secret");
  const std::string secret_hex = key_file.substr(key_file.find('\n') + 1, 64);
  const SignatureFile signature = key.sign(statement_of(checkpoint(dir)));
  EXPECT_EQ(signature.text().find(secret_hex), std::string::npos);
  SignatureFile forged = signature;
  forged.statement.size += 1;
  try {
    trusting(key).verify(forged);
    ADD_FAILURE() << "a changed statement verified";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::signature_invalid);
    EXPECT_EQ(std::string(error.what()).find(secret_hex), std::string::npos);
  }
}

TEST(Signature, RefusesAChangedStatementAKeyIdSwapAndARevokedKey) {
  TempDir dir;
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::ed25519);
  const SigningKey other = SigningKey::generate(SignatureAlgorithm::ed25519);
  const SignatureFile signature = key.sign(statement_of(checkpoint(dir)));
  TrustPolicy policy = trusting(key);
  policy.keys.push_back(other.verifying_key());

  SignatureFile changed = signature;  // one byte of the statement
  changed.statement.step = 6;
  EXPECT_ERROR_CODE(policy.verify(SignatureFile::parse(changed.text())), ErrorCode::signature_invalid);
  SignatureFile swapped = signature;  // claims the other trusted key
  swapped.key_id = other.key_id();
  EXPECT_ERROR_CODE(policy.verify(SignatureFile::parse(swapped.text())), ErrorCode::signature_invalid);
  SignatureFile flipped = signature;  // one bit of the signature
  flipped.signature[0] = static_cast<char>(flipped.signature[0] ^ 1);
  EXPECT_ERROR_CODE(policy.verify(flipped), ErrorCode::signature_invalid);

  write_text(dir / "revoked.txt", "# rotated 2026-12-01\n" + key.key_id() + "  # the old trainer key\n\n");
  policy.read_revocation_list(dir / "revoked.txt");
  EXPECT_ERROR_CODE(policy.verify(signature), ErrorCode::signature_key_revoked);
  write_text(dir / "bad_list.txt", "not-a-key-id\n");
  EXPECT_ERROR_CODE(policy.read_revocation_list(dir / "bad_list.txt"), ErrorCode::key_file_invalid);
}

TEST(Signature, RefusesEveryMalformedSpelling) {
  TempDir dir;
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::ed25519);
  const std::string good = key.sign(statement_of(checkpoint(dir))).text();
  ASSERT_NO_THROW(SignatureFile::parse(good));
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated", good.substr(0, good.size() - 10)},
      {"no final newline", good.substr(0, good.size() - 1)},
      {"trailing bytes", good + "x\n"},
      {"another version", with("holdpoint-signature 1", "holdpoint-signature 2")},
      {"unknown algorithm", with("algorithm ed25519", "algorithm rsa")},
      {"uppercase key id", with("key-id " + key.key_id(), "key-id " + std::string(32, 'A'))},
      {"a path as the file", with("file step-00000005.pt", "file ../step-00000005.pt")},
      {"a signed size with a leading zero", with("size ", "size 0")},
      {"fields out of order", with("step ", "stpe ")},
      {"a field twice", with("profile ", "step -\nprofile ")},
      {"a CR before the newline", with("\nfile", "\r\nfile")},
      {"a bad time", with("created 2026", "created 26")},
      {"a short signature", good.substr(0, good.rfind("signature ") + 20) + "\n"},
      {"oversized", good + std::string(5000, '#')},
  };
  for (const auto& [what, text] : cases) {
    SCOPED_TRACE(what);
    EXPECT_ERROR_CODE(SignatureFile::parse(text), ErrorCode::signature_malformed);
  }
}

TEST(Signature, KeyFilesOfAnotherKindAreRefused) {
  TempDir dir;
  write_text(dir / "garbage", "not a key\n");
  EXPECT_ERROR_CODE(SigningKey::read_file(dir / "garbage"), ErrorCode::key_file_invalid);
  EXPECT_ERROR_CODE(VerifyingKey::read_file(dir / "garbage"), ErrorCode::key_file_invalid);
  write_text(dir / "short_hmac", "holdpoint-hmac-sha256-key 1\nabcd\n");
  EXPECT_ERROR_CODE(SigningKey::read_file(dir / "short_hmac"), ErrorCode::key_file_invalid);
  EXPECT_ERROR_CODE(SigningKey::read_file(dir / "absent"), ErrorCode::key_file_invalid);
}

// OpenSSL's own tools read holdpoint's keys and verify its signatures, and
// holdpoint reads keys `openssl genpkey` writes.
TEST(Signature, InteroperatesWithTheOpensslCommandLine) {
  if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl command";
  TempDir dir;
  const auto quoted = [](const std::filesystem::path& p) { return "'" + p.string() + "'"; };
  ASSERT_EQ(std::system(("openssl genpkey -algorithm ed25519 -out " + quoted(dir / "theirs.pem") + " 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system(("openssl pkey -in " + quoted(dir / "theirs.pem") + " -pubout -out " + quoted(dir / "theirs.pub")).c_str()), 0);
  const SigningKey theirs = SigningKey::read_file(dir / "theirs.pem");
  const SignatureFile signature = theirs.sign(statement_of(checkpoint(dir)));
  TrustPolicy policy;
  policy.keys = VerifyingKey::read_file(dir / "theirs.pub");
  EXPECT_NO_THROW(policy.verify(signature));
  // openssl verifies the signature over the signed text.
  write_text(dir / "message", signature.signed_text());
  write_text(dir / "signature.bin", signature.signature);
  EXPECT_EQ(std::system(("openssl pkeyutl -verify -rawin -pubin -inkey " + quoted(dir / "theirs.pub") + " -in " +
                         quoted(dir / "message") + " -sigfile " + quoted(dir / "signature.bin") + " > /dev/null 2>&1")
                            .c_str()),
            0);
  // and reads holdpoint's own key files.
  SigningKey::generate(SignatureAlgorithm::ed25519).write_private_file(dir / "ours");
  EXPECT_EQ(std::system(("openssl pkey -in " + quoted(dir / "ours") + " -noout 2>/dev/null").c_str()), 0);
}

TEST(SignedLoad, ASignedFileLoadsAndItsDigestIsTheSignedOne) {
  TempDir dir;
  const auto file = checkpoint(dir);
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::ed25519);
  write_signature_file(file, key.sign(statement_of(file)));
  LoadOptions options;
  options.trust = trusting(key);
  const LoadedMapping loaded = load_checkpoint_mapping(file, options);
  EXPECT_TRUE(loaded.digest_checked);
  EXPECT_EQ(loaded.root.as_dict().at("step").as_int(), 5);
  EXPECT_TRUE(scan_checkpoint(file, options, ScanKeeps::verdict).digest_checked);
  // Unsigned and optional: read as before.
  const auto unsigned_file = checkpoint(dir, "other.pt");
  options.trust->required = false;
  EXPECT_FALSE(load_checkpoint_mapping(unsigned_file, options).digest_checked);
}

TEST(SignedLoad, EveryRefusalComesBeforeTheFileIsParsed) {
  TempDir dir;
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::ed25519);
  LoadOptions options;
  options.trust = trusting(key);
  // Bytes no reader accepts: each refusal below is the signature's, never the parser's.
  write_text(dir / "hostile.pt", "PK\x03\x04 not a checkpoint at all");
  SignedStatement statement;
  statement.file = "hostile.pt";
  statement.size = std::filesystem::file_size(dir / "hostile.pt");
  statement.sha256 = Sha256Digest::parse(std::string(64, '0'));
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "hostile.pt", options), ErrorCode::signature_missing);
  EXPECT_ERROR_CODE(scan_checkpoint(dir / "hostile.pt", options), ErrorCode::signature_missing);
  write_text(signature_path(dir / "hostile.pt"), "holdpoint-signature 1\nalgorithm ed25519\n");
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "hostile.pt", options), ErrorCode::signature_malformed);
  write_signature_file(dir / "hostile.pt", SigningKey::generate(SignatureAlgorithm::ed25519).sign(statement));
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "hostile.pt", options), ErrorCode::signature_key_unknown);
  statement.file = "another.pt";
  write_signature_file(dir / "hostile.pt", key.sign(statement));
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "hostile.pt", options), ErrorCode::signature_statement_mismatch);
  statement.file = "hostile.pt";
  write_signature_file(dir / "hostile.pt", key.sign(statement));
  // Signed by the trusted key, but the bytes are not those it vouched for.
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "hostile.pt", options), ErrorCode::sha256_mismatch);
  options.expected_sha256 = Sha256Digest::parse(std::string(64, '1'));
  EXPECT_ERROR_CODE(load_checkpoint_mapping(dir / "hostile.pt", options), ErrorCode::signature_statement_mismatch);
}

TEST(SignedLoad, AFileChangedAfterSigningIsRefused) {
  TempDir dir;
  const auto file = checkpoint(dir);
  const SigningKey key = SigningKey::generate(SignatureAlgorithm::hmac_sha256);
  write_signature_file(file, key.sign(statement_of(file)));
  LoadOptions options;
  options.trust = trusting(key);
  std::vector<std::byte> bytes = testing::read_file_bytes(file);
  bytes[bytes.size() / 2] ^= std::byte{1};  // same size, other bytes
  testing::write_file_bytes(file, bytes);
  EXPECT_ERROR_CODE(load_checkpoint_mapping(file, options), ErrorCode::sha256_mismatch);
  bytes.push_back(std::byte{0});  // another size
  testing::write_file_bytes(file, bytes);
  EXPECT_ERROR_CODE(load_checkpoint_mapping(file, options), ErrorCode::signature_statement_mismatch);
}

TEST(SignedLoad, TheStatementOfAHoldpointCheckpointNamesItsStep) {
  TempDir dir;
  const auto file = checkpoint(dir);
  const SignedStatement statement = checkpoint_statement(file);
  EXPECT_EQ(statement.file, "step-00000005.pt");
  EXPECT_FALSE(statement.step);  // a plain mapping has no manifest
  EXPECT_EQ(statement.sha256, Sha256::of(testing::read_file_bytes(file)));
}

}  // namespace
}  // namespace holdpoint
