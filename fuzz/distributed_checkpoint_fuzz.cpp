// Fuzz target for load_distributed_checkpoint: a torch.distributed.checkpoint
// folder's .metadata (records, storage_data pairs, planner_data paths, chunk
// geometry) and the byte ranges it points into.
//
// Input layout: up to three parts separated by kSeparator, written into a
// scratch folder as `.metadata`, `__0_0.distcp` and `__1_0.distcp` (a part
// left out is a file left out). The seeds in fuzz/corpus/distributed_checkpoint
// are real folders dcp.save wrote (tests/unit/fixtures/dcp_two_ranks, made by
// tests/python/make_dcp_fixture.py, and a one-process model + Adam state),
// joined this way.
//
// Expected: holdpoint::Error for anything malformed. A crash, a sanitizer
// report or any other exception is a bug, and so is an accepted folder whose
// tensors cannot be read in full.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/error.h"
#include "holdpoint/format/distributed_checkpoint.h"

namespace {

constexpr std::string_view kSeparator = "\n--holdpoint-dcp-file--\n";

// One scratch folder per process, removed at exit (the path is never destroyed,
// so the exit handler can still use it).
const std::filesystem::path& scratch() {
  static const std::filesystem::path* folder = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "holdpoint-dcp-fuzz-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) std::abort();
    auto* path = new std::filesystem::path(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(scratch(), ignored);
    });
    return path;
  }();
  return *folder;
}

void touch_every_tensor(const holdpoint::Value& value) {
  if (value.is_tensor()) {
    if (value.as_tensor().storage->has_bytes()) (void)value.as_tensor().contiguous_bytes();
    return;
  }
  if (value.is_dict()) {
    for (const auto& [key, item] : value.as_dict()) touch_every_tensor(item);
  } else if (value.is_sequence()) {
    for (const auto& item : value.as_list()) touch_every_tensor(item);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const char* names[] = {".metadata", "__0_0.distcp", "__1_0.distcp"};
  std::size_t begin = 0;
  for (const char* name : names) {
    const auto path = scratch() / name;
    std::filesystem::remove(path);
    if (begin > input.size()) continue;
    const auto end = std::min(input.find(kSeparator, begin), input.size());
    std::ofstream(path, std::ios::binary).write(input.data() + begin, static_cast<std::streamsize>(end - begin));
    begin = end + kSeparator.size();
  }
  holdpoint::Limits limits;
  limits.max_pickle_bytes = 1 << 20;
  limits.max_tensor_logical_bytes = 64 << 20;
  limits.max_tensor_numel = 16 << 20;
  try {
    touch_every_tensor(holdpoint::load_distributed_checkpoint(scratch(), limits));
  } catch (const holdpoint::Error&) {
  }
  return 0;
}
