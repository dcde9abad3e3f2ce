// SPDX-License-Identifier: Apache-2.0
// The HTTP API example's server, in process on a free port, driven by a real HTTP client (httplib::Client).
//
// The server's time comes from the test (Unix microseconds), so every status
// and header value is the one the policy predicts, exactly: fixed windows of
// free = 5/1min and pro = 10/1min, the first request 10 s into a window.
// Each test runs on the memory store and, when built with Redis, on a
// throwaway redis-server.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api_server.hpp"
#include "ratelimit/store/memory_store.hpp"

#ifdef RATELIMIT_HTTP_HAVE_REDIS
#include "ratelimit/redis.hpp"
#include "redis_server.hpp"
#endif

namespace {

using namespace std::chrono_literals;
using http_example::api_server;

/// The start of a minute, in Unix time.
constexpr std::chrono::microseconds window_start = std::chrono::seconds{1'700'000'040};
static_assert(window_start.count() % 60'000'000 == 0);

#ifdef RATELIMIT_HTTP_HAVE_REDIS
rltest::redis_server& redis() {
  static rltest::redis_server server;
  return server;
}
#endif

/// The server on 127.0.0.1 at a free port, serving from a thread, and a client.
class server_test : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    http_example::server_config cfg;
    cfg.tiers = {{"free", ratelimit::rate::parse("5/1min")},
                 {"pro", ratelimit::rate::parse("10/1min")}};
    cfg.tokens = {{"tok-free", "free"}, {"tok-free-2", "free"}, {"tok-pro", "pro"}};
    std::unique_ptr<http_example::tier_limits> limits;
    if (GetParam() == "memory") {
      using store = ratelimit::memory_store<ratelimit::fixed_window>;
      limits = std::make_unique<http_example::tier_limits_on<store>>(cfg.tiers,
                                                                     [] { return store{}; });
    } else {
#ifdef RATELIMIT_HTTP_HAVE_REDIS
      ratelimit::redis::options o = redis().options();
      o.prefix = rltest::unique_prefix("http");
      ratelimit::redis::redis_store store(o);
      limits = std::make_unique<http_example::tier_limits_on<ratelimit::redis::redis_store>>(
          cfg.tiers, [&] { return store; });
#endif
    }
    server_ = std::make_unique<api_server>(
        cfg, std::move(limits), [t = now_] { return std::chrono::microseconds{t->load()}; });
    port_ = server_->http().bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    serving_ = std::thread([this] { server_->http().listen_after_bind(); });
    for (int i = 0; i < 5000 && !server_->http().is_running(); ++i) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(server_->http().is_running());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(10, 0);
    set_time(window_start + 10s);
  }

  void TearDown() override {
    if (server_) server_->http().stop();
    if (serving_.joinable()) serving_.join();
  }

  void set_time(std::chrono::microseconds t) { now_->store(t.count()); }

  /// GET /v1/things with these headers; the response (never null).
  httplib::Result get(const httplib::Headers& h) {
    httplib::Result r = client_->Get("/v1/things", h);
    EXPECT_TRUE(r) << "no response: " << httplib::to_string(r.error());
    return r;
  }
  httplib::Result get(const std::string& token, const std::string& key = {}) {
    httplib::Headers h = {{"Authorization", "Bearer " + token}};
    if (!key.empty()) h.emplace("Idempotency-Key", key);
    return get(h);
  }

  /// Sends `raw` (a whole request) on a new connection; the status code.
  int raw_status(const std::string& raw, std::string* body = nullptr) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      if (fd >= 0) ::close(fd);
      return -1;
    }
    (void)::send(fd, raw.data(), raw.size(), MSG_NOSIGNAL);
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      got.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    if (got.size() < 12 || !got.starts_with("HTTP/1.1 ")) return -1;
    if (body != nullptr) {
      const auto end = got.find("\r\n\r\n");
      *body = end == std::string::npos ? std::string() : got.substr(end + 4);
    }
    return std::stoi(got.substr(9, 3));
  }

  std::shared_ptr<std::atomic<std::int64_t>> now_ = std::make_shared<std::atomic<std::int64_t>>(0);
  std::unique_ptr<api_server> server_;
  std::thread serving_;
  int port_ = 0;
  std::unique_ptr<httplib::Client> client_;
};

/// The rate limit fields a response must carry: exactly these, no others.
struct expected {
  int status;
  std::string ratelimit;         ///< RateLimit
  std::string policy;            ///< RateLimit-Policy
  std::string retry_after = {};  ///< Retry-After; empty = absent
};

