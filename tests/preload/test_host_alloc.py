"""The host-allocation cache on the simulated stack: testapps/hostalloc.cu's
pinned allocations and frees through every door (runtime symbol, linked
driver, cuGetProcAddress, dlsym), bare vs log vs defer.

What the program sees must not change (codes, flags, bytes, pointer queries
after a free, a double free, the implicit wait of a free, a fork); the log
says what lazypin did (one record per program call, hits after the first
cycle, bounds, idle release). Environment as test_preload.py.
"""
import collections
import os
import subprocess
import sys
import unittest

from test_preload import AppTestCase, app, calls, SRC
from nvtx_timeline import lazypin_timeline  # noqa: E402  (tests/pylib, on the path by test_preload)

DOORS = {  # --path: (api prefix of the records, via)
    "runtime": ("cuda", "symbol"),
    "driver": ("cuMem", "symbol"),
    "getproc": ("cuMem", "getproc"),
    "dlsym": ("cuMem", "dlsym"),
}
HOST_APIS = {"cudaHostAlloc", "cudaMallocHost", "cudaFreeHost", "cuMemHostAlloc",
             "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemFreeHost"}


def host_calls(records):
    return [r for r in calls(records) if r["api"] in HOST_APIS]


def is_free(rec):
    return rec["api"].endswith("FreeHost")


def releases(records):
    return collections.Counter(r["reason"] for r in records if r["type"] == "host_release")


