// The .sha256 sidecar parser that the public read (read_sha256_sidecar) and the
// run directory share: what sha256sum writes is read, anything else is refused
// with the caller's error code.
#include <cctype>
#include <string>

#include "format/sidecar.h"
#include "support/test_support.h"

namespace holdpoint::format {
namespace {

using testing::bytes_of;

const Sha256Digest kDigest = Sha256::of(bytes_of("checkpoint bytes"));

Sha256Digest parse(const std::string& text, const std::string& name = "step-00000002.pt") {
  return parse_sidecar(text, name, ErrorCode::run_sidecar_invalid);
}

TEST(Sidecar, TextIsWhatSha256sumWrites) {
  EXPECT_EQ(sidecar_text(kDigest, "model.pt"), kDigest.hex() + "  model.pt\n");
  EXPECT_EQ(parse(sidecar_text(kDigest, "step-00000002.pt")), kDigest);
}

TEST(Sidecar, Sha256sumsBinaryModeMarkerIsRead) {
  EXPECT_EQ(parse(kDigest.hex() + " *step-00000002.pt\n"), kDigest);
}

TEST(SidecarRejects, AFileWithoutItsFinalNewline) {
  EXPECT_ERROR_CODE(parse(kDigest.hex() + "  step-00000002.pt"), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(""), ErrorCode::run_sidecar_invalid);
}

TEST(SidecarRejects, MoreThanOneLine) {
  const std::string line = sidecar_text(kDigest, "step-00000002.pt");
  EXPECT_ERROR_CODE(parse(line + line), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(line + "\n"), ErrorCode::run_sidecar_invalid);
}

TEST(SidecarRejects, ASidecarForAnotherFile) {
  EXPECT_ERROR_CODE(parse(sidecar_text(kDigest, "step-00000003.pt")), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(sidecar_text(kDigest, "step-00000002.pt.tmp")), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(sidecar_text(kDigest, "checkpoints/step-00000002.pt")), ErrorCode::run_sidecar_invalid);
}

TEST(SidecarRejects, ASeparatorOtherThanSha256sums) {
  EXPECT_ERROR_CODE(parse(kDigest.hex() + " step-00000002.pt\n"), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(kDigest.hex() + "\tstep-00000002.pt\n"), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(kDigest.hex() + "   step-00000002.pt\n"), ErrorCode::run_sidecar_invalid);
}

TEST(SidecarRejects, ADigestThatIsNotLowercaseHex) {
  std::string upper = kDigest.hex();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ASSERT_NE(upper, kDigest.hex());
  EXPECT_ERROR_CODE(parse(upper + "  step-00000002.pt\n"), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(kDigest.hex().substr(1) + "x  step-00000002.pt\n"), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse(kDigest.hex().substr(2) + "  step-00000002.pt\n"), ErrorCode::run_sidecar_invalid);
  EXPECT_ERROR_CODE(parse("nonsense\n"), ErrorCode::run_sidecar_invalid);
}

TEST(SidecarRejects, WithTheCallersCodeAndAMessageNamingTheSidecar) {
  try {
    parse_sidecar(sidecar_text(kDigest, "other.pt"), "state.pt", ErrorCode::sidecar_invalid);
    FAIL() << "a sidecar for another file was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::sidecar_invalid);
    EXPECT_NE(error.detail().find("state.pt.sha256"), std::string::npos) << error.detail();
    EXPECT_NE(error.detail().find("'other.pt'"), std::string::npos) << error.detail();
  }
}

}  // namespace
}  // namespace holdpoint::format
