// Fuzz target for the step manifest of a torch.distributed.checkpoint
// generation (kind "dcp", holdpoint/run/dcp_generation.h) against a fixed,
// valid folder on disk: the fixture DCP itself wrote
// (tests/unit/fixtures/dcp_two_ranks), republished item by item into a fresh
// temporary directory at start-up.
//
// Input: the bytes of a step manifest file (a holdpoint .pt whose root is
// {"holdpoint": manifest}). It is parsed by the restricted reader, its
// manifest read (Manifest::of_root, the "dcp" field's rules), and, when it is
// of kind dcp, the folder is checked against it by verify_dcp_generation,
// with and without hashing the data files, and every range it lists is read
// by read_dcp_ranges.
//
// Oracles besides the sanitizers: only holdpoint::Error escapes; a manifest
// that passes the check lists exactly the folder's files at their true sizes,
// and one that passes the hashing check (or whose range reads pass) records
// the true SHA-256 of every range: a fuzzer cannot make the folder verify
// against digests it did not copy from the valid manifest.
//
// HOLDPOINT_DCP_FUZZ_WRITE_SEED=<file> writes the valid step manifest there
// (fuzz/corpus/dcp_generation/01-valid) and exits.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/run/dcp_generation.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "schema/component_writer.h"

namespace {

using namespace holdpoint;

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

struct Fixture {
  std::filesystem::path root;
  std::filesystem::path checkpoints;
  std::filesystem::path folder;
  Manifest valid;
  std::map<std::string, std::vector<std::byte>> files;  // the folder's true bytes
  std::unique_ptr<io::Directory> directory;

  Fixture() {
    char pattern[] = "/tmp/holdpoint-dcp-fuzz-XXXXXX";
    if (!::mkdtemp(pattern)) std::abort();
    root = pattern;
    checkpoints = root / "checkpoints";
    folder = checkpoints / shard_directory_name(5);
    std::filesystem::create_directories(folder);
    const std::filesystem::path source = std::filesystem::path(HOLDPOINT_SOURCE_DIR) / "tests" / "unit" / "fixtures" /
                                         "dcp_two_ranks";
    DcpLayout layout;
    layout.step = 5;
    layout.world_size = 2;
    std::map<std::string, std::vector<DcpItemLocation>> by_file;
    const Value metadata = read_distributed_checkpoint_metadata(source);
    for (auto& item : distributed_checkpoint_item_locations(metadata, source / ".metadata")) {
      by_file[item.file].push_back(item);
    }
    DcpWriteOptions options;
    options.durable = false;
    for (auto& [name, items] : by_file) {
      std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
      files[name] = read_file(source / name);
      std::vector<DcpItem> plan;
      for (const auto& item : items) plan.push_back({std::span(files[name]).subspan(item.offset, item.length), nullptr});
      layout.files.push_back(write_dcp_file(folder, name, plan, options));
    }
    files[".metadata"] = read_file(source / ".metadata");
    const DcpItem whole{files[".metadata"], nullptr};
    layout.files.push_back(write_dcp_file(folder, ".metadata", std::span(&whole, 1), options));
    std::sort(layout.files.begin(), layout.files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    valid.kind = CheckpointKind::dcp;
    valid.dcp = std::move(layout);
    directory = io::posix_file_system().open_directory(checkpoints, false);
  }
  ~Fixture() {
    std::error_code ignored;
    std::filesystem::remove_all(root, ignored);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// The listed files are exactly the folder's, at their true sizes.
void require_true_listing(const Fixture& f, const DcpLayout& layout) {
  if (layout.files.size() != f.files.size()) std::abort();
  for (const DcpFile& file : layout.files) {
    const auto it = f.files.find(file.name);
    if (it == f.files.end() || it->second.size() != file.size) std::abort();
  }
}

void require_true_digest(const Fixture& f, const DcpFile& file, const DcpRange& range) {
  const std::vector<std::byte>& bytes = f.files.at(file.name);
  if (Sha256::of(std::span(bytes).subspan(range.offset, range.length)) != range.sha256) std::abort();
}

void check(const Fixture& f, const Manifest& manifest, bool hash_data) {
  try {
    verify_dcp_generation(*f.directory, manifest, {}, hash_data);
  } catch (const Error&) {
    return;
  }
  require_true_listing(f, *manifest.dcp);
  if (!hash_data) return;
  for (const DcpFile& file : manifest.dcp->files) {
    for (const DcpRange& range : file.ranges) require_true_digest(f, file, range);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Fixture& f = fixture();
  if (const char* seed = std::getenv("HOLDPOINT_DCP_FUZZ_WRITE_SEED")) {
    io::MemorySink sink;
    schema::write_components(sink, f.valid, {});
    std::ofstream out(seed, std::ios::binary);
    out.write(reinterpret_cast<const char*>(sink.bytes().data()), static_cast<std::streamsize>(sink.bytes().size()));
    std::exit(0);
  }
  auto bytes = std::make_shared<std::vector<std::byte>>(size);
  if (size) std::memcpy(bytes->data(), data, size);
  Manifest manifest;
  try {
    const LoadedMapping mapping = parse_checkpoint_bytes(*bytes, bytes);
    manifest = Manifest::of_root(mapping.root);
  } catch (const Error&) {
    return 0;
  }
  if (manifest.kind != CheckpointKind::dcp) {
    if (manifest.dcp) std::abort();  // the field belongs to kind dcp only
    return 0;
  }
  if (!manifest.dcp) std::abort();
  check(f, manifest, false);
  check(f, manifest, true);
  for (const DcpFile& file : manifest.dcp->files) {
    for (std::size_t i = 0; i < file.ranges.size() && i < 64; ++i) {
      try {
        read_dcp_ranges(f.folder, file, std::span(&i, 1));
      } catch (const Error&) {
        continue;
      }
      require_true_digest(f, file, file.ranges[i]);
    }
  }
  return 0;
}
