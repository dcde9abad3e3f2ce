// SPDX-License-Identifier: Apache-2.0
// Review of the Redis URL parsers (no server): a '?' inside a query value,
// empty parameters beside multiplex= that left db= unapplied, a URL
// ending in '?', empty credentials (in URLs and set in code), a ','
// before the last '@' of a URL listing several hosts, a userinfo that
// runs into the query, path or fragment, and query parameters given to a
// form that does not take them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "ratelimit/redis/cluster/options.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "ratelimit/redis/sentinel.hpp"

namespace {

using namespace ratelimit;
using namespace std::string_literals;

/// The message parse_url (or parse_cluster_url) refuses `url` with; "" when accepted.
std::string refusal(const std::string& url) {
  try {
    if (url.find("-cluster://") != std::string::npos) {
      (void)redis::parse_cluster_url(url);
    } else {
      (void)redis::parse_url(url);
    }
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

/// Whether `url` is refused with a message holding `said` and no "S3" (the
/// start of the marker secret S3CRET the typo cases below carry).
::testing::AssertionResult refused_saying(const std::string& url, const std::string& said) {
  const std::string why = refusal(url);
  if (why.empty()) return ::testing::AssertionFailure() << url << " was accepted";
  if (why.find(said) == std::string::npos) {
    return ::testing::AssertionFailure() << url << ": \"" << why << "\" lacks \"" << said << "\"";
  }
  if (why.find("S3") != std::string::npos) {
    return ::testing::AssertionFailure() << url << ": \"" << why << "\" quotes the secret";
  }
  return ::testing::AssertionSuccess();
}

// Verifies that a second '?' in a query is refused rather than kept inside
// a value: `rediss://h?ca=/x?multiplex=2` used to read the CA file
// "/x?multiplex=2" and leave multiplex unset; a Sentinel password
// "x?db=2" hid the database. The message names the parameter.
TEST(UrlReview, QuestionMarkInsideAQueryValueIsRefused) {
  for (const std::string url :
       {"rediss://h?ca=/x?multiplex=2", "rediss://h?sni=a?b", "rediss://h?verify=none&sni=a?b",
        "rediss-cluster://h:7000?sni=a?b", "rediss://h?multiplex=2&sni=a?b",
        "redis-sentinel://a/m?sentinel_user=u?db=2",
        "redis-sentinel://a/m?db=1&sentinel_user=u?x"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_NE(why.find("'?'"), std::string::npos) << why;
  }
  // The same values without the stray '?' are taken.
  const auto o = redis::parse_url("rediss://h?sni=a&multiplex=2");
  EXPECT_EQ(o.tls.server_name, "a");
  EXPECT_EQ(o.multiplex, 2u);
  // A Sentinel password holding '?' is refused, its value not quoted.
  const std::string why = refusal("redis-sentinel://a/m?sentinel_password=s3?cret");
  EXPECT_NE(why.find("sentinel_password"), std::string::npos) << why;
  EXPECT_EQ(why.find("s3"), std::string::npos) << why;
}

// Verifies that an empty parameter anywhere in a query holding multiplex=
// is refused: `unix:///t/s?&multiplex=2&db=1` used to connect to the
// socket "/t/s?&db=1" on database 0.
TEST(UrlReview, EmptyParameterBesideMultiplexIsRefused) {
  for (const std::string url :
       {"unix:///t/s?&multiplex=2&db=1", "unix:///t/s?multiplex=2&&db=1",
        "unix:///t/s?db=1&multiplex=2&", "redis://h?&multiplex=2", "rediss://h?multiplex=2&&sni=a",
        "redis-cluster://h:7000?&multiplex=2"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_NE(why.find("empty parameter"), std::string::npos) << why;
  }
  const auto o = redis::parse_url("unix:///t/s?multiplex=2&db=1");
  EXPECT_EQ(o.unix_socket, "/t/s");
  EXPECT_EQ(o.database, 1);
  EXPECT_EQ(o.multiplex, 2u);
  // Without multiplex= a unix path may still hold '?' (documented).
  EXPECT_EQ(redis::parse_url("unix:///t/s?x=1").unix_socket, "/t/s?x=1");
}

// Verifies that with multiplex= a unix:// query holds nothing but db=: the
// '?' then starts a query (a path holds no '?'), so
// `unix:///t/s?multiplex=2&x=1&db=1` used to connect to the socket
// "/t/s?x=1&db=1" on database 0, and `unix:///t/s?x=1&multiplex=2` to
// "/t/s?x=1". The message names the parameter, not its value.
TEST(UrlReview, UnixQueryBesideMultiplexTakesOnlyDb) {
  for (const std::string url :
       {"unix:///t/s?multiplex=2&x=1", "unix:///t/s?multiplex=2&x=1&db=1",
        "unix:///t/s?x=1&multiplex=2", "unix:///t/s?DB=1&multiplex=2", "unix:///t/s?multiplex=1&=x",
        "unix://u:p@/t/s?multiplex=2&pw=secret"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_NE(why.find("beside multiplex="), std::string::npos) << why;
    EXPECT_EQ(why.find("secret"), std::string::npos) << why;
  }
  const auto o = redis::parse_url("unix:///t/s?db=3&multiplex=2");
  EXPECT_EQ(o.unix_socket, "/t/s");
  EXPECT_EQ(o.database, 3);
  EXPECT_EQ(o.multiplex, 2u);
  const auto p = redis::parse_url("unix:///t/s?multiplex=0");
  EXPECT_EQ(p.unix_socket, "/t/s");
  EXPECT_EQ(p.multiplex, 0u);
}

// Verifies that a URL whose query is empty says so, rather than ask for
// rediss:// ("TLS parameters") as `redis://h?` used to.
TEST(UrlReview, NothingAfterTheQuestionMarkIsNamed) {
  for (const std::string url : {"redis://h?", "rediss://h?", "redis://h?&", "redis-cluster://h:1?",
                                "rediss-cluster://h:1?", "redis-sentinel://a/m?"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_NE(why.find("no parameter after '?'"), std::string::npos) << why;
    EXPECT_EQ(why.find("TLS parameters"), std::string::npos) << why;
  }
}

// Verifies that an empty credential is refused by name on every scheme,
// never read as "no AUTH": `sentinel_password=` (and `sentinel_user=`) used
// to be accepted and connect to the sentinels without AUTH, `redis://u:@h`
// to connect with no AUTH at all (dropping the user), and `sentinel_user`
// alone to be dropped the same way. Messages quote no password.
TEST(UrlReview, EmptyCredentialsAreRefusedByName) {
  struct row {
    std::string url;
    std::string named;  // what the message must name
  };
  const row rows[] = {
      {"redis-sentinel://a/m?sentinel_password=", "\"sentinel_password\" without a value"},
      {"redis-sentinel://a/m?sentinel_password=&db=1", "\"sentinel_password\" without a value"},
      {"redis-sentinel://a/m?sentinel_user=&sentinel_password=s3cret",
       "\"sentinel_user\" without a value"},
      {"redis-sentinel://a/m?sentinel_user=u", "\"sentinel_user\" without \"sentinel_password\""},
      {"redis-sentinel://a/m?db=1&sentinel_user=u&multiplex=1",
       "\"sentinel_user\" without \"sentinel_password\""},
      {"redis-sentinel://u:@a/m?sentinel_password=s3cret", "user \"u\" with an empty password"},
      {"redis-sentinel://:@a/m", "empty password before '@'"},
      {"redis-sentinel://@a/m", "empty password before '@'"},
      {"redis://u:@h", "user \"u\" with an empty password"},
      {"redis://:@h", "empty password before '@'"},
      {"redis://@h", "empty password before '@'"},
      {"redis://@h?multiplex=2", "empty password before '@'"},
      {"rediss://u:@h?sni=x", "user \"u\" with an empty password"},
      {"unix://u:@/t/s", "user \"u\" with an empty password"},
      {"unix://:@/t/s?db=1", "empty password before '@'"},
      {"unix://@/t/s", "empty password before '@'"},
      {"redis-cluster://u:@a:7000,b:7001", "user \"u\" with an empty password"},
      {"redis-cluster://@a:7000", "empty password before '@'"},
      {"rediss-cluster://:@a:7000?sni=x", "empty password before '@'"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find(r.named), std::string::npos) << why;
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
  }
  // The forms with a password, and none at all, are still taken.
  const auto s = redis::parse_url("redis-sentinel://:pw@a/m?sentinel_user=su&sentinel_password=sp");
  EXPECT_EQ(s.user, "");
  EXPECT_EQ(s.password, "pw");
  EXPECT_EQ(s.sentinel.user, "su");
  EXPECT_EQ(s.sentinel.password, "sp");
  const auto p = redis::parse_url("redis-sentinel://a/m?sentinel_password=sp");
  EXPECT_EQ(p.sentinel.user, "");
  EXPECT_EQ(p.sentinel.password, "sp");
  const auto u = redis::parse_url("redis://u:p@h");
  EXPECT_EQ(u.user, "u");
  EXPECT_EQ(u.password, "p");
  EXPECT_EQ(redis::parse_url("redis://p@h").password, "p");
  EXPECT_EQ(redis::parse_url("unix://:p@/t/s").password, "p");
  const auto c = redis::parse_cluster_url("redis-cluster://u:p@a:7000,b:7001");
  EXPECT_EQ(c.node.user, "u");
  EXPECT_EQ(c.node.password, "p");
  ASSERT_EQ(c.seeds.size(), 2u);
  EXPECT_EQ(c.seeds[1].port, 7001);
  const auto none = redis::parse_url("redis://h");
  EXPECT_TRUE(none.user.empty());
  EXPECT_TRUE(none.password.empty());
  // ':PASSWORD@' (the default user) in every form; no percent-decoding, so
  // '%00' and '%20' are three-byte passwords, not empty ones.
  for (const char* url : {"redis://:p@h", "rediss://:p@h?sni=x", "redis-sentinel://:p@a/m",
                          "rediss-cluster://:p@a:7000?sni=x", "redis-cluster://:p@a:7000"}) {
    SCOPED_TRACE(url);
    std::string user = "?";
    std::string password;
    if (std::string(url).find("-cluster://") != std::string::npos) {
      const auto co = redis::parse_cluster_url(url);
      user = co.node.user;
      password = co.node.password;
    } else {
      const auto po = redis::parse_url(url);
      user = po.user;
      password = po.password;
    }
    EXPECT_EQ(user, "");
    EXPECT_EQ(password, "p");
  }
  EXPECT_EQ(redis::parse_url("redis://u:%00@h").password, "%00");
  EXPECT_EQ(redis::parse_url("redis://%20@h").password, "%20");
}

/// The message `make` refuses with; "" when it returns.
template <class F>
std::string refusal_of(F make) {
  try {
    make();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

// Verifies that the same empty credentials set in code, not through a URL,
// are refused by name when the store (or a sentinel_locator) is made: AUTH
// goes out only with a password, so a user without one was dropped and the
// store connected as the default user with no AUTH and no error. A password
// alone is taken, and so is sentinel.user when no Sentinel is used (it is
// not read then). Construction touches no server.
TEST(UrlReview, UserWithoutPasswordInCodeIsRefusedByName) {
  redis::options o;
  o.user = "alice";
  const std::string master = refusal_of([&] { redis::redis_store store(o); });
  EXPECT_NE(master.find("options::user \"alice\" is set but options::password is empty"),
            std::string::npos)
      << master;
  o.user.clear();
  o.password = "s3cret";
  o.sentinel.user = "bob";  // no Sentinel: not used
  EXPECT_EQ(refusal_of([&] { redis::redis_store store(o); }), "");
  o.sentinel.master_name = "m";
  o.sentinel.sentinels.push_back(redis::sentinel_address{"127.0.0.1", 1});
  const std::string sentinel = refusal_of([&] { redis::redis_store store(o); });
  EXPECT_NE(sentinel.find("options::sentinel.user \"bob\" is set but options::sentinel.password "
                          "is empty"),
            std::string::npos)
      << sentinel;
  EXPECT_EQ(sentinel.find("s3"), std::string::npos) << sentinel;
  const std::string located = refusal_of([&] { redis::sentinel_locator locator(o); });
  EXPECT_NE(located.find("options::sentinel.user \"bob\" is set"), std::string::npos) << located;
  o.sentinel.password = "s3cret2";
  o.user = "alice";
  EXPECT_EQ(refusal_of([&] { redis::redis_store store(o); }), "");
  o.password.clear();
  const std::string both = refusal_of([&] { redis::sentinel_locator locator(o); });
  EXPECT_NE(both.find("options::user \"alice\""), std::string::npos) << both;
}

// Verifies that a URL listing several hosts (redis-cluster://,
// rediss-cluster://, redis-sentinel://) with a ',' before its last '@' is
// refused: `redis-cluster://a:7000,:@b` was read as user "a", password
// "7000,:" and the one seed "b", so a seed written with an '@' of its own
// was silently dropped. The message says to set such a credential in code
// (nothing is percent-decoded) and does not quote the password; a
// single-host URL still takes a ',' in its password.
TEST(UrlReview, CommaBeforeTheLastAtOfAMultiHostUrlIsRefused) {
  struct row {
    std::string url;
    std::string set_in_code;  // the fields the message names
  };
  const row rows[] = {
      {"redis-cluster://a:7000,:@b", "cluster_options::node.user and node.password"},
      {"redis-cluster://a:7000,u:pw@b:7001", "cluster_options::node.user and node.password"},
      {"redis-cluster://u:s3,cret@a:7000,b:7001", "cluster_options::node.user and node.password"},
      {"redis-cluster://s3,@a", "cluster_options::node.user and node.password"},
      {"redis-cluster://u,v:s3@a:7000?multiplex=2", "cluster_options::node.user and node.password"},
      {"rediss-cluster://a:7000,:s3@b?sni=x", "cluster_options::node.user and node.password"},
      {"rediss-cluster://u:s3%2C@a,b:1@c", "cluster_options::node.user and node.password"},
      {"redis-sentinel://a:26379,:s3@b/m", "options::user and options::password"},
      {"redis-sentinel://u:s3,x@a,b/m?db=1", "options::user and options::password"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find("has a ',' before its last '@'"), std::string::npos) << why;
    EXPECT_NE(why.find("set " + r.set_in_code + " in code"), std::string::npos) << why;
    EXPECT_NE(why.find("%2C stays three bytes"), std::string::npos) << why;
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
  }
  // The same credentials without ',', and a ',' after the last '@' (the
  // seed list itself), are taken; '%2C' is a password of three bytes.
  const auto c = redis::parse_cluster_url("redis-cluster://u:p%2C@a:7000,b:7001");
  EXPECT_EQ(c.node.user, "u");
  EXPECT_EQ(c.node.password, "p%2C");
  ASSERT_EQ(c.seeds.size(), 2u);
  EXPECT_EQ(c.seeds[0], (redis::node_address{"a", 7000}));
  EXPECT_EQ(c.seeds[1], (redis::node_address{"b", 7001}));
  const auto s = redis::parse_url("redis-sentinel://:pw@a,b:26380/m");
  EXPECT_EQ(s.password, "pw");
  ASSERT_EQ(s.sentinel.sentinels.size(), 2u);
  EXPECT_EQ(s.sentinel.sentinels[1].port, 26380);
  // One host: a ',' in the password is no seed list and stays allowed.
  const auto one = redis::parse_url("redis://u:a,b@h:7000");
  EXPECT_EQ(one.user, "u");
  EXPECT_EQ(one.password, "a,b");
  EXPECT_EQ(one.port, 7000);
  EXPECT_EQ(redis::parse_url("rediss://a,b@h?sni=x").password, "a,b");
}

// Verifies that the hint "parameters follow '?'" is given only for a
// database written in a URL's path (`redis://h/x`, maybe a '/' typed for
// '?'), not for a `db=` value of a query, where it was wrong
// (`redis-sentinel://a:1/m?db=1/S3CRET`); and that counts read "1 byte".
TEST(UrlReview, PathHintOnlyForADatabaseInThePath) {
  EXPECT_NE(refusal("redis://h/x").find("(1 byte, not quoted; parameters follow '?')"),
            std::string::npos);
  for (const char* url : {"redis://h/1&multiplex=2", "redis://h/1;x", "redis://h/1=2"}) {
    EXPECT_NE(refusal(url).find("(expected 0..999999999; parameters follow '?')"),
              std::string::npos)
        << refusal(url);
  }
  EXPECT_EQ(refusal("redis://h/99999999999").find("parameters follow"), std::string::npos);
  for (const char* url : {"redis-sentinel://a:1/m?db=1/S3CRET", "unix:///t/s?db=1x"}) {
    const std::string why = refusal(url);
    EXPECT_NE(why.find("bad database in redis URL"), std::string::npos) << why;
    EXPECT_EQ(why.find("parameters follow"), std::string::npos) << why;
    EXPECT_EQ(why.find("S3CRET"), std::string::npos) << why;
  }
  EXPECT_NE(refusal("redis://[a]:1").find("a bracketed host of 1 byte without"), std::string::npos);
  EXPECT_NE(refusal("redis://[::1]x").find("has 1 byte after the IPv6 address"), std::string::npos);
}

// Verifies that read_spin_us= on a cluster URL is refused by its own name:
// the cluster store never spins, and the parameter used to fall through to
// the TLS parser, which told a redis-cluster:// user "TLS parameters need
// rediss://" and a rediss-cluster:// user "unknown parameter". It is
// refused by name whatever its value: a bad value (`read_spin_us=x`, or
// out of range) was reported as a bad value of a parameter the cluster
// forms do not take at all.
TEST(UrlReview, ReadSpinOnAClusterUrlIsRefusedByName) {
  for (const char* url :
       {"redis-cluster://a:7000,b:7001?read_spin_us=50", "redis-cluster://a:7000?read_spin_us=0",
        "rediss-cluster://a:7000?sni=x&read_spin_us=5",
        "redis-cluster://a:7000?multiplex=2&read_spin_us=1000",
        "redis-cluster://a:7000?read_spin_us=99999", "redis-cluster://a:7000?read_spin_us=S3CRET",
        "redis-cluster://a:7000?read_spin_us",
        "redis-cluster://a:7000?read_spin_us=1&read_spin_us=1"}) {
    const std::string why = refusal(url);
    EXPECT_NE(why.find("has parameter \"read_spin_us\": the cluster store never spins"),
              std::string::npos)
        << url << ": " << why;
    EXPECT_EQ(why.find("TLS"), std::string::npos) << why;
    EXPECT_EQ(why.find("S3CRET"), std::string::npos) << why;
  }
  EXPECT_EQ(redis::parse_cluster_url("redis-cluster://a:7000?multiplex=2").node.multiplex, 2u);
}

// Verifies that a userinfo running past the host is refused on every form:
// it ends at the last '@' (unix://: the first "@/"), so an '@' in a query
// value, a path or a fragment made the text before it a password and the
// text after it the host. Only an '@' after the name of a known parameter
// was caught: `redis://h?x=1@evil` connected to "evil" sending "h?x=1" as
// the password, and `redis-sentinel://s/m?x=a@evil/m2` asked the sentinel
// "evil" for master "m2". A user or password holding '?', '#' or (but in
// unix://) '/' is refused too: it cannot be told from such a URL. The
// message names the byte and the fields to set in code, and quotes neither
// password nor secret query value.
TEST(UrlReview, UserinfoRunningPastTheHostIsRefused) {
  struct row {
    std::string url;
    std::string named;        // what the message must say
    std::string set_in_code;  // the fields it names
  };
  const std::string last = "before its last '@', where its userinfo ends";
  const std::string first = "before its first \"@/\", where its userinfo ends";
  const std::string plain = "options::user and options::password";
  const row rows[] = {
      {"redis://h?x=1@evil", "'?' " + last, plain},
      {"redis://h:6379?multiplex=2@evil:1", "'?' " + last, plain},
      {"redis://h#frag@evil", "'#' " + last, plain},
      {"redis://h/1@evil:6379/2", "'/' " + last, plain},
      {"redis://u:s3/cret@h", "'/' " + last, plain},
      {"redis://:s3#cret@h", "'#' " + last, plain},
      {"redis://s3cret@h?x=a:b@c", "'?' " + last, plain},
      {"rediss://h:6379?ca=/a@b", "'?' " + last,
       "options::user, options::password and options::tls"},
      {"rediss://u:s3cret@h?verify=full&ca=/etc/a@b/ca.crt", "'?' " + last,
       "options::user, options::password and options::tls"},
      {"rediss://u:s3?cret@h?verify=none", "'?' " + last,
       "options::user, options::password and options::tls"},
      {"unix://run/s.sock?x=@/evil", "'?' " + first, plain},
      {"unix://?multiplex=2@/t/s", "'?' " + first, plain},
      {"unix://:s3?cret@/t/s", "'?' " + first, plain},
      {"unix://u:s3#cret@/t/s?db=1", "'#' " + first, plain},
      {"redis-cluster://h:7000?x=1@evil:7000", "'?' " + last,
       "cluster_options::node.user and node.password"},
      {"redis-cluster://a/x@b", "'/' " + last, "cluster_options::node.user and node.password"},
      {"redis-cluster://u:s3?cret@a:7000,b:7001", "'?' " + last,
       "cluster_options::node.user and node.password"},
      {"rediss-cluster://h:7000?sni=a@evil", "'?' " + last,
       "cluster_options::node.user, node.password and node.tls"},
      {"redis-sentinel://s1:26379/mymaster?sentinel_password=s3@cret", "'/' " + last,
       "options::user, options::password and options::sentinel"},
      {"redis-sentinel://s1/m?db=1&sentinel_password=s3@cret", "'/' " + last,
       "options::user, options::password and options::sentinel"},
      {"redis-sentinel://:s3?cret@s1/m", "'?' " + last,
       "options::user, options::password and options::sentinel"},
      {"redis-sentinel://s/m?x=s3@evil/m2", "'/' " + last,
       "options::user, options::password and options::sentinel"},
      {"redis-sentinel://s1/a@b/c", "'/' " + last,
       "options::user, options::password and options::sentinel"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find("has a " + r.named), std::string::npos) << why;
    EXPECT_NE(why.find("set " + r.set_in_code + " in code"), std::string::npos) << why;
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
    EXPECT_EQ(why.find("cret"), std::string::npos) << why;
  }
  EXPECT_NE(refusal("redis://h?x=1@evil").find("an '@' in a query value"), std::string::npos);
  // The redacted URL hides all of such a userinfo: its "user" part may be a
  // password (no ':' in the real userinfo) or a query value.
  EXPECT_NE(refusal("redis://s3cret@h?sni=a:b@c").find("\"redis://***@c\""), std::string::npos);
}

// Verifies that a password may still hold '@' (the userinfo ends at the
// last '@') on every form, and '/' in a unix:// URL, whose userinfo ends at
// the first "@/"; and that '&', '=' and ':' in a password are no query.
TEST(UrlReview, PasswordsHoldingAnAtStillWork) {
  const auto a = redis::parse_url("redis://u:p@ss@h:7000/2?multiplex=2");
  EXPECT_EQ(a.user, "u");
  EXPECT_EQ(a.password, "p@ss");
  EXPECT_EQ(a.host, "h");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.database, 2);
  EXPECT_EQ(a.multiplex, 2u);
  const auto b = redis::parse_url("rediss://:p@ss@h?sni=x");
  EXPECT_EQ(b.password, "p@ss");
  EXPECT_EQ(b.host, "h");
  EXPECT_EQ(b.tls.server_name, "x");
  const auto c = redis::parse_url("unix://u:p@s/s@/t/s?db=3");
  EXPECT_EQ(c.password, "p@s/s");
  EXPECT_EQ(c.unix_socket, "/t/s");
  EXPECT_EQ(c.database, 3);
  const auto d = redis::parse_cluster_url("redis-cluster://u:p@ss@a:7000,b:7001?multiplex=2");
  EXPECT_EQ(d.node.password, "p@ss");
  ASSERT_EQ(d.seeds.size(), 2u);
  EXPECT_EQ(d.seeds[0], (redis::node_address{"a", 7000}));
  EXPECT_EQ(d.node.multiplex, 2u);
  const auto e = redis::parse_cluster_url("rediss-cluster://:p@ss@a:7000?sni=x");
  EXPECT_EQ(e.node.password, "p@ss");
  EXPECT_EQ(e.node.tls.server_name, "x");
  const auto f = redis::parse_url("redis-sentinel://:p@ss@s1,s2:26380/m?sentinel_password=sp");
  EXPECT_EQ(f.password, "p@ss");
  ASSERT_EQ(f.sentinel.sentinels.size(), 2u);
  EXPECT_EQ(f.sentinel.sentinels[1].port, 26380);
  EXPECT_EQ(f.sentinel.password, "sp");
  const auto g = redis::parse_url("redis://u:p&multiplex=2=:x@h");
  EXPECT_EQ(g.password, "p&multiplex=2=:x");
  EXPECT_EQ(g.multiplex, 0u);
}

// Verifies that a query parameter given to a URL form that does not take it
// is refused naming that parameter and where it belongs. Whatever was left
// of a redis:// query once multiplex= and read_spin_us= were taken out used
// to be refused with "has parameters after '?': TLS parameters need
// rediss://" (`redis://h?read_spin_us=5&db=1` too), and on rediss:// with a
// list of known names that left out multiplex and read_spin_us; a unix://
// query without multiplex= went to the socket path (`unix:///t/s?sni=x&db=1`
// connected to "/t/s?sni=x&db=1" on database 0).
TEST(UrlReview, MisplacedQueryParametersAreNamed) {
  struct row {
    std::string url;
    std::string named;  // what the message must say
  };
  const std::string db_path = "has parameter \"db\": a redis:// URL takes its database in the path";
  const std::string unix_only = "(a unix:// URL takes only db=, multiplex= and read_spin_us=)";
  const row rows[] = {
      {"redis://h?read_spin_us=5&db=1", db_path},
      {"redis://h?db=1&read_spin_us=5", db_path},
      {"redis://h?multiplex=2&db=1", db_path},
      {"redis://h/2?db=3", db_path},
      {"rediss://h?sni=x&db=1",
       "has parameter \"db\": a rediss:// URL takes its database in the path"},
      {"redis://h?read_spin_us=5&sni=x",
       "has TLS parameter \"sni\": TLS parameters need rediss://"},
      {"redis://h?multiplex=2&verify=none",
       "has TLS parameter \"verify\": TLS parameters need rediss://"},
      {"redis-cluster://h:7000?multiplex=2&ca=/c",
       "has TLS parameter \"ca\": TLS parameters need rediss-cluster://"},
      {"redis-cluster://h:7000?db=1", "has parameter \"db\": a cluster has only database 0"},
      {"rediss-cluster://h:7000?sni=x&db=0", "has parameter \"db\": a cluster has only database 0"},
      {"redis://h?read_spin_us=5&sentinel_password=s3cret",
       "has parameter \"sentinel_password\", which only a redis-sentinel:// URL takes"},
      {"rediss-cluster://h:7000?multiplex=1&sentinel_user=u",
       "has parameter \"sentinel_user\", which only a redis-sentinel:// URL takes"},
      {"redis://h?read_spin_us=5&multiplx=1",
       "has unknown parameter \"multiplx\" (known: multiplex, read_spin_us; with rediss:// also "
       "ca, ca_dir, cert, key, sni, verify)"},
      {"rediss://h?multiplx=1",
       "has unknown parameter \"multiplx\" (known: ca, ca_dir, cert, key, sni, verify, "
       "multiplex, read_spin_us)"},
      {"redis-cluster://h:7000?multiplx=1",
       "has unknown parameter \"multiplx\" (known: multiplex; with rediss-cluster:// also ca"},
      {"rediss-cluster://h:7000?multiplx=1",
       "has unknown parameter \"multiplx\" (known: ca, ca_dir, cert, key, sni, verify, "
       "multiplex)"},
      // No likely misspelling of a known name: not quoted (it may be a password).
      {"rediss://h?foo=1",
       "has an unknown parameter (its name is not quoted: it is no likely misspelling of a known "
       "one, and may be a password; known: ca, ca_dir, cert, key, sni, verify, multiplex, "
       "read_spin_us)"},
      {"redis-sentinel://s/m?multiplex=2&ca=/c",
       "has TLS parameter \"ca\": a redis-sentinel:// URL takes none"},
      {"unix:///t/s?read_spin_us=5&sni=x",
       "has parameter \"sni\" beside multiplex= or read_spin_us= " + unix_only},
      {"unix:///t/s?sni=x&db=1", "has parameter \"sni\" beside db= " + unix_only},
      {"unix:///t/s?db=1&sni=x", "has parameter \"sni\" beside db= " + unix_only},
      {"unix:///t/s?x=1&db=1",
       "has an unknown parameter (its name is not quoted: it is no likely "
       "misspelling of a known one, and may be a password) beside db= " +
           unix_only},
      {"unix:///t/s?dbb=1&db=1", "has parameter \"dbb\" beside db= " + unix_only},
      {"unix:///t/s?sni=x",
       "has parameter \"sni\", which a unix:// URL does not take " + unix_only},
      {"unix:///t/s?sentinel_password=s3cret",
       "has parameter \"sentinel_password\", which a unix:// URL does not take"},
      {"unix:///t/s?db=1&db=2", "gives parameter \"db\" twice"},
      {"unix:///t/s?&db=1", "has an empty parameter beside db= (a stray '&')"},
      {"unix:///t/s?db=1&", "has an empty parameter beside db= (a stray '&')"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find(r.named), std::string::npos) << why;
    EXPECT_EQ(why.find("has parameters after '?'"), std::string::npos) << why;
    EXPECT_EQ(why.find("s3cret"), std::string::npos) << why;
  }
  // Every parameter a form takes goes with every other, in any order.
  const auto a = redis::parse_url("redis://h/1?read_spin_us=5&multiplex=2");
  EXPECT_EQ(a.database, 1);
  EXPECT_EQ(a.read_spin.count(), 5);
  EXPECT_EQ(a.multiplex, 2u);
  const auto b = redis::parse_url("rediss://h/1?sni=x&read_spin_us=5&verify=chain&multiplex=2");
  EXPECT_EQ(b.database, 1);
  EXPECT_EQ(b.read_spin.count(), 5);
  EXPECT_EQ(b.multiplex, 2u);
  EXPECT_EQ(b.tls.server_name, "x");
  EXPECT_EQ(b.tls.verify, redis::tls_verify::chain);
  const auto c = redis::parse_url("unix:///t/s?read_spin_us=5&db=1&multiplex=3");
  EXPECT_EQ(c.unix_socket, "/t/s");
  EXPECT_EQ(c.database, 1);
  EXPECT_EQ(c.read_spin.count(), 5);
  EXPECT_EQ(c.multiplex, 3u);
  const auto d = redis::parse_url("unix:///t/s?db=2");
  EXPECT_EQ(d.unix_socket, "/t/s");
  EXPECT_EQ(d.database, 2);
  const auto e = redis::parse_url(
      "redis-sentinel://s/m?read_spin_us=5&db=1&multiplex=2&sentinel_password=p&sentinel_user=u");
  EXPECT_EQ(e.read_spin.count(), 5);
  EXPECT_EQ(e.database, 1);
  EXPECT_EQ(e.multiplex, 2u);
  EXPECT_EQ(e.sentinel.user, "u");
  EXPECT_EQ(e.sentinel.password, "p");
  const auto f = redis::parse_cluster_url("rediss-cluster://h:7000?sni=x&multiplex=2&ca=/c");
  EXPECT_EQ(f.node.multiplex, 2u);
  EXPECT_EQ(f.node.tls.server_name, "x");
  EXPECT_EQ(f.node.tls.ca_file, "/c");
  // Without db=, multiplex=, read_spin_us= or another known NAME=, a unix://
  // path may still hold '?'.
  EXPECT_EQ(redis::parse_url("unix:///t/s?x=1").unix_socket, "/t/s?x=1");
  EXPECT_EQ(redis::parse_url("unix:///t/s?sni").unix_socket, "/t/s?sni");
}

// Verifies that an '@' after the '?' of a unix:// URL no longer hides its
// query: the query was searched from the last '@' (a unix:// userinfo ends
// at the first "@/"), so `unix:///t/s?multiplex=2&x=a@b` connected to the
// path "/t/s?multiplex=2&x=a@b" with multiplex 0, `unix:///t/s?x=@&db=1` to
// "/t/s?x=@&db=1" on database 0, and `unix:///t/s?sni=x@y` took no TLS
// parameter without a word. And that the first '?' starts the query when
// the text after it holds a known NAME=, after '&' or a second '?':
// `unix:///t/a?b?db=2` connected to the path "/t/a?b" on database 2.
TEST(UrlReview, UnixQueryAfterAnAtOrASecondQuestionMark) {
  struct row {
    std::string url;
    std::string named;  // what the message must say
  };
  const std::string unix_only = "(a unix:// URL takes only db=, multiplex= and read_spin_us=)";
  const std::string second = "has a second '?' in its query";
  const std::string unknown =
      "has an unknown parameter (its name is not quoted: it is no likely misspelling of a known "
      "one, and may be a password)";
  const row rows[] = {
      {"unix:///t/s?multiplex=2&x=a@b",
       unknown + " beside multiplex= or read_spin_us= " + unix_only},
      {"unix://:pw@/t/s?multiplex=2&x=a@b",
       unknown + " beside multiplex= or read_spin_us= " + unix_only},
      {"unix:///t/s?read_spin_us=5&q=@", unknown + " beside multiplex="},
      {"unix:///t/s?x=@&db=1", unknown + " beside db= " + unix_only},
      {"unix:///t/s?sn=@&db=1", "has parameter \"sn\" beside db= " + unix_only},
      {"unix:///t/s?multiplex=2@",
       "bad multiplex in redis URL \"unix:///t/s?multiplex=***\": it is not a number (2 bytes"},
      {"unix:///t/s?db=1@x",
       "bad database in redis URL \"unix:///t/s?db=***\": it is not a number"},
      {"unix:///t/s?sni=x@y", "has parameter \"sni\", which a unix:// URL does not take"},
      {"unix:///t/a?b?db=2", second},
      {"unix:///t/a?b@c?db=2", second},
      {"unix:///t/a?x=1?multiplex=2", second},
      {"unix:///t/a?db=1?x", second},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find(r.named), std::string::npos) << why;
  }
  // A path may still hold '?' and '@' when no known NAME= follows the '?'.
  EXPECT_EQ(redis::parse_url("unix:///t/s?x=a@b").unix_socket, "/t/s?x=a@b");
  EXPECT_EQ(redis::parse_url("unix:///t/a@b?c").unix_socket, "/t/a@b?c");
  EXPECT_EQ(redis::parse_url("unix:///t/s?multiplexer=1").unix_socket, "/t/s?multiplexer=1");
  const auto a = redis::parse_url("unix://u:p@/t/a@b?db=2&multiplex=3");
  EXPECT_EQ(a.unix_socket, "/t/a@b");
  EXPECT_EQ(a.password, "p");
  EXPECT_EQ(a.database, 2);
  EXPECT_EQ(a.multiplex, 3u);
}

// Verifies that a '#' anywhere in a Redis URL is refused by name on every
// form: a fragment means nothing here, and it was taken as part of whatever
// held it (`redis://h#x` connected to the host "h#x", `rediss://h?sni=a#b`
// named the server "a#b", `redis-sentinel://s/m#x` asked for master "m#x",
// `?sentinel_password=ab#cd` sent "ab#cd"). A '#' in the userinfo keeps its
// own message (UserinfoRunningPastTheHostIsRefused). No value after the
// '#' is quoted when it is secret.
TEST(UrlReview, FragmentIsRefusedOnEveryForm) {
  struct row {
    std::string url;
    std::string set_in_code;  // the fields the message names
  };
  const row rows[] = {
      {"redis://h#x", "options::host"},
      {"redis://h:6379#x", "options::host"},
      {"redis://h/1#x", "options::host"},
      {"redis://u:p@h#", "options::host"},
      {"redis://h?multiplex=2#x", "options::host"},
      {"rediss://h?sni=a#b", "options::host and options::tls"},
      {"rediss://h?ca=/a#b&sni=y", "options::host and options::tls"},
      {"unix:///t/s#x", "options::unix_socket"},
      {"unix:///t/s?db=1#x", "options::unix_socket"},
      {"unix://u:p@/t/s#x", "options::unix_socket"},
      {"redis-cluster://h#x", "cluster_options::seeds"},
      {"redis-cluster://a:7000,b#x:7001", "cluster_options::seeds"},
      {"rediss-cluster://a:7000?sni=a#b", "cluster_options::seeds and node.tls"},
      {"redis-sentinel://s/m#x", "options::sentinel"},
      {"redis-sentinel://s#x/m", "options::sentinel"},
      {"redis-sentinel://s/m?db=1#x", "options::sentinel"},
      {"redis-sentinel://s/m?sentinel_password=s3#cret", "options::sentinel"},
      {"redis-sentinel://u:s3cret@s/m?sentinel_user=u&sentinel_password=s3cret#",
       "options::sentinel"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find("has a '#': a URL fragment means nothing here"), std::string::npos) << why;
    EXPECT_NE(why.find("set " + r.set_in_code + " in code"), std::string::npos) << why;
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
  }
}

/// True when `s` holds a byte below 0x20 or at or above 0x7f.
bool has_raw_control(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c < 0x20 || c >= 0x7f;
  });
}

// Verifies that no message quotes a control byte of a URL as is: URLs went
// into exception messages (which services log) with their CR, LF and other
// bytes below 0x20 or 0x7f unescaped, in the URL itself (redacted_url), in
// a bad port, database or multiplex value, a parameter name or verify value
// (apply_tls_query), a sentinel or cluster node, a master name holding '/'
// and an IPv6 literal: a URL could forge log lines. Each such byte now reads
// \xNN, as detail::printable writes it.
TEST(UrlReview, ControlBytesInMessagesAreEscaped) {
  struct row {
    std::string url;
    std::string shown;  // what the message must hold
  };
  const row rows[] = {
      {"redis://h\r\nX-Forged:1"s, "\"redis://h\\x0d***\""},
      {"redis://h:\r\n"s, "the port is not a number (2 bytes, not quoted"},
      {"redis://h/\n1"s, "\"redis://h/***\": it is not a number (2 bytes, not quoted"},
      {"redis://h?multiplex=\x1b[2J"s,
       "\"redis://h?multiplex=***\": it is not a number (4 bytes, not quoted"},
      {"redis://h?x\r\n=1"s, "\"redis://h?***\" has an unknown parameter (its name is not quoted"},
      {"rediss://h?ca=/c&x\r\n"s, "\"rediss://h?ca=/c&***\" has a parameter without '='"},
      {"rediss://h?sni=a\rb"s, "\"rediss://h?sni=***\" has a control byte"},
      {"rediss://h?sni=a&sni=\r"s, "\"rediss://h?sni=a&sni=***\" gives parameter \"sni\" twice"},
      {"rediss://h?x\n=a?b"s, "\"rediss://h?***\" has an unknown parameter (its name is not"},
      {"rediss://h?verify=\xff"s, "has verify=\"\\xff\""},
      {"rediss://h?verify=\r\n"s, "a control byte in the value of parameter \"verify\""},
      {"rediss://h?ca=/c\r\n"s, "\"rediss://h?ca=***\" has a control byte"},
      {"redis://h\0x:1"s, "\"redis://h\\x00***\" has a host holding a space or a control byte"},
      {"redis://h x"s, "has a host holding a space or a control byte"},
      {"redis://h\xc3\xa9:x"s, "\"redis://h\\xc3\\xa9:***\""},
      {"redis://[::1\r]:1"s, "\"redis://[::1\\x0d***\" has a host holding"},
      {"redis://[::1\r:1"s, "\"redis://[::1\\x0d***\" opens [ without closing ]"},
      {"redis://[h\r]:1"s, "\"redis://[***\" holds a bracketed host of 2 bytes without ':'"},
      {"unix:///t/s\n"s, "\"unix:///t/s***\" has a socket path holding a control byte"},
      {"redis://[::1]\r\n"s, "has 2 bytes after the IPv6 address"},
      {"redis-cluster://a:7000,b\r\n:x"s, "bad node \"b\\x0d\\x0a:***\""},
      {"rediss-cluster://a:7000?verify=\n"s, "control byte in the value of parameter \"verify\""},
      {"redis-cluster://a:7000,b\r\n"s, "bad node \"b\\x0d\\x0a\""},
      {"redis-sentinel://s\r\n:x/m"s, "has a bad sentinel \"s\\x0d\\x0a:***\""},
      {"redis-sentinel://s\r\n/m"s, "has a bad sentinel \"s\\x0d\\x0a\""},
      {"redis-sentinel://s/m/\r\n"s, "in MASTER_NAME \"m/...\" (use ?db=N"},
      {"redis-sentinel://s/m?db=1&x\r\n=1"s, "has an unknown parameter (its name is not quoted"},
      {"redis-sentinel://s/m?x\n=a?b"s, "has an unknown parameter (its name is not quoted"},
      {"rediss://h?sni=a?\n"s, "the value of parameter \"sni\""},
      {"redis-sentinel://s/m\r\n"s, "master name \"m\\x0d...\""},
      {"unix:///t/s?db=\r"s,
       "\"unix:///t/s?db=***\": it is not a number (1 byte, not quoted) (expected"},
      {"unix:///t/s?multiplex=1&x\r=1"s,
       "has an unknown parameter (its name is not quoted: it is "
       "no likely misspelling of a known one, and may be a "
       "password) beside multiplex="},
      {"http://\r\n"s, "\"http://\\x0d***\" must start with"},
      // No "://" right after the scheme characters, and no ':' or '/' there:
      // nothing is shown (redacted_url).
      {"redis-cluster\r\n://h"s, "\"***\" must start with"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(redis::detail::escaped_name(r.url));
    std::string why;
    try {
      if (r.url.starts_with("redis-cluster") || r.url.starts_with("rediss-cluster")) {
        (void)redis::parse_cluster_url(r.url);
      } else {
        (void)redis::parse_url(r.url);
      }
    } catch (const std::invalid_argument& e) {
      why = e.what();
    }
    EXPECT_FALSE(why.empty());
    EXPECT_FALSE(has_raw_control(why)) << redis::detail::escaped_name(why);
    EXPECT_NE(why.find(r.shown), std::string::npos) << why;
  }
  // redacted_url itself (also used by examples to log a store's URL): every
  // shown byte escaped, secrets still hidden, a host shown up to its first
  // control byte.
  EXPECT_EQ(redis::detail::redacted_url("redis://u\r:p\n@h\x01:1?db=\x7f"s),
            "redis://u\\x0d:***@h\\x01***?db=***");
  EXPECT_EQ(redis::detail::redacted_url("redis://\"h\\\""), "redis://\\x22h\\x5c\\x22");
  EXPECT_EQ(redis::detail::redacted_url("redis://u:@h"), "redis://u:***@h");
}

// Verifies that redacted_url shows the value of every non-secret parameter
// the parsers take: `multiplex` and `read_spin_us` read `***`, so a message
// about a bad multiplex= hid the value it complained about. Every secret
// stays hidden: the password, `sentinel_password`, an unknown (maybe
// misspelt) parameter's value.
TEST(UrlReview, RedactedUrlShowsEveryNonSecretParameter) {
  EXPECT_EQ(redis::detail::redacted_url("redis://u:s3cret@h/2?multiplex=300&read_spin_us=5"),
            "redis://u:***@h/2?multiplex=300&read_spin_us=5");
  EXPECT_EQ(redis::detail::redacted_url("rediss://h?ca=/c&ca_dir=/d&cert=/e&key=/k&sni=s&"
                                        "verify=none&multiplex=1&read_spin_us=2&sni_=s3cret"),
            "rediss://h?ca=/c&ca_dir=/d&cert=/e&key=/k&sni=s&verify=none&multiplex=1&"
            "read_spin_us=2&sni_=***");
  EXPECT_EQ(redis::detail::redacted_url("redis-sentinel://:s3cret@s/m?db=1&sentinel_user=u&"
                                        "sentinel_password=s3cret&multiplex=2&read_spin_us=3&"
                                        "sentinel_pasword=s3cret"),
            // An unknown name after a secret is hidden whole (the end of the password?).
            "redis-sentinel://:***@s/m?db=1&sentinel_user=u&sentinel_password=***&multiplex=2&"
            "read_spin_us=3&***");
  EXPECT_EQ(redis::detail::redacted_url("unix:///t/s?db=1&multiplex=2&read_spin_us=3"),
            "unix:///t/s?db=1&multiplex=2&read_spin_us=3");
  // The messages that used to hide the value they named.
  EXPECT_NE(
      refusal("redis://h?multiplex=300&read_spin_us=5")
          .find("bad multiplex \"300\" in redis URL \"redis://h?multiplex=300&read_spin_us=5\""),
      std::string::npos);
  EXPECT_NE(
      refusal("redis-cluster://a:7000?multiplex=999")
          .find("bad multiplex \"999\" in redis URL \"redis-cluster://a:7000?multiplex=999\""),
      std::string::npos);
  EXPECT_NE(refusal("redis-sentinel://s/m?read_spin_us=2000&sentinel_password=s3cret")
                .find("\"redis-sentinel://s/m?read_spin_us=2000&sentinel_password=***\""),
            std::string::npos);
}

// Verifies that a query item without '=' that is no known parameter name is
// neither quoted nor shown: it may be the end of a value holding '&'
// (`?sentinel_password=p&ss` said "has no '=' after parameter "ss"") or a
// secret whose '=' was mistyped (`?sentinel_password:s3cret` was quoted
// whole, in the URL and as a parameter name). Nor does a bad port, database
// or node quote what follows a '&' in it (`redis://h/1&sentinel_password=x`
// quoted the database "1&sentinel_password=x").
TEST(UrlReview, SecretsAfterAnAmpersandOrAMistypedEqualsAreNotQuoted) {
  struct row {
    std::string url;
    std::string named;  // what the message must say
  };
  const std::string unnamed = "has a parameter without '=' (NAME=VALUE; not quoted";
  const row rows[] = {
      {"redis-sentinel://s/m?sentinel_password=p&s3cret",
       "\"redis-sentinel://s/m?sentinel_password=***&***\" " + unnamed},
      {"redis-sentinel://s/m?sentinel_password:s3cret", "\"redis-sentinel://s/m?***\" " + unnamed},
      {"redis-sentinel://s/m?db=1&s3cret", unnamed},
      {"redis://h?password:s3cret", "\"redis://h?***\" " + unnamed},
      {"redis://h?multiplex=2&s3cret", unnamed},
      {"rediss://h?ca=/x&s3cret", "\"rediss://h?ca=/x&***\" " + unnamed},
      {"rediss://h?s3cret&sni=x", unnamed},
      {"rediss-cluster://h:7000?sni=x&s3cret", unnamed},
      {"redis-cluster://h:7000?s3cret", unnamed},
      {"unix:///t/s?db=1&s3cret", "\"unix:///t/s?db=1&***\" " + unnamed},
      {"unix:///t/s?multiplex=1&s3cret", unnamed},
      {"redis://h/1&sentinel_password=s3cret", "bad database \"1&...\""},
      {"redis://h:1&sentinel_password=s3cret", "bad port \"1&...\""},
      {"redis://[::1]x&p=s3cret", "has 10 bytes after the IPv6 address"},
      {"redis-sentinel://s:1&p=s3cret/m", "has a bad sentinel \"s:1&...\""},
      {"redis-cluster://a:1&p=s3cret", "bad node \"a:1&...\""},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find(r.named), std::string::npos) << why;
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
  }
  // A known name without '=' is still named.
  EXPECT_NE(refusal("rediss://h?sni").find("has parameter \"sni\" without a value"),
            std::string::npos);
  EXPECT_NE(refusal("redis://h?sni").find("has TLS parameter \"sni\""), std::string::npos);
  EXPECT_NE(refusal("redis-sentinel://s/m?db").find("has no '=' after parameter \"db\""),
            std::string::npos);
  EXPECT_NE(refusal("redis-sentinel://s/m?db").find("\"redis-sentinel://s/m?db\""),
            std::string::npos);
}

// Verifies that a port that is not a number is never quoted, in the
// message or in the URL it quotes: `redis://default:hunter2` (the
// "USER@HOST" left out, so `default` is the host and the password the
// port) said bad port "hunter2" in redis URL "redis://default:hunter2".
// The message says the port is no number, its length and the likely
// cause, on every form that reads a port: redis://, rediss://, the
// cluster seeds and the sentinels. A number out of range is still quoted.
TEST(UrlReview, PortThatIsNoNumberIsNotQuoted) {
  for (const std::string url :
       {"redis://default:hunter2", "rediss://default:hunter2", "redis://default:hunter2/1",
        "redis://default:hunter2?multiplex=2", "rediss://default:hunter2?sni=a",
        "redis://[::1]:hunter2", "redis://default:hunter2&db=1", "redis-cluster://default:hunter2",
        "redis-cluster://a:7000,default:hunter2", "rediss-cluster://default:hunter2?sni=a",
        "redis-cluster://default:hunter2?multiplex=1", "redis-sentinel://default:hunter2/m",
        "redis-sentinel://a:26379,default:hunter2/m?db=1"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_EQ(why.find("hunter"), std::string::npos) << why;
    EXPECT_NE(why.find("port is not a number (7 bytes, not quoted"), std::string::npos) << why;
    EXPECT_NE(why.find("\"USER@HOST\"; is the '@' missing?"), std::string::npos) << why;
  }
  // A password holding ':' (two colons: read as an IPv6 address).
  for (const std::string url : {"redis://default:s3:cr3t", "redis-cluster://default:s3:cr3t",
                                "redis-sentinel://default:s3:cr3t/m"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_FALSE(why.empty());
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
    EXPECT_EQ(why.find("cr3t"), std::string::npos) << why;
  }
  EXPECT_EQ(redis::detail::redacted_url("redis://default:hunter2"), "redis://default:***");
  EXPECT_EQ(redis::detail::redacted_url("redis-sentinel://a:1,b:hunter2,[::1]:x/m"),
            "redis-sentinel://a:1,b:***,[::1]:***/m");
  EXPECT_EQ(redis::detail::redacted_url("redis://u:p@h:6379/2"), "redis://u:***@h:6379/2");
  // Numbers out of range are not quoted either (PortOutOfRangeIsNotQuoted);
  // an empty port has nothing to hide.
  EXPECT_NE(refusal("redis://h:").find("bad port \"\" in redis URL \"redis://h:\""),
            std::string::npos);
}

// Verifies that a parameter name after sentinel_password= that is no
// known parameter is never quoted, in the message or the URL:
// `?sentinel_password=p&ss=1` may be the password "p&ss=1" ('&' cannot be
// written in a value), and said unknown parameter "ss" in URL
// "...sentinel_password=***&ss=***". The message names sentinel_password=
// and says to set such a password in code. An unknown name with no secret
// before it is still quoted as a likely misspelling, with the known names.
TEST(UrlReview, UnknownNameAfterASecretIsNotQuoted) {
  const std::string after = "has an unknown parameter after sentinel_password= (not quoted";
  struct row {
    std::string url;
    std::string said;  // what the message must hold
  };
  const row rows[] = {
      {"redis-sentinel://s/m?sentinel_password=p&ss3cret=1",
       "\"redis-sentinel://s/m?sentinel_password=***&***\" " + after},
      {"redis-sentinel://s/m?sentinel_password=p&db=1&ss3cret=1",
       "\"redis-sentinel://s/m?sentinel_password=***&db=1&***\" " + after},
      {"redis-sentinel://s/m?sentinel_password=p&ss3cret=a?b", after},
      {"redis-sentinel://s/m?sentinel_password=p&ss3cret=", after},
      {"redis-sentinel://s/m?sentinel_password=p&ss3cret", "has a parameter without '='"},
      {"redis://h?sentinel_password=p&ss3cret=1", "\"redis://h?sentinel_password=***&***\""},
      {"rediss://h?sentinel_password=p&ss3cret=1", "\"rediss://h?sentinel_password=***&***\""},
      {"redis-cluster://h:1?sentinel_password=p&ss3cret=1",
       "\"redis-cluster://h:1?sentinel_password=***&***\""},
      {"unix:///t/s?db=1&sentinel_password=p&ss3cret=1",
       "\"unix:///t/s?db=1&sentinel_password=***&***\""},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.url);
    const std::string why = refusal(r.url);
    EXPECT_NE(why.find(r.said), std::string::npos) << why;
    EXPECT_EQ(why.find("s3"), std::string::npos) << why;
  }
  EXPECT_NE(refusal("redis-sentinel://s/m?sentinel_password=p&ss3cret=1")
                .find("set options::sentinel.password in code"),
            std::string::npos);
  // Any item whose value is hidden counts: a misspelt secret too.
  EXPECT_EQ(redis::detail::redacted_url("redis-sentinel://s/m?sentinel_pasword=p&ss3cret=1&db=2"),
            "redis-sentinel://s/m?sentinel_pasword=***&***&db=2");
  // Before any secret, an unknown name is a likely misspelling: quoted.
  const std::string typo = refusal("redis-sentinel://s/m?sentinel_pasword=s3cret");
  EXPECT_NE(typo.find("has an unknown parameter \"sentinel_pasword\" (known: db,"),
            std::string::npos)
      << typo;
  EXPECT_EQ(typo.find("s3"), std::string::npos) << typo;
  EXPECT_NE(refusal("redis-sentinel://s/m?db=1&dbb=2&sentinel_password=p")
                .find("has an unknown parameter \"dbb\""),
            std::string::npos);
}

// Verifies that a '&' in a Sentinel URL's MASTER_NAME, where '?' was meant,
// is refused, and that the message quotes neither the master name past the
// '&' nor a secret there. Before, `/mymaster&db=2` was accepted as master
// "mymaster&db=2" on database 0, and `/m&sentinel_password=S3CRET` sent no
// AUTH to the sentinels and carried the secret in the master name (which
// "no master" errors quote); a '/' in the name quoted the secret too.
TEST(UrlReview, AmpersandInASentinelMasterNameIsRefused) {
  const std::string urls[] = {
      "redis-sentinel://s1/mymaster&db=2",
      "redis-sentinel://s1/m&sentinel_password=S3CRET",
      "redis-sentinel://s1:26379,s2/m&sentinel_password=S3CRET?db=1",
      "redis-sentinel://u:pw@s1/m&sentinel_password=S3 CRET",
      "redis-sentinel://s1/m/&sentinel_password=S3CRET",
  };
  for (const std::string& url : urls) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    ASSERT_FALSE(why.empty()) << "accepted";
    EXPECT_EQ(why.find("S3"), std::string::npos) << why;
  }
  EXPECT_NE(refusal(urls[0]).find("has a '&' in MASTER_NAME \"mymaster&...\""), std::string::npos)
      << refusal(urls[0]);
  EXPECT_NE(refusal(urls[0]).find("options::sentinel.master_name"), std::string::npos);
  EXPECT_NE(refusal(urls[4]).find("has a '/' in MASTER_NAME \"m/...\""), std::string::npos)
      << refusal(urls[4]);
  // The query still works, and so does a name set in code.
  EXPECT_EQ(redis::parse_url("redis-sentinel://s1/mymaster?db=2").database, 2);
  EXPECT_EQ(redis::parse_url("redis-sentinel://s1/mymaster?db=2").sentinel.master_name, "mymaster");
}

// Verifies that a URL whose scheme is mistyped (no "://"), which cannot be
// split into its parts, is quoted by its leading scheme characters only:
// the whole URL, its password included, was quoted before.
TEST(UrlReview, MistypedSchemeQuotesNoSecret) {
  const std::pair<std::string, std::string> rows[] = {
      {"redis:/u:S3CRET@h", "\"redis***\" must start with"},
      {"redis//u:S3CRET@h", "\"redis***\" must start with"},
      {"redis:u:S3CRET@h", "\"redis***\" must start with"},
      {"rediss:/:S3CRET@h:6380", "\"rediss***\" must start with"},
      {"unix:/u:S3CRET@/tmp/s", "\"unix***\" must start with"},
      {"redis-sentinel:/u:S3CRET@s/m", "\"redis-sentinel***\" must start with"},
      // A bare word may be the password itself (REDIS_URL=hunter2).
      {"S3CRET", "\"***\" must start with"},
      {"S3CRET@h", "\"***\" must start with"},
      // A "://" further on is no scheme's end.
      {"redis:/u:S3CRET@h?ca=file:///x", "\"redis***\" must start with"},
      {"rediss:/u:S3CRET@h/0?x=a://b", "\"rediss***\" must start with"},
      {"redis-cluster:/u:S3CRET@h?x=a://b", "\"redis-cluster***\" must start with"},
  };
  for (const auto& [url, said] : rows) EXPECT_TRUE(refused_saying(url, said));
  EXPECT_EQ(redis::detail::redacted_url("redis:/u:S3CRET@h"), "redis***");
  EXPECT_EQ(redis::detail::redacted_url("hunter2"), "***");
  EXPECT_EQ(redis::detail::redacted_url("redis:/u:S3CRET@h?ca=file:///x"), "redis***");
}

// Verifies that a host holding '&', ';' or '=' (where '?' was meant, or a
// stray separator) is refused, quoted only up to that byte, and that neither
// the message nor the quoted URL holds what follows: `redis://h&password=S3CRET`
// was accepted as host "h&password=S3CRET", which every connect error quotes.
TEST(UrlReview, HostHoldingAParameterSeparatorIsRefused) {
  const std::pair<std::string, std::string> rows[] = {
      {"redis://h&password=S3CRET", "has a '&' in host \"h&...\""},
      {"redis://h;password=S3CRET", "has a ';' in host \"h;...\""},
      {"redis://h=S3CRET", "has a '=' in host \"h=...\""},
      {"redis://u:pw@h;password=S3CRET/0", "has a ';' in host \"h;...\""},
      {"rediss://h;password=S3CRET", "has a ';' in host \"h;...\""},
      {"redis-cluster://h1,h2&password=S3CRET", "bad node \"h2&...\""},
      {"redis-cluster://h1;password=S3CRET,h2", "bad node \"h1;...\""},
      {"redis-cluster://h1,h2:7000;password=S3CRET", "bad node \"h2:7000;...\""},
      {"redis-sentinel://s&sentinel_password=S3CRET/m", "bad sentinel \"s&...\""},
      {"redis-sentinel://s;sentinel_password=S3CRET/m", "bad sentinel \"s;...\""},
      {"redis-sentinel://s1,s2=S3CRET/m", "bad sentinel \"s2=...\""},
  };
  for (const auto& [url, said] : rows) EXPECT_TRUE(refused_saying(url, said));
  EXPECT_EQ(redis::detail::redacted_url("redis://h;password=S3CRET"), "redis://h;***");
  EXPECT_EQ(redis::detail::quoted_part("1;x=S3CRET"), "1;...");
  // A sentinel address set in code is quoted up to such a byte too.
  redis::options o;
  o.sentinel.master_name = "m";
  o.sentinel.sentinels.push_back({"s&sentinel_password=S3CRET", 26379});
  try {
    redis::sentinel_locator locator(o);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("bad sentinel address \"s&...\""), std::string::npos) << why;
    EXPECT_EQ(why.find("S3"), std::string::npos) << why;
  }
  o.sentinel.sentinels.front().host = "s\n1";
  try {
    redis::sentinel_locator locator(o);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"s\\x0a1:26379\""), std::string::npos) << e.what();
  }
}

// Verifies that a TLS file that exists but cannot be read is quoted with its
// control bytes escaped (the access() branch of require_readable quoted the
// path as is, so a path holding "\n" put a line break into a log line). Run
// in a child that drops to uid 65534 when root, for which access() passes.
TEST(UrlReview, UnreadableTlsPathIsQuotedEscaped) {
  char dir_template[] = "/tmp/rl-review-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  const std::string path = dir + "/ca\nforged line.pem";
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0000);
  ASSERT_GE(fd, 0);
  ::close(fd);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(2);
    std::string said = "accepted";
    try {
      redis::detail::require_readable(path, "CA file (ca)");
    } catch (const std::invalid_argument& e) {
      said = e.what();
    }
    const auto n = ::write(fds[1], said.data(), said.size());
    ::_exit(n == static_cast<ssize_t>(said.size()) ? 0 : 3);
  }
  ::close(fds[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    said.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(said.find("ca\\x0aforged line.pem\" is not readable"), std::string::npos) << said;
  EXPECT_EQ(said.find('\n'), std::string::npos) << said;
}

// Verifies that a ';', '=' or ',' in a Sentinel URL's MASTER_NAME is
// refused as '&' is, quoted up to that byte: `/m;sentinel_password=S3CRET`
// and `/m=S3CRET` were accepted, the secret in the master name (which "no
// master" errors quote) and no AUTH at the sentinels.
TEST(UrlReview, SeparatorInASentinelMasterNameIsRefused) {
  const std::pair<std::string, std::string> rows[] = {
      {"redis-sentinel://s/m;sentinel_password=S3CRET", "has a ';' in MASTER_NAME \"m;...\""},
      {"redis-sentinel://s/m=S3CRET", "has a '=' in MASTER_NAME \"m=...\""},
      {"redis-sentinel://s/m,S3CRET", "has a ',' in MASTER_NAME \"m,...\""},
      {"redis-sentinel://u:pw@s/m;sentinel_password=S3CRET?db=1",
       "has a ';' in MASTER_NAME \"m;...\""},
  };
  for (const auto& [url, said] : rows) {
    EXPECT_TRUE(refused_saying(url, said));
    EXPECT_TRUE(refused_saying(url, "options::sentinel.master_name"));
  }
  EXPECT_EQ(redis::detail::redacted_url("redis-sentinel://s/m=S3CRET"), "redis-sentinel://s/m***");
}

// Verifies that a parameter written after '/' where '?' was meant quotes no
// secret: `redis://h/sentinel_password=S3CRET` said bad database
// "sentinel_password=S3CRET", and `redis-sentinel://u:pw@s/m/sentinel_password=S3CRET`
// quoted the master name whole. A database that is no number is not quoted
// (its length is), a master name is quoted up to its '/', and redacted_url
// hides all of a path that is no number.
TEST(UrlReview, ParameterAfterASlashQuotesNoSecret) {
  const std::pair<std::string, std::string> rows[] = {
      {"redis://h/sentinel_password=S3CRET",
       "bad database in redis URL \"redis://h/***\": it is not a number (24 "
       "bytes, not quoted"},
      {"rediss://u:pw@h:6380/password=S3CRET", "it is not a number (15 bytes, not quoted"},
      {"redis://h/S3CRET", "\"redis://h/***\": it is not a number (6 bytes"},
      {"redis-sentinel://u:pw@s/m/sentinel_password=S3CRET",
       "\"redis-sentinel://u:***@s/m***\" has a '/' in MASTER_NAME \"m/...\""},
      {"redis-sentinel://s/m/S3CRET", "has a '/' in MASTER_NAME \"m/...\""},
  };
  for (const auto& [url, said] : rows) EXPECT_TRUE(refused_saying(url, said));
  EXPECT_EQ(redis::detail::redacted_url("redis://h/sentinel_password=S3CRET&x=1"),
            "redis://h/***&***");
  // A database that is a number is still quoted; any other path is hidden
  // whole in the URL, a known parameter's name too.
  EXPECT_NE(refusal("redis://h/1000000000").find("bad database \"1000000000\""), std::string::npos);
  EXPECT_EQ(redis::detail::redacted_url("redis://h/db=2"), "redis://h/***");
}

// Verifies that a relative unix:// socket path holding ':' before its first
// '/' is refused, quoting no password: `unix://default:S3CRET/tmp/redis.sock`
// ('@' left out) and `unix://:S3CRET` were accepted as relative paths holding
// the password, which connect errors quote.
TEST(UrlReview, UnixRelativePathHoldingAColonIsRefused) {
  const std::pair<std::string, std::string> rows[] = {
      {"unix://default:S3CRET/tmp/redis.sock", "\"unix://default:***/tmp/redis.sock\""},
      {"unix://:S3CRET", "\"unix://:***\""},
      {"unix://:S3CRET?db=1", "\"unix://:***?db=1\""},
  };
  for (const auto& [url, said] : rows) {
    EXPECT_TRUE(refused_saying(url, said + " has a relative socket path holding ':'"));
  }
  // A relative path with ':' after its first '/', and an absolute one, still work.
  EXPECT_EQ(redis::parse_url("unix://run/a:b.sock").unix_socket, "run/a:b.sock");
  EXPECT_EQ(redis::parse_url("unix:///tmp/a:b.sock").unix_socket, "/tmp/a:b.sock");
  EXPECT_EQ(redis::parse_url("unix://u:pw@/tmp/s").password, "pw");
}

// Verifies that no typo lets a secret into a message, now that redacted_url
// shows only what it knows to be safe (an allow-list): a ';', ',' or '='
// typed for '&' in the query, a secret in the path (a database, a master
// name) or in a fragment, and a bracketed host that is no IPv6 address.
// Each once quoted the marker in the URL or in the part the message names.
TEST(UrlReview, NoSecretInAnyMessageOfATypo) {
  const std::string urls[] = {
      // ';', ',' or '=' for '&' in the query.
      "redis://h?multiplex=2;password=S3CRET",
      "redis-sentinel://s1/m?db=1;sentinel_password=S3CRET",
      "redis-sentinel://s1/m?sentinel_user=u;sentinel_password=S3CRET",
      "unix:///tmp/s?db=1;password=S3CRET",
      "redis-cluster://a,b?multiplex=2;password=S3CRET",
      "redis-sentinel://s1/m?db=1,sentinel_password=S3CRET",
      "redis-sentinel://s1/m?sentinel_user=u=sentinel_password=S3CRET",
      "redis://h?db=1,sentinel_password=S3CRET",
      "redis://h?sentinel_user=u=sentinel_password=S3CRET",
      // The path.
      "redis://h/db=1;password=S3CRET",
      "redis://h/db=1,password=S3CRET",
      "redis://h/S3CRET",
      "redis://h/password:S3CRET",
      "redis://h/1;S3CRET",
      "redis-sentinel://s/m/S3CRET",
      "redis-sentinel://h:6379/m;auth:S3CRET",
      "redis-sentinel://a:7000,b:7001/1,S3CRET",
      // A fragment.
      "redis://h#password=S3CRET",
      "redis://u:p@h?multiplex=2#password=S3CRET",
      // A bracketed host that is no IPv6 address.
      "redis://[S3CRET]",
      // A TLS value run on with ';'.
      "rediss://h?sni=x;password=S3CRET",
      "rediss://h?verify=none;password=S3CRET",
      // A secret given as a parameter name.
      "redis://h?S3CRET=1",
      "redis://h/1&S3CRET=1",
  };
  for (const std::string& url : urls) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    ASSERT_FALSE(why.empty()) << "accepted";
    EXPECT_EQ(why.find("S3CRET"), std::string::npos) << why;
  }
  // What stays shown: a safe value of a known parameter, a database, a
  // master name and a socket path up to the typo.
  EXPECT_EQ(redis::detail::redacted_url("redis://h?multiplex=2;password=S3CRET"),
            "redis://h?multiplex=***");
  EXPECT_EQ(redis::detail::redacted_url("rediss://h:1/2?ca=/etc/c:a.pem&sni=x-y.z#S3CRET"),
            "rediss://h:1/2?ca=/etc/c:a.pem&sni=x-y.z#***");
  EXPECT_EQ(redis::detail::redacted_url("redis-sentinel://h:6379/m;auth:S3CRET"),
            "redis-sentinel://h:6379/m***");
  EXPECT_EQ(redis::detail::redacted_url("unix:///tmp/s;password=S3CRET"), "unix:///tmp/s***");
  EXPECT_EQ(redis::detail::redacted_url("redis://h/S3CRET"), "redis://h/***");
  EXPECT_EQ(redis::detail::redacted_url("redis://[S3CRET]:6379"), "redis://[***]:6379");
}

// Verifies that an unknown query parameter name is quoted only when it is
// a likely misspelling of a known one (likely_misspelling: [a-z_] only,
// within edit distance 2, or 1 of db, ca, key, sni), in the message and in
// the URL it quotes: a password pasted in the wrong place
// (`redis://h?S3CRET=1`, `redis://h/1&S3CRET=1`) was quoted as unknown
// parameter "S3CRET", or shown as `S3CRET=***` in the URL.
TEST(UrlReview, UnknownNameThatIsNoLikelyMisspellingIsNotQuoted) {
  const std::string unknown = "unknown parameter (its name is not quoted";
  for (const std::string url :
       {"redis://h?S3CRET=1", "rediss://h?S3CRET=1", "rediss://h?sni=x&S3CRET=",
        "rediss://h?S3CRET=1&S3CRET=1", "rediss://h?S3CRET=a?b", "redis-cluster://h:1?S3CRET=1",
        "rediss-cluster://h:1?S3CRET=1", "redis-sentinel://s/m?S3CRET=1",
        "redis-sentinel://s/m?db=1&S3CRET=a?b", "unix:///t/s?db=1&S3CRET=1",
        "unix:///t/s?multiplex=1&S3CRET=1", "redis://u:p@h?multiplex=1&S3CRET=1"}) {
    EXPECT_TRUE(refused_saying(url, unknown));
  }
  // Elsewhere in the URL: the name is hidden with its value.
  EXPECT_TRUE(refused_saying("redis://h/1&S3CRET=1", "bad database \"1&...\""));
  EXPECT_EQ(redis::detail::redacted_url("redis://h/1&S3CRET=1"), "redis://h/1&***");
  EXPECT_EQ(redis::detail::redacted_url("rediss://h?sni=a&S3CRET=1&verify=none"),
            "rediss://h?sni=a&***&verify=none");
  // Lowercase letters far from every known name are no likely misspelling.
  const std::string why = refusal("redis://h?hunterhunter=1");
  EXPECT_NE(why.find(unknown), std::string::npos) << why;
  EXPECT_EQ(why.find("hunter"), std::string::npos) << why;
  // Likely misspellings are still named, in the message and the URL.
  for (const std::string name : {"multiplx", "sentinel_pasword", "sni_", "verfy", "ca_dri"}) {
    EXPECT_TRUE(redis::detail::likely_misspelling(name)) << name;
    const std::string typo = refusal("rediss://h?" + name + "=1");
    EXPECT_NE(typo.find("\"rediss://h?" + name + "=***\" has unknown parameter \"" + name + "\""),
              std::string::npos)
        << typo;
  }
  for (const std::string name : {"", "S3CRET", "s3cret", "hunter", "abcd", "Db", "x\n"}) {
    EXPECT_FALSE(redis::detail::likely_misspelling(name)) << name;
  }
  EXPECT_TRUE(redis::detail::likely_misspelling("dbb"));
  EXPECT_TRUE(redis::detail::likely_misspelling("kex"));
}

// Verifies that a port that is all digits but no number from 1 to 65535 is
// not quoted, in the message or the URL: `redis://:123456` and
// `redis://default:123456` (a numeric password whose "USER@HOST" was left
// out, read as the port) said bad port "123456". A valid port is still
// shown.
TEST(UrlReview, PortOutOfRangeIsNotQuoted) {
  for (const std::string url :
       {"redis://:123456", "redis://default:123456", "redis://default:1234567890123",
        "rediss://default:123456?sni=a", "redis://default:123456/1", "redis://h:99999",
        "redis://h:0", "redis-cluster://default:123456", "redis-cluster://a:7000,b:123456",
        "rediss-cluster://default:123456?sni=a", "redis-sentinel://default:123456/m",
        "redis-sentinel://a:26379,default:123456/m?db=1"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_NE(why.find("port is not a number from 1 to 65535 ("), std::string::npos) << why;
    for (const char* digits : {"123456", "99999", ":0"}) {
      EXPECT_EQ(why.find(digits), std::string::npos) << why;
    }
  }
  EXPECT_EQ(redis::detail::redacted_url("redis://default:123456"), "redis://default:***");
  EXPECT_EQ(redis::detail::redacted_url("redis://h:6379/x"), "redis://h:6379/***");
  EXPECT_EQ(redis::detail::redacted_url("redis-cluster://a:1,b:65535,c:65536"),
            "redis-cluster://a:1,b:65535,c:***");
}

// Verifies that a ';' or '=' in a TLS parameter's value (or in
// sentinel_user's) is refused, naming the parameter without quoting the
// value: `rediss://h?sni=x;password=S3CRET` (';' typed for '&') was taken
// as the server name "x;password=S3CRET", which TLS and connect errors
// quote. A unix:// socket path may hold ';' (a legal path), but connect
// errors quote it only up to its first '&', ';' or '=', as the URL is shown.
TEST(UrlReview, SeparatorInATlsValueIsRefused) {
  const auto said = [](const std::string& name) {
    return "in the value of parameter \"" + name + "\" (not quoted";
  };
  EXPECT_TRUE(refused_saying("rediss://h?sni=x;password=S3CRET", "a ';' " + said("sni")));
  EXPECT_TRUE(refused_saying("rediss://h?ca=/x;password=S3CRET", said("ca")));
  EXPECT_TRUE(refused_saying("rediss://h?ca_dir=/d;S3CRET&sni=a", said("ca_dir")));
  EXPECT_TRUE(refused_saying("rediss://h?cert=/c;S3CRET&key=/k", said("cert")));
  EXPECT_TRUE(refused_saying("rediss://h?key=/k=S3CRET", "a '=' " + said("key")));
  EXPECT_TRUE(refused_saying("rediss://h?verify=none;password=S3CRET", said("verify")));
  EXPECT_TRUE(refused_saying("rediss-cluster://h:1?sni=x;password=S3CRET", said("sni")));
  EXPECT_TRUE(refused_saying(
      "redis-sentinel://s/m?sentinel_user=u;sentinel_password=S3CRET&sentinel_password=p",
      said("sentinel_user")));
  EXPECT_TRUE(refused_saying("redis-sentinel://s/m?sentinel_user=u=S3CRET&sentinel_password=p",
                             said("sentinel_user")));
  // Values without them are taken.
  const auto o = redis::parse_url("rediss://h?sni=a.b-c&ca=/etc/ssl/c:a.pem&verify=chain");
  EXPECT_EQ(o.tls.server_name, "a.b-c");
  EXPECT_EQ(o.tls.ca_file, "/etc/ssl/c:a.pem");
  // A socket path holding ';' is taken; connect errors cut it there.
  const auto u = redis::parse_url("unix:///nonexistent-rltest/s;password=S3CRET");
  EXPECT_EQ(u.unix_socket, "/nonexistent-rltest/s;password=S3CRET");
  try {
    redis::connection c(u);
    ADD_FAILURE() << "connected";
  } catch (const redis::connection_error& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("/nonexistent-rltest/s;..."), std::string::npos) << why;
    EXPECT_EQ(why.find("S3"), std::string::npos) << why;
  }
}

// Verifies that a port with leading zeros is taken as before (`:006379` is
// 6379, up to ten digits in all, as parse_url_int reads it) in every form:
// the rule that hides a port that is no number from 1 to 65535 refused
// them as six digits or more. Such a port is still hidden where a URL is
// quoted: `redis://default:0001234` ("USER@" left out) may be a password.
TEST(UrlReview, PortWithLeadingZerosIsTaken) {
  EXPECT_EQ(redis::parse_url("redis://h:006379").port, 6379);
  EXPECT_EQ(redis::parse_url("redis://h:0000065535").port, 65535);
  EXPECT_EQ(redis::parse_cluster_url("redis-cluster://a:0006379").seeds.at(0).port, 6379);
  EXPECT_EQ(redis::parse_url("redis-sentinel://s:0026379/m").sentinel.sentinels.at(0).port, 26379);
  EXPECT_EQ(redis::detail::redacted_url("redis://h:006379"), "redis://h:***");
  EXPECT_EQ(redis::detail::redacted_url("redis://:0000012345"), "redis://:***");
  EXPECT_EQ(refusal("redis://:0000012345").find("12345"), std::string::npos);
  // Eleven digits are more than any port is written with: not quoted.
  EXPECT_TRUE(refused_saying("redis://h:00000006379", "not a number from 1 to 65535 (11 digits"));
  EXPECT_EQ(refusal("redis://h:00000006379").find("6379"), std::string::npos);
}

// Verifies the redactions a review of the message rules found missing: a
// ',' in a redis:// or rediss:// host item is part of it (the port of
// `redis://default:abc,S3CRET`, "USER@" left out, was shown from the ','
// on); an item without '=' in the path (`redis://h/0&S3CRET`) is hidden as
// it is in the query; a unix socket path is cut at a ',' in connect errors
// as redacted_url cuts it.
TEST(UrlReview, CommaInAHostAndBareItemInThePathAreHidden) {
  for (const std::string url :
       {"redis://default:abc,S3CRET", "rediss://default:abc,S3CRET/0", "redis://:ab,S3CRET",
        "redis://[::1]:ab,S3CRET", "redis://h;password=ab,S3CRET", "redis://h/0&S3CRET",
        "redis-sentinel://s/m&S3CRET", "redis://h/0&S3CRET&multiplex=2",
        // A second review's: text after a bracketed host, a ',' in a
        // redis:// host, a '/' after a ';' in a master name, a space in it.
        "redis://[::1],default:S3CRET", "redis://h,[S3CRET]", "redis://u:p@h,S3CRET",
        "redis-sentinel://s/m;password=S3CRET/0", "redis-sentinel://s/m&S3CRET/x",
        "redis-sentinel://s/mymaster password S3CRET",
        // A third's: a space before a master name's '/' or ';', a space in
        // a socket path or host, text after an IPv6 address's ']'.
        "redis-sentinel://h/mymaster password S3CRET/0", "redis-sentinel://h/m S3CRET;x",
        "redis-sentinel://h/m\tS3CRET/x", "unix:///tmp/s S3CRET?db=x",
        "unix://u:pw@/tmp/s S3CRET#x", "redis-sentinel://h S3CRET/m",
        "redis-cluster://u:pw@h S3CRET", "redis://u:pw@[::1]x S3CRET", "redis://u:pw@h S3CRET",
        "redis://[::1]x:S3CRET", "redis-cluster://[::1]x:S3CRET", "redis://[::1]S3CRET"}) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    ASSERT_FALSE(why.empty()) << "accepted";
    EXPECT_EQ(why.find("S3"), std::string::npos) << why;
    EXPECT_EQ(redis::detail::redacted_url(url).find("S3"), std::string::npos);
  }
  EXPECT_EQ(redis::detail::redacted_url("redis://default:abc,S3CRET"), "redis://default:***");
  EXPECT_EQ(redis::detail::redacted_url("redis://h/0&S3CRET"), "redis://h/0&***");
  // The forms listing several hosts still split at ',' and show each.
  EXPECT_EQ(redis::detail::redacted_url("redis-cluster://a:7000,b:S3CRET,c:7002"),
            "redis-cluster://a:7000,b:***,c:7002");
  // A known name without '=' is still shown (and refused by name).
  EXPECT_EQ(redis::detail::redacted_url("redis://h/0&multiplex"), "redis://h/0&multiplex");
  // A socket path is quoted up to a '?' too (`unix:///tmp/s?S3CRET` is a
  // path: a unix:// query begins with a known parameter).
  for (const std::string path : {"/nonexistent-rltest/s?S3CRET", "/nonexistent-rltest/s S3CRET"}) {
    redis::options q;
    q.unix_socket = path;
    try {
      redis::connection c(q);
      ADD_FAILURE() << "connected";
    } catch (const redis::connection_error& e) {
      EXPECT_EQ(std::string(e.what()).find("S3"), std::string::npos) << e.what();
    }
  }
  const auto u = redis::parse_url("unix:///nonexistent-rltest/s,S3CRET");
  EXPECT_EQ(u.unix_socket, "/nonexistent-rltest/s,S3CRET");
  EXPECT_EQ(redis::detail::redacted_url("unix:///nonexistent-rltest/s,S3CRET"),
            "unix:///nonexistent-rltest/s***");
  try {
    redis::connection c(u);
    ADD_FAILURE() << "connected";
  } catch (const redis::connection_error& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("/nonexistent-rltest/s,..."), std::string::npos) << why;
    EXPECT_EQ(why.find("S3"), std::string::npos) << why;
  }
}

