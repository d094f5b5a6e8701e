// holdpoint keygen and holdpoint sign (docs/cli.md, "Signatures").
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "commands.h"
#include "holdpoint/base/signature.h"
#include "holdpoint/format/checkpoint_mapping.h"
#include "holdpoint/run/provenance.h"
#include "holdpoint/run/run_directory.h"

namespace holdpoint::cli {

namespace {

struct KeygenArguments {
  std::string out;
  bool hmac = false;
};

int run_keygen(const KeygenArguments& args) {
  try {
    const SigningKey key =
        SigningKey::generate(args.hmac ? SignatureAlgorithm::hmac_sha256 : SignatureAlgorithm::ed25519);
    key.write_private_file(args.out);
    if (args.hmac) {
      std::cout << "wrote " << args.out << " (HMAC-SHA-256 secret, mode 0600; every verifier needs a copy), key id "
                << key.key_id() << "\n";
    } else {
      const std::string public_file = args.out + ".pub";
      key.write_public_file(public_file);
      std::cout << "wrote " << args.out << " (Ed25519 private key, mode 0600) and " << public_file
                << " (its public key, for --trust), key id " << key.key_id() << "\n";
    }
    return kExitOk;
  } catch (const Error& error) {
    std::cout << "error: " << error_code_name(error.code()) << ": " << error.what() << "\n";
    return kExitUsage;
  }
}

struct SignArguments {
  std::string file;
  std::string key;
  std::string previous;
};

// A run directory: every committed generation not signed yet, in step order
// on the chain, then LATEST, BEST and index.json (RunDirectory::sign).
int sign_run_directory(const SignArguments& args, const SigningKey& key) {
  if (!args.previous.empty()) {
    std::cerr << "error: invalid_argument: --previous is for one file; a run's chain is taken from its own "
                 "signatures\n";
    return kExitUsage;
  }
  RunDirectoryOptions options;
  options.create = false;
  RunDirectory run(args.file, std::move(options));
  if (!run.latest()) {
    std::cout << "invalid: run_no_generation: " << args.file << " has no committed generation to sign\n";
    return kExitInvalid;
  }
  const std::vector<std::string> written = run.sign(key);
  for (const auto& name : written) std::cout << "  signed  " << name << "\n";
  std::cout << "signed " << args.file << " with key " << key.key_id() << ": " << written.size()
            << (written.size() == 1 ? " signature" : " signatures") << " written, LATEST " << run.latest()->name
            << "\n";
  return kExitOk;
}

int run_sign(const SignArguments& args) {
  try {
    const SigningKey key = SigningKey::read_file(args.key);
    std::error_code ignored;
    if (std::filesystem::is_directory(args.file, ignored)) return sign_run_directory(args, key);
    LoadOptions options;
    options.progress = terminal_progress("reading " + args.file);
    SignedStatement statement = checkpoint_statement(args.file, options);
    if (!args.previous.empty()) statement.previous_sha256 = Sha256Digest::parse(args.previous);
    const SignatureFile signature = key.sign(statement);
    write_signature_file(args.file, signature);
    std::cout << "signed " << args.file << " (sha256 " << statement.sha256.hex() << ") with key " << key.key_id()
              << ": " << signature_path(args.file).string() << "\n";
    return kExitOk;
  } catch (const Error& error) {
    std::cout << (exit_code_for(error.code()) == kExitInvalid ? "invalid: " : "error: ")
              << error_code_name(error.code()) << ": " << error.what() << "\n";
    return exit_code_for(error.code());
  }
}

}  // namespace

TrustPolicy trust_policy(const std::vector<std::string>& key_files, const std::vector<std::string>& revocation_lists,
                         bool required) {
  TrustPolicy policy;
  policy.required = required;
  for (const std::string& file : key_files) {
    for (VerifyingKey& key : VerifyingKey::read_file(file)) policy.keys.push_back(std::move(key));
  }
  for (const std::string& list : revocation_lists) policy.read_revocation_list(list);
  return policy;
}

void add_keygen_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<KeygenArguments>();
  CLI::App* command = app.add_subcommand(
      "keygen", "Write a new Ed25519 signing key to KEY (mode 0600) and its public key to KEY.pub, or with --hmac a "
                "shared HMAC-SHA-256 secret; refuses to replace an existing KEY");
  command->add_option("key", args->out, "the private key file to create")->required();
  command->add_flag("--hmac", args->hmac, "a shared secret (HMAC-SHA-256) instead of an Ed25519 key pair");
  command->callback([args, &exit_code] { exit_code = run_keygen(*args); });
}

void add_sign_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<SignArguments>();
  CLI::App* command = app.add_subcommand(
      "sign", "Verify FILE, then write FILE.sig: a statement of its name, size, SHA-256, step, config identity and "
              "profile, signed with KEY. For a run directory: sign every generation not signed yet, each naming the "
              "one before it, then LATEST, BEST and index.json (exit 0 signed, 1 invalid, 2 usage/IO error)");
  command->add_option("file", args->file, "the checkpoint file or run directory to sign")->required();
  command->add_option("--key", args->key, "the private key (from holdpoint keygen, or an Ed25519 PEM key)")->required();
  command->add_option("--previous", args->previous,
                      "the SHA-256 of the generation signed before this one, recorded in the statement");
  command->callback([args, &exit_code] { exit_code = run_sign(*args); });
}

}  // namespace holdpoint::cli
