#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A/B of two builds of ratelimit_cluster_bench on one throwaway 3-master Redis
# Cluster: rounds alternate A and B, each prints checks/s per benchmark, so
# ratios are taken within a round (the machine's load drifts between rounds).
# Usage: [FILTER=REGEX] [ROUNDS=5] benchmarks/redis/ab_cluster.sh BENCH_A BENCH_B
# (BENCH_* are ratelimit_cluster_bench binaries, e.g. built at two commits with
# -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON -DCMAKE_BUILD_TYPE=Release).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 BENCH_A BENCH_B" >&2; exit 2; }
A=$1
B=$2
ROUNDS=${ROUNDS:-5}
FILTER=${FILTER:-ClusterStore_Multiplexed}
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
DIR=$(mktemp -d /tmp/ratelimit-cluster-ab-XXXXXX)
PIDS=""
cleanup() { for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
wait_ping() { i=0; until redis-cli -p "$1" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 200 ] || exit 1; sleep 0.05; done; }
SINGLE=$(free_port)
redis-server --port "$SINGLE" --bind 127.0.0.1 --save '' --appendonly no --logfile '' >/dev/null 2>&1 &
PIDS="$PIDS $!"
wait_ping "$SINGLE"
ADDRS=""
FIRST=""
for n in 1 2 3; do
  P=$(free_port)
  redis-server --port "$P" --bind 127.0.0.1 --cluster-enabled yes \
    --cluster-config-file "$DIR/nodes-$P.conf" --cluster-node-timeout 1000 \
    --save '' --appendonly no --dir "$DIR" --logfile "$DIR/$P.log" >/dev/null 2>&1 &
  PIDS="$PIDS $!"
  wait_ping "$P"
  ADDRS="$ADDRS 127.0.0.1:$P"
  [ -n "$FIRST" ] || FIRST=$P
done
# shellcheck disable=SC2086
redis-cli --cluster create $ADDRS --cluster-replicas 0 --cluster-yes >/dev/null
i=0; until redis-cli -p "$FIRST" cluster info | grep -q 'cluster_state:ok'; do i=$((i+1)); [ $i -lt 200 ] || exit 1; sleep 0.05; done
sleep 1
export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$SINGLE"
export RATELIMIT_BENCH_CLUSTER_URL="redis-cluster://127.0.0.1:$FIRST"
echo "round build benchmark checks/s"
r=1
while [ $r -le "$ROUNDS" ]; do
  for v in A B; do
    if [ $v = A ]; then BENCH=$A; else BENCH=$B; fi
    "$BENCH" --benchmark_filter="$FILTER" --benchmark_min_time=1 --benchmark_format=csv 2>/dev/null |
      grep '^"BM_' | awk -F, -v v=$v -v r=$r '{ n=$1; gsub(/"/,"",n); printf "%s %s %s %.0f\n", r, v, n, $7 }'
  done
  r=$((r+1))
done
