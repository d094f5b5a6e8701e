// Atomic publication: the only way holdpoint makes a file visible.
//
//   1. create a unique staging file ".<target>.staging-<pid>-<random>" beside the
//      target, exclusively and without following symlinks (relative to the
//      directory's descriptor);
//   2. stream the content into it while SHA-256 is computed on a second thread;
//   3. fsync and close it;
//   4. read it back and run the caller's verifier on what the file system
//      returns (bounded parse + schema). How depends on ReadBack: `cached`
//      maps the page cache and relies on the verifier to check the content
//      (zip records' CRC-32s) when the caller says it does, and otherwise
//      re-reads into private memory and re-hashes; `device` drops the cached
//      pages first and always re-reads and re-hashes. The cached mapping
//      needs no fsync first: it is checked while step 3 waits for the device,
//      and the rename still waits for both;
//   5. rename it to the target, without replacing an existing file unless asked
//      (generations never replace; pointer files do);
//   6. fsync the directory.
// If any step before the rename fails, the staging file is removed (best
// effort: a crash leaves it for recovery, which removes stale staging files)
// and the target is untouched. docs/publication.md gives the crash-consistency
// argument for each step.
//
// Failure contract: throws holdpoint::Error naming the target; the verifier's
// own errors propagate unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "holdpoint/base/sha256.h"
#include "holdpoint/base/byte_sink.h"
#include "holdpoint/base/file_system.h"

namespace holdpoint::io {

inline constexpr std::string_view kStagingMarker = ".staging-";

// True for names publish() uses for staging files (".<name>.staging-...").
bool is_staging_name(std::string_view name) noexcept;

struct PublishOptions {
  bool replace = false;
  bool durable = true;
  std::uint64_t max_bytes = std::uint64_t{256} << 30;  // bound of the verifying re-read
  // Hash on the writing thread, without HashingWriter's blocks and thread:
  // for small files (pointers, sidecars, indexes), where those cost more
  // than the hashing they overlap. publish_text sets it.
  bool small = false;
  ReadBack read_back = ReadBack::cached;
  // Digest consecutive ranges of the file instead of the whole file: `write`
  // ends each range with end_range(sink), and the result lists one SHA-256
  // per range (its sha256 stays zero). The verifier then gets the bytes
  // unhashed and checks them against the ranges itself.
  bool range_digests = false;
  // The verifier checks every content byte (a zip's record CRC-32s), so the
  // cached read-back need not re-hash.
  bool verifier_checks_content = false;
  // Called once the staging file is synced, closed and verified, just before
  // the rename (step 6); a throw aborts the publication like a failed check.
  // The cached read-back's verifier may run while the fsync is in flight, so
  // this, not the verifier's end, is where every check has passed.
  std::function<void()> before_rename = {};
};

using PublishVerifier = std::function<void(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner)>;

struct PublishResult {
  Sha256Digest sha256;                      // zero with range_digests
  std::vector<Sha256Digest> range_digests;  // with range_digests: one per range, in order
  std::vector<std::uint64_t> range_ends;    // where each of them ends
  std::uint32_t crc32 = 0;  // of the whole file, as written
  std::uint64_t size = 0;
};

PublishResult publish(Directory& directory, const std::string& target, const PublishOptions& options,
                      const std::function<void(ByteSink&)>& write, const PublishVerifier& verify = {});

// Ends the current range of a sink that publish() handed to `write` under
// PublishOptions::range_digests (write_state_invalid for any other sink).
void end_range(ByteSink& sink);

// publish() for a small text (pointer files, sidecars, indexes).
PublishResult publish_text(Directory& directory, const std::string& target, std::string_view text,
                           const PublishOptions& options, const PublishVerifier& verify = {});

}  // namespace holdpoint::io
