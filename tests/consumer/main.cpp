// A program built against the installed holdpoint package (tests/consumer.cmake):
// saves a small tensor mapping with a sidecar, reads it back through the
// restricted reader with the digest the save returned, converts it back to
// at::Tensor and compares. Prints "verified round trip" and exits 0 only when
// everything matches.
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <torch/version.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/base/error.h"
#include "holdpoint/tensor/torch_tensor.h"

namespace {

int fail(const std::string& what) {
  std::cerr << "holdpoint consumer: FAIL " << what << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: holdpoint_consumer FILE.pt\n";
    return 2;
  }
  const std::string path = argv[1];
  const std::vector<std::pair<std::string, at::Tensor>> original = {
      {"fc.weight", at::arange(12, at::kFloat).reshape({3, 4})},
      {"fc.bias", at::full({3}, 0.5, at::kDouble)},
      {"steps", at::arange(5, at::kLong)},
  };
  try {
    holdpoint::Dict state;
    for (const auto& [name, tensor] : original) state.insert(name, holdpoint::tensor_value(tensor));
    const auto saved =
        holdpoint::save_mapping(path, holdpoint::Value::ordered_dict(std::move(state)), {.write_sidecar = true});
    if (holdpoint::read_sha256_sidecar(path).hex() != saved.sha256.hex()) return fail("the sidecar names another digest");

    holdpoint::LoadOptions options;
    options.expected_sha256 = saved.sha256;
    const auto loaded = holdpoint::load_checkpoint_mapping(path, options);
    if (loaded.via_libtorch) return fail("the restricted reader handed the file to LibTorch");
    const auto& dict = loaded.root.as_dict();
    if (dict.size() != original.size()) return fail("the loaded mapping has " + std::to_string(dict.size()) + " entries");
    for (const auto& [name, tensor] : original) {
      const at::Tensor back = holdpoint::to_at_tensor(dict.at(name).as_tensor());
      if (back.scalar_type() != tensor.scalar_type() || !at::equal(back, tensor)) return fail(name + " differs");
    }

    // The digest is checked, not just accepted.
    holdpoint::LoadOptions wrong_digest;
    wrong_digest.expected_sha256 = holdpoint::Sha256Digest::parse(std::string(64, '0'));
    try {
      holdpoint::load_checkpoint_mapping(path, wrong_digest);
      return fail("a wrong expected_sha256 was accepted");
    } catch (const holdpoint::Error& e) {
      if (e.code() != holdpoint::ErrorCode::sha256_mismatch) return fail(std::string("wrong digest: ") + e.what());
    }
    std::cout << "holdpoint consumer: verified round trip of " << original.size() << " tensors, sha256 "
              << saved.sha256.hex() << ", LibTorch " << TORCH_VERSION << "\n";
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
