// SPDX-License-Identifier: Apache-2.0
// The cluster store's async checks (async_apply, and the blocking checks made
// through the multiplexers): each check is a job queued on the multiplexer of
// the node owning its slot; MOVED, ASK, TRYAGAIN and NOSCRIPT are followed
// from its completion, which queues it again (TRYAGAIN through the retry
// thread, cluster/retry_queue.hpp). Included by cluster_store.hpp.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ratelimit/redis/cluster_store.hpp"

namespace ratelimit::redis {

/// The ASKING sent right before a check an ASK redirected (its reply, +OK,
/// is dropped; a failure shows in the check's own reply).
struct cluster_store::asking_job final : mux_job {
  node_ptr node;  ///< keeps the node (and the multiplexer it is queued on) alive
  void complete(std::unique_ptr<mux_job>, reply_ptr, std::exception_ptr) noexcept override {}
};

/// One single check through the nodes' multiplexers: EVALSHA (EVAL once
/// after NOSCRIPT), sent again after MOVED, ASK or TRYAGAIN (the script did
/// not run) from the completion, to the node named; never sent again after
/// a failure or timeout (it may have run). Holds its node, so a node that
/// left the slot map lives until its last check completes.
template <class Config, class Handler>
struct cluster_store::check_job final : detail::cluster_job {
  check_job(shared* st, const Config& c, std::string_view k, std::optional<timestamp> t, units n,
            access acc, Handler&& h)
      : s(st),
        cfg(c),
        key(k),
        keys(detail::redis_keys(st->opts.node.prefix, c, k)),
        slot(key_slot(keys.front())),
        now(t),
        cost(n),
        a(acc),
        handler(std::move(h)) {
    s->live_checks.fetch_add(1, std::memory_order_relaxed);
  }
  check_job(const check_job&) = delete;
  check_job& operator=(const check_job&) = delete;
  /// Last touch of the store (the members, the node, go after).
  ~check_job() override { s->live_checks.fetch_sub(1, std::memory_order_release); }

  shared* s;
  Config cfg;
  std::string key;
  std::vector<std::string> keys;
  std::uint16_t slot;
  std::optional<timestamp> now;
  units cost;
  access a;
  Handler handler;
  node_ptr node;
  std::size_t hops = 0;
  bool asking = false;
  /// Refused by the node's pending cap (multiplexer_full): local overload,
  /// not a fault of the node, so no failure for its circuit breaker.
  bool refused_full = false;
  bool with_text = false;

  /// The command: EVALSHA, or EVAL with the script's text.
  void build() {
    detail::write_check_command(bytes, with_text, cfg, keys, now, cost, a, s->floor_ms);
  }

  void deliver(const decision& d, std::exception_ptr e) noexcept {
    ++in_handler();
    detail::call_handler(handler, d, std::move(e));
    --in_handler();
  }

  /// Has the failure policy decide after `e` (not counted here).
  void degrade_and_deliver(const std::exception_ptr& e) noexcept {
    detail::degrade_and_deliver(
        s->degrader, s->stats, cfg, key, now, cost, a, e,
        [this](const decision& d, std::exception_ptr x) { deliver(d, std::move(x)); });
  }

  /// Counts `e` and has the failure policy decide.
  void fail(const std::exception_ptr& e) noexcept {
    detail::count_error(s->stats, e);
    degrade_and_deliver(e);
  }

  /// Queues this check, owned by `self`, on its node's multiplexer (behind
  /// an ASKING after an ASK), or decides it here when the node's breaker
  /// is open or no I/O thread can be started (`self` then consumed).
  /// Nothing of this job is touched once it is queued: another thread may
  /// complete it at once.
  /// @return false when the multiplexer is stopped (the store is being
  ///   destroyed; `self` kept)
  /// @throws std::bad_alloc (nothing queued)
  bool send(std::unique_ptr<mux_job>& self) {
    const node_ptr n = node;  // outlives the submit even if the check completes meanwhile
    if (n->gate.enter() == detail::breaker::verdict::refuse) {
      s->stats.short_circuited.fetch_add(1, std::memory_order_relaxed);
      s->request_refresh();
      const auto err = std::make_exception_ptr(
          connection_error("ratelimit: redis: circuit breaker of " + detail::escaped_name(n->name) +
                           " open (it failed recently)"));
      degrade_and_deliver(err);
      self.reset();
      return true;
    }
    build();
    try {
      if (!asking) return n->mux.submit(self);
      auto ask_job = std::make_unique<asking_job>();
      const std::string_view ask_args[] = {"ASKING"};
      append_command(ask_job->bytes, ask_args, 1);
      ask_job->until = until;
      ask_job->node = n;
      std::unique_ptr<mux_job> ask_base(std::move(ask_job));
      // Both on one connection, nothing queued between them, counted as
      // one check under the pending cap (never a lone ASKING).
      return n->ask_mux.submit_pair(ask_base, self);
    } catch (const multiplexer_full&) {
      // Nothing of this check was sent, and the node did not fail.
      refused_full = true;
      mux_job* j = self.get();
      j->complete(std::move(self), nullptr, std::current_exception());
      return true;
    } catch (const connection_error&) {
      // No eventfd or I/O thread: nothing of this check was sent.
      mux_job* j = self.get();
      j->complete(std::move(self), nullptr, std::current_exception());
      return true;
    }
  }

