// SPDX-License-Identifier: Apache-2.0
// The Redis Cluster store: each check runs its script on the master owning the key's slot.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/redis/cluster/hash_slot.hpp"
#include "ratelimit/redis/cluster/node.hpp"
#include "ratelimit/redis/cluster/options.hpp"
#include "ratelimit/redis/cluster/redirect.hpp"
#include "ratelimit/redis/cluster/retry_queue.hpp"
#include "ratelimit/redis/cluster/thread_mark.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/multiplexer.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"

namespace ratelimit::redis {

/// Counters of a cluster store (and its copies): those of store_stats summed
/// over every node, plus the cluster's own. A snapshot.
struct cluster_stats : store_stats {
  std::uint64_t moved = 0;     ///< MOVED redirects followed (the slot map was updated)
  std::uint64_t ask = 0;       ///< ASK redirects followed (ASKING sent to the importing node)
  std::uint64_t tryagain = 0;  ///< TRYAGAIN answers retried
  std::uint64_t topology_refreshes = 0;  ///< slot maps read with CLUSTER SLOTS and installed
  /// Slot maps that went stale while read: dropped (another map was installed
  /// meanwhile) or installed but for the slots MOVED meanwhile. Another read follows.
  std::uint64_t stale_maps = 0;
};

namespace detail {

/// Lets tests reach into a cluster_store (declared here, defined by tests only).
struct cluster_test_access;

}  // namespace detail

/// Stores the state of every policy in a Redis Cluster: each check runs the
/// policy's Lua script (as redis_store does, same keys, same replies) on the
/// master that owns the hash slot of its key.
///
/// - The slot map is read with CLUSTER SLOTS from any known node (the seeds
///   first time), on first use and then in a background thread whenever a
///   check meets a MOVED, a broken connection, a timeout or an unknown slot
///   (at most once per refresh_interval). What was learned while a read was
///   in flight may be newer than its reply: a map whose read began before
///   another map was installed is dropped, and no map overrides a slot MOVED
///   since its read began (another read follows). Nodes absent from a new map
///   are forgotten: their pools close once no check in flight uses them.
/// - MOVED: the slot map is updated and the check resent to the new owner.
///   ASK: the check is resent to the importing node after ASKING, without
///   updating the map. TRYAGAIN: resent after 5 ms. These are safe because
///   the script did not run; a timeout or broken connection is never retried
///   (the script may have run): the failure policy decides that check.
/// - Each node has its own connection pool and circuit breaker, so an
///   unreachable master degrades only the checks of its slots.
/// - A batch is split per node; every node's pipeline is written before any
///   reply is read, so the nodes work in parallel without extra threads.
/// - reset() follows MOVED and ASK, and retries TRYAGAIN (a multi-key DEL
///   while the slot's keys are half migrated) with a growing pause for up to
///   the command timeout.
/// - Single checks with options::multiplex > 0, and every async_apply(), go
///   through the node's multiplexer (one I/O thread per node, started on
///   first use); redirects are followed from the completion without waiting
///   (see async_apply and docs/semantics.md).
///
/// A cheap copyable handle: copies share the slot map, pools,
/// multiplexers, breakers, fallback limiters, counters and the refresh and
/// retry threads (joined when the last copy goes).
///
/// fork(): a store belongs to the process that made it. In a child forked
/// after, checks (async_apply() too), reset(), ping(), refresh_topology(),
/// node_for_slot() and known_nodes() throw std::logic_error (the pooled sockets are the
/// parent's), and destroying the store leaks its state rather than join the
/// parent's threads or touch locks they may have held; make a new store in
/// the child.
///
/// Thread safety: all member functions may be called from any number of
/// threads on one object or its copies.
class cluster_store {
 public:
  /// Connects lazily: construction never touches the network.
  /// @throws std::invalid_argument without seeds, with a unix socket or a
  ///   database other than 0, or with node.user set but node.password empty
  explicit cluster_store(cluster_options o) : shared_(new shared(std::move(o)), shared_deleter{}) {}

  /// Refuses an unnamed config (see redis_store::check_config).
  /// @throws std::invalid_argument when `cfg.name()` is empty
  template <class Config>
  static void check_config(const Config& cfg) {
    detail::check_named(cfg);
  }

  /// Refuses a caller-supplied time the scripts cannot take (see
  /// redis_store::check_caller_time). ratelimit::asio calls it before
  /// starting a check.
  /// @throws std::invalid_argument naming the time
  static void check_caller_time(timestamp now) { detail::check_script_time(now); }

  /// Applies `Config::policy_type` to `key` at the caller's time `now`
  /// (microseconds since the Unix epoch, 0 .. 2^52).
  /// @throws std::invalid_argument for a bad key, cost or time; store_error
  ///   subclasses only under failure_policy::throw_error
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply(const Config& cfg, std::string_view key, timestamp now, units cost,
                 access a = access::consume) {
    detail::check_named(cfg);
    detail::check_input(key, cost);
    detail::check_script_time(now);
    if (shared_->opts.node.multiplex > 0) return run_multiplexed(cfg, key, now, cost, a);
    return run(cfg, std::span<const std::string_view>(&key, 1), std::span<const units>(&cost, 1),
               std::span<const timestamp>(&now, 1), a)
        .front();
  }

