// SPDX-License-Identifier: Apache-2.0
// redis-sentinel:// URLs: sentinels, master name, the two sets of
// credentials, bad values named, passwords never quoted; bad sentinel options
// refused by the stores (no server needed).
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "ratelimit/redis.hpp"

namespace {

using namespace ratelimit;

/// The message of the invalid_argument that parse_url throws for `url`.
std::string url_error(const std::string& url) {
  try {
    (void)redis::parse_url(url);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << url << " was accepted";
  return {};
}

TEST(SentinelUrl, SentinelsMasterAndBothCredentials) {
  const auto o = redis::parse_url(
      "redis-sentinel://app:pw@10.0.0.1:5000,[::1],s3.example/mymaster?db=3&sentinel_user=sen&"
      "sentinel_password=spw");
  ASSERT_EQ(o.sentinel.sentinels.size(), 3u);
  EXPECT_EQ(o.sentinel.sentinels[0].host, "10.0.0.1");
  EXPECT_EQ(o.sentinel.sentinels[0].port, 5000);
  EXPECT_EQ(o.sentinel.sentinels[1].host, "::1");
  EXPECT_EQ(o.sentinel.sentinels[1].port, 26379);
  EXPECT_EQ(o.sentinel.sentinels[2].host, "s3.example");
  EXPECT_EQ(o.sentinel.sentinels[2].port, 26379);
  EXPECT_EQ(o.sentinel.master_name, "mymaster");
  EXPECT_EQ(o.user, "app");  // the userinfo is for the master
  EXPECT_EQ(o.password, "pw");
  EXPECT_EQ(o.database, 3);
  EXPECT_EQ(o.sentinel.user, "sen");
  EXPECT_EQ(o.sentinel.password, "spw");

  const auto plain = redis::parse_url("redis-sentinel://h/m");
  EXPECT_EQ(plain.sentinel.sentinels.size(), 1u);
  EXPECT_EQ(plain.sentinel.master_name, "m");
  EXPECT_TRUE(plain.user.empty());
  EXPECT_TRUE(plain.password.empty());
  EXPECT_TRUE(plain.sentinel.password.empty());
  EXPECT_EQ(plain.database, 0);
  // A master password may hold '@' as in redis:// (last '@'), but no '?',
  // '/' or '#' (see UrlReview.UserinfoRunningPastTheHostIsRefused).
  const auto odd = redis::parse_url("redis-sentinel://:p@w:x@y@h:1/m");
  EXPECT_EQ(odd.password, "p@w:x@y");
  EXPECT_EQ(odd.sentinel.sentinels[0].port, 1);
  // No Sentinel in plain URLs.
  EXPECT_TRUE(redis::parse_url("redis://h").sentinel.master_name.empty());
}

TEST(SentinelUrl, BadValuesAreNamed) {
  EXPECT_NE(url_error("redis-sentinel://h:1").find("no /MASTER_NAME"), std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h:1/").find("empty MASTER_NAME"), std::string::npos);
  // Quoted up to its '/': `/m/sentinel_password=S3CRET` quoted the secret.
  EXPECT_NE(url_error("redis-sentinel://h/m/2").find("'/' in MASTER_NAME \"m/...\""),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h:0/m").find("bad sentinel \"h:***\""), std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://a,h:x/m").find("bad sentinel \"h:***\""),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://a,,b/m").find("separated by commas"), std::string::npos);
  EXPECT_NE(url_error("redis-sentinel:///m").find("separated by commas"), std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://::1/m").find("bad sentinel \":***\""), std::string::npos);
  // A database that is no number is not quoted (it may be a secret).
  EXPECT_NE(url_error("redis-sentinel://h/m?db=x").find("bad database in redis URL"),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h/m?db=1000000000").find("database \"1000000000\""),
            std::string::npos);
  // No likely misspelling of a known name: not quoted (it may be a password).
  EXPECT_NE(url_error("redis-sentinel://h/m?tls=1")
                .find("\"redis-sentinel://h/m?***\" has an unknown parameter (its name is not "
                      "quoted"),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h/m?sentinel_usr=u").find("parameter \"sentinel_usr\""),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h/m?db=1&db=2").find("\"db\" twice"), std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h/m?db").find("no '=' after parameter \"db\""),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h/m?").find("no parameter after '?'"), std::string::npos);
  EXPECT_NE(url_error("sentinel://h/m").find("must start with"), std::string::npos);
  // An '@' in the db value: refused, not read as a password "h/m?db=1" and
  // the sentinel h2 (silently other sentinels and no database).
  EXPECT_NE(url_error("redis-sentinel://h/m?db=1@h2/m2").find("'@' in a query value"),
            std::string::npos);
  EXPECT_NE(url_error("redis-sentinel://h/m?sentinel_user=u&db=1@h2/m2").find("'@'"),
            std::string::npos);
}

// Verifies that a sentinel host with bytes no host name has (a NUL, which the
// resolver would cut, a space, CR LF) is refused when the store is made,
// whether it comes from a URL or from code, and quoted printably.
TEST(SentinelUrl, HostileSentinelHostsAreRefused) {
  using namespace std::string_literals;
  for (const std::string& host : {"h\0evil"s, "h x"s, "h\r\nx"s, std::string(254, 'a')}) {
    redis::options o;
    o.sentinel.master_name = "m";
    o.sentinel.sentinels.push_back({host, 26379});
    std::string what;
    try {
      redis::redis_store store(o);
    } catch (const std::invalid_argument& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("bad sentinel address"), std::string::npos) << what;
    EXPECT_EQ(what.find_first_of("\r\n"s + '\0'), std::string::npos) << what;
    std::string url_what;
    try {
      redis::redis_store store(redis::parse_url("redis-sentinel://" + host + "/m"));
    } catch (const std::invalid_argument& e) {
      url_what = e.what();
    }
    EXPECT_FALSE(url_what.empty()) << host;
  }
}

// Verifies that no message quotes either password, wherever the bad part is.
TEST(SentinelUrl, MessagesDoNotQuoteEitherPassword) {
  for (const std::string url :
       {"redis-sentinel://u:s3cret@h:0/m", "redis-sentinel://u:s3cret@h/m?db=x",
        "redis-sentinel://h/m?sentinel_password=s3cret&db=x",
        "redis-sentinel://u:s3cret@h/m?sentinel_password=s3cret&sentinel_password=s3cret2",
        "redis-sentinel://h/m?sentinel_password=s3@cret",
        "redis-sentinel://h/m?sentinel_password=s3@cr&db=1",
        "redis-sentinel://:s3cret@h/m?bogus=1&sentinel_password=s3cret",
        // A misspelt parameter holds the password too; so may a query value
        // with '@' (the userinfo then ends inside the query), and a master
        // password with '?'.
        "redis-sentinel://h/m?sentinel_pasword=s3cret", "redis-sentinel://h/m?password=s3cret&db=1",
        "redis-sentinel://h/m?sentinel_pasword=s3@cret", "redis-sentinel://:s3?x=cret@h:0/m",
        "rediss://h:0?password=s3cret"}) {
    const std::string what = url_error(url);
    EXPECT_EQ(what.find("s3"), std::string::npos) << what;
    EXPECT_EQ(what.find("cret"), std::string::npos) << what;
    EXPECT_NE(what.find("***"), std::string::npos) << what;
  }
}

// Verifies that bad sentinel options are refused when a store is made, and
// that the cluster store refuses Sentinel.
TEST(SentinelOptions, RefusedByTheStores) {
  redis::options o;
  o.sentinel.master_name = "m";
  EXPECT_THROW(redis::redis_store{o}, std::invalid_argument);  // no sentinel
  o.sentinel.sentinels.push_back(redis::sentinel_address{"127.0.0.1", 0});
  EXPECT_THROW(redis::redis_store{o}, std::invalid_argument);  // port 0
  o.sentinel.sentinels[0].port = 26379;
  o.unix_socket = "/tmp/x.sock";
  EXPECT_THROW(redis::redis_store{o}, std::invalid_argument);
  o.unix_socket.clear();
  EXPECT_NO_THROW(redis::redis_store{o});  // construction never connects
  redis::options no_name;
  no_name.sentinel.sentinels.push_back(redis::sentinel_address{});
  EXPECT_THROW(redis::redis_store{no_name}, std::invalid_argument);

  redis::cluster_options c;
  c.seeds.push_back(redis::node_address{});
  c.node = o;
  EXPECT_THROW(redis::cluster_store{c}, std::invalid_argument);
}

}  // namespace

