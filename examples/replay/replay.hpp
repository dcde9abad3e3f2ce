// SPDX-License-Identifier: Apache-2.0
// The replay engine: one policy's decisions on a store, and the summary and sweep across policies.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <exception>
#include <functional>
#include <istream>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define RATELIMIT_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RATELIMIT_REPLAY_ASAN 1
#endif
#endif
#ifndef RATELIMIT_REPLAY_ASAN
#define RATELIMIT_REPLAY_ASAN 0
#endif
#if RATELIMIT_REPLAY_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "budget.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "trace.hpp"

namespace ratelimit::replay {

// ---------------------------------------------------------------------------
// Policies and their configuration

/// The five policies, in the order every table lists them.
enum class policy_id : unsigned char {
  fixed_window,
  sliding_log,
  sliding_counter,
  token_bucket,
  gcra
};
inline constexpr std::size_t policy_count = 5;
inline constexpr policy_id all_policies[policy_count] = {
    policy_id::fixed_window, policy_id::sliding_log, policy_id::sliding_counter,
    policy_id::token_bucket, policy_id::gcra};

[[nodiscard]] constexpr std::string_view policy_name(policy_id p) noexcept {
  switch (p) {
    case policy_id::fixed_window: return "fixed_window";
    case policy_id::sliding_log: return "sliding_log";
    case policy_id::sliding_counter: return "sliding_counter";
    case policy_id::token_bucket: return "token_bucket";
    case policy_id::gcra: return "gcra";
  }
  return "?";
}

/// Parses a policy name exactly as the tool contract spells it.
[[nodiscard]] inline std::optional<policy_id> parse_policy(std::string_view s) noexcept {
  for (const policy_id p : all_policies) {
    if (policy_name(p) == s) return p;
  }
  return std::nullopt;
}

[[nodiscard]] constexpr bool is_window_policy(policy_id p) noexcept {
  return p == policy_id::fixed_window || p == policy_id::sliding_log ||
         p == policy_id::sliding_counter;
}

/// Calls `f.template operator()<P>()` with the policy type named by `id`.
template <class F>
decltype(auto) with_policy(policy_id id, F&& f) {
  switch (id) {
    case policy_id::fixed_window: return f.template operator()<fixed_window>();
    case policy_id::sliding_log: return f.template operator()<sliding_window_log>();
    case policy_id::sliding_counter: return f.template operator()<sliding_window_counter>();
    case policy_id::token_bucket: return f.template operator()<token_bucket>();
    case policy_id::gcra: break;
  }
  return f.template operator()<gcra>();
}

template <class P>
inline constexpr bool is_bucket_v = std::is_same_v<P, token_bucket> || std::is_same_v<P, gcra>;

/// What the user asked for: one rate, a burst for bucket/GCRA, count_rejected for windows.
struct limiter_settings {
  rate r{1, std::chrono::microseconds{1}};
  std::optional<units> burst;   ///< token_bucket and gcra only; unset = the limit
  bool count_rejected = false;  ///< window policies only
};

/// Builds P's configuration; options that do not apply to P are ignored. It is
/// named "replay" (the Redis stores key state by the limiter's name).
/// @throws std::invalid_argument for a bad combination (e.g. a burst over 2^50)
template <class P>
[[nodiscard]] typename P::config make_config(const limiter_settings& s) {
  if constexpr (is_bucket_v<P>) {
    return typename P::config(s.r, bucket_options{s.burst, "replay"});
  } else {
    return typename P::config(s.r, window_options{s.count_rejected, "replay"});
  }
}

/// "--rate L/PERIOD", the flag behind `r`, for messages.
[[nodiscard]] inline std::string rate_flag(const rate& r) {
  return "--rate " + std::to_string(r.limit()) + "/" + format_duration(r.period().count());
}

/// Why P cannot take `s`, starting with the flag at fault, or "" when it can:
/// `--burst B` when the same rate without the burst works, else `rate_cause`
/// (the flag that chose the rate: `--rate ...`, or the swept limit).
template <class P>
[[nodiscard]] std::string config_problem(const limiter_settings& s, const std::string& rate_cause) {
  const auto message = [](const std::invalid_argument& e) {
    std::string m = e.what();
    constexpr std::string_view prefix = "ratelimit: ";
    return m.starts_with(prefix) ? m.substr(prefix.size()) : m;
  };
  try {
    (void)make_config<P>(s);
    return {};
  } catch (const std::invalid_argument& e) {
    if (is_bucket_v<P> && s.burst) {
      limiter_settings plain = s;
      plain.burst.reset();
      try {
        (void)make_config<P>(plain);
        return "--burst " + std::to_string(*s.burst) + ": " + message(e);
      } catch (const std::invalid_argument&) {
        // The rate alone is already at fault.
      }
    }
    return rate_cause + ": " + message(e);
  }
}

// ---------------------------------------------------------------------------
// Decisions mode (the stable machine-readable interface)

inline constexpr std::string_view decisions_header =
    "ts_us,key,cost,allowed,remaining,retry_after_us,reset_after_us\n";

namespace detail {
/// Under AddressSanitizer, marks `bytes` at `p` unreadable (`on`) or readable
/// again: the window rings' pool hands out pieces of larger blocks, inside
/// which ASan alone sees no bounds. No effect in other builds.
inline void asan_poison(const void* p, std::size_t bytes, bool on) noexcept {
#if RATELIMIT_REPLAY_ASAN
  if (on) {
    __asan_poison_memory_region(p, bytes);
  } else {
    __asan_unpoison_memory_region(p, bytes);
  }
#else
  (void)p;
  (void)bytes;
  (void)on;
#endif
}

inline void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// A hint that `p` will be read soon (no effect on results; `p` is never
/// dereferenced). On x86 an asm statement: g++ 12's modref analysis judges a
/// helper whose only effect is `__builtin_prefetch` free of side effects and
/// deletes calls to it, which silently dropped the hints for key bytes and
/// ring entries below.
inline void prefetch(const void* p) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 (%0)" : : "r"(p));
#elif defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}
}  // namespace detail

/// Appends one decisions row for `e`.
inline void append_decision(std::string& out, const event& e, const decision& d) {
  detail::append_int(out, e.ts_us);
  out += ',';
  append_csv_field(out, e.key);
  out += ',';
  detail::append_int(out, e.cost);
  out += d.allowed ? ",1," : ",0,";
  detail::append_int(out, d.remaining);
  out += ',';
  detail::append_int(out, d.retry_after == never ? -1 : d.retry_after.count());
  out += ',';
  detail::append_int(out, d.reset_after.count());
  out += '\n';
}

/// Replays every event of `in` through `store` with policy P and appends one
/// row per event to `out`; when `sink` is given, `out` is written to it and
/// cleared whenever it passes `flush_bytes`. Store is any `store_for<P>`: the
/// in-process `memory_store<P>` or a Redis store with caller-supplied time.
/// @return the number of events replayed
/// @throws input_error for a bad line (unless the reader skips them), and
///         whatever the store throws (ratelimit::store_error)
template <class P, class Store>
  requires store_for<Store, P>
std::size_t replay_decisions(trace_reader& in, const typename P::config& cfg, Store& store,
                             std::string& out, std::ostream* sink = nullptr,
                             std::size_t flush_bytes = std::size_t{1} << 16) {
  event e;
  std::size_t n = 0;
  while (in.next(e)) {
    const decision d = store.apply(cfg, e.key, timestamp{e.ts_us}, e.cost, access::consume);
    append_decision(out, e, d);
    ++n;
    if (sink != nullptr && out.size() >= flush_bytes) {
      sink->write(out.data(), static_cast<std::streamsize>(out.size()));
      out.clear();
    }
  }
  return n;
}

/// Reads the whole trace once, validating every line (the first pass that
/// lets decisions mode refuse a bad file before writing anything); `max_us`
/// and `why` as in `trace_reader::limit_timestamps`.
/// @throws input_error for the first bad line
inline std::size_t validate_trace(std::istream& in, std::int64_t max_us = max_timestamp_us,
                                  const std::string& why = {}) {
  trace_reader reader(in);
  reader.limit_timestamps(max_us, why);
  event e;
  std::size_t n = 0;
  while (reader.next(e)) ++n;
  return n;
}

// ---------------------------------------------------------------------------
// Summary and sweep

/// A fast 64-bit hash of a key (8 bytes at a time, multiply-xorshift mixing).
/// Not a cryptographic hash: the table below only needs a good spread.
[[nodiscard]] inline std::uint64_t hash_key(std::string_view s) noexcept {
  constexpr std::uint64_t k1 = 0x9e3779b97f4a7c15u;
  constexpr std::uint64_t k2 = 0xbf58476d1ce4e5b9u;
  std::uint64_t h = k1 ^ (s.size() * k2);
  const char* p = s.data();
  std::size_t n = s.size();
  while (n >= 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * k2;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  if (n != 0) {
    std::uint64_t w = 0;
    for (std::size_t i = 0; i < n; ++i) {
      w |= std::uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
    }
    h = (h ^ w) * k2;
    h ^= h >> 31;
  }
  h *= k1;
  return h ^ (h >> 29);
}

/// Interns keys into dense ids 0, 1, 2, ... in order of first appearance.
/// Memory per key: its bytes, 8 bytes of end offset, and 8-byte open-addressing
/// slots at a load factor between 3/8 and 3/4 (11 to 21 bytes), all in
/// geometrically grown arrays.
class key_table {
 public:
  key_table() { slots_.assign(1024, 0); }

  /// The id of `key`, adding it if new (`fresh` says which).
  std::uint32_t intern(std::string_view key, bool& fresh) {
    return intern(key, hash_key(key), fresh);
  }
  /// The same, with `h == hash_key(key)` already computed.
  std::uint32_t intern(std::string_view key, std::uint64_t h, bool& fresh) {
    const std::uint64_t tag = h & ~std::uint64_t{0xffffffff};
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(h >> 7) & mask;; i = (i + 1) & mask) {
      const std::uint64_t s = slots_[i];
      if (s == 0) {
        const auto id = static_cast<std::uint32_t>(ends_.size() - 1);
        bytes_.append(key);
        ends_.push_back(bytes_.size());
        slots_[i] = tag | (std::uint64_t{id} + 1);
        fresh = true;
        if (4 * size() > 3 * slots_.size()) grow();
        return id;
      }
      if ((s & ~std::uint64_t{0xffffffff}) == tag) {
        const auto id = static_cast<std::uint32_t>((s & 0xffffffff) - 1);
        if (get(id) == key) {
          fresh = false;
          return id;
        }
      }
    }
  }
  /// A hint that the key hashed `h` is about to be interned. Stage 0 fetches
  /// its home slot, stage 1 (later) its end offset, stage 2 its bytes; each
  /// stage reads only what the previous one fetched. No effect on results.
  void prefetch(std::uint64_t h, int stage) const noexcept {
    const std::uint64_t* slot = slots_.data() +
                                (static_cast<std::size_t>(h >> 7) & (slots_.size() - 1));
    if (stage == 0) {
      detail::prefetch(slot);
      return;
    }
    const std::uint64_t s = *slot;
    if (s == 0 || (s & ~std::uint64_t{0xffffffff}) != (h & ~std::uint64_t{0xffffffff})) return;
    const std::size_t id = static_cast<std::size_t>(s & 0xffffffff) - 1;
    if (stage == 1) {
      detail::prefetch(ends_.data() + id);
    } else {
      detail::prefetch(bytes_.data() + ends_[id]);
    }
  }
  [[nodiscard]] std::string_view get(std::uint32_t id) const noexcept {
    return std::string_view(bytes_).substr(ends_[id], ends_[id + 1] - ends_[id]);
  }
  [[nodiscard]] std::size_t size() const noexcept { return ends_.size() - 1; }
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return bytes_.capacity() + ends_.capacity() * sizeof(std::size_t) +
           slots_.capacity() * sizeof(std::uint64_t);
  }

