// SPDX-License-Identifier: Apache-2.0
// Test helper: a throwaway 3-master, 3-replica Redis Cluster of child processes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../redis/redis_server.hpp"
#include "ratelimit/redis/cluster_store.hpp"

namespace rltest {

/// Path of redis-cli, next to redis-server.
inline std::string redis_cli_path() {
  std::string p = redis_server_path();
  const auto slash = p.rfind('/');
  p = (slash == std::string::npos ? std::string() : p.substr(0, slash + 1)) + "redis-cli";
  if (::access(p.c_str(), X_OK) != 0) {
    throw std::runtime_error(
        "redis-cli not found next to redis-server: apt-get install redis-tools");
  }
  return p;
}

/// Starts `argv` as a child with stdout/stderr to /dev/null, killed when this
/// process dies. Call from the main thread (the death signal follows the
/// thread that forked).
inline pid_t spawn(std::vector<std::string> args) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, 0);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

/// Waits for a child; returns its exit status (-1 when killed by a signal).
inline int wait_exit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Six redis-server processes on free 127.0.0.1 ports, joined with
/// `redis-cli --cluster create --cluster-replicas 1` into 3 masters with one
/// replica each, `--cluster-node-timeout 1000` so failover takes ~2 s,
/// `--cluster-require-full-coverage no` so the other masters keep serving
/// while one is down, and `--cluster-replica-validity-factor 0` so a replica
/// always takes over. Every
/// process is killed by PID in the destructor, and by the kernel when this
/// process dies.
class redis_cluster {
 public:
  static constexpr int size = 6;

