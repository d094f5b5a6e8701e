// safetensors reader: docs/format.md ("safetensors") and the checks of
// huggingface/safetensors `read_metadata` + `Metadata::validate`.
//
// Order of checks, so that each file gets the most fundamental complaint:
//   1. the 8-byte length and the header extent (before anything is allocated);
//   2. the header as JSON: UTF-8, grammar, depth, duplicate keys;
//   3. the schema, in document order (the first schema problem is reported only
//      once the whole header is known to be JSON);
//   4. the extents, in data_offsets order, as the reference validates them;
//   5. holdpoint's own Limits.
#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "base/checked_arithmetic.h"
#include "base/fail.h"
#include "format/safetensors/safetensors.h"
#include "format/safetensors/safetensors_json.h"

namespace holdpoint::format {
namespace {

using detail::checked_add;
using detail::checked_mul;
using detail::concat;
using detail::fail;

constexpr std::string_view kMetadataKey = "__metadata__";

struct TensorEntry {
  std::string name;
  DType dtype = DType::uint8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
  bool has_dtype = false;
  bool has_shape = false;
  bool has_offsets = false;
};

// Turns the parser's events into tensor entries and metadata. Schema problems
// are recorded, not thrown, so that a header that is not even JSON further on
// is reported as such; after the first problem every event is ignored.
class HeaderSchema final : public JsonHandler {
 public:
  explicit HeaderSchema(const Limits& limits) : limits_(limits) {}

  void throw_if_failed() const {
    if (error_) throw *error_;
  }
  std::vector<TensorEntry>& tensors() noexcept { return tensors_; }
  std::map<std::string, std::string>& metadata() noexcept { return metadata_; }

  void begin_object() override {
    if (error_) return;
    switch (place_) {
      case Place::document: place_ = Place::top; return;
      case Place::top_value:
        if (in_metadata_) {
          place_ = Place::metadata;
        } else {
          begin_tensor();
        }
        return;
      default: unexpected("an object");
    }
  }

  void key(std::string_view key) override {
    if (error_) return;
    if (place_ == Place::top) {
      in_metadata_ = key == kMetadataKey;
      current_name_.assign(key);
      place_ = Place::top_value;
      if (!in_metadata_) check_tensor_name();
    } else if (place_ == Place::metadata) {
      if (key.size() > limits_.max_string_bytes) {
        record(ErrorCode::safetensors_metadata_invalid, "__metadata__ has a key of ", key.size(),
               " bytes (Limits::max_string_bytes is ", limits_.max_string_bytes, ")");
        return;
      }
      current_name_.assign(key);
      place_ = Place::metadata_value;
    } else if (place_ == Place::tensor) {
      if (key == "dtype") {
        field_ = Field::dtype;
      } else if (key == "shape") {
        field_ = Field::shape;
      } else if (key == "data_offsets") {
        field_ = Field::data_offsets;
      } else {
        record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(tensors_.back().name),
               " has the key ", quoted_for_message(key), "; only dtype, shape and data_offsets are allowed");
        return;
      }
      place_ = Place::tensor_value;
    }
  }

  void end_object() override {
    if (error_) return;
    if (place_ == Place::metadata) {
      place_ = Place::top;
    } else if (place_ == Place::tensor) {
      end_tensor();
      place_ = Place::top;
    } else if (place_ == Place::top) {
      place_ = Place::done;
    }
  }

  void begin_array() override {
    if (error_) return;
    if (place_ == Place::tensor_value && field_ == Field::shape) {
      tensors_.back().has_shape = true;
      place_ = Place::shape;
    } else if (place_ == Place::tensor_value && field_ == Field::data_offsets) {
      tensors_.back().has_offsets = true;
      offsets_seen_ = 0;
      place_ = Place::offsets;
    } else {
      unexpected("an array");
    }
  }

  void end_array() override {
    if (error_) return;
    if (place_ == Place::shape) {
      place_ = Place::tensor;
    } else if (place_ == Place::offsets) {
      if (offsets_seen_ != 2) {
        record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(tensors_.back().name),
               " has ", offsets_seen_, " data_offsets; expected [begin, end]");
        return;
      }
      place_ = Place::tensor;
    }
  }

