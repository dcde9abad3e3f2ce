// SPDX-License-Identifier: Apache-2.0
// Metrics for any store: a decorator timing each check for an observer, and Prometheus counters.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"

namespace ratelimit {

/// What an observer learns about one store call besides its decision.
struct observation {
  /// `P::name` of the policy applied ("sliding_log", "compound", ...).
  std::string_view policy;
  /// The key, only for observers that opt in with `wants_key` (keys may be
  /// personal data, and a label per key explodes a metrics system); else empty.
  std::string_view key;
  /// consume (a real check), peek, or force (a shadow-mode check: recorded
  /// as admitted whatever the decision says).
  access mode = access::consume;
  /// Units the request asked for.
  units cost = 1;
  /// Wall time the wrapped store took, measured with std::chrono::steady_clock.
  std::chrono::nanoseconds latency{0};
};

/// Receives one call per store call made through `observed_store`:
/// - `o.on_decision(const observation&, const decision&)` after every call
///   that returned a decision;
/// - optionally `o.on_error(const observation&)` when the wrapped store threw
///   (a `store_error`, say); the exception is then rethrown unchanged;
/// - optionally `static constexpr bool wants_key = true;` to receive keys in
///   `observation::key` (off by default).
/// Called on the checking thread, concurrently when the store is shared, so
/// an observer must be thread-safe; it should be fast and must not throw.
/// Model: basic_metrics.
template <class O>
concept decision_observer = requires(O& o, const observation& obs, const decision& d) {
  o.on_decision(obs, d);
};

/// An observer held by value, or a handle to one: a raw or smart pointer, or
/// a std::reference_wrapper (so that one `basic_metrics`, which cannot move,
/// can serve a store that must).
template <class H>
concept observer_handle = decision_observer<H> || requires(H& h) {
  requires decision_observer<std::remove_reference_t<decltype(*h)>>;
} || requires(H& h) {
  { h.get() } -> std::same_as<std::remove_cvref_t<decltype(h.get())>&>;
  requires decision_observer<std::remove_cvref_t<decltype(h.get())>>;
};

namespace detail {

/// The observer a handle designates.
template <observer_handle H>
[[nodiscard]] constexpr auto& observer_of(H& h) noexcept {
  if constexpr (decision_observer<H>) {
    return h;
  } else if constexpr (requires { *h; }) {
    return *h;
  } else {
    return h.get();
  }
}

template <class O>
[[nodiscard]] constexpr bool observer_wants_key() noexcept {
  if constexpr (requires { O::wants_key; }) {
    return static_cast<bool>(O::wants_key);
  } else {
    return false;
  }
}

}  // namespace detail

/// Wraps a store and reports every call's decision and latency to an
/// observer. Models `store_for<observed_store<S, O>, P>` whenever S models
/// `store_for<S, P>` (and the store-clock form when S has it), so it drops
/// into `limiter` unchanged: `limiter<P, observed_store<memory_store<P>,
/// basic_metrics*>>`. Adds two steady_clock reads per call and no allocation.
///
/// Thread safety: as safe as the wrapped store and the observer together.
template <class Store, observer_handle Observer>
class observed_store {
 public:
  using store_type = Store;
  using observer_type = Observer;

  /// @param inner    the store doing the work (moved in)
  /// @param observer the observer, or a pointer / reference_wrapper to one
  observed_store(Store inner, Observer observer)
      : inner_(std::move(inner)), observer_(std::move(observer)) {}

  /// Forwards to the wrapped store at `now`, timing the call.
  template <class Config>
    requires requires(Store& s, const Config& c, std::string_view k, timestamp t, units u,
                      access a) {
      { s.apply(c, k, t, u, a) } -> std::same_as<decision>;
    }
  decision apply(const Config& cfg, std::string_view key, timestamp now, units cost, access a) {
    return observe(Config::policy_type::name, key, cost, a,
                   [&] { return inner_.apply(cfg, key, now, cost, a); });
  }

  /// Forwards to the wrapped store, which reads its own clock, timing the call.
  template <class Config>
    requires requires(Store& s, const Config& c, std::string_view k, units u, access a) {
      { s.apply(c, k, store_time, u, a) } -> std::same_as<decision>;
    }
  decision apply(const Config& cfg, std::string_view key, store_time_t, units cost, access a) {
    return observe(Config::policy_type::name, key, cost, a,
                   [&] { return inner_.apply(cfg, key, store_time, cost, a); });
  }

