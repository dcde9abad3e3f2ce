// SPDX-License-Identifier: Apache-2.0
// In-process A/B benchmark: a baseline tree's store and this tree's, alternated per round in one process, as paired ratios.
//
// Two binaries run one after the other on a shared machine differ by a
// third for reasons outside the code; here both stores live in one process,
// each round times the floor, then the baseline and the candidate back to
// back (in alternating order), and the report gives per policy the median
// and quartiles of candidate / baseline over rounds.
//
// Usage: ab_core [ROUNDS]   (built and run by run.sh)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

using pass_fn = std::function<double()>;
pass_fn make_baseline(const std::string&, const std::vector<std::string>&,
                      const std::vector<const std::string*>&);
pass_fn make_candidate(const std::string&, const std::vector<std::string>&,
                       const std::vector<const std::string*>&);

namespace {

std::string quartiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  char b[64];
  std::snprintf(b, sizeof b, "%.2f [%.2f-%.2f]", v[v.size() / 2], v[v.size() / 4],
                v[3 * v.size() / 4]);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  if (rounds < 1) return 2;
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < 100'000; ++i) keys.push_back("+1555" + std::to_string(1'000'000 + i));
  std::vector<const std::string*> order;
  for (const auto& k : keys) order.push_back(&k);
  std::shuffle(order.begin(), order.end(), std::mt19937_64{0x5eed});
  std::unordered_map<std::string, std::uint64_t> floor_map;
  for (const auto& k : keys) floor_map.emplace(k, 0);

  // The last reads the default clock on every check (limiter::try_acquire(key)).
  const std::vector<std::string> policies = {"fixed_window", "sliding_log", "sliding_counter",
                                             "token_bucket", "gcra",        "gcra, steady_clock"};
  std::vector<pass_fn> base;
  std::vector<pass_fn> cand;
  for (const auto& p : policies) {
    base.push_back(make_baseline(p, keys, order));
    cand.push_back(make_candidate(p, keys, order));
  }
  const std::size_t n = policies.size();
  std::vector<std::vector<double>> base_ratio(n), cand_ratio(n), paired(n);
  std::uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      const auto start = std::chrono::steady_clock::now();
      for (const std::string* k : order) sink += ++floor_map.find(*k)->second;
      const double floor_ns = std::chrono::duration<double, std::nano>(
                                  std::chrono::steady_clock::now() - start)
                                  .count() /
                              static_cast<double>(order.size());
      double b = 0;
      double c = 0;
      if (r % 2 == 0) {
        b = base[j]();
        c = cand[j]();
      } else {
        c = cand[j]();
        b = base[j]();
      }
      base_ratio[j].push_back(b / floor_ns);
      cand_ratio[j].push_back(c / floor_ns);
      paired[j].push_back(c / b);
    }
  }
  std::printf("%d rounds; median [quartiles]\n\n", rounds);
  std::printf("| policy | baseline x floor | candidate x floor | candidate / baseline |\n");
  std::printf("|---|---|---|---|\n");
  for (std::size_t j = 0; j < n; ++j) {
    std::printf("| %s | %s | %s | %s |\n", policies[j].c_str(), quartiles(base_ratio[j]).c_str(),
                quartiles(cand_ratio[j]).c_str(), quartiles(paired[j]).c_str());
  }
  return sink == 42 ? 1 : 0;
}
