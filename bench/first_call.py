#!/usr/bin/env python3
"""The program's first intercepted call, without and with lazypin.

    python3 bench/first_call.py [--runs N] [--sim BUILD/simcuda] [--lib LIB] [APP ARGS...]

Runs APP (default: the build's testapps/seed_shared, the forum post's program)
bare, under lazypin in log mode and in defer mode, interleaved (bare, log,
defer, bare, ...), N times each, and prints the median (and quartiles) of the
first "Host register:" time the program prints, and each mode's median minus
the bare one: what lazypin costs the program in that call (it sets itself up
earlier, inside CUDA's start-up, where the program uses cudart). Then, from the
log's first call record, the driver's (or the pool's) part of the call and
lazypin's own (the rest: the hook, the record, its stack).

--sim prepends the simulated CUDA stack to LD_LIBRARY_PATH (no GPU needed);
on a GPU machine leave it out and pass the static-cudart app (testapps/seed).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", "build")
REGISTER = re.compile(r"Host register:\s+(\d+) ns")


def first_register_ns(argv, env):
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    m = REGISTER.search(out)
    if m is None:
        sys.exit("no 'Host register:' line in the output of %s:\n%s" % (" ".join(argv), out))
    return int(m.group(1))


def first_call_record(directory):
    """The first "call" record of the log written into `directory` (None if none)."""
    for f in sorted(os.listdir(directory)):
        with open(os.path.join(directory, f), errors="replace") as log:
            for line in log:
                if '"type":"call"' in line:
                    return json.loads(line)
    return None


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--lib", default=os.path.join(BUILD, "shim", "liblazypin.so"))
    p.add_argument("--sim", nargs="?", const=os.path.join(BUILD, "simcuda"), default=None,
                   help="the simulated stack's directory (default: build/simcuda)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable for the lazypin runs (e.g. LAZYPIN_STACKS=0); repeatable")
    p.add_argument("app", nargs=argparse.REMAINDER)
    opts = p.parse_args()
    argv = opts.app or [os.path.join(BUILD, "testapps", "seed_shared")]
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAZYPIN_") and k != "LD_PRELOAD"}
    if opts.sim:
        base["LD_LIBRARY_PATH"] = ":".join(
            [os.path.abspath(opts.sim)] + [d for d in base.get("LD_LIBRARY_PATH", "").split(":") if d])
        base["SIMCUDA_SLEEP"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        envs = {"bare": base}
        for mode in ("log", "defer"):
            envs[mode] = dict(base, LD_PRELOAD=os.path.abspath(opts.lib), LAZYPIN_MODE=mode,
                              LAZYPIN_SUMMARY="0", LAZYPIN_LOG=os.path.join(tmp, "lp-%p.jsonl"),
                              **dict(kv.split("=", 1) for kv in opts.env))
        times = {name: [] for name in envs}
        parts = {name: [] for name in envs if name != "bare"}
        for _ in range(opts.runs):
            for name, env in envs.items():
                times[name].append(first_register_ns(argv, env))
                if name != "bare":
                    first = first_call_record(tmp)
                    if first is not None:
                        parts[name].append((first["t_ns"], first["latency_ns"], times[name][-1]))
                for f in os.listdir(tmp):
                    os.unlink(os.path.join(tmp, f))
    bare = statistics.median(times["bare"])
    print("first register of %s, %d runs each, interleaved (us: p25 / median / p75)%s:"
          % (os.path.basename(argv[0]), opts.runs, " with " + " ".join(opts.env) if opts.env else ""))
    for name, xs in times.items():
        lo, mid, hi = quartiles(xs)
        extra = "" if name == "bare" else ", lazypin adds %.1f us" % ((mid - bare) / 1e3)
        print("  %-5s %10.1f / %10.1f / %10.1f%s" % (name, lo / 1e3, mid / 1e3, hi / 1e3, extra))
    # The log's first call record: its latency_ns is the driver's (or the
    # pool's) part of the call; the rest of the program's time for it is
    # lazypin's own (the hook, the record, its stack; set-up too where it ran
    # inside the call: a program that reaches the driver without the getter).
    print("inside the first call (us, medians of the log's first call record):")
    for name, xs in parts.items():
        if not xs:
            continue
        med = lambda v: statistics.median(v) / 1e3
        print("  %-5s the driver (or pool) call %8.1f, lazypin's own %8.1f"
              % (name, med([l for _, l, _ in xs]), med([a - l for _, l, a in xs])))

if __name__ == "__main__":
    main()
