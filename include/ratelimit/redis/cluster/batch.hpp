// SPDX-License-Identifier: Apache-2.0
// The cluster store's pooled path (apply() without multiplexing, apply_once(),
// apply_batch()): rounds of pipelines, one per node, all nodes written before
// any reply is read. Included by cluster_store.hpp.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ratelimit/redis/cluster_store.hpp"

namespace ratelimit::redis {

/// What became of one check.
enum class cluster_store::fate : unsigned char {
  pending,   ///< to be sent (again)
  done,      ///< decided by Redis
  failed,    ///< no answer: the failure policy decides; the error is not counted yet
  degraded,  ///< no answer, error already counted (or none: breaker open)
};

struct cluster_store::item {
  std::string key;
  std::vector<std::string> keys;
  std::string time;
  std::string cost;
  node_ptr node;
  std::size_t hops = 0;
  bool asking = false;
  bool with_text = false;
  fate state = fate::pending;
  std::exception_ptr error;
};

/// The items of one round trip to one node.
struct cluster_store::group {
  detail::cluster_node* node = nullptr;
  std::vector<std::size_t> items;
  detail::breaker::verdict verdict = detail::breaker::verdict::go;
  std::optional<connection_pool::lease> lease;
  std::exception_ptr failure;
  bool settled = false;  ///< the breaker was told the outcome
};

template <class Config>
std::vector<decision> cluster_store::run_items(const Config& cfg, std::span<const batch_item> items,
                                               bool server_time, access a) {
  const detail::batch_columns c = detail::split_batch(items, server_time);
  return run(cfg, c.keys, c.costs, c.times, a);
}

inline void cluster_store::node_failed(group& g, std::exception_ptr e) {
  shared& s = *shared_;
  g.failure = e;
  g.settled = true;
  detail::count_error(s.stats, e);
  s.gate_failed(*g.node);
  s.request_refresh();
}

/// Rounds of pipelines, one per node, until every check is decided or given
/// up: redirects and NOSCRIPT go round again; a check whose round trip broke
/// or timed out is never sent again.
template <class Config>
std::vector<decision> cluster_store::run(const Config& cfg, std::span<const std::string_view> keys,
                                         std::span<const units> costs,
                                         std::span<const timestamp> times, access a,
                                         const detail::once_request* once) {
  using P = typename Config::policy_type;
  detail::check_same_process(shared_->owner_pid);
  shared& s = *shared_;
  detail::counters& c = s.stats;
  const std::size_t n = keys.size();
  std::vector<decision> out(n);
  if (n == 0) return out;
  const bool server_time = times.empty();
  const std::string_view floor = server_time ? std::string_view("0") : std::string_view(s.floor_ms);
  std::vector<item> items(n);
  try {
    s.ensure_map();
    for (std::size_t i = 0; i < n; ++i) {
      item& it = items[i];
      it.keys = detail::redis_keys(shared_->opts.node.prefix, cfg, keys[i]);
      it.key = it.keys.front();
      if (once != nullptr) {
        it.keys.push_back(detail::once_key(shared_->opts.node.prefix, cfg, keys[i], once->id));
      }
      if (!server_time) it.time = std::to_string(times[i].count());
      it.cost = std::to_string(costs[i]);
      it.node = s.owner(key_slot(it.key));
      if (it.node == nullptr) {
        it.state = fate::failed;
        it.error = std::make_exception_ptr(connection_error(
            "ratelimit: redis: no known master for slot " + std::to_string(key_slot(it.key))));
        s.request_refresh();
      }
    }
  } catch (const connection_error&) {
    const std::exception_ptr e = std::current_exception();
    detail::count_error(c, e);
    for (std::size_t i = 0; i < n; ++i) {
      items[i].state = fate::degraded;
      items[i].error = e;
    }
  }

  std::vector<std::string> policy_args;
  script_for<P>::append_args(cfg, policy_args);
  deadline until = deadline_clock::now() + s.command_timeout;
  std::string buf;
  for (;;) {
    // Group what is left by node, in one global order (node address) so two
    // threads never wait for each other's pooled connections.
    std::map<detail::cluster_node*, group> groups;
    for (std::size_t i = 0; i < n; ++i) {
      if (items[i].state != fate::pending) continue;
      group& g = groups[items[i].node.get()];
      g.node = items[i].node.get();
      g.items.push_back(i);
    }
    if (groups.empty()) break;

    // Write every node's pipeline, then read every node's replies.
    bool wait_before_retry = false;
    try {
      for (auto& [node, g] : groups) {
        g.verdict = node->gate.enter();
        if (g.verdict == detail::breaker::verdict::refuse) {
          g.settled = true;
          c.short_circuited.fetch_add(g.items.size(), std::memory_order_relaxed);
          g.failure = std::make_exception_ptr(
              connection_error("ratelimit: redis: circuit breaker of " +
                               detail::escaped_name(node->name) + " open (it failed recently)"));
          s.request_refresh();
          continue;
        }
        try {
          g.lease.emplace(node->pool.acquire(until));
          // Making a connection (bounded by connect_timeout) does not eat
          // into the round trip's command_timeout.
          until += g.lease->connect_time();
          buf.clear();
          bool text_sent = false;
          for (const std::size_t i : g.items) {
            const item& it = items[i];
            if (it.asking) {
              const std::string_view ask_args[] = {"ASKING"};
              append_command(buf, ask_args, 1);
            }
            // After NOSCRIPT one EVAL per node loads the script for the rest.
            const bool text = it.with_text && !text_sent;
            text_sent = text_sent || text;
            if (once != nullptr) {
              detail::append_eval_once<P>(buf, text, it.keys, it.time, it.cost, a, policy_args,
                                          floor, once->limit, once->retention_us);
            } else {
              detail::append_eval<P>(buf, text, it.keys, it.time, it.cost, a, policy_args, floor);
            }
          }
          g.lease->send(buf, until);  // resent only if closed before a byte left
        } catch (const connection_error&) {
          node_failed(g, std::current_exception());
        }
      }

      for (auto& [node, g] : groups) {
        if (g.failure) {
          for (const std::size_t i : g.items) {
            items[i].state = fate::degraded;
            items[i].error = g.failure;
          }
          continue;
        }
        std::size_t next = 0;
        bool noscript = false;
        try {
          for (; next < g.items.size(); ++next) {
            item& it = items[g.items[next]];
            if (it.asking) (void)(*g.lease)->receive(until);
            reply_ptr r = (*g.lease)->receive(until);
            classify(cfg, it, *r, node, out[g.items[next]], noscript, wait_before_retry,
                     once != nullptr);
          }
          g.settled = true;
          node->gate.success();
        } catch (const connection_error&) {
          node_failed(g, std::current_exception());
          // The checks without a reply may or may not have run: never resent.
          for (; next < g.items.size(); ++next) {
            items[g.items[next]].state = fate::degraded;
            items[g.items[next]].error = g.failure;
          }
        }
        if (noscript) c.script_reloads.fetch_add(1, std::memory_order_relaxed);
      }
    } catch (...) {
      // Not an I/O error (e.g. bad_alloc): replies may be left unread, so
      // no connection of this round goes back to a pool; no probe is left open.
      for (auto& [node, g] : groups) {
        if (g.lease) (*g.lease)->mark_broken();
        if (!g.settled) shared_->gate_failed(*node);
      }
      throw;
    }
    groups.clear();  // leases back to their pools before any wait
    if (wait_before_retry) {
      const auto pause = std::chrono::milliseconds(5);
      if (deadline_clock::now() + pause < until) std::this_thread::sleep_for(pause);
    }
  }

  for (std::size_t i = 0; i < n; ++i) {
    item& it = items[i];
    if (it.state == fate::done) {
      c.store.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (it.state == fate::failed) detail::count_error(c, it.error);
    out[i] = s.degrader.degrade(
        c, cfg, keys[i],
        server_time ? std::optional<timestamp>{} : std::optional<timestamp>{times[i]}, costs[i], a,
        it.error);
  }
  return out;
}

/// Decides what one reply means for its check.
template <class Config>
void cluster_store::classify(const Config& cfg, item& it, const redisReply& r,
                             detail::cluster_node* node, decision& out, bool& noscript, bool& wait,
                             bool once) {
  shared& s = *shared_;
  if (r.type != REDIS_REPLY_ERROR) {
    try {
      out = once ? detail::parse_reply_once(cfg, r) : detail::parse_reply(cfg, r);
      it.state = fate::done;
    } catch (const script_error&) {
      it.state = fate::failed;
      it.error = std::current_exception();
    }
    return;
  }
  // Every answer below means the script did not run, so resending is safe.
  const bool again = ++it.hops <= s.max_redirects;
  if (detail::is_noscript(r)) {
    noscript = true;
    it.with_text = true;
    if (again) return;
  } else if (auto d = detail::parse_redirect(r, node->opts.host, key_slot(it.keys.front()))) {
    if (d->ask) {
      s.ask.fetch_add(1, std::memory_order_relaxed);
      it.node = s.node_at(d->to);
      it.asking = true;
    } else {
      s.moved.fetch_add(1, std::memory_order_relaxed);
      it.node = s.learn(d->slot, d->to);
      it.asking = false;
      s.request_refresh();
    }
    if (again) return;
  } else if (detail::error_starts(r, "TRYAGAIN")) {
    s.tryagain.fetch_add(1, std::memory_order_relaxed);
    wait = true;
    if (again) return;
  } else if (detail::error_starts(r, "CLUSTERDOWN") || detail::error_starts(r, "MASTERDOWN") ||
             detail::error_starts(r, "LOADING")) {
    // The node cannot serve the slot now (failover in progress): the
    // failure policy decides, and the slot map is read again.
    s.request_refresh();
    it.state = fate::failed;
    it.error = std::make_exception_ptr(
        connection_error("ratelimit: redis: " + detail::escaped_name(node->name) + " answered " +
                         detail::reply_text(r)));
    return;
  } else {
    it.state = fate::failed;
    it.error = std::make_exception_ptr(
        script_error("ratelimit: redis: script failed: " + detail::reply_text(r)));
    return;
  }
  it.state = fate::failed;
  it.error = std::make_exception_ptr(
      script_error("ratelimit: redis: more than " + std::to_string(s.max_redirects) +
                   " redirects for one check (last: " + detail::reply_text(r) + ")"));
}

}  // namespace ratelimit::redis
