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
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/redis/cluster/hash_slot.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/multiplexer.hpp"
#include "ratelimit/redis/options.hpp"
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

/// Counters of a store (and its copies), for metrics. A snapshot.
struct store_stats {
  std::uint64_t store = 0;            ///< checks decided by Redis
  std::uint64_t fail_open = 0;        ///< checks admitted by failure_policy::fail_open
  std::uint64_t fail_closed = 0;      ///< checks rejected by failure_policy::fail_closed
  std::uint64_t fallback = 0;         ///< checks decided by the in-process fallback
  std::uint64_t errors = 0;           ///< failed round trips (any store_error, timeouts included)
  std::uint64_t timeouts = 0;         ///< of which timeouts
  std::uint64_t short_circuited = 0;  ///< checks answered by the open breaker without I/O
  std::uint64_t breaker_opened = 0;   ///< times the circuit breaker opened
  std::uint64_t script_reloads = 0;   ///< NOSCRIPT answers that made a script be resent
  std::uint64_t probes = 0;  ///< background probes (PING) of a server behind an open breaker
  std::uint64_t probe_failures = 0;  ///< of which failed (the breaker stayed open)
  /// In-process fallback limiters held now, one per (policy, name, config)
  /// that degraded under failure_policy::fallback; at most 64 unless more
  /// are in use at one instant.
  std::uint64_t fallback_limiters = 0;
};

namespace detail {

/// Circuit breaker: after `threshold` consecutive failures it opens; while
/// open, every check is answered by the failure policy at once and none goes
/// to Redis. A background prober (see prober) tries Redis once each cool-down;
/// a failed probe doubles the cool-down (up to the maximum); a successful probe,
/// or any check that succeeds (one already in flight when it opened), closes it.
/// Thread safety: any number of threads.
class breaker {
 public:
  enum class verdict : unsigned char { go, refuse };

  explicit breaker(const options& o)
      : threshold_(o.breaker_threshold == 0 ? 3u : o.breaker_threshold),
        base_(o.breaker_cooldown.count() > 0 ? o.breaker_cooldown : std::chrono::milliseconds{200}),
        max_(std::max(base_, o.breaker_max_cooldown.count() > 0 ? o.breaker_max_cooldown
                                                                : std::chrono::milliseconds{5000})),
        cooldown_(base_) {}

  breaker(const breaker&) = delete;
  breaker& operator=(const breaker&) = delete;

  /// `go` when closed, `refuse` when open (callers never probe).
  [[nodiscard]] verdict enter() const noexcept {
    return open_.load(std::memory_order_acquire) ? verdict::refuse : verdict::go;
  }

  /// A round trip succeeded, or a probe did: closes the breaker.
  void success() noexcept {
    if (!open_.load(std::memory_order_acquire) && failures_.load(std::memory_order_relaxed) == 0) {
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.store(0, std::memory_order_relaxed);
    cooldown_ = base_;
    open_.store(false, std::memory_order_release);
  }

  /// A round trip failed (ignored while open: it was in flight when it opened).
  /// @return true when this failure opened the breaker (start probing it)
  bool failure() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_.load(std::memory_order_relaxed)) return false;
    if (failures_.fetch_add(1, std::memory_order_relaxed) + 1 < threshold_) return false;
    cooldown_ = base_;
    probe_at_ = deadline_clock::now() + cooldown_;
    open_.store(true, std::memory_order_release);
    return true;
  }

  /// When the next probe is due (meaningful while open).
  [[nodiscard]] deadline probe_at() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return probe_at_;
  }

  /// A probe failed: the next one waits twice as long (up to the maximum).
  void probe_failed() noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_.load(std::memory_order_relaxed)) return;
    cooldown_ = std::min(cooldown_ * 2, max_);
    probe_at_ = deadline_clock::now() + cooldown_;
  }

  [[nodiscard]] bool is_open() const noexcept { return open_.load(std::memory_order_acquire); }

 private:
  std::uint32_t threshold_;
  std::chrono::milliseconds base_;
  std::chrono::milliseconds max_;
  std::mutex mutex_;
  std::atomic<bool> open_{false};
  std::atomic<std::uint32_t> failures_{0};
  std::chrono::milliseconds cooldown_;
  deadline probe_at_{};
};

