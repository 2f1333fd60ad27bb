#!/usr/bin/env python3
"""package_test BUILD_DIR FIXTURE: builds the .deb with cpack, extracts it
with dpkg -x into a clean directory and runs the extracted tools from there:
`lazypin --print-lib` must name the extracted library, `lazypin run` must
take its flags from the extracted lazypin-options, `lazypin report` must
report FIXTURE, and the man page and docs must be in the package.
Exit 77 (skipped) without dpkg-deb. Standard library only."""

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
    if not shutil.which("dpkg-deb"):
        print("no dpkg-deb: skipped")
        return 77
    run(["cmake", "--build", build, "--target", "lazypin", "lazypin_options", "lazypin_man"])
    with tempfile.TemporaryDirectory(prefix="lazypin-deb-") as d:
        run(["cpack", "-G", "DEB", "--config", os.path.join(build, "CPackConfig.cmake"), "-B", d])
        debs = glob.glob(os.path.join(d, "*.deb"))
        if len(debs) != 1:
            sys.exit("cpack made %r" % debs)
        info = run(["dpkg-deb", "-I", debs[0]]).stdout
        for want in ("Package: lazypin", "Depends:", "python3"):
            if want not in info:
                sys.exit("control lacks %r:\n%s" % (want, info))
        root = os.path.join(d, "root")
        run(["dpkg-deb", "-x", debs[0], root])
        lazypin = os.path.join(root, "usr", "bin", "lazypin")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYPIN_") and k != "LD_PRELOAD"}
        lib = run([sys.executable, lazypin, "--print-lib"], env=env).stdout.strip()
        if not (lib.startswith(root + os.sep) and lib.endswith("liblazypin.so") and os.path.isfile(lib)):
            sys.exit("--print-lib printed %r, not the extracted library under %s" % (lib, root))
        tool = os.path.join(root, "usr", "libexec", "lazypin", "lazypin-options")
        if not os.access(tool, os.X_OK):
            sys.exit("not in the package: " + tool)
        out = run([sys.executable, lazypin, "run", "--dry-run", "--log", d, "--watch", "kernel", "x"],
                  env=env, cwd=d).stdout
        if "LAZYPIN_WATCH=kernel" not in out or "LAZYPIN_LOG=%s/lazypin-%%e-%%h-%%p.jsonl" % d not in out:
            sys.exit("the extracted runner printed:\n" + out)
        out = run([sys.executable, lazypin, "report", fixture], env=env).stdout
        if "pool: 18 hits / 20 registers" not in out:
            sys.exit("the extracted report printed:\n" + out)
        man = os.path.join(root, "usr", "share", "man", "man1", "lazypin.1")
        doc = os.path.join(root, "usr", "share", "doc", "lazypin", "log-format.md")
        for f in (man, doc):
            if not os.path.isfile(f):
                sys.exit("not in the package: " + f)
        with open(man) as f:
            text = f.read()
            if "lazypin run" not in text or "\\-\\-watch" not in text and "--watch" not in text:
                sys.exit("the man page lacks the run help")
        print("ok: %s (%d bytes); --print-lib %s" % (os.path.basename(debs[0]),
                                                     os.path.getsize(debs[0]), lib))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
