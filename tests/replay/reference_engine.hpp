// SPDX-License-Identifier: Apache-2.0
// The summary and sweep engine as it was before the dense-log rewrite, frozen as a reference.
//
// `reference::analyse` is the analysis engine of examples/replay/replay.hpp
// before the rewrite for dense logs (issue 12 part 3), kept here unchanged
// apart from its namespace: one ring scan per batch, every summary policy
// always run. engine_test.cpp checks that the tool's engine prints exactly
// what this one prints, figure for figure, on dense generated logs. Test
// code only: it is slow on logs where many keys are live at once.
#pragma once

#include "replay.hpp"

namespace ratelimit::replay::reference {

/// Interns keys into dense ids 0, 1, 2, ... in order of first appearance.
/// Memory per key: its bytes, 8 bytes of end offset, and 8-byte open-addressing
/// slots at a load factor between 3/8 and 3/4 (11 to 21 bytes), all in
/// geometrically grown arrays.
class key_table {
 public:
  key_table() { slots_.assign(1024, 0); }

  /// The id of `key`, adding it if new (`fresh` says which).
  std::uint32_t intern(std::string_view key, bool& fresh) {
    return intern(key, hash_key(key), fresh);
  }
  /// The same, with `h == hash_key(key)` already computed.
  std::uint32_t intern(std::string_view key, std::uint64_t h, bool& fresh) {
    const std::uint64_t tag = h & ~std::uint64_t{0xffffffff};
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(h >> 7) & mask;; i = (i + 1) & mask) {
      const std::uint64_t s = slots_[i];
      if (s == 0) {
        const auto id = static_cast<std::uint32_t>(ends_.size() - 1);
        bytes_.append(key);
        ends_.push_back(bytes_.size());
        slots_[i] = tag | (std::uint64_t{id} + 1);
        fresh = true;
        if (4 * size() > 3 * slots_.size()) grow();
        return id;
      }
      if ((s & ~std::uint64_t{0xffffffff}) == tag) {
        const auto id = static_cast<std::uint32_t>((s & 0xffffffff) - 1);
        if (get(id) == key) {
          fresh = false;
          return id;
        }
      }
    }
  }
  /// A hint that the key hashed `h` is about to be interned. Stage 0 fetches
  /// its home slot, stage 1 (later) its end offset, stage 2 its bytes; each
  /// stage reads only what the previous one fetched. No effect on results.
  void prefetch(std::uint64_t h, int stage) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    const std::uint64_t* slot = slots_.data() +
                                (static_cast<std::size_t>(h >> 7) & (slots_.size() - 1));
    if (stage == 0) {
      __builtin_prefetch(slot);
      return;
    }
    const std::uint64_t s = *slot;
    if (s == 0 || (s & ~std::uint64_t{0xffffffff}) != (h & ~std::uint64_t{0xffffffff})) return;
    const std::size_t id = static_cast<std::size_t>(s & 0xffffffff) - 1;
    if (stage == 1) {
      __builtin_prefetch(ends_.data() + id);
    } else {
      __builtin_prefetch(bytes_.data() + ends_[id]);
    }
#else
    (void)h;
    (void)stage;
#endif
  }
  [[nodiscard]] std::string_view get(std::uint32_t id) const noexcept {
    return std::string_view(bytes_).substr(ends_[id], ends_[id + 1] - ends_[id]);
  }
  [[nodiscard]] std::size_t size() const noexcept { return ends_.size() - 1; }
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return bytes_.capacity() + ends_.capacity() * sizeof(std::size_t) +
           slots_.capacity() * sizeof(std::uint64_t);
  }

 private:
  void grow() {
    std::vector<std::uint64_t> next(slots_.size() * 2, 0);
    const std::size_t mask = next.size() - 1;
    for (const std::uint64_t s : slots_) {
      if (s == 0) continue;
      const auto id = static_cast<std::uint32_t>((s & 0xffffffff) - 1);
      std::size_t i = static_cast<std::size_t>(hash_key(get(id)) >> 7) & mask;
      while (next[i] != 0) i = (i + 1) & mask;
      next[i] = s;
    }
    slots_.swap(next);
  }

  std::string bytes_;
  std::vector<std::size_t> ends_{0};
  std::vector<std::uint64_t> slots_;
};

