// SPDX-License-Identifier: Apache-2.0
// Shadow-mode checks (access::force) against plain checks in process, as ratios from one run.
//
// For every policy, two limiters on memory_store hold the same 10,000 keys;
// one is in shadow mode. Rounds alternate between them (so that machine
// noise hits both alike), each round timing `per_round` try_acquire calls
// on shuffled keys at a caller-supplied time. Two traffics:
//   admitted  every check admitted (a shadow check is then a plain one)
//   over      every key far over its limit: plain checks are rejected and
//             write nothing, shadow checks are recorded (debt, TAT ahead, a
//             trimmed log), the case shadow mode makes more expensive
// Prints the median ns per check of each and shadow / plain.
//
// Usage: ratelimit_bench_shadow [rounds=101] [per_round=20000]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace {

namespace rl = ratelimit;
using clk = std::chrono::steady_clock;

constexpr std::size_t key_count = 10'000;
constexpr std::int64_t start_us = 1'700'000'000'000'000;

std::vector<std::string> make_keys() {
  std::vector<std::string> keys;
  keys.reserve(key_count);
  for (std::size_t i = 0; i < key_count; ++i)
    keys.push_back("+1555" + std::to_string(1'000'000 + i));
  return keys;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

volatile std::int64_t sink = 0;

template <class P>
void run(const char* name, const typename P::config& admitted_cfg,
         const typename P::config& over_cfg, int rounds, std::size_t per_round) {
  const auto keys = make_keys();
  std::vector<std::uint32_t> order(per_round);
  std::mt19937 rng(42);
  for (auto& o : order) o = static_cast<std::uint32_t>(rng() % key_count);
  for (const bool over : {false, true}) {
    const auto& cfg = over ? over_cfg : admitted_cfg;
    rl::limiter<P> plain{cfg};
    rl::limiter<P> shadow{cfg};
    shadow.set_shadow(true);
    std::int64_t now = start_us;
    // Fill every key first (over: far past its limit in both).
    for (int fill = 0; fill < (over ? 4 : 1); ++fill) {
      for (const auto& k : keys) {
        sink = sink + plain.try_acquire(k, rl::timestamp{now}).remaining;
        sink = sink + shadow.try_acquire(k, rl::timestamp{now}).remaining;
      }
    }
    std::vector<double> ns_plain;
    std::vector<double> ns_shadow;
    for (int r = 0; r < rounds; ++r) {
      for (const bool is_shadow : {false, true}) {
        auto& l = is_shadow ? shadow : plain;
        std::int64_t t = now;
        const auto begin = clk::now();
        for (const std::uint32_t i : order) {
          // Admitted traffic advances time so buckets refill; over-limit
          // traffic stays within one window.
          t += over ? 0 : 1'000;
          const rl::decision d = l.try_acquire(keys[i], rl::timestamp{t});
          sink = sink + d.remaining;
        }
        const double ns = std::chrono::duration<double, std::nano>(clk::now() - begin).count() /
                          static_cast<double>(order.size());
        (is_shadow ? ns_shadow : ns_plain).push_back(ns);
      }
      if (!over) now += static_cast<std::int64_t>(order.size()) * 1'000;
    }
    const double p = median(ns_plain);
    const double s = median(ns_shadow);
    std::printf("%-16s %-9s plain %7.1f ns  shadow %7.1f ns  shadow/plain %.2f\n", name,
                over ? "over" : "admitted", p, s, s / p);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 101;
  const std::size_t per_round = argc > 2 ? static_cast<std::size_t>(std::atoll(argv[2])) : 20'000;
  if (rounds < 1 || per_round < 1) {
    std::fprintf(stderr, "usage: ratelimit_bench_shadow [rounds>=1] [per_round>=1]\n");
    return 2;
  }
  // Admitted: a rate far above the traffic (each key sees one check per
  // 10 ms of caller time); over: 10 per hour with no time passing.
  run<rl::fixed_window>("fixed_window", rl::fixed_window::config{"1000000/1s"},
                        rl::fixed_window::config{"10/1h"}, rounds, per_round);
  run<rl::sliding_window_log>("sliding_log", rl::sliding_window_log::config{"1000/1s"},
                              rl::sliding_window_log::config{"10/1h"}, rounds, per_round);
  run<rl::sliding_window_counter>("sliding_counter",
                                  rl::sliding_window_counter::config{"1000000/1s"},
                                  rl::sliding_window_counter::config{"10/1h"}, rounds, per_round);
  run<rl::token_bucket>("token_bucket", rl::token_bucket::config{"1000000/1s"},
                        rl::token_bucket::config{"10/1h"}, rounds, per_round);
  run<rl::gcra>("gcra", rl::gcra::config{"1000/1s"}, rl::gcra::config{"10/1h"}, rounds, per_round);
  return 0;
}
