// SPDX-License-Identifier: Apache-2.0
// ratelimit-compare's Redis measurements: checks/s one at a time and in batches, and memory per key.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/redis.hpp"

namespace ratelimit::compare {

/// How much Redis work one policy gets.
struct redis_plan {
  int rounds = 3;                   ///< throughput rounds; the median is reported
  std::size_t keys = 10'000;        ///< distinct 16-byte keys the checks cycle through
  std::size_t sequential = 5'000;   ///< checks per round, one round trip each
  std::size_t batched = 50'000;     ///< checks per round, in batches of `batch`
  std::size_t batch = 100;          ///< checks per apply_batch (one round trip)
  std::size_t memory_keys = 2'000;  ///< fresh keys checked once for the memory figures
  std::size_t usage_keys = 100;     ///< of those, keys asked MEMORY USAGE
};

/// One policy's Redis figures (unset = not measured).
struct redis_figures {
  std::optional<double> sequential;    ///< checks/s, one connection, one check per round trip
  std::optional<double> batched;       ///< checks/s, one connection, apply_batch of plan.batch
  std::optional<double> memory_usage;  ///< mean MEMORY USAGE ... SAMPLES 0 of a key after one check
  std::optional<double> used_memory;   ///< INFO used_memory growth per fresh key after one check
};

namespace detail {

/// 16-byte phone-number keys "+<lead><11 digits>", as benchmarks/redis uses.
[[nodiscard]] inline std::vector<std::string> redis_keys(std::size_t n, int lead) {
  std::vector<std::string> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "+%d%011zu", lead, i % 100'000'000'000u);
    out.emplace_back(buf);
  }
  return out;
}

[[nodiscard]] inline redis::reply_ptr run_command(const redis::options& o,
                                                  std::span<const std::string_view> args) {
  redis::connection c(o);
  return c.command(args.data(), args.size(),
                   redis::deadline_clock::now() + std::chrono::seconds(10));
}

/// `used_memory` from INFO memory.
/// @throws store_error when the reply has none
[[nodiscard]] inline long long used_memory(const redis::options& o) {
  const std::string_view args[] = {"INFO", "memory"};
  const redis::reply_ptr r = run_command(o, args);
  if (r->type == REDIS_REPLY_STRING) {
    const std::string_view text(r->str, r->len);
    constexpr std::string_view field = "used_memory:";
    for (std::size_t at = text.find(field); at != std::string_view::npos;
         at = text.find(field, at + 1)) {
      if (at != 0 && text[at - 1] != '\n') continue;
      long long v = 0;
      std::size_t i = at + field.size();
      bool any = false;
      for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
        v = v * 10 + (text[i] - '0');
        any = true;
      }
      if (any) return v;
    }
  }
  throw store_error("ratelimit-compare: INFO memory gave no used_memory");
}

[[nodiscard]] inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace detail

/// A key prefix unique to this run ("rl:compare:<pid>:<us>:"), so the
/// measurement never reads state an earlier run left.
[[nodiscard]] inline std::string run_prefix() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return "rl:compare:" + std::to_string(::getpid()) + ":" + std::to_string(us) + ":";
}

/// Measures policy P's config `cfg` on the server `o` (whose prefix must be
/// this run's): throughput at the server's TIME on plan.keys keys, then the
/// memory of plan.memory_keys fresh keys after one check each.
/// @throws store_error (connection, timeout, script) from the store
template <class P>
redis_figures measure_redis(const redis::options& o, const typename P::config& cfg,
                            const redis_plan& plan) {
  using clk = std::chrono::steady_clock;
  redis_figures f;
  redis::options one = o;
  one.pool_size = 1;
  redis::redis_store store(one);
  store.ping();
  const std::vector<std::string> keys = detail::redis_keys(plan.keys, 1555);
  // Load the script and connect outside the timing.
  (void)store.apply(cfg, keys.front(), store_time, 1, access::consume);

  std::vector<double> seq;
  std::vector<double> bat;
  std::size_t next = 0;
  std::vector<redis::batch_item> items(plan.batch);
  for (int r = 0; r < plan.rounds; ++r) {
    auto start = clk::now();
    for (std::size_t i = 0; i < plan.sequential; ++i) {
      (void)store.apply(cfg, keys[next++ % keys.size()], store_time, 1, access::consume);
    }
    double s = std::chrono::duration<double>(clk::now() - start).count();
    seq.push_back(s > 0 ? static_cast<double>(plan.sequential) / s : 0.0);

    std::size_t done = 0;
    start = clk::now();
    while (done < plan.batched) {
      const std::size_t n = std::min(plan.batch, plan.batched - done);
      for (std::size_t i = 0; i < n; ++i) items[i].key = keys[next++ % keys.size()];
      (void)store.apply_batch(cfg, std::span<const redis::batch_item>(items.data(), n), store_time);
      done += n;
    }
    s = std::chrono::duration<double>(clk::now() - start).count();
    bat.push_back(s > 0 ? static_cast<double>(plan.batched) / s : 0.0);
  }
  f.sequential = detail::median_of(seq);
  f.batched = detail::median_of(bat);

  if (plan.memory_keys > 0) {
    const std::vector<std::string> fresh = detail::redis_keys(plan.memory_keys, 1999);
    const long long before = detail::used_memory(one);
    for (const std::string& k : fresh) (void)store.apply(cfg, k, store_time, 1, access::consume);
    const long long after = detail::used_memory(one);
    if (after > before) {
      f.used_memory = static_cast<double>(after - before) / static_cast<double>(fresh.size());
    }
    redis::connection c(one);
    double sum = 0;
    std::size_t counted = 0;
    for (std::size_t i = 0; i < std::min(plan.usage_keys, fresh.size()); ++i) {
      const std::string key = store.key_for(cfg, fresh[i]);
      const std::string_view args[] = {"MEMORY", "USAGE", key, "SAMPLES", "0"};
      const redis::reply_ptr r = c.command(args, 5,
                                           redis::deadline_clock::now() + std::chrono::seconds(10));
      if (r->type == REDIS_REPLY_INTEGER) {
        sum += static_cast<double>(r->integer);
        ++counted;
      }
    }
    if (counted > 0) f.memory_usage = sum / static_cast<double>(counted);
  }
  return f;
}

/// Deletes every key under `o.prefix` (SCAN MATCH, then DEL), so a run
/// against a server of the user's leaves nothing behind.
/// @throws store_error when the server cannot be reached
inline void delete_prefix(const redis::options& o) {
  redis::connection c(o);
  const std::string pattern = o.prefix + "*";
  std::string cursor = "0";
  const auto deadline = [] { return redis::deadline_clock::now() + std::chrono::seconds(10); };
  do {
    const std::string_view scan[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
    const redis::reply_ptr r = c.command(scan, 6, deadline());
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
      throw store_error("ratelimit-compare: unexpected SCAN reply");
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* found = r->element[1];
    if (found->elements > 0) {
      std::vector<std::string_view> del{"DEL"};
      for (std::size_t i = 0; i < found->elements; ++i) {
        del.emplace_back(found->element[i]->str, found->element[i]->len);
      }
      (void)c.command(del.data(), del.size(), deadline());
    }
  } while (cursor != "0");
}

}  // namespace ratelimit::compare
