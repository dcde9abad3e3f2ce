// SPDX-License-Identifier: Apache-2.0
// Checks per second of the Redis store: sequential, pooled threads, batched;
// plus `--memory` (MEMORY USAGE per key), `--print-script POLICY` and
// `--latency` (async checks: p50/p99 at 50% and 90% of the maximum).
//
// The server comes from $RATELIMIT_BENCH_REDIS_URL (default redis://127.0.0.1:6379);
// benchmarks/redis/run.sh starts a throwaway one and compares with redis-benchmark.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <semaphore>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "phone_keys.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"

namespace {

using namespace ratelimit;

redis::options bench_options(std::size_t pool) {
  const char* url = std::getenv("RATELIMIT_BENCH_REDIS_URL");
  redis::options o = redis::parse_url(url != nullptr ? url : "redis://127.0.0.1:6379");
  o.pool_size = pool;
  o.command_timeout = std::chrono::milliseconds(2000);
  o.prefix = "bench:";
  return o;
}

using ratelimit_bench::phones;

template <class P>
typename P::config bench_config() {
  if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
    return typename P::config("10/15min", bucket_options{.name = "bench"});
  } else {
    return typename P::config("10/15min", window_options{.name = "bench"});
  }
}

template <class P>
void sequential(benchmark::State& state) {
  redis::redis_store store(bench_options(1));
  const auto cfg = bench_config<P>();
  const auto& keys = phones();
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        store.apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

redis::redis_store& shared_pool() {
  static redis::redis_store store(bench_options(16));
  return store;
}

void BM_Gcra_RedisStore_Pool(benchmark::State& state) {
  redis::redis_store store = shared_pool();
  const auto cfg = bench_config<gcra>();
  const auto& keys = phones();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 997;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        store.apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

/// A store whose single checks share `conns` multiplexed connections;
/// with `lead`, blocking checks drive their connection (multiplex_lead).
redis::redis_store& mux_store(std::size_t conns, bool lead = false) {
  const auto make = [](std::size_t n, bool l) {
    redis::options o = bench_options(1);
    o.multiplex = n;
    o.multiplex_lead = l;
    return redis::redis_store(o);
  };
  // One store per (connections, lead), made on first use and kept: the
  // benchmark's threads share it.
  static std::mutex m;
  static std::map<std::pair<std::size_t, bool>, std::unique_ptr<redis::redis_store>> stores;
  const std::lock_guard<std::mutex> lock(m);
  auto& s = stores[{conns, lead}];
  if (s == nullptr) s = std::make_unique<redis::redis_store>(make(conns, lead));
  return *s;
}

// Blocking single checks from N threads through the multiplexer (arg:
// connections); MuxLead: the same with options::multiplex_lead.
template <bool Lead>
void gcra_mux(benchmark::State& state) {
  redis::redis_store store = mux_store(static_cast<std::size_t>(state.range(0)), Lead);
  const auto cfg = bench_config<gcra>();
  const auto& keys = phones();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 997;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        store.apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_Gcra_RedisStore_Mux(benchmark::State& state) {
  gcra_mux<false>(state);
}
void BM_Gcra_RedisStore_MuxLead(benchmark::State& state) {
  gcra_mux<true>(state);
}

// One thread, blocking single checks through one multiplexed connection;
// MuxLeadSequential: the same with options::multiplex_lead.
template <bool Lead>
void gcra_mux_sequential(benchmark::State& state) {
  redis::options o = bench_options(1);
  o.multiplex = 1;
  o.multiplex_lead = Lead;
  redis::redis_store store(o);
  const auto cfg = bench_config<gcra>();
  const auto& keys = phones();
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        store.apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

void BM_Gcra_RedisStore_MuxSequential(benchmark::State& state) {
  gcra_mux_sequential<false>(state);
}
void BM_Gcra_RedisStore_MuxLeadSequential(benchmark::State& state) {
  gcra_mux_sequential<true>(state);
}

// One thread keeping 256 async checks in flight (arg: connections).
void BM_Gcra_RedisStore_Async256(benchmark::State& state) {
  redis::options o = bench_options(1);
  o.multiplex = static_cast<std::size_t>(state.range(0));
  redis::redis_store store(o);
  const auto cfg = bench_config<gcra>();
  const auto& keys = phones();
  std::counting_semaphore<256> slots(256);
  std::atomic<std::int64_t> failed{0};
  std::size_t i = 0;
  for (auto _ : state) {
    slots.acquire();
    store.async_apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume,
                      [&](decision, std::exception_ptr e) {
                        if (e) failed.fetch_add(1, std::memory_order_relaxed);
                        slots.release();
                      });
  }
  for (int k = 0; k < 256; ++k) slots.acquire();  // every check completed
  if (failed.load() != 0) state.SkipWithError("async checks failed");
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

template <class P>
void batched(benchmark::State& state) {
  redis::redis_store store = shared_pool();
  const auto cfg = bench_config<P>();
  const auto& keys = phones();
  std::vector<redis::batch_item> items(100);
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 3331;
  for (auto _ : state) {
    for (auto& it : items) it.key = keys[i++ % keys.size()];
    benchmark::DoNotOptimize(
        store.apply_batch(cfg, std::span<const redis::batch_item>(items), store_time));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * 100);
}

void BM_FixedWindow_RedisStore_Sequential(benchmark::State& s) {
  sequential<fixed_window>(s);
}
void BM_SlidingLog_RedisStore_Sequential(benchmark::State& s) {
  sequential<sliding_window_log>(s);
}
void BM_SlidingCounter_RedisStore_Sequential(benchmark::State& s) {
  sequential<sliding_window_counter>(s);
}
void BM_TokenBucket_RedisStore_Sequential(benchmark::State& s) {
  sequential<token_bucket>(s);
}
void BM_Gcra_RedisStore_Sequential(benchmark::State& s) {
  sequential<gcra>(s);
}
void BM_Gcra_RedisStore_Batch100(benchmark::State& s) {
  batched<gcra>(s);
}
void BM_FixedWindow_RedisStore_Batch100(benchmark::State& s) {
  batched<fixed_window>(s);
}

BENCHMARK(BM_FixedWindow_RedisStore_Sequential)->UseRealTime();
BENCHMARK(BM_SlidingLog_RedisStore_Sequential)->UseRealTime();
BENCHMARK(BM_SlidingCounter_RedisStore_Sequential)->UseRealTime();
BENCHMARK(BM_TokenBucket_RedisStore_Sequential)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_Sequential)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_Pool)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_MuxSequential)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_MuxLeadSequential)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_Mux)
    ->ArgName("conns")
    ->Arg(1)
    ->Arg(2)
    ->ThreadRange(1, 16)
    ->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_MuxLead)
    ->ArgName("conns")
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->ThreadRange(1, 16)
    ->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_Async256)->ArgName("conns")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_Batch100)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK(BM_FixedWindow_RedisStore_Batch100)->ThreadRange(1, 4)->UseRealTime();

