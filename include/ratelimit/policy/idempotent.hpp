// SPDX-License-Identifier: Apache-2.0
// idempotent<P>: policy P with the key's request ids kept in the key's own
// state, so that an idempotent check in process is one hash of the key, one
// lock and one node, as a plain check is. Used through idempotent_store<P>
// (store/idempotent_store.hpp); exact rules: docs/semantics.md, "Idempotent
// checks", "Ids kept with their key".
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string_view>
#include <utility>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"

namespace ratelimit {

/// Most ids one key may be configured to hold in an idempotent_store (a
/// key's ids are scanned linearly).
inline constexpr std::size_t max_ids_per_key_limit = 4096;

/// What one call to an `idempotent<P>` state does.
enum class id_op : unsigned char {
  plain,  ///< a check without an id: P alone, the ids untouched
  once,   ///< a check with an id (its fingerprint in the config)
  reset,  ///< forget P's state, keep the ids (limiter::reset)
};

/// Policy P whose state also holds the key's request ids (see file comment).
/// The config is per call: P's config, what to do, and for a check with an
/// id its fingerprint (SipHash-1-3, 128-bit output, of which 96 bits are
/// kept), retention and the key's cap on ids.
template <policy P>
struct idempotent {
  static constexpr std::string_view name = P::name;
  using base_config = typename P::config;
  using base_state = typename P::state;

  /// One call. Cheap to copy (a pointer and a few words); P's config must
  /// outlive it.
  class config {
   public:
    using policy_type = idempotent;
    /// A plain check or a reset of `base`.
    config(const base_config& base, id_op op) noexcept : base_(&base), op_(op) {}
    /// A check with an id whose fingerprint is (fa, fb); fb's low 32 bits are
    /// kept. `stamped` is the check's own time, from which the id's retention
    /// runs: a store may decide a key it does not hold at a later time (see
    /// memory_store's reclaim rule), but the id was still sent at `stamped`.
    config(const base_config& base, std::uint64_t fa, std::uint64_t fb,
           std::chrono::microseconds retention, std::size_t max_per_key, timestamp stamped) noexcept
        : base_(&base),
          op_(id_op::once),
          fa_(fa),
          fb_(fb),
          retention_(retention.count()),
          stamped_(stamped.count()),
          max_per_key_(static_cast<std::uint32_t>(max_per_key)) {}
    [[nodiscard]] units limit() const noexcept { return base_->limit(); }
    [[nodiscard]] const base_config& base() const noexcept { return *base_; }
    [[nodiscard]] id_op op() const noexcept { return op_; }
    [[nodiscard]] std::uint64_t fa() const noexcept { return fa_; }
    [[nodiscard]] std::uint32_t fb() const noexcept { return static_cast<std::uint32_t>(fb_); }
    [[nodiscard]] std::int64_t retention_us() const noexcept { return retention_; }
    [[nodiscard]] std::int64_t stamped_us() const noexcept { return stamped_; }
    [[nodiscard]] std::size_t max_per_key() const noexcept { return max_per_key_; }

   private:
    const base_config* base_;
    id_op op_;
    std::uint64_t fa_ = 0;
    std::uint64_t fb_ = 0;
    std::int64_t retention_ = 0;
    std::int64_t stamped_ = 0;
    std::uint32_t max_per_key_ = 0;
  };

  /// One id of a key: 96 bits of its fingerprint, the end of its retention
  /// and the decision of its first check. 56 bytes.
  struct id_record {
    std::uint64_t fa = 0;  ///< the fingerprint's first 64 bits
    std::uint32_t fb = 0;  ///< and 32 more
    bool allowed = false;
    bool counted = false;
    decision_source source = decision_source::store;
    std::int64_t until = 0;  ///< the end of the retention, microseconds
    units limit = 0;
    units remaining = 0;
    std::int64_t retry_after = 0;
    std::int64_t reset_after = 0;

    [[nodiscard]] decision first() const noexcept {
      decision d;
      d.allowed = allowed;
      d.counted = counted;
      d.source = source;
      d.limit = limit;
      d.remaining = remaining;
      d.retry_after = std::chrono::microseconds{retry_after};
      d.reset_after = std::chrono::microseconds{reset_after};
      return d;
    }
    void set(std::uint64_t a, std::uint32_t b, std::int64_t end, const decision& d) noexcept {
      fa = a;
      fb = b;
      until = end;
      limit = d.limit;
      remaining = d.remaining;
      retry_after = d.retry_after.count();
      reset_after = d.reset_after.count();
      allowed = d.allowed;
      counted = d.counted;
      source = d.source;
    }
    friend bool operator==(const id_record&, const id_record&) = default;
  };

  static_assert(sizeof(id_record) == 56);

  /// Ids held inline in the state before the key takes a heap block.
  static constexpr std::size_t inline_ids = 2;

