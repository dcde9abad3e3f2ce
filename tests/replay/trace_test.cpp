// SPDX-License-Identifier: Apache-2.0
// Tests of trace.hpp: header and comments, varying columns, and every bad-line message.
#include "trace.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

using ratelimit::replay::event;
using ratelimit::replay::input_error;
using ratelimit::replay::trace_reader;

struct ev {
  std::int64_t ts;
  std::string key;
  std::int64_t cost;
  int label;
  std::size_t line;
  friend bool operator==(const ev&, const ev&) = default;
};

std::vector<ev> read_all(const std::string& text) {
  std::istringstream in(text);
  trace_reader r(in);
  std::vector<ev> out;
  event e;
  while (r.next(e)) out.push_back({e.ts_us, std::string(e.key), e.cost, e.label, e.line});
  return out;
}

/// The input_error a text raises: its line and message.
std::pair<std::size_t, std::string> error_of(const std::string& text) {
  try {
    read_all(text);
  } catch (const input_error& e) {
    return {e.line(), e.what()};
  }
  return {0, "no error"};
}

TEST(TraceReader, HeaderCommentsAndVaryingColumns) {
  const auto v = read_all(
      "# exported 2026-11-30\nts,key,cost,label\n1,a\n2,b,3\n3,c,,1\n# note\n4,d,2,0\n5,e,,\n");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0], (ev{1, "a", 1, -1, 3}));
  EXPECT_EQ(v[1], (ev{2, "b", 3, -1, 4}));
  EXPECT_EQ(v[2], (ev{3, "c", 1, 1, 5}));
  EXPECT_EQ(v[3], (ev{4, "d", 2, 0, 7}));
  EXPECT_EQ(v[4], (ev{5, "e", 1, -1, 8}));
}

TEST(TraceReader, NoHeaderIsFine) {
  const auto v = read_all("1.5,a\n2026-11-30T04:52:46.123Z,b\n");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].ts, 1500000);
  EXPECT_EQ(v[1].ts, 1796014366123000);
}

TEST(TraceReader, QuotedKeysKeepEveryByte) {
  const auto v = read_all("1,\"a,b\"\n2,\"x\"\"y\"\n3,\" sp \"\n4,\"multi\nline\"\n5,z\n");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0].key, "a,b");
  EXPECT_EQ(v[1].key, "x\"y");
  EXPECT_EQ(v[2].key, " sp ");
  EXPECT_EQ(v[3].key, "multi\nline");
  EXPECT_EQ(v[4].line, 6u);
}

// Verifies every bad line is reported with its physical line number, header and comments counted.
TEST(TraceReader, EveryErrorNamesItsLine) {
  const std::string head = "# c\nts,key\n";  // the bad line below is line 3
  const struct {
    std::string line;
    std::string message;
  } cases[] = {
      {"abc,k", "bad timestamp \"abc\""},
      {"1.1234567,k", "1 to 6 fractional digits"},
      {"2026-11-30T04:52:46.1Z,k", "ISO-8601"},
      {"1", "expected 2 to 4 fields"},
      {"1,k,1,0,extra", "found 5"},
      {"1,", "empty key"},
      {"1,\"\"", "empty key"},
      {"1," + std::string(513, 'k'), "key of 513 bytes exceeds the maximum of 512"},
      {"1,k,0", "bad cost \"0\""},
      {"1,k,-1", "bad cost"},
      {"1,k,1.5", "bad cost"},
      {"1,k,1125899906842625", "bad cost"},
      {"1,k,1,2", "bad label \"2\""},
      {"1,k,1,yes", "bad label"},
      {"1,k\"", "quote inside an unquoted field"},
      {"1,\"k", "unterminated quoted field"},
      {std::string("1,k\0", 4), "NUL byte"},
  };
  for (const auto& c : cases) {
    const auto [line, message] = error_of(head + "1,ok\n" + c.line + "\n2,ok\n");
    EXPECT_EQ(line, 4u) << c.line;
    EXPECT_NE(message.find("line 4: "), std::string::npos) << message;
    EXPECT_NE(message.find(c.message), std::string::npos) << c.line << " -> " << message;
  }
}

