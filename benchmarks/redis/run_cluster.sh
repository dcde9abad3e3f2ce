#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Starts one throwaway redis-server and a throwaway 3-master Redis Cluster
# (REPLICAS=1 adds a replica per master), runs the cluster benchmarks against
# both and prints the median checks/s of REPS repetitions.
# Usage: [FILTER=REGEX] benchmarks/redis/run_cluster.sh [BUILD_DIR]
# (FILTER selects benchmarks by name, e.g. FILTER='ClusterStore_(Pool/threads:1$|Async256)'
# for async checks with 256 in flight against blocking sequential checks).
# (BUILD_DIR configured with -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON).
set -eu
BUILD=${1:-build}
BENCH="$BUILD/benchmarks/redis/ratelimit_cluster_bench"
[ -x "$BENCH" ] || { echo "build $BENCH first (cmake --build $BUILD --target ratelimit_cluster_bench)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install redis-server" >&2; exit 2; }
command -v redis-cli >/dev/null || { echo "redis-cli not found: apt-get install redis-tools" >&2; exit 2; }
REPLICAS=${REPLICAS:-0}
REPS=${REPS:-3}
MIN_TIME=${MIN_TIME:-1}
# A free port whose cluster bus port (+10000) is free too, so <= 55535.
free_port() { python3 -c '
import random, socket
while True:
    p = random.randint(20000, 55535)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'; }
DIR=$(mktemp -d /tmp/ratelimit-cluster-bench-XXXXXX)
PIDS=""
cleanup() { for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
wait_ping() { i=0; until redis-cli -p "$1" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 200 ] || exit 1; sleep 0.05; done; }

SINGLE=$(free_port)
redis-server --port "$SINGLE" --bind 127.0.0.1 --save '' --appendonly no --logfile '' >/dev/null 2>&1 &
PIDS="$PIDS $!"
wait_ping "$SINGLE"

NODES=$((3 * (1 + REPLICAS)))
ADDRS=""
FIRST=""
n=0
while [ $n -lt $NODES ]; do
  P=$(free_port)
  redis-server --port "$P" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$DIR/nodes-$P.conf" --cluster-node-timeout 1000 \
    --save '' --appendonly no --dir "$DIR" --logfile "$DIR/$P.log" >/dev/null 2>&1 &
  PIDS="$PIDS $!"
  wait_ping "$P"
  ADDRS="$ADDRS 127.0.0.1:$P"
  [ -n "$FIRST" ] || FIRST=$P
  n=$((n+1))
done
# shellcheck disable=SC2086
redis-cli --cluster create $ADDRS --cluster-replicas "$REPLICAS" --cluster-yes >/dev/null
i=0; until redis-cli -p "$FIRST" cluster info | grep -q 'cluster_state:ok'; do i=$((i+1)); [ $i -lt 200 ] || exit 1; sleep 0.05; done
sleep 1  # let every node learn the final configuration

export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$SINGLE"
export RATELIMIT_BENCH_CLUSTER_URL="redis-cluster://127.0.0.1:$FIRST"
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'); cluster: 3 masters, $REPLICAS replica(s) each; commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
OUT=$(mktemp)
"$BENCH" --benchmark_filter="${FILTER:-.}" --benchmark_min_time="$MIN_TIME" --benchmark_repetitions="$REPS" \
  --benchmark_report_aggregates_only=true --benchmark_format=csv 2>/dev/null | grep '_median"' > "$OUT"
echo "== median checks/s of $REPS repetitions (GCRA 10/15min, 10,000 keys, server time)"
# CSV: name,iterations,real_time,cpu_time,time_unit,bytes_per_second,items_per_second,...
awk -F, '{ name=$1; gsub(/"/,"",name); sub(/_median$/,"",name); printf "%-52s %10.0f\n", name, $7 }' "$OUT"
rm -f "$OUT"
