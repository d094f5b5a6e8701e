#include "value_json.h"

#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "holdpoint/base/sha256.h"

namespace holdpoint::cli {

namespace {

std::string hex_of(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// A float as the hex of its IEEE bits, as "float" values are written.
std::string float_bits(double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

class Encoder {
 public:
  explicit Encoder(bool digests) : digests_(digests) {}

  nlohmann::ordered_json encode(const Value& value) {
    using nlohmann::ordered_json;
    switch (value.kind()) {
      case ValueKind::none: return nullptr;
      case ValueKind::boolean: return value.as_bool();
      case ValueKind::integer: return ordered_json{{"int", std::to_string(value.as_int())}};
      case ValueKind::big_integer: return ordered_json{{"int", big_integer_decimal(value.as_big_integer())}};
      case ValueKind::floating: {
        const double v = value.as_double();
        std::uint64_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        char text[17];
        std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
        return ordered_json{{"float", text}};
      }
      case ValueKind::string: return ordered_json{{"str", value.as_string()}};
      case ValueKind::bytes: return ordered_json{{"bytes", hex_of(value.as_bytes())}};
      case ValueKind::list:
      case ValueKind::tuple: {
        ordered_json items = ordered_json::array();
        for (const Value& item : value.as_list()) items.push_back(encode(item));
        return ordered_json{{value.is_list() ? "list" : "tuple", std::move(items)}};
      }
      case ValueKind::dict:
      case ValueKind::ordered_dict: {
        ordered_json entries = ordered_json::array();
        for (const auto& [key, item] : value.as_dict()) {
          ordered_json encoded_key = key.is_string()    ? ordered_json{{"str", key.as_string()}}
                                     : key.is_integer() ? ordered_json{{"int", std::to_string(key.as_int())}}
                                                        : encode(key.value());
          entries.push_back(ordered_json::array({std::move(encoded_key), encode(item)}));
        }
        return ordered_json{{value.is_ordered_dict() ? "odict" : "dict", std::move(entries)}};
      }
      case ValueKind::tensor: return ordered_json{{"tensor", encode_tensor(value.as_tensor())}};
      case ValueKind::complex_number: {
        const std::complex<double> z = value.as_complex();
        return ordered_json{{"complex", ordered_json::array({float_bits(z.real()), float_bits(z.imag())})}};
      }
      case ValueKind::set: {
        ordered_json items = ordered_json::array();
        for (const Value& item : value.as_list()) items.push_back(encode(item));
        return ordered_json{{"set", std::move(items)}};
      }
      case ValueKind::bytearray: return ordered_json{{"bytearray", hex_of(value.as_bytes())}};
      case ValueKind::device: return ordered_json{{"device", value.as_device()}};
      case ValueKind::dtype: return ordered_json{{"dtype", std::string(dtype_name(value.as_dtype()))}};
      case ValueKind::layout: return ordered_json{{"layout", value.as_layout()}};
      case ValueKind::size: {
        ordered_json dims = ordered_json::array();
        for (const Value& item : value.as_list()) dims.push_back(std::to_string(item.as_int()));
        return ordered_json{{"size", std::move(dims)}};
      }
      case ValueKind::meta_tensor: {
        // A tensor's fields with device "meta" and no offset, storage or elements.
        const TensorData& tensor = value.as_meta_tensor();
        ordered_json out;
        out["device"] = "meta";
        out["dtype"] = std::string(dtype_name(tensor.dtype));
        out["shape"] = tensor.sizes;
        out["stride"] = tensor.strides;
        out["requires_grad"] = tensor.requires_grad;
        out["parameter"] = tensor.is_parameter;
        return ordered_json{{"tensor", std::move(out)}};
      }
      case ValueKind::sparse_tensor: {
        // The layout, size and flags, and the parts as tensors.
        const SparseTensor& sparse = value.as_sparse_tensor();
        ordered_json out;
        out["layout"] = sparse.layout;
        out["shape"] = sparse.sizes;
        if (sparse.coalesced) out["coalesced"] = *sparse.coalesced;
        out["requires_grad"] = sparse.requires_grad;
        out["parameter"] = sparse.is_parameter;
        ordered_json parts = ordered_json::array();
        for (const Value& part : sparse.parts) parts.push_back(encode(part));
        out["parts"] = std::move(parts);
        return ordered_json{{"sparse_tensor", std::move(out)}};
      }
    }
    return nullptr;
  }

 private:
  nlohmann::ordered_json encode_tensor(const TensorData& tensor) {
    nlohmann::ordered_json out;
    out["dtype"] = std::string(dtype_name(tensor.dtype));
    out["shape"] = tensor.sizes;
    out["stride"] = tensor.strides;
    out["offset"] = tensor.storage_offset;
    out["requires_grad"] = tensor.requires_grad;
    out["parameter"] = tensor.is_parameter;
    if (tensor.from_numpy) out["numpy"] = true;
    if (tensor.conjugate) out["conj"] = true;
    if (tensor.negative) out["neg"] = true;
    const void* identity = tensor.storage->identity();
    auto [it, inserted] = storage_keys_.emplace(identity, storage_keys_.size());
    out["storage"] = std::to_string(it->second);
    if (digests_) out["sha256"] = Sha256::of(tensor.contiguous_bytes()).hex();
    return out;
  }

  bool digests_;
  std::unordered_map<const void*, std::size_t> storage_keys_;
};

}  // namespace

nlohmann::ordered_json value_to_json(const Value& value, bool tensor_digests) {
  return Encoder(tensor_digests).encode(value);
}

}  // namespace holdpoint::cli
