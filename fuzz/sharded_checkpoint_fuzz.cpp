// Fuzz target for the sharded-checkpoint reader (read_sharded_checkpoint,
// ShardedCheckpoint::combined_view) and for run-directory recovery of a
// sharded generation, on the in-memory file system of the tests
// (tests/support/fault_file_system.h, compiled into this target).
//
// A valid 2-rank sharded generation of step 4 is built once: the replicated
// component "model" (three float32 tensors, partitioned with
// partition_replicated) and the rank-local component "sampler"; each rank's
// shard is a .pt of root {"holdpoint": manifest of kind shard, "model": piece,
// "sampler": state}, the step manifest a .pt of root {"holdpoint": manifest of
// kind sharded}. The input mutates it, the result is laid out as
//   /run/checkpoints/step-00000004.pt
//   /run/checkpoints/step-00000004.shards/rank-00000.pt, rank-00001.pt
// and read.
//
// Input layout:
//   byte 0   flags: bits 0-1 the run directory around the generation:
//              0 committed (LATEST, index.json and sidecar name step 4),
//              1 unindexed (step 4's files only: recovery adopts them),
//              2 leftover (step 2, a single-file generation, is committed;
//                step 4 has its shard directory but no step manifest),
//              3 uncommitted (step 2 is committed; step 4 is newer);
//            0x04 recover (else a read-only open),
//            0x08 refresh: the step manifest records the final shards' sizes
//                 and digests (else the valid shards'),
//            0x10 redigest: an edited shard's manifest lists its root's
//                 components with their recomputed digests (after the
//                 chunk-1/2 edits of other paths, before those of
//                 "holdpoint..." paths),
//            0x20 also read rank (flags >> 6) & 1 alone,
//            0x80 ... without recomputing component digests
//   byte 1   injected I/O failure during the run directory's open: 0 none;
//            else operation (byte & 0x1f) fails (EIO/ENOSPC/EDQUOT by
//            (byte >> 6) % 3), and every later one too when byte & 0x20
//   rest     chunks separated by "\xff\x00"; a chunk's first byte picks
//            (mod 10) what its remaining bytes (the body) do:
//              0 an edit "PATH=VALUE" of the step manifest's root value
//              1 an edit of shard 0's root value   2 ... of shard 1's
//              3 the bytes of the step manifest    4 ... of shard 0
//              5 ... of shard 1
//              6 flip the byte at offset (u16 LE of body[1..2]) % size of
//                body[0] % 3: 0 the step manifest, 1 shard 0, 2 shard 1
//              7 a layout change, body[0] % 12: 0 no shard 0, 1 no shard 1,
//                2 swap the shard files, 3 no shard directory, 4 the shard
//                directory is a file, 5 ... a symlink, 6 shard 0 is a
//                symlink, 7 shard 1 is a directory, 8 no step manifest,
//                9 the step manifest is a symlink, 10 an empty file named
//                body[1..] in the shard directory, 11 truncate body[1] % 3
//                (as for 6) to (u16 LE of body[2..3]) % (size + 1) bytes
//              8 a name: an empty file of that name in checkpoints/
//              9 a name: an empty directory of that name in checkpoints/
//            PATH is dot-separated dict keys, each with optional list indices
//            ("holdpoint.sharding.shards[1].size"); a missing last key is
//            added, index == length appends. VALUE: "-" deletes, "None",
//            "True", "False", an integer, a float (with '.'), "[]", "{}",
//            "[a,b]" (a list of such scalars), "tensor" (a new float32 [3]
//            tensor), "'text'" or any other text: a string. Edits apply in
//            order; the last replacement of a file's bytes (3..5) wins over
//            edits, flips and truncations apply after both, in order.
// Fuzzers cannot guess SHA-256 digests, so "$0", "$1" become the hex digest
// and "#0", "#1" the size of shard 0 and 1: in chunks 0 and 3 (the step
// manifest) those of the final shard files, in chunks 1, 2, 4 and 5 those of
// the valid ones.
//
// Expected: holdpoint::Error (a malformed generation, an injected I/O
// failure). A crash, a sanitizer report or any other exception is a bug, and
// so is a broken contract this target checks: the unmodified generation
// reads; a read merges the valid shards back into the saved states; a read
// against the step manifest's own digest agrees with one without it, and one
// against the valid manifest's digest fails once the file changed; a rank
// read alone reads when all ranks do (and cannot be combined); a committed
// generation that reads is
// what recovery keeps as LATEST; recovery removes a leftover or uncommitted
// shard directory; a read-only open changes nothing; a second recovering
// open finds nothing left to repair.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/error.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"
#include "fault_fs_tree.h"
#include "run/run_files.h"
#include "support/fault_file_system.h"

