// SPDX-License-Identifier: Apache-2.0
// The Redis store: every check is one Lua script, shared by every application node.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/redis/breaker.hpp"
#include "ratelimit/redis/check_outcome.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/degrader.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/fork_guard.hpp"
#include "ratelimit/redis/keys.hpp"
#include "ratelimit/redis/multiplexer.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/script_call.hpp"
#include "ratelimit/redis/scripts/compound.hpp"
#include "ratelimit/redis/scripts/fixed_window.hpp"
#include "ratelimit/redis/scripts/gcra.hpp"
#include "ratelimit/redis/scripts/leases.hpp"
#include "ratelimit/redis/scripts/request_id.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/redis/scripts/sliding_window_counter.hpp"
#include "ratelimit/redis/scripts/sliding_window_log.hpp"
#include "ratelimit/redis/scripts/token_bucket.hpp"
#include "ratelimit/redis/sentinel.hpp"
#include "ratelimit/redis/stats.hpp"
#include "ratelimit/redis/sync_wait.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace ratelimit::redis {

/// Marker clock: the time of every check is the Redis server's TIME, read
/// inside the script, so every node shares one clock. Use as
/// `limiter<P, redis::redis_store, redis::server_clock>`.
struct server_clock {
  static constexpr bool reads_store_time = true;
};

/// One check of a batch (see redis_store::apply_batch).
struct batch_item {
  /// The user key, 1..512 bytes, binary safe.
  std::string_view key;
  /// Units this request takes, >= 1.
  units cost = 1;
  /// Caller-supplied time, microseconds since the Unix epoch; ignored when
  /// the batch runs on server time.
  timestamp now{0};
};

/// Stores the state of every policy in Redis: each check runs the policy's
/// Lua script (script_for<P>) with EVALSHA, atomically and in one round trip;
/// on NOSCRIPT the script is resent once with EVAL. Keys are
/// `<prefix>{<user key>}:<policy>:<limiter name>` (detail::redis_key), so every
/// config must be named (check_config); every key written carries a TTL set
/// in the same script, and the fingerprint of the config that wrote it: state
/// written under another config is converted or ignored per policy (see
/// docs/semantics.md, "State written under another config").
///
/// A cheap copyable handle: copies share one connection pool, circuit
/// breaker, fallback limiters and counters.
///
/// fork(): a store belongs to the process that made it. In a child forked
/// after, checks, reset() and ping() throw std::logic_error (the pooled
/// sockets are the parent's), and destroying the store leaks its state
/// instead of touching locks or threads of the parent; make a new store in
/// the child.
///
/// Thread safety: all member functions may be called from any number of
/// threads on one object or its copies.
class redis_store {
 public:
  /// Connects lazily: construction never touches the network. With
  /// `o.sentinel` set, every connection goes to the master the sentinels name
  /// (see sentinel_locator).
  /// @throws std::invalid_argument for bad sentinel options (see
  ///   sentinel_locator), or a user (options::user, sentinel.user) set
  ///   without its password (see detail::check_credentials)
  explicit redis_store(options o = {}) : shared_(new shared(std::move(o)), shared_deleter{}) {}

  /// Refuses a config this store cannot key: an unnamed one. `limiter`'s
  /// constructor calls it, so a missing name fails at start-up.
  /// @throws std::invalid_argument when `cfg.name()` is empty
  template <class Config>
  static void check_config(const Config& cfg) {
    detail::check_named(cfg);
  }

  /// Refuses a caller-supplied time the scripts cannot take: outside
  /// 0 .. 2^52 us (Lua numbers are exact only below 2^53), narrower than the
  /// limiter's 0 .. 2^62. ratelimit::asio calls it before starting a check.
  /// @throws std::invalid_argument naming the time
  static void check_caller_time(timestamp now) { check_script_time(now); }

  /// Applies `Config::policy_type` to `key` at the caller's time `now`.
  /// @param now  microseconds since the Unix epoch (or any epoch shared by all
  ///             callers), 0 .. 2^52 us
  /// @param cost units this request takes, >= 1
  /// @throws std::invalid_argument for a bad key, cost or time; store_error
  ///   subclasses only under failure_policy::throw_error
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply(const Config& cfg, std::string_view key, timestamp now, units cost,
                 access a = access::consume) {
    detail::check_named(cfg);
    check_input(key, cost);
    check_script_time(now);
    return run(cfg, key, std::optional<timestamp>{now}, cost, a);
  }

