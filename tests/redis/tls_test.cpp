// SPDX-License-Identifier: Apache-2.0
// TLS (rediss://) against a real redis-server with --tls-port and
// certificates made by the openssl CLI: verified success, each named failure
// (unknown CA, hostname mismatch, expired certificate, missing client
// certificate, handshake timeout, no TLS on the port), identical decisions
// over TLS and plain TCP, reconnects after a restart, AUTH + SELECT, fork(),
// and bad settings named in std::invalid_argument.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../sentinel/sentinel_harness.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"
#include "redis_server.hpp"
#include "support/fork_child.hpp"
#include "tls_certs.hpp"

namespace {

using namespace ratelimit;
using namespace std::chrono_literals;
using std::chrono::microseconds;

constexpr std::int64_t t0 = 1'732'950'000'000'000;

class Tls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new rltest::tls_certs();
    server_ = new rltest::redis_server(certs_->server_args("server"), true);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete certs_;
    server_ = nullptr;
    certs_ = nullptr;
  }

  /// Options for the TLS port of `s`, trusting our CA.
  static redis::options tls_options(const rltest::redis_server& s, std::string_view what) {
    redis::options o = s.options();
    o.port = s.tls_port();
    o.tls.enabled = true;
    o.tls.ca_file = certs_->crt("ca");
    o.prefix = rltest::unique_prefix(what);
    return o;
  }

  /// The message of the exception `E` that a check through a store made
  /// with `o` throws ("" when none is thrown).
  template <class E>
  static std::string check_error(const redis::options& o) {
    redis::redis_store store(o);
    const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
    try {
      (void)store.apply(cfg, "k", microseconds{t0}, 1);
    } catch (const E& e) {
      return e.what();
    }
    return "";
  }

  static inline rltest::tls_certs* certs_ = nullptr;
  static inline rltest::redis_server* server_ = nullptr;
};

// Verifies a check over TLS with the certificate verified (by IP address and
// by host name with SNI) is decided by Redis, on a TLS connection.
TEST_F(Tls, VerifiedCheckSucceeds) {
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  redis::options o = tls_options(*server_, "ok");
  redis::redis_store store(o);
  const decision d = store.apply(cfg, "k", microseconds{t0}, 1);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 4);
  EXPECT_EQ(d.source, decision_source::store);
  redis::connection c(o);
  EXPECT_TRUE(c.tls());
  o.host = "localhost";
  redis::redis_store by_name(o);
  EXPECT_EQ(by_name.apply(cfg, "k", microseconds{t0}, 1).remaining, 3);
}

// Verifies a pooled TLS connection serves check after check (the look at an
// idle connection does not take TLS records for a close): the server accepts
// exactly one connection for 50 checks.
TEST_F(Tls, PooledConnectionIsReused) {
  const auto accepted = [] {
    const auto r = rltest::command(server_->options(), {"INFO", "stats"});
    const std::string info(r->str, r->len);
    const auto at = info.find("total_connections_received:");
    return std::stol(info.substr(at + 27));
  };
  redis::options o = tls_options(*server_, "reuse");
  o.pool_size = 1;
  redis::redis_store store(o);
  const gcra::config cfg("100/1s", bucket_options{.name = "g"});
  const long before = accepted();
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 99 - i);
  }
  EXPECT_EQ(accepted() - before, 2);  // the store's connection and this INFO's
}

// Verifies a server certificate from a CA the client does not trust fails
// the connect with a tls_error saying "unknown CA" and OpenSSL's reason, and
// that verify=none (an explicit opt-out) connects anyway.
TEST_F(Tls, UnknownCaIsNamed) {
  redis::options o = tls_options(*server_, "unknown-ca");
  o.tls.ca_file = certs_->crt("other_ca");
  const std::string what = check_error<redis::tls_error>(o);
  EXPECT_NE(what.find("unknown CA"), std::string::npos) << what;
  EXPECT_TRUE(what.find("(unable to get local issuer certificate)") != std::string::npos ||
              what.find("(self-signed certificate in certificate chain)") != std::string::npos)
      << what;
  EXPECT_NE(what.find(std::to_string(o.port)), std::string::npos) << what;
  o.tls.verify = redis::tls_verify::none;
  EXPECT_EQ(check_error<store_error>(o), "");
}

