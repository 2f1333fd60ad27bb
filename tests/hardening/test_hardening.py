"""Hardening: lazypin under threads, re-entrancy, process life events,
other allocators, hostile configuration and memory exhaustion.

Programs from tests/hardening/apps/ (and testapps/) run with the shim preloaded
on the simulated CUDA stack, which aborts loudly ("simcuda: STALE
REGISTRATION") on any copy through a registration whose pages changed. Each
test prints the figures it measured (FIGURE lines; docs/reliability.md quotes
them). Known shim bugs are marked unittest.expectedFailure with the bug named.
Environment (set by CMake): LAZYPIN_LIB, SIMCUDA_DIR, TESTAPPS_DIR, SOURCE_DIR,
HARDENING_APPS_DIR, SIMCUDA_DRIVER. LAZYPIN_SOAK_SECONDS (default 10, at most
30 used by default CI) sets the length of the 32-thread soaks.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
import sanitizer_env  # noqa: E402

LIB = os.environ["LAZYPIN_LIB"]
SIM = os.environ["SIMCUDA_DIR"]
APPS = os.environ["TESTAPPS_DIR"]
HAPPS = os.environ["HARDENING_APPS_DIR"]
SIM_DRIVER = os.environ.get("SIMCUDA_DRIVER", os.path.join(SIM, "libcuda.so.1"))
SOAK = float(os.environ.get("LAZYPIN_SOAK_SECONDS", "10"))
LIBDIR = "/usr/lib/x86_64-linux-gnu"
JEMALLOC = os.path.join(LIBDIR, "libjemalloc.so.2")
TCMALLOC = os.path.join(LIBDIR, "libtcmalloc_minimal.so.4")


def figure(text):
    sys.stderr.write("FIGURE %s\n" % text)
    sys.stderr.flush()


def happ(name):
    return os.path.join(HAPPS, name)


def tapp(name):
    return os.path.join(APPS, name)


def read_log(path):
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


class Run:
    def __init__(self, proc, logs):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.logs = logs
        self.records = read_log(logs[0]) if logs else []

    def summary(self):
        return self.records[-1] if self.records and self.records[-1]["type"] == "summary" else None

    def why(self):
        return "rc=%s\nstdout tail:\n%s\nstderr tail:\n%s" % (self.rc, self.out[-1500:], self.err[-1500:])


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def env(self, shim=True, preload=None, libpath=None, **extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAZYPIN_")}
        env["LD_LIBRARY_PATH"] = libpath or SIM
        env["SIMCUDA_SLEEP"] = "0"
        env["LAZYPIN_SUMMARY"] = "0"
        env.pop("LD_PRELOAD", None)
        if shim:
            env["LD_PRELOAD"] = preload or LIB
            env["LAZYPIN_LOG"] = os.path.join(self.dir, "lp-%p.jsonl")
        elif preload:
            env["LD_PRELOAD"] = preload
        env.update({k: str(v) for k, v in extra.items()})
        return sanitizer_env.apply(env, LIB)

    def run_app(self, argv, shim=True, timeout=120, preload=None, libpath=None, **extra):
        for old in glob.glob(os.path.join(self.dir, "lp-*.jsonl")):
            os.unlink(old)
        proc = subprocess.run(argv, env=self.env(shim, preload, libpath, **extra), cwd=self.dir,
                              text=True, errors="replace", capture_output=True, timeout=timeout)
        self.assertEqual(sanitizer_env.reports(proc.stderr), [], proc.stderr[-3000:])
        logs = sorted(glob.glob(os.path.join(self.dir, "lp-*.jsonl")), key=os.path.getmtime)
        return Run(proc, logs)

    def assertClean(self, run):
        self.assertNotIn("STALE", run.err, run.why())
        self.assertNotIn("UNEXPECTED", run.err, run.why())
        self.assertNotIn("MISMATCH", run.err, run.why())
        self.assertEqual(run.rc, 0, run.why())


# --------------------------------------------------------------------- (a) --
class Threads(Base):
    def test_torture_32_threads_defer(self):
        seconds = SOAK
        run = self.run_app([tapp("torture"), "--threads", "32", "--seconds", str(seconds)],
                           timeout=seconds * 6 + 120, LAZYPIN_MODE="defer",
                           LAZYPIN_POOL_ENTRIES=16)
        self.assertClean(run)
        last = run.out.strip().splitlines()[-1]
        self.assertTrue(last.startswith("TORTURE") and last.endswith(" ok"), last)
        s = run.summary()
        self.assertIsNotNone(s, "the log ends with a summary record")
        self.assertGreater(s["pool"]["hits"], 0)
        figure("torture threads=32 seconds=%g %s hits=%d evictions=%s" % (
            seconds, last[len("TORTURE "):-3], s["pool"]["hits"], json.dumps(s["pool"]["evictions"])))

    def test_hammer_shared_buffers_log_mode(self):
        # Control: log mode forwards every call, so the balance always holds.
        run = self.run_app([happ("hammer"), "--threads", "32", "--seconds", "2"],
                           timeout=120, LAZYPIN_MODE="log")
        self.assertClean(run)
        figure("hammer(log) " + run.out.strip().splitlines()[-1])

    def test_hammer_shared_buffers_defer(self):
        seconds = SOAK
        run = self.run_app([happ("hammer"), "--threads", "32", "--seconds", str(seconds)],
                           timeout=seconds * 6 + 120, LAZYPIN_MODE="defer",
                           LAZYPIN_POOL_ENTRIES=8)
        figure("hammer(defer) rc=%d %s" % (run.rc, (run.out.strip().splitlines() or [""])[-1]
                                            or run.err.strip().splitlines()[-1]))
        self.assertClean(run)

    def test_pool_register_unregister_race_reproducer(self):
        # Deterministic: another thread's unregister lands between the driver's
        # register and the pool's bookkeeping; the next unregister then gets 0
        # (deferred) where the driver says 713.
        proc = subprocess.run([happ("pool_race_test")], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout[-2000:])


# --------------------------------------------------------------------- (b) --
class Reentrancy(Base):
    def compare(self, argv, **extra):
        bare = self.run_app(argv, shim=False)
        self.assertEqual(bare.rc, 0, bare.why())
        run = self.run_app(argv, LAZYPIN_MODE="defer", **extra)
        self.assertClean(run)
        return bare, run

    def test_signal_handler_free_control(self):
        # The handler never interrupts a CUDA call, but it frees pooled memory
        # while the main loop may be inside the driver (cudaMemcpy).
        run = self.run_app([happ("reentry"), "signal", "--seconds", "1"], shim=False, timeout=60)
        self.assertClean(run)
        figure("signal(bare) " + run.out.strip().splitlines()[0])

    def signal_run(self, argv, timeout, reuse=None):
        extra = {} if reuse is None else {"LAZYPIN_REUSE_FREED": reuse}
        try:
            run = self.run_app(argv, timeout=timeout, LAZYPIN_MODE="defer", **extra)
        except subprocess.TimeoutExpired:
            self.fail("hung: free() from a signal handler deadlocked")
        self.assertClean(run)
        line = run.out.strip().splitlines()[0]
        handler_frees = int(line.split("handler_frees=")[1].split()[0])
        self.assertGreater(handler_frees, 100, line)
        s = run.summary()
        self.assertIsNotNone(s)
        # Each handler free of pooled memory went to the collector, or was
        # parked (LAZYPIN_REUSE_FREED: kept registered for a later malloc).
        self.assertGreater(s["pool"]["evictions"].get("free", 0) + s["pool"]["parked"], 100,
                           json.dumps(s["pool"]))
        if reuse == "0":
            self.assertGreater(s["pool"]["evictions"]["free"], 100, json.dumps(s["pool"]))
        return run, line, s

    @unittest.skipIf(sanitizer_env.ACTIVE, "the app's handler frees only glibc's mmap'd chunks")
    def test_signal_handler_free_outside_lazypin(self):
        # SIGALRM is blocked around cudaHostRegister/Unregister, so the handler
        # interrupts the program's own code or cudaMemcpy, i.e. the CUDA driver
        # with its lock held. The handler's free of pooled memory must not call
        # the driver (it would wait for that lock: a self-deadlock): the free
        # hook hands the block to lazypin's collector thread, which unregisters
        # and then frees it.
        for reuse in ("0", None):
            run, line, s = self.signal_run(
                [happ("reentry"), "signal", "--seconds", "1", "--block-cuda"], timeout=20,
                reuse=reuse)
            figure("signal(defer, --block-cuda, reuse %s) %s evictions.free=%d parked=%d" % (
                "off" if reuse else "on", line, s["pool"]["evictions"].get("free", 0),
                s["pool"]["parked"]))

    @unittest.skipIf(sanitizer_env.ACTIVE, "the app's handler frees only glibc's mmap'd chunks")
    def test_signal_handler_free_inside_lazypin(self):
        # The handler may also interrupt cudaHostRegister/Unregister, i.e.
        # lazypin's own code (holding the pool's lock): the free is queued on
        # the thread until lazypin's code returns. A free that lazypin failed to
        # invalidate would leave the old registration in the driver: the next
        # buffer at that address gets 712 or a stale copy (simcuda aborts).
        runs = []
        for reuse in ("0", None, None):
            run, line, s = self.signal_run([happ("reentry"), "signal", "--seconds", "2"], timeout=30,
                                           reuse=reuse)
            runs.append("%s evictions.free=%d parked=%d" % (
                line, s["pool"]["evictions"].get("free", 0), s["pool"]["parked"]))
        figure("signal(defer) x3: " + " | ".join(runs))

    def test_signal_handler_madvise_inside_lazypin(self):
        # The handler drops a pooled buffer's pages (MADV_DONTNEED) while it
        # may have interrupted lazypin's own code (register, unregister and the
        # driver calls lazypin makes for them; the copies are shielded: a
        # handler inside the program's own driver call is the known limit),
        # where no hook may take the pool's lock; the main loop then registers
        # the buffer again. The kernel watch sees the removal, so the register
        # is never a stale hit (the simulated driver aborts on a copy through
        # old pages).
        for _ in range(2):
            run = self.run_app([happ("reentry"), "signal", "--seconds", "2", "--madvise"],
                               timeout=30, LAZYPIN_MODE="defer")
            self.assertClean(run)
            line = run.out.strip().splitlines()[0]
            self.assertGreater(int(line.split("handler_frees=")[1].split()[0]), 100, line)
            s = run.summary()
            self.assertEqual(run.records[0]["watch"], "uffd")
            ev = s["pool"]["evictions"]
            self.assertGreater(ev.get("watch", 0) + ev.get("madvise", 0), 100, json.dumps(s["pool"]))
            figure("signal madvise(defer) %s evictions=%s" % (line, s["pool"]["evictions"]))

    def test_atexit_early_handler_and_very_late_dtor(self):
        # Free of pooled memory from an atexit handler that runs before lazypin's,
        # and from a static destructor that runs after everything (no crash).
        bare, run = self.compare([happ("reentry"), "atexit"])
        self.assertIn("early-atexit freed", run.out)
        self.assertIn("very-late static dtor freed", run.out)

    def test_atexit_late_handler_reuse_same_codes(self):
        # A handler registered after CUDA init but before the first registration
        # runs after lazypin's exit handler: it munmaps pooled memory, maps the
        # same address again and registers it: 712 under lazypin, 0 without.
        bare, run = self.compare([happ("reentry"), "atexit"])
        self.assertEqual(run.out, bare.out)

    def test_static_dtor_reuse_same_codes(self):
        bare, run = self.compare([happ("reentry"), "dtor"])
        self.assertEqual(run.out, bare.out)

    def test_dlopen_dlclose_cuda_library(self):
        argv = [happ("reentry"), "dlopen", happ("libcudalib.so")]
        bare, run = self.compare(argv)
        self.assertEqual(run.out, bare.out)
        s = run.summary()
        self.assertGreater(s["pool"]["hits"], 0)
        figure("dlopen rounds=20 hits=%d evictions=%s" % (s["pool"]["hits"],
                                                          json.dumps(s["pool"]["evictions"])))

    def test_program_calls_free_through_rtld_next(self):
        bare, run = self.compare([happ("reentry"), "rtldnext"])
        self.assertEqual(run.out, bare.out)
        s = run.summary()
        self.assertGreaterEqual(s["pool"]["evictions"].get("free", 0) + s["pool"]["parked"], 1)
        figure("rtldnext rounds=50 evictions=%s" % json.dumps(s["pool"]["evictions"]))


# --------------------------------------------------------------------- (c) --
class ProcessLife(Base):
    def same(self, mode, **extra):
        bare = self.run_app([happ("lifecycle"), mode], shim=False, timeout=60)
        self.assertEqual(bare.rc, 0, bare.why())
        run = self.run_app([happ("lifecycle"), mode], timeout=60, LAZYPIN_MODE="defer", **extra)
        self.assertClean(run)
        self.assertEqual(run.out, bare.out)
        return run

    def test_vfork_exec_and_exit(self):
        run = self.same("vfork")
        # 10 re-registers of kept buffers; a malloc'd block freed and allocated
        # again comes back registered (LAZYPIN_REUSE_FREED): one more hit.
        self.assertGreaterEqual(run.summary()["pool"]["hits"], 10)

    def test_posix_spawn_while_registering(self):
        run = self.same("spawn")
        self.assertIsNotNone(run.summary())

    def test_exit_from_non_main_thread(self):
        for i in range(5):
            run = self.same("thread-exit")
            self.assertIsNotNone(run.summary(), "the log ends with a summary record")

    def test_underscore_exit(self):
        self.same("_exit")

    def assertParentLogOnly(self, run, calls):
        """The log is the parent's alone: its calls, one summary, at exit."""
        self.assertEqual(len(run.logs), 1, run.logs)
        self.assertEqual(len([r for r in run.records if r["type"] == "call"]), calls)
        summaries = [r for r in run.records if r["type"] == "summary"]
        self.assertEqual(len(summaries), 1, summaries)
        self.assertIs(run.records[-1], summaries[0])
        self.assertEqual(summaries[0]["ended_by"], "exit")

    def test_clone_child_without_fork_handlers(self):
        # a child made by clone()/clone3 runs no pthread_atfork
        # handler. It frees the parent's pooled buffer and registers another:
        # lazypin must notice the new process (no collector thread there, the
        # pool's lock possibly held by a parent thread) and pass through, and
        # its exit() must not wait for the parent's threads.
        for how in ("wrapper", "syscall", "clone3"):
            argv = [happ("lifecycle"), "clone", how]
            bare = self.run_app(argv, shim=False, timeout=60)
            self.assertEqual(bare.rc, 0, bare.why())
            self.assertEqual(bare.out.count("child: register=0 copy=0 unregister=0 register=0 "
                                            "unregister=0"), 3, bare.out)
            for mode in ("log", "defer"):
                try:
                    run = self.run_app(argv, timeout=60, LAZYPIN_MODE=mode)
                except subprocess.TimeoutExpired:
                    self.fail("%s %s: hung" % (how, mode))
                self.assertClean(run)
                self.assertEqual(run.out, bare.out, (how, mode))
                self.assertParentLogOnly(run, calls=10)
                if mode == "defer":
                    # (a freed block that comes back registered adds a hit)
                    self.assertGreaterEqual(run.summary()["pool"]["hits"], 3,
                                            "the parent's pool works")
        figure("clone children (wrapper, SYS_clone, clone3) x3 each, log and defer: " +
               bare.out.strip().splitlines()[0])

    def test_child_signal_wait_status_as_bare(self):
        # a forked (no exec) or cloned child that gets SIGTERM/SIGINT
        # dies of it with the same wait status as without lazypin; a handler the
        # program installed (before lazypin set up, or after) runs in the child.
        # "now": the signal may land before fork's child handler has run.
        cases = [("fork", sig, handler, when) for sig in ("TERM", "INT")
                 for handler in ("none", "early", "late") for when in ("ready", "now")]
        cases += [(how, sig, "none", when) for how in ("syscall", "wrapper", "clone3")
                  for sig in ("TERM", "INT") for when in ("ready", "now")]
        cases += [("syscall", "TERM", handler, "ready") for handler in ("early", "late")]
        statuses = set()
        for case in cases:
            argv = [happ("lifecycle"), "signal"] + list(case)
            bare = self.run_app(argv, shim=False, timeout=60)
            self.assertEqual(bare.rc, 0, bare.why())
            status = [l for l in bare.out.splitlines() if l.startswith("child %s SIG" % case[0])][0]
            signo = 15 if case[1] == "TERM" else 2
            if case[2] == "none":
                self.assertIn("signaled=1 termsig=%d" % signo, status)
            else:
                self.assertIn("child handler: signal %02d" % signo, bare.out)
                self.assertIn("exited=1 code=%d" % (40 + signo), status)
            statuses.add(status.split(": ", 1)[1])
            for mode in ("log", "defer"):
                try:
                    run = self.run_app(argv, timeout=60, LAZYPIN_MODE=mode)
                except subprocess.TimeoutExpired:
                    self.fail("%s %s: hung (the child survived its signal?)" % (case, mode))
                self.assertClean(run)
                self.assertEqual(run.out, bare.out, (case, mode))
                self.assertParentLogOnly(run, calls=4)
        figure("child signals, %d cases x (bare, log, defer), wait statuses as bare: %s" % (
            len(cases), "; ".join(sorted(statuses))))

    def test_device_reset_mid_run(self):
        run = self.same("reset")
        ev = run.summary()["pool"]["evictions"]
        self.assertGreater(ev.get("context", 0), 0, ev)