namespace {

using holdpoint::fuzz::plain_name;
using holdpoint::fuzz::snapshot;

using holdpoint::testing::FaultFileSystem;
using holdpoint::testing::FaultKind;

constexpr std::string_view kSeparator("\xff\x00", 2);
constexpr std::int64_t kStep = 4;
constexpr std::int64_t kWorld = 2;
const std::string kRun = "/run";
const std::string kCheckpoints = "/run/checkpoints";

[[noreturn]] void contract_broken() { __builtin_trap(); }

std::string bytes_of(const holdpoint::Value& root) {
  holdpoint::io::MemorySink sink;
  holdpoint::format::write_pt(sink, root);
  const auto& bytes = sink.bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

holdpoint::Sha256Digest digest_of(const std::string& bytes) {
  return holdpoint::Sha256::of(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

holdpoint::Value float_tensor(std::vector<std::int64_t> sizes, float base) {
  std::int64_t numel = 1;
  for (auto s : sizes) numel *= s;
  std::vector<float> values(static_cast<std::size_t>(numel));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = base + 0.25f * static_cast<float>(i);
  return holdpoint::Value::tensor(holdpoint::TensorData::from_bytes(
      holdpoint::DType::float32, std::move(sizes), std::as_bytes(std::span<const float>(values))));
}

// The step manifest's identity, which every shard repeats.
holdpoint::Manifest base_manifest() {
  holdpoint::Manifest manifest;
  manifest.semantic_identity = "sharded-checkpoint-fuzz";
  manifest.config.load_bearing("lr", holdpoint::Value::floating(0.5));
  return manifest;
}

struct Valid {
  holdpoint::Value model;
  std::vector<holdpoint::Value> sampler;      // by rank
  std::vector<holdpoint::Value> shard_roots;  // by rank
  std::vector<std::string> shards;            // bytes, by rank
  std::vector<std::string> shard_hex;
  std::vector<std::string> shard_size;
  std::string manifest;                       // the step manifest's bytes
  std::string older;                          // step 2: a committed single-file generation
};

holdpoint::Sharding sharding_for(const std::vector<std::string>& shards) {
  holdpoint::Sharding sharding;
  sharding.world_size = kWorld;
  sharding.step = kStep;
  sharding.replicated = {"model"};
  sharding.rank_local = {"sampler"};
  for (std::size_t r = 0; r < shards.size(); ++r) {
    sharding.shards.push_back({static_cast<std::int64_t>(r), shards[r].size(), digest_of(shards[r])});
  }
  return sharding;
}

holdpoint::Value step_manifest_root(const std::vector<std::string>& shards) {
  holdpoint::Manifest manifest = base_manifest();
  manifest.kind = holdpoint::CheckpointKind::sharded;
  manifest.sharding = sharding_for(shards);
  holdpoint::Dict root;
  root.insert(std::string(holdpoint::kManifestKey), manifest.to_value());
  return holdpoint::Value::dict(std::move(root));
}

Valid build_valid() {
  using namespace holdpoint;
  Valid v;
  Dict model;
  model.insert("weight", float_tensor({2, 3}, 1.0f));
  model.insert("bias", float_tensor({3}, -4.0f));
  model.insert("scale", float_tensor({4}, 9.0f));
  v.model = Value::ordered_dict(std::move(model));
  const ReplicatedPartition partition = partition_replicated({{"model", v.model}}, kWorld);
  for (std::int64_t rank = 0; rank < kWorld; ++rank) {
    Dict sampler;
    sampler.insert("rank", Value::integer(rank));
    sampler.insert("epoch", Value::integer(1));
    sampler.insert("cursor", Value::integer(kStep * kWorld + rank));
    sampler.insert("seed", Value::integer(17 + rank));
    v.sampler.push_back(Value::dict(std::move(sampler)));
    std::vector<std::pair<std::string, Value>> components = partition.pieces[static_cast<std::size_t>(rank)];
    components.emplace_back("sampler", v.sampler.back());
    Manifest manifest = base_manifest();
    manifest.kind = CheckpointKind::shard;
    manifest.sharding = Sharding{};
    manifest.sharding->world_size = kWorld;
    manifest.sharding->step = kStep;
    manifest.sharding->rank = rank;
    StorageDigests digests;
    for (const auto& [name, state] : components) {
      manifest.components.push_back({name, component_digest(state, digests), Value()});
    }
    Dict root;
    root.insert(std::string(kManifestKey), manifest.to_value());
    for (const auto& [name, state] : components) root.insert(name, state);
    v.shard_roots.push_back(Value::dict(std::move(root)));
    v.shards.push_back(bytes_of(v.shard_roots.back()));
    v.shard_hex.push_back(digest_of(v.shards.back()).hex());
    v.shard_size.push_back(std::to_string(v.shards.back().size()));
  }
  v.manifest = bytes_of(step_manifest_root(v.shards));
  Dict older;
  Manifest older_manifest = base_manifest();
  older.insert(std::string(kManifestKey), older_manifest.to_value());
  v.older = bytes_of(Value::dict(std::move(older)));
  return v;
}

const Valid& valid() {
  static const Valid v = build_valid();
  return v;
}

std::string substitute(std::string_view chunk, const std::vector<std::string>& hex,
                       const std::vector<std::string>& size) {
  std::string out;
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    if ((chunk[i] == '$' || chunk[i] == '#') && i + 1 < chunk.size() && (chunk[i + 1] == '0' || chunk[i + 1] == '1')) {
      const std::size_t r = static_cast<std::size_t>(chunk[i + 1] - '0');
      out += chunk[i] == '$' ? hex[r] : size[r];
      ++i;
    } else {
      out += chunk[i];
    }
  }
  return out;
}

// ---- "PATH=VALUE" edits of a root value ------------------------------------------------

struct Step {
  bool index = false;  // a list index (else a dict key)
  std::string key;
  std::size_t position = 0;
};

std::optional<std::vector<Step>> parse_path(std::string_view path) {
  std::vector<Step> steps;
  std::size_t i = 0;
  while (i < path.size()) {
    std::size_t end = i;
    while (end < path.size() && path[end] != '.' && path[end] != '[') ++end;
    if (end > i) steps.push_back({false, std::string(path.substr(i, end - i)), 0});
    i = end;
    while (i < path.size() && path[i] == '[') {
      const std::size_t close = path.find(']', i);
      if (close == std::string_view::npos || close == i + 1 || close - i > 7) return std::nullopt;
      std::size_t position = 0;
      for (std::size_t k = i + 1; k < close; ++k) {
        if (path[k] < '0' || path[k] > '9') return std::nullopt;
        position = position * 10 + static_cast<std::size_t>(path[k] - '0');
      }
      steps.push_back({true, {}, position});
      i = close + 1;
    }
    if (i < path.size()) {
      if (path[i] != '.') return std::nullopt;
      ++i;
    }
  }
  if (steps.empty()) return std::nullopt;
  return steps;
}

holdpoint::Value parse_scalar(const std::string& text) {
  using holdpoint::Value;
  if (text == "None") return Value::none();
  if (text == "True") return Value::boolean(true);
  if (text == "False") return Value::boolean(false);
  if (text == "tensor") return float_tensor({3}, 0.5f);
  if (text.size() >= 2 && text.front() == '\'' && text.back() == '\'') return Value::string(text.substr(1, text.size() - 2));
  if (!text.empty() && text.size() <= 20) {
    errno = 0;
    char* end = nullptr;
    const long long integer = std::strtoll(text.c_str(), &end, 10);
    if (errno == 0 && end == text.c_str() + text.size()) return Value::integer(integer);
    if (text.find('.') != std::string::npos && text.find_first_of("xXpP") == std::string::npos) {
      end = nullptr;
      const double d = std::strtod(text.c_str(), &end);
      if (end == text.c_str() + text.size()) return Value::floating(d);
    }
  }
  return Value::string(text);
}

holdpoint::Value parse_value(const std::string& text) {
  using holdpoint::Value;
  if (text == "{}") return Value::dict();
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    Value::List items;
    const std::string inner = text.substr(1, text.size() - 2);
    std::size_t begin = 0;
    while (!inner.empty() && begin <= inner.size()) {
      std::size_t end = inner.find(',', begin);
      if (end == std::string::npos) end = inner.size();
      items.push_back(parse_scalar(inner.substr(begin, end - begin)));
      begin = end + 1;
    }
    return Value::list(std::move(items));
  }
  return parse_scalar(text);
}

// `value` with the node at steps[at..] replaced (nullopt: deleted); unchanged
// when the path does not lead anywhere.
holdpoint::Value edited(const holdpoint::Value& value, const std::vector<Step>& steps, std::size_t at,
                        const std::optional<holdpoint::Value>& replacement) {
  using namespace holdpoint;
  const Step& step = steps[at];
  const bool last = at + 1 == steps.size();
  if (!step.index && value.is_dict()) {
    Dict entries;
    bool found = false;
    for (const auto& [key, item] : value.as_dict()) {
      if (key.is_string() && key.as_string() == step.key) {
        found = true;
        if (!last) {
          entries.insert(key, edited(item, steps, at + 1, replacement));
        } else if (replacement) {
          entries.insert(key, *replacement);
        }
      } else {
        entries.insert(key, item);
      }
    }
    if (!found && last && replacement) entries.insert(step.key, *replacement);
    if (value.as_dict().metadata()) entries.set_metadata(*value.as_dict().metadata());
    return value.is_ordered_dict() ? Value::ordered_dict(std::move(entries)) : Value::dict(std::move(entries));
  }
  if (step.index && value.is_sequence()) {
    const Value::List& list = value.as_list();
    Value::List items;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i != step.position) {
        items.push_back(list[i]);
      } else if (!last) {
        items.push_back(edited(list[i], steps, at + 1, replacement));
      } else if (replacement) {
        items.push_back(*replacement);
      }
    }
    if (step.position == list.size() && last && replacement) items.push_back(*replacement);
    return value.is_list() ? Value::list(std::move(items)) : Value::tuple(std::move(items));
  }
  return value;
}

