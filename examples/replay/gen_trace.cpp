// SPDX-License-Identifier: Apache-2.0
// ratelimit-gen-trace: writes a seeded synthetic telephony log for ratelimit-replay.
#include "gen_trace.hpp"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/rate.hpp"

namespace {

constexpr std::string_view usage =
    R"(ratelimit-gen-trace: write a synthetic telephony log (CSV) for ratelimit-replay.

Usage: ratelimit-gen-trace [options] [--out FILE]

  --seed N             random seed (default 1); same options + seed = same file
  --days N             days of traffic from 2026-11-30 (default 1)
  --subscribers N      normal subscribers, label 0 (default 3000)
  --calls-per-day X    mean calls per subscriber per day (default 6)
  --call-centres N     legitimate heavy callers, label 0 (default 8)
  --robocallers N      abusive callers, label 1, bursty or slow-and-steady (default 12)
  --edge-bursters N    abusive callers, label 1, bursting across window edges (default 4)
  --window DURATION    window whose edges they straddle, e.g. 15min (default 15min)
  --edge-burst N       calls on each side of an edge (default 10)
  --time-format F      us (default), seconds or iso
  --out FILE           output file (default: standard output)
  -h, --help           this text

Dense mode, for speed measurements (only --seed, --time-format and --out apply):
  --dense N            N calls (up to 10^9) from keys drawn uniformly, streamed
  --keys N             number of keys (default 100000)
  --max-step DURATION  each call 0 to DURATION after the one before (default 2ms)
  With the defaults and --dense 1000000, every key calls about ten times in
  17 minutes and is live in every 15-minute window.

The log is sorted in memory before it is written (about 32 bytes per call):
options whose log would need more than half of the machine's memory (or of
the address-space limit) are refused with an estimate (exit status 2).
)";

[[noreturn]] void fail(const std::string& msg) {
  std::cerr << "ratelimit-gen-trace: usage error: " << msg
            << "\nTry 'ratelimit-gen-trace --help'.\n";
  std::exit(2);
}

