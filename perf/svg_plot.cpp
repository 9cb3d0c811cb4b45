// --svg: bus bandwidth (out of place) against size on a log2 axis, one line per series: weft as
// tuned, each forced algorithm, and the peer library. Self-contained: no scripts, no fonts.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "perf/report.hpp"

namespace weft::perf {
namespace {

struct Series {
  std::string label;
  std::map<std::size_t, double> busBwBySize;  // a later cycle's value replaces an earlier one
};

std::string sizeLabel(double bytes) {
  static const char* kUnits[] = {"", "K", "M", "G", "T"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) bytes /= 1024, ++unit;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%s", bytes, kUnits[unit]);
  return buf;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

// A step of 1, 2 or 5 times a power of ten giving about `ticks` intervals up to `top`.
double niceStep(double top, int ticks) {
  const double raw = top / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

std::vector<Series> collect(const Options& options, const std::string& peerName,
                            const std::vector<Row>& rows) {
  // Rows of several types, ops or roots make one line per combination.
  auto comboOf = [](const Row& r) {
    return std::string(tableName(r.type)) + (r.op ? "/" + std::string(name(*r.op)) : "") +
           (r.root >= 0 ? " root " + std::to_string(r.root) : "");
  };
  std::set<std::string> combos;
  for (const Row& r : rows) combos.insert(comboOf(r));
  std::vector<Series> series;
  std::map<std::string, std::size_t> index;
  auto point = [&](const std::string& label, std::size_t size, double busBw) {
    auto [it, added] = index.emplace(label, series.size());
    if (added) series.push_back({label, {}});
    series[it->second].busBwBySize[size] = busBw;
  };
  for (const Row& r : rows) {
    if (r.bytes == 0) continue;  // no place on a log axis
    const std::string combo = combos.size() > 1 ? " " + comboOf(r) : "";
    point("weft (tuned)" + combo, r.bytes, r.outOfPlace.busBw);
    for (std::size_t k = 0; k < r.forced.size(); ++k) {
      if (r.forced[k].outOfPlace)
        point("weft " + options.algos[k].label() + combo, r.bytes, r.forced[k].outOfPlace->busBw);
    }
    if (r.peerTimeUs && *r.peerTimeUs > 0) {
      // Same bytes, the peer's time: bus bandwidth scales inversely.
      point(peerName + combo, r.bytes, r.outOfPlace.busBw * r.outOfPlace.timeUs / *r.peerTimeUs);
    }
  }
  return series;
}

}  // namespace

bool writeSvg(const std::string& path, const Options& options, int nranks,
              const std::string& peerName, const std::vector<Row>& rows) {
  const std::vector<Series> series = collect(options, peerName, rows);
  double xMin = 1e300, xMax = 0, yMax = 0;
  for (const Series& s : series) {
    for (const auto& [size, bw] : s.busBwBySize) {
      xMin = std::min(xMin, std::log2(static_cast<double>(size)));
      xMax = std::max(xMax, std::log2(static_cast<double>(size)));
      yMax = std::max(yMax, bw);
    }
  }
  if (series.empty()) xMin = 0, xMax = 1;
  if (xMax - xMin < 1) xMax = xMin + 1;
  if (yMax <= 0) yMax = 1;
  const double yStep = niceStep(yMax, 5);
  const double yTop = std::ceil(yMax / yStep) * yStep;

  constexpr double kW = 900, kH = 500, kLeft = 70, kRight = 230, kTop = 50, kBottom = 60;
  const double plotW = kW - kLeft - kRight, plotH = kH - kTop - kBottom;
  auto X = [&](double log2Size) { return kLeft + (log2Size - xMin) / (xMax - xMin) * plotW; };
  auto Y = [&](double bw) { return kTop + plotH - bw / yTop * plotH; };
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

  std::ofstream out(path);
  if (!out) return false;
  char buf[512];
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << kW << "' height='" << kH
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' "
         "fill='white'/>\n";
  std::snprintf(buf, sizeof buf, "weft-perf %s, %d ranks: bus bandwidth (out of place)",
                std::string(name(options.collective)).c_str(), nranks);
  out << "<text x='" << kLeft << "' y='25' font-size='15'>" << escaped(buf) << "</text>\n";
  // Axes, grid and ticks: x at powers of two (thinned to at most 12 labels), y at nice steps.
  const int span = static_cast<int>(std::ceil(xMax) - std::floor(xMin));
  const int every = std::max(1, (span + 11) / 12);
  for (int e = static_cast<int>(std::ceil(xMin)); e <= static_cast<int>(std::floor(xMax));
       e += every) {
    std::snprintf(buf, sizeof buf,
                  "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#e5e5e5'/>\n"
                  "<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>\n",
                  X(e), kTop, X(e), kTop + plotH, X(e), kTop + plotH + 18,
                  sizeLabel(std::ldexp(1.0, e)).c_str());
    out << buf;
  }
  for (double y = 0; y <= yTop + yStep / 2; y += yStep) {
    std::snprintf(buf, sizeof buf,
                  "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#e5e5e5'/>\n"
                  "<text x='%.1f' y='%.1f' text-anchor='end'>%g</text>\n",
                  kLeft, Y(y), kLeft + plotW, Y(y), kLeft - 6, Y(y) + 4, y);
    out << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='black'/>\n"
                "<text x='%.1f' y='%.1f' text-anchor='middle'>size (bytes, log2)</text>\n"
                "<text transform='translate(18 %.1f) rotate(-90)' text-anchor='middle'>busbw "
                "(GB/s)</text>\n",
                kLeft, kTop, plotW, plotH, kLeft + plotW / 2, kH - 15, kTop + plotH / 2);
  out << buf;
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % std::size(kColors)];
    const bool dashed = series[i].label.rfind("weft", 0) != 0;  // the peer
    out << "<polyline fill='none' stroke='" << color << "' stroke-width='2'"
        << (dashed ? " stroke-dasharray='6 4'" : "") << " points='";
    for (const auto& [size, bw] : series[i].busBwBySize) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(std::log2(static_cast<double>(size))), Y(bw));
      out << buf;
    }
    out << "'/>\n";
    for (const auto& [size, bw] : series[i].busBwBySize) {
      std::snprintf(buf, sizeof buf, "<circle cx='%.1f' cy='%.1f' r='2.5' fill='%s'/>\n",
                    X(std::log2(static_cast<double>(size))), Y(bw), color);
      out << buf;
    }
    const double ly = kTop + 10 + 20 * static_cast<double>(i);
    std::snprintf(buf, sizeof buf,
                  "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' stroke-width='2'%s/>\n"
                  "<text x='%.1f' y='%.1f'>",
                  kLeft + plotW + 15, ly, kLeft + plotW + 40, ly, color,
                  dashed ? " stroke-dasharray='6 4'" : "", kLeft + plotW + 46, ly + 4);
    out << buf << escaped(series[i].label) << "</text>\n";
  }
  out << "</svg>\n";
  return static_cast<bool>(out);
}

}  // namespace weft::perf
