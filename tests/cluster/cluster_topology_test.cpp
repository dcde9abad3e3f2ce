// SPDX-License-Identifier: Apache-2.0
// Slot-map changes forced on a real cluster: checks and resets on a migrating
// slot (ASK, TRYAGAIN), a slot map read before a MOVED never replaces it, and
// redirects and slot maps naming a port outside 1..65535 are refused.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_harness.hpp"
#include "cluster_test_access.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "ratelimit/redis/scripts/compound.hpp"
#include "support/eventually.hpp"
#include "support/reference.hpp"

namespace {

using namespace ratelimit;
using ratelimit_test::reference::describe;
using namespace std::chrono_literals;
using rltest::redis_cluster;
using std::chrono::microseconds;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

redis::cluster_options cluster_opts(std::string_view what) {
  static int n = 0;
  auto o = rltest::shared_cluster().options();
  o.node.prefix = "rltopo:" + std::to_string(::getpid()) + ":" + std::to_string(++n) + ":" +
                  std::string(what) + ":";
  return o;
}

/// A user key other than those in `taken` whose slot is `slot`.
std::string key_in_slot(std::uint16_t slot, std::string_view stem,
                        const std::vector<std::string>& taken = {}) {
  for (int i = 0;; ++i) {
    std::string k = std::string(stem) + std::to_string(i);
    if (redis::key_slot(k) == slot && std::find(taken.begin(), taken.end(), k) == taken.end()) {
      return k;
    }
  }
}

/// Moves one slot from its master to another, by hand, as redis-cli
/// --cluster reshard does: IMPORTING/MIGRATING, MIGRATE keys, SETSLOT NODE.
class slot_migration {
 public:
  explicit slot_migration(std::uint16_t slot) : slot_(std::to_string(slot)) {
    auto& cluster = rltest::shared_cluster();
    from_ = cluster.master_of(slot);
    for (const std::uint16_t s :
         {std::uint16_t{0}, std::uint16_t{6000}, std::uint16_t{12000}, std::uint16_t{16383}}) {
      if (const int p = cluster.master_of(s); p > 0 && p != from_) {
        to_ = p;
        break;
      }
    }
    if (from_ <= 0 || to_ <= 0) throw std::runtime_error("no two masters");
    from_id_ = redis_cluster::id_of(from_);
    to_id_ = redis_cluster::id_of(to_);
  }

  [[nodiscard]] int from() const noexcept { return from_; }
  [[nodiscard]] int to() const noexcept { return to_; }

  /// Marks the slot IMPORTING on the destination and MIGRATING on the source.
  void begin() {
    expect_ok(redis_cluster::ask(to_, {"CLUSTER", "SETSLOT", slot_, "IMPORTING", from_id_}));
    expect_ok(redis_cluster::ask(from_, {"CLUSTER", "SETSLOT", slot_, "MIGRATING", to_id_}));
  }

  /// The slot's keys still on the source that contain `part`.
  [[nodiscard]] std::vector<std::string> keys_left(std::string_view part = {}) const {
    const auto r = rltest::command(redis_cluster::node(from_),
                                   {"CLUSTER", "GETKEYSINSLOT", slot_, "100000"});
    std::vector<std::string> out;
    for (std::size_t i = 0; i < r->elements; ++i) {
      std::string k(r->element[i]->str, r->element[i]->len);
      if (k.find(part) != std::string::npos) out.push_back(std::move(k));
    }
    return out;
  }

  /// MIGRATEs `key` from the source to the destination.
  void move(const std::string& key) const {
    expect_ok(redis_cluster::ask(
        from_, {"MIGRATE", "127.0.0.1", std::to_string(to_), "", "0", "5000", "KEYS", key}));
  }

  /// Moves the remaining keys and gives the slot to the destination.
  void finish() {
    for (const std::string& k : keys_left()) move(k);
    expect_ok(redis_cluster::ask(to_, {"CLUSTER", "SETSLOT", slot_, "NODE", to_id_}));
    expect_ok(redis_cluster::ask(from_, {"CLUSTER", "SETSLOT", slot_, "NODE", to_id_}));
  }

 private:
  static void expect_ok(const std::string& reply) {
    if (reply != "OK") throw std::runtime_error("cluster command answered " + reply);
  }