// Verifies a name the certificate does not carry fails with "hostname
// mismatch" naming it, and that verify=chain (names not checked) connects.
TEST_F(Tls, HostnameMismatchIsNamed) {
  redis::options o = tls_options(*server_, "mismatch");
  o.tls.server_name = "wrong.example";
  const std::string what = check_error<redis::tls_error>(o);
  EXPECT_NE(what.find("hostname mismatch"), std::string::npos) << what;
  EXPECT_NE(what.find("wrong.example"), std::string::npos) << what;
  o.tls.verify = redis::tls_verify::chain;
  EXPECT_EQ(check_error<store_error>(o), "");
}

// Verifies that a server name set in code is quoted escaped in the
// "hostname mismatch" message (\xNN for each control byte): it was quoted
// as is, so a name holding CR LF could forge a log line.
TEST_F(Tls, HostnameMismatchEscapesTheName) {
  redis::options o = tls_options(*server_, "mismatch");
  o.tls.server_name = "wrong\r\nX-Forged.example";
  const std::string what = check_error<redis::tls_error>(o);
  EXPECT_NE(what.find("hostname mismatch: the certificate is not valid for "
                      "\"wrong\\x0d\\x0aX-Forged.example\""),
            std::string::npos)
      << redis::detail::escaped_name(what);
  EXPECT_EQ(what.find('\r'), std::string::npos) << redis::detail::escaped_name(what);
  EXPECT_EQ(what.find('\n'), std::string::npos) << redis::detail::escaped_name(what);
}

// Verifies an expired server certificate fails with "certificate expired".
TEST_F(Tls, ExpiredCertificateIsNamed) {
  rltest::redis_server expired(certs_->server_args("expired"), true);
  const std::string what = check_error<redis::tls_error>(tls_options(expired, "expired"));
  EXPECT_NE(what.find("certificate expired"), std::string::npos) << what;
}

// Verifies that a server requiring client certificates refuses a client
// without one (a tls_error saying so at connect) and admits one with a
// certificate signed by its CA.
TEST_F(Tls, MutualTlsNeedsTheClientCertificate) {
  (void)rltest::command(server_->options(), {"CONFIG", "SET", "tls-auth-clients", "yes"});
  redis::options o = tls_options(*server_, "mtls");
  const std::string what = check_error<redis::tls_error>(o);
  EXPECT_NE(what.find("asked for a client certificate"), std::string::npos) << what;
  o.tls.cert_file = certs_->crt("client");
  o.tls.key_file = certs_->key("client");
  EXPECT_EQ(check_error<store_error>(o), "");
  (void)rltest::command(server_->options(), {"CONFIG", "SET", "tls-auth-clients", "no"});
}

// Verifies a server that asks for a client certificate without requiring
// one (tls-auth-clients optional) and then refuses AUTH gives the AUTH
// failure, not a tls_error blaming the missing certificate: the server
// answered, so the session was accepted. The password is never echoed.
TEST_F(Tls, OptionalClientCertificateDoesNotHideAnAuthFailure) {
  (void)rltest::command(server_->options(),
                        {"ACL", "SETUSER", "rltls", "on", ">right", "~*", "+@all"});
  (void)rltest::command(server_->options(), {"CONFIG", "SET", "tls-auth-clients", "optional"});
  redis::options o = tls_options(*server_, "optional");
  o.user = "rltls";
  o.password = "wr0ngpass";
  std::string what;
  bool as_tls_error = false;
  try {
    redis::connection c(o);
  } catch (const redis::tls_error& e) {
    as_tls_error = true;
    what = e.what();
  } catch (const redis::connection_error& e) {
    what = e.what();
  }
  o.password = "right";
  EXPECT_NO_THROW(redis::connection{o});
  (void)rltest::command(server_->options(), {"CONFIG", "SET", "tls-auth-clients", "no"});
  EXPECT_FALSE(as_tls_error) << what;
  EXPECT_NE(what.find("AUTH as user \"rltls\""), std::string::npos) << what;
  EXPECT_EQ(what.find("client certificate"), std::string::npos) << what;
  EXPECT_EQ(what.find("wr0ngpass"), std::string::npos) << what;
}

