#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Starts a throwaway redis-server, runs the Redis store benchmarks and
# redis-benchmark calling EVALSHA of the same GCRA script, prints ratios and
# MEMORY USAGE per key. Usage: benchmarks/redis/run.sh [BUILD_DIR]
# (BUILD_DIR configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON).
set -eu
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
BENCH=$(rl_bench "$BUILD" ratelimit_redis_bench)
rl_need redis-server
PORT=${PORT:-$(rl_free_port)}
rl_start_redis "$PORT"
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT"
N=${N:-200000}

echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; redis $(rl_redis_version); commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "== MEMORY USAGE per key (10/15min, 16-byte key)"
"$BENCH" --memory

SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$("$BENCH" --print-script gcra)")
# Same script and arguments as the store sends: server time, cost 1, consume,
# no TTL floor, T = 90 s, burst 10.
RB() { redis-benchmark -p "$PORT" -n "$N" -r 10000 --csv "$@" EVALSHA "$SHA" 1 "bench:{+1555__rand_int__}:gcra:bench" "" 1 0 0 90000000 10 | tail -1 | cut -d, -f2 | tr -d '"'; }
RB_C1=$(RB -c 1 -P 1)
RB_C50=$(RB -c 50 -P 16)
echo "== redis-benchmark EVALSHA gcra: -c 1 -P 1: $RB_C1 req/s; -c 50 -P 16: $RB_C50 req/s"

rl_temp_file OUT
"$BENCH" --benchmark_min_time=1 --benchmark_format=csv 2>/dev/null | grep '^"BM_' > "$OUT"
echo "== ours (checks/s) and ratio to redis-benchmark"
# CSV: name,iterations,real_time,cpu_time,time_unit,bytes_per_second,items_per_second,...
awk -F, -v c1="$RB_C1" -v c50="$RB_C50" '{
  name=$1; gsub(/"/,"",name); ips=$7;
  base = (name ~ /Sequential/) ? c1 : c50; tag = (name ~ /Sequential/) ? "-c1 -P1" : "-c50 -P16";
  printf "%-48s %10.0f checks/s  %5.1f%% of redis-benchmark %s\n", name, ips, 100*ips/base, tag }' "$OUT"
