// SPDX-License-Identifier: Apache-2.0
// Side-by-side SVG bar panels for ratelimit-compare, in the style (and with the helpers) of the replay sweep chart.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "svg.hpp"

namespace ratelimit::compare {

/// A bar's value as printed above it: 3 significant digits, from 1,000 to
/// 9,999 the whole number ("%.3g" would print 1500 as "1.5e+03"), then
/// thousands as "k" and millions as "M".
[[nodiscard]] inline std::string bar_label(double v) {
  char buf[32];
  if (v >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  } else if (v >= 1e4) {
    std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  } else if (v >= 999.5) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return buf;
}

/// One panel: a title, the y axis label and one bar per category (empty = no
/// figure, drawn as "n/a").
struct bar_panel {
  std::string title;
  std::string y_label;
  std::vector<std::optional<double>> values;
};

/// Writes `panels` side by side under a shared legend naming `categories`;
/// category i has the same colour in every panel (the sweep chart's palette).
inline void write_bar_chart(std::ostream& o, std::string_view title, std::string_view subtitle,
                            const std::vector<std::string>& categories,
                            const std::vector<bar_panel>& panels) {
  using replay::detail::num;
  using replay::detail::styles;
  using replay::detail::xml_escape;
  // At most four panels a row; rows stack below the legend.
  const double panel_w = 330, panel_h = 300, left = 70, top = 135, gap = 90, row_gap = 70,
               bottom = 40;
  const double plot_w = panel_w - left;
  const std::size_t per_row = std::clamp<std::size_t>(panels.size(), 1, 4);
  const std::size_t rows = std::max<std::size_t>(1, (panels.size() + per_row - 1) / per_row);
  const double width = left + static_cast<double>(per_row) * panel_w +
                       static_cast<double>(per_row - 1) * (gap - left) + 30;
  const double height = top + static_cast<double>(rows) * panel_h +
                        static_cast<double>(rows - 1) * row_gap + bottom;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << num(width) << "' height='"
    << num(height) << "' viewBox='0 0 " << num(width) << " " << num(height)
    << "' font-family='Helvetica, Arial, sans-serif'>\n";
  o << "<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='" << num(width / 2) << "' y='28' font-size='19' font-weight='bold' "
    << "text-anchor='middle'>" << xml_escape(title) << "</text>\n";
  o << "<text x='" << num(width / 2) << "' y='50' font-size='13' fill='#444' "
    << "text-anchor='middle'>" << xml_escape(subtitle) << "</text>\n";

  // Legend, centred under the subtitle.
  const double item_w = 150;
  double lx = width / 2 - item_w * static_cast<double>(categories.size()) / 2;
  for (std::size_t i = 0; i < categories.size(); ++i, lx += item_w) {
    const auto& st = styles[i % std::size(styles)];
    o << "<rect x='" << num(lx) << "' y='65' width='24' height='14' fill='" << st.colour << "'/>";
    o << "<text x='" << num(lx + 30) << "' y='77' font-size='13'>" << xml_escape(categories[i])
      << "</text>\n";
  }

  for (std::size_t p = 0; p < panels.size(); ++p) {
    const bar_panel& pn = panels[p];
    const double ox = left + static_cast<double>(p % per_row) * (panel_w + gap - left);
    const double oy = top + static_cast<double>(p / per_row) * (panel_h + row_gap);
    double y_max = 0;
    for (const auto& v : pn.values) {
      if (v) y_max = std::max(y_max, *v);
    }
    y_max = replay::detail::nice_ceil(std::max(y_max, 1e-9));
    const auto sy = [&](double y) { return oy + panel_h - y / y_max * panel_h; };

    o << "<text x='" << num(ox + plot_w / 2) << "' y='" << num(oy - 14)
      << "' font-size='15' font-weight='bold' text-anchor='middle'>" << xml_escape(pn.title)
      << "</text>\n";
    for (int i = 0; i <= 5; ++i) {
      const double v = y_max * i / 5;
      const double y = sy(v);
      o << "<line x1='" << num(ox) << "' y1='" << num(y) << "' x2='" << num(ox + plot_w) << "' y2='"
        << num(y) << "' stroke='#ddd'/>";
      o << "<text x='" << num(ox - 8) << "' y='" << num(y + 4)
        << "' font-size='12' text-anchor='end'>" << replay::detail::tick_label(v) << "</text>\n";
    }
    o << "<rect x='" << num(ox) << "' y='" << num(oy) << "' width='" << num(plot_w) << "' height='"
      << num(panel_h) << "' fill='none' stroke='#333'/>\n";
    o << "<text transform='translate(" << num(ox - 48) << "," << num(oy + panel_h / 2)
      << ") rotate(-90)' font-size='13' text-anchor='middle'>" << xml_escape(pn.y_label)
      << "</text>\n";
    const std::size_t n = std::max<std::size_t>(pn.values.size(), 1);
    const double slot = plot_w / static_cast<double>(n);
    for (std::size_t i = 0; i < pn.values.size(); ++i) {
      const auto& st = styles[i % std::size(styles)];
      const double x = ox + slot * static_cast<double>(i) + slot * 0.15;
      const double w = slot * 0.7;
      if (!pn.values[i]) {
        o << "<text x='" << num(x + w / 2) << "' y='" << num(oy + panel_h - 6)
          << "' font-size='11' fill='#777' text-anchor='middle'>n/a</text>\n";
        continue;
      }
      const double v = std::max(*pn.values[i], 0.0);
      o << "<rect x='" << num(x) << "' y='" << num(sy(v)) << "' width='" << num(w) << "' height='"
        << num(oy + panel_h - sy(v)) << "' fill='" << st.colour << "' fill-opacity='0.85'/>";
      o << "<text x='" << num(x + w / 2) << "' y='" << num(sy(v) - 4)
        << "' font-size='11' text-anchor='middle'>" << bar_label(v) << "</text>\n";
    }
  }
  o << "</svg>\n";
}

}  // namespace ratelimit::compare