  /// As above, at the TIME of the Redis master owning the key.
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply(const Config& cfg, std::string_view key, store_time_t, units cost,
                 access a = access::consume) {
    detail::check_named(cfg);
    detail::check_input(key, cost);
    if (shared_->opts.node.multiplex > 0) {
      return run_multiplexed(cfg, key, std::optional<timestamp>{}, cost, a);
    }
    return run(cfg, std::span<const std::string_view>(&key, 1), std::span<const units>(&cost, 1),
               std::span<const timestamp>(), a)
        .front();
  }

  /// Applies `Config::policy_type` to `key` at `now` without blocking, as
  /// redis_store::async_apply does: the check goes through the multiplexer
  /// of the master owning the key's slot (options::multiplex connections per
  /// node, at least one) and `handler(decision, std::exception_ptr)` is
  /// called exactly once, with the decision or with the error the sync
  /// apply() would throw. MOVED, ASK, TRYAGAIN and NOSCRIPT (the script did
  /// not run) are followed from the completion, which queues the check on the
  /// other node's multiplexer; nothing waits. Before the first slot map is
  /// read, or for a slot it does not name, the check goes to a seed node
  /// (which answers it or redirects it) and the map is read in the background.
  /// The handler runs on the I/O thread of the node that answered; inline on
  /// the calling thread when the check is decided without I/O (that node's
  /// circuit breaker open, or no I/O thread could be started: a
  /// connection_error for the failure policy); on the store's retry thread
  /// when a check sent again after TRYAGAIN is decided there without I/O;
  /// and, when the store's last
  /// copy is destroyed with the check in flight, on the destroying thread
  /// with multiplexer_stopped (no failure policy; when the last copy went on
  /// an I/O thread, on a thread the store starts for its destruction). A
  /// handler must not block on this store (a sync apply() there throws
  /// std::logic_error with options::multiplex > 0; with 0 it goes through
  /// the pool and stalls the I/O thread for its round trip) and should not
  /// throw (what it throws is ignored).
  /// @throws std::invalid_argument for a bad key, cost or time (before
  ///   anything starts; the handler is then not called); std::logic_error in
  ///   a child forked after the store was made; multiplexer_stopped when
  ///   called (from a handler) while the store is being destroyed
  template <class Config, class Handler>
    requires policy<typename Config::policy_type> &&
             std::invocable<Handler&, decision, std::exception_ptr>
  void async_apply(const Config& cfg, std::string_view key, timestamp now, units cost, access a,
                   Handler handler) {
    detail::check_named(cfg);
    detail::check_input(key, cost);
    detail::check_script_time(now);
    start_check(cfg, key, std::optional<timestamp>{now}, cost, a, std::move(handler));
  }

  /// As above, at the TIME of the Redis master owning the key.
  template <class Config, class Handler>
    requires policy<typename Config::policy_type> &&
             std::invocable<Handler&, decision, std::exception_ptr>
  void async_apply(const Config& cfg, std::string_view key, store_time_t, units cost, access a,
                   Handler handler) {
    detail::check_named(cfg);
    detail::check_input(key, cost);
    start_check(cfg, key, std::optional<timestamp>{}, cost, a, std::move(handler));
  }

  /// Idempotent check (see redis_store::apply_once): one script on the
  /// master owning the key; the id key shares the key's slot.
  /// @throws std::invalid_argument for a bad key, id, cost, time or retention
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply_once(const Config& cfg, std::string_view key, request_id id,
                      std::chrono::microseconds retention, timestamp now, units cost,
                      access a = access::consume) {
    detail::check_named(cfg);
    detail::check_input(key, cost);
    ratelimit::detail::check_request_id(id);
    detail::check_script_retention(retention);
    detail::check_script_time(now);
    const detail::once_request once{id.bytes, std::to_string(cfg.limit()),
                                    std::to_string(retention.count())};
    return run(cfg, std::span<const std::string_view>(&key, 1), std::span<const units>(&cost, 1),
               std::span<const timestamp>(&now, 1), a, &once)
        .front();
  }

  /// As above, at the TIME of the Redis master owning the key.
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply_once(const Config& cfg, std::string_view key, request_id id,
                      std::chrono::microseconds retention, store_time_t, units cost,
                      access a = access::consume) {
    detail::check_named(cfg);
    detail::check_input(key, cost);
    ratelimit::detail::check_request_id(id);
    detail::check_script_retention(retention);
    const detail::once_request once{id.bytes, std::to_string(cfg.limit()),
                                    std::to_string(retention.count())};
    return run(cfg, std::span<const std::string_view>(&key, 1), std::span<const units>(&cost, 1),
               std::span<const timestamp>(), a, &once)
        .front();
  }

