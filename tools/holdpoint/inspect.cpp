#include <cstdio>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "holdpoint/checkpoint_mapping.h"
#include "value_json.h"

namespace holdpoint::cli {

namespace {

struct InspectArguments {
  std::string file;
  bool json = false;
  bool digests = false;
  bool all_records = false;
  std::size_t max_items = 50;
};

struct Totals {
  std::uint64_t tensors = 0;
  std::uint64_t tensor_bytes = 0;
};

void count_tensors(const Value& value, Totals& totals) {
  if (value.is_tensor()) {
    ++totals.tensors;
    totals.tensor_bytes += value.as_tensor().logical_bytes();
  } else if (value.is_sequence()) {
    for (const Value& item : value.as_list()) count_tensors(item, totals);
  } else if (value.is_dict()) {
    for (const auto& entry : value.as_dict()) count_tensors(entry.second, totals);
  }
}

std::string shape_text(const std::vector<std::int64_t>& sizes) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << ']';
  return out.str();
}

std::string scalar_text(const Value& value) {
  switch (value.kind()) {
    case ValueKind::none: return "None";
    case ValueKind::boolean: return value.as_bool() ? "True" : "False";
    case ValueKind::integer: return std::to_string(value.as_int());
    case ValueKind::floating: {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", value.as_double());
      return text;
    }
    case ValueKind::string: {
      const std::string& s = value.as_string();
      return "'" + (s.size() > 60 ? s.substr(0, 57) + "..." : s) + "'";
    }
    case ValueKind::bytes: return "bytes(" + std::to_string(value.as_bytes().size()) + ")";
    default: return {};
  }
}

// Prints the tree, one line per node, eliding long containers.
void print_tree(std::ostream& out, const Value& value, const std::string& label, int depth, std::size_t max_items) {
  const std::string indent(static_cast<std::size_t>(depth) * 2, ' ');
  out << indent << label;
  if (value.is_tensor()) {
    const TensorData& t = value.as_tensor();
    out << "Tensor " << dtype_name(t.dtype) << ' ' << shape_text(t.sizes) << ' ' << t.logical_bytes() << " bytes";
    if (!t.is_contiguous()) out << " (strided view)";
    if (t.requires_grad) out << " requires_grad";
    if (t.is_parameter) out << " Parameter";
    out << '\n';
    return;
  }
  if (value.is_dict()) {
    const Dict& dict = value.as_dict();
    out << value_kind_name(value.kind()) << " (" << dict.size() << " keys)\n";
    std::size_t shown = 0;
    for (const auto& [key, item] : dict) {
      if (shown++ == max_items) {
        out << indent << "  ... " << dict.size() - max_items << " more\n";
        break;
      }
      print_tree(out, item, key.to_string() + ": ", depth + 1, max_items);
    }
    return;
  }
  if (value.is_sequence()) {
    const auto& items = value.as_list();
    out << value_kind_name(value.kind()) << " (" << items.size() << " items)\n";
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i == max_items) {
        out << indent << "  ... " << items.size() - max_items << " more\n";
        break;
      }
      print_tree(out, items[i], "[" + std::to_string(i) + "]: ", depth + 1, max_items);
    }
    return;
  }
  out << scalar_text(value) << '\n';
}

nlohmann::ordered_json markers_json(const FormatMarkers& markers) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!markers.archive_name.empty()) out["archive_name"] = markers.archive_name;
  if (markers.version) out["version"] = *markers.version;
  if (markers.byteorder) out["byteorder"] = *markers.byteorder;
  if (markers.format_version) out["format_version"] = *markers.format_version;
  if (markers.storage_alignment) out["storage_alignment"] = *markers.storage_alignment;
  if (markers.serialization_id) out["serialization_id"] = *markers.serialization_id;
  if (markers.legacy_protocol_version) out["legacy_protocol_version"] = *markers.legacy_protocol_version;
  out["pickle_protocol"] = markers.pickle_protocol;
  out["uses_binfloat"] = markers.uses_binfloat;
  if (!markers.safetensors_metadata.empty()) out["safetensors_metadata"] = markers.safetensors_metadata;
  out["producer"] = markers.producer;
  return out;
}