 private:
  void grow() {
    std::vector<std::uint64_t> next(slots_.size() * 2, 0);
    const std::size_t mask = next.size() - 1;
    for (const std::uint64_t s : slots_) {
      if (s == 0) continue;
      const auto id = static_cast<std::uint32_t>((s & 0xffffffff) - 1);
      std::size_t i = static_cast<std::size_t>(hash_key(get(id)) >> 7) & mask;
      while (next[i] != 0) i = (i + 1) & mask;
      next[i] = s;
    }
    slots_.swap(next);
  }

  std::string bytes_;
  std::vector<std::size_t> ends_{0};
  std::vector<std::uint64_t> slots_;
};

/// Number of summary policies a window ring counts admitted calls for.
inline constexpr std::size_t ring_policies = policy_count;

/// Rings of each key's recent calls, to find the most calls in any window
/// (t - W, t]: all attempts (each key's peak) and, per summary policy, the
/// calls it admitted (the largest over all keys). One ring per key that called
/// in the last window, shared by the six counts: an entry is a call's time and
/// a bit per policy that admitted it, and the ring keeps a running count per
/// policy. A call stamped earlier than its key's newest call counts at that
/// newest time (time never runs backwards inside a key). Rings whose newest
/// entry has left the window go back to a free list (`release_stale`), so
/// memory follows the calls inside one window, not the trace. Handles are
/// 1-based; 0 = no ring.
class window_rings {
 public:
  /// Adds a call of key `owner` at `t`, admitted by the summary policies in
  /// `admitted` (bit p = policy p); raises `max_admitted[p]` to the calls policy
  /// p admitted in (t - W, t] and returns the attempts in (t - W, t].
  std::uint32_t add(std::uint32_t& handle, std::uint32_t owner, std::int64_t t,
                    std::uint32_t admitted, std::int64_t w,
                    std::uint32_t (&max_admitted)[ring_policies]) {
    if (handle == 0) handle = acquire(owner);
    ring& r = rings_[handle - 1];
    if (r.size != 0) {
      if (t < r.newest) t = r.newest;
      const std::int64_t cut = t - w;
      while (r.size != 0 && r.buf[r.head].ts <= cut) {
        const std::uint32_t m = r.buf[r.head].admitted;
        for (std::size_t p = 0; p < ring_policies; ++p) r.count[p] -= (m >> p) & 1u;
        r.head = (r.head + 1) & (r.capacity() - 1);
        --r.size;
      }
    }
    if (r.size == r.capacity()) entry_bytes_ += grow(r) * sizeof(entry);
    r.buf[(r.head + r.size) & (r.capacity() - 1)] = entry{t, admitted};
    ++r.size;
    r.newest = t;
    if (t < oldest_newest_) oldest_newest_ = t;
    for (std::size_t p = 0; p < ring_policies; ++p) {
      r.count[p] += (admitted >> p) & 1u;
      if (r.count[p] > max_admitted[p]) max_admitted[p] = r.count[p];
    }
    return r.size;
  }

