// SPDX-License-Identifier: Apache-2.0
// Tests of csv.hpp: RFC 4180 quoting, physical line numbers, chunk boundaries, errors.
#include "csv.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

using ratelimit::replay::append_csv_field;
using ratelimit::replay::csv_reader;

struct rec {
  std::size_t line;
  std::vector<std::string> fields;
  std::string error;
};

std::vector<rec> read_all(const std::string& text, std::size_t chunk = 1 << 20) {
  std::istringstream in(text);
  csv_reader r(in, chunk);
  std::vector<rec> out;
  for (;;) {
    const auto st = r.next();
    if (st == csv_reader::status::end) break;
    rec x{r.line(), {}, {}};
    if (st == csv_reader::status::error) {
      x.error = r.error();
    } else {
      for (std::size_t i = 0; i < r.field_count(); ++i) x.fields.emplace_back(r.field(i));
    }
    out.push_back(x);
  }
  return out;
}

TEST(CsvReader, SplitsFieldsAndCountsPhysicalLines) {
  const auto v = read_all("# comment\nts,key\n\n1,a\r\n2,b,3,1\n3,c");
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].line, 2u);
  EXPECT_EQ(v[0].fields, (std::vector<std::string>{"ts", "key"}));
  EXPECT_EQ(v[1].line, 4u);
  EXPECT_EQ(v[1].fields, (std::vector<std::string>{"1", "a"}));  // CRLF: the CR is not data
  EXPECT_EQ(v[2].line, 5u);
  EXPECT_EQ(v[2].fields.size(), 4u);
  EXPECT_EQ(v[3].line, 6u);
  EXPECT_EQ(v[3].fields, (std::vector<std::string>{"3", "c"}));
}

TEST(CsvReader, QuotedFieldsHoldCommasQuotesAndNewlines) {
  const auto v = read_all("1,\"a,b\"\n2,\"say \"\"hi\"\"\"\n3,\"two\nlines\"\n4,\"\"\n5,x\n");
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[0].fields[1], "a,b");
  EXPECT_EQ(v[1].fields[1], "say \"hi\"");
  EXPECT_EQ(v[2].fields[1], "two\nlines");
  EXPECT_EQ(v[2].line, 3u);
  EXPECT_EQ(v[3].fields[1], "");
  EXPECT_EQ(v[3].line, 5u);  // the quoted newline took a physical line
  EXPECT_EQ(v[4].line, 6u);
}

TEST(CsvReader, KeysAreNotTrimmedAndHashInsideIsData) {
  const auto v = read_all("1, a \n2,#tag\n3,\"#x\"\n");
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].fields[1], " a ");
  EXPECT_EQ(v[1].fields[1], "#tag");
  EXPECT_EQ(v[2].fields[1], "#x");
}

// Verifies records spanning chunk boundaries parse the same with a tiny buffer.
TEST(CsvReader, ChunkBoundariesDoNotMatter) {
  const std::string text =
      "# c\r\nts,key\r\n1,\"a,\"\"b\"\"\nc\"\r\n22,long-key-long-key-long-key\n333,\"q\"\n\n4,z";
  const auto big = read_all(text);
  for (std::size_t chunk = 2; chunk < 12; ++chunk) {
    const auto small = read_all(text, chunk);
    ASSERT_EQ(small.size(), big.size()) << chunk;
    for (std::size_t i = 0; i < big.size(); ++i) {
      EXPECT_EQ(small[i].fields, big[i].fields) << chunk;
      EXPECT_EQ(small[i].line, big[i].line) << chunk;
    }
  }
}

TEST(CsvReader, ReportsSyntaxErrorsAndGoesOn) {
  const auto v = read_all("1,a\"b\n2,\"x\"y\n3,ok\n4,\"open\n5,z\n");
  ASSERT_EQ(v.size(), 4u);
  EXPECT_NE(v[0].error.find("quote inside an unquoted field"), std::string::npos);
  EXPECT_EQ(v[0].line, 1u);
  EXPECT_NE(v[1].error.find("after a closing quote"), std::string::npos);
  EXPECT_EQ(v[1].line, 2u);
  EXPECT_EQ(v[2].fields[1], "ok");
  EXPECT_EQ(v[2].line, 3u);
  EXPECT_NE(v[3].error.find("unterminated quoted field (opened on line 4)"), std::string::npos);
}

TEST(CsvReader, RefusesNul) {
  const auto v = read_all(std::string("1,a\0b\n2,c\n", 10));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NE(v[0].error.find("NUL"), std::string::npos);
  EXPECT_EQ(v[1].fields[1], "c");
  EXPECT_EQ(v[1].line, 2u);
}

TEST(CsvWriter, QuotesOnlyWhenNeededAndRoundTrips) {
  for (const std::string key : {"plain", "a,b", "say \"hi\"", "two\nlines", "cr\rhere", "#lead",
                                " spaced ", "in#side", "\xc3\xa9t\xc3\xa9"}) {
    std::string line = "1,";
    append_csv_field(line, key);
    line += "\n";
    const auto v = read_all(line);
    ASSERT_EQ(v.size(), 1u) << key;
    ASSERT_EQ(v[0].fields.size(), 2u) << key;
    EXPECT_EQ(v[0].fields[1], key);
  }
  std::string s;
  append_csv_field(s, "plain");
  EXPECT_EQ(s, "plain");
  s.clear();
  append_csv_field(s, "a\"b");
  EXPECT_EQ(s, "\"a\"\"b\"");
}

}  // namespace