  void string_value(std::string_view value) override {
    if (error_) return;
    if (place_ == Place::metadata_value) {
      if (value.size() > limits_.max_string_bytes) {
        record(ErrorCode::safetensors_metadata_invalid, "__metadata__ value of ", quoted_for_message(current_name_),
               " has ", value.size(), " bytes (Limits::max_string_bytes is ", limits_.max_string_bytes, ")");
        return;
      }
      metadata_.emplace(current_name_, value);
      place_ = Place::metadata;
    } else if (place_ == Place::tensor_value && field_ == Field::dtype) {
      // Every dtype of the specification has a DType (dtype.cpp), so a name
      // holdpoint does not know is one the reference does not know either.
      const auto dtype = dtype_from_safetensors_name(value);
      if (!dtype) {
        record(ErrorCode::safetensors_dtype_unknown, "tensor ", quoted_for_message(tensors_.back().name),
               " has dtype ", quoted_for_message(value), ", which is not a safetensors dtype name");
        return;
      }
      tensors_.back().dtype = *dtype;
      tensors_.back().has_dtype = true;
      place_ = Place::tensor;
    } else {
      unexpected("a string");
    }
  }

  void number_value(const JsonNumber& number) override {
    if (error_) return;
    if (place_ != Place::shape && place_ != Place::offsets) {
      unexpected("a number");
      return;
    }
    TensorEntry& tensor = tensors_.back();
    const std::string_view field = place_ == Place::shape ? "shape" : "data_offsets";
    if (!number.exact) {
      record(ErrorCode::safetensors_integer_invalid, "tensor ", quoted_for_message(tensor.name), " has ",
             quoted_for_message(number.text), " in ", field,
             "; expected an unsigned integer below 2^64 without sign, fraction, exponent or leading zero");
      return;
    }
    if (place_ == Place::shape) {
      if (tensor.shape.size() >= limits_.max_tensor_rank) {
        record(ErrorCode::tensor_rank_limit, "tensor ", quoted_for_message(tensor.name), " has more than ",
               limits_.max_tensor_rank, " dimensions (Limits::max_tensor_rank)");
        return;
      }
      tensor.shape.push_back(*number.exact);
    } else {
      if (offsets_seen_ == 0) tensor.begin = *number.exact;
      if (offsets_seen_ == 1) tensor.end = *number.exact;
      if (++offsets_seen_ > 2) {
        record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(tensor.name),
               " has more than 2 data_offsets; expected [begin, end]");
      }
    }
  }

  void literal_value(JsonLiteral literal) override {
    if (error_) return;
    // The reference parses __metadata__ as an Option, and mlx writes null.
    if (place_ == Place::top_value && in_metadata_ && literal == JsonLiteral::null_value) {
      place_ = Place::top;
      return;
    }
    unexpected(literal == JsonLiteral::null_value ? "null" : "a boolean");
  }

 private:
  // Where the next event lands. *_value: a key was read, its value comes next.
  enum class Place : std::uint8_t { document, top, top_value, metadata, metadata_value, tensor, tensor_value, shape, offsets, done };
  enum class Field : std::uint8_t { dtype, shape, data_offsets };

  template <typename... Parts>
  void record(ErrorCode code, Parts&&... parts) {
    if (!error_) error_.emplace(code, concat(std::forward<Parts>(parts)...));
  }

  // A value of the wrong JSON type, named after the place it occurs.
  void unexpected(std::string_view what) {
    switch (place_) {
      case Place::document:
        record(ErrorCode::safetensors_header_schema_invalid, "the header is ", what, ", not a JSON object");
        return;
      case Place::top_value:
        if (in_metadata_) {
          record(ErrorCode::safetensors_metadata_invalid, "__metadata__ is ", what, ", not an object of strings");
        } else {
          record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(current_name_), " is ",
                 what, ", not an object with dtype, shape and data_offsets");
        }
        return;
      case Place::metadata_value:
        record(ErrorCode::safetensors_metadata_invalid, "__metadata__ value of ", quoted_for_message(current_name_),
               " is ", what, ", not a string");
        return;
      case Place::tensor_value: {
        const std::string_view expected = field_ == Field::dtype ? "a string" : "an array of unsigned integers";
        const std::string_view field = field_ == Field::dtype ? "dtype" : field_ == Field::shape ? "shape" : "data_offsets";
        record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(tensors_.back().name), " ",
               field, " is ", what, ", not ", expected);
        return;
      }
      case Place::shape:
      case Place::offsets:
        record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(tensors_.back().name), " ",
               place_ == Place::shape ? "shape" : "data_offsets", " holds ", what, ", not an unsigned integer");
        return;
      default:
        // Keys and container ends cannot be misplaced: the parser checked the grammar.
        record(ErrorCode::safetensors_header_schema_invalid, "unexpected ", what, " in the header");
        return;
    }
  }

  void check_tensor_name() {
    if (current_name_.empty()) {
      record(ErrorCode::safetensors_tensor_name_invalid, "a tensor has an empty name");
    } else if (current_name_.size() > limits_.max_string_bytes) {
      record(ErrorCode::safetensors_tensor_name_invalid, "a tensor name has ", current_name_.size(),
             " bytes (Limits::max_string_bytes is ", limits_.max_string_bytes, ")");
    } else if (tensors_.size() >= limits_.max_tensors) {
      record(ErrorCode::tensor_count_limit, "the header has more than ", limits_.max_tensors,
             " tensors (Limits::max_tensors)");
    }
  }

  void begin_tensor() {
    TensorEntry& tensor = tensors_.emplace_back();
    tensor.name = current_name_;
    place_ = Place::tensor;
  }

  void end_tensor() {
    const TensorEntry& tensor = tensors_.back();
    const char* missing = !tensor.has_dtype ? "dtype" : !tensor.has_shape ? "shape" : !tensor.has_offsets ? "data_offsets" : nullptr;
    if (missing) {
      record(ErrorCode::safetensors_header_schema_invalid, "tensor ", quoted_for_message(tensor.name), " has no ",
             missing);
    }
  }

  const Limits& limits_;
  Place place_ = Place::document;
  Field field_ = Field::dtype;
  bool in_metadata_ = false;
  std::size_t offsets_seen_ = 0;
  std::string current_name_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  std::optional<Error> error_;
};

