// The check every published checkpoint file passes before its rename
// (io::publish's verifier): the bytes parse with the restricted reader and
// hold a holdpoint manifest that reads. Used by run directory commits, shard
// writers and TrainingState's saves alike, so they accept the same files.
//
// Failure contract: throws holdpoint::Error with the reader's or the
// manifest's code.
//
// Thread-safety: a plain function.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "holdpoint/format/limits.h"

namespace holdpoint::schema {

void verify_checkpoint_bytes(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner,
                             const Limits& limits = {});

}  // namespace holdpoint::schema