/// Probes open breakers from one background thread, started on the first
/// watch() and then asleep on a condition variable until a breaker opens or a
/// probe is due; stop() (the destructor) wakes and joins it at once, or after
/// the probe in progress (bounded by connect_timeout + command_timeout).
///
/// After fork(), a child holding a prober made by its parent never touches
/// its mutex or condition variable (the parent's thread, absent from the
/// child, may have held the one or waited on the other at the fork): stop()
/// leaks it and watch() refuses. Stores do not reach either in a child (see
/// check_same_process), so this is a second line of defence.
///
/// Thread safety: watch() from any number of threads; stop() once no watch()
/// can run (the owner's destructor).
class prober {
 public:
  /// One attempt to reach the breaker's server: true when it answered.
  using probe_fn = std::function<bool()>;

  prober() : core_(std::make_unique<core>()) {}
  prober(const prober&) = delete;
  prober& operator=(const prober&) = delete;
  ~prober() { stop(); }

  /// Probes `gate` with `probe` each cool-down until a probe succeeds (and
  /// closes it) or something else closes it. `gate` and whatever `probe` uses
  /// must outlive stop().
  /// @return false when the thread could not be started (the caller should
  ///   then close the breaker, or it would stay open)
  [[nodiscard]] bool watch(breaker& gate, probe_fn probe) noexcept {
    if (core_ == nullptr || core_->pid != ::getpid()) return false;
    core& c = *core_;
    try {
      std::lock_guard<std::mutex> lock(c.mutex);
      if (c.stopping) return false;
      const bool known = std::any_of(c.targets.begin(), c.targets.end(),
                                     [&](const target& t) { return t.gate == &gate; });
      if (!known) {
        c.targets.push_back(target{&gate, std::make_shared<const probe_fn>(std::move(probe))});
      }
      c.changed = true;
      if (!c.thread.joinable()) {
        c.thread = std::thread([&c] { run(c); });
      }
    } catch (...) {
      return false;
    }
    c.wake.notify_one();
    return true;
  }

  /// Stops and joins the thread (no-op when it never started).
  void stop() noexcept {
    if (core_ == nullptr) return;
    if (core_->pid != ::getpid()) {
      (void)core_.release();  // forked child: the parent's thread is not here; leak, never join
      return;
    }
    if (!core_->thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      core_->stopping = true;
    }
    core_->wake.notify_all();
    core_->thread.join();
  }

 private:
  struct target {
    breaker* gate;
    std::shared_ptr<const probe_fn> probe;
  };

  struct core {
    std::mutex mutex;
    std::condition_variable wake;
    std::vector<target> targets;  ///< breakers that opened, until they close
    bool changed = false;         ///< a breaker opened since the thread last looked
    bool stopping = false;
    const pid_t pid = ::getpid();  ///< the process that made the prober (and may run its thread)
    std::thread thread;
  };

  static void run(core& c) noexcept {
    std::unique_lock<std::mutex> lock(c.mutex);
    while (!c.stopping) {
      c.changed = false;
      std::erase_if(c.targets, [](const target& t) { return !t.gate->is_open(); });
      const auto woken = [&] { return c.stopping || c.changed; };
      if (c.targets.empty()) {
        c.wake.wait(lock, woken);
        continue;
      }
      auto next = c.targets.begin();
      deadline due = next->gate->probe_at();
      for (auto it = std::next(next); it != c.targets.end(); ++it) {
        const deadline at = it->gate->probe_at();
        if (at < due) {
          due = at;
          next = it;
        }
      }
      if (deadline_clock::now() < due) {
        c.wake.wait_until(lock, due, woken);
        continue;
      }
      breaker* gate = next->gate;
      const std::shared_ptr<const probe_fn> probe = next->probe;
      lock.unlock();
      bool ok = false;
      try {
        ok = (*probe)();
      } catch (...) {
      }
      if (ok) {
        gate->success();
      } else {
        gate->probe_failed();
      }
      lock.lock();
    }
  }