namespace {

// Verifies that a master name holding CR, LF, another control byte, a space
// or DEL is refused when a store is made (in code or through a URL), the
// message showing the name with those bytes escaped: the sentinels announce
// failovers as space-separated "+switch-master <name> ..." lines, which such
// a name could never match (and a raw CR/LF would split a log line).
TEST(SentinelOptions, MasterNameWithControlBytesIsRefusedByValue) {
  using namespace std::string_literals;
  for (const std::string& name : {"m\r\nQUIT"s, "m\n"s, "\tm"s, "m x"s, "m\x7f"s, "m\0x"s}) {
    redis::options o;
    o.sentinel.master_name = name;
    o.sentinel.sentinels.push_back(redis::sentinel_address{"127.0.0.1", 26379});
    std::string why;
    try {
      redis::redis_store s(o);
    } catch (const std::invalid_argument& e) {
      why = e.what();
    }
    EXPECT_NE(why.find("master name"), std::string::npos) << why;
    EXPECT_EQ(why.find_first_of("\r\n\t\x7f"), std::string::npos) << why;  // escaped
  }
  std::string why;
  try {
    redis::options o;
    o.sentinel.master_name = "m\r\nQUIT";
    o.sentinel.sentinels.push_back(redis::sentinel_address{"127.0.0.1", 26379});
    redis::redis_store s(o);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  // Quoted escaped, up to the first bad byte (what follows may be anything).
  EXPECT_NE(why.find("\"m\\x0d...\""), std::string::npos) << why;
  EXPECT_NE(url_error("redis-sentinel://a/m\r\nQUIT").find("\"m\\x0d...\""), std::string::npos);
  // Printable names stay accepted.
  redis::options ok;
  ok.sentinel.master_name = "my-master.1_x";
  ok.sentinel.sentinels.push_back(redis::sentinel_address{"127.0.0.1", 26379});
  EXPECT_NO_THROW(redis::redis_store{ok});
}

// Verifies that what a server said (a sentinel's error, a master's ROLE
// answer) is quoted as the rest of the library quotes hostile bytes, each
// byte outside printable ASCII, '"' and '\' as \xNN
// (detail::printable, as detail::reply_text), not as '?': "ERR a?b" told
// neither which byte it was nor a '?' the server sent from one it did not.
// Still at most `most` bytes of it, then "...".
TEST(SentinelOptions, ServerAnswersAreQuotedEscaped) {
  EXPECT_EQ(redis::detail::shown("ERR a\r\nb\x1b[31m\x7f\xff\"\\?"),
            "ERR a\\x0d\\x0ab\\x1b[31m\\x7f\\xff\\x22\\x5c?");
  EXPECT_EQ(redis::detail::shown("master"), "master");
  EXPECT_EQ(redis::detail::shown(std::string(200, 'x')), std::string(120, 'x') + "...");
  EXPECT_EQ(redis::detail::shown(std::string(5, '\n'), 3), "\\x0a\\x0a\\x0a...");
  // A message of the library (already escaped, '"' in it) is quoted as is, cut.
  EXPECT_EQ(redis::detail::shown_message("cannot resolve \"h\\x0d\": x", 400),
            "cannot resolve \"h\\x0d\": x");
  EXPECT_EQ(redis::detail::shown_message(std::string(500, 'y'), 400),
            std::string(400, 'y') + "...");
  // The cut never splits an escape the message holds ("\x0d" is 4 bytes):
  // wherever the limit falls inside one, the escape is left out whole.
  for (std::size_t at = 396; at <= 400; ++at) {
    const std::string escaped = std::string(at, 'y') + "\\x0d" + std::string(100, 'z');
    const std::string cut = redis::detail::shown_message(escaped, 400);
    SCOPED_TRACE(at);
    if (at + 4 <= 400) {
      EXPECT_EQ(cut, std::string(at, 'y') + "\\x0d" + std::string(396 - at, 'z') + "...");
    } else {
      EXPECT_EQ(cut, std::string(at, 'y') + "...");
    }
  }
  // Should one hold a raw control byte, it is escaped whole.
  EXPECT_EQ(redis::detail::shown_message("a\"\nb", 400), "a\\x22\\x0ab");
}

}  // namespace
