// SPDX-License-Identifier: Apache-2.0
// The SIP front door without sockets: the parser on well-formed and hostile
// datagrams, and the front door's answers, counters and retransmissions.
#include "front_door.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ratelimit/clock/manual_clock.hpp"
#include "sip_message.hpp"

namespace {

using namespace std::chrono_literals;

std::string invite(std::string_view user, std::string_view call_id, int cseq = 1,
                   std::string_view tag = "t1", std::string_view method = "INVITE") {
  std::string m(method);
  m += " sip:service@127.0.0.1:5060 SIP/2.0\r\n";
  m += "Via: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK-1\r\n";
  m += "From: \"Caller\" <sip:" + std::string(user) + "@127.0.0.1:5061>;tag=" + std::string(tag) +
       "\r\n";
  m += "To: <sip:service@127.0.0.1:5060>\r\n";
  m += "Call-ID: " + std::string(call_id) + "\r\n";
  m += "CSeq: " + std::to_string(cseq) + " " + std::string(method) + "\r\n";
  m += "Contact: <sip:caller@127.0.0.1:5061>\r\n";
  m += "Content-Length: 0\r\n\r\n";
  return m;
}

TEST(SipParser, ReadsTheFieldsItNeeds) {
  const std::string d =
      "INVITE sip:svc@h SIP/2.0\r\n"
      "v: SIP/2.0/UDP a;branch=z9hG4bK1\r\n"
      "Via: SIP/2.0/UDP b;branch=z9hG4bK2\r\n"
      "f: <sip:+4930123@h;user=phone>;tag=abc\r\n"
      "t: sip:svc@h\r\n"
      "i: xyz@h\r\n"
      "CSeq:   42   INVITE\r\n"
      "l: 4\r\n\r\nbody";
  sipfd::sip_message m;
  ASSERT_EQ(sipfd::parse(d, m), sipfd::parse_result::request) << m.reason;
  EXPECT_EQ(m.method, "INVITE");
  EXPECT_EQ(m.via_count, 2u);
  EXPECT_EQ(m.via[1], "SIP/2.0/UDP b;branch=z9hG4bK2");
  EXPECT_EQ(m.from_user, "+4930123");
  EXPECT_EQ(m.from_tag, "abc");
  EXPECT_FALSE(m.to_has_tag);
  EXPECT_EQ(m.call_id, "xyz@h");
  EXPECT_EQ(m.cseq, 42u);
  EXPECT_EQ(m.content_length, 4u);
}

TEST(SipParser, ResponsesAreNotRequests) {
  sipfd::sip_message m;
  EXPECT_EQ(sipfd::parse("SIP/2.0 200 OK\r\nVia: x\r\n\r\n", m), sipfd::parse_result::response);
}

TEST(SipParser, RefusesEachMissingOrBadPart) {
  const std::string good = invite("alice", "c1");
  sipfd::sip_message m;
  ASSERT_EQ(sipfd::parse(good, m), sipfd::parse_result::request) << m.reason;
  const auto without = [&](std::string_view line) {
    std::string d = good;
    const std::size_t at = d.find(line);
    EXPECT_NE(at, std::string::npos) << line;
    d.erase(at, d.find("\r\n", at) + 2 - at);
    return d;
  };
  const auto replaced = [&](std::string_view from, std::string_view to) {
    std::string d = good;
    d.replace(d.find(from), from.size(), to);
    return d;
  };
  const std::vector<std::string> bad = {
      "",
      without("Via:"),
      without("From:"),
      without("To:"),
      without("Call-ID:"),
      without("CSeq:"),
      replaced("CSeq: 1 INVITE", "CSeq: x INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 1"),
      replaced("CSeq: 1 INVITE", "CSeq: 1 BYE"),
      replaced("CSeq: 1 INVITE", "CSeq: -1 INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 2147483648 INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 99999999999999999999 INVITE"),
      replaced("Content-Length: 0", "Content-Length: 10"),  // truncated body
      replaced("Content-Length: 0", "Content-Length: -1"),
      replaced("Content-Length: 0", "Content-Length: 0\r\nContent-Length: 0"),
      replaced("Call-ID: c1", "Call-ID: c1\r\nCall-ID: c2"),
      replaced("Call-ID: c1", "Call-ID: " + std::string(200, 'x')),
      replaced("Call-ID: c1", "Call-ID: a b"),
      replaced("sip:alice@", "sip:"),                                       // no user part
      replaced("sip:alice@", "http:alice@"),                                // not a SIP URI
      replaced("<sip:alice@127.0.0.1:5061>", "<sip:alice@127.0.0.1:5061"),  // unclosed
      replaced("\"Caller\"", "\"Caller"),                                   // unclosed quote
      replaced("tag=t1", "tag=" + std::string(100, 't')),
      replaced("5060>\r\nCall-ID", "5060>;tag=" + std::string(100, 't') + "\r\nCall-ID"),
      replaced("5060>\r\nCall-ID", "5060>;tag=a<b\r\nCall-ID"),
      replaced("SIP/2.0\r\n", "SIP/3.0\r\n"),
      replaced("INVITE sip", "INV<TE sip"),
      replaced("Via:", " Via:"),                    // folded
      replaced("Via:", "Via"),                      // no colon
      replaced("alice", std::string("al\0ce", 5)),  // NUL in the headers
      replaced("alice",
               "al\x01"
               "ce"),
      replaced("Call-ID: c1", "Call-ID: c1\nX-Evil:1"),                // bare LF
      replaced("Via: SIP/2.0/UDP", "Via: SIP/2.0/UDP\nX-Evil: 1\n"),   // bare LF in Via
      replaced("Via: SIP/2.0/UDP", "Via: SIP/2.0/UDP\rX-Evil: 1\r"),   // bare CR
      replaced("To: <sip:", "To: \r<sip:"),                            // bare CR
      replaced("CSeq: 1 INVITE", "CSeq: 1 INVITE\r\nCSeq: 1 INVITE"),  // two CSeq
      replaced("From:", "From: <sip:bob@h>;tag=2\r\nf:"),              // From and f:
      replaced("To:", "To: <sip:x@h>\r\nt:"),                          // To and t:
      replaced("Call-ID: c1", "Call-ID: c1\r\ni: c1"),                 // Call-ID and i:
      replaced("Content-Length: 0", "Content-Length: 0\r\nl: 0"),      // twice
      replaced("CSeq: 1 INVITE", "CSeq: +1 INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 0x1 INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 1.5 INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 4294967297 INVITE"),  // wraps in 32 bits
      replaced("CSeq: 1 INVITE", "CSeq: INVITE"),
      replaced("CSeq: 1 INVITE", "CSeq: 1 invite"),  // methods are case-sensitive
      replaced("Content-Length: 0", "Content-Length: +0"),
      replaced("Content-Length: 0", "Content-Length:"),
      replaced("Content-Length: 0", "Content-Length: 99999999999"),
      replaced("<sip:alice@127.0.0.1:5061>", "<tel:>"),           // tel: without a number
      replaced("<sip:alice@127.0.0.1:5061>", "<sip:127.0.0.1>"),  // no user
      replaced("<sip:alice@127.0.0.1:5061>", "<sip::pw@h>"),      // only a password
      replaced("<sip:alice@127.0.0.1:5061>", "<sip:al ice@h>"),   // space in the user
      replaced("<sip:alice@127.0.0.1:5061>", "<>"),               // empty URI
      replaced("\"Caller\" <sip:alice@127.0.0.1:5061>", "\"Caller\" sip:alice@h"),  // name, no <>
      replaced("tag=t1", "tag=t 1"),
      replaced("tag=t1", "tag=<t1>"),
      replaced("Call-ID: c1", "Call-ID:"),
      replaced("INVITE sip:service", "INVITE  sip:service"),  // empty Request-URI
      replaced("SIP/2.0\r\n", "SIP/2.0 \r\n"),
      good.substr(0, good.size() - 2),            // no blank line
      good.substr(0, good.size() / 2),            // truncated
      std::string(sipfd::max_datagram + 1, 'A'),  // huge
  };
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(sipfd::parse(bad[i], m), sipfd::parse_result::malformed) << "case " << i;
    EXPECT_STRNE(m.reason, "") << "case " << i;
  }
}

