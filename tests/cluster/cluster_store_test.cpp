// SPDX-License-Identifier: Apache-2.0
// The cluster store on a real 3-master Redis Cluster: slots as Redis computes
// them, keys on every master, decisions identical to memory_store, exact
// totals under concurrency and while slots migrate.
#include "ratelimit/redis/cluster_store.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "support/fork_child.hpp"
#include "support/trace_count.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using std::chrono::microseconds;

std::string describe(const decision& d) {
  std::ostringstream o;
  o << "{allowed=" << d.allowed << " counted=" << d.counted << " source=" << to_string(d.source)
    << " limit=" << d.limit << " remaining=" << d.remaining
    << " retry_after=" << (d.retry_after == never ? -1 : d.retry_after.count())
    << " reset_after=" << d.reset_after.count() << "}";
  return o.str();
}

std::string unique_prefix(std::string_view what) {
  static int n = 0;
  return "rlc:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" + std::string(what) +
         ":";
}

redis::cluster_store make_store(std::string_view what) {
  auto o = rltest::shared_cluster().options();
  o.node.prefix = unique_prefix(what);
  return redis::cluster_store(o);
}

TEST(ClusterSlot, Crc16MatchesKnownValues) {
  EXPECT_EQ(redis::crc16("123456789"), 0x31C3);
  EXPECT_EQ(redis::key_slot("foo"), 12182);
  EXPECT_EQ(redis::key_slot("bar"), 5061);
  EXPECT_EQ(redis::key_slot("{user1000}.following"), redis::key_slot("{user1000}.followers"));
  EXPECT_EQ(redis::key_slot("foo{}{bar}"), redis::crc16("foo{}{bar}") % 16384);
  EXPECT_EQ(redis::key_slot("foo{{bar}}zap"), redis::key_slot("{bar"));
  EXPECT_EQ(redis::key_slot("foo{bar}{zap}"), redis::key_slot("bar"));
}

// Verifies that the slot of every store key, including user keys with braces,
// NUL bytes and prefixes with braces, is what CLUSTER KEYSLOT answers.
TEST(ClusterSlot, MatchesClusterKeyslotOnTrickyKeys) {
  const int port = rltest::shared_cluster().ports().front();
  const std::vector<std::string> users = {"+15551234567",
                                          "a}b",
                                          "}",
                                          "{",
                                          "{}",
                                          "a{b}c",
                                          "}{:",
                                          std::string("n\0ul", 4),
                                          "two words",
                                          "\xc3\xa9t\xc3\xa9",
                                          std::string(512, 'x'),
                                          "{{}}"};
  for (const std::string prefix : {"rl:", "", "p{x}:", "p{:", "{}"}) {
    auto o = rltest::shared_cluster().options();
    o.node.prefix = prefix;
    redis::cluster_store store(o);
    for (const std::string& u : users) {
      if (prefix == "{}") {
        // An empty hash tag in the prefix would scatter one user's keys.
        EXPECT_THROW((void)store.key_for(gcra::config("1/1s", bucket_options{.name = "t"}), u),
                     std::invalid_argument);
        continue;
      }
      const std::string key = store.key_for(gcra::config("1/1s", bucket_options{.name = "t"}), u);
      const auto r = rltest::command(rltest::redis_cluster::node(port),
                                     {"CLUSTER", "KEYSLOT", key});
      ASSERT_EQ(r->type, REDIS_REPLY_INTEGER);
      EXPECT_EQ(store.slot_for<gcra>(u), r->integer) << "prefix \"" << prefix << "\" key " << key;
    }
  }
}

