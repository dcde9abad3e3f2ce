// SPDX-License-Identifier: Apache-2.0
// The ratelimit-replay command line: argument parsing, the three modes, and their reports.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <istream>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/errors.hpp"
#include "replay.hpp"
#include "store.hpp"
#include "svg.hpp"
#include "timestamp.hpp"

namespace ratelimit::replay {

inline constexpr std::string_view usage_text =
    R"(ratelimit-replay: replay a call log through rate-limiting policies.

Usage:
  ratelimit-replay --rate RATE [--burst B] [--count-rejected] [--policy POLICY]
                   [--sweep LIMITS [--plot FILE.svg]] [--skip-bad-lines] INPUT
      Summary: every policy at RATE on the same events (admitted, rejected,
      keys blocked, most calls one key got through in any window, memory,
      speed); with --policy and no --sweep, that policy only. With --sweep,
      then a threshold sweep over the given limits with RATE's window, and
      the distribution of each key's peak calls per window.
  ratelimit-replay --policy POLICY --rate RATE [--burst B] [--count-rejected]
                   [--store URL] [--skip-bad-lines] --decisions INPUT
      Decisions: CSV on standard output, one row per event in input order:
      ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us
      (retry_after_us -1 = never).

INPUT       CSV file, or - for standard input. One event per line:
            timestamp,key[,cost[,label]]; timestamp = integer microseconds,
            decimal seconds (1-6 fractional digits) or ISO-8601 UTC ending in Z;
            cost defaults to 1; label 1 = abusive, 0 = normal; '#' lines are
            comments; a first line whose first field starts with a letter or
            _ is a header (anything else must be a valid timestamp); a UTF-8
            byte-order mark at the start is skipped.

Options:
  --policy POLICY     fixed_window, sliding_log, sliding_counter, token_bucket
                      or gcra (required with --decisions; the summary's only
                      row without --sweep; the sweep table's policy with
                      --sweep, default sliding_log)
  --rate RATE         e.g. 10/15min, "10 per 15 minutes", 100/s, 1000 per day
  --burst B           capacity of token_bucket and gcra (default: the limit)
  --count-rejected    window policies count rejected attempts too
  --store URL         memory (default), redis://[USER:PASSWORD@]HOST:PORT[/DB]
                      or redis-cluster://HOST:PORT[,...] (--decisions only)
  --decisions         machine-readable decisions (see above)
  --sweep LIMITS      5..30, 5..60/5 or 5,10,20: limits to try
  --plot FILE.svg     with --sweep: chart of the sweep, one line per policy
  --skip-bad-lines    skip bad lines instead of failing; count the physical
                      lines dropped on stderr
  -h, --help          this text

Exit status: 0 success, 2 usage or input error (message names the line),
1 other failure (store unreachable, cannot write the plot).
)";

/// Parsed command line.
struct cli_options {
  std::optional<policy_id> policy;
  std::optional<rate> r;
  std::optional<units> burst;
  bool count_rejected = false;
  std::string store;
  bool decisions = false;
  std::optional<std::vector<units>> sweep;
  std::string plot;
  bool skip_bad_lines = false;
  bool help = false;
  std::string input;
};

