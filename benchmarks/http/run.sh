#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# wrk against ratelimit-http-example with the limiter off, in process and on Redis: requests/s, p99, ratios.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/http/run.sh [--bin PATH] [--rounds N] [--duration SECONDS]
                              [--connections N] [--threads N] [--tokens N]

Starts ratelimit-http-example (built in Release) once per mode and round and
runs wrk against GET /v1/hello, in rounds of interleaved modes (so that a slow
spell of a shared machine hits every mode alike):
  off      --limiter-off (no check, no RateLimit headers): the baseline
  memory   the in-process store, every request admitted (the admit path)
  reject   the in-process store, one token over its limit (the 429 path)
  redis    a throwaway redis-server on a free port (stopped by its PID), admit path
The admit modes send N distinct tokens (each its own key) under a tier of
1000000000/1min, so the limiter admits every request. Prints each run, then
the medians of requests/s and p99 latency per mode and the median of the
per-round ratios memory/off, reject/off and redis/off (target: memory/off >= 0.95).

  --bin PATH         the server (default build-http-bench/examples/http/ratelimit-http-example,
                     built here with -DCMAKE_BUILD_TYPE=Release -DRATELIMIT_REDIS=ON if absent)
  --rounds N         rounds (default 5)
  --duration S       seconds per wrk run (default 5)
  --connections N    wrk connections (default 8; the server has as many worker threads)
  --threads N        wrk threads (default 1)
  --tokens N         distinct API tokens in the admit modes (default 10000)
USAGE
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin=""
rounds=5
duration=5
connections=8
wrk_threads=1
tokens=10000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="${2:?--bin needs a path}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
    --duration) duration="${2:?--duration needs seconds}"; shift 2 ;;
    --connections) connections="${2:?--connections needs a number}"; shift 2 ;;
    --threads) wrk_threads="${2:?--threads needs a number}"; shift 2 ;;
    --tokens) tokens="${2:?--tokens needs a number}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
command -v wrk >/dev/null || { echo "run.sh: wrk not found (scripts/deps.sh installs it)" >&2; exit 1; }

if [[ -z "$bin" ]]; then
  bin="$root/build-http-bench/examples/http/ratelimit-http-example"
  if [[ ! -x "$bin" ]]; then
    cmake -S "$root" -B "$root/build-http-bench" -DCMAKE_BUILD_TYPE=Release \
      -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_TESTS=OFF -DRATELIMIT_BUILD_EXAMPLES=ON >/dev/null
    cmake --build "$root/build-http-bench" -j2 --target ratelimit_http_example >/dev/null
  fi
fi

work="$(mktemp -d)"
server_pid=""
redis_pid=""
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  [[ -n "$redis_pid" ]] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The throwaway Redis.
redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --daemonize no --logfile "" >"$work/redis.log" 2>&1 &
redis_pid=$!
redis_up=""
for _ in $(seq 100); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && { redis_up=1; break; }
  sleep 0.05
done
[[ -n "$redis_up" ]] || { echo "run.sh: redis-server did not start" >&2; cat "$work/redis.log" >&2; exit 1; }

# wrk scripts: many tokens (admit path), or one token over its limit (reject
# path); both pre-build their requests and cycle through them, so that wrk
# does the same work per request in every mode.
write_lua() {  # file, token expression
  cat >"$1" <<LUA
local reqs = {}
local n = 0
function init(args)
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
  for i = 1, 5000 do
    reqs[i] = wrk.format("GET", "/v1/hello", {["Authorization"] = "Bearer " .. $2})
  end
end
function request()
  n = n % #reqs + 1
  return reqs[n]
end
LUA
}
write_lua "$work/admit.lua" "\"tok-\" .. math.random($tokens)"
write_lua "$work/reject.lua" "\"tok-over\""

start_server() {  # args: server options; sets server_pid and port
  rm -f "$work/server.out"  # no stale port from the previous run (read before it is made)
  "$bin" --port 0 --threads "$connections" "$@" >"$work/server.out" 2>&1 &
  server_pid=$!
  port=""
  for _ in $(seq 200); do
    port="$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9]*\) .*/\1/p' "$work/server.out" 2>/dev/null || true)"
    [[ -n "$port" ]] && break
    sleep 0.05
  done
  [[ -n "$port" ]] || { cat "$work/server.out" >&2; exit 1; }
}

stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=""
}

admit_tier=(--tier bench=1000000000/1min --default-tier bench --token tok-0=bench)
results="$work/results.txt"
for round in $(seq "$rounds"); do
  for mode in off memory reject redis; do
    case "$mode" in
      off) start_server --limiter-off "${admit_tier[@]}"; lua=admit.lua ;;
      memory) start_server "${admit_tier[@]}"; lua=admit.lua ;;
      reject) start_server --tier small=1/1h --token tok-over=small; lua=reject.lua ;;
      redis) start_server --store "redis://127.0.0.1:$redis_port" "${admit_tier[@]}"; lua=admit.lua ;;
    esac
    if ! out="$(wrk -t "$wrk_threads" -c "$connections" -d "${duration}s" --latency \
      -s "$work/$lua" "http://127.0.0.1:$port/v1/hello" 2>&1)"; then
      echo "round $round  $mode  wrk failed (run left out): $out"
      stop_server
      continue
    fi
    stop_server
    rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    p99="$(awk '$1 == "99%" {print $2}' <<<"$out")"
    non2xx="$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")"
    # The admit modes must serve every request: a 503 (Redis gone) or a 429
    # is fast, and counting it would report throughput that was not served.
    if [[ "$mode" != reject && "${non2xx:-0}" != 0 ]]; then
      echo "round $round  $mode  non-2xx ${non2xx} of an admit run (run left out)"
      continue
    fi
    echo "round $round  $mode  requests/s $rps  p99 $p99  non-2xx ${non2xx:-0}"
    echo "$round $mode $rps $p99" >>"$results"
  done
done

# Medians per mode, and the median of the per-round ratios to "off".
python3 - "$results" <<'PY'
import statistics, sys

def us(v):  # wrk latency "1.23ms" / "456.00us" / "1.2s" -> microseconds
    for unit, f in (("us", 1), ("ms", 1e3), ("s", 1e6)):
        if v.endswith(unit):
            return float(v[: -len(unit)]) * f
    return float(v)

runs = {}
for line in open(sys.argv[1]):
    r, mode, rps, p99 = line.split()
    runs.setdefault(mode, {})[r] = (float(rps), us(p99))
print()
print(f"{'mode':8} {'requests/s (median)':>20} {'p99 us (median)':>16}")
for mode in ("off", "memory", "reject", "redis"):
    if mode not in runs:
        print(f"{mode:8} no runs left")
        continue
    v = list(runs[mode].values())
    print(f"{mode:8} {statistics.median(x[0] for x in v):20.0f} {statistics.median(x[1] for x in v):16.0f}")
for mode in ("memory", "reject", "redis"):
    ratios = [runs[mode][r][0] / runs["off"][r][0]
              for r in runs.get("off", {}) if r in runs.get(mode, {})]
    if not ratios:
        print(f"{mode}/off throughput ratio: no round has both")
        continue
    shown = " ".join(f"{x:.3f}" for x in ratios)
    print(f"{mode}/off throughput ratio: median {statistics.median(ratios):.3f} (per round: {shown})")
m = [runs["memory"][r][0] / runs["off"][r][0]
     for r in runs.get("off", {}) if r in runs.get("memory", {})]
if m:
    print("target memory/off >= 0.95:", "met" if statistics.median(m) >= 0.95 else "NOT met")
PY