  redis_cluster() {
    char tmpl[] = "/tmp/ratelimit-cluster-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    try {
      start();
    } catch (...) {
      stop_all();
      throw;
    }
  }
  redis_cluster(const redis_cluster&) = delete;
  redis_cluster& operator=(const redis_cluster&) = delete;
  ~redis_cluster() { stop_all(); }

  [[nodiscard]] const std::vector<int>& ports() const noexcept { return ports_; }

  /// Options reaching the cluster through one seed, with generous timeouts.
  [[nodiscard]] ratelimit::redis::cluster_options options() const {
    ratelimit::redis::cluster_options o;
    o.seeds.push_back({"127.0.0.1", ports_.front()});
    o.node.connect_timeout = std::chrono::milliseconds(1000);
    o.node.command_timeout = std::chrono::milliseconds(2000);
    return o;
  }

  /// Redis options of one node.
  [[nodiscard]] static ratelimit::redis::options node(int port) {
    ratelimit::redis::options o;
    o.port = port;
    o.connect_timeout = std::chrono::milliseconds(1000);
    o.command_timeout = std::chrono::milliseconds(5000);
    return o;
  }

  /// A command's reply as a string (status, bulk string or integer).
  static std::string ask(int port, std::initializer_list<std::string_view> args) {
    auto r = command(node(port), args);
    if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
    if (r->str == nullptr) return {};
    return std::string(r->str, r->len);
  }

  /// Node id (CLUSTER MYID) of the node on `port`.
  static std::string id_of(int port) { return ask(port, {"CLUSTER", "MYID"}); }

  /// Starts moving `slot` from the master on port `from` to the one on `to`
  /// (IMPORTING there, then MIGRATING here): checks on keys absent from
  /// `from` are answered ASK. True when both nodes said OK.
  static bool start_migration(std::uint16_t slot, int from, int to) {
    const std::string sl = std::to_string(slot);
    return ask(to, {"CLUSTER", "SETSLOT", sl, "IMPORTING", id_of(from)}) == "OK" &&
           ask(from, {"CLUSTER", "SETSLOT", sl, "MIGRATING", id_of(to)}) == "OK";
  }

  /// Ends start_migration's move, the slot staying with `from`: deletes
  /// `key` (written by the checks ASK sent to `to`) there, under ASKING, and
  /// makes the slot STABLE on both nodes. True when both said OK.
  static bool end_migration(std::uint16_t slot, int from, int to, std::string_view key) {
    {
      ratelimit::redis::connection c(node(to));
      const std::string_view asking[] = {"ASKING"};
      (void)c.command(asking, 1, ratelimit::redis::deadline_clock::now() + std::chrono::seconds(2));
      const std::string_view del[] = {"DEL", key};
      (void)c.command(del, 2, ratelimit::redis::deadline_clock::now() + std::chrono::seconds(2));
    }
    const std::string sl = std::to_string(slot);
    const bool stable_from = ask(from, {"CLUSTER", "SETSLOT", sl, "STABLE"}) == "OK";
    return ask(to, {"CLUSTER", "SETSLOT", sl, "STABLE"}) == "OK" && stable_from;
  }

  /// Port of the master owning `slot`, asked of a live node.
  [[nodiscard]] int master_of(std::uint16_t slot) const {
    for (const int p : live_ports()) {
      try {
        auto r = command(node(p), {"CLUSTER", "SLOTS"});
        for (std::size_t i = 0; i < r->elements; ++i) {
          const redisReply& e = *r->element[i];
          if (e.element[0]->integer <= slot && slot <= e.element[1]->integer) {
            return static_cast<int>(e.element[2]->element[1]->integer);
          }
        }
        return -1;
      } catch (const ratelimit::store_error&) {
      }
    }
    return -1;
  }

  /// SIGKILL of the node on `port` (its replica takes over after ~2 s).
  void kill(int port) {
    const auto it = pids_.find(port);
    if (it == pids_.end() || it->second <= 0) return;
    ::kill(it->second, SIGKILL);
    (void)wait_exit(it->second);
    it->second = -1;
  }

  /// Starts again every node kill() stopped, on its port and with its
  /// nodes.conf, and waits until the cluster is whole: every node answers
  /// cluster_state:ok and 3 masters each have a replica whose link is up (a
  /// killed master comes back as its promoted replica's replica). A test that
  /// kills a node calls this before it ends (see node_revival), so the tests
  /// after it, in the same process, find all 6 nodes.
  /// @throws std::runtime_error when a node does not start or the cluster
  /// does not heal within `limit`
  void revive(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    bool restarted = false;
    for (auto& [port, pid] : pids_) {
      if (pid > 0) continue;
      // A master started again before its replica took over would come back
      // as the master, with no keys and any slot migration it was in (kept
      // in its nodes.conf): first let the cluster fail it over.
      if (!wait_failed(port, limit)) {
        throw std::runtime_error("the node on port " + std::to_string(port) +
                                 " was never failed over");
      }
      const pid_t p = spawn_node(redis_server_path(), port);
      if (!answers(p, port)) {
        ::kill(p, SIGKILL);
        (void)wait_exit(p);
        throw std::runtime_error("cluster node on port " + std::to_string(port) +
                                 " did not start again");
      }
      pid = p;
      restarted = true;
    }
    if (!restarted) return;
    if (!wait_ok(limit) || !wait_synced(limit)) {
      throw std::runtime_error("the cluster did not heal after its nodes were started again");
    }
  }

  /// Ports of the processes still running.
  [[nodiscard]] std::vector<int> live_ports() const {
    std::vector<int> out;
    for (const int p : ports_) {
      if (pids_.at(p) > 0) out.push_back(p);
    }
    return out;
  }

  /// Waits until every live node reports cluster_state:ok.
  bool wait_ok(std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      bool ok = true;
      for (const int p : live_ports()) {
        try {
          ok = ok && ask(p, {"CLUSTER", "INFO"}).find("cluster_state:ok") != std::string::npos;
        } catch (const ratelimit::store_error&) {
          ok = false;
        }
      }
      if (ok) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  /// Waits until size / 2 nodes are masters and as many replicas report
  /// master_link_status:up.
  bool wait_synced(std::chrono::milliseconds limit) const {
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int masters = 0, linked = 0;
      for (const int p : live_ports()) {
        try {
          const std::string info = ask(p, {"INFO", "replication"});
          if (info.find("role:master") != std::string::npos) ++masters;
          if (info.find("master_link_status:up") != std::string::npos) ++linked;
        } catch (const ratelimit::store_error&) {
        }
      }
      if (masters == size / 2 && linked == size / 2) return true;
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  /// Waits until every live node flags the node on `port` as failed (FAIL,
  /// not PFAIL) and lists no slots for it (a replica took them over).
  bool wait_failed(int port, std::chrono::milliseconds limit) const {
    const std::string address = "127.0.0.1:" + std::to_string(port) + "@";
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      bool failed = true;
      for (const int p : live_ports()) {
        bool seen = false;
        try {
          std::istringstream nodes(ask(p, {"CLUSTER", "NODES"}));
          for (std::string line; std::getline(nodes, line);) {
            std::istringstream in(line);
            std::vector<std::string> f;
            for (std::string w; in >> w;) f.push_back(w);
            if (f.size() < 8 || f[1].rfind(address, 0) != 0) continue;
            seen = f.size() == 8 && ("," + f[2] + ",").find(",fail,") != std::string::npos;
          }
        } catch (const ratelimit::store_error&) {
        }
        failed = failed && seen;
      }
      if (failed) return true;
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  /// Runs redis-cli with `args` and waits; returns its exit status.
  static int cli(std::vector<std::string> args) { return wait_exit(spawn_cli(std::move(args))); }

  /// Starts redis-cli with `args` without waiting.
  static pid_t spawn_cli(std::vector<std::string> args) {
    args.insert(args.begin(), redis_cli_path());
    return spawn(std::move(args));
  }

 private:
  void start() {
    const std::string exe = redis_server_path();
    for (int i = 0; i < size; ++i) launch(exe);
    std::vector<std::string> create = {"--cluster", "create"};
    for (const int p : ports_) create.push_back("127.0.0.1:" + std::to_string(p));
    create.insert(create.end(), {"--cluster-replicas", "1", "--cluster-yes"});
    if (cli(create) != 0) throw std::runtime_error("redis-cli --cluster create failed");
    if (!wait_ok(std::chrono::seconds(30)))
      throw std::runtime_error("cluster_state never became ok");
    // A replica that never synced refuses to fail over: wait for every link.
    if (!wait_synced(std::chrono::seconds(30))) throw std::runtime_error("replicas never synced");
  }

  void launch(const std::string& exe) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      // The cluster bus listens on port + 10000, so the port must be <= 55535.
      int port = free_port();
      for (int i = 0; i < 100 && port > 55535; ++i) port = free_port();
      const pid_t pid = spawn_node(exe, port);
      if (answers(pid, port)) {
        ports_.push_back(port);
        pids_[port] = pid;
        return;
      }
      ::kill(pid, SIGKILL);
      (void)wait_exit(pid);
    }
    throw std::runtime_error("redis-server (cluster node) did not start (tried 5 ports)");
  }

  /// Starts redis-server as the cluster node on `port` (its nodes-<port>.conf
  /// in dir_, so a node started again keeps its id and rejoins).
  pid_t spawn_node(const std::string& exe, int port) const {
    const std::string ps = std::to_string(port);
    // --repl-diskless-sync-delay 0: replicas sync at once instead of after
    // the default 5 s wait for more replicas.
    return spawn({exe,
                  "--port",
                  ps,
                  "--bind",
                  "127.0.0.1",
                  "--cluster-enabled",
                  "yes",
                  "--cluster-config-file",
                  dir_ + "/nodes-" + ps + ".conf",
                  "--cluster-node-timeout",
                  "1000",
                  "--cluster-replica-validity-factor",
                  "0",
                  "--cluster-require-full-coverage",
                  "no",
                  "--save",
                  "",
                  "--appendonly",
                  "no",
                  "--repl-diskless-sync-delay",
                  "0",
                  "--dir",
                  dir_,
                  "--daemonize",
                  "no",
                  "--logfile",
                  dir_ + "/" + ps + ".log"});
  }

  /// Waits up to 10 s for the child `pid` to answer PING on `port`; false
  /// when it exited (port taken?) or never answered.
  static bool answers(pid_t pid, int port) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;
      try {
        if (command(node(port), {"PING"})->type == REDIS_REPLY_STATUS) return true;
      } catch (const ratelimit::store_error&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return false;
  }

  void stop_all() noexcept {
    for (auto& [port, pid] : pids_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        (void)wait_exit(pid);
        pid = -1;
      }
    }
    std::error_code ec;
    if (!dir_.empty() && std::getenv("RATELIMIT_KEEP_CLUSTER_DIR") == nullptr) {
      std::filesystem::remove_all(dir_, ec);
    }
  }

  std::string dir_;
  std::vector<int> ports_;
  std::map<int, pid_t> pids_;
};

/// The cluster shared by every test of this process, started on first use.
inline redis_cluster& shared_cluster() {
  static redis_cluster cluster;
  return cluster;
}

/// Calls redis_cluster::revive() when it goes out of scope, also when an
/// ASSERT ended the test early: declare one before killing a node.
class node_revival {
 public:
  explicit node_revival(redis_cluster& c) : cluster_(c) {}
  node_revival(const node_revival&) = delete;
  node_revival& operator=(const node_revival&) = delete;
  ~node_revival() {
    try {
      cluster_.revive();
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }

 private:
  redis_cluster& cluster_;
};

}  // namespace rltest
