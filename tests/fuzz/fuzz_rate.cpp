// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: ratelimit::rate::parse and the policy configs built from the rates it accepts.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "ratelimit/ratelimit.hpp"

namespace {

// Every config validates its own arithmetic on the rate (emission interval,
// exact ticks); with UBSan any overflow there is a crash. Rejection is fine.
template <class Config>
void try_config(const ratelimit::rate& r) {
  try {
    const Config cfg{r};
    RATELIMIT_FUZZ_CHECK(cfg.limit() >= 1, "an accepted config has a limit below 1");
  } catch (const std::invalid_argument&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ratelimit::rate r{1, std::chrono::microseconds{1}};
  try {
    r = ratelimit::rate::parse(text);
  } catch (const std::invalid_argument& e) {
    RATELIMIT_FUZZ_CHECK(std::string_view(e.what()).starts_with("ratelimit: invalid rate "),
                         "a rejection does not say which rate is invalid");
    return 0;
  }
  RATELIMIT_FUZZ_CHECK(r.limit() >= 1 && r.limit() <= ratelimit::max_units, "limit out of range");
  RATELIMIT_FUZZ_CHECK(r.period().count() >= 1 && r.period() <= ratelimit::max_period,
                       "period out of range");

  // The canonical spelling of an accepted rate parses back to the same rate.
  const std::string canonical = std::to_string(r.limit()) + "/" +
                                std::to_string(r.period().count()) + "us";
  RATELIMIT_FUZZ_CHECK(ratelimit::rate::parse(canonical) == r, "a rate does not round-trip");

  try_config<ratelimit::fixed_window::config>(r);
  try_config<ratelimit::sliding_window_counter::config>(r);
  try_config<ratelimit::sliding_window_log::config>(r);
  try_config<ratelimit::token_bucket::config>(r);
  try_config<ratelimit::gcra::config>(r);
  return 0;
}
