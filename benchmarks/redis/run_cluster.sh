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
. "$(dirname "$0")/lib.sh"
BENCH=$(rl_bench "$BUILD" ratelimit_cluster_bench)
rl_need redis-server
rl_need redis-cli redis-tools
REPLICAS=${REPLICAS:-0}
REPS=${REPS:-3}
MIN_TIME=${MIN_TIME:-1}
SINGLE=$(rl_free_cluster_port)
rl_start_redis "$SINGLE"
rl_start_cluster $((3 * (1 + REPLICAS))) "$REPLICAS"
FIRST=$RL_CLUSTER_PORT

export RATELIMIT_BENCH_REDIS_URL="redis://127.0.0.1:$SINGLE"
export RATELIMIT_BENCH_CLUSTER_URL="redis-cluster://127.0.0.1:$FIRST"
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; redis $(rl_redis_version); cluster: 3 masters, $REPLICAS replica(s) each; commit $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
rl_temp_file OUT
"$BENCH" --benchmark_filter="${FILTER:-.}" --benchmark_min_time="$MIN_TIME" --benchmark_repetitions="$REPS" \
  --benchmark_report_aggregates_only=true --benchmark_format=csv 2>/dev/null | grep '_median"' > "$OUT"
echo "== median checks/s of $REPS repetitions (GCRA 10/15min, 10,000 keys, server time)"
# CSV: name,iterations,real_time,cpu_time,time_unit,bytes_per_second,items_per_second,...
awk -F, '{ name=$1; gsub(/"/,"",name); sub(/_median$/,"",name); printf "%-52s %10.0f\n", name, $7 }' "$OUT"
