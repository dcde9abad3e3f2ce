// SPDX-License-Identifier: Apache-2.0
// Deliberately naive brute-force models of the five policies, written from docs/semantics.md alone.
//
// These models are the oracle of the property and differential tests, so they
// trade every bit of speed for being obviously right:
// - every recorded request is kept forever in a std::vector and every count
//   is a fresh sum over that history;
// - the token bucket counts tokens as exact fractions (tokens x period, in
//   __int128), without the library's gcd-reduced ticks;
// - `retry_after` is never solved in closed form: it is the first admitted
//   time found by scanning every microsecond (sliding counter), by testing
//   every time at which the answer can change (fixed window, sliding log), or
//   by bisecting a predicate that is obviously monotone in time (token
//   bucket, GCRA).
// The sliding-counter model scans up to two windows microsecond by
// microsecond, so use it with periods up to about 10^5 us.
//
// Each model decides one key; `keyed<Model>` holds one model per key. None of
// them includes a policy header, so they cannot inherit a policy's mistakes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ratelimit/decision.hpp"

namespace ratelimit_test::reference {

using ratelimit::decision;
using ratelimit::units;

__extension__ typedef __int128 int128;  // NOLINT: exact token arithmetic, GCC/Clang only

/// Counts recorded under count_rejected saturate here (semantics.md).
inline constexpr units count_ceiling = units{1} << 52;

/// Floor of a / b for b > 0 and any a.
[[nodiscard]] inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if (q * b > a) --q;
  return q;
}

/// One line describing every field of a decision, for failure messages.
[[nodiscard]] inline std::string describe(const decision& d) {
  std::ostringstream out;
  out << "{allowed=" << d.allowed << " counted=" << d.counted
      << " source=" << ratelimit::to_string(d.source) << " limit=" << d.limit
      << " remaining=" << d.remaining << " retry_after=";
  if (d.retry_after == ratelimit::never) {
    out << "never";
  } else {
    out << d.retry_after.count() << "us";
  }
  out << " reset_after=" << d.reset_after.count() << "us}";
  return out.str();
}

/// A request recorded in a window policy's history, at its decision time.
struct event {
  std::int64_t t;
  units cost;
};

/// Smallest t0 < x <= t0 + horizon with pred(x), by testing every microsecond.
template <class Pred>
[[nodiscard]] std::optional<std::int64_t> scan_forward(std::int64_t t0, std::int64_t horizon,
                                                       Pred pred) {
  for (std::int64_t x = t0 + 1; x <= t0 + horizon; ++x) {
    if (pred(x)) return x;
  }
  return std::nullopt;
}

