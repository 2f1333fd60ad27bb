"""LAZYPIN_AUTOPIN on the simulated stack: testapps/autopin.cc copies
from pageable memory through every door and copy form, and must print exactly
what it prints without lazypin, while the log says lazypin pinned the memory.
The sim queues copies of pinned memory behind the stream's work (a busy
kernel before each copy) and runs pageable ones at once, so a pin that broke
pageable semantics (an async host-to-device copy must take the source as of
the call, a device-to-host one must be complete on return) shows in the bytes;
the sim's stale-frame detector (root) aborts on any DMA through old frames.
Environment: as test_preload.py.
"""
import os
import re
import unittest

from test_preload import AppTestCase, app

DOORS = ("runtime", "symbol", "dlsym", "getproc", "getproc_pt")
FORMS = ("htod", "async", "any", "any_async", "2d", "2d_async", "2du", "3d", "3d_async")
VIA = {"runtime": "getproc", "symbol": "symbol", "dlsym": "dlsym", "getproc": "getproc",
       "getproc_pt": "getproc"}
SIM = {"SIMCUDA_SLEEP": "1", "SIMCUDA_KERNEL_US": "3000"}
AUTOPIN = dict(SIM, LAZYPIN_MODE="defer", LAZYPIN_AUTOPIN="1")


def autopins(records):
    return [r for r in records if r["type"] == "autopin"]


def diag(err, key):
    m = re.findall(r"diag: .*?%s=(\S+)" % re.escape(key), err)
    return m[-1] if m else None


