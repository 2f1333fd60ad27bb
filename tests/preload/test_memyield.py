"""Kept memory yields to the program: testapps/memyield.cu in a memory cgroup
of its own, bare vs defer. The program gives back 22% of the limit (a pinned
host block freed with cudaFreeHost, a registered block unregistered and freed,
an auto-pinned block freed) and then uses 80% of it (malloc'd 64 MiB pieces,
one mmap(MAP_POPULATE), pages of a mapping made before, 64 KiB pieces). Bare it
survives; under defer it must too (exit 0, same output), while lazypin did keep
the memory first (the log says so) and released it for pressure.

The cgroup is made by the test: cgroup v2 with the memory controller
(memory.max), else v1 (memory.limit_in_bytes); the test is skipped, saying
why, where neither can be made (not root, no memory controller). The same
runs on the GPU machine: MEMYIELD_APP=build/testapps/memyield (static cudart)
MEMYIELD_LIMITS=16G python3 -m unittest test_memyield (see scripts/gpu-suite).
Environment as test_preload.py.
"""
import os
import subprocess
import unittest

from test_preload import AppTestCase, app

KINDS = {  # --kind: the variables that make defer mode keep that much
    "hostcache": {},
    "reuse": {"LAZYPIN_REUSE_FREED": "30%"},
    "autopin": {"LAZYPIN_AUTOPIN": "1", "LAZYPIN_AUTOPIN_BYTES": "30%",
                "LAZYPIN_REUSE_FREED": "30%"},
}
HOWS = ("malloc", "populate", "touch", "small")


def parse_size(text):
    units = {"K": 10, "M": 20, "G": 30}
    return int(text[:-1]) << units[text[-1]] if text[-1] in units else int(text)


class Cgroup:
    """A memory cgroup of `limit` bytes, made here and removed on close."""

    def __init__(self, limit):
        self.path = None
        self.limit = limit
        name = "lazypin-memyield-%d" % os.getpid()
        v2 = "/sys/fs/cgroup"
        v1 = "/sys/fs/cgroup/memory"
        if os.path.exists(os.path.join(v2, "cgroup.controllers")):
            with open(os.path.join(v2, "cgroup.controllers")) as f:
                if "memory" not in f.read().split():
                    raise unittest.SkipTest("cgroup v2 without the memory controller")
            try:
                with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
            except OSError:
                pass
            self.path, self.limit_file = os.path.join(v2, name), "memory.max"
            self.extra = {"memory.swap.max": "0"}
        elif os.path.isdir(v1):
            self.path, self.limit_file = os.path.join(v1, name), "memory.limit_in_bytes"
            self.extra = {}
        else:
            raise unittest.SkipTest("no memory cgroup (neither v2's memory controller nor v1's)")
        try:
            os.mkdir(self.path)
            with open(os.path.join(self.path, self.limit_file), "w") as f:
                f.write(str(limit))
            for key, value in self.extra.items():
                if os.path.exists(os.path.join(self.path, key)):
                    with open(os.path.join(self.path, key), "w") as f:
                        f.write(value)
        except OSError as e:
            self.close()
            raise unittest.SkipTest("cannot make a memory cgroup: %s" % e)

    def enter(self):
        """For preexec_fn: moves the child into the cgroup."""
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def close(self):
        if self.path and os.path.isdir(self.path):
            try:
                os.rmdir(self.path)
            except OSError:
                pass


class MemYieldTest(AppTestCase):
    APP = os.environ.get("MEMYIELD_APP") or app("memyield_shared")
    LIMITS = [parse_size(s) for s in os.environ.get("MEMYIELD_LIMITS", "2G").split(",")]

    def run_in_cgroup(self, limit, argv, shim, **env):
        group = Cgroup(limit)
        try:
            return self.run_app([self.APP] + argv, shim=shim, preexec=group.enter, timeout=300,
                                SIMCUDA_SLEEP=0, **env)
        finally:
            group.close()

    def check(self, kind, how, limit, keep=0.22, demand=0.80):
        argv = ["--kind", kind, "--keep", str(int(limit * keep)),
                "--demand", str(int(limit * demand)), "--how", how]
        bare = self.run_in_cgroup(limit, argv, shim=False)
        self.assertEqual(bare.rc, 0, "bare run: %d %s" % (bare.rc, bare.err[-2000:]))
        run = self.run_in_cgroup(limit, argv, shim=True, LAZYPIN_MODE="defer", **KINDS[kind])
        self.assertNotEqual(run.rc, -9, "killed under defer (%s, %s, %d)" % (kind, how, limit))
        self.assertEqual(run.rc, 0, run.err[-2000:])
        self.assertEqual(run.out, bare.out)
        # lazypin kept it first, and gave it back for pressure.
        released = [r for r in run.records if r.get("type") in ("evict", "host_release")
                    and r.get("reason") == "pressure"]
        self.assertTrue(released, "nothing was released for pressure: was anything kept?")
        summary = [r for r in run.records if r.get("type") == "summary"]
        self.assertTrue(summary)
        return run

    def test_host_cache(self):
        for limit in self.LIMITS:
            for how in HOWS:
                with self.subTest(limit=limit, how=how):
                    self.check("hostcache", how, limit)

    def test_reuse_freed(self):
        for limit in self.LIMITS:
            for how in ("malloc", "populate", "touch"):
                with self.subTest(limit=limit, how=how):
                    self.check("reuse", how, limit)

    def test_autopin(self):
        for limit in self.LIMITS:
            for how in ("malloc", "touch"):
                with self.subTest(limit=limit, how=how):
                    self.check("autopin", how, limit)

    def test_burst_of_most_headroom(self):
        # One MAP_POPULATE of nearly all that is left once the block is kept.
        for limit in self.LIMITS:
            with self.subTest(limit=limit):
                self.check("hostcache", "populate", limit, keep=0.24, demand=0.72)

    def test_small_limit(self):
        # Under the margin from the start: nothing is kept at all, and the
        # program runs as bare.
        limit = 256 << 20
        argv = ["--kind", "hostcache", "--keep", str(limit // 4), "--demand",
                str(limit * 6 // 10), "--how", "malloc"]
        bare = self.run_in_cgroup(limit, argv, shim=False)
        self.assertEqual(bare.rc, 0, bare.err[-2000:])
        run = self.run_in_cgroup(limit, argv, shim=True, LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err[-2000:])
        self.assertEqual(run.out, bare.out)

    def test_plentiful_memory_keeps(self):
        # Far from the limit the cache keeps and serves as before.
        limit = max(self.LIMITS)
        argv = ["--kind", "hostcache", "--keep", str(16 << 20), "--cycles", "5",
                "--demand", str(16 << 20), "--how", "malloc"]
        run = self.run_in_cgroup(limit, argv, shim=True, LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err[-2000:])
        hits = [r for r in run.records if r.get("type") == "call" and r.get("action") == "hit"]
        self.assertEqual(len(hits), 4, [r for r in run.records if r.get("type") == "call"])
        self.assertFalse([r for r in run.records if r.get("reason") == "pressure"])


if __name__ == "__main__":
    unittest.main()