  /// Checks many keys: one pipeline per node, all nodes at once; results in
  /// input order. Items of one key are applied in input order. The failure
  /// policy is applied per item that got no answer.
  template <class Config>
    requires policy<typename Config::policy_type>
  std::vector<decision> apply_batch(const Config& cfg, std::span<const batch_item> items,
                                    access a = access::consume) {
    detail::check_named(cfg);
    for (const batch_item& it : items) {
      detail::check_input(it.key, it.cost);
      detail::check_script_time(it.now);
    }
    return run_items(cfg, items, false, a);
  }

  /// As above, every item at the TIME of the master owning its key.
  template <class Config>
    requires policy<typename Config::policy_type>
  std::vector<decision> apply_batch(const Config& cfg, std::span<const batch_item> items,
                                    store_time_t, access a = access::consume) {
    detail::check_named(cfg);
    for (const batch_item& it : items) detail::check_input(it.key, it.cost);
    return run_items(cfg, items, true, a);
  }

  /// Forgets `key` (DEL on its master, following redirects; the fallback
  /// limiter forgets it too).
  /// @throws store_error when the cluster cannot be reached, whatever the failure policy
  template <class Config>
    requires policy<typename Config::policy_type>
  void reset(const Config& cfg, std::string_view key) {
    using P = typename Config::policy_type;
    detail::check_named(cfg);
    ratelimit::detail::check_key(key);
    detail::check_same_process(shared_->owner_pid);
    if (const auto fb = shared_->degrader.template find<P>(cfg)) fb->store.reset(fb->cfg, key);
    const std::vector<std::string> ks = detail::redis_keys(shared_->opts.node.prefix, cfg, key);
    std::vector<std::string_view> args{"DEL"};
    for (const std::string& k : ks) args.push_back(k);
    reply_ptr r = shared_->single(key_slot(ks.front()), args.data(), args.size());
    if (r->type == REDIS_REPLY_ERROR) {
      throw script_error("ratelimit: redis: DEL failed: " + detail::reply_text(*r));
    }
  }

  /// Reads the slot map now and PINGs every master.
  /// @throws connection_error when no node answers or a master does not
  void ping() {
    detail::check_same_process(shared_->owner_pid);
    if (!shared_->refresh(deadline_clock::now() + shared_->budget())) {
      shared_->throw_no_slot_map();
    }
    for (const auto& n : shared_->masters()) {
      const std::string_view args[] = {"PING"};
      auto lease = n->pool.acquire(deadline_clock::now() + shared_->command_timeout);
      reply_ptr r = lease->command(args, 1, deadline_clock::now() + shared_->command_timeout);
      if (r->type == REDIS_REPLY_ERROR) {
        throw connection_error("ratelimit: redis: PING " + detail::escaped_name(n->name) +
                               " failed: " + detail::reply_text(*r));
      }
    }
  }

  /// Reads the slot map now (CLUSTER SLOTS), in the calling thread.
  /// @throws connection_error when no known node answers
  void refresh_topology() {
    detail::check_same_process(shared_->owner_pid);
    if (!shared_->refresh(deadline_clock::now() + shared_->budget())) {
      shared_->throw_no_slot_map();
    }
  }

  /// `host:port` of the master this store believes owns `slot`; empty when unknown.
  [[nodiscard]] std::string node_for_slot(std::uint16_t slot) const {
    detail::check_same_process(shared_->owner_pid);
    std::shared_lock<std::shared_mutex> lock(shared_->topo_mutex);
    const auto& n = shared_->slots.at(slot);
    return n == nullptr ? std::string() : n->name;
  }

  /// `host:port` of every node the store keeps a connection pool for, sorted:
  /// the masters of the current slot map and ASK targets met since it was read.
  [[nodiscard]] std::vector<std::string> known_nodes() const {
    detail::check_same_process(shared_->owner_pid);
    std::shared_lock<std::shared_mutex> lock(shared_->topo_mutex);
    std::vector<std::string> out;
    for (const auto& [name, n] : shared_->nodes) out.push_back(name);
    return out;
  }

  /// The Redis keys holding `key`'s state under `cfg` (see redis_store::keys_for).
  /// @throws std::invalid_argument for an unnamed config or a bad key
  template <class Config>
  [[nodiscard]] std::vector<std::string> keys_for(const Config& cfg, std::string_view key) const {
    ratelimit::detail::check_key(key);
    return detail::redis_keys(shared_->opts.node.prefix, cfg, key);
  }

  /// The Redis key holding `key`'s state under a (non-compound) `cfg`.
  /// @throws std::invalid_argument for an unnamed config or a bad key
  template <class Config>
  [[nodiscard]] std::string key_for(const Config& cfg, std::string_view key) const {
    return keys_for(cfg, key).front();
  }

  /// The hash slot of `key`'s Redis keys under `cfg` (CLUSTER KEYSLOT of key_for(cfg, key)).
  template <class Config>
  [[nodiscard]] std::uint16_t slot_for(const Config& cfg, std::string_view key) const {
    return key_slot(key_for(cfg, key));
  }

  /// The hash slot of `key`'s Redis keys for policy P, whatever the limiter's
  /// name (the hash tag holds only the user key).
  template <class P>
  [[nodiscard]] std::uint16_t slot_for(std::string_view key) const {
    return key_slot(detail::redis_key<P>(shared_->opts.node.prefix, key, "slot"));
  }