TEST(ClusterUrl, ParsesSeedsAndCredentials) {
  const auto o = redis::parse_cluster_url("redis-cluster://u:pw@10.0.0.1:7000,h2,h3:7002");
  ASSERT_EQ(o.seeds.size(), 3u);
  EXPECT_EQ(o.seeds[0], (redis::node_address{"10.0.0.1", 7000}));
  EXPECT_EQ(o.seeds[1], (redis::node_address{"h2", 6379}));
  EXPECT_EQ(o.seeds[2], (redis::node_address{"h3", 7002}));
  EXPECT_EQ(o.node.user, "u");
  EXPECT_EQ(o.node.password, "pw");
  EXPECT_THROW((void)redis::parse_cluster_url("redis://h:1"), std::invalid_argument);
  EXPECT_THROW((void)redis::parse_cluster_url("redis-cluster://h:1,,h:2"), std::invalid_argument);
  EXPECT_THROW((void)redis::parse_cluster_url("redis-cluster://h:1/2"), std::invalid_argument);
  EXPECT_THROW((void)redis::parse_cluster_url("redis-cluster://h:x"), std::invalid_argument);
  EXPECT_THROW(redis::cluster_store(redis::cluster_options{}), std::invalid_argument);
}

// Verifies that a cluster store set up in code with a user but no password
// is refused by name: AUTH goes out only with a password, so the nodes
// would be reached as the default user, with no AUTH and no error. A
// password alone (the default user) is taken; construction touches no node.
TEST(ClusterStore, UserWithoutPasswordInCodeIsRefusedByName) {
  redis::cluster_options o;
  o.seeds.push_back(redis::node_address{"127.0.0.1", 1});
  o.node.user = "alice";
  try {
    redis::cluster_store store(o);
    ADD_FAILURE() << "a user without a password was taken";
  } catch (const std::invalid_argument& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("options::user \"alice\" is set but options::password is empty"),
              std::string::npos)
        << why;
  }
  o.node.user.clear();
  o.node.password = "s3cret";
  EXPECT_NO_THROW(redis::cluster_store{o});
  o.node.user = "alice";
  EXPECT_NO_THROW(redis::cluster_store{o});
}

// Verifies that a cluster store whose node options carry a read_spin
// outside 0..1000 us is refused by its constructor, naming the value, as
// redis_store refuses it: the node pools were made only on first use, so
// the store was taken and every check then failed as "no cluster node
// answered CLUSTER SLOTS" (a connection_error hiding the bad option).
// Construction touches no node.
TEST(ClusterStore, ReadSpinOutOfRangeIsRefusedByTheConstructor) {
  redis::cluster_options o;
  o.seeds.push_back(redis::node_address{"127.0.0.1", 1});
  for (const long long spin : {-1LL, 1001LL}) {
    o.node.read_spin = std::chrono::microseconds(spin);
    try {
      redis::cluster_store store(o);
      ADD_FAILURE() << "read_spin " << spin << " us was taken";
    } catch (const std::invalid_argument& e) {
      const std::string why = e.what();
      EXPECT_NE(
          why.find("options::read_spin " + std::to_string(spin) + " us is outside 0..1000 us"),
          std::string::npos)
          << why;
    }
  }
  o.node.read_spin = std::chrono::microseconds(1000);
  EXPECT_NO_THROW(redis::cluster_store{o});
}

static_assert(store_for<redis::cluster_store, gcra>);
static_assert(store_clocked_store_for<redis::cluster_store, sliding_window_log>);
static_assert(!store_for<redis::cluster_store, int>);

// Verifies that keys land on all three masters, each on the node that owns its slot.
TEST(ClusterStore, SpreadsKeysOverAllMasters) {
  auto store = make_store("spread");
  const gcra::config cfg("10/1h", bucket_options{.name = "t"});
  std::map<std::string, int> per_node;
  for (int i = 0; i < 300; ++i) {
    const std::string k = "+1555" + std::to_string(1000000 + i);
    const auto d = store.apply(cfg, k, store_time, 1);
    ASSERT_EQ(d.source, decision_source::store);
    const std::string node = store.node_for_slot(store.slot_for<gcra>(k));
    ++per_node[node];
    const int port = std::stoi(node.substr(node.rfind(':') + 1));
    EXPECT_EQ(rltest::redis_cluster::ask(port, {"EXISTS", store.key_for(cfg, k)}), "1") << k;
    store.reset(cfg, k);
    EXPECT_EQ(rltest::redis_cluster::ask(port, {"EXISTS", store.key_for(cfg, k)}), "0") << k;
  }
  EXPECT_EQ(per_node.size(), 3u);
  for (const auto& [node, n] : per_node) EXPECT_GT(n, 50) << node;
  EXPECT_EQ(store.stats().errors, 0u);
}

