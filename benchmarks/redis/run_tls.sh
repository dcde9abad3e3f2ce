#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Sequential checks over TLS against plain TCP on one throwaway redis-server
# (--port and --tls-port, certificates made here with the openssl CLI); prints
# checks/s, p50/p99 latency and the TLS/plain ratios measured in one run.
# Usage: benchmarks/redis/run_tls.sh [BUILD_DIR] (configured with
# -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON; N=checks per round, ROUNDS).
set -eu
BUILD=${1:-build}
. "$(dirname "$0")/lib.sh"
BENCH=$(rl_bench "$BUILD" ratelimit_tls_bench)
rl_need redis-server
rl_need openssl
rl_temp_dir DIR
PORT=$(rl_free_port)
TPORT=$(rl_free_port)
EC="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $EC -keyout "$DIR/ca.key" -out "$DIR/ca.crt" -days 1 -subj /CN=bench-ca 2>/dev/null
openssl req -new $EC -keyout "$DIR/s.key" -out "$DIR/s.csr" -subj /CN=localhost 2>/dev/null
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" > "$DIR/ext"
openssl x509 -req -in "$DIR/s.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" -CAcreateserial \
  -out "$DIR/s.crt" -days 1 -extfile "$DIR/ext" 2>/dev/null
rl_start_redis "$PORT" --tls-port "$TPORT" --tls-cert-file "$DIR/s.crt" \
  --tls-key-file "$DIR/s.key" --tls-ca-cert-file "$DIR/ca.crt" --tls-auth-clients no
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; redis $(rl_redis_version); $(openssl version)"
"$BENCH" "redis://127.0.0.1:$PORT" "rediss://127.0.0.1:$TPORT?ca=$DIR/ca.crt" "${N:-20000}" "${ROUNDS:-5}"
