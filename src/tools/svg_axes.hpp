// Axes, markers and legends for the tools' SVG plots (weft-perf --svg, weft-plan tune --svg):
// sizes on log2 axes, values on 1-2-5 log or "nice" linear axes, one colour per algorithm and one
// marker shape per protocol so that both plots read alike. Header-only; writes SVG text.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::tools::svg {

// printf into a std::string.
[[gnu::format(printf, 1, 2)]] inline std::string fmt(const char* format, ...) {
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string s(static_cast<std::size_t>(std::max(n, 0)), '\0');
  va_start(args, format);
  std::vsnprintf(s.data(), s.size() + 1, format, args);
  va_end(args);
  return s;
}

inline std::string escaped(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else if (c == '\'') {
      out += "&apos;";
    } else {
      out += c;
    }
  }
  return out;
}

// About how wide `s` is set in a sans-serif font (UTF-8: continuation bytes do not count).
inline double textWidth(std::string_view s, double fontSize) {
  const auto chars = std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; });
  return 0.6 * fontSize * static_cast<double>(chars);
}

inline std::string text(double x, double y, std::string_view s, double size = 12,
                        std::string_view anchor = "start", std::string_view extra = "") {
  return fmt("<text x='%.1f' y='%.1f' font-size='%g' text-anchor='%.*s'%s%.*s>%s</text>\n", x, y,
             size, static_cast<int>(anchor.size()), anchor.data(), extra.empty() ? "" : " ",
             static_cast<int>(extra.size()), extra.data(), escaped(s).c_str());
}

// The document's first lines: a standalone SVG on a white background.
inline std::string open(double width, double height) {
  return fmt(
      "<?xml version='1.0' encoding='UTF-8'?>\n"
      "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' viewBox='0 0 %.0f %.0f' "
      "font-family='DejaVu Sans, Helvetica, Arial, sans-serif' fill='#222'>\n"
      "<rect width='%.0f' height='%.0f' fill='white'/>\n",
      width, height, width, height, width, height);
}

// A value with few digits: 0.05, 2.5, 500, 2e5.
inline std::string number(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) {
    const int e = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
    return fmt("%ge%d", v / std::pow(10.0, e), e);
  }
  return fmt("%g", v);
}

// 8 B, 1 KiB, 32 KiB, 1 MiB: the size 2^exponent.
inline std::string sizeLabel(int exponent) {
  static constexpr std::array<const char*, 7> kUnits = {"B",   "KiB", "MiB", "GiB",
                                                        "TiB", "PiB", "EiB"};
  exponent = std::clamp(exponent, 0, 69);
  return fmt("%d %s", 1 << (exponent % 10), kUnits[static_cast<std::size_t>(exponent / 10)]);
}

struct Tick {
  double value;
  std::string label;  // empty: a minor tick, a faint grid line only
};

// One axis: which data values sit at its two ends, their pixels (y: `from` is the bottom), the
// ticks and the title.
struct Axis {
  enum class Scale { linear, log2, log10 };
  Scale scale = Scale::linear;
  double lo = 0, hi = 1;
  double from = 0, to = 1;
  std::vector<Tick> ticks;
  std::string title;

  bool logarithmic() const { return scale != Scale::linear; }
  double pixel(double v) const {
    auto t = [&](double x) {
      return scale == Scale::linear ? x : scale == Scale::log2 ? std::log2(x) : std::log10(x);
    };
    return from + (t(v) - t(lo)) / (t(hi) - t(lo)) * (to - from);
  }
  // Whether the value can be drawn (not zero or negative on a log axis).
  bool shows(double v) const { return std::isfinite(v) && (!logarithmic() || v > 0); }
};

// Labels closer than this (pixels) would touch: x labels are up to ~7 characters wide.
inline constexpr double kMinGapX = 62, kMinGapY = 22;