holdpoint::Value apply_edit(const holdpoint::Value& root, const std::string& edit) {
  const std::size_t equals = edit.find('=');
  if (equals == std::string::npos) return root;
  const auto steps = parse_path(std::string_view(edit).substr(0, equals));
  if (!steps) return root;
  const std::string text = edit.substr(equals + 1);
  return edited(root, *steps, 0, text == "-" ? std::nullopt : std::optional<holdpoint::Value>(parse_value(text)));
}

// The shard manifest's components, recomputed from the root's other entries.
holdpoint::Value redigested(const holdpoint::Value& root) {
  using namespace holdpoint;
  if (!root.is_dict()) return root;
  const Value* manifest = root.as_dict().find(kManifestKey);
  if (!manifest || !manifest->is_dict()) return root;
  Dict components;
  StorageDigests digests;
  for (const auto& [key, state] : root.as_dict()) {
    if (!key.is_string() || key.as_string() == kManifestKey) continue;
    Dict entry;
    entry.insert("sha256", Value::string(component_digest(state, digests).hex()));
    entry.insert("contract", Value());
    components.insert(key, Value::dict(std::move(entry)));
  }
  const std::vector<Step> path = {{false, std::string(kManifestKey), 0}, {false, "components", 0}};
  return edited(root, path, 0, Value::dict(std::move(components)));
}

