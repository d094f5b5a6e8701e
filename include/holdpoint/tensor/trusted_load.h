// Trusted loading through LibTorch's own deserializer.
//
// holdpoint never parses untrusted files with LibTorch's unpickler: its 1.13
// build is affected by the weights-only and TorchScript advisories listed in
// docs/threat-model.md. Some files can only be read that way, though: LibTorch
// torch::save archives (TorchScript modules) and pickles written by
// torch::pickle_save. When the caller vouches for a file's producer and
// custody, load_checkpoint_mapping(path, {.trusted = true}) and
// TrainingState::load_trusted_checkpoint read such files with LibTorch, after
// the restricted reader refused them, and say so in a warning.
//
// enable_trusted_loading() installs the LibTorch reader behind
// load_checkpoint_mapping's trusted option; TrainingState and the CLI call it.
//
// Thread-safety: enable_trusted_loading may be called from any thread, any
// number of times.
#pragma once

#include <filesystem>

#include "holdpoint/format/checkpoint_mapping.h"

namespace holdpoint {

void enable_trusted_loading() noexcept;

// The LibTorch reader itself: a TorchScript archive becomes an OrderedDict of
// its parameters and buffers by dotted name; another zip pickle is read with
// torch::pickle_load and converted. Throws Error(trusted_load_failed) with
// LibTorch's message when LibTorch cannot read it either.
LoadedMapping load_with_libtorch(const std::filesystem::path& path);

}  // namespace holdpoint
