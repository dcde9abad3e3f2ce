// SPDX-License-Identifier: Apache-2.0
// Compound limits on a real 3-master Redis Cluster: every sub-key of one user
// key in one hash slot (as CLUSTER KEYSLOT computes it), decisions identical
// to memory_store<compound> with user keys on every master, and exact
// admission of the smaller limit under concurrency.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "ratelimit/redis/scripts/compound.hpp"
#include "support/fork_child.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using std::chrono::microseconds;

using five_policies =
    compound<sliding_window_log, fixed_window, sliding_window_counter, token_bucket, gcra>;

std::string describe(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted << " source=" << to_string(d.source)
    << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == never ? -1 : d.retry_after.count())
    << " reset_after=" << (d.reset_after == never ? -1 : d.reset_after.count()) << "}";
  return o.str();
}

std::string unique_prefix(std::string_view what) {
  static int n = 0;
  return "rlcc:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
         std::string(what) + ":";
}

redis::cluster_options cluster_opts(std::string_view what) {
  auto o = rltest::shared_cluster().options();
  o.node.prefix = unique_prefix(what);
  return o;
}

/// Every Redis key the store writes for one check of `key` (its own key helper).
template <class Config>
std::vector<std::string> store_keys(const redis::cluster_store& store, const Config& cfg,
                                    std::string_view key) {
  return redis::detail::redis_keys(store.get_options().node.prefix, cfg, key);
}

long long keyslot(int port, std::string_view key) {
  const auto r = rltest::command(rltest::redis_cluster::node(port), {"CLUSTER", "KEYSLOT", key});
  EXPECT_EQ(r->type, REDIS_REPLY_INTEGER);
  return r->integer;
}

int port_of(const std::string& node) {
  return std::stoi(node.substr(node.rfind(':') + 1));
}

const five_policies::config& five() {
  static const five_policies::config cfg{
      compound_options{"t"},
      sliding_window_log::config{"5/2s", window_options{true, "t"}},
      fixed_window::config{"50/1min", window_options{.name = "t"}},
      sliding_window_counter::config{"40/10s", window_options{.name = "t"}},
      token_bucket::config{"10/30s", bucket_options{.name = "t"}},
      gcra::config{"20/1h", bucket_options{.name = "t"}}};
  return cfg;
}

// ---- one slot per user key ------------------------------------------------------

// Verifies that every key the store writes for one compound check (one per
// sub-limit) has the slot CLUSTER KEYSLOT gives the first, which is the
// store's slot_for, for ordinary user keys and prefixes.
TEST(CompoundClusterSlot, EverySubKeyIsInTheUserKeysSlot) {
  const int port = rltest::shared_cluster().ports().front();
  const compound_of<sliding_window_log>::config three({"1/1s", "10/1min", "100/1h"},
                                                      compound_options{"t"});
  const std::vector<std::string> users = {"+15551234567",
                                          "a}b",
                                          "{",
                                          "{}",
                                          "a{b}c",
                                          std::string("n\0ul", 4),
                                          "two words",
                                          "\xc3\xa9t\xc3\xa9",
                                          std::string(512, 'x'),
                                          "{{}}",
                                          "{br}"};
  for (const std::string prefix : {"rl:", "", "p{x}:", "p{:"}) {
    auto o = rltest::shared_cluster().options();
    o.node.prefix = prefix;
    redis::cluster_store store(o);
    for (const std::string& u : users) {
      const auto ks5 = store_keys(store, five(), u);
      const auto ks3 = store_keys(store, three, u);
      ASSERT_EQ(ks5.size(), 5u);
      ASSERT_EQ(ks3.size(), 3u);
      const long long want = store.slot_for<five_policies>(u);
      for (const auto* ks : {&ks5, &ks3}) {
        for (const std::string& k : *ks) {
          EXPECT_EQ(keyslot(port, k), want) << "prefix \"" << prefix << "\" key " << k;
        }
      }
    }
  }
}