  /// Forwards the wrapped store's config check (limiter's constructor calls it).
  template <class Config>
    requires requires(const Store& s, const Config& c) { s.check_config(c); }
  void check_config(const Config& cfg) const {
    inner_.check_config(cfg);
  }

  /// Forwards `reset` (not observed: it decides nothing).
  template <class Config>
    requires requires(Store& s, const Config& c, std::string_view k) { s.reset(c, k); }
  void reset(const Config& cfg, std::string_view key) {
    inner_.reset(cfg, key);
  }

  /// The wrapped store (for `sweep`, `size` and the like).
  [[nodiscard]] Store& inner() noexcept { return inner_; }
  [[nodiscard]] const Store& inner() const noexcept { return inner_; }
  /// The observer (dereferenced when held through a handle).
  [[nodiscard]] auto& observer() noexcept { return detail::observer_of(observer_); }

 private:
  template <class Call>
  decision observe(std::string_view policy_name, std::string_view key, units cost, access a,
                   Call call) {
    auto& target = detail::observer_of(observer_);
    using target_type = std::remove_cvref_t<decltype(target)>;
    observation obs;
    obs.policy = policy_name;
    if constexpr (detail::observer_wants_key<target_type>()) obs.key = key;
    obs.mode = a;
    obs.cost = cost;
    const auto start = std::chrono::steady_clock::now();
    decision d;
    try {
      d = call();
    } catch (...) {
      obs.latency = std::chrono::steady_clock::now() - start;
      if constexpr (requires { target.on_error(obs); }) target.on_error(obs);
      throw;
    }
    obs.latency = std::chrono::steady_clock::now() - start;
    target.on_decision(obs, d);
    return d;
  }

  Store inner_;
  Observer observer_;
};

/// A ready observer: lock-free counters and a fixed-bucket latency histogram,
/// written in the Prometheus text exposition format.
///
/// Counts, for consume and force calls (real checks): allowed, rejected,
/// shadow_rejected (a forced call the policy, or a failure policy, rejected:
/// the request went ahead, so it is not counted as rejected), degraded by
/// source (`decision::degraded()`: fail_open, fail_closed, fallback) and
/// cache hits (`source == local_cache`); for all calls: peeks, errors (the
/// store threw), and the latency of every call, returned or thrown, in
/// buckets of 250 ns x 2^k up to about 1.05 s, then +Inf.
///
/// Thread safety: every member function may be called concurrently; a
/// reading is not one atomic snapshot, but each histogram is self-consistent
/// (its +Inf bucket equals its count). Neither copyable nor movable: share it
/// through a pointer or std::ref.
class basic_metrics {
 public:
  /// Finite histogram buckets: upper bounds 250 ns x 2^k, k = 0 .. 22.
  static constexpr std::size_t finite_buckets = 23;
  static constexpr std::int64_t first_bound_ns = 250;

  /// Upper bound of finite bucket `i` (< finite_buckets).
  [[nodiscard]] static constexpr std::chrono::nanoseconds bucket_bound(std::size_t i) noexcept {
    return std::chrono::nanoseconds{first_bound_ns << i};
  }

  /// Index of the bucket holding `latency` (finite_buckets = only +Inf).
  [[nodiscard]] static constexpr std::size_t bucket_of(std::chrono::nanoseconds latency) noexcept {
    const std::int64_t ns = latency.count();
    if (ns <= first_bound_ns) return 0;
    // Smallest k with ns <= 250 * 2^k: k = ceil(log2(ceil(ns / 250))).
    const auto q = static_cast<std::uint64_t>((ns + first_bound_ns - 1) / first_bound_ns);
    const auto k = static_cast<std::size_t>(std::bit_width(q - 1));
    return k < finite_buckets ? k : finite_buckets;
  }

  /// A reading of every counter.
  struct reading {
    std::uint64_t allowed = 0;
    std::uint64_t rejected = 0;
    /// Forced (shadow-mode) checks that would have been rejected.
    std::uint64_t shadow_rejected = 0;
    std::uint64_t fail_open = 0;
    std::uint64_t fail_closed = 0;
    std::uint64_t fallback = 0;
    std::uint64_t cache_hits = 0;
    std::uint64_t peeks = 0;
    std::uint64_t errors = 0;
    /// Calls per bucket, not cumulative; the last one is above every finite bound.
    std::array<std::uint64_t, finite_buckets + 1> buckets{};
    std::uint64_t latency_sum_ns = 0;

