#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Where sequential checks lose against redis-benchmark -c 1 -P 1: in ROUNDS
# alternating rounds, redis-benchmark EVALSHA of the GCRA script, then
# `ratelimit_redis_client_cost_bench --wait-probe`: the pooled store, and
# the store's bytes on a raw connection waited for by a blocking recv, poll,
# epoll, as redis-benchmark's event loop does, or after a bounded busy-poll
# (spinN, yieldN, adaptN; see client_cost_bench.cpp). Prints each mode's
# median ratio to redis-benchmark in the same round.
# PIN=apart runs Redis on CPU 1 and both clients on CPU 0 (every wake-up
# crosses vCPUs, as on a quiet machine, where each runs on its own idle
# vCPU); PIN=same runs all three on CPU 1; unset, the scheduler decides.
# Usage: benchmarks/redis/run_wait.sh BUILD   (ROUNDS=7 N=10000 RB_N=20000 MODES=store,block,... PIN=)
# (BUILD configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON
# -DCMAKE_BUILD_TYPE=Release; targets ratelimit_redis_bench and
# ratelimit_redis_client_cost_bench).
set -eu
. "$(dirname "$0")/lib.sh"
[ $# -eq 1 ] || { sed -n '3,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
P="$1/benchmarks/redis/ratelimit_redis_client_cost_bench"
BENCH="$1/benchmarks/redis/ratelimit_redis_bench"
for b in "$P" "$BENCH"; do
  [ -x "$b" ] || { echo "build $b first" >&2; exit 2; }
done
rl_need redis-server
rl_need redis-benchmark redis-tools
PORT=${PORT:-$(rl_free_port)}
rl_start_redis "$PORT"
PID=$RL_REDIS_PID
OUT=""
rl_temp_file OUT
case "${PIN:-}" in
  apart) taskset -pc 1 "$PID" >/dev/null; ON="taskset -c 0" ;;
  same) taskset -pc 1 "$PID" >/dev/null; ON="taskset -c 1" ;;
  '') ON="" ;;
  *) echo "PIN is apart, same or unset" >&2; exit 2 ;;
esac
ROUNDS=${ROUNDS:-7}
N=${N:-10000}
RB_N=${RB_N:-20000}
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$("$BENCH" --print-script gcra)")
# Every GCRA key both clients use is checked past its limit first, so that
# all rounds run the same path in Redis (see run_ab.sh).
rl_prime_gcra "$PORT" "$SHA"
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); PIN=${PIN:-}"
r=1
while [ "$r" -le "$ROUNDS" ]; do
  base=$($ON redis-benchmark -p "$PORT" -n "$RB_N" -r 10000 --csv -c 1 -P 1 EVALSHA "$SHA" 1 "bench:{+1555__rand_int__}:gcra:bench" "" 1 0 0 90000000 10 | tail -1 | cut -d, -f2 | tr -d '"')
  all=$($ON "$P" --wait-probe 127.0.0.1 "$PORT" "$N" 1 "${MODES:-store,block,blockinf,blocklate,poll,epoll,rbstyle}" "$r")
  line=$(echo "$all" | grep "^round")
  echo "round $r: redis-benchmark $base/s;${line#round 1:}; load $(cut -d' ' -f1 /proc/loadavg)"
  echo "  $(echo "$all" | grep "^cpu")"
  echo "  $(echo "$all" | grep "^send")"
  echo "  $(echo "$all" | grep "^spin hits")"
  echo "${line#round 1:}" | awk -v r="$r" -v b="$base" '{ for (i = 1; i < NF; i += 2) print r "," $i "," $(i+1) "," b }' >> "$OUT"
  r=$((r+1))
done
echo "== ratio to redis-benchmark -c 1 -P 1 in the same round: median (rounds)"
sort -t, -k2,2 -k1,1n "$OUT" | awk -F, '
  { key=$2; ratio[key]=ratio[key] sprintf(" %.2f", $3/$4) }
  END { for (k in ratio) {
          n=split(ratio[k], a, " ");
          for (i=2; i<=n; i++) { v=a[i]; j=i-1; while (j>0 && a[j]+0>v+0) { a[j+1]=a[j]; j-- } a[j+1]=v }
          printf "%-8s median %.2fx  rounds:%s\n", k, a[int((n+1)/2)], ratio[k] } }' | sort
