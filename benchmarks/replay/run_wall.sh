#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Wall-clock and CPU time of whole ratelimit-replay runs on a dense and a sparse generated log.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: benchmarks/replay/run_wall.sh [--bin DIR] [--base DIR] [--runs N] [--dir DIR]

Makes two logs with ratelimit-gen-trace (unless they are already in DIR):

  dense.csv   --dense 1000000 --seed 1 (100,000 keys drawn uniformly, calls
              0-2 ms apart: every key live in every 15-minute window)
  sparse.csv  --seed 42 --subscribers 110000 --calls-per-day 6.6
              --call-centres 20 --robocallers 30 --edge-bursters 10 (one day)

then runs `ratelimit-replay --rate 10/15min LOG` (all five policies) and
`--policy P` for each policy, N times each in interleaved order, and prints
per command the median wall-clock time, the median user+system CPU time and
events per second of wall-clock time (the whole process: reading, parsing,
every policy, the report).

  --bin DIR   directory with ratelimit-replay and ratelimit-gen-trace
              (default build-rperf/examples/replay)
  --base DIR  another build's ratelimit-replay (e.g. of an older commit), run
              alternately with the first; adds its medians and the speed-up
  --runs N    runs per command (default 5)
  --dir DIR   where the logs are kept (default replay-logs)
EOF
}

bin=build-rperf/examples/replay
base=""
runs=5
dir=replay-logs
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin="${2:?--bin needs a directory}"; shift 2 ;;
    --base) base="${2:?--base needs a directory}"; shift 2 ;;
    --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
    --dir) dir="${2:?--dir needs a directory}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run_wall.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "run_wall.sh: --runs must be a positive number" >&2; exit 2; }
for tool in ratelimit-replay ratelimit-gen-trace; do
  [[ -x "$bin/$tool" ]] || { echo "run_wall.sh: $bin/$tool not found (see --bin)" >&2; exit 2; }
done
if [[ -n "$base" && ! -x "$base/ratelimit-replay" ]]; then
  echo "run_wall.sh: $base/ratelimit-replay not found (see --base)" >&2
  exit 2
fi

mkdir -p "$dir"
if [[ ! -s "$dir/dense.csv" ]]; then
  "$bin/ratelimit-gen-trace" --dense 1000000 --seed 1 --out "$dir/dense.csv"
fi
if [[ ! -s "$dir/sparse.csv" ]]; then
  "$bin/ratelimit-gen-trace" --seed 42 --subscribers 110000 --calls-per-day 6.6 \
    --call-centres 20 --robocallers 30 --edge-bursters 10 --out "$dir/sparse.csv"
fi

policies=("" fixed_window sliding_log sliding_counter token_bucket gcra)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# One run: appends "wall cpu" (seconds) to the command's file.
run_once() {
  local exe="$1" log="$2" policy="$3" key="$4"
  local args=(--rate 10/15min)
  [[ -n "$policy" ]] && args+=(--policy "$policy")
  TIMEFORMAT='%R %U %S'
  local t
  t="$( { time "$exe" "${args[@]}" "$log" >/dev/null; } 2>&1 )"
  read -r wall user sys <<<"$t"
  awk -v w="$wall" -v u="$user" -v s="$sys" 'BEGIN {print w, u + s}' >>"$tmp/$key"
}

for ((r = 0; r < runs; r++)); do
  for log in dense sparse; do
    for p in "${policies[@]}"; do
      run_once "$bin/ratelimit-replay" "$dir/$log.csv" "$p" "$log-${p:-all}"
      if [[ -n "$base" ]]; then
        run_once "$base/ratelimit-replay" "$dir/$log.csv" "$p" "base-$log-${p:-all}"
      fi
    done
  done
done

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%-8s %-16s %10s %10s %14s' log policy "wall s" "cpu s" "M events/s"
[[ -n "$base" ]] && printf ' %12s %12s %9s' "base wall s" "base cpu s" "speed-up"
echo
for log in dense sparse; do
  events=$(grep -cv '^[#t]' "$dir/$log.csv")
  for p in "${policies[@]}"; do
    key="$log-${p:-all}"
    wall=$(cut -d' ' -f1 "$tmp/$key" | median)
    cpu=$(cut -d' ' -f2 "$tmp/$key" | median)
    printf '%-8s %-16s %10.3f %10.3f %14.2f' "$log" "${p:-all five}" "$wall" "$cpu" \
      "$(awk -v e="$events" -v w="$wall" 'BEGIN {print e / w / 1e6}')"
    if [[ -n "$base" ]]; then
      bwall=$(cut -d' ' -f1 "$tmp/base-$key" | median)
      bcpu=$(cut -d' ' -f2 "$tmp/base-$key" | median)
      printf ' %12.3f %12.3f %8.2fx' "$bwall" "$bcpu" \
        "$(awk -v b="$bwall" -v w="$wall" 'BEGIN {print b / w}')"
    fi
    echo
  done
done
echo "(medians of $runs runs; wall = elapsed time of the whole process)"
