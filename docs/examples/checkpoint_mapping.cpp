// Saves a small mapping as a PyTorch checkpoint, reads it back through the
// restricted reader against a digest, and shows that a wrong digest is refused
// with its own error code. LibTorch-free: links holdpoint::core.
#include <unistd.h>

#include <array>
#include <exception>
#include <filesystem>
#include <iostream>
#include <span>
#include <string>

#include "holdpoint/base/error.h"
#include "holdpoint/base/sha256.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/value.h"

namespace {

bool round_trip(const std::filesystem::path& dir) {
  const std::array<float, 6> weights{0.5F, -1.0F, 2.0F, 0.25F, 3.0F, -0.75F};
  holdpoint::Dict entries;
  entries.insert("fc.weight", holdpoint::Value::tensor(holdpoint::TensorData::from_bytes(
                                  holdpoint::DType::float32, {2, 3}, std::as_bytes(std::span(weights)))));
  entries.insert("epoch", holdpoint::Value::integer(3));
  const holdpoint::Value state = holdpoint::Value::ordered_dict(std::move(entries));

  // Published atomically, with model.pt.sha256 beside it; Python's
  // torch.load("model.pt", weights_only=True) opens it.
  const std::filesystem::path file = dir / "model.pt";
  const holdpoint::SaveResult saved = holdpoint::save_mapping(file, state);

  // In real use the digest comes from a place an attacker cannot write (an
  // experiment tracker, a signed release note), not from beside the file.
  const std::string trusted_hex = saved.sha256.hex();
  holdpoint::LoadOptions options;
  options.expected_sha256 = holdpoint::Sha256Digest::parse(trusted_hex);
  const holdpoint::LoadedMapping loaded = holdpoint::load_checkpoint_mapping(file, options);
  if (!holdpoint::equal_content(loaded.root, state)) {
    std::cerr << "reloaded mapping differs: " << holdpoint::describe_difference(loaded.root, state) << "\n";
    return false;
  }

  options.expected_sha256 = holdpoint::Sha256Digest::parse(std::string(64, '0'));
  try {
    holdpoint::load_checkpoint_mapping(file, options);
  } catch (const holdpoint::Error& error) {
    if (error.code() == holdpoint::ErrorCode::sha256_mismatch) return true;
    throw;
  }
  std::cerr << "a wrong digest was accepted\n";
  return false;
}

}  // namespace

int main() {
  const auto dir = std::filesystem::temp_directory_path() / ("holdpoint-api-mapping-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = false;
  try {
    ok = round_trip(dir);
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
  }
  std::filesystem::remove_all(dir);
  return ok ? 0 : 1;
}