class HostAllocTest(AppTestCase):
    def hostalloc(self, *args, shim=True, **env):
        return self.run_app([app("hostalloc_shared")] + list(args), shim=shim, **env)

    # -- transparent: the same output bare, in log mode and in defer mode ------
    def check_door(self, path):
        # Simulated durations on: the implicit wait of a free is observable.
        bare = self.hostalloc("--path", path, "--check", "--fork", "--fork-child-cuda", shim=False,
                              SIMCUDA_SLEEP=1)
        self.assertEqual(bare.rc, 0, bare.out + bare.err)
        self.assertNotIn("FAIL", bare.out)
        prefix, via = DOORS[path]
        per_mode = {}
        for mode in ("log", "defer"):
            run = self.hostalloc("--path", path, "--check", "--fork", "--fork-child-cuda",
                                 LAZYPIN_MODE=mode, SIMCUDA_SLEEP=1)
            self.assertEqual(run.rc, 0, run.out + run.err)
            self.assertEqual(run.out, bare.out, "output changed under lazypin (%s)" % mode)
            recs = host_calls(run.records)
            self.assertTrue(recs)
            for r in recs:
                self.assertTrue(r["api"].startswith(prefix), r)
                self.assertEqual(r["via"], via, r)
            per_mode[mode] = recs
        # One record per program call, whatever lazypin did with it.
        self.assertEqual([(r["api"], r["result"]) for r in per_mode["log"]],
                         [(r["api"], r["result"]) for r in per_mode["defer"]])
        self.assertTrue(all(r["action"] == "forward" for r in per_mode["log"]))
        actions = collections.Counter(r["action"] for r in per_mode["defer"])
        self.assertGreater(actions["hit"], 0, actions)
        self.assertGreater(actions["deferred"], 0, actions)
        # Every successful allocation names its block; frees carry no size.
        for r in per_mode["defer"]:
            if is_free(r):
                self.assertEqual(r["bytes"], 0, r)
            elif r["result"] == 0:
                self.assertNotEqual(int(r["ptr"], 16), 0, r)
        return run

    def test_runtime(self):
        run = self.check_door("runtime")
        rel = releases(run.records)
        # Queries of a freed block and a double free freed the cached block first;
        # the fork released what was cached (the child is the driver's alone).
        self.assertGreater(rel["query"], 0, rel)
        self.assertGreater(rel["double_free"], 0, rel)
        self.assertGreater(rel["fork"], 0, rel)

    def test_driver_linked(self):
        self.check_door("driver")

    def test_driver_getproc(self):
        self.check_door("getproc")

    def test_driver_dlsym(self):
        self.check_door("dlsym")

    def test_free_without_the_wait_is_not_complete(self):
        # LAZYPIN_UNREGISTER_WAIT=0 drops the implicit wait (README): the
        # check that a copy in flight is complete after a free then fails.
        run = self.hostalloc("--path", "runtime", "--check", LAZYPIN_MODE="defer",
                             LAZYPIN_UNREGISTER_WAIT=0, SIMCUDA_SLEEP=1)
        self.assertIn("CHECK runtime free_waits", run.out)
        self.assertIn("free_waits 0 0 0 600 FAIL", run.out)

    # -- cycles hit ------------------------------------------------------------
    def test_cycles_hit_after_the_first(self):
        for path in DOORS:
            run = self.hostalloc("--path", path, "--bench", "--sizes", "4M,1M", "--cycles", "12",
                                 LAZYPIN_MODE="defer")
            self.assertEqual(run.rc, 0, run.err)
            allocs = [r for r in host_calls(run.records) if not is_free(r)]
            frees = [r for r in host_calls(run.records) if is_free(r)]
            # Per size: 12 cycles then one kept block: the first is a miss, the rest hits.
            self.assertEqual([r["action"] for r in allocs],
                             (["miss"] + ["hit"] * 12) * 2, path)
            self.assertTrue(all(r["action"] == "deferred" and r["result"] == 0 for r in frees))
            summary = run.records[-1]
            self.assertEqual(summary["type"], "summary")
            self.assertEqual(summary["host_alloc"]["hits"], 24)
            self.assertEqual(summary["host_alloc"]["misses"], 2)
            self.assertEqual(summary["host_alloc"]["zeroed_bytes"], 12 * 5 << 20)

    def test_off_and_log_mode_forward_everything(self):
        for extra in ({"LAZYPIN_MODE": "defer", "LAZYPIN_HOST_ALLOC_CACHE": "0"},
                      {"LAZYPIN_MODE": "log"}):
            run = self.hostalloc("--path", "runtime", "--bench", "--sizes", "1M", "--cycles", "5",
                                 **extra)
            self.assertEqual(run.rc, 0, run.err)
            self.assertTrue(all(r["action"] == "forward" for r in host_calls(run.records)), extra)
            self.assertNotIn("host_alloc", run.records[-1])

    # -- bounded ---------------------------------------------------------------
    def test_bound_in_bytes(self):
        run = self.hostalloc("--path", "driver", "--bench", "--sizes", "4M,64M", "--cycles", "4",
                             LAZYPIN_MODE="defer", LAZYPIN_HOST_ALLOC_CACHE="8M")
        self.assertEqual(run.rc, 0, run.err)
        big = [r for r in host_calls(run.records) if is_free(r)][-5:]  # the 64 MiB frees
        self.assertTrue(all(r["action"] == "forward" for r in big), big)
        summary = run.records[-1]["host_alloc"]
        self.assertLessEqual(summary["peak_bytes"], 8 << 20)
        self.assertEqual(summary["hits"], 4)  # the 4 MiB cycles after the first, and the kept one

    def test_bound_in_entries_drops_the_oldest(self):
        run = self.hostalloc("--path", "runtime", "--check", LAZYPIN_MODE="defer",
                             LAZYPIN_POOL_ENTRIES=1)
        self.assertEqual(run.rc, 0, run.err)
        self.assertNotIn("FAIL", run.out)
        self.assertLessEqual(run.records[-1]["host_alloc"]["peak_entries"], 1)
        self.assertGreater(releases(run.records)["lru"], 0)

    # -- collected -------------------------------------------------------------
    def test_idle_blocks_are_released(self):
        run = self.hostalloc("--path", "runtime", "--idle-wait-ms", "800", LAZYPIN_MODE="defer",
                             LAZYPIN_IDLE_MS=100)
        self.assertEqual(run.rc, 0, run.err)
        idle = [r for r in run.records if r["type"] == "host_release" and r["reason"] == "idle"]
        self.assertEqual(len(idle), 1, run.records)
        self.assertEqual(idle[0]["result"], 0)
        self.assertEqual(idle[0]["bytes"], 1 << 20)
        self.assertEqual(run.records[-1]["host_alloc"]["cached_entries"], 0)

    def test_release_at_exit(self):
        run = self.hostalloc("--path", "runtime", "--idle-wait-ms", "1", LAZYPIN_MODE="defer",
                             LAZYPIN_RELEASE_AT_EXIT=1)
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(releases(run.records)["exit"], 1)
        self.assertEqual(run.records[-1]["host_alloc"]["cached_entries"], 0)

    # -- memory hooks ------------------------------------------------------------
    def test_munmap_of_a_freed_block_frees_the_kept_one_first(self):
        bare = self.hostalloc("--path", "runtime", "--munmap-after-free", shim=False)
        self.assertEqual(bare.rc, 0, bare.out + bare.err)
        run = self.hostalloc("--path", "runtime", "--munmap-after-free", LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.out + run.err)
        self.assertEqual(run.out, bare.out)
        self.assertEqual(releases(run.records)["munmap"], 1)

    # -- NVTX: each host call is one balanced range, as a registration is -------
    @unittest.skipUnless(os.environ.get("NVTX_RECORDER"), "no NVTX recorder")
    def test_each_call_is_a_balanced_nvtx_range(self):
        record = os.path.join(self.dir, "nvtx.txt")
        run = self.hostalloc("--path", "runtime", "--bench", "--sizes", "1M", "--cycles", "4",
                             LAZYPIN_MODE="defer", NVTX_INJECTION64_PATH=os.environ["NVTX_RECORDER"],
                             NVTX_RECORD=record)
        self.assertEqual(run.rc, 0, run.err)
        pushes, _, balanced, _ = lazypin_timeline(record)
        self.assertTrue(balanced)
        self.assertEqual(pushes, [r["api"] for r in calls(run.records)])

    # -- the report reads the new records ---------------------------------------
    def test_report_shows_host_allocations(self):
        run = self.hostalloc("--path", "runtime", "--bench", "--sizes", "1M", "--cycles", "6",
                             LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        rep = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "lazypin_report.py"),
                              run.log], capture_output=True, text=True, timeout=60)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        self.assertIn("== host allocations", rep.stdout)
        self.assertIn("hits 6  misses 1", rep.stdout)
        self.assertIn("pool: not used", rep.stdout)  # host hits are not the pool's


if __name__ == "__main__":
    unittest.main()
