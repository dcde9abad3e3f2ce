// SPDX-License-Identifier: Apache-2.0
// One pass of checks on existing keys, in a function of its own, for counting instructions per check under callgrind.
//
// Timings on a shared machine move by 2x; instruction and simulated cache
// miss counts do not. This program fills one policy's limiter (or the bare
// unordered_map floor) with the paired benchmark's phone-number keys, then
// runs one pass of checks over them in shuffled order inside `checks_pass`.
// Count that function alone and divide by the number of keys:
//
//   valgrind --tool=callgrind --toggle-collect='*checks_pass*' (one line)
//     build-bench/benchmarks/core/ratelimit_count_core sliding_log
//   callgrind_annotate callgrind.out.<pid> | grep 'PROGRAM TOTALS'
//
// Add `--cache-sim=yes` for simulated cache misses (give `--LL=` a size
// below the machine's L3, or every miss lands in a huge simulated LL).
//
// Usage: ratelimit_count_core POLICY [--keys N]
//   POLICY: floor fixed_window sliding_log sliding_counter token_bucket gcra
//           idempotent_new idempotent_repeat (checks with request ids through
//           idempotent_store<fixed_window>: new ids, or the last pass's again)
//           lease_pair (a lease acquire and its release per key, 9-byte
//           lease ids), lease_pair_long (44-byte ids), lease_pair_call (keys
//           holding one more lease), lease_pair_gcra (with a GCRA rate); each
//           also with the suffix _hint (the release given the acquire's
//           lease_hint)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ratelimit/ratelimit.hpp"

namespace rl = ratelimit;

namespace {

using key_order = std::vector<const std::string*>;

template <class Check>
[[gnu::noinline]] std::uint64_t checks_pass(const key_order& order, Check&& check) {
  std::uint64_t sum = 0;
  for (const std::string* k : order) sum += check(*k);
  return sum;
}

template <class P>
std::uint64_t run(typename P::config cfg, const std::vector<std::string>& keys,
                  const key_order& order) {
  rl::limiter<P> lim(std::move(cfg));
  std::int64_t now = 1'000'000'000;
  for (const auto& k : keys) (void)lim.try_acquire(k, rl::timestamp{now});
  return checks_pass(order, [&](const std::string& k) {
    now += 10;
    return static_cast<std::uint64_t>(lim.try_acquire(k, rl::timestamp{now}).remaining);
  });
}

/// Idempotent checks through idempotent_store<fixed_window>, as in
/// ratelimit_request_id_bench: a retention of one pass, three passes with new
/// ids first (so every key holds the ids of the last two passes, its steady
/// state), then the counted pass: new ids, or with `repeat` the last pass's
/// ids again at its times. Ids "a84c1f0e-<pass>-<i>@10.0.0.5;1 INVITE".
std::uint64_t run_idempotent(const std::vector<std::string>& keys, const key_order& order,
                             bool repeat) {
  const rl::fixed_window::config cfg{rl::rate{1'000'000, std::chrono::milliseconds{1}}};
  rl::limiter<rl::fixed_window, rl::idempotent_store<rl::fixed_window>> lim(cfg);
  const std::int64_t step = 10;
  lim.set_idempotency(
      {.retention = std::chrono::microseconds{static_cast<std::int64_t>(keys.size()) * step}});
  std::vector<std::string> ids(keys.size());
  std::int64_t now = 1'000'000'000;
  const auto pass_ids = [&](int pass) {
    for (std::size_t v = 0; v < order.size(); ++v)
      ids[v] = "a84c1f0e-" + std::to_string(pass) + "-" + std::to_string(v) + "@10.0.0.5;1 INVITE";
  };
  for (int pass = 0; pass < 3; ++pass) {
    pass_ids(pass);
    for (std::size_t v = 0; v < order.size(); ++v) {
      (void)lim.try_acquire(*order[v], rl::request_id{ids[v]}, rl::timestamp{now});
      now += step;
    }
  }
  if (repeat) {
    now -= static_cast<std::int64_t>(order.size()) * step;
  } else {
    pass_ids(3);
  }
  std::size_t v = 0;
  return checks_pass(order, [&](const std::string& k) {
    const rl::decision d = lim.try_acquire(k, rl::request_id{ids[v++]}, rl::timestamp{now});
    now += step;
    return static_cast<std::uint64_t>(d.remaining) + (d.repeat ? 1 : 0);
  });
}

/// Lease acquire/release pairs (5 leases per key, as in
/// ratelimit_leases_paired), on keys held by the store, after one pair per
/// key with the same id (as in that benchmark's later rounds, a long id's
/// heap block is then already there). `id` is the pair's lease id; `in_call`:
/// each key holds one more lease throughout; `hinted`: the release takes the
/// acquire's lease_hint. Counts one pair per key.
template <class Limiter>
std::uint64_t run_lease_pairs(Limiter& lim, const std::vector<std::string>& keys,
                              const key_order& order, const std::string& id, bool in_call,
                              bool hinted) {
  std::int64_t now = 1'000'000'000;
  for (const auto& k : keys) (void)lim.acquire(k, "call-0000", rl::timestamp{now});
  if (!in_call) {
    for (const auto& k : keys) (void)lim.release(k, "call-0000", rl::timestamp{now});
  }
  for (const auto& k : keys) {
    (void)lim.acquire(k, id, rl::timestamp{now});
    (void)lim.release(k, id, rl::timestamp{now});
  }
  if (hinted) {
    return checks_pass(order, [&](const std::string& k) {
      now += 10;
      rl::lease_hint hint;
      return static_cast<std::uint64_t>(lim.acquire(k, id, rl::timestamp{now}, hint).remaining) +
             static_cast<std::uint64_t>(lim.release(k, id, rl::timestamp{now}, hint).allowed);
    });
  }
  return checks_pass(order, [&](const std::string& k) {
    now += 10;
    return static_cast<std::uint64_t>(lim.acquire(k, id, rl::timestamp{now}).remaining) +
           static_cast<std::uint64_t>(lim.release(k, id, rl::timestamp{now}).allowed);
  });
}

/// POLICY lease_pair[_long|_call|_gcra][_hint] (see the usage above).
std::uint64_t run_lease_policy(std::string_view policy, const std::vector<std::string>& keys,
                               const key_order& order) {
  const rl::concurrency_config conc{5, std::chrono::hours{1}, {.name = "calls"}};
  const bool hinted = policy.ends_with("_hint");
  if (hinted) policy.remove_suffix(5);
  if (policy == "lease_pair_gcra") {
    rl::concurrency_limiter<rl::gcra> lim(
        conc, rl::gcra::config{rl::rate{1, std::chrono::seconds{10}},
                               rl::bucket_options{100'000'000, "calls"}});
    return run_lease_pairs(lim, keys, order, "call-0001", false, hinted);
  }
  rl::concurrency_limiter<> lim(conc);
  if (policy == "lease_pair_long") {
    return run_lease_pairs(lim, keys, order, "3f2b8c1e-9d4a-4e7b-a6c5-1b2d3e4f5a6b@10.0.0.5", false,
                           hinted);
  }
  return run_lease_pairs(lim, keys, order, "call-0001", policy == "lease_pair_call", hinted);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ratelimit_count_core POLICY [--keys N]\n");
    return 2;
  }
  const std::string_view policy = argv[1];
  std::size_t key_count = 100'000;
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--keys" && i + 1 < argc) {
      key_count = static_cast<std::size_t>(std::atol(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: ratelimit_count_core POLICY [--keys N]\n");
      return 2;
    }
  }

