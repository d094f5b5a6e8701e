// The tree half of holdpoint diff (holdpoint/verify/checkpoint_diff.h): two
// verified trees walked together, every difference of keys, kinds, scalars,
// dtypes and shapes reported where it is found, and each pair of tensors of
// equal dtype and shape handed back to be compared element by element once
// the walk is over (when the total of bytes to read is known). Each entry is
// placed in its section: a component, the manifest, its configuration.
//
// Thread-safety: a pure function of the two trees.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "holdpoint/format/value.h"
#include "holdpoint/verify/checkpoint_diff.h"

namespace holdpoint::diff {

struct Where {
  std::string section;
  std::optional<ConfigFieldClass> config_field;
};

// A pair of tensors of equal dtype and shape, compared after the walk (when
// the total of bytes to read is known).
struct TensorPair {
  std::string path;
  Where where;
  std::shared_ptr<const TensorData> a;
  std::shared_ptr<const TensorData> b;
};

using WalkItem = std::variant<DiffEntry, TensorPair>;

// "float32 [2, 3]"
std::string tensor_text(const TensorData& tensor);

// The differences and tensor pairs of trees `a` and `b`, in walk order; every
// path is prefixed with `prefix` (a shard's "shards/<rank>").
std::vector<WalkItem> walk_trees(const Value& a, const Value& b, double atol, double rtol, const std::string& prefix);

}  // namespace holdpoint::diff
