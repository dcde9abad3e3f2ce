#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Sequential checks over TLS against plain TCP on one throwaway redis-server
# (--port and --tls-port, certificates made here with the openssl CLI); prints
# checks/s, p50/p99 latency and the TLS/plain ratios measured in one run.
# Usage: benchmarks/redis/run_tls.sh [BUILD_DIR] (configured with
# -DRATELIMIT_REDIS=ON -DRATELIMIT_BUILD_BENCHMARKS=ON; N=checks per round, ROUNDS).
set -eu
BUILD=${1:-build}
BENCH="$BUILD/benchmarks/redis/ratelimit_tls_bench"
[ -x "$BENCH" ] || { echo "build $BENCH first (cmake --build $BUILD --target ratelimit_tls_bench)" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "redis-server not found: apt-get install redis-server" >&2; exit 2; }
command -v openssl >/dev/null || { echo "openssl not found: apt-get install openssl" >&2; exit 2; }
DIR=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
TPORT=$(free_port)
cleanup() { [ -n "${PID:-}" ] && kill "$PID" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
EC="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $EC -keyout "$DIR/ca.key" -out "$DIR/ca.crt" -days 1 -subj /CN=bench-ca 2>/dev/null
openssl req -new $EC -keyout "$DIR/s.key" -out "$DIR/s.csr" -subj /CN=localhost 2>/dev/null
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" > "$DIR/ext"
openssl x509 -req -in "$DIR/s.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" -CAcreateserial \
  -out "$DIR/s.crt" -days 1 -extfile "$DIR/ext" 2>/dev/null
redis-server --port "$PORT" --tls-port "$TPORT" --bind 127.0.0.1 --save '' --appendonly no \
  --logfile '' --tls-cert-file "$DIR/s.crt" --tls-key-file "$DIR/s.key" \
  --tls-ca-cert-file "$DIR/ca.crt" --tls-auth-clients no >/dev/null 2>&1 &
PID=$!
i=0; until redis-cli -p "$PORT" ping >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.05; done
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'); $(openssl version)"
"$BENCH" "redis://127.0.0.1:$PORT" "rediss://127.0.0.1:$TPORT?ca=$DIR/ca.crt" "${N:-20000}" "${ROUNDS:-5}"
