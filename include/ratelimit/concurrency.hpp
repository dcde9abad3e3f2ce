// SPDX-License-Identifier: Apache-2.0
// Concurrency limits with leases: "at most 5 calls in progress per subscriber".
//
// A key holds up to N live leases, each named by a lease id the caller picks
// (a SIP dialog's Call-ID, a request id) and each expiring at most
// `max_duration` after it was granted or last renewed, so a lost BYE cannot
// hold a slot forever. `acquire` grants a lease or rejects with the time until
// the earliest live lease expires; `release` frees one; `renew` extends one.
// Optionally a rate policy R is applied by the same acquire, all or nothing:
// "at most 5 calls in progress and 10 calls per 15 minutes" is one check that
// consumes from neither when either refuses.
//
// The lease set is a policy in the sense of concepts.hpp (`leases<R>`), whose
// per-call config (`leases<R>::config`) carries the operation and the lease
// id, so memory_store, redis_store and cluster_store run it unchanged: one
// critical section per operation in process, one Lua script in Redis
// (redis/scripts/leases.hpp). `concurrency_limiter` is the front end.
// Exact rules: docs/semantics.md, "Concurrency limits (leases)".
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/limiter_name.hpp"
#include "ratelimit/detail/validate.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace ratelimit {

/// Most live leases one key may be configured to hold (a key's leases are
/// scanned linearly in process).
inline constexpr units max_leases = 65536;
/// Longest lease id in bytes (binary safe: any bytes, NUL included).
inline constexpr std::size_t max_lease_id_bytes = 256;

/// Options of a concurrency limit.
struct concurrency_options {
  /// The limiter's name, its identity in shared stores: 1..64 bytes of
  /// [A-Za-z0-9_.-], or empty (unnamed; the Redis stores refuse it).
  std::string name = {};
};

/// N live leases per key, each for at most `max_duration`.
/// Thread safety: immutable.
class concurrency_config {
 public:
  /// @param max_live     leases live at once per key, 1 .. max_leases
  /// @param max_duration lifetime of a lease from its grant or last renewal,
  ///                     1 us .. max_period (2^46 us)
  /// @throws std::invalid_argument naming the bad value (or a bad name)
  concurrency_config(units max_live, std::chrono::microseconds max_duration,
                     concurrency_options o = {})
      : limit_(max_live), duration_(max_duration), name_(std::move(o.name)) {
    if (limit_ < 1 || limit_ > max_leases) {
      throw std::invalid_argument("ratelimit: concurrency limit must be in 1.." +
                                  std::to_string(max_leases) + ", got " + std::to_string(limit_));
    }
    if (duration_.count() < 1 || duration_ > max_period) {
      throw std::invalid_argument("ratelimit: lease duration must be in 1.." +
                                  std::to_string(max_period.count()) + "us, got " +
                                  std::to_string(duration_.count()) + "us");
    }
    detail::check_name(name_);
  }

  /// Leases live at once per key (N).
  [[nodiscard]] units limit() const noexcept { return limit_; }
  /// Longest life of a lease from its grant or last renewal.
  [[nodiscard]] std::chrono::microseconds max_duration() const noexcept { return duration_; }
  /// The limiter's name (concurrency_options::name), empty when unnamed.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  units limit_;
  std::chrono::microseconds duration_;
  std::string name_;
};

/// The rate part of `leases<no_rate>`: none.
struct no_rate {};

/// What one call to a lease limiter does.
enum class lease_op : unsigned char {
  none,     ///< nothing (sweeps and resets)
  acquire,  ///< grant a lease (or find it already live)
  release,  ///< free a live lease
  renew,    ///< extend a live lease to now + max_duration
};

namespace detail {

/// @throws std::invalid_argument for an empty lease id or one over max_lease_id_bytes
inline void check_lease_id(std::string_view id) {
  if (id.size() - 1 >= max_lease_id_bytes) {
    if (id.empty()) throw std::invalid_argument("ratelimit: lease id must not be empty");
    throw std::invalid_argument("ratelimit: lease id of " + std::to_string(id.size()) +
                                " bytes exceeds the maximum of " +
                                std::to_string(max_lease_id_bytes) + " bytes");
  }
}

/// The rate policy's config, or nothing.
template <class R>
struct rate_config_of {
  using type = typename R::config;
};
template <>
struct rate_config_of<no_rate> {
  using type = no_rate;
};
template <class R>
struct rate_state_of {
  using type = typename R::state;
};
template <>
struct rate_state_of<no_rate> {
  using type = no_rate;
};

}  // namespace detail

/// The lease set of one key as a policy: `leases<>` alone, or `leases<R>` with
/// the rate policy R applied by every acquire (all or nothing). Any of the
/// five policies may be R, without `count_rejected` (a refused acquire
/// consumes nothing from the rate).
template <class R = no_rate>
struct leases {
  static constexpr std::string_view name = "leases";
  static constexpr bool rated = !std::is_same_v<R, no_rate>;
  using rate_config = typename detail::rate_config_of<R>::type;
  using rate_state = typename detail::rate_state_of<R>::type;

  /// The limiter's configuration: the lease limit and, if any, the rate.
  /// Thread safety: immutable.
  class settings {
   public:
    /// The rate's own name plays no part: the limiter is named by `c`.
    /// @throws std::invalid_argument for a rate that counts rejected attempts
    explicit settings(concurrency_config c, rate_config r = {})
        : conc_(std::move(c)), rate_(std::move(r)) {
      if constexpr (rated) {
        if (detail::counts_rejected(rate_)) {
          throw std::invalid_argument(
              "ratelimit: the rate of a concurrency limiter must not count rejected attempts "
              "(a refused acquire consumes nothing)");
        }
      }
    }
    [[nodiscard]] const concurrency_config& concurrency() const noexcept { return conc_; }
    [[nodiscard]] const rate_config& rate() const noexcept { return rate_; }

