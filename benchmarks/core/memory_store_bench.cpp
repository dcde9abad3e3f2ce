// SPDX-License-Identifier: Apache-2.0
// Cost of one in-process check for every policy on memory_store, next to a bare std::unordered_map floor.
//
// Cases (BENCHMARK_CAPTURE names):
//   hot_key_now         1 key, caller-supplied time advancing 10 us per check, admitted
//   hot_key_clock       1 key, the limiter's default steady_clock, admitted
//   many_keys_now       100,000 existing keys in shuffled order, time passed in, admitted
//   many_keys_clock     100,000 existing keys, default steady_clock, admitted
//   many_keys_rejected  100,000 keys already at 10/15min, a fixed time: every check rejected
// and, for the fixed window only (hash flooding, one thread):
//   flood_colliding     4,096 keys of 192 bytes that share one libstdc++ std::hash value
//   flood_random        4,096 random keys of 192 bytes, the same checks otherwise
// Every case runs on 1 and 2 threads with real time, so items_per_second is the
// throughput of the whole process. Two threads on one key share it (contention);
// on 100,000 keys each thread owns a disjoint half of them.
// The floor's map is built and kept like the limiters (see shared_floor).
// A check's `remaining` is what the loops keep, as the paired run
// (paired_floor.cpp) does, so that both time the same code.
// On 100,000 keys each thread's pass over its keys starts with the caches
// emptied (see evict_caches), as each pass of the paired run does.
// Counters on the many_keys cases: heap bytes per key measured with mallinfo2().

#include <benchmark/benchmark.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ratelimit/ratelimit.hpp"
#include "stdhash_collisions.hpp"