int run_inspect(const InspectArguments& args) {
  LoadedMapping mapping;
  try {
    LoadOptions options;
    options.progress = terminal_progress("reading " + args.file);
    mapping = load_checkpoint_mapping(args.file, options);
  } catch (const Error& error) {
    std::cerr << (exit_code_for(error.code()) == kExitInvalid ? "invalid: " : "error: ")
              << error_code_name(error.code()) << ": " << error.what() << "\n";
    return exit_code_for(error.code());
  }
  Totals totals;
  count_tensors(mapping.root, totals);
  std::size_t storages = 0;
  for (const RecordInfo& record : mapping.records) {
    if (record.name.starts_with("data/") || record.name.starts_with("storage/") ||
        mapping.format == FileFormat::safetensors) {
      ++storages;
    }
  }

  if (args.json) {
    nlohmann::ordered_json out;
    out["file"] = args.file;
    out["format"] = std::string(file_format_name(mapping.format));
    out["bytes"] = mapping.file_bytes;
    out["sha256"] = mapping.sha256.hex();
    out["markers"] = markers_json(mapping.markers);
    nlohmann::ordered_json records = nlohmann::ordered_json::array();
    for (const RecordInfo& record : mapping.records) {
      records.push_back({{"name", record.name}, {"offset", record.offset}, {"size", record.size}, {"crc32", record.crc32}});
    }
    out["records"] = std::move(records);
    out["summary"] = {{"tensors", totals.tensors}, {"storages", storages}, {"tensor_bytes", totals.tensor_bytes}};
    out["tree"] = value_to_json(mapping.root, args.digests);
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }

  std::ostream& out = std::cout;
  out << "file:     " << args.file << "\n";
  out << "format:   " << file_format_name(mapping.format) << ", " << mapping.file_bytes << " bytes\n";
  out << "sha256:   " << mapping.sha256.hex() << "\n";
  out << "producer: " << mapping.markers.producer << "\n";
  const auto markers = markers_json(mapping.markers);
  out << "markers: ";
  for (const auto& [key, value] : markers.items()) {
    if (key != "producer") out << " " << key << "=" << value.dump();
  }
  out << "\n";
  out << "records (" << mapping.records.size() << "):\n";
  for (std::size_t i = 0; i < mapping.records.size(); ++i) {
    if (!args.all_records && i == 20) {
      out << "  ... " << mapping.records.size() - 20 << " more (--all-records)\n";
      break;
    }
    const RecordInfo& record = mapping.records[i];
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", record.crc32);
    out << "  " << record.name << "  offset " << record.offset << "  size " << record.size;
    if (mapping.format == FileFormat::pytorch_zip) out << "  crc32 " << crc;
    out << "\n";
  }
  out << "summary:  " << totals.tensors << " tensors, " << storages << " storages, " << totals.tensor_bytes
      << " tensor bytes\n";
  out << "tree:\n";
  print_tree(out, mapping.root, "", 1, args.max_items);
  return kExitOk;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InspectArguments>();
  CLI::App* command = app.add_subcommand("inspect", "Show the keys, dtypes, shapes, records and digest of FILE");
  command->add_option("file", args->file, "a .pt or .safetensors file")->required();
  command->add_flag("--json", args->json, "print JSON (the canonical value encoding of docs/cli.md)");
  command->add_flag("--digests", args->digests, "with --json: add the SHA-256 of each tensor's elements");
  command->add_flag("--all-records", args->all_records, "list every record, not just the first 20");
  command->add_option("--max-items", args->max_items, "container items shown per level (default 50)");
  command->callback([args, &exit_code] { exit_code = run_inspect(*args); });
}

}  // namespace holdpoint::cli