  std::string slot_;
  int from_ = -1, to_ = -1;
  std::string from_id_, to_id_;
};

std::string name_of(int port) {
  return "127.0.0.1:" + std::to_string(port);
}

// Verifies checks on a slot being migrated: a key already MIGRATEd (and a key
// created during the migration) is answered by the importing node after ASK +
// ASKING, a key still on the source by the source, singly and in a batch, and
// every decision equals an in-process limiter's; then the slot is handed over
// and MOVED takes the checks to the new owner. The ASK counter proves the
// redirects happened.
TEST(ClusterTopology, ChecksOnAMigratingSlotFollowAskAndMatchMemoryStore) {
  redis::cluster_store store(cluster_opts("ask"));
  store.refresh_topology();
  const std::string moved_key = "ask-moved";
  const std::uint16_t slot = store.slot_for<token_bucket>(moved_key);
  const std::string staying_key = key_in_slot(slot, "ask-stays");
  const std::string new_key = key_in_slot(slot, "ask-new");
  slot_migration m(slot);
  ASSERT_EQ(store.node_for_slot(slot), name_of(m.from()));

  const token_bucket::config cfg("4/1s", bucket_options{.name = "t"});
  memory_store<token_bucket> reference;
  std::int64_t t = t0;
  const auto check = [&](const std::string& k) {
    t += 90'000;
    const decision want = reference.apply(cfg, k, microseconds{t}, 1, access::consume);
    const decision got = store.apply(cfg, k, microseconds{t}, 1);
    EXPECT_EQ(describe(got), describe(want)) << k << " at " << t;
  };
  for (int i = 0; i < 3; ++i) {
    check(moved_key);
    check(staying_key);
  }

  m.begin();
  const auto moved = m.keys_left("{" + moved_key + "}");
  ASSERT_EQ(moved.size(), 1u);
  m.move(moved.front());
  const auto before = store.stats();
  for (int i = 0; i < 8; ++i) {
    check(moved_key);
    check(staying_key);
    check(new_key);
  }
  // A batch mixing both nodes of the slot: one pipeline each, ASKING per item.
  std::vector<std::string> batch_keys = {moved_key, staying_key, new_key, moved_key, staying_key};
  std::vector<redis::batch_item> items;
  std::vector<decision> want;
  for (const std::string& k : batch_keys) {
    t += 50'000;
    items.push_back({k, 1, microseconds{t}});
    want.push_back(reference.apply(cfg, k, microseconds{t}, 1, access::consume));
  }
  const std::vector<decision> got = store.apply_batch(cfg, items);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(describe(got[i]), describe(want[i])) << "batch item " << i;
  }
  const auto during = store.stats();
  // Every check of the moved and the new key met ASK: the map is not updated by one.
  EXPECT_GE(during.ask - before.ask, 8u + 8u + 3u);
  EXPECT_EQ(store.node_for_slot(slot), name_of(m.from()));
  EXPECT_EQ(during.errors, 0u);

  m.finish();
  for (int i = 0; i < 4; ++i) {
    check(moved_key);
    check(staying_key);
    check(new_key);
  }
  const auto after = store.stats();
  EXPECT_GT(after.moved, during.moved);
  EXPECT_EQ(store.node_for_slot(slot), name_of(m.to()));
  EXPECT_EQ(after.errors, 0u);
  EXPECT_EQ(after.fail_open + after.fail_closed + after.fallback, 0u);
}

using two_limits = compound<token_bucket, fixed_window>;

// Verifies reset() of a compound key whose sub-keys are split between the two
// nodes of a migrating slot: the DEL meets TRYAGAIN until the rest of the
// keys is MIGRATEd, and reset() keeps retrying (instead of throwing) until the
// importing node deletes them all.
TEST(ClusterTopology, ResetRetriesTryagainWhileACompoundKeysSlotIsHalfMigrated) {
  redis::cluster_store store(cluster_opts("tryagain"));
  store.refresh_topology();
  const two_limits::config cfg(compound_options{.name = "two"}, token_bucket::config("5/1s"),
                               fixed_window::config("9/1min"));
  const std::string user = "split-user";
  const std::uint16_t slot = store.slot_for<two_limits>(user);
  slot_migration m(slot);
  ASSERT_TRUE(store.apply(cfg, user, microseconds{t0}, 1).allowed);
  ASSERT_EQ(store.apply(cfg, user, microseconds{t0}, 1).remaining, 3);
  const std::string tag = "{" + user + "}";
  const auto keys = m.keys_left(tag);
  ASSERT_EQ(keys.size(), 2u);

  m.begin();
  m.move(keys.front());
  const std::uint64_t tryagain_before = store.stats().tryagain;
  std::exception_ptr failure;
  std::thread resetter([&] {
    try {
      store.reset(cfg, user);
    } catch (...) {
      failure = std::current_exception();
    }
  });
  // Move the other key only once reset() has met TRYAGAIN (or already gave up).
  const bool met = rltest::eventually([&] { return store.stats().tryagain > tryagain_before; },
                                      2ms);
  for (const std::string& k : m.keys_left(tag)) m.move(k);
  resetter.join();
  EXPECT_TRUE(met) << "reset() never met TRYAGAIN";
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "reset() threw: " << e.what();
    }
  }
  m.finish();
  // Both sub-keys are gone: the next check starts from a full limit.
  EXPECT_EQ(store.apply(cfg, user, microseconds{t0}, 1).remaining, 4);
  EXPECT_EQ(m.keys_left(tag).size(), 0u);
  const auto on_dest = rltest::command(redis_cluster::node(m.to()),
                                       {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)});
  EXPECT_EQ(on_dest->integer, 2);  // written again by the check above
}

