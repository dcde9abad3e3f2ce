// SPDX-License-Identifier: Apache-2.0
// ratelimit-compare: the five policies at one rate, measured in process, on Redis and on a trace, as one table.
#pragma once

#if __has_include(<malloc.h>)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <istream>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bars.hpp"
#include "cli.hpp"
#include "ratelimit/limiter.hpp"

#ifdef RATELIMIT_COMPARE_HAVE_REDIS
#include "redis_part.hpp"
#include "redis_server.hpp"
#endif

namespace ratelimit::compare {

using replay::all_policies;
using replay::policy_id;
using replay::policy_name;
using replay::usage_error;

/// Built with the Redis store (RATELIMIT_REDIS=ON)?
#ifdef RATELIMIT_COMPARE_HAVE_REDIS
inline constexpr bool have_redis = true;
#else
inline constexpr bool have_redis = false;
#endif

inline constexpr std::string_view usage_text =
    R"(ratelimit-compare: the five rate-limiting policies at one rate, side by side.

Usage:
  ratelimit-compare [--rate RATE] [--redis URL | --redis auto | --no-redis]
                    [--keys N] [--rounds N] [--quick] [--out FILE.md]
                    [--csv FILE.csv] [--svg FILE.svg] [--skip-bad-lines] [INPUT]

For fixed_window, sliding_log, sliding_counter, token_bucket and gcra at RATE:
  in process  cost of one check (median over rounds, and as a ratio to a bare
              std::unordered_map find-and-increment timed in the same round),
              two threads on distinct keys / one thread, heap bytes per key
  Redis       checks/s one at a time and in batches of 100 (one connection,
              the server's TIME), MEMORY USAGE of a key after one check
  accuracy    INPUT replayed exactly as ratelimit-replay does: calls admitted,
              most calls one key got through in any window, keys blocked, and
              with labels the abusive keys caught and normal keys blocked
The table goes to standard output (markdown), progress to standard error.

INPUT         CSV call log, ratelimit-replay's format (timestamp,key[,cost[,label]]),
              or - for standard input; default: the bundled sample
              examples/data/sample_calls.csv
Options:
  --rate RATE       e.g. 10/15min (default), "100 per minute", 1000/day
  --redis URL       measure on redis://[USER:PASSWORD@]HOST:PORT[/DB]; the
                    run's keys are deleted at the end
  --redis auto      start a throwaway redis-server (no persistence) on a free
                    127.0.0.1 port and stop it at the end (the default when
                    built with Redis support); it is $RATELIMIT_REDIS_SERVER,
                    else redis-server on PATH. Without one, the default run
                    leaves the Redis columns out and says so, and an explicit
                    --redis auto is an error
  --no-redis        skip the Redis columns
  --keys N          keys in the in-process measurement (default 100000)
  --rounds N        timing rounds (default 11)
  --quick           3 rounds on 2000 keys, a few hundred Redis checks: runs in
                    seconds (tests); its timings are too short to choose by
  --out FILE        write the markdown table to FILE instead of standard output
  --csv FILE        also write the figures as CSV (one row per policy)
  --svg FILE        also write a bar chart of the figures
  --skip-bad-lines  skip bad lines of INPUT instead of failing
  -h, --help        this text

Exit status: 0 success, 2 usage or input error (the message names the value
or line; --redis auto without a redis-server), 1 other failure (Redis
unreachable, cannot write a file).
)";

/// Parsed command line.
struct options {
  rate r{10, std::chrono::minutes{15}};
  std::string input;  ///< "" = the bundled sample, "-" = standard input
  std::string redis;  ///< "" = none, "auto", or a redis:// URL
  bool redis_set = false;
  bool no_redis = false;
  std::size_t keys = 100'000;
  int rounds = 11;
  bool keys_set = false;
  bool rounds_set = false;
  bool quick = false;
  std::string out;
  std::string csv;
  std::string svg;
  bool skip_bad_lines = false;
  bool help = false;
};

/// Most keys of the in-process measurement (12-byte phone numbers).
inline constexpr std::size_t max_keys = 1'000'000;
/// Most timing rounds.
inline constexpr int max_rounds = 1'000;

namespace detail {

/// `url` with everything between "://" and the last '@' (the user and
/// password) replaced by "***", for messages.
[[nodiscard]] inline std::string shown_url(std::string_view url) {
  const auto scheme = url.find("://");
  const auto at = url.rfind('@');
  if (scheme == std::string_view::npos || at == std::string_view::npos || at < scheme + 3) {
    return std::string(url);
  }
  return std::string(url.substr(0, scheme + 3)) + "***" + std::string(url.substr(at));
}

[[nodiscard]] inline std::int64_t parse_count(const std::string& flag, const std::string& v,
                                              std::int64_t lo, std::int64_t hi) {
  std::size_t pos = 0;
  std::int64_t n = 0;
  if (!ratelimit::detail::parse_digits(v, pos, hi, n) || pos != v.size() || n < lo) {
    throw usage_error(flag + " \"" + v + "\" must be a whole number from " + std::to_string(lo) +
                      " to " + std::to_string(hi));
  }
  return n;
}

}  // namespace detail

/// Parses arguments strictly: unknown flags, missing or bad values and
/// repeated inputs are usage errors naming the argument.
/// @throws usage_error
[[nodiscard]] inline options parse_cli(const std::vector<std::string>& args) {
  options o;
  bool have_input = false;
  bool only_positional = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (only_positional || arg == "-" || !arg.starts_with("-")) {
      if (have_input) {
        throw usage_error("more than one INPUT: \"" + o.input + "\" and \"" + arg + "\"");
      }
      if (arg.empty()) throw usage_error("empty INPUT file name");
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
    const auto file = [&]() {
      std::string v = value();
      if (v.empty()) throw usage_error(arg + " needs a file name");
      return v;
    };
    if (arg == "-h" || arg == "--help") {
      flag();
      o.help = true;
    } else if (arg == "--rate") {
      const std::string v = value();
      try {
        o.r = rate::parse(v);
      } catch (const std::invalid_argument& e) {
        throw usage_error(std::string("--rate: ") + e.what());
      }
    } else if (arg == "--redis") {
      const std::string v = value();
      if (v != "auto" && !v.starts_with("redis://")) {
        throw usage_error("--redis \"" + detail::shown_url(v) +
                          "\": use auto or redis://[USER:PASSWORD@]HOST:PORT[/DB]");
      }
#ifdef RATELIMIT_COMPARE_HAVE_REDIS
      if (v != "auto") {
        try {
          (void)redis::parse_url(v);
        } catch (const std::invalid_argument& e) {
          throw usage_error(std::string("--redis: ") + e.what());
        }
      }
#endif
      o.redis = v;
      o.redis_set = true;
    } else if (arg == "--no-redis") {
      flag();
      o.no_redis = true;
    } else if (arg == "--keys") {
      o.keys = static_cast<std::size_t>(
          detail::parse_count("--keys", value(), 2, static_cast<std::int64_t>(max_keys)));
      o.keys_set = true;
    } else if (arg == "--rounds") {
      o.rounds = static_cast<int>(detail::parse_count("--rounds", value(), 1, max_rounds));
      o.rounds_set = true;
    } else if (arg == "--quick") {
      flag();
      o.quick = true;
    } else if (arg == "--out") {
      o.out = file();
    } else if (arg == "--csv") {
      o.csv = file();
    } else if (arg == "--svg") {
      o.svg = file();
    } else if (arg == "--skip-bad-lines") {
      flag();
      o.skip_bad_lines = true;
    } else {
      throw usage_error("unknown option \"" + args[i] + "\" (see --help)");
    }
  }
  if (o.help) return o;
  if (o.redis_set && o.no_redis) throw usage_error("--redis and --no-redis exclude each other");
  if (o.redis_set && !have_redis) {
    throw usage_error("--redis " + detail::shown_url(o.redis) +
                      ": this ratelimit-compare was built without Redis support (configure with "
                      "-DRATELIMIT_REDIS=ON), use --no-redis");
  }
  if (o.quick) {
    if (!o.keys_set) o.keys = 2'000;
    if (!o.rounds_set) o.rounds = 3;
  }
  if (!o.redis_set && !o.no_redis && have_redis) o.redis = "auto";
  if (o.no_redis) o.redis.clear();
  return o;
}

// ---------------------------------------------------------------------------
// Measurements

/// One policy's in-process figures (unset = not measured).
struct process_figures {
  std::optional<double> ns;       ///< median ns per check
  std::optional<double> x_floor;  ///< median of (check / floor) per round
  std::optional<double> scaling;  ///< two threads on distinct halves / one thread, median
  std::optional<double> bytes;    ///< heap bytes per key beyond the key's bytes, after one check
};

#ifndef RATELIMIT_COMPARE_HAVE_REDIS
/// One policy's Redis figures (this build has no Redis support: never set).
struct redis_figures {
  std::optional<double> sequential;
  std::optional<double> batched;
  std::optional<double> memory_usage;
  std::optional<double> used_memory;
};
#endif

/// One row of the table.
struct policy_row {
  policy_id id = policy_id::fixed_window;
  /// Why the policy cannot take the rate (as ratelimit-replay says it); empty when it can.
  std::string unavailable;
  process_figures process;
  redis_figures redis;
  std::uint64_t admitted = 0;
  std::uint64_t rejected = 0;
  std::uint32_t max_in_window = 0;
  std::size_t keys_blocked = 0;
  std::size_t abusive_caught = 0;
  std::size_t normal_blocked = 0;
};

/// Everything the outputs print.
struct report {
  rate r{10, std::chrono::minutes{15}};
  std::string input_name;
  std::uint64_t events = 0;
  std::size_t keys = 0;
  bool labelled = false;
  std::size_t abusive_keys = 0;
  std::size_t normal_keys = 0;
  std::size_t process_keys = 0;
  int rounds = 0;
  std::int64_t step_us = 0;  ///< time between two checks of one key in the in-process timing
  bool quick = false;        ///< --quick: the timings are too short to mean much
  double floor_ns = 0;
  std::optional<double> floor_scaling;  ///< the floor's own 2 threads / 1, timed in the same rounds
  std::optional<double> floor_bytes;
  std::string redis_where;  ///< "" = Redis not measured
  std::vector<policy_row> rows;
};

namespace detail {

using clk = std::chrono::steady_clock;

/// One pass of checks over `order` at time `now`; returns a checksum.
using pass_fn = std::function<std::uint64_t(const std::vector<const std::string*>&, std::int64_t)>;

/// A limiter of policy P holding every key (one check each at `t0`), as a pass.
template <class P>
[[nodiscard]] pass_fn make_pass(const typename P::config& cfg, const std::vector<std::string>& keys,
                                std::int64_t t0) {
  auto lim = std::make_shared<limiter<P>>(cfg);
  for (const auto& k : keys) (void)lim->try_acquire(k, timestamp{t0});
  return [lim](const std::vector<const std::string*>& order, std::int64_t now) {
    std::uint64_t sum = 0;
    for (const std::string* k : order) {
      sum += static_cast<std::uint64_t>(lim->try_acquire(*k, timestamp{now}).remaining);
    }
    return sum;
  };
}

[[nodiscard]] inline double seconds_of(const std::function<void()>& f) {
  const auto start = clk::now();
  f();
  return std::chrono::duration<double>(clk::now() - start).count();
}

[[nodiscard]] inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// malloc's bytes in use (glibc mallinfo2), or 0 where it is not available.
[[nodiscard]] inline std::size_t heap_in_use() noexcept {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

/// Heap growth per key over `after - before`, beyond `key_bytes`; unset when
/// the allocator does not report it (non-glibc, sanitizers).
[[nodiscard]] inline std::optional<double> per_key(std::size_t before, std::size_t after,
                                                   std::size_t keys, std::size_t key_bytes) {
  if (after <= before || keys == 0) return std::nullopt;
  return static_cast<double>(after - before) / static_cast<double>(keys) -
         static_cast<double>(key_bytes);
}

/// Heap bytes per key of a fresh limiter<P> after one check on every key.
template <class P>
[[nodiscard]] std::optional<double> process_bytes(const typename P::config& cfg,
                                                  const std::vector<std::string>& keys,
                                                  std::int64_t t0) {
  auto lim = std::make_unique<limiter<P>>(cfg);
  const std::size_t before = heap_in_use();
  for (const auto& k : keys) (void)lim->try_acquire(k, timestamp{t0});
  const std::size_t after = heap_in_use();
  return per_key(before, after, keys.size(), keys.front().size());
}

}  // namespace detail

/// The in-process measurement's memory estimate: per key, the floor's map
/// node, five limiters' nodes (about 140 bytes each) and the sliding log's
/// entries (16 bytes each, ring capacity up to twice that), one per pass up
/// to the limit: 1 + rounds + 3 max(3, rounds / 3) passes.
[[nodiscard]] inline double in_process_bytes(const rate& r, std::size_t keys, int rounds) {
  const std::int64_t passes = 1 + rounds + 3 * std::max(3, rounds / 3);
  const std::int64_t entries = std::min<std::int64_t>(r.limit(), passes);
  return static_cast<double>(keys) * (6.0 * 140.0 + 32.0 * static_cast<double>(entries));
}

/// Refuses --keys and --rounds whose in-process measurement would pass the
/// memory budget (half of this machine's memory, or of the address-space
/// limit).
/// @throws replay::memory_budget_error naming both flags and the estimate
inline void check_in_process_budget(const rate& r, std::size_t keys, int rounds,
                                    std::size_t budget = replay::default_memory_budget()) {
  const double need = in_process_bytes(r, keys, rounds);
  if (need <= static_cast<double>(budget)) return;
  throw replay::memory_budget_error(
      "--keys " + std::to_string(keys) + " with --rounds " + std::to_string(rounds) +
      " needs about " + replay::format_bytes(need) + " in process, over the memory budget of " +
      replay::format_bytes(static_cast<double>(budget)) +
      " (half of this machine's memory, or of the address-space limit); use fewer keys or rounds");
}

/// Progress lines on standard error.
using progress_fn = std::function<void(const std::string&)>;

/// Times every available policy of `rows` in process, the way
/// benchmarks/core/paired_floor.cpp does: all limiters (one per policy, each
/// holding every key) and a bare std::unordered_map<std::string, uint64_t>
/// are alive at once; each round times a pass of the floor (find and
/// increment every key) and then a pass of each policy (one try_acquire per
/// key, `now` passed in) in rotating order. Every key is checked once per
/// pass and passes are `step_us` = period / limit (rounded up) apart, so each
/// key runs at exactly its limit. Then, in max(3, rounds / 3) rounds of the
/// same kind (the floor first, the policies in rotating order), one thread on
/// all keys against two threads on distinct halves, each after an untimed
/// pass that brings the structure back into cache, as the benchmark does; the
/// floor's own figure is the reference for what the host gives two threads.
inline void measure_in_process(report& rep, std::size_t key_count, int rounds,
                               const progress_fn& progress) {
  const rate& r = rep.r;
  const std::int64_t period = r.period().count();
  const std::int64_t step = std::max<std::int64_t>(1, (period + r.limit() - 1) / r.limit());
  rep.step_us = step;
  rep.process_keys = key_count;
  rep.rounds = rounds;
  std::vector<std::string> keys;
  keys.reserve(key_count);
  for (std::size_t i = 0; i < key_count; ++i) {
    keys.push_back("+1555" + std::to_string(1'000'000 + i));
  }
  std::vector<const std::string*> order;
  for (const auto& k : keys) order.push_back(&k);
  std::shuffle(order.begin(), order.end(), std::mt19937_64{0x5eed});
  const replay::limiter_settings settings{r, std::nullopt, false};
  std::int64_t now = 1'700'000'000'000'000;

  // Memory first, each structure built fresh on its own.
  progress("in process: heap bytes per key on " + replay::detail::group(key_count) + " keys");
  {
    auto counts = std::make_unique<std::unordered_map<std::string, std::uint64_t>>();
    const std::size_t before = detail::heap_in_use();
    for (const auto& k : keys) counts->emplace(k, 0);
    rep.floor_bytes = detail::per_key(before, detail::heap_in_use(), keys.size(), keys[0].size());
  }
  for (policy_row& row : rep.rows) {
    if (!row.unavailable.empty()) continue;
    row.process.bytes = replay::with_policy(row.id, [&]<class P>() {
      return detail::process_bytes<P>(replay::make_config<P>(settings), keys, now);
    });
  }

  std::vector<policy_row*> subjects_rows;
  std::vector<detail::pass_fn> passes;
  for (policy_row& row : rep.rows) {
    if (!row.unavailable.empty()) continue;
    subjects_rows.push_back(&row);
    passes.push_back(replay::with_policy(row.id, [&]<class P>() {
      return detail::make_pass<P>(replay::make_config<P>(settings), keys, now);
    }));
  }
  std::unordered_map<std::string, std::uint64_t> floor_map;
  for (const auto& k : keys) floor_map.emplace(k, 0);
  // Two threads on distinct keys of the one map: each find reads, each
  // increment writes its own node, so they share no written memory.
  const detail::pass_fn floor_keys = [&floor_map](const std::vector<const std::string*>& ks,
                                                  std::int64_t) {
    std::uint64_t sum = 0;
    for (const std::string* k : ks) sum += ++floor_map.find(*k)->second;
    return sum;
  };
  const auto floor_pass = [&] { return floor_keys(order, 0); };

  std::vector<std::vector<double>> ratio(passes.size());
  std::vector<std::vector<double>> ns(passes.size());
  std::vector<double> floor_ns;
  std::uint64_t sink = 0;
  const double per = 1e9 / static_cast<double>(order.size());
  for (int round = 0; round < rounds; ++round) {
    progress("in process: round " + std::to_string(round + 1) + "/" + std::to_string(rounds));
    now += step;
    const double f = detail::seconds_of([&] { sink += floor_pass(); });
    floor_ns.push_back(f * per);
    for (std::size_t j = 0; j < passes.size(); ++j) {
      const std::size_t s = (j + static_cast<std::size_t>(round)) % passes.size();
      const double t = detail::seconds_of([&] { sink += passes[s](order, now); });
      ns[s].push_back(t * per);
      ratio[s].push_back(f > 0 ? t / f : 0.0);
    }
  }
  rep.floor_ns = detail::median(floor_ns);
  for (std::size_t s = 0; s < passes.size(); ++s) {
    subjects_rows[s]->process.ns = detail::median(ns[s]);
    subjects_rows[s]->process.x_floor = detail::median(ratio[s]);
  }

  // Two threads on distinct halves of the keys against one thread on all of
  // them: subject 0 is the floor, then the policies, in rounds.
  const std::vector<const std::string*> lo(order.begin(),
                                           order.begin() + static_cast<long>(order.size() / 2));
  const std::vector<const std::string*> hi(order.begin() + static_cast<long>(order.size() / 2),
                                           order.end());
  std::vector<const detail::pass_fn*> scaled{&floor_keys};
  for (const detail::pass_fn& p : passes) scaled.push_back(&p);
  const auto scaling_once = [&](const detail::pass_fn& pass) {
    // The untimed pass first: after the other subjects ran, the structure is
    // out of cache, and the one-thread pass would pay for that alone while
    // the two threads right after it found it warm.
    now += step;
    sink += pass(order, now);
    now += step;
    const double one = detail::seconds_of([&] { sink += pass(order, now); });
    now += step;
    std::uint64_t other = 0;
    const double two = detail::seconds_of([&] {
      // A pass may throw (bad_alloc): the other thread's error is carried
      // back, and jthread is joined on the way out if this thread's pass
      // throws, where a std::thread would end the process either way.
      std::exception_ptr error;
      std::jthread a([&] {
        try {
          other = pass(lo, now);
        } catch (...) {
          error = std::current_exception();
        }
      });
      sink += pass(hi, now);
      a.join();
      if (error) std::rethrow_exception(error);
    });
    sink += other;
    return two > 0 ? one / two : 0.0;
  };
  const int scaling_rounds = std::max(3, rounds / 3);
  std::vector<std::vector<double>> scaling(scaled.size());
  for (int round = 0; round < scaling_rounds; ++round) {
    progress("in process: two threads, round " + std::to_string(round + 1) + "/" +
             std::to_string(scaling_rounds));
    scaling[0].push_back(scaling_once(*scaled[0]));
    for (std::size_t j = 0; j < passes.size(); ++j) {
      const std::size_t s = 1 + (j + static_cast<std::size_t>(round)) % passes.size();
      scaling[s].push_back(scaling_once(*scaled[s]));
    }
  }
  rep.floor_scaling = detail::median(scaling[0]);
  for (std::size_t s = 0; s < passes.size(); ++s) {
    subjects_rows[s]->process.scaling = detail::median(scaling[s + 1]);
  }
  if (sink == 42) progress("");  // keeps the passes observable
}

/// Replays the trace `in` exactly as ratelimit-replay's summary does, plus
/// its sweep at the rate's own limit (which gives the labelled counts), and
/// fills the accuracy figures of `rep`.
/// @throws replay::input_error for a bad line, replay::memory_budget_error
inline void measure_accuracy(report& rep, std::istream& in, bool skip_bad_lines,
                             std::ostream& err) {
  replay::analysis_options a;
  a.settings = replay::limiter_settings{rep.r, std::nullopt, false};
  a.skip_bad_lines = skip_bad_lines;
  a.sweep_limits = {rep.r.limit()};
  a.sweep_policies.assign(std::begin(all_policies), std::end(all_policies));
  const replay::analysis_result res = replay::analyse(in, a);
  if (res.skipped > 0) {
    err << "ratelimit-compare: skipped " << res.skipped
        << " bad line(s); first: " << res.first_skipped << '\n';
  }
  rep.events = res.events;
  rep.keys = res.keys;
  rep.labelled = res.labelled;
  rep.abusive_keys = res.abusive_keys;
  rep.normal_keys = res.normal_keys;
  for (const replay::policy_summary& p : res.policies) {
    policy_row row;
    row.id = p.id;
    row.unavailable = p.unavailable;
    row.admitted = p.admitted;
    row.rejected = p.rejected;
    row.max_in_window = p.max_in_window;
    row.keys_blocked = p.keys_blocked;
    for (const replay::sweep_point& s : res.sweep) {
      if (s.id == p.id && s.unavailable.empty()) {
        row.abusive_caught = s.abusive_caught;
        row.normal_blocked = s.normal_blocked;
      }
    }
    rep.rows.push_back(std::move(row));
  }
}

// ---------------------------------------------------------------------------
// Outputs

namespace detail {

[[nodiscard]] inline std::string fixed(const std::optional<double>& v, int decimals) {
  if (!v) return "-";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, *v);
  return buf;
}

/// A name the user gave (the trace's file name) as markdown text on one
/// line: valid UTF-8 kept, line breaks, other control bytes and bytes that
/// are not UTF-8 as U+FFFD, and the characters markdown or HTML would read as
/// markup backslash-escaped, so a hostile name cannot add rows, tags or links.
[[nodiscard]] inline std::string markdown_text(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u < 0x20 || u == 0x7f) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else if (u < 0x80) {
      if (std::string_view("\\`[]<>|&").find(s[i]) != std::string_view::npos) out += '\\';
      out += s[i];
      ++i;
    } else if (const std::size_t n = replay::detail::utf8_length(s, i); n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

[[nodiscard]] inline std::string rate_text(const rate& r) {
  return std::to_string(r.limit()) + "/" + replay::format_duration(r.period().count());
}

}  // namespace detail

/// The markdown table's column headers, in order.
inline constexpr std::string_view table_columns[] = {"policy",
                                                     "ns/check",
                                                     "x floor",
                                                     "2 threads / 1",
                                                     "B/key in process",
                                                     "Redis checks/s",
                                                     "Redis checks/s, batch 100",
                                                     "Redis B/key",
                                                     "admitted",
                                                     "max in W",
                                                     "keys blocked",
                                                     "abusive caught",
                                                     "normal blocked"};

/// Writes the markdown report: a heading line, the table, and notes.
inline void write_markdown(std::ostream& o, const report& rep) {
  using replay::detail::group;
  using replay::detail::pct;
  o << "Rate " << rep.r.limit() << " per " << replay::format_duration(rep.r.period().count())
    << "; trace " << detail::markdown_text(rep.input_name) << ": " << group(rep.events)
    << " calls, " << group(rep.keys) << " keys";
  if (rep.labelled) {
    o << " (" << group(rep.abusive_keys) << " labelled abusive, " << group(rep.normal_keys)
      << " normal)";
  }
  o << ".\n\n|";
  for (const std::string_view c : table_columns) o << ' ' << c << " |";
  o << "\n|";
  for (std::size_t i = 0; i < std::size(table_columns); ++i) o << (i == 0 ? "---|" : "--:|");
  o << '\n';
  for (const policy_row& row : rep.rows) {
    o << "| " << policy_name(row.id) << " | ";
    if (!row.unavailable.empty()) {
      for (std::size_t i = 2; i < std::size(table_columns); ++i) o << "n/a | ";
      o << "n/a |\n";
      continue;
    }
    const auto per_s = [](const std::optional<double>& v) {
      return v ? replay::detail::rate_per_s(*v) : std::string("-");
    };
    o << detail::fixed(row.process.ns, 1) << " | " << detail::fixed(row.process.x_floor, 2) << " | "
      << detail::fixed(row.process.scaling, 2) << " | " << detail::fixed(row.process.bytes, 1)
      << " | " << per_s(row.redis.sequential) << " | " << per_s(row.redis.batched) << " | "
      << detail::fixed(row.redis.memory_usage, 0) << " | " << group(row.admitted) << " | "
      << row.max_in_window << " | " << group(row.keys_blocked) << " | ";
    if (rep.labelled) {
      o << pct(static_cast<double>(row.abusive_caught), static_cast<double>(rep.abusive_keys), 1)
        << " | "
        << pct(static_cast<double>(row.normal_blocked), static_cast<double>(rep.normal_keys))
        << " |\n";
    } else {
      o << "- | - |\n";
    }
  }
  o << '\n';
  if (rep.quick) {
    o << "- `--quick`: too few keys, rounds and Redis checks for the timings to mean much; "
         "the accuracy columns are exact.\n";
  }
  if (rep.process_keys > 0) {
    o << "- In process: " << group(rep.process_keys) << " keys (12 bytes), median of " << rep.rounds
      << " rounds, `now` passed in, each key checked once every "
      << replay::format_duration(rep.step_us)
      << " (its limit's pace); x floor: per round, the check against a bare "
         "`std::unordered_map<std::string, uint64_t>` find-and-increment timed in the same round ("
      << detail::fixed(rep.floor_ns, 1) << " ns, " << detail::fixed(rep.floor_bytes, 1)
      << " B/key beyond the key); 2 threads / 1: throughput of two threads on distinct halves of "
         "the keys over one thread on all of them, timed in rounds with the floor's: 2 threads / 1 "
         "of the floor itself: "
      << detail::fixed(rep.floor_scaling, 2)
      << " (what this host gives a second thread; near 1 when the second core is busy); "
         "B/key in process: malloc's bytes in use per "
         "key after one check, beyond the key's bytes (`-` where the allocator does not say).\n";
  }
  if (!rep.redis_where.empty()) {
    // The URL is the user's and the version the server's: text, not markup.
    o << "- Redis: " << detail::markdown_text(rep.redis_where)
      << "; one connection, the server's TIME, each check one script (batches: one round trip "
         "per 100 checks); Redis B/key: `MEMORY USAGE` of a 16-byte key after one check "
         "(state and config fingerprint).\n";
  } else {
    o << "- Redis: not measured (`-`).\n";
  }
  o << "- Accuracy: the trace replayed as `ratelimit-replay --rate " << detail::rate_text(rep.r)
    << "` replays it; max in W: most calls one key got through in any window (t-W, t]; keys "
       "blocked: keys rejected at least once";
  if (rep.labelled) {
    o << "; abusive caught / normal blocked: keys labelled 1 / 0 rejected at least once";
  }
  o << ".\n";
  for (const policy_row& row : rep.rows) {
    if (!row.unavailable.empty())
      o << "- n/a " << policy_name(row.id) << ": " << row.unavailable << '\n';
  }
}

/// The CSV header (one row per policy follows).
inline constexpr std::string_view csv_header =
    "policy,rate,ns_per_check,x_floor,threads2_over_1,process_bytes_per_key,redis_checks_per_s,"
    "redis_batch_checks_per_s,redis_bytes_per_key,redis_used_memory_per_key,events,admitted,"
    "rejected,max_in_window,keys_blocked,abusive_keys,abusive_caught,normal_keys,normal_blocked,"
    "floor_ns_per_check,floor_threads2_over_1,unavailable\n";

/// Writes the figures as CSV: empty fields where nothing was measured.
inline void write_csv(std::ostream& o, const report& rep) {
  const auto num = [](const std::optional<double>& v, int decimals) {
    return v ? detail::fixed(v, decimals) : std::string();
  };
  o << csv_header;
  for (const policy_row& row : rep.rows) {
    std::string line;
    line += policy_name(row.id);
    line += ',' + detail::rate_text(rep.r);
    const bool ok = row.unavailable.empty();
    const auto cells = {num(row.process.ns, 1),
                        num(row.process.x_floor, 3),
                        num(row.process.scaling, 3),
                        num(row.process.bytes, 1),
                        num(row.redis.sequential, 0),
                        num(row.redis.batched, 0),
                        num(row.redis.memory_usage, 1),
                        num(row.redis.used_memory, 1),
                        std::to_string(rep.events),
                        ok ? std::to_string(row.admitted) : std::string(),
                        ok ? std::to_string(row.rejected) : std::string(),
                        ok ? std::to_string(row.max_in_window) : std::string(),
                        ok ? std::to_string(row.keys_blocked) : std::string(),
                        rep.labelled ? std::to_string(rep.abusive_keys) : std::string(),
                        rep.labelled && ok ? std::to_string(row.abusive_caught) : std::string(),
                        rep.labelled ? std::to_string(rep.normal_keys) : std::string(),
                        rep.labelled && ok ? std::to_string(row.normal_blocked) : std::string(),
                        rep.process_keys > 0 ? detail::fixed(rep.floor_ns, 1) : std::string(),
                        rep.process_keys > 0 ? num(rep.floor_scaling, 3) : std::string()};
    for (const std::string& c : cells) line += ',' + c;
    line += ',';
    replay::append_csv_field(line, row.unavailable);
    o << line << '\n';
  }
}

/// Writes the bar chart: cost, memory, Redis throughput (when measured) and accuracy.
inline void write_svg(std::ostream& o, const report& rep) {
  std::vector<std::string> names;
  std::vector<bar_panel> panels;
  bar_panel cost{"Cost per check", "x the unordered_map floor", {}};
  bar_panel mem{"Memory per key, in process", "bytes beyond the key", {}};
  bar_panel seq{"Redis, one at a time", "checks/s", {}};
  bar_panel rmem{"Redis memory per key", "bytes (MEMORY USAGE)", {}};
  bar_panel max_w{"Most calls in any window",
                  "calls one key got through (limit " + std::to_string(rep.r.limit()) + ")",
                  {}};
  bar_panel caught{"Abusive keys caught", "% of abusive keys blocked", {}};
  bar_panel wrong{"Normal keys blocked", "% of normal keys (false rejects)", {}};
  for (const policy_row& row : rep.rows) {
    names.emplace_back(policy_name(row.id));
    const bool ok = row.unavailable.empty();
    cost.values.push_back(ok ? row.process.x_floor : std::nullopt);
    mem.values.push_back(ok ? row.process.bytes : std::nullopt);
    seq.values.push_back(ok ? row.redis.sequential : std::nullopt);
    rmem.values.push_back(ok ? row.redis.memory_usage : std::nullopt);
    max_w.values.push_back(ok ? std::optional<double>(row.max_in_window) : std::nullopt);
    const auto share = [](std::size_t part, std::size_t whole) {
      return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
    };
    caught.values.push_back(ok ? std::optional<double>(share(row.abusive_caught, rep.abusive_keys))
                               : std::nullopt);
    wrong.values.push_back(ok ? std::optional<double>(share(row.normal_blocked, rep.normal_keys))
                              : std::nullopt);
  }
  if (rep.process_keys > 0) {
    panels.push_back(cost);
    panels.push_back(mem);
  }
  if (!rep.redis_where.empty()) {
    panels.push_back(seq);
    panels.push_back(rmem);
  }
  panels.push_back(max_w);
  if (rep.labelled) {
    panels.push_back(caught);
    panels.push_back(wrong);
  }
  write_bar_chart(o,
                  "Rate-limiting policies at " + std::to_string(rep.r.limit()) + " per " +
                      replay::format_duration(rep.r.period().count()),
                  "trace " + rep.input_name + ": " + replay::detail::group(rep.events) +
                      " calls, " + replay::detail::group(rep.keys) + " keys",
                  names, panels);
}

// ---------------------------------------------------------------------------
// The command

namespace detail {

/// Writes `f(stream)` to `path`.
/// @throws std::runtime_error naming the file when it cannot be written
template <class F>
void write_file(const std::string& path, F&& f) {
  std::ofstream file(path, std::ios::binary);
  if (file) f(file);
  file.flush();
  if (!file) throw std::runtime_error("cannot write " + path);
}

#ifdef RATELIMIT_COMPARE_HAVE_REDIS
/// Measures every policy on Redis: on `server` (the throwaway redis-server
/// run() started for `--redis auto`), else on the server at o.redis.
inline void measure_redis_all(report& rep, const options& o,
                              std::unique_ptr<rltest::redis_server> server,
                              const progress_fn& progress, std::ostream& err) {
  redis::options base;
  if (server) {
    base = server->options();
    rep.redis_where = "a throwaway redis-server on 127.0.0.1:" + std::to_string(server->port());
  } else {
    base = redis::parse_url(o.redis);
    base.connect_timeout = std::chrono::milliseconds(2000);
    rep.redis_where = "the server at " + redis::detail::redacted_url(o.redis);
  }
  base.command_timeout = std::chrono::milliseconds(10'000);
  base.on_failure = redis::failure_policy::throw_error;
  // A fresh server of our own takes the store's default prefix, so MEMORY
  // USAGE counts the key names a deployment would have; on a server of the
  // user's the run's keys get a prefix of their own, deleted at the end.
  if (!server) base.prefix = run_prefix();
  base.on_warning = [&err](std::string_view w) {
    err << "ratelimit-compare: warning: " << w << '\n';
  };
  {
    const std::string_view args[] = {"INFO", "server"};
    const redis::reply_ptr r = detail::run_command(base, args);
    if (r->type == REDIS_REPLY_STRING) {
      const std::string_view text(r->str, r->len);
      constexpr std::string_view field = "redis_version:";
      if (const auto at = text.find(field); at != std::string_view::npos) {
        const auto end = text.find_first_of("\r\n", at);
        rep.redis_where += " (Redis " +
                           std::string(text.substr(at + field.size(), end - at - field.size())) +
                           ")";
      }
    }
  }
  if (!server) {
    rep.redis_where += ", keys under a prefix of this run's (" +
                       std::to_string(base.prefix.size() - 3) +
                       " bytes longer than the default rl:, which MEMORY USAGE counts)";
  }
  redis_plan plan;
  if (o.quick) {
    plan.rounds = 1;
    plan.keys = 200;
    plan.sequential = 300;
    plan.batched = 2'000;
    plan.memory_keys = 200;
    plan.usage_keys = 20;
  }
  const replay::limiter_settings settings{rep.r, std::nullopt, false};
  try {
    for (policy_row& row : rep.rows) {
      if (!row.unavailable.empty()) continue;
      progress("Redis: " + std::string(policy_name(row.id)));
      row.redis = replay::with_policy(row.id, [&]<class P>() {
        return measure_redis<P>(base, replay::make_config<P>(settings), plan);
      });
    }
  } catch (...) {
    if (!server) {
      try {
        delete_prefix(base);
      } catch (const std::exception&) {
        // The keys expire by their TTLs.
      }
    }
    throw;
  }
  if (!server) {
    progress("Redis: deleting this run's keys");
    delete_prefix(base);
  }
}
#endif

}  // namespace detail

/// Runs the tool: returns the exit status (0 ok, 2 usage or input error,
/// 1 other failure). The table goes to `out` (or --out), messages and
/// progress to `err`. `sample` is the default INPUT.
inline int run_compare(const std::vector<std::string>& args, std::istream& std_in,
                       std::ostream& out, std::ostream& err, const std::string& sample) {
  options o;
  try {
    o = parse_cli(args);
  } catch (const std::invalid_argument& e) {
    err << "ratelimit-compare: usage error: " << e.what() << "\n"
        << "Try 'ratelimit-compare --help'.\n";
    return 2;
  }
  if (o.help) {
    out << usage_text;
    return 0;
  }
  const progress_fn progress = [&err](const std::string& line) {
    if (!line.empty()) err << "ratelimit-compare: " << line << '\n' << std::flush;
  };
  try {
    check_in_process_budget(o.r, o.keys, o.rounds);
  } catch (const std::invalid_argument& e) {
    err << "ratelimit-compare: error: " << e.what() << '\n';
    return 2;
  }
#ifdef RATELIMIT_COMPARE_HAVE_REDIS
  // --redis auto: the throwaway redis-server is found and started before
  // anything is measured, so a server that cannot run costs no minute of
  // measuring. Asked for (--redis auto, or RATELIMIT_REDIS_SERVER set), a
  // failure is an error; by default the Redis columns are left out.
  std::unique_ptr<rltest::redis_server> server;
  if (o.redis == "auto") {
    const char* env = std::getenv("RATELIMIT_REDIS_SERVER");
    const bool asked = o.redis_set || (env != nullptr && *env != '\0');
    std::string why;
    if (const rltest::redis_server_lookup found = rltest::find_redis_server(); !found.path) {
      why = "no redis-server found (" + found.looked + ")";
    } else {
      progress("Redis: starting a throwaway redis-server (" + *found.path + ")");
      try {
        server = std::make_unique<rltest::redis_server>();
      } catch (const std::runtime_error& e) {
        why = *found.path + ": " + e.what();
      }
    }
    if (!why.empty()) {
      constexpr std::string_view how =
          "install redis-server (e.g. `apt-get install redis-server`), set "
          "RATELIMIT_REDIS_SERVER to its path, or give --redis URL for a running server";
      if (asked) {
        err << "ratelimit-compare: error: --redis auto: " << why << "; " << how
            << ", or use --no-redis\n";
        return 2;
      }
      err << "ratelimit-compare: " << why
          << ", so the Redis columns are left out (as with --no-redis); to get them, " << how
          << ".\n";
      o.redis.clear();
    }
  }
#endif
  const std::string path = o.input.empty() ? sample : o.input;
  report rep;
  rep.r = o.r;
  rep.quick = o.quick;
  rep.input_name = o.input == "-"    ? "standard input"
                   : o.input.empty() ? "examples/data/sample_calls.csv"
                                     : path;
  try {
    progress("accuracy: replaying " + rep.input_name);
    if (o.input == "-") {
      measure_accuracy(rep, std_in, o.skip_bad_lines, err);
    } else {
      std::ifstream in(path, std::ios::binary);
      if (!in) {
        throw usage_error("cannot open \"" + path + "\"" +
                          (o.input.empty() ? " (the bundled sample; give INPUT)" : ""));
      }
      measure_accuracy(rep, in, o.skip_bad_lines, err);
    }
  } catch (const replay::input_error& e) {
    err << "ratelimit-compare: error: " << rep.input_name << ": " << e.what() << '\n';
    return 2;
  } catch (const std::invalid_argument& e) {
    err << "ratelimit-compare: error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    err << "ratelimit-compare: failure: " << e.what() << '\n';
    return 1;
  }
  try {
    measure_in_process(rep, o.keys, o.rounds, progress);
#ifdef RATELIMIT_COMPARE_HAVE_REDIS
    if (!o.redis.empty()) detail::measure_redis_all(rep, o, std::move(server), progress, err);
#endif
    if (o.out.empty()) {
      write_markdown(out, rep);
    } else {
      detail::write_file(o.out, [&](std::ostream& f) { write_markdown(f, rep); });
      progress("wrote the table to " + o.out);
    }
    if (!o.csv.empty()) {
      detail::write_file(o.csv, [&](std::ostream& f) { write_csv(f, rep); });
      progress("wrote the CSV to " + o.csv);
    }
    if (!o.svg.empty()) {
      detail::write_file(o.svg, [&](std::ostream& f) { write_svg(f, rep); });
      progress("wrote the chart to " + o.svg);
    }
  } catch (const std::invalid_argument& e) {
    err << "ratelimit-compare: error: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    err << "ratelimit-compare: failure: " << e.what() << '\n';
    return 1;
  }
  return 0;
}

}  // namespace ratelimit::compare