  std::vector<std::string> keys;
  for (std::size_t i = 0; i < key_count; ++i)
    keys.push_back("+1555" + std::to_string(1'000'000 + i));
  key_order order;
  for (const auto& k : keys) order.push_back(&k);
  std::shuffle(order.begin(), order.end(), std::mt19937_64{0x5eed});

  // The paired benchmark's configurations: nearly every check is admitted.
  const rl::rate fast{1'000'000, std::chrono::milliseconds{1}};
  std::uint64_t sum = 0;
  if (policy == "floor") {
    std::unordered_map<std::string, std::uint64_t> map;
    for (const auto& k : keys) map.emplace(k, 0);
    sum = checks_pass(order, [&](const std::string& k) { return ++map.find(k)->second; });
  } else if (policy == "fixed_window") {
    sum = run<rl::fixed_window>(rl::fixed_window::config{fast}, keys, order);
  } else if (policy == "sliding_log") {
    sum = run<rl::sliding_window_log>(rl::sliding_window_log::config{fast}, keys, order);
  } else if (policy == "sliding_counter") {
    sum = run<rl::sliding_window_counter>(rl::sliding_window_counter::config{fast}, keys, order);
  } else if (policy == "token_bucket") {
    sum = run<rl::token_bucket>(rl::token_bucket::config{fast}, keys, order);
  } else if (policy == "gcra") {
    sum = run<rl::gcra>(rl::gcra::config{rl::rate{1, std::chrono::microseconds{1}},
                                         rl::bucket_options{1'000'000'000}},
                        keys, order);
  } else if (policy.starts_with("lease_pair")) {
    sum = run_lease_policy(policy, keys, order);
  } else if (policy == "idempotent_new" || policy == "idempotent_repeat") {
    sum = run_idempotent(keys, order, policy == "idempotent_repeat");
  } else {
    std::fprintf(stderr, "ratelimit_count_core: unknown policy '%s'\n", argv[1]);
    return 2;
  }
  std::printf("%zu checks, sum %llu\n", order.size(), static_cast<unsigned long long>(sum));
  return 0;
}