// Verifies user keys that start with '}' and a prefix whose first '{' is
// followed by '}': there `<prefix>{<user key>}` has an empty hash tag, so
// Redis hashes each whole key. The store must either still write the
// sub-keys to one slot or refuse the key with std::invalid_argument; it must
// never send a script that Redis refuses with CROSSSLOT.
TEST(CompoundClusterSlot, SubKeysWithoutAHashTagAreInOneSlotOrRefused) {
  const int port = rltest::shared_cluster().ports().front();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"rl:", "}"}, {"rl:", "}alice"}, {"", "}{:"}, {"{}", "alice"}};
  for (const auto& [prefix, user] : cases) {
    auto o = rltest::shared_cluster().options();
    o.node.prefix = prefix;
    redis::cluster_store store(o);
    std::set<long long> slots;
    std::vector<std::string> keys;
    try {
      keys = store_keys(store, five(), user);
    } catch (const std::invalid_argument&) {
      // The store refuses the configuration before any I/O.
      EXPECT_THROW((void)store.apply(five(), user, store_time, 1), std::invalid_argument);
      EXPECT_THROW(store.reset(five(), user), std::invalid_argument);
      continue;
    }
    for (const std::string& k : keys) slots.insert(keyslot(port, k));
    if (slots.size() == 1) {
      EXPECT_EQ(*slots.begin(), keyslot(port, store_keys(store, five(), user).front()));
      EXPECT_EQ(to_string(store.apply(five(), user, store_time, 1).source), "store");
      store.reset(five(), user);
    } else {
      EXPECT_THROW((void)store.apply(five(), user, store_time, 1), std::invalid_argument)
          << "prefix \"" << prefix << "\" user key \"" << user << "\": the sub-keys span "
          << slots.size() << " slots";
      EXPECT_THROW(store.reset(five(), user), std::invalid_argument);
    }
  }
}

// Verifies that a compound check on a user key starting with '}' is never
// admitted past its limit, even under fail_open: the store either decides it
// in Redis (exactly 3 of 10 admitted) or refuses the key with
// std::invalid_argument before any I/O, but never lets Redis answer CROSSSLOT
// and the failure policy admit everything.
TEST(CompoundClusterStore, UserKeysStartingWithABraceAreStillLimited) {
  auto o = cluster_opts("brace");
  o.node.on_failure = redis::failure_policy::fail_open;
  redis::cluster_store store(o);
  const compound_of<fixed_window>::config cfg({"3/1h", "5/1h"}, compound_options{"t"});
  for (const std::string user : {"}", "}alice", "}{:"}) {
    int admitted = 0;
    int refused = 0;
    for (int i = 0; i < 10; ++i) {
      try {
        const decision d = store.apply(cfg, user, store_time, 1);
        EXPECT_EQ(to_string(d.source), "store") << "user key \"" << user << "\"";
        admitted += d.allowed ? 1 : 0;
      } catch (const std::invalid_argument&) {
        ++refused;
      }
    }
    if (refused == 0) {
      EXPECT_EQ(admitted, 3) << "user key \"" << user << "\"";
    } else {
      EXPECT_EQ(refused, 10) << "user key \"" << user << "\"";
    }
  }
  EXPECT_EQ(store.stats().fail_open, 0u);
}