  /// Counters of decisions, errors, breakers, redirects and refreshes.
  [[nodiscard]] cluster_stats stats() const noexcept {
    const detail::counters& c = shared_->stats;
    const auto get = [](const std::atomic<std::uint64_t>& a) {
      return a.load(std::memory_order_relaxed);
    };
    cluster_stats s;
    s.store = get(c.store);
    s.fail_open = get(c.fail_open);
    s.fail_closed = get(c.fail_closed);
    s.fallback = get(c.fallback);
    s.errors = get(c.errors);
    s.timeouts = get(c.timeouts);
    s.short_circuited = get(c.short_circuited);
    s.breaker_opened = get(c.breaker_opened);
    s.script_reloads = get(c.script_reloads);
    s.probes = get(c.probes);
    s.probe_failures = get(c.probe_failures);
    s.fallback_limiters = shared_->degrader.fallbacks_held();
    s.moved = get(shared_->moved);
    s.ask = get(shared_->ask);
    s.tryagain = get(shared_->tryagain);
    s.topology_refreshes = get(shared_->refreshes);
    s.stale_maps = get(shared_->stale_maps);
    return s;
  }

  [[nodiscard]] const cluster_options& get_options() const noexcept { return shared_->opts; }

 private:
  friend struct detail::cluster_test_access;
  using node_ptr = std::shared_ptr<detail::cluster_node>;

  struct shared {
    explicit shared(cluster_options o)
        : opts(validated(std::move(o))),
          command_timeout(opts.node.command_timeout.count() > 0 ? opts.node.command_timeout
                                                                : std::chrono::milliseconds{100}),
          connect_timeout(opts.node.connect_timeout.count() > 0 ? opts.node.connect_timeout
                                                                : std::chrono::milliseconds{200}),
          refresh_interval(opts.refresh_interval.count() > 0 ? opts.refresh_interval
                                                             : std::chrono::milliseconds{100}),
          max_redirects(opts.max_redirects == 0 ? 5 : opts.max_redirects),
          floor_ms(std::to_string(opts.node.caller_time_ttl_floor.count())),
          degrader(opts.node.on_failure, opts.node.fallback_divisor),
          slots(cluster_slots),
          learned_at(cluster_slots) {}

    shared(const shared&) = delete;
    shared& operator=(const shared&) = delete;

    ~shared() {
      // Before the retry thread's checks complete: they get
      // multiplexer_stopped, not the failure policy (nor a breaker failure).
      stopping_io.store(true, std::memory_order_release);
      retries.stop();  // sends to the nodes
      stop_io();       // completions use the prober, refresher and counters
      // A check may still be completing on the I/O thread of a node the
      // store no longer holds (it left the slot map and that check was its
      // last, so stop_io() did not see it): wait for it, stopping again any
      // node it was queued on meanwhile.
      while (live_checks.load(std::memory_order_acquire) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        stop_io();
      }
      prober.stop();  // its probes use the nodes
      {
        std::lock_guard<std::mutex> lock(refresh_mutex);
        stopping = true;
      }
      refresh_cv.notify_all();
      if (refresher.joinable()) refresher.join();
    }

    /// Stops the multiplexers of every node made so far (the slot map's and
    /// those it left, still held by checks in flight): their checks get
    /// multiplexer_stopped. A completion that was following a redirect as
    /// this began may queue its check on another node, even a new one: rounds
    /// go on until one finds no node it has not stopped.
    ///
    /// Allocates nothing (it runs in the destructor, maybe with memory
    /// short): one node is held at a time, and once stopping_io is set the
    /// registry only grows at its end (node_locked erases nothing then), so
    /// each round takes the nodes appended since the last.
    void stop_io() noexcept {
      stopping_io.store(true, std::memory_order_release);
      std::size_t from = 0;
      for (;;) {
        std::size_t i = from;
        for (;; ++i) {
          node_ptr n;
          {
            std::lock_guard<std::mutex> lock(registry_mutex);
            if (i >= registry.size()) break;
            n = registry[i].lock();
          }
          if (n != nullptr) n->stop_io();
        }
        if (i == from) return;
        from = i;
      }
    }

    /// True on the I/O thread of one of this store's nodes, or its retry
    /// thread (where a blocking check could wait for itself): one
    /// thread-local read. The retry thread is marked as it starts; an I/O
    /// thread by the first check completing on it, before any handler can
    /// run there (see check_job::complete).
    [[nodiscard]] bool on_io_thread() const noexcept { return detail::cluster_thread_mark() == id; }

    /// Counts a failed round trip to `node`; when it opens the node's breaker,
    /// has the node probed in the background. The probe owns the node, so the
    /// node outlives its probes even once it left the slot map.
    void gate_failed(detail::cluster_node& node) noexcept {
      if (!node.gate.failure()) return;
      stats.breaker_opened.fetch_add(1, std::memory_order_relaxed);
      bool watched = false;
      try {
        watched = prober.watch(node.gate, [this, n = node.shared_from_this()] {
          return detail::probe_ping(n->pool, command_timeout, stats);
        });
      } catch (...) {
      }
      // Without a prober nothing would close it: let checks try the node again.
      if (!watched) node.gate.success();
    }

