#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Diagnosis: what keeps two threads on distinct keys of one memory_store from doubling the work.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/core/two_threads/run.sh [ROUNDS]

Copies this tree's memory_store into a temporary header as memory_store_x,
whose shard lock is a template parameter, compiles main.cpp against it and
runs it (default 60 rounds). main.cpp times one thread on 100,000 keys and
two threads on distinct halves of them, for the floor (a shared
unordered_map, no lock), memory_store, and copies of it with the shard
lock removed or replaced (see main.cpp). The copies without a real lock are
wrong under contention and exist only to be measured. Needs g++ with C++20.
USAGE
}

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  usage
  exit 0
fi
rounds="${1:-60}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The class template only (the options and enums come from the real header),
# renamed, with detail::spin_lock replaced by a template parameter and, when
# PadLock, the bucket pointer moved off the lock's cache line.
{
  echo '#pragma once'
  echo '#include "ratelimit/store/memory_store.hpp"'
  echo 'namespace ratelimit {'
  sed -n '/^\/\/\/ Holds the state of policy P/,/^};$/p' "$root/include/ratelimit/store/memory_store.hpp" |
    sed -e 's/detail::spin_lock/Lock/g' \
        -e 's/^template <policy P>$/template <policy P, class Lock = detail::spin_lock, bool PadLock = false>/' \
        -e 's/^class memory_store {/class memory_store_x {/' \
        -e 's/memory_store(/memory_store_x(/g' \
        -e 's/memory_store&/memory_store_x\&/g' \
        -e 's/~memory_store()/~memory_store_x()/' \
        -e 's/^    node\*\* buckets = nullptr;/    alignas(PadLock ? 64 : 8) node** buckets = nullptr;/'
  echo '}  // namespace ratelimit'
} >"$work/memory_store_x.hpp"
grep -q 'class memory_store_x {' "$work/memory_store_x.hpp"
grep -q 'alignas(PadLock' "$work/memory_store_x.hpp"

g++ -O3 -DNDEBUG -std=gnu++20 -pthread -I"$root/include" -I"$work" -I"$here" \
  "$here/main.cpp" -o "$work/two_threads"
"$work/two_threads" "$rounds"
