#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# sip-front-door under sipp at increasing call rates: limiter off, in process,
# and on a throwaway Redis. Per run: calls/s the server answered, calls sipp
# saw fail, and the server's CPU time per call (/proc/PID/schedstat, in ns,
# read just before it is stopped; getrusage's ticks are too coarse for runs
# of a few seconds); the limiter's share of the CPU is 1 - cpu(off) /
# cpu(limiter), medians of REPS. Redis's own CPU per call likewise. In
# process the limiter's share is also measured directly within each run: the
# server's wall time inside acquire and release ("limiter_us" of its final
# counters) over its CPU time.
#
# Usage: benchmarks/sip/run.sh [BUILD_DIR]
#   BUILD_DIR holds examples/sip/sip-front-door, ideally a Release build with
#   Redis: cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release \
#            -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_EXAMPLES=ON
#          cmake --build build/release --target sip_front_door
# Environment: RATES (default "250 500 1000 2000" calls/s), SECONDS_PER_RUN (4),
#   REPS (3), NUMBERS (1000 calling numbers; each may make 100 calls per 15 min,
#   more than any rate here gives it: every call is admitted and makes the same
#   INVITE, 200, ACK, BYE, 200 whether the limiter is on or off).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-build/release}"
server="$build/examples/sip/sip-front-door"
[ -x "$server" ] || { echo "build $server first (see the header of $0)" >&2; exit 2; }
command -v sipp >/dev/null || { echo "sipp not found: apt-get install sip-tester" >&2; exit 2; }
rates="${RATES:-250 500 1000 2000}"
secs="${SECONDS_PER_RUN:-4}"
reps="${REPS:-3}"
numbers="${NUMBERS:-1000}"

work="$(mktemp -d "${TMPDIR:-/tmp}/sip_bench.XXXXXX")"
server_pid=""
redis_pid=""
sipp_pid=""
cleanup() {
  if [ -n "$sipp_pid" ]; then kill "$sipp_pid" 2>/dev/null || true; fi
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

csv="$work/numbers.csv"
echo SEQUENTIAL >"$csv"
for i in $(seq 1 "$numbers"); do printf '+4930%06d;\n' "$i" >>"$csv"; done

store_modes="off memory"
if command -v redis-server >/dev/null; then
  redis_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
  redis_pid=$!
  for _ in $(seq 1 200); do
    redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.05
  done
  store_modes="off memory redis"
fi

# CPU time of process PID (its main thread) in microseconds.
proc_cpu_us() { awk '{ printf "%.0f", $1 / 1000 }' "/proc/$1/schedstat"; }

# one_run MODE RATE: prints "calls_per_s failed cpu_us_per_call redis_cpu_us_per_call
#   limiter_us_per_call".
one_run() {
  local mode="$1" rate="$2" args=(--rate 100/15min --max-calls 2 --max-call-seconds 60)
  case "$mode" in
    off) args+=(--limiter-off) ;;
    redis)
      redis-cli -p "$redis_port" flushall >/dev/null
      args+=(--store "redis://127.0.0.1:$redis_port")
      ;;
  esac
  "$server" --listen 127.0.0.1:0 "${args[@]}" >"$work/server.out" 2>&1 &
  server_pid=$!
  local port=""
  for _ in $(seq 1 100); do
    port="$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$work/server.out" 2>/dev/null || true)"
    [ -n "$port" ] && break
    sleep 0.05
  done
  local calls=$((rate * secs))
  rm -f "$work"/stat.csv
  local t0 t1 r0=0 r1=0
  [ "$mode" = redis ] && r0="$(proc_cpu_us "$redis_pid")"
  t0="$(date +%s.%N)"
  # In the background with its PID kept, so that the EXIT trap stops it
  # when this script is interrupted or killed while sipp runs.
  (cd "$work" && exec sipp "127.0.0.1:$port" -sf "$root/examples/sip/scenarios/uac_call.xml" \
    -inf "$csv" -m "$calls" -r "$rate" -d 0 -i 127.0.0.1 -nostdin -timeout 120s \
    -trace_stat -stf stat.csv -fd 1 >/dev/null 2>&1) &
  sipp_pid=$!
  wait "$sipp_pid" || true
  sipp_pid=""
  t1="$(date +%s.%N)"
  [ "$mode" = redis ] && r1="$(proc_cpu_us "$redis_pid")"
  local cpu
  cpu="$(proc_cpu_us "$server_pid")"
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=""
  local stats
  stats="$(grep '^{' "$work/server.out" | tail -n 1)"
  if [ -n "${SIP_BENCH_DEBUG:-}" ] || ! grep -q "\"errors\":0," <<<"$stats"; then
    echo "$mode $rate: $stats" >&2
    cat "$work/server.out" >&2
  fi
  local answered failed
  answered=$(($(sed -n 's/.*"admitted":\([0-9]*\).*/\1/p' <<<"$stats") + \
    $(sed -n 's/.*"rejected":\([0-9]*\).*/\1/p' <<<"$stats")))
  failed="$(awk -F';' 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "FailedCall(C)") c = i }
                       END { print $c }' "$work/stat.csv")"
  local lim
  lim="$(sed -n 's/.*"limiter_us":\([0-9]*\).*/\1/p' <<<"$stats")"
  awk -v n="$answered" -v t0="$t0" -v t1="$t1" -v cpu="$cpu" -v f="$failed" -v r=$((r1 - r0)) \
    -v lim="$lim" 'BEGIN { printf "%.0f %d %.1f %.1f %.2f\n", n / (t1 - t0), f, (n > 0 ? cpu / n : 0),
                               (n > 0 ? r / n : 0), (n > 0 ? lim / n : 0) }'
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg); sipp $(sipp -v 2>&1 | grep -o 'v[0-9.]*' | head -1); commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "== $secs s per run, median of $reps runs; 100 calls/15 min and 2 in progress per number, $numbers numbers"
printf '%-6s %-7s %11s %7s %12s %14s %17s %16s %15s\n' "rate" "store" "answered/s" "failed" \
  "cpu us/call" "1-off/on" "redis cpu us/call" "limiter us/call" "limiter/cpu"
for rate in $rates; do
  off_cpu=""
  for mode in $store_modes; do
    : >"$work/runs"
    for _ in $(seq 1 "$reps"); do one_run "$mode" "$rate" >>"$work/runs"; done
    cps="$(cut -d' ' -f1 "$work/runs" | median)"
    failed="$(cut -d' ' -f2 "$work/runs" | median)"
    cpu="$(cut -d' ' -f3 "$work/runs" | median)"
    rcpu="$(cut -d' ' -f4 "$work/runs" | median)"
    [ "$mode" = redis ] || rcpu="-"
    lim="$(cut -d' ' -f5 "$work/runs" | median)"
    direct="$(awk '{ if ($3 > 0) print 100 * $5 / $3 }' "$work/runs" | median)"
    direct="$(printf '%.0f%%' "$direct")"
    [ "$mode" = off ] && { lim="-"; direct="-"; }
    [ "$mode" = redis ] && direct="$direct (wall)"
    share="-"
    if [ "$mode" = off ]; then
      off_cpu="$cpu"
    else
      share="$(awk -v a="$off_cpu" -v b="$cpu" 'BEGIN { printf "%.0f%%", (b > 0 ? 100 * (1 - a / b) : 0) }')"
    fi
    printf '%-6s %-7s %11s %7s %12s %14s %17s %16s %15s\n' "$rate" "$mode" "$cps" "$failed" "$cpu" \
      "$share" "$rcpu" "$lim" "$direct"
  done
done