// ---- the file-system layout ----------------------------------------------------------------

enum class Node : std::uint8_t { file, missing, symlink, directory };

struct Layout {
  Node manifest = Node::file;
  Node shard_directory = Node::directory;
  Node shard[2] = {Node::file, Node::file};
  bool swapped = false;
  std::vector<std::string> extra_in_shards;  // empty files in the shard directory
  std::vector<std::pair<std::string, bool>> names;  // checkpoints/ entries: (name, is a directory)
};

struct Outcome {
  bool ok = false;
  std::optional<holdpoint::ErrorCode> code;
};

std::uint16_t u16(std::string_view body, std::size_t at) {
  return static_cast<std::uint16_t>(static_cast<std::uint8_t>(body[at]) |
                                    (static_cast<std::uint8_t>(body[at + 1]) << 8));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace holdpoint;
  if (size < 2) return 0;
  const std::uint8_t flags = data[0];
  const std::uint8_t fault = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const Valid& v = valid();
  const int mode = flags & 0x03;
  const bool recover = flags & 0x04;
  const bool refresh = flags & 0x08;
  const bool redigest = flags & 0x10;

  // ---- the chunks ----
  std::vector<std::string_view> chunks;
  for (std::size_t begin = 0; begin <= rest.size();) {
    std::size_t end = rest.find(kSeparator, begin);
    if (end == std::string_view::npos) end = rest.size();
    if (end > begin) chunks.push_back(rest.substr(begin, end - begin));
    begin = end + kSeparator.size();
  }

  // The shards: edits, replacements, then flips and truncations.
  std::vector<std::string> shards = v.shards;
  for (std::size_t r = 0; r < 2; ++r) {
    std::vector<std::string> edits;
    std::optional<std::string> replaced;
    for (const auto chunk : chunks) {
      const int kind = static_cast<std::uint8_t>(chunk[0]) % 10;
      if (kind == 1 + static_cast<int>(r)) edits.push_back(substitute(chunk.substr(1), v.shard_hex, v.shard_size));
      if (kind == 4 + static_cast<int>(r)) replaced = substitute(chunk.substr(1), v.shard_hex, v.shard_size);
    }
    if (replaced) {
      shards[r] = *replaced;
    } else if (!edits.empty()) {
      Value root = v.shard_roots[r];
      for (const auto& edit : edits) {
        if (!edit.starts_with(kManifestKey)) root = apply_edit(root, edit);
      }
      if (redigest) root = redigested(root);
      for (const auto& edit : edits) {
        if (edit.starts_with(kManifestKey)) root = apply_edit(root, edit);
      }
      try {
        shards[r] = bytes_of(root);
      } catch (const Error&) {
        return 0;  // a root the writer refuses
      }
    }
  }
  std::string manifest;
  Layout layout;
  const auto byte_ops = [&](bool on_manifest) {
    for (const auto chunk : chunks) {
      const int kind = static_cast<std::uint8_t>(chunk[0]) % 10;
      const std::string_view body = chunk.substr(1);
      std::size_t target = 0;
      if (kind == 6 && body.size() >= 3) {
        target = static_cast<std::uint8_t>(body[0]) % 3;
      } else if (kind == 7 && body.size() >= 4 && static_cast<std::uint8_t>(body[0]) % 12 == 11) {
        target = static_cast<std::uint8_t>(body[1]) % 3;
      } else {
        continue;
      }
      if ((target == 0) != on_manifest) continue;
      std::string& bytes = target == 0 ? manifest : shards[target - 1];
      if (kind == 6) {
        if (!bytes.empty()) bytes[u16(body, 1) % bytes.size()] ^= '\xff';
      } else {
        bytes.resize(u16(body, 2) % (bytes.size() + 1));
      }
    }
  };
  byte_ops(false);

  // The step manifest, over the final shards.
  std::vector<std::string> final_hex, final_size;
  for (const auto& shard : shards) {
    final_hex.push_back(digest_of(shard).hex());
    final_size.push_back(std::to_string(shard.size()));
  }
  {
    std::vector<std::string> edits;
    std::optional<std::string> replaced;
    for (const auto chunk : chunks) {
      const int kind = static_cast<std::uint8_t>(chunk[0]) % 10;
      if (kind == 0) edits.push_back(substitute(chunk.substr(1), final_hex, final_size));
      if (kind == 3) replaced = substitute(chunk.substr(1), final_hex, final_size);
    }
    if (replaced) {
      manifest = *replaced;
    } else if (edits.empty() && !refresh) {
      manifest = v.manifest;
    } else {
      Value root = step_manifest_root(refresh ? shards : v.shards);
      for (const auto& edit : edits) root = apply_edit(root, edit);
      try {
        manifest = bytes_of(root);
      } catch (const Error&) {
        return 0;
      }
    }
  }
  byte_ops(true);

  // ---- the layout ----
  for (const auto chunk : chunks) {
    const int kind = static_cast<std::uint8_t>(chunk[0]) % 10;
    const std::string body(chunk.substr(1));
    if (kind == 8 || kind == 9) {
      if (plain_name(body)) layout.names.emplace_back(body, kind == 9);
      continue;
    }
    if (kind != 7 || body.empty()) continue;
    switch (static_cast<std::uint8_t>(body[0]) % 12) {
      case 0: layout.shard[0] = Node::missing; break;
      case 1: layout.shard[1] = Node::missing; break;
      case 2: layout.swapped = !layout.swapped; break;
      case 3: layout.shard_directory = Node::missing; break;
      case 4: layout.shard_directory = Node::file; break;
      case 5: layout.shard_directory = Node::symlink; break;
      case 6: layout.shard[0] = Node::symlink; break;
      case 7: layout.shard[1] = Node::directory; break;
      case 8: layout.manifest = Node::missing; break;
      case 9: layout.manifest = Node::symlink; break;
      case 10:
        if (plain_name(body.substr(1))) layout.extra_in_shards.push_back(body.substr(1));
        break;
      case 11: break;  // a truncation, applied above
    }
  }
  if (layout.swapped) std::swap(shards[0], shards[1]);
  if (mode == 2) layout.manifest = Node::missing;

  const std::string manifest_name = generation_name(kStep);
  const std::string shards_name = shard_directory_name(kStep);
  const std::string shards_path = kCheckpoints + "/" + shards_name;
  FaultFileSystem fs;
  GenerationInfo generation;
  generation.name = manifest_name;
  generation.step = kStep;
  generation.size = manifest.size();
  generation.sha256 = digest_of(manifest);
  generation.world_size = kWorld;
  GenerationInfo older;
  older.name = generation_name(2);
  older.step = 2;
  older.size = v.older.size();
  older.sha256 = digest_of(v.older);
  try {
    fs.open_directory(kCheckpoints, true);
    if (layout.manifest == Node::file) fs.write_file(kCheckpoints + "/" + manifest_name, manifest);
    if (layout.manifest == Node::symlink) fs.plant_symlink(kCheckpoints, manifest_name, "elsewhere");
    if (layout.shard_directory == Node::directory) {
      fs.open_directory(shards_path, true);
      for (std::size_t r = 0; r < 2; ++r) {
        const std::string name = shard_file_name(static_cast<std::int64_t>(r));
        switch (layout.shard[r]) {
          case Node::file: fs.write_file(shards_path + "/" + name, shards[r]); break;
          case Node::symlink: fs.plant_symlink(shards_path, name, "../" + manifest_name); break;
          case Node::directory: fs.open_directory(shards_path + "/" + name, true); break;
          case Node::missing: break;
        }
      }
      for (const auto& name : layout.extra_in_shards) {
        if (!fs.exists(shards_path + "/" + name)) fs.write_file(shards_path + "/" + name, "");
      }
    } else if (layout.shard_directory == Node::file) {
      fs.write_file(shards_path, shards[0]);
    } else if (layout.shard_directory == Node::symlink) {
      fs.plant_symlink(kCheckpoints, shards_name, "elsewhere");
    }
    if (mode == 0) {
      fs.write_file(kCheckpoints + "/" + manifest_name + ".sha256", generation.sha256.hex() + "  " + manifest_name + "\n");
      fs.write_file(kRun + "/" + std::string(kRunIndex), run_index_text({generation}));
      fs.write_file(kRun + "/" + std::string(kLatestPointer), run_pointer_text(generation));
    } else if (mode >= 2) {
      fs.write_file(kCheckpoints + "/" + older.name, v.older);
      fs.write_file(kCheckpoints + "/" + older.name + ".sha256", older.sha256.hex() + "  " + older.name + "\n");
      fs.write_file(kRun + "/" + std::string(kRunIndex), run_index_text({older}));
      fs.write_file(kRun + "/" + std::string(kLatestPointer), run_pointer_text(older));
    }
    for (const auto& [name, directory] : layout.names) {
      if (fs.exists(kCheckpoints + "/" + name)) continue;
      if (directory) {
        fs.open_directory(kCheckpoints + "/" + name, true);
      } else {
        fs.write_file(kCheckpoints + "/" + name, "");
      }
    }
  } catch (const Error&) {
    return 0;  // a layout the file system double cannot hold
  }
  // What the reader finds (names of chunks 8 and 9 may stand in for missing files).
  const auto on_disk = [&](const std::string& path) -> std::optional<std::string> {
    try {
      return fs.contents(path);
    } catch (const Error&) {
      return std::nullopt;  // missing, a directory or a symlink
    }
  };
  const std::optional<std::string> manifest_on_disk = on_disk(kCheckpoints + "/" + manifest_name);
  const bool manifest_pristine = manifest_on_disk == v.manifest;
  bool shards_pristine = true;
  for (std::int64_t r = 0; r < kWorld; ++r) {
    shards_pristine = shards_pristine && on_disk(shards_path + "/" + shard_file_name(r)) == v.shards[static_cast<std::size_t>(r)];
  }

  // ---- read_sharded_checkpoint ----
  ShardedReadOptions options;
  options.limits.max_file_bytes = 1 << 20;
  const auto read = [&](const ShardedReadOptions& o, std::optional<ShardedCheckpoint>* out) {
    Outcome outcome;
    try {
      auto directory = fs.open_directory(kCheckpoints, false);
      ShardedCheckpoint checkpoint = read_sharded_checkpoint(*directory, manifest_name, o);
      outcome.ok = true;
      if (out) *out = std::move(checkpoint);
    } catch (const Error& error) {
      outcome.code = error.code();
    }
    return outcome;
  };
  std::optional<ShardedCheckpoint> loaded;
  const Outcome plain = read(options, &loaded);
  if (manifest_pristine && shards_pristine && !plain.ok) contract_broken();
  if (loaded) {
    try {
      const Value view = loaded->combined_view();
      const Sharding& sharding = loaded->sharding();
      for (const auto& name : sharding.replicated) {
        if (!view.as_dict().find(name)) contract_broken();
      }
      for (std::int64_t r = 0; r < sharding.world_size; ++r) {
        for (const auto& name : sharding.rank_local) {
          if (!view.as_dict().find(name + "@rank" + std::to_string(r))) contract_broken();
        }
      }
      if (shards_pristine) {
        // The valid shards give back the saved states: the merged model, and
        // each rank's components as it saved them (whatever the step
        // manifest calls replicated or rank-local).
        for (const auto& name : sharding.replicated) {
          if (name == "model" && !equal_content(view.as_dict().at(name), v.model)) contract_broken();
        }
        for (std::int64_t r = 0; r < sharding.world_size; ++r) {
          const Value& saved = v.shard_roots[static_cast<std::size_t>(r)];
          for (const auto& name : sharding.rank_local) {
            if (!equal_content(view.as_dict().at(name + "@rank" + std::to_string(r)), saved.as_dict().at(name))) {
              contract_broken();
            }
          }
        }
        if (sharding.replicated == std::vector<std::string>{"model"} &&
            sharding.rank_local == std::vector<std::string>{"sampler"}) {
          for (std::int64_t r = 0; r < kWorld; ++r) {
            if (!equal_content(view.as_dict().at("sampler@rank" + std::to_string(r)),
                               v.sampler[static_cast<std::size_t>(r)])) {
              contract_broken();
            }
          }
        }
      }
      (void)loaded->total_bytes();
    } catch (const Error&) {
      // shard_piece_conflict: pieces that each verify but do not merge.
    }
  }
  // Against the step manifest's own digest: the same outcome.
  {
    ShardedReadOptions o = options;
    if (manifest_on_disk) o.expected_sha256 = digest_of(*manifest_on_disk);
    const Outcome checked = read(o, nullptr);
    if (checked.ok != plain.ok || checked.code != plain.code) contract_broken();
  }
  // Against the valid step manifest's digest: fails unless it is that file.
  if (!manifest_pristine) {
    ShardedReadOptions o = options;
    o.expected_sha256 = digest_of(v.manifest);
    if (read(o, nullptr).ok) contract_broken();
  }
  // One rank alone.
  if (flags & 0x20) {
    ShardedReadOptions o = options;
    const std::int64_t rank = (flags >> 6) & 0x01;
    o.ranks = {rank};
    o.check_component_digests = !(flags & 0x80);
    std::optional<ShardedCheckpoint> one;
    const Outcome alone = read(o, &one);
    if (plain.ok && !alone.ok) contract_broken();
    if (one) {
      try {
        (void)one->combined_view();
        contract_broken();  // needs every shard
      } catch (const Error& error) {
        if (error.code() != ErrorCode::invalid_argument) contract_broken();
      }
      if (loaded) {
        for (const auto& name : one->sharding().rank_local) {
          if (!equal_content(one->rank_local(name, rank), loaded->rank_local(name, rank))) contract_broken();
        }
      }
    }
  }

  // ---- run-directory recovery ----
  RunDirectoryOptions run_options;
  run_options.file_system = &fs;
  run_options.recover = recover;
  run_options.durable = true;
  run_options.limits.max_file_bytes = 1 << 20;
  if (fault & 0x1f) fs.fail_at(fault & 0x1f, static_cast<FaultKind>((fault >> 6) % 3), (fault & 0x20) != 0);
  std::map<std::string, std::string> before;
  if (!recover) snapshot(fs, kRun, before);
  std::optional<std::string> first_latest;
  bool opened = false;
  try {
    RunDirectory directory(kRun, run_options);
    opened = true;
    const auto& report = directory.recovery();
    (void)report.clean();
    (void)report.lines();
    const auto latest = directory.latest();
    if (latest) first_latest = latest->name;
    if ((fault & 0x1f) == 0) {
      // A committed generation that reads is the one recovery keeps.
      if (mode == 0 && plain.ok && (!latest || latest->name != manifest_name)) contract_broken();
      // A shard directory without a committed step manifest is removed.
      if (recover && mode >= 2 && layout.shard_directory == Node::directory && fs.exists(shards_path)) contract_broken();
    }
    (void)directory.verify_all();
    if (latest) (void)directory.load(*latest);
  } catch (const Error&) {
    // Rejection with a code is the expected outcome for damaged directories.
  }

  if (!recover) {
    std::map<std::string, std::string> after;
    snapshot(fs, kRun, after);
    if (after != before) contract_broken();  // a read-only open changed the directory
  } else if (opened && (fault & 0x1f) == 0) {
    // Recovery repaired everything it could: opening again repairs nothing.
    try {
      RunDirectory again(kRun, run_options);
      const auto& report = again.recovery();
      if (!report.removed_staging.empty() || !report.removed_uncommitted.empty() || !report.damaged.empty() ||
          !report.quarantined.empty() || !report.removed_orphan_sidecars.empty() || !report.adopted.empty() ||
          !report.dropped_from_index.empty() || report.latest_rewritten || report.best_rewritten ||
          report.index_rewritten) {
        contract_broken();
      }
      const auto latest = again.latest();
      if ((latest ? std::optional<std::string>(latest->name) : std::nullopt) != first_latest) contract_broken();
    } catch (const Error&) {
    }
  }
  return 0;
}