// Verifies that a multiplex= or read_spin_us= value that is no number is
// quoted neither in the message nor in the URL it shows, on every form:
// `redis://h?multiplex=S3CRET` said bad multiplex "S3CRET" in redis URL
// "redis://h?multiplex=S3CRET" (a password pasted in the wrong place). Only
// its length is given, as for a database or a port that is no number. A
// number (all digits) out of range is still quoted, and so are digits up to
// a '&', ';' or '=' (quoted_part cuts there).
TEST(UrlReview, NumericParameterThatIsNoNumberIsNotQuoted) {
  const std::string not_number = "it is not a number (6 bytes, not quoted) (expected 0..";
  const std::pair<std::string, std::string> rows[] = {
      {"redis://h?multiplex=S3CRET",
       "bad multiplex in redis URL \"redis://h?multiplex=***\": " + not_number + "256)"},
      {"rediss://h?sni=a&read_spin_us=S3CRET",
       "bad read_spin_us in redis URL \"rediss://h?sni=a&read_spin_us=***\": " + not_number +
           "1000)"},
      {"redis-cluster://a:7000?multiplex=S3CRET",
       "bad multiplex in redis URL \"redis-cluster://a:7000?multiplex=***\": " + not_number},
      {"rediss-cluster://a:7000?multiplex=S3CRET&sni=x", "bad multiplex in redis URL"},
      {"redis-cluster://a:7000?read_spin_us=S3CRET",
       "redis URL \"redis-cluster://a:7000?read_spin_us=***\" has parameter \"read_spin_us\": "
       "the cluster store never spins"},
      {"redis-sentinel://s/m?multiplex=S3CRET",
       "bad multiplex in redis URL \"redis-sentinel://s/m?multiplex=***\": " + not_number},
      {"redis-sentinel://s/m?db=1&read_spin_us=S3CRET",
       "bad read_spin_us in redis URL \"redis-sentinel://s/m?db=1&read_spin_us=***\": " +
           not_number},
      {"unix:///t/s?multiplex=S3CRET",
       "bad multiplex in redis URL \"unix:///t/s?multiplex=***\": " + not_number},
      {"unix:///t/s?db=1&read_spin_us=S3CRET", "bad read_spin_us in redis URL"},
      {"redis://h?multiplex=2S3CRET", "it is not a number (7 bytes, not quoted)"},
      {"redis://h?multiplex=-S3CRET", "it is not a number (7 bytes, not quoted)"},
      {"redis://h?read_spin_us=S3CRET;x=1", "it is not a number (10 bytes, not quoted)"},
  };
  for (const auto& [url, said] : rows) EXPECT_TRUE(refused_saying(url, said));
  EXPECT_EQ(redis::detail::redacted_url("redis://h?multiplex=S3CRET&read_spin_us=S3CRET"),
            "redis://h?multiplex=***&read_spin_us=***");
  EXPECT_EQ(redis::detail::redacted_url("redis-sentinel://s/m?db=S3CRET&multiplex=2"),
            "redis-sentinel://s/m?db=***&multiplex=2");
  // Numbers are quoted.
  EXPECT_NE(refusal("redis://h?multiplex=300")
                .find("bad multiplex \"300\" in redis URL "
                      "\"redis://h?multiplex=300\" (expected 0..256)"),
            std::string::npos);
  EXPECT_NE(refusal("redis-sentinel://s/m?read_spin_us=2000").find("bad read_spin_us \"2000\""),
            std::string::npos);
  EXPECT_NE(refusal("redis://h?multiplex=2;x").find("bad multiplex \"2;...\""), std::string::npos);
  EXPECT_NE(refusal("redis://h?multiplex=").find("bad multiplex \"\""), std::string::npos);
}

