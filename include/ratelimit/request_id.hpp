// SPDX-License-Identifier: Apache-2.0
// Idempotent checks: a request id, its validation, the retention of ids, and
// the in-process table of ids a limiter uses over an in-process store.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>  // std::lock_guard
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/printable.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/detail/spin_lock.hpp"
#include "ratelimit/detail/validate.hpp"

namespace ratelimit {

/// Longest request id in bytes (binary safe, like keys).
inline constexpr std::size_t max_request_id_bytes = 256;

/// The id of one request, for idempotent checks (`limiter::try_acquire(key,
/// request_id{...})`): an HTTP `Idempotency-Key`, a SIP Call-ID + CSeq. A
/// view: the bytes must outlive the call. Its own type so that an id is
/// never mistaken for a key, a cost or a time in the limiter's overloads.
struct request_id {
  explicit constexpr request_id(std::string_view id) noexcept : bytes(id) {}
  std::string_view bytes;
};

/// Options of idempotent checks, per limiter. An aggregate; every field has a default.
struct idempotency_options {
  /// How long an id is remembered after its first check; 0 = the policy's
  /// window or period (for a compound, the longest of its sub-limits).
  std::chrono::microseconds retention{0};
  /// In-process only: most ids held at once by the limiter's id table;
  /// 0 = `default_max_request_ids`. At the cap, a new id evicts an id of its
  /// stripe (the one whose retention ends first among the 8 slots examined
  /// next), whose retries are then decided as new requests; when its stripe
  /// holds none, the new id is not recorded. Redis keeps ids as
  /// keys with a TTL and has no cap of its own (see docs/semantics.md).
  std::size_t max_ids = 0;
  /// In-process only: independently locked stripes of the id table, rounded
  /// up to a power of two, at most 65536; 0 = 64.
  std::size_t stripes = 0;
};

/// Default cap on the ids an in-process limiter holds.
inline constexpr std::size_t default_max_request_ids = std::size_t{1} << 20;

namespace detail {

[[noreturn, gnu::noinline, gnu::cold]] inline void throw_bad_request_id(std::string_view id) {
  if (id.empty()) throw std::invalid_argument("ratelimit: request id must not be empty");
  throw std::invalid_argument("ratelimit: request id \"" + printable(id, 40) + "\" of " +
                              std::to_string(id.size()) + " bytes exceeds the maximum of " +
                              std::to_string(max_request_id_bytes) + " bytes");
}

/// @throws std::invalid_argument for an empty id or one over max_request_id_bytes
inline void check_request_id(request_id id) {
  if (id.bytes.size() - 1 >= max_request_id_bytes) throw_bad_request_id(id.bytes);
}

/// The policy's window or period in microseconds; for a compound, the longest.
template <class Config>
[[nodiscard]] std::int64_t natural_period_us(const Config& cfg) {
  if constexpr (requires { cfg.period_us(); }) {
    return cfg.period_us();
  } else if constexpr (requires { cfg.get_rate().period(); }) {
    return std::chrono::duration_cast<std::chrono::microseconds>(cfg.get_rate().period()).count();
  } else if constexpr (requires { cfg.parts().size(); }) {  // compound_of: a vector
    std::int64_t longest = 1;
    for (const auto& p : cfg.parts()) longest = std::max(longest, natural_period_us(p));
    return longest;
  } else {  // compound<Ps...>: a tuple
    return std::apply(
        [](const auto&... p) {
          return std::max({std::int64_t{1}, natural_period_us(p)...});
        },
        cfg.parts());
  }
}

/// Most stripes an id table takes (idempotency_options::stripes).
inline constexpr std::size_t max_id_stripes = 65536;

/// @throws std::invalid_argument for a stripe count over max_id_stripes
inline void check_id_stripes(std::size_t s) {
  if (s > max_id_stripes) {
    throw std::invalid_argument("ratelimit: idempotency_options::stripes " + std::to_string(s) +
                                " is over the maximum of " + std::to_string(max_id_stripes));
  }
}

/// The retention of ids under `o` for `cfg`, after checking every field of
/// `o`, whichever store the limiter has (one that keeps ids itself ignores
/// max_ids and stripes, but a value no store accepts is refused all the same).
/// @throws std::invalid_argument for a negative retention or one over
///   max_time, or a stripe count over max_id_stripes
template <class Config>
[[nodiscard]] std::chrono::microseconds retention_for(const Config& cfg,
                                                      const idempotency_options& o) {
  check_id_stripes(o.stripes);
  if (o.retention.count() < 0 || o.retention > max_time) {
    throw std::invalid_argument("ratelimit: request id retention " +
                                std::to_string(o.retention.count()) + "us is outside 0.." +
                                std::to_string(max_time.count()) + "us (0 = the policy's period)");
  }
  if (o.retention.count() > 0) return o.retention;
  return std::chrono::microseconds{natural_period_us(cfg)};
}

/// The limiter's in-process table of request ids: (key, id) -> the first
/// decision and the time its retention ends.
///
/// Why a table beside the store rather than inside memory_store: plain checks
/// must not pay for ids, neither in time nor in bytes per key. A check with
/// an id locks one stripe of this table (chosen by the hash of key and id),
/// looks the id up, runs the store's ordinary `apply` under that lock and
/// records the id before unlocking; so two checks with the same key and id
/// are serialised (exactly one consumes), checks with other ids on the same
/// key run concurrently as plain checks do, and the store's hot path is the
/// same code. The stripe lock is always taken before the store's own locks
/// (its shard's and its buckets'), never after, so they cannot deadlock.
///
/// Each stripe is an open-addressing table of 16-byte tags (linear probing,
/// at most half full, deletion by backward shift: 32 bits of the
/// fingerprint, the end of the retention and the index of a 56-byte record),
/// which probes and the sweep read, 4 to a cache line; the record (the
/// 128-bit fingerprint of (key, id) and the decision) is read only when the
/// tag's 32 bits match, and never moves. No key or id bytes, and no
/// allocation per id: 92 bytes per id held at the fullest (two tags, a
/// record, a 4-byte free-list entry reserved per record), 184 just after a
/// stripe doubles. The fingerprint is two SipHash-1-3
/// values of `<key length><key><id>` under two secret keys drawn for each
/// table: without the keys nobody can build two (key, id) pairs that share
/// one, and by chance two of a billion ids share one with probability below
/// 2^-68. So a check with a new id costs two hashes and about two cache
/// misses (its tag, its record) beyond a plain check.
///
/// Ids are dropped one retention after theirs has ended (a check stamped up
/// to a retention earlier than the latest one, as threads and out-of-order
/// caller times give, still finds the ids it would have found): each record
/// written examines the next eight slots of a sweep over its stripe. At
/// `max_ids`, see idempotency_options::max_ids: the id evicted is the one
/// whose retention ends first among the next 8 slots of the sweep. When the
/// memory for a new record cannot be had, the check's decision is returned
/// and only its id goes unrecorded; a std::bad_alloc from the store's own
/// check propagates with nothing recorded.
///
/// Thread safety: `check` from any number of threads.
class id_table {
 public:
  explicit id_table(const idempotency_options& o)
      : stripes_(normalise_stripes(o.stripes)),
        stripe_shift_(63U - static_cast<unsigned>(std::countr_zero(stripes_))),
        max_ids_(o.max_ids == 0 ? default_max_request_ids : o.max_ids),
        seed_a_(make_seed(0)),
        seed_b_(make_seed(1)),
        stripe_(std::make_unique<stripe[]>(stripes_)) {}

