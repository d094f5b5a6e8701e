// The parts of best-state capture that build fresh modules: recording a
// selection (its output witness) and the publication gate (docs/best-state.md).
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>

#include "base/fail.h"
#include "base/utc_time.h"
#include "holdpoint/checkpoint/best_state_gate.h"
#include "holdpoint/state/module_state.h"
#include "holdpoint/tensor/torch_tensor.h"
#include "holdpoint_version.h"
#include "holdpoint/base/file_system.h"
#include "base/publish.h"
#include "checkpoint/best_state_envelope.h"

namespace holdpoint {

using detail::fail;

std::string_view selection_decision_name(SelectionDecision decision) noexcept {
  switch (decision) {
    case SelectionDecision::accept:
      return "ACCEPT";
    case SelectionDecision::repair:
      return "REPAIR";
    case SelectionDecision::rerun:
      return "RERUN";
    case SelectionDecision::hold:
      return "HOLD";
  }
  return "unknown";
}

namespace {

void check_recipe(const ModuleRecipe& recipe) {
  if (!recipe.make || !recipe.forward) fail(ErrorCode::invalid_argument, "a module recipe needs make and forward");
}

std::shared_ptr<torch::nn::Module> make_fresh(const ModuleRecipe& recipe) {
  auto module = recipe.make();
  if (!module) fail(ErrorCode::invalid_argument, "the module recipe's make() returned no module");
  return module;
}

// Fills every tensor of `module` with a value its selected content cannot
// have, so that after a load, only the load can have put the selection there.
// A second poison is tried where the first happens to equal the selection
// (a selected tensor of NaNs, an integer buffer of 90s).
void poison(torch::nn::Module& module, const SelectionRecord& record) {
  at::NoGradGuard no_grad;
  for (auto& [name, tensor] : live_state(module)) {
    if (tensor.numel() == 0) continue;  // nothing to load, nothing to fake
    std::vector<c10::Scalar> poisons;
    if (tensor.scalar_type() == at::kBool) {
      poisons = {true, false};
    } else if (at::isFloatingType(tensor.scalar_type()) || at::isComplexType(tensor.scalar_type())) {
      poisons = {std::numeric_limits<double>::quiet_NaN(), -12345.0};
    } else {
      poisons = {90, 37};  // fits every integer type
    }
    const TensorWitness* selected = record.tensor(name);
    bool differs = false;
    for (const auto& value : poisons) {
      tensor.fill_(value);
      differs = !selected || !witness_of(name, tensor).same_content(*selected);
      if (differs) break;
    }
    if (!differs) {
      fail(ErrorCode::selection_poison_ineffective, "'", name,
           "' of the fresh module still equals its selected content after poisoning");
    }
  }
}

// Strict state_dict load: every name, no other, matching dtype and shape,
// copied in place (ModuleState's validate and apply).
void strict_load(torch::nn::Module& fresh, const NamedTensors& state) {
  Dict entries;
  for (const auto& [name, tensor] : state) {
    if (!entries.insert(name, tensor_value(tensor))) {
      fail(ErrorCode::invalid_argument, "the state names '", name, "' twice");
    }
  }
  const Value value = Value::ordered_dict(std::move(entries));
  ModuleState component(fresh);
  component.validate(value);
  component.apply(value);
}

// The output witness: forward on a private copy of the probe (a forward that
// writes to its input must not reach the record), in eval mode, without grad.
TensorWitness run_probe(const ModuleRecipe& recipe, torch::nn::Module& module, const TensorData& probe_input) {
  module.eval();
  at::NoGradGuard no_grad;
  const at::Tensor output = recipe.forward(module, to_at_tensor(probe_input).clone());
  if (!output.defined()) fail(ErrorCode::invalid_argument, "the module recipe's forward returned no tensor");
  return witness_of("output", output);
}

// A contiguous CPU copy in immutable storage of its own.
TensorData private_copy(const at::Tensor& tensor) {
  const at::Tensor cpu = tensor.detach().to(at::kCPU).resolve_conj().resolve_neg().contiguous();
  const DType dtype = from_scalar_type(cpu.scalar_type());
  const std::size_t nbytes = static_cast<std::size_t>(cpu.numel()) * dtype_itemsize(dtype);
  return TensorData::from_bytes(dtype, cpu.sizes().vec(),
                                {nbytes ? static_cast<const std::byte*>(cpu.data_ptr()) : nullptr, nbytes});
}


}  // namespace

SelectionRecord record_selection(const SelectionInfo& info, const NamedTensors& selected, const ModuleRecipe& recipe,
                                 const at::Tensor& probe_input) {
  check_recipe(recipe);
  if (info.label.empty()) fail(ErrorCode::invalid_argument, "a selection needs a label");
  if (!probe_input.defined()) fail(ErrorCode::invalid_argument, "a selection needs a probe input");

  // Everything below reads this private copy, never `selected` again.
  const NamedTensors copy = snapshot(selected);
  SelectionRecord record;
  record.info = info;
  for (const auto& [name, tensor] : copy) record.tensors.push_back(witness_of(name, tensor));
  record.probe_input = private_copy(probe_input);

  // The recipe must receive the selection, or no later reload could; the
  // output witness comes from that module, not from the live one, whose
  // forward could move its own buffers (batch norm in training mode).
  const auto fresh = make_fresh(recipe);
  poison(*fresh, record);
  strict_load(*fresh, copy);
  const StateComparison loaded = compare_with_record(record, live_state(*fresh));
  if (!loaded.matches) {
    fail(ErrorCode::selection_reload_mismatch,
         "the recipe's module does not hold the selection after the load: ", loaded.detail);
  }
  for (const auto& item : fresh->named_buffers()) record.buffer_names.push_back(item.key());
  record.probe_output = run_probe(recipe, *fresh, record.probe_input);

  record.runtime.holdpoint_version = HOLDPOINT_VERSION;
  record.runtime.libtorch_version = TORCH_VERSION;
  record.runtime.compiler = __VERSION__;
  record.runtime.selected_at = detail::utc_timestamp();
  record.runtime.intra_op_threads = at::get_num_threads();
  return record;
}

SelectionRecord record_selection(const SelectionInfo& info, const torch::nn::Module& module, const ModuleRecipe& recipe,
                                 const at::Tensor& probe_input) {
  return record_selection(info, live_state(module), recipe, probe_input);
}

// ---- the gate --------------------------------------------------------------------

namespace {

// Every check on the staged bytes, in the order of docs/best-state.md; the
// first failure throws with its code and publish() removes the staging file.
void verify_staged(std::span<std::byte> bytes, const std::shared_ptr<const void>& owner, const SelectionRecord& record,
                   const ModuleRecipe& recipe, const SelectionGateOptions& options, PublicationAttempt& attempt) {
  const SelectionEnvelope envelope = selection::parse_envelope(bytes, owner);
  const std::string difference = describe_record_difference(record, envelope.record);
  if (!difference.empty()) {
    fail(ErrorCode::selection_record_mismatch,
         "the staged envelope's record differs from the trusted one: ", difference);
  }
  check_matches_record(record, envelope.state);

  const auto fresh = make_fresh(recipe);
  poison(*fresh, record);
  attempt.poisoned = true;
  if (options.load) {
    options.load(*fresh, envelope.state);
  } else {
    strict_load(*fresh, envelope.state);
  }
  attempt.reloaded = true;
  attempt.reloaded_state = compare_with_record(record, live_state(*fresh));
  if (!attempt.reloaded_state.matches) {
    fail(ErrorCode::selection_reload_mismatch,
         "the fresh module does not hold the selection after the load: ", attempt.reloaded_state.detail);
  }
  attempt.output = run_probe(recipe, *fresh, record.probe_input);
  attempt.output_matches = attempt.output->same_content(record.probe_output);
  if (!attempt.output_matches) {
    fail(ErrorCode::selection_output_mismatch, "the reloaded module's output on the probe is ",
         attempt.output->content_text(), ", the selection recorded ", record.probe_output.content_text());
  }
  attempt.verified = true;
}

PublicationAttempt attempt_publication(const std::filesystem::path& target, const SelectionRecord& record,
                                       const ModuleRecipe& recipe, const SelectionCandidate& candidate,
                                       const SelectionGateOptions& options) {
  PublicationAttempt attempt;
  attempt.route = candidate.route;
  bool checks_returned = false;
  try {
    // What is checked is what is written: one private copy for both, so a
    // candidate that changes meanwhile cannot slip between them.
    const NamedTensors copy = snapshot(candidate.tensors);
    attempt.candidate = compare_with_record(record, copy);
    if (candidate.claimed_record) {
      const std::string difference = describe_record_difference(record, *candidate.claimed_record);
      if (!difference.empty()) {
        attempt.candidate.matches = false;
        attempt.candidate.first_mismatch = ErrorCode::selection_record_mismatch;
        attempt.candidate.detail = "the candidate's record differs from the trusted one: " + difference;
      }
    }

    io::FileSystem& file_system = options.file_system ? *options.file_system : io::posix_file_system();
    const std::filesystem::path parent = target.has_parent_path() ? target.parent_path() : ".";
    const auto directory = file_system.open_directory(parent, false);
    io::PublishOptions publish_options;
    publish_options.replace = true;  // a new selection supersedes the previous one
    publish_options.durable = options.durable;
    publish_options.read_back = options.read_back;
    publish_options.verifier_checks_content = true;  // verify_staged parses the envelope, CRC-32s included
    publish_options.before_rename = [&] {
      if (options.before_publish) options.before_publish();
      checks_returned = true;
    };
    const io::PublishResult published = io::publish(
        *directory, target.filename().string(), publish_options,
        [&](io::ByteSink& sink) {
          attempt.staged = true;
          // A candidate read from an envelope travels with the record it
          // claims, so a mislabelled one fails the staged record check too.
          selection::write_envelope(sink, candidate.claimed_record ? *candidate.claimed_record : record,
                                    candidate.route, copy);
        },
        [&](std::span<std::byte> bytes, const std::shared_ptr<const void>& owner) {
          verify_staged(bytes, owner, record, recipe, options, attempt);
          // The staged checks cover everything the in-memory comparison
          // does; this keeps a refused candidate unpublishable regardless.
          if (!attempt.candidate.matches) fail(*attempt.candidate.first_mismatch, attempt.candidate.detail);
        });
    attempt.published = true;
    attempt.sha256 = published.sha256;
    attempt.file_bytes = published.size;
  } catch (const Error& error) {
    attempt.failure = error.code();
    attempt.failure_detail = error.what();
    // publish() renames before it fsyncs the directory: that failure comes
    // after the file took the target's name.
    attempt.published = checks_returned && error.code() == ErrorCode::io_sync_failed;
  } catch (const c10::Error& error) {
    attempt.failure_detail = error.what_without_backtrace();
  }
  return attempt;
}

// The candidate provably does not hold the selection (as opposed to: it could
// not be compared, or it matched and something later failed).
bool lost_selection(const PublicationAttempt& attempt) {
  return !attempt.candidate.matches && attempt.candidate.first_mismatch.has_value();
}

std::string failure_text(const PublicationAttempt& attempt) {
  if (attempt.failure) return detail::concat(error_code_name(*attempt.failure), ": ", attempt.failure_detail);
  return attempt.failure_detail;
}

}  // namespace

SelectionGateReport publish_selection(const std::filesystem::path& target, const SelectionRecord& record,
                                      const ModuleRecipe& recipe, const SelectionCandidate& candidate,
                                      const SelectionCandidate* faithful_copy, const SelectionGateOptions& options) {
  check_recipe(recipe);
  SelectionGateReport report;
  report.target = target;
  report.candidate = attempt_publication(target, record, recipe, candidate, options);
  const PublicationAttempt& first = report.candidate;

  const auto settle_published = [&](const PublicationAttempt& attempt, SelectionDecision decision,
                                    const std::string& what) {
    if (attempt.failure) {
      report.decision = SelectionDecision::rerun;
      report.reason = what +
                      " was renamed into place but the directory fsync failed, so the rename may not "
                      "survive a crash; run the gate again (" +
                      failure_text(attempt) + ")";
    } else {
      report.decision = decision;
      report.reason = what + " holds the selection, its staged envelope verified, and it was published";
    }
  };

  if (first.published) {
    settle_published(first, SelectionDecision::accept, "candidate '" + first.route + "'");
  } else if (!lost_selection(first)) {
    report.decision = SelectionDecision::rerun;
    report.reason = "candidate '" + first.route + "' holds the selection but the gate did not complete; nothing " +
                    "was published (" + failure_text(first) + ")";
  } else if (!faithful_copy) {
    report.decision = SelectionDecision::hold;
    report.reason = "candidate '" + first.route + "' does not hold the selection (" +
                    std::string(error_code_name(*first.candidate.first_mismatch)) + ": " + first.candidate.detail +
                    ") and no faithful copy was offered; nothing was published";
  } else {
    report.faithful_copy = attempt_publication(target, record, recipe, *faithful_copy, options);
    const PublicationAttempt& copy = *report.faithful_copy;
    const std::string lost = "candidate '" + first.route + "' does not hold the selection (" +
                             std::string(error_code_name(*first.candidate.first_mismatch)) + ")";
    if (copy.published) {
      settle_published(copy, SelectionDecision::repair, lost + "; faithful copy '" + copy.route + "'");
    } else if (lost_selection(copy)) {
      report.decision = SelectionDecision::hold;
      report.reason = lost + " and neither does faithful copy '" + copy.route + "' (" +
                      std::string(error_code_name(*copy.candidate.first_mismatch)) + ": " + copy.candidate.detail +
                      "); nothing was published";
    } else {
      report.decision = SelectionDecision::rerun;
      report.reason = lost + "; faithful copy '" + copy.route + "' holds it but the gate did not complete; " +
                      "nothing was published (" + failure_text(copy) + ")";
    }
  }
  return report;
}

}  // namespace holdpoint