   private:
    concurrency_config conc_;
    rate_config rate_;
  };

  /// One operation: the settings, what to do and the lease id. Cheap to copy
  /// (a pointer and a view); the policy concept's `config`. The settings and
  /// the id must outlive it, except in a config made by `owning`.
  class config {
   public:
    using policy_type = leases;
    config(const settings& s, lease_op op, std::string_view id) noexcept
        : s_(&s), op_(op), id_(id) {}
    /// A config that owns its settings (the Redis stores' fallback limiter).
    [[nodiscard]] static config owning(settings s) {
      auto held = std::make_shared<const settings>(std::move(s));
      config c(*held, lease_op::none, {});
      c.held_ = std::move(held);
      return c;
    }
    /// The same settings with another operation and lease id.
    [[nodiscard]] config with(lease_op op, std::string_view id) const {
      config c = *this;
      c.op_ = op;
      c.id_ = id;
      return c;
    }
    /// N, the concurrency limit.
    [[nodiscard]] units limit() const noexcept { return s_->concurrency().limit(); }
    [[nodiscard]] const std::string& name() const noexcept { return s_->concurrency().name(); }
    [[nodiscard]] const settings& get_settings() const noexcept { return *s_; }
    [[nodiscard]] lease_op op() const noexcept { return op_; }
    [[nodiscard]] std::string_view lease_id() const noexcept { return id_; }

   private:
    const settings* s_;
    lease_op op_;
    std::string_view id_;
    std::shared_ptr<const settings> held_;
  };

  /// One live (or not yet dropped) lease: its id and its expiry, 24 bytes.
  /// An id of up to 15 bytes is held inline, so that granting and freeing it
  /// neither allocates nor calls into the string library; a longer one is
  /// one heap block (as a std::string would hold it).
  class lease {
   public:
    std::int64_t expiry = 0;  ///< microseconds; live while expiry > t; 0 = no lease

    lease() noexcept { std::memset(buf_, 0, sizeof buf_); }
    lease(const lease& o) : expiry(o.expiry) {
      std::memset(buf_, 0, sizeof buf_);
      assign(o.id());
    }
    lease(lease&& o) noexcept : expiry(o.expiry), last_(o.last_) {
      std::memcpy(buf_, o.buf_, sizeof buf_);
      o.last_ = 0;  // o keeps no heap block
    }
    lease& operator=(const lease& o) {
      if (this != &o) {
        assign(o.id());
        expiry = o.expiry;
      }
      return *this;
    }
    lease& operator=(lease&& o) noexcept {
      if (this != &o) {
        free_heap();
        last_ = o.last_;
        std::memcpy(buf_, o.buf_, sizeof buf_);
        expiry = o.expiry;
        o.last_ = 0;
      }
      return *this;
    }
    ~lease() { free_heap(); }

    /// The lease id (a default lease's is one NUL byte, never compared).
    [[nodiscard]] std::string_view id() const noexcept { return {data(), size()}; }

    /// Sets the id to a copy of `id` (1..256 bytes), which may be a view of
    /// this lease's own id or of part of it.
    /// @throws std::invalid_argument for an empty id or one over 256 bytes
    ///   (a store driven without the limiter's checks), std::bad_alloc; the
    ///   lease unchanged
    void assign(std::string_view id) {
      // The size is kept in one byte; the check's throw stays out of line.
      if (id.size() - 1 >= max_lease_id_bytes) [[unlikely]]
        refuse(id);
      if (id.size() <= inline_bytes) {
        if (size() > inline_bytes) [[unlikely]] {
          // `id` may lie in the block about to be freed: copy it out first.
          char small[inline_bytes] = {};
          copy_small(small, id.data(), id.size());
          free_heap();
          std::memcpy(buf_, small, sizeof small);
        } else {
          copy_small(buf_, id.data(), id.size());
        }
      } else if (size() > inline_bytes && heap_capacity(size()) >= id.size()) {
        // The block of the id held before (its lease freed, or this one
        // renamed) is large enough: a key that takes and frees calls one
        // after another allocates once. memmove: `id` may be a part of it.
        std::memmove(heap_block(), id.data(), id.size());
      } else {
        char* p = new char[heap_capacity(id.size())];
        std::memcpy(p, id.data(), id.size());
        free_heap();
        std::memcpy(buf_, &p, sizeof p);
      }
      last_ = static_cast<std::uint8_t>(id.size() - 1);
    }

    /// assign(), with its most common case inline: an id of up to
    /// inline_bytes bytes taking the place of another such id.
    void assign_short(std::string_view id) {
      if (id.size() - 1 < inline_bytes && size() <= inline_bytes) {
        copy_small(buf_, id.data(), id.size());
        last_ = static_cast<std::uint8_t>(id.size() - 1);
      } else {
        assign(id);
      }
    }

    /// Whether this lease's id is `id`. Inline ids are compared with two
    /// overlapping word loads, without a call.
    [[nodiscard]] bool holds(std::string_view id) const noexcept {
      if (id.size() != size()) return false;
      const std::size_t n = id.size();
      const char* a = data();
      const char* b = id.data();
      if (n >= 8 && n <= 16) {
        return load<std::uint64_t>(a) == load<std::uint64_t>(b) &&
               load<std::uint64_t>(a + n - 8) == load<std::uint64_t>(b + n - 8);
      }
      if (n >= 4 && n < 8) {
        return load<std::uint32_t>(a) == load<std::uint32_t>(b) &&
               load<std::uint32_t>(a + n - 4) == load<std::uint32_t>(b + n - 4);
      }
      return std::memcmp(a, b, n) == 0;
    }

