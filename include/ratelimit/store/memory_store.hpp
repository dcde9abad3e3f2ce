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
#include <limits>
#include <memory>
#include <mutex>  // std::lock_guard
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/forced_step.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/detail/spin_lock.hpp"

namespace ratelimit {

/// What the memory store does with a new key when `max_keys` is reached and
/// no idle key can be reclaimed. Existing keys are always decided normally.
enum class when_full : unsigned char {
  fail_open,    ///< admit the new key's request without recording it (source fail_open)
  fail_closed,  ///< reject it (source fail_closed, retry_after 0: nothing is known)
};

/// Most shards a `memory_store` takes (64 MiB of shard headers, 256 bytes
/// each on 64-bit targets). Checks on held keys lock only their bucket, so
/// more shards help only new keys, drops and resizes; the default 64 is
/// enough for most uses.
inline constexpr std::size_t max_shards = std::size_t{1} << 18;

/// Options of `memory_store`. An aggregate; every field has a default.
struct memory_store_options {
  /// Number of shards, at most `max_shards`; rounded up to a power of two;
  /// 0 = 64. Each shard has its own lock for new keys, drops and resizes
  /// (and its own table, so a resize stalls only that shard's checks);
  /// checks on keys already held lock only their bucket.
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
/// Each key lives in one of N shards chosen by its hash, in a bucket of that
/// shard's table. A check on a key the store holds locks only the key's
/// bucket (a bit in the bucket's word), so threads on distinct keys write
/// no common line of the table or the shard (their nodes are separate
/// allocations, which the allocator may still place on one line); a new
/// key, a drop and a resize also take the shard's lock. A key is one allocation holding its bytes and its state, found
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
/// throws it, every lock it took is released, and the key's state and every
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
        count_(std::make_unique<std::atomic<std::size_t>>(0)) {}

  memory_store(memory_store&&) noexcept = default;
  memory_store& operator=(memory_store&&) noexcept = default;
  memory_store(const memory_store&) = delete;
  memory_store& operator=(const memory_store&) = delete;
  ~memory_store() = default;

  /// Applies P to `key` at `now` with `cost` as one atomic step.
  /// @param key  validated by the caller (1..512 bytes); a new one of 2^32
  ///             bytes or more, which a node cannot hold, throws
  ///             std::length_error
  /// @param now  microseconds since the clock's epoch
  /// @param cost validated by the caller (>= 1)
  /// @param a    consume (record), peek (decide only) or force (record as
  ///             admitted even when rejected; see concepts.hpp)
  /// @throws std::bad_alloc with the store unchanged (see the class comment)
  decision apply(const config_type& cfg, std::string_view key, timestamp now, units cost,
                 access a) {
    const std::uint64_t h = hash(key);
    shard& sh = shard_for(h);
    return apply_in_shard(cfg, h, sh, sh.prefetch(h), key, now, cost, a);
  }

  /// `apply` at the time `read_now()` returns, called once after the key is
  /// hashed and before its bucket is locked: what a limiter that reads its
  /// own clock calls. On x86 reading the TSC waits for every earlier load to
  /// complete; read first, it would hold the key's load and hash up behind
  /// the previous check's cache misses, which on a large store cost about
  /// four times the read itself. So the key is hashed first and its bucket
  /// and chain are fetched ahead (see `shard::prefetch`), then the clock is
  /// read while those cache misses are served, then the bucket is locked. If
  /// `read_now` throws, nothing was done.
  /// @param read_now  returns a valid `timestamp`; may throw
  template <class ReadNow>
  decision apply_reading(const config_type& cfg, std::string_view key, ReadNow&& read_now,
                         units cost, access a) {
    const std::uint64_t h = hash(key);
    shard& sh = shard_for(h);
    const typename shard::probe start = sh.prefetch(h);
    return apply_in_shard(cfg, h, sh, start, key, read_now(), cost, a);
  }