/// MEMORY USAGE of one key per policy at 10/15min with a 16-byte phone key.
template <class P>
void memory_of(redis::redis_store& store, const redis::options& o, units calls) {
  const auto cfg = bench_config<P>();
  const std::string phone = "+15551234567890x";  // 16 bytes
  store.reset(cfg, phone);
  for (units i = 0; i < calls; ++i) (void)store.apply(cfg, phone, store_time, 1, access::consume);
  redis::connection c(o);
  const std::string key = store.key_for(cfg, phone);
  const std::string_view args[] = {"MEMORY", "USAGE", key, "SAMPLES", "0"};
  auto r = c.command(args, 5, redis::deadline_clock::now() + std::chrono::seconds(2));
  std::cout << P::name << " after " << calls << " checks: key \"" << key << "\" "
            << (r->type == REDIS_REPLY_INTEGER ? r->integer : -1) << " bytes\n";
}

/// MEMORY USAGE of a lease set with `live` leases (16-byte phone key, ids of
/// 36 bytes like a SIP Call-ID), and of the rate key a GCRA rate adds.
void memory_of_leases(const redis::options& o, int live) {
  const std::string phone = "+15551234567890x";  // 16 bytes
  concurrency_limiter<gcra, redis::redis_store, redis::server_clock> calls{
      concurrency_config{10, std::chrono::hours{2}, concurrency_options{.name = "calls"}},
      gcra::config{"10/15min", bucket_options{.name = "calls"}}, redis::redis_store{o}};
  calls.reset(phone);
  for (int i = 0; i < live; ++i) {
    std::string id = "a84b4c76e66710" + std::to_string(1000 + i) + "@pc33.atlanta.example";
    id.resize(36, 'x');
    (void)calls.acquire(phone, id);
  }
  const leases<gcra>::config req(calls.settings(), lease_op::none, {});
  const auto keys = redis::redis_store{o}.keys_for(req, phone);
  redis::connection c(o);
  for (const std::string& key : keys) {
    const std::string_view args[] = {"MEMORY", "USAGE", key, "SAMPLES", "0"};
    auto r = c.command(args, 5, redis::deadline_clock::now() + std::chrono::seconds(2));
    std::cout << "leases, " << live << " live: key \"" << key << "\" "
              << (r->type == REDIS_REPLY_INTEGER ? r->integer : -1) << " bytes\n";
  }
}

}  // namespace