// Verifies a peer that accepts TCP but never answers the handshake fails the
// connect with timeout_error within connect_timeout (no hang).
TEST_F(Tls, HandshakeTimesOut) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 8), 0);  // the kernel completes TCP; nobody speaks TLS
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  redis::options o = tls_options(*server_, "silent");
  o.port = ntohs(a.sin_port);
  o.connect_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  const std::string what = check_error<redis::timeout_error>(o);
  const auto took = std::chrono::steady_clock::now() - start;
  ::close(fd);
  EXPECT_NE(what.find("TLS handshake"), std::string::npos) << what;
  EXPECT_LT(took, 3s);
}

// Verifies TLS to a port without TLS (Redis waits for the rest of what it
// takes for an inline command) fails within connect_timeout, not a hang.
TEST_F(Tls, PlainPortIsNoTls) {
  redis::options o = tls_options(*server_, "plain-port");
  o.port = server_->port();
  o.connect_timeout = 200ms;
  const std::string what = check_error<redis::connection_error>(o);
  EXPECT_NE(what.find("TLS handshake with 127.0.0.1:" + std::to_string(o.port)), std::string::npos)
      << what;
}

// Verifies the same checks give the same decisions over TLS and plain TCP
// (on the same server, under different prefixes), at the window's edges.
TEST_F(Tls, DecidesAsPlainTcp) {
  redis::options plain = server_->options();
  plain.prefix = rltest::unique_prefix("plain");
  redis::redis_store over_tcp(plain);
  redis::redis_store over_tls(tls_options(*server_, "tls"));
  const fixed_window::config fw("3/1s", window_options{.name = "fw"});
  const gcra::config g("3/1s", bucket_options{.name = "g"});
  const std::int64_t at[] = {0,         1,         2,         3,         999'999,
                             1'000'000, 1'000'001, 1'333'333, 1'333'334, 2'500'000};
  for (const std::int64_t dt : at) {
    const microseconds now{t0 + dt};
    EXPECT_EQ(over_tls.apply(fw, "k", now, 1), over_tcp.apply(fw, "k", now, 1)) << dt;
    EXPECT_EQ(over_tls.apply(g, "k", now, 1), over_tcp.apply(g, "k", now, 1)) << dt;
  }
}

// Verifies blocking checks over one multiplexed TLS connection that the
// calling threads drive themselves (leader/follower: each reads the socket
// through OpenSSL, which may hold several replies at once): 16 threads x 25
// checks on one key admit exactly the limit, every check decided by Redis.
TEST_F(Tls, MultiplexedBlockingChecksFromThreadsAdmitExactlyTheLimit) {
  redis::options o = tls_options(*server_, "mux-threads");
  o.multiplex = 1;
  o.multiplex_lead = true;
  o.command_timeout = 5000ms;
  o.on_failure = redis::failure_policy::throw_error;
  redis::redis_store store(o);
  const fixed_window::config cfg("100/1h", window_options{.name = "t"});
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < 16; ++i) {
    pool.emplace_back([&] {
      for (int j = 0; j < 25; ++j) {
        if (store.apply(cfg, "k", store_time, 1).allowed) ++admitted;
      }
    });
  }
  for (auto& t : pool) t.join();
  EXPECT_EQ(admitted.load(), 100);
  EXPECT_EQ(store.stats().store, 400u);
  EXPECT_EQ(store.stats().errors, 0u);
}

// Verifies a restarted server is reached again over TLS with AUTH and SELECT
// from a rediss:// URL, and the key lands in the database the URL names.
TEST_F(Tls, RestartReconnectsWithAuthAndSelect) {
  rltest::redis_server s(certs_->server_args("server"), true);
  const auto set_password = [&] {
    (void)rltest::command(s.options(), {"CONFIG", "SET", "requirepass", "s3cret"});
  };
  set_password();
  redis::options o = redis::parse_url("rediss://:s3cret@localhost:" + std::to_string(s.tls_port()) +
                                      "/3?ca=" + certs_->crt("ca"));
  o.prefix = rltest::unique_prefix("restart");
  redis::redis_store store(o);
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  EXPECT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).remaining, 4);
  s.restart();
  set_password();
  const decision d = store.apply(cfg, "k", microseconds{t0}, 1);
  EXPECT_EQ(d.source, decision_source::store);
  EXPECT_EQ(d.remaining, 4);  // the restarted server is empty
  redis::options plain = s.options();
  plain.password = "s3cret";
  plain.database = 3;
  EXPECT_EQ(rltest::command(plain, {"DBSIZE"})->integer, 1);
}

