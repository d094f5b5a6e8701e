// make_run_directory DIR --generations N [--step-interval S] [--metric-sequence V1,V2,...]
//
// Creates a run directory with N committed generations through
// RunDirectory::commit, for the CLI tests (tests/python/test_cli_run.py). Each
// generation is a real checkpoint: a holdpoint manifest under "holdpoint" and a
// small float32 tensor whose values depend on the step, so every file differs.
// Generation i (0-based) has step (i + 1) * S (S defaults to 1), epoch i and
// metrics {"loss": V_i}; without --metric-sequence the loss falls with each
// step, so BEST is LATEST. BEST ranks by "loss", lower is better.
//
// Exit status: 0 when every generation was committed, 1 when a commit failed
// (the error code is printed), 2 on usage errors.

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "format/pt_writer.h"
#include "holdpoint/base/error.h"
#include "holdpoint/schema/manifest.h"
#include "holdpoint/run/run_directory.h"
#include "holdpoint/format/value.h"
#include "holdpoint/base/byte_sink.h"

namespace {

int usage(const std::string& why) {
  std::cerr << "make_run_directory: " << why << "\n"
            << "usage: make_run_directory DIR --generations N [--step-interval S] [--metric-sequence V1,V2,...]\n";
  return 2;
}

std::vector<double> parse_sequence(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::stod(item));
  return values;
}

holdpoint::Value checkpoint_root(std::int64_t step) {
  holdpoint::Manifest manifest;
  manifest.semantic_identity = "make_run_directory";
  std::vector<float> weights(4);
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(step) + 0.25f * static_cast<float>(i);
  const auto* bytes = reinterpret_cast<const std::byte*>(weights.data());
  holdpoint::Dict root;
  root.insert("holdpoint", manifest.to_value());
  root.insert("weight", holdpoint::Value::tensor(holdpoint::TensorData::from_bytes(
                            holdpoint::DType::float32, {4}, {bytes, weights.size() * sizeof(float)})));
  root.insert("step", holdpoint::Value::integer(step));
  return holdpoint::Value::dict(std::move(root));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("missing DIR");
  const std::string directory = argv[1];
  std::int64_t generations = -1;
  std::int64_t interval = 1;
  std::vector<double> metrics;
  try {
    for (int i = 2; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 == argc) return usage(flag + " needs a value");
      const std::string value = argv[++i];
      if (flag == "--generations") {
        generations = std::stoll(value);
      } else if (flag == "--step-interval") {
        interval = std::stoll(value);
      } else if (flag == "--metric-sequence") {
        metrics = parse_sequence(value);
      } else {
        return usage("unknown option " + flag);
      }
    }
  } catch (const std::exception&) {
    return usage("a value is not a number");
  }
  if (generations < 0) return usage("--generations N is required (N >= 0)");
  if (interval < 1) return usage("--step-interval must be at least 1");
  if (!metrics.empty() && static_cast<std::int64_t>(metrics.size()) != generations) {
    return usage("--metric-sequence needs one value per generation");
  }

  try {
    holdpoint::RunDirectoryOptions options;
    options.best_metric = holdpoint::BestMetric{"loss", false};
    holdpoint::RunDirectory run(directory, options);
    for (std::int64_t i = 0; i < generations; ++i) {
      holdpoint::GenerationSpec spec;
      spec.step = (i + 1) * interval;
      spec.epoch = i;
      const double loss = metrics.empty() ? 1.0 / static_cast<double>(i + 1) : metrics[static_cast<std::size_t>(i)];
      spec.metrics = {{"loss", loss}};
      const holdpoint::Value root = checkpoint_root(spec.step);
      const auto result = run.commit(spec, [&](holdpoint::io::ByteSink& sink) {
        holdpoint::format::PtWriteOptions write_options;
        write_options.torch_1_13_compatible = true;  // so Python's torch 1.13 weights_only loader reads it
        holdpoint::format::write_pt(sink, root, write_options);
      });
      std::cout << result.generation.name << " " << result.generation.sha256.hex()
                << (result.became_best ? " best" : "") << "\n";
    }
  } catch (const holdpoint::Error& error) {
    std::cerr << "make_run_directory: " << holdpoint::error_code_name(error.code()) << ": " << error.what() << "\n";
    return 1;
  }
  return 0;
}
