// SPDX-License-Identifier: Apache-2.0
// Paired benchmark: an idempotent check (limiter::try_acquire with a
// request_id) against a plain check of the same keys, interleaved in one
// process, as ratios; and the heap bytes an id costs in process.
//
// Two limiters of fixed_window "1000000/h" (never idle, never full in a run) hold the same 100,000 phone-number keys (12
// bytes). Each round times, back to back in alternating order, one pass of
// plain checks over every key and one pass of idempotent checks over every
// key, each with a request id of its own ("<Call-ID>;<CSeq> INVITE", 32 to 34
// bytes) and a retention of one round (1 s); caller-supplied time advances
// 10 us per check, so every check is admitted, each key is checked once a
// round with a new id, and the id table holds one live id per key plus the ended ones it
// has not dropped yet (up to one more retention). A third row retries: every
// key sends the id it just got again, at the same times (a repeat, answered
// from the id table without the store).
//
// Two more rows do the same through a third limiter whose store keeps each
// key's ids in the key's own node (idempotent_store<fixed_window>): a pass
// with new ids and a retry pass, in the same rounds, against the same plain
// pass.
//
// Reports, per row, the median over rounds of (row time / plain time) in the
// same round, and the median ns per check; then the heap bytes per id held
// (mallinfo2: the id's allocation, key and id bytes included, and its share
// of the bucket arrays), measured on a limiter whose keys are already held;
// and for idempotent_store, the heap bytes per key holding one id and
// holding two (its steady state here: the id just decided and the previous
// one, kept for one more retention) against a plain memory_store's.
//
// Usage: ratelimit_request_id_bench [--rounds N] [--keys N]
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

#if defined(__GLIBC__)  // defined by the standard headers above
#include <malloc.h>
#endif

namespace rl = ratelimit;
using clk = std::chrono::steady_clock;

