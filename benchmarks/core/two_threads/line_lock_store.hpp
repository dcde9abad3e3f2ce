// SPDX-License-Identifier: Apache-2.0
// A measurement prototype, not a store: the lock word in the bucket array's cache line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>

#include "ratelimit/concepts.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/detail/siphash.hpp"
#include "ratelimit/detail/spin_lock.hpp"

namespace ratelimit::diagnosis {

/// What a check on a held key would cost if its lock sat in the cache line
/// of the bucket array it reads anyway: each 64-byte line of the table holds
/// a lock word and 7 chain heads, and a check on a held key takes only that
/// line's lock. The table grows at 8 keys per line, so it takes the bytes per
/// key of memory_store's (8 B per bucket at one key per bucket).
///
/// Only what the two-thread measurement needs: keys are inserted by one
/// thread before any check runs (a table that moves under a check would need
/// the reclamation this prototype does not have), nothing is ever dropped,
/// and `reset` does nothing. Never use it as a store.
template <policy P>
class line_lock_store {
 public:
  using config_type = typename P::config;
  using state_type = typename P::state;

  line_lock_store() : shards_(std::make_unique<shard[]>(shard_count)) {}

  decision apply(const config_type& cfg, std::string_view key, timestamp now, units cost,
                 access /*a*/) {
    const std::uint64_t h = detail::siphash13(seed_, key);
    shard& sh = shards_[h >> 58];
    if (sh.lines != nullptr) {
      line& ln = sh.lines[(h >> 32) & sh.line_mask];
      std::lock_guard<detail::spin_lock> guard(ln.lock);
      for (node* n = ln.head[slot(h)]; n != nullptr; n = n->next) {
        if (n->hash == h && n->holds(key)) return P::step(cfg, n->state, now, cost);
      }
    }
    // New key: single-threaded by this prototype's contract.
    std::lock_guard<detail::spin_lock> guard(sh.lock);
    if (sh.lines == nullptr || sh.size + 1 > (sh.line_mask + 1) * 8) grow(sh);
    state_type fresh{};
    const decision d = P::step(cfg, fresh, now, cost);
    void* mem = ::operator new(sizeof(node) + key.size());
    node* n = ::new (mem) node{nullptr, h, fresh, static_cast<std::uint32_t>(key.size())};
    std::memcpy(static_cast<char*>(mem) + sizeof(node), key.data(), key.size());
    node*& head = sh.lines[(h >> 32) & sh.line_mask].head[slot(h)];
    n->next = head;
    head = n;
    ++sh.size;
    return d;
  }

  void reset(const config_type& /*cfg*/, std::string_view /*key*/) {}

 private:
  static constexpr std::size_t shard_count = 64;

  struct node {
    node* next;
    std::uint64_t hash;
    state_type state;
    std::uint32_t size;

    [[nodiscard]] bool holds(std::string_view k) const noexcept {
      return k.size() == size &&
             std::memcmp(reinterpret_cast<const char*>(this) + sizeof(node), k.data(), size) == 0;
    }
  };

  struct alignas(64) line {
    detail::spin_lock lock;
    node* head[7] = {};
  };
  static_assert(sizeof(line) == 64);

  struct alignas(64) shard {
    detail::spin_lock lock;
    line* lines = nullptr;
    std::size_t line_mask = 0;
    std::size_t size = 0;
  };

  /// Which of a line's 7 chains: from hash bits the line index does not use.
  static unsigned slot(std::uint64_t h) noexcept {
    return static_cast<unsigned>(((h & 0xffffffffULL) * 7) >> 32);
  }

  static void grow(shard& sh) {
    const std::size_t count = sh.lines == nullptr ? 2 : (sh.line_mask + 1) * 2;
    line* next = new line[count]();
    for (std::size_t i = 0; sh.lines != nullptr && i <= sh.line_mask; ++i) {
      for (node* first : sh.lines[i].head) {
        for (node* n = first; n != nullptr;) {
          node* following = n->next;
          node*& head = next[(n->hash >> 32) & (count - 1)].head[slot(n->hash)];
          n->next = head;
          head = n;
          n = following;
        }
      }
    }
    delete[] sh.lines;
    sh.lines = next;
    sh.line_mask = count - 1;
  }

  // Nodes and lines are leaked on destruction: the process ends right after.
  detail::siphash_prepared seed_{detail::siphash_key{0x0123456789abcdefULL, 0xfedcba9876543210ULL}};
  std::unique_ptr<shard[]> shards_;
};

}  // namespace ratelimit::diagnosis
