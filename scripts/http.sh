#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds ratelimit-http-example in Release into ./build/http and starts it (the HTTP API example).
#
# Usage: scripts/http.sh            serve on http://127.0.0.1:8080, in-process store, built-in tiers
#        scripts/http.sh ARGS...    ratelimit-http-example ARGS... (e.g. --help, --store redis://HOST:PORT)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build/http"

bash "$root/scripts/deps.sh" >&2
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DRATELIMIT_BUILD_TESTS=OFF \
  -DRATELIMIT_BUILD_EXAMPLES=ON -DRATELIMIT_REDIS=ON >&2
cmake --build "$build_dir" -j2 --target ratelimit_http_example >&2

exec "$build_dir/examples/http/ratelimit-http-example" "$@"