// Verifies a slot map read before a MOVED update is not installed over it:
// while one read is between CLUSTER SLOTS and installing its map, the slot
// moves and a check learns so from MOVED; the older map must not send the
// slot back to its old master.
TEST(ClusterTopology, SlotMapReadBeforeAMovedUpdateIsNotInstalled) {
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  std::atomic<int> reads{0};
  std::atomic<bool> release{false};
  std::atomic<bool> moved_in_hook{false};
  // A key whose slot holds no key yet: the tests run before this one in the
  // same process share its cluster and may have left keys in any slot (the
  // fixed key "stale-map" shared its slot with ClusterStore's "k34").
  std::string key;
  std::uint16_t slot = 0;
  for (int i = 0; key.empty() && i < 1000; ++i) {
    const std::string k = "stale-map" + std::to_string(i);
    slot = redis::key_slot(k);
    const int master = rltest::shared_cluster().master_of(slot);
    if (master > 0 && rltest::redis_cluster::ask(
                          master, {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}) == "0") {
      key = k;
    }
  }
  ASSERT_FALSE(key.empty()) << "no empty slot among 1000 keys";
  slot_migration m(slot);
  redis::cluster_store store(cluster_opts("stale"));
  ASSERT_EQ(
      rltest::redis_cluster::ask(m.from(), {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}),
      "0");
  redis::detail::cluster_test_access::on_slots_read(store, [&] {
    const int n = reads.fetch_add(1);
    if (n == 1) {
      // This read's reply still has the slot on m.from().
      m.begin();
      m.finish();
      const decision d = store.apply(cfg, key, microseconds{t0}, 1);
      moved_in_hook = d.source == decision_source::store && d.remaining == 4;
    } else if (n > 1) {
      // Later reads (the refresher, woken by the MOVED) wait for the verdict.
      (void)rltest::eventually([&] { return release.load(); }, 2ms);
    }
  });
  store.refresh_topology();
  ASSERT_EQ(store.node_for_slot(slot), name_of(m.from()));
  const auto before = store.stats();
  store.refresh_topology();
  EXPECT_TRUE(moved_in_hook.load());
  const auto after = store.stats();
  EXPECT_GT(after.moved, before.moved);
  EXPECT_EQ(after.stale_maps, before.stale_maps + 1);
  EXPECT_EQ(store.node_for_slot(slot), name_of(m.to())) << "a stale slot map was installed";
  release = true;
  // The refresher reads the map again and keeps the slot where it is.
  ASSERT_TRUE(rltest::eventually(
      [&] { return store.stats().topology_refreshes > after.topology_refreshes; }, 2ms));
  EXPECT_EQ(store.node_for_slot(slot), name_of(m.to()));
  EXPECT_EQ(store.apply(cfg, key, microseconds{t0}, 1).remaining, 3);
}

/// The reply hiredis reads from the RESP bytes `resp`.
redis::reply_ptr read_reply(std::string_view resp) {
  redisReader* reader = redisReaderCreate();
  void* out = nullptr;
  const bool ok = redisReaderFeed(reader, resp.data(), resp.size()) == REDIS_OK &&
                  redisReaderGetReply(reader, &out) == REDIS_OK && out != nullptr;
  redisReaderFree(reader);
  if (!ok) throw std::runtime_error("bad RESP in a test");
  return redis::reply_ptr(static_cast<redisReply*>(out));
}

// Verifies that a MOVED or ASK answer naming port 0 or a port past 65535 is
// not taken for a redirect (it was: any 1-5 digits, 0..99999), while every
// real port, and an IPv6 host in brackets, is.
TEST(ClusterRedirect, PortsOutsideOneTo65535AreNotRedirects) {
  for (const std::string_view bad :
       {"-MOVED 1 h:0\r\n", "-MOVED 1 h:00000\r\n", "-ASK 1 h:65536\r\n", "-MOVED 1 h:99999\r\n",
        "-MOVED 1 h:123456\r\n", "-MOVED 1 h:\r\n", "-MOVED 1 h:-1\r\n"}) {
    EXPECT_FALSE(redis::detail::parse_redirect(*read_reply(bad), "asked", 1)) << bad;
  }
  const auto low = redis::detail::parse_redirect(*read_reply("-MOVED 16383 h:1\r\n"), "asked",
                                                 16383);
  ASSERT_TRUE(low);
  EXPECT_EQ(low->to.port, 1);
  EXPECT_EQ(low->slot, 16383);
  const auto high = redis::detail::parse_redirect(*read_reply("-ASK 7 [::1]:65535\r\n"), "asked",
                                                  7);
  ASSERT_TRUE(high);
  EXPECT_TRUE(high->ask);
  EXPECT_EQ(high->to.host, "::1");
  EXPECT_EQ(high->to.port, 65535);
  const auto same = redis::detail::parse_redirect(*read_reply("-MOVED 7 :7001\r\n"), "asked", 7);
  ASSERT_TRUE(same);
  EXPECT_EQ(same->to.host, "asked");
}