/// A usage error: exit status 2.
class usage_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Parses arguments strictly: unknown flags, missing values and repeated
/// inputs are usage errors naming the argument.
[[nodiscard]] inline cli_options parse_cli(const std::vector<std::string>& args) {
  cli_options o;
  bool have_input = false;
  bool only_positional = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (only_positional || arg == "-" || !arg.starts_with("-")) {
      if (have_input) {
        throw usage_error("more than one INPUT: \"" + o.input + "\" and \"" + arg + "\"");
      }
      o.input = arg;
      have_input = true;
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    std::optional<std::string> inline_value;
    if (const auto eq = arg.find('='); eq != std::string::npos && arg.starts_with("--")) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    const auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw usage_error(arg + " needs a value");
      return args[++i];
    };
    const auto flag = [&] {
      if (inline_value) throw usage_error(arg + " takes no value");
    };
    if (arg == "-h" || arg == "--help") {
      flag();
      o.help = true;
    } else if (arg == "--policy") {
      const std::string v = value();
      o.policy = parse_policy(v);
      if (!o.policy) {
        throw usage_error("unknown policy \"" + v +
                          "\" (use fixed_window, sliding_log, sliding_counter, token_bucket "
                          "or gcra)");
      }
    } else if (arg == "--rate") {
      const std::string v = value();
      try {
        o.r = rate::parse(v);
      } catch (const std::invalid_argument& e) {
        throw usage_error(std::string("--rate: ") + e.what());
      }
    } else if (arg == "--burst") {
      const std::string v = value();
      std::size_t pos = 0;
      std::int64_t b = 0;
      if (!ratelimit::detail::parse_digits(v, pos, max_units, b) || pos != v.size() || b < 1) {
        throw usage_error("--burst \"" + v + "\" must be a whole number from 1 to " +
                          std::to_string(max_units));
      }
      o.burst = b;
    } else if (arg == "--count-rejected") {
      flag();
      o.count_rejected = true;
    } else if (arg == "--store") {
      o.store = value();
    } else if (arg == "--decisions") {
      flag();
      o.decisions = true;
    } else if (arg == "--sweep") {
      try {
        o.sweep = parse_sweep(value());
      } catch (const std::invalid_argument& e) {
        throw usage_error(e.what());
      }
    } else if (arg == "--plot") {
      o.plot = value();
      if (o.plot.empty()) throw usage_error("--plot needs a file name");
    } else if (arg == "--skip-bad-lines") {
      flag();
      o.skip_bad_lines = true;
    } else {
      throw usage_error("unknown option \"" + args[i] + "\" (see --help)");
    }
  }
  if (o.help) return o;
  if (!have_input) throw usage_error("missing INPUT (a CSV file, or - for standard input)");
  if (!o.r) throw usage_error("missing --rate (e.g. --rate 10/15min)");
  if (o.decisions) {
    if (!o.policy) throw usage_error("--decisions needs --policy");
    if (o.sweep) throw usage_error("--sweep cannot be combined with --decisions");
    if (!o.plot.empty()) throw usage_error("--plot cannot be combined with --decisions");
    if (o.burst && is_window_policy(*o.policy)) {
      throw usage_error("--burst applies to token_bucket and gcra, not " +
                        std::string(policy_name(*o.policy)));
    }
    if (o.count_rejected && !is_window_policy(*o.policy)) {
      throw usage_error("--count-rejected applies to the window policies, not " +
                        std::string(policy_name(*o.policy)));
    }
  } else {
    if (!o.store.empty() && o.store != "memory") {
      throw usage_error("--store applies to --decisions only (the summary runs in process)");
    }
    if (!o.plot.empty() && !o.sweep) throw usage_error("--plot needs --sweep");
  }
  return o;
}

namespace detail {

[[nodiscard]] inline std::string group(std::uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string s;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

[[nodiscard]] inline std::string pct(double part, double whole, int decimals = 2) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(decimals) << (whole > 0 ? 100.0 * part / whole : 0.0) << '%';
  return o.str();
}

[[nodiscard]] inline std::string bytes(double b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  if (b < 1024) {
    o << std::setprecision(0) << b << " B";
  } else if (b < 1024.0 * 1024) {
    o << b / 1024 << " KiB";
  } else {
    o << b / 1024 / 1024 << " MiB";
  }
  return o.str();
}

[[nodiscard]] inline std::string rate_per_s(double v) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1);
  if (v >= 1e6) {
    o << v / 1e6 << "M";
  } else if (v >= 1e3) {
    o << v / 1e3 << "k";
  } else {
    o << std::setprecision(0) << v;
  }
  return o.str();
}

[[nodiscard]] inline std::string pad(std::string s, std::size_t w, bool left = false) {
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

[[nodiscard]] inline std::string describe_settings(const limiter_settings& s) {
  std::string d = "window " + format_duration(s.r.period().count()) + ", rejected calls " +
                  (s.count_rejected ? "counted (--count-rejected)" : "not counted");
  return d;
}

}  // namespace detail

