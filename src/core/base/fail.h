// Throwing a holdpoint::Error with a message built from parts.
//
//   fail(ErrorCode::zip_name_invalid, "entry ", index, " name is ", name.size(),
//        " bytes (bound ", kMaxNameBytes, ")");
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "holdpoint/base/error.h"

namespace holdpoint::detail {

template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

template <typename... Parts>
[[noreturn]] void fail(ErrorCode code, Parts&&... parts) {
  throw Error(code, concat(std::forward<Parts>(parts)...));
}

}  // namespace holdpoint::detail