// Sizes in bytes on a log2 axis, a little padding at both ends; labels on every `step`-th power
// of two (1, 2, 5 or 10 octaves: those hit every KiB, MiB, GiB), faint lines on the others.
inline Axis sizeAxis(double minBytes, double maxBytes, double from, double to, std::string title) {
  double a = std::log2(std::max(1.0, minBytes)), b = std::log2(std::max(1.0, maxBytes));
  if (b - a < 1) a -= 0.5, b += 0.5;
  const double pad = std::max(0.25, 0.03 * (b - a));
  Axis axis{Axis::Scale::log2, std::exp2(a - pad), std::exp2(b + pad), from, to, {},
            std::move(title)};
  const double perOctave = std::fabs(to - from) / (b - a + 2 * pad);
  int step = 1;
  for (int s : {1, 2, 5, 10, 20, 30}) {
    step = s;
    if (s * perOctave >= kMinGapX) break;
  }
  for (int e = static_cast<int>(std::ceil(a - pad)); e <= static_cast<int>(std::floor(b + pad));
       ++e) {
    if (e % step == 0) {
      axis.ticks.push_back({std::exp2(e), sizeLabel(e)});
    } else if (perOctave >= 8) {
      axis.ticks.push_back({std::exp2(e), ""});
    }
  }
  return axis;
}

namespace detail {

// The largest 1-2-5 x 10^k value at or below v, or the smallest at or above it.
inline double snap125(double v, bool down) {
  const int k0 = static_cast<int>(std::floor(std::log10(v)));
  double best = down ? 0 : HUGE_VAL;
  for (int k = k0 - 1; k <= k0 + 1; ++k) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double c = m * std::pow(10.0, k);
      if (down && c <= v * (1 + 1e-9)) best = std::max(best, c);
      if (!down && c >= v * (1 - 1e-9)) best = std::min(best, c);
    }
  }
  return best;
}

// Decimals that print every multiple of `step` exactly (0.25: 2).
inline int decimalsOf(double step) {
  int d = 0;
  while (d < 9 && std::fabs(step * std::pow(10.0, d) - std::round(step * std::pow(10.0, d))) >
                      1e-6 * step * std::pow(10.0, d))
    ++d;
  return d;
}

}  // namespace detail

// Values on the data's range [lo, hi]: log10 when the positive data span more than 1.5 decades,
// from and to the 1-2-5 x 10^k values just outside them, labelled at 1, 2 and 5 x 10^k or, where
// those would crowd, at every 1st, 2nd or 5th power of ten; else linear from zero to a tick, with
// steps of 1, 2, 2.5 or 5 x 10^k.
inline Axis valueAxis(double lo, double hi, double from, double to, std::string title) {
  const double length = std::fabs(to - from);
  const double minGap = from > to ? kMinGapY : kMinGapX;  // y axes run bottom to top
  if (lo > 0 && hi > lo * std::pow(10.0, 1.5)) {
    // A little room (5% of a decade) between the data and the ends.
    const double bottom = detail::snap125(lo / 1.12, true), top = detail::snap125(hi * 1.12, false);
    const double perDecade = length / std::log10(top / bottom);
    // 0: labels at 1, 2 and 5 x 10^k; n: at every n-th power of ten.
    int every = 0;
    for (int n : {0, 1, 2, 5, 10}) {
      every = n;
      if ((n == 0 ? std::log10(2.0) : n) * perDecade >= minGap) break;
    }
    Axis axis{Axis::Scale::log10, bottom, top, from, to, {}, std::move(title)};
    const int k0 = static_cast<int>(std::floor(std::log10(bottom))) - 1;
    const int k1 = static_cast<int>(std::ceil(std::log10(top))) + 1;
    for (int k = k0; k <= k1; ++k) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, k);
        if (v < bottom * (1 - 1e-9) || v > top * (1 + 1e-9)) continue;
        const bool major = every == 0 || (m == 1 && k % every == 0);
        // Unlabelled values still get a faint line where there is room: 2 and 5 between the
        // labelled decades, or the other decades.
        const bool minor = m == 1 ? perDecade >= 6 : every == 1 && perDecade * 0.3 >= 6;
        if (major) {
          axis.ticks.push_back({v, number(v)});
        } else if (minor) {
          axis.ticks.push_back({v, ""});
        }
      }
    }
    return axis;
  }
  const double bottom0 = std::min(0.0, lo);
  const double top0 = hi > bottom0 ? hi : bottom0 + 1;
  const double raw = (top0 - bottom0) / std::max(2.0, std::floor(length / (2.5 * minGap)));
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * p;
  for (double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m * p >= raw * (1 - 1e-9)) {
      step = m * p;
      break;
    }
  }
  const double bottom = std::floor(bottom0 / step + 1e-9) * step;
  const double top = std::ceil(top0 / step - 1e-9) * step;
  Axis axis{Axis::Scale::linear, bottom, top, from, to, {}, std::move(title)};
  const int decimals = detail::decimalsOf(step);
  for (int i = 0; bottom + i * step <= top + step / 2; ++i) {
    const double v = bottom + i * step;
    const double clean = std::fabs(v) < step * 1e-6 ? 0 : v;
    axis.ticks.push_back({clean, fmt("%.*f", decimals, clean)});
  }
  return axis;
}

