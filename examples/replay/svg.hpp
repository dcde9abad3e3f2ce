// SPDX-License-Identifier: Apache-2.0
// A small SVG line chart writer for the threshold sweep: side-by-side panels, one line per series.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ratelimit::replay {

/// One line of a panel: (x, y) points in data units.
struct plot_series {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

/// One chart: a title, axis labels and its lines.
struct plot_panel {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool percent_0_100 = false;  ///< fix the y axis to 0..100 instead of fitting it
  std::vector<plot_series> series;
};

namespace detail {

/// Bytes of a valid UTF-8 sequence starting at `s[i]` (1 to 4), or 0 when
/// the bytes there are not one (stray continuation, overlong form, surrogate,
/// past U+10FFFF, cut short).
[[nodiscard]] inline std::size_t utf8_length(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xbf) return 0;
  }
  return n;
}

/// `s` as XML character data or a quoted attribute value: markup characters
/// as entities, valid UTF-8 kept, and every byte XML 1.0 cannot carry (control
/// bytes other than tab, newline and carriage return; bytes that are not
/// UTF-8, as a file name may hold) as U+FFFD, so a hostile name cannot make
/// the document ill-formed.
[[nodiscard]] inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f) {
          out += "\xEF\xBF\xBD";
        } else if (const std::size_t n = utf8_length(s, i); n == 0) {
          out += "\xEF\xBF\xBD";
        } else {
          out.append(s.substr(i, n));
          i += n;
          continue;
        }
    }
    ++i;
  }
  return out;
}

[[nodiscard]] inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

/// Smallest 1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 x 10^k at or above v.
[[nodiscard]] inline double nice_ceil(double v) {
  if (v <= 0) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (const double m : {1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * p >= v * (1 - 1e-12)) return m * p;
  }
  return 10 * p;
}

[[nodiscard]] inline std::string tick_label(double v) {
  char buf[32];
  if (std::fabs(v - std::round(v)) < 1e-9) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2g", v);
  }
  return buf;
}

struct style {
  const char* colour;
  const char* dash;
  const char* marker;  // circle, square, triangle, diamond, cross
};

inline constexpr style styles[] = {
    {"#d62728", "", "square"},  {"#1f77b4", "", "circle"},   {"#2ca02c", "", "triangle"},
    {"#ff7f0e", "", "diamond"}, {"#9467bd", "6,4", "cross"}, {"#8c564b", "2,3", "circle"},
};

inline void marker(std::ostream& o, const style& st, double x, double y) {
  const std::string c = st.colour;
  const std::string m = st.marker;
  if (m == "circle") {
    o << "<circle cx='" << num(x) << "' cy='" << num(y) << "' r='3.5' fill='" << c << "'/>";
  } else if (m == "square") {
    o << "<rect x='" << num(x - 3.5) << "' y='" << num(y - 3.5) << "' width='7' height='7' fill='"
      << c << "'/>";
  } else if (m == "triangle") {
    o << "<path d='M" << num(x) << "," << num(y - 4.5) << " L" << num(x + 4.5) << ","
      << num(y + 3.5) << " L" << num(x - 4.5) << "," << num(y + 3.5) << " Z' fill='" << c << "'/>";
  } else if (m == "diamond") {
    o << "<path d='M" << num(x) << "," << num(y - 5) << " L" << num(x + 5) << "," << num(y) << " L"
      << num(x) << "," << num(y + 5) << " L" << num(x - 5) << "," << num(y)
      << " Z' fill='none' stroke='" << c << "' stroke-width='1.8'/>";
  } else {
    o << "<path d='M" << num(x - 4) << "," << num(y - 4) << " L" << num(x + 4) << "," << num(y + 4)
      << " M" << num(x - 4) << "," << num(y + 4) << " L" << num(x + 4) << "," << num(y - 4)
      << "' stroke='" << c << "' stroke-width='2'/>";
  }
  o << '\n';
}

/// Earlier series are drawn wider, so a later one lying on top of them
/// leaves them visible as a coloured edge.
[[nodiscard]] inline double line_width(std::size_t i) {
  return std::max(1.6, 5.0 - 0.8 * static_cast<double>(i));
}

}  // namespace detail