class AutoPinTest(AppTestCase):
    def compare(self, argv, **extra):
        """Runs bare and with auto-pin: same stdout, exit 0; returns the auto-pin run."""
        bare = self.run_app([app("autopin")] + argv, shim=False, **SIM)
        self.assertEqual(bare.rc, 0, bare.err[-2000:])
        env = dict(AUTOPIN)
        env.update(extra)
        run = self.run_app([app("autopin")] + argv, **env)
        self.assertEqual(run.rc, 0, run.err[-3000:])
        self.assertEqual(run.out, bare.out, "the program saw a difference")
        self.assertIn("AUTOPIN ok", run.out)
        return run

    # -- every door and every copy form ---------------------------------------
    def test_every_door_and_form(self):
        for door in DOORS:
            for form in FORMS:
                if door == "runtime" and form == "2du":
                    continue  # no runtime form
                with self.subTest(door=door, form=form):
                    run = self.compare(["--door", door, "--form", form])
                    pins = autopins(run.records)
                    h, back = int(diag(run.err, "h"), 16), int(diag(run.err, "back"), 16)
                    ok = [p for p in pins if p["result"] == 0]
                    # h and back on the first round trip (the queries leave h
                    # pinned: they are answered as for unregistered memory), and
                    # h once more on the last round trip: the program registered
                    # and unregistered a sub-range (deferred), which that copy
                    # covers without lying inside it, so it is released first
                    # (the driver must see no registration there, as bare) and h
                    # is then memory nobody holds. Nothing else (the program's
                    # own ranges are left alone).
                    self.assertEqual(sorted(int(p["ptr"], 16) for p in ok),
                                     sorted([h, h, back]), pins)
                    order = [(r["type"], int(r["ptr"], 16), r.get("reason")) for r in run.records
                             if r["type"] in ("autopin", "evict")]
                    last = max(i for i, o in enumerate(order) if o == ("autopin", h, None))
                    self.assertEqual(order[last - 1], ("evict", h + 8192, "overlap"), order)
                    for p in ok:
                        self.assertEqual(p["via"], VIA[door], p)
                        self.assertEqual(p["bytes"], 8 << 20)
                        self.assertEqual(p["action"], "autopin")
                        self.assertGreater(p["latency_ns"], 0)
                        self.assertEqual(p["dir"], "htod" if int(p["ptr"], 16) == h else "dtoh")
                        if door == "getproc_pt":
                            self.assertRegex(p["api"], r"_pt[sd][sz]$")
                    self.assertEqual(diag(run.err, "live"), "2", "both buffers pinned")
                    summary = run.records[-1]
                    self.assertEqual(summary["type"], "summary")
                    ap = summary["pool"]["autopin"]
                    self.assertEqual(ap["pins"], 3)
                    self.assertEqual(ap["hits"], 1, "the program's exact register was served")
                    self.assertGreaterEqual(ap["copies"], 6, "later copies found it pinned")
                    evicts = {r["reason"] for r in run.records if r["type"] == "evict"}
                    self.assertNotIn("query", evicts)
                    self.assertIn("overlap", evicts)

    def test_threads_copying_one_range_while_it_is_queried(self):
        for _ in range(3):
            run = self.compare(["--door", "runtime", "--form", "async", "--scenario", "threads",
                                "--iters", "20"], LAZYPIN_AUTOPIN_MIN="1M")
            self.assertEqual(run.out.count("bytes=ok"), 4)
            self.assertGreater(len(autopins(run.records)), 0)

    # A program that asks about its memory before every copy: each query is
    # answered as for unregistered memory (as bare), and the pin stays.
    def test_queries_before_every_copy_keep_the_pin(self):
        run = self.compare(["--door", "getproc", "--form", "async", "--scenario", "queries",
                            "--iters", "6"])
        h = int(diag(run.err, "h"), 16)
        self.assertEqual(len([p for p in autopins(run.records) if int(p["ptr"], 16) == h]), 1)
        self.assertEqual(run.records[-1]["pool"]["autopin"]["queried"], 0)
        self.assertNotIn("query", {r["reason"] for r in run.records if r["type"] == "evict"})

    def test_each_pin_is_a_marker_on_the_timeline(self):
        recorder = os.environ.get("NVTX_RECORDER")
        if not recorder:
            self.skipTest("no NVTX_RECORDER")
        record = os.path.join(self.dir, "nvtx.txt")
        run = self.compare(["--door", "getproc", "--form", "async"],
                           NVTX_INJECTION64_PATH=recorder, NVTX_RECORD=record)
        with open(record) as f:
            marks = [l.rstrip("\n") for l in f if l.startswith("mark lazypin ")]
        self.assertEqual(marks.count("mark lazypin autopin"), len(autopins(run.records)))
        self.assertIn("mark lazypin evict:overlap", marks)

    # -- what changes the pages ------------------------------------------------
    def test_every_page_change_invalidates(self):
        for door, form in (("getproc", "async"), ("runtime", "htod"), ("symbol", "2d_async")):
            with self.subTest(door=door, form=form):
                run = self.compare(["--door", door, "--form", form, "--scenario", "invalidate"])
                evicts = {r["reason"] for r in run.records if r["type"] == "evict"}
                for reason in ("munmap", "madvise", "watch", "mmap_fixed"):
                    self.assertIn(reason, evicts)
                # A free of an auto-pinned malloc'd block changes no page when
                # the block is parked for reuse (LAZYPIN_REUSE_FREED): it stays
                # allocated and pinned, or it is released (free).
                self.assertTrue("free" in evicts or run.records[-1]["pool"]["parked"] > 0, evicts)
                self.assertGreaterEqual(len([p for p in autopins(run.records) if p["result"] == 0]), 8)

    def test_fork_releases_first(self):
        run = self.compare(["--door", "runtime", "--form", "async", "--scenario", "fork"])
        self.assertIn("child status=0", run.out)
        evicts = [r for r in run.records if r["type"] == "evict" and r["reason"] == "fork"]
        self.assertEqual(len(evicts), 2, "both pinned buffers released before the fork")

    def test_bounded(self):
        run = self.compare(["--door", "getproc", "--form", "async", "--scenario", "bounds"],
                           LAZYPIN_AUTOPIN_BYTES="12M")
        self.assertEqual(len(autopins(run.records)), 1)
        self.assertEqual(diag(run.err, "live"), "1")
        self.assertGreater(run.records[-1]["pool"]["autopin"]["full"], 0)
        run = self.compare(["--door", "getproc", "--form", "async", "--scenario", "bounds"],
                           LAZYPIN_POOL_BYTES="12M")
        self.assertEqual(len(autopins(run.records)), 1, "the pool's own bound too")

    def test_small_copies_and_a_higher_threshold_are_left_alone(self):
        run = self.compare(["--door", "runtime", "--form", "async", "--size", "1"])
        self.assertEqual(autopins(run.records), [])
        self.assertEqual(diag(run.err, "live"), "0")
        run = self.compare(["--door", "runtime", "--form", "async"], LAZYPIN_AUTOPIN_MIN="16M")
        self.assertEqual(autopins(run.records), [])

    def test_pinned_at_the_nth_copy(self):
        run = self.compare(["--door", "getproc", "--form", "async", "--iters", "4"],
                           LAZYPIN_AUTOPIN_AFTER="3")
        h = int(diag(run.err, "h"), 16)
        # h: pinned at its 3rd copy, and still pinned after the query, so the
        # program's exact register of it is served.
        pins = [p for p in autopins(run.records) if int(p["ptr"], 16) == h]
        self.assertEqual(len(pins), 1, pins)
        self.assertEqual(run.records[-1]["pool"]["autopin"]["pins"], 2, "h and back, once each")
        self.assertEqual(run.records[-1]["pool"]["autopin"]["hits"], 1, "the register of h was served")
        # async copies are counted at the pinned rate but never timed
        times = run.records[-1]["pool"]["autopin"]["copy_times"]
        self.assertGreater(times["htod"]["pinned_rate_bytes"] + times["dtoh"]["pinned_rate_bytes"], 0)
        for d in ("htod", "dtoh"):
            self.assertEqual((times[d]["pageable"]["copies"], times[d]["pinned"]["copies"]), (0, 0), times)

    def test_synchronous_copies_are_timed(self):
        # pageable before the 2nd copy pins the range, pinned after: the rates of this run
        run = self.compare(["--door", "getproc", "--form", "htod", "--iters", "4"],
                           LAZYPIN_AUTOPIN_AFTER="2")
        times = run.records[-1]["pool"]["autopin"]["copy_times"]
        for d in ("htod", "dtoh"):
            self.assertGreater(times[d]["pageable"]["copies"], 0, times)
            self.assertGreater(times[d]["pinned"]["copies"], 0, times)
        self.assertIn("saved_ns", run.records[-1]["pool"]["autopin"])

    def test_never_inside_a_capture(self):
        for door in ("runtime", "getproc"):
            with self.subTest(door=door):
                run = self.compare(["--door", door, "--form", "async", "--scenario", "capture"])
                self.assertEqual(diag(run.err, "capture"), "0", "nothing pinned while capturing")
                self.assertEqual(len(autopins(run.records)), 2, "after the capture: h and back")

    def test_shared_memory_is_left_alone(self):
        run = self.compare(["--door", "getproc", "--form", "async", "--scenario", "shared"])
        h = int(diag(run.err, "live"))
        self.assertEqual(h, 1, "only the private buffer copied back into")
        shared = [p for p in autopins(run.records) if p["dir"] == "htod"]
        self.assertEqual(shared, [])

    def test_a_range_partly_registered_by_the_program_is_left_alone(self):
        run = self.compare(["--door", "getproc", "--form", "async", "--scenario", "partial"])
        h = int(diag(run.err, "h"), 16)
        self.assertEqual([p for p in autopins(run.records) if int(p["ptr"], 16) == h], [])
        self.assertEqual(diag(run.err, "live"), "2", "the program's half and the back buffer")

    # -- copies over a range lazypin keeps and the program does not hold -----
    def overlap_ranges(self, run):
        """{(kept, step): range} from the app's diag lines."""
        return {(k, s): int(r, 16) for k, s, r in
                re.findall(r"diag: kept=(\S+) step=(.+?) range=(\S+)", run.err)}

    def check_overlap_releases(self, run, kept_kinds):
        """Each kept range a copy overlaps without lying inside is released for
        the overlap before that copy; the copies inside it leave it kept."""
        overlaps = {int(r["ptr"], 16) for r in run.records
                    if r["type"] == "evict" and r["reason"] == "overlap"}
        for (kept, step), ptr in self.overlap_ranges(run).items():
            if kept not in kept_kinds:
                continue
            inside = step in ("inside", "exact")
            self.assertEqual(ptr in overlaps, not inside, (kept, step))

    def test_a_copy_over_a_kept_range_sees_the_bare_driver(self):
        # Bare, every copy is pageable: 0 and the bytes. The driver refuses a
        # copy that starts inside a registration and runs past it (1), so a
        # range lazypin keeps (auto-pinned, or deferred after the program's
        # unregister) must be released first wherever the copy does not lie
        # inside it: sync and async, both directions, runtime and driver,
        # 1D, 2D and 3D spans.
        for door, form in (("runtime", "htod"), ("runtime", "async"), ("runtime", "2d"),
                           ("runtime", "3d_async"), ("getproc", "async"), ("symbol", "htod"),
                           ("dlsym", "any"), ("getproc", "any_async"), ("symbol", "2d_async"),
                           ("getproc_pt", "2du"), ("dlsym", "3d")):
            with self.subTest(door=door, form=form):
                run = self.compare(["--door", door, "--form", form, "--scenario", "overlap"])
                self.assertIn("held starts inside h2d rc=1", run.out)  # the program's: as bare
                self.assertNotIn("DIFFER", run.out)
                self.check_overlap_releases(run, ("deferred", "autopinned"))
                # Released for the overlap, the copy's own span is pinned instead.
                ranges = self.overlap_ranges(run)
                pinned = {int(p["ptr"], 16) for p in autopins(run.records) if p["result"] == 0}
                k = 4 << 20
                self.assertIn(ranges[("autopinned", "starts inside")], pinned)
                self.assertIn(ranges[("autopinned", "covers")] - k // 2, pinned)

    def test_a_copy_over_a_deferred_range_sees_the_bare_driver(self):
        # Defer mode without auto-pin: the program registered 4 MiB,
        # unregistered it (deferred), then copies 8 MiB from there.
        bare = self.run_app([app("autopin"), "--door", "runtime", "--form", "htod",
                             "--scenario", "overlap"], shim=False, **SIM)
        self.assertEqual(bare.rc, 0, bare.err[-2000:])
        for door, form in (("runtime", "htod"), ("runtime", "async"), ("getproc", "2d_async"),
                           ("symbol", "3d")):
            with self.subTest(door=door, form=form):
                argv = [app("autopin"), "--door", door, "--form", form, "--scenario", "overlap"]
                if (door, form) != ("runtime", "htod"):
                    bare = self.run_app(argv, shim=False, **SIM)
                    self.assertEqual(bare.rc, 0, bare.err[-2000:])
                run = self.run_app(argv, **dict(SIM, LAZYPIN_MODE="defer"))
                self.assertEqual(run.rc, 0, run.err[-3000:])
                self.assertEqual(run.out, bare.out, "the program saw a difference")
                self.assertEqual(autopins(run.records), [])
                self.check_overlap_releases(run, ("deferred",))

    def test_idle_collection_releases_it(self):
        run = self.compare(["--door", "getproc", "--form", "htod", "--scenario", "idle"],
                           LAZYPIN_IDLE_MS="200")
        self.assertEqual(diag(run.err, "live"), "0")  # the last one: after the idle wait
        self.assertIn("idle", {r["reason"] for r in run.records if r["type"] == "evict"})

    # -- the other apps, differential: nothing they observe changes -----------
    def test_other_apps_see_no_difference(self):
        small = dict(LAZYPIN_MODE="defer", LAZYPIN_AUTOPIN="1", LAZYPIN_AUTOPIN_MIN="64K")
        slow = {"SIMCUDA_SLEEP": "1", "SIMCUDA_KERNEL_US": "100000"}
        for case in ("wait", "pageable", "remap", "fork", "capture", "thread"):
            with self.subTest(case=case):
                argv = [app("transparent_shared"), "--case", case, "--fork-bytes", "64M"]
                bare = self.run_app(argv, shim=False, **slow)
                run = self.run_app(argv, **dict(slow, **small))
                self.assertEqual(run.rc, 0, run.err[-2000:])
                self.assertEqual(run.out, bare.out)
        bare = self.run_app([app("diffseq_shared")], shim=False)
        run = self.run_app([app("diffseq_shared")], **small)
        self.assertEqual((run.rc, run.out), (0, bare.out))
        self.assertGreater(len(autopins(run.records)), 0)
        # Many threads copying, registering, freeing and remapping: never stale
        # (the sim aborts on a DMA through old frames), every code and byte checked.
        run = self.run_app([app("torture"), "--threads", "4", "--seconds", "3"],
                           LAZYPIN_POOL_ENTRIES=8, **small)
        self.assertEqual(run.rc, 0, run.out[-2000:] + run.err[-2000:])
        self.assertNotIn("STALE", run.err)
        ap = run.records[-1]["pool"]["autopin"]
        self.assertGreater(ap["pins"], 100)
        self.assertGreater(ap["copies"], 100)

    def test_off_unless_asked_and_only_with_defer(self):
        run = self.compare(["--door", "getproc", "--form", "async"], LAZYPIN_AUTOPIN="0")
        self.assertEqual(autopins(run.records), [])
        run = self.compare(["--door", "getproc", "--form", "async"], LAZYPIN_MODE="log")
        self.assertEqual(autopins(run.records), [])
        self.assertIn("LAZYPIN_AUTOPIN=1 ignored", run.err)
        run = self.compare(["--door", "getproc", "--form", "async"], LAZYPIN_WATCH="hooks")
        self.assertEqual(autopins(run.records), [])
        self.assertIn("needs the kernel watch", run.err)


if __name__ == "__main__":
    unittest.main()
