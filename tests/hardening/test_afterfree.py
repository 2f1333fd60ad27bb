"""After the program gave memory back: its double and invalid frees, blocks
LAZYPIN_REUSE_FREED serves, host blocks the host-allocation cache keeps, and
its own userfaultfd on memory lazypin watches. tests/hardening/apps/afterfree
prints what it observed (codes, errnos, sizes); each case runs bare, in log
mode and in defer mode (and the variants that apply), and must print the same
and end the same way (exit status, glibc's own message on a double free).
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hardening import Base, happ  # noqa: E402

APP = happ("afterfree")
MiB = 1 << 20

MODES = {
    "log": {"LAZYPIN_MODE": "log"},
    "defer": {"LAZYPIN_MODE": "defer"},
    "defer, no reuse": {"LAZYPIN_MODE": "defer", "LAZYPIN_REUSE_FREED": "0"},
    "defer, autopin": {"LAZYPIN_MODE": "defer", "LAZYPIN_AUTOPIN": "1"},
}


def glibc_lines(err):
    return [l for l in err.splitlines() if "free(" in l or "munmap_chunk" in l]


class AfterFree(Base):
    def compare(self, args, modes=MODES, timeout=60):
        """Runs bare, then in each mode: same stdout, exit status and glibc
        message. Returns the runs by mode."""
        bare = self.run_app([APP] + args, shim=False, timeout=timeout)
        self.assertNotIn("UNEXPECTED", bare.err, bare.why())
        runs = {}
        for label, env in modes.items():
            run = self.run_app([APP] + args, timeout=timeout, **env)
            self.assertNotIn("STALE", run.err, (label, run.why()))
            self.assertEqual(run.out, bare.out, (label, args, run.why(), bare.why()))
            self.assertEqual(run.rc, bare.rc, (label, args, run.why(), bare.why()))
            self.assertEqual(glibc_lines(run.err), glibc_lines(bare.err), (label, args, run.why()))
            runs[label] = run
        return bare, runs

    def evictions(self, run):
        return [r["reason"] for r in run.records if r["type"] in ("evict", "host_release")]

    # A double free fails at the second free, as glibc makes it fail bare:
    # "free(): double free detected in tcache 2" (SIGABRT) for a small block,
    # SIGSEGV for an mmapped one (its header went with the first free). The
    # first free was parked (reuse) or handed to the collector (no reuse).
    # (Not with LAZYPIN_REUSE_FREED=0: when the collector made the first free
    # already, glibc's tcache check, which looks at the freeing thread's own
    # cache, misses it; README, known limits.)
    def test_double_free_small_block(self):
        bare, _ = self.compare(["doublefree", "64"],
                               modes={k: v for k, v in MODES.items() if k != "defer, no reuse"})
        self.assertEqual(bare.rc, -6, bare.why())
        self.assertIn("free(): double free detected in tcache 2", bare.err)
        self.assertIn("freed once", bare.out)
        self.assertNotIn("freed twice", bare.out)

    def test_double_free_mmapped_block(self):
        bare, _ = self.compare(["doublefree", str(MiB)])
        self.assertEqual(bare.rc, -11, bare.why())
        self.assertIn("freed once", bare.out)

    # free(p + 8192) inside a pooled block: glibc's "free(): invalid pointer"
    # (SIGABRT), never a fault of lazypin's reading the pointer's header.
    def test_invalid_pointer_free(self):
        bare, _ = self.compare(["invalidfree"])
        self.assertEqual(bare.rc, -6, bare.why())
        self.assertIn("free(): invalid pointer", bare.err)

    # A parked mmapped block is not served once mallopt raised the threshold
    # above its size (the mallopt releases parked blocks): the allocation gets
    # a heap block, as bare.
    def test_served_block_follows_mallopt_threshold(self):
        _, runs = self.compare(["threshold"])
        # The mallopt released the parked block (glibc then has its free).
        self.assertIn("make_room", self.evictions(runs["defer"]))

    # A served mmapped block reads as zeros, as a fresh mmapped block does,
    # with the same usable size.
    def test_served_mmapped_block_is_zeroed(self):
        _, runs = self.compare(["zeroed"])
        pool = runs["defer"].summary()["pool"]
        self.assertGreaterEqual(pool["served"], 1, pool)

    # MAP_FIXED_NOREPLACE over pages of a block the program freed: bare the
    # block is unmapped and the mapping is made; the parked block is released first.
    def test_map_fixed_noreplace_over_freed_block(self):
        _, runs = self.compare(["noreplace"])
        self.assertIn("mmap_fixed", self.evictions(runs["defer"]))

    # memalign with an alignment above a page: such a block is never parked
    # (no allocation could be given it as a fresh one). Its free goes to the
    # collector, which frees it a moment later (README: what remains), so the
    # usable sizes may differ from bare's; each is one memalign gives.
    def test_memalign_above_a_page_not_parked(self):
        run = self.run_app([APP, "memalign"], LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.why())
        self.assertEqual(run.out.count("aligned=1"), 3, run.out)
        self.assertEqual(run.summary()["pool"]["parked"], 0, run.summary()["pool"])

    # mallinfo2 counts a kept block as freed, as bare. lazypin's own
    # bookkeeping (a few KiB of heap) is in the figures; the 2 MiB block is not.
    def test_mallinfo_without_kept_block(self):
        bare = self.run_app([APP, "mallinfo"], shim=False)
        run = self.run_app([APP, "mallinfo"], LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.why())
        in_use = lambda r: int(r.out.split("in use: ")[1].split(" ")[0])  # noqa: E731
        blocks = lambda r: r.out.split("mmapped blocks ")[1].strip()  # noqa: E731
        self.assertLess(abs(in_use(run) - in_use(bare)), 256 * 1024, (run.out, bare.out))
        self.assertEqual(blocks(run), blocks(bare), (run.out, bare.out))
        self.assertEqual(run.summary()["pool"]["parked"], 1, run.summary()["pool"])

    # Use after cudaFreeHost: each memory call on the freed block meets what it
    # meets bare (unmapped memory: -1 ENOMEM; NOREPLACE maps), and the next
    # allocation of that size works.
    def test_memory_calls_on_freed_host_block(self):
        reasons = {"mprotect": "mprotect", "mprotect_none": "mprotect", "madvise": "madvise",
                   "mincore": "memory_call", "mlock": "memory_call", "munlock": "memory_call",
                   "msync": "memory_call", "noreplace": "memory_call"}
        for call, reason in reasons.items():
            bare, runs = self.compare(["hostcall", call], modes={k: MODES[k] for k in ("log", "defer")})
            self.assertIn("after cudaFreeHost", bare.out)
            self.assertIn(reason, self.evictions(runs["defer"]), (call, runs["defer"].records[-3:]))

    # The program's own userfaultfd on memory lazypin's kernel watch holds:
    # registered by the program and deferred, registered now, or only copied
    # (auto-pinned). The register succeeds as bare; the memory works after.
    def test_program_userfaultfd_on_watched_memory(self):
        for what in ("deferred", "inuse", "copied"):
            bare, runs = self.compare(["uffd", what])
            if "unavailable" in bare.out:
                self.skipTest("no userfaultfd here: " + bare.out)
            self.assertIn("UFFDIO_REGISTER %s: rc=0" % what, bare.out)
        self.assertIn("userfaultfd", self.evictions(runs["defer, autopin"]))


if __name__ == "__main__":
    unittest.main()