void expect_response(const httplib::Result& r, const expected& e, const std::string& what) {
  ASSERT_TRUE(r) << what;
  EXPECT_EQ(r->status, e.status) << what;
  EXPECT_EQ(r->get_header_value("RateLimit"), e.ratelimit) << what;
  EXPECT_EQ(r->get_header_value("RateLimit-Policy"), e.policy) << what;
  EXPECT_FALSE(r->has_header("X-RateLimit-Remaining")) << what;
  EXPECT_EQ(r->has_header("Retry-After"), !e.retry_after.empty()) << what;
  EXPECT_EQ(r->get_header_value("Retry-After"), e.retry_after) << what;
  EXPECT_EQ(r->get_header_value_count("RateLimit"), 1U) << what;
}

constexpr const char* free_policy = "\"free\";q=5;w=60";

TEST_P(server_test, FreeTierAdmitsFiveThenAnswers429UntilTheWindowEnds) {
  // 10 s into the window: 50 s to its end.
  for (int i = 1; i <= 5; ++i) {
    const std::string r = std::to_string(5 - i);
    expect_response(get("tok-free"), {200, "\"free\";r=" + r + ";t=50", free_policy},
                    "request " + std::to_string(i));
  }
  const auto limited = get("tok-free");
  expect_response(limited, {429, "\"free\";r=0;t=50", free_policy, "50"}, "request 6");
  EXPECT_EQ(limited->body, "{\"error\":\"rate limited\",\"repeat\":false}\n");
  // The microsecond before the window ends: still limited, Retry-After 1 s (rounded up).
  set_time(window_start + 60s - 1us);
  expect_response(get("tok-free"), {429, "\"free\";r=0;t=1", free_policy, "1"},
                  "1 us before the window ends");
  // At the end of the window: a new one, with all 60 s to go.
  set_time(window_start + 60s);
  const auto next = get("tok-free");
  expect_response(next, {200, "\"free\";r=4;t=60", free_policy}, "next window");
  EXPECT_EQ(next->body, "{\"ok\":true,\"tier\":\"free\",\"repeat\":false}\n");
  EXPECT_EQ(server_->admitted(), 6U);
  EXPECT_EQ(server_->limited(), 2U);
  EXPECT_EQ(server_->refused(), 0U);
}

TEST_P(server_test, TiersHaveTheirOwnLimitsAndTokensTheirOwnCounts) {
  const std::string pro = "\"pro\";q=10;w=60";
  for (int i = 1; i <= 10; ++i) {
    const std::string r = std::to_string(10 - i);
    expect_response(get("tok-pro"), {200, "\"pro\";r=" + r + ";t=50", pro},
                    "pro request " + std::to_string(i));
  }
  expect_response(get("tok-pro"), {429, "\"pro\";r=0;t=50", pro, "50"}, "pro 11");
  // Two tokens of one tier count apart.
  for (int i = 1; i <= 5; ++i) ASSERT_EQ(get("tok-free")->status, 200);
  EXPECT_EQ(get("tok-free")->status, 429);
  expect_response(get("tok-free-2"), {200, "\"free\";r=4;t=50", free_policy}, "another free token");
}

TEST_P(server_test, RetryWithOneIdempotencyKeyGetsTheFirstDecisionAndConsumesNothing) {
  const expected first = {200, "\"free\";r=4;t=50", free_policy};
  expect_response(get("tok-free", "order-1"), first, "first");
  // The retry, 5 s later: the first decision's fields again, and nothing consumed.
  set_time(window_start + 15s);
  const auto retry = get("tok-free", "order-1");
  expect_response(retry, first, "retry");
  EXPECT_EQ(retry->body, "{\"ok\":true,\"tier\":\"free\",\"repeat\":true}\n");
  expect_response(get("tok-free"), {200, "\"free\";r=3;t=45", free_policy},
                  "plain request after the retry");
  // One key from another token is another request.
  expect_response(get("tok-free-2", "order-1"), {200, "\"free\";r=4;t=45", free_policy},
                  "same key, other token");
  // A rejected request's retry is rejected again, with its first Retry-After.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(get("tok-free")->status, 200);
  const expected no = {429, "\"free\";r=0;t=45", free_policy, "45"};
  expect_response(get("tok-free", "order-2"), no, "over the limit");
  set_time(window_start + 70s - 1us);  // a new window; order-1's retention (60 s) not yet over
  expect_response(get("tok-free", "order-2"), no, "retry of the 429 in the next window");
  expect_response(get("tok-free", "order-1"), first, "order-1 one us before its retention ends");
  // Retention over: order-1 is a new request of the new window.
  set_time(window_start + 70s);
  expect_response(get("tok-free", "order-1"), {200, "\"free\";r=4;t=50", free_policy},
                  "order-1 after its retention");
  expect_response(get("tok-free"), {200, "\"free\";r=3;t=50", free_policy},
                  "plain request in the new window");
}

