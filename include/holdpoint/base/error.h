// holdpoint::Error and ErrorCode: the one exception type of the library.
//
// Every distinct rejection has its own ErrorCode, so that callers and tests can
// tell *why* something was refused without parsing messages. The message names
// the file (when known), the field and the bound that was violated.
//
// Codes are grouped by the layer that raises them. Their numeric values are
// stable within a release but are not part of the file format; use the names
// (error_code_name) in logs and JSON.
//
// Thread-safety: Error is an immutable value type.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace holdpoint {

// X(name, description). The description is the one-line meaning printed by
// `holdpoint codes` and used in docs.
#define HOLDPOINT_ERROR_CODES(X)                                                              \
  /* usage and I/O */                                                                         \
  X(invalid_argument, "the caller passed an argument the API does not accept")                \
  X(call_order_invalid, "an API was called out of order or past its end (unscale twice, OneCycleLR past total_steps)") \
  X(io_open_failed, "the file could not be opened")                                           \
  X(io_read_failed, "reading the file failed")                                                 \
  X(io_write_failed, "writing the file failed")                                                \
  X(io_sync_failed, "fsync of a file or directory failed")                                     \
  X(io_rename_failed, "renaming the staged file into place failed")                            \
  X(io_not_regular_file, "the path is not a regular file")                                     \
  X(file_changed_during_read, "the file changed (size or bytes) while it was being read")      \
  X(file_too_large, "the file is larger than Limits::max_file_bytes")                          \
  X(file_empty, "the file is empty")                                                           \
  X(sha256_mismatch, "the SHA-256 of the file differs from the expected digest")               \
  X(sha256_invalid, "an expected SHA-256 is not 64 hexadecimal digits")                        \
  X(sidecar_invalid, "the .sha256 sidecar is missing, malformed or names another file")        \
  /* signatures (holdpoint/base/signature.h, docs/threat-model.md "Signatures") */          \
  X(signature_missing, "the trust policy requires a signature and the file has no .sig beside it") \
  X(signature_malformed, "the .sig file is not a holdpoint signature: a field missing, out of order, malformed, or the file too large") \
  X(signature_invalid, "the signature does not verify under the trusted key its key id names") \
  X(signature_key_unknown, "the signature's key id names no key the trust policy holds") \
  X(signature_key_revoked, "the signature's key id is on the trust policy's revocation list") \
  X(signature_statement_mismatch, "the signed statement names another file, size or digest than the one read") \
  X(signature_chain_broken, "a signed generation's previous-sha256 names no signed generation of the run: a generation missing, reordered or replaced") \
  X(signature_rollback, "LATEST or BEST names a signed generation older than the newest one the run's signatures record: a rolled-back pointer") \
  X(key_file_invalid, "a key file is missing, unreadable, or not an Ed25519 PEM key or holdpoint HMAC key") \
  /* container detection */                                                                   \
  X(unknown_format, "the bytes are neither a PyTorch zip, a legacy PyTorch stream nor safetensors") \
  X(git_lfs_pointer, "a Git LFS pointer file, not the checkpoint it points to (run git lfs pull)") \
  X(legacy_tar_format, "a pre-0.1.10 PyTorch tar checkpoint, which is not supported")          \
  X(pytorch1_prerelease_format, "the pre-release PYTORCH1 container, which is not supported")  \
  X(torchscript_archive, "a TorchScript/package archive (constants.pkl, code/...), not a weights checkpoint") \
  /* zip layer */                                                                             \
  X(zip_eocd_missing, "no end-of-central-directory record at the end of the file")            \
  X(zip_trailing_data, "bytes or a comment follow the end-of-central-directory record")       \
  X(zip_multi_disk, "the archive claims to span several disks")                               \
  X(zip64_locator_invalid, "the zip64 end-of-central-directory locator is malformed")         \
  X(zip64_eocd_invalid, "the zip64 end-of-central-directory record is malformed")             \
  X(zip_entry_count_mismatch, "the entry counts of the directory records disagree")           \
  X(zip_too_many_entries, "more entries than Limits::max_records")                            \
  X(zip_central_directory_invalid, "the central directory lies outside the file or is malformed") \
  X(zip_central_directory_too_large, "the central directory exceeds Limits::max_central_directory_bytes") \
  X(zip_empty, "the archive has no entries")                                                  \
  X(zip_encrypted, "an entry is encrypted")                                                   \
  X(zip_compressed, "an entry is compressed; PyTorch records are stored")                     \
  X(zip_unsupported_flags, "an entry uses general-purpose flags other than data descriptor and UTF-8") \
  X(zip_size_mismatch, "an entry's compressed and uncompressed sizes differ")                 \
  X(zip_extra_field_invalid, "an entry's extra field is malformed or holds unexpected blocks") \
  X(zip_name_invalid, "an entry name is empty, too long, not UTF-8 or has forbidden components") \
  X(zip_name_duplicate, "two entries have the same name")                                     \
  X(zip_name_case_duplicate, "two entry names differ only in ASCII case")                     \
  X(zip_archive_folder_invalid, "entries do not share one top-level archive folder")          \
  X(zip_local_header_invalid, "a local file header is malformed or lies outside the file")    \
  X(zip_local_header_mismatch, "a local file header disagrees with its central directory entry") \
  X(zip_local_zip64_mismatch, "a local header's zip64 block disagrees with the central directory") \
  X(zip_entries_overlap, "two entries, or an entry and the central directory, share bytes")   \
  X(zip_gap, "unaccounted bytes between entries (strict layout)")                             \
  X(zip_descriptor_mismatch, "a data descriptor disagrees with the central directory")        \
  X(zip_crc_mismatch, "an entry's CRC-32 does not match its bytes")                           \
  X(zip_crc_missing, "an entry's CRC-32 is zero and Limits::allow_zero_crc is off")           \
  /* PyTorch records */                                                                       \
  X(record_unknown, "the archive holds a record that a weights checkpoint never has")         \
  X(record_missing, "a required record (data.pkl, version) is missing")                       \
  X(record_unreferenced, "a data/<key> record is not referenced by the pickle")               \
  X(version_invalid, "the version record is not a decimal number")                            \
  X(version_unsupported, "the archive version is outside the range PyTorch reads (1..10)")    \
  X(byteorder_invalid, "the byteorder record is neither 'little' nor 'big'")                  \
  X(byteorder_unsupported, "a big-endian archive uses untyped storages, which cannot be byte-swapped safely") \
  X(format_version_invalid, "the .format_version or .storage_alignment record is not a decimal number") \
  /* pickle VM */                                                                             \
  X(pickle_too_large, "the pickle is larger than Limits::max_pickle_bytes")                   \
  X(pickle_truncated, "the pickle ends inside an opcode or before STOP")                      \
  X(pickle_protocol_unsupported, "the pickle protocol is not one PyTorch writers use")        \
  X(pickle_opcode_forbidden, "an opcode outside the allowlist")                               \
  X(pickle_opcode_limit, "more opcodes than Limits::max_opcodes")                             \
  X(pickle_frame_invalid, "a FRAME length does not match the bytes that follow")              \
  X(pickle_stack_underflow, "an opcode needs more stack items than there are")                \
  X(pickle_stack_limit, "more stack items than Limits::max_stack_items")                      \
  X(pickle_mark_missing, "an opcode needs a MARK and there is none")                          \
  X(pickle_mark_limit, "MARKs nest deeper than Limits::max_mark_depth")                       \
  X(pickle_stop_invalid, "at STOP the stack does not hold exactly one item, or a MARK is open") \
  X(pickle_trailing_bytes, "bytes follow the STOP opcode")                                    \
  X(pickle_memo_missing, "BINGET of a memo index that was never stored")                      \
  X(pickle_memo_index_invalid, "BINPUT skips memo indices")                                   \
  X(pickle_memo_limit, "more memo entries than Limits::max_memo_entries")                     \
  X(pickle_memo_mutable, "BINGET of a mutable container (would allow cycles and aliasing)")   \
  X(pickle_nesting_limit, "containers nest deeper than Limits::max_nesting_depth")            \
  X(pickle_string_too_long, "a string is longer than Limits::max_string_bytes")               \
  X(pickle_string_invalid, "a string is not valid UTF-8 (or ASCII for byte strings)")         \
  X(pickle_int_invalid, "an integer does not fit in 64 bits or its text form is malformed")   \
  X(pickle_global_forbidden, "GLOBAL names a module attribute outside the allowlist")         \
  X(pickle_global_malformed, "GLOBAL's module or name is not a short dotted identifier")      \
  X(pickle_call_forbidden, "REDUCE applied to something that is not an allowed callable")     \
  X(pickle_call_args_invalid, "an allowed callable got arguments of the wrong shape or type")  \
  X(pickle_build_forbidden, "BUILD on anything but an OrderedDict with a _metadata state, a NumPy value or a record object") \
  X(pickle_record_invalid, "a record object (an allowlisted dataclass, docs/format.md) gets arguments, fields or a state its class does not have") \
  X(pickle_setitem_target, "SETITEM(S) on something that is not a dict")                      \
  X(pickle_append_target, "APPEND(S) on something that is not a list")                        \
  X(pickle_dict_key_invalid, "a dict key is neither a string, an integer nor a record object (in a dict of record keys only)") \
  X(pickle_duplicate_key, "a dict key occurs twice")                                          \
  X(pickle_container_limit, "more container elements than Limits::max_container_elements")    \
  X(pickle_expansion_limit, "shared references expand past Limits::max_expanded_nodes")       \
  X(pickle_type_invalid, "a value has a type the surrounding structure does not allow")      \
  /* NumPy arrays and scalars, decoded as data (docs/format.md, "NumPy values") */            \
  X(numpy_dtype_unsupported, "a NumPy dtype that is not a plain number type (object, structured, text)") \
  X(numpy_array_invalid, "a NumPy array or scalar whose shape, dtype and data disagree")      \
  /* persistent ids and storages */                                                           \
  X(persistent_id_invalid, "a persistent id is not ('storage', type, key, location, numel)")  \
  X(storage_type_unsupported, "a persistent id names a storage type that is not a plain dtype") \
  X(storage_key_invalid, "a storage key is not a canonical decimal number")                   \
  X(storage_record_missing, "a storage key has no data/<key> record")                         \
  X(storage_location_unsupported, "a storage location is not cpu, cuda[:n] or mps")           \
  X(storage_numel_invalid, "a storage element count is negative or overflows")                \
  X(storage_size_mismatch, "a storage record's size differs from numel x itemsize")          \
  X(storage_redeclared, "one storage key is declared with two dtypes or element counts")      \
  /* tensors */                                                                               \
  X(tensor_rank_limit, "a tensor has more dimensions than Limits::max_tensor_rank")           \
  X(tensor_geometry_invalid, "size and stride differ in length, or hold negative values")     \
  X(tensor_numel_limit, "a tensor's element count overflows or exceeds Limits::max_tensor_numel") \
  X(tensor_out_of_bounds, "a tensor view reaches outside its storage")                        \
  X(tensor_bytes_limit, "a tensor's logical bytes exceed Limits::max_tensor_logical_bytes or the expansion bound") \
  X(tensor_requires_grad_invalid, "requires_grad on a tensor whose dtype cannot have gradients") \
  X(tensor_hooks_not_empty, "a tensor carries backward hooks or rebuild metadata")            \
  X(tensor_count_limit, "more tensors than Limits::max_tensors")                              \
  /* legacy (non-zip) stream */                                                               \
  X(legacy_magic_invalid, "the legacy stream does not start with PyTorch's magic number")     \
  X(legacy_protocol_unsupported, "the legacy stream's protocol version is not 1001")         \
  X(legacy_sys_info_invalid, "the legacy stream's sys_info is malformed or not little-endian") \
  X(legacy_storage_keys_invalid, "the legacy storage key list disagrees with the pickle")     \
  X(legacy_storage_header_invalid, "a legacy storage's element count disagrees with its declaration") \
  X(legacy_view_metadata_unsupported, "a legacy persistent id carries storage-view metadata") \
  X(legacy_trailing_data, "bytes follow the last legacy storage")                             \
  /* safetensors */                                                                           \
  X(safetensors_header_too_small, "the file is shorter than the 8-byte header length")        \
  X(safetensors_header_too_large, "the header length exceeds Limits::max_safetensors_header_bytes") \
  X(safetensors_header_length_invalid, "the header length points past the end of the file")   \
  X(safetensors_header_invalid, "the header is not UTF-8 JSON that starts with '{'")          \
  X(safetensors_header_schema_invalid, "the header JSON does not have the safetensors schema") \
  X(safetensors_json_depth_limit, "the header JSON nests deeper than Limits::max_json_depth") \
  X(safetensors_duplicate_key, "a header object has a key twice")                             \
  X(safetensors_dtype_unknown, "a tensor's dtype is not a safetensors dtype name")            \
  X(safetensors_integer_invalid, "a shape or offset is not an exact unsigned 64-bit integer") \
  X(safetensors_offsets_invalid, "tensor extents are not contiguous from 0 without gaps or overlaps") \
  X(safetensors_validation_overflow, "shape x element size overflows")                       \
  X(safetensors_misaligned_slice, "a tensor's bit size is not a whole number of bytes")       \
  X(safetensors_tensor_info_invalid, "a tensor's byte length differs from its shape x element size") \
  X(safetensors_incomplete_buffer, "the data buffer does not end exactly at the end of the file") \
  X(safetensors_metadata_invalid, "__metadata__ is not an object of string values")           \
  X(safetensors_tensor_name_invalid, "a tensor name is empty or longer than Limits::max_string_bytes") \
  /* torch.distributed.checkpoint folders (docs/python.md, "torch.distributed.checkpoint") */ \
  X(dcp_metadata_invalid, "a DCP .metadata does not have the structure DCP writes (a field missing or mistyped, a chunk outside its tensor, chunks that do not tile it)") \
  X(dcp_item_missing, "a DCP item has no storage_data entry, or its .distcp file is absent") \
  X(dcp_range_invalid, "a DCP item's byte range lies outside its .distcp file, or its file name leaves the folder") \
  X(dcp_transform_unsupported, "a DCP item was written through a stream transform (compression, ...) or a format holdpoint does not decode") \
  X(dcp_expanded_bytes_limit, "the DCP items the metadata references, each counted every time it is referenced, and the tensors assembled from chunks exceed Limits::max_distributed_checkpoint_bytes") \
  X(dcp_chunk_corners_limit, "a DCP tensor's chunks have more corners to check than the tiling check's bound (many chunks split along many dimensions)") \
  X(dcp_range_unlisted, "a DCP item's byte range is not a range that the step manifest of its generation lists and digests") \
  X(dcp_file_unlisted, "a DCP generation's folder holds a file that its step manifest does not list") \
  /* writers and conversion */                                                                \
  X(write_value_unsupported, "the value cannot be written in the chosen format or mode")      \
  X(write_storage_dtype_conflict, "one storage is referenced with two dtypes")                \
  X(write_state_invalid, "the writer was used after finish() or abandon()")                   \
  X(convert_not_flat, "conversion needs a flat mapping of names to tensors")                  \
  X(convert_dtype_unsupported, "a tensor's dtype has no counterpart in the destination format (F6_* in .pt; complex32, complex128, bits* in safetensors)") \
  X(convert_float4_shape_invalid, "F4 <-> float4_e2m1fn_x2 needs rank >= 1 and, towards .pt, an even last dimension (two elements per byte)") \
  X(dtype_unsupported, "a dtype or tensor kind has no counterpart on the other side (LibTorch build, file format)") \
  /* training-state components (state layer) */                                               \
  X(state_key_missing, "a component's state lacks a key it requires")                         \
  X(state_key_unknown, "a component's state has a key the component does not know")           \
  X(state_type_invalid, "a state field has the wrong type")                                   \
  X(state_value_invalid, "a state field's value is out of range or inconsistent")             \
  X(state_shape_mismatch, "a state tensor's shape differs from the live object's")            \
  X(state_dtype_mismatch, "a state tensor's dtype differs from the live object's")            \
  X(state_structure_mismatch, "the state's structure (groups, parameters, entries) differs from the live object's") \
  X(state_apply_failed, "applying a validated state to a live object failed")                 \
  X(rng_inventory_mismatch, "the file's generators differ from the registered ones")          \
  X(rng_state_invalid, "a generator state cannot be restored")                                \
  /* checkpoint schema, identity, profiles, trust (checkpoint layer) */                       \
  X(schema_field_missing, "the checkpoint manifest lacks a required field")                   \
  X(schema_field_unknown, "the checkpoint manifest has a field this version does not know")   \
  X(schema_field_invalid, "a manifest field has the wrong type or value")                     \
  X(schema_version_unsupported, "the checkpoint schema version is not one this build reads")  \
  X(checkpoint_kind_mismatch, "the checkpoint's kind (resume, model, selection) is not the one required") \
  X(component_missing, "a registered component has no state in the checkpoint")               \
  X(component_unknown, "the checkpoint holds a component that is not registered")             \
  X(component_digest_mismatch, "a component's content differs from the digest in the manifest") \
  X(component_contract_mismatch, "a component's structure differs from its contract in the manifest") \
  X(config_drift, "a load-bearing configuration field differs from the checkpoint's")         \
  X(config_invalid, "the configuration is malformed")                                         \
  X(profile_unknown, "the resume profile is not one this build knows")                        \
  X(profile_precondition_violated, "a precondition of the resume profile does not hold")      \
  X(unsafe_checkpoint_load_unavailable, "only LibTorch's unhardened deserializer could read this file; untrusted loads refuse it") \
  X(legacy_layout_unrecognized, "the file's mapping is not a layout a legacy reader knows")   \
  X(trusted_load_failed, "LibTorch's deserializer failed on a trusted file")                  \
  /* run directories, publication, saving (run layer) */                                      \
  X(run_directory_invalid, "checkpoints/ in the run directory is not a directory (a symlink or a file)") \
  X(run_directory_locked, "another process has the run directory open for writing")           \
  X(run_generation_unreadable, "a generation could not be read or is beyond this build's limits or schema; recovery stops rather than fall back") \
  X(run_pointer_invalid, "LATEST or BEST is malformed or names no generation")                 \
  X(run_index_invalid, "index.json is malformed")                                              \
  X(run_sidecar_invalid, "a generation's .sha256 sidecar is malformed or names another file")  \
  X(run_generation_exists, "a generation for this step is already committed")                 \
  X(run_step_not_increasing, "a new generation's step is not after LATEST's")                  \
  X(run_generation_missing, "a generation named by the index or a pointer is not on disk")     \
  X(run_no_generation, "the run directory has damaged generations and none that verifies; resuming from scratch is refused") \
  X(run_shards_invalid, "a sharded generation's shard directory is missing, not a directory, or lacks a shard its step manifest names") \
  X(run_gc_refused, "retention refused to delete: an operation failed or LATEST is not verified") \
  X(export_destination_invalid, "the export destination exists and is not an empty directory") \
  X(save_invalid_request, "a save or preemption request is invalid in the current state")      \
  /* sharded checkpoints and distributed saves (dist layer) */                                \
  X(shard_size_mismatch, "a shard file's size differs from the size its step manifest records") \
  X(shard_digest_mismatch, "a shard file's SHA-256 differs from the digest its step manifest records") \
  X(shard_identity_mismatch, "a shard's own manifest names another rank, world size or step than the step manifest") \
  X(shard_piece_conflict, "the shards' pieces of a replicated component disagree (two ranks hold one tensor, or their structure or values differ)") \
  X(distributed_rank_failed, "another rank failed its part of a collective save or load; every rank rejects it, naming the rank and its reason") \
  X(distributed_replicated_mismatch, "the replicated state differs across ranks (structure, tensor sizes or scalar values), so it cannot be written as one copy") \
  X(distributed_ranks_disagree, "the ranks of a collective save disagree on the step, configuration identity, profile, semantic identity or component names") \
  X(distributed_world_size_changed, "the checkpoint was saved by another number of ranks; only an unqualified resume that allows it may change the world size") \
  X(distributed_cursor_uneven, "the saved ranks' sampler cursors differ, so the global position cannot be reassigned to a new world size") \
  /* joining a world from torchrun's environment (holdpoint/dist/launch.h) */                 \
  X(launch_variable_missing, "a variable the launcher must set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) is not set") \
  X(launch_variable_invalid, "a launcher variable is not a number in its range, a port or a boolean") \
  X(launch_variables_contradict, "the launcher's variables contradict each other (RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, ...)") \
  /* resume verification (verify layer) */                                                    \
  X(resume_output_exists, "the verification's output directory already exists")               \
  X(resume_trainer_unavailable, "the trainer program does not exist or is not executable")    \
  X(resume_run_failed, "a trainer run could not start, exited non-zero or was killed by a signal") \
  X(resume_run_timed_out, "a trainer run did not finish within the timeout and was killed")   \
  X(resume_run_output_missing, "a trainer run left no summary.json, checkpoint.pt or checkpoint.pt.sha256") \
  X(resume_summary_unreadable, "summary.json is not JSON (a bare NaN is not JSON: write \"nan\")") \
  X(resume_summary_schema_unsupported, "summary.json's schema or schema_version is not one this build reads") \
  X(resume_summary_field_missing, "summary.json or one of its trace records lacks a required field") \
  X(resume_summary_field_invalid, "a summary.json field has the wrong type or value")         \
  X(resume_protocol_violated, "a run's summary contradicts its command (steps, global step, resume, RNG restore, versions)") \
  X(resume_structure_mismatch, "the runs differ in structure: trace length, generators, keys, kinds, dtypes or shapes") \
  X(resume_value_not_finite, "a compared value is NaN or infinite")                           \
  X(resume_value_deviation, "a floating-point value deviates beyond atol + rtol x |continuous|") \
  X(resume_value_mismatch, "a value compared exactly (sample ids, steps, integers, booleans, strings) differs") \
  X(resume_negative_control_matched, "the resume without RNG restore matched the continuous run, so the check could not detect an incomplete resume") \
  /* best-state capture (selection layer) */                                                 \
  X(selection_record_invalid, "a selection record has a missing, unknown or mistyped field") \
  X(selection_envelope_invalid, "a selection envelope's model state is not a mapping of names to tensors, or its selection component is malformed") \
  X(selection_record_mismatch, "the selection record a candidate or envelope carries differs from the trusted record") \
  X(selection_key_missing, "a candidate lacks a tensor the selection record holds (strict key matching)") \
  X(selection_key_unexpected, "a candidate holds a tensor the selection record does not (strict key matching)") \
  X(selection_dtype_mismatch, "a candidate tensor's dtype differs from the selection record's") \
  X(selection_shape_mismatch, "a candidate tensor's shape differs from the selection record's") \
  X(selection_content_mismatch, "a candidate tensor's elements differ from the selection record's witness (values or SHA-256)") \
  X(selection_poison_ineffective, "poisoning a fresh module's tensor left it equal to the selected content, so a load that did nothing would go unnoticed") \
  X(selection_reload_mismatch, "after loading the staged envelope, the fresh module's tensors differ from the selection record: the load did not take effect") \
  X(selection_output_mismatch, "the reloaded module's output on the probe input differs from the output recorded at selection") \
  X(pickle_cycle, "a list or dict is changed after the memo handed it out: only a container that holds itself (a cycle) is pickled so") \
  X(tensor_metadata_unsupported, "a tensor's rebuild metadata sets something other than the conj and neg bits, or the conj bit on a tensor that is not complex") \
  X(sparse_indices_invalid, "a sparse tensor's index tensor has a dtype, rank or view its layout does not allow") \
  X(sparse_shape_invalid, "a sparse tensor's size, index tensors and values disagree in their dimensions") \
  X(sparse_index_out_of_bounds, "a sparse tensor's index lies outside its size") \
  X(sparse_compressed_indices_invalid, "a compressed sparse tensor's compressed indices do not run from 0 to nnz without decreasing, or a row's plain indices are not sorted and distinct") \
  X(sparse_not_coalesced, "a sparse COO tensor marked coalesced has indices out of order or repeated")

