#include "format/zip/zip_names.h"

#include <cstdint>

#include "base/fail.h"
#include "base/keyed_hash.h"
#include "format/zip/zip_format.h"

namespace holdpoint::format::zip {

using detail::concat;

namespace {

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

bool equal_folded(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

std::uint64_t folded_hash(std::string_view name) {
  return detail::siphash24(detail::process_sip_key(), name.data(), name.size(), true);
}

std::string name_character_problem(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return concat("name is ", name.size(), " bytes (must be 1..", kMaxNameBytes, ")");
  }
  if (name.front() == '/') return "name starts with '/'";
  std::size_t i = 0;
  while (i < name.size()) {
    const auto lead = static_cast<unsigned char>(name[i]);
    std::uint32_t code_point = 0;
    std::size_t length = 0;
    std::uint32_t minimum = 0;
    if (lead < 0x80) {
      code_point = lead;
      length = 1;
    } else if ((lead & 0xE0) == 0xC0) {
      code_point = lead & 0x1F;
      length = 2;
      minimum = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      code_point = lead & 0x0F;
      length = 3;
      minimum = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      code_point = lead & 0x07;
      length = 4;
      minimum = 0x10000;
    } else {
      return concat("byte ", i, " is not valid UTF-8");
    }
    if (length > name.size() - i) return concat("UTF-8 sequence at byte ", i, " is truncated");
    for (std::size_t k = 1; k < length; ++k) {
      const auto continuation = static_cast<unsigned char>(name[i + k]);
      if ((continuation & 0xC0) != 0x80) return concat("byte ", i + k, " is not valid UTF-8");
      code_point = (code_point << 6) | (continuation & 0x3F);
    }
    if (code_point < minimum || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return concat("byte ", i, " starts an overlong, surrogate or out-of-range UTF-8 sequence");
    }
    if (code_point < 0x20 || (code_point >= 0x7F && code_point <= 0x9F)) {
      return concat("byte ", i, " is a control character");
    }
    if (code_point == '\\') return "name contains '\\'";
    i += length;
  }
  return {};
}

bool is_valid_path_component(std::string_view component) noexcept {
  return !component.empty() && component != "." && component != "..";
}

std::string entry_name_problem(std::string_view name) {
  std::string problem = name_character_problem(name);
  if (!problem.empty()) return problem;
  std::size_t start = 0;
  while (true) {
    const std::size_t slash = name.find('/', start);
    const std::string_view component =
        name.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (!is_valid_path_component(component)) {
      return concat("path component '", component, "' is empty, '.' or '..'");
    }
    if (slash == std::string_view::npos) return {};
    start = slash + 1;
  }
}

}  // namespace holdpoint::format::zip