// Verifies that a compound check writes every sub-key on the master owning
// the user key's slot, for user keys on all three masters, and that reset
// deletes all of them there.
TEST(CompoundClusterStore, WritesEverySubKeyOnTheOwningMasterAndResetDeletesThem) {
  redis::cluster_store store(cluster_opts("write"));
  store.refresh_topology();
  std::map<std::string, int> per_node;
  for (int i = 0; i < 60; ++i) {
    const std::string u = "+1555" + std::to_string(2000000 + i);
    const decision d = store.apply(five(), u, store_time, 1);
    ASSERT_TRUE(d.allowed) << describe(d);
    ASSERT_EQ(d.source, decision_source::store);
    const std::string node = store.node_for_slot(store.slot_for<five_policies>(u));
    ++per_node[node];
    const auto ks = store_keys(store, five(), u);
    for (const std::string& k : ks) {
      EXPECT_EQ(rltest::redis_cluster::ask(port_of(node), {"EXISTS", k}), "1") << k;
    }
    store.reset(five(), u);
    for (const std::string& k : ks) {
      EXPECT_EQ(rltest::redis_cluster::ask(port_of(node), {"EXISTS", k}), "0") << k;
    }
  }
  EXPECT_EQ(per_node.size(), 3u);
  EXPECT_EQ(store.stats().errors, 0u);
}

// ---- differential test against memory_store ---------------------------------

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

/// Small limits and periods that overlap, so sub-limits take turns binding.
template <class P>
typename P::config random_part(std::mt19937_64& rng) {
  static constexpr std::int64_t limits[] = {1, 2, 3, 5, 7, 10, 16};
  static constexpr std::int64_t periods[] = {1, 7, 64, 1000, 999'983, 1'000'000, 60'000'000};
  for (;;) {
    try {
      auto p = periods[uniform(rng, 0, 6)];
      if (uniform(rng, 0, 3) == 0) p = uniform(rng, 1, 5'000'000);
      const rate r(limits[uniform(rng, 0, 6)], microseconds{p});
      if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
        bucket_options o;
        o.name = "t";
        if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 2 * r.limit() + 3);
        return typename P::config(r, o);
      } else {
        return typename P::config(r, window_options{uniform(rng, 0, 1) == 0, "t"});
      }
    } catch (const std::invalid_argument&) {
      // e.g. GCRA faster than 1/us: draw again
    }
  }
}

template <class C>
struct random_config;

template <policy P>
struct random_config<compound_of<P>> {
  static typename compound_of<P>::config make(std::mt19937_64& rng) {
    std::vector<typename P::config> parts;
    const auto n = uniform(rng, 1, 3);
    for (std::int64_t i = 0; i < n; ++i) parts.push_back(random_part<P>(rng));
    return typename compound_of<P>::config(std::move(parts), compound_options{"t"});
  }
};

template <policy... Ps>
struct random_config<compound<Ps...>> {
  static typename compound<Ps...>::config make(std::mt19937_64& rng) {
    // Braced lists evaluate left to right: a seed gives one config.
    return std::apply(
        [](auto... p) {
          return typename compound<Ps...>::config(compound_options{"t"}, std::move(p)...);
        },
        std::tuple<typename Ps::config...>{random_part<Ps>(rng)...});
  }
};

struct event {
  std::string key;
  std::int64_t t = 0;
  units cost = 1;
  enum kind_t { consume, peek, reset, force } kind = consume;
};

// The access of an event: forced checks (shadow mode) are part of the traces.
ratelimit::access access_of(event::kind_t k) {
  return k == event::peek    ? ratelimit::access::peek
         : k == event::force ? ratelimit::access::force
                             : ratelimit::access::consume;
}

