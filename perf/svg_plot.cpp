// --svg: two panels against size on a log2 axis, both out of place (what nccl-tests reports): the
// time per call and the bus bandwidth. One line per series (weft as tuned, each --algos algorithm,
// the --compare peer) and weft's pick at each size as a marker: colour for the algorithm, shape
// for the protocol. Self-contained: no scripts, no fonts.
#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "perf/report.hpp"
#include "src/tools/svg_axes.hpp"

namespace weft::perf {
namespace {

namespace svg = tools::svg;

struct Point {
  double timeUs = 0, busBw = 0;
  std::string plan;  // "algorithm/protocol"; empty for the peer
};

enum class Kind { tuned, forced, peer };

struct Series {
  std::string label;
  Kind kind = Kind::tuned;
  std::string color, dash;
  std::map<std::size_t, Point> bySize;  // a later cycle's value replaces an earlier one
};

std::string comboOf(const Row& r) {
  return std::string(tableName(r.type)) + (r.op ? " " + std::string(tableName(*r.op)) : "") +
         (r.root >= 0 ? ", root " + std::to_string(r.root) : "");
}

std::vector<Series> collect(const Options& options, const std::string& peerName,
                            const std::vector<Row>& rows) {
  // Rows of several types, ops or roots make one line per combination, told apart by dashes
  // (in the order the combinations first come).
  static constexpr std::array<const char*, 6> kDashes = {"",        "7 4",  "2 3",
                                                         "9 3 2 3", "14 4", "4 2 4 6"};
  std::map<std::string, int> combos;
  for (const Row& r : rows) combos.emplace(comboOf(r), static_cast<int>(combos.size()));

  std::vector<Series> series;
  std::map<std::string, std::size_t> index;
  auto point = [&](Kind kind, const std::string& label, const std::string& color, const Row& r,
                   Point p) {
    const bool several = combos.size() > 1;
    const int c = combos[comboOf(r)];
    const std::string full = several ? label + ", " + comboOf(r) : label;
    auto [it, added] = index.emplace(full, series.size());
    if (added) {
      const int dash = (c + (kind == Kind::peer ? 1 : 0)) % static_cast<int>(kDashes.size());
      series.push_back({full, kind, color, kDashes[static_cast<std::size_t>(dash)], {}});
    }
    series[it->second].bySize[r.bytes] = std::move(p);
  };
  for (const Row& r : rows) {
    if (r.bytes == 0) continue;  // no place on a log axis
    point(Kind::tuned, "weft (tuned)", "#111111", r,
          {r.outOfPlace.timeUs, r.outOfPlace.busBw, r.plan});
    for (std::size_t k = 0; k < r.forced.size() && k < options.algos.size(); ++k) {
      if (const auto& m = r.forced[k].outOfPlace) {
        point(Kind::forced, "weft " + options.algos[k].label() + " (forced)",
              svg::algorithmColor(options.algos[k].algorithm), r,
              {m->timeUs, m->busBw, r.forced[k].plan});
      }
    }
    if (r.peerTimeUs && *r.peerTimeUs > 0) {
      // Same bytes, the peer's time: bus bandwidth scales inversely.
      point(Kind::peer, peerName, "#666666", r,
            {*r.peerTimeUs, r.outOfPlace.busBw * r.outOfPlace.timeUs / *r.peerTimeUs, ""});
    }
  }
  // Draw order and legend order: the peer and forced algorithms under weft as tuned.
  std::stable_sort(series.begin(), series.end(), [](const Series& a, const Series& b) {
    return static_cast<int>(a.kind) < static_cast<int>(b.kind);
  });
  return series;
}

// The range of one measure over every series: [smallest positive or 0, largest].
std::pair<double, double> rangeOf(const std::vector<Series>& series, double Point::*measure) {
  double lo = HUGE_VAL, hi = 0;
  for (const Series& s : series) {
    for (const auto& [size, p] : s.bySize) {
      if (p.*measure > 0) lo = std::min(lo, p.*measure);
      hi = std::max(hi, p.*measure);
    }
  }
  return {std::isfinite(lo) ? lo : 0, hi};
}

// One panel: frame, every series' line and points, weft's picks on top.
std::string panel(const std::vector<Series>& series, const svg::Axis& x, const svg::Axis& y,
                  double Point::*measure) {
  std::string out = svg::frame(x, y);
  // Draw the tuned series last so that its pick markers sit on top.
  for (int pass = 0; pass < 2; ++pass) {
    for (const Series& s : series) {
      if ((s.kind == Kind::tuned) != (pass == 1)) continue;
      std::vector<std::pair<double, double>> points;
      std::vector<const Point*> shown;
      for (const auto& [size, p] : s.bySize) {
        if (!y.shows(p.*measure)) continue;
        points.push_back({x.pixel(double(size)), y.pixel(p.*measure)});
        shown.push_back(&p);
      }
      const bool tuned = s.kind == Kind::tuned;
      out += svg::polyline(points, s.color, tuned ? 2.2 : 1.7, s.dash);
      for (std::size_t i = 0; i < points.size(); ++i) {
        const auto [px, py] = points[i];
        if (tuned) {
          const auto [algorithm, protocol] = svg::splitPlan(shown[i]->plan);
          out += svg::marker(svg::protocolShape(protocol), px, py, 4.5,
                             svg::algorithmColor(algorithm), "#111111", 0.8);
        } else {
          out += svg::marker(svg::Shape::circle, px, py, 2.2, s.color);
        }
      }
    }
  }
  return out;
}

}  // namespace

bool writeSvg(const std::string& path, const Options& options, int nranks,
              const std::string& peerName, const std::vector<Row>& rows) {
  const std::vector<Series> series = collect(options, peerName, rows);
  double xMin = HUGE_VAL, xMax = 0;
  for (const Series& s : series) {
    for (const auto& [size, p] : s.bySize) {
      xMin = std::min(xMin, double(size));
      xMax = std::max(xMax, double(size));
    }
  }
  if (series.empty()) xMin = 1, xMax = 2;

  // Two panels stacked on one size axis, the legend to the right of the top one.
  constexpr double kLeft = 92, kPlotW = 600, kTop = 76, kPanelH = 270, kGap = 80;
  const double top2 = kTop + kPanelH + kGap;
  const svg::Axis sizes =
      svg::sizeAxis(xMin, xMax, kLeft, kLeft + kPlotW, "message size (bytes, log scale)");
  const auto [tLo, tHi] = rangeOf(series, &Point::timeUs);
  const auto [bLo, bHi] = rangeOf(series, &Point::busBw);
  svg::Axis time = svg::valueAxis(tLo, tHi, kTop + kPanelH, kTop, "");
  svg::Axis bw = svg::valueAxis(bLo, bHi, top2 + kPanelH, top2, "");
  time.title = std::string("time per call (µs") + (time.logarithmic() ? ", log scale)" : ")");
  bw.title = std::string("bus bandwidth (GB/s") + (bw.logarithmic() ? ", log scale)" : ")");

  svg::Legend legend(kLeft + kPlotW + 28, kTop - 6);
  legend.heading("Series (out of place)");
  for (const Series& s : series)
    legend.line(s.label, s.color, s.kind == Kind::tuned ? 2.2 : 1.7, s.dash);
  for (std::size_t k = 0; k < options.algos.size(); ++k) {
    const bool served = std::any_of(rows.begin(), rows.end(), [&](const Row& r) {
      return k < r.forced.size() && r.forced[k].outOfPlace.has_value();
    });
    if (!served) legend.note("weft " + options.algos[k].label() + " (forced): n/a");
  }
  // Every pick weft made, in the order of the sizes where it first made it.
  std::vector<std::string> picks;
  for (const Series& s : series) {
    if (s.kind != Kind::tuned) continue;
    for (const auto& [size, p] : s.bySize) {
      if (std::find(picks.begin(), picks.end(), p.plan) == picks.end()) picks.push_back(p.plan);
    }
  }
  if (!picks.empty()) legend.heading("weft's pick per size");
  for (const std::string& plan : picks) {
    const auto [algorithm, protocol] = svg::splitPlan(plan);
    legend.point(plan, svg::protocolShape(protocol), svg::algorithmColor(algorithm), "#111111",
                 0.8);
  }
  const double width = std::max(900.0, kLeft + kPlotW + 28 + legend.width() + 16);
  const double height = std::max(top2 + kPanelH + 58, legend.bottom() + 16);

  std::string combo = rows.empty() ? "" : comboOf(rows.front());
  if (!std::all_of(rows.begin(), rows.end(), [&](const Row& r) { return comboOf(r) == combo; }))
    combo = "several types, ops or roots";
  std::string doc = svg::open(width, height);
  doc += svg::text(
      kLeft, 28,
      svg::fmt("weft-perf %s, %d ranks, %s memory", std::string(name(options.collective)).c_str(),
               nranks, options.gpu() ? "GPU" : "host"),
      16, "start", "font-weight='bold'");
  doc += svg::text(
      kLeft, 50, "out of place (the time nccl-tests reports)" + (combo.empty() ? "" : "; " + combo),
      12, "start", "fill='#555'");
  doc += panel(series, sizes, time, &Point::timeUs);
  doc += panel(series, sizes, bw, &Point::busBw);
  doc += legend.svg();
  doc += "</svg>\n";

  std::ofstream out(path);
  if (!out) return false;
  out << doc;
  return static_cast<bool>(out);
}

}  // namespace weft::perf
