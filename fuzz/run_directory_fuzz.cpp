// Fuzz target for run-directory recovery (RunDirectory's constructor and its
// queries): index.json, the LATEST and BEST pointers, the sha256sum sidecars
// and generation names, on the in-memory file system of the tests
// (tests/support/fault_file_system.h, compiled into this target).
//
// Input layout:
//   byte 0   flags: 0x01 recover (else read-only), 0x02 best metric "loss",
//            0x04 higher is better, 0x08 omit step-00000001.pt, 0x10 omit
//            step-00000002.pt, 0x20 add a valid step-00000003.pt, 0x40/0x80
//            the retention policy plan_gc is asked about
//   byte 1   injected I/O failure: 0 none; else operation (byte & 0x1f) of
//            the run directory fails (EIO/ENOSPC/EDQUOT by (byte >> 6) % 3),
//            and every later one too when byte & 0x20
//   rest     chunks separated by "\xff\x00"; a chunk's first byte picks
//            (mod 10) what its remaining bytes become:
//              0 index.json        1 LATEST        2 BEST
//              3 checkpoints/step-00000001.pt.sha256
//              4 checkpoints/step-00000002.pt.sha256
//              5 a name: parse_generation_name, and a file of that name in
//                checkpoints/ holding valid generation bytes (step 3's)
//              6 the bytes of checkpoints/step-00000003.pt (any content)
//              7 a name: an empty file of that name in the run directory
//              8 flip the byte of step-00000001.pt at offset (u16 LE) % size
//              9 a name: a symlink of that name in checkpoints/
// Fuzzers cannot guess SHA-256 digests, so in every chunk "$1", "$2", "$3"
// become the hex digest and "#1", "#2", "#3" the size of the valid generation
// files of steps 1, 2, 3 (built once, as tests/unit/run_directory_test.cpp's
// checkpoint_bytes() does).
//
// Expected: holdpoint::Error (a malformed run directory, an injected I/O
// failure, an unreadable generation). A crash, a sanitizer report or any
// other exception is a bug, and so is a broken contract this target checks:
// a read-only open changes nothing, a generation name has one spelling, and a
// second recovering open finds nothing left to repair.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/error.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/base/byte_sink.h"
#include "fault_fs_tree.h"
#include "support/fault_file_system.h"

namespace {

using holdpoint::fuzz::plain_name;
using holdpoint::fuzz::snapshot;

using holdpoint::testing::FaultFileSystem;
using holdpoint::testing::FaultKind;

constexpr std::string_view kRun = "/run";
constexpr std::string_view kSeparator("\xff\x00", 2);

struct Generation {
  std::string bytes;
  std::string hex;
  std::string size;
};

Generation generation(std::int64_t step) {
  using namespace holdpoint;
  Dict root;
  Manifest manifest;
  manifest.semantic_identity = "run-directory-fuzz";
  root.insert(std::string(kManifestKey), manifest.to_value());
  std::vector<std::int64_t> payload(8);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = step * 1000 + static_cast<std::int64_t>(i);
  root.insert("payload", Value::tensor(TensorData::from_bytes(
                             DType::int64, {8}, std::as_bytes(std::span<const std::int64_t>(payload)))));
  root.insert("step", Value::integer(step));
  io::MemorySink sink;
  format::write_pt(sink, Value::dict(std::move(root)));
  const auto& bytes = sink.bytes();
  Generation g;
  g.bytes.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  g.hex = Sha256::of(bytes).hex();
  g.size = std::to_string(bytes.size());
  return g;
}

const std::vector<Generation>& generations() {
  static const std::vector<Generation> all = {generation(1), generation(2), generation(3)};
  return all;
}

std::string substitute(std::string_view chunk) {
  std::string out;
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    if ((chunk[i] == '$' || chunk[i] == '#') && i + 1 < chunk.size() && chunk[i + 1] >= '1' && chunk[i + 1] <= '3') {
      const Generation& g = generations()[chunk[i + 1] - '1'];
      out += chunk[i] == '$' ? g.hex : g.size;
      ++i;
    } else {
      out += chunk[i];
    }
  }
  return out;
}