  /// As above, at the Redis server's TIME.
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply(const Config& cfg, std::string_view key, store_time_t, units cost,
                 access a = access::consume) {
    detail::check_named(cfg);
    check_input(key, cost);
    return run(cfg, key, std::optional<timestamp>{}, cost, a);
  }

  /// Applies `Config::policy_type` to `key` at `now` without blocking: the
  /// check goes through the store's multiplexer (options::multiplex
  /// connections, at least one) and `handler(decision, std::exception_ptr)`
  /// is called exactly once: with the decision and a null exception_ptr, or
  /// with the error that the sync apply() would throw (store_error
  /// subclasses only under failure_policy::throw_error; the failure policy
  /// decides every other failure, as for apply()). It runs on the store's
  /// I/O thread; inline on the calling thread when the check is decided
  /// without I/O (circuit breaker open, or the I/O thread cannot be started:
  /// a connection_error for the failure policy); and, when the store's last copy is
  /// destroyed with the check in flight, on the destroying thread with a
  /// multiplexer_stopped error (no failure policy: the store is gone; when
  /// the last copy went on the I/O thread, with a handler that held it, on
  /// a thread the store starts for its destruction). A handler must not
  /// block on this store (a sync apply() there throws std::logic_error) and
  /// should not throw (what it throws is ignored).
  /// @throws std::invalid_argument for a bad key, cost or time (before
  ///   anything starts; the handler is then not called); std::logic_error
  ///   in a child forked after the store was made; multiplexer_stopped when
  ///   called (from a handler) while the store is being destroyed
  template <class Config, class Handler>
    requires policy<typename Config::policy_type> &&
             std::invocable<Handler&, decision, std::exception_ptr>
  void async_apply(const Config& cfg, std::string_view key, timestamp now, units cost, access a,
                   Handler handler) {
    detail::check_named(cfg);
    check_input(key, cost);
    check_script_time(now);
    start_check(cfg, key, std::optional<timestamp>{now}, cost, a, std::move(handler));
  }

  /// As above, at the Redis server's TIME.
  template <class Config, class Handler>
    requires policy<typename Config::policy_type> &&
             std::invocable<Handler&, decision, std::exception_ptr>
  void async_apply(const Config& cfg, std::string_view key, store_time_t, units cost, access a,
                   Handler handler) {
    detail::check_named(cfg);
    check_input(key, cost);
    start_check(cfg, key, std::optional<timestamp>{}, cost, a, std::move(handler));
  }

  /// Idempotent check (limiter::try_acquire with a request_id): the id and
  /// the policy are one script (scripts/request_id.hpp). A degraded decision
  /// records no id.
  /// @param retention 1 .. 2^52 us
  /// @throws std::invalid_argument for a bad key, id, cost, time or retention
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply_once(const Config& cfg, std::string_view key, request_id id,
                      std::chrono::microseconds retention, timestamp now, units cost,
                      access a = access::consume) {
    detail::check_named(cfg);
    check_input(key, cost);
    ratelimit::detail::check_request_id(id);
    detail::check_script_retention(retention);
    check_script_time(now);
    const detail::once_request once{id.bytes, std::to_string(cfg.limit()),
                                    std::to_string(retention.count())};
    return run_batch_impl(cfg, std::span<const std::string_view>(&key, 1),
                          std::span<const units>(&cost, 1), std::span<const timestamp>(&now, 1), a,
                          &once)
        .front();
  }

  /// As above, at the Redis server's TIME.
  template <class Config>
    requires policy<typename Config::policy_type>
  decision apply_once(const Config& cfg, std::string_view key, request_id id,
                      std::chrono::microseconds retention, store_time_t, units cost,
                      access a = access::consume) {
    detail::check_named(cfg);
    check_input(key, cost);
    ratelimit::detail::check_request_id(id);
    detail::check_script_retention(retention);
    const detail::once_request once{id.bytes, std::to_string(cfg.limit()),
                                    std::to_string(retention.count())};
    return run_batch_impl(cfg, std::span<const std::string_view>(&key, 1),
                          std::span<const units>(&cost, 1), std::span<const timestamp>(), a, &once)
        .front();
  }