// The four characters JSON allows around a value.
bool is_json_whitespace(std::byte b) noexcept {
  return b == std::byte{' '} || b == std::byte{'\t'} || b == std::byte{'\n'} || b == std::byte{'\r'};
}

std::uint64_t load_u64_le(const std::byte* bytes) noexcept {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<std::uint8_t>(bytes[i]);
  return value;
}

// Element count of `tensor`, or a throw. The product is taken over the nonzero
// dimensions so that every partial product, in whatever order TensorData
// multiplies, fits int64: the reference accepts [0, 2^40, 2^40] (its
// left-to-right product stays 0), holdpoint does not.
std::uint64_t checked_numel(const TensorEntry& tensor) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t product = 1;
  bool has_zero = false;
  for (const std::uint64_t size : tensor.shape) {
    if (size == 0) {
      has_zero = true;
      continue;
    }
    const auto next = checked_mul(product, size);
    if (!next || *next > kMax) {
      fail(ErrorCode::safetensors_validation_overflow, "tensor ", quoted_for_message(tensor.name),
           ": the product of its shape overflows 2^63 - 1");
    }
    product = *next;
  }
  return has_zero ? 0 : product;
}

// The extents, as the reference validates them: sorted by data_offsets, each
// begins where the previous ended (the first at 0), and each holds exactly
// shape x element size bytes. Returns the end of the data buffer.
std::uint64_t validate_extents(const std::vector<TensorEntry>& tensors) {
  std::vector<std::size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = tensors[a];
    const auto& y = tensors[b];
    return std::tie(x.begin, x.end, a) < std::tie(y.begin, y.end, b);
  });
  std::uint64_t expected_begin = 0;
  for (const std::size_t index : order) {
    const TensorEntry& tensor = tensors[index];
    if (tensor.end < tensor.begin) {
      fail(ErrorCode::safetensors_offsets_invalid, "tensor ", quoted_for_message(tensor.name), " has data_offsets [",
           tensor.begin, ", ", tensor.end, "], which end before they begin");
    }
    if (tensor.begin != expected_begin) {
      fail(ErrorCode::safetensors_offsets_invalid, "tensor ", quoted_for_message(tensor.name), " has data_offsets [",
           tensor.begin, ", ", tensor.end, "] but the previous extent ends at ", expected_begin,
           tensor.begin > expected_begin ? " (a gap)" : " (an overlap)",
           "; extents must be contiguous from 0");
    }
    const std::uint64_t numel = checked_numel(tensor);
    const std::string_view dtype = *dtype_safetensors_name(tensor.dtype);
    // Sub-byte dtypes pack elements across bytes: the size rule is on bits,
    // and, as in the reference, the bits must fill whole bytes exactly.
    const auto bits = checked_mul(numel, std::uint64_t{dtype_bits(tensor.dtype)});
    if (!bits) {
      fail(ErrorCode::safetensors_validation_overflow, "tensor ", quoted_for_message(tensor.name), ": ", numel,
           " elements of ", dtype, " overflow 2^64 bits");
    }
    if (*bits % 8 != 0) {
      fail(ErrorCode::safetensors_misaligned_slice, "tensor ", quoted_for_message(tensor.name), ": ", numel,
           " elements of ", dtype, " are ", *bits, " bits, not a whole number of bytes");
    }
    if (*bits / 8 != tensor.end - tensor.begin) {
      fail(ErrorCode::safetensors_tensor_info_invalid, "tensor ", quoted_for_message(tensor.name), " has ",
           tensor.end - tensor.begin, " bytes in data_offsets but its shape and dtype ", dtype, " need ",
           *bits / 8);
    }
    expected_begin = tensor.end;
  }
  return expected_begin;
}

