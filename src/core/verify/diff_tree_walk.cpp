// The tree half of holdpoint diff: diff_tree_walk.h.
#include "verify/diff_tree_walk.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "base/fail.h"
#include "holdpoint/schema/manifest.h"
#include "verify/diff_elements.h"

namespace holdpoint::diff {

using detail::concat;

std::string tensor_text(const TensorData& tensor) {
  return concat(dtype_name(tensor.dtype), ' ', shape_text(tensor.sizes));
}

namespace {

std::string value_text(const Value& value) {
  switch (value.kind()) {
    case ValueKind::list: return concat("list(", value.as_list().size(), ")");
    case ValueKind::tuple: return concat("tuple(", value.as_list().size(), ")");
    case ValueKind::dict: return concat("dict(", value.as_dict().size(), ")");
    case ValueKind::ordered_dict: return concat("OrderedDict(", value.as_dict().size(), ")");
    case ValueKind::tensor: return tensor_text(value.as_tensor());
    default: return scalar_text(value, 80);
  }
}

// Containers of one family compare their contents even when the exact kind
// differs (dict vs OrderedDict, list vs tuple); the kind change is reported.
int kind_family(ValueKind kind) {
  switch (kind) {
    case ValueKind::dict:
    case ValueKind::ordered_dict: return 1;
    case ValueKind::list:
    case ValueKind::tuple:
    case ValueKind::size:
    case ValueKind::set: return 2;
    default: return 0;
  }
}

std::string join_path(const std::string& path, const std::string& key) { return path.empty() ? key : path + "/" + key; }

const std::vector<std::string_view>& component_sections() {
  static const std::vector<std::string_view> names = {"model",   "optimizer", "scheduler",  "scaler", "rng",
                                                      "sampler", "progress",  "early_stop", "history"};
  return names;
}

class TreeWalk {
 public:
  TreeWalk(const Value& a, const Value& b, double atol, double rtol, std::string prefix)
      : atol_(atol), rtol_(rtol), prefix_(std::move(prefix)) {
    has_manifest_ = find_manifest_entry(a) != nullptr || find_manifest_entry(b) != nullptr;
    for (const Value* root : {&a, &b}) {
      const Value* manifest = find_manifest_entry(*root);
      if (!manifest || !manifest->is_dict()) continue;
      const Value* components = manifest->as_dict().find(std::string_view("components"));
      if (!components || !components->is_dict()) continue;
      for (const auto& [key, value] : components->as_dict()) {
        if (key.is_string()) manifest_components_.push_back(key.as_string());
      }
    }
  }

  std::vector<WalkItem> run(const Value& a, const Value& b) {
    compare(a, b, "", Where{a.is_dict() || b.is_dict() ? "manifest" : "other", std::nullopt}, 0);
    return std::move(items_);
  }

 private:
  std::string key_text(const DictKey& key) const { return key.is_string() ? key.as_string() : key.to_string(); }

  // Where a child of `where` at `depth` (the child's depth) lies.
  Where child_where(const Where& where, const std::string& path, const std::string& key, const Value& child,
                    int depth) const {
    if (depth == 1) {
      if (key == kManifestKey) return {"manifest", std::nullopt};
      for (std::string_view name : component_sections()) {
        if (key == name) return {key, std::nullopt};
      }
      for (const std::string& name : manifest_components_) {
        if (key == name) return {key, std::nullopt};
      }
      if (!has_manifest_ && child.is_tensor()) return {"model", std::nullopt};
      return {"other", std::nullopt};
    }
    const std::string manifest(kManifestKey);
    if (depth == 2 && path == manifest && key == "config") return {"config", std::nullopt};
    if (depth == 3 && path == manifest + "/config") {
      if (key == "load_bearing") return {"config", ConfigFieldClass::load_bearing};
      if (key == "operational") return {"config", ConfigFieldClass::operational};
    }
    return where;
  }

  std::string full(const std::string& path) const {
    if (prefix_.empty()) return path;
    return path.empty() ? prefix_ : prefix_ + "/" + path;
  }

  DiffEntry entry(const std::string& path, const Where& where, DiffChange change, std::string a, std::string b) {
    DiffEntry e;
    e.path = full(path);
    e.section = where.section;
    e.config_field = where.config_field;
    e.change = change;
    e.a = std::move(a);
    e.b = std::move(b);
    return e;
  }

  void add(DiffEntry e) { items_.emplace_back(std::move(e)); }

