// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: decoding of script replies (and cluster redirects) from RESP bytes read by hiredis.
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_check.hpp"
#include "ratelimit/errors.hpp"
#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis.hpp"

namespace {

namespace rl = ratelimit;

// hiredis allocates an array's element vector as soon as it reads the count,
// so "*2000000000\r\n" is an 16 GB calloc: a fuzzer out-of-memory, not a
// finding in our code. Arrays longer than this are refused by the reader.
constexpr long long max_array = 64;

template <class R, class T, class N>
struct capped_array {
  static inline R (*base)(T, N) = nullptr;
  static R create(T task, N elements) {
    return static_cast<long long>(elements) > max_array ? nullptr : base(task, elements);
  }
};

template <class R, class T, class N>
auto cap_arrays(R (*base)(T, N)) {
  capped_array<R, T, N>::base = base;
  return &capped_array<R, T, N>::create;
}

// parse_reply refuses every reply no script of this library gives, so each
// decoded decision must be one the policies can produce (docs/semantics.md,
// "Decision fields").
void check_decision(const rl::decision& d) {
  RATELIMIT_FUZZ_CHECK(d.limit >= 1, "decoded a limit below 1");
  RATELIMIT_FUZZ_CHECK(d.remaining >= 0 && d.remaining <= d.limit,
                       "decoded remaining outside 0..limit");
  RATELIMIT_FUZZ_CHECK(d.reset_after.count() >= 0, "decoded a negative reset_after");
  // A repeat (leases: an id already live) is admitted and records nothing.
  RATELIMIT_FUZZ_CHECK(!d.repeat || (d.allowed && !d.counted),
                       "decoded a repeat that was rejected or counted");
  if (d.allowed) {
    RATELIMIT_FUZZ_CHECK((d.counted || d.repeat) && d.retry_after.count() == 0,
                         "decoded an admission that was not counted or must wait");
  } else {
    RATELIMIT_FUZZ_CHECK(d.retry_after.count() >= 1, "decoded a rejection with no wait");
  }
}

/// Decodes `r` for one config: a decision, or a ratelimit::error (any other
/// exception escapes and is reported as a crash).
template <class Config>
void decode(const Config& cfg, const redisReply& r) {
  try {
    const rl::decision d = rl::redis::detail::parse_reply(cfg, r);
    check_decision(d);
  } catch (const rl::error&) {
  }
}

struct configs {
  rl::fixed_window::config fixed{"10/s"};
  rl::sliding_window_counter::config counter{"10/s"};
  rl::sliding_window_log::config log{"10/s"};
  rl::token_bucket::config bucket{"10/s"};
  rl::gcra::config gcra{"10/s"};
  rl::compound<rl::fixed_window, rl::gcra>::config both{rl::fixed_window::config{"10/s"},
                                                        rl::gcra::config{"100/min"}};
  rl::compound_of<rl::sliding_window_log>::config many{"5/s", "50/min"};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const configs cfg;
  redisReader* reader = redisReaderCreate();
  if (reader == nullptr) return 0;
  redisReplyObjectFunctions fns = *reader->fn;
  fns.createArray = cap_arrays(fns.createArray);
  reader->fn = &fns;

  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) == REDIS_OK) {
    // Every complete reply in the input, until it runs out or turns malformed.
    for (int n = 0; n < 64; ++n) {
      void* out = nullptr;
      if (redisReaderGetReply(reader, &out) != REDIS_OK || out == nullptr) break;
      const rl::redis::reply_ptr reply(static_cast<redisReply*>(out));
      const redisReply& r = *reply;
      decode(cfg.fixed, r);
      decode(cfg.counter, r);
      decode(cfg.log, r);
      decode(cfg.bucket, r);
      decode(cfg.gcra, r);
      decode(cfg.both, r);
      decode(cfg.many, r);
      (void)rl::redis::detail::is_noscript(r);
      (void)rl::redis::detail::is_node_failure(r);
      const auto expected = static_cast<std::uint16_t>(size % rl::redis::cluster_slots);
      if (const auto redirect = rl::redis::detail::parse_redirect(r, "asked-host", expected)) {
        RATELIMIT_FUZZ_CHECK(redirect->slot == expected, "redirect to another slot followed");
        RATELIMIT_FUZZ_CHECK(!redirect->to.host.empty(), "redirect without a host");
      }
    }
  }
  redisReaderFree(reader);
  return 0;
}