  /// The keyed hash of `key` in this store: what `apply_hashed` takes. A
  /// caller that checks one key twice (a lease's acquire, then its release)
  /// keeps it so that the second check skips hashing the key.
  [[nodiscard]] std::uint64_t key_hash(std::string_view key) const noexcept { return hash(key); }

  /// `apply`, also setting `h` to the key's hash (`key_hash(key)`) before
  /// the check is made: what a caller that keeps the hash for a later
  /// `apply_hashed` calls (a lease's acquire filling its lease_hint). The
  /// hash is this store's own, so the key is hashed once whether or not
  /// the store holds it (`key_hash` and then `apply_hashed` would hash a new
  /// key twice).
  /// @throws std::bad_alloc with the store unchanged; `h` is set even then
  decision apply_keeping_hash(const config_type& cfg, std::string_view key, std::uint64_t& h,
                              timestamp now, units cost, access a) {
    h = hash(key);
    shard& sh = shard_for(h);
    return apply_in_shard(cfg, h, sh, sh.prefetch(h), key, now, cost, a);
  }

  /// `apply` with `h`, the key's hash, computed before (`key_hash`). Any
  /// `h` is safe: a key is held only in the shard and bucket its own hash
  /// picks, and found only in a node holding its very bytes (and the low 32
  /// bits of its hash, all a node keeps), so a hash of another key, from
  /// another store or made up finds either nothing, and the check is then
  /// made as `apply` makes it (hashing the key): the same decision, one
  /// hash later; or the key's own node, when `h` shares the low 32 bits and
  /// the shard of the key's hash.
  decision apply_hashed(const config_type& cfg, std::string_view key, std::uint64_t h,
                        timestamp now, units cost, access a) {
    {
      shard& sh = shard_for(h);
      const typename shard::bucket_guard g(sh, h, sh.prefetch(h));
      if (node* n = g.find(h, key)) return step_held(cfg, n->state, now, cost, a);
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
  /// Holds a shard's lock for at most 64 buckets at a time and each
  /// bucket's lock only while it examines that bucket, so checks on keys
  /// already held go on meanwhile, and new keys wait for one chunk at most. Keys held from
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

  /// Returns `f(held)` called under the key's bucket lock, `held` pointing to the
  /// state held for `key` or null when none is: reads a part of a state
  /// without copying all of it. `f` must not call into this store.
  template <class F>
  decltype(auto) inspect(std::string_view key, F&& f) const {
    const std::uint64_t h = hash(key);
    const typename shard::bucket_guard g(shard_for(h), h);
    const node* n = g.find(h, key);
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
        bucket& word = sh.at(b);
        node* head = lock_bucket(word);
        for (const node* n = head; n != nullptr; n = n->next) ++length;
        unlock_bucket(word, head);
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

  /// One key: this header, then the key's bytes, in one allocation. The
  /// header has no padding for a state of 8-byte alignment, so a node of a
  /// 12-byte key fits a 48-byte heap chunk for GCRA and a 64-byte one for
  /// the sliding counter (64 and 80 when `hash` took 8 bytes and `size` sat
  /// after the state: the counter's node then straddled two cache lines on
  /// most keys, and its check took 1.2x as long).
  struct node {
    node* next;
    /// The low 32 bits of the key's hash: all that a bucket index needs (a
    /// shard has at most 2^27 buckets), and a filter before the key compare.
    std::uint32_t hash;
    std::uint32_t size;
    state_type state;

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

    /// @throws std::length_error for a key of 2^32 bytes or more
    ///   (throw_key_too_long), std::bad_alloc, or whatever moving the state
    ///   throws; nothing is allocated then.
    static node* create(std::uint64_t h, std::string_view key, state_type&& st) {
      if (key.size() > std::numeric_limits<std::uint32_t>::max()) [[unlikely]]
        throw_key_too_long(key.size());
      void* mem = over_aligned
                      ? ::operator new(sizeof(node) + key.size(), std::align_val_t{alignof(node)})
                      : ::operator new(sizeof(node) + key.size());
      node* n;
      // A state whose move throws leaves no node behind; with a no-throw
      // move (every built-in policy) the compiler drops the handler.
      try {
        n = ::new (mem) node{nullptr, static_cast<std::uint32_t>(h),
                             static_cast<std::uint32_t>(key.size()), std::move(st)};
      } catch (...) {
        release(mem);
        throw;
      }
      std::memcpy(static_cast<char*>(mem) + sizeof(node), key.data(), key.size());
      return n;
    }
    static void destroy(node* n) noexcept {
      n->~node();
      release(n);
    }
    /// Frees a node's memory (its node destroyed or never made).
    static void release(void* mem) noexcept {
      if constexpr (over_aligned) {
        ::operator delete(mem, std::align_val_t{alignof(node)});
      } else {
        ::operator delete(mem);
      }
    }

    /// A state aligned beyond what plain `operator new` gives (a policy's
    /// `alignas(32)` or `alignas(64)` state): such nodes take the aligned
    /// `operator new`. The key's bytes need no alignment.
    static constexpr bool over_aligned = alignof(state_type) > __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  };

  /// A bucket: the head of its chain of nodes, whose lowest bit is the
  /// bucket's lock (nodes are at least 8-byte aligned). A check on a key
  /// locks the key's bucket and nothing else: the bucket's cache line is one
  /// it reads anyway, so the lock costs no cache miss of its own, and two
  /// threads on distinct keys write no common line of the table (they meet
  /// there only when their keys share a line of buckets, 8 buckets per
  /// line; their nodes may share a line if the allocator put them on one).
  using bucket = std::atomic<std::uintptr_t>;
  static constexpr std::uintptr_t bucket_locked = 1;

  /// Segments of a shard's bucket table: segment 0 holds buckets 0-15 and
  /// segment j >= 1 buckets [2^(j+3), 2^(j+4)), so doubling a table adds one
  /// segment and no bucket ever moves in memory. A check reads the table
  /// without the shard's lock; since no segment is freed before the store
  /// is, whatever segment a check reached stays valid memory (a table that
  /// shrinks keeps its upper segments, empty, for the next growth). At most
  /// 16 * 2^(max_segments - 1) buckets per shard (2^27, over 8 billion for
  /// 64 shards); beyond that a shard stops growing and its chains lengthen.
  static constexpr std::size_t max_segments = 24;
  static constexpr std::size_t first_segment = 16;
  static_assert((first_segment << (max_segments - 1)) <= (std::uint64_t{1} << 32),
                "a bucket index must fit the 32 bits of the hash a node keeps");

  struct segment_of {
    std::size_t index;
    std::size_t offset;
  };
  [[nodiscard, gnu::always_inline]] static segment_of locate(std::size_t b) noexcept {
    if (b < first_segment) return {0, b};
    const auto width = static_cast<std::size_t>(std::bit_width(b));
    return {width - 4, b ^ (std::size_t{1} << (width - 1))};
  }
  [[nodiscard]] static std::size_t segment_size(std::size_t j) noexcept {
    return j == 0 ? first_segment : first_segment << (j - 1);
  }

  /// Takes bucket `b`'s lock; returns its chain. The common case is one
  /// locked bit-test-and-set on a line the check needs anyway; a bucket held
  /// by another thread is waited for by spinning on plain loads, then by
  /// yielding, then by short sleeps (a table being resized holds every
  /// bucket of its shard for as long as the rehash takes).
  [[gnu::always_inline]] static node* lock_bucket(bucket& b) noexcept {
    if ((b.fetch_or(bucket_locked, std::memory_order_acquire) & bucket_locked) != 0) [[unlikely]]
      wait_for_bucket(b);
    return reinterpret_cast<node*>(b.load(std::memory_order_relaxed) & ~bucket_locked);
  }
  /// `lock_bucket` for a check that already read the bucket's word
  /// (`seen`, from `shard::prefetch`): a compare-and-swap from that word. On
  /// success the chain's head is the word read before, not a value the
  /// locked instruction returns, so the processor can start walking the
  /// chain before the lock is confirmed (measured: 5-10% of a check on a
  /// large store, against `fetch_or` and a second load).
  [[gnu::always_inline]] static node* lock_bucket_seen(bucket& b, std::uintptr_t seen) noexcept {
    seen &= ~bucket_locked;
    if (b.compare_exchange_strong(seen, seen | bucket_locked, std::memory_order_acquire,
                                  std::memory_order_relaxed)) [[likely]]
      return reinterpret_cast<node*>(seen);
    return lock_bucket(b);
  }
  [[gnu::noinline, gnu::cold]] static void wait_for_bucket(bucket& b) noexcept {
    for (unsigned round = 0;; ++round) {
      if ((b.load(std::memory_order_relaxed) & bucket_locked) == 0 &&
          (b.fetch_or(bucket_locked, std::memory_order_acquire) & bucket_locked) == 0) {
        return;
      }
      if (round < 128) {
        detail::spin_lock::relax();
      } else if (round < 160) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds{20});
      }
    }
  }
  /// Drops bucket `b`'s lock, its chain now being `head`.
  [[gnu::always_inline]] static void unlock_bucket(bucket& b, node* head) noexcept {
    b.store(reinterpret_cast<std::uintptr_t>(head), std::memory_order_release);
  }

  /// A shard: a table of buckets, each with its own lock, and the lock that
  /// orders changes to the table's shape. A check on a held key takes only
  /// its bucket's lock. Inserting a key, dropping one and resizing the table
  /// take the shard's lock first, then bucket locks (a resize takes them
  /// all); a thread that holds a bucket's lock never waits for the shard's
  /// lock nor for a second bucket unless it holds the shard's lock, so no
  /// two threads can wait for each other.
  struct alignas(64) shard {
    /// Buckets - 1, or 0 before the table exists. Read by every check,
    /// written only by a resize, which holds every bucket's lock meanwhile.
    std::atomic<std::size_t> mask{0};
    std::array<std::atomic<bucket*>, max_segments> segments{};
    // The fields below change under `lock` only; they share the last cache
    // line with the segments of tables over 2^26 buckets, which no check
    // reads elsewhere.
    detail::spin_lock lock;
    std::size_t size = 0;
    std::size_t cursor = 0;  ///< next bucket the incremental sweep examines
    /// The latest `now` at which this shard dropped an idle key.
    timestamp reclaimed_at = timestamp::min();

    shard() = default;
    shard(const shard&) = delete;
    shard& operator=(const shard&) = delete;
    ~shard() {
      const std::size_t m = mask.load(std::memory_order_relaxed);
      for (std::size_t i = 0; m != 0 && i <= m; ++i) {
        for (node* n = chain(at(i).load(std::memory_order_relaxed)); n != nullptr;) {
          node* next = n->next;
          node::destroy(n);
          n = next;
        }
      }
      for (auto& seg : segments) delete[] seg.load(std::memory_order_relaxed);
    }

    [[nodiscard]] static node* chain(std::uintptr_t word) noexcept {
      return reinterpret_cast<node*>(word & ~bucket_locked);
    }

    [[nodiscard]] std::size_t bucket_count() const noexcept {
      const std::size_t m = mask.load(std::memory_order_relaxed);
      return m == 0 ? 0 : m + 1;
    }

    /// Bucket `b` of the table; `b` must be below a mask read before.
    [[nodiscard, gnu::always_inline]] bucket& at(std::size_t b) const noexcept {
      const segment_of where = locate(b);
      return segments[where.index].load(std::memory_order_relaxed)[where.offset];
    }

    /// Where a check on hash `h` starts: the bucket under the mask read.
    struct probe {
      bucket* at = nullptr;  ///< null when the shard has no table yet
      std::size_t mask = 0;
      std::uintptr_t seen = 0;
    };

    /// Finds the bucket of hash `h` and starts fetching it and the first
    /// node of its chain, without taking the bucket's lock. On x86 a locked
    /// instruction waits for every earlier access, so a lock taken on a
    /// bucket not yet in cache would serve this check's misses one after the
    /// other, behind the previous check's; the plain load and prefetches
    /// here run ahead instead, while the previous check finishes. The chain's
    /// head may be stale or freed by the time it is prefetched: a prefetch
    /// never faults, and the check reads the chain only under the lock.
    [[nodiscard, gnu::always_inline]] probe prefetch(std::uint64_t h) const noexcept {
      const std::size_t m = mask.load(std::memory_order_acquire);
      if (m == 0) return {};
      bucket& b = at(h & m);
#if defined(__GNUC__) || defined(__clang__)
      __builtin_prefetch(&b, 1);
      const std::uintptr_t w = b.load(std::memory_order_relaxed);
      __builtin_prefetch(reinterpret_cast<const void*>(w & ~bucket_locked));
      return {&b, m, w};
#else
      return {&b, m, b.load(std::memory_order_relaxed)};
#endif
    }

    /// A held bucket lock; empty when the shard has no table yet.
    class bucket_guard {
     public:
      /// Locks the bucket of `h` in the table as it is once locked. A node
      /// is in exactly one chain and moves to another only while a resize
      /// holds both buckets, so a node found in the chain of any bucket the
      /// check holds is locked, whatever mask led there. The mask is read
      /// again after the lock only so that the bucket is the key's in the
      /// current table (a resize changes the mask only while it holds every
      /// bucket): otherwise a key moved by a resize since the first read
      /// would look absent (which a check would survive, looking again under
      /// the shard's lock, but `inspect` would not).
      /// `start`, when given, is where `prefetch` found the bucket.
      /// The common case (the bucket `start` found, the mask unchanged)
      /// is inline in every check; the rest is out of line.
      [[gnu::always_inline]] bucket_guard(const shard& sh, std::uint64_t h,
                                          probe start = {}) noexcept {
        if (start.at != nullptr) [[likely]] {
          node* head = lock_bucket_seen(*start.at, start.seen);
          if (sh.mask.load(std::memory_order_relaxed) == start.mask) [[likely]] {
            b_ = start.at;
            head_ = head;
            return;
          }
          unlock_bucket(*start.at, head);
        }
        lock_from_scratch(sh, h);
      }
      bucket_guard(const bucket_guard&) = delete;
      bucket_guard& operator=(const bucket_guard&) = delete;
      [[gnu::always_inline]] ~bucket_guard() {
        if (b_ != nullptr) unlock_bucket(*b_, head_);
      }

      [[nodiscard]] node* find(std::uint64_t h, std::string_view key) const noexcept {
        for (node* n = head_; n != nullptr; n = n->next) {
          if (n->hash == static_cast<std::uint32_t>(h) && n->holds(key)) return n;
        }
        return nullptr;
      }

      [[gnu::noinline]] void lock_from_scratch(const shard& sh, std::uint64_t h) noexcept {
        for (;;) {
          const std::size_t m = sh.mask.load(std::memory_order_acquire);
          if (m == 0) return;
          bucket& b = sh.at(h & m);
          node* head = lock_bucket(b);
          if (sh.mask.load(std::memory_order_relaxed) == m) [[likely]] {
            b_ = &b;
            head_ = head;
            return;
          }
          unlock_bucket(b, head);
        }
      }
      [[nodiscard]] node*& head() noexcept { return head_; }

     private:
      bucket* b_ = nullptr;
      node* head_ = nullptr;
    };

    /// Inserts a key the shard does not hold. Holds `lock`, and no bucket.
    void insert(std::uint64_t h, std::string_view key, state_type&& st) {
      if (size + 1 > bucket_count()) grow();
      node* n = node::create(h, key, std::move(st));
      bucket_guard g(*this, h);
      n->next = g.head();
      g.head() = n;
      ++size;
    }

    /// Holds `lock`, and no bucket.
    bool erase(std::uint64_t h, std::string_view key) noexcept {
      bucket_guard g(*this, h);
      for (node** link = &g.head(); *link != nullptr; link = &(*link)->next) {
        node* n = *link;
        if (n->hash == static_cast<std::uint32_t>(h) && n->holds(key)) {
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
    /// `seen`). Returns how many were dropped. Holds `lock`, and no bucket.
    std::size_t sweep(const config_type& cfg, timestamp now, std::size_t nodes,
                      std::size_t bucket_budget, std::size_t& seen_total,
                      std::atomic<std::size_t>& total) noexcept {
      std::size_t dropped = 0;
      std::size_t seen = 0;
      const std::size_t nb = bucket_count();
      // Start fetching the first node of the next few chains: taking each
      // bucket's lock would otherwise wait for the previous chain's misses.
      for (std::size_t i = 1; i <= 4 && i <= bucket_budget && i <= nb; ++i) {
        const std::uintptr_t word = at((cursor + i) & (nb - 1)).load(std::memory_order_relaxed);
#if defined(__GNUC__) || defined(__clang__)
        if (word > bucket_locked) __builtin_prefetch(chain(word));
#else
        (void)word;
#endif
      }
      for (std::size_t i = 0; i < bucket_budget && i < nb && seen < nodes; ++i) {
        cursor = (cursor + 1) & (nb - 1);
        dropped += drop_idle(cfg, now, at(cursor), seen);
      }
      seen_total += seen;
      after_drops(dropped, now, total);
      return dropped;
    }

    /// One chunk of a full sweep: examines up to `sweep_chunk_buckets`
    /// buckets in reverse-binary order from `scan` (0 starts a sweep) and
    /// advances it; `scan` is 0 again once every bucket was examined.
    /// Holds `lock`, and no bucket.
    ///
    /// Reverse-binary order (as Redis's SCAN) increments the bucket index
    /// from its top bit down. When the table doubles, bucket b splits into b
    /// and b + old size, both ahead of or both behind the scan; when it
    /// halves, buckets merge likewise. So a sweep spread over many lock holds
    /// still examines every key held throughout (a key may be examined
    /// twice after a shrink, which is harmless).
    std::size_t sweep_chunk(const config_type& cfg, timestamp now, std::uint64_t& scan,
                            std::atomic<std::size_t>& total) noexcept {
      const std::size_t m = mask.load(std::memory_order_relaxed);
      if (m == 0) {
        scan = 0;
        return 0;
      }
      std::size_t dropped = 0;
      std::size_t seen = 0;
      for (std::size_t i = 0; i < sweep_chunk_buckets; ++i) {
        dropped += drop_idle(cfg, now, at(scan & m), seen);
        scan = next_in_scan(scan, m);
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

    /// Drops the idle keys of one bucket, under its lock; counts the keys
    /// looked at in `seen`.
    std::size_t drop_idle(const config_type& cfg, timestamp now, bucket& b,
                          std::size_t& seen) noexcept {
      // Keys are inserted only under the shard's lock, which the caller
      // holds: a bucket seen empty stays empty, and needs no lock.
      const std::uintptr_t word = b.load(std::memory_order_relaxed);
      if (chain(word) == nullptr) return 0;
      node* head = lock_bucket_seen(b, word);
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
      unlock_bucket(b, head);
      return dropped;
    }

    /// Bookkeeping after idle keys were dropped at `now`.
    void after_drops(std::size_t dropped, timestamp now, std::atomic<std::size_t>& total) noexcept {
      if (dropped == 0) return;
      total.fetch_sub(dropped, std::memory_order_relaxed);
      reclaimed_at = std::max(reclaimed_at, now);
      // After a spike, shrink: a table mostly empty would make every pass
      // of the incremental sweep long, and idle keys would linger. The
      // upper segment stays allocated for the next growth.
      const std::size_t nb = bucket_count();
      if (nb > first_segment && size < nb / 8) halve();
    }

    /// Doubles the table (or makes its first segment); on std::bad_alloc
    /// nothing changed. Holds `lock`, and no bucket.
    void grow() {
      const std::size_t nb = bucket_count();
      if (nb == 0) {
        bucket* seg = segments[0].load(std::memory_order_relaxed);
        if (seg == nullptr) {
          seg = new_segment(0);
          segments[0].store(seg, std::memory_order_release);
        }
        mask.store(first_segment - 1, std::memory_order_release);
        return;
      }
      const std::size_t j = locate(nb).index;  // the segment of buckets [nb, 2 nb)
      if (j >= max_segments) return;           // as large as a shard gets
      bucket* upper = segments[j].load(std::memory_order_relaxed);
      if (upper == nullptr) {
        // A segment no table had before: no check can know it, so its
        // buckets start locked instead of being locked one by one.
        upper = new_segment(j);  // may throw: nothing changed yet
        for (std::size_t i = 0; i < nb; ++i)
          upper[i].store(bucket_locked, std::memory_order_relaxed);
        segments[j].store(upper, std::memory_order_release);
      } else {
        // A segment kept from a larger table. A check that read that
        // table's mask may hold one of its buckets for a moment: it then
        // sees another mask, finds nothing there and lets go.
        for (std::size_t i = 0; i < nb; ++i) (void)lock_bucket(upper[i]);
      }
      // Every lower bucket, in a pass of its own: the locked instructions
      // then run back to back, and the split below walks the chains with
      // plain loads whose cache misses overlap (each locked instruction
      // would wait for the previous chain's misses).
      for (std::size_t i = 0; i < nb; ++i) (void)lock_bucket(at(i));
      for (std::size_t i = 0; i < nb; ++i) {
        bucket& low = at(i);
        node* n = chain(low.load(std::memory_order_relaxed));
        node* stay = nullptr;
        node* move = nullptr;
        while (n != nullptr) {
          node* next = n->next;
          node*& to = (n->hash & nb) != 0 ? move : stay;
          n->next = to;
          to = n;
          n = next;
        }
        // Still locked: the bit stays set while the chain is rewritten.
        low.store(reinterpret_cast<std::uintptr_t>(stay) | bucket_locked,
                  std::memory_order_relaxed);
        upper[i].store(reinterpret_cast<std::uintptr_t>(move) | bucket_locked,
                       std::memory_order_relaxed);
      }
      mask.store(2 * nb - 1, std::memory_order_release);
      for (std::size_t i = 0; i < nb; ++i) {
        unlock_bucket(at(i), chain(at(i).load(std::memory_order_relaxed)));
        unlock_bucket(upper[i], chain(upper[i].load(std::memory_order_relaxed)));
      }
      cursor &= 2 * nb - 1;
    }

    /// Halves the table, merging each upper bucket into its lower twin.
    /// Allocates nothing. Holds `lock`, and no bucket.
    void halve() noexcept {
      const std::size_t nb = bucket_count();
      const std::size_t half = nb / 2;
      bucket* upper = segments[locate(half).index].load(std::memory_order_relaxed);
      for (std::size_t i = 0; i < nb; ++i) (void)lock_bucket(at(i));
      for (std::size_t i = 0; i < half; ++i) {
        node* low = chain(at(i).load(std::memory_order_relaxed));
        node* high = chain(upper[i].load(std::memory_order_relaxed));
        while (high != nullptr) {
          node* next = high->next;
          high->next = low;
          low = high;
          high = next;
        }
        at(i).store(reinterpret_cast<std::uintptr_t>(low) | bucket_locked,
                    std::memory_order_relaxed);
        upper[i].store(bucket_locked, std::memory_order_relaxed);
      }
      mask.store(half - 1, std::memory_order_release);
      for (std::size_t i = 0; i < half; ++i) {
        unlock_bucket(at(i), chain(at(i).load(std::memory_order_relaxed)));
        unlock_bucket(upper[i], nullptr);
      }
      cursor &= half - 1;
    }

    /// A segment of empty, unlocked buckets.
    [[nodiscard]] static bucket* new_segment(std::size_t j) {
      return new bucket[segment_size(j)]();
    }
  };

  static_assert(sizeof(void*) != 8 || sizeof(shard) == 256, "a shard header is four cache lines");

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

  /// Refuses a key a node cannot hold, before it is inserted: a node keeps
  /// its key's size in 32 bits, and a longer key, its size cut, would never
  /// match its own node again (every check a new node: no limit, unbounded
  /// memory). Callers pass at most 512 bytes. Tested where a node is made
  /// (node::create) and nowhere else: the same test in `apply`, or in
  /// `apply_new` before the sweep, made GCC inline less of the sliding
  /// log's check, 1.19-1.30x slower in `benchmarks/core/ab/run.sh`.
  [[noreturn, gnu::noinline, gnu::cold]] static void throw_key_too_long(std::size_t size) {
    throw std::length_error("ratelimit: memory_store: a key of " + std::to_string(size) +
                            " bytes (a node holds at most 4294967295)");
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

  /// `apply` on a key already hashed to `h` in shard `sh`. A key the
  /// shard holds is decided under its bucket's lock alone.
  decision apply_in_shard(const config_type& cfg, std::uint64_t h, shard& sh,
                          typename shard::probe start, std::string_view key, timestamp now,
                          units cost, access a) {
    // A bucket seen empty cannot hold the key: a new key goes straight to
    // the shard's lock, where the key is looked for again under its bucket's.
    if (start.at == nullptr || start.seen != 0) [[likely]] {
      const typename shard::bucket_guard g(sh, h, start);
      if (node* n = g.find(h, key)) return step_held(cfg, n->state, now, cost, a);
    }
    return apply_absent(sh, cfg, h, key, now, cost, a);
  }

  /// `apply` on a key its bucket did not hold a moment ago: decided under
  /// the shard's lock, which every insertion and drop holds, so that the
  /// key's absence, the shard's `reclaimed_at` and the key cap cannot change
  /// while the check decides.
  [[gnu::noinline]] decision apply_absent(shard& sh, const config_type& cfg, std::uint64_t h,
                                          std::string_view key, timestamp now, units cost,
                                          access a) {
    {
      std::lock_guard<detail::spin_lock> guard(sh.lock);
      if (auto d = try_apply(sh, cfg, h, key, now, cost, a)) return *d;
    }
    return apply_when_full(sh, cfg, h, key, now, cost, a);
  }

  /// Decides under the shard's lock (holding no bucket's); empty only when
  /// a new key must be recorded and the store is full.
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
    {
      // Another thread may have inserted the key before this one took the
      // shard's lock; none can insert or drop it from now on.
      const typename shard::bucket_guard g(sh, h);
      if (node* n = g.find(h, key)) return step_held(cfg, n->state, now, cost, a);
    }
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
    // A built-in policy's `step` is its `step_as<false>`, which is forced
    // inline: GCC left fixed_window::step out of line, and the call (the
    // decision written to memory and read back) cost 14% of a check in
    // `benchmarks/core/ab/run.sh` (the sliding log 13%, GCRA through the
    // default clock 9%; the others were inlined already). Only those
    // policies: any other, one derived from them included (which inherits
    // their `step_as`), gets its own `step` called.
    if constexpr (detail::step_is_step_as<P>) {
      return P::template step_as<false>(cfg, held, now, cost);
    } else {
      return P::step(cfg, held, now, cost);
    }
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
  std::unique_ptr<std::atomic<std::size_t>> count_;
  std::unique_ptr<std::atomic<std::size_t>> reclaim_cursor_ =
      std::make_unique<std::atomic<std::size_t>>(0);
};

}  // namespace ratelimit
