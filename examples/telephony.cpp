// SPDX-License-Identifier: Apache-2.0
// Plays a simulated day of phone calls against "more than 10 calls in 15 minutes is rejected" under all five policies.
//
// The call stream is generated from a seed, so every run with the same
// arguments prints the same table. Most numbers call a few times a day; a few
// dozen abusive numbers fire bursts; a third of those time their bursts around
// the edges of the 15-minute windows (the fixed window's known weakness: it
// lets up to twice the limit through within a few minutes). Each policy runs on
// the in-process store driven by a manual clock set to each call's time.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace {

namespace rl = ratelimit;

constexpr std::int64_t second_us = 1'000'000;
constexpr std::int64_t minute_us = 60 * second_us;
constexpr std::int64_t window_us = 15 * minute_us;
constexpr std::int64_t day_us = 24 * 60 * minute_us;
/// 2024-11-30T00:00:00Z in microseconds: a multiple of 15 minutes, so the
/// fixed windows (aligned to the clock's epoch) start on the quarter hour.
constexpr std::int64_t day_start_us = 1'732'924'800 * second_us;
constexpr const char* rule = "10/15min";

struct options {
  std::uint64_t seed = 1;
  std::size_t numbers = 20'000;
  std::size_t abusive = 40;
};

/// splitmix64: small, fast and identical on every platform (the standard
/// distributions are not), so a seed always gives the same day.
class generator {
 public:
  explicit generator(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi] (the modulo bias is far below anything this prints).
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(unsigned percent) { return next() % 100 < percent; }

 private:
  std::uint64_t state_;
};

struct call {
  std::int64_t at_us;
  std::uint32_t caller;  ///< index into the number list
};

struct traffic {
  std::vector<std::string> numbers;  ///< "+1555xxxxxxx"; the last `abusive` are abusive
  std::size_t abusive = 0;
  std::vector<call> calls;  ///< sorted by time
};

std::string phone_number(std::string_view prefix, std::size_t i) {
  // 7919 is coprime with 10^7, so distinct i give distinct subscriber digits.
  const std::string digits = std::to_string((i * 7919 + 4'242'421) % 10'000'000);
  return std::string(prefix) + std::string(7 - digits.size(), '0') + digits;
}

traffic generate(const options& o) {
  generator rng(o.seed);
  traffic t;
  t.abusive = o.abusive;
  const std::size_t total = o.numbers + o.abusive;
  t.numbers.reserve(total);
  for (std::size_t i = 0; i < o.numbers; ++i) t.numbers.push_back(phone_number("+1555", i));
  for (std::size_t i = 0; i < o.abusive; ++i) t.numbers.push_back(phone_number("+1900", i));

  const auto add = [&](std::size_t who, std::int64_t offset_us) {
    if (offset_us < 0 || offset_us >= day_us) return;
    t.calls.push_back(call{day_start_us + offset_us, static_cast<std::uint32_t>(who)});
  };
  for (std::size_t who = 0; who < o.numbers; ++who) {
    // Ordinary subscribers: a handful of calls at random times...
    const std::int64_t singles = rng.between(1, 8);
    for (std::int64_t c = 0; c < singles; ++c) add(who, rng.between(0, day_us - 1));
    // ...sometimes a short busy spell (calling back, a conference)...
    if (rng.chance(20)) {
      const std::int64_t start = rng.between(0, day_us - 1);
      const std::int64_t n = rng.between(3, 8);
      for (std::int64_t c = 0; c < n; ++c) add(who, start + rng.between(0, 10 * minute_us));
    }
    // ...and a rare legitimate heavy caller (a dispatcher): 12 calls in 30 minutes.
    if (rng.chance(1)) {
      const std::int64_t start = rng.between(0, day_us - 1);
      for (std::int64_t c = 0; c < 12; ++c) add(who, start + rng.between(0, 30 * minute_us));
    }
  }
  for (std::size_t a = 0; a < o.abusive; ++a) {
    const std::size_t who = o.numbers + a;
    const std::int64_t bursts = rng.between(3, 6);
    for (std::int64_t b = 0; b < bursts; ++b) {
      if (a % 3 == 0) {
        // Edge burst: 10 calls in the minute before a quarter hour, 10 in the minute after.
        const std::int64_t edge = rng.between(1, 95) * window_us;
        for (int c = 0; c < 10; ++c) add(who, edge - rng.between(1, minute_us));
        for (int c = 0; c < 10; ++c) add(who, edge + rng.between(0, minute_us - 1));
      } else {
        // Plain burst: 20 to 60 calls within 2 to 5 minutes.
        const std::int64_t start = rng.between(0, day_us - 1);
        const std::int64_t span = rng.between(2, 5) * minute_us;
        const std::int64_t n = rng.between(20, 60);
        for (std::int64_t c = 0; c < n; ++c) add(who, start + rng.between(0, span));
      }
    }
  }
  std::stable_sort(t.calls.begin(), t.calls.end(),
                   [](const call& x, const call& y) { return x.at_us < y.at_us; });
  return t;
}

struct outcome {
  std::string_view policy;
  std::size_t admitted = 0;
  std::size_t rejected = 0;
  std::size_t blocked_normal = 0;
  std::size_t blocked_abusive = 0;
  std::size_t over_limit_numbers = 0;  ///< numbers with more than 10 admitted in some window
  std::size_t worst = 0;               ///< most admitted calls of one number in any window
  std::string worst_number;
};

