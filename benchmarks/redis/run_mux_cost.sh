#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Client cost per check of benchmark rows (multiplexed, pooled, async), from
# the whole benchmark process: CPU time (perf task-clock), context switches,
# futex calls and system calls, each divided by the EVALSHA/EVAL calls the
# server counted; then redis-benchmark's own per request (-c 50 -P 16).
# Counts, not speeds: they hold better than checks/s on a loaded machine.
# Usage: benchmarks/redis/run_mux_cost.sh BUILD_DIR [OTHER_BUILD_DIR]
#   (REPS=2 MIN_TIME=2 FILTERS='regex;regex' as --benchmark_filter values)
#   (leader/follower rows, MuxLead*, are those of options::multiplex_lead)
# Needs perf (linux-perf) with tracepoints readable (root, or
# kernel.perf_event_paranoid <= 1).
set -eu
. "$(dirname "$0")/lib.sh"
BENCHES=$(rl_bench "$1" ratelimit_redis_bench)
if [ $# -ge 2 ]; then BENCHES="$BENCHES $(rl_bench "$2" ratelimit_redis_bench)"; fi
rl_need redis-server
rl_need perf linux-perf
PORT=${PORT:-$(rl_free_port)}
rl_start_redis "$PORT"
rl_temp_file STAT
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$PORT"
REPS=${REPS:-2}
MIN_TIME=${MIN_TIME:-2}
FILTERS=${FILTERS:-'Gcra_RedisStore_Mux/conns:1/real_time/threads:16;Gcra_RedisStore_MuxLead/conns:1/real_time/threads:16;Gcra_RedisStore_MuxLeadSequential;Gcra_RedisStore_Mux/conns:2/real_time/threads:16;Gcra_RedisStore_MuxSequential;Gcra_RedisStore_Async256/conns:1;Gcra_RedisStore_Pool/real_time/threads:16'}
EVENTS=task-clock,context-switches,syscalls:sys_enter_futex,raw_syscalls:sys_enter
calls() {
  redis-cli -p "$PORT" INFO commandstats | tr -d '\r' |
    grep -E '^cmdstat_(evalsha|eval):' | sed 's/^[^:]*:calls=\([0-9]*\).*/\1/' | paste -sd+ - | bc
}
per() {  # per LABEL COUNT: the perf counts in $STAT divided by COUNT
  awk -F, -v n="$2" -v label="$1" '
    $3 == "task-clock" { t = $1 } $3 == "context-switches" { cs = $1 }
    $3 ~ /futex/ { fu = $1 } $3 ~ /raw_syscalls/ { sc = $1 }
    END { printf "%-70s n=%d cpu_us=%.2f cs=%.2f futex=%.2f syscalls=%.2f\n",
                 label, n, t * 1000 / n, cs / n, fu / n, sc / n }' "$STAT"
}
echo "== load $(cut -d' ' -f1-3 /proc/loadavg); per check (per request for redis-benchmark)"
echo "$FILTERS" | tr ';' '\n' | while read -r f; do
  for b in $BENCHES; do
    k=1
    while [ "$k" -le "$REPS" ]; do
      redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null
      perf stat -x, -e "$EVENTS" -o "$STAT" "$b" --benchmark_filter="$f" \
        --benchmark_min_time="$MIN_TIME" >/dev/null 2>&1
      per "$b $f" "$(calls)"
      k=$((k + 1))
    done
  done
done
SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$("${BENCHES%% *}" --print-script gcra)")
N=200000
perf stat -x, -e "$EVENTS" -o "$STAT" redis-benchmark -p "$PORT" -n "$N" -r 10000 -c 50 -P 16 \
  EVALSHA "$SHA" 1 "bench:{+1555__rand_int__}:gcra:bench" "" 1 0 0 90000000 10 >/dev/null 2>&1
per "redis-benchmark -c 50 -P 16" "$N"
echo "== load $(cut -d' ' -f1-3 /proc/loadavg)"