  /// A hint that the ring `handle` will be used soon.
  void prefetch(std::uint32_t handle) const noexcept {
    if (handle != 0) detail::prefetch(rings_.data() + (handle - 1));
  }

  /// A hint that the entries of ring `handle` will be used soon (after `prefetch`).
  void prefetch_entries(std::uint32_t handle) const noexcept {
    if (handle != 0) {
      const ring& r = rings_[handle - 1];
      if (r.cap != 0) detail::prefetch(r.buf + r.head);
    }
  }

  /// Frees every ring whose newest call has left the window at `now`, and
  /// clears its owner's handle in `handles` (indexed by owner). The rings are
  /// scanned only when one can be stale: `oldest_newest_` is at most the
  /// newest call of every ring in use (a ring's newest call only moves
  /// forward), so while it is after `now - w` no ring is stale. On a log
  /// where every key calls within each window that skips nearly every scan.
  template <class Handle>
  void release_stale(std::vector<Handle>& handles, std::int64_t now, std::int64_t w) {
    if (oldest_newest_ > now - w) return;
    std::int64_t oldest = no_call;
    for (std::size_t i = 0; i < rings_.size(); ++i) {
      ring& r = rings_[i];
      if (r.owner == no_owner) continue;
      if (r.size != 0 && r.newest > now - w) {
        oldest = std::min(oldest, r.newest);
        continue;
      }
      handles[r.owner].ring = 0;
      r.owner = no_owner;
      r.size = 0;
      r.head = 0;
      r.count = {};
      free_.push_back(static_cast<std::uint32_t>(i + 1));
    }
    oldest_newest_ = oldest;
  }
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return rings_.capacity() * sizeof(ring) + free_.capacity() * sizeof(std::uint32_t) +
           entry_bytes_;
  }
  /// Bytes of ring buffers allocated and not yet freed (in use or kept for
  /// reuse); `memory_bytes` counts only the buffers rings hold.
  [[nodiscard]] std::size_t pool_bytes() const noexcept { return pool_.bytes(); }

 private:
  static constexpr std::uint32_t no_owner = 0xffffffff;
  static constexpr std::int64_t no_call = INT64_MAX;
  struct entry {
    std::int64_t ts;
    std::uint32_t admitted;
  };
  struct ring {
    // 56 bytes: the buffer is a bare array with a 32-bit capacity, so the
    // newest time fits beside it at the size the tool's figures assume.
    entry* buf = nullptr;     ///< `cap` entries owned by the pool, or none
    std::int64_t newest = 0;  ///< time of the newest entry (valid when size != 0)
    std::uint32_t head = 0;
    std::uint32_t size = 0;
    std::uint32_t owner = no_owner;
    std::uint32_t cap = 0;
    std::array<std::uint32_t, ring_policies> count{};
    [[nodiscard]] std::uint32_t capacity() const noexcept { return cap; }
  };

  /// Ring buffers of 2^k entries, carved from blocks of 64 KiB and recycled
  /// per size: a ring that grows hands its old buffer back for the next ring
  /// of that size. A buffer larger than a block is allocated alone and freed
  /// when its ring outgrows it. On a dense log every key's ring grows twice;
  /// this makes that a few hundred allocations instead of two per key.
  class buffer_pool {
   public:
    /// A buffer of `n` entries (a power of two).
    entry* take(std::uint32_t n) {
      if (n > block_entries) {
        auto buf = std::make_unique<entry[]>(n);
        entry* p = buf.get();
        large_.emplace(p, std::move(buf));
        bytes_ += std::size_t{n} * sizeof(entry);
        return p;
      }
      std::vector<entry*>& spare = spare_[static_cast<std::size_t>(std::countr_zero(n))];
      if (!spare.empty()) {
        entry* p = spare.back();
        spare.pop_back();
        detail::asan_poison(p, std::size_t{n} * sizeof(entry), false);
        return p;
      }
      if (left_ < n) {
        next_ = blocks_.emplace_back(std::make_unique<entry[]>(block_entries)).get();
        bytes_ += std::size_t{block_entries} * sizeof(entry);
        left_ = block_entries;
        detail::asan_poison(next_, std::size_t{block_entries} * sizeof(entry), true);
      }
      entry* p = next_;
      next_ += n;
      left_ -= n;
      detail::asan_poison(p, std::size_t{n} * sizeof(entry), false);
      return p;
    }
    /// Takes back a buffer of `n` entries from `take`. One larger than a
    /// block is freed: kept, it would hold the memory of a burst that is
    /// over (a ring grown to 2^k entries would leave about 2^k more behind).
    void give(entry* p, std::uint32_t n) {
      if (n > block_entries) {
        large_.erase(p);
        bytes_ -= std::size_t{n} * sizeof(entry);
        return;
      }
      spare_[static_cast<std::size_t>(std::countr_zero(n))].push_back(p);
      detail::asan_poison(p, std::size_t{n} * sizeof(entry), true);
    }
    /// Bytes allocated and not yet freed.
    [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

    buffer_pool() = default;
    buffer_pool(const buffer_pool&) = delete;
    buffer_pool& operator=(const buffer_pool&) = delete;
    ~buffer_pool() {
      for (const auto& b : blocks_) {
        detail::asan_poison(b.get(), std::size_t{block_entries} * sizeof(entry), false);
      }
    }

   private:
    static constexpr std::uint32_t block_entries = 4096;
    std::array<std::vector<entry*>, 32> spare_;  ///< by log2 size, up to a block
    std::vector<std::unique_ptr<entry[]>> blocks_;
    /// Buffers larger than a block, each in use by a ring.
    std::unordered_map<entry*, std::unique_ptr<entry[]>> large_;
    entry* next_ = nullptr;
    std::uint32_t left_ = 0;
    std::size_t bytes_ = 0;
  };

  /// Doubles the buffer of `r` (4 entries at first); returns the entries added.
  std::size_t grow(ring& r) {
    if (r.cap > 0x7fffffffu) throw std::length_error("a window ring cannot hold 2^32 calls");
    const std::uint32_t next_cap = r.cap == 0 ? 4 : r.cap * 2;
    entry* next = pool_.take(next_cap);
    for (std::uint32_t i = 0; i < r.size; ++i) next[i] = r.buf[(r.head + i) & (r.cap - 1)];
    entry* old = std::exchange(r.buf, next);
    const std::uint32_t old_cap = std::exchange(r.cap, next_cap);
    r.head = 0;
    if (old != nullptr) pool_.give(old, old_cap);
    return next_cap - old_cap;
  }
  std::uint32_t acquire(std::uint32_t owner) {
    std::uint32_t h = 0;
    if (!free_.empty()) {
      h = free_.back();
      free_.pop_back();
    } else {
      rings_.emplace_back();
      h = static_cast<std::uint32_t>(rings_.size());
    }
    rings_[h - 1].owner = owner;
    return h;
  }
  buffer_pool pool_;  // before rings_, whose buffers it owns
  std::vector<ring> rings_;
  std::vector<std::uint32_t> free_;
  std::int64_t oldest_newest_ = no_call;  ///< at most the newest call of any ring in use
  std::size_t entry_bytes_ = 0;           ///< capacity of every ring's buffer, in bytes
};

