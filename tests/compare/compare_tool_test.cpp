// SPDX-License-Identifier: Apache-2.0
// Tests of the built ratelimit-compare executable: table, CSV and SVG formats, agreement with
// ratelimit-replay's numbers on the same trace, and refusal of bad arguments and input.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct result {
  int status;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// A path in the temporary directory unique to this process (ctest runs cases in parallel).
fs::path temp(const std::string& name) {
  return fs::temp_directory_path() /
         ("ratelimit_compare_" + std::to_string(::getpid()) + "_" + name);
}

/// Runs `exe` through the shell with `args` (already quoted), after `prefix`
/// (e.g. "env VAR=value ").
result run_exe(const std::string& exe, const std::string& args, const std::string& prefix = "") {
  const fs::path out = temp("out.txt");
  const fs::path err = temp("err.txt");
  const std::string cmd = prefix + "'" + exe + "' " + args + " >'" + out.string() + "' 2>'" +
                          err.string() + "' </dev/null";
  const int raw = std::system(cmd.c_str());
  result r{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
  fs::remove(out);
  fs::remove(err);
  return r;
}

result compare(const std::string& args) {
  return run_exe(RATELIMIT_COMPARE_EXE, args);
}

const std::string sample = RATELIMIT_REPLAY_SAMPLE;
const std::vector<std::string> policies = {"fixed_window", "sliding_log", "sliding_counter",
                                           "token_bucket", "gcra"};

std::string trim(std::string s) {
  while (!s.empty() && s.front() == ' ') s.erase(s.begin());
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

/// The cells of a markdown table row "| a | b |".
std::vector<std::string> md_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (std::size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|') {
      cells.push_back(trim(cell));
      cell.clear();
    } else {
      cell += line[i];
    }
  }
  return cells;
}

/// The fields of one CSV line (RFC 4180 quotes).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

/// The table rows (by policy) of the markdown report, after checking the header.
std::map<std::string, std::vector<std::string>> table_rows(const std::string& md) {
  std::map<std::string, std::vector<std::string>> rows;
  for (const std::string& l : lines_of(md)) {
    if (!l.starts_with("| ")) continue;
    const auto cells = md_cells(l);
    if (cells.empty() || cells[0] == "policy") continue;
    rows[cells[0]] = cells;
  }
  return rows;
}

/// CSV rows by policy, keyed by column name.
std::map<std::string, std::map<std::string, std::string>> csv_rows(const std::string& csv) {
  const auto ls = lines_of(csv);
  std::map<std::string, std::map<std::string, std::string>> rows;
  if (ls.empty()) return rows;
  const auto header = csv_fields(ls[0]);
  for (std::size_t i = 1; i < ls.size(); ++i) {
    const auto f = csv_fields(ls[i]);
    EXPECT_EQ(f.size(), header.size()) << ls[i];
    for (std::size_t c = 0; c < std::min(f.size(), header.size()); ++c) {
      rows[f[0]][header[c]] = f[c];
    }
  }
  return rows;
}

/// Whether `svg` is well-formed XML as far as elements go: every tag closed in
/// order, attributes quoted, one root <svg>.
bool well_formed(const std::string& svg, std::string& why) {
  std::vector<std::string> stack;
  std::size_t roots = 0;
  for (std::size_t i = 0; i < svg.size();) {
    if (svg[i] != '<') {
      if (svg[i] == '&' && svg.compare(i, 5, "&amp;") != 0 && svg.compare(i, 4, "&lt;") != 0 &&
          svg.compare(i, 4, "&gt;") != 0 && svg.compare(i, 6, "&quot;") != 0 &&
          svg.compare(i, 6, "&apos;") != 0) {
        why = "bare & at " + std::to_string(i);
        return false;
      }
      ++i;
      continue;
    }
    const std::size_t end = svg.find('>', i);
    if (end == std::string::npos) {
      why = "unclosed tag at " + std::to_string(i);
      return false;
    }
    const std::string tag = svg.substr(i + 1, end - i - 1);
    i = end + 1;
    std::size_t quotes = 0;
    for (const char c : tag) quotes += c == '\'' ? 1 : 0;
    if (quotes % 2 != 0) {
      why = "unbalanced quotes in <" + tag + ">";
      return false;
    }
    if (tag.starts_with("/")) {
      if (stack.empty() || stack.back() != tag.substr(1)) {
        why = "</" + tag.substr(1) + "> does not close " + (stack.empty() ? "" : stack.back());
        return false;
      }
      stack.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" />"));
    if (stack.empty()) ++roots;
    if (!tag.ends_with("/")) stack.push_back(name);
  }
  if (!stack.empty()) {
    why = "<" + stack.back() + "> never closed";
    return false;
  }
  if (roots != 1) {
    why = std::to_string(roots) + " root elements";
    return false;
  }
  return true;
}

std::string no_commas(std::string s) {
  std::erase(s, ',');
  return s;
}

