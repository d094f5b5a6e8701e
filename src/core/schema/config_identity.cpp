#include "holdpoint/schema/config_identity.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "base/fail.h"
#include "base/json_string.h"

namespace holdpoint {

using detail::append_json_string;
using detail::fail;

namespace {

constexpr char kMaxEpochs[] = "max_epochs";

// Python's float repr: the shortest digits that round-trip, in fixed notation
// when the decimal exponent is in [-4, 16), scientific otherwise, and always
// with a '.' or an exponent so that floats never read as ints.
std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string text(buffer, result.ptr);  // "-1.2345e+17"
  const bool negative = text[0] == '-';
  if (negative) text.erase(0, 1);
  const std::size_t e = text.find('e');
  std::string digits = text.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(text.substr(e + 1));
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<std::size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<std::size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<std::size_t>(exponent) + 1) + "." +
            digits.substr(static_cast<std::size_t>(exponent) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_text;
  }
  return negative ? "-" + out : out;
}

void append_canonical(std::string& out, const Value& value, const std::string& path, ConfigDigestVersion version) {
  switch (value.kind()) {
    case ValueKind::none: out += "null"; return;
    case ValueKind::boolean: out += value.as_bool() ? "true" : "false"; return;
    case ValueKind::integer: out += std::to_string(value.as_int()); return;
    case ValueKind::big_integer: out += big_integer_decimal(value.as_big_integer()); return;  // as json.dumps writes it
    case ValueKind::floating: out += python_float_repr(value.as_double()); return;
    case ValueKind::string: append_json_string(out, value.as_string()); return;
    case ValueKind::list:
    case ValueKind::tuple: {
      out.push_back('[');
      const auto& items = value.as_list();
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out.push_back(',');
        append_canonical(out, items[i], path + "[" + std::to_string(i) + "]", version);
      }
      out.push_back(']');
      return;
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      for (const auto& [key, item] : value.as_dict()) {
        if (key.is_object()) {
          fail(ErrorCode::config_invalid, path, " has the key ", key.to_string(),
               "; configuration keys are str or int");
        }
      }
      std::vector<std::pair<std::string, const Value*>> sorted;
      if (version == ConfigDigestVersion::text_key_order) {
        // Kept to check files written before python_key_order: every key by its
        // text, and of an int and a str key with the same text only the first.
        std::map<std::string, const Value*> by_text;
        for (const auto& [key, item] : value.as_dict()) {
          by_text.emplace(key.is_string() ? key.as_string() : std::to_string(key.as_int()), &item);
        }
        sorted.assign(by_text.begin(), by_text.end());
      } else {
        std::vector<const Dict::Entry*> entries;
        for (const Dict::Entry& entry : value.as_dict()) entries.push_back(&entry);
        std::sort(entries.begin(), entries.end(), [](const Dict::Entry* a, const Dict::Entry* b) {
          const DictKey& x = a->first;
          const DictKey& y = b->first;
          if (x.is_string() != y.is_string()) return y.is_string();
          return x.is_string() ? x.as_string() < y.as_string() : x.as_int() < y.as_int();
        });
        for (const Dict::Entry* entry : entries) {
          const DictKey& key = entry->first;
          sorted.emplace_back(key.is_string() ? key.as_string() : std::to_string(key.as_int()), &entry->second);
        }
      }
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : sorted) {
        if (!first) out.push_back(',');
        first = false;
        append_json_string(out, key);
        out.push_back(':');
        append_canonical(out, *item, path + "." + key, version);
      }
      out.push_back('}');
      return;
    }
    case ValueKind::bytes:
    case ValueKind::tensor:
    case ValueKind::complex_number:
    case ValueKind::set:
    case ValueKind::bytearray:
    case ValueKind::device:
    case ValueKind::dtype:
    case ValueKind::size:
    case ValueKind::layout:
    case ValueKind::meta_tensor:
    case ValueKind::sparse_tensor: break;
  }
  fail(ErrorCode::config_invalid, path, " is a ", value_kind_name(value.kind()),
       "; configuration values are None, bool, int, float, str, lists and dicts");
}

void check_config_value(const Value& value, const std::string& path) {
  std::string ignored;
  append_canonical(ignored, value, path, kConfigDigestVersion);
}

Sha256Digest digest_of(const std::string& text) {
  return Sha256::of({reinterpret_cast<const std::byte*>(text.data()), text.size()});
}

void collect_drift(const Value* saved, const Value* live, const std::string& path, std::vector<std::string>& out) {
  if (!saved || !live) {
    out.push_back(path);
    return;
  }
  if (saved->is_dict() && live->is_dict()) {
    std::map<std::string, std::pair<const Value*, const Value*>> keys;
    for (const auto& [key, item] : saved->as_dict()) keys[key.to_string()].first = &item;
    for (const auto& [key, item] : live->as_dict()) keys[key.to_string()].second = &item;
    for (const auto& [key, pair] : keys) {
      const std::string name = key.size() >= 2 && key.front() == '\'' ? key.substr(1, key.size() - 2) : key;
      collect_drift(pair.first, pair.second, path.empty() ? name : path + "." + name, out);
    }
    return;
  }
  if (canonical_json(*saved) != canonical_json(*live)) out.push_back(path);
}

}  // namespace

