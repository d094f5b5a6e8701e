// The reports of holdpoint diff (holdpoint/verify/checkpoint_diff.h): the
// names of changes and configuration classes, the counts, and the text and
// JSON renderings of a CheckpointDiff (docs/cli.md "diff" shows both).
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "base/fail.h"
#include "holdpoint/verify/checkpoint_diff.h"
#include "verify/diff_elements.h"

namespace holdpoint {

using detail::concat;

std::string_view diff_change_name(DiffChange change) noexcept {
  switch (change) {
    case DiffChange::added: return "added";
    case DiffChange::removed: return "removed";
    case DiffChange::type_changed: return "type changed";
    case DiffChange::dtype_changed: return "dtype changed";
    case DiffChange::shape_changed: return "shape changed";
    case DiffChange::attribute_changed: return "attribute changed";
    case DiffChange::value_changed: return "value changed";
  }
  return "unknown";
}

std::string_view config_field_class_name(ConfigFieldClass field_class) noexcept {
  return field_class == ConfigFieldClass::load_bearing ? "load-bearing" : "operational";
}

std::size_t CheckpointDiff::beyond_tolerance() const noexcept {
  std::size_t count = 0;
  for (const DiffEntry& entry : entries) count += entry.within_tolerance ? 0 : 1;
  return count;
}

bool CheckpointDiff::same() const noexcept { return beyond_tolerance() == 0; }

namespace {

std::string index_text(const std::vector<std::int64_t>& index) { return shape_text(index); }

std::string entry_line(const DiffEntry& e) {
  std::string line = concat(diff_change_name(e.change), ": ", e.path.empty() ? "(root)" : e.path, " (", e.section);
  if (e.config_field) line += concat(", ", config_field_class_name(*e.config_field));
  line += ") ";
  if (e.change == DiffChange::added) {
    line += e.b;
  } else if (e.change == DiffChange::removed) {
    line += e.a;
  } else if (e.a == e.b) {
    line += e.a;
  } else {
    line += e.a + " -> " + e.b;
  }
  if (e.deviation) {
    const Deviation& d = *e.deviation;
    if (d.numel > 1) {
      line += concat(": ", d.differing, " of ", d.numel, " elements differ");
      if (d.unequal != d.differing) line += concat(" (", d.unequal, " unequal)");
      if (!d.first_index.empty()) line += concat(", first at ", index_text(d.first_index));
    }
    if (d.max_abs_deviation) {
      line += concat(d.numel > 1 ? ", " : ": ", "max abs ", float_text(*d.max_abs_deviation));
      if (d.numel > 1 && !d.max_abs_index.empty()) line += " at " + index_text(d.max_abs_index);
    }
    if (d.max_rel_deviation) line += concat(", max rel ", float_text(*d.max_rel_deviation));
  }
  if (!e.detail.empty()) line += "; " + e.detail;
  if (e.within_tolerance) line += " (within tolerance)";
  return line;
}

nlohmann::ordered_json optional_number(const std::optional<double>& value) {
  if (!value) return nullptr;
  if (std::isinf(*value)) return *value > 0 ? "inf" : "-inf";
  return *value;
}

nlohmann::ordered_json side_json(const DiffSide& side) {
  return {{"path", side.path.string()},
          {"bytes", side.bytes},
          {"sha256", side.sha256.hex()},
          {"format", std::string(file_format_name(side.format))}};
}

}  // namespace

std::string CheckpointDiff::text() const {
  std::string out;
  for (const DiffEntry& e : entries) out += entry_line(e) + "\n";
  const std::size_t beyond = beyond_tolerance();
  const std::size_t within = entries.size() - beyond;
  out += concat(same() ? "same" : "different", ": ", a.path.string(), " and ", b.path.string(), ": ");
  if (entries.empty()) {
    out += "no difference";
  } else {
    out += concat(beyond, beyond == 1 ? " difference" : " differences", " beyond tolerance");
    if (within > 0) out += concat(", ", within, " within tolerance");
  }
  out += concat(" (atol ", float_text(atol), ", rtol ", float_text(rtol), "; ", tensors_compared,
                " tensor pairs, ", bytes_compared, " bytes compared in ", files_compared, " files)\n");
  return out;
}

std::string CheckpointDiff::json() const {
  nlohmann::ordered_json out;
  out["a"] = side_json(a);
  out["b"] = side_json(b);
  out["sharded"] = sharded;
  out["atol"] = atol;
  out["rtol"] = rtol;
  out["same"] = same();
  out["summary"] = {{"differences", entries.size()},
                    {"beyond_tolerance", beyond_tolerance()},
                    {"within_tolerance", entries.size() - beyond_tolerance()},
                    {"files_compared", files_compared},
                    {"tensors_compared", tensors_compared},
                    {"bytes_compared", bytes_compared}};
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const DiffEntry& e : entries) {
    nlohmann::ordered_json item;
    item["path"] = e.path;
    item["section"] = e.section;
    item["config_field"] =
        e.config_field ? nlohmann::ordered_json(std::string(config_field_class_name(*e.config_field))) : nullptr;
    item["change"] = std::string(diff_change_name(e.change));
    item["a"] = e.change == DiffChange::added ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.a);
    item["b"] = e.change == DiffChange::removed ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(e.b);
    item["within_tolerance"] = e.within_tolerance;
    item["detail"] = e.detail;
    if (e.deviation) {
      const Deviation& d = *e.deviation;
      item["deviation"] = {{"numel", d.numel},
                           {"unequal", d.unequal},
                           {"differing", d.differing},
                           {"max_abs_deviation", optional_number(d.max_abs_deviation)},
                           {"max_rel_deviation", optional_number(d.max_rel_deviation)},
                           {"max_abs_index", d.max_abs_index},
                           {"first_index", d.first_index}};
    } else {
      item["deviation"] = nullptr;
    }
    list.push_back(std::move(item));
  }
  out["entries"] = std::move(list);
  return out.dump(2) + "\n";
}

}  // namespace holdpoint
