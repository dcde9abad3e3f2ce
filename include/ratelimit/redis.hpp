// SPDX-License-Identifier: Apache-2.0
// Redis umbrella header: the Redis store, its options, errors and scripts (needs hiredis).
#pragma once

#include "ratelimit/ratelimit.hpp"
#include "ratelimit/redis/cluster_store.hpp"
#include "ratelimit/redis/connection_pool.hpp"
#include "ratelimit/redis/errors.hpp"
#include "ratelimit/redis/options.hpp"
#include "ratelimit/redis/redis_store.hpp"
#include "ratelimit/redis/scripts/fixed_window.hpp"
#include "ratelimit/redis/scripts/gcra.hpp"
#include "ratelimit/redis/scripts/leases.hpp"
#include "ratelimit/redis/scripts/script_for.hpp"
#include "ratelimit/redis/scripts/sliding_window_counter.hpp"
#include "ratelimit/redis/scripts/sliding_window_log.hpp"
#include "ratelimit/redis/scripts/token_bucket.hpp"
#include "ratelimit/redis/sentinel.hpp"