/// Writes panels side by side with a shared legend (series are matched by
/// position: series i has the same colour and marker in every panel).
inline void write_svg_chart(std::ostream& o, std::string_view title, std::string_view subtitle,
                            const std::vector<plot_panel>& panels) {
  using detail::line_width;
  using detail::num;
  const double panel_w = 470, panel_h = 360, left = 70, top = 135, gap = 90, bottom = 60;
  const double plot_w = panel_w - left;
  const double width = left + static_cast<double>(panels.size()) * panel_w +
                       static_cast<double>(panels.size() - 1) * (gap - left) + 30;
  const double height = top + panel_h + bottom;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << num(width) << "' height='"
    << num(height) << "' viewBox='0 0 " << num(width) << " " << num(height)
    << "' font-family='Helvetica, Arial, sans-serif'>\n";
  o << "<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='" << num(width / 2) << "' y='28' font-size='19' font-weight='bold' "
    << "text-anchor='middle'>" << detail::xml_escape(title) << "</text>\n";
  o << "<text x='" << num(width / 2) << "' y='50' font-size='13' fill='#444' "
    << "text-anchor='middle'>" << detail::xml_escape(subtitle) << "</text>\n";

  // Legend, centred under the subtitle.
  if (!panels.empty()) {
    const auto& series = panels.front().series;
    const double item_w = 150;
    double x = width / 2 - item_w * static_cast<double>(series.size()) / 2;
    for (std::size_t i = 0; i < series.size(); ++i, x += item_w) {
      const auto& st = detail::styles[i % std::size(detail::styles)];
      o << "<line x1='" << num(x) << "' y1='72' x2='" << num(x + 30) << "' y2='72' stroke='"
        << st.colour << "' stroke-width='" << num(line_width(i)) << "' stroke-dasharray='"
        << st.dash << "'/>";
      detail::marker(o, st, x + 15, 72);
      o << "<text x='" << num(x + 36) << "' y='77' font-size='13'>"
        << detail::xml_escape(series[i].name) << "</text>\n";
    }
  }

  for (std::size_t p = 0; p < panels.size(); ++p) {
    const plot_panel& pn = panels[p];
    const double ox = left + static_cast<double>(p) * (panel_w + gap - left);
    const double oy = top;
    double x_min = 1e300, x_max = -1e300, y_max = 0;
    for (const auto& s : pn.series) {
      for (const auto& [x, y] : s.points) {
        x_min = std::min(x_min, x);
        x_max = std::max(x_max, x);
        y_max = std::max(y_max, y);
      }
    }
    if (x_min > x_max) {
      x_min = 0;
      x_max = 1;
    }
    if (x_max == x_min) {
      x_min -= 1;
      x_max += 1;
    }
    y_max = pn.percent_0_100 ? 100.0 : detail::nice_ceil(std::max(y_max, 1.0));
    const auto sx = [&](double x) { return ox + (x - x_min) / (x_max - x_min) * plot_w; };
    const auto sy = [&](double y) { return oy + panel_h - y / y_max * panel_h; };

    o << "<text x='" << num(ox + plot_w / 2) << "' y='" << num(oy - 14)
      << "' font-size='15' font-weight='bold' text-anchor='middle'>" << detail::xml_escape(pn.title)
      << "</text>\n";
    // Grid and y ticks: five steps.
    for (int i = 0; i <= 5; ++i) {
      const double v = y_max * i / 5;
      const double y = sy(v);
      o << "<line x1='" << num(ox) << "' y1='" << num(y) << "' x2='" << num(ox + plot_w) << "' y2='"
        << num(y) << "' stroke='#ddd'/>";
      o << "<text x='" << num(ox - 8) << "' y='" << num(y + 4)
        << "' font-size='12' text-anchor='end'>" << detail::tick_label(v) << "</text>\n";
    }
    // x ticks at whole numbers, at most about 12 of them.
    const double span = x_max - x_min;
    const double step = std::max(1.0, detail::nice_ceil(span / 12));
    for (double v = std::ceil(x_min / step) * step; v <= x_max + 1e-9; v += step) {
      const double x = sx(v);
      o << "<line x1='" << num(x) << "' y1='" << num(oy + panel_h) << "' x2='" << num(x) << "' y2='"
        << num(oy + panel_h + 5) << "' stroke='#333'/>";
      o << "<text x='" << num(x) << "' y='" << num(oy + panel_h + 20)
        << "' font-size='12' text-anchor='middle'>" << detail::tick_label(v) << "</text>\n";
    }
    o << "<rect x='" << num(ox) << "' y='" << num(oy) << "' width='" << num(plot_w) << "' height='"
      << num(panel_h) << "' fill='none' stroke='#333'/>\n";
    o << "<text x='" << num(ox + plot_w / 2) << "' y='" << num(oy + panel_h + 44)
      << "' font-size='13' text-anchor='middle'>" << detail::xml_escape(pn.x_label) << "</text>\n";
    o << "<text transform='translate(" << num(ox - 48) << "," << num(oy + panel_h / 2)
      << ") rotate(-90)' font-size='13' text-anchor='middle'>" << detail::xml_escape(pn.y_label)
      << "</text>\n";
    for (std::size_t i = 0; i < pn.series.size(); ++i) {
      const auto& st = detail::styles[i % std::size(detail::styles)];
      const auto& pts = pn.series[i].points;
      if (pts.empty()) continue;
      o << "<polyline fill='none' stroke='" << st.colour << "' stroke-width='" << num(line_width(i))
        << "' stroke-opacity='0.85' stroke-dasharray='" << st.dash << "' points='";
      for (const auto& [x, y] : pts) o << num(sx(x)) << "," << num(sy(y)) << " ";
      o << "'/>\n";
      for (const auto& [x, y] : pts) detail::marker(o, st, sx(x), sy(y));
    }
  }
  o << "</svg>\n";
}

}  // namespace ratelimit::replay