/// Prints the five-policy comparison.
inline void print_summary(std::ostream& out, const analysis_result& r, const limiter_settings& s,
                          std::string_view input_name) {
  using namespace detail;
  const rate& rt = s.r;
  out << "Replayed " << group(r.events) << " events from " << input_name << ": " << group(r.keys)
      << " keys";
  if (r.labelled) {
    out << " (" << group(r.abusive_keys) << " labelled abusive, " << group(r.normal_keys)
        << " normal)";
  }
  out << '\n';
  if (r.events > 0) {
    out << "Time span " << format_iso(r.first_ts) << " .. " << format_iso(r.last_ts) << '\n';
  }
  out << "Rate " << rt.limit() << " per " << format_duration(rt.period().count()) << "; burst "
      << s.burst.value_or(rt.limit()) << " for token_bucket and gcra; " << describe_settings(s)
      << "\n\n";
  out << pad("policy", 16, true) << pad("admitted", 12) << pad("rejected", 11)
      << pad("rejected%", 10) << pad("keys blocked", 13) << pad("max in W", 9)
      << pad("state/key", 11) << pad("state peak", 12) << pad("events/s", 10) << '\n';
  std::string unavailable;
  for (const policy_summary& p : r.policies) {
    if (!p.unavailable.empty()) {
      // One policy that cannot take the rate must not cost the other four.
      out << pad(std::string(policy_name(p.id)), 16, true) << pad("n/a", 12) << '\n';
      unavailable += "n/a " + std::string(policy_name(p.id)) + ": " + p.unavailable + '\n';
      continue;
    }
    const double secs = r.shared_seconds + p.seconds;
    const double eps = secs > 0 ? static_cast<double>(r.events) / secs : 0.0;
    out << pad(std::string(policy_name(p.id)), 16, true) << pad(group(p.admitted), 12)
        << pad(group(p.rejected), 11)
        << pad(pct(static_cast<double>(p.rejected), static_cast<double>(r.events)), 10)
        << pad(group(p.keys_blocked), 13) << pad(std::to_string(p.max_in_window), 9)
        << pad(bytes(p.state_bytes_per_key), 11)
        << pad(bytes(static_cast<double>(p.state_peak_bytes)), 12) << pad(rate_per_s(eps), 10)
        << '\n';
  }
  if (!unavailable.empty()) out << '\n' << unavailable;
  out << "\nmax in W: most calls one key got through in any window (t-W, t] of "
      << format_duration(rt.period().count()) << " (the limit is " << rt.limit()
      << "; a fixed window lets up to twice that through across a window edge).\n"
      << "state/key: policy state per key (mean); state peak: state of the keys not yet idle,"
         " at the busiest sample.\n"
      << "events/s: events / CPU time of one core for the shared work (reading, parsing,"
         " key lookup, max-in-W rings) plus this policy's own steps; the whole pass ("
      << std::count_if(r.policies.begin(), r.policies.end(),
                       [](const policy_summary& p) { return p.unavailable.empty(); }) +
             std::count_if(r.sweep.begin(), r.sweep.end(),
                           [](const sweep_point& p) { return p.unavailable.empty(); })
      << " policy runs): "
      << rate_per_s(r.total_seconds > 0 ? static_cast<double>(r.events) / r.total_seconds : 0.0)
      << " events/s.\nTool bookkeeping beyond the policy state: "
      << bytes(r.keys == 0 ? 0.0 : static_cast<double>(r.tool_bytes) / static_cast<double>(r.keys))
      << " per key at peak (key bytes, key index, per-key info, window rings), plus a 1 MiB"
         " read buffer.\n";
}