  id_table(const id_table&) = delete;
  id_table& operator=(const id_table&) = delete;
  ~id_table() = default;

  /// The check of `key` with `id` at `now`: the first decision again (with
  /// `repeat`) when the id is held and `now` is before its retention ends;
  /// otherwise `decide()`, recorded with the id until `now + retention` when
  /// it is a consuming check decided by the store itself (not degraded).
  template <class Decide>
  decision check(std::string_view key, request_id id, timestamp now,
                 std::chrono::microseconds retention, access a, Decide&& decide) {
    char buf[2 + max_key_bytes + max_request_id_bytes];
    const std::size_t n = compose(buf, key, id.bytes);
    const std::string_view composite(buf, n);
    const std::uint64_t fa = detail::siphash13(seed_a_, composite);
    // High bits pick the stripe, low bits the slot, so the two stay independent.
    stripe& st = stripe_[static_cast<std::size_t>((fa >> 1) >> stripe_shift_)];
    std::lock_guard<detail::spin_lock> guard(st.lock);
    // The probe's first line is loaded while the second half is hashed.
    if (st.tags != nullptr) __builtin_prefetch(&st.tags[fa & st.mask]);
    const std::uint64_t fb = detail::siphash13(seed_b_, composite);
    const std::size_t held = st.find(fa, fb);
    const bool found = held != st.capacity();
    // A new id's record goes to the next free record: load its line for
    // writing while the store decides.
    if (!found && !st.free.empty()) __builtin_prefetch(&st.records[st.free.back()], 1);
    if (found && now < st.tags[held].until) {
      decision d = st.records[st.tags[held].record].first;
      d.repeat = true;
      return d;
    }
    // Not held, or its retention is over at `now`: a new request. An ended
    // record is replaced only by a check that records a new one (as the
    // Redis script overwrites it), so that a peek or a degraded check
    // changes nothing.
    decision d = decide();
    if (a == access::peek || d.degraded()) return d;
    const timestamp until = now > timestamp::max() - retention ? timestamp::max() : now + retention;
    if (found) {  // the same id again after its retention: rewrite in place
      st.tags[held].until = until;
      st.records[st.tags[held].record].first = d;
      return d;
    }
    // One more retention of grace before a record is dropped (see above).
    st.sweep(now - retention, 8, *count_);
    if (!reserve(st)) return d;
    try {
      st.insert(fa, fb, until, d);
    } catch (const std::bad_alloc&) {
      // The check was decided (and consumed): return it; only the id goes
      // unrecorded, as at the cap with an empty stripe.
      count_->fetch_sub(1, std::memory_order_relaxed);
    }
    return d;
  }

