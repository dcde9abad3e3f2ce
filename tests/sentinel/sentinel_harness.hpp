// SPDX-License-Identifier: Apache-2.0
// Test helper: a throwaway Redis master, one replica and three sentinels,
// child processes on free 127.0.0.1 ports, with no persistence.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../cluster/cluster_harness.hpp"
#include "../redis/redis_server.hpp"
#include "ratelimit/redis.hpp"

namespace rltest {

/// Path of redis-sentinel ($RATELIMIT_REDIS_SENTINEL, else next to redis-server).
/// @throws std::runtime_error saying how to install it
inline std::string redis_sentinel_path() {
  if (const char* p = std::getenv("RATELIMIT_REDIS_SENTINEL"); p != nullptr && *p != '\0') return p;
  std::string p = redis_server_path();
  const auto slash = p.rfind('/');
  p = (slash == std::string::npos ? std::string() : p.substr(0, slash + 1)) + "redis-sentinel";
  if (::access(p.c_str(), X_OK) != 0) {
    throw std::runtime_error(
        "redis-sentinel not found next to redis-server: the Sentinel tests run real sentinels; "
        "apt-get install redis-sentinel (scripts/deps.sh does)");
  }
  return p;
}

/// One sentinel: `redis-sentinel <config>` on a free port, with a config file
/// of its own in `dir` (a sentinel rewrites its config file, so it must be
/// writable), killed by PID when destroyed.
class sentinel_process {
 public:
  /// With `auth`, the master's default user has the password "mpw" and the
  /// sentinel's default user "spw" (for the other sentinels), and an ACL user
  /// "watch" with password "wpw" may run every command.
  sentinel_process(const std::filesystem::path& dir, int master_port, std::string_view name,
                   int down_after_ms, int failover_timeout_ms, bool auth = false)
      : auth_(auth) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port();
      const auto conf = dir / ("sentinel-" + std::to_string(port_) + ".conf");
      {
        std::ofstream f(conf);
        f << "port " << port_ << "\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\n"
          << "dir " << dir.string() << "\n"
          << "sentinel monitor " << name << " 127.0.0.1 " << master_port << " 2\n"
          << "sentinel down-after-milliseconds " << name << " " << down_after_ms << "\n"
          << "sentinel failover-timeout " << name << " " << failover_timeout_ms << "\n"
          << "sentinel parallel-syncs " << name << " 1\n";
        if (auth) {
          f << "sentinel auth-pass " << name
            << " mpw\nrequirepass spw\nsentinel sentinel-pass spw\n"
            << "user watch on >wpw +@all ~* &*\n";
        }
      }
      pid_ = spawn({redis_sentinel_path(), conf.string()});
      if (wait_ping()) return;
      stop();
    }
    throw std::runtime_error("redis-sentinel did not start (tried 5 ports)");
  }
  sentinel_process(const sentinel_process&) = delete;
  sentinel_process& operator=(const sentinel_process&) = delete;
  ~sentinel_process() { stop(); }

  void stop() noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] ratelimit::redis::options options() const {
    ratelimit::redis::options o;
    o.port = port_;
    o.connect_timeout = std::chrono::milliseconds(1000);
    if (auth_) o.password = "spw";
    return o;
  }

 private:
  bool wait_ping() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      try {
        if (command(options(), {"PING"})->type == REDIS_REPLY_STATUS) return true;
      } catch (const ratelimit::store_error&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  bool auth_ = false;
  int port_ = 0;
  pid_t pid_ = -1;
};

/// A master, one replica of it and three sentinels monitoring it as `name`
/// (quorum 2), with `down_after_ms` and `failover_timeout_ms` small so a
/// failover takes a second or two. Config files (and the RDB file a replica
/// writes when it syncs) live in a temporary directory removed at the end; every process is killed by PID in the
/// destructor (and by the kernel when this process dies).
class sentinel_group {
 public:
  static constexpr std::string_view name = "rlmaster";

