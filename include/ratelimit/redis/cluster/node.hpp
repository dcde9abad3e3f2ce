// SPDX-License-Identifier: Apache-2.0
// One Redis Cluster node as the cluster store holds it: pool, breaker and
// multiplexers, and how it is deleted.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/multiplexer.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/redis_store.hpp"

namespace ratelimit::redis::detail {

/// One cluster node: its connection pool and circuit breaker. Owned by the
/// slot map and by the checks and probes using it: a node that left the map
/// is closed when the last of them lets go.
///
/// Single checks through a multiplexer (options::multiplex > 0, and every
/// async check) go out on `mux`; a check an ASK sent here goes out on
/// `ask_mux` (one connection) right behind its ASKING, both queued at once
/// (multiplexer::submit_pair) so nothing comes between them and they count
/// as one check under `multiplex_max_pending`. The multiplexers start their
/// I/O threads on first use.
struct cluster_node : std::enable_shared_from_this<cluster_node> {
  cluster_node(std::string n, options o)
      : name(std::move(n)),
        opts(std::move(o)),
        pool(opts),
        gate(opts),
        mux(opts, opts.multiplex, hook()),
        ask_mux(opts, 1, hook()) {}
  cluster_node(const cluster_node&) = delete;
  cluster_node& operator=(const cluster_node&) = delete;

  std::string name;  ///< "host:port" (as is: messages quote it through detail::escaped_name)
  options opts;
  connection_pool pool;
  breaker gate;
  multiplexer mux;
  multiplexer ask_mux;
  const pid_t owner_pid = ::getpid();

  /// True on the I/O thread of one of the node's multiplexers.
  [[nodiscard]] bool on_io_thread() const noexcept {
    return mux.on_io_thread() || ask_mux.on_io_thread();
  }

  /// Stops both multiplexers: every check queued or in flight on them gets
  /// multiplexer_stopped. Idempotent.
  void stop_io() noexcept {
    mux.stop();
    ask_mux.stop();
  }

 private:
  /// New multiplexed connections read maxmemory-policy as the pool's do.
  multiplexer::connect_hook hook() {
    return [this](connection& c, deadline start) { pool.check_new_connection(c, start); };
  }
};

/// A check through a node's multiplexer that can be sent again (after
/// TRYAGAIN, by the store's retry thread).
struct cluster_job : mux_job {
  /// Sends the check again, owned by `self`; completes it when that fails.
  virtual void resend(std::unique_ptr<mux_job>& self) noexcept = 0;
};

/// Deletes a node, as delete_unless_forked (leaked in a forked child). The
/// last owner of a node may be a check completing on the node's own I/O
/// thread, which cannot join itself: a thread of its own deletes the node then.
struct cluster_node_deleter {
  void operator()(cluster_node* n) const noexcept {
    if (n->owner_pid != ::getpid()) return;
    if (n->on_io_thread()) {
      try {
        std::thread([n] { delete n; }).detach();
        return;
      } catch (...) {
        // No thread: joining itself below ends in std::terminate.
      }
    }
    delete n;
  }
};

}  // namespace ratelimit::redis::detail
