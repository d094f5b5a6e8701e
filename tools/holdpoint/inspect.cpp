#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/run/sharded_checkpoint.h"
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
  if (value.is_sparse_tensor()) {
    for (const Value& part : value.as_sparse_tensor().parts) count_tensors(part, totals);
  } else if (value.is_tensor()) {
    ++totals.tensors;
    totals.tensor_bytes += value.as_tensor().logical_bytes();
  } else if (value.is_sequence()) {
    for (const Value& item : value.as_list()) count_tensors(item, totals);
  } else if (value.is_dict()) {
    for (const auto& entry : value.as_dict()) count_tensors(entry.second, totals);
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
    if (t.conjugate) out << " conj";
    if (t.negative) out << " neg";
    if (t.from_numpy) out << " (NumPy array)";
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
  out << scalar_text(value, 60) << '\n';
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

int report_rejected(const Error& error) {
  std::cerr << (exit_code_for(error.code()) == kExitInvalid ? "invalid: " : "error: ")
            << error_code_name(error.code()) << ": " << error.what() << "\n";
  return exit_code_for(error.code());
}

std::size_t count_storages(const LoadedMapping& mapping) {
  std::size_t storages = 0;
  for (const RecordInfo& record : mapping.records) {
    if (record.name.starts_with("data/") || record.name.starts_with("storage/") ||
        mapping.format == FileFormat::safetensors) {
      ++storages;
    }
  }
  return storages;
}

// A step manifest read with its shards (docs/distributed.md): the tree shown
// is the manifest plus the combined view of the shards' components.
struct ShardedView {
  ShardedCheckpoint checkpoint;
  Value tree;
  std::size_t storages = 0;
};

std::filesystem::path shard_path(const std::string& manifest_file, const Sharding& sharding, std::int64_t rank) {
  return std::filesystem::path(manifest_file).parent_path() / shard_directory_name(sharding.step) /
         shard_file_name(rank);
}

nlohmann::ordered_json sharding_json(const InspectArguments& args, const ShardedView& view) {
  const ShardedCheckpoint& checkpoint = view.checkpoint;
  const Sharding& sharding = checkpoint.sharding();
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  for (const ShardRecord& record : sharding.shards) {
    const LoadedMapping& shard = *checkpoint.shards.at(static_cast<std::size_t>(record.rank));
    std::vector<std::string> components;
    for (const auto& [key, value] : shard.root.as_dict()) {
      if (!(key.is_string() && key.as_string() == kManifestKey)) components.push_back(key.is_string() ? key.as_string() : key.to_string());
    }
    shards.push_back({{"rank", record.rank},
                      {"name", shard_directory_name(sharding.step) + "/" + shard_file_name(record.rank)},
                      {"file", shard_path(args.file, sharding, record.rank).string()},
                      {"size", record.size},
                      {"sha256", record.sha256.hex()},
                      {"format", std::string(file_format_name(shard.format))},
                      {"record_count", shard.records.size()},
                      {"components", std::move(components)}});
  }
  return {{"world_size", sharding.world_size},
          {"step", sharding.step},
          {"replicated", sharding.replicated},
          {"rank_local", sharding.rank_local},
          {"total_bytes", checkpoint.total_bytes()},
          {"shards", std::move(shards)}};
}

// A torch.distributed.checkpoint folder, as holdpoint.load reads it: every
// item read (there is no streaming reader for DCP) and the tree shown.
int inspect_distributed_checkpoint(const InspectArguments& args) {
  Value tree;
  try {
    tree = load_distributed_checkpoint(args.file);
  } catch (const Error& error) {
    return report_rejected(error);
  }
  Totals totals;
  count_tensors(tree, totals);
  if (args.json) {
    nlohmann::ordered_json out;
    out["file"] = args.file;
    out["format"] = "torch.distributed.checkpoint";
    out["sha256"] = nullptr;
    out["summary"] = {{"tensors", totals.tensors}, {"tensor_bytes", totals.tensor_bytes}};
    out["tree"] = value_to_json(tree, args.digests);
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::ostream& out = std::cout;
  out << "file:     " << args.file << "\n";
  out << "format:   torch.distributed.checkpoint folder (.metadata and its items, each read by the restricted "
         "reader; a DCP folder carries no digest)\n";
  out << "summary:  " << totals.tensors << " tensors, " << totals.tensor_bytes << " tensor bytes\n";
  out << "tree:\n";
  print_tree(out, tree, "", 1, args.max_items);
  return kExitOk;
}

int run_inspect(const InspectArguments& args) {
  if (is_distributed_checkpoint(args.file)) return inspect_distributed_checkpoint(args);
  LoadedMapping mapping;
  std::optional<ShardedView> sharded;
  try {
    LoadOptions options;
    options.progress = terminal_progress("reading " + args.file);
    options.compute_sha256 = true;  // the report names the file's SHA-256
    // Without --digests no tensor byte is shown, so the file is streamed and
    // memory stays bounded whatever its size; --digests needs the bytes.
    mapping = args.digests ? load_checkpoint_mapping(args.file, options) : scan_checkpoint(args.file, options);
    if (is_sharded_manifest(mapping)) {
      if (!args.digests) {
        // A step manifest is small, and its manifest may hold tensors whose
        // bytes are read (floats of a torch 1.13-compatible file).
        LoadOptions manifest_options;
        manifest_options.expected_sha256 = mapping.sha256;
        mapping = load_checkpoint_mapping(args.file, manifest_options);
      }
      // The shards are read (sizes, SHA-256, identity, component digests)
      // against the step manifest just read, which must not have changed.
      ShardedReadOptions read_options;
      read_options.expected_sha256 = mapping.sha256;
      ShardedView view{read_sharded_checkpoint(args.file, read_options), Value(), 0};
      Dict tree;
      tree.insert(std::string(kManifestKey), mapping.root.as_dict().at(std::string(kManifestKey)));
      const Value combined = view.checkpoint.combined_view();
      for (const auto& [key, value] : combined.as_dict()) tree.insert(key, value);
      view.tree = Value::dict(std::move(tree));
      for (const auto& shard : view.checkpoint.shards) view.storages += count_storages(*shard);
      sharded = std::move(view);
    }
  } catch (const Error& error) {
    return report_rejected(error);
  }
  const Value& tree = sharded ? sharded->tree : mapping.root;
  Totals totals;
  count_tensors(tree, totals);
  const std::size_t storages = sharded ? sharded->storages : count_storages(mapping);

  if (args.json) {
    nlohmann::ordered_json out;
    out["file"] = args.file;
    out["format"] = std::string(file_format_name(mapping.format));
    out["bytes"] = mapping.file_bytes;
    out["sha256"] = mapping.sha256->hex();
    out["markers"] = markers_json(mapping.markers);
    nlohmann::ordered_json records = nlohmann::ordered_json::array();
    for (const RecordInfo& record : mapping.records) {
      records.push_back({{"name", record.name}, {"offset", record.offset}, {"size", record.size}, {"crc32", record.crc32}});
    }
    out["records"] = std::move(records);
    if (sharded) out["sharding"] = sharding_json(args, *sharded);
    out["summary"] = {{"tensors", totals.tensors}, {"storages", storages}, {"tensor_bytes", totals.tensor_bytes}};
    out["tree"] = value_to_json(tree, args.digests);
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }

  std::ostream& out = std::cout;
  out << "file:     " << args.file << "\n";
  out << "format:   " << file_format_name(mapping.format) << ", " << mapping.file_bytes << " bytes\n";
  out << "sha256:   " << mapping.sha256->hex() << "\n";
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
  if (sharded) {
    const ShardedCheckpoint& checkpoint = sharded->checkpoint;
    const Sharding& sharding = checkpoint.sharding();
    const auto names = [](const std::vector<std::string>& list) {
      std::string text;
      for (const auto& name : list) text += (text.empty() ? "" : ", ") + name;
      return text.empty() ? std::string("(none)") : text;
    };
    out << "sharding: step manifest of a sharded generation, world size " << sharding.world_size << ", step "
        << sharding.step << "\n";
    out << "  replicated: " << names(sharding.replicated) << "\n";
    out << "  rank-local: " << names(sharding.rank_local) << "\n";
    out << "  shards (" << sharding.shards.size() << ", " << checkpoint.total_bytes()
        << " bytes with the manifest; each size, SHA-256, identity and component digest checked):\n";
    for (const ShardRecord& record : sharding.shards) {
      out << "    rank " << record.rank << "  " << shard_path(args.file, sharding, record.rank).string() << "  "
          << record.size << " bytes  sha256 " << record.sha256.hex() << "\n";
    }
  }
  out << "summary:  " << totals.tensors << " tensors, " << storages << " storages, " << totals.tensor_bytes
      << " tensor bytes" << (sharded ? " (all shards)" : "") << "\n";
  out << (sharded ? "tree (the manifest, replicated components merged from the shards, rank-local ones as "
                    "<name>@rank<r>):\n"
                  : "tree:\n");
  print_tree(out, tree, "", 1, args.max_items);
  return kExitOk;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InspectArguments>();
  CLI::App* command = app.add_subcommand("inspect", "Show the keys, dtypes, shapes, records and digest of FILE");
  command->add_option("file", args->file, "a .pt or .safetensors file, or a torch.distributed.checkpoint folder")
      ->required();
  command->add_flag("--json", args->json, "print JSON (the canonical value encoding of docs/cli.md)");
  command->add_flag("--digests", args->digests,
                    "with --json: add the SHA-256 of each tensor's elements (reads FILE whole into memory; without "
                    "it, inspect streams FILE in bounded memory)");
  command->add_flag("--all-records", args->all_records, "list every record, not just the first 20");
  command->add_option("--max-items", args->max_items, "container items shown per level (default 50)");
  command->callback([args, &exit_code] { exit_code = run_inspect(*args); });
}

}  // namespace holdpoint::cli