// Grid lines, tick marks and labels, both axis titles and the border of the plot area that `x`
// (left to right) and `y` (bottom to top) span.
inline std::string frame(const Axis& x, const Axis& y) {
  std::string out;
  double widest = 0;
  for (const Tick& t : x.ticks) {
    const double px = x.pixel(t.value);
    out += fmt("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s'/>\n", px, y.from, px,
               y.to, t.label.empty() ? "#f0f0f0" : "#d8d8d8");
    if (t.label.empty()) continue;
    out += fmt("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#333'/>\n", px, y.from, px,
               y.from + 5);
    out += text(px, y.from + 19, t.label, 12, "middle");
  }
  for (const Tick& t : y.ticks) {
    const double py = y.pixel(t.value);
    out += fmt("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s'/>\n", x.from, py, x.to,
               py, t.label.empty() ? "#f0f0f0" : "#d8d8d8");
    if (t.label.empty()) continue;
    out += fmt("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#333'/>\n", x.from - 5, py,
               x.from, py);
    out += text(x.from - 8, py + 4, t.label, 12, "end");
    widest = std::max(widest, textWidth(t.label, 12));
  }
  out += fmt("<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#333'/>\n",
             x.from, y.to, x.to - x.from, y.from - y.to);
  out += text((x.from + x.to) / 2, y.from + 40, x.title, 13, "middle");
  const double titleX = x.from - widest - 22;
  out +=
      fmt("<text transform='translate(%.1f %.1f) rotate(-90)' font-size='13' "
          "text-anchor='middle'>%s</text>\n",
          titleX, (y.from + y.to) / 2, escaped(y.title).c_str());
  return out;
}

enum class Shape { circle, square, diamond, triangle, triangleDown };

// A point marker of about radius r.
inline std::string marker(Shape shape, double x, double y, double r, std::string_view fill,
                          std::string_view stroke = "none", double strokeWidth = 0) {
  const std::string paint =
      fmt("fill='%.*s' stroke='%.*s' stroke-width='%g'", static_cast<int>(fill.size()), fill.data(),
          static_cast<int>(stroke.size()), stroke.data(), strokeWidth);
  switch (shape) {
    case Shape::circle:
      return fmt("<circle cx='%.1f' cy='%.1f' r='%.1f' %s/>\n", x, y, r, paint.c_str());
    case Shape::square:
      return fmt("<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' %s/>\n", x - 0.85 * r,
                 y - 0.85 * r, 1.7 * r, 1.7 * r, paint.c_str());
    case Shape::diamond:
      return fmt("<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f' %s/>\n", x, y - 1.2 * r,
                 x + 1.2 * r, y, x, y + 1.2 * r, x - 1.2 * r, y, paint.c_str());
    case Shape::triangle:
    case Shape::triangleDown: {
      const double s = shape == Shape::triangle ? 1 : -1;
      return fmt("<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f' %s/>\n", x, y - s * 1.25 * r,
                 x + 1.15 * r, y + s * 0.8 * r, x - 1.15 * r, y + s * 0.8 * r, paint.c_str());
    }
  }
  return {};
}