  /// With `auth`: the master has an ACL user "app" (password "apw") and its
  /// default user the password "mpw"; for the sentinels see sentinel_process.
  explicit sentinel_group(bool auth = false, int down_after_ms = 400,
                          int failover_timeout_ms = 2000)
      : dir_(make_dir()),
        master_(std::make_unique<redis_server>(
            std::vector<std::string>{"--repl-diskless-sync-delay", "0", "--dir", dir_.string()})),
        replica_(std::make_unique<redis_server>(replica_args(auth))) {
    if (auth) {
      const auto o = master_->options();
      command(o, {"ACL", "SETUSER", "app", "on", ">apw", "+@all", "~*", "&*"});
      command(o, {"CONFIG", "SET", "requirepass", "mpw"});
    }
    for (int i = 0; i < 3; ++i) {
      sentinels_.push_back(std::make_unique<sentinel_process>(
          dir_, master_->port(), name, down_after_ms, failover_timeout_ms, auth));
    }
  }
  sentinel_group(const sentinel_group&) = delete;
  sentinel_group& operator=(const sentinel_group&) = delete;
  ~sentinel_group() {
    sentinels_.clear();
    replica_.reset();
    master_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  [[nodiscard]] redis_server& master() { return *master_; }
  [[nodiscard]] redis_server& replica() { return *replica_; }
  [[nodiscard]] sentinel_process& sentinel(std::size_t i) { return *sentinels_.at(i); }

  /// `redis-sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/rlmaster`.
  [[nodiscard]] std::string url(std::string_view master_name = name) const {
    std::string u = "redis-sentinel://";
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
      u += (i == 0 ? "" : ",") + std::string("127.0.0.1:") + std::to_string(sentinels_[i]->port());
    }
    return u + "/" + std::string(master_name);
  }

  /// The master's port as sentinel `i` reports it (0 when it reports none).
  [[nodiscard]] int reported_master_port(std::size_t i) {
    try {
      auto r = command(sentinels_.at(i)->options(), {"SENTINEL", "get-master-addr-by-name", name});
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
        return std::stoi(std::string(r->element[1]->str, r->element[1]->len));
      }
    } catch (const std::exception&) {
    }
    return 0;
  }

  /// Waits until the replica is in sync and every sentinel knows it and the
  /// two other sentinels (needed for a failover: quorum and a majority to vote).
  /// @return false when that took longer than `limit`
  bool wait_ready(std::chrono::milliseconds limit = std::chrono::seconds(15)) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      bool ready = false;
      try {
        auto info = command(replica_->options(), {"INFO", "replication"});
        ready = std::string_view(info->str, info->len).find("master_link_status:up") !=
                std::string_view::npos;
      } catch (const std::exception&) {
      }
      for (auto& s : sentinels_) {
        try {
          auto others = command(s->options(), {"SENTINEL", "sentinels", name});
          auto replicas = command(s->options(), {"SENTINEL", "replicas", name});
          ready = ready && others->type == REDIS_REPLY_ARRAY && others->elements == 2 &&
                  replicas->type == REDIS_REPLY_ARRAY && replicas->elements == 1;
        } catch (const std::exception&) {
          ready = false;
        }
      }
      if (ready) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  /// Waits until every sentinel names the master at `port`.
  /// @return false when that took longer than `limit`
  bool wait_master(int port, std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (std::size_t i = 0; i < sentinels_.size(); ++i) {
        all = all && reported_master_port(i) == port;
      }
      if (all) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  std::vector<std::string> replica_args(bool auth) const {
    std::vector<std::string> a = {
        "--repl-diskless-sync-delay",   "0", "--dir", dir_.string(), "--replicaof", "127.0.0.1",
        std::to_string(master_->port())};
    if (auth) a.insert(a.end(), {"--masterauth", "mpw"});
    return a;
  }

  static std::filesystem::path make_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "rl-sentinel-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    return t;
  }

  std::filesystem::path dir_;
  std::unique_ptr<redis_server> master_;
  std::unique_ptr<redis_server> replica_;
  std::vector<std::unique_ptr<sentinel_process>> sentinels_;
};

}  // namespace rltest