  std::unique_ptr<core> core_;
};

/// Throws when called in a process other than `owner`, the one that made a
/// store: a child forked after the store was made shares the parent's pooled
/// sockets (its commands would interleave with the parent's replies), and any
/// of the store's mutexes may have been held by a parent thread at the fork,
/// never to be released in the child.
/// @throws std::logic_error naming the rule: make a new store after fork()
inline void check_same_process(pid_t owner) {
  if (owner != ::getpid()) {
    throw std::logic_error(
        "ratelimit: redis: a store made before fork() was used in the child; make a new store "
        "in the child after fork()");
  }
}

/// Deleter of a store's shared state: deletes it in the process that made it
/// (T::owner_pid) and leaks it in a child forked after, where destroying it
/// could join a thread that does not exist there, lock a mutex a parent thread
/// held at the fork or destroy a condition variable a parent thread waited on
/// (each of which can block forever). Leaking closes none of the parent's
/// sockets either.
template <class T>
struct delete_unless_forked {
  void operator()(T* p) const noexcept {
    if (p->owner_pid == ::getpid()) delete p;
  }
};

struct counters {
  std::atomic<std::uint64_t> store{0}, fail_open{0}, fail_closed{0}, fallback{0}, errors{0},
      timeouts{0}, short_circuited{0}, breaker_opened{0}, script_reloads{0}, probes{0},
      probe_failures{0};
};

/// One background probe of a server whose breaker is open: PING on a fresh
/// connection of `pool` (idle ones, likely made before the outage, are dropped
/// first), within connect_timeout + `command_timeout`. The connection goes
/// back to the pool when it answered.
/// @return true when the server answered PING
[[nodiscard]] inline bool probe_ping(connection_pool& pool,
                                     std::chrono::milliseconds command_timeout,
                                     counters& c) noexcept {
  c.probes.fetch_add(1, std::memory_order_relaxed);
  try {
    pool.clear();
    const deadline start = deadline_clock::now();
    connection_pool::lease lease = pool.acquire(start + command_timeout);
    const std::string_view args[] = {"PING"};
    reply_ptr r = lease->command(args, 1, start + command_timeout + lease.connect_time());
    if (r->type != REDIS_REPLY_ERROR) return true;
    lease->mark_broken();
  } catch (...) {
  }
  c.probe_failures.fetch_add(1, std::memory_order_relaxed);
  return false;
}

struct fallback_base {
  virtual ~fallback_base() = default;
};

template <class P>
struct fallback_limiter final : fallback_base {
  explicit fallback_limiter(typename P::config c) : cfg(std::move(c)) {}
  typename P::config cfg;
  memory_store<P> store;
};

/// Validates a check's key and cost.
/// @throws std::invalid_argument
inline void check_input(std::string_view key, units cost) {
  ratelimit::detail::check_key(key);
  ratelimit::detail::check_cost(cost);
}

/// Validates a caller-supplied time for the scripts (see max_script_time).
/// @throws std::invalid_argument
inline void check_script_time(timestamp now) {
  if (now.count() < 0 || now > max_script_time) {
    throw std::invalid_argument("ratelimit: redis: time " + std::to_string(now.count()) +
                                "us is outside 0.." + std::to_string(max_script_time.count()) +
                                "us (Lua numbers are exact only below 2^53)");
  }
}

/// True when Redis would find an empty hash tag in `k` (its first `{` is
/// directly followed by `}`) and so hash the whole key instead.
[[nodiscard]] inline bool has_empty_hash_tag(std::string_view k) noexcept {
  const std::size_t open = k.find('{');
  return open != std::string_view::npos && open + 1 < k.size() && k[open + 1] == '}';
}