    friend bool operator==(const lease& a, const lease& b) noexcept {
      return a.expiry == b.expiry && a.id() == b.id();
    }

   private:
    static constexpr std::size_t inline_bytes = 15;

    [[nodiscard]] std::size_t size() const noexcept { return std::size_t{last_} + 1; }
    [[noreturn, gnu::noinline, gnu::cold]] static void refuse(std::string_view id) {
      detail::check_lease_id(id);
      throw std::logic_error("ratelimit: lease id refused");  // not reached
    }
    /// Bytes allocated for a heap id of n bytes: n rounded up to what a
    /// 16-byte-granular malloc gives anyway (its chunk, less its 8-byte
    /// header), so that the block can take a longer id later at no cost.
    /// The block of an id of n bytes is never smaller than this.
    [[nodiscard]] static std::size_t heap_capacity(std::size_t n) noexcept {
      return ((n + 8 + 15) & ~std::size_t{15}) - 8;
    }
    [[nodiscard]] const char* data() const noexcept {
      if (size() <= inline_bytes) return buf_;
      const char* p = nullptr;
      std::memcpy(&p, buf_, sizeof p);
      return p;
    }
    [[nodiscard]] char* heap_block() const noexcept {
      char* p = nullptr;
      std::memcpy(&p, buf_, sizeof p);
      return p;
    }
    void free_heap() noexcept {
      if (size() > inline_bytes) {
        char* p = nullptr;
        std::memcpy(&p, buf_, sizeof p);
        delete[] p;
        last_ = 0;
      }
    }
    template <class Word>
    [[nodiscard]] static Word load(const char* p) noexcept {
      Word v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    /// memmove of 1..inline_bytes bytes as two overlapping fixed-size
    /// moves, each loaded before anything is stored (`from` may overlap `to`).
    static void copy_small(char* to, const char* from, std::size_t n) noexcept {
      if (n >= 8) {
        const auto head = load<std::uint64_t>(from);
        const auto tail = load<std::uint64_t>(from + n - 8);
        std::memcpy(to, &head, 8);
        std::memcpy(to + n - 8, &tail, 8);
      } else if (n >= 4) {
        const auto head = load<std::uint32_t>(from);
        const auto tail = load<std::uint32_t>(from + n - 4);
        std::memcpy(to, &head, 4);
        std::memcpy(to + n - 4, &tail, 4);
      } else {
        const char a = from[0];
        const char b = from[n / 2];
        const char c = from[n - 1];
        to[0] = a;
        to[n / 2] = b;
        to[n - 1] = c;
      }
    }

    std::uint8_t last_ = 0;   ///< the id's size - 1 (ids are 1..256 bytes)
    char buf_[inline_bytes];  ///< the id, or a pointer to it when longer than inline_bytes
  };

  /// A key's leases, unordered, in 32 bytes: the first held inline (in the
  /// store's node, so that a key with one call costs no second allocation and
  /// no second cache miss, and the node stays small), the others in one heap
  /// block kept for the key's life once made.
  class lease_set {
   public:
    lease_set() noexcept = default;
    /// @throws std::bad_alloc
    lease_set(const lease_set& o) : first_(o.first_) {
      if (o.more_ != nullptr && o.more_->size != 0) {
        more_ = block::make(o.more_->size);
        for (; more_->size < o.more_->size; ++more_->size) {
          try {
            ::new (more_->items() + more_->size) lease(o.more_->items()[more_->size]);
          } catch (...) {
            block::destroy(more_);
            throw;
          }
        }
      }
    }
    lease_set(lease_set&& o) noexcept
        : first_(std::move(o.first_)), more_(std::exchange(o.more_, nullptr)) {
      o.first_.expiry = 0;
    }
    lease_set& operator=(const lease_set& o) {
      if (this != &o) {
        lease_set copy(o);
        swap(copy);
      }
      return *this;
    }
    lease_set& operator=(lease_set&& o) noexcept {
      if (this != &o) {
        lease_set taken(std::move(o));
        swap(taken);
      }
      return *this;
    }
    ~lease_set() { block::destroy(more_); }

