// SPDX-License-Identifier: Apache-2.0
// Paired benchmark: a lease acquire/release pair against a plain check of the same keys, as ratios.
//
// Keeps every limiter alive at once over the same keys (100,000 phone
// numbers, or one hot key with --keys 1), then for each round times, back to
// back and in rotating order: a pass of plain checks (fixed window, GCRA) and
// a pass of lease pairs (acquire then release of one lease id per key, alone
// and with a GCRA rate). Reports per subject the median time per operation
// (a pair counts as one) and the median over rounds of (pair / plain check)
// measured in the same round. Time is passed in, 10 us later per operation;
// every key stays held by its store (a plain check's state is never idle).
// The lease pairs run on keys without another lease, alone and with a GCRA
// rate, and on keys holding one more lease throughout ("in a call"); each
// again with the release given the acquire's lease_hint ("pair+hint").
// Then, with --memory, the heap bytes per key of 100,000 keys each holding
// one live lease (mallinfo2, glibc only).
//
// With --long-ids the lease ids are 44 bytes (a UUID Call-ID with a host
// part) instead of 9, beyond the 15 bytes a lease holds inline.
//
// With --lock-floor, two more subjects time the store's spin lock alone: one
// and two uncontended lock/unlock pairs per operation around an increment,
// the floor of a check and of a pair on one hot key (`--keys 1`), where the
// compare-and-swap waits for the previous unlock's store.
//
// Usage: ratelimit_leases_paired [--rounds N] [--keys N] [--memory] [--long-ids] [--lock-floor]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/ratelimit.hpp"

#if defined(__GLIBC__)  // defined by the standard headers above
#include <malloc.h>
#endif

namespace rl = ratelimit;
using clk = std::chrono::steady_clock;