TEST(TraceReader, AKeyOf512BytesIsFine) {
  const auto v = read_all("1," + std::string(512, 'k') + "\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].key.size(), 512u);
}

TEST(TraceReader, OnlyTheFirstRecordMayBeAHeader) {
  const auto [line, message] = error_of("ts,key\nts,key\n");
  EXPECT_EQ(line, 2u);
  EXPECT_NE(message.find("bad timestamp"), std::string::npos);
}

TEST(TraceReader, AByteOrderMarkIsSkipped) {
  const auto with_header = read_all("\xef\xbb\xbfts,key\n1,a\n");
  ASSERT_EQ(with_header.size(), 1u);
  EXPECT_EQ(with_header[0], (ev{1, "a", 1, -1, 2}));
  const auto without = read_all(
      "\xef\xbb\xbf"
      "1000000,a\n2,b\n");
  ASSERT_EQ(without.size(), 2u);
  EXPECT_EQ(without[0], (ev{1000000, "a", 1, -1, 1}));
}

TEST(TraceReader, AHeaderStartsWithALetterOrUnderscore) {
  for (const std::string header :
       {"ts,key", "Timestamp,caller,cost,label", "_t,k", "\"when\",who", "z"}) {
    const auto v = read_all(header + "\n1,a\n");
    ASSERT_EQ(v.size(), 1u) << header;
    EXPECT_EQ(v[0].line, 2u) << header;
  }
}

// Verifies a first line that attempts a timestamp is checked like any other
// line, never dropped as a header.
TEST(TraceReader, AFirstLineThatAttemptsATimestampIsAnError) {
  const struct {
    std::string line;
    std::string message;
  } cases[] = {
      {" 1000000,a", "bad timestamp \" 1000000\""},
      {"+100,a", "bad timestamp \"+100\""},
      {"-5,a", "bad timestamp \"-5\""},
      {"2026-11-30T04:52:46+01:00,a", "ending in Z"},
      {"1.2.3,a", "bad timestamp \"1.2.3\""},
      {"1e6,a", "bad timestamp \"1e6\""},
      {".5,a", "bad timestamp"},
      {",a", "empty timestamp"},
      {"\xef\xbb\xbf\xef\xbb\xbf"
       "1000000,a",
       "bad timestamp \"\\ufeff"
       "1000000\""},
      {"\"1 \",a", "bad timestamp \"1 \""},
      {"1000000", "expected 2 to 4 fields"},
  };
  for (const auto& c : cases) {
    const auto [line, message] = error_of(c.line + "\n2,b\n");
    EXPECT_EQ(line, 1u) << c.line;
    EXPECT_NE(message.find("line 1: "), std::string::npos) << message;
    EXPECT_NE(message.find(c.message), std::string::npos) << c.line << " -> " << message;
  }
}

TEST(TraceReader, AStoreLimitOnTimestampsNamesTheLine) {
  std::istringstream in("ts,key\n4503599627370496,a\n4503599627370497,a\n");
  trace_reader r(in);
  r.limit_timestamps(std::int64_t{1} << 52, "the latest this store takes");
  event e;
  ASSERT_TRUE(r.next(e));
  try {
    r.next(e);
    FAIL() << "no error";
  } catch (const input_error& x) {
    EXPECT_EQ(x.line(), 3u);
    EXPECT_NE(std::string(x.what()).find("after 4503599627370496 us, the latest this store takes"),
              std::string::npos)
        << x.what();
  }
}

// Verifies --skip-bad-lines goes on at the line after an unterminated quote and
// counts every physical line a bad record took.
TEST(TraceReader, SkippingCountsEveryDroppedLine) {
  const struct {
    std::string text;
    std::vector<std::string> keys;
    std::size_t skipped;
  } cases[] = {
      {"ts,key\n1,a\n2,\"b\n3,c\n4,d\n", {"a", "c", "d"}, 1},
      {"ts,key\n1,a\n2,\"b\n3,c\n4,\"d\"x\n5,e\n", {"a", "e"}, 3},
      {"ts,key\n1,\"multi\nline\",zero\n2,b\n", {"b"}, 2},
      {"1,a\n2,\"b", {"a"}, 1},
  };
  for (const auto& c : cases) {
    std::istringstream in(c.text);
    trace_reader r(in, true);
    event e;
    std::vector<std::string> keys;
    while (r.next(e)) keys.emplace_back(e.key);
    EXPECT_EQ(keys, c.keys) << c.text;
    EXPECT_EQ(r.skipped(), c.skipped) << c.text;
  }
}

TEST(TraceReader, SkipsBadLinesWhenAsked) {
  std::istringstream in("ts,key\n1,a\nx,b\n2,c,0\n3,d\n");
  trace_reader r(in, true);
  event e;
  std::vector<std::string> keys;
  while (r.next(e)) keys.emplace_back(e.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(r.skipped(), 2u);
  EXPECT_NE(r.first_skipped().find("line 3: bad timestamp"), std::string::npos);
}

}  // namespace
