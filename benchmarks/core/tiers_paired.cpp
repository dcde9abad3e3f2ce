// SPDX-License-Identifier: Apache-2.0
// Paired benchmark: a tiered check against a plain check of the same policy,
// interleaved in one process, as ratios.
//
// Both limiters hold the same 100,000 phone-number keys; the tiered one has
// three tiers (looked up per key by a lambda over the key's last digit) and
// keeps memory_store<tiered<P>>, the plain one memory_store<P>. Each round
// times a pass of each over every key, in alternating order, with `now`
// passed in (so no clock read), and the report is, per policy, the median
// over rounds of (tiered time / plain time) measured in the same round; a
// third pass names the tier in each call instead of asking the lookup.
// A tiered check adds: the application's lookup (a std::function call), the
// reader announcement on the tier table (two atomic operations on the
// thread's own cache line), a search of the tiers by name, and the 24-byte
// fingerprint compare before the policy's step.
//
// Usage: ratelimit_tiers_paired [--rounds N] [--keys N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/tiers.hpp"

namespace rl = ratelimit;
using clk = std::chrono::steady_clock;

namespace {

std::vector<std::string> phone_numbers(std::size_t n) {
  std::mt19937_64 rng(42);
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    out.push_back("+1555" + std::to_string(1'000'000 + rng() % 8'999'999));
  return out;
}

std::string_view tier_of(std::string_view key) {
  switch ((key.back() - '0') % 3) {
    case 0: return "free";
    case 1: return "pro";
    default: return "team";
  }
}

template <class P>
struct pair_of {
  rl::limiter<P> plain;
  rl::tiered_limiter<P> tiered;
};

template <class P, class Make>
pair_of<P>* make(Make cfg) {
  return new pair_of<P>{
      rl::limiter<P>(cfg(1000)),
      rl::tiered_limiter<P>({{"free", cfg(1000)}, {"pro", cfg(2000)}, {"team", cfg(3000)}},
                            tier_of)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One check of every key; `per_call` names the tier in the call instead of
/// asking the lookup (tiered limiter only).
template <class L>
double pass(L& l, const std::vector<std::string>& keys, std::int64_t& t, bool per_call = false) {
  std::uint64_t admitted = 0;
  const auto start = clk::now();
  for (const std::string& k : keys) {
    if constexpr (requires { l.try_acquire(k, std::string_view{}, rl::timestamp{t}); }) {
      admitted += (per_call ? l.try_acquire(k, tier_of(k), rl::timestamp{t})
                            : l.try_acquire(k, rl::timestamp{t}))
                          .allowed
                      ? 1U
                      : 0U;
    } else {
      admitted += l.try_acquire(k, rl::timestamp{t}).allowed ? 1U : 0U;
    }
    t += 1;
  }
  const double ns = std::chrono::duration<double, std::nano>(clk::now() - start).count();
  if (admitted == 0) std::puts("");  // keep the checks observable
  return ns / static_cast<double>(keys.size());
}

template <class P>
void run(const char* name, pair_of<P>& p, const std::vector<std::string>& keys, int rounds) {
  std::int64_t t = 1'000'000;
  pass(p.plain, keys, t);  // warm: every key inserted
  pass(p.tiered, keys, t);
  std::vector<double> plain, tiered, named, ratio, named_ratio;
  for (int r = 0; r < rounds; ++r) {
    double a = 0;
    double b = 0;
    double c = 0;
    if (r % 2 == 0) {
      a = pass(p.plain, keys, t);
      b = pass(p.tiered, keys, t);
      c = pass(p.tiered, keys, t, true);
    } else {
      c = pass(p.tiered, keys, t, true);
      b = pass(p.tiered, keys, t);
      a = pass(p.plain, keys, t);
    }
    plain.push_back(a);
    tiered.push_back(b);
    named.push_back(c);
    ratio.push_back(b / a);
    named_ratio.push_back(c / a);
  }
  std::printf(
      "%-13s plain %7.1f ns  tiered %7.1f ns (%.3fx, min %.3f, max %.3f)  tier per call %7.1f ns "
      "(%.3fx)\n",
      name, median(plain), median(tiered), median(ratio),
      *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()),
      median(named), median(named_ratio));
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 11;
  std::size_t nkeys = 100'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--keys") == 0)
      nkeys = static_cast<std::size_t>(std::atoll(argv[i + 1]));
  }
  if (rounds < 1 || nkeys < 1) {
    std::fprintf(stderr, "usage: ratelimit_tiers_paired [--rounds N>=1] [--keys N>=1]\n");
    return 2;
  }
  const auto keys = phone_numbers(nkeys);
  std::printf("%zu keys, %d rounds, medians per check\n", keys.size(), rounds);
  auto* fw = make<rl::fixed_window>(
      [](rl::units l) { return rl::fixed_window::config{rl::rate(l, std::chrono::minutes(1))}; });
  run("fixed_window", *fw, keys, rounds);
  auto* g = make<rl::gcra>(
      [](rl::units l) { return rl::gcra::config{rl::rate(l, std::chrono::minutes(1))}; });
  run("gcra", *g, keys, rounds);
  auto* log = make<rl::sliding_window_log>([](rl::units l) {
    return rl::sliding_window_log::config{rl::rate(l, std::chrono::minutes(1))};
  });
  run("sliding_log", *log, keys, rounds);
  // Deliberately leaked: tearing down 600,000 keys is not what is measured.
  return 0;
}
