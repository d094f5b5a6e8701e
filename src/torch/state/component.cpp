#include "holdpoint/state/component.h"

namespace holdpoint {

Value Component::contract() const { return contract_of(capture(CaptureMode::reference)); }

void Component::describe(ProfileFacts&) const {}

std::function<void()> Component::stage(const Value&) { return {}; }

Value deep_copy(const Value& value) {
  switch (value.kind()) {
    case ValueKind::tensor: {
      const TensorData& t = value.as_tensor();
      TensorData copy = TensorData::from_bytes(t.dtype, t.sizes, t.contiguous_bytes());
      copy.requires_grad = t.requires_grad;
      copy.is_parameter = t.is_parameter;
      copy.conjugate = t.conjugate;
      copy.negative = t.negative;
      return Value::tensor(std::move(copy));
    }
    case ValueKind::list:
    case ValueKind::tuple: {
      Value::List items;
      for (const Value& item : value.as_list()) items.push_back(deep_copy(item));
      return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ValueKind::dict:
    case ValueKind::ordered_dict: {
      Dict entries;
      for (const auto& [key, item] : value.as_dict()) entries.insert(key, deep_copy(item));
      if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
      return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
    }
    default: return value;  // scalars and strings are immutable
  }
}

}  // namespace holdpoint