TEST_P(server_test, BadTokensAndIdempotencyKeysGet400NamingTheProblem) {
  struct bad {
    httplib::Headers headers;
    int status;
    std::string body;
  };
  const std::string long_token(http_example::max_token_bytes + 1, 'a');
  const std::string long_key(ratelimit::max_request_id_bytes + 1, 'k');
  const std::vector<bad> cases = {
      {{}, 400, R"({"error":"missing API token: send \"Authorization: Bearer <token>\""})"},
      {{{"Authorization", "Basic dG9rOmZyZWU="}},
       400,
       R"({"error":"Authorization header must be \"Bearer <token>\""})"},
      {{{"Authorization", "Bearer " + long_token}},
       400,
       R"({"error":"API token of 129 bytes exceeds the maximum of 128"})"},
      {{{"Authorization", "Bearer tok!free"}},
       400,
       R"({"error":"API token holds a bad byte 0x21 at offset 3"})"},
      {{{"Authorization", "Bearer tok-free"}, {"Authorization", "Bearer tok-pro"}},
       400,
       R"({"error":"Authorization header sent more than once"})"},
      {{{"Authorization", "Bearer nobody"}}, 401, R"({"error":"unknown API token"})"},
      {{{"Authorization", "Bearer tok-free"}, {"Idempotency-Key", long_key}},
       400,
       R"({"error":"Idempotency-Key of 257 bytes exceeds the maximum of 256"})"},
      {{{"Authorization", "Bearer tok-free"}, {"Idempotency-Key", "a b"}},
       400,
       R"({"error":"Idempotency-Key holds a bad byte 0x20 at offset 1"})"},
      {{{"Authorization", "Bearer tok-free"}, {"Idempotency-Key", "a"}, {"Idempotency-Key", "b"}},
       400,
       R"({"error":"Idempotency-Key header sent more than once"})"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto r = get(cases[i].headers);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, cases[i].status) << "case " << i;
    EXPECT_EQ(r->body, cases[i].body + "\n") << "case " << i;
    EXPECT_FALSE(r->has_header("RateLimit")) << "case " << i;
  }
  // Bytes a client library would not send, on a raw connection.
  std::string body;
  EXPECT_EQ(raw_status("GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                       "Authorization: Bearer tok\xff\r\n\r\n",
                       &body),
            400);
  EXPECT_EQ(body, "{\"error\":\"API token holds a bad byte 0xff at offset 3\"}\n");
  EXPECT_EQ(raw_status("GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                       "Authorization: Bearer tok-free\r\nIdempotency-Key: k\x01k\r\n\r\n",
                       &body),
            400);
  EXPECT_EQ(raw_status("GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                       "Authorization: Bearer tok-free\r\nIdempotency-Key: \x80\r\n\r\n",
                       &body),
            400);
  EXPECT_EQ(body, "{\"error\":\"Idempotency-Key holds a bad byte 0x80 at offset 0\"}\n");
  // A NUL byte is a bad byte too, not the end of the value (get_header_value
  // would cut "k<NUL>x" and "k<NUL>y" to one key "k").
  using namespace std::string_literals;
  EXPECT_EQ(raw_status("GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                       "Authorization: Bearer tok-free\0x\r\n\r\n"s,
                       &body),
            400);
  EXPECT_EQ(body, "{\"error\":\"API token holds a bad byte 0x00 at offset 8\"}\n");
  EXPECT_EQ(raw_status("GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                       "Authorization: Bearer tok-free\r\nIdempotency-Key: k\0x\r\n\r\n"s,
                       &body),
            400);
  EXPECT_EQ(body, "{\"error\":\"Idempotency-Key holds a bad byte 0x00 at offset 1\"}\n");
  // None of them reached the limiter: the token's count is untouched.
  expect_response(get("tok-free"), {200, "\"free\";r=4;t=50", free_policy}, "first good request");
  EXPECT_EQ(server_->admitted(), 1U);
  EXPECT_EQ(server_->limited(), 0U);
  // The server is still up.
  EXPECT_EQ(client_->Get("/healthz")->status, 200);
}