// Verifies that the limiter drives the cluster store on both clocks.
TEST(ClusterStore, DrivesTheLimiterOnServerAndCallerTime) {
  auto store = make_store("limiter");
  limiter<gcra, redis::cluster_store, redis::server_clock> server(
      gcra::config("2/1h", bucket_options{.name = "t"}), store);
  EXPECT_TRUE(server.try_acquire("+15550001").allowed);
  EXPECT_TRUE(server.try_acquire("+15550001").allowed);
  EXPECT_FALSE(server.try_acquire("+15550001").allowed);
  manual_clock clock;
  limiter<fixed_window, redis::cluster_store, manual_clock> caller(
      fixed_window::config("1/1s", window_options{.name = "t"}), store, clock);
  EXPECT_TRUE(caller.try_acquire("+15550002").allowed);
  EXPECT_FALSE(caller.try_acquire("+15550002").allowed);
}

// Verifies that after SCRIPT FLUSH on every node a batch over all masters
// reloads the scripts (EVAL once per node) and is fully decided by Redis.
TEST(ClusterStore, ReloadsScriptsAfterFlushOnEveryNode) {
  auto store = make_store("flush");
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  std::vector<std::string> keys;
  for (int i = 0; i < 60; ++i) keys.push_back("k" + std::to_string(i));
  std::vector<redis::batch_item> batch;
  for (const auto& k : keys) batch.push_back({k, 1, microseconds{0}});
  (void)store.apply_batch(cfg, std::span<const redis::batch_item>(batch), store_time);
  for (const int p : rltest::shared_cluster().ports()) {
    (void)rltest::redis_cluster::ask(p, {"SCRIPT", "FLUSH"});
  }
  const auto ds = store.apply_batch(cfg, std::span<const redis::batch_item>(batch), store_time);
  for (const auto& d : ds) EXPECT_EQ(d.source, decision_source::store);
  const auto s = store.stats();
  EXPECT_GE(s.script_reloads, 3u);
  EXPECT_EQ(s.errors, 0u);
}

// ---- differential test against memory_store ---------------------------------

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

std::int64_t uniform(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi) {
  return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
}

template <class P>
typename P::config random_config(std::mt19937_64& rng) {
  static const std::int64_t periods[] = {1,       7,         64,         1000,
                                         999'983, 1'000'000, 60'000'000, 3'600'000'000};
  static const std::int64_t limits[] = {1, 2, 3, 5, 10, 37, 100};
  for (;;) {
    try {
      const rate r(limits[uniform(rng, 0, 6)], microseconds{periods[uniform(rng, 0, 7)]});
      if constexpr (std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>) {
        bucket_options o;
        o.name = "t";
        if (uniform(rng, 0, 2) == 0) o.burst = uniform(rng, 1, 2 * r.limit() + 3);
        return typename P::config(r, o);
      } else {
        return typename P::config(r, window_options{uniform(rng, 0, 2) == 0, "t"});
      }
    } catch (const std::invalid_argument&) {
      // e.g. GCRA faster than 1/us: draw again
    }
  }
}