    [[nodiscard]] std::size_t size() const noexcept {
      if (first_.expiry == 0) return 0;  // a lease's expiry is >= 1 (time >= 0, duration >= 1)
      return more_ == nullptr ? 1 : 1 + std::size_t{more_->size};
    }
    [[nodiscard]] bool empty() const noexcept { return first_.expiry == 0; }
    /// True when the set holds no lease, or one that is live at `t`.
    [[nodiscard]] bool at_most_one_live(std::int64_t t) const noexcept {
      return first_.expiry == 0 || (first_.expiry > t && (more_ == nullptr || more_->size == 0));
    }
    [[nodiscard]] lease& operator[](std::size_t i) noexcept {
      return i == 0 ? first_ : more_->items()[i - 1];
    }
    [[nodiscard]] const lease& operator[](std::size_t i) const noexcept {
      return i == 0 ? first_ : more_->items()[i - 1];
    }
    /// Adds a lease (expiry >= 1), copying its id once.
    /// @throws std::bad_alloc with the set unchanged
    void add(std::string_view id, std::int64_t expiry) {
      if (first_.expiry != 0) return add_more(id, expiry);
      first_.assign(id);
      first_.expiry = expiry;
    }
    /// The leases after the first (empty when there is none).
    [[nodiscard]] std::span<const lease> more() const noexcept {
      if (more_ == nullptr || first_.expiry == 0) return {};
      return {more_->items(), more_->size};
    }
    /// add() on an empty set, with an id of up to 15 bytes copied inline
    /// when the lease held one before (no call); else as add().
    /// @throws std::bad_alloc with the set unchanged
    void add_first(std::string_view id, std::int64_t expiry) {
      first_.assign_short(id);
      first_.expiry = expiry;
    }
    /// Removes the set's only lease (remove(0) when size() == 1).
    void remove_only() noexcept { first_.expiry = 0; }
    /// Removes lease i (the last one takes its place).
    void remove(std::size_t i) noexcept {
      const std::size_t n = size();
      if (i + 1 != n) (*this)[i] = std::move((*this)[n - 1]);
      if (n == 1) {
        first_.expiry = 0;  // its id stays until the next add overwrites it
      } else {
        more_->items()[more_->size - 1].~lease();
        --more_->size;
      }
    }
    /// The same leases held in the same order (the store compares a state with
    /// a new one to tell whether there is anything to record).
    friend bool operator==(const lease_set& a, const lease_set& b) noexcept {
      const std::size_t n = a.size();
      if (n != b.size()) return false;
      for (std::size_t i = 0; i < n; ++i) {
        if (!(a[i] == b[i])) return false;
      }
      return true;
    }

   private:
    /// The leases after the first: this header, then `capacity` slots.
    struct block {
      std::uint32_t size;
      std::uint32_t capacity;
      [[nodiscard]] lease* items() noexcept {
        return std::launder(
            reinterpret_cast<lease*>(reinterpret_cast<char*>(this) + sizeof(block)));
      }
      static block* make(std::size_t capacity) {
        void* mem = ::operator new(sizeof(block) + capacity * sizeof(lease));
        return ::new (mem) block{0, static_cast<std::uint32_t>(capacity)};
      }
      static void destroy(block* b) noexcept {
        if (b == nullptr) return;
        for (std::uint32_t i = 0; i < b->size; ++i) b->items()[i].~lease();
        b->~block();
        ::operator delete(static_cast<void*>(b));
      }
    };
    static_assert(sizeof(block) % alignof(lease) == 0);

    /// add() when the first lease is taken: into the block.
    [[gnu::noinline]] void add_more(std::string_view id, std::int64_t expiry) {
      if (more_ == nullptr || more_->size == more_->capacity) grow();
      lease* slot = ::new (more_->items() + more_->size) lease();
      try {
        slot->assign_short(id);
      } catch (...) {
        slot->~lease();
        throw;
      }
      slot->expiry = expiry;
      ++more_->size;
    }

    /// Doubles the block (3 slots at first); on std::bad_alloc nothing changed.
    void grow() {
      const std::size_t capacity = more_ == nullptr ? 3 : std::size_t{more_->capacity} * 2;
      block* next = block::make(capacity);
      if (more_ != nullptr) {
        for (; next->size < more_->size; ++next->size) {
          ::new (next->items() + next->size) lease(std::move(more_->items()[next->size]));
        }
        block::destroy(more_);
      }
      more_ = next;
    }

    void swap(lease_set& o) noexcept {
      std::swap(first_, o.first_);
      std::swap(more_, o.more_);
    }

    lease first_;
    block* more_ = nullptr;
  };

  /// The key's leases (at most N live ones; expired ones are dropped by the
  /// next operation) and the rate's state.
  struct state {
    lease_set held;
    [[no_unique_address]] rate_state rate{};
    friend bool operator==(const state& a, const state& b) {
      if constexpr (rated) {
        return a.held == b.held && a.rate == b.rate;
      } else {
        return a.held == b.held;
      }
    }
  };

  /// Runs `cfg.op()` on the key's state at `now` (cost is always 1). May
  /// throw std::bad_alloc (a new lease's id, a sliding log's entry), or
  /// std::invalid_argument for a grant of an id out of 1..256 bytes (the
  /// limiter checks ids first), leaving the state as it was.
  static decision step(const config& cfg, state& s, timestamp now, units /*cost*/) {
    // A key with at most one lease, live (a subscriber in no call or in
    // one): acquire into an empty set and release of its one lease, the
    // same decisions as the general path, without its loops (a release
    // never touches the rate). Short, so that it is inlined into the
    // store's critical section; without a rate the general path is a call
    // of its own.
    const std::int64_t t = now.count();
    if (s.held.at_most_one_live(t)) {
      if (cfg.op() == lease_op::acquire && s.held.empty()) {
        if constexpr (rated) {
          return acquire(cfg, s, absent, now);
        } else {
          return acquire_first(cfg, s, t);
        }
      }
      if (cfg.op() == lease_op::release && !s.held.empty() && s.held[0].holds(cfg.lease_id())) {
        s.held.remove_only();
        return released_last(cfg);
      }
    }
    if constexpr (rated) {
      return step_general(cfg, s, now);
    } else {
      return step_general_call(cfg, s, now);
    }
  }

  /// The decision step() would give, on a copy (access::peek; the limiter
  /// never peeks). Out of line, so that the store's path for held keys does
  /// not carry a lease set's copy.
  [[gnu::noinline]] static decision peek(const config& cfg, const state& s, timestamp now,
                                         units cost) {
    state copy = s;
    return step(cfg, copy, now, cost);
  }

