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
. "$(dirname "$0")/lib.sh"
rl_need redis-server
rl_need redis-cli redis-tools
SINGLE=$(rl_free_cluster_port)
rl_start_redis "$SINGLE"
rl_start_cluster 3 0
FIRST=$RL_CLUSTER_PORT
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