// RFC 3261 7.3.1 and 7.3.3: header names are case-insensitive and From, To,
// Call-ID, Via and Content-Length have compact forms.
TEST(SipParser, HeaderNamesInAnyCaseAndCompactForm) {
  const std::string d =
      "INVITE sip:svc@h SIP/2.0\r\n"
      "VIA: SIP/2.0/UDP a;branch=z9hG4bK1\r\n"
      "V: SIP/2.0/UDP b;branch=z9hG4bK2\r\n"
      "fROM: <SIP:alice@h>;TAG=abc\r\n"
      "T: <sip:svc@h>;Tag=x\r\n"
      "I: id-1\r\n"
      "cseq: 7 INVITE\r\n"
      "L: 0\r\n"
      "X-Unknown:\r\n\r\n";
  sipfd::sip_message m;
  ASSERT_EQ(sipfd::parse(d, m), sipfd::parse_result::request) << m.reason;
  EXPECT_EQ(m.via_count, 2u);
  EXPECT_EQ(m.from_user, "alice");
  EXPECT_EQ(m.from_tag, "abc");
  EXPECT_TRUE(m.to_has_tag);
  EXPECT_EQ(m.call_id, "id-1");
  EXPECT_EQ(m.cseq, 7u);
  EXPECT_EQ(m.content_length, 0u);
  std::string lower_call_id = d;
  lower_call_id.replace(lower_call_id.find("I: id-1"), 7, "call-id: id-2");
  ASSERT_EQ(sipfd::parse(lower_call_id, m), sipfd::parse_result::request) << m.reason;
  EXPECT_EQ(m.call_id, "id-2");
}

// What the calling number and the dialog are made of, at the edges.
TEST(SipParser, FromUserAndTagEdges) {
  std::string d;  // the views in m point into it
  const auto from_of = [&d](std::string_view from, sipfd::sip_message& m) {
    d = "INVITE sip:svc@h SIP/2.0\r\nVia: SIP/2.0/UDP a\r\nFrom: ";
    d += from;
    d += "\r\nTo: <sip:svc@h>\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n";
    return sipfd::parse(d, m);
  };
  struct good_case {
    std::string_view from, user, tag;
  };
  const good_case good[] = {
      {"<tel:+49-30-123;phone-context=x>;tag=a", "+49-30-123", "a"},
      {"tel:+4930123;tag=b", "+4930123", "b"},
      {"<sip:+4930123;npdi@h;user=phone>;tag=c", "+4930123", "c"},  // user parameters
      {"<sip:alice:secret@h>;tag=d", "alice", "d"},                 // password dropped
      {"<sips:alice@h>", "alice", ""},                              // no tag
      {"<sip:alice@h>;tag=", "alice", ""},                          // empty tag
      {"<sip:alice@h>;tag", "alice", ""},                           // tag without value
      {"<sip:alice@h;tag=evil>;tag=real", "alice", "real"},         // URI parameter is not it
      {"<sip:alice@h> ; TAG = e ; other=1", "alice", "e"},
      {"\"a \\\" <sip:mallory@h>\" <sip:alice@h>;tag=f", "alice", "f"},  // quoted name
      {"sip:alice@h;tag=g", "alice", "g"},
  };
  sipfd::sip_message m;
  for (const good_case& c : good) {
    ASSERT_EQ(from_of(c.from, m), sipfd::parse_result::request) << c.from << ": " << m.reason;
    EXPECT_EQ(m.from_user, c.user) << c.from;
    EXPECT_EQ(m.from_tag, c.tag) << c.from;
  }
  for (std::string_view bad : {"<sip:h>;tag=1", "<tel:>", "<mailto:alice@h>", "sip:@h",
                               "\"unclosed <sip:alice@h>", "<sip:alice@h", "alice"}) {
    EXPECT_EQ(from_of(bad, m), sipfd::parse_result::malformed) << bad;
  }
  EXPECT_EQ(from_of("<sip:" + std::string(sipfd::max_user, '1') + "@h>", m),
            sipfd::parse_result::request);
  EXPECT_EQ(from_of("<sip:" + std::string(sipfd::max_user + 1, '1') + "@h>", m),
            sipfd::parse_result::malformed);
}

