#include "format/sidecar.h"

#include "base/fail.h"

namespace holdpoint::format {

namespace {
constexpr std::size_t kHexDigits = 64;
}  // namespace

std::string sidecar_text(const Sha256Digest& digest, std::string_view name) {
  return detail::concat(digest.hex(), "  ", name, "\n");
}

Sha256Digest parse_sidecar(std::string_view text, std::string_view name, ErrorCode code) {
  const auto invalid = [&](const auto&... why) { detail::fail(code, name, kSidecarSuffix, " ", why...); };
  if (text.empty() || text.back() != '\n' || text.find('\n') != text.size() - 1) {
    invalid("is not one line ending in a newline");
  }
  const std::string_view line = text.substr(0, text.size() - 1);
  const std::string_view separator = line.size() >= kHexDigits + 2 ? line.substr(kHexDigits, 2) : "";
  if (separator != "  " && separator != " *") invalid("is not '<64 lowercase hex digits>  ", name, "'");
  const std::string_view hex = line.substr(0, kHexDigits);
  const auto digest = Sha256Digest::from_hex(hex);
  if (!digest || digest->hex() != hex) invalid("has no lowercase SHA-256 digest (64 digits 0-9, a-f)");
  const std::string_view named = line.substr(kHexDigits + 2);
  if (named != name) invalid("names '", named, "', not '", name, "'");
  return *digest;
}

}  // namespace holdpoint::format
