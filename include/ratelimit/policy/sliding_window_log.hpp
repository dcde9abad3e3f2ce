// SPDX-License-Identifier: Apache-2.0
// Sliding-window log: the timestamps of admitted requests in (t - W, t].
//
// Algorithm: a request of cost c at t is admitted iff the costs logged in
// (t - W, t] plus c are <= limit. Accuracy: exact; never more than limit in any
// window (t - W, t]. Memory: at most `limit` entries of 16 bytes per key (a
// ring buffer, the first two entries inline; under count_rejected only the
// newest entries that still matter are kept, see `trim`). O(log n) per
// check, plus amortised O(1) to drop entries that left the window when one is
// recorded.
// See https://blog.cloudflare.com/counting-things-a-lot-of-different-things/
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "ratelimit/decision.hpp"
#include "ratelimit/detail/inline_step.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// Sliding-window log policy (see file comment).
struct sliding_window_log {
  static constexpr std::string_view name = "sliding_log";

  /// Validated configuration: a rate and window_options.
  using config = detail::window_config<sliding_window_log>;

  /// One logged request: its time and the running total of costs up to and
  /// including it (so any range sum is a subtraction and retry_after a binary
  /// search).
  struct entry {
    std::int64_t ts = 0;
    units cum = 0;
    friend bool operator==(const entry&, const entry&) = default;
  };

  /// Ring buffer of entries, oldest first. Value-initialised = key never seen.
  /// The first `inline_capacity` entries live inside the state itself, so a
  /// key that logs few requests costs no second allocation (and no second
  /// cache miss per check); beyond that the ring moves to the heap.
  class state {
   public:
    static constexpr std::size_t inline_capacity = 2;

    state() = default;
    state(const state& o) { copy_from(o); }
    state(state&& o) noexcept { take(o); }
    state& operator=(const state& o) {
      if (this != &o) {
        state tmp(o);
        clear_heap();
        take(tmp);
      }
      return *this;
    }
    state& operator=(state&& o) noexcept {
      if (this != &o) {
        clear_heap();
        take(o);
      }
      return *this;
    }
    ~state() = default;

    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    [[nodiscard]] const entry& at(std::size_t i) const noexcept { return data()[index(i)]; }
    [[nodiscard]] const entry& front() const noexcept { return data()[head_]; }
    [[nodiscard]] const entry& back() const noexcept { return at(size_ - 1); }
    /// Sum of the costs of the entries held.
    [[nodiscard]] units total() const noexcept { return empty() ? 0 : back().cum - base_; }
    /// Cost of entry i.
    [[nodiscard]] units cost(std::size_t i) const noexcept {
      return at(i).cum - (i == 0 ? base_ : at(i - 1).cum);
    }
    /// Slots available without growing (for memory accounting).
    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
    /// Bytes held on the heap, beyond sizeof(state).
    [[nodiscard]] std::size_t heap_bytes() const noexcept {
      return heap_ ? capacity_ * sizeof(entry) : 0;
    }

    /// Leaves the log holding the one entry (ts, cost), keeping the ring's
    /// memory: the state that popping every entry and then `push_back` give.
    void assign_one(std::int64_t ts, units cost) noexcept {
      head_ = 0;
      size_ = 1;
      base_ = 0;
      data()[0] = entry{ts, cost};
    }

    void pop_front() noexcept {
      base_ = data()[head_].cum;
      head_ = index(1);
      --size_;
      if (size_ == 0) {
        head_ = 0;
        base_ = 0;
      }
    }

    /// Grows the ring now if appending after popping the `drop` oldest
    /// entries would have to, so that those pops and that append cannot
    /// allocate. Throws std::bad_alloc with the state unchanged.
    void reserve_push(std::size_t drop, std::size_t max_entries) {
      // Only a full ring with nothing to drop grows; then size_ < max_entries
      // (the caller drops one entry from a ring of max_entries), so the
      // grown ring holds every entry and one more.
      if (drop == 0 && size_ == capacity_) grow(max_entries);
    }

    /// Appends; `max_entries` bounds the ring's growth.
    void push_back(std::int64_t ts, units cost, std::size_t max_entries) {
      if (size_ == capacity_) grow(max_entries);
      const units last = empty() ? base_ : back().cum;
      data()[index(size_)] = entry{ts, last + cost};
      ++size_;
      // Running totals only grow; rebase long before int64 could overflow.
      if (back().cum > (units{1} << 61)) rebase();
    }