    static cluster_options validated(cluster_options o) {
      if (o.seeds.empty()) {
        throw std::invalid_argument("ratelimit: redis cluster: at least one seed node is needed");
      }
      if (!o.node.unix_socket.empty() || o.node.database != 0) {
        throw std::invalid_argument(
            "ratelimit: redis cluster: nodes are reached over TCP and have only database 0");
      }
      if (o.node.tls.enabled) (void)detail::tls_context_for(o.node.tls);  // names a bad file
      (void)multiplexer::checked(o.node.multiplex);
      // The node pools are made on first use, where a refusal would surface
      // as "no cluster node answered": refuse it here, naming the value.
      detail::check_read_spin(o.node.read_spin);
      detail::check_credentials(o.node, "ratelimit: redis cluster");
      if (!o.node.sentinel.master_name.empty() || !o.node.sentinel.sentinels.empty()) {
        throw std::invalid_argument(
            "ratelimit: redis cluster: Sentinel is for redis_store (a cluster fails over by "
            "itself)");
      }
      return o;
    }

    /// Time allowed to the first, synchronous read of the slot map.
    [[nodiscard]] deadline_clock::duration budget() const noexcept {
      return connect_timeout + command_timeout;
    }

    /// The node at `a`, made on first use. Caller holds topo_mutex exclusively.
    node_ptr node_locked(const node_address& a) {
      std::string name = detail::node_name(a);
      if (const auto it = nodes.find(name); it != nodes.end()) return it->second;
      options o = opts.node;
      o.host = a.host;
      o.port = a.port;
      node_ptr n(new detail::cluster_node(name, std::move(o)), detail::cluster_node_deleter{});
      {
        std::lock_guard<std::mutex> lock(registry_mutex);
        // Not while stop_io() walks the registry by index.
        if (!stopping_io.load(std::memory_order_acquire)) {
          std::erase_if(registry,
                        [](const std::weak_ptr<detail::cluster_node>& w) { return w.expired(); });
        }
        registry.push_back(n);
      }
      nodes.emplace(std::move(name), n);
      return n;
    }

    [[nodiscard]] node_ptr owner(std::uint16_t slot) {
      std::shared_lock<std::shared_mutex> lock(topo_mutex);
      return slots[slot];
    }

    /// After MOVED: `slot` now lives on `a`. A slot map read in flight may
    /// predate this: the generation stamp keeps its entry for `slot` out.
    node_ptr learn(std::uint16_t slot, const node_address& a) {
      std::unique_lock<std::shared_mutex> lock(topo_mutex);
      node_ptr n = node_locked(a);
      slots[slot] = n;
      learned_at[slot] = ++generation;
      return n;
    }

    node_ptr node_at(const node_address& a) {
      std::unique_lock<std::shared_mutex> lock(topo_mutex);
      return node_locked(a);
    }

