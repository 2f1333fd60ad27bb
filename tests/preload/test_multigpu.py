"""Several devices in one process on the simulated stack (SIMCUDA_DEVICES=2
and 4): testapps/multigpu.cu bare vs log vs defer.

What the program sees must not change: codes, flags, pointer attributes and
bytes, above all those of a copy another device still makes while device 0
unregisters or frees the memory (the driver's implicit wait covers every
device). The log says what lazypin did per device: hits per context, a
reset of one device leaving the others' pooled and cached state, and that of
another context on the reset device. Environment as test_preload.py.
"""
import collections
import subprocess
import sys
import unittest

from test_preload import AppTestCase, app, calls, SRC

# Simulated durations on: copies in flight behind spin kernels are observable.
TIMED = {"SIMCUDA_SLEEP": "1", "SIMCUDA_KERNEL_US": "20000"}


class MultiGpuTest(AppTestCase):
    def multigpu(self, devices, *args, shim=True, **env):
        return self.run_app([app("multigpu_shared")] + list(args), shim=shim,
                            SIMCUDA_DEVICES=devices, **dict(TIMED, **env))

    def check_same_output(self, devices):
        bare = self.multigpu(devices, shim=False)
        self.assertEqual(bare.rc, 0, bare.err)
        self.assertIn("devices %d\n" % devices, bare.out)
        # What the bare run must show for the test to mean anything.
        self.assertNotIn("WRONG", bare.out)
        self.assertNotIn("later-bytes", bare.out)
        self.assertIn("regs: dev1 register=712", bare.out)
        runs = {}
        for mode in ("log", "defer"):
            run = self.multigpu(devices, LAZYPIN_MODE=mode)
            self.assertEqual(run.rc, 0, run.err)
            self.assertEqual(run.out, bare.out, "output changed under lazypin (%s)" % mode)
            recs = calls(run.records)
            self.assertTrue(recs)
            for r in recs:
                self.assertIn(r.get("device"), range(devices), r)
            runs[mode] = run
        # One record per program call, whatever lazypin did with it (the
        # threads of the first case interleave: compared as multisets).
        shape = lambda run: collections.Counter((r["api"], r["result"], r["device"])
                                                for r in calls(run.records))
        self.assertEqual(shape(runs["log"]), shape(runs["defer"]))
        # Pool hits on every device (the threads case registers each buffer --rounds times).
        hits = collections.Counter(r["device"] for r in calls(runs["defer"].records)
                                   if r["action"] == "hit")
        self.assertEqual(set(hits), set(range(devices)), hits)
        return runs

    def test_two_devices(self):
        self.check_same_output(2)

    def test_four_devices(self):
        self.check_same_output(4)

    def test_without_the_wait_another_device_reads_changed_bytes(self):
        # The check above means something: with the unregister's wait off the
        # other devices' copies see the bytes written after the unregister or
        # the free (README: LAZYPIN_UNREGISTER_WAIT=0).
        run = self.multigpu(2, "--case", "freehost", LAZYPIN_MODE="defer",
                            LAZYPIN_UNREGISTER_WAIT="0", SIMCUDA_KERNEL_US="100000")
        self.assertEqual(run.rc, 0, run.err)
        portable = [l for l in run.out.splitlines() if " portable free=" in l]
        self.assertTrue(portable, run.out)
        # The later bytes, or a mix of them when the copy ran during the fill.
        self.assertTrue([l for l in portable if "reader-got=bytes-of-the-copy" not in l], run.out)

    def test_autopin_copies_to_each_device(self):
        # LAZYPIN_AUTOPIN pins the buffer in the first copying device's
        # context; every device's copies of it keep pageable semantics.
        bare = self.multigpu(2, "--case", "pageable", shim=False)
        self.assertEqual(bare.rc, 0, bare.err)
        self.assertNotIn("NOT-BACK", bare.out)
        run = self.multigpu(2, "--case", "pageable", LAZYPIN_MODE="defer", LAZYPIN_AUTOPIN="1")
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(run.out, bare.out)
        pins = [r for r in run.records if r["type"] == "autopin" and r["result"] == 0]
        self.assertTrue(pins, "auto-pin pinned nothing: the test shows nothing")

    def test_a_context_lazypin_never_saw_is_not_waited_for(self):
        # The known limit (docs/design.md): a context made with cuCtxCreate on
        # a device whose primary context is inactive, in which lazypin saw no
        # call, is not waited for; its copy in flight reads the bytes written
        # after device 0's deferred unregister. (The same context with a
        # registration of its own is waited for: the "made" case above.)
        bare = self.multigpu(2, "--case", "unseen", shim=False)
        self.assertIn("made-context-got=bytes-of-the-copy", bare.out)
        run = self.multigpu(2, "--case", "unseen", LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("made-context-got=later-bytes", run.out,
                      "lazypin now waits for contexts it never saw: update the known limit")
        run = self.multigpu(2, "--case", "unseen", LAZYPIN_MODE="defer", LAZYPIN_UNREGISTER_WAIT="1",
                            LAZYPIN_POOL_ENTRIES="0")
        self.assertEqual(run.out, bare.out, "LAZYPIN_POOL_ENTRIES=0: nothing deferred, as bare")

    def test_a_reset_drops_only_that_primary_contexts_state(self):
        run = self.multigpu(2, "--case", "reset", LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        seq = collections.defaultdict(list)
        for r in calls(run.records):
            if "Unregister" not in r["api"] and "Free" not in r["api"]:
                seq[(r["api"], r["device"])].append(r["action"])
        # Device 0's registration and cached block survive device 1's reset;
        # after device 0's own reset, its registration is gone (a miss).
        self.assertEqual(seq[("cudaHostRegister", 0)], ["miss", "hit", "miss"], seq)
        self.assertEqual(seq[("cudaMallocHost", 0)], ["miss", "hit"], seq)
        # Device 1's are gone with its primary context.
        self.assertEqual(seq[("cudaHostRegister", 1)], ["miss", "miss"], seq)
        self.assertEqual(seq[("cudaMallocHost", 1)], ["miss", "miss"], seq)
        # A context made with cuCtxCreate on device 0 keeps its own through
        # device 0's primary reset.
        self.assertEqual(seq[("cuMemHostRegister_v2", 0)], ["miss", "hit"], seq)
        self.assertEqual(seq[("cuMemAllocHost_v2", 0)], ["miss", "hit"], seq)

    def test_releases_wait_for_every_device(self):
        # An idle release of device 0's buffer while device 1 runs an 800 ms
        # kernel: lazypin waits for device 1 first (waited_ns), so the
        # unregister itself is short and stalls no device's work. (Waiting
        # for device 0's context alone, the unregister took what was left of
        # the kernel.)
        run = self.multigpu(2, "--case", "idle", "--kernel-ms", "800", LAZYPIN_MODE="defer",
                            LAZYPIN_IDLE_MS="50", SIMCUDA_KERNEL_US="800000")
        self.assertEqual(run.rc, 0, run.err)
        self.assertIn("dev0=bytes-of-the-copy", run.out)
        idle = [r for r in run.records if r["type"] == "evict" and r["reason"] == "idle"]
        self.assertEqual(len(idle), 1, idle)
        e = idle[0]
        self.assertFalse(e.get("forced"), e)
        self.assertGreater(e["waited_ns"], 200e6, e)
        self.assertLess(e["latency_ns"] - e["waited_ns"], 100e6, e)

    def test_report_groups_by_device(self):
        run = self.multigpu(2, "--case", "threads", LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        rep = subprocess.run([sys.executable, SRC + "/scripts/lazypin_report.py", run.log],
                             capture_output=True, text=True)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        self.assertIn("== by device", rep.stdout)
        section = rep.stdout.split("== by device", 1)[1].split("\n\n", 1)[0]
        rows = [l.split() for l in section.splitlines()[2:]]
        self.assertEqual([r[0] for r in rows], ["0", "1"], section)

    def test_one_device_logs_no_device(self):
        run = self.multigpu(1, LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 2, "one device: nothing to show")
        self.assertIn("2 or more needed", run.err)
        # One device: records as before (no "device"), the report without the section.
        run = self.run_app([app("hostalloc_shared"), "--path", "runtime", "--check"],
                           LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        self.assertTrue(calls(run.records))
        self.assertFalse([r for r in calls(run.records) if "device" in r])

if __name__ == "__main__":
    unittest.main()
