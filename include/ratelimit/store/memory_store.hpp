// SPDX-License-Identifier: Apache-2.0
// The in-process store: a sharded hash map from key to policy state.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>  // std::lock_guard
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/forced_step.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/detail/spin_lock.hpp"

namespace ratelimit {

/// What the memory store does with a new key when `max_keys` is reached and
/// no idle key can be reclaimed. Existing keys are always decided normally.
enum class when_full : unsigned char {
  fail_open,    ///< admit the new key's request without recording it (source fail_open)
  fail_closed,  ///< reject it (source fail_closed, retry_after 0: nothing is known)
};

/// Most shards a `memory_store` takes (64 MiB of shard headers).
inline constexpr std::size_t max_shards = std::size_t{1} << 20;

/// Options of `memory_store`. An aggregate; every field has a default.
struct memory_store_options {
  /// Number of independently locked shards, at most `max_shards`; rounded
  /// up to a power of two; 0 = 64. More shards = less contention between
  /// threads on distinct keys.
  std::size_t shards = 0;
  /// Hard cap on the number of keys held; 0 = no cap (idle keys are still
  /// reclaimed, so memory follows the number of active keys).
  std::size_t max_keys = 0;
  /// Behaviour for a new key when the cap is reached.
  when_full on_full = when_full::fail_open;
  /// Keys examined for idleness per inserted key (incremental reclaim); 0 = 2.
  std::size_t sweep_per_insert = 0;
  /// The 128-bit SipHash key; empty (the default) = a fresh random key per
  /// store. A fixed key makes runs reproducible where decisions can depend on
  /// which keys were reclaimed (out-of-order caller times, as in a replay of
  /// an unsorted log), but anyone who knows it can build keys that share one
  /// chain: never fix it where callers choose the keys.
  std::optional<std::array<std::uint64_t, 2>> hash_key = std::nullopt;
};

/// Holds the state of policy P for any number of keys, in process.
///
/// Each key lives in one of N shards chosen by its hash; a check locks only
/// that shard. A key is one allocation holding its bytes and its state, found
/// by `std::string_view` without allocating. Keys are hashed with SipHash-1-3
/// under a key drawn at random for each store, so callers who choose the keys
/// (user ids, IP addresses, API tokens) cannot make them share a bucket.
///
/// Keys whose state is back to empty ("idle", see `P::idle`) are reclaimed
/// incrementally as new keys arrive, and all at once by `sweep`. Each shard
/// remembers the latest time at which it dropped an idle key, and decides a
/// key it does not hold at that time or later (see `try_apply`), so a request
/// whose thread read the clock before the key was dropped is never decided
/// against a state younger than the one dropped.
///
/// If a policy step or an insertion throws (std::bad_alloc), the check
/// throws it, the shard's lock is released, and the key's state and every
/// other key are as they were before the check, except for idle keys the
/// check may already have reclaimed (which changes no decision; `size()`
/// counts them out).
///
/// Thread safety: all member functions may be called from any number of
/// threads concurrently, except construction, destruction and move.
template <policy P>
class memory_store {
 public:
  using policy_type = P;
  using config_type = typename P::config;
  using state_type = typename P::state;

  memory_store() : memory_store(memory_store_options{}) {}
  /// @throws std::invalid_argument when `o.shards` is over `max_shards`
  explicit memory_store(memory_store_options o)
      : options_(normalise(o)),
        shard_shift_(63U - static_cast<unsigned>(std::countr_zero(options_.shards))),
        seed_(options_.hash_key
                  ? detail::siphash_key{(*options_.hash_key)[0], (*options_.hash_key)[1]}
                  : make_seed(this)),
        shards_(std::make_unique<shard[]>(options_.shards)),
        hints_(std::make_unique<table_hint[]>(options_.shards)),
        count_(std::make_unique<std::atomic<std::size_t>>(0)) {
    for (std::size_t i = 0; i < options_.shards; ++i) shards_[i].hint = &hints_[i];
  }

  memory_store(memory_store&&) noexcept = default;
  memory_store& operator=(memory_store&&) noexcept = default;
  memory_store(const memory_store&) = delete;
  memory_store& operator=(const memory_store&) = delete;
  ~memory_store() = default;