# --------------------------------------------------------------------- (d) --
def have(path):
    return os.path.exists(path)


class Allocators(Base):
    def torture(self, preload):
        run = self.run_app([tapp("torture"), "--threads", "4", "--seconds", "2"], preload=preload,
                           timeout=120, LAZYPIN_MODE="defer", LAZYPIN_POOL_ENTRIES=8)
        self.assertClean(run)
        s = run.summary()
        turned_off = "defer turned off" in run.err
        if not turned_off:
            self.assertGreater(s["pool"]["hits"], 0)
        figure("torture LD_PRELOAD=%s: %s; %s" % (
            ":".join(os.path.basename(p) for p in preload.split(":")),
            run.out.strip().splitlines()[-1].split(" copies")[0],
            "defer turned itself off (self-test)" if turned_off else
            "hits=%d evictions=%s" % (s["pool"]["hits"], json.dumps(s["pool"]["evictions"]))))
        return turned_off

    @unittest.skipUnless(have(JEMALLOC), "libjemalloc2 not installed (scripts/setup installs it)")
    @unittest.skipIf(sanitizer_env.ACTIVE, "two allocators besides ASan's in one process")
    def test_jemalloc_before_and_after(self):
        self.assertFalse(self.torture(JEMALLOC + ":" + LIB))
        self.assertFalse(self.torture(LIB + ":" + JEMALLOC))

    @unittest.skipUnless(have(TCMALLOC), "libtcmalloc-minimal4 not installed (scripts/setup installs it)")
    def test_tcmalloc_before_and_after(self):
        # tcmalloc first: its munmap shadows lazypin's, so the self-test turns
        # defer off (and says so): safe, logging only.
        self.torture(TCMALLOC + ":" + LIB)
        self.assertFalse(self.torture(LIB + ":" + TCMALLOC))

    def canaries(self, label, app, preload):
        """pooled blocks of 1 and 8 bytes freed next to canary blocks,
        32 rounds each; every canary intact, as without lazypin."""
        argv = [happ(app), "--rounds", "32", "--sizes", "1,8"]
        bare = self.run_app(argv, shim=False, preload=preload if preload != LIB else None)
        self.assertEqual(bare.rc, 0, bare.why())
        self.assertIn("CANARY ok", bare.out)
        for mode in ("log", "defer"):
            run = self.run_app(argv, preload=preload, LAZYPIN_MODE=mode)
            self.assertClean(run)
            self.assertNotIn("DAMAGED", run.err, run.why())
            self.assertEqual(run.out, bare.out, (label, mode))
            if mode == "defer":
                # A non-glibc free passes the memory hooks' self-test: defer stays on.
                self.assertNotIn("defer turned off", run.err)
                self.assertEqual(run.records[0]["mode"], "defer")
                ev = run.summary()["pool"]["evictions"]
        figure("canaries %s: %s; defer evictions=%s" % (
            label, " ".join(l for l in run.out.splitlines() if "size=" in l), json.dumps(ev)))
        return ev

    def assertPooledFreesReleased(self, ev):
        # Each of the 64 pooled frees went through the collector, except when
        # the program's next register shared a page with the pooled block
        # before the collector got to it: then that register released it
        # first ("overlap"), which is as correct, and only a matter of timing.
        self.assertEqual(ev.get("free", 0) + ev.get("overlap", 0), 64, ev)

    @unittest.skipUnless(have(JEMALLOC), "libjemalloc2 not installed (scripts/setup installs it)")
    @unittest.skipIf(sanitizer_env.ACTIVE, "two allocators besides ASan's in one process")
    def test_canaries_jemalloc(self):
        ev = self.canaries("jemalloc after lazypin", "canary", LIB + ":" + JEMALLOC)
        self.assertPooledFreesReleased(ev)

    @unittest.skipUnless(have(TCMALLOC), "libtcmalloc-minimal4 not installed (scripts/setup installs it)")
    @unittest.skipIf(sanitizer_env.ACTIVE, "two allocators besides ASan's in one process")
    def test_canaries_tcmalloc(self):
        ev = self.canaries("tcmalloc after lazypin", "canary", LIB + ":" + TCMALLOC)
        self.assertPooledFreesReleased(ev)

    @unittest.skipIf(sanitizer_env.ACTIVE, "the program's own malloc besides ASan's")
    def test_canaries_program_allocator(self):
        # The executable defines malloc/free: lazypin's free hook never runs, the
        # allocator keeps freed blocks mapped (so the pooled registration stays
        # valid) and writes its free list into them.
        ev = self.canaries("own malloc in the executable", "canary_ownmalloc", LIB)
        self.assertNotIn("free", ev)

    def test_own_mmap_allocator(self):
        bare = self.run_app([happ("ownalloc")], shim=False)
        self.assertEqual(bare.rc, 0, bare.why())
        run = self.run_app([happ("ownalloc")], LAZYPIN_MODE="defer")
        self.assertClean(run)
        self.assertEqual(run.out, bare.out)
        ev = run.summary()["pool"]["evictions"]
        for reason in ("munmap", "mmap_fixed", "madvise"):
            self.assertGreater(ev.get(reason, 0), 0, ev)
        figure("ownalloc %s evictions=%s" % (run.out.strip().splitlines()[-1], json.dumps(ev)))


