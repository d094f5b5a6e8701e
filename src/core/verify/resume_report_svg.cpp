#include "verify/resume_report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

namespace holdpoint::verify {

namespace {

constexpr double kWidth = 820;
constexpr double kLeft = 78;    // room for the y tick labels
constexpr double kRight = 210;  // room for the legend
constexpr double kPlotWidth = kWidth - kLeft - kRight;
constexpr double kLossTop = 88, kLossHeight = 220;
constexpr double kDeviationTop = 370, kDeviationHeight = 220;
constexpr double kHeight = kDeviationTop + kDeviationHeight + 70;

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string number(double value, const char* format = "%.2f") {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

// A vertical axis: value -> y pixel.
struct Axis {
  double top, height, low, high;
  bool log;
  double y(double value) const {
    const double v = log ? std::log10(std::max(value, kExactFloor)) : value;
    const double lo = log ? std::log10(low) : low, hi = log ? std::log10(high) : high;
    return top + height * (1 - (v - lo) / (hi - lo));
  }
};

struct Frame {
  std::int64_t steps;
  double x(double step) const {
    return kLeft + kPlotWidth * (steps > 1 ? (step - 1) / static_cast<double>(steps - 1) : 0.5);
  }
};

// Line segments through the finite points (a non-finite point breaks the line), with a dot per point.
void draw_series(std::ostringstream& svg, const ChartSeries& series, const Frame& frame, const Axis& axis,
                 std::size_t& omitted) {
  const std::string style = "fill=\"none\" stroke=\"" + series.color + "\" stroke-width=\"" + number(series.width, "%.1f") +
                            "\" stroke-opacity=\"" + number(series.opacity) + "\"" +
                            (series.dashed ? " stroke-dasharray=\"6 4\"" : "");
  std::string path;
  bool pen_down = false;
  for (const auto& [step, value] : series.points) {
    if (!std::isfinite(value)) {
      ++omitted;
      pen_down = false;
      continue;
    }
    path += (pen_down ? " L" : " M") + number(frame.x(step), "%.1f") + " " + number(axis.y(value), "%.1f");
    pen_down = true;
  }
  if (!path.empty()) svg << "<path d=\"" << path.substr(1) << "\" " << style << "/>\n";
  for (const auto& [step, value] : series.points) {
    if (!std::isfinite(value)) continue;
    svg << "<circle cx=\"" << number(frame.x(step), "%.1f") << "\" cy=\"" << number(axis.y(value), "%.1f")
        << "\" r=\"2.5\" fill=\"" << series.color << "\" fill-opacity=\"" << number(series.opacity) << "\"/>\n";
  }
}

void draw_step_axis(std::ostringstream& svg, const Frame& frame, double bottom, const std::vector<std::int64_t>& cuts,
                    double top) {
  svg << "<line x1=\"" << kLeft << "\" y1=\"" << bottom << "\" x2=\"" << kLeft + kPlotWidth << "\" y2=\"" << bottom
      << "\" stroke=\"#444\"/>\n";
  const std::int64_t every = std::max<std::int64_t>(1, frame.steps / 20);
  for (std::int64_t step = 1; step <= frame.steps; step += every) {
    svg << "<text x=\"" << number(frame.x(step), "%.1f") << "\" y=\"" << bottom + 16
        << "\" text-anchor=\"middle\">" << step << "</text>\n";
  }
  svg << "<text x=\"" << kLeft + kPlotWidth / 2 << "\" y=\"" << bottom + 34 << "\" text-anchor=\"middle\">update (global step)</text>\n";
  for (const std::int64_t cut : cuts) {
    const double x = frame.x(static_cast<double>(cut) + 0.5);
    svg << "<line x1=\"" << number(x, "%.1f") << "\" y1=\"" << top << "\" x2=\"" << number(x, "%.1f") << "\" y2=\""
        << bottom << "\" stroke=\"#999\" stroke-dasharray=\"2 3\"/>\n";
  }
}

void draw_legend(std::ostringstream& svg, const std::vector<ChartSeries>& series, double top) {
  double y = top + 8;
  for (const ChartSeries& s : series) {
    if (s.label.empty()) continue;
    const double x = kLeft + kPlotWidth + 16;
    svg << "<line x1=\"" << x << "\" y1=\"" << y << "\" x2=\"" << x + 22 << "\" y2=\"" << y << "\" stroke=\"" << s.color
        << "\" stroke-width=\"" << number(std::max(s.width, 2.0), "%.1f") << "\""
        << (s.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n";
    svg << "<text x=\"" << x + 28 << "\" y=\"" << y + 4 << "\">" << escape(s.label) << "</text>\n";
    y += 18;
  }
}

}  // namespace

std::string render_resume_svg(const ResumePicture& picture) {
  const Frame frame{std::max<std::int64_t>(picture.steps, 1)};
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << kLeft << "\" y=\"26\" font-size=\"16\" font-weight=\"bold\">" << escape(picture.title)
      << "</text>\n";
  svg << "<text x=\"" << kLeft << "\" y=\"46\" fill=\"#555\">" << escape(picture.subtitle) << "</text>\n";

  // Loss, linear.
  double low = INFINITY, high = -INFINITY;
  for (const ChartSeries& s : picture.losses) {
    for (const auto& point : s.points) {
      if (!std::isfinite(point.second)) continue;
      low = std::min(low, point.second);
      high = std::max(high, point.second);
    }
  }
  if (!std::isfinite(low)) low = 0, high = 1;
  if (high - low < 1e-12) high = low + 1;
  // Ticks at a round step (1, 2 or 5 x 10^k), about five of them.
  const double raw_step = (high - low) / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw_step)));
  const double tick = magnitude * (raw_step / magnitude > 5 ? 10 : raw_step / magnitude > 2 ? 5 : raw_step / magnitude > 1 ? 2 : 1);
  const Axis loss{kLossTop, kLossHeight, std::floor(low / tick) * tick, std::ceil(high / tick) * tick, false};
  std::size_t omitted = 0;
  svg << "<text x=\"" << kLeft << "\" y=\"" << kLossTop - 8 << "\" font-weight=\"bold\">training loss per update</text>\n";
  for (double value = loss.low; value <= loss.high + tick / 2; value += tick) {
    const double y = loss.y(value);
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(y, "%.1f") << "\" x2=\"" << kLeft + kPlotWidth << "\" y2=\""
        << number(y, "%.1f") << "\" stroke=\"#eee\"/>\n";
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << number(y + 4, "%.1f") << "\" text-anchor=\"end\">"
        << number(std::fabs(value) < tick / 1e6 ? 0.0 : value, "%.3g") << "</text>\n";
  }
  draw_step_axis(svg, frame, kLossTop + kLossHeight, picture.cuts, kLossTop);
  for (const ChartSeries& s : picture.losses) draw_series(svg, s, frame, loss, omitted);
  draw_legend(svg, picture.losses, kLossTop);

