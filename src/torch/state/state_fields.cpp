#include "state/state_fields.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace holdpoint::state {

namespace {
std::string describe(const Value& value) { return std::string(value_kind_name(value.kind())); }
}  // namespace

FieldReader::FieldReader(const Value& value, std::string path) : path_(std::move(path)) {
  if (!value.is_dict()) state_error(ErrorCode::state_type_invalid, path_, " is a ", describe(value), ", not a dict");
  dict_ = &value.as_dict();
}

std::string FieldReader::path_of(std::string_view key) const { return path_ + "." + std::string(key); }

const Value& FieldReader::required(std::string_view key) const {
  const Value* value = dict_->find(key);
  if (!value) state_error(ErrorCode::state_key_missing, path_of(key), " is missing");
  return *value;
}

double number_of(const Value& value, const std::string& path) {
  switch (value.kind()) {
    case ValueKind::floating: return value.as_double();
    case ValueKind::integer: return static_cast<double>(value.as_int());
    case ValueKind::tensor: {
      const TensorData& t = value.as_tensor();
      if (t.sizes.empty() && (t.dtype == DType::float64 || t.dtype == DType::float32)) {
        if (t.dtype == DType::float64) return value.as_number();
        float f;
        std::memcpy(&f, t.storage->data() + t.storage_offset * 4, sizeof f);
        return f;
      }
      break;
    }
    default: break;
  }
  state_error(ErrorCode::state_type_invalid, path, " is a ", describe(value), ", not a number");
}

std::int64_t integer_of(const Value& value, const std::string& path) {
  if (value.is_int()) return value.as_int();
  // PyTorch 1.13 writes some counters (Adam's step) as 0-d float32 tensors
  // holding whole numbers; accept those when they are exact.
  if (value.is_tensor() || value.is_double()) {
    const double d = number_of(value, path);
    if (d >= -9.007199254740992e15 && d <= 9.007199254740992e15 && d == static_cast<double>(static_cast<std::int64_t>(d))) {
      return static_cast<std::int64_t>(d);
    }
    state_error(ErrorCode::state_value_invalid, path, " = ", d, " is not a whole number");
  }
  state_error(ErrorCode::state_type_invalid, path, " is a ", describe(value), ", not an int");
}

std::string repr(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

std::int64_t FieldReader::integer(std::string_view key) const { return integer_of(required(key), path_of(key)); }
double FieldReader::number(std::string_view key) const { return number_of(required(key), path_of(key)); }

bool FieldReader::boolean(std::string_view key) const {
  const Value& value = required(key);
  if (!value.is_bool()) state_error(ErrorCode::state_type_invalid, path_of(key), " is a ", describe(value), ", not a bool");
  return value.as_bool();
}

const std::string& FieldReader::string(std::string_view key) const {
  const Value& value = required(key);
  if (!value.is_string()) state_error(ErrorCode::state_type_invalid, path_of(key), " is a ", describe(value), ", not a str");
  return value.as_string();
}

const TensorData& FieldReader::tensor(std::string_view key) const { return *tensor_ptr(key); }

const std::shared_ptr<const TensorData>& FieldReader::tensor_ptr(std::string_view key) const {
  const Value& value = required(key);
  if (!value.is_tensor()) {
    state_error(ErrorCode::state_type_invalid, path_of(key), " is a ", describe(value), ", not a Tensor");
  }
  return value.tensor_ptr();
}

const Value::List& FieldReader::sequence(std::string_view key) const {
  const Value& value = required(key);
  if (!value.is_sequence()) {
    state_error(ErrorCode::state_type_invalid, path_of(key), " is a ", describe(value), ", not a list");
  }
  return value.as_list();
}

FieldReader FieldReader::child(std::string_view key) const { return FieldReader(required(key), path_of(key)); }

void FieldReader::allow_only(std::initializer_list<std::string_view> allowed) const {
  for (const auto& [key, value] : *dict_) {
    const std::string name = key.is_string() ? key.as_string() : key.to_string();
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end() || !key.is_string()) {
      state_error(ErrorCode::state_key_unknown, path_, " has an unexpected key ", key.to_string());
    }
  }
}

}  // namespace holdpoint::state