  /// True when no lease is live at `now` and the rate's state is idle.
  static bool idle(const config& cfg, const state& s, timestamp now) noexcept {
    for (std::size_t i = 0; i < s.held.size(); ++i) {
      if (s.held[i].expiry > now.count()) return false;
    }
    if constexpr (rated) {
      return R::idle(cfg.get_settings().rate(), s.rate, now);
    } else {
      (void)cfg;
      return true;
    }
  }

 private:
  /// step_general(), out of line: what step() calls beyond its fast path
  /// (without a rate), so that the fast path stays short.
  [[gnu::noinline]] static decision step_general_call(const config& cfg, state& s, timestamp now) {
    return step_general(cfg, s, now);
  }

  /// step() beyond its fast path (all of it with a rate).
  static decision step_general(const config& cfg, state& s, timestamp now) {
    const std::int64_t t = now.count();
    if constexpr (!rated) {
      // A subscriber in one call taking or ending a second: the same
      // decisions as the general path below, without its loops.
      decision d;
      if (second_call(cfg, s, t, d)) return d;
    }
    std::size_t mine = find(s, cfg.lease_id(), t);
    if (mine == expired_found) [[unlikely]] {
      if (cfg.op() == lease_op::acquire) return acquire_over_expired(cfg, s, now);
      mine = drop_expired(s, cfg.lease_id(), t);
    }
    // Acquire and release, the operations of every call, inline; the rest out of line.
    if (cfg.op() == lease_op::acquire) return acquire(cfg, s, mine, now);
    if (cfg.op() == lease_op::release) {
      if (mine != absent) s.held.remove(mine);
      return answer(cfg, s, t, mine != absent);
    }
    return step_other(cfg, s, mine, t);
  }

  static constexpr std::size_t absent = static_cast<std::size_t>(-1);
  static constexpr std::size_t expired_found = static_cast<std::size_t>(-2);

  [[nodiscard]] static std::int64_t duration_of(const config& cfg) noexcept {
    return cfg.get_settings().concurrency().max_duration().count();
  }

  /// acquire on a set holding no lease: grants the first (see step()).
  static decision acquire_first(const config& cfg, state& s, std::int64_t t) {
    const std::int64_t duration = duration_of(cfg);
    s.held.add_first(cfg.lease_id(), t + duration);
    decision d;
    d.allowed = true;
    d.counted = true;
    d.limit = cfg.limit();
    d.remaining = d.limit - 1;
    d.reset_after = std::chrono::microseconds{duration};
    return d;
  }

  /// Without a rate, on a key whose leases are all live at `t`: an acquire
  /// of a new id beside one lease, when N >= 2 (granted), and a release of
  /// one of two leases: true with the decision in `d`. False for anything
  /// else (the general path decides; `d` is then of no use), the set untouched.
  /// @throws std::bad_alloc (the new lease's place) with the set unchanged
  static bool second_call(const config& cfg, state& s, std::int64_t t, decision& d) {
    const std::size_t n = s.held.size();
    if (n == 0 || n > 2 || s.held[0].expiry <= t) return false;
    const std::string_view id = cfg.lease_id();
    if (n == 1) {
      if (cfg.op() != lease_op::acquire || cfg.limit() < 2 || s.held[0].holds(id)) return false;
    } else {
      if (cfg.op() != lease_op::release || s.held[1].expiry <= t) return false;
    }
    d.allowed = true;
    d.counted = true;
    d.limit = cfg.limit();
    if (n == 1) {
      const std::int64_t expiry = t + duration_of(cfg);
      s.held.add(id, expiry);
      d.remaining = d.limit - 2;
      d.reset_after = std::chrono::microseconds{std::max(s.held[0].expiry, expiry) - t};
      return true;
    }
    std::size_t mine = 0;
    if (!s.held[0].holds(id)) {
      if (!s.held[1].holds(id)) return false;
      mine = 1;
    }
    s.held.remove(mine);
    d.remaining = d.limit <= 1 ? 0 : d.limit - 1;
    d.reset_after = std::chrono::microseconds{s.held[0].expiry - t};
    return true;
  }

  /// The decision of a release that freed a key's only lease (see step()).
  static decision released_last(const config& cfg) noexcept {
    decision d;
    d.allowed = true;
    d.counted = true;
    d.limit = cfg.limit();
    d.remaining = d.limit;
    return d;
  }

  /// Drops the leases expired at `t`; returns the index of the live lease `id` or `absent`.
  [[gnu::noinline]] static std::size_t drop_expired(state& s, std::string_view id,
                                                    std::int64_t t) noexcept {
    for (std::size_t i = s.held.size(); i-- > 0;) {
      if (s.held[i].expiry <= t) s.held.remove(i);
    }
    return find(s, id, t);
  }

  /// Renew, and the no-op of sweeps and resets.
  [[gnu::noinline]] static decision step_other(const config& cfg, state& s, std::size_t mine,
                                               std::int64_t t) noexcept {
    if (cfg.op() != lease_op::renew) return answer(cfg, s, t, false);
    if (mine != absent) {
      lease& l = s.held[mine];
      l.expiry = std::max(l.expiry, t + duration_of(cfg));
    }
    return answer(cfg, s, t, mine != absent);
  }

