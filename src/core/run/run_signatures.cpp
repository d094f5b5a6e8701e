// A run directory's signatures (holdpoint/run/run_directory.h, sign and
// verify_signatures; docs/threat-model.md, "Signing a run").
//
//   checkpoints/step-N.pt.sig  one per generation, kept when retention removes
//                              the generation, so the chain stays whole
//   LATEST.sig, BEST.sig       the pointer's bytes; step: the step it names;
//   index.json.sig             previous-sha256: the chain's head when signed
//
// Generations are signed only once LATEST names them, so a signed generation
// newer than LATEST is never a crash's leftover: it means LATEST was put back.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/fail.h"
#include "format/signed_digest.h"
#include "holdpoint/format/scan.h"
#include "holdpoint/run/provenance.h"
#include "run/run_directory_impl.h"
#include "run/run_files.h"
#include "run/run_names.h"

namespace holdpoint {

using detail::concat;
using detail::fail;

namespace {

constexpr std::string_view kSignatureSuffix = ".sig";
constexpr std::uint64_t kMaxSignatureFileBytes = 4096;  // as read_signature_file's bound

std::string signature_name(std::string_view name) { return concat(name, kSignatureSuffix); }

// A signature file's generation: "step-00000005.pt.sig" -> "step-00000005.pt".
std::optional<std::string> signed_generation(const std::string& name) {
  if (!name.ends_with(kSignatureSuffix)) return std::nullopt;
  std::string generation = name.substr(0, name.size() - kSignatureSuffix.size());
  if (!parse_generation_name(generation)) return std::nullopt;
  return generation;
}

GenerationCheck passed(std::string name, std::string detail) { return {std::move(name), true, std::nullopt, std::move(detail)}; }

GenerationCheck failed(std::string name, ErrorCode code, std::string detail) {
  return {std::move(name), false, code, std::move(detail)};
}

// A signed generation in the chain, as its signature file states it.
struct ChainLink {
  std::int64_t step = 0;
  std::string name;  // the generation's
  SignedStatement statement;
};

}  // namespace

// The signature files of checkpoints/, by the step of their generation.
std::map<std::int64_t, std::string> RunDirectory::Impl::generation_signatures() const {
  std::map<std::int64_t, std::string> found;
  if (!checkpoints) return found;
  for (const auto& name : checkpoints->list()) {
    if (const auto generation = signed_generation(name)) found.emplace(*parse_generation_name(*generation), name);
  }
  return found;
}

std::optional<SignatureFile> RunDirectory::Impl::read_signature(io::Directory& dir, const std::string& name) const {
  const auto info = dir.stat(name);
  if (!info) return std::nullopt;
  if (info->type != io::FileInfo::Type::regular) fail(ErrorCode::signature_malformed, name, " is not a regular file");
  if (info->size > kMaxSignatureFileBytes) {
    fail(ErrorCode::signature_malformed, name, " is ", info->size, " bytes, above the ", kMaxSignatureFileBytes,
         " a signature file may have");
  }
  const auto text = read_small(dir, name);
  return SignatureFile::parse(*text);
}

SignedStatement RunDirectory::Impl::generation_statement(const GenerationInfo& g) const {
  LoadOptions load;
  load.limits = options.limits;
  load.expected_sha256 = g.sha256;
  if (fs == &io::posix_file_system()) return checkpoint_statement(path / kCheckpointsDirectory / g.name, load);
  const io::Snapshot snapshot = checkpoints->read(g.name, options.limits.max_file_bytes, g.sha256);
  return checkpoint_statement(parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, options.limits), g.name);
}

// The pointer and index signatures: over the bytes on disk now, naming the
// chain's head.
void RunDirectory::Impl::sign_pointers(const SigningKey& key, const Sha256Digest& head,
                                        std::vector<std::string>& written) {
  const auto sign_file = [&](std::string_view name, std::optional<std::int64_t> step) {
    const auto text = read_small(*root, std::string(name));
    if (!text) return;
    SignedStatement statement;
    statement.file = std::string(name);
    statement.size = text->size();
    statement.sha256 = Sha256::of(std::as_bytes(std::span(text->data(), text->size())));
    if (step) statement.step = static_cast<std::uint64_t>(*step);
    statement.previous_sha256 = head;
    io::publish_text(*root, signature_name(name), key.sign(statement).text(), publish_options(true));
    written.push_back(signature_name(name));
  };
  if (latest) sign_file(kLatestPointer, *latest);
  if (best) sign_file(kBestPointer, *best);
  sign_file(kRunIndex, latest);
}