/// Number of summary policies a window ring counts admitted calls for.
inline constexpr std::size_t ring_policies = policy_count;

/// Rings of each key's recent calls, to find the most calls in any window
/// (t - W, t]: all attempts (each key's peak) and, per summary policy, the
/// calls it admitted (the largest over all keys). One ring per key that called
/// in the last window, shared by the six counts: an entry is a call's time and
/// a bit per policy that admitted it, and the ring keeps a running count per
/// policy. A call stamped earlier than its key's newest call counts at that
/// newest time (time never runs backwards inside a key). Rings whose newest
/// entry has left the window go back to a free list (`release_stale`), so
/// memory follows the calls inside one window, not the trace. Handles are
/// 1-based; 0 = no ring.
class window_rings {
 public:
  /// Adds a call of key `owner` at `t`, admitted by the summary policies in
  /// `admitted` (bit p = policy p); raises `max_admitted[p]` to the calls policy
  /// p admitted in (t - W, t] and returns the attempts in (t - W, t].
  std::uint32_t add(std::uint32_t& handle, std::uint32_t owner, std::int64_t t,
                    std::uint32_t admitted, std::int64_t w,
                    std::uint32_t (&max_admitted)[ring_policies]) {
    if (handle == 0) handle = acquire(owner);
    ring& r = rings_[handle - 1];
    if (r.size != 0) {
      const std::int64_t newest = r.buf[(r.head + r.size - 1) & (r.capacity() - 1)].ts;
      if (t < newest) t = newest;
      const std::int64_t cut = t - w;
      while (r.size != 0 && r.buf[r.head].ts <= cut) {
        const std::uint32_t m = r.buf[r.head].admitted;
        for (std::size_t p = 0; p < ring_policies; ++p) r.count[p] -= (m >> p) & 1u;
        r.head = (r.head + 1) & (r.capacity() - 1);
        --r.size;
      }
    }
    if (r.size == r.capacity()) r.grow();
    r.buf[(r.head + r.size) & (r.capacity() - 1)] = entry{t, admitted};
    ++r.size;
    for (std::size_t p = 0; p < ring_policies; ++p) {
      r.count[p] += (admitted >> p) & 1u;
      if (r.count[p] > max_admitted[p]) max_admitted[p] = r.count[p];
    }
    return r.size;
  }

