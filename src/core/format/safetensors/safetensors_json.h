// A strict, non-recursive JSON parser for the safetensors header. (The
// writer's string escaping is base/json_string.h, shared with the canonical
// configuration JSON.)
//
// parse_json reads one JSON document and reports it to a JsonHandler as a
// stream of events, so that the caller builds only what its schema needs: no
// document tree is materialised. It is stricter than RFC 8259 where the
// safetensors specification asks for it:
//   - strings must be UTF-8 without overlong forms, encoded surrogates or code
//     points above U+10FFFF; \u escapes must pair surrogates correctly; raw
//     control characters (< 0x20) are rejected;
//   - every object is checked for duplicate keys (compared after unescaping);
//   - containers may nest at most `max_depth` deep.
// Numbers are reported with their text and, when the text is a canonical
// unsigned integer that fits 64 bits, its exact value. Leading zeros are
// accepted lexically ("01") so that the schema layer can report them as a bad
// integer in the field where they occur rather than as unparseable JSON.
//
// Memory: the parser keeps one frame per open container (bounded by
// max_depth) and, per open object, its decoded keys: never more than the
// input's own length plus 24 bytes per key.
//
// Failure contract: throws holdpoint::Error with safetensors_header_invalid
// (not JSON, not UTF-8), safetensors_json_depth_limit or
// safetensors_duplicate_key, naming the byte offset. Handler callbacks may
// throw too; the parser does not catch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace holdpoint::format {

struct JsonNumber {
  std::string_view text;               // as written, e.g. "1.5e3" or "007"
  std::optional<std::uint64_t> exact;  // set only for 0 | [1-9][0-9]* within 2^64 - 1
};

enum class JsonLiteral : std::uint8_t { true_value, false_value, null_value };

// Events in document order. Strings are decoded UTF-8 and are valid only for
// the duration of the call. `key` precedes each member value of an object.
class JsonHandler {
 public:
  virtual ~JsonHandler() = default;
  virtual void begin_object() = 0;
  virtual void key(std::string_view key) = 0;
  virtual void end_object() = 0;
  virtual void begin_array() = 0;
  virtual void end_array() = 0;
  virtual void string_value(std::string_view value) = 0;
  virtual void number_value(const JsonNumber& number) = 0;
  virtual void literal_value(JsonLiteral literal) = 0;
};

// Parses exactly one JSON value surrounded by optional JSON whitespace.
void parse_json(std::string_view text, std::uint32_t max_depth, JsonHandler& handler);

// True if `text` is well-formed UTF-8 (the same rules parse_json applies).
bool is_valid_utf8(std::string_view text) noexcept;

// A short, printable rendering of a possibly hostile string for error
// messages: quoted, control characters and invalid UTF-8 as \xNN, cut after
// 64 bytes.
std::string quoted_for_message(std::string_view text);

}  // namespace holdpoint::format
