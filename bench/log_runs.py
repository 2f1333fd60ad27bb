#!/usr/bin/env python3
"""Prints a lazypin log's call records as runs of the same (api, action), in
order: count, first, median and max latency_ns of each run (the shim's own
view of each call, to set against the app's). Usage: log_runs.py LOG..."""
import json
import sys


def runs(path):
    out, cur = [], None
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type") != "call":
                continue
            key = (r["api"], r["action"], r["result"])
            if cur is None or cur[0] != key:
                cur = (key, [])
                out.append(cur)
            cur[1].append(r["latency_ns"])
    return out


for path in sys.argv[1:]:
    print("==", path)
    for (api, action, result), lat in runs(path):
        s = sorted(lat)
        print("  %-22s %-10s result=%-4s n=%-5d first_ns=%-9d median_ns=%-9d max_ns=%d" % (
            api, action, result, len(lat), lat[0], s[len(s) // 2], s[-1]))
