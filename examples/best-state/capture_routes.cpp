// capture_routes: seed 004's fixture end to end (docs/best-state.md).
//
//   capture_routes [--dir DIR] [--json FILE]
//
// Selects the tiny module at w=2, offset=1 (output 7 at x=3), captures it by
// every route in tiny_selection.h, updates the module in place (w=7,
// offset=11, output 32), then classifies each route with the storage
// diagnostics and sends it through the publication gate, offering the
// snapshot as the faithful copy. Then the two publication negative controls
// against a previously accepted file: a later-state candidate carrying the
// selected record, and a failure injected after validation and before the
// rename; each must leave that file's bytes unchanged and no staging file.
//
// Published files go to DIR (default: a new directory under the system temp
// directory), the evidence to FILE as JSON; stdout gets one line per case.
// Exit 0 when every case ended as the fixture expects, 1 when one did not
// (the evidence says which), 2 on a usage or setup error. Exit 0 does not mean
// every candidate was accepted: read the decisions.
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "holdpoint/checkpoint/best_state_gate.h"
#include "tiny_selection.h"

namespace {

using holdpoint::SelectionDecision;
using Json = nlohmann::ordered_json;
using namespace tiny_selection;

struct Arguments {
  std::filesystem::path dir;
  std::filesystem::path json;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments arguments;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if ((flag == "--dir" || flag == "--json") && i + 1 < argc) {
      (flag == "--dir" ? arguments.dir : arguments.json) = argv[++i];
    } else {
      throw std::invalid_argument("usage: capture_routes [--dir DIR] [--json FILE]");
    }
  }
  if (arguments.dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "holdpoint-best-state-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("cannot create a directory under the temp directory");
    arguments.dir = pattern;
  } else {
    std::filesystem::create_directories(arguments.dir);
  }
  return arguments;
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> staging_files(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".staging-") != std::string::npos) names.push_back(name);
  }
  return names;
}

Json values_of(const holdpoint::NamedTensors& tensors) {
  Json values = Json::object();
  for (const auto& [name, tensor] : tensors) values[name] = tensor.item<float>();
  return values;
}