  /// Checks many keys in one round trip (pipelined EVALSHAs, applied in
  /// order), each at its item's caller-supplied time. The failure policy is
  /// applied per item that got no answer.
  template <class Config>
    requires policy<typename Config::policy_type>
  std::vector<decision> apply_batch(const Config& cfg, std::span<const batch_item> items,
                                    access a = access::consume) {
    detail::check_named(cfg);
    for (const batch_item& it : items) {
      check_input(it.key, it.cost);
      check_script_time(it.now);
    }
    return run_batch(cfg, items, false, a);
  }

  /// As above, every item at the Redis server's TIME.
  template <class Config>
    requires policy<typename Config::policy_type>
  std::vector<decision> apply_batch(const Config& cfg, std::span<const batch_item> items,
                                    store_time_t, access a = access::consume) {
    detail::check_named(cfg);
    for (const batch_item& it : items) check_input(it.key, it.cost);
    return run_batch(cfg, items, true, a);
  }

  /// Forgets `key` (DEL of its Redis key; the fallback limiter forgets it too).
  /// @throws store_error when Redis cannot be reached, whatever the failure policy
  template <class Config>
    requires policy<typename Config::policy_type>
  void reset(const Config& cfg, std::string_view key) {
    using P = typename Config::policy_type;
    detail::check_named(cfg);
    ratelimit::detail::check_key(key);
    detail::check_same_process(shared_->owner_pid);
    if (const auto fb = shared_->degrader.template find<P>(cfg)) fb->store.reset(fb->cfg, key);
    const std::vector<std::string> ks = detail::redis_keys(shared_->opts.prefix, cfg, key);
    std::vector<std::string_view> args{"DEL"};
    for (const std::string& k : ks) args.push_back(k);
    auto lease = acquire();
    reply_ptr r = lease->command(args.data(), args.size(), command_deadline());
    if (r->type == REDIS_REPLY_ERROR)
      throw script_error("ratelimit: redis: DEL failed: " + detail::reply_text(*r));
  }

  /// Round trip to the server (PING).
  /// @throws connection_error when it cannot be reached
  void ping() {
    detail::check_same_process(shared_->owner_pid);
    const std::string_view args[] = {"PING"};
    auto lease = acquire();
    reply_ptr r = lease->command(args, 1, command_deadline());
    if (r->type == REDIS_REPLY_ERROR)
      throw connection_error("ratelimit: redis: PING failed: " + detail::reply_text(*r));
  }

  /// The Redis keys holding `key`'s state under `cfg`: one,
  /// `<prefix>{<key>}:<policy>:<cfg.name()>`, or one per sub-limit of a
  /// compound (that followed by `:<i>:<sub-policy>`).
  /// @throws std::invalid_argument for an unnamed config or a bad key
  template <class Config>
  [[nodiscard]] std::vector<std::string> keys_for(const Config& cfg, std::string_view key) const {
    ratelimit::detail::check_key(key);
    return detail::redis_keys(shared_->opts.prefix, cfg, key);
  }

  /// The Redis key holding `key`'s state under a (non-compound) `cfg`.
  /// @throws std::invalid_argument for an unnamed config or a bad key
  template <class Config>
  [[nodiscard]] std::string key_for(const Config& cfg, std::string_view key) const {
    return keys_for(cfg, key).front();
  }

  /// Counters of decisions made without Redis, errors and breaker activity.
  [[nodiscard]] store_stats stats() const noexcept {
    const detail::counters& c = shared_->stats;
    const auto get = [](const std::atomic<std::uint64_t>& a) {
      return a.load(std::memory_order_relaxed);
    };
    return store_stats{
        get(c.store),           get(c.fail_open),      get(c.fail_closed),
        get(c.fallback),        get(c.errors),         get(c.timeouts),
        get(c.short_circuited), get(c.breaker_opened), get(c.script_reloads),
        get(c.probes),          get(c.probe_failures), shared_->degrader.fallbacks_held()};
  }

  /// True while the circuit breaker answers checks without trying Redis (a
  /// background thread probes it and closes the breaker when it answers).
  [[nodiscard]] bool circuit_open() const noexcept { return shared_->breaker.is_open(); }

  [[nodiscard]] const options& get_options() const noexcept { return shared_->opts; }