/// What the tool remembers per key besides the policies' states: 12 bytes.
struct key_info {
  std::uint32_t raw_peak = 0;  ///< most calls (attempts) in any window
  std::uint32_t ring = 0;      ///< window_rings handle, 0 = none
  signed char label = -1;      ///< 1 if any event of the key is labelled 1, else 0 if labelled
  std::uint8_t blocked = 0;    ///< bit p: summary policy p rejected the key at least once
};

/// One policy's figures in the summary.
struct policy_summary {
  policy_id id = policy_id::fixed_window;
  /// Why the policy could not take the settings (e.g. gcra above 1 call per
  /// us), naming the flag at fault; empty when it ran. The figures are then 0.
  std::string unavailable;
  units limit = 0;                   ///< the limit (burst for bucket/GCRA)
  std::uint64_t admitted = 0;        ///< calls admitted
  std::uint64_t rejected = 0;        ///< calls rejected
  std::size_t keys_blocked = 0;      ///< keys rejected at least once
  std::uint32_t max_in_window = 0;   ///< most calls one key got through in any (t - W, t]
  double state_bytes_per_key = 0;    ///< policy state per key held at the end (mean)
  std::size_t state_peak_bytes = 0;  ///< state of the non-idle keys at the sampled peak
  double seconds = 0;                ///< CPU time of this policy's own work (steps, state sampling)
};

/// One (policy, limit) point of the sweep.
struct sweep_point {
  policy_id id = policy_id::fixed_window;
  units limit = 0;
  std::string unavailable;         ///< as in policy_summary: why this point could not run
  std::uint64_t rejected = 0;      ///< calls rejected
  std::size_t keys_blocked = 0;    ///< keys rejected at least once
  std::size_t abusive_caught = 0;  ///< keys labelled 1 rejected at least once
  std::size_t normal_blocked = 0;  ///< keys labelled 0 rejected at least once (false rejects)
};

/// Everything the summary and sweep print.
struct analysis_result {
  std::uint64_t events = 0;
  std::size_t keys = 0;
  std::size_t abusive_keys = 0;  ///< keys labelled 1
  std::size_t normal_keys = 0;   ///< keys labelled 0 only
  bool labelled = false;         ///< any event carried a label
  std::int64_t first_ts = 0;
  std::int64_t last_ts = 0;
  std::size_t skipped = 0;
  std::string first_skipped;
  /// CPU time shared by every policy: reading, parsing, interning, labels,
  /// the window rings ("max in W" and per-key peaks) and the tool's sampling.
  double shared_seconds = 0;
  double total_seconds = 0;  ///< CPU time of the whole pass (shared + every policy)
  std::vector<policy_summary> policies;
  std::vector<sweep_point> sweep;
  /// Per key: most calls in any window and the key's label (-1, 0, 1).
  std::vector<std::pair<std::uint32_t, signed char>> key_peaks;
  /// Peak bytes of the tool's own bookkeeping (key bytes and index, key_info,
  /// window rings, sweep bits), sampled with the policies' state.
  std::size_t tool_bytes = 0;
  std::int64_t window_us = 0;
};

/// What to analyse.
struct analysis_options {
  limiter_settings settings;
  bool summary = true;  ///< the five policies at the given rate
  /// The summary's policies (`--policy P` alone: only P is run and printed);
  /// every policy by default. Order does not matter: rows follow `all_policies`.
  std::vector<policy_id> summary_policies{std::begin(all_policies), std::end(all_policies)};
  std::vector<units> sweep_limits;  ///< empty = no sweep
  std::vector<policy_id> sweep_policies;
  bool skip_bad_lines = false;
  std::size_t sample_every = std::size_t{1} << 16;  ///< events between memory samples
  /// Bytes the per-key state may reach before the run is refused; 0 = default_memory_budget().
  std::size_t memory_budget = 0;
};