// CSeq: a number in 0 .. 2^31 - 1 and the request's method.
TEST(SipParser, CSeqEdges) {
  std::string d = invite("alice", "c1");
  const auto with = [&](std::string_view cseq, sipfd::sip_message& m) {
    std::string x = d;
    x.replace(x.find("CSeq: 1 INVITE"), 14, cseq);
    return sipfd::parse(x, m);
  };
  sipfd::sip_message m;
  ASSERT_EQ(with("CSeq: 0 INVITE", m), sipfd::parse_result::request);
  EXPECT_EQ(m.cseq, 0u);
  ASSERT_EQ(with("CSeq: 2147483647 INVITE", m), sipfd::parse_result::request);
  EXPECT_EQ(m.cseq, 2147483647u);
  ASSERT_EQ(with("CSeq: 0000000042\tINVITE", m), sipfd::parse_result::request);
  EXPECT_EQ(m.cseq, 42u);
  EXPECT_EQ(with("CSeq: 2147483648 INVITE", m), sipfd::parse_result::malformed);
  EXPECT_EQ(with("CSeq: 00000000042 INVITE", m), sipfd::parse_result::malformed);  // 11 digits
}

// Content-Length may be smaller than the body (UDP: the rest is ignored),
// never larger; absent, the body is the rest of the datagram. NUL bytes in
// the body are the body's business.
TEST(SipParser, ContentLengthAgainstTheBody) {
  std::string d = invite("alice", "c1");
  d.replace(d.find("Content-Length: 0"), 17, "Content-Length: 3");
  sipfd::sip_message m;
  EXPECT_EQ(sipfd::parse(d, m), sipfd::parse_result::malformed);  // no body at all
  ASSERT_EQ(sipfd::parse(d + std::string("a\0b", 3), m), sipfd::parse_result::request) << m.reason;
  EXPECT_EQ(m.content_length, 3u);
  ASSERT_EQ(sipfd::parse(d + "abcdef", m), sipfd::parse_result::request);
  EXPECT_EQ(m.content_length, 3u);
  std::string no_cl = invite("alice", "c1");
  no_cl.erase(no_cl.find("Content-Length: 0\r\n"), 19);
  ASSERT_EQ(sipfd::parse(no_cl + "xyz", m), sipfd::parse_result::request) << m.reason;
  EXPECT_EQ(m.content_length, 3u);
}

TEST(SipParser, TooManyViaOrHeadersIsMalformed) {
  std::string d = invite("alice", "c1");
  std::string vias;
  for (std::size_t i = 0; i <= sipfd::max_vias; ++i) vias += "Via: SIP/2.0/UDP x\r\n";
  std::string many = d;
  many.insert(many.find("From:"), vias);
  sipfd::sip_message m;
  EXPECT_EQ(sipfd::parse(many, m), sipfd::parse_result::malformed);
  std::string headers;
  for (std::size_t i = 0; i <= sipfd::max_headers; ++i) headers += "X-H: 1\r\n";
  many = d;
  many.insert(many.find("From:"), headers);
  EXPECT_EQ(sipfd::parse(many, m), sipfd::parse_result::malformed);
}

// Every prefix and every one-byte corruption of a good INVITE, and random
// bytes: the parser answers (request, response or malformed), never reads out
// of bounds (ASan), and what it calls a request has every field it promises.
TEST(SipParser, HostileBytesNeverCrash) {
  const std::string good = invite("+4930123456", "call-1@host", 7, "tagx");
  sipfd::sip_message m;
  const auto check = [&](std::string_view d) {
    if (sipfd::parse(d, m) == sipfd::parse_result::request) {
      ASSERT_GT(m.via_count, 0u);
      ASSERT_FALSE(m.from_user.empty());
      ASSERT_FALSE(m.call_id.empty());
      ASSERT_EQ(m.cseq_method, m.method);
      ASSERT_LE(m.content_length, d.size());
      // Nothing echoed into a response may break a line (header injection).
      const auto one_line = [](std::string_view v) {
        return v.find_first_of("\r\n") == std::string_view::npos;
      };
      ASSERT_TRUE(one_line(m.from) && one_line(m.to) && one_line(m.call_id) && one_line(m.method) &&
                  one_line(m.uri));
      for (std::size_t v = 0; v < m.via_count; ++v) ASSERT_TRUE(one_line(m.via[v]));
    }
  };
  for (std::size_t n = 0; n <= good.size(); ++n) check(std::string_view(good).substr(0, n));
  std::mt19937 rng(20261130);
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int v : {0, 1, 9, 10, 13, 32, 58, 59, 60, 62, 64, 127, 128, 255}) {
      std::string d = good;
      d[i] = static_cast<char>(v);
      check(d);
    }
  }
  for (int round = 0; round < 2000; ++round) {
    std::string d(rng() % 600, '\0');
    for (char& c : d) c = static_cast<char>(rng() % 256);
    if (round % 2 == 0) d = good.substr(0, rng() % good.size()) + d;
    check(d);
  }
}

/// A front door on a manual clock: its time is the test's.
struct door_fixture {
  ratelimit::manual_clock clock;
  std::unique_ptr<sipfd::front_door> door;
  sipfd::clock_type::time_point now{};