std::vector<event> random_trace(std::mt19937_64& rng, units smallest, std::int64_t w, int seed) {
  static const std::vector<std::string> key_pool = {"+1555", std::string("a\0b", 3), "{br}", "a}b",
                                                    "\xc3\xa9t\xc3\xa9"};
  std::vector<std::string> keys;
  const auto nkeys = uniform(rng, 1, 4);
  for (std::int64_t i = 0; i < nkeys; ++i) {
    keys.push_back(key_pool[static_cast<std::size_t>(uniform(rng, 0, 4))] + std::to_string(seed) +
                   "." + std::to_string(i));
  }
  std::int64_t t = 1'732'950'000'000'000 + uniform(rng, 0, 1'000'000'000);
  const auto n = uniform(rng, 20, 60);
  std::vector<event> trace;
  // Forced checks: none, some or most of the trace.
  const std::int64_t forced_share = uniform(rng, 0, 2) * 30;
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 9)) {
      case 0:
      case 1: break;
      case 2:
      case 3: t += uniform(rng, 1, 3); break;
      case 4: t += uniform(rng, 1, std::max<std::int64_t>(1, w / 4)); break;
      case 5: t += uniform(rng, 0, w); break;
      case 6: t += uniform(rng, 0, 3 * w); break;
      case 7: t -= uniform(rng, 0, 2 * w); break;  // time going backwards
      default: t += uniform(rng, 0, 1000); break;
    }
    event e;
    e.key = keys[static_cast<std::size_t>(uniform(rng, 0, nkeys - 1))];
    e.t = t;
    switch (uniform(rng, 0, 9)) {
      case 0: e.cost = uniform(rng, 1, smallest + 2); break;
      case 1: e.cost = uniform(rng, smallest + 1, smallest + 20); break;  // above a sub-limit
      case 2: e.cost = uniform(rng, 2, 4); break;
      default: e.cost = 1; break;
    }
    const auto k = uniform(rng, 0, 39);
    e.kind = k < 4 ? event::peek : (k == 4 ? event::reset : event::consume);
    if (e.kind == event::consume && uniform(rng, 0, 99) < forced_share) e.kind = event::force;
    trace.push_back(std::move(e));
  }
  return trace;
}

template <class C>
class CompoundClusterDifferential : public ::testing::Test {};

using compounds = ::testing::Types<compound_of<sliding_window_counter>,
                                   compound<gcra, fixed_window, sliding_window_log>>;
TYPED_TEST_SUITE(CompoundClusterDifferential, compounds);

// Verifies identical decisions (every field) to memory_store<compound> on
// seeded random traces with caller time: count_rejected mixes, costs above
// sub-limits, time going backwards, peeks and resets, user keys on all three
// masters; even seeds one check per round trip, odd seeds batches spanning
// several nodes.
TYPED_TEST(CompoundClusterDifferential, MatchesMemoryStoreOnRandomTraces) {
  using C = TypeParam;
  redis::cluster_store store(cluster_opts("diff"));
  const int traces = rltest::diff_traces(200);
  std::set<std::string> nodes;
  std::int64_t checks = 0;
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 6151u + 41u);
    const auto cfg = random_config<C>::make(rng);
    const auto trace = random_trace(rng, cfg.limit(), uniform(rng, 1, 2'000'000), seed);
    const bool batched = seed % 2 == 1;
    std::map<std::string, memory_store<C>> memory;
    std::vector<decision> expected;
    for (const event& e : trace) {
      auto& m = memory[e.key];
      if (e.kind == event::reset) {
        m.reset(cfg, e.key);
        expected.push_back(decision{});
      } else {
        expected.push_back(m.apply(cfg, e.key, microseconds{e.t}, e.cost, access_of(e.kind)));
      }
    }
    std::vector<decision> got(trace.size());
    for (std::size_t i = 0; i < trace.size();) {
      const event& e = trace[i];
      const ratelimit::access a = access_of(e.kind);
      if (e.kind == event::reset) {
        store.reset(cfg, e.key);
        ++i;
      } else if (!batched) {
        got[i] = store.apply(cfg, e.key, microseconds{e.t}, e.cost, a);
        ++i;
      } else {
        std::vector<redis::batch_item> batch;
        const std::size_t first = i;
        while (i < trace.size() && trace[i].kind == e.kind) {
          batch.push_back({trace[i].key, trace[i].cost, microseconds{trace[i].t}});
          ++i;
        }
        const auto ds = store.apply_batch(cfg, std::span<const redis::batch_item>(batch), a);
        ASSERT_EQ(ds.size(), batch.size());
        std::copy(ds.begin(), ds.end(), got.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    for (std::size_t j = 0; j < trace.size(); ++j) {
      if (trace[j].kind == event::reset) continue;
      ++checks;
      nodes.insert(store.node_for_slot(store.template slot_for<C>(trace[j].key)));
      ASSERT_EQ(describe(got[j]), describe(expected[j]))
          << "seed " << seed << " event " << j << " t=" << trace[j].t << " cost=" << trace[j].cost
          << " peek=" << (trace[j].kind == event::peek) << (batched ? " (batched)" : "");
      ASSERT_EQ(got[j], expected[j]) << "seed " << seed << " event " << j;  // never vs -1
    }
    for (const auto& [key, m] : memory) store.reset(cfg, key);
  }
  EXPECT_EQ(nodes.size(), 3u);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.fail_open + s.fail_closed + s.fallback, 0u);
  EXPECT_EQ(s.store, static_cast<std::uint64_t>(checks));
}

