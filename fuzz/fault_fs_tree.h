// Helpers of the fuzz targets that build run directories on the in-memory
// FaultFileSystem (run_directory, sharded_checkpoint).
#pragma once

#include <map>
#include <string>

#include "holdpoint/base/error.h"
#include "support/fault_file_system.h"

namespace holdpoint::fuzz {

// A fuzzed name usable as one directory entry.
inline bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos && name.size() <= 255;
}

// Everything under `path`: "d" for a directory, "f<bytes>" for a file, "o"
// for anything else (a symlink). Two snapshots compare equal when nothing changed.
inline void snapshot(const testing::FaultFileSystem& fs, const std::string& path,
                     std::map<std::string, std::string>& out) {
  if (!fs.exists(path)) return;
  try {
    const auto names = fs.list(path);
    out[path] = "d";
    for (const auto& name : names) snapshot(fs, path + "/" + name, out);
    return;
  } catch (const Error&) {
  }
  try {
    out[path] = "f" + fs.contents(path);
  } catch (const Error&) {
    out[path] = "o";
  }
}

}  // namespace holdpoint::fuzz