/// The Redis key of `key` for policy P and limiter `name`:
/// `<prefix>{<key>}:<policy>:<name>`, so that every key of one user key
/// shares its hash tag (one cluster slot).
///
/// A user key starting with `}` would leave that tag empty: Redis would hash
/// each whole key, and the keys of one compound check would land in different
/// slots. Such user keys get a tag of their own,
/// `<prefix>{~<slot of key>}{<key>}:<policy>:<name>!`.
///
/// Why two (key, policy, name) under one prefix never share a key (two
/// prefixes may: "p" with key "{x" and "p{" with key "x"), compound sub-keys
/// (`<this>:<i>:<sub-policy>`, scripts/compound.hpp) included: names are
/// [A-Za-z0-9_.-]+ and policy names [a-z_]+, so neither holds ':', '{', '}'
/// or '!'. Read a key (after the store's fixed prefix) from its end: when the
/// second-to-last ':'-segment is digits it is a compound sub-key (no policy
/// name is digits) and the segments before are `<name>[!]` and `compound`;
/// otherwise the last two segments are `<policy>` and `<name>[!]`. A trailing
/// `!` on the name marks the second form (no name ends in `!`). The user key
/// is then everything between the first `{` (usual form) or the second `{`
/// (second form, whose `~<slot>` is a function of the key) and the `}` just
/// before `:<policy>`; user keys may hold any byte, but the parse never
/// searches inside them. So each component is recovered from the key.
/// @throws std::invalid_argument for a prefix whose first `{` is followed by `}`
template <class P>
[[nodiscard]] std::string redis_key(std::string_view prefix, std::string_view key,
                                    std::string_view limiter_name) {
  if (has_empty_hash_tag(prefix)) {
    throw std::invalid_argument("ratelimit: redis key prefix \"" + std::string(prefix) +
                                "\" holds an empty hash tag {}: keys of one user key could "
                                "not share a cluster slot");
  }
  std::string k;
  const std::string_view name = script_for<P>::name;
  k.reserve(prefix.size() + key.size() + name.size() + limiter_name.size() + 14);
  k.append(prefix);
  k += '{';
  k.append(key);
  k += "}:";
  k.append(name);
  k += ':';
  k.append(limiter_name);
  if (!has_empty_hash_tag(k)) return k;
  k.clear();
  k.append(prefix);
  k += "{~";
  k += std::to_string(key_slot(key));
  k += "}{";
  k.append(key);
  k += "}:";
  k.append(name);
  k += ':';
  k.append(limiter_name);
  k += '!';
  return k;
}

/// Refuses an unnamed config: Redis state outlives processes and deploys, and
/// two unnamed limiters of one policy would read and write one key.
/// @throws std::invalid_argument when `cfg.name()` is empty
template <class Config>
void check_named(const Config& cfg) {
  if (cfg.name().empty()) {
    throw std::invalid_argument(
        "ratelimit: redis: a limiter needs a name to keep its state in Redis (it is part of "
        "the key, so that two limiters never share state); give it one, e.g. "
        "fixed_window::config{\"10/s\", window_options{.name = \"calls\"}}, "
        "gcra::config{\"10/s\", bucket_options{.name = \"calls\"}} or, for a compound, "
        "compound_options{.name = \"calls\"}");
  }
}

/// The Redis keys of one check: `redis_key<P>` alone, or, when script_for<P>
/// declares `append_keys(cfg, base, out)` (compound), the keys it derives from it.
template <class Config>
[[nodiscard]] std::vector<std::string> redis_keys(std::string_view prefix, const Config& cfg,
                                                  std::string_view key) {
  using P = typename Config::policy_type;
  check_named(cfg);
  std::string base = redis_key<P>(prefix, key, cfg.name());
  std::vector<std::string> out;
  if constexpr (requires { script_for<P>::append_keys(cfg, base, out); }) {
    script_for<P>::append_keys(cfg, base, out);
  } else {
    out.push_back(std::move(base));
  }
  return out;
}

/// The policy name and its script arguments, without the limiter's name:
/// what the state's meaning depends on. The scripts store the arguments part
/// (joined by ',') with the state as its fingerprint.
template <class Config>
[[nodiscard]] std::string config_id(const Config& cfg) {
  using P = typename Config::policy_type;
  std::vector<std::string> args;
  script_for<P>::append_args(cfg, args);
  std::string id(script_for<P>::name);
  for (const std::string& a : args) {
    id += ':';
    id += a;
  }
  return id;
}