const std::string expected_header =
    "| policy | ns/check | x floor | 2 threads / 1 | B/key in process | Redis checks/s | "
    "Redis checks/s, batch 100 | Redis B/key | admitted | max in W | keys blocked | "
    "abusive caught | normal blocked |";
const std::string expected_csv_header =
    "policy,rate,ns_per_check,x_floor,threads2_over_1,process_bytes_per_key,redis_checks_per_s,"
    "redis_batch_checks_per_s,redis_bytes_per_key,redis_used_memory_per_key,events,admitted,"
    "rejected,max_in_window,keys_blocked,abusive_keys,abusive_caught,normal_keys,normal_blocked,"
    "floor_ns_per_check,floor_threads2_over_1,unavailable";

bool is_number(const std::string& s) {
  return std::regex_match(s, std::regex(R"([0-9]+(\.[0-9]+)?[kM]?)"));
}

TEST(CompareTool, TableCsvAndSvgFormats) {
  const fs::path csv = temp("f.csv");
  const fs::path svg = temp("f.svg");
  const auto r = compare("--quick --no-redis --keys 500 --csv '" + csv.string() + "' --svg '" +
                         svg.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  // Markdown: the header, the alignment row, five policy rows of 13 cells.
  const auto ls = lines_of(r.out);
  ASSERT_GE(ls.size(), 9u);
  EXPECT_TRUE(
      ls[0].starts_with("Rate 10 per 15min; trace examples/data/sample_calls.csv: 34,807 "
                        "calls, 2,605 keys (16 labelled abusive, 2,589 normal)."))
      << ls[0];
  EXPECT_EQ(ls[2], expected_header);
  EXPECT_EQ(ls[3], "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
  for (std::size_t i = 0; i < policies.size(); ++i) {
    const auto cells = md_cells(ls[4 + i]);
    ASSERT_EQ(cells.size(), 13u) << ls[4 + i];
    EXPECT_EQ(cells[0], policies[i]);
    // Measured in process: numbers; Redis skipped: "-".
    EXPECT_TRUE(is_number(cells[1])) << cells[1];
    EXPECT_TRUE(is_number(cells[2])) << cells[2];
    EXPECT_TRUE(is_number(cells[3])) << cells[3];
    EXPECT_EQ(cells[5], "-");
    EXPECT_EQ(cells[6], "-");
    EXPECT_EQ(cells[7], "-");
  }
  EXPECT_NE(r.out.find("- Redis: not measured"), std::string::npos);
  // The reference for "2 threads / 1": the floor's own scaling, in the notes.
  std::smatch floor_scaling;
  ASSERT_TRUE(std::regex_search(r.out, floor_scaling,
                                std::regex(R"(2 threads / 1 of the floor itself: ([0-9.]+))")))
      << r.out;
  EXPECT_GT(std::stod(floor_scaling[1]), 0.0);
  // Progress went to stderr, not into the table.
  EXPECT_NE(r.err.find("in process: round 3/3"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("ratelimit-compare:"), std::string::npos);

  const std::string c = slurp(csv);
  const auto cl = lines_of(c);
  ASSERT_EQ(cl.size(), 6u) << c;
  EXPECT_EQ(cl[0], expected_csv_header);
  const auto rows = csv_rows(c);
  for (const std::string& p : policies) {
    ASSERT_EQ(rows.count(p), 1u) << p;
    const auto& row = rows.at(p);
    EXPECT_EQ(row.at("rate"), "10/15min");
    EXPECT_EQ(row.at("events"), "34807");
    EXPECT_TRUE(is_number(row.at("ns_per_check")));
    EXPECT_TRUE(is_number(row.at("x_floor")));
    EXPECT_TRUE(is_number(row.at("threads2_over_1")));
    EXPECT_EQ(row.at("redis_checks_per_s"), "");
    EXPECT_EQ(row.at("unavailable"), "");
    // The floor's figures are the same on every row; its scaling is the notes'.
    EXPECT_EQ(row.at("floor_ns_per_check"), rows.at(policies[0]).at("floor_ns_per_check"));
    ASSERT_TRUE(is_number(row.at("floor_threads2_over_1"))) << row.at("floor_threads2_over_1");
    EXPECT_NEAR(std::stod(row.at("floor_threads2_over_1")), std::stod(floor_scaling[1]), 0.006);
  }

  const std::string s = slurp(svg);
  std::string why;
  EXPECT_TRUE(s.starts_with("<svg xmlns='http://www.w3.org/2000/svg'")) << s.substr(0, 80);
  EXPECT_TRUE(well_formed(s, why)) << why;
  for (const std::string& p : policies) EXPECT_NE(s.find(">" + p + "<"), std::string::npos) << p;
  EXPECT_NE(s.find("Cost per check"), std::string::npos);
  EXPECT_NE(s.find("Abusive keys caught"), std::string::npos);
  EXPECT_EQ(s.find("Redis"), std::string::npos);  // no Redis panels without Redis
  fs::remove(csv);
  fs::remove(svg);
}

/// A table or CSV number: "-" and "" are none; "13.4k" and "1.2M" are scaled.
double number_of(const std::string& s) {
  EXPECT_TRUE(is_number(s)) << "not a number: \"" << s << "\"";
  if (!is_number(s)) return -1;
  const double scale = s.ends_with("k") ? 1e3 : s.ends_with("M") ? 1e6 : 1;
  return std::stod(s) * scale;
}

/// Half a unit of the last digit `s` shows ("62.4" 0.05, "13.4k" 50, "120" 0.5).
double half_unit(const std::string& s) {
  const double scale = s.ends_with("k") ? 1e3 : s.ends_with("M") ? 1e6 : 1;
  const auto dot = s.find('.');
  const std::size_t digits = s.find_first_of("kM");
  const std::size_t decimals = dot == std::string::npos
                                   ? 0
                                   : (digits == std::string::npos ? s.size() : digits) - dot - 1;
  return 0.5 * std::pow(10.0, -static_cast<double>(decimals)) * scale;
}

/// Whether the figures `a` and `b`, each as printed, can be the same value.
bool same_figure(const std::string& a, const std::string& b) {
  return std::abs(number_of(a) - number_of(b)) <= half_unit(a) + half_unit(b) + 1e-9;
}

/// The bar labels of each panel of a ratelimit-compare chart, by panel title
/// ("n/a" where a panel has no figure for a category).
std::map<std::string, std::vector<std::string>> svg_bars(const std::string& svg) {
  std::map<std::string, std::vector<std::string>> panels;
  const std::regex title(
      R"(font-size='15' font-weight='bold' text-anchor='middle'>([^<]+)</text>)");
  const std::regex bar(R"(fill-opacity='0\.85'/><text [^>]*>([^<]+)</text>)");
  const std::regex none(R"(fill='#777' text-anchor='middle'>n/a</text>)");
  std::string current;
  for (const std::string& l : lines_of(svg)) {
    std::smatch m;
    if (std::regex_search(l, m, title)) {
      current = m[1];
      panels[current];
    } else if (std::regex_search(l, m, bar)) {
      panels[current].push_back(m[1]);
    } else if (std::regex_search(l, none)) {
      panels[current].push_back("n/a");
    }
  }
  return panels;
}

// The in-process figures are positive and plausible, and the CSV and the
// chart give the table's figures. One round, so that x floor is exactly
// ns/check over the floor's ns of that round (with more rounds it is the
// median of the per-round ratios, not the ratio of the medians).
TEST(CompareTool, TableCsvAndSvgGiveTheSameFigures) {
  const fs::path csv = temp("same.csv");
  const fs::path svg = temp("same.svg");
  const auto r = compare("--quick --no-redis --keys 500 --rounds 1 --csv '" + csv.string() +
                         "' --svg '" + svg.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto table = table_rows(r.out);
  const auto rows = csv_rows(slurp(csv));
  const auto bars = svg_bars(slurp(svg));
  std::smatch floor;
  ASSERT_TRUE(std::regex_search(
      r.out, floor, std::regex(R"(timed in the same round \(([0-9.]+) ns, ([-0-9.]+) B/key)")))
      << r.out;
  const std::string floor_ns = floor[1];
  EXPECT_GT(number_of(floor_ns), 0.0);
  ASSERT_EQ(bars.count("Cost per check"), 1u);
  ASSERT_EQ(bars.count("Memory per key, in process"), 1u);
  ASSERT_EQ(bars.count("Most calls in any window"), 1u);
  ASSERT_EQ(bars.at("Cost per check").size(), policies.size());
  ASSERT_EQ(bars.at("Memory per key, in process").size(), policies.size());
  ASSERT_EQ(bars.at("Most calls in any window").size(), policies.size());
  for (std::size_t i = 0; i < policies.size(); ++i) {
    const std::string& p = policies[i];
    SCOPED_TRACE(p);
    const auto& cells = table.at(p);
    const auto& row = rows.at(p);
    const std::string &ns = cells[1], &x = cells[2], &two = cells[3], &bytes = cells[4];
    EXPECT_GT(number_of(ns), 0.0);
    EXPECT_GT(number_of(x), 0.0);
    EXPECT_GT(number_of(two), 0.0);
    // x floor = ns/check / floor ns, each rounded as printed.
    const double ratio = number_of(ns) / number_of(floor_ns);
    const double ratio_err = ratio * (half_unit(ns) / number_of(ns) +
                                      half_unit(floor_ns) / number_of(floor_ns));
    EXPECT_NEAR(number_of(x), ratio, half_unit(x) + ratio_err + 1e-9)
        << ns << " / " << floor_ns << " against " << x;
    // Heap bytes per key: a node and the state, or "-" where malloc does not say.
    if (bytes != "-") {
      EXPECT_GE(number_of(bytes), 16.0) << bytes;
      EXPECT_LE(number_of(bytes), 1024.0) << bytes;
    }
    // The CSV row: the table's figures, at more decimals where it has them.
    EXPECT_EQ(row.at("ns_per_check"), ns);
    EXPECT_TRUE(same_figure(row.at("x_floor"), x)) << row.at("x_floor") << " vs " << x;
    EXPECT_TRUE(same_figure(row.at("threads2_over_1"), two))
        << row.at("threads2_over_1") << " vs " << two;
    EXPECT_EQ(row.at("process_bytes_per_key"), bytes == "-" ? "" : bytes);
    EXPECT_EQ(row.at("floor_ns_per_check"), floor_ns);
    EXPECT_EQ(row.at("redis_used_memory_per_key"), "");
    EXPECT_EQ(row.at("max_in_window"), cells[9]);
    // The chart: one bar per policy, in the table's order, with its figure.
    EXPECT_TRUE(same_figure(bars.at("Cost per check")[i], x))
        << bars.at("Cost per check")[i] << " vs " << x;
    if (bytes == "-") {
      EXPECT_EQ(bars.at("Memory per key, in process")[i], "n/a");
    } else {
      EXPECT_TRUE(same_figure(bars.at("Memory per key, in process")[i], bytes))
          << bars.at("Memory per key, in process")[i] << " vs " << bytes;
    }
    EXPECT_EQ(bars.at("Most calls in any window")[i], cells[9]);
  }
  fs::remove(csv);
  fs::remove(svg);
}

// A bar's label from 1,000 to 9,999 is a plain number, as the table has it
// ("%.3g" alone printed 1500 as "1.5e+03").
TEST(CompareTool, BarLabelsInTheThousandsArePlainNumbers) {
  const fs::path trace = temp("thousands.csv");
  {
    std::ofstream f(trace, std::ios::binary);
    f << "ts,key\n";
    for (int i = 0; i < 1500; ++i) f << 1'000'000 + i * 100 << ",a\n";
  }
  const fs::path svg = temp("thousands.svg");
  const auto r = compare("--quick --no-redis --keys 100 --rounds 1 --rate 5000/s --svg '" +
                         svg.string() + "' '" + trace.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto table = table_rows(r.out);
  const auto bars = svg_bars(slurp(svg));
  ASSERT_EQ(bars.count("Most calls in any window"), 1u);
  ASSERT_EQ(bars.at("Most calls in any window").size(), policies.size());
  for (std::size_t i = 0; i < policies.size(); ++i) {
    SCOPED_TRACE(policies[i]);
    EXPECT_EQ(table.at(policies[i])[9], "1500");
    EXPECT_EQ(bars.at("Most calls in any window")[i], "1500");
  }
  fs::remove(trace);
  fs::remove(svg);
}

/// Whether `s` is UTF-8 and holds no byte XML 1.0 forbids (control bytes but
/// tab, newline and carriage return).
bool xml_chars_only(const std::string& s, std::string& why) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80             ? 1
                    : (c & 0xe0) == 0xc0 ? 2
                    : (c & 0xf0) == 0xe0 ? 3
                    : (c & 0xf8) == 0xf0 ? 4
                                         : 0;
    if (n == 0 || i + n > s.size()) {
      why = "byte " + std::to_string(c) + " at " + std::to_string(i) + " starts no UTF-8 character";
      return false;
    }
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) {
        why = "bad UTF-8 at " + std::to_string(i);
        return false;
      }
    }
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      why = "control byte " + std::to_string(c) + " at " + std::to_string(i);
      return false;
    }
    i += n;
  }
  return true;
}

