// SPDX-License-Identifier: Apache-2.0
// A seeded, deterministic generator of synthetic telephony logs in the replay format.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "budget.hpp"
#include "csv.hpp"
#include "timestamp.hpp"

namespace ratelimit::replay {

/// What to generate. Defaults make the checked-in sample (about 30,000 calls).
struct gen_options {
  std::uint64_t seed = 1;
  /// First day, microseconds since the Unix epoch (a midnight UTC); default 2026-11-30.
  std::int64_t start_us = detail::days_from_civil(2026, 11, 30) * 86'400'000'000;
  int days = 1;
  std::size_t subscribers = 3000;  ///< normal callers (label 0)
  double calls_per_day = 6;        ///< mean calls per normal subscriber per day
  std::size_t call_centres = 8;    ///< legitimate heavy callers (label 0)
  std::size_t robocallers = 12;    ///< abusive callers (label 1): bursts, some slow and steady
  std::size_t edge_bursters = 4;   ///< abusive callers (label 1) bursting across window edges
  std::int64_t window_us = 15 * 60'000'000;  ///< the window whose edges edge bursters straddle
  int edge_burst = 10;                       ///< calls on each side of a window edge
  enum class time_format { us, seconds, iso } format = time_format::us;
  /// Most calls `generate_trace` holds before it stops with memory_budget_error:
  /// the hard bound behind `check_trace_budget`'s estimate.
  std::size_t max_calls = static_cast<std::size_t>(-1);
};

/// One generated call.
struct gen_event {
  std::int64_t ts_us;
  std::uint32_t key;
  signed char label;
  friend bool operator<(const gen_event& a, const gen_event& b) {
    return a.ts_us != b.ts_us ? a.ts_us < b.ts_us : a.key < b.key;
  }
};

/// A generated log: key names and events sorted by time.
struct gen_trace {
  std::vector<std::string> keys;
  std::vector<gen_event> events;
};

namespace detail {

/// splitmix64: small, fast, and the same on every platform (unlike the
/// standard distributions, whose output is implementation-defined).
class rng {
 public:
  explicit rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi) noexcept {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  /// Exponential with the given mean.
  double exponential(double mean) noexcept { return -std::log(1.0 - uniform()) * mean; }

 private:
  std::uint64_t s_;
};

inline constexpr std::int64_t us_per_s = 1'000'000;
inline constexpr std::int64_t us_per_h = 3600 * us_per_s;

/// Relative call volume per hour of day (UTC): quiet nights, a morning and a late-afternoon peak.
inline constexpr double hour_weight[24] = {0.2, 0.1, 0.1, 0.1, 0.1, 0.2, 0.5, 1.2,
                                           2.0, 2.6, 2.8, 2.7, 2.2, 2.3, 2.5, 2.6,
                                           2.7, 2.9, 2.6, 2.1, 1.6, 1.1, 0.7, 0.4};

[[nodiscard]] inline std::int64_t daily_time(rng& r) {
  double total = 0;
  for (const double w : hour_weight) total += w;
  double u = r.uniform() * total;
  int h = 0;
  while (h < 23 && u >= hour_weight[h]) u -= hour_weight[h++];
  return h * us_per_h + static_cast<std::int64_t>(r.uniform() * static_cast<double>(us_per_h));
}

}  // namespace detail

/// Bytes `generate_trace` holds per call (a 16-byte event, in a vector that
/// may be twice its size while growing) and per caller (its name in the key
/// vector and in the set that keeps names unique, allocator overhead included).
inline constexpr double gen_bytes_per_call = 32;
inline constexpr double gen_bytes_per_caller = 160;

/// What a log made with `o` holds in memory, estimated from above.
struct gen_estimate {
  double calls = 0;
  double callers = 0;
  double bytes = 0;
  std::string cause;  ///< the options behind the largest share, for messages
};

/// Estimates the calls and bytes of `generate_trace(o)` without generating:
/// normal subscribers make `calls_per_day` calls a day on average (5% more
/// for the chatty ones) plus redial runs (12% of calls, 3 redials on
/// average), taken here as 1.5 x; call centres at most 1,300 calls a day
/// (a gap of at least 28 s over 10 h), robocallers at most 1,500 (6 campaigns
/// of 250), edge bursters at most 20 x edge_burst.
[[nodiscard]] inline gen_estimate estimate_trace(const gen_options& o) {
  const auto d = static_cast<double>(o.days);
  const auto n = [](std::size_t v) { return static_cast<double>(v); };
  const auto num = [](double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  };
  struct part {
    double calls;
    double callers;
    std::string cause;
  };
  const part parts[] = {
      {n(o.subscribers) * d * o.calls_per_day * 1.5, n(o.subscribers),
       "--subscribers " + std::to_string(o.subscribers) + " with --calls-per-day " +
           num(o.calls_per_day) + " over --days " + std::to_string(o.days)},
      {n(o.call_centres) * d * 1300, n(o.call_centres),
       "--call-centres " + std::to_string(o.call_centres) + " over --days " +
           std::to_string(o.days)},
      {n(o.robocallers) * d * 1500, n(o.robocallers),
       "--robocallers " + std::to_string(o.robocallers) + " over --days " + std::to_string(o.days)},
      {n(o.edge_bursters) * d * 20 * o.edge_burst, n(o.edge_bursters),
       "--edge-bursters " + std::to_string(o.edge_bursters) + " with --edge-burst " +
           std::to_string(o.edge_burst) + " over --days " + std::to_string(o.days)},
  };
  gen_estimate e;
  double largest = -1;
  for (const part& p : parts) {
    const double bytes = p.calls * gen_bytes_per_call + p.callers * gen_bytes_per_caller;
    e.calls += p.calls;
    e.callers += p.callers;
    e.bytes += bytes;
    if (bytes > largest) {
      largest = bytes;
      e.cause = p.cause;
    }
  }
  return e;
}

/// Refuses options whose log would not fit in `budget` bytes, naming the
/// options behind most of it and the estimate, and sets `o.max_calls` so that
/// generation stops cleanly even where the estimate is low.
/// @throws memory_budget_error
inline void check_trace_budget(gen_options& o, std::size_t budget) {
  const gen_estimate e = estimate_trace(o);
  const auto b = static_cast<double>(budget);
  const auto num = [](double v) {
    std::ostringstream s;
    if (v < 1e12) {
      s << std::fixed << std::setprecision(0) << v;
    } else {
      s << std::setprecision(3) << v;
    }
    return s.str();
  };
  if (e.bytes > b) {
    throw memory_budget_error(e.cause + " would make about " + num(e.calls) + " calls from " +
                              num(e.callers) + " callers, about " + format_bytes(e.bytes) +
                              " in memory (the log is sorted in memory before it is written), "
                              "over the budget of " +
                              format_bytes(b) +
                              " (half of this machine's memory, or of the address-space "
                              "limit); ask for fewer");
  }
  const double callers_bytes = e.callers * gen_bytes_per_caller;
  o.max_calls = static_cast<std::size_t>((b - callers_bytes) / gen_bytes_per_call);
}

/// Generates a log. Deterministic for given options on every platform.
/// @throws memory_budget_error past `o.max_calls` calls
[[nodiscard]] inline gen_trace generate_trace(const gen_options& o) {
  using namespace detail;
  rng r(o.seed);
  gen_trace t;
  std::set<std::string> used;
  const auto new_key = [&](const std::string& prefix, int digits) {
    for (;;) {
      std::string k = prefix;
      for (int i = 0; i < digits; ++i) k += static_cast<char>('0' + r.between(0, 9));
      if (used.insert(k).second) {
        t.keys.push_back(k);
        return static_cast<std::uint32_t>(t.keys.size() - 1);
      }
    }
  };
  const std::int64_t day_us = 24 * us_per_h;
  const std::int64_t end = o.start_us + o.days * day_us;
  const auto add = [&](std::int64_t ts, std::uint32_t k, signed char label) {
    if (ts < o.start_us || ts >= end) return;
    if (t.events.size() >= o.max_calls) {
      throw memory_budget_error("the log passed " + std::to_string(o.max_calls) +
                                " calls, the most that fit the memory budget; ask for fewer");
    }
    t.events.push_back({ts, k, label});
  };
  const char* mobile[] = {"+49151", "+49160", "+49170", "+49176"};

  // Normal subscribers: a personal level of activity, calls spread over the
  // day, and now and then a redial run when the other side is busy.
  for (std::size_t i = 0; i < o.subscribers; ++i) {
    const std::uint32_t k = new_key(mobile[r.between(0, 3)], 8);
    const bool chatty = r.uniform() < 0.01;  // small businesses run from a mobile
    const double level = chatty ? o.calls_per_day * 6 : r.exponential(o.calls_per_day);
    for (int d = 0; d < o.days; ++d) {
      double clock = r.exponential(1.0);
      while (clock < level) {
        std::int64_t ts = o.start_us + d * day_us + daily_time(r);
        add(ts, k, 0);
        if (r.uniform() < 0.12) {
          const auto redials = r.between(1, 5);
          for (std::int64_t j = 0; j < redials; ++j) {
            ts += static_cast<std::int64_t>((15 + r.exponential(60)) * us_per_s);
            add(ts, k, 0);
          }
        }
        clock += r.exponential(1.0);
      }
    }
  }
  // Call centres: legitimate, steady, heavy during business hours.
  for (std::size_t i = 0; i < o.call_centres; ++i) {
    const std::uint32_t k = new_key("+49800", 7);
    const double mean_gap_s = 25 + r.uniform() * 95;
    for (int d = 0; d < o.days; ++d) {
      std::int64_t ts = o.start_us + d * day_us + 8 * us_per_h + r.between(0, 30 * 60) * us_per_s;
      const std::int64_t close = o.start_us + d * day_us + 18 * us_per_h;
      while (ts < close) {
        add(ts, k, 0);
        ts += static_cast<std::int64_t>((3 + r.exponential(mean_gap_s)) * us_per_s);
      }
    }
  }
  // Robocallers: campaigns of rapid calls; a third of them slow and steady instead.
  for (std::size_t i = 0; i < o.robocallers; ++i) {
    const std::uint32_t k = new_key(r.uniform() < 0.5 ? "+1202" : "+44203", 7);
    const bool slow = i % 3 == 2;
    for (int d = 0; d < o.days; ++d) {
      if (slow) {
        std::int64_t ts = o.start_us + d * day_us + 9 * us_per_h + r.between(0, 3600) * us_per_s;
        const std::int64_t stop = ts + r.between(6, 10) * us_per_h;
        const double gap = 60 + r.uniform() * 40;
        while (ts < stop) {
          add(ts, k, 1);
          ts += static_cast<std::int64_t>((5 + r.exponential(gap)) * us_per_s);
        }
        continue;
      }
      const auto campaigns = r.between(2, 6);
      for (std::int64_t c = 0; c < campaigns; ++c) {
        std::int64_t ts = o.start_us + d * day_us + r.between(7, 20) * us_per_h +
                          r.between(0, 3599) * us_per_s;
        const auto calls = r.between(30, 250);
        const double gap = 2 + r.uniform() * 10;
        for (std::int64_t j = 0; j < calls; ++j) {
          add(ts, k, 1);
          ts += static_cast<std::int64_t>((0.5 + r.exponential(gap)) * us_per_s);
        }
      }
    }
  }
  // Edge bursters: `edge_burst` calls just before a window edge and as many
  // just after: a fixed window admits both halves.
  for (std::size_t i = 0; i < o.edge_bursters; ++i) {
    const std::uint32_t k = new_key("+3375", 7);
    for (int d = 0; d < o.days; ++d) {
      const auto bursts = r.between(4, 10);
      for (std::int64_t b = 0; b < bursts; ++b) {
        const std::int64_t day0 = o.start_us + d * day_us;
        const std::int64_t windows = day_us / o.window_us;
        const std::int64_t edge = day0 + r.between(1, windows - 1) * o.window_us;
        for (int j = 0; j < o.edge_burst; ++j) {
          add(edge - 1 - r.between(0, 8 * us_per_s), k, 1);
          add(edge + r.between(0, 8 * us_per_s), k, 1);
        }
      }
    }
  }
  std::sort(t.events.begin(), t.events.end());
  return t;
}

namespace detail {

/// Appends `us` in the generator's time format.
inline void append_gen_time(std::string& buf, std::int64_t us, gen_options::time_format f) {
  switch (f) {
    case gen_options::time_format::us: buf += std::to_string(us); break;
    case gen_options::time_format::seconds: {
      std::string frac = std::to_string(1'000'000 + us % 1'000'000).substr(1);
      buf += std::to_string(us / 1'000'000) + "." + frac;
      break;
    }
    case gen_options::time_format::iso: buf += format_iso(us); break;
  }
}

}  // namespace detail

/// A dense log for speed measurements: every call from a key drawn uniformly
/// among `keys`, each call 0 to `max_step_us` after the one before (uniform),
/// so with the defaults (1,000,000 calls, 100,000 keys, up to 2 ms apart:
/// about 17 minutes) every key calls about ten times and is live in every
/// 15-minute window.
struct dense_options {
  std::uint64_t seed = 1;
  std::int64_t start_us = gen_options{}.start_us;
  std::uint64_t events = 1'000'000;  ///< at most 10^9
  std::uint64_t keys = 100'000;      ///< 1 .. 10^8
  std::int64_t max_step_us = 2'000;  ///< 0 .. 10 s
  gen_options::time_format format = gen_options::time_format::us;
};

/// Writes a dense log as replay CSV (a comment, a header, then
/// `timestamp,key,1,0` rows, every key labelled normal), streaming: memory
/// stays constant. Keys are `+4917` and eight digits. Deterministic for a
/// given seed and options on every platform.
/// @throws std::invalid_argument for options out of the ranges above
inline void write_dense_trace_csv(std::ostream& out, const dense_options& o) {
  if (o.events > 1'000'000'000 || o.keys < 1 || o.keys > 100'000'000 || o.max_step_us < 0 ||
      o.max_step_us > 10'000'000) {
    throw std::invalid_argument(
        "dense log: at most 10^9 calls, 1 to 10^8 keys, steps of 0 to 10 s");
  }
  detail::rng r(o.seed);
  std::string buf = "# dense synthetic log from ratelimit-gen-trace --dense " +
                    std::to_string(o.events) + " --keys " + std::to_string(o.keys) +
                    " --max-step " + std::to_string(o.max_step_us) + "us --seed " +
                    std::to_string(o.seed) + "\ntimestamp,caller,cost,label\n";
  std::int64_t t = o.start_us;
  char key[] = "+491700000000";
  for (std::uint64_t i = 0; i < o.events; ++i) {
    t += r.between(0, o.max_step_us);
    auto k = static_cast<std::uint64_t>(r.between(0, static_cast<std::int64_t>(o.keys) - 1));
    for (int d = 12; d >= 5; --d, k /= 10) key[d] = static_cast<char>('0' + k % 10);
    detail::append_gen_time(buf, t, o.format);
    buf += ',';
    buf.append(key, 13);
    buf += ",1,0\n";
    if (buf.size() > (1u << 16)) {
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  }
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

/// Writes a generated log as replay CSV: a comment, a header, then
/// `timestamp,key,cost,label` rows.
inline void write_trace_csv(std::ostream& out, const gen_trace& t, const gen_options& o,
                            bool header = true) {
  std::string buf;
  if (header) {
    buf += "# synthetic telephony log from ratelimit-gen-trace --seed " + std::to_string(o.seed) +
           " (label 1 = abusive caller)\n";
    buf += "timestamp,caller,cost,label\n";
  }
  for (const gen_event& e : t.events) {
    detail::append_gen_time(buf, e.ts_us, o.format);
    buf += ',';
    append_csv_field(buf, t.keys[e.key]);
    buf += e.label == 1 ? ",1,1\n" : ",1,0\n";
    if (buf.size() > (1u << 16)) {
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
      buf.clear();
    }
  }
  out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
}

}  // namespace ratelimit::replay