    /// Calls timed (the histogram's count).
    [[nodiscard]] std::uint64_t timed() const noexcept {
      std::uint64_t n = 0;
      for (const std::uint64_t b : buckets) n += b;
      return n;
    }
    /// Consume calls decided without the store (`decision::degraded()`).
    [[nodiscard]] std::uint64_t degraded() const noexcept {
      return fail_open + fail_closed + fallback;
    }
  };

  basic_metrics() = default;
  basic_metrics(const basic_metrics&) = delete;
  basic_metrics& operator=(const basic_metrics&) = delete;
  ~basic_metrics() = default;

  /// Records one decision (the `decision_observer` hook).
  void on_decision(const observation& obs, const decision& d) noexcept {
    time(obs.latency);
    if (obs.mode == access::peek) {
      bump(peeks_);
      return;
    }
    if (d.allowed) {
      bump(d.shadow_rejected ? shadow_rejected_ : allowed_);
    } else {
      bump(obs.mode == access::force ? shadow_rejected_ : rejected_);
    }
    switch (d.source) {
      case decision_source::fail_open: bump(fail_open_); break;
      case decision_source::fail_closed: bump(fail_closed_); break;
      case decision_source::fallback: bump(fallback_); break;
      case decision_source::local_cache: bump(cache_hits_); break;
      case decision_source::store: break;
    }
  }

  /// Records a call that threw (the optional `decision_observer` hook).
  void on_error(const observation& obs) noexcept {
    time(obs.latency);
    bump(errors_);
  }

  /// Reads every counter (relaxed; see the class comment).
  [[nodiscard]] reading read() const noexcept {
    reading r;
    r.allowed = load(allowed_);
    r.rejected = load(rejected_);
    r.shadow_rejected = load(shadow_rejected_);
    r.fail_open = load(fail_open_);
    r.fail_closed = load(fail_closed_);
    r.fallback = load(fallback_);
    r.cache_hits = load(cache_hits_);
    r.peeks = load(peeks_);
    r.errors = load(errors_);
    for (std::size_t i = 0; i < buckets_.size(); ++i) r.buckets[i] = load(buckets_[i]);
    r.latency_sum_ns = load(latency_sum_ns_);
    return r;
  }

  /// Writes every metric in the Prometheus text exposition format (version
  /// 0.0.4), each series labelled `store="<store_label>"`. To expose several
  /// stores in one scrape, use the free `write_prometheus` (each metric family
  /// must appear once).
  void write_prometheus(std::ostream& out, std::string_view store_label) const;

 private:
  using counter = std::atomic<std::uint64_t>;
  static_assert(counter::is_always_lock_free);

  static void bump(counter& c) noexcept { c.fetch_add(1, std::memory_order_relaxed); }
  [[nodiscard]] static std::uint64_t load(const counter& c) noexcept {
    return c.load(std::memory_order_relaxed);
  }
  void time(std::chrono::nanoseconds latency) noexcept {
    bump(buckets_[bucket_of(latency)]);
    const std::int64_t ns = latency.count();
    latency_sum_ns_.fetch_add(ns > 0 ? static_cast<std::uint64_t>(ns) : 0,
                              std::memory_order_relaxed);
  }

