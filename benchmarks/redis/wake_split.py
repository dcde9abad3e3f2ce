#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Wake-ups of a Redis client and redis-server, from `perf sched script`.

For every wake-up of a task whose name starts with one of NAMES (default:
redis-server, redis-benchmark, ratelimit_redis): whether it woke on the vCPU
of the task that woke it (`same`) or on the other (`remote`), whether that
vCPU was idle at the time, and how long it took from the wake-up to the task
running (p50, p90). A round trip on a quiet machine with both tasks on one
vCPU takes two `same` wake-ups; on two vCPUs, two `remote` ones of an idle
vCPU.

Usage:
  perf sched record -o client.data -- CLIENT...      (while redis-server runs)
  perf sched script -i client.data | benchmarks/redis/wake_split.py [NAMES...]
"""
import collections
import re
import sys


def main():
    names = tuple(sys.argv[1:]) or ("redis-server", "redis-benchmark", "ratelimit_redis")
    running = {}  # cpu -> name of the task running there
    pending = {}  # pid -> (time of the wake-up, target cpu, target idle, name, waker cpu)
    delays = collections.defaultdict(list)
    head = re.compile(r"\s*(.+?)\s+(\d+) \[(\d+)\]\s+([\d.]+):\s+sched:(\S+):")
    waking = re.compile(r"comm=(\S+) pid=(\d+) prio=\d+ target_cpu=(\d+)")
    switch = re.compile(r"prev_comm=.+? prev_pid=\d+ .* ==> next_comm=(.+?) next_pid=(\d+)")
    for line in sys.stdin:
        m = head.match(line)
        if not m:
            continue
        cpu, t, event = int(m.group(3)), float(m.group(4)), m.group(5)
        if event == "sched_waking":
            w = waking.search(line)
            if w and w.group(1).startswith(names):
                target = int(w.group(3))
                idle = running.get(target, "").startswith("swapper")
                pending[w.group(2)] = (t, target, idle, w.group(1), cpu)
        elif event == "sched_switch":
            s = switch.search(line)
            if not s:
                continue
            running[cpu] = s.group(1)
            got = pending.pop(s.group(2), None)
            if got is not None:
                t0, target, idle, name, waker = got
                kind = ("same" if target == waker else "remote") + (", idle" if idle else ", busy")
                delays[(name, kind)].append((t - t0) * 1e6)
    for (name, kind), v in sorted(delays.items()):
        v.sort()
        print(f"{name:16s} {kind:13s} {len(v):7d} wake-ups  p50 {v[len(v) // 2]:6.1f} us"
              f"  p90 {v[int(len(v) * 0.9)]:6.1f} us")


if __name__ == "__main__":
    main()
