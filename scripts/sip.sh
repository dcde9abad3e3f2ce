#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds sip-front-door in Release into ./build/sip and starts it (the SIP front door example).
#
# Usage: scripts/sip.sh            listen on udp 127.0.0.1:5060, in-process store, 10/15min, 2 calls
#        scripts/sip.sh ARGS...    sip-front-door ARGS... (e.g. --help, --store redis://HOST:PORT)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="$root/build/sip"

bash "$root/scripts/deps.sh" >&2
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DRATELIMIT_BUILD_TESTS=OFF \
  -DRATELIMIT_BUILD_EXAMPLES=ON -DRATELIMIT_REDIS=ON >&2
cmake --build "$build_dir" -j2 --target sip_front_door >&2

if [ $# -eq 0 ]; then
  set -- --listen 127.0.0.1:5060 --rate 10/15min --max-calls 2
fi
exec "$build_dir/examples/sip/sip-front-door" "$@"