  explicit door_fixture(const sipfd::policy& p, std::size_t max_transactions = 100'000,
                        std::size_t max_bytes = std::size_t{64} << 20) {
    door = std::make_unique<sipfd::front_door>(sipfd::in_process_admission(p, clock),
                                               "sip:fd@127.0.0.1:5060", max_transactions,
                                               max_bytes);
  }
  std::string send(const std::string& d) {
    std::string out;
    if (!door->handle(d, now, out)) return "";
    return out;
  }
  void advance(std::chrono::microseconds d) {
    clock.advance(d);
    now += d;
  }
};

std::string status(const std::string& response) {
  return response.substr(0, 12);
}

/// A BYE of the dialog (call_id, tag) that carries `door`'s To tag, as a UAC
/// that got our answer sends it.
std::string bye(const sipfd::front_door& door, std::string_view user, std::string_view call_id,
                int cseq, std::string_view tag = "t1") {
  std::string d = invite(user, call_id, cseq, tag, "BYE");
  const std::string to = "To: <sip:service@127.0.0.1:5060>";
  d.insert(d.find(to) + to.size(), ";tag=" + door.dialog_tag(call_id, tag, user));
  return d;
}

/// The To tag of an answer.
std::string to_tag(const std::string& answer) {
  const std::size_t to = answer.find("\r\nTo: ");
  const std::size_t at = answer.find(";tag=", to);
  const std::size_t end = answer.find("\r\n", to + 2);
  if (to == std::string::npos || at == std::string::npos || at > end) return "";
  return answer.substr(at + 5, end - at - 5);
}

TEST(SipFrontDoor, RateLimitsPerNumberAndRetransmissionsAreTheSameCall) {
  door_fixture f(sipfd::policy{"2/15min", 10, std::chrono::hours{1}});
  const std::string r1 = f.send(invite("alice", "a1"));
  EXPECT_EQ(status(r1), "SIP/2.0 200 ");
  EXPECT_NE(r1.find("To: <sip:service@127.0.0.1:5060>;tag=fd"), std::string::npos) << r1;
  EXPECT_EQ(f.send(invite("alice", "a1")), r1);  // retransmission: the same bytes
  EXPECT_EQ(status(f.send(invite("alice", "a2"))), "SIP/2.0 200 ");
  f.advance(1s);
  const std::string r3 = f.send(invite("alice", "a3"));
  ASSERT_EQ(status(r3), "SIP/2.0 503 ");
  // The first call leaves the 15-minute window 899 s from now.
  EXPECT_NE(r3.find("Retry-After: 899\r\n"), std::string::npos) << r3;
  f.advance(10s);
  EXPECT_EQ(f.send(invite("alice", "a3")), r3);  // the same answer, not a new decision
  EXPECT_EQ(status(f.send(invite("bob", "b1"))), "SIP/2.0 200 ");  // numbers are separate
  const sipfd::counters& c = f.door->stats();
  EXPECT_EQ(c.invites, 4u);
  EXPECT_EQ(c.admitted, 3u);
  EXPECT_EQ(c.rejected, 1u);
  EXPECT_EQ(c.invite_retransmissions, 2u);
}

TEST(SipFrontDoor, CallsInProgressAndByeAndLostBye) {
  door_fixture f(sipfd::policy{"100/15min", 2, std::chrono::seconds{60}});
  EXPECT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");
  f.advance(10s);
  EXPECT_EQ(status(f.send(invite("alice", "a2"))), "SIP/2.0 200 ");
  const std::string busy = f.send(invite("alice", "a3"));
  ASSERT_EQ(status(busy), "SIP/2.0 503 ");
  EXPECT_NE(busy.find("Retry-After: 50\r\n"), std::string::npos) << busy;  // a1 expires at 60 s
  // BYE a2 frees a slot; its retransmission gets the same 200 and frees nothing more.
  const std::string freed = f.send(bye(*f.door, "alice", "a2", 2));
  EXPECT_EQ(status(freed), "SIP/2.0 200 ");
  EXPECT_EQ(f.send(bye(*f.door, "alice", "a2", 2)), freed);
  EXPECT_EQ(status(f.send(invite("alice", "a4"))), "SIP/2.0 200 ");
  // a1's BYE never comes: at 60 s its lease is gone, one microsecond before it is not.
  f.advance(50s - 1us);
  EXPECT_EQ(status(f.send(invite("alice", "a5"))), "SIP/2.0 503 ");
  f.advance(1us);
  EXPECT_EQ(status(f.send(invite("alice", "a6"))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(bye(*f.door, "alice", "a1", 2))), "SIP/2.0 481 ");  // expired
  const sipfd::counters& c = f.door->stats();
  EXPECT_EQ(c.admitted, 4u);
  EXPECT_EQ(c.rejected, 2u);
  EXPECT_EQ(c.byes, 2u);
  EXPECT_EQ(c.released, 1u);
  EXPECT_EQ(c.unknown_byes, 1u);
  EXPECT_EQ(c.bye_retransmissions, 1u);
}

TEST(SipFrontDoor, CachedAnswerGoneTheLeaseStillKnowsTheCall) {
  door_fixture f(sipfd::policy{"5/15min", 5, std::chrono::hours{1}});
  EXPECT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");
  f.advance(
      std::chrono::duration_cast<std::chrono::microseconds>(sipfd::front_door::transaction_life));
  f.door->housekeeping(f.now);
  EXPECT_EQ(f.door->transactions_held(), 0u);
  EXPECT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");  // repeat of a live lease
  EXPECT_EQ(f.door->stats().admitted, 1u);
  EXPECT_EQ(f.door->stats().invite_retransmissions, 1u);
}

