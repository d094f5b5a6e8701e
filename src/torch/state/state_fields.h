// Reading dict-shaped component states with errors that name the field.
//
// Every component validates its Value through a FieldReader, so that every
// rejection says which component, which field (as a path such as
// "optimizer.param_groups[0].lr"), what was expected and what was found, with
// one ErrorCode per kind of problem: state_key_missing, state_key_unknown,
// state_type_invalid, state_value_invalid.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "base/fail.h"
#include "holdpoint/format/value.h"

namespace holdpoint::state {

class FieldReader {
 public:
  // `value` must be a dict (or OrderedDict); `path` names it in messages.
  FieldReader(const Value& value, std::string path);

  const std::string& path() const noexcept { return path_; }
  std::string path_of(std::string_view key) const;
  const Dict& dict() const noexcept { return *dict_; }

  bool has(std::string_view key) const { return dict_->find(key) != nullptr; }
  const Value& required(std::string_view key) const;
  const Value* optional(std::string_view key) const { return dict_->find(key); }

  std::int64_t integer(std::string_view key) const;
  // A float, an int, or a 0-d float64 tensor (torch 1.13 compatibility mode).
  double number(std::string_view key) const;
  bool boolean(std::string_view key) const;
  const std::string& string(std::string_view key) const;
  const TensorData& tensor(std::string_view key) const;
  // The same, as the tree holds it (for adopt_or_copy in tensor_state.h).
  const std::shared_ptr<const TensorData>& tensor_ptr(std::string_view key) const;
  const Value::List& sequence(std::string_view key) const;
  FieldReader child(std::string_view key) const;

  // Rejects (state_key_unknown) any key not in `allowed`.
  void allow_only(std::initializer_list<std::string_view> allowed) const;

 private:
  const Dict* dict_;
  std::string path_;
};

// A number from a float, int or 0-d float64 tensor; state_type_invalid otherwise.
double number_of(const Value& value, const std::string& path);
std::int64_t integer_of(const Value& value, const std::string& path);

// A double with 17 significant digits, enough to tell any two doubles apart,
// for messages that must show the exact value a state or option holds.
std::string repr(double value);

template <typename... Parts>
[[noreturn]] void state_error(ErrorCode code, Parts&&... parts) {
  detail::fail(code, std::forward<Parts>(parts)...);
}

}  // namespace holdpoint::state