/// Appends EVALSHA (or EVAL) of P's script for one check. `time` is empty for
/// server time; `ttl_floor_ms` is "0" for server time.
template <class P>
void append_eval(std::string& out, bool with_text, const std::vector<std::string>& keys,
                 std::string_view time, std::string_view cost, access a,
                 const std::vector<std::string>& policy_args, std::string_view ttl_floor_ms) {
  const std::string nkeys = std::to_string(keys.size());
  std::vector<std::string_view> args;
  args.reserve(8 + keys.size() + policy_args.size());
  args.push_back(with_text ? "EVAL" : "EVALSHA");
  args.push_back(with_text ? script_for<P>::text : std::string_view(script_sha<P>()));
  args.push_back(nkeys);
  for (const std::string& k : keys) args.push_back(k);
  args.push_back(time);
  args.push_back(cost);
  args.push_back(access_arg(a));
  args.push_back(ttl_floor_ms);
  for (const std::string& p : policy_args) args.push_back(p);
  append_command(out, args.data(), args.size());
}

[[nodiscard]] inline bool is_noscript(const redisReply& r) noexcept {
  return r.type == REDIS_REPLY_ERROR && r.len >= 8 && std::string_view(r.str, 8) == "NOSCRIPT";
}

/// The decision in a script's reply.
/// @throws script_error for an error reply or a malformed one
template <class Config>
[[nodiscard]] decision parse_reply(const Config& cfg, const redisReply& r) {
  if (r.type == REDIS_REPLY_ERROR) {
    throw script_error("ratelimit: redis: script failed: " + std::string(r.str, r.len));
  }
  // Five integers, or six when the script reports the decision's limit
  // (compound), or seven when it also reports a repeat (leases).
  if (r.type != REDIS_REPLY_ARRAY || r.elements < 5 || r.elements > 7) {
    throw script_error("ratelimit: redis: unexpected script reply");
  }
  long long v[7] = {};
  for (std::size_t i = 0; i < r.elements; ++i) {
    if (r.element[i]->type != REDIS_REPLY_INTEGER) {
      throw script_error("ratelimit: redis: unexpected script reply element");
    }
    v[i] = r.element[i]->integer;
  }
  // Only a reply a script of this library could give decides a check.
  const long long limit = r.elements >= 6 ? v[5] : cfg.limit();
  const long long far = std::int64_t{1} << 53;
  // A repeat is admitted and records nothing; any other admission records.
  const bool repeat = v[6] == 1;
  const bool ok = (v[0] == 0 || v[0] == 1) && (v[1] == 0 || v[1] == 1) &&
                  (v[6] == 0 || (repeat && v[0] == 1 && v[1] == 0)) &&
                  (v[0] == 0 || v[1] == 1 || repeat) && limit >= 1 && limit <= max_units &&
                  v[2] >= 0 && v[2] <= limit && v[3] >= -1 && v[3] <= far &&
                  // An admission waits 0; a rejection at least 1 us, or never.
                  (v[0] == 1 ? v[3] == 0 : v[3] != 0) && v[4] >= 0 && v[4] <= far;
  if (!ok) {
    std::string got;
    for (std::size_t i = 0; i < r.elements; ++i) {
      got += i == 0 ? "{" : ", ";
      got += std::to_string(v[i]);
    }
    throw script_error("ratelimit: redis: script reply out of range: " + got + "}");
  }
  decision d;
  d.allowed = v[0] != 0;
  d.counted = v[1] != 0;
  d.limit = static_cast<units>(limit);
  d.remaining = static_cast<units>(v[2]);
  d.retry_after = v[3] < 0 ? never : std::chrono::microseconds{v[3]};
  d.reset_after = std::chrono::microseconds{v[4]};
  d.repeat = repeat;
  return d;
}