TEST(SipFrontDoor, AFullCacheDropsTheOldestAnswerFirst) {
  door_fixture f(sipfd::policy{"1/15min", 5, std::chrono::hours{1}}, 2);
  EXPECT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");
  const std::string refused = f.send(invite("alice", "a2"));
  EXPECT_EQ(status(refused), "SIP/2.0 503 ");
  EXPECT_EQ(status(f.send(invite("bob", "b1"))), "SIP/2.0 200 ");  // pushes out a1's answer
  EXPECT_EQ(f.door->transactions_held(), 2u);
  EXPECT_EQ(f.send(invite("alice", "a2")), refused);  // still cached
  // a1's answer is gone; its live lease still makes it the same call.
  EXPECT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");
  const sipfd::counters& c = f.door->stats();
  EXPECT_EQ(c.invites, 3u);
  EXPECT_EQ(c.admitted, 2u);
  EXPECT_EQ(c.rejected, 1u);
  EXPECT_EQ(c.invite_retransmissions, 2u);
}

TEST(SipFrontDoor, MalformedAndOtherDatagramsAreCounted) {
  door_fixture f(sipfd::policy{});
  EXPECT_EQ(f.send("garbage"), "");
  EXPECT_EQ(f.send(std::string(9000, 'x')), "");
  EXPECT_EQ(f.send("SIP/2.0 200 OK\r\n\r\n"), "");
  EXPECT_EQ(f.send(invite("alice", "a1", 1, "t1", "ACK")), "");
  EXPECT_EQ(status(f.send(invite("alice", "a1", 1, "t1", "OPTIONS"))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(invite("alice", "a1", 1, "t1", "REGISTER"))), "SIP/2.0 501 ");
  const sipfd::counters& c = f.door->stats();
  EXPECT_EQ(c.received, 6u);
  EXPECT_EQ(c.malformed, 2u);
  EXPECT_EQ(c.ignored, 1u);
  EXPECT_EQ(c.acks, 1u);
  EXPECT_EQ(c.other, 2u);
  EXPECT_EQ(c.invites, 0u);
  EXPECT_EQ(sipfd::to_json(c).substr(0, 28), "{\"received\":6,\"malformed\":2,");
}

// A BYE names its dialog by Call-ID and From tag *and* the From user: a peer
// that knows alice's Call-ID and tag but calls as mallory frees nothing of
// alice's (one that forges alice's From can: From is not authenticated).
TEST(SipFrontDoor, AByeFromAnotherNumberCannotReleaseALease) {
  door_fixture f(sipfd::policy{"100/15min", 1, std::chrono::hours{1}});
  EXPECT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(bye(*f.door, "mallory", "a1", 2))), "SIP/2.0 481 ");
  EXPECT_EQ(status(f.send(bye(*f.door, "alice", "a1", 2, "other-tag"))), "SIP/2.0 481 ");
  EXPECT_EQ(status(f.send(invite("alice", "a2"))), "SIP/2.0 503 ");  // a1 still holds the slot
  EXPECT_EQ(status(f.send(bye(*f.door, "alice", "a1", 3))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(invite("alice", "a3"))), "SIP/2.0 200 ");
  EXPECT_EQ(f.door->stats().released, 1u);
  EXPECT_EQ(f.door->stats().unknown_byes, 2u);
}

// Our To tag is a keyed hash of the dialog, and a BYE must carry it: one who
// knows alice's Call-ID, From tag and number but never saw our answer frees
// nothing, and a forged BYE does not poison the cache for the real one that
// follows with the same CSeq.
TEST(SipFrontDoor, AByeWithoutOurToTagReleasesNothing) {
  door_fixture f(sipfd::policy{"100/15min", 1, std::chrono::hours{1}});
  const std::string ok = f.send(invite("alice", "a1"));
  ASSERT_EQ(status(ok), "SIP/2.0 200 ");
  const std::string tag = to_tag(ok);
  EXPECT_EQ(tag, f.door->dialog_tag("a1", "t1", "alice"));
  EXPECT_EQ(tag.size(), 18u);  // "fd" and 16 hex digits
  EXPECT_EQ(status(f.send(invite("alice", "a1", 2, "t1", "BYE"))), "SIP/2.0 481 ");  // no tag
  std::string forged = invite("alice", "a1", 2, "t1", "BYE");
  const std::string to = "To: <sip:service@127.0.0.1:5060>";
  forged.insert(forged.find(to) + to.size(), ";tag=fd0123456789abcdef");
  EXPECT_EQ(status(f.send(forged)), "SIP/2.0 481 ");
  EXPECT_EQ(status(f.send(invite("alice", "a2"))), "SIP/2.0 503 ");  // a1 still holds the slot
  EXPECT_EQ(status(f.send(bye(*f.door, "alice", "a1", 2))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(invite("alice", "a3"))), "SIP/2.0 200 ");
  EXPECT_EQ(f.door->stats().unknown_byes, 2u);
  EXPECT_EQ(f.door->stats().released, 1u);
  EXPECT_EQ(f.door->stats().bye_retransmissions, 0u);
}

// A BYE carrying a dialog's To tag under another From number (a UA that
// learnt the tag, a mistaken forwarder) is 481 without a cached answer, so
// the real BYE of that transaction (same Call-ID, From tag, To tag and CSeq)
// still releases the lease; before, the tag ignored the number, the store was
// asked for mallory's lease and the 481 was cached under alice's key.
TEST(SipFrontDoor, AByeWithOurTagUnderAnotherNumberDoesNotAnswerTheRealOne) {
  door_fixture f(sipfd::policy{"100/15min", 1, std::chrono::hours{1}});
  ASSERT_EQ(status(f.send(invite("alice", "a1"))), "SIP/2.0 200 ");
  std::string forged = invite("mallory", "a1", 2, "t1", "BYE");
  const std::string to = "To: <sip:service@127.0.0.1:5060>";
  forged.insert(forged.find(to) + to.size(), ";tag=" + f.door->dialog_tag("a1", "t1", "alice"));
  EXPECT_EQ(status(f.send(forged)), "SIP/2.0 481 ");
  EXPECT_EQ(f.door->transactions_held(), 1u);  // the INVITE's answer only
  EXPECT_EQ(status(f.send(bye(*f.door, "alice", "a1", 2))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(invite("alice", "a2"))), "SIP/2.0 200 ");  // the slot is free
  EXPECT_EQ(f.door->stats().released, 1u);
  // Our tags are lower-case hex; the same digits in upper case are another tag.
  std::string upper = bye(*f.door, "alice", "a2", 2);
  const std::size_t at = upper.find(";tag=fd") + 7;
  for (std::size_t i = at; i < at + 16; ++i) {
    upper[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(upper[i])));
  }
  if (upper != bye(*f.door, "alice", "a2", 2)) {
    EXPECT_EQ(status(f.send(upper)), "SIP/2.0 481 ");
  }
  EXPECT_EQ(status(f.send(bye(*f.door, "alice", "a2", 2))), "SIP/2.0 200 ");
}

