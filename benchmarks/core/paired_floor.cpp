// SPDX-License-Identifier: Apache-2.0
// Paired benchmark: each policy's check and the bare-map floor, interleaved in one process, as ratios.
//
// Google Benchmark runs each case on its own, one after the other; on a
// shared, noisy machine two cases measured minutes apart can differ by 2x for
// reasons that have nothing to do with the code. This program keeps every
// structure alive at once (the same 100,000 phone-number keys in a limiter per
// policy and in a std::unordered_map<std::string, std::uint64_t>), then for
// each round times a pass of the floor and a pass of every policy back to
// back, in rotating order, and reports per policy the median over rounds of
// (policy time / floor time) measured in the same round.
//
// Usage: ratelimit_paired_core [--rounds N] [--keys N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace rl = ratelimit;
using clk = std::chrono::steady_clock;

namespace {

struct subject {
  std::string name;
  std::function<std::uint64_t(const std::vector<const std::string*>&, std::int64_t&)> pass;
};

template <class P>
subject make_subject(std::string name, typename P::config cfg, const std::vector<std::string>& keys,
                     bool use_clock) {
  auto lim = std::make_shared<rl::limiter<P>>(std::move(cfg));
  std::int64_t t0 = 1'000'000'000;
  for (const auto& k : keys) (void)lim->try_acquire(k, rl::timestamp{t0});
  if (use_clock) {
    return {std::move(name), [lim](const std::vector<const std::string*>& order, std::int64_t&) {
              std::uint64_t sum = 0;
              for (const std::string* k : order) {
                sum += static_cast<std::uint64_t>(lim->try_acquire(*k).remaining);
              }
              return sum;
            }};
  }
  return {std::move(name), [lim](const std::vector<const std::string*>& order, std::int64_t& now) {
            std::uint64_t sum = 0;
            for (const std::string* k : order) {
              sum += static_cast<std::uint64_t>(lim->try_acquire(*k, rl::timestamp{now}).remaining);
              now += 10;
            }
            return sum;
          }};
}

double seconds_of(const std::function<void()>& f) {
  const auto start = clk::now();
  f();
  return std::chrono::duration<double>(clk::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  std::size_t key_count = 100'000;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--keys" && i + 1 < argc) {
      key_count = static_cast<std::size_t>(std::atol(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: ratelimit_paired_core [--rounds N] [--keys N]\n");
      return 2;
    }
  }
  if (rounds < 1 || key_count < 2) {
    std::fprintf(stderr, "ratelimit_paired_core: need --rounds >= 1 and --keys >= 2\n");
    return 2;
  }

  std::vector<std::string> keys;
  for (std::size_t i = 0; i < key_count; ++i)
    keys.push_back("+1555" + std::to_string(1'000'000 + i));
  std::vector<const std::string*> order;
  for (const auto& k : keys) order.push_back(&k);
  std::shuffle(order.begin(), order.end(), std::mt19937_64{0x5eed});

  // Rates under which nearly every check on an existing key is admitted.
  const rl::rate fast{1'000'000, std::chrono::milliseconds{1}};
  const rl::gcra::config gcra_cfg{rl::rate{1, std::chrono::microseconds{1}},
                                  rl::bucket_options{1'000'000'000}};
  std::vector<subject> subjects;
  subjects.push_back(
      make_subject<rl::fixed_window>("fixed_window", rl::fixed_window::config{fast}, keys, false));
  subjects.push_back(make_subject<rl::sliding_window_log>(
      "sliding_log", rl::sliding_window_log::config{fast}, keys, false));
  subjects.push_back(make_subject<rl::sliding_window_counter>(
      "sliding_counter", rl::sliding_window_counter::config{fast}, keys, false));
  subjects.push_back(
      make_subject<rl::token_bucket>("token_bucket", rl::token_bucket::config{fast}, keys, false));
  subjects.push_back(make_subject<rl::gcra>("gcra", gcra_cfg, keys, false));
  subjects.push_back(make_subject<rl::gcra>("gcra (steady_clock)", gcra_cfg, keys, true));

  std::unordered_map<std::string, std::uint64_t> floor_map;
  for (const auto& k : keys) floor_map.emplace(k, 0);
  const auto floor_pass = [&] {
    std::uint64_t sum = 0;
    for (const std::string* k : order) sum += ++floor_map.find(*k)->second;
    return sum;
  };

  std::vector<std::vector<double>> ratio(subjects.size());
  std::vector<std::vector<double>> ns(subjects.size());
  std::vector<double> floor_ns;
  std::uint64_t sink = 0;
  std::int64_t now = 1'000'000'000;
  const double per = 1e9 / static_cast<double>(order.size());
  for (int r = 0; r < rounds; ++r) {
    const double f = seconds_of([&] { sink += floor_pass(); });
    floor_ns.push_back(f * per);
    for (std::size_t j = 0; j < subjects.size(); ++j) {
      const std::size_t s = (j + static_cast<std::size_t>(r)) % subjects.size();
      const double t = seconds_of([&] { sink += subjects[s].pass(order, now); });
      ns[s].push_back(t * per);
      ratio[s].push_back(t / f);
    }
  }

  // Two threads on distinct halves of the keys vs one thread on all of them.
  const auto scaling = [&](std::size_t s) {
    std::vector<const std::string*> lo(order.begin(),
                                       order.begin() + static_cast<long>(order.size() / 2));
    std::vector<const std::string*> hi(order.begin() + static_cast<long>(order.size() / 2),
                                       order.end());
    std::vector<double> out;
    for (int r = 0; r < std::max(3, rounds / 3); ++r) {
      std::int64_t n1 = now;
      const double one = seconds_of([&] { sink += subjects[s].pass(order, n1); });
      std::int64_t na = now;
      std::int64_t nb = now;
      const double two = seconds_of([&] {
        std::thread a([&] { sink += subjects[s].pass(lo, na); });
        sink += subjects[s].pass(hi, nb);
        a.join();
      });
      now = std::max({n1, na, nb});
      out.push_back(one / two);
    }
    return median(out);
  };

  std::printf("paired, %zu keys, %d rounds; medians; ratio = policy / floor in the same round\n\n",
              key_count, rounds);
  std::printf(
      "| check | ns/check | x floor | 2 threads / 1 (distinct keys) |\n|---|---|---|---|\n");
  std::printf("| floor: unordered_map find + increment | %.1f | 1.00 | - |\n", median(floor_ns));
  for (std::size_t s = 0; s < subjects.size(); ++s) {
    std::printf("| %s | %.1f | %.2f | %.2f |\n", subjects[s].name.c_str(), median(ns[s]),
                median(ratio[s]), scaling(s));
  }
  return sink == 42 ? 1 : 0;
}
