// Pickle opcode bytes, shared by the restricted VM (pickle_reader.cpp) and the
// emitter (pickle_writer.cpp), plus the few byte sequences both must agree on.
//
// The values are those of CPython's Lib/pickle.py. Every opcode is listed, also
// the ones the VM refuses, so that a rejection can name what it saw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace holdpoint::format::pickle_op {

// Protocol 0 and 1.
inline constexpr std::uint8_t MARK = '(';
inline constexpr std::uint8_t STOP = '.';
inline constexpr std::uint8_t POP = '0';
inline constexpr std::uint8_t POP_MARK = '1';
inline constexpr std::uint8_t DUP = '2';
inline constexpr std::uint8_t FLOAT = 'F';
inline constexpr std::uint8_t INT = 'I';
inline constexpr std::uint8_t BININT = 'J';
inline constexpr std::uint8_t BININT1 = 'K';
inline constexpr std::uint8_t LONG = 'L';
inline constexpr std::uint8_t BININT2 = 'M';
inline constexpr std::uint8_t NONE = 'N';
inline constexpr std::uint8_t PERSID = 'P';
inline constexpr std::uint8_t BINPERSID = 'Q';
inline constexpr std::uint8_t REDUCE = 'R';
inline constexpr std::uint8_t STRING = 'S';
inline constexpr std::uint8_t BINSTRING = 'T';
inline constexpr std::uint8_t SHORT_BINSTRING = 'U';
inline constexpr std::uint8_t UNICODE = 'V';
inline constexpr std::uint8_t BINUNICODE = 'X';
inline constexpr std::uint8_t APPEND = 'a';
inline constexpr std::uint8_t BUILD = 'b';
inline constexpr std::uint8_t GLOBAL = 'c';
inline constexpr std::uint8_t DICT = 'd';
inline constexpr std::uint8_t EMPTY_DICT = '}';
inline constexpr std::uint8_t APPENDS = 'e';
inline constexpr std::uint8_t GET = 'g';
inline constexpr std::uint8_t BINGET = 'h';
inline constexpr std::uint8_t INST = 'i';
inline constexpr std::uint8_t LONG_BINGET = 'j';
inline constexpr std::uint8_t LIST = 'l';
inline constexpr std::uint8_t EMPTY_LIST = ']';
inline constexpr std::uint8_t OBJ = 'o';
inline constexpr std::uint8_t PUT = 'p';
inline constexpr std::uint8_t BINPUT = 'q';
inline constexpr std::uint8_t LONG_BINPUT = 'r';
inline constexpr std::uint8_t SETITEM = 's';
inline constexpr std::uint8_t TUPLE = 't';
inline constexpr std::uint8_t EMPTY_TUPLE = ')';
inline constexpr std::uint8_t SETITEMS = 'u';
inline constexpr std::uint8_t BINFLOAT = 'G';
// Protocol 2.
inline constexpr std::uint8_t PROTO = 0x80;
inline constexpr std::uint8_t NEWOBJ = 0x81;
inline constexpr std::uint8_t EXT1 = 0x82;
inline constexpr std::uint8_t EXT2 = 0x83;
inline constexpr std::uint8_t EXT4 = 0x84;
inline constexpr std::uint8_t TUPLE1 = 0x85;
inline constexpr std::uint8_t TUPLE2 = 0x86;
inline constexpr std::uint8_t TUPLE3 = 0x87;
inline constexpr std::uint8_t NEWTRUE = 0x88;
inline constexpr std::uint8_t NEWFALSE = 0x89;
inline constexpr std::uint8_t LONG1 = 0x8a;
inline constexpr std::uint8_t LONG4 = 0x8b;
// Protocol 3.
inline constexpr std::uint8_t BINBYTES = 'B';
inline constexpr std::uint8_t SHORT_BINBYTES = 'C';
// Protocol 4.
inline constexpr std::uint8_t SHORT_BINUNICODE = 0x8c;
inline constexpr std::uint8_t BINUNICODE8 = 0x8d;
inline constexpr std::uint8_t BINBYTES8 = 0x8e;
inline constexpr std::uint8_t EMPTY_SET = 0x8f;
inline constexpr std::uint8_t ADDITEMS = 0x90;
inline constexpr std::uint8_t FROZENSET = 0x91;
inline constexpr std::uint8_t NEWOBJ_EX = 0x92;
inline constexpr std::uint8_t STACK_GLOBAL = 0x93;
inline constexpr std::uint8_t MEMOIZE = 0x94;
inline constexpr std::uint8_t FRAME = 0x95;
// Protocol 5.
inline constexpr std::uint8_t BYTEARRAY8 = 0x96;
inline constexpr std::uint8_t NEXT_BUFFER = 0x97;
inline constexpr std::uint8_t READONLY_BUFFER = 0x98;