namespace detail {

/// A batch of parsed events: keys interned, so the policies never see text.
struct batch {
  std::vector<std::int64_t> ts;
  std::vector<std::uint32_t> id;
  std::vector<units> cost;
  /// Bit p: summary policy p admitted the event. One array per thread that
  /// runs lanes (each writes only its own), OR-ed by the window rings.
  std::array<std::vector<std::uint8_t>, 2> admitted;
  std::vector<signed char> label;
  std::string key_bytes;               ///< the batch's keys, back to back
  std::vector<std::uint32_t> key_end;  ///< end of each key in key_bytes
  std::vector<std::uint64_t> hash;     ///< hash_key of each key
  // Taken when the batch is read, so that the stages that run later (or on
  // the other thread) see the figures as of this batch.
  std::size_t keys = 0;           ///< keys interned up to and including this batch
  std::size_t key_bytes_mem = 0;  ///< key table and key_info capacity bytes then
  std::int64_t now = 0;           ///< latest event time up to and including this batch
  bool sample = false;            ///< memory is sampled after this batch
  /// Per lane group: the sweep lanes' blocked bits capacity after `resize(keys)`.
  std::array<std::size_t, 2> sweep_bits{};
  void clear() {
    ts.clear();
    id.clear();
    cost.clear();
    label.clear();
    key_bytes.clear();
    key_end.clear();
    hash.clear();
  }
};

/// How many events ahead the per-key loops fetch the state they will need.
inline constexpr std::size_t prefetch_distance = 16;

template <class P>
[[nodiscard]] std::size_t state_bytes(const typename P::state& s) noexcept {
  if constexpr (std::is_same_v<P, sliding_window_log>) {
    return sizeof(s) + s.capacity() * sizeof(sliding_window_log::entry);
  } else {
    return sizeof(s);
  }
}

/// A hint that the entries `s` keeps outside itself (the sliding log's heap
/// ring, oldest and newest entry) will be read soon; call it once `s` itself
/// has been fetched. No effect on results.
template <class P>
void prefetch_heap(const typename P::state& s) noexcept {
  if constexpr (std::is_same_v<P, sliding_window_log>) {
    if (!s.empty()) {
      prefetch(&s.front());
      prefetch(&s.back());
    }
  } else {
    (void)s;
  }
}

/// One policy at one configuration over every key, its states in a dense
/// vector indexed by key id (the policy's own `P::step`, no store).
class lane {
 public:
  virtual ~lane() = default;
  /// Decides every event of `b`; a summary lane sets its bit in `admitted`
  /// (one byte per event), a sweep lane records the keys it rejected.
  virtual void run(const batch& b, std::uint8_t* admitted) = 0;
  virtual void resize(std::size_t keys) = 0;
  /// Bytes of state of the keys not idle at `now`.
  [[nodiscard]] virtual std::size_t live_bytes(std::int64_t now) const = 0;
  [[nodiscard]] virtual std::size_t total_bytes() const = 0;
  [[nodiscard]] virtual units limit() const = 0;
  /// sizeof one key's state (what `resize` adds per key).
  [[nodiscard]] virtual std::size_t state_size() const noexcept = 0;
  /// Bytes of the state vector (and blocked bits) once `resize(keys)` has run.
  [[nodiscard]] virtual std::size_t bytes_after_resize(std::size_t keys) const noexcept = 0;
  /// Heap bytes the states hold beyond `state_size()` each (the sliding log's
  /// rings), kept current by `run` at no extra pass over the keys.
  [[nodiscard]] std::size_t heap_bytes() const noexcept { return heap_bytes_; }
  policy_id id = policy_id::fixed_window;
  int summary_slot = -1;        ///< bit in batch::admitted for summary lanes, -1 for sweep lanes
  std::size_t sweep_index = 0;  ///< sweep lanes: index into analysis_result::sweep
  std::uint64_t admitted = 0;
  std::uint64_t rejected = 0;
  std::vector<std::uint64_t> blocked;  ///< sweep lanes: bit per key, set when rejected
  double seconds = 0;
  std::size_t peak_bytes = 0;
  [[nodiscard]] bool was_blocked(std::size_t k) const noexcept {
    return ((blocked[k / 64] >> (k % 64)) & 1u) != 0;
  }

 protected:
  std::size_t heap_bytes_ = 0;
};

/// Decides one event on `s`, keeping `heap` equal to the heap bytes of all states.
template <class P>
decision tracked_step(const typename P::config& cfg, typename P::state& s, timestamp t, units cost,
                      std::size_t& heap) noexcept {
  if constexpr (std::is_same_v<P, sliding_window_log>) {
    const std::size_t before = s.heap_bytes();
    const decision d = P::step(cfg, s, t, cost);
    heap = heap + s.heap_bytes() - before;
    return d;
  } else {
    (void)heap;
    return P::step(cfg, s, t, cost);
  }
}

template <class P>
class policy_lane final : public lane {
 public:
  explicit policy_lane(typename P::config cfg) : cfg_(std::move(cfg)) {}

  void run(const batch& b, std::uint8_t* admitted_bits) override {
    const std::size_t n = b.ts.size();
    const std::int64_t* ts = b.ts.data();
    const std::uint32_t* id = b.id.data();
    const units* cost = b.cost.data();
    typename P::state* states = states_.data();
    std::uint64_t ok = 0;
    if (summary_slot >= 0) {
      std::uint8_t* mask = admitted_bits;
      const int bit = summary_slot;
      for (std::size_t i = 0; i < n; ++i) {
        // Keys are in trace order, so states are touched at random: fetch
        // ahead, and, once a state is in, what it points to.
        if (i + prefetch_distance < n) prefetch(states + id[i + prefetch_distance]);
        if (i + prefetch_distance / 2 < n) prefetch_heap<P>(states[id[i + prefetch_distance / 2]]);
        const bool allowed =
            tracked_step<P>(cfg_, states[id[i]], timestamp{ts[i]}, cost[i], heap_bytes_).allowed;
        ok += allowed ? 1u : 0u;
        mask[i] = static_cast<std::uint8_t>(mask[i] | (static_cast<unsigned>(allowed) << bit));
      }
    } else {
      std::uint64_t* bits = blocked.data();
      for (std::size_t i = 0; i < n; ++i) {
        if (i + prefetch_distance < n) prefetch(states + id[i + prefetch_distance]);
        if (i + prefetch_distance / 2 < n) prefetch_heap<P>(states[id[i + prefetch_distance / 2]]);
        const std::uint32_t k = id[i];
        if (tracked_step<P>(cfg_, states[k], timestamp{ts[i]}, cost[i], heap_bytes_).allowed) {
          ++ok;
        } else {
          bits[k / 64] |= std::uint64_t{1} << (k % 64);
        }
      }
    }
    admitted += ok;
    rejected += n - ok;
  }
  void resize(std::size_t keys) override {
    if (states_.size() < keys) {
      // Grow geometrically (resize alone may allocate exactly) and account the capacity.
      if (states_.capacity() < keys) states_.reserve(std::max(keys, 2 * states_.capacity()));
      states_.resize(keys);
    }
    if (summary_slot < 0) blocked.resize((keys + 63) / 64, 0);
  }
  [[nodiscard]] std::size_t live_bytes(std::int64_t now) const override {
    std::size_t bytes = 0;
    const std::size_t n = states_.size();
    for (std::size_t i = 0; i < n; ++i) {
      // A sequential pass spends less per state than a step: fetch further ahead.
      if (i + 4 * prefetch_distance < n) prefetch_heap<P>(states_[i + 4 * prefetch_distance]);
      if (!P::idle(cfg_, states_[i], timestamp{now})) bytes += state_bytes<P>(states_[i]);
    }
    return bytes;
  }
  [[nodiscard]] std::size_t total_bytes() const override {
    std::size_t bytes = 0;
    for (const auto& s : states_) bytes += state_bytes<P>(s);
    return bytes;
  }
  [[nodiscard]] units limit() const override { return cfg_.limit(); }
  [[nodiscard]] std::size_t state_size() const noexcept override {
    return sizeof(typename P::state);
  }
  [[nodiscard]] std::size_t bytes_after_resize(std::size_t keys) const noexcept override {
    std::size_t cap = states_.capacity();
    if (cap < keys) cap = std::max(keys, 2 * cap);
    return cap * sizeof(typename P::state) +
           (summary_slot < 0 ? (keys + 63) / 64 * sizeof(std::uint64_t) : 0);
  }