std::string canonical_json(const Value& value, ConfigDigestVersion version) {
  std::string out;
  append_canonical(out, value, "config", version);
  return out;
}

TrainingConfig& TrainingConfig::load_bearing(const std::string& key, Value value) {
  check_config_value(value, "config.load_bearing." + key);
  load_bearing_.insert_or_assign(key, std::move(value));
  return *this;
}

TrainingConfig& TrainingConfig::operational(const std::string& key, Value value) {
  check_config_value(value, "config.operational." + key);
  // max_epochs() reads it back as an int; the resume rules compare it as one.
  if (key == kMaxEpochs && (!value.is_int() || value.as_int() < 0)) {
    fail(ErrorCode::config_invalid, "config.operational.max_epochs must be a non-negative int, not ",
         canonical_json(value));
  }
  operational_.insert_or_assign(key, std::move(value));
  return *this;
}

TrainingConfig& TrainingConfig::max_epochs(std::int64_t epochs) {
  if (epochs < 0) fail(ErrorCode::config_invalid, "config.operational.max_epochs is negative (", epochs, ")");
  return operational(kMaxEpochs, Value::integer(epochs));
}

std::optional<std::int64_t> TrainingConfig::max_epochs() const {
  const Value* value = operational_.find(std::string_view(kMaxEpochs));
  if (!value) return std::nullopt;
  return value->as_int();
}

std::string TrainingConfig::canonical_load_bearing(ConfigDigestVersion version) const {
  return canonical_json(Value::dict(load_bearing_), version);
}
std::string TrainingConfig::canonical_operational(ConfigDigestVersion version) const {
  return canonical_json(Value::dict(operational_), version);
}
Sha256Digest TrainingConfig::load_bearing_digest(ConfigDigestVersion version) const {
  return digest_of(canonical_load_bearing(version));
}
Sha256Digest TrainingConfig::operational_digest(ConfigDigestVersion version) const {
  return digest_of(canonical_operational(version));
}
bool TrainingConfig::digest_depends_on_version() const {
  return canonical_load_bearing(ConfigDigestVersion::text_key_order) != canonical_load_bearing() ||
         canonical_operational(ConfigDigestVersion::text_key_order) != canonical_operational();
}

Value TrainingConfig::to_value() const {
  Dict out;
  out.insert("load_bearing", Value::dict(load_bearing_));
  out.insert("operational", Value::dict(operational_));
  return Value::dict(std::move(out));
}

namespace {

// Files written in torch 1.13 compatible mode carry floats as 0-d float64
// tensors (1.13's weights_only unpickler has no BINFLOAT); a configuration
// holds no tensors, so inside one such a tensor is read back as its number.
Value config_value(const Value& value) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      const TensorData& t = value.as_tensor();
      if (t.dtype == DType::float64 && t.sizes.empty()) return Value::floating(value.as_number());
      return value;
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : value.as_list()) items.push_back(config_value(item));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, config_value(item));
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default: return value;
  }
}

}  // namespace

TrainingConfig TrainingConfig::from_value(const Value& value, const std::string& path) {
  if (!value.is_dict()) fail(ErrorCode::config_invalid, path, " is a ", value_kind_name(value.kind()), ", not a dict");
  TrainingConfig config;
  for (const auto& [key, item] : value.as_dict()) {
    if (!key.is_string() || (key.as_string() != "load_bearing" && key.as_string() != "operational")) {
      fail(ErrorCode::config_invalid, path, " has an unexpected key ", key.to_string());
    }
    if (!item.is_dict()) fail(ErrorCode::config_invalid, path, ".", key.as_string(), " is not a dict");
    for (const auto& [field, field_value] : item.as_dict()) {
      if (!field.is_string()) fail(ErrorCode::config_invalid, path, ".", key.as_string(), " has a non-str key");
      // Checked here too, so that errors name the field where the file has it.
      const std::string field_path = path + "." + key.as_string() + "." + field.as_string();
      Value converted = config_value(field_value);
      check_config_value(converted, field_path);
      if (key.as_string() == "operational" && field.as_string() == kMaxEpochs && !converted.is_int()) {
        fail(ErrorCode::config_invalid, field_path, " is not an int");
      }
      if (key.as_string() == "load_bearing") {
        config.load_bearing(field.as_string(), std::move(converted));
      } else {
        config.operational(field.as_string(), std::move(converted));
      }
    }
  }
  return config;
}

ConfigComparison compare_configs(const TrainingConfig& saved, const TrainingConfig& live) {
  ConfigComparison result;
  const Value saved_fields = Value::dict(saved.load_bearing_fields());
  const Value live_fields = Value::dict(live.load_bearing_fields());
  collect_drift(&saved_fields, &live_fields, "", result.drifted);
  const auto saved_epochs = saved.max_epochs();
  const auto live_epochs = live.max_epochs();
  if (saved_epochs && live_epochs && *saved_epochs != *live_epochs) {
    result.max_epochs = MaxEpochsChange{*saved_epochs, *live_epochs};
  }
  return result;
}

}  // namespace holdpoint