    /// Distinct masters of the current slot map.
    [[nodiscard]] std::vector<node_ptr> masters() {
      std::shared_lock<std::shared_mutex> lock(topo_mutex);
      std::vector<node_ptr> out;
      for (const node_ptr& n : slots) {
        if (n != nullptr && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
      }
      return out;
    }

    /// Reads the slot map from the first node that answers, trying current
    /// masters, other known nodes, then the seeds; gives up at `until`. When
    /// the map changed while the read was in flight (see apply_slots), a
    /// background read is asked for.
    /// @return true when a slot map was read (installed, in part or not at all)
    bool refresh(deadline until) noexcept {
      std::string why;
      const bool read = read_slots(until, why);
      std::lock_guard<std::mutex> lock(tls_failure_mutex);
      tls_failure.swap(why);  // only this attempt's TLS failure is named later
      return read;
    }

    /// refresh() without the note: `tls_why` is set to the last TLS failure
    /// of this attempt.
    bool read_slots(deadline until, std::string& tls_why) noexcept {
      try {
        std::vector<node_address> candidates;
        std::uint64_t started = 0;
        const auto add = [&](const node_address& a) {
          if (std::find(candidates.begin(), candidates.end(), a) == candidates.end()) {
            candidates.push_back(a);
          }
        };
        {
          std::shared_lock<std::shared_mutex> lock(topo_mutex);
          started = generation;
          node_ptr last;
          for (const node_ptr& n : slots) {
            if (n != nullptr && n != last) add(node_address{n->opts.host, n->opts.port});
            last = n;
          }
          for (const auto& [name, n] : nodes) add(node_address{n->opts.host, n->opts.port});
        }
        for (const node_address& s : opts.seeds) add(s);
        for (const node_address& a : candidates) {
          if (deadline_clock::now() >= until) return false;
          try {
            options o = opts.node;
            o.host = a.host;
            o.port = a.port;
            // Connecting must not outlast `until` either.
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(until -
                                                                           deadline_clock::now());
            o.connect_timeout = std::max(std::chrono::milliseconds{1},
                                         std::min(o.connect_timeout, left));
            connection c(o);
            const std::string_view args[] = {"CLUSTER", "SLOTS"};
            reply_ptr r = c.command(args, 2,
                                    std::min(until, deadline_clock::now() + command_timeout));
            if (slots_read_hook) slots_read_hook();
            switch (apply_slots(*r, a.host, started)) {
              case install::done: refreshes.fetch_add(1, std::memory_order_relaxed); return true;
              case install::merged:
                refreshes.fetch_add(1, std::memory_order_relaxed);
                [[fallthrough]];
              case install::stale:
                stale_maps.fetch_add(1, std::memory_order_relaxed);
                request_refresh();
                return true;
              case install::bad: break;
            }
          } catch (const tls_error& e) {  // try the next node; a TLS failure is named
            tls_why = e.what();
          } catch (const store_error&) {
            // try the next node
          }
        }
      } catch (...) {
        // allocation failure: keep the old map
      }
      return false;
    }

    /// No node answered CLUSTER SLOTS; the last TLS failure, if any, is named.
    [[noreturn]] void throw_no_slot_map() {
      std::string what = "ratelimit: redis: no cluster node answered CLUSTER SLOTS";
      {
        std::lock_guard<std::mutex> lock(tls_failure_mutex);
        if (!tls_failure.empty()) what += " (last TLS failure: " + tls_failure + ")";
      }
      throw connection_error(what);
    }

    /// done: installed; merged: installed but for slots MOVED since the read
    /// began; stale: dropped (another map was installed since); bad: unreadable.
    enum class install : unsigned char { done, merged, stale, bad };

    /// Installs the map of a CLUSTER SLOTS reply
    /// ([[start, end, [host, port, id, ...], replica...], ...]) read from
    /// generation `started` on. CLUSTER SLOTS carries no config epoch, so
    /// anything learned after the read began may be newer than the reply: a
    /// map installed since wins over it whole, a MOVED since wins for its
    /// slot. Forgets the nodes the installed map leaves out. A master host
    /// that a MOVED could not name (detail::plausible_node_host) makes the
    /// reply bad.
    install apply_slots(const redisReply& r, const std::string& asked_host, std::uint64_t started) {
      if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return install::bad;
      struct range {
        std::uint16_t first, last;
        node_address at;
      };
      std::vector<range> ranges;
      for (std::size_t i = 0; i < r.elements; ++i) {
        const redisReply& e = *r.element[i];
        if (e.type != REDIS_REPLY_ARRAY || e.elements < 3) return install::bad;
        const redisReply& lo = *e.element[0];
        const redisReply& hi = *e.element[1];
        const redisReply& m = *e.element[2];
        if (lo.type != REDIS_REPLY_INTEGER || hi.type != REDIS_REPLY_INTEGER ||
            m.type != REDIS_REPLY_ARRAY || m.elements < 2 ||
            m.element[0]->type != REDIS_REPLY_STRING || m.element[1]->type != REDIS_REPLY_INTEGER ||
            m.element[1]->integer < 1 || m.element[1]->integer > 65535 || lo.integer < 0 ||
            hi.integer < lo.integer || hi.integer >= cluster_slots) {
          return install::bad;
        }
        std::string host(m.element[0]->str, m.element[0]->len);
        // The rule of MOVED and ASK: a host holding a control byte, a space
        // or a byte past ASCII, or over 255 bytes, makes the reply
        // unreadable (it was connected to, and quoted in messages, as is).
        if (!detail::plausible_node_host(host)) return install::bad;
        if (host.empty() || host == "?") host = asked_host;
        ranges.push_back(
            range{static_cast<std::uint16_t>(lo.integer), static_cast<std::uint16_t>(hi.integer),
                  node_address{std::move(host), static_cast<int>(m.element[1]->integer)}});
      }
      // Declared before the lock: the nodes left out (and the old map) are
      // let go of after it is released.
      std::vector<node_ptr> fresh(cluster_slots);
      std::vector<node_ptr> left;
      install outcome = install::done;
      {
        std::unique_lock<std::shared_mutex> lock(topo_mutex);
        if (map_generation > started) return install::stale;
        std::set<const detail::cluster_node*> in_map;
        for (const range& g : ranges) {
          const node_ptr n = node_locked(g.at);
          in_map.insert(n.get());
          for (unsigned s = g.first; s <= g.last; ++s) fresh[s] = n;
        }
        if (generation != started) {
          for (std::size_t s = 0; s < cluster_slots; ++s) {
            if (learned_at[s] <= started) continue;
            fresh[s] = slots[s];
            in_map.insert(fresh[s].get());
            outcome = install::merged;
          }
        }
        slots.swap(fresh);
        for (auto it = nodes.begin(); it != nodes.end();) {
          if (in_map.count(it->second.get()) != 0) {
            ++it;
          } else {
            left.push_back(std::move(it->second));
            it = nodes.erase(it);
          }
        }
        map_generation = ++generation;
        have_map = true;
      }
      // A node that left is no longer probed (a closed breaker drops out of
      // the prober, which then lets go of the node).
      for (const node_ptr& n : left) n->gate.success();
      return outcome;
    }

    /// Reads the slot map in the calling thread if none was read yet.
    /// @throws connection_error when no node answers
    void ensure_map() {
      {
        std::shared_lock<std::shared_mutex> lock(topo_mutex);
        if (have_map) return;
      }
      // One caller reads the first map; the others wait for it no longer
      // than their own budget.
      const deadline until = deadline_clock::now() + budget();
      // (try_lock in a loop rather than std::timed_mutex, whose clocked lock
      // ThreadSanitizer does not see.)
      std::unique_lock<std::mutex> once(first_map_mutex, std::try_to_lock);
      while (!once.owns_lock()) {
        if (deadline_clock::now() >= until) {
          throw timeout_error("ratelimit: redis: the cluster slot map is still being read");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{1});
        once.try_lock();
      }
      {
        std::shared_lock<std::shared_mutex> lock(topo_mutex);
        if (have_map) return;
      }
      // Right after a failed read, answer at once: the background refresher
      // keeps trying, so callers do not each wait out the seeds' timeouts.
      if (last_map_failure && deadline_clock::now() < *last_map_failure + refresh_interval) {
        request_refresh();
        throw_no_slot_map();
      }
      if (!refresh(until)) {
        last_map_failure = deadline_clock::now();
        request_refresh();
        throw_no_slot_map();
      }
    }

    /// Asks the background thread to read the slot map again (throttled).
    void request_refresh() noexcept {
      try {
        std::lock_guard<std::mutex> lock(refresh_mutex);
        if (stopping) return;
        refresh_wanted = true;
        if (!refresher.joinable()) refresher = std::thread([this] { refresh_loop(); });
      } catch (...) {
        return;  // no thread: the next MOVED or failure asks again
      }
      refresh_cv.notify_one();
    }

    void refresh_loop() noexcept {
      std::unique_lock<std::mutex> lock(refresh_mutex);
      for (;;) {
        refresh_cv.wait(lock, [&] { return stopping || refresh_wanted; });
        if (stopping) return;
        refresh_wanted = false;
        lock.unlock();
        (void)refresh(deadline_clock::now() + 4 * budget());
        lock.lock();
        refresh_cv.wait_for(lock, refresh_interval, [&] { return stopping; });
      }
    }

    /// One command on the master of `slot`, following MOVED and ASK (reset).
    /// @throws store_error
    reply_ptr single(std::uint16_t slot, const std::string_view* args, std::size_t n) {
      ensure_map();
      node_ptr node = owner(slot);
      bool asking = false;
      // TRYAGAIN (keys of one command split between the two nodes of a
      // migrating slot) lasts until the migration moves the rest: retried
      // from the slot's owner, pausing longer each time, up to this.
      const deadline give_up = deadline_clock::now() + command_timeout;
      std::chrono::milliseconds pause{5};
      for (std::size_t hop = 0;; ++hop) {
        if (node == nullptr) {
          request_refresh();
          throw connection_error("ratelimit: redis: no known master for slot " +
                                 std::to_string(slot));
        }
        const deadline until = deadline_clock::now() + command_timeout;
        reply_ptr r;
        try {
          auto lease = node->pool.acquire(until);
          const deadline end = until + lease.connect_time();
          if (asking) {
            std::string buf;
            const std::string_view ask_args[] = {"ASKING"};
            append_command(buf, ask_args, 1);
            append_command(buf, args, n);
            lease->send(buf, end);
            (void)lease->receive(end);
            r = lease->receive(end);
          } else {
            r = lease->command(args, n, end);
          }
        } catch (const connection_error&) {
          request_refresh();
          throw;
        }
        if (detail::error_starts(*r, "TRYAGAIN")) {
          tryagain.fetch_add(1, std::memory_order_relaxed);
          if (deadline_clock::now() + pause >= give_up) return r;
          std::this_thread::sleep_for(pause);
          pause = std::min(pause * 2, std::chrono::milliseconds{50});
          node = owner(slot);
          asking = false;
          hop = 0;
          continue;
        }
        const auto redirect = detail::parse_redirect(*r, node->opts.host, slot);
        if (!redirect || hop >= max_redirects) return r;
        asking = redirect->ask;
        if (asking) {
          ask.fetch_add(1, std::memory_order_relaxed);
          node = node_at(redirect->to);
        } else {
          moved.fetch_add(1, std::memory_order_relaxed);
          node = learn(redirect->slot, redirect->to);
          request_refresh();
        }
      }
    }

    const pid_t owner_pid = ::getpid();                        ///< see shared_deleter
    const std::uint64_t id = detail::next_cluster_store_id();  ///< see on_io_thread
    cluster_options opts;
    /// Every node made, as long as something holds it (see stop_io).
    std::mutex registry_mutex;
    std::vector<std::weak_ptr<detail::cluster_node>> registry;
    std::atomic<bool> stopping_io{false};     ///< the store is being destroyed
    std::atomic<std::size_t> live_checks{0};  ///< check_jobs not yet destroyed (see ~shared)
    detail::cluster_retry_queue retries{id};  ///< checks sent again after TRYAGAIN
    std::mutex tls_failure_mutex;
    std::string tls_failure;  ///< the TLS failure of the last slot map read, if any
    std::chrono::milliseconds command_timeout;
    std::chrono::milliseconds connect_timeout;
    std::chrono::milliseconds refresh_interval;
    std::size_t max_redirects;
    std::string floor_ms;
    detail::degrader degrader;
    detail::counters stats;
    std::atomic<std::uint64_t> moved{0}, ask{0}, tryagain{0}, refreshes{0}, stale_maps{0};

    std::shared_mutex topo_mutex;
    std::vector<node_ptr> slots;            ///< owner of each slot; null = unknown
    std::map<std::string, node_ptr> nodes;  ///< masters of the map and ASK targets, by "host:port"
    std::uint64_t generation = 0;           ///< bumped by every change of `slots`
    std::uint64_t map_generation = 0;       ///< generation of the last map installed
    std::vector<std::uint64_t> learned_at;  ///< generation of each slot's last MOVED
    bool have_map = false;
    std::mutex first_map_mutex;
    std::optional<deadline> last_map_failure;  ///< guarded by first_map_mutex

    std::mutex refresh_mutex;
    std::condition_variable refresh_cv;
    bool refresh_wanted = false;
    bool stopping = false;
    std::thread refresher;

    detail::prober prober;  ///< probes nodes whose breaker is open

    /// Test seam (set before first use): runs between reading CLUSTER SLOTS
    /// and installing its map.
    std::function<void()> slots_read_hook;
  };

