// The restricted pickle VM: decodes a PyTorch data.pkl into a Value without
// executing anything.
//
// Only an allowlist of opcodes is interpreted, GLOBAL/STACK_GLOBAL may name
// only the callables and type tags of docs/format.md ("Pickle allowlist"), and
// REDUCE/BUILD accept only the exact argument shapes honest torch.save output
// has. Every count and size is checked against Limits before it is used. The
// VM never calls back into anything but the StorageResolver.
//
// Failure contract: throws holdpoint::Error with a pickle_*, persistent_id_*,
// storage_* or tensor_* code and the byte offset of the offending opcode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "holdpoint/format/dtype.h"
#include "holdpoint/format/limits.h"
#include "holdpoint/format/value.h"

namespace holdpoint::format {

// A validated persistent id: ('storage', <dtype tag>, key, location, numel).
struct StorageRequest {
  // The dtype of the storage class; uint8 for torch.UntypedStorage (numel is
  // then in bytes and the tensor's dtype comes from _rebuild_tensor_v3).
  DType dtype = DType::uint8;
  bool untyped = false;
  std::string key;       // canonical decimal in zip files; any short string in legacy streams
  std::string location;  // "cpu", "cuda:0", ...
  std::uint64_t numel = 0;
};

// Supplies the bytes of each storage the first time its key is seen. Must
// return a storage of exactly numel x itemsize bytes or throw (storage_*).
class StorageResolver {
 public:
  virtual ~StorageResolver() = default;
  virtual std::shared_ptr<const Storage> resolve(const StorageRequest& request) = 0;
};

enum class PersistentIdForm : std::uint8_t {
  zip,     // ('storage', type, key, location, numel)
  legacy,  // ('storage', type, key, location, numel, view_metadata=None)
};

struct PickleOptions {
  PersistentIdForm persistent_ids = PersistentIdForm::zip;
  // Zip archives: keys must be canonical decimals ("0", "17"). Legacy streams
  // use pointer-like decimals too, but are checked by their own reader.
  bool canonical_storage_keys = true;
  // Keep only the memo entries the pickle fetches again, as a first walk over
  // its opcodes finds them, so that the arenas can drop what nothing refers
  // to any more (a state dict then needs a few hundred bytes less per tensor).
  // The result is the same either way; false is for tests that compare.
  bool keep_fetched_memo_only = true;
  // Decode the opcodes of a whole tensor (_rebuild_tensor_v2 with a typed
  // storage, as torch.save and holdpoint write it) in one step instead of one
  // stack operation at a time. Anything the step does not recognise, or that
  // would reach a limit, goes through the ordinary VM, so the result and any
  // error are the same either way; false is for tests that compare.
  bool tensor_fast_path = true;
  // Check every tensor in full, then let it go: a dict (SETITEM, SETITEMS)
  // takes no entry for it, and a list or tuple takes None in its place (so
  // does an OrderedDict built from a list of pairs); the root, if it is
  // itself a tensor, stays one. For a caller that wants the verdict, not the
  // values, and would otherwise hold a tensor description and a dict entry
  // per tensor until the end. The keys of the entries not taken are kept as
  // 128-bit keyed fingerprints, so a key used twice is still refused. Which
  // inputs are refused, and with which code, is the same either way; a
  // message may then name a dropped tensor's kind as none.
  bool drop_tensors = false;
  // The bytes of a storage the resolver gave without them (Storage::absent: a
  // scan that checks records without keeping them), for the one check that
  // reads tensor elements while parsing: a sparse tensor's index values
  // (validate_sparse_tensor). Used for those checks only, then let go. Empty:
  // such a sparse tensor gets the checks its absent indices allow.
  std::function<std::shared_ptr<const Storage>(const Storage& absent)> read_absent;
  // Called every spend_every_bytes of a zip archive's pickle with a count of bytes
  // from its start that the VM has left behind for good: it will not read
  // them again, and neither it nor the Value it returns keeps a view into
  // them (the strings and storage keys it still needs there are copied out
  // first). A caller whose bytes are a private snapshot gives their memory
  // back (docs/format.md §11). Only while keep_fetched_memo_only holds (with
  // every memo entry kept, any string may be fetched again); never for a
  // stream with trailing bytes. Empty: nothing is reported.
  std::function<void(std::size_t spent_bytes)> on_spent;
  // How many bytes the VM reads between two on_spent reports (at least 1).
  // Each report copies out what the VM still views in the spent bytes, so
  // small values are for tests and fuzzing.
  std::size_t spend_every_bytes = std::size_t{256} << 10;
};

struct PickleResult {
  Value root;
  std::size_t consumed = 0;  // bytes up to and including STOP
  int protocol = 0;          // 0 or 1 when there is no PROTO opcode
  bool uses_binfloat = false;
  std::uint64_t tensor_count = 0;
  std::uint64_t storage_count = 0;  // distinct storage keys resolved
  std::uint64_t fast_path_tensors = 0;  // tensors decoded in one step (PickleOptions::tensor_fast_path)
};

// Runs the VM over `pickle`. With `allow_trailing_bytes` (legacy streams, where
// several pickles follow each other) decoding stops at STOP and `consumed`
// tells where; otherwise bytes after STOP are rejected.
PickleResult read_pickle(std::span<const std::byte> pickle, StorageResolver& storages, const Limits& limits,
                         const PickleOptions& options = {}, bool allow_trailing_bytes = false);

}  // namespace holdpoint::format
