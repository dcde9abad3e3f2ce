// SPDX-License-Identifier: Apache-2.0
// The built ratelimit-http-example as a user runs it: --port 0, curl and httplib::Client, SIGTERM, bad options.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/child_process.hpp"

#ifdef RATELIMIT_HTTP_HAVE_REDIS
#include "cluster/cluster_harness.hpp"
#include "redis_server.hpp"
#endif

namespace {

using namespace std::chrono_literals;

/// The example started with `args`.
class process : public rltest::child_process {
 public:
  explicit process(std::vector<std::string> args)
      : rltest::child_process(RATELIMIT_HTTP_EXE, std::move(args)) {}
};

/// The port in "... listening on http://127.0.0.1:PORT (...)".
int port_of(const std::string& line) {
  const auto at = line.find("127.0.0.1:");
  if (at == std::string::npos) return -1;
  return std::atoi(line.c_str() + at + 10);
}

/// R of the RateLimit field `"name";r=R;t=T`, or empty without one.
std::string remaining(const httplib::Result& r) {
  const std::string v = r ? r->get_header_value("RateLimit") : std::string();
  const auto at = v.find(";r=");
  if (at == std::string::npos) return {};
  return v.substr(at + 3, v.find(';', at + 3) - at - 3);
}

bool have_curl() {
  return std::system("curl --version >/dev/null 2>&1") == 0;
}

/// A period in hours whose fixed window (aligned to the Unix epoch) does not
/// end in the next minute, so a test's counts cannot be reset under it: 24,
/// else 25, else 23 (their windows end together only every 13,800 h).
int steady_hours() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  for (const int h : {24, 25, 23}) {
    const std::chrono::hours period(h);
    if (period - now % period > 60s) return h;
  }
  return 24;  // unreachable
}

TEST(http_tool, ServesLimitsAndStopsCleanlyOnSigterm) {
  // The tier's window is some hours long and not about to end (no wait near midnight).
  const int hours = steady_hours();
  const std::string period_s = std::to_string(hours * 3600);
  process server(
      {"--port", "0", "--tier", "gold=3/" + std::to_string(hours) + "h", "--token", "t-1=gold"});
  const std::string first = server.line();
  const int port = port_of(first);
  ASSERT_GT(port, 0) << first;
  EXPECT_EQ(first, "ratelimit-http-example: listening on http://127.0.0.1:" + std::to_string(port) +
                       " (store memory)\n");

  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1/hello";
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  const httplib::Headers auth = {{"Authorization", "Bearer t-1"}};
  if (have_curl()) {
    // One request from curl, as in the README.
    FILE* p = ::popen(("curl --noproxy '*' -s -i -H 'Authorization: Bearer t-1' " + url).c_str(),
                      "r");
    ASSERT_NE(p, nullptr);
    std::string got;
    char b[1024];
    for (std::size_t n; (n = std::fread(b, 1, sizeof b, p)) > 0;) got.append(b, n);
    ASSERT_EQ(::pclose(p), 0) << got;
    EXPECT_TRUE(got.starts_with("HTTP/1.1 200 OK\r\n")) << got;
    EXPECT_NE(got.find("\r\nRateLimit-Policy: \"gold\";q=3;w=" + period_s + "\r\n"),
              std::string::npos)
        << got;
    EXPECT_NE(got.find("\r\nRateLimit: \"gold\";r=2;t="), std::string::npos) << got;
  } else {
    ASSERT_EQ(client.Get("/v1/hello", auth)->status, 200);
  }
  for (const char* r : {"1", "0"}) {
    const auto res = client.Get("/v1/hello", auth);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(remaining(res), r);
  }
  const auto limited = client.Get("/v1/hello", auth);
  ASSERT_TRUE(limited);
  EXPECT_EQ(limited->status, 429);
  // Retry-After: the rest of the window, and the same as RateLimit's t.
  const std::string retry = limited->get_header_value("Retry-After");
  ASSERT_FALSE(retry.empty());
  EXPECT_GE(std::stol(retry), 1);
  EXPECT_LE(std::stol(retry), std::stol(period_s));
  EXPECT_EQ(limited->get_header_value("RateLimit"), "\"gold\";r=0;t=" + retry);
  EXPECT_EQ(client.Get("/v1/hello")->status, 400);

  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(), 0);
  EXPECT_EQ(server.rest(), "ratelimit-http-example: stopped; admitted 3, limited 1, refused 1\n");
}

