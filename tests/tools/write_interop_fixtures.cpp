// write_interop_fixtures OUTDIR
//
// Writes the C++ -> Python interop fixtures: checkpoints saved through the public
// API (save_mapping; with --torch-1-13-compatible in torch 1.13 compatibility
// mode), each with
// `<file>.expected.json`, the canonical NODE tree of the Value that was written.
// tests/python/test_cpp_to_python.py loads every file with Python's
// `torch.load(f, weights_only=True)` and compares what it gets with that tree.
//
// The expected tree describes the Value as the caller built it, not as any reader
// sees it, with, in compatibility mode, the one transformation it documents: floats
// become 0-d float64 tensors and bytes 1-d uint8 tensors. Storage keys in the tree
// number distinct storages in depth-first first-reference order ("0", "1", ...),
// which is how the Python side numbers the storages of the loaded object, so the
// comparison also checks which tensors share a storage.
//
// Exit status: 0 when every file was written, 1 when any failed (each failure is
// printed), 2 on usage errors.

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/dtype.h"
#include "holdpoint/base/error.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/value.h"

namespace {

using holdpoint::Dict;
using holdpoint::DType;
using holdpoint::TensorData;
using holdpoint::Value;
using Json = nlohmann::ordered_json;

// ---- canonical NODE encoding --------------------------------------------------

class CanonicalEncoder {
 public:
  explicit CanonicalEncoder(bool torch_1_13_compatible) : compatible_(torch_1_13_compatible) {}

  Json encode(const Value& v) {
    switch (v.kind()) {
      case holdpoint::ValueKind::none:
        return nullptr;
      case holdpoint::ValueKind::boolean:
        return v.as_bool();
      case holdpoint::ValueKind::integer:
        return Json{{"int", std::to_string(v.as_int())}};
      case holdpoint::ValueKind::floating: {
        double d = v.as_double();
        if (!compatible_) return Json{{"float", float_bits_hex(d)}};
        // Compatibility mode: a 0-d float64 tensor of its own.
        return synthetic_tensor("float64", {}, std::string(reinterpret_cast<const char*>(&d), sizeof d));
      }
      case holdpoint::ValueKind::string:
        return Json{{"str", v.as_string()}};
      case holdpoint::ValueKind::bytes: {
        std::string bytes(v.as_bytes());
        if (!compatible_) return Json{{"bytes", hex_of(bytes)}};
        // Compatibility mode: a 1-d uint8 tensor of its own.
        return synthetic_tensor("uint8", {static_cast<std::int64_t>(bytes.size())}, bytes);
      }
      case holdpoint::ValueKind::list:
      case holdpoint::ValueKind::tuple: {
        Json items = Json::array();
        for (const Value& item : v.as_list()) items.push_back(encode(item));
        return Json{{v.is_list() ? "list" : "tuple", std::move(items)}};
      }
      case holdpoint::ValueKind::dict:
      case holdpoint::ValueKind::ordered_dict: {
        Json entries = Json::array();
        for (const auto& [key, item] : v.as_dict()) {
          Json k = key.is_string() ? Json{{"str", key.as_string()}} : Json{{"int", std::to_string(key.as_int())}};
          entries.push_back(Json::array({std::move(k), encode(item)}));
        }
        return Json{{v.is_ordered_dict() ? "odict" : "dict", std::move(entries)}};
      }
      case holdpoint::ValueKind::tensor:
        return tensor(v.as_tensor());
      default:
        break;  // the fixtures hold none of the other kinds
    }
    throw std::logic_error("a kind the interop fixtures do not encode");
  }

 private:
  Json tensor(const TensorData& t) {
    std::vector<std::byte> elements = t.contiguous_bytes();
    Json node;
    node["dtype"] = std::string(holdpoint::dtype_name(t.dtype));
    node["shape"] = t.sizes.vec();
    node["stride"] = t.strides.vec();
    node["offset"] = t.storage_offset;
    node["requires_grad"] = t.requires_grad;
    node["parameter"] = t.is_parameter;
    node["storage"] = key_for(t.storage->identity());
    node["sha256"] = holdpoint::Sha256::of(elements).hex();
    return Json{{"tensor", std::move(node)}};
  }