// A line through the points. Round joins: ImageMagick's renderer closes mitred open lines (and
// it ignores opacity, so none is offered).
inline std::string polyline(const std::vector<std::pair<double, double>>& points,
                            std::string_view color, double width, std::string_view dash = "") {
  if (points.size() < 2) return {};
  std::string out = fmt("<polyline fill='none' stroke='%.*s' stroke-width='%g'",
                        static_cast<int>(color.size()), color.data(), width);
  if (!dash.empty())
    out += fmt(" stroke-dasharray='%.*s'", static_cast<int>(dash.size()), dash.data());
  out += " stroke-linejoin='round' stroke-linecap='round' points='";
  for (const auto& [x, y] : points) out += fmt("%.1f,%.1f ", x, y);
  out.pop_back();  // the last space
  return out + "'/>\n";
}

// One colour per algorithm, the same in every plot; a name not listed gets one by its letters.
inline std::string algorithmColor(std::string_view algorithm) {
  static constexpr std::array<std::pair<std::string_view, const char*>, 11> kKnown = {{
      {"ring", "#1f77b4"},
      {"rhd", "#ff7f0e"},
      {"dbtree", "#2ca02c"},
      {"oneshot", "#d62728"},
      {"twoshot", "#9467bd"},
      {"pat", "#8c564b"},
      {"slots", "#e377c2"},
      {"bruck", "#bcbd22"},
      {"pairwise", "#17becf"},
      {"hierarchical", "#393b79"},
      {"p2p", "#637939"},
  }};
  for (const auto& [name, color] : kKnown) {
    if (name == algorithm) return color;
  }
  static constexpr std::array<const char*, 4> kOthers = {"#843c39", "#7b4173", "#3182bd",
                                                         "#e6550d"};
  unsigned sum = 0;
  for (char c : algorithm) sum = sum * 31 + static_cast<unsigned char>(c);
  return kOthers[sum % kOthers.size()];
}

// One marker shape per protocol.
inline Shape protocolShape(std::string_view protocol) {
  if (protocol == "simple") return Shape::circle;
  if (protocol == "ll") return Shape::square;
  if (protocol == "direct") return Shape::diamond;
  if (protocol == "ll128") return Shape::triangle;
  return Shape::triangleDown;
}

// "ring/simple" -> {"ring", "simple"}.
inline std::pair<std::string, std::string> splitPlan(std::string_view plan) {
  const auto slash = plan.find('/');
  if (slash == std::string_view::npos) return {std::string(plan), ""};
  return {std::string(plan.substr(0, slash)), std::string(plan.substr(slash + 1))};
}

// A column of legend entries downwards from (x, y): headings, line samples, marker samples.
class Legend {
 public:
  Legend(double x, double y) : x_(x), y_(y) {}

  void heading(std::string_view label) {
    if (entries_ > 0) y_ += 8;
    y_ += 16;
    svg_ += text(x_, y_, label, 12, "start", "font-weight='bold'");
    width_ = std::max(width_, textWidth(label, 12) * 1.08);
    ++entries_;
  }
  void line(std::string_view label, std::string_view color, double width,
            std::string_view dash = "") {
    y_ += 18;
    svg_ += polyline({{x_, y_ - 4}, {x_ + 30, y_ - 4}}, color, width, dash);
    add(label);
  }
  void point(std::string_view label, Shape shape, std::string_view fill,
             std::string_view stroke = "none", double strokeWidth = 0) {
    y_ += 18;
    svg_ += marker(shape, x_ + 15, y_ - 4, 4.5, fill, stroke, strokeWidth);
    add(label);
  }
  // A grey line of text where a sample would be (a series with nothing to draw).
  void note(std::string_view label) {
    y_ += 18;
    add(label, "fill='#777'");
  }
  double bottom() const { return y_ + 6; }
  double width() const { return width_; }
  const std::string& svg() const { return svg_; }

 private:
  // The label right of the sample (a line sample is 30 wide, and a thick one's caps reach out).
  void add(std::string_view label, std::string_view extra = "") {
    svg_ += text(x_ + 44, y_, label, 12, "start", extra);
    width_ = std::max(width_, 44 + textWidth(label, 12));
    ++entries_;
  }

  double x_, y_;
  double width_ = 0;
  int entries_ = 0;
  std::string svg_;
};

}  // namespace weft::tools::svg