// The trace's file name is the user's: control bytes, bytes that are not
// UTF-8, markup and a line break in it (no quote: the test runs it through the shell) must not break the SVG (it is in the
// subtitle) nor add lines or rows to the markdown table.
TEST(CompareTool, HostileTraceFileNameKeepsTheOutputsWellFormed) {
  const std::string name = "evil\x01\xff\xc3\xa9<text>&|x|`[a](b)\n| fake | row |.csv";
  const fs::path trace = temp(name);
  fs::copy_file(sample, trace, fs::copy_options::overwrite_existing);
  const fs::path svg = temp("hostile.svg");
  const fs::path md = temp("hostile.md");
  const auto r = compare("--quick --no-redis --keys 200 --out '" + md.string() + "' --svg '" +
                         svg.string() + "' '" + trace.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string s = slurp(svg);
  std::string why;
  EXPECT_TRUE(well_formed(s, why)) << why;
  EXPECT_TRUE(xml_chars_only(s, why)) << why;
  EXPECT_NE(s.find("evil\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9&lt;text&gt;&amp;|x|"), std::string::npos);

  const std::string m = slurp(md);
  EXPECT_TRUE(xml_chars_only(m, why)) << why;
  const auto ls = lines_of(m);
  ASSERT_GE(ls.size(), 9u) << m;
  EXPECT_NE(ls[0].find("trace " + temp("").string()), std::string::npos) << ls[0];
  EXPECT_NE(ls[0].find("evil\xef\xbf\xbd\xef\xbf\xbd\xc3\xa9\\<text\\>\\&\\|x\\|\\`\\[a\\](b)"
                       "\xef\xbf\xbd\\| fake \\| row \\|.csv: 34,807 calls"),
            std::string::npos)
      << ls[0];
  EXPECT_EQ(ls[1], "");
  EXPECT_EQ(ls[2], expected_header);
  fs::remove(trace);
  fs::remove(svg);
  fs::remove(md);
}

TEST(CompareTool, SvgCheckerRejectsBrokenXml) {
  std::string why;
  EXPECT_TRUE(well_formed("<svg a='1'><g><rect/></g></svg>\n", why)) << why;
  EXPECT_FALSE(well_formed("<svg><g></svg>", why));
  EXPECT_FALSE(well_formed("<svg a='1></svg>", why));
  EXPECT_FALSE(well_formed("<svg>a & b</svg>", why));
  EXPECT_FALSE(well_formed("<svg></svg><svg></svg>", why));
}

/// ratelimit-replay's summary rows (admitted, rejected, keys blocked, max in W)
/// and caught / false-reject pairs at the rate's limit, by policy.
struct replay_figures {
  std::map<std::string, std::vector<std::string>> summary;
  std::map<std::string, std::pair<std::string, std::string>> caught;
};

replay_figures replay_summary(const std::string& rate, const std::string& limit,
                              const std::string& input) {
  const auto r = run_exe(RATELIMIT_REPLAY_EXE,
                         "--rate " + rate + " --sweep " + limit + " '" + input + "'");
  EXPECT_EQ(r.status, 0) << r.err;
  replay_figures f;
  const auto ls = lines_of(r.out);
  bool by_policy = false;
  for (const std::string& l : ls) {
    std::istringstream in(l);
    std::vector<std::string> tok;
    for (std::string t; in >> t;) tok.push_back(t);
    if (tok.empty()) continue;
    if (l.starts_with("Caught (abusive")) by_policy = true;
    if (!by_policy && tok.size() >= 6 &&
        std::find(policies.begin(), policies.end(), tok[0]) != policies.end()) {
      f.summary[tok[0]] = {no_commas(tok[1]), no_commas(tok[2]), no_commas(tok[4]), tok[5]};
    }
    if (by_policy && tok[0] == limit) {
      const std::regex pair(R"(([0-9.]+%) / ([0-9.]+%))");
      std::size_t i = 0;
      for (auto it = std::sregex_iterator(l.begin(), l.end(), pair); it != std::sregex_iterator();
           ++it, ++i) {
        if (i < policies.size()) f.caught[policies[i]] = {(*it)[1], (*it)[2]};
      }
    }
  }
  return f;
}

/// Runs both tools on `input` at `rate` and requires the same accuracy figures.
void expect_agreement(const std::string& rate, const std::string& limit, const std::string& input,
                      bool labelled) {
  const fs::path csv = temp("agree.csv");
  const auto r = compare("--quick --no-redis --keys 200 --rounds 1 --rate " + rate + " --csv '" +
                         csv.string() + "' '" + input + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = csv_rows(slurp(csv));
  const auto table = table_rows(r.out);
  const replay_figures want = replay_summary(rate, limit, input);
  ASSERT_EQ(want.summary.size(), policies.size());
  for (const std::string& p : policies) {
    SCOPED_TRACE(p + " at " + rate);
    const auto& got = rows.at(p);
    const auto& w = want.summary.at(p);
    EXPECT_EQ(got.at("admitted"), w[0]);
    EXPECT_EQ(got.at("rejected"), w[1]);
    EXPECT_EQ(got.at("keys_blocked"), w[2]);
    EXPECT_EQ(got.at("max_in_window"), w[3]);
    const auto& cells = table.at(p);
    EXPECT_EQ(no_commas(cells[8]), w[0]);
    EXPECT_EQ(cells[9], w[3]);
    EXPECT_EQ(no_commas(cells[10]), w[2]);
    if (labelled) {
      ASSERT_EQ(want.caught.count(p), 1u);
      EXPECT_EQ(cells[11], want.caught.at(p).first);
      EXPECT_EQ(cells[12], want.caught.at(p).second);
    } else {
      EXPECT_EQ(cells[11], "-");
      EXPECT_EQ(cells[12], "-");
      EXPECT_EQ(got.at("abusive_caught"), "");
    }
  }
  fs::remove(csv);
}

TEST(CompareTool, AccuracyAgreesWithReplayOnTheSample) {
  expect_agreement("10/15min", "10", sample, true);
  expect_agreement("3/min", "3", sample, true);
}

TEST(CompareTool, AccuracyAgreesWithReplayWithoutLabels) {
  // Unlabelled events with costs, out of order within a key, and one ISO time.
  const fs::path p = temp("unlabelled.csv");
  std::ofstream(p, std::ios::binary) << "ts,key,cost\n"
                                        "1000000,a,1\n1200000,a,2\n1100000,a,1\n"
                                        "1300000,b\n1400000,a\n2000001,a,3\n"
                                        "1970-01-01T00:00:02.500Z,b,2\n2600000,b\n2700000,b\n";
  expect_agreement("3/s", "3", p.string(), false);
  fs::remove(p);
}

TEST(CompareTool, PolicyThatCannotTakeTheRateIsNotApplicable) {
  // gcra needs at least 1 us between requests; the other four run.
  const fs::path csv = temp("na.csv");
  const auto r = compare("--quick --no-redis --keys 100 --rounds 1 --rate 3000000/s --csv '" +
                         csv.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto table = table_rows(r.out);
  EXPECT_EQ(table.at("gcra")[1], "n/a");
  EXPECT_TRUE(is_number(table.at("token_bucket")[1]));
  EXPECT_NE(r.out.find("- n/a gcra: --rate 3000000/1s"), std::string::npos) << r.out;
  const auto rows = csv_rows(slurp(csv));
  EXPECT_NE(rows.at("gcra").at("unavailable"), "");
  EXPECT_EQ(rows.at("gcra").at("admitted"), "");
  fs::remove(csv);
}

TEST(CompareTool, BadArgumentsAreUsageErrorsNamingTheValue) {
  const struct {
    std::string args;
    std::string message;
  } cases[] = {
      {"--rate 10/fortnight", "10/fortnight"},
      {"--rate", "--rate needs a value"},
      {"--keys 1", "--keys \"1\""},
      {"--keys 2000001", "--keys \"2000001\""},
      {"--keys -5", "--keys \"-5\""},
      {"--rounds 0", "--rounds \"0\""},
      {"--rounds ten", "--rounds \"ten\""},
      {"--redis ftp://x", "--redis \"ftp://x\""},
      {"--redis 'mongodb://admin:hunter2@db'", "mongodb://***@db"},
      {"--no-redis=1", "--no-redis takes no value"},
      {"--csv ''", "--csv needs a file name"},
      {"--bogus", "\"--bogus\""},
      {"a.csv b.csv", "more than one INPUT"},
      {"--no-redis /nonexistent/calls.csv", "/nonexistent/calls.csv"},
#ifdef RATELIMIT_COMPARE_HAVE_REDIS
      // An out-of-range port is not quoted (it may be a numeric password).
      {"--redis redis://h:99999", "port is not a number from 1 to 65535"},
      {"--redis auto --no-redis", "exclude each other"},
#else
      {"--redis auto", "without Redis support"},
#endif
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = compare(c.args);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("hunter2"), std::string::npos) << r.err;
  }
  EXPECT_EQ(compare("--help").status, 0);
}

// An address-space limit fixes the memory budget whatever the machine; the
// sanitizers reserve terabytes of address space and cannot run under one.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

TEST(CompareTool, RunsThatWouldNotFitInMemoryAreRefusedUpFront) {
  if (sanitized) GTEST_SKIP() << "needs ulimit -v, which the sanitizers cannot run under";
  // Budget: half of 2 GiB. A million keys whose sliding logs grow by one entry
  // per pass over 1,667 passes need about 50 GiB.
  const fs::path out = temp("budget_out.txt");
  const fs::path err = temp("budget_err.txt");
  const std::string cmd = "ulimit -v 2097152; '" + std::string(RATELIMIT_COMPARE_EXE) +
                          "' --no-redis --keys 1000000 --rounds 1000 --rate 1000000/d >'" +
                          out.string() + "' 2>'" + err.string() + "' </dev/null";
  const int raw = std::system(cmd.c_str());
  EXPECT_EQ(WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, 2);
  const std::string e = slurp(err);
  EXPECT_NE(e.find("--keys 1000000 with --rounds 1000 needs about"), std::string::npos) << e;
  EXPECT_NE(e.find("over the memory budget of 1.0 GiB"), std::string::npos) << e;
  EXPECT_EQ(slurp(out), "");
  fs::remove(out);
  fs::remove(err);
}

TEST(CompareTool, BadInputLinesAreNamedBeforeAnyMeasurement) {
  const fs::path p = temp("bad.csv");
  std::ofstream(p, std::ios::binary) << "ts,key\n1,a\n2\n";
  const auto r = compare("--no-redis '" + p.string() + "'");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("line 3"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("in process"), std::string::npos) << r.err;  // failed fast
  const auto skipped = compare("--quick --no-redis --keys 100 --rounds 1 --skip-bad-lines '" +
                               p.string() + "'");
  EXPECT_EQ(skipped.status, 0) << skipped.err;
  EXPECT_NE(skipped.err.find("skipped 1 bad line"), std::string::npos) << skipped.err;
  fs::remove(p);
}

TEST(CompareTool, UnwritableOutputIsAFailure) {
  const auto r = compare("--quick --no-redis --keys 100 --rounds 1 --out /nonexistent/dir/t.md");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("/nonexistent/dir/t.md"), std::string::npos) << r.err;
}

#ifdef RATELIMIT_COMPARE_HAVE_REDIS
TEST(CompareTool, RedisColumnsFromAThrowawayServer) {
  const fs::path csv = temp("redis.csv");
  const fs::path svg = temp("redis.svg");
  const auto r = compare("--quick --keys 200 --rounds 1 --redis auto --csv '" + csv.string() +
                         "' --svg '" + svg.string() + "'");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto table = table_rows(r.out);
  for (const std::string& p : policies) {
    SCOPED_TRACE(p);
    const auto& cells = table.at(p);
    EXPECT_TRUE(is_number(cells[5])) << cells[5];
    EXPECT_TRUE(is_number(cells[6])) << cells[6];
    EXPECT_TRUE(is_number(cells[7])) << cells[7];
  }
  EXPECT_NE(r.out.find("a throwaway redis-server on 127.0.0.1:"), std::string::npos) << r.out;
  // MEMORY USAGE of one key: the sliding log (an entry list) is the largest.
  const auto rows = csv_rows(slurp(csv));
  const auto bars = svg_bars(slurp(svg));
  ASSERT_EQ(bars.count("Redis, one at a time"), 1u);
  ASSERT_EQ(bars.count("Redis memory per key"), 1u);
  for (std::size_t i = 0; i < policies.size(); ++i) {
    const std::string& p = policies[i];
    SCOPED_TRACE(p);
    const auto& cells = table.at(p);
    const auto& row = rows.at(p);
    EXPECT_GT(number_of(cells[5]), 0.0);
    EXPECT_GT(number_of(cells[6]), 0.0);
    // A key, its state and its config fingerprint: tens to hundreds of bytes.
    EXPECT_GE(number_of(cells[7]), 32.0);
    EXPECT_LE(number_of(cells[7]), 4096.0);
    EXPECT_TRUE(same_figure(row.at("redis_checks_per_s"), cells[5]))
        << row.at("redis_checks_per_s") << " vs " << cells[5];
    EXPECT_TRUE(same_figure(row.at("redis_batch_checks_per_s"), cells[6]))
        << row.at("redis_batch_checks_per_s") << " vs " << cells[6];
    EXPECT_TRUE(same_figure(row.at("redis_bytes_per_key"), cells[7]))
        << row.at("redis_bytes_per_key") << " vs " << cells[7];
    // INFO used_memory growth adds Redis's own entries to MEMORY USAGE's
    // figure; allocator arenas make it coarse, so only its order is checked.
    if (!row.at("redis_used_memory_per_key").empty()) {
      EXPECT_GT(number_of(row.at("redis_used_memory_per_key")), 0.0);
      EXPECT_LE(number_of(row.at("redis_used_memory_per_key")), 8192.0);
    }
    ASSERT_EQ(bars.at("Redis, one at a time").size(), policies.size());
    ASSERT_EQ(bars.at("Redis memory per key").size(), policies.size());
    EXPECT_TRUE(same_figure(bars.at("Redis, one at a time")[i], cells[5]))
        << bars.at("Redis, one at a time")[i] << " vs " << cells[5];
    EXPECT_TRUE(same_figure(bars.at("Redis memory per key")[i], cells[7]))
        << bars.at("Redis memory per key")[i] << " vs " << cells[7];
  }
  EXPECT_GT(std::stod(rows.at("sliding_log").at("redis_bytes_per_key")),
            std::stod(rows.at("gcra").at("redis_bytes_per_key")));
  std::string why;
  const std::string s = slurp(svg);
  EXPECT_TRUE(well_formed(s, why)) << why;
  EXPECT_NE(s.find("Redis, one at a time"), std::string::npos);
  fs::remove(csv);
  fs::remove(svg);
}

/// Runs ratelimit-compare with `args` where no redis-server can be found:
/// RATELIMIT_REDIS_SERVER unset and PATH an empty directory.
result compare_without_redis_server(const std::string& args) {
  const fs::path empty = temp("empty_path");
  fs::create_directories(empty);
  const result r = run_exe(RATELIMIT_COMPARE_EXE, args,
                           "env -u RATELIMIT_REDIS_SERVER PATH='" + empty.string() + "' ");
  fs::remove(empty);
  return r;
}

// The default run (no --redis) on a machine without redis-server: said up
// front, in the tool's words, then the table without the Redis columns.
TEST(CompareTool, DefaultRunWithoutRedisServerLeavesTheRedisColumnsOut) {
  const auto r = compare_without_redis_server("--quick --keys 200 --rounds 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto table = table_rows(r.out);
  ASSERT_EQ(table.size(), policies.size()) << r.out;
  for (const std::string& p : policies) {
    SCOPED_TRACE(p);
    EXPECT_TRUE(is_number(table.at(p)[1])) << table.at(p)[1];
    EXPECT_EQ(table.at(p)[5], "-");
    EXPECT_EQ(table.at(p)[7], "-");
  }
  EXPECT_NE(r.out.find("- Redis: not measured"), std::string::npos) << r.out;
  const auto note = r.err.find("no redis-server found");
  ASSERT_NE(note, std::string::npos) << r.err;
  // Said before anything was measured.
  EXPECT_LT(note, r.err.find("accuracy: replaying")) << r.err;
  EXPECT_NE(r.err.find("RATELIMIT_REDIS_SERVER"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Redis columns are left out"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--redis URL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("install redis-server"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("RATELIMIT_TEST_REDIS_URL"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tests"), std::string::npos) << r.err;
}

// --redis auto asked for explicitly: refused before anything is measured.
TEST(CompareTool, ExplicitRedisAutoWithoutRedisServerFailsEarly) {
  const auto r = compare_without_redis_server("--quick --keys 200 --rounds 1 --redis auto");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("--redis auto: no redis-server found"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("RATELIMIT_REDIS_SERVER"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--no-redis"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("accuracy"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("in process"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("RATELIMIT_TEST_REDIS_URL"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tests"), std::string::npos) << r.err;
}

// A redis-server that cannot run is found out before anything is measured.
TEST(CompareTool, RedisServerThatCannotRunIsFoundOutBeforeMeasuring) {
  const fs::path dir = temp("bad_servers");
  fs::create_directories(dir / "as_dir" / "redis-server");  // a directory of that name
  fs::create_directories(dir / "exits");
  const fs::path script = dir / "exits" / "redis-server";  // runs, serves nothing
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nexit 1\n";
  }
  fs::permissions(script, fs::perms::owner_all);
  const std::string args = "--quick --keys 200 --rounds 1";
  const auto with = [&](const std::string& env) {
    return run_exe(RATELIMIT_COMPARE_EXE, args, "env -u RATELIMIT_REDIS_SERVER " + env + " ");
  };
  {
    SCOPED_TRACE("RATELIMIT_REDIS_SERVER names a directory: asked for, so an error");
    const auto r = with("RATELIMIT_REDIS_SERVER='" + dir.string() + "' PATH=/usr/bin:/bin");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("is not an executable file"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("accuracy"), std::string::npos) << r.err;
  }
  {
    SCOPED_TRACE("RATELIMIT_REDIS_SERVER names a program that exits at once");
    const auto r = with("RATELIMIT_REDIS_SERVER='" + script.string() + "' PATH=/usr/bin:/bin");
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("did not start"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("accuracy"), std::string::npos) << r.err;
  }
  {
    SCOPED_TRACE("a directory named redis-server on PATH is skipped, as execvp skips it");
    const auto r = with("PATH='" + (dir / "as_dir").string() + "'");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("no redis-server found"), std::string::npos) << r.err;
  }
  {
    SCOPED_TRACE("by default, a server that does not start leaves the columns out");
    const auto r = with("PATH='" + (dir / "exits").string() + "'");
    EXPECT_EQ(r.status, 0) << r.err;
    const auto note = r.err.find("did not start");
    ASSERT_NE(note, std::string::npos) << r.err;
    EXPECT_LT(note, r.err.find("accuracy: replaying")) << r.err;
    EXPECT_NE(r.err.find("Redis columns are left out"), std::string::npos) << r.err;
    const auto table = table_rows(r.out);
    ASSERT_EQ(table.size(), policies.size()) << r.out;
    for (const std::string& p : policies) EXPECT_EQ(table.at(p)[5], "-") << p;
  }
  fs::remove_all(dir);
}