  Json synthetic_tensor(const char* dtype, std::vector<std::int64_t> shape, const std::string& bytes) {
    Json node;
    node["dtype"] = dtype;
    node["shape"] = shape;
    node["stride"] = shape.empty() ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{1};
    node["offset"] = 0;
    node["requires_grad"] = false;
    node["parameter"] = false;
    node["storage"] = std::to_string(next_key_++);
    node["sha256"] = holdpoint::Sha256::of(std::as_bytes(std::span(bytes.data(), bytes.size()))).hex();
    return Json{{"tensor", std::move(node)}};
  }

  std::string key_for(const void* identity) {
    auto [it, inserted] = keys_.try_emplace(identity, next_key_);
    if (inserted) ++next_key_;
    return std::to_string(it->second);
  }

  // The canonical float: the big-endian IEEE-754 bits as 16 lowercase hex digits.
  static std::string float_bits_hex(double value) {
    const auto bits = std::bit_cast<std::uint64_t>(value);
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
    return text;
  }

  static std::string hex_of(const std::string& bytes) {
    constexpr char kDigits[] = "0123456789abcdef";
    std::string out;
    for (unsigned char c : bytes) out += {kDigits[c >> 4], kDigits[c & 15]};
    return out;
  }

  bool compatible_;
  std::map<const void*, int> keys_;
  int next_key_ = 0;
};

// ---- deterministic contents -----------------------------------------------------

// splitmix64: a fixed, seedable byte source so the fixtures are reproducible.
std::vector<std::byte> pseudo_random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> out(n);
  std::uint64_t state = seed;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 8 == 0) {
      state += 0x9E3779B97F4A7C15ULL;
    }
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    out[i] = static_cast<std::byte>(z >> (8 * (i % 8)));
  }
  return out;
}

std::int64_t numel_of(const std::vector<std::int64_t>& sizes) {
  std::int64_t n = 1;
  for (std::int64_t s : sizes) n *= s;
  return n;
}

TensorData make_tensor(DType dtype, std::vector<std::int64_t> sizes, std::uint64_t seed) {
  std::size_t n = static_cast<std::size_t>(numel_of(sizes)) * holdpoint::dtype_itemsize(dtype);
  std::vector<std::byte> bytes = pseudo_random_bytes(n, seed);
  if (dtype == DType::boolean) {
    for (std::byte& b : bytes) b &= std::byte{1};  // torch bools are 0 or 1
  }
  return TensorData::from_bytes(dtype, std::move(sizes), bytes);
}

Value tensor_value(DType dtype, std::vector<std::int64_t> sizes, std::uint64_t seed) {
  return Value::tensor(make_tensor(dtype, std::move(sizes), seed));
}

// A view of `base`'s storage with its own geometry.
Value view_of(const TensorData& base, std::vector<std::int64_t> sizes, std::vector<std::int64_t> strides,
              std::int64_t offset) {
  TensorData view = base;
  view.sizes = std::move(sizes);
  view.strides = std::move(strides);
  view.storage_offset = offset;
  return Value::tensor(std::move(view));
}

Dict dict_of(std::vector<std::pair<holdpoint::DictKey, Value>> entries) {
  Dict d;
  for (auto& [k, v] : entries) {
    if (!d.insert(std::move(k), std::move(v))) throw std::logic_error("duplicate key in fixture");
  }
  return d;
}

// ---- the fixtures ------------------------------------------------------------------

const std::vector<DType> kTorch113Dtypes = {
    DType::float64, DType::float32, DType::float16, DType::bfloat16, DType::int64,     DType::int32,
    DType::int16,   DType::int8,    DType::uint8,   DType::boolean,  DType::complex64, DType::complex128,
};