std::int64_t whole(const std::string& flag, const std::string& v, std::int64_t max) {
  std::size_t i = 0;
  std::int64_t out = 0;
  if (!ratelimit::detail::parse_digits(v, i, max, out) || i != v.size()) {
    fail(flag + " \"" + v + "\" must be a whole number up to " + std::to_string(max));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using ratelimit::replay::gen_options;
  gen_options o;
  ratelimit::replay::dense_options dense;
  bool dense_mode = false;
  std::string scenario_flag;  // the first option that only the telephony scenario takes
  std::string dense_flag;     // the first of --keys and --max-step
  std::string out_path;
  const std::vector<std::string> args(argv + 1, argv + argc);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::cout << usage;
      return 0;
    }
    if (i + 1 >= args.size())
      fail(a.starts_with("-") ? a + " needs a value" : "unexpected \"" + a + "\"");
    const std::string& v = args[++i];
    const bool shared = a == "--seed" || a == "--time-format" || a == "--out";
    const bool dense_only = a == "--dense" || a == "--keys" || a == "--max-step";
    if (!shared && !dense_only && scenario_flag.empty()) scenario_flag = a;
    if (a == "--dense") {
      dense.events = static_cast<std::uint64_t>(whole(a, v, 1'000'000'000));
      dense_mode = true;
    } else if (a == "--keys") {
      dense.keys = static_cast<std::uint64_t>(whole(a, v, 100'000'000));
      if (dense.keys < 1) fail("--keys \"" + v + "\" must be at least 1");
      if (dense_flag.empty()) dense_flag = a;
    } else if (a == "--max-step") {
      if (v == "0") {
        dense.max_step_us = 0;
      } else {
        try {
          dense.max_step_us = ratelimit::rate::parse("1/" + v).period().count();
        } catch (const std::invalid_argument&) {
          fail("--max-step \"" + v + "\": expected a duration such as 2ms, or 0");
        }
      }
      if (dense.max_step_us > 10'000'000) fail("--max-step \"" + v + "\" must be at most 10s");
      if (dense_flag.empty()) dense_flag = a;
    } else if (a == "--seed") {
      o.seed = static_cast<std::uint64_t>(whole(a, v, INT64_MAX));
    } else if (a == "--days") {
      o.days = static_cast<int>(whole(a, v, 3650));
    } else if (a == "--subscribers") {
      o.subscribers = static_cast<std::size_t>(whole(a, v, 100'000'000));
    } else if (a == "--calls-per-day") {
      char* end = nullptr;
      o.calls_per_day = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.calls_per_day >= 0) || o.calls_per_day > 1e6) {
        fail("--calls-per-day \"" + v + "\" must be a number from 0 to 1e6");
      }
    } else if (a == "--call-centres") {
      o.call_centres = static_cast<std::size_t>(whole(a, v, 1'000'000));
    } else if (a == "--robocallers") {
      o.robocallers = static_cast<std::size_t>(whole(a, v, 1'000'000));
    } else if (a == "--edge-bursters") {
      o.edge_bursters = static_cast<std::size_t>(whole(a, v, 1'000'000));
    } else if (a == "--window") {
      try {
        o.window_us = ratelimit::rate::parse("1/" + v).period().count();
      } catch (const std::invalid_argument& e) {
        fail("--window \"" + v + "\": expected a duration such as 15min");
      }
      // Edges are drawn strictly inside a day, so a day needs two windows at least.
      if (o.window_us >= 86'400'000'000 || 86'400'000'000 % o.window_us != 0) {
        fail("--window \"" + v + "\" must divide one day into two or more windows");
      }
    } else if (a == "--edge-burst") {
      o.edge_burst = static_cast<int>(whole(a, v, 100'000));
    } else if (a == "--time-format") {
      if (v == "us") {
        o.format = gen_options::time_format::us;
      } else if (v == "seconds") {
        o.format = gen_options::time_format::seconds;
      } else if (v == "iso") {
        o.format = gen_options::time_format::iso;
      } else {
        fail("--time-format \"" + v + "\" must be us, seconds or iso");
      }
    } else if (a == "--out") {
      out_path = v;
    } else {
      fail("unknown option \"" + a + "\"");
    }
  }
  if (dense_mode && !scenario_flag.empty()) fail(scenario_flag + " does not apply to --dense");
  if (!dense_mode && !dense_flag.empty()) fail(dense_flag + " applies to --dense only");
  if (dense_mode) {
    dense.seed = o.seed;
    dense.format = o.format;
    std::ofstream file;
    if (!out_path.empty() && out_path != "-") {
      file.open(out_path, std::ios::binary);
      if (!file) {
        std::cerr << "ratelimit-gen-trace: failure: cannot write " << out_path << '\n';
        return 1;
      }
    }
    std::ostream& out = file.is_open() ? static_cast<std::ostream&>(file) : std::cout;
    ratelimit::replay::write_dense_trace_csv(out, dense);
    out.flush();
    if (!out) {
      std::cerr << "ratelimit-gen-trace: failure: cannot write "
                << (file.is_open() ? out_path : "standard output") << '\n';
      return 1;
    }
    return 0;
  }
  ratelimit::replay::gen_trace trace;
  try {
    ratelimit::replay::check_trace_budget(o, ratelimit::replay::default_memory_budget());
    trace = ratelimit::replay::generate_trace(o);
  } catch (const ratelimit::replay::memory_budget_error& e) {
    std::cerr << "ratelimit-gen-trace: error: " << e.what() << '\n';
    return 2;
  }
  if (out_path.empty() || out_path == "-") {
    ratelimit::replay::write_trace_csv(std::cout, trace, o);
    std::cout.flush();
    return std::cout ? 0 : 1;
  }
  std::ofstream f(out_path, std::ios::binary);
  ratelimit::replay::write_trace_csv(f, trace, o);
  f.close();
  if (!f) {
    std::cerr << "ratelimit-gen-trace: failure: cannot write " << out_path << '\n';
    return 1;
  }
  std::vector<bool> seen(trace.keys.size());
  std::size_t callers = 0;
  for (const auto& e : trace.events) {
    if (!seen[e.key]) ++callers;
    seen[e.key] = true;
  }
  std::cerr << "ratelimit-gen-trace: wrote " << trace.events.size() << " calls from " << callers
            << " callers to " << out_path << '\n';
  return 0;
}
