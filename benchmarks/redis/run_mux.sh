#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Multiplexed and async checks against redis-benchmark EVALSHA of the same GCRA
# script, in ROUNDS alternating rounds (each round measures the baseline right
# before our rows, so that load from other processes hits both alike); prints
# each round's ratios and their medians.
# Rows of 16 threads are also shown against redis-benchmark with 16 requests
# in flight (-c 16 -P 1 and -c 2 -P 8), the most 16 blocking callers can have.
# Usage: benchmarks/redis/run_mux.sh [BUILD_DIR [OTHER_BUILD_DIR]] (ROUNDS=5 MIN_TIME=1 N=200000)
# (BUILD_DIR configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON).
# With OTHER_BUILD_DIR (another revision, say) both run in every round, one
# right after the other, and their rows are prefixed "1:" and "2:".
# PIN=apart runs Redis on CPU 1 and every client (redis-benchmark and ours) on
# CPU 0, as when Redis has a host of its own; PIN=same runs all on CPU 1;
# unset, the scheduler decides.
set -eu
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
BENCH=$(rl_bench "$BUILD" ratelimit_redis_bench)
BENCH2=
if [ $# -ge 2 ]; then BENCH2=$(rl_bench "$2" ratelimit_redis_bench); fi
rl_need redis-server
PORT=${PORT:-$(rl_free_port)}
rl_start_redis "$PORT"
case "${PIN:-}" in
  apart) taskset -pc 1 "$RL_REDIS_PID" >/dev/null; ON="taskset -c 0" ;;
  same) taskset -pc 1 "$RL_REDIS_PID" >/dev/null; ON="taskset -c 1" ;;
  '') ON="" ;;
  *) echo "PIN is apart, same or unset" >&2; exit 2 ;;
esac
rl_temp_file OUT
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT"
N=${N:-200000}
ROUNDS=${ROUNDS:-5}
MIN_TIME=${MIN_TIME:-1}
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$("$BENCH" --print-script gcra)")
RB() { $ON redis-benchmark -p "$PORT" -n "$N" -r 10000 --csv "$@" EVALSHA "$SHA" 1 "bench:{+1555__rand_int__}:gcra:bench" "" 1 0 0 90000000 10 | tail -1 | cut -d, -f2 | tr -d '"'; }
one() { $ON "$1" --benchmark_filter="$2" --benchmark_min_time="$MIN_TIME" --benchmark_format=csv 2>/dev/null | grep '^"BM_' | cut -d, -f1,7 | tr -d '"'; }
ours() {
  if [ -z "$BENCH2" ]; then one "$BENCH" "$1"; return; fi
  one "$BENCH" "$1" | sed 's/^/1:/'
  one "$BENCH2" "$1" | sed 's/^/2:/'
}
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); redis $(rl_redis_version); PIN=${PIN:-}"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  C1=$(RB -c 1 -P 1)
  ours 'Gcra_RedisStore_(Mux|MuxLead)?Sequential' | while IFS=, read -r name ips; do
    echo "$r,$name,$ips,$C1"; done >> "$OUT"
  C50=$(RB -c 50 -P 16)
  # The same 16 checks in flight as 16 blocking threads keep, from one
  # event-driven thread: 16 connections of one each, and 2 of 8 each.
  C16=$(RB -c 16 -P 1)
  C2P8=$(RB -c 2 -P 8)
  ours 'Gcra_RedisStore_(Pool|Mux/conns:[12]|MuxLead/conns:[12])/real_time/threads:16|Gcra_RedisStore_Async256' | while IFS=, read -r name ips; do
    echo "$r,$name,$ips,$C50"
    case "$name" in
      *threads:16) echo "$r,$name vs -c16 -P1,$ips,$C16"; echo "$r,$name vs -c2 -P8,$ips,$C2P8" ;;
    esac
  done >> "$OUT"
  echo "round $r: redis-benchmark -c1 -P1 $C1/s, -c50 -P16 $C50/s, -c16 -P1 $C16/s, -c2 -P8 $C2P8/s"
  r=$((r+1))
done
echo "== ratio to redis-benchmark in the same round (-c1 -P1 for sequential rows, -c50 -P16 otherwise unless named): per round, median"
sort -t, -k2,2 -k1,1n "$OUT" | awk -F, '
  { key=$2; ratio[key]=ratio[key] sprintf(" %.2f", $3/$4); ips[key]=ips[key] sprintf(" %.0f", $3) }
  END { for (k in ratio) {
          n=split(ratio[k], a, " ");
          for (i=2; i<=n; i++) { v=a[i]; j=i-1; while (j>0 && a[j]+0>v+0) { a[j+1]=a[j]; j-- } a[j+1]=v }
          m=a[int((n+1)/2)];
          printf "%-60s median %.2fx  rounds:%s  (checks/s:%s)\n", k, m, ratio[k], ips[k] } }' | sort
