#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Starts a throwaway redis-server and runs the idempotent-check benchmark
# (Redis memory per id, round trips against plain checks).
# Usage: benchmarks/redis/run_request_id.sh [BUILD_DIR]
# (BUILD_DIR configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON).
set -eu
BUILD=${1:-build}
BENCH="$BUILD/benchmarks/redis/ratelimit_request_id_redis_bench"
[ -x "$BENCH" ] || { echo "build $BENCH first (cmake --build $BUILD --target ratelimit_request_id_redis_bench)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install redis-server" >&2; exit 2; }
PORT=${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --logfile '' >/dev/null 2>&1 &
PID=$!
trap 'kill "$PID" 2>/dev/null || true' EXIT INT TERM
i=0; until redis-cli -p "$PORT" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.05; done
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT"
echo "== redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'); commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
shift 2>/dev/null || true
"$BENCH" "$@"
