#!/usr/bin/env python3
"""savings_agreement.py BUILD_DIR [--runs N] [--sim]: does the saving lazypin
reports agree with what was measured?

For each program (the seed, a single-buffer loop, pageable copies under
auto-pin, a Python client through ctypes), runs it N times in log mode (bare
calls, timed) and N times in defer mode, alternating, and prints per program:
  - the median wall time of each mode and their difference (what the user
    gains; noisy, it includes everything the program does);
  - the saving the shim's exit summary printed for each defer run (its
    estimate from the defer log alone; the report prints the same);
  - the measured saving of `lazypin report LOG --compare DEFER_LOG`: the time
    the log-mode run spent in registration calls minus the defer run's.
--sim runs on the build's simulated CUDA stack (build/simcuda). Standard
library only. On the H200: python3 bench/savings_agreement.py build --runs 5
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "scripts", "lazypin_report.py")
POOL_LINE = re.compile(r"^lazypin: pool: .*? evicted, peak \d+ entries / \d+ bytes, (.*)$", re.M)
PY_CLIENT = r"""
import ctypes, ctypes.util, sys
rt = ctypes.CDLL(sys.argv[2])
n = 4 << 20
buf = ctypes.create_string_buffer(n)
for _ in range(int(sys.argv[1])):
    assert rt.cudaHostRegister(buf, n, 0) == 0
    assert rt.cudaHostUnregister(buf) == 0
"""


def programs(build, sim):
    apps = os.path.join(build, "testapps")
    suffix = "_shared" if sim else ""
    cudart = (os.path.join(build, "simcuda", "libcudart.so.13") if sim else "libcudart.so")
    return [
        ("seed", [os.path.join(apps, "seed" + suffix), "--repeat", "20"], {}),
        ("loop", [os.path.join(apps, "loop" + suffix), "--sizes", "1M,4M", "--iters", "200",
                  "--modes", "reg"], {}),
        ("pageable", [os.path.join(apps, "pageable" + suffix), "--sizes", "64M", "--repeat", "10"],
         {"LAZYPIN_AUTOPIN": "1"}),
        ("python", [sys.executable, "-c", PY_CLIENT, "300", cudart], {}),
    ]


def run(build, argv, mode, logdir, sim, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYPIN_") and k != "LD_PRELOAD"}
    env["LD_PRELOAD"] = os.path.join(build, "shim", "liblazypin.so")
    env["LAZYPIN_MODE"] = mode
    env["LAZYPIN_LOG"] = os.path.join(logdir, "%s-%%p.jsonl" % mode)
    if sim:
        env["LD_LIBRARY_PATH"] = os.path.join(build, "simcuda")
    if mode == "defer":
        env.update(extra)
    before = set(glob.glob(os.path.join(logdir, "*.jsonl")))
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit("%s (%s): rc %d\n%s" % (argv[0], mode, r.returncode, r.stderr[-2000:]))
    log = sorted(set(glob.glob(os.path.join(logdir, "*.jsonl"))) - before)
    m = POOL_LINE.search(r.stderr)
    return wall, (log[0] if log else None), (m.group(1) if m else None)


def measured(bare, pooled):
    r = subprocess.run([sys.executable, REPORT, "--json", bare, "--compare", pooled],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None
    s = json.loads(r.stdout)["comparison"]["saving"]
    return s["saved_ns"] if s else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    rows = []
    for name, argv, extra in programs(a.build, a.sim):
        if a.only and name not in a.only.split(","):
            continue
        if not os.path.exists(argv[0]):
            print("skipping %s: %s not built" % (name, argv[0]))
            continue
        walls = {"log": [], "defer": []}
        est, meas = [], []
        with tempfile.TemporaryDirectory(prefix="lazypin-agree-") as d:
            for i in range(a.runs):
                wb, lb, _ = run(a.build, argv, "log", d, a.sim, extra)
                wd, ld, line = run(a.build, argv, "defer", d, a.sim, extra)
                walls["log"].append(wb)
                walls["defer"].append(wd)
                if line:
                    est.append(line)
                if lb and ld:
                    m = measured(lb, ld)
                    if m is not None:
                        meas.append(m / 1e6)
        mb, md = statistics.median(walls["log"]), statistics.median(walls["defer"])
        rows.append((name, mb, md, est, meas))
        print("%-9s wall log %.3f s (%.3f-%.3f), defer %.3f s (%.3f-%.3f): %+.1f ms"
              % (name, mb, min(walls["log"]), max(walls["log"]), md, min(walls["defer"]),
                 max(walls["defer"]), (mb - md) * 1e3))
        if meas:
            print("          measured in calls (--compare): median %.1f ms (%.1f-%.1f)"
                  % (statistics.median(meas), min(meas), max(meas)))
        for e in est:
            print("          exit summary: " + e)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