  /// A hint that the ring `handle` will be used soon.
  void prefetch(std::uint32_t handle) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    if (handle != 0) __builtin_prefetch(rings_.data() + (handle - 1));
#else
    (void)handle;
#endif
  }

  /// A hint that the entries of ring `handle` will be used soon (after `prefetch`).
  void prefetch_entries(std::uint32_t handle) const noexcept {
#if defined(__GNUC__) || defined(__clang__)
    if (handle != 0) {
      const ring& r = rings_[handle - 1];
      if (!r.buf.empty()) __builtin_prefetch(r.buf.data() + r.head);
    }
#else
    (void)handle;
#endif
  }

  /// Frees every ring whose newest call has left the window at `now`, and
  /// clears its owner's handle in `handles` (indexed by owner).
  template <class Handle>
  void release_stale(std::vector<Handle>& handles, std::int64_t now, std::int64_t w) {
    for (std::size_t i = 0; i < rings_.size(); ++i) {
      ring& r = rings_[i];
      if (r.owner == no_owner) continue;
      if (r.size != 0 && r.buf[(r.head + r.size - 1) & (r.capacity() - 1)].ts > now - w) continue;
      handles[r.owner].ring = 0;
      r.owner = no_owner;
      r.size = 0;
      r.head = 0;
      r.count = {};
      free_.push_back(static_cast<std::uint32_t>(i + 1));
    }
  }
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t n = rings_.capacity() * sizeof(ring) + free_.capacity() * sizeof(std::uint32_t);
    for (const ring& r : rings_) n += r.buf.capacity() * sizeof(entry);
    return n;
  }

 private:
  static constexpr std::uint32_t no_owner = 0xffffffff;
  struct entry {
    std::int64_t ts;
    std::uint32_t admitted;
  };
  struct ring {
    std::vector<entry> buf;
    std::uint32_t head = 0;
    std::uint32_t size = 0;
    std::uint32_t owner = no_owner;
    std::array<std::uint32_t, ring_policies> count{};
    [[nodiscard]] std::uint32_t capacity() const noexcept {
      return static_cast<std::uint32_t>(buf.size());
    }
    void grow() {
      std::vector<entry> next(buf.empty() ? 4 : buf.size() * 2);
      for (std::uint32_t i = 0; i < size; ++i) next[i] = buf[(head + i) & (capacity() - 1)];
      buf.swap(next);
      head = 0;
    }
  };
  std::uint32_t acquire(std::uint32_t owner) {
    std::uint32_t h = 0;
    if (!free_.empty()) {
      h = free_.back();
      free_.pop_back();
    } else {
      rings_.emplace_back();
      h = static_cast<std::uint32_t>(rings_.size());
    }
    rings_[h - 1].owner = owner;
    return h;
  }
  std::vector<ring> rings_;
  std::vector<std::uint32_t> free_;
};

/// What the tool remembers per key besides the policies' states: 12 bytes.
struct key_info {
  std::uint32_t raw_peak = 0;  ///< most calls (attempts) in any window
  std::uint32_t ring = 0;      ///< window_rings handle, 0 = none
  signed char label = -1;      ///< 1 if any event of the key is labelled 1, else 0 if labelled
  std::uint8_t blocked = 0;    ///< bit p: summary policy p rejected the key at least once
};