 private:
  typename P::config cfg_;
  std::vector<typename P::state> states_;
};

[[nodiscard]] inline std::unique_ptr<lane> make_lane(policy_id id, const limiter_settings& s) {
  return with_policy(id, [&]<class P>() -> std::unique_ptr<lane> {
    auto l = std::make_unique<policy_lane<P>>(make_config<P>(s));
    l->id = id;
    return l;
  });
}

[[nodiscard]] inline double cpu_seconds() noexcept {
  // The process's own CPU time (every thread): what the cores spend, not wall time.
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

/// The calling thread's CPU time where the platform has one (POSIX), else the process's.
[[nodiscard]] inline double thread_cpu_seconds() noexcept {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
#endif
  return cpu_seconds();
}

/// Relative cost of one lane's step per event, to split the lanes between
/// the two threads (measured on a dense log; only the balance depends on it).
[[nodiscard]] constexpr double lane_weight(policy_id p) noexcept {
  switch (p) {
    case policy_id::sliding_log: return 6;
    case policy_id::sliding_counter: return 1.5;
    case policy_id::fixed_window: return 1;
    case policy_id::token_bucket: return 1;
    case policy_id::gcra: break;
  }
  return 0.6;
}

/// The work of the reading stage (reading, parsing, interning; the reading
/// thread) and of the window rings (the worker thread), in the units of
/// `lane_weight` (measured with perf on the dense log).
inline constexpr double read_weight = 5;
inline constexpr double ring_weight = 3;

/// The capacity a vector grown one `emplace_back` at a time from empty has at
/// `n` elements (it doubles: 1, 2, 4, ...); `key_info` is grown to it in
/// steps so that its memory figures match the engine that grew it per key.
[[nodiscard]] constexpr std::size_t doubled_capacity(std::size_t n) noexcept {
  std::size_t cap = 0;
  while (cap < n) cap = cap == 0 ? 1 : 2 * cap;
  return cap;
}

/// One worker thread that runs a job at a time, handed over by `start` and
/// awaited by `wait`, for the whole pass (a thread per batch would cost a
/// thread start and fresh stack and heap pages every 4,096 events).
class worker_thread {
 public:
  /// @throws std::system_error when no thread can be started
  worker_thread() : thread_([this] { loop(); }) {}
  worker_thread(const worker_thread&) = delete;
  worker_thread& operator=(const worker_thread&) = delete;
  ~worker_thread() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  /// Runs `job` on the worker; the previous job must have been awaited.
  void start(std::function<void()> job) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
      busy_ = true;
    }
    wake_.notify_all();
  }
  /// Waits for the job started last; rethrows what it threw.
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || busy_; });
      if (busy_) {
        std::function<void()> job = std::move(job_);
        lock.unlock();
        std::exception_ptr error;
        try {
          job();
        } catch (...) {
          error = std::current_exception();
        }
        lock.lock();
        error_ = error;
        busy_ = false;
        done_.notify_all();
        continue;
      }
      return;  // stop_ and nothing left to run
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::function<void()> job_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

/// Runs one group of lanes over `b`: grows their states to the batch's keys,
/// decides every event, and samples the summary lanes' state when the batch
/// says so. Charges each lane the calling thread's CPU time.
inline void run_lanes(const std::vector<lane*>& group, batch& b, std::size_t slot) {
  double clock = thread_cpu_seconds();
  std::size_t sweep_bits = 0;
  for (lane* l : group) {
    l->resize(b.keys);
    sweep_bits += l->blocked.capacity() * sizeof(std::uint64_t);
    l->run(b, b.admitted[slot].data());
    if (b.sample && l->summary_slot >= 0) {
      l->peak_bytes = std::max(l->peak_bytes, l->live_bytes(b.now));
    }
    const double t = thread_cpu_seconds();
    l->seconds += t - clock;
    clock = t;
  }
  b.sweep_bits[slot] = sweep_bits;
}

}  // namespace detail

