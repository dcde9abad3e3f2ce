// SPDX-License-Identifier: Apache-2.0
// Tests of csv.hpp: RFC 4180 quoting, physical line numbers, chunk boundaries, errors.
#include "csv.hpp"

#include <gtest/gtest.h>

#include <ios>
#include <sstream>
#include <stdexcept>
#include <streambuf>
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
  ASSERT_EQ(v.size(), 5u);
  EXPECT_NE(v[0].error.find("quote inside an unquoted field"), std::string::npos);
  EXPECT_EQ(v[0].line, 1u);
  EXPECT_NE(v[1].error.find("after a closing quote"), std::string::npos);
  EXPECT_EQ(v[1].line, 2u);
  EXPECT_EQ(v[2].fields[1], "ok");
  EXPECT_EQ(v[2].line, 3u);
  EXPECT_NE(v[3].error.find("unterminated quoted field (opened on line 4)"), std::string::npos);
  EXPECT_EQ(v[3].line, 4u);
  EXPECT_EQ(v[4].fields, (std::vector<std::string>{"5", "z"}));  // read again at the next line
  EXPECT_EQ(v[4].line, 5u);
}

// Verifies a quote that never closes costs its own line only, at every chunk size,
// and that next_line() says how many lines each bad record took.
TEST(CsvReader, UnterminatedQuoteResumesAtTheNextPhysicalLine) {
  for (std::size_t chunk : {std::size_t{2}, std::size_t{5}, std::size_t{1} << 20}) {
    std::istringstream in("1,a\n2,\"b\n3,c\n4,d");
    csv_reader r(in, chunk);
    ASSERT_EQ(r.next(), csv_reader::status::record);
    ASSERT_EQ(r.next(), csv_reader::status::error) << chunk;
    EXPECT_EQ(r.line(), 2u);
    EXPECT_EQ(r.next_line(), 3u);
    ASSERT_EQ(r.next(), csv_reader::status::record) << chunk;
    EXPECT_EQ(r.field(0), "3");
    EXPECT_EQ(r.line(), 3u);
    ASSERT_EQ(r.next(), csv_reader::status::record);
    EXPECT_EQ(r.field(1), "d");
    EXPECT_EQ(r.next(), csv_reader::status::end);
  }
  // A quote that closes lines later on junk takes every line up to the junk.
  std::istringstream in("2,\"b\n3,c\n4,\"d\"x\n5,e\n");
  csv_reader r(in);
  ASSERT_EQ(r.next(), csv_reader::status::error);
  EXPECT_EQ(r.line(), 1u);
  EXPECT_EQ(r.next_line(), 4u);
  EXPECT_NE(r.error().find("(on line 3)"), std::string::npos) << r.error();
  ASSERT_EQ(r.next(), csv_reader::status::record);
  EXPECT_EQ(r.field(1), "e");
  EXPECT_EQ(r.line(), 4u);
}

// Verifies a stray quote, a huge line or a huge comment never makes the reader
// hold the rest of the input: each is skipped with memory bounded by
// max_record_bytes, and reading goes on.
TEST(CsvReader, LongRecordsAreErrorsNotMemory) {
  const std::string filler(std::size_t{3} << 20, 'x');  // 3 MiB
  std::string lines;
  for (int i = 0; i < 30000; ++i) lines += "k" + std::to_string(i) + ",filler line\n";
  const struct {
    std::string text;
    std::string message;
    std::size_t next_line;
  } cases[] = {
      {"1,\"open\n" + lines, "closing quote missing", 2},
      {"1," + filler + "\n", "line longer than 65536 bytes", 2},
  };
  for (const auto& c : cases) {
    std::istringstream in(c.text + "2,b\n");
    csv_reader r(in, 4096, 65536);
    ASSERT_EQ(r.next(), csv_reader::status::error);
    EXPECT_NE(r.error().find(c.message), std::string::npos) << r.error();
    EXPECT_EQ(r.line(), 1u);
    EXPECT_EQ(r.next_line(), c.next_line);
    csv_reader::status st;
    while ((st = r.next()) == csv_reader::status::record) {
    }
    EXPECT_EQ(st, csv_reader::status::end);
    EXPECT_LE(r.memory_bytes(), std::size_t{1} << 18);
  }
  std::istringstream in("#" + filler + "\n1,a\n");
  csv_reader r(in, 4096, 65536);
  ASSERT_EQ(r.next(), csv_reader::status::record);
  EXPECT_EQ(r.line(), 2u);
  EXPECT_LE(r.memory_bytes(), std::size_t{1} << 18);
}

TEST(CsvReader, SkipsAByteOrderMarkOnlyAtTheStart) {
  const std::string bom = "\xef\xbb\xbf";
  for (std::size_t chunk = 2; chunk < 8; ++chunk) {
    const auto v = read_all(bom + "# c\n1,a\n" + bom + "2,b\n", chunk);
    ASSERT_EQ(v.size(), 2u) << chunk;
    EXPECT_EQ(v[0].fields[0], "1");
    EXPECT_EQ(v[0].line, 2u);
    EXPECT_EQ(v[1].fields[0], bom + "2");  // not at the start: data
  }
  const auto just = read_all(bom);
  EXPECT_TRUE(just.empty());
  const auto short_input = read_all("1");
  ASSERT_EQ(short_input.size(), 1u);
  EXPECT_EQ(short_input[0].fields[0], "1");
}

TEST(CsvReader, RefusesNul) {
  const auto v = read_all(std::string("1,a\0b\n2,c\n", 10));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NE(v[0].error.find("NUL"), std::string::npos);
  EXPECT_EQ(v[1].fields[1], "c");
  EXPECT_EQ(v[1].line, 2u);
}

/// Gives `text`, then fails as a read error does (an EIO, or a directory
/// opened as a file): libstdc++'s filebuf throws from underflow, which
/// std::istream::read turns into badbit.
class failing_buf : public std::streambuf {
 public:
  explicit failing_buf(std::string text) : text_(std::move(text)) {
    setg(text_.data(), text_.data(), text_.data() + text_.size());
  }

 protected:
  int_type underflow() override { throw std::ios_base::failure("read error"); }

 private:
  std::string text_;
};

// Verifies that a read error is not taken for the end of the input: the log
// would be replayed truncated, with success.
TEST(CsvReader, AReadErrorIsNotTheEndOfTheInput) {
  failing_buf buf("1,a\n2,b\n");
  std::istream in(&buf);
  csv_reader r(in, 4);
  EXPECT_THROW(
      {
        while (r.next() != csv_reader::status::end) {
        }
      },
      std::runtime_error);
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