// The published file read back as a consumer would: the restricted reader,
// the envelope checks, and the record's witnesses.
Json readback(const std::filesystem::path& path, const holdpoint::SelectionRecord& record) {
  const holdpoint::SelectionEnvelope envelope = holdpoint::read_selection_envelope(path);
  const holdpoint::StateComparison comparison = holdpoint::compare_with_record(record, envelope.state);
  return {{"route", envelope.route}, {"matches_record", comparison.matches}, {"values", values_of(envelope.state)}};
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  try {
    arguments = parse_arguments(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << error.what() << "\n";
    return 2;
  }
  try {
    at::set_num_threads(1);
    Tiny model;
    if (output_at_probe(*model) != 7.0f) throw std::runtime_error("the fixture does not start at output 7");
    const holdpoint::ModuleRecipe recipe = tiny_recipe();
    const holdpoint::SelectionRecord record =
        holdpoint::record_selection(tiny_selection_info(), *model, recipe, probe_input());
    const CapturedRoutes routes = capture_routes(model, record);

    // eval() changes a flag, not the storage: the update below still moves
    // every handle that shares it.
    const void* w_before = model->w.data_ptr();
    model->eval();
    if (model->w.data_ptr() != w_before) throw std::runtime_error("eval() moved a tensor");
    update_in_place(*model);
    const float live_output = output_at_probe(*model);
    if (live_output != 32.0f) throw std::runtime_error("the update did not move the output to 32");

    bool as_expected = true;
    Json cases = Json::array();
    const std::filesystem::path route_dir = arguments.dir / "routes";
    std::filesystem::create_directories(route_dir);
    const holdpoint::SelectionCandidate faithful{"snapshot", routes.snapshot, {}};
    for (const RouteCandidate& route : route_candidates(routes)) {
      const holdpoint::CandidateDiagnostics diagnostics = holdpoint::diagnose(route.candidate.tensors, *model);
      const std::filesystem::path target = route_dir / (route.candidate.route + ".pt");
      const holdpoint::SelectionGateReport report =
          holdpoint::publish_selection(target, record, recipe, route.candidate, &faithful);
      const bool ok = report.decision == route.expected;
      as_expected = as_expected && ok;
      Json row;
      row["route"] = route.candidate.route;
      row["expected"] = std::string(holdpoint::selection_decision_name(route.expected));
      row["decision"] = std::string(holdpoint::selection_decision_name(report.decision));
      row["as_expected"] = ok;
      row["values_after_update"] = values_of(route.candidate.tensors);
      row["diagnostics"] = Json::parse(holdpoint::to_json(diagnostics));
      row["gate"] = Json::parse(holdpoint::to_json(report));
      row["published_readback"] = std::filesystem::exists(target) ? readback(target, record) : Json(nullptr);
      cases.push_back(std::move(row));
      std::printf("%-26s is_live_mapping=%-5s shares_storage=%-5s values=%-24s %-6s (expected %s)%s\n",
                  route.candidate.route.c_str(), diagnostics.is_live_mapping ? "true" : "false",
                  diagnostics.shares_storage ? "true" : "false", cases.back()["values_after_update"].dump().c_str(),
                  std::string(holdpoint::selection_decision_name(report.decision)).c_str(),
                  std::string(holdpoint::selection_decision_name(route.expected)).c_str(), ok ? "" : "  UNEXPECTED");
    }

    // The previously accepted file, then the two negative controls against it.
    const std::filesystem::path accepted = arguments.dir / "accepted.pt";
    const holdpoint::SelectionGateReport first = holdpoint::publish_selection(accepted, record, recipe, faithful);
    if (first.decision != SelectionDecision::accept) throw std::runtime_error("the snapshot was not accepted");
    const std::string accepted_bytes = read_bytes(accepted);

    struct Control {
      std::string name;
      holdpoint::SelectionCandidate candidate;
      holdpoint::SelectionGateOptions options;
      SelectionDecision expected;
      holdpoint::ErrorCode expected_code;
    };
    holdpoint::SelectionGateOptions inject;
    inject.before_publish = [] {
      throw holdpoint::Error(holdpoint::ErrorCode::io_rename_failed,
                             "injected after every check passed, before the rename (negative control)");
    };
    const std::vector<Control> controls = {
        // Serialised after the update, under the selected record: keys,
        // dtypes and shapes are right, the values are not.
        {"later_state_with_selected_record",
         holdpoint::decode_selection_envelope(
             holdpoint::encode_selection_envelope(record,
                                                  {"serialized_after_update", holdpoint::live_state(*model), {}}))
             .candidate(),
         {},
         SelectionDecision::hold,
         holdpoint::ErrorCode::selection_content_mismatch},
        {"failure_before_publish", faithful, inject, SelectionDecision::rerun, holdpoint::ErrorCode::io_rename_failed},
    };
    Json control_rows = Json::array();
    for (const Control& control : controls) {
      const holdpoint::SelectionGateReport report =
          holdpoint::publish_selection(accepted, record, recipe, control.candidate, nullptr, control.options);
      const bool unchanged = read_bytes(accepted) == accepted_bytes;
      const std::vector<std::string> leftovers = staging_files(arguments.dir);
      const bool code_ok = report.candidate.failure == control.expected_code;
      const bool ok = report.decision == control.expected && code_ok && unchanged && leftovers.empty();
      as_expected = as_expected && ok;
      Json row;
      row["control"] = control.name;
      row["expected"] = std::string(holdpoint::selection_decision_name(control.expected));
      row["decision"] = std::string(holdpoint::selection_decision_name(report.decision));
      row["expected_failure"] = std::string(holdpoint::error_code_name(control.expected_code));
      row["as_expected"] = ok;
      row["previous_file_unchanged"] = unchanged;
      row["staging_files_left"] = leftovers;
      row["gate"] = Json::parse(holdpoint::to_json(report));
      control_rows.push_back(std::move(row));
      std::printf("%-34s %-6s (expected %s) previous file unchanged=%s staging files left=%zu%s\n",
                  control.name.c_str(), std::string(holdpoint::selection_decision_name(report.decision)).c_str(),
                  std::string(holdpoint::selection_decision_name(control.expected)).c_str(),
                  unchanged ? "true" : "false", leftovers.size(), ok ? "" : "  UNEXPECTED");
    }

    Json evidence;
    evidence["selection"] = Json::parse(holdpoint::to_json(record));
    evidence["live_output_after_update"] = live_output;
    evidence["live_values_after_update"] = values_of(holdpoint::live_state(*model));
    evidence["eval_training_flag"] = model->is_training();
    evidence["directory"] = arguments.dir.string();
    evidence["cases"] = std::move(cases);
    evidence["accepted"] = {{"path", accepted.string()}, {"gate", Json::parse(holdpoint::to_json(first))}};
    evidence["controls"] = std::move(control_rows);
    evidence["all_as_expected"] = as_expected;
    if (!arguments.json.empty()) {
      std::ofstream out(arguments.json);
      out << evidence.dump(2) << "\n";
      if (!out) throw std::runtime_error("cannot write " + arguments.json.string());
    }
    std::printf("all_as_expected=%s directory=%s\n", as_expected ? "true" : "false", arguments.dir.c_str());
    return as_expected ? 0 : 1;
  } catch (const std::exception& error) {
    std::cerr << "capture_routes: " << error.what() << "\n";
    return 2;
  }
}