template <class P>
outcome play(const traffic& t) {
  rl::manual_clock clock;
  rl::limiter<P, rl::memory_store<P>, rl::manual_clock> lim{typename P::config{rule},
                                                            rl::memory_store<P>{}, clock};
  const rl::units limit = lim.config().get_rate().limit();

  outcome out;
  out.policy = P::name;
  std::vector<bool> blocked(t.numbers.size(), false);
  std::vector<std::vector<std::int64_t>> admitted_at(t.numbers.size());
  for (const call& c : t.calls) {
    clock.set(std::chrono::microseconds{c.at_us});
    if (lim.try_acquire(t.numbers[c.caller]).allowed) {
      ++out.admitted;
      admitted_at[c.caller].push_back(c.at_us);
    } else {
      ++out.rejected;
      blocked[c.caller] = true;
    }
  }
  for (std::size_t who = 0; who < t.numbers.size(); ++who) {
    if (blocked[who])
      ++(who < t.numbers.size() - t.abusive ? out.blocked_normal : out.blocked_abusive);
    // Largest number of admitted calls in any (t - 15 min, t]: slide over the
    // number's admitted calls (already in time order).
    const auto& times = admitted_at[who];
    std::size_t first = 0;
    std::size_t most = 0;
    for (std::size_t last = 0; last < times.size(); ++last) {
      while (times[first] <= times[last] - window_us) ++first;
      most = std::max(most, last - first + 1);
    }
    if (most > static_cast<std::size_t>(limit)) ++out.over_limit_numbers;
    if (most > out.worst) {
      out.worst = most;
      out.worst_number = t.numbers[who];
    }
  }
  return out;
}

void print_usage(std::FILE* to) {
  std::fprintf(to,
               "usage: telephony [--seed N] [--numbers N] [--abusive N]\n"
               "\n"
               "Plays one simulated day of calls against the rule \"more than 10 calls in\n"
               "15 minutes is rejected\" (rate %s) under each of the five policies, on the\n"
               "in-process store with a manual clock, and prints what each one let through.\n"
               "\n"
               "  --seed N      seed of the generated day (default 1)\n"
               "  --numbers N   ordinary subscriber numbers, 1..1000000 (default 20000)\n"
               "  --abusive N   abusive numbers firing bursts, 0..10000 (default 40);\n"
               "                every third one bursts across a quarter-hour edge\n"
               "  --help        this text\n",
               rule);
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "telephony: %s\n", message.c_str());
  std::fprintf(stderr, "try 'telephony --help'\n");
  std::exit(2);
}

std::uint64_t parse_number(std::string_view flag, std::string_view text, std::uint64_t min,
                           std::uint64_t max) {
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || value < min ||
      value > max) {
    usage_error(std::string(flag) + " expects a whole number from " + std::to_string(min) + " to " +
                std::to_string(max) + ", got '" + std::string(text) + "'");
  }
  return value;
}

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    }
    if (arg != "--seed" && arg != "--numbers" && arg != "--abusive") {
      usage_error("unknown argument '" + std::string(arg) + "'");
    }
    if (i + 1 >= argc) usage_error(std::string(arg) + " needs a value");
    const std::string_view value = argv[++i];
    if (arg == "--seed") {
      o.seed = parse_number(arg, value, 0, UINT64_MAX);
    } else if (arg == "--numbers") {
      o.numbers = static_cast<std::size_t>(parse_number(arg, value, 1, 1'000'000));
    } else {
      o.abusive = static_cast<std::size_t>(parse_number(arg, value, 0, 10'000));
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_args(argc, argv);
  try {
    const traffic t = generate(o);
    std::printf("rule: more than 10 calls in 15 minutes is rejected (rate %s)\n", rule);
    std::printf(
        "day: %zu calls from %zu numbers (%zu abusive, %zu of them bursting across "
        "quarter-hour edges), seed %llu\n\n",
        t.calls.size(), t.numbers.size(), t.abusive, (t.abusive + 2) / 3,
        static_cast<unsigned long long>(o.seed));

    const outcome results[] = {play<rl::fixed_window>(t), play<rl::sliding_window_log>(t),
                               play<rl::sliding_window_counter>(t), play<rl::token_bucket>(t),
                               play<rl::gcra>(t)};
    std::printf("%-16s %9s %9s %15s %15s %11s %10s  %s\n", "policy", "admitted", "rejected",
                "blocked normal", "blocked abusive", ">10 in 15m", "max 15m", "worst number");
    for (const outcome& r : results) {
      std::printf("%-16.*s %9zu %9zu %15zu %11zu/%-3zu %11zu %10zu  %s\n",
                  static_cast<int>(r.policy.size()), r.policy.data(), r.admitted, r.rejected,
                  r.blocked_normal, r.blocked_abusive, t.abusive, r.over_limit_numbers, r.worst,
                  r.worst_number.c_str());
    }
    std::printf(
        "\nblocked: numbers with at least one rejected call. '>10 in 15m': numbers that got more\n"
        "than 10 calls through within some 15 minutes (t - 15min, t]; 'max 15m': the most any\n"
        "number got through in such a window. The fixed window lets an edge burst through twice\n"
        "(up to 20); the token bucket and GCRA admit the burst of 10 plus what refills during the\n"
        "window; the sliding log never exceeds 10.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "telephony: %s\n", e.what());
    return 1;
  }
  return 0;
}