  /// Destroys the shared state with the last copy of the store, as
  /// detail::delete_unless_forked (leaked in a forked child). When the last
  /// copy goes on an I/O thread of one of its nodes (a handler held it), that
  /// thread cannot join itself: a thread of its own destroys the state, and
  /// the checks still in flight get multiplexer_stopped there.
  /// Handlers running on this thread (of any cluster store).
  static int& in_handler() noexcept {
    static thread_local int depth = 0;
    return depth;
  }

  struct shared_deleter {
    void operator()(shared* p) const noexcept {
      if (p->owner_pid != ::getpid()) return;
      // In a handler the check is alive, and ~shared waits for it.
      if (p->on_io_thread() || in_handler() > 0) {
        try {
          std::thread([p] { delete p; }).detach();
          return;
        } catch (...) {
          // No thread: joining itself below ends in std::terminate.
        }
      }
      delete p;
    }
  };

  /// The ASKING sent right before a check an ASK redirected (cluster/async_check.hpp).
  struct asking_job;
  /// One single check through the nodes' multiplexers (cluster/async_check.hpp).
  template <class Config, class Handler>
  struct check_job;

  /// Starts one check on the multiplexer of the node owning its slot (a
  /// seed when the slot has no known owner), or decides it at once when
  /// that node's breaker is open. `handler` gets the outcome exactly once.
  /// (cluster/async_check.hpp)
  template <class Config, class Handler>
  void start_check(const Config& cfg, std::string_view key, std::optional<timestamp> now,
                   units cost, access a, Handler&& handler);