std::vector<std::pair<std::string, std::function<Value()>>> fixtures() {
  std::vector<std::pair<std::string, std::function<Value()>>> out;

  out.emplace_back("dtypes", [] {
    Dict d;
    std::uint64_t seed = 1;
    for (DType dt : kTorch113Dtypes) d.insert(std::string(holdpoint::dtype_name(dt)), tensor_value(dt, {2, 3}, seed++));
    return Value::dict(std::move(d));
  });

  out.emplace_back("shapes", [] {
    Dict d;
    std::uint64_t seed = 100;
    for (DType dt : kTorch113Dtypes) {
      std::string name(holdpoint::dtype_name(dt));
      d.insert(name + "_0d", tensor_value(dt, {}, seed++));
      d.insert(name + "_empty", tensor_value(dt, {0, 3}, seed++));
    }
    d.insert("rank5", tensor_value(DType::float32, {2, 1, 3, 1, 2}, seed++));
    d.insert("zero_middle", tensor_value(DType::int64, {4, 0, 2}, seed++));
    return Value::dict(std::move(d));
  });

  out.emplace_back("views", [] {
    TensorData base = make_tensor(DType::float32, {4, 6}, 200);
    return Value::dict(dict_of({
        {"base", Value::tensor(base)},
        {"transposed", view_of(base, {6, 4}, {1, 6}, 0)},
        {"row2", view_of(base, {6}, {1}, 12)},
        {"column1", view_of(base, {4}, {6}, 1)},
        {"every_other", view_of(base, {2, 3}, {12, 2}, 1)},
    }));
  });

  out.emplace_back("two_views_one_storage", [] {
    // The whole storage is never referenced as such: only two disjoint views.
    TensorData base = make_tensor(DType::int32, {20}, 300);
    return Value::dict(dict_of({
        {"first", view_of(base, {2, 4}, {4, 1}, 0)},
        {"second_t", view_of(base, {3, 4}, {1, 3}, 8)},
    }));
  });

  out.emplace_back("tied", [] {
    auto shared = std::make_shared<const TensorData>(make_tensor(DType::float32, {3, 2}, 400));
    return Value::dict(dict_of({
        {"encoder.weight", Value::tensor(shared)},
        {"decoder.weight", Value::tensor(shared)},
        {"nested", Value::list({Value::tensor(shared), Value::integer(1)})},
    }));
  });

  out.emplace_back("unicode_keys", [] {
    return Value::dict(dict_of({
        {"ünïcødé", tensor_value(DType::float32, {2}, 500)},
        {"日本語のキー", Value::string("値 ✓")},
        {"emoji 🙂🚀", Value::integer(7)},
        {"", Value::string("empty key")},
        {"tab\tnew\nline\"quote\\", Value::none()},
    }));
  });

  out.emplace_back("nested", [] {
    Value inner =
        Value::dict(dict_of({{"x", Value::list({Value::none(), Value::boolean(true), Value::boolean(false)})}}));
    return Value::dict(dict_of({
        {"list", Value::list({Value::integer(1), Value::tuple({Value::integer(2), Value::integer(3)}), inner,
                              Value::list({Value::list({Value::list()})})})},
        {"tuples", Value::tuple({Value::tuple(), Value::tuple({Value::integer(1)}),
                                 Value::tuple({Value::string("a"), Value::string("b"), Value::string("c"),
                                               Value::string("d")})})},
        {"empty_dict", Value::dict()},
        {"empty_list", Value::list()},
        {"str", Value::string("hello")},
        {"true", Value::boolean(true)},
        {"false", Value::boolean(false)},
        {"none", Value::none()},
        {"deep", Value::dict(dict_of(
                     {{"a", Value::dict(dict_of({{"b", Value::list({tensor_value(DType::int64, {3}, 600)})}}))}}))},
    }));
  });

  out.emplace_back("int_edges", [] {
    constexpr std::int64_t k31 = std::int64_t{1} << 31;
    constexpr std::int64_t k40 = std::int64_t{1} << 40;
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
    const std::vector<std::int64_t> edges = {0,   1,    -1,       255, 256,  65535, 65536, k31 - 1,
                                             k31, -k31, -k31 - 1, k40, -k40, kMax,  kMin};
    Value::List values;
    Dict as_keys;
    for (std::int64_t e : edges) {
      values.push_back(Value::integer(e));
      as_keys.insert(holdpoint::DictKey(e), Value::string(std::to_string(e)));
    }
    return Value::dict(
        dict_of({{"values", Value::list(std::move(values))}, {"as_keys", Value::dict(std::move(as_keys))}}));
  });

  out.emplace_back("floats", [] {
    const double inf = std::numeric_limits<double>::infinity();
    return Value::dict(dict_of({
        {"lr", Value::floating(0.1)},
        {"values", Value::list({Value::floating(0.0), Value::floating(-0.0), Value::floating(1.5), Value::floating(inf),
                                Value::floating(-inf), Value::floating(std::numeric_limits<double>::quiet_NaN()),
                                Value::floating(1e-310), Value::floating(1e300)})},
        {"betas", Value::tuple({Value::floating(0.9), Value::floating(0.999)})},
    }));
  });

  out.emplace_back("many_entries", [] {
    Dict d;
    for (int i = 0; i < 1200; ++i) {
      d.insert("layer" + std::to_string(i) + ".weight",
               tensor_value(DType::float32, {2}, 1000 + static_cast<std::uint64_t>(i)));
    }
    Value::List ints;
    for (int i = 0; i < 1100; ++i) ints.push_back(Value::integer(i * 7));
    d.insert("ints", Value::list(std::move(ints)));
    Dict by_index;
    for (int i = 0; i < 1001; ++i) by_index.insert(holdpoint::DictKey(i), Value::integer(i));
    d.insert("by_index", Value::dict(std::move(by_index)));
    return Value::dict(std::move(d));
  });

  out.emplace_back("ordered_dict", [] {
    Dict state = dict_of({
        {"fc.weight", tensor_value(DType::float32, {3, 4}, 700)},
        {"fc.bias", tensor_value(DType::float32, {3}, 701)},
        {"bn.num_batches_tracked", tensor_value(DType::int64, {}, 702)},
    });
    Dict inner = dict_of({{"z", Value::integer(1)}, {"a", Value::integer(2)}});
    return Value::dict(
        dict_of({{"model", Value::ordered_dict(std::move(state))}, {"order", Value::ordered_dict(std::move(inner))}}));
  });

  out.emplace_back("ordered_dict_root", [] {
    return Value::ordered_dict(dict_of({
        {"b", tensor_value(DType::float16, {2, 2}, 800)},
        {"a", tensor_value(DType::bfloat16, {2}, 801)},
    }));
  });

  out.emplace_back("bytes_compat", [] {
    return Value::dict(
        dict_of({{"blob", Value::bytes(std::string("\x00\x01\xfe\xffholdpoint", 13))}, {"empty", Value::bytes("")}}));
  });

  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const bool compatible = argc == 3 && std::string_view(argv[1]) == "--torch-1-13-compatible";
  if (argc != 2 && !compatible) {
    std::cerr << "usage: write_interop_fixtures [--torch-1-13-compatible] OUTDIR\n";
    return 2;
  }
  const std::filesystem::path outdir = argv[argc - 1];
  std::error_code ec;
  std::filesystem::create_directories(outdir, ec);
  if (ec) {
    std::cerr << "cannot create " << outdir << ": " << ec.message() << "\n";
    return 2;
  }

  int failures = 0;
  for (const auto& [name, build] : fixtures()) {
    const std::filesystem::path file = outdir / (name + ".pt");
    try {
      Value root = build();
      holdpoint::SaveOptions options;
      options.torch_1_13_compatible = compatible;
      options.durable = false;
      holdpoint::save_mapping(file, root, options);
      std::ofstream expected(file.string() + ".expected.json", std::ios::binary | std::ios::trunc);
      expected << CanonicalEncoder(compatible).encode(root).dump(1) << "\n";
      if (!expected) throw std::runtime_error("cannot write " + file.string() + ".expected.json");
      std::cout << file.string() << "\n";
    } catch (const holdpoint::Error& e) {
      std::cout << "FAILED " << name << ": " << holdpoint::error_code_name(e.code()) << ": " << e.what() << "\n";
      ++failures;
    } catch (const std::exception& e) {
      std::cout << "FAILED " << name << ": " << e.what() << "\n";
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