TEST(http_tool, LimiterOffAdmitsAllWithoutHeaders) {
  process server({"--port", "0", "--limiter-off", "--tier", "gold=1/1d", "--token", "t-1=gold"});
  const int port = port_of(server.line());
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  for (int i = 0; i < 3; ++i) {
    const auto res = client.Get("/v1/x", {{"Authorization", "Bearer t-1"}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_FALSE(res->has_header("RateLimit"));
  }
  server.signal(SIGINT);
  EXPECT_EQ(server.wait(), 0);
}

TEST(http_tool, BadOptionsExitWithCode2NamingTheProblem) {
  struct bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<bad> cases = {
      {{"--store", "bogus://x"}, "--store scheme \"bogus\": use memory"},
      {{"--store", "nonsense"}, "--store \"nonsense\": use memory"},
      {{"--tier", "free=5/fortnight"}, "unknown unit \"fortnight\""},
      {{"--tier", "free"}, "--tier expects NAME=VALUE, got \"free\""},
      {{"--tier", "bad name=5/1s"}, "name"},
      {{"--token", "a=nosuch"}, "token \"a\" names tier \"nosuch\", which is not defined"},
      {{"--token", "a\x01=free"}, "API token holds a bad byte 0x01 at offset 1"},
      {{"--default-tier", "gold"}, "default tier names tier \"gold\""},
      {{"--port", "70000"}, "--port expects a number in 0..65535, got \"70000\""},
      {{"--port", " 80"}, "--port expects a number in 0..65535, got \" 80\""},
      {{"--port", "+80"}, "--port expects a number in 0..65535, got \"+80\""},
      {{"--max-keys", "-1"}, "--max-keys expects a number in 0..1000000000, got \"-1\""},
      {{"--redis-timeout", "0"}, "--redis-timeout expects a number in 1..60000, got \"0\""},
      {{"--tier", "a=1/1s", "--tier", "a=2/1s"}, "tier \"a\" is defined twice"},
      {{"--store", "redis://:6379x"}, "redis"},
      {{"--frobnicate"}, "unknown option or missing value: --frobnicate"},
      {{"--store", "rediss://user:s3cret@127.0.0.1:6379"}, "--store scheme \"rediss\": use memory"},
  };
  for (const bad& c : cases) {
    process p(c.args);
    const std::string out = p.rest();
    EXPECT_EQ(out.find("s3cret"), std::string::npos) << "a password in the message: " << out;
    EXPECT_EQ(p.wait(), 2) << c.args[0] << ": " << out;
    EXPECT_TRUE(out.starts_with("ratelimit-http-example: ")) << out;
    EXPECT_NE(out.find(c.message), std::string::npos) << out;
  }
}

TEST(http_tool, ATokenEndingInEqualsSignsCanBeGivenWithToken) {
  // Base64 padding: --token splits TOKEN=TIER at its last '=' (tier names hold none).
  process server({"--port", "0", "--tier", "gold=3/" + std::to_string(steady_hours()) + "h",
                  "--token", "dG9rZW4===gold"});
  const std::string line = server.line();
  const int port = port_of(line);
  ASSERT_GT(port, 0) << line;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  const auto r = client.Get("/v1/x", {{"Authorization", "Bearer dG9rZW4=="}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(remaining(r), "2");
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(), 0);
}

TEST(http_tool, APortInUseExitsWithCode1) {
  process first({"--port", "0"});
  const int port = port_of(first.line());
  ASSERT_GT(port, 0);
  // Not a second listener sharing the port (SO_REUSEPORT), with counts of its own.
  process second({"--port", std::to_string(port)});
  const std::string out = second.rest();
  EXPECT_EQ(second.wait(), 1) << out;
  EXPECT_EQ(out, "ratelimit-http-example: cannot listen on 127.0.0.1:" + std::to_string(port) +
                     " (address in use or not local)\n");
}

TEST(http_tool, MaxKeysBoundsTheTokensOfTheDefaultTier) {
  // With --default-tier every made-up token is a new key: past --max-keys, 503.
  process server({"--port", "0", "--max-keys", "2", "--tier",
                  "free=5/" + std::to_string(steady_hours()) + "h", "--default-tier", "free"});
  const int port = port_of(server.line());
  ASSERT_GT(port, 0);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  const auto get = [&](const std::string& token) {
    const auto r = client.Get("/v1/x", {{"Authorization", "Bearer " + token}});
    return r ? r->status : -1;
  };
  EXPECT_EQ(get("made-up-1"), 200);
  EXPECT_EQ(get("made-up-2"), 200);
  const auto full = client.Get("/v1/x", {{"Authorization", "Bearer made-up-3"}});
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 503);
  EXPECT_EQ(full->body, "{\"error\":\"rate limit store full\"}\n");
  EXPECT_FALSE(full->has_header("Retry-After"));
  // Tokens already held are decided as before.
  EXPECT_EQ(get("made-up-1"), 200);
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(), 0);
  EXPECT_EQ(server.rest(), "ratelimit-http-example: stopped; admitted 3, limited 0, refused 1\n");
}

#ifdef RATELIMIT_HTTP_HAVE_REDIS
TEST(http_tool, TwoServersOnOneRedisShareOneLimit) {
  const std::string gold = std::to_string(steady_hours()) + "h";
  rltest::redis_server redis;
  const std::string url = "redis://127.0.0.1:" + std::to_string(redis.port());
  // A generous Redis timeout: a loaded CI machine (sanitizers) must not turn a
  // slow reply into a 503.
  const std::vector<std::string> args = {
      "--port",  "0",        "--store",         url,   "--tier", "gold=3/" + gold,
      "--token", "t-1=gold", "--redis-timeout", "5000"};
  process a(args);
  process b(args);
  const std::string line_a = a.line();
  EXPECT_NE(line_a.find("(store " + url + ")"), std::string::npos) << line_a;
  httplib::Client ca("127.0.0.1", port_of(line_a));
  httplib::Client cb("127.0.0.1", port_of(b.line()));
  ca.set_read_timeout(10, 0);
  cb.set_read_timeout(10, 0);
  const httplib::Headers auth = {{"Authorization", "Bearer t-1"}};
  const httplib::Headers once = {{"Authorization", "Bearer t-1"}, {"Idempotency-Key", "k-1"}};
  EXPECT_EQ(remaining(ca.Get("/v1/x", once)), "2");
  // The retry reaches the other server: still the first decision, nothing consumed.
  const auto retry = cb.Get("/v1/x", once);
  EXPECT_EQ(retry->status, 200);
  EXPECT_EQ(remaining(retry), "2");
  EXPECT_EQ(retry->body, "{\"ok\":true,\"tier\":\"gold\",\"repeat\":true}\n");
  EXPECT_EQ(remaining(cb.Get("/v1/x", auth)), "1");
  EXPECT_EQ(remaining(ca.Get("/v1/x", auth)), "0");
  EXPECT_EQ(cb.Get("/v1/x", auth)->status, 429);
  EXPECT_EQ(ca.Get("/v1/x", auth)->status, 429);
  // Redis gone: 503, and the server keeps serving.
  redis.stop();
  const auto down = ca.Get("/v1/x", auth);
  ASSERT_TRUE(down);
  EXPECT_EQ(down->status, 503);
  EXPECT_EQ(ca.Get("/healthz")->status, 200);
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  EXPECT_EQ(a.wait(), 0);
  EXPECT_EQ(b.wait(), 0);
}

TEST(http_tool, ClusterStoreFromItsUrl) {
  const std::string gold = std::to_string(steady_hours()) + "h";
  rltest::redis_cluster cluster;
  const std::string url = "redis-cluster://127.0.0.1:" + std::to_string(cluster.ports().front());
  process server({"--port", "0", "--store", url, "--tier", "gold=2/" + gold, "--token", "t-1=gold",
                  "--token", "t-2=gold", "--redis-timeout", "5000"});
  const std::string line = server.line();
  httplib::Client client("127.0.0.1", port_of(line));
  client.set_read_timeout(10, 0);
  const httplib::Headers once = {{"Authorization", "Bearer t-1"}, {"Idempotency-Key", "k"}};
  EXPECT_EQ(remaining(client.Get("/v1/x", once)), "1") << line;
  EXPECT_EQ(client.Get("/v1/x", once)->body, "{\"ok\":true,\"tier\":\"gold\",\"repeat\":true}\n");
  EXPECT_EQ(remaining(client.Get("/v1/x", {{"Authorization", "Bearer t-1"}})), "0");
  EXPECT_EQ(client.Get("/v1/x", {{"Authorization", "Bearer t-1"}})->status, 429);
  EXPECT_EQ(remaining(client.Get("/v1/x", {{"Authorization", "Bearer t-2"}})), "1");
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait(), 0);
}
#endif

}  // namespace