# --------------------------------------------------------------------- (e) --
VARIABLES = ["LAZYPIN_MODE", "LAZYPIN_LOG", "LAZYPIN_SUMMARY", "LAZYPIN_POOL_BYTES",
             "LAZYPIN_POOL_ENTRIES", "LAZYPIN_IDLE_MS", "LAZYPIN_CHECK_PFN",
             "LAZYPIN_RELEASE_AT_EXIT"]
BAD_VALUES = {
    "empty": "",
    "negative": "-1",
    "huge": "18446744073709551616",
    "garbage": "x!@#$%^&*()",
    "overflow": "99999999999999999999G",
    "unicode": "d\u00e9fer\u2192\u221e\U0001F600",
    "long": "9" * 10240,
}


class HostileConfig(Base):
    APP = "path_runtime_shared"

    def check(self, bare, run, bad_vars, label):
        self.assertEqual(run.rc, 0, "%s: %s" % (label, run.why()))
        self.assertEqual(run.out, bare.out, label)
        lines = run.err.splitlines()
        for var in bad_vars:
            naming = [l for l in lines if var + "=" in l]
            if var == "LAZYPIN_LOG":
                self.assertLessEqual(len(naming), 1, (label, naming))
            else:
                self.assertEqual(len(naming), 1, (label, var, run.err[-2000:]))
                self.assertIn("accepts", naming[0])
            for l in naming:
                self.assertLess(len(l), 400, (label, "line too long"))
        lazypin_lines = [l for l in lines if l.startswith("lazypin")]
        # One per bad variable, plus at most one about the log file.
        self.assertLessEqual(len(lazypin_lines), len(bad_vars) + 1, (label, lazypin_lines[:20]))

    def test_every_variable_every_bad_value(self):
        bare = self.run_app([tapp(self.APP)], shim=False)
        tried = 0
        for var in VARIABLES:
            for kind, value in BAD_VALUES.items():
                extra = {"LAZYPIN_MODE": "defer"} if var != "LAZYPIN_MODE" else {}
                extra[var] = value  # a bad LAZYPIN_SUMMARY means the default (1): a summary
                run = self.run_app([tapp(self.APP)], timeout=60, **extra)
                if var == "LAZYPIN_SUMMARY":  # drop the summary text itself
                    run.err = "\n".join(l for l in run.err.splitlines()
                                        if l.startswith("lazypin: LAZYPIN_") or "log" in l)
                self.check(bare, run, [var], "%s=%s" % (var, kind))
                tried += 1
        for kind, value in BAD_VALUES.items():  # every variable bad at once
            extra = {var: value for var in VARIABLES if var != "LAZYPIN_SUMMARY"}
            run = self.run_app([tapp(self.APP)], timeout=60, **extra)
            self.check(bare, run, [v for v in VARIABLES if v != "LAZYPIN_SUMMARY"],
                       "all=%s" % kind)
            tried += 1
        figure("hostile configuration: %d runs (%d variables x %d bad values, plus %d all-at-once)"
               % (tried, len(VARIABLES), len(BAD_VALUES), len(BAD_VALUES)))

    def log_unusable(self, path, app="diffseq_shared"):
        bare = self.run_app([tapp(app)], shim=False)
        run = self.run_app([tapp(app)], LAZYPIN_MODE="defer", LAZYPIN_LOG=path)
        self.assertEqual(run.rc, 0, run.why())
        self.assertEqual(run.out, bare.out)
        lines = [l for l in run.err.splitlines() if l.startswith("lazypin")]
        self.assertLessEqual(len(lines), 1, lines)
        return run

    def test_log_unwritable_and_missing_directory(self):
        for path in ("/proc/lazypin.jsonl", "/nonexistent/dir/lp.jsonl",
                     os.path.join(self.dir, "x" * 300, "lp.jsonl")):
            run = self.log_unusable(path)
            self.assertIn("not writing a log file", run.err)

    def test_log_on_full_tmpfs(self):
        mnt = os.path.join(self.dir, "small")
        os.mkdir(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt],
                          capture_output=True).returncode != 0:
            self.skipTest("cannot mount a tmpfs here (needs root)")
        try:
            # Leave about 8 KiB free: the log starts, then runs out of space.
            with open(os.path.join(mnt, "fill"), "wb") as f:
                try:
                    f.write(b"\0" * (56 * 1024))
                except OSError:
                    pass
            run = self.log_unusable(os.path.join(mnt, "lp.jsonl"))
            figure("log on a full 64 KiB tmpfs: %s" % (run.err.strip().splitlines() or ["(no line)"])[-1][:160])
            self.assertIn("incomplete", run.err)
        finally:
            subprocess.run(["umount", mnt], capture_output=True)