  /// A single check through the multiplexers, waited for on this thread.
  template <class Config>
  decision run_multiplexed(const Config& cfg, std::string_view key, std::optional<timestamp> now,
                           units cost, access a) {
    detail::check_same_process(shared_->owner_pid);
    shared& st = *shared_;
    if (st.on_io_thread()) {
      throw std::logic_error(
          "ratelimit: redis: a blocking check on the cluster store's I/O thread (inside an async "
          "handler) would wait for itself; use async_apply there");
    }
    try {
      st.ensure_map();
    } catch (const connection_error&) {
      const std::exception_ptr e = std::current_exception();
      detail::count_error(st.stats, e);
      return st.degrader.degrade(st.stats, cfg, key, now, cost, a, e);
    }
    return detail::sync_wait(
        [&](auto handler) { start_check(cfg, key, now, cost, a, std::move(handler)); });
  }

  // The pooled path: cluster/batch.hpp.

  /// What became of one check.
  enum class fate : unsigned char;
  /// One check of a round.
  struct item;
  /// The items of one round trip to one node.
  struct group;

  template <class Config>
  std::vector<decision> run_items(const Config& cfg, std::span<const batch_item> items,
                                  bool server_time, access a);

  void node_failed(group& g, std::exception_ptr e);

  /// Rounds of pipelines, one per node, until every check is decided or given
  /// up: redirects and NOSCRIPT go round again; a check whose round trip broke
  /// or timed out is never sent again.
  template <class Config>
  std::vector<decision> run(const Config& cfg, std::span<const std::string_view> keys,
                            std::span<const units> costs, std::span<const timestamp> times,
                            access a, const detail::once_request* once = nullptr);

  /// Decides what one reply means for its check.
  template <class Config>
  void classify(const Config& cfg, item& it, const redisReply& r, detail::cluster_node* node,
                decision& out, bool& noscript, bool& wait, bool once);

  std::shared_ptr<shared> shared_;
};

}  // namespace ratelimit::redis

// The async checks and the pooled path, defined out of the class.
#include "ratelimit/redis/cluster/async_check.hpp"  // IWYU pragma: export
#include "ratelimit/redis/cluster/batch.hpp"        // IWYU pragma: export