namespace detail {

/// A batch of parsed events: keys interned, so the policies never see text.
struct batch {
  std::vector<std::int64_t> ts;
  std::vector<std::uint32_t> id;
  std::vector<units> cost;
  std::vector<std::uint8_t> admitted;  ///< bit p: summary policy p admitted the event
  std::vector<signed char> label;
  std::string key_bytes;               ///< the batch's keys, back to back
  std::vector<std::uint32_t> key_end;  ///< end of each key in key_bytes
  std::vector<std::uint64_t> hash;     ///< hash_key of each key
  void clear() {
    ts.clear();
    id.clear();
    cost.clear();
    label.clear();
    key_bytes.clear();
    key_end.clear();
    hash.clear();
  }
};

/// How many events ahead the per-key loops fetch the state they will need.
inline constexpr std::size_t prefetch_distance = 12;

/// A hint that `p` will be read soon (no effect on results).
inline void prefetch(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

template <class P>
[[nodiscard]] std::size_t state_bytes(const typename P::state& s) noexcept {
  if constexpr (std::is_same_v<P, sliding_window_log>) {
    return sizeof(s) + s.capacity() * sizeof(sliding_window_log::entry);
  } else {
    return sizeof(s);
  }
}

/// One policy at one configuration over every key, its states in a dense
/// vector indexed by key id (the policy's own `P::step`, no store).
class lane {
 public:
  virtual ~lane() = default;
  /// Decides every event of `b`; a summary lane sets its bit in `b.admitted`,
  /// a sweep lane records the keys it rejected.
  virtual void run(batch& b) = 0;
  virtual void resize(std::size_t keys) = 0;
  /// Bytes of state of the keys not idle at `now`.
  [[nodiscard]] virtual std::size_t live_bytes(std::int64_t now) const = 0;
  [[nodiscard]] virtual std::size_t total_bytes() const = 0;
  [[nodiscard]] virtual units limit() const = 0;
  /// sizeof one key's state (what `resize` adds per key).
  [[nodiscard]] virtual std::size_t state_size() const noexcept = 0;
  /// Bytes of the state vector (and blocked bits) once `resize(keys)` has run.
  [[nodiscard]] virtual std::size_t bytes_after_resize(std::size_t keys) const noexcept = 0;
  /// Heap bytes the states hold beyond `state_size()` each (the sliding log's
  /// rings), kept current by `run` at no extra pass over the keys.
  [[nodiscard]] std::size_t heap_bytes() const noexcept { return heap_bytes_; }
  policy_id id = policy_id::fixed_window;
  int summary_slot = -1;        ///< bit in batch::admitted for summary lanes, -1 for sweep lanes
  std::size_t sweep_index = 0;  ///< sweep lanes: index into analysis_result::sweep
  std::uint64_t admitted = 0;
  std::uint64_t rejected = 0;
  std::vector<std::uint64_t> blocked;  ///< sweep lanes: bit per key, set when rejected
  double seconds = 0;
  std::size_t peak_bytes = 0;
  [[nodiscard]] bool was_blocked(std::size_t k) const noexcept {
    return ((blocked[k / 64] >> (k % 64)) & 1u) != 0;
  }

 protected:
  std::size_t heap_bytes_ = 0;
};

/// Decides one event on `s`, keeping `heap` equal to the heap bytes of all states.
template <class P>
decision tracked_step(const typename P::config& cfg, typename P::state& s, timestamp t, units cost,
                      std::size_t& heap) noexcept {
  if constexpr (std::is_same_v<P, sliding_window_log>) {
    const std::size_t before = s.heap_bytes();
    const decision d = P::step(cfg, s, t, cost);
    heap = heap + s.heap_bytes() - before;
    return d;
  } else {
    (void)heap;
    return P::step(cfg, s, t, cost);
  }
}

template <class P>
class policy_lane final : public lane {
 public:
  explicit policy_lane(typename P::config cfg) : cfg_(std::move(cfg)) {}

  void run(batch& b) override {
    const std::size_t n = b.ts.size();
    const std::int64_t* ts = b.ts.data();
    const std::uint32_t* id = b.id.data();
    const units* cost = b.cost.data();
    typename P::state* states = states_.data();
    std::uint64_t ok = 0;
    if (summary_slot >= 0) {
      std::uint8_t* mask = b.admitted.data();
      const int bit = summary_slot;
      for (std::size_t i = 0; i < n; ++i) {
        // Keys are in trace order, so states are touched at random: fetch ahead.
        if (i + prefetch_distance < n) prefetch(states + id[i + prefetch_distance]);
        const bool allowed =
            tracked_step<P>(cfg_, states[id[i]], timestamp{ts[i]}, cost[i], heap_bytes_).allowed;
        ok += allowed ? 1u : 0u;
        mask[i] = static_cast<std::uint8_t>(mask[i] | (static_cast<unsigned>(allowed) << bit));
      }
    } else {
      std::uint64_t* bits = blocked.data();
      for (std::size_t i = 0; i < n; ++i) {
        if (i + prefetch_distance < n) prefetch(states + id[i + prefetch_distance]);
        const std::uint32_t k = id[i];
        if (tracked_step<P>(cfg_, states[k], timestamp{ts[i]}, cost[i], heap_bytes_).allowed) {
          ++ok;
        } else {
          bits[k / 64] |= std::uint64_t{1} << (k % 64);
        }
      }
    }
    admitted += ok;
    rejected += n - ok;
  }
  void resize(std::size_t keys) override {
    if (states_.size() < keys) {
      // Grow geometrically (resize alone may allocate exactly) and account the capacity.
      if (states_.capacity() < keys) states_.reserve(std::max(keys, 2 * states_.capacity()));
      states_.resize(keys);
    }
    if (summary_slot < 0) blocked.resize((keys + 63) / 64, 0);
  }
  [[nodiscard]] std::size_t live_bytes(std::int64_t now) const override {
    std::size_t bytes = 0;
    for (const auto& s : states_) {
      if (!P::idle(cfg_, s, timestamp{now})) bytes += state_bytes<P>(s);
    }
    return bytes;
  }
  [[nodiscard]] std::size_t total_bytes() const override {
    std::size_t bytes = 0;
    for (const auto& s : states_) bytes += state_bytes<P>(s);
    return bytes;
  }
  [[nodiscard]] units limit() const override { return cfg_.limit(); }
  [[nodiscard]] std::size_t state_size() const noexcept override {
    return sizeof(typename P::state);
  }
  [[nodiscard]] std::size_t bytes_after_resize(std::size_t keys) const noexcept override {
    std::size_t cap = states_.capacity();
    if (cap < keys) cap = std::max(keys, 2 * cap);
    return cap * sizeof(typename P::state) +
           (summary_slot < 0 ? (keys + 63) / 64 * sizeof(std::uint64_t) : 0);
  }

 private:
  typename P::config cfg_;
  std::vector<typename P::state> states_;
};

[[nodiscard]] inline std::unique_ptr<lane> make_lane(policy_id id, const limiter_settings& s) {
  return with_policy(id, [&]<class P>() -> std::unique_ptr<lane> {
    auto l = std::make_unique<policy_lane<P>>(make_config<P>(s));
    l->id = id;
    return l;
  });
}

[[nodiscard]] inline double cpu_seconds() noexcept {
  // The process's own CPU time: what one core spends, not wall time.
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

}  // namespace detail

/// Reads the trace once and runs the five policies (summary) and every sweep
/// configuration side by side, in batches of 4,096 events. Each key is
/// interned once into a dense id; every policy keeps its states in a vector
/// indexed by that id. Memory: per key, the policies' states, `key_info` and
/// the key's bytes and index; window rings hold only the calls inside one
/// window. Nothing grows with the number of events.
///
/// CPU time (std::clock, the process's own) is split into `shared_seconds`
/// (reading, parsing, interning, labels, the window rings of every count, the
/// tool's memory sampling) and each policy's own `seconds` (its steps, its
/// state vector, its memory sampling); `total_seconds` is the whole pass.
///
/// A policy or sweep point that cannot take its settings (gcra above 1 call
/// per us, a burst too large for exact ticks) does not stop the run: it is
/// reported with `unavailable` set. Per-key memory (state vectors, sweep bits,
/// the sliding logs' rings, key index) is checked against
/// `opt.memory_budget` after every batch is interned and before the states
/// grow.
/// @throws input_error for a bad line (unless skipping), memory_budget_error
///         when the per-key state would pass the budget (naming --sweep when
///         the sweep is what multiplies it)
[[nodiscard]] inline analysis_result analyse(std::istream& in, const analysis_options& opt) {
  const double start = detail::cpu_seconds();
  analysis_result res;
  const std::int64_t w = opt.settings.r.period().count();
  res.window_us = w;

  std::vector<std::unique_ptr<detail::lane>> lanes;
  std::uint8_t summary_mask = 0;  ///< bits of the summary policies that run
  if (opt.summary) {
    for (const policy_id p : all_policies) {
      policy_summary ps;
      ps.id = p;
      ps.unavailable = with_policy(
          p, [&]<class P>() { return config_problem<P>(opt.settings, rate_flag(opt.settings.r)); });
      if (ps.unavailable.empty()) {
        auto l = detail::make_lane(p, opt.settings);
        l->summary_slot = static_cast<int>(p);
        summary_mask = static_cast<std::uint8_t>(summary_mask | (1u << static_cast<unsigned>(p)));
        lanes.push_back(std::move(l));
      }
      res.policies.push_back(std::move(ps));
    }
  }
  std::size_t sweep_lanes = 0;
  for (const policy_id p : opt.sweep_policies) {
    for (const units limit : opt.sweep_limits) {
      limiter_settings s = opt.settings;
      s.r = rate(limit, opt.settings.r.period());
      s.burst.reset();  // each swept limit is also its own burst
      sweep_point sp;
      sp.id = p;
      sp.limit = limit;
      sp.unavailable = with_policy(p, [&]<class P>() {
        return config_problem<P>(s, "--sweep limit " + std::to_string(limit));
      });
      if (sp.unavailable.empty()) {
        auto l = detail::make_lane(p, s);
        l->sweep_index = res.sweep.size();
        lanes.push_back(std::move(l));
        ++sweep_lanes;
      }
      res.sweep.push_back(std::move(sp));
    }
  }
  const std::size_t budget = opt.memory_budget != 0 ? opt.memory_budget : default_memory_budget();
  std::size_t state_per_key = 0;
  for (const auto& l : lanes) state_per_key += l->state_size();

  trace_reader reader(in, opt.skip_bad_lines);
  key_table keys;
  std::vector<key_info> info;
  window_rings rings;
  std::uint32_t max_admitted[ring_policies] = {};
  detail::batch b;
  constexpr std::size_t batch_size = 4096;
  b.ts.reserve(batch_size);
  b.id.reserve(batch_size);
  b.cost.reserve(batch_size);
  b.admitted.assign(batch_size, 0);
  std::int64_t now = 0;
  std::size_t since_sample = 0;
  bool more = true;
  double clock = detail::cpu_seconds();
  res.shared_seconds = clock - start;
  // Charges the CPU time since the last call to `slot`.
  const auto charge = [&clock](double& slot) {
    const double t = detail::cpu_seconds();
    slot += t - clock;
    clock = t;
  };

  // Refuses the run before the state vectors grow past the budget.
  const auto check_budget = [&] {
    std::size_t need = keys.memory_bytes() + info.capacity() * sizeof(key_info);
    for (const auto& l : lanes) need += l->bytes_after_resize(keys.size()) + l->heap_bytes();
    if (need <= budget) return;
    const std::string at = "at " + std::to_string(keys.size()) + " keys the run needs about " +
                           format_bytes(static_cast<double>(need)) +
                           ", over the memory budget of " +
                           format_bytes(static_cast<double>(budget)) +
                           " (half of this machine's memory, or of the address-space limit)";
    if (sweep_lanes > 0) {
      throw memory_budget_error("--sweep: " + std::to_string(opt.sweep_limits.size()) +
                                " limits x " + std::to_string(opt.sweep_policies.size()) +
                                " policies run " + std::to_string(sweep_lanes) +
                                " configurations side by side, " +
                                format_bytes(static_cast<double>(state_per_key)) +
                                " of policy state per key; " + at + "; sweep fewer limits");
    }
    throw memory_budget_error("the input has too many keys: " + at);
  };

  while (more) {
    b.clear();
    event e;
    while (b.ts.size() < batch_size && (more = reader.next(e))) {
      if (e.label >= 0) res.labelled = true;
      if (res.events == 0) res.first_ts = e.ts_us;
      res.first_ts = std::min(res.first_ts, e.ts_us);
      res.last_ts = std::max(res.last_ts, e.ts_us);
      ++res.events;
      b.ts.push_back(e.ts_us);
      b.cost.push_back(e.cost);
      b.label.push_back(e.label);
      b.key_bytes.append(e.key);
      b.key_end.push_back(static_cast<std::uint32_t>(b.key_bytes.size()));
      b.hash.push_back(hash_key(e.key));
    }
    const std::size_t n = b.ts.size();
    // Intern the batch's keys, one table lookup per event for every policy,
    // fetching the slots and key bytes a few events ahead.
    b.id.resize(n);
    for (std::size_t i = 0, start = 0; i < n; ++i) {
      if (i + 16 < n) keys.prefetch(b.hash[i + 16], 0);
      if (i + 8 < n) keys.prefetch(b.hash[i + 8], 1);
      if (i + 4 < n) keys.prefetch(b.hash[i + 4], 2);
      const std::string_view key(b.key_bytes.data() + start, b.key_end[i] - start);
      start = b.key_end[i];
      bool fresh = false;
      b.id[i] = keys.intern(key, b.hash[i], fresh);
      if (fresh) info.emplace_back();
    }
    std::fill_n(b.admitted.begin(), n, std::uint8_t{0});
    check_budget();
    charge(res.shared_seconds);
    for (auto& l : lanes) {
      l->resize(keys.size());
      l->run(b);
      charge(l->seconds);
    }
    // The window rings: every attempt, and per summary policy the admitted calls.
    const std::uint8_t rejected_mask = summary_mask;
    for (std::size_t i = 0; i < n; ++i) {
      if (i + 2 * detail::prefetch_distance < n) {
        detail::prefetch(info.data() + b.id[i + 2 * detail::prefetch_distance]);
      }
      if (i + detail::prefetch_distance < n) {
        rings.prefetch(info[b.id[i + detail::prefetch_distance]].ring);
      }
      if (i + detail::prefetch_distance / 2 < n) {
        rings.prefetch_entries(info[b.id[i + detail::prefetch_distance / 2]].ring);
      }
      const std::uint32_t k = b.id[i];
      key_info& ki = info[k];
      if (b.label[i] > ki.label) ki.label = b.label[i];
      const std::uint32_t m = b.admitted[i];
      const std::uint32_t c = rings.add(ki.ring, k, b.ts[i], m, w, max_admitted);
      if (c > ki.raw_peak) ki.raw_peak = c;
      ki.blocked = static_cast<std::uint8_t>(ki.blocked | (~m & rejected_mask));
      now = std::max(now, b.ts[i]);
    }
    since_sample += n;
    if (since_sample >= opt.sample_every || !more) {
      since_sample = 0;
      std::size_t sweep_bits = 0;
      for (const auto& l : lanes) sweep_bits += l->blocked.capacity() * sizeof(std::uint64_t);
      res.tool_bytes = std::max(res.tool_bytes, keys.memory_bytes() +
                                                    info.capacity() * sizeof(key_info) +
                                                    rings.memory_bytes() + sweep_bits);
      rings.release_stale(info, now, w);
      charge(res.shared_seconds);
      for (auto& l : lanes) {
        if (l->summary_slot >= 0) {
          l->peak_bytes = std::max(l->peak_bytes, l->live_bytes(now));
          charge(l->seconds);
        }
      }
    } else {
      // Rings are freed after every batch; memory is sampled less often.
      rings.release_stale(info, now, w);
      charge(res.shared_seconds);
    }
  }

  res.keys = keys.size();
  res.skipped = reader.skipped();
  res.first_skipped = reader.first_skipped();
  for (const key_info& ki : info) {
    if (ki.label == 1) ++res.abusive_keys;
    if (ki.label == 0) ++res.normal_keys;
    res.key_peaks.emplace_back(ki.raw_peak, ki.label);
  }
  for (const auto& l : lanes) {
    if (l->summary_slot >= 0) {
      policy_summary& s = res.policies[static_cast<std::size_t>(l->summary_slot)];
      s.limit = l->limit();
      s.admitted = l->admitted;
      s.rejected = l->rejected;
      const auto slot = static_cast<std::size_t>(l->summary_slot);
      for (const key_info& ki : info) {
        if ((ki.blocked >> slot) & 1u) ++s.keys_blocked;
      }
      s.max_in_window = max_admitted[slot];
      s.state_bytes_per_key = res.keys == 0 ? 0.0
                                            : static_cast<double>(l->total_bytes()) /
                                                  static_cast<double>(res.keys);
      s.state_peak_bytes = l->peak_bytes;
      s.seconds = l->seconds;
    } else {
      sweep_point& p = res.sweep[l->sweep_index];
      p.rejected = l->rejected;
      for (std::size_t k = 0; k < info.size(); ++k) {
        if (!l->was_blocked(k)) continue;
        ++p.keys_blocked;
        if (info[k].label == 1) ++p.abusive_caught;
        if (info[k].label == 0) ++p.normal_blocked;
      }
    }
  }
  res.total_seconds = detail::cpu_seconds() - start;
  return res;
}

}  // namespace ratelimit::replay::reference