  /// Index of the live lease `id`, `absent`, or `expired_found` when some
  /// lease has expired at `t` (the caller drops them and looks again).
  [[nodiscard]] static std::size_t find(const state& s, std::string_view id,
                                        std::int64_t t) noexcept {
    if (s.held.empty()) return absent;
    const lease& first = s.held[0];
    if (first.expiry <= t) return expired_found;
    std::size_t found = first.holds(id) ? 0 : absent;
    const std::span<const lease> more = s.held.more();
    for (std::size_t i = 0; i < more.size(); ++i) {
      const lease& l = more[i];
      if (l.expiry <= t) return expired_found;
      if (found == absent && l.holds(id)) found = i + 1;
    }
    return found;
  }

  /// The lease part's fields on the state `s` (all live at `t`).
  static detail::compound_part lease_part(const config& cfg, const state& s, std::int64_t t,
                                          bool ok) noexcept {
    detail::compound_part p;
    p.limit = cfg.limit();
    const std::size_t n = s.held.size();
    const auto live = static_cast<units>(n);
    p.remaining = live >= p.limit ? 0 : p.limit - live;
    std::int64_t earliest = std::numeric_limits<std::int64_t>::max();
    std::int64_t latest = t;
    if (n != 0) {
      earliest = s.held[0].expiry;
      latest = std::max(latest, earliest);
      for (const lease& l : s.held.more()) {
        earliest = std::min(earliest, l.expiry);
        latest = std::max(latest, l.expiry);
      }
    }
    p.reset_after = std::chrono::microseconds{latest - t};
    if (!ok) p.retry_after = std::chrono::microseconds{earliest - t};
    p.counted = ok;
    return p;
  }

  /// The decision of release and renew: the lease part alone; `done` =
  /// a live lease was freed or extended; otherwise rejected, retry `never`.
  static decision answer(const config& cfg, const state& s, std::int64_t t, bool done) noexcept {
    const detail::compound_part p = lease_part(cfg, s, t, true);
    decision d;
    d.allowed = done;
    d.counted = done;
    d.limit = p.limit;
    d.remaining = p.remaining;
    d.retry_after = done ? std::chrono::microseconds{0} : never;
    d.reset_after = p.reset_after;
    return d;
  }

  /// acquire on a set holding leases expired at `now`. A grant takes the
  /// place of an expired lease (its id assigned, which may allocate, before
  /// anything changes) and only then are the other expired leases dropped:
  /// a std::bad_alloc leaves the set as it was, expired leases included.
  [[gnu::noinline]] static decision acquire_over_expired(const config& cfg, state& s,
                                                         timestamp now) {
    const std::int64_t t = now.count();
    std::size_t stale = absent;
    for (std::size_t i = 0; i < s.held.size(); ++i) {
      const lease& l = s.held[i];
      if (l.expiry > t) {
        if (l.holds(cfg.lease_id()))
          return acquire(cfg, s, drop_expired(s, cfg.lease_id(), t), now);
      } else if (stale == absent) {
        stale = i;
      }
    }
    return acquire(cfg, s, absent, now, stale);
  }

  /// acquire of the live lease `mine`, or of a new one when `mine` is
  /// absent. `stale`: absent when every lease is live at `now`, else an
  /// expired lease, whose place a grant takes before the expired leases are
  /// dropped (see acquire_over_expired).
  static decision acquire(const config& cfg, state& s, std::size_t mine, timestamp now,
                          std::size_t stale = absent) {
    const std::int64_t t = now.count();
    if (mine != absent) {
      // Already live: the same lease again, no second slot, no renewal.
      decision d = answer(cfg, s, t, true);
      d.counted = false;
      d.repeat = true;
      return d;
    }
    std::size_t live = s.held.size();
    if (stale != absent) {
      for (std::size_t i = 0; i < s.held.size(); ++i) live -= s.held[i].expiry <= t ? 1 : 0;
    }
    const bool free_slot = static_cast<units>(live) < cfg.limit();
    const std::int64_t expiry = t + duration_of(cfg);
    // Grants the lease (may throw std::bad_alloc, changing nothing), then
    // drops the expired leases.
    const auto grant = [&](bool granted) {
      if (granted && stale == absent) {
        s.held.add(cfg.lease_id(), expiry);
      } else if (granted) {
        lease& l = s.held[stale];
        l.assign(cfg.lease_id());
        l.expiry = expiry;
      }
      if (stale != absent) (void)drop_expired(s, {}, t);
    };
    if constexpr (!rated) {
      grant(free_slot);
      const detail::compound_part p = lease_part(cfg, s, t, free_slot);
      decision d;
      d.allowed = free_slot;
      d.counted = free_slot;
      d.limit = p.limit;
      d.remaining = p.remaining;
      d.retry_after = p.retry_after;
      d.reset_after = p.reset_after;
      return d;
    } else {
      const rate_config& rc = cfg.get_settings().rate();
      rate_state trial = s.rate;
      const decision rd = R::step(rc, trial, now, 1);
      const bool all = free_slot && rd.allowed;
      std::array<detail::compound_part, 2> parts{};
      parts[1] = detail::settle<R>(rc, s.rate, trial, rd, all, now, 1);
      // Everything that may throw is done; the rate is committed last
      // (a move that does not allocate).
      grant(all);
      parts[0] = lease_part(cfg, s, t, free_slot);
      parts[0].counted = all;
      if (free_slot && !all) {
        // Admitted on the lease set, which stays untouched: never binding.
        parts[0].binding_candidate = false;
      }
      if (all) s.rate = std::move(trial);
      return detail::combine(parts.data(), parts.size(), all);
    }
  }
};

class lease_hint;
namespace detail {
/// The limiter's access to a lease_hint's fields.
struct lease_hint_access {
  /// Marks `h` filled by `store` and returns its hash, for the store to set.
  [[nodiscard]] static std::uint64_t& hash_to_fill(lease_hint& h, const void* store) noexcept;
  /// The hash `h` holds if `store` filled it.
  [[nodiscard]] static std::optional<std::uint64_t> hash_for(const lease_hint& h,
                                                             const void* store) noexcept;
};
}  // namespace detail

/// What an acquire learned about its key that lets the release or renew of
/// the same lease skip work: on the in-process store, the key's keyed hash,
/// so that the release does not hash the key again. A plain value the caller
/// keeps with its lease (beside the Call-ID); 16 bytes, no allocation.
///
/// Only a hint: it never changes a decision. An operation given a hint
/// decides exactly as the same operation without one, whatever the hint is:
/// one filled by another key, another lease, another limiter or store (or a
/// store since destroyed), one whose lease has since expired, been released
/// or acquired again, or one never filled. A hint that does not fit the key
/// costs one hash more (the key is looked up once by the hint, then as
/// without it). Stores that do not hash keys in process (Redis) ignore it.
class lease_hint {
 public:
  lease_hint() noexcept = default;
  /// True once an acquire on an in-process store filled it.
  [[nodiscard]] bool filled() const noexcept { return store_ != nullptr; }

