#!/usr/bin/env python3
"""Startup cost of preloading liblazypin.so into a program that never calls CUDA.

    python3 bench/startup.py build/shim/liblazypin.so [runs]

Builds a C++ hello world (it loads libstdc++ like any CUDA program), then runs it
alternately without and with LD_PRELOAD and prints the medians and the difference.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

lib = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 300
with tempfile.TemporaryDirectory() as tmp:
    src, exe = os.path.join(tmp, "hello.cc"), os.path.join(tmp, "hello")
    with open(src, "w") as f:
        f.write('#include <iostream>\nint main() { std::cout << ""; return 0; }\n')
    subprocess.run(["c++", "-O2", "-o", exe, src], check=True)
    plain = dict(os.environ)
    plain.pop("LD_PRELOAD", None)
    preloaded = dict(plain, LD_PRELOAD=lib, LAZYPIN_MODE="defer")
    times = {"plain": [], "preloaded": []}
    for _ in range(runs):
        for name, env in (("plain", plain), ("preloaded", preloaded)):
            t0 = time.perf_counter()
            subprocess.run([exe], env=env, check=True)
            times[name].append((time.perf_counter() - t0) * 1e3)
    a, b = statistics.median(times["plain"]), statistics.median(times["preloaded"])
    print("startup, median of %d runs: plain %.3f ms, preloaded %.3f ms, lazypin adds %.3f ms"
          % (runs, a, b, b - a))