  /// Applies P to `key` at `now` with `cost` as one atomic step.
  /// @param key  validated by the caller (1..512 bytes)
  /// @param now  microseconds since the clock's epoch
  /// @param cost validated by the caller (>= 1)
  /// @param a    consume (record), peek (decide only) or force (record as
  ///             admitted even when rejected; see concepts.hpp)
  /// @throws std::bad_alloc with the store unchanged (see the class comment)
  decision apply(const config_type& cfg, std::string_view key, timestamp now, units cost,
                 access a) {
    const std::uint64_t h = hash(key);
    return apply_in_shard(cfg, h, shard_for(h), key, now, cost, a);
  }

  /// `apply` at the time `read_now()` returns, called once after the key is
  /// hashed and before the shard is locked: what a limiter that reads its
  /// own clock calls. On x86 reading the TSC waits for every earlier load to
  /// complete; read first, it would hold the key's load and hash up behind
  /// the previous check's cache misses, which on a large store cost about
  /// four times the read itself. So the key is hashed first and its bucket
  /// is prefetched (a prefetch is not waited for), then the clock is read
  /// while that cache miss is served, then the shard is locked. If
  /// `read_now` throws, nothing was done.
  /// @param read_now  returns a valid `timestamp`; may throw
  template <class ReadNow>
  decision apply_reading(const config_type& cfg, std::string_view key, ReadNow&& read_now,
                         units cost, access a) {
    const std::uint64_t h = hash(key);
    shard& sh = shard_for(h);
    hints_[shard_index(h)].prefetch(h);
    return apply_in_shard(cfg, h, sh, key, read_now(), cost, a);
  }

  /// The keyed hash of `key` in this store: what `apply_hashed` takes. A
  /// caller that checks one key twice (a lease's acquire, then its release)
  /// keeps it so that the second check skips hashing the key.
  [[nodiscard]] std::uint64_t key_hash(std::string_view key) const noexcept { return hash(key); }

  /// `apply`, also setting `h` to the key's hash (`key_hash(key)`) before
  /// the check is made: what a caller that keeps the hash for a later
  /// `apply_hashed` calls (a lease's acquire filling its lease_hint). The
  /// hash is this store's own, so the key is hashed once and its shard
  /// locked once whether or not the store holds it (`key_hash` and then
  /// `apply_hashed` would hash and lock twice for a new key).
  /// @throws std::bad_alloc with the store unchanged; `h` is set even then
  decision apply_keeping_hash(const config_type& cfg, std::string_view key, std::uint64_t& h,
                              timestamp now, units cost, access a) {
    h = hash(key);
    return apply_in_shard(cfg, h, shard_for(h), key, now, cost, a);
  }

  /// `apply` with `h`, the key's hash, computed before (`key_hash`). Any
  /// `h` is safe: the key is found only in a node holding its very bytes
  /// and this store's hash of them, so a hash of another key, from another
  /// store or made up finds nothing, and the check is then made as `apply`
  /// makes it (hashing the key): the same decision, one hash later.
  decision apply_hashed(const config_type& cfg, std::string_view key, std::uint64_t h,
                        timestamp now, units cost, access a) {
    {
      shard& sh = shard_for(h);
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      if (node* n = sh.find(h, key)) return step_held(cfg, n->state, now, cost, a);
    }
    return apply(cfg, key, now, cost, a);
  }

  /// Forgets `key` (its next check sees a key never seen).
  void reset(const config_type&, std::string_view key) {
    const std::uint64_t h = hash(key);
    shard& sh = shard_for(h);
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    if (sh.erase(h, key)) count_->fetch_sub(1, std::memory_order_relaxed);
  }

  /// Drops every key idle at `now`; returns how many were dropped.
  ///
  /// Holds a shard's lock for at most 64 buckets at a time, so checks on
  /// that shard wait for one chunk, never for the whole shard. Keys held from
  /// the start to the end of the sweep are all examined even if other
  /// threads grow or shrink the shard's table between chunks. A shard that
  /// drops a key decides keys it does not hold at `now` or later from then
  /// on (see the class comment), so pass the clock's time, not a later one.
  std::size_t sweep(const config_type& cfg, timestamp now) {
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < options_.shards; ++i) {
      shard& sh = shards_[i];
      std::uint64_t cursor = 0;
      do {
        std::lock_guard<detail::spin_lock> guard(sh.lock);
        dropped += sh.sweep_chunk(cfg, now, cursor, *count_);
      } while (cursor != 0);
    }
    return dropped;
  }