// Verifies a child that destroys a TLS connection made by its parent sends
// nothing on it (no close_notify): the parent's session keeps working.
TEST_F(Tls, ForkChildLeavesTheParentsSession) {
  auto c = std::make_unique<redis::connection>(tls_options(*server_, "fork"));
  const std::string_view ping[] = {"PING"};
  ASSERT_EQ(c->command(ping, 1, redis::deadline_clock::now() + 2s)->type, REDIS_REPLY_STATUS);
  const rltest::child_end end = rltest::in_child([&] {
    c.reset();
    return 0;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.status, 0);
  EXPECT_FALSE(c->peer_closed());
  EXPECT_EQ(c->command(ping, 1, redis::deadline_clock::now() + 2s)->type, REDIS_REPLY_STATUS);
}

// Verifies that the SSL_CTX cache tells option sets apart even when paths
// hold newlines (the key joined the fields with '\n'): A = {ca "D/x\ny"}
// and B = {ca "D/x", ca_dir "y", key "\n"} joined to the same text, and
// with "D/x" a hard link of "D/x\ny" their files had the same stamps, so B
// got A's context instead of its error (a key without a certificate).
TEST_F(Tls, ContextCacheKeyTellsNewlinesInPathsApart) {
  char dir_template[] = "/tmp/rltest-tls-key-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string joined = dir + "/x\ny";
  const std::string link = dir + "/x";
  {
    std::ifstream in(certs_->crt("ca"), std::ios::binary);
    std::ofstream out(joined, std::ios::binary);
    out << in.rdbuf();
  }
  ASSERT_EQ(::link(joined.c_str(), link.c_str()), 0);
  struct stat st {};
  ASSERT_NE(::stat("y", &st), 0) << "a file \"y\" in the working directory";
  ASSERT_NE(::stat("\n", &st), 0);
  redis::tls_options a;
  a.enabled = true;
  a.ca_file = joined;
  const std::shared_ptr<SSL_CTX> ctx = redis::detail::tls_context_for(a);
  ASSERT_NE(ctx, nullptr);
  redis::tls_options b;
  b.enabled = true;
  b.ca_file = link;
  b.ca_dir = "y";
  b.key_file = "\n";
  EXPECT_THROW((void)redis::detail::tls_context_for(b), std::invalid_argument);
  redis::options o = tls_options(*server_, "cache-key");
  o.tls = b;
  EXPECT_THROW(redis::redis_store{o}, std::invalid_argument);
  // A itself is still served from the cache.
  EXPECT_EQ(redis::detail::tls_context_for(a), ctx);
  ::unlink(link.c_str());
  ::unlink(joined.c_str());
  ::rmdir(dir.c_str());
}

// Verifies that a child forked while another thread held the SSL_CTX
// cache's lock can still make TLS stores: two threads of the parent take
// contexts from the cache in a loop while the test forks 80 children, each of
// which takes a context and decides a check over TLS with a store of its own.
// Before, a child forked with the lock held waited on it forever.
TEST_F(Tls, ChildForkedWhileTheContextCacheIsLockedMakesStores) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators are not fork-safe here: a child forked while "
                  "another thread allocates can block in malloc before our code runs";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the sanitizers' allocators are not fork-safe here: a child forked while "
                  "another thread allocates can block in malloc before our code runs";
#endif
#endif
  redis::options o = tls_options(*server_, "fork-cache");
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int i = 0; i < 2; ++i) {
    busy.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) (void)redis::detail::tls_context_for(o.tls);
    });
  }
  int hung = 0;
  int failed = 0;
  for (int i = 0; i < 80; ++i) {
    const rltest::child_end end = rltest::in_child(
        [&] {
          if (redis::detail::tls_context_for(o.tls) == nullptr) return 2;
          redis::redis_store store(o);
          const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
          return store.apply(cfg, "k", microseconds{t0}, 1).source == decision_source::store ? 0
                                                                                             : 3;
        },
        // A child takes about 12 ms; 3 s was once too little on a machine
        // saturated by other builds. A deadlock waits forever either way.
        10s);
    hung += end.hung ? 1 : 0;
    failed += !end.hung && end.status != 0 ? 1 : 0;
  }
  stop = true;
  for (auto& t : busy) t.join();
  EXPECT_EQ(hung, 0);
  EXPECT_EQ(failed, 0);
}