/// Reads the trace once and runs the five policies (summary) and every sweep
/// configuration side by side, in batches of 4,096 events. Each key is
/// interned once into a dense id; every policy keeps its states in a vector
/// indexed by that id. Memory: per key, the policies' states, `key_info` and
/// the key's bytes and index; window rings hold only the calls inside one
/// window. Nothing grows with the number of events.
///
/// CPU time (std::clock, the process's own) is split into `shared_seconds`
/// (reading, parsing, interning, labels, the window rings of every count, the
/// tool's memory sampling) and each policy's own `seconds` (its steps, its
/// state vector, its memory sampling); `total_seconds` is the whole pass.
///
/// A policy or sweep point that cannot take its settings (gcra above 1 call
/// per us, a burst too large for exact ticks) does not stop the run: it is
/// reported with `unavailable` set. Per-key memory (state vectors, sweep bits,
/// the sliding logs' rings, key index) is checked against
/// `opt.memory_budget` after every batch is interned and before the states
/// grow.
/// @throws input_error for a bad line (unless skipping), memory_budget_error
///         when the per-key state would pass the budget (naming --sweep when
///         the sweep is what multiplies it)
[[nodiscard]] inline analysis_result analyse(std::istream& in, const analysis_options& opt) {
  const double start = detail::cpu_seconds();
  analysis_result res;
  const std::int64_t w = opt.settings.r.period().count();
  res.window_us = w;

  std::vector<std::unique_ptr<detail::lane>> lanes;
  std::uint8_t summary_mask = 0;  ///< bits of the summary policies that run
  if (opt.summary) {
    for (const policy_id p : all_policies) {
      if (std::find(opt.summary_policies.begin(), opt.summary_policies.end(), p) ==
          opt.summary_policies.end()) {
        continue;
      }
      policy_summary ps;
      ps.id = p;
      ps.unavailable = with_policy(
          p, [&]<class P>() { return config_problem<P>(opt.settings, rate_flag(opt.settings.r)); });
      if (ps.unavailable.empty()) {
        auto l = detail::make_lane(p, opt.settings);
        l->summary_slot = static_cast<int>(p);
        summary_mask = static_cast<std::uint8_t>(summary_mask | (1u << static_cast<unsigned>(p)));
        lanes.push_back(std::move(l));
      }
      res.policies.push_back(std::move(ps));
    }
  }
  std::size_t sweep_lanes = 0;
  for (const policy_id p : opt.sweep_policies) {
    for (const units limit : opt.sweep_limits) {
      limiter_settings s = opt.settings;
      s.r = rate(limit, opt.settings.r.period());
      s.burst.reset();  // each swept limit is also its own burst
      sweep_point sp;
      sp.id = p;
      sp.limit = limit;
      sp.unavailable = with_policy(p, [&]<class P>() {
        return config_problem<P>(s, "--sweep limit " + std::to_string(limit));
      });
      if (sp.unavailable.empty()) {
        auto l = detail::make_lane(p, s);
        l->sweep_index = res.sweep.size();
        lanes.push_back(std::move(l));
        ++sweep_lanes;
      }
      res.sweep.push_back(std::move(sp));
    }
  }
  const std::size_t budget = opt.memory_budget != 0 ? opt.memory_budget : default_memory_budget();
  std::size_t state_per_key = 0;
  for (const auto& l : lanes) state_per_key += l->state_size();

  trace_reader reader(in, opt.skip_bad_lines);
  key_table keys;
  std::vector<key_info> info;
  window_rings rings;
  std::uint32_t max_admitted[ring_policies] = {};
  constexpr std::size_t batch_size = 4096;
  // Three buffers: while batch k is decided, the rings count batch k - 1 and
  // batch k + 1 is read into the third.
  std::array<detail::batch, 3> batches;
  for (detail::batch& b : batches) {
    b.ts.reserve(batch_size);
    b.id.reserve(batch_size);
    b.cost.reserve(batch_size);
    for (auto& a : b.admitted) a.assign(batch_size, 0);
  }
  std::int64_t now = 0;
  std::size_t since_sample = 0;
  bool more = true;
  // Two lane groups: group 0 runs on this thread beside the reading stage,
  // group 1 on a worker thread. The heaviest lanes go first to the lighter
  // side; the window rings go to the side that makes the heavier one lighter
  // (the worker on a tie: the sliding log alone is better beside them).
  std::array<std::vector<detail::lane*>, 2> groups;
  bool rings_on_worker = true;
  {
    std::vector<detail::lane*> order;
    for (const auto& l : lanes) order.push_back(l.get());
    std::stable_sort(order.begin(), order.end(), [](const detail::lane* x, const detail::lane* y) {
      return detail::lane_weight(x->id) > detail::lane_weight(y->id);
    });
    double best = 0;
    for (const bool on_worker : {true, false}) {
      std::array<std::vector<detail::lane*>, 2> split;
      double load[2] = {detail::read_weight, 0};
      load[on_worker ? 1 : 0] += detail::ring_weight;
      for (detail::lane* l : order) {
        const std::size_t g = load[1] < load[0] ? 1 : 0;
        split[g].push_back(l);
        load[g] += detail::lane_weight(l->id);
      }
      const double heavier = std::max(load[0], load[1]);
      if (on_worker || heavier < best) {
        groups = std::move(split);
        rings_on_worker = on_worker;
        best = heavier;
      }
    }
  }
  // This thread's CPU time is shared time, except while it runs lane group 0;
  // so is the worker's time in the window rings when they run there.
  double ring_seconds = 0;
  double clock = detail::thread_cpu_seconds();
  res.shared_seconds = detail::cpu_seconds() - start;
  const auto charge_shared = [&] {
    const double t = detail::thread_cpu_seconds();
    res.shared_seconds += t - clock;
    clock = t;
  };

  // Refuses the run before the state vectors grow past the budget.
  const auto check_budget = [&] {
    std::size_t need = keys.memory_bytes() +
                       detail::doubled_capacity(keys.size()) * sizeof(key_info);
    for (const auto& l : lanes) need += l->bytes_after_resize(keys.size()) + l->heap_bytes();
    if (need <= budget) return;
    const std::string at = "at " + std::to_string(keys.size()) + " keys the run needs about " +
                           format_bytes(static_cast<double>(need)) +
                           ", over the memory budget of " +
                           format_bytes(static_cast<double>(budget)) +
                           " (half of this machine's memory, or of the address-space limit)";
    if (sweep_lanes > 0) {
      throw memory_budget_error("--sweep: " + std::to_string(opt.sweep_limits.size()) +
                                " limits x " + std::to_string(opt.sweep_policies.size()) +
                                " policies run " + std::to_string(sweep_lanes) +
                                " configurations side by side, " +
                                format_bytes(static_cast<double>(state_per_key)) +
                                " of policy state per key; " + at + "; sweep fewer limits");
    }
    throw memory_budget_error("the input has too many keys: " + at);
  };

  // Reads, parses and interns the next batch, and notes what the later stages
  // need to see as of this batch.
  const auto read_batch = [&](detail::batch& b) {
    b.clear();
    event e;
    while (b.ts.size() < batch_size && (more = reader.next(e))) {
      if (e.label >= 0) res.labelled = true;
      if (res.events == 0) res.first_ts = e.ts_us;
      res.first_ts = std::min(res.first_ts, e.ts_us);
      res.last_ts = std::max(res.last_ts, e.ts_us);
      now = std::max(now, e.ts_us);
      ++res.events;
      b.ts.push_back(e.ts_us);
      b.cost.push_back(e.cost);
      b.label.push_back(e.label);
      b.key_bytes.append(e.key);
      b.key_end.push_back(static_cast<std::uint32_t>(b.key_bytes.size()));
      b.hash.push_back(hash_key(e.key));
    }
    const std::size_t n = b.ts.size();
    // Intern the batch's keys, one table lookup per event for every policy,
    // fetching the slots and key bytes a few events ahead.
    b.id.resize(n);
    for (std::size_t i = 0, start = 0; i < n; ++i) {
      if (i + 24 < n) keys.prefetch(b.hash[i + 24], 0);
      if (i + 16 < n) keys.prefetch(b.hash[i + 16], 1);
      if (i + 8 < n) keys.prefetch(b.hash[i + 8], 2);
      const std::string_view key(b.key_bytes.data() + start, b.key_end[i] - start);
      start = b.key_end[i];
      bool fresh = false;
      b.id[i] = keys.intern(key, b.hash[i], fresh);
    }
    for (auto& a : b.admitted) std::fill_n(a.begin(), n, std::uint8_t{0});
    b.keys = keys.size();
    b.key_bytes_mem = keys.memory_bytes() +
                      detail::doubled_capacity(keys.size()) * sizeof(key_info);
    b.now = now;
    since_sample += n;
    b.sample = since_sample >= opt.sample_every || !more;
    if (b.sample) since_sample = 0;
  };

  // The window rings: every attempt, and per summary policy the admitted
  // calls; then the tool's memory sample, and the rings freed. The per-key
  // info grows here (not while reading), to the capacity it is accounted at.
  const std::uint8_t rejected_mask = summary_mask;
  const auto ring_batch = [&](const detail::batch& b) {
    if (info.size() < b.keys) {
      info.reserve(detail::doubled_capacity(b.keys));
      info.resize(b.keys);
    }
    const std::size_t n = b.ts.size();
    const std::uint8_t* admitted0 = b.admitted[0].data();
    const std::uint8_t* admitted1 = b.admitted[1].data();
    for (std::size_t i = 0; i < n; ++i) {
      if (i + 2 * detail::prefetch_distance < n) {
        detail::prefetch(info.data() + b.id[i + 2 * detail::prefetch_distance]);
      }
      if (i + detail::prefetch_distance < n) {
        rings.prefetch(info[b.id[i + detail::prefetch_distance]].ring);
      }
      if (i + detail::prefetch_distance / 2 < n) {
        rings.prefetch_entries(info[b.id[i + detail::prefetch_distance / 2]].ring);
      }
      const std::uint32_t k = b.id[i];
      key_info& ki = info[k];
      if (b.label[i] > ki.label) ki.label = b.label[i];
      const std::uint32_t m = admitted0[i] | admitted1[i];
      const std::uint32_t c = rings.add(ki.ring, k, b.ts[i], m, w, max_admitted);
      if (c > ki.raw_peak) ki.raw_peak = c;
      ki.blocked = static_cast<std::uint8_t>(ki.blocked | (~m & rejected_mask));
    }
    if (b.sample) {
      res.tool_bytes = std::max(res.tool_bytes, b.key_bytes_mem + rings.memory_bytes() +
                                                    b.sweep_bits[0] + b.sweep_bits[1]);
    }
    // Rings are freed after every batch; memory is sampled less often.
    rings.release_stale(info, b.now, w);
  };

  // A pipeline of two threads over batches k = 0, 1, ...: the worker counts
  // the window rings of batch k - 1 (whose lanes are done), then runs lane
  // group 1 over batch k; meanwhile this thread runs group 0 over batch k,
  // then reads batch k + 1 into the buffer batch k - 2 has left (when the
  // rings run on this thread, they count batch k - 1 before that read). The
  // budget is checked once both threads are done, before any state grows for
  // k + 1.
  // Every stage sees each batch in the order of a single thread: results do
  // not depend on the threads.
  detail::batch* cur = &batches[0];
  detail::batch* prev = nullptr;
  read_batch(*cur);
  check_budget();
  // The worker's job (declared before the worker, which outlives no job).
  const auto worker_job = [&](detail::batch* ring_of, detail::batch* lanes_of) {
    if (rings_on_worker && ring_of != nullptr) {
      const double t = detail::thread_cpu_seconds();
      ring_batch(*ring_of);
      ring_seconds += detail::thread_cpu_seconds() - t;
    }
    detail::run_lanes(groups[1], *lanes_of, 1);
  };
  std::optional<detail::worker_thread> worker;
  try {
    worker.emplace();
  } catch (const std::system_error&) {
    // No thread to be had: this thread runs every stage, one after the other.
  }
  for (;;) {
    charge_shared();
    if (worker) {
      worker->start([&worker_job, prev, cur] { worker_job(prev, cur); });
    } else {
      worker_job(prev, cur);
    }
    clock = detail::thread_cpu_seconds();
    detail::run_lanes(groups[0], *cur, 0);
    clock = detail::thread_cpu_seconds();
    if (!rings_on_worker && prev != nullptr) ring_batch(*prev);
    const bool last = !more;
    detail::batch* next = nullptr;
    for (detail::batch& b : batches) {
      if (&b != cur && &b != prev) next = &b;
    }
    if (!last) read_batch(*next);
    if (worker) worker->wait();
    prev = cur;
    if (last) break;
    check_budget();
    cur = next;
  }
  ring_batch(*prev);
  charge_shared();
  res.shared_seconds += ring_seconds;

  res.keys = keys.size();
  res.skipped = reader.skipped();
  res.first_skipped = reader.first_skipped();
  for (const key_info& ki : info) {
    if (ki.label == 1) ++res.abusive_keys;
    if (ki.label == 0) ++res.normal_keys;
    res.key_peaks.emplace_back(ki.raw_peak, ki.label);
  }
  for (const auto& l : lanes) {
    if (l->summary_slot >= 0) {
      policy_summary& s = *std::find_if(
          res.policies.begin(), res.policies.end(),
          [&](const policy_summary& ps) { return static_cast<int>(ps.id) == l->summary_slot; });
      s.limit = l->limit();
      s.admitted = l->admitted;
      s.rejected = l->rejected;
      const auto slot = static_cast<std::size_t>(l->summary_slot);
      for (const key_info& ki : info) {
        if ((ki.blocked >> slot) & 1u) ++s.keys_blocked;
      }
      s.max_in_window = max_admitted[slot];
      s.state_bytes_per_key = res.keys == 0 ? 0.0
                                            : static_cast<double>(l->total_bytes()) /
                                                  static_cast<double>(res.keys);
      s.state_peak_bytes = l->peak_bytes;
      s.seconds = l->seconds;
    } else {
      sweep_point& p = res.sweep[l->sweep_index];
      p.rejected = l->rejected;
      for (std::size_t k = 0; k < info.size(); ++k) {
        if (!l->was_blocked(k)) continue;
        ++p.keys_blocked;
        if (info[k].label == 1) ++p.abusive_caught;
        if (info[k].label == 0) ++p.normal_blocked;
      }
    }
  }
  res.total_seconds = detail::cpu_seconds() - start;
  return res;
}