namespace {

std::size_t heap_in_use() {
#if defined(__GLIBC__)
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  std::size_t key_count = 100'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else if (a == "--keys") {
      key_count = static_cast<std::size_t>(std::atoll(argv[i + 1]));
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N] [--keys N]\n", argv[0]);
      return 2;
    }
  }
  if (rounds < 1 || key_count < 1) return 2;

  std::vector<std::string> keys;
  for (std::size_t i = 0; i < key_count; ++i) {
    const std::string digits = std::to_string((i * 7919 + 1'234'567) % 10'000'000);
    keys.push_back("+1555" + std::string(7 - digits.size(), '0') + digits);
  }
  std::vector<std::size_t> order(key_count);
  for (std::size_t i = 0; i < key_count; ++i) order[i] = i;
  std::mt19937_64 rng(42);
  std::shuffle(order.begin(), order.end(), rng);

  const rl::fixed_window::config cfg{"1000000/h"};
  rl::limiter<rl::fixed_window> plain{cfg};
  rl::limiter<rl::fixed_window> once{cfg};
  using keyed_limiter = rl::limiter<rl::fixed_window, rl::idempotent_store<rl::fixed_window>>;
  keyed_limiter keyed{cfg};
  // Retention: one round (each key is checked once per round with a new id).
  const std::int64_t step = 10;
  once.set_idempotency(
      {.retention = std::chrono::microseconds{static_cast<std::int64_t>(key_count) * step}});
  keyed.set_idempotency(
      {.retention = std::chrono::microseconds{static_cast<std::int64_t>(key_count) * step}});

  // Ids per round: "a84c1f0e-<round>-<i>@10.0.0.5;1 INVITE".
  const auto id_of = [](int round, std::size_t i) {
    return "a84c1f0e-" + std::to_string(round) + "-" + std::to_string(i) + "@10.0.0.5;1 INVITE";
  };
  std::int64_t t_plain = 1'700'000'000'000'000;
  std::int64_t t_once = t_plain;
  std::int64_t t_keyed = t_plain;
  std::int64_t sink = 0;

  const auto pass_plain = [&] {
    const auto start = clk::now();
    for (std::size_t v = 0; v < key_count; ++v) {
      sink += plain.try_acquire(keys[order[v]], rl::timestamp{t_plain}, 1).remaining;
      t_plain += step;
    }
    return std::chrono::duration<double, std::nano>(clk::now() - start).count();
  };
  // The ids of one round in visiting order, in one buffer read front to back,
  // as ids arrive in requests (so the benchmark adds no cache miss of its own).
  const auto pass_once = [&](const std::vector<std::string_view>& ids) {
    const auto start = clk::now();
    for (std::size_t v = 0; v < key_count; ++v) {
      sink += once.try_acquire(keys[order[v]], rl::request_id{ids[v]}, rl::timestamp{t_once}, 1)
                  .remaining;
      t_once += step;
    }
    return std::chrono::duration<double, std::nano>(clk::now() - start).count();
  };
  // The same through idempotent_store; `retry` replays the times of the pass
  // before (every check a repeat).
  const auto pass_keyed = [&](const std::vector<std::string_view>& ids, bool retry,
                              std::size_t& repeated) {
    const std::int64_t t_saved = t_keyed;
    if (retry) t_keyed -= static_cast<std::int64_t>(key_count) * step;
    const auto start = clk::now();
    for (std::size_t v = 0; v < key_count; ++v) {
      const rl::decision d = keyed.try_acquire(keys[order[v]], rl::request_id{ids[v]},
                                               rl::timestamp{t_keyed}, 1);
      repeated += d.repeat ? 1 : 0;
      sink += d.remaining;
      t_keyed += step;
    }
    const double ns = std::chrono::duration<double, std::nano>(clk::now() - start).count();
    t_keyed = std::max(t_keyed, t_saved);
    return ns;
  };

  // Warm up both: every key held, the id table at its steady size.
  std::vector<std::string_view> ids(key_count);
  std::string id_bytes;
  const auto make_ids = [&](int round) {
    id_bytes.clear();
    std::vector<std::size_t> ends;
    for (std::size_t v = 0; v < key_count; ++v) {
      id_bytes += id_of(round, order[v]);
      ends.push_back(id_bytes.size());
    }
    for (std::size_t v = 0; v < key_count; ++v) {
      const std::size_t begin = v == 0 ? 0 : ends[v - 1];
      ids[v] = std::string_view(id_bytes).substr(begin, ends[v] - begin);
    }
  };
  for (int w = 0; w < 3; ++w) {
    make_ids(-1 - w);
    (void)pass_once(ids);
    std::size_t ignored = 0;
    (void)pass_keyed(ids, false, ignored);
    (void)pass_plain();
  }
  std::vector<double> new_ratio, retry_ratio, plain_ns, new_ns, retry_ns;
  std::vector<double> keyed_ratio, keyed_retry_ratio, keyed_ns, keyed_retry_ns;
  std::size_t repeats = 0;
  std::size_t keyed_repeats = 0;
  std::size_t keyed_new_repeats = 0;
  for (int r = 0; r < rounds; ++r) {
    make_ids(r);
    const bool plain_first = r % 2 == 0;
    double p = 0;
    double n = 0;
    double kn = 0;
    if (plain_first) p = pass_plain();
    if (r % 4 < 2) {
      n = pass_once(ids);
      kn = pass_keyed(ids, false, keyed_new_repeats);
    } else {
      kn = pass_keyed(ids, false, keyed_new_repeats);
      n = pass_once(ids);
    }
    if (!plain_first) p = pass_plain();
    const double km = pass_keyed(ids, true, keyed_repeats);
    // Retry pass: every key sends the id it just got again (a repeat).
    const std::int64_t t_saved = t_once;
    t_once -= static_cast<std::int64_t>(key_count) * step;  // the same times again: within 1 s
    const auto start = clk::now();
    for (std::size_t v = 0; v < key_count; ++v) {
      const rl::decision d = once.try_acquire(keys[order[v]], rl::request_id{ids[v]},
                                              rl::timestamp{t_once}, 1);
      repeats += d.repeat ? 1 : 0;
      sink += d.remaining;
      t_once += step;
    }
    const double m = std::chrono::duration<double, std::nano>(clk::now() - start).count();
    t_once = std::max(t_once, t_saved);
    const double per = static_cast<double>(key_count);
    new_ratio.push_back(n / p);
    retry_ratio.push_back(m / p);
    plain_ns.push_back(p / per);
    new_ns.push_back(n / per);
    retry_ns.push_back(m / per);
    keyed_ratio.push_back(kn / p);
    keyed_retry_ratio.push_back(km / p);
    keyed_ns.push_back(kn / per);
    keyed_retry_ns.push_back(km / per);
  }
  std::printf("ids held: %zu, longest probe %zu\n", once.request_ids_held(),
              once.request_id_table()->longest_probe());
  // Heap per id: a limiter whose keys are all held, then one id per key.
  std::size_t held = 0;
  double per_id = 0;
  {
    rl::limiter<rl::fixed_window> m{cfg};
    m.set_idempotency({.retention = std::chrono::hours{1}});
    const rl::timestamp t{1'700'000'000'000'000};
    for (const std::string& k : keys) (void)m.try_acquire(k, t, 1);
    const std::size_t before = heap_in_use();
    for (std::size_t i = 0; i < key_count; ++i) {
      (void)m.try_acquire(keys[order[i]], rl::request_id{ids[i]}, t, 1);
    }
    held = m.request_ids_held();
    per_id = static_cast<double>(heap_in_use() - before) / static_cast<double>(held);
  }
  // Heap per key: a plain memory_store, idempotent_store with one id per key
  // and with two (the second a retention later, the first still held).
  double plain_per_key = 0;
  double keyed_one = 0;
  double keyed_two = 0;
  {
    const rl::timestamp t{1'700'000'000'000'000};
    const double n = static_cast<double>(key_count);
    std::size_t before = heap_in_use();
    {
      rl::limiter<rl::fixed_window> m{cfg};
      for (const std::string& k : keys) (void)m.try_acquire(k, t, 1);
      plain_per_key = static_cast<double>(heap_in_use() - before) / n;
    }
    before = heap_in_use();
    keyed_limiter m{cfg};
    m.set_idempotency({.retention = std::chrono::hours{1}});
    for (std::size_t i = 0; i < key_count; ++i) {
      (void)m.try_acquire(keys[order[i]], rl::request_id{ids[i]}, t, 1);
    }
    keyed_one = static_cast<double>(heap_in_use() - before) / n;
    make_ids(rounds + 1);
    for (std::size_t i = 0; i < key_count; ++i) {
      (void)m.try_acquire(keys[order[i]], rl::request_id{ids[i]}, t + std::chrono::hours{1}, 1);
    }
    keyed_two = static_cast<double>(heap_in_use() - before) / n;
  }

  std::printf("ratelimit_request_id_bench: %zu keys, fixed window 1000000/h, %d rounds (medians)\n",
              key_count, rounds);
  std::printf("%-44s %10s %12s\n", "row", "ns/check", "vs plain");
  std::printf("%-44s %10.1f %12s\n", "plain try_acquire(key, now)", median(plain_ns), "1.00x");
  std::printf("%-44s %10.1f %11.2fx\n", "try_acquire(key, id, now), every id new", median(new_ns),
              median(new_ratio));
  std::printf("%-44s %10.1f %11.2fx\n", "try_acquire(key, id, now), retries (repeats)",
              median(retry_ns), median(retry_ratio));
  std::printf("%-44s %10.1f %11.2fx\n", "idempotent_store: every id new", median(keyed_ns),
              median(keyed_ratio));
  std::printf("%-44s %10.1f %11.2fx\n", "idempotent_store: retries (repeats)",
              median(keyed_retry_ns), median(keyed_retry_ratio));
  std::printf(
      "repeats answered: %zu of %zu retry-pass checks (idempotent_store: %zu; "
      "%zu new-id checks seen as repeats)\n",
      repeats, static_cast<std::size_t>(rounds) * key_count, keyed_repeats, keyed_new_repeats);
  std::printf("heap per id held (%zu ids, 12-byte keys, ids of %zu bytes): %.1f B\n", held,
              ids[0].size(), per_id);
  std::printf(
      "heap per key: memory_store %.1f B; idempotent_store with 1 id %.1f B, "
      "with 2 ids %.1f B\n",
      plain_per_key, keyed_one, keyed_two);
  return sink == 42 ? 1 : 0;
}