    friend bool operator==(const state& a, const state& b) noexcept {
      if (a.size_ != b.size_) return false;
      for (std::size_t i = 0; i < a.size_; ++i) {
        if (a.at(i).ts != b.at(i).ts || a.cost(i) != b.cost(i)) return false;
      }
      return true;
    }

   private:
    [[nodiscard]] entry* data() noexcept { return heap_ ? heap_.get() : inline_; }
    [[nodiscard]] const entry* data() const noexcept { return heap_ ? heap_.get() : inline_; }
    [[nodiscard]] std::size_t index(std::size_t i) const noexcept {
      const std::size_t j = head_ + i;
      return j >= capacity_ ? j - capacity_ : j;
    }
    void grow(std::size_t max_entries) {
      const std::size_t cap = std::min(capacity_ * 2, max_entries);
      auto next = std::make_unique<entry[]>(cap);
      for (std::size_t i = 0; i < size_; ++i) next[i] = at(i);
      heap_ = std::move(next);
      capacity_ = cap;
      head_ = 0;
    }
    void rebase() noexcept {
      for (std::size_t i = 0; i < size_; ++i) data()[index(i)].cum -= base_;
      base_ = 0;
    }
    void copy_from(const state& o) {
      if (o.size_ > inline_capacity) {
        heap_ = std::make_unique<entry[]>(o.size_);
        capacity_ = o.size_;
      }
      for (std::size_t i = 0; i < o.size_; ++i) data()[i] = o.at(i);
      size_ = o.size_;
      base_ = o.base_;
    }
    /// Takes o's contents and leaves o empty (and valid).
    void take(state& o) noexcept {
      heap_ = std::move(o.heap_);
      for (std::size_t i = 0; i < inline_capacity; ++i) inline_[i] = o.inline_[i];
      capacity_ = o.capacity_;
      head_ = o.head_;
      size_ = o.size_;
      base_ = o.base_;
      o.capacity_ = inline_capacity;
      o.head_ = 0;
      o.size_ = 0;
      o.base_ = 0;
    }
    void clear_heap() noexcept {
      heap_.reset();
      capacity_ = inline_capacity;
      head_ = 0;
      size_ = 0;
      base_ = 0;
    }

    entry inline_[inline_capacity]{};
    std::unique_ptr<entry[]> heap_;
    std::size_t capacity_ = inline_capacity;
    std::size_t head_ = 0;
    std::size_t size_ = 0;
    units base_ = 0;  ///< running total just before the oldest entry
  };

  /// Decides and records. May throw std::bad_alloc when the log has to
  /// grow; the state is then unchanged (the ring grows before anything else
  /// is written).
  static decision step(const config& cfg, state& s, timestamp now, units cost) {
    return step_as<false>(cfg, s, now, cost);
  }
  /// As step, recording the request even when rejected (access::force), as
  /// count_rejected records an attempt; `trim` keeps the log at most `limit`
  /// entries however many requests are forced past the limit.
  static decision force(const config& cfg, state& s, timestamp now, units cost) {
    return step_as<true>(cfg, s, now, cost);
  }
  /// `step` (Forced = false) or `force` (true), one instantiation each so
  /// that a plain check carries no trace of the forced path.
  template <bool Forced>
  [[gnu::always_inline]] static decision step_as(const config& cfg, state& s, timestamp now,
                                                 units cost) {
    std::int64_t t = now.count();
    // Time never runs backwards inside a key: decide at the newest entry.
    if (!s.empty() && t < s.back().ts) t = s.back().ts;
    // Every entry has left the window (the usual case of a key that is not
    // at its limit): nothing to search, and the log is emptied at once
    // instead of entry by entry. This part stays small enough to be inlined
    // into the store's check; the general case is a call.
    if (s.empty() || s.back().ts <= t - cfg.period_us()) {
      return step_on_empty_window(cfg, s, t, cost, Forced);
    }
    return step_in_window(cfg, s, t, cost, Forced);
  }