/// The decision in a reply of a wrapped (request id) script: the policy's
/// reply and a last element, 1 when it is a repeat.
/// @throws script_error for an error reply or a malformed one
template <class Config>
[[nodiscard]] decision parse_reply_once(const Config& cfg, const redisReply& r) {
  if (r.type == REDIS_REPLY_ARRAY && (r.elements == 6 || r.elements == 7)) {
    const redisReply& flag = *r.element[r.elements - 1];
    if (flag.type != REDIS_REPLY_INTEGER || (flag.integer != 0 && flag.integer != 1)) {
      throw script_error("ratelimit: redis: unexpected repeat flag in script reply");
    }
    redisReply policy_part = r;  // a shallow view without the flag; never freed
    policy_part.elements -= 1;
    decision d = parse_reply(cfg, policy_part);
    d.repeat = flag.integer == 1;
    return d;
  }
  if (r.type == REDIS_REPLY_ERROR) return parse_reply(cfg, r);
  throw script_error("ratelimit: redis: unexpected script reply");
}

/// The base of the id key of `key` (the policy key, for a compound its base).
template <class Config>
[[nodiscard]] std::string once_key(std::string_view prefix, const Config& cfg, std::string_view key,
                                   std::string_view id) {
  return request_id_key(redis_key<typename Config::policy_type>(prefix, key, cfg.name()), id);
}

/// Counts one failed round trip (and whether it was a timeout).
inline void count_error(counters& c, const std::exception_ptr& e) noexcept {
  c.errors.fetch_add(1, std::memory_order_relaxed);
  try {
    std::rethrow_exception(e);
  } catch (const timeout_error&) {
    c.timeouts.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
  }
}

/// Applies the failure policy to checks that got no answer, with one
/// in-process fallback limiter per config.
/// Thread safety: any number of threads.
class degrader {
 public:
  degrader(failure_policy p, units divisor) : policy_(p), divisor_(divisor) {}

  /// At most this many fallback limiters are kept: one per (policy, name,
  /// config) that degraded. Tiers changed at run time during an outage make
  /// new configs; past the cap the least recently used limiter that no check
  /// is using is dropped (its keys start fresh if that config degrades again).
  static constexpr std::size_t max_fallbacks = 64;

  /// The fallback limiter of `cfg`, or null when none is held.
  template <class P>
  [[nodiscard]] std::shared_ptr<fallback_limiter<P>> find(const typename P::config& cfg) {
    const fallback_id id = id_of<P>(cfg);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = fallbacks_.find(id);
    if (it == fallbacks_.end()) return nullptr;
    return std::static_pointer_cast<fallback_limiter<P>>(it->second.limiter);
  }