  // |deviation|, log scale from the exact floor to the next decade above the largest.
  double largest = 1e-3;
  for (const ChartSeries& s : picture.deviations) {
    for (const auto& point : s.points) {
      if (std::isfinite(point.second)) largest = std::max(largest, point.second);
    }
  }
  const Axis deviation{kDeviationTop, kDeviationHeight, kExactFloor, std::pow(10.0, std::ceil(std::log10(largest))),
                       true};
  svg << "<text x=\"" << kLeft << "\" y=\"" << kDeviationTop - 8
      << "\" font-weight=\"bold\">|loss - continuous loss| per update (log scale)</text>\n";
  // A grid line every third decade from the floor, and one at the top.
  std::vector<double> decades;
  for (double decade = std::log10(deviation.low); decade < std::log10(deviation.high) - 1.5; decade += 3) {
    decades.push_back(decade);
  }
  decades.push_back(std::log10(deviation.high));
  for (const double decade : decades) {
    const double value = std::pow(10.0, decade);
    const double y = deviation.y(value);
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(y, "%.1f") << "\" x2=\"" << kLeft + kPlotWidth << "\" y2=\""
        << number(y, "%.1f") << "\" stroke=\"#eee\"/>\n";
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << number(y + 4, "%.1f") << "\" text-anchor=\"end\">"
        << (value <= kExactFloor ? std::string("exact") : number(value, "%.0e")) << "</text>\n";
  }
  if (picture.tolerance > kExactFloor) {
    const double y = deviation.y(picture.tolerance);
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(y, "%.1f") << "\" x2=\"" << kLeft + kPlotWidth << "\" y2=\""
        << number(y, "%.1f") << "\" stroke=\"#c80\" stroke-dasharray=\"8 3\"/>\n";
    svg << "<text x=\"" << kLeft + kPlotWidth - 4 << "\" y=\"" << number(y - 4, "%.1f")
        << "\" text-anchor=\"end\" fill=\"#c80\">tolerance " << number(picture.tolerance, "%.0e") << "</text>\n";
  }
  draw_step_axis(svg, frame, kDeviationTop + kDeviationHeight, picture.cuts, kDeviationTop);
  for (const ChartSeries& s : picture.deviations) draw_series(svg, s, frame, deviation, omitted);
  draw_legend(svg, picture.deviations, kDeviationTop);

  std::string note = "dotted vertical line: the cut (interruption after that update)";
  if (omitted) note += "; " + std::to_string(omitted) + " non-finite value(s) not drawn";
  svg << "<text x=\"" << kLeft << "\" y=\"" << kHeight - 14 << "\" fill=\"#555\">" << escape(note) << "</text>\n";
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace holdpoint::verify