  /// `step` at the (clamped) time t when some entry is in (t - W, t].
  [[gnu::noinline]] static decision step_in_window(const config& cfg, state& s, std::int64_t t,
                                                   units cost, bool forced) {
    const std::int64_t w = cfg.period_us();
    const units limit = cfg.limit();
    // Entries at or before t - W have left the window, but they are dropped
    // only when this attempt is recorded: a rejection writes nothing, and a
    // later request stamped before t may still see them.
    const std::size_t first = first_in_window(s, t - w);
    units in_window = first == 0 ? s.total() : s.back().cum - s.at(first - 1).cum;

    decision d;
    d.limit = limit;
    d.allowed = in_window + cost <= limit;
    if (d.allowed || forced || cfg.count_rejected()) {
      // The ring never needs more than `limit` slots (see `trim`): a full
      // ring's oldest entry is one that trimming after this push would drop.
      const auto max_entries = static_cast<std::size_t>(limit);
      const bool drop_one_more = s.size() - first >= max_entries;
      s.reserve_push(first + (drop_one_more ? 1 : 0), max_entries);
      for (std::size_t i = 0; i < first; ++i) s.pop_front();
      if (drop_one_more) s.pop_front();
      s.push_back(t, cost, max_entries);
      trim(s, limit);
      // Trimming only happens once the kept entries reach the limit, so this
      // is the window's total whenever it is below the limit.
      in_window = s.total();
      d.counted = true;
    }
    d.remaining = std::max<units>(0, limit - in_window);
    if (!d.allowed) {
      if (cost > limit) {
        d.retry_after = never;
      } else {
        // The retry is admitted once entry i has left the window, for the
        // oldest i whose newer entries sum to at most limit - cost. Entries
        // are cumulative, so that is a binary search on `cum`.
        const units need = s.back().cum + cost - limit;  // cum_i >= need
        std::size_t lo = 0;
        std::size_t hi = s.size() - 1;
        while (lo < hi) {
          const std::size_t mid = lo + (hi - lo) / 2;
          if (s.at(mid).cum >= need) {
            hi = mid;
          } else {
            lo = mid + 1;
          }
        }
        d.retry_after = std::chrono::microseconds{s.at(lo).ts + w - t};
      }
    }
    d.reset_after = std::chrono::microseconds{in_window == 0 ? 0 : s.back().ts + w - t};
    return d;
  }

  /// `step` when no entry is in the window (t - W, t]: the request is
  /// admitted iff cost <= limit, and a recorded attempt leaves the log
  /// holding only itself (one entry never reaches `trim`'s bound, and the
  /// ring always has room for one, so nothing can throw).
  static decision step_on_empty_window(const config& cfg, state& s, std::int64_t t, units cost,
                                       bool forced) noexcept {
    const units limit = cfg.limit();
    decision d;
    d.limit = limit;
    d.allowed = cost <= limit;
    units in_window = 0;
    if (d.allowed || forced || cfg.count_rejected()) {
      s.assign_one(t, cost);
      in_window = cost;
      d.counted = true;
    }
    d.remaining = std::max<units>(0, limit - in_window);
    if (!d.allowed) d.retry_after = never;  // only a cost above the limit is refused here
    d.reset_after = std::chrono::microseconds{in_window == 0 ? 0 : cfg.period_us()};
    return d;
  }

  /// Index of the oldest entry newer than `horizon` (size() if none); entry
  /// times never decrease, so bisect.
  [[nodiscard]] static std::size_t first_in_window(const state& s, std::int64_t horizon) noexcept {
    std::size_t lo = 0;
    std::size_t hi = s.size();
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (s.at(mid).ts <= horizon) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  /// Keeps the shortest run of newest entries whose costs reach `limit`.
  /// Older entries can no longer change any decision: while one of them is
  /// still in the window, so is the whole kept run, which alone rejects every
  /// request; and every retry_after is decided inside the kept run. So the log
  /// holds at most `limit` entries even when rejected attempts are counted or
  /// requests are forced past the limit (access::force).
  ///
  /// In full, with K the kept run (costs summing to S >= limit, base B =
  /// the running total just before it) and any dropped entry e (e.ts <= every
  /// kept time, e.cum <= B): (1) admission at any later t: if e is in (t - W,
  /// t], so is all of K, so the window holds >= S >= limit and the request
  /// (cost >= 1) is rejected with or without e; if e is not, e adds nothing.
  /// (2) retry_after picks the oldest entry i with cum_i >= need = last.cum +
  /// cost - limit; since last.cum - B = S >= limit, need > B >= e.cum, so i is
  /// never a dropped entry. (3) remaining and reset_after read only the newest
  /// entries (remaining is 0 once S >= limit). Times never run backwards in a
  /// key (a request is decided at the newest entry's time or later), so no
  /// later check can look at a window that ends before K's entries.
  static void trim(state& s, units limit) noexcept {
    while (s.size() > 1 && s.back().cum - s.front().cum >= limit) s.pop_front();
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    return s.empty() || s.back().ts <= now.count() - cfg.period_us();
  }
};

namespace detail {
/// `sliding_window_log::step` is its `step_as<false>`, which a store may call instead.
template <>
inline constexpr bool step_is_step_as<sliding_window_log> = true;
}  // namespace detail

}  // namespace ratelimit