  /// P's state and the key's ids: `inline_ids` records in place, more in
  /// one heap block that grows by doubling up to the key's cap. A record is
  /// dropped (its place reused) one retention after its own ended, `grace`
  /// being the longest retention recorded in the state; value-initialised =
  /// key never seen.
  class state {
   public:
    base_state inner{};

    state() noexcept = default;
    /// @throws std::bad_alloc
    state(const state& o) : inner(o.inner), grace_(o.grace_), count_(o.count_), first_(o.first_) {
      if (o.more_ != nullptr) {  // the same capacity, so that a copy grows as the original
        more_ = new id_record[o.capacity_];
        if (o.count_ > inline_ids) std::copy(o.more_, o.more_ + (o.count_ - inline_ids), more_);
        capacity_ = o.capacity_;
      }
    }
    state(state&& o) noexcept
        : inner(std::move(o.inner)),
          grace_(o.grace_),
          count_(std::exchange(o.count_, 0)),
          capacity_(std::exchange(o.capacity_, 0)),
          first_(o.first_),
          more_(std::exchange(o.more_, nullptr)) {}
    state& operator=(const state& o) {
      if (this != &o) {
        state copy(o);
        swap(copy);
      }
      return *this;
    }
    state& operator=(state&& o) noexcept {
      if (this != &o) {
        state taken(std::move(o));
        swap(taken);
      }
      return *this;
    }
    ~state() { delete[] more_; }

    void swap(state& o) noexcept {
      using std::swap;
      swap(inner, o.inner);
      swap(grace_, o.grace_);
      swap(count_, o.count_);
      swap(capacity_, o.capacity_);
      swap(first_, o.first_);
      swap(more_, o.more_);
    }

    /// Ids held, ended ones waiting to be dropped included.
    [[nodiscard]] std::size_t ids() const noexcept { return count_; }
    /// Heap block capacity in records (0 while the ids fit inline).
    [[nodiscard]] std::size_t heap_records() const noexcept { return capacity_; }
    [[nodiscard]] std::int64_t grace() const noexcept { return grace_; }

    [[nodiscard]] id_record& at(std::size_t i) noexcept {
      return i < inline_ids ? first_[i] : more_[i - inline_ids];
    }
    [[nodiscard]] const id_record& at(std::size_t i) const noexcept {
      return i < inline_ids ? first_[i] : more_[i - inline_ids];
    }

    /// The index of the record of (fa, fb), or ids() when none.
    [[nodiscard]] std::size_t find(std::uint64_t fa, std::uint32_t fb) const noexcept {
      const std::size_t n = count_;
      for (std::size_t i = 0; i < n; ++i) {
        const id_record& r = at(i);
        if (r.fa == fa && r.fb == fb) return i;
      }
      return n;
    }

    /// What one pass over the records finds for an id at `now`: the index
    /// of its record (`held`, ids() when none) and, when it has none, the
    /// first record droppable at `now` in storage order (`free`, ids()
    /// when none), in one pass.
    struct lookup_result {
      std::size_t held;
      std::size_t free;
    };
    [[nodiscard]] lookup_result lookup(std::uint64_t fa, std::uint32_t fb,
                                       std::int64_t now) const noexcept {
      const std::size_t n = count_;
      const std::int64_t upto = now - grace_;
      std::size_t free = n;
      const std::size_t in_node = std::min<std::size_t>(n, inline_ids);
      for (std::size_t i = 0; i < in_node; ++i) {
        const id_record& r = first_[i];
        if (r.fa == fa && r.fb == fb) return {i, n};
        if (free == n && r.until <= upto) free = i;
      }
      for (std::size_t i = inline_ids; i < n; ++i) {
        const id_record& r = more_[i - inline_ids];
        if (r.fa == fa && r.fb == fb) return {i, n};
        if (free == n && r.until <= upto) free = i;
      }
      return {n, free};
    }

    /// The place for a new record under a cap of `cap` ids when no record
    /// is droppable (lookup() found none, else its `free` is the place): a
    /// new one (growing the heap block; on std::bad_alloc nothing changed),
    /// else at the cap the record whose retention ends first (the first
    /// such in storage order).
    [[nodiscard]] std::size_t place_when_none_droppable(std::size_t cap) {
      if (count_ < cap) {
        if (count_ >= inline_ids && count_ - inline_ids == capacity_) grow(cap);
        return count_;  // one past the end: the caller appends
      }
      std::size_t victim = 0;
      for (std::size_t i = 1; i < count_; ++i) {
        if (at(i).until < at(victim).until) victim = i;
      }
      return victim;
    }

    /// Whether every record is droppable at `now`.
    [[nodiscard]] bool ids_idle(std::int64_t now) const noexcept {
      for (std::size_t i = 0; i < count_; ++i) {
        if (!droppable(at(i), now)) return false;
      }
      return true;
    }