// A transaction is also told apart by its From number: an INVITE copying
// alice's Call-ID, From tag and CSeq under another number is that number's
// call (mallory, with his one slot taken, gets 503), not a retransmission
// answered with alice's cached 200 (her Via and From, no slot charged).
TEST(SipFrontDoor, AnInviteCopyingAnotherNumbersDialogIsNotItsRetransmission) {
  door_fixture f(sipfd::policy{"100/15min", 1, std::chrono::hours{1}});
  const std::string alice = f.send(invite("alice", "a1"));
  ASSERT_EQ(status(alice), "SIP/2.0 200 ");
  ASSERT_EQ(status(f.send(invite("mallory", "m1"))), "SIP/2.0 200 ");
  const std::string copied = f.send(invite("mallory", "a1"));
  EXPECT_EQ(status(copied), "SIP/2.0 503 ");
  EXPECT_EQ(copied.find("sip:alice@"), std::string::npos) << copied;
  EXPECT_EQ(f.send(invite("alice", "a1")), alice);  // alice's retransmission still hers
  EXPECT_EQ(f.door->stats().invite_retransmissions, 1u);
}

// Front doors sharing a secret give one dialog one tag (a retransmission or a
// BYE may reach another of them); other secrets, other tags.
TEST(SipFrontDoor, DialogTagsFollowTheSecret) {
  const auto secret = sipfd::front_door::parse_secret("00112233445566778899AABBCCDDEEFF");
  EXPECT_EQ(secret.k0, 0x0011223344556677ULL);
  EXPECT_EQ(secret.k1, 0x8899aabbccddeeffULL);
  const auto door = [](ratelimit::detail::siphash_key k) {
    return sipfd::front_door(nullptr, "sip:fd@h", 10, 1 << 20, k);
  };
  const sipfd::front_door a = door(secret), b = door(secret);
  const sipfd::front_door c = door(sipfd::front_door::parse_secret(std::string(32, '0')));
  EXPECT_EQ(a.dialog_tag("x", "y", "u"), b.dialog_tag("x", "y", "u"));
  EXPECT_NE(a.dialog_tag("x", "y", "u"), c.dialog_tag("x", "y", "u"));
  EXPECT_NE(a.dialog_tag("x", "y", "u"), a.dialog_tag("x", "z", "u"));
  EXPECT_NE(a.dialog_tag("1", "23", "u"), a.dialog_tag("12", "3", "u"));  // no ambiguous join
  EXPECT_NE(a.dialog_tag("x", "y1", "2"), a.dialog_tag("x", "y", "12"));
  EXPECT_NE(a.dialog_tag("x", "y", "u"), a.dialog_tag("x", "y", "v"));  // the number is in it
  EXPECT_NE(door(sipfd::front_door::random_secret()).dialog_tag("x", "y", "u"),
            door(sipfd::front_door::random_secret()).dialog_tag("x", "y", "u"));
  for (const std::string& bad : {std::string(31, '0'), std::string(33, '0'), std::string(),
                                 std::string(31, '0') + "g", std::string(31, '0') + " "}) {
    EXPECT_THROW((void)sipfd::front_door::parse_secret(bad), std::invalid_argument) << bad;
  }
}

/// Writes `bytes` to a new file in the temp directory; its path.
std::string temp_file(const std::string& bytes) {
  static int n = 0;
  const std::string path = std::string(::testing::TempDir()) + "sipfd_secret_" +
                           std::to_string(::getpid()) + "_" + std::to_string(++n);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot write " + path);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return path;
}

