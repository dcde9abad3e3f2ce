// SPDX-License-Identifier: Apache-2.0
// Core umbrella header: policies, clocks, the in-process store, the limiter. Never includes hiredis.
#pragma once

#include "ratelimit/clock/coarse_clock.hpp"
#include "ratelimit/clock/manual_clock.hpp"
#include "ratelimit/clock/steady_clock.hpp"
#include "ratelimit/concepts.hpp"
#include "ratelimit/concurrency.hpp"
#include "ratelimit/decision.hpp"
#include "ratelimit/errors.hpp"
#include "ratelimit/limiter.hpp"
#include "ratelimit/policy/compound.hpp"
#include "ratelimit/policy/fixed_window.hpp"
#include "ratelimit/policy/gcra.hpp"
#include "ratelimit/policy/sliding_window_counter.hpp"
#include "ratelimit/policy/sliding_window_log.hpp"
#include "ratelimit/policy/token_bucket.hpp"
#include "ratelimit/rate.hpp"
#include "ratelimit/request_id.hpp"
#include "ratelimit/store/blocked_cache.hpp"
#include "ratelimit/store/memory_store.hpp"
#include "ratelimit/store/observed_store.hpp"
#include "ratelimit/version.hpp"
