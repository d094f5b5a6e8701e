// Checking a checkpoint file of any size without holding it in memory.
//
// scan_checkpoint reads the file once, in order, through a small ring of
// buffers, computing its SHA-256 on a second thread while it checks every zip
// record's CRC-32, and validates the structure exactly as
// load_checkpoint_mapping (holdpoint/format/checkpoint_mapping.h) does: the
// zip end records, central directory, local headers, data descriptors and
// layout, the record policy, the pickle, storage sizes and tensor geometry;
// for safetensors the header and its extents. It returns the same
// LoadedMapping (root tree, format, markers, records, SHA-256, size), except
// that tensors carry no bytes: their storages are Storage::absent, with sizes
// and identities (views of one storage still share it) but no payload, and
// reading their bytes throws. LoadedMapping::storage_locations then says
// where each storage's bytes lie in the file (and the zip record's CRC-32),
// for a caller that reads one tensor at a time later (holdpoint diff). Use it
// to verify and inspect; use
// load_checkpoint_mapping when the tensors' values are needed.
//
// The bytes parsed are the bytes hashed. What is read before the pass (the
// first bytes, to detect the format; the zip end records and central
// directory; the safetensors header) is compared with the bytes of the pass
// as they stream by; local headers, data descriptors, data.pkl and the small
// records are taken from the pass itself. A difference, or the file growing
// or shrinking while it is read, is file_changed_during_read.
//
// Memory: besides the result, the ring (32 MiB) and the metadata the checks
// need: the central directory's entries (the directory itself, at most
// Limits::max_central_directory_bytes, is kept only as its SHA-256 once
// parsed), data.pkl (at most max_pickle_bytes), a safetensors header (at most
// max_safetensors_header_bytes); never the tensor bytes. Exception: a legacy
// stream (torch < 1.6, or _use_new_zipfile_serialization=False) is read by
// load_checkpoint_mapping, whole, into private memory, and its tensors keep
// their bytes; the format predates checkpoints of the sizes that need
// streaming.
//
// Failure contract: throws holdpoint::Error naming the file, with the code
// load_checkpoint_mapping gives for the same bytes: I/O and size errors
// first, then sha256_mismatch when options.expected_sha256 differs (checked
// after the whole file was hashed, before any structural verdict), then the
// first structural check that fails, in the same order (a damaged record is
// reported as a CRC mismatch before anything its bytes say). Without an
// expected digest, a file whose end records, central directory or format
// already fail is refused without reading the rest. options.progress is
// called on the calling thread as the file streams.
//
// ScanKeeps::verdict runs every check above but keeps less: each tensor is
// dropped as soon as it is checked (a dict keeps no entry for it, a list or
// tuple None; format/pickle/pickle_reader.h, PickleOptions::drop_tensors) and
// the record list stays empty, so that the memory a file of many small
// tensors needs is mostly its data.pkl and central directory (holdpoint
// verify). A file is refused, with the same code, exactly when
// ScanKeeps::tree refuses it.
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/loaded_mapping.h"

namespace holdpoint {

// What scan_checkpoint returns besides the verdict, format, markers, size and
// SHA-256.
enum class ScanKeeps : std::uint8_t {
  tree,     // the tree, tensors with sizes and no bytes, and the records (inspect)
  verdict,  // the tree without its tensors, and no records (verify)
};

LoadedMapping scan_checkpoint(const std::filesystem::path& path, const LoadOptions& options = {},
                              ScanKeeps keeps = ScanKeeps::tree);

}  // namespace holdpoint
