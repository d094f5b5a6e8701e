// Fuzz target for parse_run_summary, the reader of the summary.json a trainer
// writes under the resume protocol (docs/verification.md). The whole input is
// the JSON text. Rejection with holdpoint::Error (the resume_summary_* codes)
// is the expected outcome for most inputs; anything else (a crash, a
// sanitizer report, another exception such as nlohmann's) is a bug, and so
// is an accepted summary whose trace records do not name exactly the
// summary's generators, in order.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "holdpoint/base/error.h"
#include "holdpoint/verify/resume_verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const holdpoint::RunSummary summary = holdpoint::parse_run_summary(text, "summary.json (fuzz)");
    double sum = holdpoint::trace_number_value(summary.final_loss) + holdpoint::trace_number_value(summary.final_mse) +
                 holdpoint::trace_number_value(summary.final_next_lr);
    for (const auto& step : summary.trace) {
      if (step.rng_next.size() != summary.generators.size()) __builtin_trap();
      for (std::size_t i = 0; i < step.rng_next.size(); ++i) {
        if (step.rng_next[i].first != summary.generators[i]) __builtin_trap();
        sum += holdpoint::trace_number_value(step.rng_next[i].second);
      }
      sum += holdpoint::trace_number_value(step.lr) + holdpoint::trace_number_value(step.loss);
    }
    volatile double sink = sum;
    (void)sink;
  } catch (const holdpoint::Error&) {
  }
  return 0;
}