  /// Keys currently held (idle ones not yet reclaimed included).
  [[nodiscard]] std::size_t size() const noexcept {
    return count_->load(std::memory_order_relaxed);
  }

  /// Copy of the state held for `key`, or a value-initialised one.
  [[nodiscard]] state_type state_of(std::string_view key) const {
    return inspect(key, [](const state_type* s) { return s != nullptr ? *s : state_type{}; });
  }

  /// Returns `f(held)` called under the shard's lock, `held` pointing to the
  /// state held for `key` or null when none is: reads a part of a state
  /// without copying all of it. `f` must not call into this store.
  template <class F>
  decltype(auto) inspect(std::string_view key, F&& f) const {
    const std::uint64_t h = hash(key);
    shard& sh = shard_for(h);
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    const node* n = sh.find(h, key);
    return std::forward<F>(f)(n != nullptr ? &n->state : static_cast<const state_type*>(nullptr));
  }

  [[nodiscard]] const memory_store_options& options() const noexcept { return options_; }

  /// The most keys found in one hash bucket, over every shard: a diagnostic
  /// (a healthy store stays in single digits whatever the keys are).
  /// Thread safety: takes each shard's lock in turn; walks every key, so it
  /// is meant for tests and monitoring, not for the request path.
  [[nodiscard]] std::size_t longest_chain() const {
    std::size_t longest = 0;
    for (std::size_t i = 0; i < options_.shards; ++i) {
      shard& sh = shards_[i];
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      for (std::size_t b = 0; b < sh.bucket_count(); ++b) {
        std::size_t length = 0;
        for (const node* n = sh.buckets[b]; n != nullptr; n = n->next) ++length;
        longest = std::max(longest, length);
      }
    }
    return longest;
  }

 private:
  static constexpr std::size_t sweep_when_full = 64;
  static constexpr std::size_t reclaim_nodes = 256;
  /// Buckets a full `sweep` examines per hold of a shard's lock.
  static constexpr std::size_t sweep_chunk_buckets = 64;

  /// One key: this header, then the key's bytes, in one allocation.
  struct node {
    node* next;
    std::uint64_t hash;
    state_type state;
    std::uint32_t size;

    [[nodiscard]] const char* key_data() const noexcept {
      return reinterpret_cast<const char*>(this) + sizeof(node);
    }
    [[nodiscard]] std::string_view key() const noexcept { return {key_data(), size}; }

    /// Whether this node holds `k`. Keys of 8 to 16 bytes (phone numbers,
    /// IPv4 addresses, short ids) are compared with two overlapping 8-byte
    /// loads each, inline, instead of a call to memcmp.
    [[nodiscard]] bool holds(std::string_view k) const noexcept {
      if (k.size() != size) return false;
      const char* mine = key_data();
      if (size >= 8 && size <= 16) {
        return load8(mine) == load8(k.data()) &&
               load8(mine + size - 8) == load8(k.data() + size - 8);
      }
      return std::memcmp(mine, k.data(), size) == 0;
    }

    [[nodiscard]] static std::uint64_t load8(const char* p) noexcept {
      std::uint64_t v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }

    static node* create(std::uint64_t h, std::string_view key, state_type&& st) {
      void* mem = ::operator new(sizeof(node) + key.size());
      node* n = ::new (mem) node{nullptr, h, std::move(st), static_cast<std::uint32_t>(key.size())};
      std::memcpy(static_cast<char*>(mem) + sizeof(node), key.data(), key.size());
      return n;
    }
    static void destroy(node* n) noexcept {
      n->~node();
      ::operator delete(static_cast<void*>(n));
    }
  };

  /// Where a shard's bucket array is, for the prefetch in `apply_reading`:
  /// written under the shard's lock whenever the array moves, read without
  /// it. The two words may then come from different arrays, or from one
  /// already freed; they only ever form the address of a prefetch, which
  /// never faults and changes nothing but the cache. Kept apart from the
  /// shards, whose cache lines two threads take from each other on every
  /// check, so that reading it does not fetch one more time.
  struct table_hint {
    std::atomic<std::uintptr_t> base{0};
    std::atomic<std::size_t> mask{0};