namespace {

namespace rl = ratelimit;

constexpr std::size_t many_keys = 100'000;
/// A realistic caller-supplied time: microseconds since the Unix epoch (late 2023).
constexpr std::int64_t start_us = 1'700'000'000'000'000;
/// Simulated time between two checks of one thread in the "now" cases.
constexpr std::int64_t step_us = 10;

enum class time_source { passed, steady };
enum class traffic { admitted, rejected };

struct scenario {
  std::size_t keys;
  time_source time;
  traffic load;
};

/// 100,000 distinct numbers "+1555" followed by 7 digits: 12 bytes each, so a
/// std::string holds them inline (no heap block of their own).
const std::vector<std::string>& phone_numbers() {
  static const std::vector<std::string> numbers = [] {
    std::vector<std::string> out;
    out.reserve(many_keys);
    for (std::size_t i = 0; i < many_keys; ++i) {
      // 7919 is coprime with 10^7, so i -> (i * 7919 + c) mod 10^7 never repeats.
      const std::string digits = std::to_string((i * 7919 + 1'234'567) % 10'000'000);
      out.push_back("+1555" + std::string(7 - digits.size(), '0') + digits);
    }
    return out;
  }();
  return numbers;
}

constexpr double key_bytes = 12.0;

/// The keys of one thread, in key order. With many keys, thread i of n owns
/// the i-th of n disjoint slices, so threads never share a key.
std::vector<const std::string*> key_slice(std::size_t key_count, int thread, int threads) {
  const auto& all = phone_numbers();
  std::vector<const std::string*> out;
  if (key_count == 1) {
    out.push_back(&all.front());
    return out;
  }
  const auto t = static_cast<std::size_t>(thread);
  const auto n = static_cast<std::size_t>(threads);
  for (std::size_t i = key_count * t / n; i < key_count * (t + 1) / n; ++i) out.push_back(&all[i]);
  return out;
}

/// The same keys in a fixed shuffled order: the order the thread checks them.
/// Keys are inserted in key order and checked in this one, so neither the
/// limiter nor the floor walks memory in allocation order (which would let
/// the hardware prefetcher hide every cache miss).
std::vector<const std::string*> visit_order(std::size_t key_count, int thread, int threads) {
  auto out = key_slice(key_count, thread, threads);
  std::mt19937_64 rng(0x5eed + static_cast<std::uint64_t>(thread));
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

/// Gives freed blocks back to the top of the heap, so that the next structure
/// built is laid out in insertion order whatever ran before it.
void fresh_heap() {
#if defined(__GLIBC__)
  (void)malloc_trim(0);
#endif
}

// Configurations under which nearly every check on an existing key is admitted,
// so the benchmark measures the hot path that records the request. The rates
// stay far above what the loop can reach (even on one key with the real
// clock), and the sliding log's entries still age out within 1 ms.
template <class P>
typename P::config admit_config();
template <>
rl::fixed_window::config admit_config<rl::fixed_window>() {
  return rl::fixed_window::config{rl::rate{1'000'000, std::chrono::milliseconds{1}}};
}
template <>
rl::sliding_window_log::config admit_config<rl::sliding_window_log>() {
  return rl::sliding_window_log::config{rl::rate{1'000'000, std::chrono::milliseconds{1}}};
}
template <>
rl::sliding_window_counter::config admit_config<rl::sliding_window_counter>() {
  return rl::sliding_window_counter::config{rl::rate{1'000'000, std::chrono::milliseconds{1}}};
}
template <>
rl::token_bucket::config admit_config<rl::token_bucket>() {
  return rl::token_bucket::config{rl::rate{1'000'000, std::chrono::milliseconds{1}}};
}
template <>
rl::gcra::config admit_config<rl::gcra>() {
  // GCRA's emission interval must be >= 1 us, so the headroom is a large burst.
  return rl::gcra::config{rl::rate{1, std::chrono::microseconds{1}},
                          rl::bucket_options{.burst = 1'000'000'000}};
}

/// The telephony rule: more than 10 calls in 15 minutes is rejected.
template <class P>
typename P::config reject_config() {
  return typename P::config{rl::rate::parse("10/15min")};
}

struct fixture_base {
  virtual ~fixture_base() = default;
};

template <class P>
struct fixture final : fixture_base {
  explicit fixture(typename P::config cfg) : lim(std::move(cfg)) {}
  rl::limiter<P> lim;
  /// Where the caller-supplied time goes on: it never runs backwards across runs.
  std::atomic<std::int64_t> next_now{start_us};
};

// One fixture at a time, kept across the runs and repetitions of one
// benchmark (Google Benchmark runs them back to back), so the 100,000-key
// prefill happens once per benchmark rather than once per run.
std::string current_id;
std::unique_ptr<fixture_base> current;
std::atomic<fixture_base*> ready{nullptr};

template <class P>
fixture<P>& shared_fixture(const scenario& sc) {
  const std::string id = std::string(P::name) + '/' + std::to_string(sc.keys) + '/' +
                         std::to_string(static_cast<int>(sc.time)) + '/' +
                         std::to_string(static_cast<int>(sc.load));
  if (id != current_id || current == nullptr) {
    current.reset();
    fresh_heap();
    current_id = id;
    auto fx = std::make_unique<fixture<P>>(sc.load == traffic::admitted ? admit_config<P>()
                                                                        : reject_config<P>());
    const auto& keys = phone_numbers();
    for (std::size_t i = 0; i < sc.keys; ++i) {
      if (sc.load == traffic::rejected) {
        // Ten calls at the fixed time exhaust 10/15min; every later check is rejected.
        for (int c = 0; c < 10; ++c) (void)fx->lim.try_acquire(keys[i], rl::timestamp{start_us});
      } else if (sc.time == time_source::steady) {
        (void)fx->lim.try_acquire(keys[i]);
      } else {
        (void)fx->lim.try_acquire(keys[i], rl::timestamp{start_us - 1});
      }
    }
    current = std::move(fx);
  }
  return static_cast<fixture<P>&>(*current);
}

/// Heap bytes per key (malloc's in-use bytes after 100,000 first checks minus
/// before, over 100,000), per policy name and for the bare-map floor.
std::map<std::string, double, std::less<>>& bytes_per_key() {
  static std::map<std::string, double, std::less<>> figures;
  return figures;
}

[[nodiscard]] std::size_t heap_in_use() {
#if defined(__GLIBC__)
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

template <class P>
void measure_memory() {
  const auto& keys = phone_numbers();
  auto lim = std::make_unique<rl::limiter<P>>(admit_config<P>());
  const std::size_t before = heap_in_use();
  for (const auto& k : keys) (void)lim->try_acquire(k, rl::timestamp{start_us});
  const std::size_t after = heap_in_use();
  lim.reset();
  fresh_heap();
  bytes_per_key()[std::string(P::name)] = static_cast<double>(after - before) /
                                          static_cast<double>(keys.size());
}

void measure_floor_memory() {
  const auto& keys = phone_numbers();
  auto counts = std::make_unique<std::unordered_map<std::string, std::uint64_t>>();
  const std::size_t before = heap_in_use();
  for (const auto& k : keys) counts->emplace(k, 0);
  const std::size_t after = heap_in_use();
  counts.reset();
  fresh_heap();
  bytes_per_key()["unordered_map"] = static_cast<double>(after - before) /
                                     static_cast<double>(keys.size());
}

void add_memory_counters(benchmark::State& state, std::string_view name) {
  const auto& figures = bytes_per_key();
  const auto it = figures.find(name);
  if (it == figures.end()) return;
  // Set by thread 0 only: counters are summed over threads.
  state.counters["bytes_per_key"] = it->second;
  state.counters["bytes_beyond_key"] = it->second - key_bytes;
}

/// Bytes walked by evict_caches: three times the 32 MiB L3 of the machine
/// kind the figures come from (2 MiB L2 per core).
constexpr std::size_t evict_bytes = std::size_t{96} << 20;

/// Reads one word per cache line of a buffer larger than the caches, which
/// pushes every structure out of them (evict_caches; before the timed loop
/// too, so that the first pass starts cold as well).
void walk_junk() {
  static const std::vector<std::uint64_t> junk(evict_bytes / sizeof(std::uint64_t), 1);
  std::uint64_t sum = 0;
  for (std::size_t j = 0; j < junk.size(); j += 64 / sizeof(std::uint64_t)) sum += junk[j];
  benchmark::DoNotOptimize(sum);
}

/// The threads of one multi-threaded case meet here around evict_caches,
/// so that no thread's timed pass overlaps another's walk (whose memory
/// traffic it would pay for). Threads run the same iterations, so with
/// slices of one size their passes end together; with slices of unequal
/// size they would not (a thread would wait for a pass the other never
/// ends), so then there is no meeting. Set up by thread 0 before the timed
/// loop, whose start Google Benchmark holds until every thread is in.
class pass_barrier {
 public:
  void reset(std::size_t keys, int threads) noexcept {
    parties_ = keys % static_cast<std::size_t>(threads) == 0 ? threads : 1;
    arrived_.store(0, std::memory_order_relaxed);
  }
  void wait() noexcept {
    if (parties_ <= 1) return;
    const unsigned generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    while (generation_.load(std::memory_order_acquire) == generation) std::this_thread::yield();
  }

 private:
  int parties_ = 1;
  std::atomic<int> arrived_{0};
  std::atomic<unsigned> generation_{0};
};
pass_barrier pass_end;

/// Pushes every structure out of the caches, timing paused: what the paired
/// run (paired_floor.cpp) gets from timing the other structures between two
/// passes of one. Called at the end of each pass over a thread's keys on
/// 100,000 keys. Without it one structure of 5-11 MB, cycled on its own,
/// stays in the 32 MiB L3: the floor took 29 ns there against 110-300 ns
/// in the paired run, and the limiters' fixed costs (hash, lock, policy)
/// weighed 1.5x the floor where the paired run measured 1.0-1.3x. The two
/// tools now measure the same regime: every key's node out of cache.
void evict_caches(benchmark::State& state) {
  state.PauseTiming();
  pass_end.wait();
  walk_junk();
  pass_end.wait();
  state.ResumeTiming();
}

template <class P>
void run_check(benchmark::State& state, const scenario& sc) {
  // Thread 0 builds (or reuses) the shared limiter; the others wait for it.
  if (state.thread_index() == 0) {
    pass_end.reset(sc.keys, state.threads());
    ready.store(&shared_fixture<P>(sc), std::memory_order_release);
  } else {
    while (ready.load(std::memory_order_acquire) == nullptr) std::this_thread::yield();
  }
  auto& fx = static_cast<fixture<P>&>(*ready.load(std::memory_order_acquire));
  const auto order = visit_order(sc.keys, state.thread_index(), state.threads());
  if (sc.keys > 1) walk_junk();
  std::size_t i = 0;

  if (sc.time == time_source::steady) {
    for (auto _ : state) {
      auto r = fx.lim.try_acquire(*order[i]).remaining;
      benchmark::DoNotOptimize(r);
      if (++i == order.size()) {
        i = 0;
        if (sc.keys > 1) evict_caches(state);
      }
    }
  } else {
    const bool advance = sc.load == traffic::admitted;
    std::int64_t now = advance ? fx.next_now.load(std::memory_order_relaxed) : start_us;
    for (auto _ : state) {
      auto r = fx.lim.try_acquire(*order[i], rl::timestamp{now}).remaining;
      benchmark::DoNotOptimize(r);
      if (advance) now += step_us;
      if (++i == order.size()) {
        i = 0;
        if (sc.keys > 1) evict_caches(state);
      }
    }
    std::int64_t seen = fx.next_now.load(std::memory_order_relaxed);
    while (seen < now && !fx.next_now.compare_exchange_weak(seen, now)) {
    }
  }
  // Every thread has passed the loop's start barrier, so none still waits.
  if (state.thread_index() == 0) {
    ready.store(nullptr, std::memory_order_relaxed);
    if (sc.keys > 1) add_memory_counters(state, P::name);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_FixedWindow_MemoryStore(benchmark::State& state, scenario sc) {
  run_check<rl::fixed_window>(state, sc);
}
void BM_SlidingLog_MemoryStore(benchmark::State& state, scenario sc) {
  run_check<rl::sliding_window_log>(state, sc);
}
void BM_SlidingCounter_MemoryStore(benchmark::State& state, scenario sc) {
  run_check<rl::sliding_window_counter>(state, sc);
}
void BM_TokenBucket_MemoryStore(benchmark::State& state, scenario sc) {
  run_check<rl::token_bucket>(state, sc);
}
void BM_Gcra_MemoryStore(benchmark::State& state, scenario sc) {
  run_check<rl::gcra>(state, sc);
}

/// The floor's structure: a std::unordered_map<std::string, std::uint64_t>
/// holding the keys, built and kept exactly like a limiter's fixture.
struct floor_fixture final : fixture_base {
  std::unordered_map<std::string, std::uint64_t> counts;
};

/// The floor's map for `key_count` keys, made the way `shared_fixture` makes
/// a limiter: on a freshly trimmed heap, keys inserted in key order, kept
/// across the runs and repetitions of one benchmark and shared by its
/// threads. (It used to be built anew by each thread of each run, a young
/// compact map against limiters filled earlier and reused, which on 100,000
/// keys moved the ratio to the floor by up to 2x against the paired run.)
floor_fixture& shared_floor(std::size_t key_count) {
  const std::string id = "floor/" + std::to_string(key_count);
  if (id != current_id || current == nullptr) {
    current.reset();
    fresh_heap();
    current_id = id;
    auto fx = std::make_unique<floor_fixture>();
    const auto& keys = phone_numbers();
    for (std::size_t i = 0; i < key_count; ++i) fx->counts.emplace(keys[i], 0);
    current = std::move(fx);
  }
  return static_cast<floor_fixture&>(*current);
}

/// The floor: find-and-increment in a std::unordered_map<std::string,
/// std::uint64_t> by std::string key, with no lock, no policy and no
/// validation. One map shared by the threads, each on its own keys (finds
/// do not modify the map, and no two threads increment the same value), as
/// the limiters' threads share one limiter.
void BM_Floor_UnorderedMap(benchmark::State& state, std::size_t key_count) {
  if (state.thread_index() == 0) {
    pass_end.reset(key_count, state.threads());
    ready.store(&shared_floor(key_count), std::memory_order_release);
  } else {
    while (ready.load(std::memory_order_acquire) == nullptr) std::this_thread::yield();
  }
  auto& fx = static_cast<floor_fixture&>(*ready.load(std::memory_order_acquire));
  const auto order = visit_order(key_count, state.thread_index(), state.threads());
  if (key_count > 1) walk_junk();
  std::size_t i = 0;
  for (auto _ : state) {
    std::uint64_t& n = fx.counts.find(*order[i])->second;
    ++n;
    benchmark::DoNotOptimize(n);
    if (++i == order.size()) {
      i = 0;
      if (key_count > 1) evict_caches(state);
    }
  }
  if (state.thread_index() == 0) {
    ready.store(nullptr, std::memory_order_relaxed);
    if (key_count > 1) add_memory_counters(state, "unordered_map");
  }
  state.SetItemsProcessed(state.iterations());
}

/// Checks cycling over 4,096 existing keys of 192 bytes, time passed in:
/// keys built to collide under std::hash, or random bytes of the same length.
/// Against a store hashing with std::hash the first would walk one chain of
/// 4,096 keys per check; with a keyed hash the two cost the same.
void BM_Flood_FixedWindow(benchmark::State& state, bool colliding) {
  std::vector<std::string> keys = ratelimit::test::stdhash_colliding_keys(12);
  if (!colliding) {
    std::mt19937_64 rng(0xf100d);
    for (std::string& k : keys) {
      for (char& c : k) c = static_cast<char>(rng());
    }
  }
  std::shuffle(keys.begin(), keys.end(), std::mt19937_64{0x5eed});
  rl::limiter<rl::fixed_window> lim(admit_config<rl::fixed_window>());
  std::int64_t now = start_us;
  for (const std::string& k : keys) (void)lim.try_acquire(k, rl::timestamp{now});
  std::size_t i = 0;
  for (auto _ : state) {
    auto d = lim.try_acquire(keys[i], rl::timestamp{now});
    benchmark::DoNotOptimize(d);
    now += step_us;
    if (++i == keys.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}

constexpr scenario hot_key_now{1, time_source::passed, traffic::admitted};
constexpr scenario hot_key_clock{1, time_source::steady, traffic::admitted};
constexpr scenario many_keys_now{many_keys, time_source::passed, traffic::admitted};
constexpr scenario many_keys_clock{many_keys, time_source::steady, traffic::admitted};
constexpr scenario many_keys_rejected{many_keys, time_source::passed, traffic::rejected};

#define RATELIMIT_POLICY_BENCHMARKS(fn)                                                           \
  BENCHMARK_CAPTURE(fn, hot_key_now, hot_key_now)->Threads(1)->Threads(2)->UseRealTime();         \
  BENCHMARK_CAPTURE(fn, hot_key_clock, hot_key_clock)->Threads(1)->Threads(2)->UseRealTime();     \
  BENCHMARK_CAPTURE(fn, many_keys_now, many_keys_now)->Threads(1)->Threads(2)->UseRealTime();     \
  BENCHMARK_CAPTURE(fn, many_keys_clock, many_keys_clock)->Threads(1)->Threads(2)->UseRealTime(); \
  BENCHMARK_CAPTURE(fn, many_keys_rejected, many_keys_rejected)                                   \
      ->Threads(1)                                                                                \
      ->Threads(2)                                                                                \
      ->UseRealTime()

BENCHMARK_CAPTURE(BM_Floor_UnorderedMap, hot_key, std::size_t{1})->Threads(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_Floor_UnorderedMap, many_keys, many_keys)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime();
RATELIMIT_POLICY_BENCHMARKS(BM_FixedWindow_MemoryStore);
RATELIMIT_POLICY_BENCHMARKS(BM_SlidingLog_MemoryStore);
RATELIMIT_POLICY_BENCHMARKS(BM_SlidingCounter_MemoryStore);
RATELIMIT_POLICY_BENCHMARKS(BM_TokenBucket_MemoryStore);
RATELIMIT_POLICY_BENCHMARKS(BM_Gcra_MemoryStore);
BENCHMARK_CAPTURE(BM_Flood_FixedWindow, flood_colliding, true)->UseRealTime();
BENCHMARK_CAPTURE(BM_Flood_FixedWindow, flood_random, false)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // Memory first, on a quiet heap, before any benchmark has run.
  (void)phone_numbers();
  measure_floor_memory();
  measure_memory<rl::fixed_window>();
  measure_memory<rl::sliding_window_log>();
  measure_memory<rl::sliding_window_counter>();
  measure_memory<rl::token_bucket>();
  measure_memory<rl::gcra>();
  benchmark::AddCustomContext("key_bytes", std::to_string(static_cast<int>(key_bytes)));
  for (const auto& [name, bytes] : bytes_per_key()) {
    benchmark::AddCustomContext("heap_bytes_per_key." + name, std::to_string(bytes));
  }

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