  /// Sends the check again (the script did not run).
  void resend(std::unique_ptr<mux_job>& self) noexcept override {
    std::exception_ptr error;
    try {
      if (send(self)) return;
      deliver(decision{}, std::make_exception_ptr(multiplexer_stopped(
                              "ratelimit: redis: the store is being destroyed")));
      return;
    } catch (...) {
      error = std::current_exception();
    }
    fail(error);
  }

  void complete(std::unique_ptr<mux_job> self, reply_ptr r,
                std::exception_ptr error) noexcept override {
    // Marks the node's I/O thread as this store's before a handler runs
    // there (complete() also runs at destruction, on the destroying thread,
    // and inline when nothing could be sent: those are not marked).
    if (detail::cluster_thread_mark() != s->id && node->on_io_thread()) {
      detail::cluster_thread_mark() = s->id;
    }
    if (error) {
      if (s->stopping_io.load(std::memory_order_acquire)) {
        deliver(decision{}, error);
        return;
      }
      // Never resent: it may have run. The node may be gone or demoted.
      if (!refused_full) {
        s->gate_failed(*node);
        s->request_refresh();
      }
      fail(error);
      return;
    }
    node->gate.success();  // the node answered
    if (r->type != REDIS_REPLY_ERROR) {
      decision d;
      try {
        d = detail::parse_reply(cfg, *r);
      } catch (...) {
        fail(std::current_exception());
        return;
      }
      s->stats.store.fetch_add(1, std::memory_order_relaxed);
      deliver(d, nullptr);
      return;
    }
    // Every answer below but the last two means the script did not run.
    const bool again = ++hops <= s->max_redirects;
    try {
      if (detail::is_noscript(*r)) {
        s->stats.script_reloads.fetch_add(1, std::memory_order_relaxed);
        with_text = true;
      } else if (auto d = detail::parse_redirect(*r, node->opts.host, slot)) {
        if (d->ask) {
          s->ask.fetch_add(1, std::memory_order_relaxed);
          node = s->node_at(d->to);
          asking = true;
        } else {
          s->moved.fetch_add(1, std::memory_order_relaxed);
          node = s->learn(d->slot, d->to);
          asking = false;
          s->request_refresh();
        }
      } else if (detail::error_starts(*r, "TRYAGAIN")) {
        s->tryagain.fetch_add(1, std::memory_order_relaxed);
        asking = false;
        if (node_ptr o = s->owner(slot)) node = std::move(o);
        // The rest of the slot's keys are being moved: sent again 5 ms
        // later (by the retry thread: nothing waits here), at once when
        // that would pass the deadline.
        const deadline due = deadline_clock::now() + std::chrono::milliseconds(5);
        if (again && due < until) {
          if (s->retries.resend_at(due, self)) return;
          deliver(decision{}, std::make_exception_ptr(multiplexer_stopped(
                                  "ratelimit: redis: the store is being destroyed")));
          return;
        }
      } else if (detail::error_starts(*r, "CLUSTERDOWN") ||
                 detail::error_starts(*r, "MASTERDOWN") || detail::error_starts(*r, "LOADING")) {
        s->request_refresh();
        fail(std::make_exception_ptr(
            connection_error("ratelimit: redis: " + detail::escaped_name(node->name) +
                             " answered " + detail::reply_text(*r))));
        return;
      } else {
        fail(std::make_exception_ptr(
            script_error("ratelimit: redis: script failed: " + detail::reply_text(*r))));
        return;
      }
      if (!again) {
        fail(std::make_exception_ptr(
            script_error("ratelimit: redis: more than " + std::to_string(s->max_redirects) +
                         " redirects for one check (last: " + detail::reply_text(*r) + ")")));
        return;
      }
    } catch (...) {
      fail(std::current_exception());  // bad_alloc learning a node
      return;
    }
    if (s->stopping_io.load(std::memory_order_acquire)) {
      deliver(decision{}, std::make_exception_ptr(multiplexer_stopped(
                              "ratelimit: redis: the store is being destroyed")));
      return;
    }
    resend(self);
  }
};

/// Starts one check on the multiplexer of the node owning its slot (a
/// seed when the slot has no known owner), or decides it at once when
/// that node's breaker is open. `handler` gets the outcome exactly once.
template <class Config, class Handler>
void cluster_store::start_check(const Config& cfg, std::string_view key,
                                std::optional<timestamp> now, units cost, access a,
                                Handler&& handler) {
  detail::check_same_process(shared_->owner_pid);
  shared& st = *shared_;
  using job_t = check_job<Config, std::decay_t<Handler>>;
  auto job = std::make_unique<job_t>(&st, cfg, key, now, cost, a, std::move(handler));
  job->until = deadline_clock::now() + st.command_timeout;
  job->node = st.owner(job->slot);
  if (job->node == nullptr) {
    // No map yet, or none naming the slot: a seed answers or redirects.
    st.request_refresh();
    job->node = st.node_at(st.opts.seeds[job->slot % st.opts.seeds.size()]);
  }
  job_t* j = job.get();
  std::unique_ptr<mux_job> base(std::move(job));
  if (!j->send(base)) throw multiplexer_stopped("ratelimit: redis: the store is being destroyed");
}

}  // namespace ratelimit::redis
