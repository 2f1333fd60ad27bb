#!/usr/bin/env python3
"""Start-up cost of preloading liblazypin.so into programs that never call CUDA.

    python3 bench/startup.py build/shim/liblazypin.so [runs]

LD_PRELOAD reaches every process a launcher starts, so this times, each run
once without and once with LD_PRELOAD (paired, alternating), `runs` times
(default 50), and prints the medians and the median of the paired differences:
  - a C program (`int main(){return 0;}`): nothing of its own beyond libc, so
    any library the shim drags in shows;
  - /bin/true;
  - a shell script that runs 20 commands (the shim is loaded 21 times);
  - a C++ hello world (loads libstdc++ anyway, like any CUDA program).
LAZYPIN_MODE=defer throughout: the set-up waits for a CUDA call, which never comes.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

lib = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 50


def build(tmp, name, lang, source):
    src, exe = os.path.join(tmp, name + "." + lang), os.path.join(tmp, name)
    with open(src, "w") as f:
        f.write(source)
    subprocess.run(["cc" if lang == "c" else "c++", "-O2", "-o", exe, src], check=True)
    return exe


with tempfile.TemporaryDirectory() as tmp:
    c_prog = build(tmp, "empty", "c", "int main(void) { return 0; }\n")
    cxx_prog = build(tmp, "hello", "cc", '#include <iostream>\nint main() { std::cout << ""; return 0; }\n')
    script = os.path.join(tmp, "twenty.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\n" + "".join("%s\n" % c for c in ["true", "/bin/true", c_prog, "ls / >/dev/null",
                                                            "cat /dev/null", "date >/dev/null",
                                                            "uname >/dev/null", "id -u >/dev/null",
                                                            "basename /a/b >/dev/null", "dirname /a/b >/dev/null"] * 2))
    os.chmod(script, 0o755)
    programs = [("C program", [c_prog]), ("/bin/true", ["/bin/true"]),
                ("sh script, 20 commands", [script]), ("C++ hello", [cxx_prog])]
    plain = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("LAZYPIN_")}
    preloaded = dict(plain, LD_PRELOAD=lib, LAZYPIN_MODE="defer")
    print("start-up, %d paired runs each (ms): median plain, median preloaded, median of the "
          "paired differences" % runs)
    for label, argv in programs:
        times = {"plain": [], "preloaded": []}
        for _ in range(runs):
            for name, env in (("plain", plain), ("preloaded", preloaded)):
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, check=True)
                times[name].append((time.perf_counter() - t0) * 1e3)
        diffs = [b - a for a, b in zip(times["plain"], times["preloaded"])]
        print("  %-24s %8.3f %8.3f   lazypin adds %.3f ms"
              % (label, statistics.median(times["plain"]), statistics.median(times["preloaded"]),
                 statistics.median(diffs)))
