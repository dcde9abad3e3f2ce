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

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
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
  /// 0 = `default_max_request_ids`. At the cap, a new id evicts the oldest id
  /// of its stripe (whose retries are then decided as new requests); when
  /// its stripe holds none, the new id is not recorded. Redis keeps ids as
  /// keys with a TTL and has no cap of its own (see docs/semantics.md).
  std::size_t max_ids = 0;
  /// In-process only: independently locked stripes of the id table, rounded
  /// up to a power of two, at most 65536; 0 = 64.
  std::size_t stripes = 0;
};

/// Default cap on the ids an in-process limiter holds.
inline constexpr std::size_t default_max_request_ids = std::size_t{1} << 20;

namespace detail {

/// Printable form of hostile bytes for an error message: at most 40 bytes,
/// non-printable ones as \xNN.
[[nodiscard]] inline std::string printable(std::string_view bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xf];
    }
  }
  if (bytes.size() > 40) out += "...";
  return out;
}

[[noreturn, gnu::noinline, gnu::cold]] inline void throw_bad_request_id(std::string_view id) {
  if (id.empty()) throw std::invalid_argument("ratelimit: request id must not be empty");
  throw std::invalid_argument("ratelimit: request id \"" + printable(id) + "\" of " +
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

/// The retention of ids under `o` for `cfg`.
/// @throws std::invalid_argument for a negative retention or one over max_time
template <class Config>
[[nodiscard]] std::chrono::microseconds retention_for(const Config& cfg,
                                                      const idempotency_options& o) {
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
/// same code. The stripe lock is always taken before the store's shard lock,
/// never after, so the two cannot deadlock.
///
/// Each id is one allocation (header, key bytes, id bytes). Ids are dropped
/// once their retention has ended: on lookup, and, one retention later, from
/// the oldest end of a stripe's insertion list each time an id is recorded in
/// it (so the table holds at most about two retentions' worth of ids). At `max_ids`,
/// see idempotency_options::max_ids.
///
/// Thread safety: `check` from any number of threads.
class id_table {
 public:
  explicit id_table(const idempotency_options& o)
      : stripes_(normalise_stripes(o.stripes)),
        max_ids_(o.max_ids == 0 ? default_max_request_ids : o.max_ids),
        seed_(make_seed()),
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
    const std::uint64_t h = detail::siphash13(seed_, composite);
    stripe& st = stripe_[static_cast<std::size_t>(h >> 1) & (stripes_ - 1)];
    std::lock_guard<detail::spin_lock> guard(st.lock);
    entry* held = st.find(h, composite);
    if (held != nullptr && now < held->until) {
      decision d = held->first;
      d.repeat = true;
      return d;
    }
    // Not held, or its retention is over at `now`: a new request. An ended
    // record is replaced only by a check that records a new one (as the
    // Redis script overwrites it), so that a peek or a degraded check
    // changes nothing.
    decision d = decide();
    if (a == access::peek || d.degraded()) return d;
    if (held != nullptr) st.erase(held, *count_);
    const timestamp until = now > timestamp::max() - retention ? timestamp::max() : now + retention;
    // One more retention of grace before a record is dropped: a check stamped
    // up to a retention earlier than this one (threads, out-of-order caller
    // times) still finds the ids it would have found.
    st.expire(now - retention, *count_);
    if (!reserve(st)) return d;
    try {
      st.insert(h, composite, until, d);
    } catch (...) {
      count_->fetch_sub(1, std::memory_order_relaxed);
      throw;
    }
    return d;
  }

  /// Forgets every id of `key` (limiter::reset). Walks every stripe.
  void forget_key(std::string_view key) {
    for (std::size_t i = 0; i < stripes_; ++i) {
      stripe& st = stripe_[i];
      std::lock_guard<detail::spin_lock> guard(st.lock);
      st.erase_key(key, *count_);
    }
  }

  /// Ids held (some may have ended their retention and wait to be dropped).
  [[nodiscard]] std::size_t size() const noexcept {
    return count_->load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t max_ids() const noexcept { return max_ids_; }

 private:
  struct entry {
    entry* next;   ///< bucket chain
    entry* newer;  ///< insertion list, towards `newest`
    entry* older;  ///< insertion list, towards `oldest`
    std::uint64_t hash;
    timestamp until;
    decision first;
    std::uint16_t key_size;
    std::uint16_t size;  ///< of the composite bytes

    [[nodiscard]] const char* data() const noexcept {
      return reinterpret_cast<const char*>(this) + sizeof(entry);
    }
    [[nodiscard]] std::string_view bytes() const noexcept { return {data(), size}; }
  };

  struct alignas(64) stripe {
    detail::spin_lock lock;
    entry** buckets = nullptr;
    std::size_t mask = 0;
    std::size_t size = 0;
    entry* oldest = nullptr;  ///< insertion list, oldest first
    entry* newest = nullptr;

    stripe() = default;
    stripe(const stripe&) = delete;
    stripe& operator=(const stripe&) = delete;
    ~stripe() {
      for (entry* e = oldest; e != nullptr;) {
        entry* n = e->newer;
        destroy(e);
        e = n;
      }
      delete[] buckets;
    }

    [[nodiscard]] entry* find(std::uint64_t h, std::string_view bytes) const noexcept {
      if (buckets == nullptr) return nullptr;
      for (entry* e = buckets[h & mask]; e != nullptr; e = e->next) {
        if (e->hash == h && e->bytes() == bytes) return e;
      }
      return nullptr;
    }

    void insert(std::uint64_t h, std::string_view bytes, timestamp until, const decision& d) {
      if (buckets == nullptr || size + 1 > mask + 1)
        resize(buckets == nullptr ? 16 : (mask + 1) * 2);
      void* mem = ::operator new(sizeof(entry) + bytes.size());
      auto* e = ::new (mem)
          entry{nullptr, nullptr, newest, h, until, d, 0, static_cast<std::uint16_t>(bytes.size())};
      std::memcpy(static_cast<char*>(mem) + sizeof(entry), bytes.data(), bytes.size());
      e->key_size = static_cast<std::uint16_t>(static_cast<unsigned char>(bytes[0]) |
                                               (static_cast<unsigned char>(bytes[1]) << 8));
      entry*& head = buckets[h & mask];
      e->next = head;
      head = e;
      if (newest != nullptr) {
        newest->newer = e;
      } else {
        oldest = e;
      }
      newest = e;
      ++size;
    }

    /// Unlinks and frees `e` (from its chain and the insertion list).
    void erase(entry* e, std::atomic<std::size_t>& total) noexcept {
      for (entry** link = &buckets[e->hash & mask]; *link != nullptr; link = &(*link)->next) {
        if (*link == e) {
          *link = e->next;
          break;
        }
      }
      (e->older != nullptr ? e->older->newer : oldest) = e->newer;
      (e->newer != nullptr ? e->newer->older : newest) = e->older;
      destroy(e);
      --size;
      total.fetch_sub(1, std::memory_order_relaxed);
    }

    /// Drops ids whose retention ended by `upto` from the oldest end (at most
    /// 4 per call, so a check pays a bounded price).
    void expire(timestamp upto, std::atomic<std::size_t>& total) noexcept {
      for (int i = 0; i < 4 && oldest != nullptr && oldest->until <= upto; ++i)
        erase(oldest, total);
    }

    void erase_key(std::string_view key, std::atomic<std::size_t>& total) noexcept {
      for (entry* e = oldest; e != nullptr;) {
        entry* n = e->newer;
        if (std::string_view(e->data() + 2, e->key_size) == key) erase(e, total);
        e = n;
      }
    }

    void resize(std::size_t count) {
      auto** next = new entry*[count]();
      for (entry* e = oldest; e != nullptr; e = e->newer) {
        entry*& head = next[e->hash & (count - 1)];
        e->next = head;
        head = e;
      }
      delete[] buckets;
      buckets = next;
      mask = count - 1;
    }

    static void destroy(entry* e) noexcept {
      e->~entry();
      ::operator delete(static_cast<void*>(e));
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

  /// Counts one more id; at the cap evicts this stripe's oldest instead.
  bool reserve(stripe& st) noexcept {
    std::size_t current = count_->load(std::memory_order_relaxed);
    do {
      if (current >= max_ids_) {
        if (st.oldest == nullptr) return false;
        st.erase(st.oldest, *count_);
        current = count_->load(std::memory_order_relaxed);
        continue;
      }
    } while (!count_->compare_exchange_weak(current, current + 1, std::memory_order_relaxed));
    return true;
  }

  static std::size_t normalise_stripes(std::size_t s) {
    if (s > 65536) {
      throw std::invalid_argument("ratelimit: idempotency_options::stripes " + std::to_string(s) +
                                  " is over the maximum of 65536");
    }
    return std::bit_ceil(s == 0 ? std::size_t{64} : s);
  }

  static detail::siphash_key make_seed() {
    try {
      std::random_device rd;
      const auto word = [&rd] {
        return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
      };
      return {word(), word()};
    } catch (...) {
      const auto ticks = static_cast<std::uint64_t>(
          std::chrono::steady_clock::now().time_since_epoch().count());
      return {ticks ^ 0x9e3779b97f4a7c15ULL, ticks * 0xbf58476d1ce4e5b9ULL};
    }
  }

  std::size_t stripes_;
  std::size_t max_ids_;
  detail::siphash_prepared seed_;
  std::unique_ptr<stripe[]> stripe_;
  std::unique_ptr<std::atomic<std::size_t>> count_ = std::make_unique<std::atomic<std::size_t>>(0);
};

}  // namespace detail
}  // namespace ratelimit