/// Nearest-rank percentile (q in [0, 1]) of sorted values; 0 for none.
[[nodiscard]] inline std::uint32_t percentile(const std::vector<std::uint32_t>& sorted,
                                              double q) noexcept {
  if (sorted.empty()) return 0;
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  if (rank < 1) rank = 1;
  return sorted[std::min(rank, sorted.size()) - 1];
}

/// Most limits one --sweep may list.
inline constexpr units max_sweep_limits = 1000;

/// Parses a sweep specification: "5..30" (every integer), "5..30/5" (step),
/// or "5,10,20". Limits must be 1..2^50, at most 1000 of them.
/// @throws std::invalid_argument quoting the text
[[nodiscard]] inline std::vector<units> parse_sweep(std::string_view text) {
  const auto fail = [&]() -> std::vector<units> {
    throw std::invalid_argument("invalid --sweep \"" + std::string(text) +
                                "\" (expected e.g. 5..30, 5..60/5 or 5,10,20)");
  };
  const auto number = [&](std::string_view s, units& out) {
    std::size_t i = 0;
    return ratelimit::detail::parse_digits(s, i, max_units, out) && i == s.size() && out >= 1;
  };
  const auto too_many = [&](units n) -> std::vector<units> {
    throw std::invalid_argument("--sweep \"" + std::string(text) + "\" has " + std::to_string(n) +
                                " limits; at most " + std::to_string(max_sweep_limits) +
                                " (each runs five policies side by side)");
  };
  std::vector<units> out;
  if (const auto dots = text.find(".."); dots != std::string_view::npos) {
    units lo = 0, hi = 0, step = 1;
    std::string_view rest = text.substr(dots + 2);
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
      if (!number(rest.substr(slash + 1), step)) return fail();
      rest = rest.substr(0, slash);
    }
    if (!number(text.substr(0, dots), lo) || !number(rest, hi) || hi < lo) return fail();
    if ((hi - lo) / step >= max_sweep_limits) return too_many((hi - lo) / step + 1);
    for (units v = lo; v <= hi; v += step) out.push_back(v);
  } else {
    std::size_t start = 0;
    for (;;) {
      const std::size_t comma = text.find(',', start);
      units v = 0;
      if (!number(text.substr(start, comma - start), v)) return fail();
      out.push_back(v);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (out.size() > max_sweep_limits) return too_many(static_cast<units>(out.size()));
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

}  // namespace ratelimit::replay
