// Trusted loading: the one route to LibTorch's own deserializer.
//
// holdpoint never parses untrusted files with LibTorch's unpickler: it is
// affected by the weights-only and TorchScript advisories listed in
// docs/threat-model.md. Some files can only be read that way, though: LibTorch
// torch::save archives (TorchScript modules) and pickles written by
// torch::pickle_save. When the caller vouches for a file's producer and
// custody, load_trusted_mapping reads it with the restricted reader first and,
// only when that reader refuses the file for what it is (not for an I/O error
// or a digest mismatch), with LibTorch, and says so in a warning.
// TrainingState::load_trusted_checkpoint (holdpoint/checkpoint/training_state.h)
// restores training state from its result; nothing else in holdpoint reaches
// LibTorch's deserializer.
//
// Failure contract: throws holdpoint::Error naming the file: the restricted
// reader's code for I/O and digest failures, trusted_load_failed with
// LibTorch's message when LibTorch cannot read the file either.
//
// Thread-safety: independent calls may run concurrently.
#pragma once

#include <filesystem>

#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint {

LoadedMapping load_trusted_mapping(const std::filesystem::path& path, const LoadOptions& options = {});

}  // namespace holdpoint