// Verifies that a redirect naming a slot other than the check's is not
// followed (a hostile or confused node could otherwise repoint any slot of
// the map), and that a host holding control bytes, spaces or non-ASCII
// bytes, or over 255 bytes, is not a redirect.
TEST(ClusterRedirect, OtherSlotsAndHostileHostsAreNotRedirects) {
  EXPECT_TRUE(redis::detail::parse_redirect(*read_reply("-MOVED 7 h:1\r\n"), "asked", 7));
  EXPECT_FALSE(redis::detail::parse_redirect(*read_reply("-MOVED 7 h:1\r\n"), "asked", 8));
  EXPECT_FALSE(redis::detail::parse_redirect(*read_reply("-ASK 0 h:1\r\n"), "asked", 16383));
  for (const std::string& host :
       {std::string("h\rX"), std::string("h\x01"), std::string("a b"), std::string("h\xc3\xa9"),
        std::string(256, 'h'), std::string("h\x7f")}) {
    const std::string resp = "-MOVED 7 " + host + ":7001\r\n";
    EXPECT_FALSE(redis::detail::parse_redirect(*read_reply(resp), "asked", 7)) << host;
  }
  EXPECT_TRUE(redis::detail::parse_redirect(
      *read_reply("-MOVED 7 " + std::string(255, 'h') + ":1\r\n"), "asked", 7));
}

// Verifies that a CLUSTER SLOTS reply whose master port is not 1..65535 is
// refused whole (it was installed, the port cast to int unchecked: 2^32 + 7001
// became 7001, -1 and 0 became addresses no node has) and that the store keeps
// routing by its old map.
TEST(ClusterRedirect, SlotMapWithAPortOutsideOneTo65535IsRefused) {
  redis::cluster_store store(cluster_opts("badport"));
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 4);
  const std::string before = store.node_for_slot(0);
  ASSERT_FALSE(before.empty());
  const auto map = [](std::string_view port) {
    return "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + std::string(port) + "\r\n";
  };
  for (const std::string_view port : {"0", "-1", "65536", "4294974297", "-4294967295"}) {
    EXPECT_FALSE(redis::detail::cluster_test_access::install_slots(store, *read_reply(map(port)),
                                                                   "127.0.0.1"))
        << port;
    EXPECT_EQ(store.node_for_slot(0), before) << port;
    EXPECT_EQ(store.node_for_slot(16383).empty(), false) << port;
  }
  EXPECT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 3);
}

// Verifies that a CLUSTER SLOTS reply naming a master host that a MOVED or
// ASK could not name (detail::plausible_node_host: a control byte, a space,
// a byte past ASCII, over 255 bytes) is refused whole, as a hostile or
// broken node's answer: it was installed, and the host connected to and
// quoted in messages as is ("\r\nX-Forged: 1" into a log line). The store
// keeps routing by its old map.
TEST(ClusterRedirect, SlotMapWithAHostileHostIsRefused) {
  redis::cluster_store store(cluster_opts("badhost"));
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  ASSERT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 4);
  const std::string before = store.node_for_slot(0);
  ASSERT_FALSE(before.empty());
  const auto map = [](const std::string& host) {
    return "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$" + std::to_string(host.size()) + "\r\n" + host +
           "\r\n:7000\r\n";
  };
  for (const std::string& host :
       {std::string("h\r\nX-Forged: 1"), std::string("h\x01"), std::string("a b"),
        std::string("h\xc3\xa9"), std::string(256, 'h'), std::string("h\x7f"),
        std::string("\x1b[31m")}) {
    EXPECT_FALSE(redis::detail::cluster_test_access::install_slots(store, *read_reply(map(host)),
                                                                   "127.0.0.1"))
        << redis::detail::escaped_name(host);
    EXPECT_EQ(store.node_for_slot(0), before);
  }
  EXPECT_TRUE(redis::detail::plausible_node_host(std::string(255, 'h')));
  EXPECT_TRUE(redis::detail::plausible_node_host(""));
  EXPECT_TRUE(redis::detail::plausible_node_host("::1"));
  EXPECT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 3);
}

}  // namespace