  /// Ids held (some may have ended their retention and wait to be dropped).
  [[nodiscard]] std::size_t size() const noexcept {
    return count_->load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t max_ids() const noexcept { return max_ids_; }

  /// The longest run of occupied slots in any stripe (a probe's worst case):
  /// a diagnostic for tests and monitoring; takes each stripe's lock in turn.
  [[nodiscard]] std::size_t longest_probe() const {
    std::size_t longest = 0;
    for (std::size_t i = 0; i < stripes_; ++i) {
      stripe& st = stripe_[i];
      std::lock_guard<detail::spin_lock> guard(st.lock);
      std::size_t run = 0;
      for (std::size_t k = 0; k < 2 * st.capacity(); ++k) {  // twice: runs wrap around
        run = st.tags[k & st.mask].check != 0 ? run + 1 : 0;
        longest = std::max(longest, std::min(run, st.capacity()));
      }
    }
    return longest;
  }

 private:
  /// The probed part of a record: 16 bytes, 4 per cache line, so that a
  /// probe and the sweep read few lines; a deletion shifts only tags.
  struct tag {
    std::uint32_t check;   ///< the fingerprint's bits 0..30, bit 31 set; 0 = empty
    std::uint32_t record;  ///< index of the record in `records`
    timestamp until;       ///< the end of the id's retention
  };
  /// The rest, read only when a tag's check matches; never moved.
  struct record {
    std::uint64_t a;  ///< the fingerprint, first half
    std::uint64_t b;  ///< second half
    decision first;   ///< the decision of its first check
  };

  /// A tag's check: the fingerprint's low bits (so that a tag knows its home
  /// slot, check & mask, without reading its record) and bit 31 set (never 0).
  [[nodiscard]] static std::uint32_t check_bits(std::uint64_t fa) noexcept {
    return static_cast<std::uint32_t>(fa) | 0x80000000U;
  }

  struct alignas(64) stripe {
    detail::spin_lock lock;
    tag* tags = nullptr;
    std::size_t mask = 0;  ///< capacity - 1, or 0 before the first insert
    std::size_t size = 0;
    std::size_t cursor = 0;           ///< next slot the sweep examines
    std::vector<record> records;      ///< one per slot of capacity / 2
    std::vector<std::uint32_t> free;  ///< indexes of unused records

    stripe() = default;
    stripe(const stripe&) = delete;
    stripe& operator=(const stripe&) = delete;
    ~stripe() { delete[] tags; }

    [[nodiscard]] std::size_t capacity() const noexcept { return tags == nullptr ? 0 : mask + 1; }

    /// The slot holding (fa, fb), or capacity() when none does.
    [[nodiscard]] std::size_t find(std::uint64_t fa, std::uint64_t fb) const noexcept {
      if (tags == nullptr) return 0;
      const std::uint32_t c = check_bits(fa);
      for (std::size_t i = fa & mask;; i = (i + 1) & mask) {
        if (tags[i].check == 0) return capacity();
        if (tags[i].check == c) {
          const record& r = records[tags[i].record];
          if (r.a == fa && r.b == fb) return i;
        }
      }
    }

    void insert(std::uint64_t fa, std::uint64_t fb, timestamp until, const decision& d) {
      // Tags at most half full, so that probes stay short and always end.
      if (tags == nullptr || free.empty()) grow();
      const std::uint32_t rec = free.back();
      records[rec] = record{fa, fb, d};
      free.pop_back();
      place(tag{check_bits(fa), rec, until}, fa & mask);
      ++size;
    }

    void place(const tag& t, std::size_t i) noexcept {
      while (tags[i].check != 0) i = (i + 1) & mask;
      tags[i] = t;
    }

    /// Empties slot `i` and shifts back the tags after it that probed past
    /// it, so that every probe still ends at an empty slot.
    void erase_at(std::size_t i, std::atomic<std::size_t>& total) noexcept {
      free.push_back(tags[i].record);  // capacity reserved in grow(): no allocation
      std::size_t hole = i;
      for (std::size_t j = (i + 1) & mask; tags[j].check != 0; j = (j + 1) & mask) {
        const std::size_t h = tags[j].check & mask;
        // Move j into the hole when its home is not in (hole, j] (cyclically).
        if (((j - h) & mask) >= ((j - hole) & mask)) {
          tags[hole] = tags[j];
          hole = j;
        }
      }
      tags[hole].check = 0;
      --size;
      total.fetch_sub(1, std::memory_order_relaxed);
    }

    /// Examines the next `count` slots of the sweep; drops records whose
    /// retention ended by `upto`.
    void sweep(timestamp upto, std::size_t count, std::atomic<std::size_t>& total) noexcept {
      if (tags == nullptr) return;
      for (std::size_t k = 0; k < count; ++k) {
        cursor = (cursor + 1) & mask;
        if (tags[cursor].check != 0 && tags[cursor].until <= upto) erase_at(cursor, total);
      }
    }

    /// At the cap: drops the record ending first among the next 8 of the sweep.
    bool evict(std::atomic<std::size_t>& total) noexcept {
      if (size == 0) return false;
      std::size_t victim = capacity();
      for (std::size_t k = 0; k < 8 || victim == capacity(); ++k) {
        cursor = (cursor + 1) & mask;
        if (tags[cursor].check != 0 &&
            (victim == capacity() || tags[cursor].until < tags[victim].until)) {
          victim = cursor;
        }
      }
      erase_at(victim, total);
      return true;
    }

    /// Doubles the tags (16 at first) and the records (half as many); on
    /// std::bad_alloc nothing changed.
    void grow() {
      const std::size_t count = tags == nullptr ? 16 : capacity() * 2;
      // Tags find their home in 31 bits of their check; records are counted in 32.
      if (count > (std::size_t{1} << 30)) throw std::bad_alloc();
      const std::size_t old_records = records.size();
      auto fresh = std::make_unique<tag[]>(count);  // zeroed: all empty
      records.reserve(count / 2);
      free.reserve(count / 2);
      records.resize(count / 2);
      for (std::size_t r = count / 2; r-- > old_records;)
        free.push_back(static_cast<std::uint32_t>(r));
      tag* old = tags;
      const std::size_t old_capacity = capacity();
      tags = fresh.release();
      mask = count - 1;
      cursor &= mask;
      for (std::size_t i = 0; i < old_capacity; ++i) {
        if (old[i].check != 0) place(old[i], old[i].check & mask);
      }
      delete[] old;
    }
  };

  /// `<key length, 2 bytes LE><key><id>`: (key, id) pairs map to distinct byte strings.
  static std::size_t compose(char* out, std::string_view key, std::string_view id) noexcept {
    out[0] = static_cast<char>(key.size() & 0xff);
    out[1] = static_cast<char>(key.size() >> 8);
    std::memcpy(out + 2, key.data(), key.size());
    std::memcpy(out + 2 + key.size(), id.data(), id.size());
    return 2 + key.size() + id.size();
  }

  /// Counts one more id; at the cap evicts one of this stripe's instead.
  bool reserve(stripe& st) noexcept {
    std::size_t current = count_->load(std::memory_order_relaxed);
    do {
      if (current >= max_ids_) {
        if (!st.evict(*count_)) return false;
        current = count_->load(std::memory_order_relaxed);
        continue;
      }
    } while (!count_->compare_exchange_weak(current, current + 1, std::memory_order_relaxed));
    return true;
  }

  static std::size_t normalise_stripes(std::size_t s) {
    check_id_stripes(s);
    return std::bit_ceil(s == 0 ? std::size_t{64} : s);
  }

  static detail::siphash_key make_seed(int which) {
    try {
      std::random_device rd;
      const auto word = [&rd] {
        return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
      };
      return {word(), word()};
    } catch (...) {
      const auto ticks = static_cast<std::uint64_t>(
          std::chrono::steady_clock::now().time_since_epoch().count());
      const detail::siphash_key mixed{ticks ^ 0x9e3779b97f4a7c15ULL,
                                      static_cast<std::uint64_t>(which)};
      return {detail::siphash13(mixed, "ratelimit.id0"), detail::siphash13(mixed, "ratelimit.id1")};
    }
  }

  std::size_t stripes_;
  unsigned stripe_shift_;  ///< 63 - log2(stripes)
  std::size_t max_ids_;
  detail::siphash_prepared seed_a_;
  detail::siphash_prepared seed_b_;
  std::unique_ptr<stripe[]> stripe_;
  std::unique_ptr<std::atomic<std::size_t>> count_ = std::make_unique<std::atomic<std::size_t>>(0);
};

}  // namespace detail
}  // namespace ratelimit
