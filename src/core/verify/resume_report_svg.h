// The picture of a resume verification (DIR/report.svg): per-step loss of the
// runs on top, and below it each run's |deviation from the continuous run|
// per step on a log scale, zero deviations drawn on an "exact" floor line.
// A self-contained SVG: no scripts, fonts or external references.
//
// Thread-safety: a pure function. Non-finite points are left out of the lines
// (and counted in a note), never drawn at a made-up position.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace holdpoint::verify {

struct ChartSeries {
  std::string label;   // legend text; series with an empty label have no legend entry
  std::string color;   // an SVG color
  bool dashed = false;
  double width = 1.5;
  double opacity = 1.0;
  std::vector<std::pair<double, double>> points;  // (global step, value)
};

struct ResumePicture {
  std::string title;
  std::string subtitle;
  std::int64_t steps = 0;
  std::vector<std::int64_t> cuts;  // a dotted line after each cut's last update
  double tolerance = 0;            // drawn on the deviation axis when > 0
  std::vector<ChartSeries> losses;
  std::vector<ChartSeries> deviations;
};

// Deviations below this are drawn on the floor line labelled "exact".
inline constexpr double kExactFloor = 1e-18;

std::string render_resume_svg(const ResumePicture& picture);

}  // namespace holdpoint::verify