// Verifies TLS to an IPv6 address with a zone id ([::1%251]: zone 1, the
// loopback): the certificate is checked against the address alone (its
// subjectAltName holds IP:::1), and the check is decided by Redis. Before,
// "::1%1" was taken for a host name and failed the name check.
TEST_F(Tls, Ipv6ZoneIdIsCheckedAsTheAddress) {
  std::vector<std::string> args = certs_->server_args("server");
  args.insert(args.end(), {"--bind", "127.0.0.1 ::1"});
  rltest::redis_server v6(args, true);
  redis::options o = redis::parse_url("rediss://[::1%251]:" + std::to_string(v6.tls_port()) +
                                      "?ca=" + certs_->crt("ca"));
  EXPECT_EQ(o.host, "::1%1");
  o.connect_timeout = 5s;
  o.command_timeout = 5s;
  o.prefix = rltest::unique_prefix("tls-zone");
  redis::redis_store store(o);
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  EXPECT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).source, decision_source::store);
}

// Verifies bad TLS settings are named in std::invalid_argument when the store
// is made: a missing CA file, a certificate without its key, a key that is
// not the certificate's, a file that is no key, TLS over a unix socket.
TEST_F(Tls, BadSettingsAreNamed) {
  const auto error = [](const redis::options& o) -> std::string {
    try {
      redis::redis_store store(o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  redis::options o = tls_options(*server_, "bad");
  o.password = "s3cret";
  o.tls.ca_file = certs_->dir() + "/missing.crt";
  std::string what = error(o);
  EXPECT_NE(what.find("CA file (ca) \"" + o.tls.ca_file + "\""), std::string::npos) << what;
  EXPECT_NE(what.find("No such file"), std::string::npos) << what;
  o.tls.ca_file = certs_->dir();
  EXPECT_NE(error(o).find("is a directory"), std::string::npos);
  o.tls.ca_file = certs_->crt("ca");
  o.tls.cert_file = certs_->crt("client");
  EXPECT_NE(error(o).find("go together"), std::string::npos);
  o.tls.key_file = certs_->key("server");  // OpenSSL: "key values mismatch"
  what = error(o);
  EXPECT_NE(what.find("client key (key) \"" + o.tls.key_file + "\""), std::string::npos) << what;
  o.tls.key_file = certs_->crt("ca");  // a certificate, no key
  what = error(o);
  EXPECT_NE(what.find("client key (key) \"" + o.tls.key_file + "\" is unusable"), std::string::npos)
      << what;
  EXPECT_EQ(what.find("s3cret"), std::string::npos) << what;
  redis::options u;
  u.unix_socket = "/tmp/redis.sock";
  u.tls.enabled = true;
  EXPECT_NE(error(u).find("unix socket"), std::string::npos);
}

// Verifies the name check uses the certificate's subjectAltName only: an IP
// address host needs an IP entry (a DNS entry for the same host does not
// do), and a certificate without names is not accepted for its subject's
// common name (docs/redis.md: "a DNS name is matched against its DNS names").
TEST_F(Tls, NamesComeFromSubjectAltNameOnly) {
  certs_->make("dns_only", "ca", "2", "subjectAltName=DNS:localhost");
  certs_->make("cn_only", "ca", "2", "basicConstraints=CA:FALSE");
  {
    rltest::redis_server dns_only(certs_->server_args("dns_only"), true);
    redis::options o = tls_options(dns_only, "dns-only");
    const std::string what = check_error<redis::tls_error>(o);
    EXPECT_NE(what.find("hostname mismatch"), std::string::npos) << what;
    EXPECT_NE(what.find("\"127.0.0.1\""), std::string::npos) << what;
    o.host = "localhost";
    EXPECT_EQ(check_error<store_error>(o), "");
  }
  rltest::redis_server cn_only(certs_->server_args("cn_only"), true);
  redis::options o = tls_options(cn_only, "cn-only");
  o.host = "localhost";  // the certificate's CN
  const std::string what = check_error<redis::tls_error>(o);
  EXPECT_NE(what.find("hostname mismatch"), std::string::npos) << what;
  o.tls.verify = redis::tls_verify::chain;
  EXPECT_EQ(check_error<store_error>(o), "");
}

// Verifies a hashed CA directory (ca_dir, no ca file) is trusted, and that
// a CA file replaced while the store runs is read for the next new
// connection (a store made trusting the wrong CA recovers without being
// made again).
TEST_F(Tls, CaDirectoryAndReplacedCaFile) {
  const std::string dir = certs_->dir() + "/cadir";
  const std::string cmd = "mkdir -p '" + dir + "' && cp '" + certs_->crt("ca") + "' '" + dir +
                          "/' && openssl rehash '" + dir + "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  redis::options o = tls_options(*server_, "ca-dir");
  o.tls.ca_file.clear();
  o.tls.ca_dir = dir;
  EXPECT_EQ(check_error<store_error>(o), "");

  const std::string file = certs_->dir() + "/rotating-ca.crt";
  const auto copy = [&](const std::string& from) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream out(file + ".tmp", std::ios::binary | std::ios::trunc);
    out << in.rdbuf() << "\n";  // a size differing from the other CA's
    out.close();
    ASSERT_EQ(std::rename((file + ".tmp").c_str(), file.c_str()), 0);
  };
  copy(certs_->crt("other_ca"));
  o = tls_options(*server_, "rotate");
  o.tls.ca_file = file;
  o.on_failure = redis::failure_policy::throw_error;
  o.breaker_threshold = 1000;
  redis::redis_store store(o);
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  EXPECT_THROW((void)store.apply(cfg, "k", microseconds{t0}, 1), redis::tls_error);
  copy(certs_->crt("ca"));
  EXPECT_EQ(store.apply(cfg, "k", microseconds{t0}, 1).source, decision_source::store);
}

// Verifies many threads sharing one TLS pool (fewer connections than
// threads) get exact decisions: 8 threads x 40 checks of one key with a
// limit of 100 at one instant admit exactly 100 (run under TSan by CI).
TEST_F(Tls, ThreadsShareOnePool) {
  redis::options o = tls_options(*server_, "threads");
  o.pool_size = 3;
  o.command_timeout = 5s;
  o.connect_timeout = 5s;
  redis::redis_store store(o);
  const token_bucket::config cfg("100/1s", bucket_options{.name = "t"});
  std::atomic<int> allowed{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 40; ++i) {
        try {
          if (store.apply(cfg, "shared", microseconds{t0}, 1).allowed) ++allowed;
        } catch (const store_error&) {
          ++errors;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(allowed.load(), 100);
}

// Verifies a command and a reply much larger than a TLS record and the
// socket buffers (partial writes, many records per reply) go through whole.
TEST_F(Tls, LargeCommandAndReply) {
  redis::connection c(tls_options(*server_, "large"));
  std::string value(8 << 20, 'v');
  for (std::size_t i = 0; i < value.size(); i += 4093) value[i] = static_cast<char>('a' + i % 26);
  const std::string key = rltest::unique_prefix("large") + "k";
  const std::string_view set[] = {"SET", key, value};
  EXPECT_EQ(c.command(set, 3, redis::deadline_clock::now() + 20s)->type, REDIS_REPLY_STATUS);
  const std::string_view get[] = {"GET", key};
  const redis::reply_ptr r = c.command(get, 2, redis::deadline_clock::now() + 20s);
  ASSERT_EQ(r->type, REDIS_REPLY_STRING);
  EXPECT_TRUE(std::string_view(r->str, r->len) == value);
  const std::string_view del[] = {"DEL", key};
  EXPECT_EQ(c.command(del, 2, redis::deadline_clock::now() + 5s)->integer, 1);
}

// Verifies options::tls reaches the sentinels' connections as well as the
// master's: a sentinel serving only TLS (tls-port, port 0) is asked over TLS
// for a master that serves TLS, and the check is decided by that master; with
// a CA that signed nothing here, the sentinel's certificate is refused and
// the error names it.
TEST_F(Tls, SentinelAndMasterOverTls) {
  std::string exe;
  try {
    exe = rltest::redis_sentinel_path();
  } catch (const std::runtime_error& e) {
    GTEST_SKIP() << e.what();
  }
  const std::string dir = certs_->dir() + "/sentinel";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const int port = rltest::free_port();
  const std::string conf = dir + "/sentinel.conf";
  {
    std::ofstream f(conf);
    f << "port 0\ntls-port " << port << "\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\n"
      << "dir " << dir << "\ntls-cert-file " << certs_->crt("server") << "\ntls-key-file "
      << certs_->key("server") << "\ntls-ca-cert-file " << certs_->crt("ca")
      << "\ntls-auth-clients no\ntls-replication yes\n"
      << "sentinel monitor tlsmaster 127.0.0.1 " << server_->tls_port() << " 1\n";
  }
  const pid_t pid = rltest::spawn({exe, conf});
  redis::options o = tls_options(*server_, "sentinel");
  o.sentinel.master_name = "tlsmaster";
  o.sentinel.sentinels = {{"127.0.0.1", port}};
  o.connect_timeout = 1000ms;
  const token_bucket::config cfg("5/1s", bucket_options{.name = "t"});
  std::string what = "not tried";
  for (int i = 0; i < 200 && !what.empty(); ++i) {  // until the sentinel listens
    what = check_error<store_error>(o);
    if (!what.empty()) std::this_thread::sleep_for(25ms);
  }
  EXPECT_EQ(what, "");
  o.tls.ca_file = certs_->crt("other_ca");
  what = check_error<redis::connection_error>(o);
  EXPECT_NE(what.find("sentinel 127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
  EXPECT_NE(what.find("unknown CA"), std::string::npos) << what;
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

// Verifies an encrypted client key is refused with std::invalid_argument
// naming it, without OpenSSL asking for its pass phrase on the process's
// terminal: a child with a controlling terminal (a pty nobody types into)
// must not block reading /dev/tty.
TEST_F(Tls, EncryptedKeyIsRefusedWithoutPrompting) {
  const std::string enc = certs_->dir() + "/client-enc.key";
  const std::string cmd = "openssl pkey -in '" + certs_->key("client") +
                          "' -aes256 -passout pass:secret -out '" + enc + "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  redis::options o = tls_options(*server_, "enc");
  o.tls.cert_file = certs_->crt("client");
  o.tls.key_file = enc;
  const rltest::child_end end = rltest::in_child(
      [&] {
        if (::setsid() < 0) return 2;
        const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
        if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return 3;
        const char* name = ::ptsname(master);
        if (name == nullptr || ::open(name, O_RDWR) < 0) return 4;  // the controlling terminal
        try {
          redis::redis_store store(o);
        } catch (const std::invalid_argument& e) {
          const std::string what = e.what();
          return what.find("client key (key) \"" + enc + "\"") != std::string::npos ? 0 : 5;
        }
        return 6;
      },
      5s);
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.status, 0);
}

// Verifies a URL with '@' in a TLS parameter's value is refused naming that,
// with the password hidden, instead of being read as a userinfo ending at
// that '@' (which connected to the host after it, sending the rest as a
// password); a password holding '?' is refused the same way (it cannot be
// told from such a URL), one holding '@' still parses.
TEST(TlsUrl, AtSignInAQueryValueIsRefused) {
  const auto url_error = [](const std::string& url) -> std::string {
    try {
      (void)redis::parse_url(url);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  std::string what = url_error("rediss://h:6380?sni=a@b");
  EXPECT_NE(what.find("'@' in a query value"), std::string::npos) << what;
  what = url_error("rediss://u:s3cret@h?verify=full&ca=/etc/a@b/ca.crt");
  EXPECT_NE(what.find("'@' in a query value"), std::string::npos) << what;
  EXPECT_EQ(what.find("s3cret"), std::string::npos) << what;
  what = url_error("redis://h?key=x@y");
  EXPECT_NE(what.find("'@' in a query value"), std::string::npos) << what;
  what = url_error("rediss://u:s3?ss=1&x@h:6380?verify=none");
  EXPECT_NE(what.find("has a '?' before its last '@'"), std::string::npos) << what;
  EXPECT_EQ(what.find("s3"), std::string::npos) << what;
  const redis::options o = redis::parse_url("rediss://u:pa@ss=1&x@h:6380?verify=none");
  EXPECT_EQ(o.password, "pa@ss=1&x");
  EXPECT_EQ(o.host, "h");
}

// Verifies rediss:// and rediss-cluster:// parameters, and that bad ones are
// named without echoing the password.
TEST(TlsUrl, ParametersAndErrors) {
  const redis::options o = redis::parse_url(
      "rediss://u:p@h:6380/2?ca=/a.crt&ca_dir=/d&cert=/c.crt&key=/"
      "c.key&sni=n.example&verify=chain");
  EXPECT_TRUE(o.tls.enabled);
  EXPECT_EQ(o.user, "u");
  EXPECT_EQ(o.password, "p");
  EXPECT_EQ(o.host, "h");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.database, 2);
  EXPECT_EQ(o.tls.ca_file, "/a.crt");
  EXPECT_EQ(o.tls.ca_dir, "/d");
  EXPECT_EQ(o.tls.cert_file, "/c.crt");
  EXPECT_EQ(o.tls.key_file, "/c.key");
  EXPECT_EQ(o.tls.server_name, "n.example");
  EXPECT_EQ(o.tls.verify, redis::tls_verify::chain);
  const redis::options d = redis::parse_url("rediss://h");
  EXPECT_TRUE(d.tls.enabled);
  EXPECT_EQ(d.tls.verify, redis::tls_verify::full);
  EXPECT_EQ(d.port, 6379);
  EXPECT_FALSE(redis::parse_url("redis://h").tls.enabled);
  EXPECT_EQ(redis::parse_url("rediss://:pa@ss@h?verify=none").password, "pa@ss");

  const auto url_error = [](const std::string& url) -> std::string {
    try {
      (void)redis::parse_url(url);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  std::string what = url_error("rediss://u:s3cret@h?cafile=/x");
  // No likely misspelling of a known name: not quoted (it may be a password).
  EXPECT_NE(what.find("unknown parameter (its name is not quoted"), std::string::npos) << what;
  EXPECT_NE(url_error("rediss://h?ca_dirr=/x").find("unknown parameter \"ca_dirr\""),
            std::string::npos);
  EXPECT_EQ(what.find("s3cret"), std::string::npos) << what;
  EXPECT_NE(url_error("rediss://h?verify=maybe").find("verify=\"maybe\""), std::string::npos);
  EXPECT_NE(url_error("rediss://h?ca=/a&ca=/b").find("\"ca\" twice"), std::string::npos);
  EXPECT_NE(url_error("rediss://h?ca=").find("\"ca\" without a value"), std::string::npos);
  EXPECT_NE(url_error("rediss://h?ca").find("\"ca\" without a value"), std::string::npos);
  EXPECT_NE(url_error("redis://h?verify=none").find("need rediss://"), std::string::npos);

  const redis::cluster_options c = redis::parse_cluster_url(
      "rediss-cluster://u:pw@a:7000,b:7001?ca=/ca.crt&sni=c.example");
  EXPECT_TRUE(c.node.tls.enabled);
  EXPECT_EQ(c.node.tls.ca_file, "/ca.crt");
  EXPECT_EQ(c.node.tls.server_name, "c.example");
  ASSERT_EQ(c.seeds.size(), 2U);
  EXPECT_EQ(c.seeds[1].port, 7001);
  EXPECT_EQ(c.node.password, "pw");
  EXPECT_FALSE(redis::parse_cluster_url("redis-cluster://a:7000").node.tls.enabled);
  try {
    (void)redis::parse_cluster_url("rediss-cluster://u:pw@a:7000?verfy=1");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"verfy\""), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("pw"), std::string::npos) << e.what();
  }
}

}  // namespace