// Verifies that a number of a URL with more than 10 digits (a database, a
// multiplex= or read_spin_us= value) is quoted neither in the message nor
// in the URL it shows: `redis://h/12345678901234` said bad database
// "12345678901234" in redis URL "redis://h/12345678901234", and a long
// number may be a numeric password pasted in the wrong place. Its number of
// digits is given. Ten digits (as many as parse_url_int reads) are quoted.
TEST(UrlReview, NumberOfMoreThanTenDigitsIsNotQuoted) {
  const std::string digits = "12345678901234";
  const std::pair<std::string, std::string> rows[] = {
      {"redis://h/" + digits,
       "bad database in redis URL \"redis://h/***\": it is not a number from 0 to 999999999 (14 "
       "digits, not quoted)"},
      {"rediss://u:pw@h:6380/" + digits + "?sni=x", "it is not a number from 0 to 999999999 (14"},
      {"redis://h/" + digits + "&x=1", "\"redis://h/***&***\": it is not a number from 0 to"},
      {"unix:///t/s?db=" + digits, "\"unix:///t/s?db=***\": it is not a number from 0 to"},
      {"redis-sentinel://s/m?db=" + digits, "\"redis-sentinel://s/m?db=***\": it is not a number"},
      {"redis-sentinel://s/m/" + digits, "\"redis-sentinel://s/m***\" has a '/' in MASTER_NAME"},
      {"redis://h?multiplex=" + digits,
       "bad multiplex in redis URL \"redis://h?multiplex=***\": it is not a number from 0 to 256 "
       "(14 digits, not quoted)"},
      {"redis-cluster://a:7000?multiplex=" + digits, "it is not a number from 0 to 256 (14 digits"},
      {"redis-sentinel://s/m?read_spin_us=" + digits,
       "\"redis-sentinel://s/m?read_spin_us=***\": it is not a number from 0 to 1000 (14 digits"},
      {"unix:///t/s?read_spin_us=00000000001", "it is not a number from 0 to 1000 (11 digits"},
  };
  for (const auto& [url, said] : rows) {
    SCOPED_TRACE(url);
    const std::string why = refusal(url);
    EXPECT_NE(why.find(said), std::string::npos) << why;
    EXPECT_EQ(why.find("1234567890"), std::string::npos) << why;
    EXPECT_EQ(why.find("0000000000"), std::string::npos) << why;
  }
  EXPECT_EQ(redis::detail::redacted_url("redis://h/" + digits), "redis://h/***");
  EXPECT_EQ(redis::detail::redacted_url("unix:///t/s?db=" + digits + "&multiplex=2"),
            "unix:///t/s?db=***&multiplex=2");
  // Ten digits are quoted, and shown.
  EXPECT_NE(refusal("redis://h/9999999999")
                .find("bad database \"9999999999\" in redis URL \"redis://h/9999999999\""),
            std::string::npos);
  EXPECT_NE(refusal("redis://h?multiplex=0000000257").find("bad multiplex \"0000000257\""),
            std::string::npos);
  EXPECT_EQ(redis::parse_url("redis://h/0000000007").database, 7);
}

}  // namespace