/// Smallest x in [lo, hi] with pred(x), for pred false-then-true on [lo, hi]
/// and pred(hi) true.
template <class Pred>
[[nodiscard]] std::int64_t bisect_first(std::int64_t lo, std::int64_t hi, Pred pred) {
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

/// Fixed window: window k = floor(t / W) covers [kW, (k+1)W).
class fixed_window_model {
 public:
  fixed_window_model(units limit, std::int64_t period_us, bool count_rejected)
      : limit_(limit), w_(period_us), count_rejected_(count_rejected) {}

  decision step(std::int64_t now, units cost) {
    std::int64_t t = now;
    // The state holds the start of the window of the newest recorded request.
    if (!history_.empty()) t = std::max(t, floor_div(history_.back().t, w_) * w_);
    const auto admits_at = [&](std::int64_t x) { return count_in(window_of(x)) + cost <= limit_; };

    decision d;
    d.limit = limit_;
    d.allowed = admits_at(t);
    if (d.allowed || count_rejected_) {
      history_.push_back({t, cost});
      d.counted = true;
    }
    d.remaining = std::max<units>(0, limit_ - count_in(window_of(t)));
    if (!d.allowed) {
      if (cost > limit_) {
        d.retry_after = ratelimit::never;
      } else {
        // The count of the window holding x changes only where a window starts.
        std::int64_t x = t + 1;
        while (!admits_at(x)) x = (window_of(x) + 1) * w_;
        d.retry_after = std::chrono::microseconds{x - t};
      }
    }
    // Empty again once x is past the newest recorded request's window.
    if (!history_.empty()) {
      const std::int64_t empty_from = (window_of(history_.back().t) + 1) * w_;
      d.reset_after = std::chrono::microseconds{std::max<std::int64_t>(0, empty_from - t)};
    }
    return d;
  }

 private:
  [[nodiscard]] std::int64_t window_of(std::int64_t x) const { return floor_div(x, w_); }
  [[nodiscard]] units count_in(std::int64_t k) const {
    units n = 0;
    for (const event& e : history_) {
      if (window_of(e.t) == k) n = std::min(count_ceiling, n + e.cost);
    }
    return n;
  }

  units limit_;
  std::int64_t w_;
  bool count_rejected_;
  std::vector<event> history_;
};

/// Sliding log: the costs recorded in (t - W, t].
class sliding_log_model {
 public:
  sliding_log_model(units limit, std::int64_t period_us, bool count_rejected)
      : limit_(limit), w_(period_us), count_rejected_(count_rejected) {}

  decision step(std::int64_t now, units cost) {
    std::int64_t t = now;
    if (!history_.empty()) t = std::max(t, history_.back().t);  // newest entry
    const auto admits_at = [&](std::int64_t x) { return sum_in_window(x) + cost <= limit_; };

    decision d;
    d.limit = limit_;
    d.allowed = admits_at(t);
    if (d.allowed || count_rejected_) {
      history_.push_back({t, cost});
      d.counted = true;
    }
    d.remaining = std::max<units>(0, limit_ - sum_in_window(t));
    if (!d.allowed) {
      if (cost > limit_) {
        d.retry_after = ratelimit::never;
      } else {
        // After t the window's sum only changes when a request leaves it, at
        // its time + W: try each of those moments in order.
        std::vector<std::int64_t> candidates;
        for (const event& e : history_) {
          if (e.t + w_ > t) candidates.push_back(e.t + w_);
        }
        std::sort(candidates.begin(), candidates.end());
        for (const std::int64_t x : candidates) {
          if (admits_at(x)) {
            d.retry_after = std::chrono::microseconds{x - t};
            break;
          }
        }
      }
    }
    if (!history_.empty()) {
      d.reset_after = std::chrono::microseconds{
          std::max<std::int64_t>(0, history_.back().t + w_ - t)};
    }
    return d;
  }

 private:
  [[nodiscard]] units sum_in_window(std::int64_t x) const {
    units n = 0;
    for (const event& e : history_) {
      if (e.t > x - w_ && e.t <= x) n += e.cost;
    }
    return n;
  }

  units limit_;
  std::int64_t w_;
  bool count_rejected_;
  std::vector<event> history_;
};

/// Sliding counter: n_(k-1) * ((W - e) / W) + n_k + c <= limit in IEEE double.
class sliding_counter_model {
 public:
  sliding_counter_model(units limit, std::int64_t period_us, bool count_rejected)
      : limit_(limit), w_(period_us), count_rejected_(count_rejected) {}

  decision step(std::int64_t now, units cost) {
    std::int64_t t = now;
    if (!history_.empty()) t = std::max(t, window_of(history_.back().t) * w_);

    decision d;
    d.limit = limit_;
    d.allowed = passes_at(t, cost);
    if (d.allowed || count_rejected_) {
      history_.push_back({t, cost});
      counts_.clear();
      d.counted = true;
    }
    // Largest m that passes; the test is monotone in m, so bisect [0, limit].
    if (passes_at(t, 1)) {
      d.remaining = bisect_first(0, limit_, [&](std::int64_t m) { return !passes_at(t, m + 1); });
    }
    if (!d.allowed) {
      if (cost > limit_) {
        d.retry_after = ratelimit::never;
      } else {
        // Two windows after t's window both counts are zero, so it passes by then.
        const std::int64_t horizon = (window_of(t) + 2) * w_ - t;
        const auto x = scan_forward(t, horizon, [&](std::int64_t y) { return passes_at(y, cost); });
        d.retry_after = std::chrono::microseconds{x ? *x - t : -1};
      }
    }
    if (!history_.empty()) {
      const std::int64_t empty_from = (window_of(history_.back().t) + 2) * w_;
      d.reset_after = std::chrono::microseconds{std::max<std::int64_t>(0, empty_from - t)};
    }
    return d;
  }

 private:
  [[nodiscard]] std::int64_t window_of(std::int64_t x) const { return floor_div(x, w_); }
  /// Units recorded in window k: a sum over the whole history, remembered
  /// until the history changes (the scan below asks for it once per us).
  [[nodiscard]] units count_in(std::int64_t k) const {
    if (const auto it = counts_.find(k); it != counts_.end()) return it->second;
    units n = 0;
    for (const event& e : history_) {
      if (window_of(e.t) == k) n = std::min(count_ceiling, n + e.cost);
    }
    counts_.emplace(k, n);
    return n;
  }
  [[nodiscard]] bool passes_at(std::int64_t x, units m) const {
    const std::int64_t k = window_of(x);
    const std::int64_t e = x - k * w_;
    // Each step is stored through a volatile so that it is rounded to double
    // on its own, as semantics.md requires (no fused multiply-add).
    const volatile double weight = static_cast<double>(w_ - e) / static_cast<double>(w_);
    const volatile double weighted = static_cast<double>(count_in(k - 1)) * weight;
    const volatile double with_current = weighted + static_cast<double>(count_in(k));
    const volatile double total = with_current + static_cast<double>(m);
    return total <= static_cast<double>(limit_);
  }

  units limit_;
  std::int64_t w_;
  bool count_rejected_;
  std::vector<event> history_;
  mutable std::map<std::int64_t, units> counts_;
};

/// Token bucket: capacity `burst`, refilled by `limit` tokens per `period`,
/// continuously. Tokens are held as tokens x period (an exact integer).
class token_bucket_model {
 public:
  token_bucket_model(units limit, std::int64_t period_us, units burst)
      : limit_(limit), period_(period_us), burst_(burst) {}

  decision step(std::int64_t now, units cost) {
    std::int64_t t = now;
    if (last_admitted_) t = std::max(t, *last_admitted_);
    const int128 need = int128{cost} * period_;
    const auto admits_at = [&](std::int64_t x) { return scaled_tokens_at(x) >= need; };

    decision d;
    d.limit = burst_;
    d.allowed = admits_at(t);
    if (d.allowed) {
      scaled_ = scaled_tokens_at(t) - need;
      last_admitted_ = t;
      d.counted = true;
    }
    d.remaining = static_cast<units>(scaled_tokens_at(t) / period_);
    const std::int64_t to_full = bisect_first(0, time_to_fill_from_empty(), [&](std::int64_t dt) {
      return scaled_tokens_at(t + dt) == capacity();
    });
    if (!d.allowed) {
      d.retry_after = cost > burst_ ? ratelimit::never
                                    : std::chrono::microseconds{bisect_first(
                                          1, std::max<std::int64_t>(1, to_full),
                                          [&](std::int64_t dt) { return admits_at(t + dt); })};
    }
    d.reset_after = std::chrono::microseconds{to_full};
    return d;
  }

 private:
  [[nodiscard]] int128 capacity() const { return int128{burst_} * period_; }
  /// Microseconds that certainly refill an empty bucket.
  [[nodiscard]] std::int64_t time_to_fill_from_empty() const {
    return static_cast<std::int64_t>(capacity() / limit_ + 1);
  }
  [[nodiscard]] int128 scaled_tokens_at(std::int64_t x) const {
    if (!last_admitted_) return capacity();
    const int128 refilled = scaled_ + int128{x - *last_admitted_} * limit_;
    return std::min(refilled, capacity());
  }

  units limit_;
  std::int64_t period_;
  units burst_;
  int128 scaled_ = 0;                          ///< tokens x period at *last_admitted_
  std::optional<std::int64_t> last_admitted_;  ///< empty: a full bucket holding no time
};

/// GCRA: emission interval T = period / limit rounded to the nearest us
/// (halves up); admits iff max(TAT, t) + c*T - t <= burst*T.
class gcra_model {
 public:
  gcra_model(units limit, std::int64_t period_us, units burst)
      : t_(emission_interval(limit, period_us)), burst_(burst) {}

  /// round(period / limit), halves up.
  [[nodiscard]] static std::int64_t emission_interval(units limit, std::int64_t period_us) {
    const std::int64_t whole = period_us / limit;
    const std::int64_t rest = period_us % limit;
    return whole + (2 * rest >= limit ? 1 : 0);
  }

  decision step(std::int64_t t, units cost) {
    const std::int64_t tolerance = burst_ * t_;
    const auto admits = [&](std::int64_t x, units c) {
      return c <= burst_ && std::max(tat_, x) + c * t_ - x <= tolerance;
    };

    decision d;
    d.limit = burst_;
    d.allowed = admits(t, cost);
    if (d.allowed) {
      tat_ = std::max(tat_, t) + cost * t_;
      d.counted = true;
    }
    if (admits(t, 1)) {
      d.remaining = bisect_first(0, burst_, [&](std::int64_t m) { return !admits(t, m + 1); });
    }
    if (!d.allowed) {
      if (cost > burst_) {
        d.retry_after = ratelimit::never;
      } else {
        // Past TAT the request only has to fit the tolerance, which it does.
        const std::int64_t hi = std::max<std::int64_t>(1, tat_ - t + 1);
        d.retry_after = std::chrono::microseconds{
            bisect_first(1, hi, [&](std::int64_t dt) { return admits(t + dt, cost); })};
      }
    }
    d.reset_after = std::chrono::microseconds{std::max<std::int64_t>(0, tat_ - t)};
    return d;
  }

 private:
  std::int64_t t_;
  units burst_;
  std::int64_t tat_ = 0;
};

/// One model per key, created on first use from a factory.
template <class Model>
class keyed {
 public:
  template <class Factory>
  explicit keyed(Factory make) : make_(std::move(make)) {}

  decision step(const std::string& key, std::int64_t now, units cost) {
    auto it = models_.find(key);
    if (it == models_.end()) it = models_.emplace(key, make_()).first;
    return it->second.step(now, cost);
  }

 private:
  std::function<Model()> make_;
  std::map<std::string, Model> models_;
};

}  // namespace ratelimit_test::reference