 private:
  friend struct detail::lease_hint_access;

  std::uint64_t hash_ = 0;       ///< the key's hash in the store `store_`
  const void* store_ = nullptr;  ///< the store that hashed it (compared, never dereferenced)
};

inline std::uint64_t& detail::lease_hint_access::hash_to_fill(lease_hint& h,
                                                              const void* store) noexcept {
  h.store_ = store;
  return h.hash_;
}
inline std::optional<std::uint64_t> detail::lease_hint_access::hash_for(
    const lease_hint& h, const void* store) noexcept {
  if (h.store_ != store) return std::nullopt;
  return h.hash_;
}

/// The front end of a lease limit: `acquire`, `release`, `renew` per key and
/// lease id, each reading the clock once (or taking `now`), validating its
/// input and running as one atomic operation in the store.
///
/// @tparam R     a rate policy applied by every acquire, or `no_rate`
/// @tparam Store memory_store<leases<R>> (default), redis::redis_store or
///               redis::cluster_store
/// @tparam Clock as for `limiter`
///
/// Bad input (empty key or key over 512 bytes, empty lease id or one over
/// 256 bytes, time out of range) throws std::invalid_argument naming it.
/// Thread safety: as `limiter`.
template <class R = no_rate, class Store = memory_store<leases<R>>, class Clock = steady_clock>
  requires(clock_source<Clock> && store_for<Store, leases<R>>) ||
          (store_clock<Clock> && store_clocked_store_for<Store, leases<R>>)
class concurrency_limiter {
 public:
  using policy_type = leases<R>;
  using settings_type = typename leases<R>::settings;

  /// A lease limit alone.
  /// @throws std::invalid_argument when the store refuses the config (unnamed, in Redis)
  explicit concurrency_limiter(concurrency_config c, Store store = Store{}, Clock clock = Clock{})
    requires(!leases<R>::rated)
      : concurrency_limiter(settings_type(std::move(c)), std::move(store), std::move(clock)) {}

  /// A lease limit and the rate `r`, applied together by every acquire.
  /// @throws std::invalid_argument for a rate that counts rejected attempts,
  ///   or when the store refuses the config
  concurrency_limiter(concurrency_config c, typename leases<R>::rate_config r,
                      Store store = Store{}, Clock clock = Clock{})
    requires(leases<R>::rated)
      : concurrency_limiter(settings_type(std::move(c), std::move(r)), std::move(store),
                            std::move(clock)) {}

  explicit concurrency_limiter(settings_type s, Store store = Store{}, Clock clock = Clock{})
      : settings_(std::make_unique<settings_type>(std::move(s))),
        store_(std::move(store)),
        clock_(std::move(clock)) {
    if constexpr (requires { store_.check_config(request(lease_op::none, {})); }) {
      store_.check_config(request(lease_op::none, {}));
    }
  }

  /// Grants `lease_id` on `key` for max_duration, or rejects (see
  /// docs/semantics.md: a live id is the same lease again, `repeat`).
  /// @param key      1..512 bytes, binary safe
  /// @param lease_id 1..256 bytes, binary safe
  [[nodiscard]] decision acquire(std::string_view key, std::string_view lease_id) {
    return run(key, lease_op::acquire, lease_id);
  }
  /// As above, at `now`.
  [[nodiscard]] decision acquire(std::string_view key, std::string_view lease_id, timestamp now)
    requires store_for<Store, leases<R>>
  {
    return run_at(key, lease_op::acquire, lease_id, now);
  }

  /// As `acquire(key, lease_id)`, also filling `hint` for the release or
  /// renew of this lease (see lease_hint: it changes no decision).
  [[nodiscard]] decision acquire(std::string_view key, std::string_view lease_id,
                                 lease_hint& hint) {
    return run_hinted(key, lease_op::acquire, lease_id, hint, &hint);
  }
  /// As above, at `now`.
  [[nodiscard]] decision acquire(std::string_view key, std::string_view lease_id, timestamp now,
                                 lease_hint& hint)
    requires store_for<Store, leases<R>>
  {
    return run_hinted_at(key, lease_op::acquire, lease_id, now, hint, &hint);
  }

  /// Frees `lease_id`: allowed when it was live; an unknown or expired id is
  /// rejected with retry_after `never` and changes nothing.
  decision release(std::string_view key, std::string_view lease_id) {
    return run(key, lease_op::release, lease_id);
  }
  /// As above, at `now`.
  decision release(std::string_view key, std::string_view lease_id, timestamp now)
    requires store_for<Store, leases<R>>
  {
    return run_at(key, lease_op::release, lease_id, now);
  }

