#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Starts a throwaway redis-server and runs the idempotent-check benchmark
# (Redis memory per id, round trips against plain checks).
# Usage: benchmarks/redis/run_request_id.sh [BUILD_DIR]
# (BUILD_DIR configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON).
set -eu
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
BENCH=$(rl_bench "$BUILD" ratelimit_request_id_redis_bench)
rl_need redis-server
PORT=${PORT:-$(rl_free_port)}
rl_start_redis "$PORT"
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT"
echo "== redis $(rl_redis_version); commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
shift 2>/dev/null || true
"$BENCH" "$@"
