// SPDX-License-Identifier: Apache-2.0
// The cluster store over TLS (rediss-cluster://) against a real 3-master Redis
// Cluster whose nodes talk TLS to clients and to each other (--tls-cluster
// yes): the slot map read over TLS names the nodes' TLS ports, checks on
// every master are decided by Redis, identically to plain TCP, and a seed
// with an untrusted certificate fails naming the unknown CA.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../redis/tls_certs.hpp"
#include "cluster_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using std::chrono::microseconds;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

/// Three masters (no replicas), each with a plain port for administration
/// and a TLS port for clients and the cluster bus; slots split in three.
class tls_cluster {
 public:
  explicit tls_cluster(const rltest::tls_certs& certs) {
    char tmpl[] = "/tmp/rltest-tls-cluster.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    const std::string exe = rltest::redis_server_path();
    for (int i = 0; i < 3; ++i) {
      int tls = rltest::free_port();
      while (tls > 55535) tls = rltest::free_port();  // the bus listens on port + 10000
      const int plain = rltest::free_port();
      std::vector<std::string> args = {exe,
                                       "--port",
                                       std::to_string(plain),
                                       "--tls-port",
                                       std::to_string(tls),
                                       "--bind",
                                       "127.0.0.1",
                                       "--cluster-enabled",
                                       "yes",
                                       "--cluster-config-file",
                                       dir_ + "/nodes-" + std::to_string(tls) + ".conf",
                                       "--tls-cluster",
                                       "yes",
                                       "--save",
                                       "",
                                       "--appendonly",
                                       "no",
                                       "--dir",
                                       dir_,
                                       "--logfile",
                                       ""};
      for (const std::string& a : certs.server_args("server")) args.push_back(a);
      pids_.push_back(rltest::spawn(args));
      plain_.push_back(plain);
      tls_.push_back(tls);
    }
    for (const int p : plain_) {
      bool up = false;
      for (int i = 0; i < 500 && !up; ++i) {
        try {
          up = rltest::command(rltest::redis_cluster::node(p), {"PING"})->type ==
               REDIS_REPLY_STATUS;
        } catch (const store_error&) {
          std::this_thread::sleep_for(10ms);
        }
      }
      if (!up) throw std::runtime_error("a TLS cluster node did not start");
    }
    const char* ranges[3][2] = {{"0", "5460"}, {"5461", "10922"}, {"10923", "16383"}};
    for (std::size_t i = 0; i < 3; ++i) {
      (void)rltest::redis_cluster::ask(plain_[i],
                                       {"CLUSTER", "ADDSLOTSRANGE", ranges[i][0], ranges[i][1]});
    }
    for (std::size_t i = 1; i < 3; ++i) {
      const std::string port = std::to_string(tls_[i]);
      (void)rltest::redis_cluster::ask(plain_[0], {"CLUSTER", "MEET", "127.0.0.1", port});
    }
    const auto until = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      bool ok = true;
      for (const int p : plain_) {
        ok = ok && rltest::redis_cluster::ask(p, {"CLUSTER", "INFO"}).find("cluster_state:ok") !=
                       std::string::npos;
      }
      if (ok) break;
      if (std::chrono::steady_clock::now() > until) throw std::runtime_error("TLS cluster not ok");
      std::this_thread::sleep_for(50ms);
    }
  }
  tls_cluster(const tls_cluster&) = delete;
  tls_cluster& operator=(const tls_cluster&) = delete;
  ~tls_cluster() {
    for (const pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      (void)rltest::wait_exit(pid);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  [[nodiscard]] const std::vector<int>& plain_ports() const noexcept { return plain_; }
  [[nodiscard]] const std::vector<int>& tls_ports() const noexcept { return tls_; }

 private:
  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<int> plain_;
  std::vector<int> tls_;
};

// Verifies checks over TLS reach every master (through the TLS ports the slot
// map names), are decided by Redis, and equal the same checks over plain TCP.
TEST(TlsCluster, ChecksOnEveryMasterAsOverPlainTcp) {
  const rltest::tls_certs certs;
  const tls_cluster cluster(certs);
  redis::cluster_options over_tls = redis::parse_cluster_url(
      "rediss-cluster://127.0.0.1:" + std::to_string(cluster.tls_ports()[0]) +
      "?ca=" + certs.crt("ca"));
  over_tls.node.connect_timeout = 1000ms;
  over_tls.node.command_timeout = 2000ms;
  over_tls.node.prefix = "tls:";
  redis::cluster_options over_tcp = over_tls;
  over_tcp.node.tls = {};
  over_tcp.seeds = {{"127.0.0.1", cluster.plain_ports()[0]}};
  over_tcp.node.prefix = "tcp:";
  redis::cluster_store tls_store(over_tls);
  redis::cluster_store tcp_store(over_tcp);
  const gcra::config cfg("2/1s", bucket_options{.name = "g"});
  for (int k = 0; k < 30; ++k) {  // 30 keys: every master holds some
    const std::string key = "k" + std::to_string(k);
    for (const std::int64_t dt : {0, 1, 2, 499'999, 500'000}) {
      const decision a = tls_store.apply(cfg, key, microseconds{t0 + dt}, 1);
      EXPECT_EQ(a.source, decision_source::store) << key;
      EXPECT_EQ(a, tcp_store.apply(cfg, key, microseconds{t0 + dt}, 1)) << key << " " << dt;
    }
  }
  // Every master was reached over TLS: each holds keys of the tls: prefix.
  for (const int p : cluster.plain_ports()) {
    const std::string n = rltest::redis_cluster::ask(p, {"DBSIZE"});
    EXPECT_GE(std::stoi(n), 2) << p;  // tls: and tcp: keys of its slots
  }
  // Multiplexed and async over TLS (?multiplex=2 in the URL): 3 checks per
  // key in flight at once, exactly 2 admitted per key, all decided by Redis.
  {
    redis::cluster_options mux = redis::parse_cluster_url(
        "rediss-cluster://127.0.0.1:" + std::to_string(cluster.tls_ports()[0]) +
        "?ca=" + certs.crt("ca") + "&multiplex=2");
    ASSERT_EQ(mux.node.multiplex, 2u);
    mux.node.connect_timeout = 1000ms;
    mux.node.command_timeout = 2000ms;
    mux.node.prefix = "tlsmux:";
    redis::cluster_store mux_store(mux);
    std::mutex m;
    std::condition_variable cv;
    std::size_t left = 90, errors = 0, not_store = 0;
    std::map<std::string, int> admitted;
    for (int k = 0; k < 30; ++k) {
      const std::string key = "k" + std::to_string(k);
      for (int i = 0; i < 3; ++i) {
        mux_store.async_apply(cfg, key, microseconds{t0}, 1, access::consume,
                              [&, key](decision d, std::exception_ptr e) {
                                std::lock_guard<std::mutex> lock(m);
                                errors += e ? 1 : 0;
                                not_store += d.source == decision_source::store ? 0 : 1;
                                admitted[key] += d.allowed ? 1 : 0;
                                --left;
                                cv.notify_all();
                              });
      }
    }
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return left == 0; }));
    EXPECT_EQ(errors, 0u);
    EXPECT_EQ(not_store, 0u);
    ASSERT_EQ(admitted.size(), 30u);
    for (const auto& [key, n] : admitted) EXPECT_EQ(n, 2) << key;
  }
  // Nodes are verified too: with a CA that signed nothing here, no check passes.
  redis::cluster_options untrusted = over_tls;
  untrusted.node.tls.ca_file = certs.crt("other_ca");
  untrusted.node.connect_timeout = 300ms;
  try {
    redis::cluster_store bad(untrusted);
    (void)bad.apply(cfg, "k0", microseconds{t0}, 1);
    ADD_FAILURE() << "a check passed with an untrusted certificate";
  } catch (const redis::connection_error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown CA"), std::string::npos) << e.what();
  }
  untrusted.node.tls.ca_file = certs.dir() + "/missing.crt";
  try {
    redis::cluster_store bad(untrusted);
    ADD_FAILURE() << "a missing CA file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("missing.crt"), std::string::npos) << e.what();
  }
}