/// Prints the sweep table for `policy`, the per-policy catch and false-reject
/// rates, and the distribution of per-key peaks.
inline void print_sweep(std::ostream& out, const analysis_result& r, const limiter_settings& s,
                        policy_id policy) {
  using namespace detail;
  const std::string w = format_duration(r.window_us);
  out << "\nThreshold sweep: " << policy_name(policy) << ", " << describe_settings(s)
      << "; each limit is also the burst of token_bucket and gcra\n\n";
  out << pad("limit", 7) << pad("keys blocked", 14) << pad("calls rejected", 16);
  if (r.labelled) out << pad("abusive caught", 24) << pad("normal wrongly blocked", 26);
  out << '\n';
  std::string unavailable;
  for (const sweep_point& p : r.sweep) {
    if (p.id != policy) continue;
    if (!p.unavailable.empty()) {
      out << pad(std::to_string(p.limit), 7) << pad("n/a", 14) << '\n';
      if (unavailable.empty()) unavailable = p.unavailable;
      continue;
    }
    out << pad(std::to_string(p.limit), 7)
        << pad(pct(static_cast<double>(p.keys_blocked), static_cast<double>(r.keys)), 14)
        << pad(pct(static_cast<double>(p.rejected), static_cast<double>(r.events)), 16);
    if (r.labelled) {
      out << pad(group(p.abusive_caught) + "/" + group(r.abusive_keys) + " " +
                     pct(static_cast<double>(p.abusive_caught), static_cast<double>(r.abusive_keys),
                         1),
                 24)
          << pad(group(p.normal_blocked) + "/" + group(r.normal_keys) + " " +
                     pct(static_cast<double>(p.normal_blocked), static_cast<double>(r.normal_keys)),
                 26);
    }
    out << '\n';
  }
  if (!unavailable.empty()) {
    out << "n/a: " << policy_name(policy) << " cannot take some limits; the first: " << unavailable
        << '\n';
  }
  if (r.labelled) {
    out << "\nCaught (abusive keys blocked at least once) / false rejects (normal keys blocked"
           " at least once), by policy:\n\n"
        << pad("limit", 7);
    for (const policy_id p : all_policies) out << pad(std::string(policy_name(p)), 22);
    out << '\n';
    std::vector<units> limits;
    for (const sweep_point& p : r.sweep) {
      if (std::find(limits.begin(), limits.end(), p.limit) == limits.end()) {
        limits.push_back(p.limit);
      }
    }
    for (const units l : limits) {
      out << pad(std::to_string(l), 7);
      for (const policy_id id : all_policies) {
        std::string cell = "-";
        for (const sweep_point& p : r.sweep) {
          if (p.id == id && p.limit == l && !p.unavailable.empty()) {
            cell = "n/a";
          } else if (p.id == id && p.limit == l) {
            cell = pct(static_cast<double>(p.abusive_caught), static_cast<double>(r.abusive_keys),
                       1) +
                   " / " +
                   pct(static_cast<double>(p.normal_blocked), static_cast<double>(r.normal_keys));
          }
        }
        out << pad(cell, 22);
      }
      out << '\n';
    }
  }
  out << "\nPeak calls per key in any " << w
      << " window (t-W, t], all attempts counted (what a threshold is compared with):\n\n"
      << pad("keys", 16, true) << pad("count", 9) << pad("p50", 7) << pad("p90", 7) << pad("p99", 7)
      << pad("p99.9", 7) << pad("max", 7) << '\n';
  const auto row = [&](const char* name, int label) {
    std::vector<std::uint32_t> v;
    for (const auto& [peak, l] : r.key_peaks) {
      if (label == 2 || l == label) v.push_back(peak);
    }
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    out << pad(name, 16, true) << pad(group(v.size()), 9);
    for (const double q : {0.5, 0.9, 0.99, 0.999}) {
      out << pad(std::to_string(percentile(v, q)), 7);
    }
    out << pad(std::to_string(v.back()), 7) << '\n';
  };
  if (r.labelled) {
    row("normal (0)", 0);
    row("abusive (1)", 1);
    row("unlabelled", -1);
  }
  row("all", 2);
  out << "A key is blocked by the sliding log with --count-rejected at limit L exactly when its"
         " peak exceeds L.\n";
}

