// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the replay tool's timestamp parser, against a plain reference for the numeric forms.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "timestamp.hpp"

namespace {

namespace rp = ratelimit::replay;

bool all_digits(std::string_view s) {
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

/// The numeric forms (integer microseconds, decimal seconds) parsed the slow,
/// obvious way in 128 bits. Returns false for a rejection. Only called for
/// inputs with neither 'T' nor '-', which the parser reads as numbers.
bool reference_number(std::string_view s, std::int64_t& out) {
  const std::size_t dot = s.find('.');
  const std::string_view whole = s.substr(0, dot);
  if (whole.empty() || whole.size() > 19 || !all_digits(whole)) return false;
  __int128 v = 0;
  for (const char c : whole) v = v * 10 + (c - '0');
  if (dot != std::string_view::npos) {
    const std::string_view frac = s.substr(dot + 1);
    if (frac.empty() || frac.size() > 6 || !all_digits(frac)) return false;
    __int128 f = 0;
    for (std::size_t i = 0; i < 6; ++i) f = f * 10 + (i < frac.size() ? frac[i] - '0' : 0);
    v = v * 1'000'000 + f;
  }
  if (v > rp::max_timestamp_us) return false;
  out = static_cast<std::int64_t>(v);
  return true;
}

// Year 10000 starts here; format_iso writes four-digit years only.
constexpr std::int64_t year_10000_us = 253'402'300'800'000'000;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  std::int64_t got = -1;
  const char* why = rp::parse_timestamp(s, got);
  RATELIMIT_FUZZ_CHECK(why == nullptr || *why != '\0', "a rejection has an empty message");

  const bool iso = s.find('T') != std::string_view::npos || s.find('-') != std::string_view::npos;
  if (!iso && !s.empty()) {
    std::int64_t want = -1;
    const bool ok = reference_number(s, want);
    RATELIMIT_FUZZ_CHECK(ok == (why == nullptr), "accepts a number the reference rejects or back");
    RATELIMIT_FUZZ_CHECK(!ok || got == want, "a number parses to another value than the reference");
  }
  if (why != nullptr) return 0;
  RATELIMIT_FUZZ_CHECK(got >= 0 && got <= rp::max_timestamp_us, "timestamp out of range");

  if (got < year_10000_us) {
    // The canonical ISO form of any accepted time parses back to it, and an
    // ISO input is that form up to its fractional digits.
    const std::string canonical = rp::format_iso(got);
    std::int64_t back = -1;
    RATELIMIT_FUZZ_CHECK(rp::parse_timestamp(canonical, back) == nullptr && back == got,
                         "format_iso does not round-trip");
    if (iso && (s.size() == 20 || s.size() == 24 || s.size() == 27)) {
      const std::size_t frac_digits = s.size() == 20 ? 0 : s.size() - 21;
      const std::string expect = std::string(s.substr(0, 19)) + "." +
                                 std::string(s.substr(20, frac_digits)) +
                                 std::string(6 - frac_digits, '0') + "Z";
      RATELIMIT_FUZZ_CHECK(canonical == expect, "an ISO time does not format back to itself");
    }
  }
  return 0;
}
