#include <charconv>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/format/distributed_checkpoint.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/dcp_generation.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/run/sharded_checkpoint.h"
#include "run_directory_output.h"

namespace holdpoint::cli {

namespace {

struct VerifyArguments {
  std::string file;
  std::string sha256;
  bool sidecar = false;
  bool json = false;
  std::vector<std::string> trust;    // key files: Ed25519 PEM public keys, HMAC key files
  std::vector<std::string> revoked;  // revocation lists
  bool signature_optional = false;
  std::string expect_head;                 // a step or a SHA-256: the run's signed head, from an outside witness
  std::optional<std::int64_t> min_step;    // the run's signed head is at least this step
};

// --expect-head and --min-step: the outside witness, in the trust policy.
// false when --expect-head is neither a step nor a SHA-256.
bool add_witness(const VerifyArguments& args, TrustPolicy& policy) {
  policy.min_head_step = args.min_step;
  if (args.expect_head.empty()) return true;
  if (const auto digest = Sha256Digest::from_hex(args.expect_head); digest && args.expect_head == digest->hex()) {
    policy.expected_head_sha256 = digest;
    return true;
  }
  std::int64_t step = 0;
  const char* end = args.expect_head.data() + args.expect_head.size();
  const auto [at, error] = std::from_chars(args.expect_head.data(), end, step);
  if (error != std::errc() || at != end || step < 0) return false;
  policy.expected_head_step = step;
  return true;
}

// A directory holding LATEST, index.json or checkpoints/ is a run directory
// (through a symlink too, which opening it then refuses); any other directory
// is refused as before, as not a regular file.
bool is_run_directory(const std::filesystem::path& path) {
  std::error_code ignored;
  if (!std::filesystem::is_directory(path, ignored)) return false;
  for (const std::string_view name : {kLatestPointer, kRunIndex, kCheckpointsDirectory}) {
    if (std::filesystem::symlink_status(path / name, ignored).type() != std::filesystem::file_type::not_found) {
      return true;
    }
  }
  return false;
}

// A step manifest (docs/distributed.md): every shard is read and checked on
// its own (size, SHA-256 and content against the step manifest), so each
// one's result is reported; then the replicated components must merge.
int verify_sharded(const VerifyArguments& args, const LoadedMapping& mapping, bool digest_checked) {
  nlohmann::ordered_json report;
  report["file"] = args.file;
  std::optional<ErrorCode> code;
  std::string message;
  const auto failed = [&](ErrorCode c, const std::string& m) {
    if (!code) {
      code = c;
      message = m;
    }
  };
  const Manifest manifest = [&] {
    try {
      return Manifest::of_root(mapping.root);
    } catch (const Error&) {
      return Manifest{};
    }
  }();
  nlohmann::ordered_json shards = nlohmann::ordered_json::array();
  std::vector<std::string> lines;
  std::optional<ShardedCheckpoint> combined;
  if (!manifest.sharding) {
    // The manifest itself does not read: the library says why.
    try {
      ShardedReadOptions options;
      options.expected_sha256 = mapping.sha256;
      read_sharded_checkpoint(args.file, options);
      failed(ErrorCode::schema_field_invalid, args.file + ": the step manifest does not read");
    } catch (const Error& error) {
      failed(error.code(), error.what());
    }
  } else {
    const Sharding& sharding = *manifest.sharding;
    const std::filesystem::path directory = std::filesystem::path(args.file).parent_path();
    for (const ShardRecord& record : sharding.shards) {
      const std::string name = shard_directory_name(sharding.step) + "/" + shard_file_name(record.rank);
      nlohmann::ordered_json entry = {{"rank", record.rank},
                                      {"name", name},
                                      {"file", (directory / name).string()},
                                      {"size", record.size},
                                      {"sha256", record.sha256.hex()}};
      try {
        ShardedReadOptions options;
        options.expected_sha256 = mapping.sha256;
        options.ranks = std::vector<std::int64_t>{record.rank};
        ShardedCheckpoint one = read_sharded_checkpoint(args.file, options);
        if (!combined) {
          combined = std::move(one);
        } else {
          combined->shards.at(static_cast<std::size_t>(record.rank)) =
              std::move(one.shards.at(static_cast<std::size_t>(record.rank)));
        }
        entry["ok"] = true;
        entry["code"] = nullptr;
        entry["message"] = "";
        lines.push_back("  ok      rank " + std::to_string(record.rank) + "  " + name + "  " +
                        std::to_string(record.size) + " bytes  sha256 " + record.sha256.hex());
      } catch (const Error& error) {
        entry["ok"] = false;
        entry["code"] = std::string(error_code_name(error.code()));
        entry["message"] = error.what();
        lines.push_back("  FAILED  rank " + std::to_string(record.rank) + "  " + name + "  " +
                        std::string(error_code_name(error.code())) + ": " + error.what());
        failed(error.code(), "shard of rank " + std::to_string(record.rank) + " (" + name + "): " + error.what());
      }
      shards.push_back(std::move(entry));
    }
    if (!code && combined) {
      try {
        combined->combined_view();
        lines.push_back("  ok      the replicated components (" + std::to_string(sharding.replicated.size()) +
                        ") merge from the shards");
      } catch (const Error& error) {
        lines.push_back("  FAILED  merging the replicated components: " + std::string(error_code_name(error.code())) +
                        ": " + error.what());
        failed(error.code(), error.what());
      }
    }
  }
  report["valid"] = !code.has_value();
  report["format"] = std::string(file_format_name(mapping.format));
  report["sha256"] = mapping.sha256->hex();
  report["digest_checked"] = digest_checked;
  if (manifest.sharding) {
    report["sharding"] = {{"world_size", manifest.sharding->world_size},
                          {"step", manifest.sharding->step},
                          {"replicated", manifest.sharding->replicated},
                          {"rank_local", manifest.sharding->rank_local},
                          {"shards", std::move(shards)}};
  }
  const int exit_code = code ? exit_code_for(*code) : kExitOk;
  if (code) {
    report["code"] = std::string(error_code_name(*code));
    report["message"] = message;
  }
  if (args.json) {
    std::cout << report.dump(2) << "\n";
    return exit_code;
  }
  for (const auto& line : lines) std::cout << line << "\n";
  if (code) {
    std::cout << (exit_code == kExitInvalid ? "invalid: " : "error: ") << error_code_name(*code) << ": " << message
              << "\n";
    return exit_code;
  }
  std::cout << "valid: " << args.file << " (sharded step manifest, world size " << manifest.sharding->world_size
            << ", step " << manifest.sharding->step << ", sha256 " << mapping.sha256->hex()
            << (digest_checked ? ", digest matches" : "") << "; " << manifest.sharding->world_size
            << (manifest.sharding->world_size == 1 ? " shard" : " shards")
            << " verified: size, SHA-256, identity, component digests)\n";
  return kExitOk;
}

// The step manifest of a torch.distributed.checkpoint generation (docs/dcp.md):
// the folder beside it holds exactly the listed files at their sizes, every
// item's bytes have their recorded SHA-256, and every item .metadata places
// is a listed range. Errors propagate to run_verify's report.
int verify_dcp(const VerifyArguments& args, const LoadedMapping& mapping, bool digest_checked) {
  const Manifest manifest = Manifest::of_root(mapping.root);
  const std::filesystem::path file(args.file);
  const auto step = parse_generation_name(file.filename().string());
  if (step && *step != manifest.dcp->step) {
    throw Error(ErrorCode::shard_identity_mismatch, args.file + " is the step manifest of step " +
                                                        std::to_string(manifest.dcp->step) + ", not of step " +
                                                        std::to_string(*step));
  }
  const auto directory = io::posix_file_system().open_directory(
      file.has_parent_path() ? file.parent_path() : std::filesystem::path("."), false);
  verify_dcp_generation(*directory, manifest, {}, true);
  std::size_t ranges = 0;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const DcpFile& f : manifest.dcp->files) {
    ranges += f.ranges.size();
    files.push_back({{"name", f.name}, {"size", f.size}, {"ranges", f.ranges.size()}});
  }
  if (args.json) {
    nlohmann::ordered_json report;
    report["file"] = args.file;
    report["valid"] = true;
    report["format"] = std::string(file_format_name(mapping.format));
    report["sha256"] = mapping.sha256->hex();
    report["digest_checked"] = digest_checked;
    report["dcp"] = {{"world_size", manifest.dcp->world_size},
                     {"step", manifest.dcp->step},
                     {"folder", shard_directory_name(manifest.dcp->step)},
                     {"files", std::move(files)}};
    std::cout << report.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "valid: " << args.file << " (DCP step manifest, world size " << manifest.dcp->world_size << ", step "
            << manifest.dcp->step << ", sha256 " << mapping.sha256->hex() << (digest_checked ? ", digest matches" : "")
            << "; " << manifest.dcp->files.size() << " files in " << shard_directory_name(manifest.dcp->step) << "/, "
            << ranges << " items verified: sizes, SHA-256 of every item, .metadata's items listed)\n";
  return kExitOk;
}

int run_verify(const VerifyArguments& args) {
  if (is_run_directory(args.file)) {
    if (!args.sha256.empty() || args.sidecar) {
      std::cerr << "error: invalid_argument: --sha256 and --sidecar check one file; " << args.file
                << " is a directory (its generations are checked against their own records)\n";
      return kExitUsage;
    }
    if (args.trust.empty() && (!args.expect_head.empty() || args.min_step)) {
      std::cerr << "error: invalid_argument: --expect-head and --min-step are checked against the run's signatures; "
                   "give the keys with --trust\n";
      return kExitUsage;
    }
    try {
      std::optional<TrustPolicy> trust;
      if (!args.trust.empty()) trust = trust_policy(args.trust, args.revoked, !args.signature_optional);
      if (trust && !add_witness(args, *trust)) {
        std::cerr << "error: invalid_argument: --expect-head '" << args.expect_head
                  << "' is neither a step (a non-negative integer) nor a SHA-256 (64 lowercase hex digits)\n";
        return kExitUsage;
      }
      return verify_run_directory(args.file, args.json, trust);
    } catch (const Error& error) {  // a key file or revocation list that does not read
      std::cerr << "error: " << error_code_name(error.code()) << ": " << error.what() << "\n";
      return exit_code_for(error.code());
    }
  }
  if (!args.expect_head.empty() || args.min_step) {
    std::cerr << "error: invalid_argument: --expect-head and --min-step check a run directory's signed head; "
              << args.file << " is not a run directory\n";
    return kExitUsage;
  }
  const bool distributed = is_distributed_checkpoint(args.file);
  if (distributed && (!args.sha256.empty() || args.sidecar || !args.trust.empty())) {
    std::cerr << "error: invalid_argument: " << args.file
              << " is a torch.distributed.checkpoint folder, which has no single digest or signature to check "
                 "(--sha256, --sidecar, --trust)\n";
    return kExitUsage;
  }
  nlohmann::ordered_json report;
  report["file"] = args.file;
  try {
    if (distributed) {
      // What holdpoint.load reads, checked the same way: every item through
      // the restricted reader, every tensor's chunks tiled.
      load_distributed_checkpoint(args.file);
      report["valid"] = true;
      report["format"] = "torch.distributed.checkpoint";
      report["sha256"] = nullptr;
      report["digest_checked"] = false;
      if (args.json) {
        std::cout << report.dump(2) << "\n";
      } else {
        std::cout << "valid: " << args.file << " (torch.distributed.checkpoint folder, every item read; no digest)\n";
      }
      return kExitOk;
    }
    LoadOptions options;
    options.progress = terminal_progress("reading " + args.file);
    if (!args.sha256.empty()) options.expected_sha256 = Sha256Digest::parse(args.sha256);
    if (args.sidecar) options.expected_sha256 = read_sha256_sidecar(args.file);
    if (!args.trust.empty()) options.trust = trust_policy(args.trust, args.revoked, !args.signature_optional);
    const std::optional<SignatureFile> signature = options.trust ? read_signature_file(args.file) : std::nullopt;
    // Streams the file: memory stays bounded whatever its size, and tensors
    // are dropped as soon as they are checked.
    const LoadedMapping mapping = scan_checkpoint(args.file, options, ScanKeeps::verdict);
    if (is_sharded_manifest(mapping)) {
      // A step manifest is small, and reading its manifest may need tensor
      // bytes (floats of a torch 1.13-compatible file are 0-d tensors): read
      // it into memory, pinned to the digest just computed.
      LoadOptions manifest_options;
      manifest_options.expected_sha256 = mapping.sha256;
      return verify_sharded(args, load_checkpoint_mapping(args.file, manifest_options),
                            options.expected_sha256.has_value());
    }
    if (is_dcp_manifest(mapping)) {
      LoadOptions manifest_options;
      manifest_options.expected_sha256 = mapping.sha256;
      return verify_dcp(args, load_checkpoint_mapping(args.file, manifest_options), options.expected_sha256.has_value());
    }
    report["valid"] = true;
    report["format"] = std::string(file_format_name(mapping.format));
    report["sha256"] = mapping.sha256->hex();
    report["digest_checked"] = mapping.digest_checked;
    if (signature) {
      report["signed_by"] = signature->key_id;
      report["signed"] = signature->statement.created;
    }
    if (args.json) {
      std::cout << report.dump(2) << "\n";
    } else {
      std::cout << "valid: " << args.file << " (" << file_format_name(mapping.format) << ", sha256 "
                << mapping.sha256->hex() << (mapping.digest_checked ? ", digest matches" : "")
                << (signature ? ", signed by key " + signature->key_id + " at " + signature->statement.created : "")
                << ")\n";
    }
    return kExitOk;
  } catch (const Error& error) {
    const int exit_code = exit_code_for(error.code());
    report["valid"] = false;
    report["code"] = std::string(error_code_name(error.code()));
    report["message"] = error.what();
    if (args.json) {
      std::cout << report.dump(2) << "\n";
    } else {
      std::cout << (exit_code == kExitInvalid ? "invalid: " : "error: ") << error_code_name(error.code()) << ": "
                << error.what() << "\n";
    }
    return exit_code;
  }
}

}  // namespace

void add_verify_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<VerifyArguments>();
  CLI::App* command = app.add_subcommand(
      "verify",
      "Check that FILE is a well-formed checkpoint, or that every generation of the run directory RUN verifies "
      "(exit 0 valid, 1 invalid, 2 usage/IO error)");
  command
      ->add_option("file", args->file,
                   "a .pt or .safetensors file, a torch.distributed.checkpoint folder, or a run directory")
      ->required();
  auto* sha = command->add_option("--sha256", args->sha256, "expected SHA-256 (64 hex digits) from a trusted source");
  auto* sidecar = command->add_flag("--sidecar", args->sidecar, "check FILE against FILE.sha256 (sha256sum format)");
  sha->excludes(sidecar);
  command->add_option("--trust", args->trust,
                      "a key file to trust (Ed25519 PEM public keys, or a holdpoint HMAC key); repeatable. FILE must "
                      "then carry a valid FILE.sig by one of these keys, checked before FILE is read");
  command->add_option("--revoked", args->revoked, "a revocation list: key ids no longer trusted, one a line");
  command->add_flag("--signature-optional", args->signature_optional,
                    "with --trust: an unsigned FILE is read as before (a signature that is there is still checked)");
  command->add_option("--expect-head", args->expect_head,
                      "with --trust, for a run directory: the newest signed generation must be exactly this step, or "
                      "have this SHA-256, as recorded outside the run (an outside witness; signature_rollback otherwise)");
  command->add_option("--min-step", args->min_step,
                      "with --trust, for a run directory: the newest signed generation must be this step or later "
                      "(an outside witness; signature_rollback otherwise)");
  command->add_flag("--json", args->json, "print a JSON report");
  command->callback([args, &exit_code] { exit_code = run_verify(*args); });
}

}  // namespace holdpoint::cli
