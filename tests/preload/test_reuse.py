"""Freed pinned blocks come back (LAZYPIN_REUSE_FREED).

testapps/reuse runs the allocate/pin/unpin/free cycle and the allocator's
semantics around it on the simulated stack, bare and under the shim: what it
prints (RESULT lines aside) must be the same, and the log must show the hits.
The simulated driver aborts on any copy through a registration whose frames
changed (/proc/self/pagemap, as root), so every run is also a staleness check.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_preload import AppTestCase, app, calls  # noqa: E402
import sanitizer_env  # noqa: E402

LIBDIR = "/usr/lib/x86_64-linux-gnu"
JEMALLOC = os.path.join(LIBDIR, "libjemalloc.so.2")
TCMALLOC = os.path.join(LIBDIR, "libtcmalloc_minimal.so.4")
REUSE = app("reuse")


def lines(out):
    return [l for l in out.splitlines() if not l.startswith("RESULT")]


def registers(run):
    return [r["action"] for r in calls(run.records) if r["api"] == "cudaHostRegister"]


def warnings(run):
    return [r["message"] for r in run.records if r["type"] == "warning"]


MIB = 1 << 20


def parse_size(text):
    return int(text[:-1]) << {"K": 10, "M": 20}[text[-1]]


def cycle_registers(size, iters):
    # glibc mmaps a block above 128 KiB (up to 32 MiB) until the first free
    # of one raises its dynamic threshold: later blocks of that size come
    # from the heap. That first free reaches glibc (an mmapped chunk glibc
    # would no longer give is never served again), its block never comes back.
    first = ["miss", "miss"] if 128 << 10 < parse_size(size) <= 32 * MIB else ["miss"]
    return (first + ["hit"] * iters)[:iters]


class ReuseTest(AppTestCase):
    def same(self, argv, **extra):
        bare = self.run_app(argv, shim=False)
        self.assertEqual(bare.rc, 0, bare.err)
        env = {"LAZYPIN_MODE": "defer"}
        env.update(extra)
        run = self.run_app(argv, **env)
        self.assertEqual(run.rc, 0, run.err[-3000:])
        self.assertNotIn("STALE", run.err)
        self.assertEqual(lines(run.out), lines(bare.out))
        self.assertNotIn("WRONG", run.out)
        self.assertNotIn("NO", run.out.replace("NONE", ""))
        return run

    def summary(self, run):
        return run.records[-1]["pool"]

    def test_cycle_hits_after_the_first_at_every_size(self):
        sizes = ["4K", "64K", "200K", "1M", "4M", "16M", "48M"]
        run = self.same([REUSE, "--mode", "cycle", "--sizes", ",".join(sizes), "--iters", "5"])
        expected = sum((cycle_registers(size, 5) for size in sizes), [])
        self.assertEqual(registers(run), expected)
        pool = self.summary(run)
        self.assertEqual(pool["hits"], expected.count("hit"))
        self.assertGreaterEqual(pool["served"], pool["hits"])
        # Every free of the cycle parks but each mmapped first one, which goes
        # to glibc (unregistered first, by the collector); a block served to
        # another allocation of that size (stdio's buffer) parks once more.
        firsts = expected.count("miss") - len(sizes)
        self.assertGreaterEqual(pool["parked"], 5 * len(sizes) - firsts)
        self.assertEqual(pool["evictions"].get("free", 0), firsts, pool["evictions"])
        self.assertFalse(any("REUSE" in w for w in warnings(run)), warnings(run))

    def test_served_blocks_are_the_same_frames(self):
        # The sim compares /proc/self/pagemap frames on every copy (as root),
        # and LAZYPIN_CHECK_PFN=1 makes the pool compare them on every hit.
        run = self.same([REUSE, "--mode", "cycle", "--sizes", "64K,4M", "--iters", "4"],
                        LAZYPIN_CHECK_PFN="1")
        if os.geteuid() == 0:
            self.assertNotIn("stale detection disabled", run.err)
        self.assertEqual(registers(run), cycle_registers("64K", 4) + cycle_registers("4M", 4))
        self.assertFalse([w for w in warnings(run) if "CHECK_PFN" in w], warnings(run))

    def test_reuse_off_is_todays_behaviour(self):
        run = self.same([REUSE, "--mode", "cycle", "--sizes", "4M", "--iters", "3"],
                        LAZYPIN_REUSE_FREED="0")
        self.assertEqual(registers(run), ["miss"] * 3)
        ev = self.summary(run)["evictions"]
        self.assertEqual(ev.get("free", 0) + ev.get("overlap", 0), 3, ev)
        self.assertEqual(self.summary(run)["parked"], 0)

    def test_calloc_zeroes_a_block_that_comes_back(self):
        run = self.same([REUSE, "--mode", "calloc"])
        self.assertIn("calloc size=4M zero=yes", run.out)
        self.assertGreater(self.summary(run)["hits"], 0)

    def test_mmapped_block_comes_back_zeroed_by_lazypins_thread(self):
        # Zeroed while parked, given a pause: the free wakes the collector,
        # whose paced steps (2% of its time) take about 20 ms for 4 MiB here.
        run = self.same([REUSE, "--mode", "zeroed", "--iters", "4", "--pause-ms", "300"])
        self.assertIn("zeroed size=4M iters=4 zero=yes bytes=ok", run.out)
        pool = self.summary(run)
        self.assertEqual(pool["served"], 3, pool)
        self.assertEqual(pool["served_zeroed"], 3, pool)

    def test_no_zeroing_ahead_where_unregisters_do_not_wait(self):
        # LAZYPIN_UNREGISTER_WAIT=0: a copy the program left running may still
        # read a block it freed; lazypin writes nothing into it until served.
        run = self.same([REUSE, "--mode", "zeroed", "--iters", "3", "--pause-ms", "300"],
                        LAZYPIN_UNREGISTER_WAIT="0")
        self.assertIn("zeroed size=4M iters=3 zero=yes bytes=ok", run.out)
        pool = self.summary(run)
        self.assertEqual(pool["served"], 2, pool)
        self.assertEqual(pool["served_zeroed"], 0, pool)

    def test_mmapped_block_served_before_its_zeroing_reads_zeros(self):
        run = self.same([REUSE, "--mode", "zeroed", "--iters", "6", "--sizes", "4M,48M"])
        self.assertIn("zeroed size=4M iters=6 zero=yes bytes=ok", run.out)
        self.assertIn("zeroed size=48M iters=6 zero=yes bytes=ok", run.out)
        self.assertEqual(self.summary(run)["served"], 10)

    def test_every_aligned_allocator_keeps_its_alignment(self):
        run = self.same([REUSE, "--mode", "align"])
        self.assertEqual(run.out.count("aligned=yes"), 8, run.out)
        self.assertGreater(self.summary(run)["hits"], 0)

    def test_usable_size_as_bare_and_as_a_fresh_block(self):
        # glibc's mmap threshold fixed: every usable size is the bare run's,
        # and a served block's is a fresh block's at that moment.
        run = self.same([REUSE, "--mode", "usable", "--fixed-threshold"])
        self.assertIn("as_fresh=yes", run.out)
        self.assertGreater(self.summary(run)["hits"], 0)
        # Dynamic threshold (glibc's default): every usable size as bare too,
        # though each size's first free (an mmapped block) reaches glibc only
        # after its unregister, a while later.
        run = self.same([REUSE, "--mode", "usable", "--sizes", "200K,1M,4M,16M,48M"])
        self.assertGreater(self.summary(run)["hits"], 0)

    def test_realloc_of_a_block_that_came_back(self):
        self.same([REUSE, "--mode", "realloc"])

    def test_block_not_registered_again_stays_pageable(self):
        run = self.same([REUSE, "--mode", "pageable"])
        self.assertIn("pageable copy=as-pageable", run.out)
        self.assertEqual(self.summary(run)["served"], 1)

    def test_free_from_a_signal_handler(self):
        run = self.same([REUSE, "--mode", "signal"])
        self.assertEqual(registers(run), cycle_registers("4M", 5))

    def test_threads_and_frees_on_other_threads(self):
        run = self.same([REUSE, "--mode", "threads", "--threads", "6"])
        self.assertGreater(self.summary(run)["hits"], 60)

    def test_fork_child_never_uses_parked_blocks(self):
        run = self.same([REUSE, "--mode", "fork"])
        self.assertIn("fork child malloc=ok", run.out)
        pool = self.summary(run)
        self.assertEqual(pool["evictions"].get("fork"), 1, pool)
        # The parent's second block parked, released at the fork: the
        # parent's third is a miss, its fourth a hit.
        self.assertEqual(registers(run), cycle_registers("4M", 2) + ["miss", "hit"])

    def test_idle_release_frees_parked_blocks(self):
        run = self.same([REUSE, "--mode", "idle", "--pause-ms", "600"], LAZYPIN_IDLE_MS="100")
        self.assertEqual(registers(run), cycle_registers("4M", 2) + ["miss"])
        self.assertEqual(self.summary(run)["evictions"].get("idle"), 1)

    def test_allocation_that_fails_while_blocks_are_parked_gets_the_room(self):
        # A 64 MiB block parked, then an address-space limit that fits an
        # 80 MiB malloc only once the parked block is gone (bare: freed): the
        # setrlimit has the collector release it (memory pressure), and the
        # allocation succeeds.
        run = self.same([REUSE, "--mode", "room"])
        self.assertIn("room other=allocated", run.out)
        ev = self.summary(run)["evictions"]
        self.assertEqual(ev.get("pressure", 0) + ev.get("make_room", 0), 1, ev)

    def test_bounds_count_parked_blocks(self):
        run = self.same([REUSE, "--mode", "cycle", "--sizes", "1M,2M,3M", "--iters", "2"],
                        LAZYPIN_POOL_ENTRIES="1")
        pool = self.summary(run)
        self.assertLessEqual(pool["pooled_entries"], 1)
        self.assertLessEqual(pool["peak_entries"], 2, "the peak counts the moment before the eviction")
        self.assertGreater(pool["evictions"].get("lru", 0), 0)
        run = self.same([REUSE, "--mode", "cycle", "--sizes", "4M", "--iters", "3"],
                        LAZYPIN_POOL_BYTES="1M")
        self.assertEqual(registers(run), ["miss"] * 3, "too large to pool: nothing parked")

    @unittest.skipUnless(os.path.exists(JEMALLOC), "libjemalloc2 not installed")
    @unittest.skipIf(sanitizer_env.ACTIVE, "two allocators besides ASan's in one process")
    def test_jemalloc_preloaded_steps_aside_once(self):
        argv = [REUSE, "--mode", "cycle", "--sizes", "64K,4M", "--iters", "3"]
        for preload, says in ((self.env()["LD_PRELOAD"] + ":" + JEMALLOC, "the next malloc is"),
                              (JEMALLOC + ":" + self.env()["LD_PRELOAD"], "the process's malloc is")):
            run = self.run_app(argv, LAZYPIN_MODE="defer", LD_PRELOAD=preload)
            self.assertEqual(run.rc, 0, run.err[-3000:])
            self.assertNotIn("WRONG", run.out)
            said = [w for w in warnings(run) if "LAZYPIN_REUSE_FREED steps aside" in w]
            self.assertEqual(len(said), 1, warnings(run))
            self.assertIn(says, said[0])
            self.assertIn("jemalloc", said[0])
            self.assertEqual(self.summary(run)["served"], 0)

    @unittest.skipUnless(os.path.exists(TCMALLOC), "libtcmalloc-minimal4 not installed")
    @unittest.skipIf(sanitizer_env.ACTIVE, "two allocators besides ASan's in one process")
    def test_tcmalloc_after_lazypin_steps_aside_once(self):
        # (tcmalloc before lazypin shadows its munmap: defer turns off altogether.)
        argv = [REUSE, "--mode", "cycle", "--sizes", "64K,4M", "--iters", "3"]
        run = self.run_app(argv, LAZYPIN_MODE="defer",
                           LD_PRELOAD=self.env()["LD_PRELOAD"] + ":" + TCMALLOC)
        self.assertEqual(run.rc, 0, run.err[-3000:])
        self.assertNotIn("WRONG", run.out)
        said = [w for w in warnings(run) if "LAZYPIN_REUSE_FREED steps aside" in w]
        self.assertEqual(len(said), 1, warnings(run))
        self.assertIn("tcmalloc", said[0])
        self.assertEqual(self.summary(run)["served"], 0)

    def test_header_config_names_the_option(self):
        run = self.same([REUSE, "--mode", "cycle", "--sizes", "4K", "--iters", "1"])
        self.assertGreater(run.records[0]["config"]["reuse_freed"], 0)

    def test_reuse_bound_in_bytes(self):
        # Blocks the program believes freed are kept up to LAZYPIN_REUSE_FREED
        # bytes: a 4 MiB block does not fit in 1 MiB, so its free is released.
        run = self.same([REUSE, "--mode", "cycle", "--sizes", "256K,4M", "--iters", "3"],
                        LAZYPIN_REUSE_FREED="1M")
        self.assertEqual(registers(run), cycle_registers("256K", 3) + ["miss", "miss", "miss"])
        pool = self.summary(run)
        self.assertEqual(pool["parked"], 2, "the 256 KiB heap blocks' frees only")
        # Each 4 MiB free and the first 256 KiB one went to the collector (a
        # next block sharing a page with one still pending there, or with a
        # parked one, releases it first: overlap).
        ev = pool["evictions"]
        self.assertGreaterEqual(ev.get("free", 0) + ev.get("overlap", 0), 4, ev)
        self.assertNotIn("lru", ev)


if __name__ == "__main__":
    unittest.main()


NON_PIE_CLIENT = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int cudaHostRegister(void*, size_t, unsigned);
int cudaHostUnregister(void*);
/* Non-PIC code taking malloc's address: the symbol's canonical address is
   this executable's PLT entry (as in Ubuntu's /usr/bin/python3.12). */
__attribute__((noinline)) void* (*address_of_malloc(void))(size_t) { return malloc; }
int main(void) {
  for (int i = 0; i < 4; ++i) {
    char* p = address_of_malloc()(4 << 20);
    memset(p, i, 4 << 20);
    if (cudaHostRegister(p, 4 << 20, 0) != 0) return 1;
    if (cudaHostUnregister(p) != 0) return 2;
    free(p);
  }
  puts("OK");
  return 0;
}
"""


class NonPieExecutableTest(AppTestCase):
    def test_an_executables_plt_entry_for_malloc_is_not_another_allocator(self):
        import shutil
        import subprocess
        from test_preload import SIM
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            self.skipTest("no C compiler")
        src = os.path.join(self.dir, "np.c")
        exe = os.path.join(self.dir, "np")
        with open(src, "w") as f:
            f.write(NON_PIE_CLIENT)
        subprocess.run([cc, "-no-pie", "-fno-pic", "-O1", "-o", exe, src, "-L" + SIM,
                        "-l:libcudart.so.13"], check=True)
        run = self.run_app([exe], LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        self.assertFalse([r for r in run.records if r["type"] == "warning"
                          and "steps aside" in r["message"]])
        regs = [r["action"] for r in calls(run.records) if r["api"] == "cudaHostRegister"]
        self.assertEqual(regs, cycle_registers("4M", 4))