std::vector<std::string> RunDirectory::Impl::sign_run(const SigningKey& key) {
  std::vector<std::string> written;
  if (committed.empty() || !latest) return written;
  // The chain goes on from the newest signature before each unsigned generation.
  const auto signatures = generation_signatures();
  const auto statement_in = [&](const std::string& name) -> std::optional<SignedStatement> {
    try {
      if (const auto signature = read_signature(*checkpoints, name)) return signature->statement;
    } catch (const Error&) {  // a malformed one is replaced, or skipped as a predecessor
    }
    return std::nullopt;
  };
  std::optional<Sha256Digest> previous;
  for (const auto& [step, g] : committed) {
    if (const auto existing = statement_in(signature_name(g.name));
        existing && existing->file == g.name && existing->sha256 == g.sha256) {
      previous = g.sha256;
      continue;
    }
    // The newest signature before this step, a removed generation's included.
    for (auto it = signatures.lower_bound(step); it != signatures.begin();) {
      --it;
      if (const auto older = statement_in(it->second)) {
        previous = older->sha256;
        break;
      }
    }
    SignedStatement statement = generation_statement(g);
    statement.previous_sha256 = previous;
    io::publish_text(*checkpoints, signature_name(g.name), key.sign(statement).text(), publish_options(true));
    written.push_back(concat(kCheckpointsDirectory, "/", signature_name(g.name)));
    previous = g.sha256;
  }
  sign_pointers(key, committed.at(*latest).sha256, written);
  return written;
}

void RunDirectory::Impl::check_generation_signature(const GenerationInfo& g) const {
  if (!options.trust || !checkpoints) return;
  try {
    format::expected_digest(*checkpoints, g.name, *options.trust, g.sha256);
  } catch (const Error& error) {
    throw error.with_path((path / kCheckpointsDirectory / g.name).string());
  }
}

void RunDirectory::Impl::refuse_signed_rollback(const GenerationInfo& g) const {
  // A read-only open removes nothing: verify_signatures reports the rollback.
  if (!options.trust || !options.recover || !checkpoints) return;
  std::optional<SignatureFile> signature;
  try {
    signature = read_signature(*checkpoints, signature_name(g.name));
    if (!signature) return;
    options.trust->verify(*signature);
  } catch (const Error&) {
    return;  // not a signature this policy accepts: no evidence of a commit
  }
  fail(ErrorCode::signature_rollback, "checkpoints/", g.name, " is newer than the generation LATEST names and carries a "
       "trusted signature (key ", signature->key_id, "), so it was committed: LATEST was rolled back. Nothing was "
       "removed; put the newer LATEST back, or open the run without a trust policy to discard ", g.name);
}

std::vector<std::string> RunDirectory::sign(const SigningKey& key) {
  Impl& d = *impl_;
  d.require_writable();
  try {
    return d.sign_run(key);
  } catch (const Error& error) {
    d.rethrow_with_run(error);
  }
}

