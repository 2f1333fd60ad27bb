#!/usr/bin/env python3
"""package_test BUILD_DIR FIXTURE: builds the packages with `scripts/pack
--deb` (the .deb and its -dbg), installs them into a fresh root with dpkg -x
and runs the installed tools from there: the control file recommends
binutils, the library is stripped and its debug information is in the -dbg
package under its build id, `lazypin --print-lib` names the installed
library, `lazypin run --sim` runs the build's seed_shared on the installed
simulated stack and writes a log that the installed `lazypin report`
reports, `lazypin report` reports FIXTURE, and the man page has its sections.
Exit 77 (skipped) without dpkg-deb, objcopy or fakeroot. Standard library only."""

import glob
import os
import shutil
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("%s: rc %d\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r


def main(build, fixture):
    missing = [t for t in ("dpkg-deb", "objcopy", "readelf", "fakeroot") if not shutil.which(t)]
    if missing:
        print("no %s: skipped" % ", ".join(missing))
        return 77
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    out = tempfile.mkdtemp(prefix="lazypin-pack-")
    try:
        return check(src, build, fixture, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def check(src, build, fixture, dist):
    run([os.path.join(src, "scripts", "pack"), "--deb", os.path.abspath(build)],
        env=dict(os.environ, PACK_OUT=dist))
    debs = sorted(glob.glob(os.path.join(dist, "lazypin_*.deb")))
    dbgs = sorted(glob.glob(os.path.join(dist, "lazypin-dbg_*.deb")))
    if len(debs) != 1 or len(dbgs) != 1:
        sys.exit("scripts/pack --deb made %r %r" % (debs, dbgs))
    info = run(["dpkg-deb", "-I", debs[0]]).stdout
    for want in ("Package: lazypin", "Depends: python3", "Recommends: binutils"):
        if want not in info:
            sys.exit("control lacks %r:\n%s" % (want, info))
    with tempfile.TemporaryDirectory(prefix="lazypin-deb-") as d:
        root = os.path.join(d, "root")
        for deb in debs + dbgs:
            run(["dpkg-deb", "-x", deb, root])
        lib = os.path.join(root, "usr", "lib", "liblazypin.so")
        sections = run(["readelf", "-S", lib]).stdout
        if ".debug_info" in sections:
            sys.exit("the packaged library is not stripped")
        build_id = [l.split()[-1] for l in run(["readelf", "-n", lib]).stdout.splitlines()
                    if "Build ID" in l][0]
        dbg = os.path.join(root, "usr", "lib", "debug", ".build-id", build_id[:2], build_id[2:] + ".debug")
        if not os.path.isfile(dbg) or ".debug_info" not in run(["readelf", "-S", dbg]).stdout:
            sys.exit("no debug information for build id %s in the -dbg package" % build_id)
        lazypin = os.path.join(root, "usr", "bin", "lazypin")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYPIN_") and k != "LD_PRELOAD"}
        got = run([sys.executable, lazypin, "--print-lib"], env=env).stdout.strip()
        if got != lib:
            sys.exit("--print-lib printed %r, not the installed library %s" % (got, lib))
        out = run([sys.executable, lazypin, "run", "--dry-run", "--log", d, "--watch", "kernel", "x"],
                  env=env, cwd=d).stdout
        if "LAZYPIN_WATCH=kernel" not in out or "LAZYPIN_LOG=%s/lazypin-%%e-%%h-%%p.jsonl" % d not in out:
            sys.exit("the installed runner printed:\n" + out)
        seed = os.path.join(os.path.abspath(build), "testapps", "seed_shared")
        if os.path.exists(seed):
            logs = os.path.join(d, "logs")
            os.mkdir(logs)
            r = run([sys.executable, lazypin, "run", "--sim", "--defer", "--log", logs + "/", seed,
                     "--repeat", "3"], env=env, cwd=d)
            sim = os.path.join(root, "usr", "libexec", "lazypin", "simcuda")
            if "lazypin: 1 log:" not in r.stderr:
                sys.exit("the installed lazypin run --sim:\n" + r.stderr)
            out = run([sys.executable, lazypin, "run", "--sim", "--dry-run", "x"], env=env, cwd=d).stdout
            if "LD_LIBRARY_PATH=" + sim not in out:
                sys.exit("--sim does not use the installed simulated stack:\n" + out)
            out = run([sys.executable, lazypin, "report", logs], env=env).stdout
            if "seed_shared" not in out or "== pool" not in out:
                sys.exit("the installed report of the --sim run printed:\n" + out)
        else:
            print("no %s: lazypin run --sim not tried" % seed)
        out = run([sys.executable, lazypin, "report", fixture], env=env).stdout
        if "pool: 18 hits / 20 registers" not in out:
            sys.exit("the installed report printed:\n" + out)
        man = os.path.join(root, "usr", "share", "man", "man1", "lazypin.1")
        doc = os.path.join(root, "usr", "share", "doc", "lazypin", "log-format.md")
        for f in (man, doc):
            if not os.path.isfile(f):
                sys.exit("not in the package: " + f)
        with open(man) as f:
            text = f.read()
        for want in (".SH ENVIRONMENT", ".SH EXIT STATUS", ".SH FILES", ".SH EXAMPLES", "LAZYPIN_POOL_BYTES"):
            if want not in text:
                sys.exit("the man page lacks %r" % want)
        print("ok: %s (%d bytes), %s; installed under %s" % (
            os.path.basename(debs[0]), os.path.getsize(debs[0]), os.path.basename(dbgs[0]), root))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