  void compare(const Value& a, const Value& b, const std::string& path, const Where& where, int depth) {
    if (a.kind() != b.kind()) {
      add(entry(path, where, DiffChange::type_changed, value_text(a), value_text(b)));
      if (kind_family(a.kind()) == 0 || kind_family(a.kind()) != kind_family(b.kind())) return;
    }
    switch (a.kind()) {
      case ValueKind::dict:
      case ValueKind::ordered_dict: compare_dicts(a.as_dict(), b.as_dict(), path, where, depth); return;
      case ValueKind::list:
      case ValueKind::tuple:
      case ValueKind::set:
      case ValueKind::size: compare_lists(a.as_list(), b.as_list(), path, where, depth); return;
      case ValueKind::tensor: compare_tensors(a, b, path, where); return;
      case ValueKind::floating: {
        const double x = a.as_double(), y = b.as_double();
        if (std::memcmp(&x, &y, sizeof x) == 0) return;
        DeviationCounter counter(atol_, rtol_, nullptr);
        counter.add_numel(1);
        counter.reals(x, y, 0);
        const Deviation deviation = counter.finish();
        if (deviation.unequal == 0) return;  // -0.0 against 0.0, or NaN payloads
        DiffEntry e = entry(path, where, DiffChange::value_changed, value_text(a), value_text(b));
        e.within_tolerance = deviation.differing == 0;
        e.deviation = deviation;
        add(std::move(e));
        return;
      }
      case ValueKind::integer: {
        if (a.as_int() == b.as_int()) return;
        DeviationCounter counter(atol_, rtol_, nullptr);
        counter.add_numel(1);
        counter.integers(a.as_int(), b.as_int(), 0);
        DiffEntry e = entry(path, where, DiffChange::value_changed, value_text(a), value_text(b));
        e.deviation = counter.finish();
        add(std::move(e));
        return;
      }
      case ValueKind::bytes:
      case ValueKind::bytearray: {
        const std::string_view x = a.as_bytes(), y = b.as_bytes();
        if (x == y) return;
        DiffEntry e = entry(path, where, DiffChange::value_changed, value_text(a), value_text(b));
        if (x.size() == y.size()) {
          std::size_t differing = 0;
          std::size_t first = x.size();
          for (std::size_t i = 0; i < x.size(); ++i) {
            if (x[i] != y[i] && differing++ == 0) first = i;
          }
          e.detail = concat(differing, " of ", x.size(), " bytes differ, the first at offset ", first);
        } else {
          e.detail = concat(x.size(), " -> ", y.size(), " bytes");
        }
        add(std::move(e));
        return;
      }
      case ValueKind::none: return;
      case ValueKind::boolean:
        if (a.as_bool() != b.as_bool()) add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        return;
      case ValueKind::big_integer:
        if (a.as_big_integer() != b.as_big_integer()) {
          add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        }
        return;
      case ValueKind::string:
        if (a.as_string() != b.as_string()) {
          add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        }
        return;
      case ValueKind::complex_number:
      case ValueKind::device:
      case ValueKind::dtype:
      case ValueKind::layout:
      case ValueKind::meta_tensor:
        if (!equal_content(a, b)) add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
        return;
      case ValueKind::sparse_tensor: {
        // A changed header (layout, size, flags, nnz) is one entry; under an
        // equal header the parts compare as the tensors they are.
        if (typed_scalar_text(a) != typed_scalar_text(b)) {
          add(entry(path, where, DiffChange::value_changed, value_text(a), value_text(b)));
          return;
        }
        const auto& x = a.as_sparse_tensor().parts;
        const auto& y = b.as_sparse_tensor().parts;
        for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
          compare_tensors(x[i], y[i], path + ".part" + std::to_string(i), where);
        }
        return;
      }
    }
  }

  void compare_dicts(const Dict& a, const Dict& b, const std::string& path, const Where& where, int depth) {
    for (const auto& [key, value] : a) {
      const std::string name = key_text(key);
      const std::string child = join_path(path, name);
      const Value* other = b.find(key);
      const Where child_at = child_where(where, path, name, value, depth + 1);
      if (other) {
        compare(value, *other, child, child_at, depth + 1);
      } else {
        add(entry(child, child_at, DiffChange::removed, value_text(value), ""));
      }
    }
    for (const auto& [key, value] : b) {
      if (a.find(key)) continue;
      const std::string name = key_text(key);
      add(entry(join_path(path, name), child_where(where, path, name, value, depth + 1), DiffChange::added, "",
                value_text(value)));
    }
  }

  void compare_lists(const Value::List& a, const Value::List& b, const std::string& path, const Where& where,
                     int depth) {
    const std::size_t common = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string name = std::to_string(i);
      const std::string child = join_path(path, name);
      const Value& present = i < a.size() ? a[i] : b[i];
      const Where child_at = child_where(where, path, name, present, depth + 1);
      if (i < common) {
        compare(a[i], b[i], child, child_at, depth + 1);
      } else if (i < a.size()) {
        add(entry(child, child_at, DiffChange::removed, value_text(a[i]), ""));
      } else {
        add(entry(child, child_at, DiffChange::added, "", value_text(b[i])));
      }
    }
  }

  void compare_tensors(const Value& a, const Value& b, const std::string& path, const Where& where) {
    const TensorData& x = a.as_tensor();
    const TensorData& y = b.as_tensor();
    if (x.requires_grad != y.requires_grad || x.is_parameter != y.is_parameter || x.conjugate != y.conjugate ||
        x.negative != y.negative) {
      DiffEntry e = entry(path, where, DiffChange::attribute_changed, tensor_text(x), tensor_text(y));
      const auto flag = [](bool set) { return set ? "True" : "False"; };
      e.detail = concat("requires_grad ", flag(x.requires_grad), " -> ", flag(y.requires_grad), ", Parameter ",
                        flag(x.is_parameter), " -> ", flag(y.is_parameter));
      if (x.conjugate != y.conjugate) e.detail += concat(", conj ", flag(x.conjugate), " -> ", flag(y.conjugate));
      if (x.negative != y.negative) e.detail += concat(", neg ", flag(x.negative), " -> ", flag(y.negative));
      add(std::move(e));
    }
    if (x.dtype != y.dtype) {
      add(entry(path, where, DiffChange::dtype_changed, tensor_text(x), tensor_text(y)));
      return;
    }
    if (!(x.sizes == y.sizes)) {
      add(entry(path, where, DiffChange::shape_changed, tensor_text(x), tensor_text(y)));
      return;
    }
    items_.emplace_back(TensorPair{full(path), where, a.tensor_ptr(), b.tensor_ptr()});
  }

  double atol_;
  double rtol_;
  std::string prefix_;
  bool has_manifest_ = false;
  std::vector<std::string> manifest_components_;
  std::vector<WalkItem> items_;
};

}  // namespace

std::vector<WalkItem> walk_trees(const Value& a, const Value& b, double atol, double rtol, const std::string& prefix) {
  return TreeWalk(a, b, atol, rtol, prefix).run(a, b);
}

}  // namespace holdpoint::diff