  /// As `release(key, lease_id)`, with the hint its acquire filled: skips
  /// hashing the key in process; the same decision whatever `hint` is.
  decision release(std::string_view key, std::string_view lease_id, const lease_hint& hint) {
    return run_hinted(key, lease_op::release, lease_id, hint, nullptr);
  }
  /// As above, at `now`.
  decision release(std::string_view key, std::string_view lease_id, timestamp now,
                   const lease_hint& hint)
    requires store_for<Store, leases<R>>
  {
    return run_hinted_at(key, lease_op::release, lease_id, now, hint, nullptr);
  }

  /// Extends a live `lease_id` to expire at now + max_duration (never
  /// earlier than it did); an unknown or expired id is rejected with
  /// retry_after `never` and changes nothing (acquire it again).
  decision renew(std::string_view key, std::string_view lease_id) {
    return run(key, lease_op::renew, lease_id);
  }
  /// As above, at `now`.
  decision renew(std::string_view key, std::string_view lease_id, timestamp now)
    requires store_for<Store, leases<R>>
  {
    return run_at(key, lease_op::renew, lease_id, now);
  }

  /// As `renew(key, lease_id)`, with the hint its acquire filled (see release).
  decision renew(std::string_view key, std::string_view lease_id, const lease_hint& hint) {
    return run_hinted(key, lease_op::renew, lease_id, hint, nullptr);
  }
  /// As above, at `now`.
  decision renew(std::string_view key, std::string_view lease_id, timestamp now,
                 const lease_hint& hint)
    requires store_for<Store, leases<R>>
  {
    return run_hinted_at(key, lease_op::renew, lease_id, now, hint, nullptr);
  }

  /// Forgets every lease of `key` (and its rate state).
  void reset(std::string_view key) {
    detail::check_key(key);
    store_.reset(request(lease_op::none, {}), key);
  }

  /// Drops the keys with no live lease (and an idle rate) at `now`; in process only.
  std::size_t sweep(timestamp now)
    requires requires(Store& s, const typename leases<R>::config& c) { s.sweep(c, now); }
  {
    return store_.sweep(request(lease_op::none, {}), now);
  }

  /// The clock's current time in microseconds since its epoch.
  [[nodiscard]] timestamp now() const noexcept
    requires clock_source<Clock>
  {
    return std::chrono::duration_cast<timestamp>(clock_.now().time_since_epoch());
  }

  [[nodiscard]] const settings_type& settings() const noexcept { return *settings_; }
  [[nodiscard]] Store& store() noexcept { return store_; }
  [[nodiscard]] Clock& clock() noexcept { return clock_; }

 private:
  [[nodiscard]] typename leases<R>::config request(lease_op op, std::string_view id) const {
    return typename leases<R>::config(*settings_, op, id);
  }

  decision run(std::string_view key, lease_op op, std::string_view id) {
    if constexpr (store_clock<Clock>) {
      detail::check_key(key);
      detail::check_lease_id(id);
      return store_.apply(request(op, id), key, store_time, 1, access::consume);
    } else {
      return run_at(key, op, id, now());
    }
  }

  decision run_at(std::string_view key, lease_op op, std::string_view id, timestamp now) {
    detail::check_key(key);
    detail::check_lease_id(id);
    detail::check_time(now);
    return store_.apply(request(op, id), key, now, 1, access::consume);
  }

  /// The store hashes keys itself (memory_store): hints apply.
  static constexpr bool hashes_keys = requires(Store& st, const typename leases<R>::config& c,
                                               std::string_view k, std::uint64_t h, timestamp t) {
    { st.key_hash(k) } -> std::same_as<std::uint64_t>;
    st.apply_hashed(c, k, h, t, units{1}, access::consume);
    st.apply_keeping_hash(c, k, h, t, units{1}, access::consume);
  };

  decision run_hinted(std::string_view key, lease_op op, std::string_view id,
                      const lease_hint& hint, lease_hint* fill) {
    if constexpr (hashes_keys && clock_source<Clock>) {
      return run_hinted_at(key, op, id, now(), hint, fill);
    } else {
      return run(key, op, id);
    }
  }

  /// `fill`: the hint an acquire fills with the key's hash (`hint` itself),
  /// or null for a release or renew, which only reads `hint`.
  decision run_hinted_at(std::string_view key, lease_op op, std::string_view id, timestamp now,
                         const lease_hint& hint, lease_hint* fill) {
    if constexpr (hashes_keys) {
      detail::check_key(key);
      detail::check_lease_id(id);
      detail::check_time(now);
      const void* self = &store_;
      if (fill != nullptr) {
        // One hash, also for a key the store does not hold yet; the store
        // sets the hint's hash before it decides.
        return store_.apply_keeping_hash(request(op, id), key,
                                         detail::lease_hint_access::hash_to_fill(*fill, self), now,
                                         1, access::consume);
      }
      if (const auto known = detail::lease_hint_access::hash_for(hint, self)) {
        return store_.apply_hashed(request(op, id), key, *known, now, 1, access::consume);
      }
      return store_.apply(request(op, id), key, now, 1, access::consume);
    } else {
      (void)hint;
      (void)fill;
      return run_at(key, op, id, now);
    }
  }

  /// Behind a pointer, so that the requests' pointer to it survives a move.
  std::unique_ptr<settings_type> settings_;
  Store store_;
  Clock clock_;
};

}  // namespace ratelimit