enum class ErrorCode : std::uint16_t {
#define HOLDPOINT_X(name, description) name,
  HOLDPOINT_ERROR_CODES(HOLDPOINT_X)
#undef HOLDPOINT_X
};

// "zip_crc_mismatch" etc.; "unknown" for a value outside the enum.
std::string_view error_code_name(ErrorCode code) noexcept;
std::string_view error_code_description(ErrorCode code) noexcept;
// The inverse of error_code_name; nullopt for an unknown name.
std::optional<ErrorCode> error_code_from_name(std::string_view name) noexcept;
// Number of codes, for iteration in docs and tests.
std::size_t error_code_count() noexcept;
// Whether `code` is about the environment or the call (an argument the API
// does not accept, a file that cannot be opened, read, written, synced or
// renamed, a malformed expected digest, an export destination in use) rather
// than about the content of a file: the CLI's exit code 2 rather than 1, and
// what stops `export --all` rather than skipping a generation.
bool is_environment_error(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string detail);

  ErrorCode code() const noexcept { return code_; }
  // The message without the file prefix.
  const std::string& detail() const noexcept { return detail_; }
  // The file the error is about, empty when it was raised on bytes in memory.
  const std::string& path() const noexcept { return path_; }

  // A copy that names `path` in its message (only if no path is set yet).
  Error with_path(std::string path) const;

 private:
  Error(ErrorCode code, std::string detail, std::string path);

  ErrorCode code_;
  std::string detail_;
  std::string path_;
};

}  // namespace holdpoint