template <class P>
std::vector<event> random_trace(std::mt19937_64& rng, const typename P::config& cfg, int seed) {
  const std::int64_t w = cfg.get_rate().period().count();
  const units limit = cfg.limit();
  static const std::vector<std::string> key_pool = {"+1555", std::string("a\0b", 3), "{br}", "a}b",
                                                    "\xc3\xa9t\xc3\xa9"};
  std::vector<std::string> keys;
  const auto nkeys = uniform(rng, 1, 4);
  for (std::int64_t i = 0; i < nkeys; ++i) {
    keys.push_back(key_pool[static_cast<std::size_t>(uniform(rng, 0, 4))] + std::to_string(seed) +
                   "." + std::to_string(i));
  }
  std::int64_t t = 1'732'950'000'000'000 + uniform(rng, 0, 1'000'000'000);
  std::vector<event> trace;
  // Forced checks: none, some or most of the trace.
  const std::int64_t forced_share = uniform(rng, 0, 2) * 30;
  const auto n = uniform(rng, 20, 80);
  for (std::int64_t i = 0; i < n; ++i) {
    switch (uniform(rng, 0, 7)) {
      case 0: break;
      case 1: t += uniform(rng, 1, 3); break;
      case 2: t += uniform(rng, 0, w); break;
      case 3: t += uniform(rng, 0, 3 * w); break;
      case 4: t -= uniform(rng, 0, w); break;  // time going backwards
      default: t += uniform(rng, 1, std::max<std::int64_t>(1, w / limit)); break;
    }
    event e;
    e.key = keys[static_cast<std::size_t>(uniform(rng, 0, nkeys - 1))];
    e.t = t;
    e.cost = uniform(rng, 0, 5) == 0 ? uniform(rng, 1, limit + 2) : 1;
    const auto k = uniform(rng, 0, 39);
    e.kind = k < 3 ? event::peek : (k == 3 ? event::reset : event::consume);
    if (e.kind == event::consume && uniform(rng, 0, 99) < forced_share) e.kind = event::force;
    trace.push_back(std::move(e));
  }
  return trace;
}

template <class P>
class ClusterDifferential : public ::testing::Test {};

using policies =
    ::testing::Types<fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra>;
TYPED_TEST_SUITE(ClusterDifferential, policies);

// Verifies identical decisions (every field) to memory_store on seeded random
// traces with caller time, keys spread over the masters: half of the traces
// sent as batches that span several nodes, a quarter as async checks all in
// flight at once (per-node multiplexers), an eighth as sync checks through
// the multiplexers, the rest one check per round trip on the pools.
TYPED_TEST(ClusterDifferential, MatchesMemoryStoreOnRandomTraces) {
  using P = TypeParam;
  auto store = make_store(P::name);
  // Same key space, single checks through per-node multiplexers.
  auto mo = store.get_options();
  mo.node.multiplex = 1;
  redis::cluster_store mux_store(mo);
  {
    // Every master has the script cached: a NOSCRIPT resend would otherwise
    // put an async check behind later ones of its key.
    std::mt19937_64 rng(1);
    const auto warm = random_config<P>(rng);
    for (int k = 0; k < 32; ++k) {
      (void)mux_store.apply(warm, "warm" + std::to_string(k), microseconds{1'732'950'000'000'000},
                            1, access::peek);
    }
  }
  const int traces = rltest::diff_traces(300);
  std::set<std::string> nodes;
  for (int seed = 0; seed < traces; ++seed) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(seed) * 7919u + 29u);
    const auto cfg = random_config<P>(rng);
    const auto trace = random_trace<P>(rng, cfg, seed);
    const bool batched = seed % 2 == 1;
    const bool async = seed % 4 == 2;
    const bool mux_sync = seed % 8 == 4;
    std::map<std::string, memory_store<P>> memory;
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
      if (e.kind == event::reset) {
        store.reset(cfg, e.key);
        ++i;
      } else if (async) {
        // Every event up to the next reset in flight at once; each key's
        // checks go to one node in order, so they are applied in order.
        std::mutex m;
        std::condition_variable cv;
        std::size_t left = 0;
        std::vector<std::exception_ptr> errors(trace.size());
        std::vector<int> calls(trace.size(), 0);
        const std::size_t first = i;
        while (i < trace.size() && trace[i].kind != event::reset) ++i;
        left = i - first;
        for (std::size_t j = first; j < i; ++j) {
          mux_store.async_apply(cfg, trace[j].key, microseconds{trace[j].t}, trace[j].cost,
                                access_of(trace[j].kind),
                                [&, j](decision d, std::exception_ptr err) {
                                  std::lock_guard<std::mutex> lock(m);
                                  got[j] = d;
                                  errors[j] = err;
                                  ++calls[j];
                                  --left;
                                  cv.notify_one();
                                });
        }
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [&] { return left == 0; });
        }
        for (std::size_t j = first; j < i; ++j) {
          ASSERT_EQ(calls[j], 1) << "event " << j;
          ASSERT_FALSE(errors[j]) << "event " << j;
        }
      } else if (mux_sync) {
        got[i] = mux_store.apply(cfg, e.key, microseconds{e.t}, e.cost, access_of(e.kind));
        ++i;
      } else if (!batched) {
        got[i] = store.apply(cfg, e.key, microseconds{e.t}, e.cost, access_of(e.kind));
        ++i;
      } else {
        std::vector<redis::batch_item> batch;
        const auto kind = e.kind;
        const std::size_t first = i;
        while (i < trace.size() && trace[i].kind == kind) {
          batch.push_back({trace[i].key, trace[i].cost, microseconds{trace[i].t}});
          ++i;
        }
        auto ds = store.apply_batch(cfg, std::span<const redis::batch_item>(batch),
                                    access_of(kind));
        std::copy(ds.begin(), ds.end(), got.begin() + static_cast<std::ptrdiff_t>(first));
      }
    }
    for (std::size_t j = 0; j < trace.size(); ++j) {
      if (trace[j].kind == event::reset) continue;
      nodes.insert(store.node_for_slot(store.template slot_for<P>(trace[j].key)));
      ASSERT_EQ(describe(got[j]), describe(expected[j]))
          << P::name << " seed " << seed << " event " << j
          << (batched ? " (batched)" : (async ? " (async)" : (mux_sync ? " (multiplexed)" : "")));
    }
    for (const auto& [key, m] : memory) store.reset(cfg, key);
  }
  EXPECT_EQ(nodes.size(), 3u);
  const auto s = store.stats();
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.fail_open + s.fail_closed + s.fallback, 0u);
  const auto ms = mux_store.stats();
  EXPECT_GT(ms.store, 0u);
  EXPECT_EQ(ms.errors, 0u);
  EXPECT_EQ(ms.fail_open + ms.fail_closed + ms.fallback, 0u);
}