    void set(node** buckets, std::size_t m) noexcept {
      base.store(reinterpret_cast<std::uintptr_t>(buckets), std::memory_order_relaxed);
      mask.store(m, std::memory_order_relaxed);
    }

    void prefetch(std::uint64_t h) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
      const std::uintptr_t b = base.load(std::memory_order_relaxed);
      if (b == 0) return;
      // Integer arithmetic: a stale mask may point past a stale array.
      const std::uintptr_t slot = b + (h & mask.load(std::memory_order_relaxed)) * sizeof(node*);
      __builtin_prefetch(reinterpret_cast<const void*>(slot));
#else
      (void)h;
#endif
    }
  };

  struct alignas(64) shard {
    detail::spin_lock lock;
    node** buckets = nullptr;
    std::size_t mask = 0;  ///< bucket count - 1, or 0 before the first insert
    std::size_t size = 0;
    std::size_t cursor = 0;  ///< next bucket the incremental sweep examines
    /// The latest `now` at which this shard dropped an idle key.
    timestamp reclaimed_at = timestamp::min();
    table_hint* hint = nullptr;  ///< this shard's entry in the store's `hints_`

    shard() = default;
    shard(const shard&) = delete;
    shard& operator=(const shard&) = delete;
    ~shard() {
      if (buckets == nullptr) return;
      for (std::size_t i = 0; i <= mask; ++i) {
        for (node* n = buckets[i]; n != nullptr;) {
          node* next = n->next;
          node::destroy(n);
          n = next;
        }
      }
      delete[] buckets;
    }

    [[nodiscard]] std::size_t bucket_count() const noexcept {
      return buckets == nullptr ? 0 : mask + 1;
    }

    [[nodiscard]] node* find(std::uint64_t h, std::string_view key) const noexcept {
      if (buckets == nullptr) return nullptr;
      for (node* n = buckets[h & mask]; n != nullptr; n = n->next) {
        if (n->hash == h && n->holds(key)) return n;
      }
      return nullptr;
    }

    void insert(std::uint64_t h, std::string_view key, state_type&& st) {
      if (size + 1 > bucket_count()) grow();
      node* n = node::create(h, key, std::move(st));
      node*& head = buckets[h & mask];
      n->next = head;
      head = n;
      ++size;
    }

    bool erase(std::uint64_t h, std::string_view key) noexcept {
      if (buckets == nullptr) return false;
      for (node** link = &buckets[h & mask]; *link != nullptr; link = &(*link)->next) {
        node* n = *link;
        if (n->hash == h && n->holds(key)) {
          *link = n->next;
          node::destroy(n);
          --size;
          return true;
        }
      }
      return false;
    }

    /// Examines buckets from the cursor until `nodes` keys were looked at
    /// (or 16 buckets passed) and drops the idle ones.
    std::size_t sweep_some(const config_type& cfg, timestamp now, std::size_t nodes,
                           std::atomic<std::size_t>& total) noexcept {
      std::size_t seen = 0;
      return sweep(cfg, now, nodes, 16, seen, total);
    }

    /// Drops idle keys from buckets after the cursor; stops after
    /// `bucket_budget` buckets or once `nodes` keys were looked at (added to
    /// `seen`). Returns how many were dropped.
    std::size_t sweep(const config_type& cfg, timestamp now, std::size_t nodes,
                      std::size_t bucket_budget, std::size_t& seen_total,
                      std::atomic<std::size_t>& total) noexcept {
      std::size_t dropped = 0;
      std::size_t seen = 0;
      const std::size_t nb = bucket_count();
      for (std::size_t i = 0; i < bucket_budget && i < nb && seen < nodes; ++i) {
        cursor = (cursor + 1) & mask;
        dropped += drop_idle(cfg, now, buckets[cursor], seen);
      }
      seen_total += seen;
      after_drops(dropped, now, total);
      return dropped;
    }

    /// One chunk of a full sweep: examines up to `sweep_chunk_buckets`
    /// buckets in reverse-binary order from `scan` (0 starts a sweep) and
    /// advances it; `scan` is 0 again once every bucket was examined.
    ///
    /// Reverse-binary order (as Redis's SCAN) increments the bucket index
    /// from its top bit down. When the table doubles, bucket b splits into b
    /// and b + old size, both ahead of or both behind the scan; when it
    /// halves, buckets merge likewise. So a sweep spread over many lock holds
    /// still examines every key held throughout (a key may be examined
    /// twice after a shrink, which is harmless).
    std::size_t sweep_chunk(const config_type& cfg, timestamp now, std::uint64_t& scan,
                            std::atomic<std::size_t>& total) noexcept {
      if (buckets == nullptr) {
        scan = 0;
        return 0;
      }
      std::size_t dropped = 0;
      std::size_t seen = 0;
      for (std::size_t i = 0; i < sweep_chunk_buckets; ++i) {
        dropped += drop_idle(cfg, now, buckets[scan & mask], seen);
        scan = next_in_scan(scan, mask);
        if (scan == 0) break;
      }
      after_drops(dropped, now, total);
      return dropped;
    }

    [[nodiscard]] static std::uint64_t next_in_scan(std::uint64_t scan,
                                                    std::uint64_t table_mask) noexcept {
      scan |= ~static_cast<std::uint64_t>(table_mask);
      return reverse_bits(reverse_bits(scan) + 1);
    }

    [[nodiscard]] static std::uint64_t reverse_bits(std::uint64_t v) noexcept {
      v = ((v >> 1) & 0x5555555555555555ULL) | ((v & 0x5555555555555555ULL) << 1);
      v = ((v >> 2) & 0x3333333333333333ULL) | ((v & 0x3333333333333333ULL) << 2);
      v = ((v >> 4) & 0x0f0f0f0f0f0f0f0fULL) | ((v & 0x0f0f0f0f0f0f0f0fULL) << 4);
      v = ((v >> 8) & 0x00ff00ff00ff00ffULL) | ((v & 0x00ff00ff00ff00ffULL) << 8);
      v = ((v >> 16) & 0x0000ffff0000ffffULL) | ((v & 0x0000ffff0000ffffULL) << 16);
      return (v >> 32) | (v << 32);
    }

    /// Drops the idle keys of one chain; counts the keys looked at in `seen`.
    std::size_t drop_idle(const config_type& cfg, timestamp now, node*& head,
                          std::size_t& seen) noexcept {
      std::size_t dropped = 0;
      for (node** link = &head; *link != nullptr;) {
        node* n = *link;
        ++seen;
        if (P::idle(cfg, n->state, now)) {
          *link = n->next;
          node::destroy(n);
          --size;
          ++dropped;
        } else {
          link = &n->next;
        }
      }
      return dropped;
    }

    /// Bookkeeping after idle keys were dropped at `now`.
    void after_drops(std::size_t dropped, timestamp now, std::atomic<std::size_t>& total) noexcept {
      if (dropped == 0) return;
      total.fetch_sub(dropped, std::memory_order_relaxed);
      reclaimed_at = std::max(reclaimed_at, now);
      // After a spike, shrink: a table mostly empty would make every pass
      // of the incremental sweep long, and idle keys would linger. Shrinking
      // is only an optimisation: without memory for the smaller table, keep
      // the larger one.
      const std::size_t nb = bucket_count();
      if (nb > 16 && size < nb / 8) {
        try {
          resize(nb / 2);
        } catch (const std::bad_alloc&) {  // NOLINT(bugprone-empty-catch)
        }
      }
    }

    void grow() { resize(buckets == nullptr ? 16 : (mask + 1) * 2); }

    /// Rehashes into `next_count` buckets; on std::bad_alloc nothing changed.
    void resize(std::size_t next_count) {
      auto** next = new node*[next_count]();
      const std::size_t next_mask = next_count - 1;
      for (std::size_t i = 0; i < bucket_count(); ++i) {
        for (node* n = buckets[i]; n != nullptr;) {
          node* following = n->next;
          node*& head = next[n->hash & next_mask];
          n->next = head;
          head = n;
          n = following;
        }
      }
      delete[] buckets;
      buckets = next;
      mask = next_mask;
      cursor &= mask;
      hint->set(buckets, mask);
    }
  };

  static memory_store_options normalise(memory_store_options o) {
    // Checked before rounding up: std::bit_ceil of a count above 2^63 is
    // undefined (a size_t from a negative number would get there).
    if (o.shards > max_shards) {
      throw std::invalid_argument("ratelimit: memory_store_options::shards " +
                                  std::to_string(o.shards) + " is over the maximum of " +
                                  std::to_string(max_shards));
    }
    o.shards = std::bit_ceil(o.shards == 0 ? std::size_t{64} : o.shards);
    if (o.sweep_per_insert == 0) o.sweep_per_insert = 2;
    return o;
  }

  /// SipHash-1-3 under the store's secret key. An unkeyed hash such as
  /// libstdc++'s std::hash (MurmurHash-like) has multicollisions that do not
  /// depend on any seed: anyone can build 2^n keys of 16n bytes that share
  /// one 64-bit hash, which would put them all in one chain of one shard and
  /// make every check on them cost a walk of that chain under its lock.
  [[nodiscard]] std::uint64_t hash(std::string_view key) const noexcept {
    return detail::siphash13(seed_, key);
  }

  /// A fresh secret key per store, from the system's random source; should
  /// that be unavailable, from the store's address and the time, which still
  /// differ from run to run and are not visible to a remote caller.
  [[nodiscard]] static detail::siphash_key make_seed(const void* self) noexcept {
    try {
      std::random_device rd;
      const auto word = [&rd] {
        return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
      };
      return {word(), word()};
    } catch (...) {  // std::random_device may throw when no entropy source exists
      const auto ticks = static_cast<std::uint64_t>(
          std::chrono::steady_clock::now().time_since_epoch().count());
      const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(self));
      // Two distinct words out of one SipHash keyed by the mixed inputs.
      const detail::siphash_key mixed{ticks ^ 0x9e3779b97f4a7c15ULL, address};
      return {detail::siphash13(mixed, "ratelimit.k0"), detail::siphash13(mixed, "ratelimit.k1")};
    }
  }

  [[nodiscard]] shard& shard_for(std::uint64_t h) const noexcept { return shards_[shard_index(h)]; }

  [[nodiscard]] std::size_t shard_index(std::uint64_t h) const noexcept {
    // High bits pick the shard, low bits the bucket, so the two stay independent.
    // (h >> 1) >> (63 - bits) is h >> (64 - bits) without the undefined
    // shift by 64 when there is one shard (bits = 0), and without a branch.
    return static_cast<std::size_t>((h >> 1) >> shard_shift_);
  }

  /// `apply` on a key already hashed to `h` in shard `sh`.
  decision apply_in_shard(const config_type& cfg, std::uint64_t h, shard& sh, std::string_view key,
                          timestamp now, units cost, access a) {
    {
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      // try_apply, with the held key's case written out so that its
      // decision is returned directly rather than through an optional.
      if (node* n = sh.find(h, key)) return step_held(cfg, n->state, now, cost, a);
      if (auto d = apply_new(sh, cfg, h, key, now, cost, a)) return *d;
    }
    return apply_when_full(sh, cfg, h, key, now, cost, a);
  }

  /// Decides under the shard's lock; empty only when a new key must be
  /// recorded and the store is full.
  ///
  /// A key the shard does not hold is decided at `max(now, reclaimed_at)`.
  /// Why: the caller read `now` before taking the lock. Meanwhile another
  /// thread may have found this key idle at some later time r and dropped
  /// it; deciding the caller's request at `now` on an empty state would then
  /// forget requests the dropped state still counted at `now` (a key filled
  /// to its limit at t0 would admit one more request in the window holding
  /// t0 and `now`). Deciding at r instead is exact for every policy here:
  /// `P::idle(s, r)` means that s decides and records every request at r or
  /// later exactly as an empty state does (fixed window: r is in a later
  /// window; sliding log: every entry is at or before r - W; sliding
  /// counter: both counts are out of reach at r; token bucket: refilled by
  /// r; GCRA: TAT <= r; compound: every part idle). So the result is the one
  /// the dropped state would have given a request stamped r, the time the
  /// drop itself read, no later than this check: the same as a limiter whose
  /// thread read its clock a little later, and the usual rule that durations
  /// are measured from the decision time holds. The mark is per shard, as a
  /// key lives in one shard; a key never held in the shard is decided at r
  /// too, which changes nothing for an empty state except that its first
  /// record is stamped r (only possible when times run out of order).
  std::optional<decision> try_apply(shard& sh, const config_type& cfg, std::uint64_t h,
                                    std::string_view key, timestamp now, units cost, access a) {
    if (node* n = sh.find(h, key)) return step_held(cfg, n->state, now, cost, a);
    return apply_new(sh, cfg, h, key, now, cost, a);
  }

  /// The policy step on a key the shard holds; a peek steps a copy, or
  /// calls `P::peek` on the state itself when P has one (a policy whose
  /// state holds more than the step reads, as idempotent<P>'s ids).
  static decision step_held(const config_type& cfg, state_type& held, timestamp now, units cost,
                            access a) {
    if (a == access::peek) {
      if constexpr (requires(const state_type& s) { P::peek(cfg, s, now, cost); }) {
        return P::peek(cfg, std::as_const(held), now, cost);
      } else {
        state_type copy = held;
        return P::step(cfg, copy, now, cost);
      }
    }
    if (a == access::force) [[unlikely]]
      return detail::forced_step<P>(cfg, held, now, cost);
    return P::step(cfg, held, now, cost);
  }

  // The paths below stay out of line: a check on a key already held (the
  // common case) then runs as one short stretch of code, which leaves the
  // processor room to start the next check's cache misses early.

  /// try_apply for a key the shard does not hold.
  [[gnu::noinline]] std::optional<decision> apply_new(shard& sh, const config_type& cfg,
                                                      std::uint64_t h, std::string_view key,
                                                      timestamp now, units cost, access a) {
    now = std::max(now, sh.reclaimed_at);
    state_type fresh{};
    decision d = a == access::force ? detail::forced_step<P>(cfg, fresh, now, cost)
                                    : P::step(cfg, fresh, now, cost);
    if (a == access::peek || fresh == state_type{}) return d;  // nothing to record
    sh.sweep_some(cfg, now, options_.sweep_per_insert, *count_);
    // Reserve the key's place first so that concurrent inserts on other
    // shards can never take the store past max_keys.
    if (!reserve()) return std::nullopt;
    try {
      sh.insert(h, key, std::move(fresh));
    } catch (...) {
      count_->fetch_sub(1, std::memory_order_relaxed);
      throw;
    }
    return d;
  }

  /// The store is full. Reclaim idle keys in every shard (one lock at a
  /// time, never two), then try once more; another thread may have inserted
  /// this very key meanwhile, which try_apply handles.
  [[gnu::noinline]] decision apply_when_full(shard& sh, const config_type& cfg, std::uint64_t h,
                                             std::string_view key, timestamp now, units cost,
                                             access a) {
    reclaim(cfg, now);
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    if (auto d = try_apply(sh, cfg, h, key, now, cost, a)) return *d;
    return overflow(cfg);
  }

  /// A full store looks for idle keys shard after shard, starting from a
  /// rotating shard, until one is dropped or `reclaim_nodes` keys were looked
  /// at: a flood of new keys at a full store pays a bounded price per check.
  void reclaim(const config_type& cfg, timestamp now) {
    const std::size_t start = reclaim_cursor_->fetch_add(1, std::memory_order_relaxed);
    std::size_t seen = 0;
    for (std::size_t i = 0; i < options_.shards && seen < reclaim_nodes; ++i) {
      shard& sh = shards_[(start + i) & (options_.shards - 1)];
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      if (sh.sweep(cfg, now, reclaim_nodes - seen, sweep_when_full, seen, *count_) != 0) return;
    }
  }

  /// Counts one more key unless that would pass max_keys.
  bool reserve() noexcept {
    if (options_.max_keys == 0) {
      count_->fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    // Compare-and-swap, so that size() itself never reads above the cap.
    std::size_t current = count_->load(std::memory_order_relaxed);
    do {
      if (current >= options_.max_keys) return false;
    } while (!count_->compare_exchange_weak(current, current + 1, std::memory_order_relaxed));
    return true;
  }

  [[nodiscard]] decision overflow(const config_type& cfg) const noexcept {
    decision d;
    d.limit = cfg.limit();
    d.allowed = options_.on_full == when_full::fail_open;
    d.source = d.allowed ? decision_source::fail_open : decision_source::fail_closed;
    return d;
  }

  memory_store_options options_;
  unsigned shard_shift_;  ///< 63 - log2(shards)
  detail::siphash_prepared seed_;
  std::unique_ptr<shard[]> shards_;
  std::unique_ptr<table_hint[]> hints_;
  std::unique_ptr<std::atomic<std::size_t>> count_;
  std::unique_ptr<std::atomic<std::size_t>> reclaim_cursor_ =
      std::make_unique<std::atomic<std::size_t>>(0);
};

}  // namespace ratelimit