# --------------------------------------------------------------------- (g) --
class LogPath(Base):
    """The log file (issues 15 and 17): no open that blocks, no link followed in
    any component, no existing file ever opened (a taken name gets a suffixed
    log), and valid UTF-8 whatever bytes argv holds. Each case in log and
    defer mode; the program's output and exit status are as without lazypin."""
    APP = "path_runtime_shared"
    MODES = ("log", "defer")

    def setUp(self):
        super().setUp()
        self.bare = self.launch(shim=False)
        self.assertEqual(self.bare.returncode, 0, self.bare.stderr[-2000:])

    def launch(self, shim=True, argv=None, pass_fds=(), timeout=10, **extra):
        try:
            return subprocess.run(argv or [tapp(self.APP)], env=self.env(shim, **extra),
                                  cwd=self.dir, capture_output=True, timeout=timeout,
                                  pass_fds=pass_fds)
        except subprocess.TimeoutExpired:
            self.fail("hung (%s s): %s" % (timeout, extra))

    @staticmethod
    def lazypin_lines(proc):
        return [l for l in proc.stderr.decode("utf-8", "replace").splitlines()
                if l.startswith("lazypin")]

    def assertRuns(self, proc):
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        self.assertEqual(proc.stdout, self.bare.stdout)
        self.assertEqual(sanitizer_env.reports(proc.stderr.decode("utf-8", "replace")), [])

    def assertCompleteLog(self, path, pid=None):
        with open(path, "rb") as f:
            records = [json.loads(l.decode("utf-8", "strict")) for l in f if l.strip()]
        self.assertEqual(records[0]["type"], "header", path)
        self.assertEqual(records[-1]["type"], "summary", path)
        self.assertEqual(records[0]["config"]["log"], path)
        if pid is not None:
            self.assertEqual(records[0]["pid"], pid)
        return records

    def refused(self, path, why, **run):
        """Runs the app with LAZYPIN_LOG=path in each mode: it runs as bare, with
        exactly one lazypin line, which names the variable and `why`."""
        before = sorted(os.listdir(self.dir))
        for mode in self.MODES:
            proc = self.launch(LAZYPIN_MODE=mode, LAZYPIN_LOG=path, **run)
            self.assertRuns(proc)
            lines = self.lazypin_lines(proc)
            self.assertEqual(len(lines), 1, (mode, lines))
            self.assertIn("LAZYPIN_LOG=", lines[0])
            self.assertIn(why, lines[0])
            self.assertIn("not writing a log file", lines[0])
            self.assertLess(len(lines[0]), 400)
            self.assertEqual(sorted(os.listdir(self.dir)), before, "no file was created")
        figure("LAZYPIN_LOG=%s: %s" % (path.replace(self.dir, "$TMP"),
                                       lines[0].replace(self.dir, "$TMP")[:200]))

    def test_fifo_is_refused_and_never_blocks(self):
        fifo = os.path.join(self.dir, "lp.fifo")
        os.mkfifo(fifo)
        self.refused(fifo, "is a FIFO, not a regular file")

    def test_socket_is_refused(self):
        import socket
        path = os.path.join(self.dir, "lp.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.listen(1)
        try:
            self.refused(path, "is a socket, not a regular file")
        finally:
            s.close()

    def test_dev_null_is_refused(self):
        self.refused("/dev/null", "is a character device, not a regular file")

    def test_directory_is_refused(self):
        os.mkdir(os.path.join(self.dir, "d"))
        self.refused(os.path.join(self.dir, "d"), "is a directory, not a regular file")
        self.refused(os.path.join(self.dir, "d") + "/", "names a directory")

    def write_victim(self, path):
        with open(path, "w") as f:
            f.write("root:x:0:0:root:/root:/bin/sh\n")
        return os.stat(path)

    def assertUntouched(self, path, st):
        with open(path) as f:
            self.assertEqual(f.read(), "root:x:0:0:root:/root:/bin/sh\n")
        now = os.stat(path)
        self.assertEqual((now.st_size, now.st_mtime_ns, now.st_mode), (st.st_size, st.st_mtime_ns, st.st_mode))

    def test_symlink_in_the_last_component(self):
        victim = os.path.join(self.dir, "passwd")
        st = self.write_victim(victim)
        os.symlink(victim, os.path.join(self.dir, "lp.jsonl"))
        self.refused(os.path.join(self.dir, "lp.jsonl"), "symbolic link")
        self.assertUntouched(victim, st)

    def test_symlink_in_a_middle_component(self):
        # dir/link -> other, which holds a file of the log's name.
        other = os.path.join(self.dir, "other")
        os.mkdir(other)
        st = self.write_victim(os.path.join(other, "passwd"))
        os.mkdir(os.path.join(self.dir, "dir"))
        os.symlink(other, os.path.join(self.dir, "dir", "link"))
        self.refused(os.path.join(self.dir, "dir", "link", "passwd"),
                     'goes through a symbolic link ("%s")' % os.path.join(self.dir, "dir", "link"))
        self.assertUntouched(os.path.join(other, "passwd"), st)
        self.refused(os.path.join(self.dir, "dir", "link", "new.jsonl"), "symbolic link")
        self.assertEqual(os.listdir(other), ["passwd"])

    def test_proc_self_fd_magic_links(self):
        victim = os.path.join(self.dir, "passwd")
        st = self.write_victim(victim)
        fd = os.open(victim, os.O_RDWR)
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.refused("/proc/self/fd/%d" % fd, "symbolic link", pass_fds=(fd, dfd))
            self.refused("/proc/self/fd/%d/passwd" % dfd, "symbolic link", pass_fds=(fd, dfd))
            self.refused("/proc/self/fd/%d/new.jsonl" % dfd, "symbolic link", pass_fds=(fd, dfd))
        finally:
            os.close(fd)
            os.close(dfd)
        self.assertUntouched(victim, st)

    def taken_name(self, setup):
        """A name already taken by a regular file: the log goes to a suffixed
        name (one line says which), and the file is unchanged."""
        path = os.path.join(self.dir, "lp.jsonl")
        for mode in self.MODES:
            for old in glob.glob(os.path.join(self.dir, "*")):
                os.unlink(old)
            victim, st = setup(path)
            proc = self.launch(LAZYPIN_MODE=mode, LAZYPIN_LOG=path)
            self.assertRuns(proc)
            lines = self.lazypin_lines(proc)
            used = os.path.join(self.dir, "lp.1.jsonl")
            self.assertEqual(lines, ['lazypin: LAZYPIN_LOG="%s" exists (lazypin never overwrites a '
                                     'file); this process logs to "%s"' % (path, used)])
            self.assertUntouched(victim, st)
            records = self.assertCompleteLog(used)
            self.assertEqual(records[0]["mode"], mode)
            self.assertEqual(os.stat(used).st_mode & 0o777, 0o600)
        figure("taken log name: " + lines[0].replace(self.dir, "$TMP"))

    def test_existing_log_of_the_same_name(self):
        self.taken_name(lambda path: (path, self.write_victim(path)))

    def test_hard_link_to_a_user_file(self):
        def setup(path):
            victim = os.path.join(self.dir, "passwd")
            st = self.write_victim(victim)
            os.link(victim, path)
            return victim, os.stat(victim)
        self.taken_name(setup)

    def test_three_processes_one_fixed_name(self):
        # each process keeps its own complete log.
        path = os.path.join(self.dir, "same.jsonl")
        for mode in self.MODES:
            for old in glob.glob(os.path.join(self.dir, "same*")):
                os.unlink(old)
            env = self.env(LAZYPIN_MODE=mode, LAZYPIN_LOG=path)
            procs = [subprocess.Popen([tapp(self.APP)], env=env, cwd=self.dir,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                     for _ in range(3)]
            outs = [p.communicate(timeout=60) for p in procs]
            for p, (out, err) in zip(procs, outs):
                self.assertEqual(p.returncode, 0, err[-2000:])
                self.assertEqual(out, self.bare.stdout)
            logs = sorted(glob.glob(os.path.join(self.dir, "same*.jsonl")))
            self.assertEqual(logs, [os.path.join(self.dir, n)
                                    for n in ("same.1.jsonl", "same.2.jsonl", "same.jsonl")])
            pids = {self.assertCompleteLog(log)[0]["pid"] for log in logs}
            self.assertEqual(pids, {p.pid for p in procs})
            moved = [l for _, err in outs for l in err.decode().splitlines() if "logs to" in l]
            self.assertEqual(len(moved), 2, moved)
            report = subprocess.run([sys.executable, os.path.join(os.environ["SOURCE_DIR"], "scripts",
                                                                  "lazypin"), "report", "--json"] + logs,
                                    capture_output=True, text=True, timeout=60)
            self.assertEqual(report.returncode, 0, report.stderr[-2000:])
            self.assertEqual(sorted(p["pid"] for p in json.loads(report.stdout)["processes"]),
                             sorted(pids))
        figure("three processes, LAZYPIN_LOG=same.jsonl: logs %s" % ", ".join(
            os.path.basename(l) for l in logs))

    def test_invalid_utf8_argv_is_valid_json(self):
        args = [b"\xff\xfe", b"cut\xe2\x82", b"caf\xc3\xa9", b"sur\xed\xa0\x80", b"q\"\\\n"]
        path = os.path.join(self.dir, "utf8.jsonl")
        for mode in self.MODES:
            if os.path.exists(path):
                os.unlink(path)
            proc = self.launch(argv=[tapp(self.APP).encode()] + args, LAZYPIN_MODE=mode,
                               LAZYPIN_LOG=path)
            self.assertRuns(proc)
            header = self.assertCompleteLog(path, pid=None)[0]
            self.assertEqual(header["argv"][1:], [a.decode("utf-8", "replace") for a in args])
            report = subprocess.run([sys.executable, os.path.join(os.environ["SOURCE_DIR"], "scripts",
                                                                  "lazypin"), "report", "--json", path],
                                    capture_output=True, timeout=60)
            self.assertEqual(report.returncode, 0, report.stderr[-2000:])
            doc = json.loads(report.stdout.decode("utf-8", "strict"))
            self.assertIn([a.decode("utf-8", "replace") for a in args],
                          [p["argv"][1:] for p in doc["processes"]], json.dumps(doc)[:2000])


# --------------------------------------------------------------------- (f) --
class Exhaustion(Base):
    """The simulated driver has no pinned-memory limit, and RLIMIT_MEMLOCK does
    not apply to it (it registers whatever is mapped; root is not limited). A
    stand-in libcuda.so.1 (apps/memlimit.cc) forwards to the sim and fails a
    register with out of memory (2) past MEMLIMIT_BYTES."""
    LIMIT = 4 << 20

    def run_exhaust(self, shim, **extra):
        libpath = os.path.join(HAPPS, "memlimit") + ":" + SIM
        return self.run_app([happ("exhaust"), "--buffers", "4"], shim=shim, libpath=libpath,
                            SIMCUDA_DRIVER=SIM_DRIVER, MEMLIMIT_BYTES=self.LIMIT, **extra)

    @staticmethod
    def codes(out):
        return [l.split(" last=")[0] for l in out.splitlines()]

    def test_make_room_then_driver_answer(self):
        bare = self.run_exhaust(False)
        self.assertEqual(bare.rc, 0, bare.why())
        self.assertIn("phase3 register one more 5 -> 2", bare.out)
        run = self.run_exhaust(True, LAZYPIN_MODE="defer")
        self.assertClean(run)
        self.assertEqual(self.codes(run.out), self.codes(bare.out))
        ev = run.summary()["pool"]["evictions"]
        self.assertGreater(ev.get("make_room", 0), 0, ev)
        failed = [r for r in run.records if r["type"] == "call" and r["result"] == 2]
        self.assertEqual(len(failed), 2)
        figure("exhaustion: limit 4 MiB, 4 pooled buffers; make_room evictions=%d; "
               "out-of-memory calls passed on=%d" % (ev["make_room"], len(failed)))

    @unittest.skipIf(sanitizer_env.ACTIVE, "ASan's allocator keeps freed memory in quarantine")
    def test_big_pooled_free_returns_memory_before_it_returns(self):
        # The collector frees pooled blocks after unregistering them; past 64 MiB
        # pending, free() waits for that, so a program that frees a big buffer
        # and allocates another does not need both at once.
        # Freed blocks kept for reuse are bounded by LAZYPIN_REUSE_FREED: a
        # 160 MiB block past a 100 MiB bound is released as without reuse.
        argv = [happ("exhaust"), "--big-free", "160"]
        bare = self.run_app(argv, shim=False)
        self.assertEqual(bare.rc, 0, bare.why())
        for reuse in ("0", "100M"):
            run = self.run_app(argv, LAZYPIN_MODE="defer", LAZYPIN_REUSE_FREED=reuse)
            self.assertClean(run)
            self.assertEqual(run.out, bare.out)
            self.assertEqual(run.out.count("released=yes"), 3, run.out)
            self.assertEqual(run.summary()["pool"]["evictions"].get("free"), 3)
        figure("big-free 3 x 160 MiB: " + run.out.strip().replace("\n", " | "))

    def test_make_room_leaves_no_last_error(self):
        bare = self.run_exhaust(False)
        run = self.run_exhaust(True, LAZYPIN_MODE="defer")
        self.assertEqual(run.out, bare.out)

    def test_layered_driver_that_uses_dlsym(self):
        # The stand-in driver looks up the sim's cuGetProcAddress_v2 with plain
        # dlsym, as a naive layered driver (a tracer, a forwarding libcuda)
        # would. lazypin hands it its hook, whose "real" is the stand-in's own
        # getter (the first one it was offered): infinite recursion, SIGSEGV.
        bare = self.run_exhaust(False)
        run = self.run_exhaust(True, LAZYPIN_MODE="defer", MEMLIMIT_PLAIN_DLSYM=1)
        self.assertEqual(run.rc, 0, run.why())
        self.assertEqual(self.codes(run.out), self.codes(bare.out))


if __name__ == "__main__":
    unittest.main()