  /// How many fallback limiters are held (at most max_fallbacks, unless more
  /// than that many are in use at once).
  [[nodiscard]] std::size_t fallbacks_held() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fallbacks_.size();
  }

  /// The decision of the failure policy for a check that got no answer.
  /// @throws the `error` under failure_policy::throw_error
  template <class Config>
  decision degrade(counters& c, const Config& cfg, std::string_view key,
                   std::optional<timestamp> now, units cost, access a,
                   const std::exception_ptr& error) {
    using P = typename Config::policy_type;
    decision d;
    d.limit = cfg.limit();
    switch (policy_) {
      case failure_policy::throw_error: std::rethrow_exception(error);
      case failure_policy::fail_open:
        c.fail_open.fetch_add(1, std::memory_order_relaxed);
        d.allowed = true;
        d.source = decision_source::fail_open;
        return d;
      case failure_policy::fail_closed:
        c.fail_closed.fetch_add(1, std::memory_order_relaxed);
        d.source = decision_source::fail_closed;
        return d;
      case failure_policy::fallback: {
        c.fallback.fetch_add(1, std::memory_order_relaxed);
        const std::shared_ptr<fallback_limiter<P>> held = fallback_for<P>(cfg);
        auto& fb = *held;
        const timestamp t = now ? *now
                                : std::chrono::duration_cast<timestamp>(
                                      std::chrono::system_clock::now().time_since_epoch());
        // A config that carries per-call data (leases: the operation and
        // lease id) lends it to the fallback's own config.
        if constexpr (requires { script_for<P>::rebind(fb.cfg, cfg); }) {
          d = fb.store.apply(script_for<P>::rebind(fb.cfg, cfg), key, t, cost, a);
        } else {
          d = fb.store.apply(fb.cfg, key, t, cost, a);
        }
        d.source = decision_source::fallback;
        return d;
      }
    }
    std::rethrow_exception(error);
  }

 private:
  /// A fallback limiter belongs to one policy type (the static_casts rely on
  /// it: compound<A, A> and compound_of<A> share config ids), one limiter
  /// name and one config.
  using fallback_id = std::pair<std::type_index, std::string>;

  template <class P>
  [[nodiscard]] static fallback_id id_of(const typename P::config& cfg) {
    std::string id = cfg.name();
    id += '/';
    if constexpr (requires { script_for<P>::fallback_id(cfg); }) {
      id += script_for<P>::fallback_id(cfg);  // without per-call data (leases)
    } else {
      id += config_id(cfg);
    }
    return fallback_id{std::type_index(typeid(P)), std::move(id)};
  }

  /// The fallback limiter of `cfg`, made on first use. The caller's
  /// shared_ptr keeps it alive while the check runs, even if it is dropped
  /// from the map meanwhile.
  template <class P>
  [[nodiscard]] std::shared_ptr<fallback_limiter<P>> fallback_for(const typename P::config& cfg) {
    fallback_id id = id_of<P>(cfg);
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uint64_t now = ++uses_;
    auto it = fallbacks_.find(id);
    if (it == fallbacks_.end()) {
      auto made = std::make_shared<fallback_limiter<P>>(script_for<P>::scaled(cfg, divisor_));
      if (fallbacks_.size() >= max_fallbacks) drop_least_recent();
      it = fallbacks_.emplace(std::move(id), slot{std::move(made), now}).first;
    }
    it->second.last_use = now;
    return std::static_pointer_cast<fallback_limiter<P>>(it->second.limiter);
  }

  /// Drops the least recently used limiter no check holds; keeps all when
  /// every one is in use. Called with mutex_ held.
  void drop_least_recent() {
    auto victim = fallbacks_.end();
    for (auto it = fallbacks_.begin(); it != fallbacks_.end(); ++it) {
      if (it->second.limiter.use_count() != 1) continue;
      if (victim == fallbacks_.end() || it->second.last_use < victim->second.last_use) victim = it;
    }
    if (victim != fallbacks_.end()) fallbacks_.erase(victim);
  }

  struct slot {
    std::shared_ptr<fallback_base> limiter;
    std::uint64_t last_use = 0;
  };

  failure_policy policy_;
  units divisor_;
  mutable std::mutex mutex_;
  std::uint64_t uses_ = 0;
  std::map<fallback_id, slot> fallbacks_;
};

}  // namespace detail

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
  /// @throws std::invalid_argument for bad sentinel options (see sentinel_locator)
  explicit redis_store(options o = {}) : shared_(new shared(std::move(o)), shared_deleter{}) {}

  /// Refuses a config this store cannot key: an unnamed one. `limiter`'s
  /// constructor calls it, so a missing name fails at start-up.
  /// @throws std::invalid_argument when `cfg.name()` is empty
  template <class Config>
  static void check_config(const Config& cfg) {
    detail::check_named(cfg);
  }

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
      throw script_error("ratelimit: redis: DEL failed: " + std::string(r->str, r->len));
  }

  /// Round trip to the server (PING).
  /// @throws connection_error when it cannot be reached
  void ping() {
    detail::check_same_process(shared_->owner_pid);
    const std::string_view args[] = {"PING"};
    auto lease = acquire();
    reply_ptr r = lease->command(args, 1, command_deadline());
    if (r->type == REDIS_REPLY_ERROR)
      throw connection_error("ratelimit: redis: PING failed: " + std::string(r->str, r->len));
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
        : opts(std::move(o)),
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

    /// The command: EVALSHA, or EVAL with the script's text.
    void build(bool with_text) {
      using P = typename Config::policy_type;
      const std::vector<std::string> keys = detail::redis_keys(s->opts.prefix, cfg, key);
      std::vector<std::string> policy_args;
      script_for<P>::append_args(cfg, policy_args);
      const std::string time_arg = now ? std::to_string(now->count()) : std::string();
      const std::string cost_arg = std::to_string(cost);
      const std::string_view floor = now ? std::string_view(s->floor_ms) : std::string_view("0");
      bytes.clear();
      bytes.reserve(with_text ? script_for<P>::text.size() + 256 : 256);
      detail::append_eval<P>(bytes, with_text, keys, time_arg, cost_arg, a, policy_args, floor);
    }

    void deliver(const decision& d, std::exception_ptr e) noexcept {
      try {
        handler(d, std::move(e));
      } catch (...) {
      }
    }

    void degrade_and_deliver(const std::exception_ptr& e) noexcept {
      decision d;
      try {
        d = s->degrader.degrade(s->stats, cfg, key, now, cost, a, e);
      } catch (...) {
        deliver(decision{}, std::current_exception());
        return;
      }
      deliver(d, nullptr);
    }

    void complete(std::unique_ptr<mux_job> self, reply_ptr r,
                  std::exception_ptr error) noexcept override {
      if (error) {
        if (s->stopping.load(std::memory_order_acquire)) {
          deliver(decision{}, error);
          return;
        }
        detail::count_error(s->stats, error);
        s->failed();
        if (s->sentinel) s->master_may_have_moved(error);
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
                   units cost, access a, Handler&& handler) {
    detail::check_same_process(shared_->owner_pid);
    shared& st = *shared_;
    if (st.breaker.enter() == detail::breaker::verdict::refuse) {
      st.stats.short_circuited.fetch_add(1, std::memory_order_relaxed);
      const auto err = std::make_exception_ptr(
          connection_error("ratelimit: redis: circuit breaker open (Redis failed recently)"));
      decision d;
      std::exception_ptr e;
      try {
        d = degrade(cfg, key, now, cost, a, err);
      } catch (...) {
        e = std::current_exception();
      }
      try {
        handler(d, std::move(e));
      } catch (...) {
      }
      return;
    }
    using job_t = check_job<Config, std::decay_t<Handler>>;
    auto job = std::make_unique<job_t>(&st, cfg, key, now, cost, a, std::move(handler));
    job->build(false);
    job->until = deadline_clock::now() + st.command_timeout;
    std::unique_ptr<mux_job> base(std::move(job));
    bool queued = false;
    try {
      queued = st.mux.submit(base);
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
    struct waiter {
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      decision d;
      std::exception_ptr e;
    } w;
    start_check(cfg, key, now, cost, a, [&w](decision d, std::exception_ptr e) {
      std::lock_guard<std::mutex> lock(w.m);
      w.d = d;
      w.e = std::move(e);
      w.done = true;
      w.cv.notify_one();  // under the lock: `w` lives until the waiter sees `done`
    });
    std::unique_lock<std::mutex> lock(w.m);
    w.cv.wait(lock, [&] { return w.done; });
    if (w.e) std::rethrow_exception(w.e);
    return w.d;
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
    return run_batch_impl(
               cfg, std::span<const std::string_view>(&key, 1), std::span<const units>(&cost, 1),
               now ? std::span<const timestamp>(&*now, 1) : std::span<const timestamp>(), a)
        .front();
  }

  template <class Config>
  std::vector<decision> run_batch(const Config& cfg, std::span<const batch_item> items,
                                  bool server_time, access a) {
    std::vector<std::string_view> keys;
    std::vector<units> costs;
    std::vector<timestamp> times;
    keys.reserve(items.size());
    costs.reserve(items.size());
    if (!server_time) times.reserve(items.size());
    for (const batch_item& it : items) {
      keys.push_back(it.key);
      costs.push_back(it.cost);
      if (!server_time) times.push_back(it.now);
    }
    return run_batch_impl(cfg, keys, costs, times, a);
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
