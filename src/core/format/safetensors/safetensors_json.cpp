#include "format/safetensors/safetensors_json.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "base/fail.h"

namespace holdpoint::format {
namespace {

using detail::fail;

// Length of the well-formed UTF-8 sequence starting at p[0] (>= 0x80), or 0.
// The ranges are those of the Unicode standard's table 3-7: they exclude
// overlong forms, UTF-16 surrogates and code points above U+10FFFF.
std::size_t utf8_sequence_length(const unsigned char* p, std::size_t available) noexcept {
  const unsigned char lead = p[0];
  std::size_t length;
  unsigned char low = 0x80, high = 0xBF;  // bounds of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (available < length) return 0;
  if (p[1] < low || p[1] > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  }
  return length;
}

void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

std::optional<std::uint64_t> canonical_u64(std::string_view text) noexcept {
  if (text.empty() || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : text) {
    if (!is_digit(c)) return std::nullopt;
    if (__builtin_mul_overflow(value, std::uint64_t{10}, &value) ||
        __builtin_add_overflow(value, static_cast<std::uint64_t>(c - '0'), &value)) {
      return std::nullopt;
    }
  }
  return value;
}

class Parser {
 public:
  Parser(std::string_view text, std::uint32_t max_depth, JsonHandler& handler)
      : text_(text), max_depth_(max_depth), handler_(handler) {}

  // The value grammar is driven by an explicit stack of open containers, so a
  // deeply nested input costs heap frames (bounded by max_depth), not C++ stack.
  void run() {
    skip_whitespace();
    value();
    while (depth_ > 0) {
      skip_whitespace();
      Frame& frame = frames_[depth_ - 1];
      const char close = frame.is_object ? '}' : ']';
      if (peek() == close) {
        ++pos_;
        close_container();
        continue;
      }
      if (frame.has_members) {
        expect(',', "',' or the end of the container");
        skip_whitespace();
      }
      frame.has_members = true;
      if (frame.is_object) {
        if (peek() != '"') syntax_error("a string key");
        const std::size_t key_offset = pos_;
        string_body();
        frame.key_spans.emplace_back(frame.keys.size(), scratch_.size(), key_offset);
        frame.keys.append(scratch_);
        skip_whitespace();
        expect(':', "':' after an object key");
        skip_whitespace();
        handler_.key(scratch_);
      }
      value();
    }
    skip_whitespace();
    if (pos_ != text_.size()) syntax_error("the end of the header after the top-level value");
  }

 private:
  struct KeySpan {
    KeySpan(std::size_t begin, std::size_t length, std::size_t offset) : begin(begin), length(length), offset(offset) {}
    std::size_t begin;   // in Frame::keys
    std::size_t length;
    std::size_t offset;  // of the key in the header, for messages
  };
  struct Frame {
    bool is_object = false;
    bool has_members = false;
    std::string keys;  // decoded keys, concatenated
    std::vector<KeySpan> key_spans;
  };

  char peek() const noexcept { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool at_end() const noexcept { return pos_ >= text_.size(); }

  [[noreturn]] void syntax_error(std::string_view expected) const {
    if (at_end()) fail(ErrorCode::safetensors_header_invalid, "header JSON ends early: expected ", expected);
    fail(ErrorCode::safetensors_header_invalid, "header JSON is invalid at byte ", pos_, " of the header", ": expected ", expected);
  }

  void expect(char c, std::string_view what) {
    if (peek() != c) syntax_error(what);
    ++pos_;
  }

  void skip_whitespace() noexcept {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }

  void value() {
    switch (peek()) {
      case '{': open_container(true); return;
      case '[': open_container(false); return;
      case '"':
        string_body();
        handler_.string_value(scratch_);
        return;
      case 't': literal("true", JsonLiteral::true_value); return;
      case 'f': literal("false", JsonLiteral::false_value); return;
      case 'n': literal("null", JsonLiteral::null_value); return;
      default:
        if (peek() == '-' || is_digit(peek())) {
          number();
          return;
        }
        syntax_error("a JSON value");
    }
  }

  void open_container(bool is_object) {
    if (depth_ >= max_depth_) {
      fail(ErrorCode::safetensors_json_depth_limit, "header JSON nests deeper than ", max_depth_,
           " containers (Limits::max_json_depth) at byte ", pos_);
    }
    ++pos_;
    if (frames_.size() == depth_) frames_.emplace_back();
    Frame& frame = frames_[depth_++];
    frame.is_object = is_object;
    frame.has_members = false;
    frame.keys.clear();
    frame.key_spans.clear();
    if (is_object) {
      handler_.begin_object();
    } else {
      handler_.begin_array();
    }
  }

  void close_container() {
    Frame& frame = frames_[depth_ - 1];
    if (frame.is_object) {
      reject_duplicate_keys(frame);
      --depth_;
      handler_.end_object();
    } else {
      --depth_;
      handler_.end_array();
    }
  }

  // Sorting at the end of the object keeps the check O(n log n) with no
  // per-key allocation; the spans are not needed in order afterwards.
  static void reject_duplicate_keys(Frame& frame) {
    if (frame.key_spans.size() < 2) return;
    const std::string& keys = frame.keys;
    auto text_of = [&keys](const KeySpan& span) { return std::string_view(keys).substr(span.begin, span.length); };
    std::sort(frame.key_spans.begin(), frame.key_spans.end(), [&](const KeySpan& a, const KeySpan& b) {
      const int order = text_of(a).compare(text_of(b));
      return order != 0 ? order < 0 : a.offset < b.offset;
    });
    for (std::size_t i = 1; i < frame.key_spans.size(); ++i) {
      if (text_of(frame.key_spans[i - 1]) == text_of(frame.key_spans[i])) {
        fail(ErrorCode::safetensors_duplicate_key, "header object has the key ",
             quoted_for_message(text_of(frame.key_spans[i])), " twice (bytes ", frame.key_spans[i - 1].offset,
             " and ", frame.key_spans[i].offset, ")");
      }
    }
  }

  void literal(std::string_view word, JsonLiteral kind) {
    if (text_.substr(pos_, word.size()) != word) syntax_error("a JSON value");
    pos_ += word.size();
    handler_.literal_value(kind);
  }

  void digits() {
    if (!is_digit(peek())) syntax_error("a digit");
    while (is_digit(peek())) ++pos_;
  }

  void number() {
    const std::size_t start = pos_;
    if (peek() == '-') ++pos_;
    digits();
    if (peek() == '.') {
      ++pos_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits();
    }
    JsonNumber number;
    number.text = text_.substr(start, pos_ - start);
    number.exact = canonical_u64(number.text);
    handler_.number_value(number);
  }

  std::uint32_t hex4() {
    std::uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = peek();
      std::uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<std::uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<std::uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<std::uint32_t>(c - 'A' + 10);
      } else {
        syntax_error("four hexadecimal digits after \\u");
      }
      value = value * 16 + digit;
      ++pos_;
    }
    return value;
  }

