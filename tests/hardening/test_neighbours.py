"""What lazypin keeps behind the program's back stays out of its way:
descriptors the program takes over, children made without fork(), address
space limits, staged copies, blocks handed out again, signals and threads.
tests/hardening/apps/neighbours prints what it observed; each case runs bare
and under every mode it concerns, three times each, and must print the same
and end the same way (exit status; glibc's message where it aborts).
"""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_hardening import Base, happ  # noqa: E402

APP = happ("neighbours")
RUNS = 3

LOG = {"LAZYPIN_MODE": "log"}
DEFER = {"LAZYPIN_MODE": "defer"}
MODES = {"log": LOG, "defer": DEFER}
# A stream kept busy on the simulator: the copies from deferred memory are staged.
BUSY = {"SIMCUDA_SLEEP": "1", "SIMCUDA_KERNEL_US": "20000"}


def glibc_lines(err):
    return [l for l in err.splitlines() if "free(" in l or "realloc(" in l or "munmap_chunk" in l]


class Neighbours(Base):
    def compare(self, args, modes=MODES, extra=None, timeout=120):
        """Bare, then each mode, RUNS times each: the same stdout, exit
        status and glibc message as the first bare run."""
        extra = extra or {}
        bare = self.run_app([APP] + args, shim=False, timeout=timeout, **extra)
        self.assertNotIn("UNEXPECTED", bare.err, bare.why())
        runs = {}
        for label, env in [("bare", None)] + list(modes.items()):
            for i in range(RUNS):
                if env is None:
                    run = self.run_app([APP] + args, shim=False, timeout=timeout, **extra)
                else:
                    run = self.run_app([APP] + args, timeout=timeout, **dict(extra, **env))
                where = (label, i, args, run.why(), bare.why())
                self.assertNotIn("STALE", run.err, where)
                self.assertEqual(run.out, bare.out, where)
                self.assertEqual(run.rc, bare.rc, where)
                self.assertEqual(glibc_lines(run.err), glibc_lines(bare.err), where)
                runs[label] = run
        return bare, runs

    # -- descriptors the program owns ------------------------------------------
    # A pipe dup2'd onto every descriptor from 100 up (where lazypin keeps its
    # log): the program reads back exactly what it wrote.
    def test_log_descriptor_taken_over(self):
        bare, runs = self.compare(["logfd"])
        self.assertIn("read back 1024", bare.out)
        self.assertTrue(runs["log"].records, "the log goes on in its own file")

    # Every descriptor from 3 up closed (close() on each, close_range,
    # closefrom): the program closes what it opened, lazypin's are not its to
    # close (EBADF, as for a closed number), and the log holds every call.
    def test_program_closes_every_descriptor(self):
        for how in ("close", "range", "from"):
            bare, runs = self.compare(["closeall", how])
            self.assertIn("next open: 3", bare.out)
            for label, run in runs.items():
                if label == "bare":
                    continue
                calls = [r for r in run.records if r["type"] == "call"]
                self.assertGreaterEqual(len(calls), 2 * 104, (how, label, len(calls)))

    # A pipe's read end dup2'd onto the kernel watch's descriptor: the
    # program's byte stays in its pipe, and a mapping made where deferred
    # memory was unmapped is copied with its own bytes.
    def test_watch_descriptor_taken_over(self):
        bare, _ = self.compare(["watchfd"])
        self.assertIn("stale copies: 0", bare.out)
        self.assertIn("byte: read", bare.out)

    # open() gives the lowest free number while lazypin keeps memory (its
    # memory readings never take a number the program could get).
    def test_open_gives_the_lowest_descriptor(self):
        bare, _ = self.compare(["lowest"], modes={"defer": DEFER})
        self.assertIn(": 0 of 20000", bare.out)

    # -- children made without fork() ---------------------------------------------
    def test_raw_fork_children(self):
        for how in ("syscall", "clone"):
            bare, _ = self.compare(["rawfork", how])
            self.assertIn("child: register 0, copy fresh bytes, unregister 0", bare.out)

    # A raw copy made just after the first register, while lazypin's threads
    # start and make their first allocations: no child inherits an allocator
    # lock that one of them held (the fork fence). Without the fence about 1
    # run in 15 hung; 15 runs a mode.
    def test_raw_copy_while_lazypin_threads_start(self):
        for label, env in MODES.items():
            for i in range(15):
                run = self.run_app([APP, "rawfork", "syscall"], timeout=60, **env)
                self.assertIn("child exit: 0", run.out, (label, i, run.why()))

    # -- address-space limits ---------------------------------------------------------
    def test_address_space_limits(self):
        for what in ("as", "data"):
            bare, _ = self.compare(["rlimit", what], modes={"defer": DEFER})
            self.assertIn("malloc 80 MiB: ok", bare.out)

    # -- staged copies --------------------------------------------------------------------
    def test_staged_copy_refused_before_a_byte_moves(self):
        bare, _ = self.compare(["staged"], extra=BUSY)
        self.assertIn("device bytes changed: 0", bare.out)
        self.assertIn("2 MiB into 2 MiB: arrived", bare.out)

    def test_staged_copy_after_thread_teardown(self):
        for where in ("tls", "key", "atexit"):
            bare, _ = self.compare(["stagedlate", where], extra=BUSY)
            self.assertIn("own mapping bytes changed: 0", bare.out)

    # -- blocks handed out again --------------------------------------------------------------
    def test_served_blocks_as_fresh_ones(self):
        for what in ("sizes", "tail", "mallinfo"):
            self.compare(["served", what])

    def test_freed_pinned_memory_faults(self):
        bare, _ = self.compare(["served", "readfreed"])
        self.assertEqual(bare.rc, -11, bare.why())

    def test_realloc_of_an_interior_pointer_aborts(self):
        bare, _ = self.compare(["served", "interior"])
        self.assertEqual(bare.rc, -6, bare.why())

    # -- signals and threads -----------------------------------------------------------------------
    def test_dispositions_are_the_programs(self):
        bare, _ = self.compare(["signals"])
        self.assertIn("after CUDA: SIGINT default, SIGTERM default", bare.out)

    # Every lazypin thread takes a signal sent to each thread, but the kernel
    # watch's reader (README: a handler there could wait for itself).
    def test_every_thread_acknowledges(self):
        bare, _ = self.compare(["census"], modes={"log": LOG, "defer, hooks watch":
                                                  dict(DEFER, LAZYPIN_WATCH="hooks")})
        self.assertIn("acknowledged: yes", bare.out)
        run = self.run_app([APP, "census"], **DEFER)
        if run.records and run.records[0].get("watch") == "uffd":
            self.assertIn("acknowledged: no", run.out)


if __name__ == "__main__":
    unittest.main()
