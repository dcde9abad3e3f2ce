# SPDX-License-Identifier: Apache-2.0
# Shared by the benchmarks/redis/*.sh scripts (sourced, POSIX sh): starts
# throwaway redis-servers (one, or a Redis Cluster), waits for them, and
# stops them and removes the scripts' temporary files on exit, Ctrl-C or
# TERM. Usage, in a script: . "$(dirname "$0")/lib.sh"
#
# rl_bench BUILD TARGET      prints BUILD/benchmarks/redis/TARGET; fails (2) unless
#                            built (BENCH=$(rl_bench ...) then ends a `set -e` script)
# rl_need CMD [PACKAGE]      exit 2 unless CMD is on PATH (naming PACKAGE to install)
# rl_free_port               a free TCP port on 127.0.0.1
# rl_free_cluster_port       a free port whose cluster bus port (+10000) is free too
# rl_temp_file VAR, rl_temp_dir VAR [TEMPLATE]
#                            VAR := a new temporary file / directory, removed on exit
# rl_start_redis PORT [ARGS] a redis-server on PORT (and ARGS), waited for; its
#                            pid in RL_REDIS_PID
# rl_start_cluster NODES REPLICAS
#                            a Redis Cluster of NODES servers (REPLICAS per
#                            master), waited for; its first port in RL_CLUSTER_PORT
# rl_redis_version           the redis-server version, e.g. 7.0.15
# rl_prime_gcra PORT SHA     checks every GCRA key of the sequential benchmarks
#                            (ratelimit_redis_bench's and redis-benchmark's) past
#                            its limit, so that every round runs the same path

RL_PIDS=""
RL_TEMPS=""

rl_cleanup() {
  for p in $RL_PIDS; do kill -9 "$p" 2>/dev/null || true; done
  for t in $RL_TEMPS; do rm -rf "$t"; done
}
trap rl_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rl_bench() {
  [ -x "$1/benchmarks/redis/$2" ] ||
    { echo "build $1/benchmarks/redis/$2 first (cmake --build $1 --target $2)" >&2; exit 2; }
  echo "$1/benchmarks/redis/$2"
}

rl_need() {
  command -v "$1" >/dev/null || { echo "$1 not found: apt-get install ${2:-$1}" >&2; exit 2; }
}

rl_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

rl_free_cluster_port() {
  python3 -c '
import random, socket
while True:
    p = random.randint(20000, 55535)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'
}

# Both set the variable named $1 (not called in a command substitution,
# whose subshell would not pass RL_TEMPS on).
rl_temp_file() {
  rl_t=$(mktemp)
  RL_TEMPS="$RL_TEMPS $rl_t"
  eval "$1=\$rl_t"
}

rl_temp_dir() {
  rl_t=$(mktemp -d "${2:-/tmp/ratelimit-bench-XXXXXX}")
  RL_TEMPS="$RL_TEMPS $rl_t"
  eval "$1=\$rl_t"
}

# Waits up to 10 s for the server on port $1 to answer PING.
rl_wait_ping() {
  rl_i=0
  until redis-cli -p "$1" ping >/dev/null 2>&1; do
    rl_i=$((rl_i + 1))
    [ $rl_i -lt 200 ] || { echo "redis-server on port $1 did not start" >&2; exit 1; }
    sleep 0.05
  done
}

# Not in a command substitution: RL_PIDS must change in the caller's shell.
rl_start_redis() {
  rl_port=$1
  shift
  redis-server --port "$rl_port" --bind 127.0.0.1 --save '' --appendonly no --logfile '' "$@" \
    >/dev/null 2>&1 &
  RL_REDIS_PID=$!
  RL_PIDS="$RL_PIDS $RL_REDIS_PID"
  rl_wait_ping "$rl_port"
}

rl_start_cluster() {
  rl_dir=""
  rl_temp_dir rl_dir /tmp/ratelimit-cluster-bench-XXXXXX
  rl_addrs=""
  RL_CLUSTER_PORT=""
  rl_n=0
  while [ $rl_n -lt "$1" ]; do
    rl_p=$(rl_free_cluster_port)
    redis-server --port "$rl_p" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$rl_dir/nodes-$rl_p.conf" --cluster-node-timeout 1000 \
      --save '' --appendonly no --dir "$rl_dir" --logfile "$rl_dir/$rl_p.log" >/dev/null 2>&1 &
    RL_PIDS="$RL_PIDS $!"
    rl_wait_ping "$rl_p"
    rl_addrs="$rl_addrs 127.0.0.1:$rl_p"
    [ -n "$RL_CLUSTER_PORT" ] || RL_CLUSTER_PORT=$rl_p
    rl_n=$((rl_n + 1))
  done
  # shellcheck disable=SC2086
  redis-cli --cluster create $rl_addrs --cluster-replicas "$2" --cluster-yes >/dev/null
  rl_i=0
  until redis-cli -p "$RL_CLUSTER_PORT" cluster info | grep -q 'cluster_state:ok'; do
    rl_i=$((rl_i + 1))
    [ $rl_i -lt 200 ] || { echo "the cluster did not reach cluster_state:ok" >&2; exit 1; }
    sleep 0.05
  done
  sleep 1  # let every node learn the final configuration
}

rl_redis_version() {
  redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'
}

# The keys are "+1555" and 11 digits (the benchmark's) or 12
# (redis-benchmark's __rand_int__), with the arguments both pass for
# 10/15min; 11 checks each through redis-cli --pipe. A key's first 10 checks
# admit and write, about 1-2 us more per call in Redis.
rl_prime_gcra() {
  awk -v sha="$2" 'function bulk(s) { return "$" length(s) "\r\n" s "\r\n" }
    function eval(key) { printf "*10\r\n%s%s%s%s%s%s%s%s%s%s", bulk("EVALSHA"), bulk(sha), bulk("1"),
                           bulk(key), bulk(""), bulk("1"), bulk("0"), bulk("0"), bulk("90000000"), bulk("10") }
    BEGIN { for (p = 0; p < 11; p++) for (i = 0; i < 10000; i++) {
              eval(sprintf("bench:{+1555%011d}:gcra:bench", i)); eval(sprintf("bench:{+1555%012d}:gcra:bench", i)) } }' |
    redis-cli -p "$1" --pipe >/dev/null
}