  // A \u escape, with pos_ just after the 'u'. A high surrogate must be
  // followed by an escaped low surrogate; anything else would decode to
  // something that is not UTF-8.
  void unicode_escape() {
    const std::size_t start = pos_ - 2;
    std::uint32_t code_point = hex4();
    if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
      pos_ = start;
      syntax_error("no lone low surrogate in a \\u escape");
    }
    if (code_point >= 0xD800 && code_point <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") {
        pos_ = start;
        syntax_error("a \\u low surrogate after a \\u high surrogate");
      }
      pos_ += 2;
      const std::uint32_t low = hex4();
      if (low < 0xDC00 || low > 0xDFFF) {
        pos_ = start;
        syntax_error("a \\u low surrogate after a \\u high surrogate");
      }
      code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(scratch_, code_point);
  }

  // Decodes the string at pos_ (which is '"') into scratch_.
  void string_body() {
    ++pos_;
    scratch_.clear();
    const auto* bytes = reinterpret_cast<const unsigned char*>(text_.data());
    while (true) {
      const std::size_t run_start = pos_;
      while (pos_ < text_.size() && bytes[pos_] >= 0x20 && bytes[pos_] < 0x80 && bytes[pos_] != '"' &&
             bytes[pos_] != '\\') {
        ++pos_;
      }
      scratch_.append(text_.substr(run_start, pos_ - run_start));
      if (at_end()) syntax_error("the closing '\"' of a string");
      const unsigned char c = bytes[pos_];
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c < 0x20) syntax_error("no raw control character inside a string (escape it)");
      if (c >= 0x80) {
        const std::size_t length = utf8_sequence_length(bytes + pos_, text_.size() - pos_);
        if (length == 0) syntax_error("well-formed UTF-8");
        scratch_.append(text_.substr(pos_, length));
        pos_ += length;
        continue;
      }
      ++pos_;  // the backslash
      const char escape = peek();
      ++pos_;
      switch (escape) {
        case '"': scratch_.push_back('"'); break;
        case '\\': scratch_.push_back('\\'); break;
        case '/': scratch_.push_back('/'); break;
        case 'b': scratch_.push_back('\b'); break;
        case 'f': scratch_.push_back('\f'); break;
        case 'n': scratch_.push_back('\n'); break;
        case 'r': scratch_.push_back('\r'); break;
        case 't': scratch_.push_back('\t'); break;
        case 'u': unicode_escape(); break;
        default:
          pos_ -= 2;
          syntax_error("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::uint32_t max_depth_;
  JsonHandler& handler_;
  std::vector<Frame> frames_;  // frames_[0, depth_) are open; the rest are kept for reuse
  std::size_t depth_ = 0;
  std::string scratch_;
};

}  // namespace

void parse_json(std::string_view text, std::uint32_t max_depth, JsonHandler& handler) {
  Parser(text, max_depth, handler).run();
}

bool is_valid_utf8(std::string_view text) noexcept {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t i = 0;
  while (i < text.size()) {
    if (bytes[i] < 0x80) {
      ++i;
      continue;
    }
    const std::size_t length = utf8_sequence_length(bytes + i, text.size() - i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string quoted_for_message(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  constexpr std::size_t kShown = 64;
  std::string_view shown = text.substr(0, kShown);
  // Do not cut a UTF-8 sequence in half.
  while (shown.size() < text.size() && !shown.empty() &&
         (static_cast<unsigned char>(text[shown.size()]) & 0xC0) == 0x80) {
    shown.remove_suffix(1);
  }
  const bool utf8 = is_valid_utf8(shown);
  std::string out = "\"";
  for (const char c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte < 0x20 || byte == 0x7F || (byte >= 0x80 && !utf8)) {
      out.append("\\x");
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xF]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  if (shown.size() < text.size()) out.append("... (").append(std::to_string(text.size())).append(" bytes)");
  return out;
}

}  // namespace holdpoint::format