/// `--latency`: async checks through one multiplexed connection. First the
/// most checks/s one thread reaches with 256 in flight (2 s), then an open
/// loop at 50% and 90% of it (3 s each; a check is due at its scheduled time,
/// so a late start counts in its latency): p50 and p99 from the due time to
/// the handler.
int latency() {
  redis::options o = bench_options(1);
  o.multiplex = 1;
  redis::redis_store store(o);
  const auto cfg = bench_config<gcra>();
  const auto& keys = phones();
  using clk = std::chrono::steady_clock;
  double max_rate = 0;
  {
    std::counting_semaphore<256> slots(256);
    std::size_t i = 0;
    const auto start = clk::now();
    while (clk::now() - start < std::chrono::seconds(2)) {
      slots.acquire();
      store.async_apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume,
                        [&](decision, std::exception_ptr) { slots.release(); });
    }
    for (int k = 0; k < 256; ++k) slots.acquire();
    max_rate = static_cast<double>(i) / std::chrono::duration<double>(clk::now() - start).count();
  }
  std::printf("max %.0f checks/s (one thread, 256 in flight)\n", max_rate);
  for (const double share : {0.5, 0.9}) {
    const double rate = max_rate * share;
    const auto n = static_cast<std::size_t>(rate * 3);
    std::vector<std::int64_t> took(n, -1);
    std::atomic<std::size_t> done{0};
    std::atomic<std::size_t> failed{0};
    const auto start = clk::now();
    for (std::size_t i = 0; i < n; ++i) {
      const auto due = start + std::chrono::nanoseconds(
                                   static_cast<std::int64_t>(1e9 * static_cast<double>(i) / rate));
      // Sleep rather than spin: on 2 cores a spinning thread would take the
      // I/O thread's and the server's time. Checks due meanwhile go out together.
      if (clk::now() < due) std::this_thread::sleep_until(due);
      store.async_apply(
          cfg, keys[i % keys.size()], store_time, 1, access::consume,
          [&, i, due](decision, std::exception_ptr e) {
            took[i] =
                std::chrono::duration_cast<std::chrono::microseconds>(clk::now() - due).count();
            if (e) failed.fetch_add(1);
            done.fetch_add(1, std::memory_order_release);
          });
    }
    while (done.load(std::memory_order_acquire) != n) std::this_thread::yield();
    std::sort(took.begin(), took.end());
    std::printf("%.0f%% of max (%.0f checks/s): p50 %lld us, p99 %lld us, %zu failed\n",
                share * 100, rate, static_cast<long long>(took[n / 2]),
                static_cast<long long>(took[n * 99 / 100]), failed.load());
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--latency") == 0) return latency();
  if (argc >= 2 && std::strcmp(argv[1], "--memory") == 0) {
    const auto o = bench_options(1);
    redis::redis_store store(o);
    memory_of<fixed_window>(store, o, 3);
    memory_of<token_bucket>(store, o, 3);
    memory_of<gcra>(store, o, 3);
    memory_of<sliding_window_counter>(store, o, 3);
    memory_of<sliding_window_log>(store, o, 3);
    memory_of<sliding_window_log>(store, o, 10);
    for (const int live : {1, 3, 5}) memory_of_leases(o, live);
    return 0;
  }
  if (argc >= 3 && std::strcmp(argv[1], "--print-script") == 0) {
    const std::string_view p = argv[2];
    if (p == "gcra")
      std::cout << redis::script_for<gcra>::text;
    else if (p == "fixed_window")
      std::cout << redis::script_for<fixed_window>::text;
    else if (p == "token_bucket")
      std::cout << redis::script_for<token_bucket>::text;
    else if (p == "sliding_counter")
      std::cout << redis::script_for<sliding_window_counter>::text;
    else if (p == "sliding_log")
      std::cout << redis::script_for<sliding_window_log>::text;
    else
      return 2;
    return 0;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