// ---- concurrency -------------------------------------------------------------

constexpr int processes = 2;
constexpr int threads_per_process = 8;
constexpr int attempts_per_thread = 40;

template <class Config, class Time>
long run_threads(const redis::cluster_options& o, const Config& cfg, const std::string& key,
                 Time when) {
  redis::cluster_store store(o);
  std::atomic<long> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads_per_process; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < attempts_per_thread; ++j) {
        if (store.apply(cfg, key, when, 1, access::consume).allowed) ++admitted;
      }
    });
  }
  for (auto& t : pool) t.join();
  return admitted.load();
}

template <class Config, class Time>
long admitted_across_processes(const redis::cluster_options& o, const Config& cfg,
                               const std::string& key, Time when) {
  return rltest::sum_in_children(processes, [&](int) { return run_threads(o, cfg, key, when); });
}

// Verifies that 2 processes x 8 threads on one key admit exactly the limit,
// on server time and on caller time, for a key on each master.
TEST(ClusterConcurrency, ProcessesAndThreadsOnOneKeyAdmitExactlyTheLimit) {
  auto o = rltest::shared_cluster().options();
  o.node.prefix = unique_prefix("conc");
  const fixed_window::config window("100/1h", window_options{.name = "t"});
  const gcra::config bucket("100/1h", bucket_options{.name = "t"});
  redis::cluster_store probe(o);
  probe.refresh_topology();
  std::set<std::string> nodes;
  for (int i = 0; nodes.size() < 3; ++i) {
    const std::string key = "hot" + std::to_string(i);
    if (!nodes.insert(probe.node_for_slot(probe.slot_for<fixed_window>(key))).second) continue;
    EXPECT_EQ(admitted_across_processes(o, window, key, store_time), 100) << key;
    EXPECT_EQ(admitted_across_processes(o, bucket, key, microseconds{1'732'950'000'000'000}), 100)
        << key;
  }
}

// ---- resharding ---------------------------------------------------------------

// Verifies that checks running while `redis-cli --cluster reshard` moves slots
// from one master to another follow MOVED/ASK and are neither lost nor
// doubled: every decision equals memory_store's on the same sequence.
TEST(ClusterResharding, ChecksDuringMigrationMatchMemoryStore) {
  auto& cluster = rltest::shared_cluster();
  auto o = cluster.options();
  o.node.prefix = unique_prefix("reshard");
  redis::cluster_store store(o);
  store.refresh_topology();
  const int from_port = cluster.master_of(0);
  int to_port = -1;
  for (const std::uint16_t s : {std::uint16_t{8000}, std::uint16_t{16000}}) {
    if (cluster.master_of(s) != from_port) {
      to_port = cluster.master_of(s);
      break;
    }
  }
  ASSERT_GT(from_port, 0);
  ASSERT_GT(to_port, 0);
  // redis-cli takes the source's lowest slots; use keys in the first 40 of them.
  std::vector<std::uint16_t> source_slots;
  for (std::uint16_t s = 0; s < redis::cluster_slots && source_slots.size() < 40; ++s) {
    if (cluster.master_of(s) == from_port) source_slots.push_back(s);
    if (s > 2000) break;
  }
  ASSERT_EQ(source_slots.size(), 40u);
  const std::set<std::uint16_t> wanted(source_slots.begin(), source_slots.end());
  std::map<std::uint16_t, int> per_slot;
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 120; ++i) {
    const std::string k = "mig" + std::to_string(i);
    const auto s = store.slot_for<token_bucket>(k);
    if (wanted.count(s) != 0 && per_slot[s] < 3) {
      ++per_slot[s];
      keys.push_back(k);
    }
  }
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  struct check {
    std::size_t key;
    std::int64_t t;
  };
  std::vector<check> done;
  std::vector<decision> got;
  std::atomic<bool> stop{false};
  std::exception_ptr failure;
  std::thread checker([&] {
    try {
      std::int64_t t = 1'732'950'000'000'000;
      for (std::size_t i = 0; !stop.load(); ++i) {
        const std::size_t k = (i * 7) % keys.size();
        t += 1000;
        got.push_back(store.apply(cfg, keys[k], microseconds{t}, 1));
        done.push_back({k, t});
      }
    } catch (...) {
      failure = std::current_exception();
    }
  });
  std::this_thread::sleep_for(200ms);
  const int status = rltest::redis_cluster::cli(
      {"--cluster", "reshard", "127.0.0.1:" + std::to_string(from_port), "--cluster-from",
       rltest::redis_cluster::id_of(from_port), "--cluster-to",
       rltest::redis_cluster::id_of(to_port), "--cluster-slots", "40", "--cluster-yes"});
  std::this_thread::sleep_for(300ms);
  stop = true;
  checker.join();
  ASSERT_EQ(status, 0) << "redis-cli --cluster reshard failed";
  if (failure) std::rethrow_exception(failure);
  for (const std::uint16_t s : source_slots) ASSERT_EQ(cluster.master_of(s), to_port) << s;

  std::vector<memory_store<token_bucket>> memory(keys.size());
  long admitted_redis = 0, admitted_memory = 0;
  for (std::size_t i = 0; i < done.size(); ++i) {
    const auto want = memory[done[i].key].apply(cfg, keys[done[i].key], microseconds{done[i].t}, 1,
                                                access::consume);
    admitted_memory += want.allowed ? 1 : 0;
    admitted_redis += got[i].allowed ? 1 : 0;
    ASSERT_EQ(describe(got[i]), describe(want)) << "check " << i << " key " << keys[done[i].key];
  }
  EXPECT_EQ(admitted_redis, admitted_memory);
  const auto s = store.stats();
  EXPECT_GT(s.moved + s.ask, 0u);
  EXPECT_EQ(s.errors, 0u);
  std::cout << "[ reshard  ] " << done.size() << " checks while 40 slots moved: " << s.moved
            << " MOVED, " << s.ask << " ASK, " << s.topology_refreshes << " slot-map reads, "
            << admitted_redis << " admitted\n";
}

}  // namespace

namespace {

/// A TCP port on 127.0.0.1 that accepts connections (the kernel completes
/// the handshake) but never answers: a seed that hangs.
class silent_listener {
 public:
  silent_listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(fd_, 64) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("cannot open a listening socket");
    }
    port_ = ntohs(a.sin_port);
  }
  ~silent_listener() { ::close(fd_); }
  silent_listener(const silent_listener&) = delete;
  silent_listener& operator=(const silent_listener&) = delete;
  [[nodiscard]] int port() const noexcept { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace

// Verifies SPEC "a check never blocks longer than its timeout" before any
// slot map exists: with seeds that accept but never answer, concurrent
// checks each return within connect + command timeout (plus a margin for a
// busy machine), decided by the failure policy, instead of queueing behind
// one another's attempts.
TEST(ClusterStore, ChecksWithoutASlotMapReturnWithinTheirBudget) {
  const silent_listener a;
  const silent_listener b;
  redis::cluster_options o;
  o.seeds = {{"127.0.0.1", a.port()}, {"127.0.0.1", b.port()}};
  o.node.connect_timeout = 100ms;
  o.node.command_timeout = 100ms;
  o.node.on_failure = redis::failure_policy::fail_open;
  redis::cluster_store store(o);
  const gcra::config cfg("10/1h", bucket_options{.name = "t"});
  const auto bound = o.node.connect_timeout + o.node.command_timeout + 300ms;
  std::vector<std::thread> threads;
  std::atomic<int> slow{0};
  std::atomic<int> not_degraded{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 3; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const decision d = store.apply(cfg, "k" + std::to_string(t), store_time, 1);
        if (std::chrono::steady_clock::now() - start > bound) ++slow;
        if (d.source != decision_source::fail_open) ++not_degraded;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(slow.load(), 0);
  EXPECT_EQ(not_degraded.load(), 0);
}

namespace {

/// A port on 127.0.0.1 with nothing listening: connecting is refused.
int refused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("cannot bind a socket");
  }
  ::close(fd);  // bound, never listened on, closed: the port refuses
  return ntohs(a.sin_port);
}

}  // namespace

// Verifies that seeds listed before a live node that refuse connections or
// accept and never answer only cost the first slot-map read its time: the
// store reads the map from the live seed, and from then on every check is
// decided by Redis, exactly (a limit of 3 admits 3 of 5). Production seed
// lists name nodes that have since died or hang.
TEST(ClusterStore, DeadAndSilentSeedsBeforeALiveOneAreSkipped) {
  const silent_listener silent;
  redis::cluster_options o = rltest::shared_cluster().options();
  o.seeds = {{"127.0.0.1", refused_port()},
             {"127.0.0.1", silent.port()},
             {"127.0.0.1", rltest::shared_cluster().ports().front()}};
  o.node.connect_timeout = 300ms;
  o.node.command_timeout = 500ms;
  o.node.on_failure = redis::failure_policy::fail_closed;
  o.node.prefix = unique_prefix("dead-seeds");
  redis::cluster_store store(o);
  const fixed_window::config cfg("3/1h", window_options{.name = "t"});
  // The first check may spend its budget on the silent seed (fail_closed:
  // refused, not counted); a later one finds the map.
  bool mapped = false;
  for (int i = 0; i < 20 && !mapped; ++i) {
    mapped = store.apply(cfg, "probe", store_time, 1).source == decision_source::store;
  }
  ASSERT_TRUE(mapped) << "no check was decided by Redis through the live seed";
  int allowed = 0;
  for (int i = 0; i < 5; ++i) {
    const decision d = store.apply(cfg, "k", store_time, 1);
    EXPECT_EQ(d.source, decision_source::store) << describe(d);
    allowed += d.allowed ? 1 : 0;
  }
  EXPECT_EQ(allowed, 3);
}