 private:
  struct shared {
    explicit shared(options o)
        : opts(checked(std::move(o))),
          sentinel(detail::make_sentinel_link(opts,
                                              [this] {
                                                pool.renew();
                                                mux.renew();
                                              })),
          pool(opts, detail::sentinel_opener(sentinel.get())),
          breaker(opts),
          degrader(opts.on_failure, opts.fallback_divisor),
          command_timeout(opts.command_timeout.count() > 0 ? opts.command_timeout
                                                           : std::chrono::milliseconds{100}),
          floor_ms(std::to_string(opts.caller_time_ttl_floor.count())) {}
    shared(const shared&) = delete;
    shared& operator=(const shared&) = delete;
    static options checked(options o) {
      detail::check_credentials(o, "ratelimit: redis");
      return o;
    }
    /// The multiplexer's completions and the prober's probes use the pool,
    /// breaker and counters, and the sentinel watcher the pool: stop them
    /// first. Checks still in flight get multiplexer_stopped.
    ~shared() {
      stopping.store(true, std::memory_order_release);
      mux.stop();
      prober.stop();
      if (sentinel) sentinel->watcher->stop();
    }

    /// Sentinel, after a multiplexed check failed with `error`: a connection
    /// that broke or answered READONLY (a failover, a demotion) means the
    /// master may have moved, so every shared connection is retired (as
    /// the sentinels' announcement does) and the pool's idle ones dropped
    /// (as a pooled check's failure does); the next checks ask the
    /// sentinels. A check refused for a full queue says nothing of the master.
    void master_may_have_moved(const std::exception_ptr& error) noexcept {
      try {
        std::rethrow_exception(error);
      } catch (const multiplexer_full&) {
        return;
      } catch (const connection_error&) {
      } catch (...) {
        return;
      }
      mux.renew();
      pool.clear();
    }

    /// Counts a failed round trip; when it opens the breaker, has it probed.
    void failed() noexcept {
      if (!breaker.failure()) return;
      stats.breaker_opened.fetch_add(1, std::memory_order_relaxed);
      bool watched = false;
      try {
        watched = prober.watch(breaker,
                               [this] { return detail::probe_ping(pool, command_timeout, stats); });
      } catch (...) {
      }
      // Without a prober nothing would close it: let checks try Redis again.
      if (!watched) breaker.success();
    }

    const pid_t owner_pid = ::getpid();  ///< see shared_deleter
    options opts;
    std::unique_ptr<detail::sentinel_link> sentinel;  ///< null without Sentinel
    connection_pool pool;
    detail::breaker breaker;
    detail::degrader degrader;
    detail::counters stats;
    std::chrono::milliseconds command_timeout;
    std::string floor_ms;
    /// I/O thread started on first use; its connections read maxmemory-policy
    /// as the pool's do (one warning per store).
    multiplexer mux{opts, opts.multiplex,
                    [this](connection& c, deadline start) { pool.check_new_connection(c, start); },
                    detail::sentinel_opener(sentinel.get())};
    std::atomic<bool> stopping{false};  ///< the store is being destroyed
    detail::prober prober;              ///< last: destroyed (joined) first
  };

