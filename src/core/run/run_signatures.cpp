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
#include <functional>
#include <map>
#include <optional>
#include <set>
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
using run::kSignatureSuffix;
using run::signature_name;

namespace {

// A signature file's generation: "step-00000005.pt.sig" -> "step-00000005.pt".
std::optional<std::string> signed_generation(const std::string& name) {
  if (!name.ends_with(kSignatureSuffix)) return std::nullopt;
  std::string generation = name.substr(0, name.size() - kSignatureSuffix.size());
  if (!parse_generation_name(generation)) return std::nullopt;
  return generation;
}

GenerationCheck check_passed(std::string name, std::string detail) { return {std::move(name), true, std::nullopt, std::move(detail)}; }

GenerationCheck check_failed(std::string name, ErrorCode code, std::string detail) {
  return {std::move(name), false, code, std::move(detail)};
}

std::string hex_or(const std::optional<Sha256Digest>& digest, std::string_view none) {
  return digest ? digest->hex() : std::string(none);
}

// `name` of `dir` under `policy`, or nothing: a signature that is absent,
// malformed or not trusted is no evidence (verify_signatures reports it, and
// a load of its generation refuses it).
std::optional<SignatureFile> trusted_signature(io::Directory& dir, const std::string& name, const TrustPolicy& policy) {
  try {
    std::optional<SignatureFile> signature = read_signature(dir, name);
    if (signature) policy.verify(*signature);
    return signature;
  } catch (const Error&) {
    return std::nullopt;
  }
}

// What the run's trusted signatures say, read from the run as it is on disk.
struct SignedEvidence {
  // Generation signatures that name their own generation, by step.
  std::map<std::int64_t, SignedStatement> links;
  std::set<std::int64_t> present;  // regular generation files in checkpoints/
  std::optional<std::int64_t> pointer_step;  // the step LATEST names, when it parses
  // index.json, when index.json.sig vouches for its bytes.
  std::optional<run::RunIndex> signed_index;
  // The chain heads (previous-sha256) and steps that LATEST.sig, BEST.sig and
  // index.json.sig name, with the file that names each.
  std::vector<std::pair<std::string, Sha256Digest>> named_heads;
  std::vector<std::pair<std::string, std::int64_t>> named_steps;
};

SignedEvidence gather_evidence(io::Directory& root, const TrustPolicy& policy,
                               const std::function<std::optional<std::string>(io::Directory&, const std::string&)>& read) {
  SignedEvidence evidence;
  if (const auto info = root.stat(std::string(kCheckpointsDirectory)); info && info->type == io::FileInfo::Type::directory) {
    const auto checkpoints = root.open_subdirectory(std::string(kCheckpointsDirectory), false);
    for (const auto& name : checkpoints->list()) {
      if (const auto step = parse_generation_name(name)) {
        if (const auto stat = checkpoints->stat(name); stat && stat->type == io::FileInfo::Type::regular) {
          evidence.present.insert(*step);
        }
      } else if (const auto generation = signed_generation(name)) {
        const auto signature = trusted_signature(*checkpoints, name, policy);
        if (signature && signature->statement.file == *generation) {
          evidence.links.emplace(*parse_generation_name(*generation), signature->statement);
        }
      }
    }
  }
  const auto text_of = [&](std::string_view name) -> std::optional<std::string> {
    try {
      return read(root, std::string(name));
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  if (const auto latest = text_of(kLatestPointer)) {
    try {
      evidence.pointer_step = parse_generation_name(run::parse_pointer(*latest, kLatestPointer).first);
    } catch (const Error&) {
    }
  }
  for (const std::string_view name : {kLatestPointer, kBestPointer, kRunIndex}) {
    const auto signature = trusted_signature(root, signature_name(name), policy);
    if (!signature || signature->statement.file != name) continue;
    const SignedStatement& s = signature->statement;
    const std::string source = signature_name(name);
    if (s.previous_sha256) evidence.named_heads.emplace_back(source, *s.previous_sha256);
    if (s.step && name != kBestPointer) evidence.named_steps.emplace_back(source, static_cast<std::int64_t>(*s.step));
    if (name != kRunIndex) continue;
    const auto text = text_of(kRunIndex);
    if (!text || text->size() != s.size ||
        Sha256::of(std::as_bytes(std::span(text->data(), text->size()))) != s.sha256) {
      continue;  // an index written since (a crash before its signature): not evidence
    }
    try {
      evidence.signed_index = run::parse_index(*text);
    } catch (const Error&) {
    }
  }
  return evidence;
}

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

SignedStatement RunDirectory::Impl::generation_statement(const GenerationInfo& g) const {
  LoadOptions load;
  load.limits = options.limits;
  load.expected_sha256 = g.sha256;
  if (fs == &io::posix_file_system()) return checkpoint_statement(path / kCheckpointsDirectory / g.name, load);
  const io::Snapshot snapshot = checkpoints->read(g.name, options.limits.max_file_bytes, g.sha256);
  LoadedMapping mapping = parse_checkpoint_bytes(snapshot.buffer->bytes(), snapshot.buffer, options.limits);
  mapping.sha256 = snapshot.sha256;  // parsing alone hashes nothing: the snapshot's digest is the file's
  return checkpoint_statement(mapping, g.name);
}

void RunDirectory::Impl::sign_small_file(const SigningKey& key, std::string_view name, std::optional<std::int64_t> step,
                                         const Sha256Digest& head, std::vector<std::string>& written) {
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
}

// The pointer and index signatures: over the bytes on disk now, naming the
// chain's head.
void RunDirectory::Impl::sign_pointers(const SigningKey& key, const Sha256Digest& head,
                                        std::vector<std::string>& written) {
  if (latest) sign_small_file(key, kLatestPointer, *latest, head, written);
  if (best) sign_small_file(key, kBestPointer, *best, head, written);
  sign_small_file(key, kRunIndex, latest, head, written);
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
  chain_head_known = true;
  chain_head = previous;
  sign_pointers(key, committed.at(*latest).sha256, written);
  return written;
}

void RunDirectory::Impl::sign_commit(const SigningKey& key, const GenerationInfo& g) {
  if (!chain_head_known) {
    sign_run(key);
    return;
  }
  std::vector<std::string> written;
  SignedStatement statement = generation_statement(g);
  statement.previous_sha256 = chain_head;
  io::publish_text(checkpoints_dir(), signature_name(g.name), key.sign(statement).text(), publish_options(true));
  chain_head = g.sha256;
  sign_pointers(key, g.sha256, written);
}

void RunDirectory::Impl::check_generation_signature(const GenerationInfo& g) const {
  if (!options.trust || !checkpoints) return;
  try {
    format::expected_digest(*checkpoints, g.name, *options.trust, g.sha256);
  } catch (const Error& error) {
    throw error.with_path((path / kCheckpointsDirectory / g.name).string());
  }
}

std::vector<GenerationCheck> RunDirectory::Impl::judge_signed_head(const TrustPolicy& policy,
                                                                   std::optional<std::int64_t>* head_step) const {
  const SignedEvidence e =
      gather_evidence(*root, policy, [this](io::Directory& dir, const std::string& name) { return read_small(dir, name); });
  std::vector<GenerationCheck> checks;
  std::map<std::int64_t, Sha256Digest> digests;
  // A signed generation may be absent only where the signed index records
  // that retention removed it, with the digest its signature names.
  const auto retired_on_record = [&](std::int64_t step) {
    const auto digest = digests.find(step);
    if (!e.signed_index || digest == digests.end()) return false;
    const auto it = e.signed_index->retired.find(step);
    return it != e.signed_index->retired.end() && it->second.sha256 == digest->second;
  };
  // Every generation the evidence names, with what vouches for it.
  std::map<std::int64_t, std::string> named;
  for (const auto& [step, s] : e.links) {
    named.emplace(step, concat(kCheckpointsDirectory, "/", signature_name(s.file)));
    digests.emplace(step, s.sha256);
  }
  if (e.signed_index) {
    for (const auto& [name, g] : e.signed_index->generations) {
      named.emplace(g.step, "index.json (signed)");
      digests.emplace(g.step, g.sha256);
    }
    for (const auto& [step, r] : e.signed_index->retired) {
      named.emplace(step, "index.json's retired (signed)");
      digests.emplace(step, r.sha256);
    }
  }
  for (const auto& [source, step] : e.named_steps) named.emplace(step, source);
  std::vector<std::string> broken;
  for (const auto& [source, named_digest] : e.named_heads) {
    const Sha256Digest& digest = named_digest;  // clang before 16 cannot capture a structured binding
    const auto found = std::find_if(digests.begin(), digests.end(), [&](const auto& d) { return d.second == digest; });
    if (found == digests.end()) {
      broken.push_back(concat(source, " names ", digest.hex(), " as the newest signed generation, and no signature or "
                              "signed index of the run vouches for a generation with that digest: its signature was "
                              "removed"));
    } else {
      named.emplace(found->first, source);
    }
  }
  const std::optional<std::int64_t> head = named.empty() ? std::nullopt : std::optional(named.rbegin()->first);
  if (head_step) *head_step = head;
  const std::string head_name = head ? generation_name(*head) : std::string("(none)");

  // The head: the outside witness, then LATEST against it.
  const auto head_failure = [&]() -> std::optional<std::string> {
    if (policy.min_head_step && (!head || *head < *policy.min_head_step)) {
      return concat("the newest signed generation is ", head_name, ", but the outside witness says step ",
                    *policy.min_head_step, " or later was committed: the whole run was rolled back");
    }
    if (policy.expected_head_step && head != policy.expected_head_step) {
      return concat("the newest signed generation is ", head_name, ", not step ", *policy.expected_head_step,
                    " as the outside witness says");
    }
    if (policy.expected_head_sha256) {
      const auto digest = head ? digests.find(*head) : digests.end();
      if (digest == digests.end() || digest->second != *policy.expected_head_sha256) {
        return concat("the newest signed generation is ", head_name, " (SHA-256 ",
                      digest == digests.end() ? std::string("unknown") : digest->second.hex(),
                      "), not the generation with SHA-256 ", policy.expected_head_sha256->hex(),
                      " the outside witness names");
      }
    }
    if (!head) return std::nullopt;
    if (!e.present.count(*head) && !retired_on_record(*head)) {
      return concat(head_name, " is the newest generation the run's signatures name (", named.at(*head),
                    "), and it is not on disk: a load would fall back to an older one");
    }
    if (e.pointer_step && *e.pointer_step < *head) {
      return concat("LATEST names ", generation_name(*e.pointer_step), ", but ", named.at(*head), " names ", head_name,
                    ", which is newer: LATEST was rolled back");
    }
    return std::nullopt;
  }();
  if (head_failure) {
    checks.push_back(check_failed("head", ErrorCode::signature_rollback, *head_failure));
  } else if (head) {
    checks.push_back(check_passed("head", concat("the newest signed generation is ", head_name, ", and LATEST names it")));
  }

  // The chain, from its first link to the head.
  std::optional<std::string> missing_signature;  // a signed generation still there, its signature gone
  const auto chain_failure = [&]() -> std::optional<std::string> {
    if (!broken.empty()) return broken.front();
    const SignedStatement* before = nullptr;
    for (const auto& [step, s] : e.links) {
      if (!before && s.previous_sha256) {
        return concat(s.file, " is the oldest signed generation, and it names ", s.previous_sha256->hex(),
                      " as the one before it: older generations were removed together with their signatures");
      }
      if (before && s.previous_sha256 != before->sha256) {
        return concat(s.file, " names ", hex_or(s.previous_sha256, "no generation"),
                      " as the one before it, but the signed generation before it is ", before->file, " (",
                      before->sha256.hex(), "): a generation is missing, reordered or replaced");
      }
      before = &s;
    }
    for (const auto& [step, source] : named) {
      const auto link = e.links.find(step);
      if (link == e.links.end() && e.present.count(step)) {
        if (!missing_signature) {
          missing_signature = concat(generation_name(step), " is named by ", source, " and has no trusted signature: "
                                     "its signature was removed");
        }
        continue;
      }
      if (link == e.links.end()) {
        return concat(generation_name(step), " is named by ", source, ", has no trusted signature and is not on disk: "
                      "it was removed with its signature");
      }
      if (step != head && !e.present.count(step) && !retired_on_record(step)) {
        return concat(generation_name(step), " is signed and not on disk, and no signed index records retention "
                      "removing it: it was removed");
      }
    }
    return std::nullopt;
  }();
  if (chain_failure) {
    checks.push_back(check_failed("chain", ErrorCode::signature_chain_broken, *chain_failure));
  } else if (missing_signature) {
    checks.push_back(check_failed("chain", ErrorCode::signature_missing, *missing_signature));
  } else if (!e.links.empty()) {
    checks.push_back(check_passed("chain", concat(e.links.size(), " signed generations, each naming the one before it, "
                                            "every one on disk or retired on record")));
  }
  return checks;
}

void RunDirectory::Impl::judge_signatures_on_open() {
  if (!options.trust) return;
  for (GenerationCheck& check : judge_signed_head(*options.trust, &signed_head_step)) {
    if (check.ok) continue;
    Error error(*check.code, concat(check.name, ": ", check.detail,
                                    options.recover ? "; nothing was changed" : std::string()));
    if (options.recover) throw error;
    if (!signature_verdict) signature_verdict = std::move(error);
  }
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
  // Each generation signature, on its own: format::signed_digest's checks
  // (trusted key, the statement names this generation and, while it is kept,
  // its recorded size and digest).
  const auto signatures = d.generation_signatures();
  std::optional<Sha256Digest> newest_signed;
  for (const auto& [step, name] : signatures) {
    const std::string label = concat(kCheckpointsDirectory, "/", name);
    const std::string generation = name.substr(0, name.size() - kSignatureSuffix.size());
    const auto committed = d.committed.find(step);
    const bool kept = committed != d.committed.end();
    try {
      const SignatureFile signature = *read_signature(*d.checkpoints, name);
      newest_signed = format::signed_digest(signature, policy, generation,
                                            kept ? std::optional(committed->second.size) : std::nullopt,
                                            kept ? std::optional(committed->second.sha256) : std::nullopt);
      checks.push_back(check_passed(label, concat("signed by key ", signature.key_id, kept ? "" : " (generation no longer kept)")));
    } catch (const Error& error) {
      checks.push_back(check_failed(label, error.code(), error.detail()));
    }
  }
  for (const auto& [step, g] : d.committed) {
    if (signatures.count(step) || !policy.required) continue;
    checks.push_back(check_failed(concat(kCheckpointsDirectory, "/", signature_name(g.name)), ErrorCode::signature_missing,
                            concat(g.name, " is committed and not signed")));
  }
  if (signatures.empty() && !policy.required && !policy.min_head_step && !policy.expected_head_step &&
      !policy.expected_head_sha256) {
    return checks;
  }

  // The head (the witness; LATEST) and the chain, as an open judges them.
  for (GenerationCheck& check : d.judge_signed_head(policy, nullptr)) checks.push_back(std::move(check));

  // The pointers and the index: the current bytes, naming the chain's head.
  const auto check_pointer = [&](std::string_view name, bool present) {
    if (!present) return;
    const std::string label = signature_name(name);
    try {
      const auto text = d.read_small(*d.root, std::string(name));
      if (!text) return;
      const auto signature = read_signature(*d.root, label);
      if (!signature) {
        if (policy.required) fail(ErrorCode::signature_missing, name, " is not signed");
        return;
      }
      format::signed_digest(*signature, policy, std::string(name), text->size(),
                            Sha256::of(std::as_bytes(std::span(text->data(), text->size()))));
      const SignedStatement& s = signature->statement;
      if (newest_signed && s.previous_sha256 != newest_signed) {
        fail(ErrorCode::signature_rollback, "it was signed when the newest signed generation was ",
             hex_or(s.previous_sha256, "none"), ", not ", newest_signed->hex(), ": an older ", name, " was put back");
      }
      checks.push_back(check_passed(label, concat("signed by key ", signature->key_id)));
    } catch (const Error& error) {
      checks.push_back(check_failed(label, error.code(), error.detail()));
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