// ---- concurrency -------------------------------------------------------------

constexpr int processes = 2;
constexpr int threads_per_process = 4;
constexpr int attempts_per_thread = 30;

template <class Config, class Time>
long run_threads(const redis::cluster_options& o, const Config& cfg, const std::string& key,
                 Time when) {
  redis::cluster_store store(o);
  std::atomic<long> admitted{0};
  std::atomic<long> undecided{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads_per_process; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < attempts_per_thread; ++j) {
        const decision d = store.apply(cfg, key, when, 1, ratelimit::access::consume);
        if (d.source != decision_source::store) ++undecided;
        if (d.allowed) ++admitted;
      }
    });
  }
  for (auto& t : pool) t.join();
  return undecided.load() == 0 ? admitted.load() : -1;
}

/// Admitted checks of `processes` x `threads_per_process` threads on one key;
/// -1 from a child that failed or got a decision not made by Redis.
template <class Config, class Time>
long admitted_across_processes(const redis::cluster_options& o, const Config& cfg,
                               const std::string& key, Time when) {
  return rltest::sum_in_children(processes, [&](int) { return run_threads(o, cfg, key, when); });
}

// Verifies that 2 processes x 4 threads on one key, with a compound of two
// limits, admit exactly the smaller limit (the larger one counting rejected
// attempts in one case), on server time and on caller time, for a key on
// each master.
TEST(CompoundClusterConcurrency, ProcessesAndThreadsAdmitExactlyTheSmallerLimit) {
  const auto o = cluster_opts("conc");
  using window_and_bucket = compound<sliding_window_log, gcra>;
  const window_and_bucket::config server_cfg{
      compound_options{"t"}, sliding_window_log::config{"40/1h", window_options{.name = "t"}},
      gcra::config{"17/1h", bucket_options{.name = "t"}}};
  const compound_of<fixed_window>::config caller_cfg(
      {fixed_window::config{"23/1h", window_options{.name = "t"}},
       fixed_window::config{"50/1h", window_options{true, "t"}}},
      compound_options{"t"});
  redis::cluster_store probe(o);
  probe.refresh_topology();
  std::set<std::string> nodes;
  for (int i = 0; nodes.size() < 3; ++i) {
    const std::string key = "hot" + std::to_string(i);
    if (!nodes.insert(probe.node_for_slot(probe.slot_for<window_and_bucket>(key))).second) {
      continue;
    }
    EXPECT_EQ(admitted_across_processes(o, server_cfg, key, store_time), 17) << key;
    EXPECT_EQ(admitted_across_processes(o, caller_cfg, key, microseconds{1'732'950'000'000'000}),
              23)
        << key;
    // Both sub-limits are now full (the second counted the rejected
    // attempts); on the tie the first one binds.
    const decision d = probe.apply(caller_cfg, key, microseconds{1'732'950'000'000'000}, 1,
                                   ratelimit::access::peek);
    EXPECT_FALSE(d.allowed);
    EXPECT_EQ(d.limit, 23);
    EXPECT_EQ(d.remaining, 0);
  }
}

}  // namespace