  counter allowed_{0};
  counter rejected_{0};
  counter shadow_rejected_{0};
  counter fail_open_{0};
  counter fail_closed_{0};
  counter fallback_{0};
  counter cache_hits_{0};
  counter peeks_{0};
  counter errors_{0};
  std::array<counter, finite_buckets + 1> buckets_{};
  counter latency_sum_ns_{0};
};

/// One store's metrics and the value of its `store` label.
struct labelled_metrics {
  std::string_view store;
  const basic_metrics& metrics;
};

namespace detail {

/// `s` escaped for a label value: backslash, double quote and line feed.
[[nodiscard]] inline std::string escape_label(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

/// Nanoseconds as exact decimal seconds ("0.00000025", "1.048576", "0").
[[nodiscard]] inline std::string seconds_text(std::uint64_t ns) {
  std::string out = std::to_string(ns / 1'000'000'000U);
  std::uint64_t frac = ns % 1'000'000'000U;
  if (frac == 0) return out;
  std::string digits = std::to_string(frac);
  digits.insert(0, 9 - digits.size(), '0');
  while (digits.back() == '0') digits.pop_back();
  return out + "." + digits;
}

inline void write_family_header(std::ostream& out, std::string_view name, std::string_view type,
                                std::string_view help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace detail

/// Writes the metrics of several stores as one exposition: each metric
/// family once, one series per store (and result, source, bucket).
inline void write_prometheus(std::ostream& out, std::initializer_list<labelled_metrics> sources) {
  struct row {
    std::string store;
    basic_metrics::reading r;
  };
  std::vector<row> rows;
  rows.reserve(sources.size());
  for (const labelled_metrics& s : sources) {
    rows.push_back({detail::escape_label(s.store), s.metrics.read()});
  }

  detail::write_family_header(out, "ratelimit_checks_total", "counter",
                              "Checks decided (consume and shadow-mode calls), by result.");
  for (const row& x : rows) {
    out << "ratelimit_checks_total{store=\"" << x.store << "\",result=\"allowed\"} " << x.r.allowed
        << '\n';
    out << "ratelimit_checks_total{store=\"" << x.store << "\",result=\"rejected\"} "
        << x.r.rejected << '\n';
    out << "ratelimit_checks_total{store=\"" << x.store << "\",result=\"shadow_rejected\"} "
        << x.r.shadow_rejected << '\n';
  }
  detail::write_family_header(
      out, "ratelimit_degraded_total", "counter",
      "Checks decided without the store (fail_open, fail_closed, fallback), by source.");
  for (const row& x : rows) {
    const std::pair<std::string_view, std::uint64_t> by_source[] = {
        {"fail_open", x.r.fail_open}, {"fail_closed", x.r.fail_closed}, {"fallback", x.r.fallback}};
    for (const auto& [source, n] : by_source) {
      out << "ratelimit_degraded_total{store=\"" << x.store << "\",source=\"" << source << "\"} "
          << n << '\n';
    }
  }
  detail::write_family_header(out, "ratelimit_cache_hits_total", "counter",
                              "Checks answered by a locally cached rejection.");
  for (const row& x : rows) {
    out << "ratelimit_cache_hits_total{store=\"" << x.store << "\"} " << x.r.cache_hits << '\n';
  }
  detail::write_family_header(out, "ratelimit_peeks_total", "counter",
                              "Peek calls (decisions that consume nothing).");
  for (const row& x : rows) {
    out << "ratelimit_peeks_total{store=\"" << x.store << "\"} " << x.r.peeks << '\n';
  }
  detail::write_family_header(out, "ratelimit_store_errors_total", "counter",
                              "Store calls that threw (the error was rethrown to the caller).");
  for (const row& x : rows) {
    out << "ratelimit_store_errors_total{store=\"" << x.store << "\"} " << x.r.errors << '\n';
  }
  detail::write_family_header(out, "ratelimit_check_duration_seconds", "histogram",
                              "Time the store took per call, consume or peek, returned or thrown.");
  for (const row& x : rows) {
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < basic_metrics::finite_buckets; ++i) {
      cumulative += x.r.buckets[i];
      const auto bound = static_cast<std::uint64_t>(basic_metrics::bucket_bound(i).count());
      out << "ratelimit_check_duration_seconds_bucket{store=\"" << x.store << "\",le=\""
          << detail::seconds_text(bound) << "\"} " << cumulative << '\n';
    }
    cumulative += x.r.buckets[basic_metrics::finite_buckets];
    out << "ratelimit_check_duration_seconds_bucket{store=\"" << x.store << "\",le=\"+Inf\"} "
        << cumulative << '\n';
    out << "ratelimit_check_duration_seconds_sum{store=\"" << x.store << "\"} "
        << detail::seconds_text(x.r.latency_sum_ns) << '\n';
    out << "ratelimit_check_duration_seconds_count{store=\"" << x.store << "\"} " << cumulative
        << '\n';
  }
}

inline void basic_metrics::write_prometheus(std::ostream& out, std::string_view store_label) const {
  ratelimit::write_prometheus(out, {labelled_metrics{store_label, *this}});
}

}  // namespace ratelimit