// A RATELIMIT_REDIS_SERVER wrapper that runs redis-server as a child of its
// own (no exec): the throwaway server is still stopped at the end (the whole
// process group is killed), so nothing listens on its port afterwards.
TEST(CompareTool, WrappedRedisServerIsStoppedWithItsWrapper) {
  const fs::path dir = temp("wrapper");
  fs::create_directories(dir);
  const fs::path script = dir / "redis-server";
  {
    std::ofstream f(script);
    f << "#!/bin/sh\nredis-server \"$@\"\n";  // the one on PATH, as a child of the shell
  }
  fs::permissions(script, fs::perms::owner_all);
  const auto r = run_exe(RATELIMIT_COMPARE_EXE, "--quick --keys 200 --rounds 1",
                         "env RATELIMIT_REDIS_SERVER='" + script.string() + "' ");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string mark = "a throwaway redis-server on 127.0.0.1:";
  const auto at = r.out.find(mark);
  ASSERT_NE(at, std::string::npos) << r.out;
  const int port = std::stoi(r.out.substr(at + mark.size()));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // A killed process closes its sockets as it dies, a moment after the
  // signal: 5 s to stop listening (it never did, before the group kill).
  bool listening = true;
  for (int i = 0; i < 100 && listening; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    listening = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (listening) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(listening) << "a server still listens on port " << port;
  fs::remove_all(dir);
}

TEST(CompareTool, UnreachableRedisIsAFailureNamingTheServer) {
  // Port 1 on loopback: nothing listens there.
  const auto r = compare("--quick --keys 100 --rounds 1 --redis redis://127.0.0.1:1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}
#endif

}  // namespace