  /// Destroys the shared state with the last copy of the store, as
  /// detail::delete_unless_forked (leaked in a forked child). When the last
  /// copy goes on the store's I/O thread (a handler held it, or destroyed
  /// it), that thread cannot join itself: a thread of its own destroys the
  /// state once the I/O thread is back in its loop, and the checks still in
  /// flight get multiplexer_stopped there.
  struct shared_deleter {
    void operator()(shared* p) const noexcept {
      if (p->owner_pid != ::getpid()) return;
      if (p->mux.on_io_thread()) {
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

  /// One single check through the multiplexer: EVALSHA, then EVAL once
  /// after NOSCRIPT (the script did not run), never resent otherwise.
  template <class Config, class Handler>
  struct check_job final : mux_job {
    check_job(shared* st, const Config& c, std::string_view k, std::optional<timestamp> t, units n,
              access acc, Handler&& h)
        : s(st), cfg(c), key(k), now(t), cost(n), a(acc), handler(std::move(h)) {}

    shared* s;
    Config cfg;
    std::string key;
    std::optional<timestamp> now;
    units cost;
    access a;
    Handler handler;
    bool reloaded = false;
    /// Refused by the multiplexer's pending cap (multiplexer_full): local
    /// overload, not a Redis fault, so no failure for the circuit breaker.
    bool refused_full = false;

    /// The command: EVALSHA, or EVAL with the script's text, the bytes
    /// write_check_command writes, formatted in place as on the pooled path
    /// (append_single_eval: no vector of key strings; the policy's arguments
    /// in this thread's reused vector), so that beyond `bytes` itself it
    /// allocates nothing for a single-key policy.
    void build(bool with_text) {
      using P = typename Config::policy_type;
      thread_local std::vector<std::string> args;
      bytes.clear();
      bytes.reserve(with_text ? script_for<P>::text.size() + 256 : 256);
      detail::append_single_eval(bytes, args, with_text, s->opts.prefix, cfg, key, now, cost, a,
                                 now ? std::string_view(s->floor_ms) : std::string_view("0"));
    }

    void deliver(const decision& d, std::exception_ptr e) noexcept {
      detail::call_handler(handler, d, std::move(e));
    }

    void degrade_and_deliver(const std::exception_ptr& e) noexcept {
      detail::degrade_and_deliver(
          s->degrader, s->stats, cfg, key, now, cost, a, e,
          [this](const decision& d, std::exception_ptr x) { deliver(d, std::move(x)); });
    }

    void complete(std::unique_ptr<mux_job> self, reply_ptr r,
                  std::exception_ptr error) noexcept override {
      if (error) {
        if (s->stopping.load(std::memory_order_acquire)) {
          deliver(decision{}, error);
          return;
        }
        detail::count_error(s->stats, error);
        if (!refused_full) {
          s->failed();
          if (s->sentinel) s->master_may_have_moved(error);
        }
        degrade_and_deliver(error);
        return;
      }
      if (detail::is_noscript(*r)) {
        if (!reloaded) {
          // NOSCRIPT: the script did not run, so sending it again is safe.
          reloaded = true;
          s->stats.script_reloads.fetch_add(1, std::memory_order_relaxed);
          try {
            build(true);
            if (s->mux.submit(self)) return;
            error = std::make_exception_ptr(
                multiplexer_stopped("ratelimit: redis: the store is being destroyed"));
            deliver(decision{}, error);
            return;
          } catch (...) {
            error = std::current_exception();
          }
        } else {
          error = std::make_exception_ptr(
              script_error("ratelimit: redis: NOSCRIPT again after EVAL"));
        }
        s->breaker.success();
        detail::count_error(s->stats, error);
        degrade_and_deliver(error);
        return;
      }
      decision d;
      try {
        d = detail::parse_reply(cfg, *r);
      } catch (...) {
        s->breaker.success();
        error = std::current_exception();
        detail::count_error(s->stats, error);
        degrade_and_deliver(error);
        return;
      }
      s->breaker.success();
      s->stats.store.fetch_add(1, std::memory_order_relaxed);
      deliver(d, nullptr);
    }
  };

  /// Starts one check on the multiplexer (or decides it at once when the
  /// breaker is open). `handler(decision, std::exception_ptr)` gets the
  /// outcome exactly once.
  template <class Config, class Handler>
  void start_check(const Config& cfg, std::string_view key, std::optional<timestamp> now,
                   units cost, access a, Handler&& handler, mux_waiter* waiter = nullptr) {
    detail::check_same_process(shared_->owner_pid);
    shared& st = *shared_;
    if (st.breaker.enter() == detail::breaker::verdict::refuse) {
      st.stats.short_circuited.fetch_add(1, std::memory_order_relaxed);
      const auto err = std::make_exception_ptr(
          connection_error("ratelimit: redis: circuit breaker open (Redis failed recently)"));
      detail::degrade_and_deliver(st.degrader, st.stats, cfg, key, now, cost, a, err,
                                  [&handler](const decision& d, std::exception_ptr e) {
                                    detail::call_handler(handler, d, std::move(e));
                                  });
      return;
    }
    using job_t = check_job<Config, std::decay_t<Handler>>;
    auto job = std::make_unique<job_t>(&st, cfg, key, now, cost, a, std::move(handler));
    job->build(false);
    job->until = deadline_clock::now() + st.command_timeout;
    job->waiter = waiter;
    job_t* const jp = job.get();
    std::unique_ptr<mux_job> base(std::move(job));
    bool queued = false;
    try {
      queued = st.mux.submit(base);
    } catch (const multiplexer_full&) {
      // The cap on pending checks (local overload): nothing was sent, and
      // Redis did not fail, so the breaker counts nothing.
      jp->refused_full = true;
      jp->complete(std::move(base), nullptr, std::current_exception());
      return;
    } catch (const connection_error&) {
      // No eventfd or I/O thread (out of descriptors or threads): nothing
      // was sent, a failure decided here as a connect that failed.
      mux_job* j = base.get();
      j->complete(std::move(base), nullptr, std::current_exception());
      return;
    }
    if (!queued) throw multiplexer_stopped("ratelimit: redis: the store is being destroyed");
  }

  /// A single check through the multiplexer, waited for on this thread.
  template <class Config>
  decision run_multiplexed(const Config& cfg, std::string_view key, std::optional<timestamp> now,
                           units cost, access a) {
    if (shared_->mux.on_io_thread()) {
      throw std::logic_error(
          "ratelimit: redis: a blocking check on the store's I/O thread (inside an async "
          "handler) would wait for itself; use async_apply there");
    }
    detail::sync_waiter w;
    start_check(
        cfg, key, now, cost, a, [&w](decision d, std::exception_ptr e) { w.set(d, std::move(e)); },
        shared_->opts.multiplex_lead ? &w : nullptr);
    return w.get();
  }

  /// A key's reply slot in one round trip.
  struct pending {
    std::vector<std::string> keys;
    std::string time;
    std::string cost;
  };

  static void check_input(std::string_view key, units cost) { detail::check_input(key, cost); }

  static void check_script_time(timestamp now) { detail::check_script_time(now); }

  [[nodiscard]] deadline command_deadline() const noexcept {
    return deadline_clock::now() + shared_->command_timeout;
  }

  [[nodiscard]] connection_pool::lease acquire() {
    return shared_->pool.acquire(command_deadline());
  }

  template <class Config>
  decision degrade(const Config& cfg, std::string_view key, std::optional<timestamp> now,
                   units cost, access a, const std::exception_ptr& error) {
    return shared_->degrader.degrade(shared_->stats, cfg, key, now, cost, a, error);
  }

  void count_error(const std::exception_ptr& e) noexcept { detail::count_error(shared_->stats, e); }

  template <class P>
  void append_eval(std::string& out, bool with_text, const std::vector<std::string>& key,
                   const std::string& time, const std::string& cost, access a,
                   const std::vector<std::string>& policy_args, bool server_time,
                   const detail::once_request* once) const {
    const std::string_view floor = server_time ? std::string_view("0")
                                               : std::string_view(shared_->floor_ms);
    if (once != nullptr) {
      detail::append_eval_once<P>(out, with_text, key, time, cost, a, policy_args, floor,
                                  once->limit, once->retention_us);
    } else {
      detail::append_eval<P>(out, with_text, key, time, cost, a, policy_args, floor);
    }
  }

  template <class Config>
  decision run(const Config& cfg, std::string_view key, std::optional<timestamp> now, units cost,
               access a) {
    if (shared_->opts.multiplex > 0) return run_multiplexed(cfg, key, now, cost, a);
    return run_pooled(cfg, key, now, cost, a);
  }

  /// One check on a pooled connection: run_batch_impl for one key, with the
  /// same outcomes (EVALSHA; EVAL once after NOSCRIPT, the script did not
  /// run; never resent otherwise; the failure policy decides a failed round
  /// trip), on the connection's own buffers, so that a check allocates
  /// nothing once they have grown, and with the reply's integers read
  /// straight from the socket (connection::receive_script).
  template <class Config>
  decision run_pooled(const Config& cfg, std::string_view key, std::optional<timestamp> now,
                      units cost, access a) {
    detail::check_same_process(shared_->owner_pid);
    shared& st = *shared_;
    if (st.breaker.enter() == detail::breaker::verdict::refuse) {
      st.stats.short_circuited.fetch_add(1, std::memory_order_relaxed);
      const auto err = std::make_exception_ptr(
          connection_error("ratelimit: redis: circuit breaker open (Redis failed recently)"));
      return degrade(cfg, key, now, cost, a, err);
    }
    // Refused before a connection is taken, as run_batch_impl does (the
    // caller checked the name).
    detail::check_prefix(st.opts.prefix);
    const std::string_view floor = now ? std::string_view(st.floor_ms) : std::string_view("0");
    decision d;
    std::exception_ptr item_error;
    bool format_failed = false;
    try {
      const deadline start = deadline_clock::now();
      connection_pool::lease lease = st.pool.acquire(start + st.command_timeout);
      // Time spent making a new connection (bounded by connect_timeout) does
      // not eat into the round trip's command_timeout.
      deadline until = start + st.command_timeout + lease.connect_time();
      // Whatever interrupts the exchange (I/O, a timeout, bad_alloc), the
      // connection may hold an unread reply: it must not serve another caller.
      struct drop_unless_done {
        connection_pool::lease& l;
        bool done = false;
        ~drop_unless_done() {
          if (!done) l->mark_broken();
        }
      } guard{lease};
      {
        std::string& buf = lease->command_buffer();
        buf.clear();
        try {
          detail::append_single_eval(buf, lease->argument_buffer(), false, st.opts.prefix, cfg, key,
                                     now, cost, a, floor);
        } catch (...) {
          // Nothing was sent (a refused prefix, bad_alloc): the connection
          // stays usable and Redis did not fail, as when run_batch_impl
          // formats before it takes a connection.
          guard.done = true;
          format_failed = true;
          throw;
        }
        // Resent on a new connection only when the server had closed this
        // one before it accepted a byte (see lease::send); `buf` may be gone after.
        lease.send(buf, until);
      }
      script_reply reply;
      lease->receive_script(until, reply);
      if (reply.count == 0 && detail::is_noscript(*reply.other)) {
        // NOSCRIPT: the script never ran, so sending it again is safe. EVAL
        // once (it also caches the script).
        st.stats.script_reloads.fetch_add(1, std::memory_order_relaxed);
        std::string eval;
        std::vector<std::string> args;
        detail::append_single_eval(eval, args, true, st.opts.prefix, cfg, key, now, cost, a, floor);
        lease->send(eval, until);
        lease->receive_script(until, reply);
        if (reply.count == 0 && detail::is_noscript(*reply.other)) {
          item_error = std::make_exception_ptr(
              script_error("ratelimit: redis: NOSCRIPT again after EVAL"));
        }
      }
      if (!item_error) {
        try {
          d = reply.count != 0 ? detail::decision_of(cfg, reply.values, reply.count)
                               : detail::parse_reply(cfg, *reply.other);
        } catch (const script_error&) {
          item_error = std::current_exception();
        }
      }
      guard.done = true;
      st.breaker.success();
    } catch (const connection_error&) {
      const std::exception_ptr failure = std::current_exception();
      count_error(failure);
      st.failed();
      // Sentinel: the master may have moved (failover, demotion). Idle
      // connections to it are dropped; the next ones ask the sentinels.
      if (!st.opts.sentinel.master_name.empty()) st.pool.clear();
      // The reply was not read: the script may or may not have run, and is
      // never sent again: the failure policy decides.
      return degrade(cfg, key, now, cost, a, failure);
    } catch (...) {
      if (!format_failed) st.failed();
      throw;
    }
    if (item_error) {
      count_error(item_error);
      return degrade(cfg, key, now, cost, a, item_error);
    }
    st.stats.store.fetch_add(1, std::memory_order_relaxed);
    return d;
  }

  template <class Config>
  std::vector<decision> run_batch(const Config& cfg, std::span<const batch_item> items,
                                  bool server_time, access a) {
    const detail::batch_columns c = detail::split_batch(items, server_time);
    return run_batch_impl(cfg, c.keys, c.costs, c.times, a);
  }

  /// One round trip for every key (times empty = server time), then one more
  /// for the keys that got NOSCRIPT. Never retries after a timeout. With
  /// `once`, every key is checked with that request id (wrapped scripts).
  template <class Config>
  std::vector<decision> run_batch_impl(const Config& cfg, std::span<const std::string_view> keys,
                                       std::span<const units> costs,
                                       std::span<const timestamp> times, access a,
                                       const detail::once_request* once = nullptr) {
    using P = typename Config::policy_type;
    detail::check_same_process(shared_->owner_pid);
    const std::size_t n = keys.size();
    std::vector<decision> out(n);
    if (n == 0) return out;
    const bool server_time = times.empty();
    const auto time_of = [&](std::size_t i) {
      return server_time ? std::optional<timestamp>{} : std::optional<timestamp>{times[i]};
    };
    detail::counters& c = shared_->stats;
    if (shared_->breaker.enter() == detail::breaker::verdict::refuse) {
      c.short_circuited.fetch_add(n, std::memory_order_relaxed);
      const auto err = std::make_exception_ptr(
          connection_error("ratelimit: redis: circuit breaker open (Redis failed recently)"));
      for (std::size_t i = 0; i < n; ++i)
        out[i] = degrade(cfg, keys[i], time_of(i), costs[i], a, err);
      return out;
    }

    std::vector<std::string> policy_args;
    script_for<P>::append_args(cfg, policy_args);
    std::vector<pending> items(n);
    std::string buf;
    for (std::size_t i = 0; i < n; ++i) {
      items[i].keys = detail::redis_keys(shared_->opts.prefix, cfg, keys[i]);
      if (once != nullptr) {
        items[i].keys.push_back(detail::once_key(shared_->opts.prefix, cfg, keys[i], once->id));
      }
      items[i].time = server_time ? std::string() : std::to_string(times[i].count());
      items[i].cost = std::to_string(costs[i]);
      append_eval<P>(buf, false, items[i].keys, items[i].time, items[i].cost, a, policy_args,
                     server_time, once);
    }

    std::vector<char> done(n, 0);
    std::vector<std::exception_ptr> item_errors(n);
    std::exception_ptr failure;
    const auto read_into = [&](connection& conn, std::size_t i, deadline until) {
      reply_ptr r = conn.receive(until);
      if (detail::is_noscript(*r)) return false;
      try {
        out[i] = once != nullptr ? detail::parse_reply_once(cfg, *r) : detail::parse_reply(cfg, *r);
        done[i] = 1;
      } catch (const script_error&) {
        item_errors[i] = std::current_exception();
      }
      return true;
    };
    try {
      const deadline start = deadline_clock::now();
      connection_pool::lease lease = shared_->pool.acquire(start + shared_->command_timeout);
      // Time spent making a new connection (bounded by connect_timeout) does
      // not eat into the round trip's command_timeout.
      deadline until = start + shared_->command_timeout + lease.connect_time();
      // Whatever interrupts the exchange (I/O, a timeout, bad_alloc), the
      // connection may hold unread replies: it must not serve another caller.
      struct drop_unless_done {
        connection_pool::lease& l;
        bool done = false;
        ~drop_unless_done() {
          if (!done) l->mark_broken();
        }
      } guard{lease};
      // Resent on a new connection only when the server had closed this one
      // before it accepted a byte (see lease::send).
      lease.send(buf, until);
      std::vector<std::size_t> retry;
      for (std::size_t i = 0; i < n; ++i) {
        if (!read_into(*lease, i, until)) retry.push_back(i);
      }
      if (!retry.empty()) {
        // NOSCRIPT: the script never ran for these keys, so sending them again
        // is safe. EVAL once (it also caches the script), then EVALSHA.
        c.script_reloads.fetch_add(1, std::memory_order_relaxed);
        buf.clear();
        for (std::size_t j = 0; j < retry.size(); ++j) {
          const pending& p = items[retry[j]];
          append_eval<P>(buf, j == 0, p.keys, p.time, p.cost, a, policy_args, server_time, once);
        }
        lease->send(buf, until);
        for (const std::size_t i : retry) {
          if (!read_into(*lease, i, until)) {
            item_errors[i] = std::make_exception_ptr(
                script_error("ratelimit: redis: NOSCRIPT again after EVAL"));
          }
        }
      }
      guard.done = true;
      shared_->breaker.success();
    } catch (const connection_error&) {
      failure = std::current_exception();
      count_error(failure);
      shared_->failed();
      // Sentinel: the master may have moved (failover, demotion). Idle
      // connections to it are dropped; the next ones ask the sentinels.
      if (!shared_->opts.sentinel.master_name.empty()) shared_->pool.clear();
    } catch (...) {
      shared_->failed();
      throw;
    }
    // A reply that was read decides its key. A key without one may or may not
    // have run, and is never sent again: the failure policy decides it.
    for (std::size_t i = 0; i < n; ++i) {
      if (done[i] != 0) {
        c.store.fetch_add(1, std::memory_order_relaxed);
      } else if (item_errors[i]) {
        count_error(item_errors[i]);
        out[i] = degrade(cfg, keys[i], time_of(i), costs[i], a, item_errors[i]);
      } else {
        out[i] = degrade(cfg, keys[i], time_of(i), costs[i], a, failure);
      }
    }
    return out;
  }

  std::shared_ptr<shared> shared_;
};

}  // namespace ratelimit::redis