TensorData make_tensor(const TensorEntry& entry, std::shared_ptr<const Storage> storage) {
  TensorData tensor;
  tensor.dtype = entry.dtype;
  tensor.sizes.assign(entry.shape.begin(), entry.shape.end());
  tensor.strides.assign(tensor.sizes.size(), 1);
  std::int64_t stride = 1;
  for (std::size_t i = tensor.sizes.size(); i-- > 0;) {
    tensor.strides[i] = stride;
    // Cannot overflow: checked_numel bounded the product of the nonzero sizes.
    if (tensor.sizes[i] != 0) stride *= tensor.sizes[i];
  }
  tensor.storage = std::move(storage);
  return tensor;
}

}  // namespace

bool looks_like_safetensors(std::span<const std::byte> file) noexcept {
  return looks_like_safetensors(file, file.size()).value_or(false);
}

std::optional<bool> looks_like_safetensors(std::span<const std::byte> head, std::uint64_t file_size) noexcept {
  if (file_size < 9) return false;
  if (head.size() < 9) return std::nullopt;
  // A '{' right after the length is enough: a damaged length should reach the
  // reader and get its precise code rather than unknown_format.
  if (head[8] == std::byte{'{'}) return true;
  // JSON whitespace before the '{' counts only inside a length that fits the
  // file, so that text with blanks at byte 8 is not taken for safetensors.
  const std::uint64_t header_bytes = load_u64_le(head.data());
  if (header_bytes > file_size - 8) return false;
  const std::uint64_t end = std::min<std::uint64_t>(8 + header_bytes, head.size());
  if (const auto verdict = safetensors_whitespace_verdict(head.subspan(8, static_cast<std::size_t>(end - 8)))) {
    return verdict;
  }
  return end == 8 + header_bytes ? std::optional<bool>(false) : std::nullopt;
}

std::optional<bool> safetensors_whitespace_verdict(std::span<const std::byte> bytes) noexcept {
  for (std::byte b : bytes) {
    if (b == std::byte{'{'}) return true;
    if (!is_json_whitespace(b)) return false;
  }
  return std::nullopt;
}

std::uint64_t safetensors_head_bytes(std::span<const std::byte> head, std::uint64_t file_size, const Limits& limits) {
  if (file_size < 8) return file_size;
  const std::uint64_t header_bytes = load_u64_le(head.data());
  if (header_bytes > limits.max_safetensors_header_bytes || header_bytes > file_size - 8) return 8;
  return 8 + header_bytes;
}