TEST_P(server_test, TheLongestTokenAndIdempotencyKeyAndAnyCaseOfBearerAreAccepted) {
  // 128 bytes of token pass the checks (an unknown token: 401, not 400).
  const std::string longest_token(http_example::max_token_bytes, 'a');
  const auto unknown = get({{"Authorization", "Bearer " + longest_token}});
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 401);
  EXPECT_EQ(unknown->body, "{\"error\":\"unknown API token\"}\n");
  // 256 bytes of Idempotency-Key: a request, and its retry a repeat.
  const std::string longest_key(ratelimit::max_request_id_bytes, 'k');
  expect_response(get("tok-free", longest_key), {200, "\"free\";r=4;t=50", free_policy},
                  "256-byte key");
  const auto retry = get("tok-free", longest_key);
  expect_response(retry, {200, "\"free\";r=4;t=50", free_policy}, "its retry");
  EXPECT_EQ(retry->body, "{\"ok\":true,\"tier\":\"free\",\"repeat\":true}\n");
  // The scheme in any case, then one or more spaces: the same token's count.
  expect_response(get({{"Authorization", "bearer tok-free"}}),
                  {200, "\"free\";r=3;t=50", free_policy}, "lowercase scheme");
  expect_response(get({{"Authorization", "BEARER    tok-free"}}),
                  {200, "\"free\";r=2;t=50", free_policy}, "uppercase scheme, four spaces");
}

TEST_P(server_test, ABodyOverTheMaximumGets413AndIsNotRead) {
  const httplib::Headers auth = {{"Authorization", "Bearer tok-free"}};
  const auto longest = client_->Post("/v1/things", auth,
                                     std::string(http_example::max_body_bytes, 'x'),
                                     "application/octet-stream");
  ASSERT_TRUE(longest);
  expect_response(longest, {200, "\"free\";r=4;t=50", free_policy}, "64 KiB body");
  // One byte more: refused before the handler (no limiter check, no count).
  const auto over = client_->Post("/v1/things", auth,
                                  std::string(http_example::max_body_bytes + 1, 'x'),
                                  "application/octet-stream");
  ASSERT_TRUE(over);
  EXPECT_EQ(over->status, 413);
  EXPECT_FALSE(over->has_header("RateLimit"));
  // A huge Content-Length is refused from the header alone (not read into memory).
  EXPECT_EQ(raw_status("POST /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n"
                       "Authorization: Bearer tok-free\r\nContent-Length: 10000000000\r\n\r\n"),
            413);
  expect_response(get("tok-free"), {200, "\"free\";r=3;t=50", free_policy}, "after the 413s");
}

std::vector<std::string> stores() {
#ifdef RATELIMIT_HTTP_HAVE_REDIS
  return {"memory", "redis"};
#else
  return {"memory"};
#endif
}

INSTANTIATE_TEST_SUITE_P(http, server_test, ::testing::ValuesIn(stores()),
                         [](const auto& info) { return info.param; });

/// Open file descriptors of this process.
std::size_t open_fds() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    ::closedir(d);
  }
  return n;
}

/// A connection to 127.0.0.1:`port` that sends nothing (a slow client).
/// Waits up to 50 ms for the handshake (past the listen backlog the server
/// drops it, and the connect would wait seconds for a SYN retry).
int idle_client(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  pollfd p{fd, POLLOUT, 0};
  (void)::poll(&p, 1, 50);
  return fd;
}

// Verifies the bound on slow clients: with 2 workers and at most 2
// connections waiting for one, 20 clients that send nothing make the server
// hold at most 2 + 2 + 1 accepted sockets (httplib's own ThreadPool, which
// the example used, queued all 20: one socket each, without bound). Once they
// leave, the server answers again; and stop() returns while the accept loop
// waits for room.
TEST(http_bounds, SlowClientsCannotMakeTheServerHoldMoreSockets) {
  using store = ratelimit::memory_store<ratelimit::fixed_window>;
  http_example::server_config cfg;
  auto limits = std::make_unique<http_example::tier_limits_on<store>>(cfg.tiers,
                                                                      [] { return store{}; });
  api_server server(cfg, std::move(limits), [] { return std::chrono::microseconds{0}; });
  server.set_workers(2, 2);
  const int port = server.http().bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.http().listen_after_bind(); });
  for (int i = 0; i < 5000 && !server.http().is_running(); ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(server.http().is_running());

  const std::size_t before = open_fds();
  std::vector<int> clients;
  for (int i = 0; i < 20; ++i) clients.push_back(idle_client(port));
  std::this_thread::sleep_for(500ms);
  const std::size_t held = open_fds() - before - clients.size();
  EXPECT_LE(held, 2u + 2u + 1u);
  EXPECT_GE(held, 2u);  // the workers took theirs
  for (const int fd : clients) ::close(fd);
  clients.clear();

  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  const auto r = c.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);

  for (int i = 0; i < 20; ++i) clients.push_back(idle_client(port));
  std::this_thread::sleep_for(300ms);
  server.stop();
  for (const int fd : clients) ::close(fd);
  serving.join();
}

}  // namespace