namespace {

/// The lease ids: the one a key may already hold, and the pair's.
std::string id_held = "call-0000";
std::string id_pair = "call-0001";

using pass_fn = std::function<std::uint64_t(const std::vector<const std::string*>&, std::int64_t&)>;

struct subject {
  std::string name;
  pass_fn pass;
};

template <class P>
subject plain(std::string name, typename P::config cfg, const std::vector<std::string>& keys) {
  auto lim = std::make_shared<rl::limiter<P>>(std::move(cfg));
  for (const auto& k : keys) (void)lim->try_acquire(k, rl::timestamp{1'000'000'000});
  return {std::move(name), [lim](const std::vector<const std::string*>& order, std::int64_t& now) {
            std::uint64_t sum = 0;
            for (const std::string* k : order) {
              sum += static_cast<std::uint64_t>(lim->try_acquire(*k, rl::timestamp{now}).remaining);
              now += 10;
            }
            return sum;
          }};
}

/// With `in_call`, each key holds one more lease throughout (a subscriber
/// already in a call); without, the key's only lease is the pair's. Either
/// way every key is held by the store: all are inserted before any lease is
/// released, and a store drops idle keys only while inserting new ones.
/// With `hinted`, the release is given the hint its acquire filled
/// (rl::lease_hint), so that it does not hash the key again.
template <class Limiter>
subject pairs(std::string name, std::shared_ptr<Limiter> lim, const std::vector<std::string>& keys,
              bool in_call, bool hinted = false) {
  const rl::timestamp start{1'000'000'000};
  for (const auto& k : keys) (void)lim->acquire(k, id_held, start);
  if (!in_call) {
    for (const auto& k : keys) (void)lim->release(k, id_held, start);
  }
  if (hinted) {
    return {std::move(name),
            [lim](const std::vector<const std::string*>& order, std::int64_t& now) {
              std::uint64_t sum = 0;
              for (const std::string* k : order) {
                rl::lease_hint hint;
                sum += static_cast<std::uint64_t>(
                    lim->acquire(*k, id_pair, rl::timestamp{now}, hint).remaining);
                sum += static_cast<std::uint64_t>(
                    lim->release(*k, id_pair, rl::timestamp{now}, hint).allowed);
                now += 10;
              }
              return sum;
            }};
  }
  return {
      std::move(name), [lim](const std::vector<const std::string*>& order, std::int64_t& now) {
        std::uint64_t sum = 0;
        for (const std::string* k : order) {
          sum += static_cast<std::uint64_t>(
              lim->acquire(*k, id_pair, rl::timestamp{now}).remaining);
          sum += static_cast<std::uint64_t>(lim->release(*k, id_pair, rl::timestamp{now}).allowed);
          now += 10;
        }
        return sum;
      }};
}

/// `Locks` lock/unlock pairs of one spin lock per operation, each around an
/// increment: what a check (1) and a pair (2) cost on one hot key at least.
template <int Locks>
subject lock_floor(std::string name) {
  struct counted {
    rl::detail::spin_lock lock;
    std::uint64_t n = 0;
  };
  auto c = std::make_shared<counted>();
  return {std::move(name), [c](const std::vector<const std::string*>& order, std::int64_t& now) {
            for (std::size_t i = 0; i < order.size(); ++i) {
              for (int l = 0; l < Locks; ++l) {
                const std::lock_guard<rl::detail::spin_lock> guard(c->lock);
                ++c->n;
              }
              now += 10;
            }
            return c->n;
          }};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

#if defined(__GLIBC__)
std::size_t heap_in_use() {
  return mallinfo2().uordblks;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  std::size_t key_count = 100'000;
  bool memory = false;
  bool floor = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (a == "--keys" && i + 1 < argc) {
      key_count = static_cast<std::size_t>(std::atol(argv[++i]));
    } else if (a == "--memory") {
      memory = true;
    } else if (a == "--lock-floor") {
      floor = true;
    } else if (a == "--long-ids") {
      id_held = "a84c1f0e-7b21-4c55-9e0d-1f2a3b4c5d6f@10.0.0.5";
      id_pair = "a84c1f0e-7b21-4c55-9e0d-1f2a3b4c5d6e@10.0.0.5";
    } else {
      std::fprintf(stderr,
                   "usage: ratelimit_leases_paired [--rounds N] [--keys N] [--memory] [--long-ids] "
                   "[--lock-floor]\n");
      return 2;
    }
  }
  if (rounds < 1 || key_count < 1) {
    std::fprintf(stderr, "ratelimit_leases_paired: need --rounds >= 1 and --keys >= 1\n");
    return 2;
  }

  std::vector<std::string> keys;
  for (std::size_t i = 0; i < key_count; ++i)
    keys.push_back("+1555" + std::to_string(1'000'000 + i));
  std::vector<const std::string*> order;
  // A pass is at least 100,000 operations, whatever the key count.
  while (order.size() < 100'000) {
    for (const auto& k : keys) order.push_back(&k);
  }
  std::shuffle(order.begin(), order.end(), std::mt19937_64{0x5eed});

  // Limits that admit every check and keep every key's state busy (never
  // idle) for the whole run, so that every subject times held keys.
  const rl::fixed_window::config fixed_cfg{rl::rate{1'000'000'000, std::chrono::hours{1}}};
  const rl::gcra::config gcra_cfg{rl::rate{1, std::chrono::seconds{10}},
                                  rl::bucket_options{100'000'000, "calls"}};
  const rl::concurrency_config conc{5, std::chrono::hours{1}, {.name = "calls"}};
  std::vector<subject> subjects;
  subjects.push_back(plain<rl::fixed_window>("check: fixed_window", fixed_cfg, keys));
  subjects.push_back(plain<rl::gcra>("check: gcra", gcra_cfg, keys));
  subjects.push_back(
      pairs("pair: leases", std::make_shared<rl::concurrency_limiter<>>(conc), keys, false));
  subjects.push_back(pairs("pair: leases + gcra rate",
                           std::make_shared<rl::concurrency_limiter<rl::gcra>>(conc, gcra_cfg),
                           keys, false));
  subjects.push_back(pairs("pair: leases, in a call",
                           std::make_shared<rl::concurrency_limiter<>>(conc), keys, true));
  subjects.push_back(pairs("pair+hint: leases", std::make_shared<rl::concurrency_limiter<>>(conc),
                           keys, false, true));
  subjects.push_back(pairs("pair+hint: leases + gcra",
                           std::make_shared<rl::concurrency_limiter<rl::gcra>>(conc, gcra_cfg),
                           keys, false, true));
  subjects.push_back(pairs("pair+hint: in a call",
                           std::make_shared<rl::concurrency_limiter<>>(conc), keys, true, true));
  if (floor) {
    subjects.push_back(lock_floor<1>("floor: 1 lock/unlock"));
    subjects.push_back(lock_floor<2>("floor: 2 lock/unlock"));
  }

  std::vector<std::vector<double>> per_op(subjects.size());
  std::vector<std::vector<double>> vs_fixed(subjects.size());
  std::vector<std::vector<double>> vs_gcra(subjects.size());
  std::int64_t now = 2'000'000'000;
  std::uint64_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> took(subjects.size());
    for (std::size_t j = 0; j < subjects.size(); ++j) {
      const std::size_t s = (j + static_cast<std::size_t>(r)) % subjects.size();
      const auto start = clk::now();
      sink += subjects[s].pass(order, now);
      took[s] = std::chrono::duration<double>(clk::now() - start).count();
    }
    for (std::size_t s = 0; s < subjects.size(); ++s) {
      per_op[s].push_back(took[s] * 1e9 / static_cast<double>(order.size()));
      vs_fixed[s].push_back(took[s] / took[0]);
      vs_gcra[s].push_back(took[s] / took[1]);
    }
  }
  std::printf("%zu keys, %zu operations per pass, %d rounds (medians)\n", key_count, order.size(),
              rounds);
  std::printf("%-28s %10s %14s %12s\n", "subject", "ns/op", "x fixed_window", "x gcra");
  for (std::size_t s = 0; s < subjects.size(); ++s) {
    std::printf("%-28s %10.1f %14.2f %12.2f\n", subjects[s].name.c_str(), median(per_op[s]),
                median(vs_fixed[s]), median(vs_gcra[s]));
  }

#if defined(__GLIBC__)
  if (memory) {
    // Heap per key: 100,000 keys, each with one live lease, in a limiter of its own.
    std::vector<std::string> many;
    for (std::size_t i = 0; i < 100'000; ++i)
      many.push_back("+1555" + std::to_string(1'000'000 + i));
    const std::size_t before = heap_in_use();
    {
      auto lim = std::make_unique<rl::concurrency_limiter<>>(conc);
      for (const auto& k : many) (void)lim->acquire(k, "call-0001", rl::timestamp{1'000'000'000});
      const std::size_t one = heap_in_use();
      for (const auto& k : many) (void)lim->acquire(k, "call-0002", rl::timestamp{1'000'000'000});
      const std::size_t two = heap_in_use();
      std::printf(
          "in-process heap per key (12-byte key, 9-byte lease ids): one lease %.1f B, two "
          "leases %.1f B\n",
          static_cast<double>(one - before) / 1e5, static_cast<double>(two - before) / 1e5);
    }
  }
#endif
  std::printf("(checksum %llu)\n", static_cast<unsigned long long>(sink));
  return 0;
}