SafetensorsFile read_safetensors(std::span<const std::byte> file, const std::shared_ptr<const void>& owner,
                                 const Limits& limits) {
  return read_safetensors_header(
      file, file.size(),
      [&](std::uint64_t offset, std::uint64_t size) {
        return std::make_shared<const Storage>(file.data() + offset, static_cast<std::size_t>(size), owner);
      },
      limits);
}

SafetensorsFile read_safetensors_header(std::span<const std::byte> head, std::uint64_t file_size,
                                        const SafetensorsStorageMaker& make_storage, const Limits& limits) {
  if (head.size() < std::min<std::uint64_t>(file_size, 8)) {
    fail(ErrorCode::invalid_argument, "read_safetensors_header: ", head.size(), " leading bytes of a ", file_size,
         "-byte file, fewer than the length prefix");
  }
  if (file_size < 8) {
    fail(ErrorCode::safetensors_header_too_small, "the file has ", file_size,
         " bytes; a safetensors file starts with an 8-byte header length");
  }
  const std::uint64_t header_bytes = load_u64_le(head.data());
  if (header_bytes > limits.max_safetensors_header_bytes) {
    fail(ErrorCode::safetensors_header_too_large, "the header length is ", header_bytes,
         " bytes (Limits::max_safetensors_header_bytes is ", limits.max_safetensors_header_bytes, ")");
  }
  const auto header_end = checked_add(std::uint64_t{8}, header_bytes);
  if (!header_end || *header_end > file_size) {
    fail(ErrorCode::safetensors_header_length_invalid, "the header length is ", header_bytes, " bytes but only ",
         file_size - 8, " bytes follow it");
  }
  if (head.size() < *header_end) {
    fail(ErrorCode::invalid_argument, "read_safetensors_header: ", head.size(), " leading bytes, fewer than the ",
         *header_end, " the header takes");
  }
  // JSON whitespace may surround the object, as the reference (serde_json)
  // allows; looks_like_safetensors skips the same four characters.
  const std::string_view header(reinterpret_cast<const char*>(head.data()) + 8, static_cast<std::size_t>(header_bytes));
  HeaderSchema schema(limits);
  parse_json(header, limits.max_json_depth, schema);
  schema.throw_if_failed();
  std::vector<TensorEntry>& entries = schema.tensors();

  const std::uint64_t buffer_bytes = validate_extents(entries);
  const auto file_end = checked_add(*header_end, buffer_bytes);
  if (!file_end || *file_end != file_size) {
    fail(ErrorCode::safetensors_incomplete_buffer, "the header describes ", buffer_bytes,
         " data bytes after a header ending at byte ", *header_end, ", but the file has ", file_size,
         " bytes; the data buffer must end exactly at the end of the file");
  }

  SafetensorsFile result;
  result.header_bytes = header_bytes;
  result.metadata = std::move(schema.metadata());
  result.tensors.reserve(entries.size());
  Dict root;
  for (const TensorEntry& entry : entries) {
    const std::uint64_t nbytes = entry.end - entry.begin;
    const std::uint64_t numel = checked_numel(entry);
    if (numel > limits.max_tensor_numel) {
      fail(ErrorCode::tensor_numel_limit, "tensor ", quoted_for_message(entry.name), " has ", numel,
           " elements (Limits::max_tensor_numel is ", limits.max_tensor_numel, ")");
    }
    if (nbytes > limits.max_tensor_logical_bytes) {
      fail(ErrorCode::tensor_bytes_limit, "tensor ", quoted_for_message(entry.name), " has ", nbytes,
           " bytes (Limits::max_tensor_logical_bytes is ", limits.max_tensor_logical_bytes, ")");
    }
    const std::uint64_t offset = *header_end + entry.begin;
    result.tensors.push_back(RecordInfo{entry.name, offset, nbytes, 0});
    // The parser rejected duplicate names, so insert cannot fail.
    root.insert(entry.name, Value::tensor(make_tensor(entry, make_storage(offset, nbytes))));
  }
  result.root = Value::ordered_dict(std::move(root));
  return result;
}

}  // namespace holdpoint::format
