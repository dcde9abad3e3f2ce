#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Before/after in one run: the same benchmark rows from two builds (say, main
# and a branch) against redis-benchmark EVALSHA of the same GCRA script, in
# ROUNDS alternating rounds (baseline, build A, build B, each round; the order
# of A and B flips every round), so that load from other processes hits all
# alike. Prints each round's ratios to redis-benchmark and their medians.
# Before the first round, every GCRA key both clients use is checked past
# its limit (11 checks each, through redis-cli --pipe), so that all rounds
# run the same path in Redis: a key's first 10 checks admit and write, about
# 1-2 us more per call, and without this the benchmark rows paid for those in
# their first rounds while redis-benchmark had left its own behind (PRIME=0
# skips it). B_QUERY='read_spin_us=50' gives build B's rows that URL query.
# Usage: benchmarks/redis/run_ab.sh BUILD_A BUILD_B
#   (ROUNDS=5 MIN_TIME=1 N=200000 FILTER='Gcra_RedisStore_Sequential' RB_ARGS='-c 1 -P 1' PRIME=1 B_QUERY=)
# (both BUILD dirs configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON
# -DCMAKE_BUILD_TYPE=Release).
set -eu
. "$(dirname "$0")/lib.sh"
[ $# -eq 2 ] || { sed -n '3,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
A="$1/benchmarks/redis/ratelimit_redis_bench"
B="$2/benchmarks/redis/ratelimit_redis_bench"
for b in "$A" "$B"; do
  [ -x "$b" ] || { echo "build $b first (--target ratelimit_redis_bench)" >&2; exit 2; }
done
rl_need redis-server
rl_need redis-benchmark redis-tools
PORT=${PORT:-$(rl_free_port)}
rl_start_redis "$PORT"
OUT=""
rl_temp_file OUT
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT"
N=${N:-200000}
B_QUERY=${B_QUERY:+?$B_QUERY}
ROUNDS=${ROUNDS:-5}
MIN_TIME=${MIN_TIME:-1}
FILTER=${FILTER:-Gcra_RedisStore_Sequential}
RB_ARGS=${RB_ARGS:--c 1 -P 1}
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$("$A" --print-script gcra)")
# shellcheck disable=SC2086
RB() { redis-benchmark -p "$PORT" -n "$N" -r 10000 --csv $RB_ARGS EVALSHA "$SHA" 1 "bench:{+1555__rand_int__}:gcra:bench" "" 1 0 0 90000000 10 | tail -1 | cut -d, -f2 | tr -d '"'; }
rows() { RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT${3:-}" "$2" --benchmark_filter="$FILTER" --benchmark_min_time="$MIN_TIME" --benchmark_format=csv 2>/dev/null | grep '^"BM_' | cut -d, -f1,7 | tr -d '"' | while IFS=, read -r name ips; do echo "$r,$1 $name,$ips,$base"; done >> "$OUT"; }
[ "${PRIME:-1}" != 1 ] || rl_prime_gcra "$PORT" "$SHA"
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  base=$(RB)
  if [ $((r % 2)) -eq 1 ]; then rows A "$A"; rows B "$B" "$B_QUERY"; else rows B "$B" "$B_QUERY"; rows A "$A"; fi
  echo "round $r: redis-benchmark $RB_ARGS $base/s; load $(cut -d' ' -f1 /proc/loadavg)"
  r=$((r+1))
done
echo "== ratio to redis-benchmark $RB_ARGS in the same round (A = $1, B = $2): per round, median"
sort -t, -k2,2 -k1,1n "$OUT" | awk -F, '
  { key=$2; ratio[key]=ratio[key] sprintf(" %.2f", $3/$4); ips[key]=ips[key] sprintf(" %.0f", $3) }
  END { for (k in ratio) {
          n=split(ratio[k], a, " ");
          for (i=2; i<=n; i++) { v=a[i]; j=i-1; while (j>0 && a[j]+0>v+0) { a[j+1]=a[j]; j-- } a[j+1]=v }
          m=a[int((n+1)/2)];
          printf "%-48s median %.2fx  rounds:%s  (checks/s:%s)\n", k, m, ratio[k], ips[k] } }' | sort -k2
