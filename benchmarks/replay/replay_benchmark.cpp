// SPDX-License-Identifier: Apache-2.0
// Replays a generated 1,000,000-event, ~100,000-key log through each policy, CSV parsing included.
#include <benchmark/benchmark.h>

#include <sstream>
#include <streambuf>
#include <string>

#include "gen_trace.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "replay.hpp"

namespace {

using namespace ratelimit;
using namespace ratelimit::replay;

/// The log, generated once: ~110,000 subscribers at ~6.6 calls a day (plus redials), one day.
const std::string& trace_text() {
  static const std::string text = [] {
    gen_options o;
    o.seed = 42;
    o.subscribers = 110'000;
    o.calls_per_day = 6.6;
    o.call_centres = 20;
    o.robocallers = 30;
    o.edge_bursters = 10;
    std::ostringstream out;
    write_trace_csv(out, generate_trace(o), o);
    return out.str();
  }();
  return text;
}

/// A dense log, generated once: 1,000,000 calls from 100,000 keys drawn
/// uniformly, 0-2 ms apart (`ratelimit-gen-trace --dense 1000000`): every key
/// is live in every 15-minute window.
const std::string& dense_text() {
  static const std::string text = [] {
    std::ostringstream out;
    write_dense_trace_csv(out, dense_options{});
    return out.str();
  }();
  return text;
}

/// Discards what it is given: the benchmark measures producing the rows, not a terminal.
class null_buffer : public std::streambuf {
 protected:
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
  int_type overflow(int_type c) override { return c; }
};

const limiter_settings settings{rate::parse("10/15min"), {}, false};

/// Decisions mode end to end: parse, memory_store, format every row.
template <class P>
void BM_Replay_MemoryStore(benchmark::State& state) {
  const std::string& text = trace_text();
  const auto cfg = make_config<P>(settings);
  null_buffer nb;
  std::ostream sink(&nb);
  std::size_t events = 0;
  for (auto _ : state) {
    std::istringstream in(text);
    trace_reader reader(in);
    memory_store<P> store;
    std::string out;
    out.reserve(1 << 17);
    events = replay_decisions<P>(reader, cfg, store, out, &sink);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events) * state.iterations());
  state.counters["events"] = static_cast<double>(events);
}

/// Parsing alone, for reference.
void BM_Replay_ParseOnly(benchmark::State& state) {
  const std::string& text = trace_text();
  std::size_t events = 0;
  for (auto _ : state) {
    std::istringstream in(text);
    events = validate_trace(in);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events) * state.iterations());
}

/// Summary mode: all five policies side by side in one pass, plus per-key bookkeeping.
void BM_Replay_Summary_AllPolicies(benchmark::State& state) {
  const std::string& text = trace_text();
  analysis_result r;
  for (auto _ : state) {
    std::istringstream in(text);
    analysis_options o;
    o.settings = settings;
    r = analyse(in, o);
    benchmark::DoNotOptimize(r.events);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(r.events) * state.iterations());
  state.counters["keys"] = static_cast<double>(r.keys);
  state.counters["tool_bytes_per_key"] = static_cast<double>(r.tool_bytes) /
                                         static_cast<double>(r.keys);
  for (const policy_summary& p : r.policies) {
    state.counters[std::string(policy_name(p.id)) + "_Mev_s"] = static_cast<double>(r.events) /
                                                                (r.shared_seconds + p.seconds) /
                                                                1e6;
    state.counters[std::string(policy_name(p.id)) + "_state_B_per_key"] = p.state_bytes_per_key;
  }
}

/// Summary mode on the dense log: all five policies (range 5) or one
/// (range = its policy_id), as `--policy P` runs it. Wall-clock time: the
/// engine runs on two threads.
void BM_Replay_Summary_Dense(benchmark::State& state) {
  const std::string& text = dense_text();
  analysis_result r;
  for (auto _ : state) {
    std::istringstream in(text);
    analysis_options o;
    o.settings = settings;
    if (state.range(0) < static_cast<std::int64_t>(policy_count)) {
      o.summary_policies = {all_policies[state.range(0)]};
    }
    r = analyse(in, o);
    benchmark::DoNotOptimize(r.events);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(r.events) * state.iterations());
  state.counters["keys"] = static_cast<double>(r.keys);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_Replay_MemoryStore, fixed_window)
    ->Name("BM_FixedWindow_MemoryStore_Replay")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Replay_MemoryStore, sliding_window_log)
    ->Name("BM_SlidingLog_MemoryStore_Replay")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Replay_MemoryStore, sliding_window_counter)
    ->Name("BM_SlidingCounter_MemoryStore_Replay")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Replay_MemoryStore, token_bucket)
    ->Name("BM_TokenBucket_MemoryStore_Replay")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Replay_MemoryStore, gcra)
    ->Name("BM_Gcra_MemoryStore_Replay")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Replay_ParseOnly)->Name("BM_Replay_ParseOnly")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Replay_Summary_AllPolicies)
    ->Name("BM_Replay_Summary_AllPolicies")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Replay_Summary_Dense)
    ->Name("BM_Replay_Summary_Dense")
    ->DenseRange(0, static_cast<int>(policy_count))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
