// SPDX-License-Identifier: Apache-2.0
// idempotent_store<P>: the in-process store for limiters that make
// idempotent checks: a memory_store of idempotent<P>, whose node for a key
// holds P's state and the key's request ids together.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/policy/idempotent.hpp"
#include "ratelimit/request_id.hpp"
#include "ratelimit/store/memory_store.hpp"

namespace ratelimit {

/// Options of an idempotent_store's ids. An aggregate; every field has a default.
struct idempotent_store_options {
  /// Most ids one key holds, 1..max_ids_per_key_limit; 0 = 64. At the cap a
  /// new id of the key takes the place of the key's id whose retention ends
  /// first (see docs/semantics.md, "Ids kept with their key").
  std::size_t max_ids_per_key = 0;
};

/// An in-process store that keeps each key's request ids in the key's own
/// node: `limiter<P, idempotent_store<P>>`. An idempotent check then costs
/// one hash of the key, one lock and one node, as a plain check does, plus
/// one pass of SipHash-1-3 with 128-bit output over the id (its fingerprint,
/// of which 96 bits are kept, under a secret key drawn per store, computed
/// before the lock). Plain checks through this store run P unchanged on the
/// same state. A limiter over the default memory_store<P> keeps ids in its
/// own table instead (request_id.hpp); this store is the one to choose when
/// most checks carry ids. Exact rules: docs/semantics.md, "Ids kept with
/// their key".
///
/// Memory: a key's node holds two ids inline (56 bytes each), with ids or
/// without; more go to one heap block per key, doubled as needed up to the
/// key's cap. Bounded by `max_keys` (memory_store_options) x `max_ids_per_key`.
///
/// Thread safety: as memory_store (any number of threads; not construction,
/// destruction or move).
template <policy P>
class idempotent_store {
 public:
  using policy_type = P;
  using config_type = typename P::config;
  using wrapped = idempotent<P>;

  idempotent_store() : idempotent_store(memory_store_options{}) {}
  /// @throws std::invalid_argument for bad store options or a cap outside 1..max_ids_per_key_limit
  explicit idempotent_store(memory_store_options o, idempotent_store_options io = {})
      : store_(std::move(o)), max_per_key_(normalise(io.max_ids_per_key)), seed_(make_seed(this)) {}

  /// A plain check (memory_store::apply), on the state idempotent checks share.
  decision apply(const config_type& cfg, std::string_view key, timestamp now, units cost,
                 access a) {
    return store_.apply(typename wrapped::config(cfg, id_op::plain), key, now, cost, a);
  }
  /// As memory_store::apply_reading.
  template <class ReadNow>
  decision apply_reading(const config_type& cfg, std::string_view key, ReadNow&& read_now,
                         units cost, access a) {
    return store_.apply_reading(typename wrapped::config(cfg, id_op::plain), key,
                                std::forward<ReadNow>(read_now), cost, a);
  }

  /// An idempotent check (see docs/semantics.md, "Idempotent checks"):
  /// `key`, `id`, `cost`, `now` and `retention` validated by the caller.
  /// @throws std::bad_alloc with the store unchanged
  decision apply_once(const config_type& cfg, std::string_view key, request_id id,
                      std::chrono::microseconds retention, timestamp now, units cost, access a) {
    const fingerprint f = fingerprint_of(id.bytes);
    return store_.apply(typename wrapped::config(cfg, f.a, f.b, retention, max_per_key_, now), key,
                        now, cost, a);
  }

  /// Forgets `key`'s policy state, keeping its ids (a retry of a request
  /// decided before still gets its first decision).
  void reset(const config_type& cfg, std::string_view key) {
    (void)store_.apply(typename wrapped::config(cfg, id_op::reset), key, timestamp{0}, 1,
                       access::consume);
  }

  /// Drops every key idle at `now` (P idle and every id dropped).
  std::size_t sweep(const config_type& cfg, timestamp now) {
    return store_.sweep(typename wrapped::config(cfg, id_op::plain), now);
  }

  /// Keys held.
  [[nodiscard]] std::size_t size() const noexcept { return store_.size(); }
  /// Ids `key` holds (ended ones not yet dropped included): a diagnostic.
  [[nodiscard]] std::size_t ids_of(std::string_view key) const {
    return store_.inspect(key, [](const typename wrapped::state* s) noexcept {
      return s != nullptr ? s->ids() : std::size_t{0};
    });
  }
  /// P's state for `key`, or a value-initialised one (a copy of P's state
  /// alone: the key's ids are not copied).
  [[nodiscard]] typename P::state state_of(std::string_view key) const {
    return store_.inspect(key, [](const typename wrapped::state* s) {
      return s != nullptr ? s->inner : typename P::state{};
    });
  }
  [[nodiscard]] std::size_t max_ids_per_key() const noexcept { return max_per_key_; }
  [[nodiscard]] const memory_store_options& options() const noexcept { return store_.options(); }
  /// The memory_store underneath.
  [[nodiscard]] memory_store<wrapped>& memory() noexcept { return store_; }

 private:
  static std::size_t normalise(std::size_t n) {
    if (n == 0) return 64;
    if (n > max_ids_per_key_limit) {
      throw std::invalid_argument("ratelimit: idempotent_store_options::max_ids_per_key " +
                                  std::to_string(n) + " is over the maximum of " +
                                  std::to_string(max_ids_per_key_limit));
    }
    return n;
  }

  /// An id's 128-bit fingerprint (96 bits of it are kept).
  struct fingerprint {
    std::uint64_t a;
    std::uint64_t b;
  };

  /// SipHash-1-3 with its 128-bit output (the specification's variant:
  /// 0xee folded into v1 at the start and v2 at the end, then 0xdd into v1
  /// for the second half) under the store's secret key: one pass over the id.
  [[nodiscard]] [[gnu::always_inline]] fingerprint fingerprint_of(
      std::string_view id) const noexcept {
    detail::sip::state s = seed_.start;
    s.v1 ^= 0xee;
    const auto* p = reinterpret_cast<const unsigned char*>(id.data());
    const std::size_t n = id.size();
    const unsigned char* const end = p + (n & ~std::size_t{7});
    for (; p != end; p += 8) s.compress<1>(detail::sip::load_le64(p));
    s.compress<1>(detail::sip::load_tail(p, n & 7, n) |
                  (static_cast<std::uint64_t>(n & 0xff) << 56));
    s.v2 ^= 0xee;
    for (int r = 0; r < 3; ++r) s.round();
    const std::uint64_t a = s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
    s.v1 ^= 0xdd;
    for (int r = 0; r < 3; ++r) s.round();
    return {a, s.v0 ^ s.v1 ^ s.v2 ^ s.v3};
  }

  /// A fresh secret key per store; without a random source, from the
  /// store's address and the time.
  static detail::siphash_key make_seed(const void* self) noexcept {
    try {
      std::random_device rd;
      const auto word = [&rd] {
        return (static_cast<std::uint64_t>(rd()) << 32) ^ static_cast<std::uint64_t>(rd());
      };
      return {word(), word()};
    } catch (...) {
      const auto ticks = static_cast<std::uint64_t>(
          std::chrono::steady_clock::now().time_since_epoch().count());
      const auto address = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(self));
      const detail::siphash_key mixed{ticks ^ 0x9e3779b97f4a7c15ULL, address};
      return {detail::siphash13(mixed, "ratelimit.ik0"), detail::siphash13(mixed, "ratelimit.ik1")};
    }
  }

  memory_store<wrapped> store_;
  std::size_t max_per_key_;
  detail::siphash_prepared seed_;
};

}  // namespace ratelimit