// Verifies "no cluster node answered CLUSTER SLOTS" names a TLS failure only
// when it happened in that attempt: once the only seed refuses plain TCP
// connects, the TLS failure of an earlier attempt is no longer quoted.
TEST(TlsCluster, OnlyThisAttemptsTlsFailureIsNamed) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::atomic<bool> stop{false};
  std::thread closer([&] {  // accepts and closes at once: no TLS spoken
    while (!stop) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) {
        const int c = ::accept(fd, nullptr, nullptr);
        if (c >= 0) ::close(c);
      }
    }
  });
  redis::cluster_options o = redis::parse_cluster_url(
      "rediss-cluster://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "?verify=none");
  o.node.connect_timeout = 500ms;
  redis::cluster_store store(o);
  std::string first;
  try {
    store.ping();
  } catch (const redis::connection_error& e) {
    first = e.what();
  }
  stop = true;
  closer.join();
  ::close(fd);  // connects are refused from now on
  EXPECT_NE(first.find("last TLS failure"), std::string::npos) << first;
  std::string second;
  try {
    store.ping();
  } catch (const redis::connection_error& e) {
    second = e.what();
  }
  EXPECT_NE(second.find("no cluster node answered"), std::string::npos) << second;
  EXPECT_EQ(second.find("TLS"), std::string::npos) << second;
}

}  // namespace
