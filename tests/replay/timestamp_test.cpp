// SPDX-License-Identifier: Apache-2.0
// Tests of timestamp.hpp: every accepted form converts exactly; everything else is refused.
#include "timestamp.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace {

using ratelimit::replay::format_duration;
using ratelimit::replay::format_iso;
using ratelimit::replay::parse_timestamp;

std::int64_t parse_ok(const std::string& s) {
  std::int64_t v = -1;
  const char* why = parse_timestamp(s, v);
  EXPECT_EQ(why, nullptr) << s << ": " << (why ? why : "");
  return v;
}

bool refused(const std::string& s) {
  std::int64_t v = 0;
  return parse_timestamp(s, v) != nullptr;
}

TEST(Timestamp, IntegerMicroseconds) {
  EXPECT_EQ(parse_ok("0"), 0);
  EXPECT_EQ(parse_ok("1732950000250000"), 1732950000250000);
  EXPECT_EQ(parse_ok("0001"), 1);
  EXPECT_EQ(parse_ok("4611686018427387904"), std::int64_t{1} << 62);
}

// Verifies the conversion is exact decimal arithmetic: 0.1 s is 100000 us, never 99999.
TEST(Timestamp, DecimalSecondsAreExact) {
  EXPECT_EQ(parse_ok("1732950000.25"), 1732950000250000);
  EXPECT_EQ(parse_ok("1732950000.1"), 1732950000100000);
  EXPECT_EQ(parse_ok("0.000001"), 1);
  EXPECT_EQ(parse_ok("1.000001"), 1000001);
  EXPECT_EQ(parse_ok("1795996800.999999"), 1795996800999999);
  EXPECT_EQ(parse_ok("12.30"), 12300000);
}

TEST(Timestamp, IsoUtcWithZeroThreeOrSixDigits) {
  EXPECT_EQ(parse_ok("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_ok("2026-11-30T04:52:46Z"), 1796014366000000);
  EXPECT_EQ(parse_ok("2026-11-30T04:52:46.123Z"), 1796014366123000);
  EXPECT_EQ(parse_ok("2026-11-30T04:52:46.123456Z"), 1796014366123456);
  EXPECT_EQ(parse_ok("2024-02-29T23:59:59.999999Z"), 1709251199999999);
  EXPECT_EQ(parse_ok("2000-03-01T00:00:00Z"), 951868800000000);
}

TEST(Timestamp, AllFormsAgree) {
  EXPECT_EQ(parse_ok("2026-11-30T04:52:46.250000Z"), parse_ok("1796014366.25"));
  EXPECT_EQ(parse_ok("1796014366.25"), parse_ok("1796014366250000"));
}

TEST(Timestamp, RefusesEverythingElse) {
  for (const char* s : {"",
                        " 1",
                        "1 ",
                        "-1",
                        "+1",
                        "1e6",
                        "1.",
                        ".5",
                        "1.1234567",
                        "1,5",
                        "0x10",
                        "abc",
                        "4611686018427387905",
                        "99999999999999999999",
                        "2026-11-30T04:52:46",
                        "2026-11-30 04:52:46Z",
                        "2026-11-30T04:52:46.1Z",
                        "2026-11-30T04:52:46.12Z",
                        "2026-11-30T04:52:46.1234Z",
                        "2026-11-30T04:52:46+00:00",
                        "2026-11-30t04:52:46z",
                        "2026-13-01T00:00:00Z",
                        "2026-02-29T00:00:00Z",
                        "2026-04-31T00:00:00Z",
                        "2026-11-30T24:00:00Z",
                        "2026-11-30T23:60:00Z",
                        "2026-12-31T23:59:60Z",
                        "1969-12-31T23:59:59Z",
                        "26-11-30T00:00:00Z"}) {
    EXPECT_TRUE(refused(s)) << s;
  }
}

// Verifies that 19-digit inputs past INT64_MAX are refused without signed
// overflow in the fast path (found by fuzz_timestamp; UBSan stops on the old code).
TEST(Timestamp, NineteenDigitsPastInt64AreRefusedWithoutOverflow) {
  EXPECT_TRUE(refused("9992686018428737905"));
  EXPECT_TRUE(refused("9999999999999999999"));
  EXPECT_EQ(parse_ok("999999999999999999"), 999999999999999999);  // 18 digits: below 2^62
}

TEST(Timestamp, FormatsBackToIso) {
  EXPECT_EQ(format_iso(1796014366123456), "2026-11-30T04:52:46.123456Z");
  EXPECT_EQ(format_iso(0), "1970-01-01T00:00:00.000000Z");
  EXPECT_EQ(parse_ok(format_iso(1709251199999999)), 1709251199999999);
}

TEST(Timestamp, FormatsDurations) {
  EXPECT_EQ(format_duration(15 * 60'000'000LL), "15min");
  EXPECT_EQ(format_duration(86'400'000'000LL), "1d");
  EXPECT_EQ(format_duration(1500), "1500us");
  EXPECT_EQ(format_duration(90'000'000), "90s");
}

}  // namespace