// The highest protocol the VM knows (PROTO 2..5 are accepted).
inline constexpr std::uint8_t kHighestProtocol = 5;

// Python's pickle._BATCHSIZE: SETITEMS/APPENDS carry at most this many items.
inline constexpr std::size_t kBatchSize = 1000;

// GLOBAL module and name lines are at most this long (without the newline).
inline constexpr std::size_t kMaxGlobalPartBytes = 128;

// "SETITEMS", or "opcode 0x9f" for a byte that is no pickle opcode.
constexpr std::string_view name(std::uint8_t op) noexcept {
  switch (op) {
    case MARK: return "MARK";
    case STOP: return "STOP";
    case POP: return "POP";
    case POP_MARK: return "POP_MARK";
    case DUP: return "DUP";
    case FLOAT: return "FLOAT";
    case INT: return "INT";
    case BININT: return "BININT";
    case BININT1: return "BININT1";
    case LONG: return "LONG";
    case BININT2: return "BININT2";
    case NONE: return "NONE";
    case PERSID: return "PERSID";
    case BINPERSID: return "BINPERSID";
    case REDUCE: return "REDUCE";
    case STRING: return "STRING";
    case BINSTRING: return "BINSTRING";
    case SHORT_BINSTRING: return "SHORT_BINSTRING";
    case UNICODE: return "UNICODE";
    case BINUNICODE: return "BINUNICODE";
    case APPEND: return "APPEND";
    case BUILD: return "BUILD";
    case GLOBAL: return "GLOBAL";
    case DICT: return "DICT";
    case EMPTY_DICT: return "EMPTY_DICT";
    case APPENDS: return "APPENDS";
    case GET: return "GET";
    case BINGET: return "BINGET";
    case INST: return "INST";
    case LONG_BINGET: return "LONG_BINGET";
    case LIST: return "LIST";
    case EMPTY_LIST: return "EMPTY_LIST";
    case OBJ: return "OBJ";
    case PUT: return "PUT";
    case BINPUT: return "BINPUT";
    case LONG_BINPUT: return "LONG_BINPUT";
    case SETITEM: return "SETITEM";
    case TUPLE: return "TUPLE";
    case EMPTY_TUPLE: return "EMPTY_TUPLE";
    case SETITEMS: return "SETITEMS";
    case BINFLOAT: return "BINFLOAT";
    case PROTO: return "PROTO";
    case NEWOBJ: return "NEWOBJ";
    case EXT1: return "EXT1";
    case EXT2: return "EXT2";
    case EXT4: return "EXT4";
    case TUPLE1: return "TUPLE1";
    case TUPLE2: return "TUPLE2";
    case TUPLE3: return "TUPLE3";
    case NEWTRUE: return "NEWTRUE";
    case NEWFALSE: return "NEWFALSE";
    case LONG1: return "LONG1";
    case LONG4: return "LONG4";
    case BINBYTES: return "BINBYTES";
    case SHORT_BINBYTES: return "SHORT_BINBYTES";
    case SHORT_BINUNICODE: return "SHORT_BINUNICODE";
    case BINUNICODE8: return "BINUNICODE8";
    case BINBYTES8: return "BINBYTES8";
    case EMPTY_SET: return "EMPTY_SET";
    case ADDITEMS: return "ADDITEMS";
    case FROZENSET: return "FROZENSET";
    case NEWOBJ_EX: return "NEWOBJ_EX";
    case STACK_GLOBAL: return "STACK_GLOBAL";
    case MEMOIZE: return "MEMOIZE";
    case FRAME: return "FRAME";
    case BYTEARRAY8: return "BYTEARRAY8";
    case NEXT_BUFFER: return "NEXT_BUFFER";
    case READONLY_BUFFER: return "READONLY_BUFFER";
    default: return "unknown opcode";
  }
}

// The string rule of both sides: well-formed UTF-8 without overlong forms,
// UTF-16 surrogates or code points above U+10FFFF. Python's pickle decodes
// BINUNICODE with "surrogatepass", which would let a lone surrogate through;
// nothing honest writes one, and C++ consumers could not round-trip it.
constexpr bool is_strict_utf8(std::string_view text) noexcept {
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    std::uint32_t code = 0;
    std::uint32_t minimum = 0;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2, code = lead & 0x1Fu, minimum = 0x80;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3, code = lead & 0x0Fu, minimum = 0x800;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4, code = lead & 0x07u, minimum = 0x10000;
    } else {
      return false;  // continuation byte as lead, C0/C1 overlong leads, F5..FF
    }
    if (length > n - i) return false;
    for (std::size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0u) != 0x80u) return false;
      code = (code << 6) | (next & 0x3Fu);
    }
    if (code < minimum || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

}  // namespace holdpoint::format::pickle_op
