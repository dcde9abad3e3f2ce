// SPDX-License-Identifier: Apache-2.0
// Sliding-window log: the timestamps of admitted requests in (t - W, t].
//
// Algorithm: a request of cost c at t is admitted iff the costs logged in
// (t - W, t] plus c are <= limit. Accuracy: exact; never more than limit in any
// window (t - W, t]. Memory: at most `limit` entries of 16 bytes per key (a
// ring buffer; under count_rejected only the newest entries that still matter
// are kept, see `trim`). Amortised O(1) per admitted check, O(log n) per
// rejection. See https://blog.cloudflare.com/counting-things-a-lot-of-different-things/
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "ratelimit/decision.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/rate.hpp"

namespace ratelimit {

/// Sliding-window log policy (see file comment).
struct sliding_window_log {
  static constexpr std::string_view name = "sliding_log";

  /// Validated configuration. Thread safety: immutable.
  class config {
   public:
    using policy_type = sliding_window_log;
    explicit config(rate r, window_options o = {}) : rate_(r), options_(o) {}
    explicit config(std::string_view r, window_options o = {}) : config(rate::parse(r), o) {}
    [[nodiscard]] units limit() const noexcept { return rate_.limit(); }
    [[nodiscard]] std::int64_t period_us() const noexcept { return rate_.period().count(); }
    [[nodiscard]] const rate& get_rate() const noexcept { return rate_; }
    [[nodiscard]] bool count_rejected() const noexcept { return options_.count_rejected; }

   private:
    rate rate_;
    window_options options_;
  };

  /// One logged request: its time and the running total of costs up to and
  /// including it (so any range sum is a subtraction and retry_after a binary
  /// search).
  struct entry {
    std::int64_t ts = 0;
    units cum = 0;
    friend bool operator==(const entry&, const entry&) = default;
  };

  /// Ring buffer of entries, oldest first. Value-initialised = key never seen.
  class state {
   public:
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
    [[nodiscard]] const entry& at(std::size_t i) const noexcept { return buf_[index(i)]; }
    [[nodiscard]] const entry& front() const noexcept { return buf_[head_]; }
    [[nodiscard]] const entry& back() const noexcept { return at(size_ - 1); }
    /// Sum of the costs of the entries held.
    [[nodiscard]] units total() const noexcept { return empty() ? 0 : back().cum - base_; }
    /// Cost of entry i.
    [[nodiscard]] units cost(std::size_t i) const noexcept {
      return at(i).cum - (i == 0 ? base_ : at(i - 1).cum);
    }
    /// Slots allocated (for memory accounting).
    [[nodiscard]] std::size_t capacity() const noexcept { return buf_.size(); }

    void pop_front() noexcept {
      base_ = buf_[head_].cum;
      head_ = index(1);
      --size_;
      if (size_ == 0) {
        head_ = 0;
        base_ = 0;
      }
    }

    /// Appends; `max_entries` bounds the ring's growth.
    void push_back(std::int64_t ts, units cost, std::size_t max_entries) {
      if (size_ == buf_.size()) grow(max_entries);
      const units last = empty() ? base_ : back().cum;
      buf_[index(size_)] = entry{ts, last + cost};
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
    [[nodiscard]] std::size_t index(std::size_t i) const noexcept {
      const std::size_t j = head_ + i;
      return j >= buf_.size() ? j - buf_.size() : j;
    }
    void grow(std::size_t max_entries) {
      const std::size_t cap = std::min(std::max<std::size_t>(4, buf_.size() * 2), max_entries);
      std::vector<entry> next(cap);
      for (std::size_t i = 0; i < size_; ++i) next[i] = at(i);
      buf_.swap(next);
      head_ = 0;
    }
    void rebase() noexcept {
      for (std::size_t i = 0; i < size_; ++i) buf_[index(i)].cum -= base_;
      base_ = 0;
    }

    std::vector<entry> buf_;
    std::size_t head_ = 0;
    std::size_t size_ = 0;
    units base_ = 0;  ///< running total just before the oldest entry
  };

  static decision step(const config& cfg, state& s, timestamp now, units cost) noexcept {
    const std::int64_t w = cfg.period_us();
    const units limit = cfg.limit();
    std::int64_t t = now.count();
    // Time never runs backwards inside a key: decide at the newest entry.
    if (!s.empty() && t < s.back().ts) t = s.back().ts;
    while (!s.empty() && s.front().ts <= t - w) s.pop_front();

    decision d;
    d.limit = limit;
    d.allowed = s.total() + cost <= limit;
    if (d.allowed || cfg.count_rejected()) {
      // The ring never needs more than `limit` slots (see `trim`): a full
      // ring's oldest entry is one that trimming after this push would drop.
      const auto max_entries = static_cast<std::size_t>(limit);
      if (s.size() >= max_entries) s.pop_front();
      s.push_back(t, cost, max_entries);
      trim(s, limit);
      d.counted = true;
    }
    d.remaining = std::max<units>(0, limit - s.total());
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
    d.reset_after = std::chrono::microseconds{s.empty() ? 0 : s.back().ts + w - t};
    return d;
  }

  /// Keeps the shortest run of newest entries whose costs reach `limit`.
  /// Older entries can no longer change any decision: while one of them is
  /// still in the window, so is the whole kept run, which alone rejects every
  /// request; and every retry_after is decided inside the kept run. So the log
  /// holds at most `limit` entries even when rejected attempts are counted.
  static void trim(state& s, units limit) noexcept {
    while (s.size() > 1 && s.back().cum - s.front().cum >= limit) s.pop_front();
  }

  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    return s.empty() || s.back().ts <= now.count() - cfg.period_us();
  }
};

}  // namespace ratelimit