/// What read_secret_file says of a file holding `bytes`: the message it
/// refuses it with ("" when accepted), and the file's path (now removed).
std::pair<std::string, std::string> secret_file_outcome(const std::string& bytes) {
  const std::string path = temp_file(bytes);
  std::string why;
  try {
    (void)sipfd::front_door::read_secret_file(path);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  std::remove(path.c_str());
  return {why, path};
}

/// The message read_secret_file refuses `bytes` with ("" when accepted).
std::string secret_file_refusal(const std::string& bytes) {
  return secret_file_outcome(bytes).first;
}

// Verifies that --dialog-secret-file reads its file whole: what follows the
// first 256 bytes (which alone were read) is no longer ignored, a file
// over 4096 bytes is refused rather than cut, a binary one is refused
// without quoting its bytes, and the secret with trailing whitespace (up to
// the bound) is read exactly.
TEST(SipFrontDoor, DialogSecretFileIsReadWhole) {
  using namespace std::string_literals;
  const std::string hex = "00112233445566778899AABBCCDDEEFF";
  const std::string path = temp_file(hex + "\r\n" + std::string(3000, ' ') + "\n");
  const auto k = sipfd::front_door::read_secret_file(path);
  std::remove(path.c_str());
  EXPECT_EQ(k.k0, 0x0011223344556677ULL);
  EXPECT_EQ(k.k1, 0x8899aabbccddeeffULL);
  EXPECT_EQ(secret_file_refusal(hex + std::string(4096 - 32, '\n')), "");  // exactly the bound
  // Garbage after byte 256: the old reader stopped before it.
  EXPECT_NE(secret_file_refusal(hex + std::string(300, ' ') + "x"), "");
  EXPECT_NE(secret_file_refusal(hex + std::string(4097 - 32, '\n')).find("more than 4096 bytes"),
            std::string::npos);
  const std::string binary = secret_file_refusal(hex + "\0\xff\x01secret"s);
  EXPECT_NE(binary.find("32 hex digits"), std::string::npos) << binary;
  EXPECT_EQ(binary.find("secret\""), std::string::npos) << binary;
  EXPECT_NE(secret_file_refusal("\x7f\x45\x4c\x46"s + std::string(28, '\0')).find("hex digit"),
            std::string::npos);
  EXPECT_NE(secret_file_refusal(""), "");
  try {
    (void)sipfd::front_door::read_secret_file("/nonexistent/dir/secret");
    ADD_FAILURE() << "a missing file was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
}

// Verifies the edges of read_secret_file as its comment states them, and
// that every refusal names the file (quoted, control bytes escaped) and
// never the secret: messages used to say only "cannot open the file" or
// "the dialog secret needs 32 hex digits", whichever file it was.
TEST(SipFrontDoor, DialogSecretFileEdgesAndErrorsNameTheFile) {
  using namespace std::string_literals;
  const std::string hex = "00112233445566778899aabbccddeeff";
  // Taken: with no newline, with one (LF or CRLF), and exactly 4096 bytes.
  for (const std::string& ok :
       {hex, hex + "\n", hex + "\r\n", hex + " \t\n", hex + std::string(4096 - 32, ' ')}) {
    SCOPED_TRACE(ok.size());
    EXPECT_EQ(secret_file_refusal(ok), "");
  }
  struct row {
    std::string bytes;
    std::string why;  // what follows the file's name
  };
  const row rows[] = {
      {"", "needs 32 hex digits (128 bits), got 0 characters"},
      {"\n\n", "needs 32 hex digits (128 bits), got 0 characters"},
      {" " + hex, "needs 32 hex digits (128 bits), got 33 characters"},  // leading blank
      {hex.substr(1) + "\n", "got 31 characters"},
      {hex + "0\n", "got 33 characters"},
      {hex + std::string(4097 - 32, ' '), "it holds more than 4096 bytes"},
      {hex + std::string(9000, '\n'), "it holds more than 4096 bytes"},
      {"g" + hex.substr(1), "not a hex digit at position 1"},
      {hex.substr(0, 31) + "\0"s, "not a hex digit at position 32"},
  };
  for (const row& r : rows) {
    SCOPED_TRACE(r.bytes.size());
    const auto [why, path] = secret_file_outcome(r.bytes);
    EXPECT_EQ(why.rfind("dialog secret file \"" + path + "\": ", 0), 0u) << why;
    EXPECT_NE(why.find(r.why), std::string::npos) << why;
    EXPECT_EQ(why.find("0011223344"), std::string::npos) << why;  // never the secret
  }
  // A missing file and a directory: named, with the reason.
  const std::string missing = "/nonexistent/dir/se\ncret";
  try {
    (void)sipfd::front_door::read_secret_file(missing);
    ADD_FAILURE() << "a missing file was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "dialog secret file \"/nonexistent/dir/se\\x0acret\": cannot open it: No such "
              "file or directory");
  }
  const std::string dir(::testing::TempDir());
  try {
    (void)sipfd::front_door::read_secret_file(dir);
    ADD_FAILURE() << "a directory was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  // A FIFO that no process writes to: refused as empty, not a hang in open.
  const std::string fifo = dir + "/sipfd-secret-fifo-" + std::to_string(::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  try {
    (void)sipfd::front_door::read_secret_file(fifo);
    ADD_FAILURE() << "a FIFO with no writer was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("got 0 characters"), std::string::npos) << e.what();
  }
  ::unlink(fifo.c_str());
}

// An INVITE of a live dialog with a new CSeq and no To tag (a UAC retrying
// with the same Call-ID) is the same call, not a second one; with a To tag
// (a re-INVITE) it is refused 481 and counts nothing.
TEST(SipFrontDoor, SameDialogNewCSeqIsTheSameCall) {
  door_fixture f(sipfd::policy{"1/15min", 1, std::chrono::hours{1}});
  EXPECT_EQ(status(f.send(invite("alice", "a1", 1))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(invite("alice", "a1", 2))), "SIP/2.0 200 ");
  std::string reinvite = invite("alice", "a1", 3);
  reinvite.replace(reinvite.find("5060>\r\nCall-ID"), 5, "5060>;tag=fdx");
  EXPECT_EQ(status(f.send(reinvite)), "SIP/2.0 481 ");
  const sipfd::counters& c = f.door->stats();
  EXPECT_EQ(c.invites, 1u);
  EXPECT_EQ(c.admitted, 1u);
  EXPECT_EQ(c.invite_retransmissions, 1u);
  EXPECT_EQ(c.other, 1u);
}

/// An admission whose store is down for the first `failures` calls.
class flaky_admission final : public sipfd::admission {
 public:
  explicit flaky_admission(int failures) : failures_(failures) {}
  answer acquire(std::string_view, std::string_view) override {
    if (failures_-- > 0) throw std::runtime_error("store down");
    return {true, false, {}};
  }
  bool release(std::string_view, std::string_view) override {
    if (failures_-- > 0) throw std::runtime_error("store down");
    return true;
  }

 private:
  int failures_;
};

// A store failure is answered 500 and not cached: the retransmission asks
// the store again and gets the real answer.
TEST(SipFrontDoor, StoreFailureIs500AndNotCached) {
  sipfd::front_door door(std::make_unique<flaky_admission>(1), "sip:fd@h");
  std::string out;
  const sipfd::clock_type::time_point now{};
  ASSERT_TRUE(door.handle(invite("alice", "a1"), now, out));
  EXPECT_EQ(status(out), "SIP/2.0 500 ");
  EXPECT_EQ(door.transactions_held(), 0u);
  ASSERT_TRUE(door.handle(invite("alice", "a1"), now, out));
  EXPECT_EQ(status(out), "SIP/2.0 200 ");
  EXPECT_EQ(door.stats().errors, 1u);
  EXPECT_EQ(door.stats().admitted, 1u);
  EXPECT_EQ(door.stats().invite_retransmissions, 0u);
  sipfd::front_door door2(std::make_unique<flaky_admission>(0), "sip:fd@h");
  ASSERT_TRUE(door2.handle(invite("bob", "b1"), now, out));
  sipfd::front_door door3(std::make_unique<flaky_admission>(1), "sip:fd@h");
  ASSERT_TRUE(door3.handle(bye(door3, "bob", "b1", 2), now, out));
  EXPECT_EQ(status(out), "SIP/2.0 500 ");
  ASSERT_TRUE(door3.handle(bye(door3, "bob", "b1", 2), now, out));
  EXPECT_EQ(status(out), "SIP/2.0 200 ");
  EXPECT_EQ(door3.stats().errors, 1u);
  EXPECT_EQ(door3.stats().bye_retransmissions, 0u);
}

// A flood of new calls in large datagrams (8 Via headers filling 8 KiB; each
// answer echoes them) stays within the cache's byte budget, and the newest
// answers are still there for their retransmissions.
TEST(SipFrontDoor, AFloodOfLargeInvitesStaysWithinTheCacheBytes) {
  constexpr std::size_t budget = 256 * 1024;
  door_fixture f(sipfd::policy{"1/15min", 1, std::chrono::hours{1}}, 100'000, budget);
  const auto big = [](int i) {
    std::string d = invite("n" + std::to_string(i), "flood-" + std::to_string(i));
    std::string vias;
    for (std::size_t v = 1; v < sipfd::max_vias; ++v) {
      vias += "Via: SIP/2.0/UDP h;branch=z9hG4bK" + std::string(1000, 'x') + "\r\n";
    }
    d.insert(d.find("From:"), vias);
    EXPECT_LE(d.size(), sipfd::max_datagram);
    return d;
  };
  std::size_t held_max = 0;
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(status(f.send(big(i))), "SIP/2.0 200 ");
    EXPECT_LE(f.door->transaction_bytes(), budget);
    held_max = std::max(held_max, f.door->transactions_held());
  }
  EXPECT_GT(held_max, 10u);
  EXPECT_LT(held_max, 40u);  // 256 KiB / ~7.5 KiB per answer
  EXPECT_EQ(status(f.send(big(299))), "SIP/2.0 200 ");
  EXPECT_EQ(f.door->stats().invite_retransmissions, 1u);
  EXPECT_EQ(f.door->stats().admitted, 300u);
}

// A 64 KiB datagram (what recvfrom with MSG_TRUNC reports for an oversized
// one is cut to max_datagram + 1 by main) and one of only NUL bytes.
TEST(SipFrontDoor, HugeAndBinaryDatagramsAreDroppedAndCounted) {
  door_fixture f(sipfd::policy{});
  std::string huge = invite("alice", "a1");
  huge += std::string(65507 - huge.size(), 'a');
  EXPECT_EQ(f.send(huge), "");
  EXPECT_EQ(f.send(std::string(sipfd::max_datagram + 1, 'x')), "");
  EXPECT_EQ(f.send(std::string(512, '\0')), "");
  EXPECT_EQ(f.send(std::string(1, '\0')), "");
  EXPECT_EQ(f.door->stats().malformed, 4u);
  EXPECT_EQ(f.door->stats().invites, 0u);
}

// Answers never carry a line the sender wrote: a bare LF or CR in an echoed
// header is refused, not reflected as a header of the sender's choosing.
TEST(SipFrontDoor, NoHeaderInjectionIntoAnswers) {
  door_fixture f(sipfd::policy{});
  std::string d = invite("alice", "a1");
  d.replace(d.find("Call-ID: a1"), 11, "Call-ID: a1\nRetry-After:0");
  EXPECT_EQ(f.send(d), "");
  d = invite("alice", "a2");
  d.replace(d.find("Via: SIP/2.0/UDP"), 16, "Via: SIP/2.0/UDP\rX-Evil:1\r");
  EXPECT_EQ(f.send(d), "");
  EXPECT_EQ(f.door->stats().malformed, 2u);
  EXPECT_EQ(f.door->stats().invites, 0u);
}

// Every number is the caller's word: a flood of made-up numbers, each call
// admitted and never ended, holds at most max_numbers of them; past that a
// new number is refused, a known one is decided as always, and a number
// freed (BYE, idle) makes room again.
TEST(SipFrontDoor, MadeUpNumbersAreCapped) {
  sipfd::policy p{"10/1s", 1, std::chrono::seconds{60}};
  p.max_numbers = 64;
  door_fixture f(p);
  int admitted = 0;
  for (int i = 0; i < 1000; ++i) {
    if (status(f.send(invite("n" + std::to_string(i), "c" + std::to_string(i)))) ==
        "SIP/2.0 200 ") {
      ++admitted;
    }
  }
  EXPECT_EQ(admitted, 64);
  EXPECT_EQ(f.door->stats().rejected, 936u);
  EXPECT_EQ(status(f.send(bye(*f.door, "n0", "c0", 2))), "SIP/2.0 200 ");
  f.advance(2s);  // n0 is idle now (no lease, its rate window passed)
  EXPECT_EQ(status(f.send(invite("new", "x1"))), "SIP/2.0 200 ");
  EXPECT_EQ(status(f.send(invite("newer", "x2"))), "SIP/2.0 503 ");
  f.advance(60s);  // every lease has expired: all idle
  EXPECT_EQ(status(f.send(invite("newer", "x3"))), "SIP/2.0 200 ");
}

}  // namespace
