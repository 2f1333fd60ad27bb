#!/usr/bin/env python3
"""Benchmark of `lazypin report` on a big generated log.

    python3 bench/report_bench.py [--records N] [--keep FILE] [--check-linear]

Writes a defer-mode log of N records (default 2,000,000: a register and an
unregister per step over 64 buffers of 4K..16M, hits mostly, an LRU or idle
eviction now and then, call-site stacks), then runs the report on it in a
child process and prints wall time and the child's peak RSS
(resource.getrusage(RUSAGE_CHILDREN).ru_maxrss). Goal: 2 M records in under
10 s and 300 MB.

--check-linear also times N/4 records and fails (exit 1) if the time per
record grew more than 3x from N/4 to N: a loose check that the report stays
linear, meant for ctest (not a timing assertion).
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "scripts", "lazypin_report.py")


def generate(path, records, seed=1):
    rnd = random.Random(seed)
    sizes = [4096 << (2 * (i % 7)) for i in range(64)]
    ptrs = [0x7f0000000000 + i * (64 << 20) for i in range(64)]
    with open(path, "w") as f:
        f.write(json.dumps({"type": "header", "format": 1, "lazypin": "0.1.0", "pid": 4242,
                            "exe": "/opt/app/bench", "argv": ["./bench"], "mode": "defer",
                            "mode_requested": "defer", "mode_reason": "", "host": "benchhost",
                            "watch": "uffd", "watch_reason": "",
                            "start_unix_ns": 1764553000000000000, "driver_version": 13000,
                            "config": {"mode": "defer", "pool_bytes": 8 << 30,
                                       "pool_entries": 65536, "idle_ms": 10000}},
                           separators=(",", ":")) + "\n")
        f.write('{"type":"stack","id":1,"frames":["0x401136","0x401200"]}\n')
        f.write('{"type":"stack","id":2,"frames":["0x401180","0x401200"]}\n')
        call = ('{"type":"call","t_ns":%d,"tid":4242,"api":"%s","via":"symbol","ptr":"0x%x",'
                '"bytes":%d,"flags":0,"result":0,"latency_ns":%d,"action":"%s","evicted":0,'
                '"stack":%d}\n')
        evict = ('{"type":"evict","t_ns":%d,"tid":4243,"ptr":"0x%x","bytes":%d,"reason":"%s",'
                 '"result":0,"latency_ns":%d}\n')
        pooled = set()
        t = 0
        n = 3
        buf = []
        while n < records - 1:
            i = rnd.randrange(64)
            t += 1000
            if i in pooled:
                buf.append(call % (t, "cudaHostRegister", ptrs[i], sizes[i], 900 + rnd.randrange(300),
                                   "hit", 1))
            else:
                buf.append(call % (t, "cudaHostRegister", ptrs[i], sizes[i],
                                   50000 + sizes[i] // 100 + rnd.randrange(5000), "miss", 1))
            t += 1000
            buf.append(call % (t, "cudaHostUnregister", ptrs[i], 0, 400 + rnd.randrange(100),
                               "deferred", 2))
            pooled.add(i)
            n += 2
            if rnd.random() < 0.01 and n < records - 1:
                j = rnd.choice(sorted(pooled))
                pooled.discard(j)
                buf.append(evict % (t, ptrs[j], sizes[j], rnd.choice(("lru", "idle")),
                                    40000 + rnd.randrange(10000)))
                n += 1
            if len(buf) >= 10000:
                f.write("".join(buf))
                buf = []
        f.write("".join(buf))
        f.write('{"type":"summary","t_ns":%d,"ended_by":"exit","apis":{},"size_classes":{},'
                '"records_dropped":0}\n' % t)
    return os.path.getsize(path)


def time_report(path):
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = ru0.ru_maxrss
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, REPORT, "--json", path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit("report failed: %s" % r.stderr)
    doc = json.loads(r.stdout)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime
    return wall, cpu, max(ru.ru_maxrss, before) / 1024.0, doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--keep", metavar="FILE", help="write the log here and keep it")
    ap.add_argument("--check-linear", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        sizes = [args.records // 4, args.records] if args.check_linear else [args.records]
        per = []
        for n in sizes:
            path = args.keep if (args.keep and n == args.records) else os.path.join(d, "big-%d.jsonl" % n)
            t0 = time.monotonic()
            nbytes = generate(path, n)
            gen = time.monotonic() - t0
            wall, cpu, rss, doc = time_report(path)
            calls = doc["totals"]["calls"]
            print("records %d (%d calls, %.0f MB, generated in %.1f s): report %.2f s wall, "
                  "%.2f s CPU, peak RSS %.0f MB, %.2f us/record (load average %.1f)"
                  % (n, calls, nbytes / 1e6, gen, wall, cpu, rss, wall / n * 1e6,
                     os.getloadavg()[0]))
            per.append(cpu / n)
        if args.check_linear and per[1] > 3 * per[0]:
            print("not linear: %.2f us/record at %d, %.2f at %d"
                  % (per[0] * 1e6, sizes[0], per[1] * 1e6, sizes[1]))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