    /// Writes the record at `i` (a place from lookup() or
    /// place_when_none_droppable()); noexcept.
    void write(std::size_t i, std::uint64_t fa, std::uint32_t fb, std::int64_t until,
               std::int64_t retention, const decision& d) noexcept {
      if (i == count_) ++count_;
      at(i).set(fa, fb, until, d);
      grace_ = std::max(grace_, retention);
    }

    friend bool operator==(const state& a, const state& b) noexcept {
      if (!(a.inner == b.inner) || a.count_ != b.count_ || a.grace_ != b.grace_) return false;
      for (std::size_t i = 0; i < a.count_; ++i) {
        if (!(a.at(i) == b.at(i))) return false;
      }
      return true;
    }

   private:
    [[nodiscard]] bool droppable(const id_record& r, std::int64_t now) const noexcept {
      // until + grace <= now, without overflow (until may be max).
      return r.until <= now - grace_;
    }

    void grow(std::size_t cap) {
      const std::size_t most = cap - inline_ids;
      const std::size_t next = std::min<std::size_t>(most, capacity_ == 0 ? 2 : 2 * capacity_);
      auto* fresh = new id_record[next];  // may throw: nothing changed
      std::copy(more_, more_ + (count_ - inline_ids), fresh);
      delete[] more_;
      more_ = fresh;
      capacity_ = static_cast<std::uint32_t>(next);
    }

    std::int64_t grace_ = 0;
    std::uint32_t count_ = 0;
    std::uint32_t capacity_ = 0;
    std::array<id_record, inline_ids> first_{};
    id_record* more_ = nullptr;
  };

  static decision step(const config& c, state& s, timestamp now, units cost) {
    return run<false>(c, s, now, cost);
  }
  /// access::force (shadow mode): the first check of an id is forced and
  /// records the policy's own decision.
  static decision force(const config& c, state& s, timestamp now, units cost)
    requires forcible_policy<P>
  {
    return run<true>(c, s, now, cost);
  }

  /// access::peek (memory_store calls it on the held state itself): the
  /// decision `step` would return, reading the ids in place and stepping a
  /// copy of P's state only, so that a peek never copies the key's heap
  /// block of ids.
  static decision peek(const config& c, const state& s, timestamp now, units cost) {
    if (c.op() == id_op::reset) return decision{};
    if (c.op() == id_op::once) {
      const std::size_t held = s.find(c.fa(), c.fb());
      if (held != s.ids() && now.count() < s.at(held).until) {
        decision d = s.at(held).first();
        d.repeat = true;
        return d;
      }
    }
    base_state copy = s.inner;
    return P::step(c.base(), copy, now, cost);
  }

  /// Idle when P's state is and every id was dropped (one retention after
  /// its own ended).
  static bool idle(const config& c, const state& s, timestamp now) noexcept {
    return P::idle(c.base(), s.inner, now) && s.ids_idle(now.count());
  }

 private:
  template <bool Forced>
  static decision base_step(const config& c, state& s, timestamp now, units cost) {
    if constexpr (Forced) {
      return P::force(c.base(), s.inner, now, cost);
    } else {
      return P::step(c.base(), s.inner, now, cost);
    }
  }

  template <bool Forced>
  static decision run(const config& c, state& s, timestamp now, units cost) {
    if (c.op() == id_op::plain) [[likely]]
      return base_step<Forced>(c, s, now, cost);
    if (c.op() == id_op::reset) {
      s.inner = base_state{};
      return decision{};
    }
    const std::int64_t t = now.count();
    const auto [held, free] = s.lookup(c.fa(), c.fb(), t);
    if (held != s.ids() && t < s.at(held).until) {
      decision d = s.at(held).first();
      d.repeat = true;
      return d;
    }
    // A new request: the same id after its retention (its record is
    // rewritten) or an id the key does not hold.
    // Its retention runs from the check's own time, which is `now` except
    // for a key the store did not hold, decided at the store's last
    // reclaim if that was later (memory_store's reclaim rule): the id was
    // sent at its stamp, and its retention ends as for the other stores.
    const std::int64_t r = c.retention_us();
    const std::size_t place = held != s.ids()   ? held
                              : free != s.ids() ? free
                                                : s.place_when_none_droppable(c.max_per_key());
    const decision d = base_step<Forced>(c, s, now, cost);
    const std::int64_t from = std::min(t, c.stamped_us());
    const std::int64_t until = from > max_time_us - r ? max_time_us : from + r;
    s.write(place, c.fa(), c.fb(), until, r, d);
    return d;
  }

  static constexpr std::int64_t max_time_us = std::chrono::microseconds::max().count();
};

}  // namespace ratelimit