/// Writes the sweep chart: with labels, catch rate and false-reject rate
/// against the limit; without, keys blocked and calls rejected.
inline void write_sweep_plot(std::ostream& o, const analysis_result& r, const limiter_settings& s) {
  std::vector<plot_panel> panels(2);
  const std::string x = "limit (calls per " + format_duration(r.window_us) + ")";
  if (r.labelled) {
    panels[0] = {"Abusive callers caught", x, "% of abusive keys blocked at least once", true, {}};
    panels[1] = {"Normal callers wrongly blocked",
                 x,
                 "false-reject rate: % of normal keys blocked",
                 false,
                 {}};
  } else {
    panels[0] = {"Keys blocked at least once", x, "% of keys", false, {}};
    panels[1] = {"Calls rejected", x, "% of calls", false, {}};
  }
  for (const policy_id id : all_policies) {
    plot_series a{std::string(policy_name(id)), {}};
    plot_series b{std::string(policy_name(id)), {}};
    for (const sweep_point& p : r.sweep) {
      if (p.id != id || !p.unavailable.empty()) continue;
      const auto xl = static_cast<double>(p.limit);
      if (r.labelled) {
        a.points.emplace_back(xl, r.abusive_keys == 0
                                      ? 0.0
                                      : 100.0 * static_cast<double>(p.abusive_caught) /
                                            static_cast<double>(r.abusive_keys));
        b.points.emplace_back(xl, r.normal_keys == 0
                                      ? 0.0
                                      : 100.0 * static_cast<double>(p.normal_blocked) /
                                            static_cast<double>(r.normal_keys));
      } else {
        a.points.emplace_back(xl, r.keys == 0 ? 0.0
                                              : 100.0 * static_cast<double>(p.keys_blocked) /
                                                    static_cast<double>(r.keys));
        b.points.emplace_back(xl, r.events == 0 ? 0.0
                                                : 100.0 * static_cast<double>(p.rejected) /
                                                      static_cast<double>(r.events));
      }
    }
    if (a.points.empty()) continue;
    panels[0].series.push_back(std::move(a));
    panels[1].series.push_back(std::move(b));
  }
  const std::string subtitle = detail::describe_settings(s) +
                               "; each limit is also the burst of token_bucket and gcra";
  write_svg_chart(o,
                  "Rate-limit threshold sweep: " + detail::group(r.events) + " calls, " +
                      detail::group(r.keys) + " callers",
                  subtitle, panels);
}

/// The latest event time a --store takes, and why, when less than the parser's 2^62 us.
struct store_time_limit {
  std::int64_t max_us = max_timestamp_us;
  std::string why;  ///< ends the message for a later time
};

/// The Redis stores take caller times up to 2^52 us only (redis::max_script_time):
/// their Lua scripts compute in doubles, exact to 2^53, with headroom for a
/// window past the time. The in-process store takes the parser's whole range.
[[nodiscard]] inline store_time_limit time_limit_of(std::string_view store_url) {
  if (!is_redis_url(store_url)) return {};
  constexpr std::int64_t redis_max = std::int64_t{1} << 52;
#ifdef RATELIMIT_REPLAY_HAVE_REDIS
  static_assert(redis_max == ratelimit::redis::max_script_time.count());
#endif
  return {redis_max,
          "the latest time the Redis store takes: its Lua scripts compute in doubles, exact "
          "only below 2^53 (the in-memory store takes up to 2^62 us)"};
}

