// SPDX-License-Identifier: Apache-2.0
// Rates: every accepted string form and unit, the bounds, and messages that quote bad input.
#include "ratelimit/rate.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

using namespace std::chrono_literals;
using ratelimit::rate;

constexpr std::int64_t second_us = 1'000'000;
constexpr std::int64_t minute_us = 60 * second_us;
constexpr std::int64_t hour_us = 60 * minute_us;
constexpr std::int64_t day_us = 24 * hour_us;

void expect_rate(std::string_view text, ratelimit::units limit, std::int64_t period_us) {
  const rate r = rate::parse(text);
  EXPECT_EQ(r.limit(), limit) << '"' << text << '"';
  EXPECT_EQ(r.period().count(), period_us) << '"' << text << '"';
}

/// Message of the std::invalid_argument thrown by parsing `text` ("" if none).
std::string parse_error(std::string_view text) {
  try {
    (void)rate::parse(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Rate, ParsesTheDocumentedExamples) {
  expect_rate("10/15min", 10, 15 * minute_us);
  expect_rate("10 per 15 minutes", 10, 15 * minute_us);
  expect_rate("100/s", 100, second_us);
  expect_rate("5/1h", 5, hour_us);
  expect_rate("1000 per day", 1000, day_us);
}

TEST(Rate, ParsesEveryUnitName) {
  expect_rate("1/us", 1, 1);
  expect_rate("1/ms", 1, 1'000);
  for (const char* s : {"1/s", "1/sec", "1/second", "1/seconds"}) expect_rate(s, 1, second_us);
  for (const char* m : {"1/min", "1/minute", "1/minutes"}) expect_rate(m, 1, minute_us);
  for (const char* h : {"1/h", "1/hour", "1/hours"}) expect_rate(h, 1, hour_us);
  for (const char* d : {"1/d", "1/day", "1/days"}) expect_rate(d, 1, day_us);
  expect_rate("7/250us", 7, 250);
  expect_rate("3 per 20 ms", 3, 20'000);
  expect_rate("2 per 3 seconds", 2, 3 * second_us);
  expect_rate("5/2d", 5, 2 * day_us);
}

TEST(Rate, AcceptsSpacesAndTabsAroundTheParts) {
  expect_rate("  10 / 15 min  ", 10, 15 * minute_us);
  expect_rate("10\tper\t15\tminutes", 10, 15 * minute_us);
  expect_rate("10 per minute", 10, minute_us);
}

TEST(Rate, AcceptsTheBounds) {
  expect_rate("1125899906842624/us", ratelimit::max_units, 1);          // 2^50
  expect_rate("1/70368744177664us", 1, ratelimit::max_period.count());  // 2^46 us
  expect_rate("1/814 days", 1, 814 * day_us);
  const rate r(ratelimit::max_units, ratelimit::max_period);
  EXPECT_EQ(r.limit(), std::int64_t{1} << 50);
  EXPECT_EQ(r.period(), std::chrono::microseconds{std::int64_t{1} << 46});
}

TEST(Rate, ComparesByLimitAndPeriod) {
  EXPECT_EQ(rate::parse("60/min"), rate(60, 60s));
  EXPECT_EQ(rate::parse("1000 per 1000 ms"), rate::parse("1000/s"));
  EXPECT_NE(rate::parse("60/min"), rate::parse("1/s"));  // same speed, different window
}

// Verifies that every rejected string is quoted in the message, whatever the reason.
TEST(Rate, RejectsMalformedStringsQuotingThem) {
  for (const char* bad :
       {"",        "   ",     "ten/s",        "-1/s",       "+1/s",           "1.5/s",  "10",
        "10/",     "10 / ",   "10/15",        "10 s",       "10//s",          "10/S",   "10/Sec",
        "10/secs", "10/1.5s", "10/fortnight", "10/s extra", "10/15 min utes", "10 per", "10 pe s",
        "0x10/s",  "10/-1s",  "10/ms/s"}) {
    const std::string msg = parse_error(bad);
    EXPECT_NE(msg.find('"' + std::string(bad) + '"'), std::string::npos)
        << "input \"" << bad << "\" gave: " << msg;
  }
}

TEST(Rate, RejectsZeroAndOutOfBoundValuesQuotingThem) {
  for (const char* bad : {"0/s", "0 per minute", "10/0s", "10 per 0 minutes",
                          "1125899906842625/s",  // 2^50 + 1
                          "1/70368744177665us",  // 2^46 + 1 us
                          "1/815 days", "1/99999999999999999999 us", "99999999999999999999/s"}) {
    const std::string msg = parse_error(bad);
    EXPECT_NE(msg.find('"' + std::string(bad) + '"'), std::string::npos)
        << "input \"" << bad << "\" gave: " << msg;
  }
}

TEST(Rate, RejectsAnUnknownUnitNamingIt) {
  const std::string msg = parse_error("10/15 fortnights");
  EXPECT_NE(msg.find("\"10/15 fortnights\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"fortnights\""), std::string::npos) << msg;
}

TEST(Rate, ConstructorRejectsBadValuesNamingThem) {
  const auto message = [](ratelimit::units limit, std::chrono::microseconds period) {
    try {
      (void)rate(limit, period);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(0, 1s).find("limit"), std::string::npos);
  EXPECT_NE(message(0, 1s).find("got 0"), std::string::npos);
  EXPECT_NE(message(-3, 1s).find("got -3"), std::string::npos);
  EXPECT_NE(message(ratelimit::max_units + 1, 1s).find("got 1125899906842625"), std::string::npos);
  EXPECT_NE(message(1, 0us).find("period"), std::string::npos);
  EXPECT_NE(message(1, 0us).find("got 0us"), std::string::npos);
  EXPECT_NE(message(1, -5us).find("got -5us"), std::string::npos);
  EXPECT_NE(message(1, ratelimit::max_period + 1us).find("got 70368744177665us"),
            std::string::npos);
}

TEST(Rate, CheckCostAcceptsOneToMaxUnits) {
  EXPECT_NO_THROW(ratelimit::detail::check_cost(1));
  EXPECT_NO_THROW(ratelimit::detail::check_cost(ratelimit::max_units));
  for (const ratelimit::units bad :
       {ratelimit::units{0}, ratelimit::units{-1}, ratelimit::max_units + 1}) {
    try {
      ratelimit::detail::check_cost(bad);
      ADD_FAILURE() << "cost " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("got " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
}

TEST(Rate, FloorAndCeilingDivisionRoundTheRightWay) {
  EXPECT_EQ(ratelimit::detail::floor_div(7, 3), 2);
  EXPECT_EQ(ratelimit::detail::floor_div(-7, 3), -3);
  EXPECT_EQ(ratelimit::detail::floor_div(-6, 3), -2);
  EXPECT_EQ(ratelimit::detail::floor_div(0, 3), 0);
  EXPECT_EQ(ratelimit::detail::ceil_div(7, 3), 3);
  EXPECT_EQ(ratelimit::detail::ceil_div(6, 3), 2);
  EXPECT_EQ(ratelimit::detail::ceil_div(0, 3), 0);
}

}  // namespace
