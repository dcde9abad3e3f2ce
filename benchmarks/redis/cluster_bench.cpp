// SPDX-License-Identifier: Apache-2.0
// Checks per second of the cluster store against a 3-master Redis Cluster and
// of redis_store against one Redis, same workload: sequential, pooled threads,
// batches of 100; and the cluster store's async checks from one thread with
// 256 in flight (per-node multiplexers) against its blocking sequential checks.
//
// The cluster comes from $RATELIMIT_BENCH_CLUSTER_URL (redis-cluster://...),
// the single server from $RATELIMIT_BENCH_REDIS_URL (redis://...);
// benchmarks/redis/run_cluster.sh starts both and prints the medians.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <semaphore>
#include <string>
#include <vector>

#include "phone_keys.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "ratelimit/redis/cluster_store.hpp"

namespace {

using namespace ratelimit;

constexpr std::size_t pool_per_node = 16;

redis::redis_store& single() {
  static redis::redis_store store([] {
    const char* url = std::getenv("RATELIMIT_BENCH_REDIS_URL");
    redis::options o = redis::parse_url(url != nullptr ? url : "redis://127.0.0.1:6379");
    o.pool_size = pool_per_node;
    o.command_timeout = std::chrono::milliseconds(2000);
    o.prefix = "bench:";
    return o;
  }());
  return store;
}

redis::cluster_store& cluster() {
  static redis::cluster_store store([] {
    const char* url = std::getenv("RATELIMIT_BENCH_CLUSTER_URL");
    redis::cluster_options o = redis::parse_cluster_url(
        url != nullptr ? url : "redis-cluster://127.0.0.1:7000");
    o.node.pool_size = pool_per_node;
    o.node.command_timeout = std::chrono::milliseconds(2000);
    o.node.prefix = "bench:";
    return o;
  }());
  return store;
}

using ratelimit_bench::phones;

template <class Store>
void checks(benchmark::State& state, Store& shared) {
  Store store = shared;  // a copy per thread, as an application would hold
  const gcra::config cfg("10/15min", bucket_options{.name = "t"});
  const auto& keys = phones();
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 997;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        store.apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume));
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

template <class Store>
void batches(benchmark::State& state, Store& shared) {
  Store store = shared;
  const gcra::config cfg("10/15min", bucket_options{.name = "t"});
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

void BM_Gcra_RedisStore_Pool(benchmark::State& s) {
  checks(s, single());
}
void BM_Gcra_ClusterStore_Pool(benchmark::State& s) {
  checks(s, cluster());
}
void BM_Gcra_RedisStore_Batch100(benchmark::State& s) {
  batches(s, single());
}
void BM_Gcra_ClusterStore_Batch100(benchmark::State& s) {
  batches(s, cluster());
}

/// A cluster store of its own with `multiplex` connections per node.
redis::cluster_store multiplexed_cluster(std::size_t multiplex) {
  redis::cluster_options o = cluster().get_options();
  o.node.multiplex = multiplex;
  return redis::cluster_store(o);
}

// One thread keeping 256 async checks in flight over the masters (arg:
// connections per node). Every check must be decided by Redis.
void BM_Gcra_ClusterStore_Async256(benchmark::State& state) {
  redis::cluster_store store = multiplexed_cluster(static_cast<std::size_t>(state.range(0)));
  const gcra::config cfg("10/15min", bucket_options{.name = "t"});
  const auto& keys = phones();
  store.refresh_topology();
  std::counting_semaphore<256> slots(256);
  std::atomic<std::int64_t> failed{0};
  std::size_t i = 0;
  for (auto _ : state) {
    slots.acquire();
    store.async_apply(cfg, keys[i++ % keys.size()], store_time, 1, access::consume,
                      [&](decision d, std::exception_ptr e) {
                        if (e || d.source != decision_source::store) {
                          failed.fetch_add(1, std::memory_order_relaxed);
                        }
                        slots.release();
                      });
  }
  for (int k = 0; k < 256; ++k) slots.acquire();  // every check completed
  if (failed.load() != 0) state.SkipWithError("async checks not decided by Redis");
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

// Blocking single checks through the per-node multiplexers (one connection
// per node), from 1 or 16 threads sharing one store.
void BM_Gcra_ClusterStore_Multiplexed(benchmark::State& state) {
  static redis::cluster_store shared = multiplexed_cluster(1);
  checks(state, shared);
}

BENCHMARK(BM_Gcra_RedisStore_Pool)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(BM_Gcra_ClusterStore_Pool)->ThreadRange(1, 16)->UseRealTime();
BENCHMARK(BM_Gcra_ClusterStore_Async256)->ArgName("conns")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Gcra_ClusterStore_Multiplexed)->Threads(1)->Threads(16)->UseRealTime();
BENCHMARK(BM_Gcra_RedisStore_Batch100)->ThreadRange(1, 4)->UseRealTime();
BENCHMARK(BM_Gcra_ClusterStore_Batch100)->ThreadRange(1, 4)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