namespace detail {

/// Runs decisions mode for policy P on the store named by --store.
template <class P>
int run_decisions(const cli_options& o, std::istream& std_in, std::ostream& out,
                  std::ostream& err) {
  limiter_settings settings{*o.r, o.burst, o.count_rejected};
  // One policy, so a setting it cannot take is a usage error naming its flag.
  if (std::string why = config_problem<P>(settings, rate_flag(settings.r)); !why.empty()) {
    throw usage_error(why);
  }
  const typename P::config cfg = make_config<P>(settings);
  const store_time_limit limit = time_limit_of(o.store);
  return with_store<P>(o.store, [&](auto& store) -> int {
    std::string buffer;
    buffer.reserve(std::size_t{1} << 16);
    if (o.input == "-") {
      // A pipe cannot be read twice: buffer the output unless bad lines are
      // skipped (then nothing can fail half way for a bad line).
      trace_reader reader(std_in, o.skip_bad_lines);
      reader.limit_timestamps(limit.max_us, limit.why);
      buffer.append(decisions_header);
      replay_decisions<P>(reader, cfg, store, buffer, o.skip_bad_lines ? &out : nullptr);
      out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      if (o.skip_bad_lines && reader.skipped() > 0) {
        err << "ratelimit-replay: skipped " << reader.skipped()
            << " bad line(s); first: " << reader.first_skipped() << '\n';
      }
      return 0;
    }
    std::error_code ec;
    const bool regular = std::filesystem::is_regular_file(o.input, ec);
    if (!o.skip_bad_lines && regular) {
      // First pass: validate every line, so a bad file writes nothing.
      std::ifstream check(o.input, std::ios::binary);
      if (!check) throw usage_error("cannot open \"" + o.input + "\"");
      validate_trace(check, limit.max_us, limit.why);
    }
    std::ifstream in(o.input, std::ios::binary);
    if (!in) throw usage_error("cannot open \"" + o.input + "\"");
    const bool stream = regular || o.skip_bad_lines;
    trace_reader reader(in, o.skip_bad_lines);
    reader.limit_timestamps(limit.max_us, limit.why);
    buffer.append(decisions_header);
    replay_decisions<P>(reader, cfg, store, buffer, stream ? &out : nullptr);
    out.write(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (reader.skipped() > 0) {
      err << "ratelimit-replay: skipped " << reader.skipped()
          << " bad line(s); first: " << reader.first_skipped() << '\n';
    }
    return 0;
  });
}

inline int run_analysis(const cli_options& o, std::istream& std_in, std::ostream& out,
                        std::ostream& err) {
  analysis_options a;
  a.settings = limiter_settings{*o.r, o.burst, o.count_rejected};
  a.skip_bad_lines = o.skip_bad_lines;
  if (o.sweep) {
    a.sweep_limits = *o.sweep;
    a.sweep_policies.assign(std::begin(all_policies), std::end(all_policies));
  } else if (o.policy) {
    // Without a sweep, --policy P prints P's row only, so only P runs.
    a.summary_policies = {*o.policy};
  }
  analysis_result r;
  std::string name = o.input == "-" ? "standard input" : o.input;
  if (o.input == "-") {
    r = analyse(std_in, a);
  } else {
    std::ifstream in(o.input, std::ios::binary);
    if (!in) throw usage_error("cannot open \"" + o.input + "\"");
    r = analyse(in, a);
  }
  print_summary(out, r, a.settings, name);
  if (o.sweep) print_sweep(out, r, a.settings, o.policy.value_or(policy_id::sliding_log));
  if (r.skipped > 0) {
    err << "ratelimit-replay: skipped " << r.skipped << " bad line(s); first: " << r.first_skipped
        << '\n';
  }
  if (!o.plot.empty()) {
    std::ofstream f(o.plot, std::ios::binary);
    if (f) write_sweep_plot(f, r, a.settings);
    if (!f) {
      err << "ratelimit-replay: error: cannot write " << o.plot << '\n';
      return 1;
    }
    out << "\nWrote the sweep chart to " << o.plot << '\n';
  }
  return 0;
}

}  // namespace detail

/// Runs the tool: returns the exit status (0 ok, 2 usage or input error,
/// 1 other failure). Messages go to `err`, results to `out`.
inline int run_replay(const std::vector<std::string>& args, std::istream& std_in, std::ostream& out,
                      std::ostream& err) {
  cli_options o;
  try {
    o = parse_cli(args);
  } catch (const std::invalid_argument& e) {
    err << "ratelimit-replay: usage error: " << e.what() << "\n"
        << "Try 'ratelimit-replay --help'.\n";
    return 2;
  }
  if (o.help) {
    out << usage_text;
    return 0;
  }
  const std::string name = o.input == "-" ? "<stdin>" : o.input;
  try {
    if (o.decisions) {
      return with_policy(*o.policy,
                         [&]<class P>() { return detail::run_decisions<P>(o, std_in, out, err); });
    }
    return detail::run_analysis(o, std_in, out, err);
  } catch (const input_error& e) {
    err << "ratelimit-replay: error: " << name << ": " << e.what() << '\n';
    return 2;
  } catch (const std::invalid_argument& e) {
    err << "ratelimit-replay: error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    err << "ratelimit-replay: failure: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace ratelimit::replay