[[noreturn]] void contract_broken() { __builtin_trap(); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace holdpoint;
  if (size < 2) return 0;
  const std::uint8_t flags = data[0];
  const std::uint8_t fault = data[1];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const auto& valid = generations();

  FaultFileSystem fs;
  const std::string run(kRun);
  const std::string checkpoints = run + "/checkpoints";
  std::optional<std::string> name_chunk;
  try {
    if (!(flags & 0x08)) fs.write_file(checkpoints + "/step-00000001.pt", valid[0].bytes);
    if (!(flags & 0x10)) fs.write_file(checkpoints + "/step-00000002.pt", valid[1].bytes);
    if (flags & 0x20) fs.write_file(checkpoints + "/step-00000003.pt", valid[2].bytes);
    std::size_t begin = 0;
    while (begin <= rest.size()) {
      std::size_t end = rest.find(kSeparator, begin);
      if (end == std::string_view::npos) end = rest.size();
      const std::string_view chunk = rest.substr(begin, end - begin);
      begin = end + kSeparator.size();
      if (chunk.empty()) continue;
      const std::string body = substitute(chunk.substr(1));
      switch (static_cast<std::uint8_t>(chunk[0]) % 10) {
        case 0: fs.write_file(run + "/index.json", body); break;
        case 1: fs.write_file(run + "/LATEST", body); break;
        case 2: fs.write_file(run + "/BEST", body); break;
        case 3: fs.write_file(checkpoints + "/step-00000001.pt.sha256", body); break;
        case 4: fs.write_file(checkpoints + "/step-00000002.pt.sha256", body); break;
        case 5:
          name_chunk = body;
          if (plain_name(body)) fs.write_file(checkpoints + "/" + body, valid[2].bytes);
          break;
        case 6: fs.write_file(checkpoints + "/step-00000003.pt", body); break;
        case 7:
          if (plain_name(body)) fs.write_file(run + "/" + body, "");
          break;
        case 8:
          if (body.size() >= 2 && fs.exists(checkpoints + "/step-00000001.pt")) {
            const std::size_t length = fs.contents(checkpoints + "/step-00000001.pt").size();
            const std::size_t offset = static_cast<std::uint8_t>(body[0]) | (static_cast<std::uint8_t>(body[1]) << 8);
            if (length > 0) fs.corrupt(checkpoints + "/step-00000001.pt", offset % length);
          }
          break;
        case 9:
          if (plain_name(body) && !fs.exists(checkpoints + "/" + body)) fs.plant_symlink(checkpoints, body, "elsewhere");
          break;
      }
    }
  } catch (const Error&) {
    return 0;  // a layout the file system double cannot hold (a file under a symlink's name)
  }

  if (name_chunk) {
    if (const auto step = parse_generation_name(*name_chunk)) {
      if (*step < 0 || generation_name(*step) != *name_chunk) contract_broken();
    }
  }

  RunDirectoryOptions options;
  options.file_system = &fs;
  options.recover = flags & 0x01;
  options.durable = true;
  if (flags & 0x02) options.best_metric = BestMetric{"loss", (flags & 0x04) != 0};
  options.limits.max_file_bytes = 1 << 20;
  RetentionPolicy policy;
  policy.keep_last = (flags >> 6) & 0x03;
  policy.keep_every = (flags >> 6) & 0x01 ? 2 : 0;
  policy.keep_best = (flags >> 7) & 0x01;
  if (fault & 0x1f) {
    fs.fail_at(fault & 0x1f, static_cast<FaultKind>((fault >> 6) % 3), (fault & 0x20) != 0);
  }

  std::map<std::string, std::string> before;
  if (!options.recover) snapshot(fs, run, before);
  std::optional<std::string> first_latest;
  bool opened = false;
  try {
    RunDirectory directory(std::string(kRun), options);
    opened = true;
    const auto& report = directory.recovery();
    (void)report.clean();
    (void)report.lines();
    for (const auto& g : directory.generations()) {
      if (directory.find(g.name).has_value() != true) contract_broken();
      (void)g.metric("loss");
    }
    const auto latest = directory.latest();
    if (latest) first_latest = latest->name;
    (void)directory.best();
    (void)directory.verify_all();
    (void)directory.plan_gc(policy);
    if (latest) (void)directory.load(*latest);
  } catch (const Error&) {
    // Rejection with a code is the expected outcome for most inputs.
  }

  if (!options.recover) {
    std::map<std::string, std::string> after;
    snapshot(fs, run, after);
    if (after != before) contract_broken();  // a read-only open changed the directory
  } else if (opened && (fault & 0x1f) == 0) {
    // Recovery repaired everything it could: opening again repairs nothing.
    try {
      RunDirectory again(std::string(kRun), options);
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