std::vector<GenerationCheck> RunDirectory::verify_signatures(const TrustPolicy& policy) const {
  const Impl& d = *impl_;
  std::vector<GenerationCheck> checks;
  // Each generation signature, on its own.
  std::vector<ChainLink> chain;
  const auto signatures = d.generation_signatures();
  for (const auto& [step, name] : signatures) {
    const std::string label = concat(kCheckpointsDirectory, "/", name);
    const std::string generation = name.substr(0, name.size() - kSignatureSuffix.size());
    try {
      const SignatureFile signature = *d.read_signature(*d.checkpoints, name);
      policy.verify(signature);
      const SignedStatement& s = signature.statement;
      if (s.file != generation) {
        fail(ErrorCode::signature_statement_mismatch, "the statement names '", s.file, "', not '", generation, "'");
      }
      const auto committed = d.committed.find(step);
      if (committed != d.committed.end() &&
          (s.sha256 != committed->second.sha256 || s.size != committed->second.size)) {
        fail(ErrorCode::signature_statement_mismatch, "the statement vouches for ", s.size, " bytes with SHA-256 ",
             s.sha256.hex(), "; ", generation, " has ", committed->second.size, " bytes with SHA-256 ",
             committed->second.sha256.hex());
      }
      chain.push_back({step, generation, s});
      checks.push_back(passed(label, concat("signed by key ", signature.key_id,
                                            committed == d.committed.end() ? " (generation no longer kept)" : "")));
    } catch (const Error& error) {
      checks.push_back(failed(label, error.code(), error.detail()));
    }
  }
  for (const auto& [step, g] : d.committed) {
    if (signatures.count(step)) continue;
    if (policy.required) {
      checks.push_back(failed(concat(kCheckpointsDirectory, "/", signature_name(g.name)), ErrorCode::signature_missing,
                              concat(g.name, " is committed and not signed")));
    }
  }
  if (chain.empty() && !policy.required) return checks;

  // The chain: by step, each names the one before it.
  bool chain_ok = true;
  for (std::size_t i = 1; i < chain.size(); ++i) {
    const ChainLink& before = chain[i - 1];
    const ChainLink& link = chain[i];
    if (link.statement.previous_sha256 != before.statement.sha256) {
      checks.push_back(failed(
          "chain", ErrorCode::signature_chain_broken,
          concat(link.name, " names ",
                 link.statement.previous_sha256 ? link.statement.previous_sha256->hex() : std::string("no generation"),
                 " as the one before it, but the signed generation before it is ", before.name, " (",
                 before.statement.sha256.hex(), "): a generation is missing, reordered or replaced")));
      chain_ok = false;
      break;
    }
  }
  if (chain_ok && !chain.empty()) {
    checks.push_back(passed("chain", concat(chain.size(), " signed generations, each naming the one before it")));
  }

  // The pointers and the index: the current bytes, naming the chain's head.
  const std::optional<ChainLink> head = chain.empty() ? std::nullopt : std::optional(chain.back());
  if (d.latest && head) {
    const GenerationInfo& latest = d.committed.at(*d.latest);
    if (latest.step < head->step) {
      checks.push_back(failed(std::string(kLatestPointer), ErrorCode::signature_rollback,
                              concat("LATEST names ", latest.name, ", but ", head->name,
                                     " is signed and newer: LATEST was rolled back")));
    }
  }
  const auto check_pointer = [&](std::string_view name, bool present) {
    if (!present) return;
    const std::string label = signature_name(name);
    try {
      const auto text = d.read_small(*d.root, std::string(name));
      if (!text) return;
      const auto signature = d.read_signature(*d.root, label);
      if (!signature) {
        if (policy.required) fail(ErrorCode::signature_missing, name, " is not signed");
        return;
      }
      policy.verify(*signature);
      const SignedStatement& s = signature->statement;
      if (s.file != name) fail(ErrorCode::signature_statement_mismatch, "the statement names '", s.file, "'");
      const Sha256Digest digest = Sha256::of(std::as_bytes(std::span(text->data(), text->size())));
      if (s.sha256 != digest || s.size != text->size()) {
        fail(ErrorCode::signature_statement_mismatch, "the statement vouches for other bytes than ", name,
             " holds (SHA-256 ", s.sha256.hex(), ", the file's ", digest.hex(), ")");
      }
      if (head && s.previous_sha256 != head->statement.sha256) {
        fail(ErrorCode::signature_rollback, "it was signed when the newest signed generation was ",
             s.previous_sha256 ? s.previous_sha256->hex() : std::string("none"), ", not ", head->name,
             ": an older ", name, " was put back");
      }
      checks.push_back(passed(label, concat("signed by key ", signature->key_id)));
    } catch (const Error& error) {
      checks.push_back(failed(label, error.code(), error.detail()));
    }
  };
  check_pointer(kLatestPointer, d.latest.has_value());
  check_pointer(kBestPointer, d.best.has_value());
  check_pointer(kRunIndex, true);
  return checks;
}

void RunDirectory::require_signatures(const TrustPolicy& policy) const {
  for (const GenerationCheck& check : verify_signatures(policy)) {
    if (check.ok) continue;
    throw Error(*check.code, concat(check.name, ": ", check.detail)).with_path(impl_->path.string());
  }
}

}  // namespace holdpoint
