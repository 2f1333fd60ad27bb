"""lazypin in unusual surroundings: a fiber whose stack holds a bogus return
address, seccomp filters that kill on a system call, memory with a protected
page, a low RLIMIT_NOFILE. apps/confined.cc runs bare, then under lazypin in
log and defer mode; the output and exit status must be the bare run's.
Environment as for test_hardening.py (set by CMake)."""
import os
import unittest

from test_hardening import Base, figure, happ


class Confined(Base):
    MODES = ("log", "defer")

    def same_as_bare(self, args, modes=MODES, **extra):
        """Runs confined `args` bare and in each mode; returns {mode: run}."""
        argv = [happ("confined")] + list(args)
        bare = self.run_app(argv, shim=False, timeout=60)
        self.assertEqual(bare.rc, 0, bare.why())
        runs = {}
        for mode in modes:
            run = self.run_app(argv, timeout=60, LAZYPIN_MODE=mode, **extra)
            self.assertEqual(run.rc, bare.rc, (args, mode, run.why()))
            self.assertEqual(run.out, bare.out, (args, mode))
            self.assertNotIn("STALE", run.err, run.why())
            runs[mode] = run
        return bare, runs

    def test_fiber_with_bogus_return_address(self):
        # The unwinder must never read at a bogus return address, nor past the
        # stack's mapping (the guard page above the fiber's stack).
        for kind in ("unmapped", "data", "code", "guard"):
            for stacks in ("1", "all"):
                bare, runs = self.same_as_bare(["fiber", kind], LAZYPIN_STACKS=stacks)
            stacks = [r for r in runs["log"].records if r["type"] == "stack"]
            self.assertTrue(stacks, "the fiber's calls have stacks")
            self.assertTrue(all(len(s["frames"]) >= 1 for s in stacks), stacks)
        figure("fibers with a bogus outermost return address (unmapped, data, code, a guard "
               "page above the stack), LAZYPIN_STACKS=1 and all: output and exit as bare")

    def test_seccomp_filter_kills_nothing_of_lazypins(self):
        cases = [("userfaultfd", "early"), ("set_mempolicy", "early"), ("set_mempolicy", "late"),
                 ("get_mempolicy", "late")]
        for call, when in cases:
            bare, runs = self.same_as_bare(["seccomp", call, when])
            self.assertIn("alive", bare.out)
            lines = [l for l in runs["defer"].err.splitlines() if l.startswith("lazypin")]
            self.assertEqual(len(lines), 1, lines)  # said once
            self.assertIn("seccomp filter is in force", lines[0])
            self.assertLess(len(lines[0]), 400)
            self.assertEqual([l for l in runs["log"].err.splitlines() if l.startswith("lazypin")],
                             [], "log mode makes none of those calls: nothing to say")
            if when == "early":
                self.assertEqual(runs["defer"].records[0]["watch"], "hooks")
                self.assertEqual(runs["defer"].records[0]["mode"], "defer")
        figure("seccomp filters killing on %s: output and exit as bare in log and defer mode" %
               ", ".join("%s (%s)" % c for c in cases))

    def test_seccomp_watch_kernel_is_asked_for(self):
        # LAZYPIN_WATCH=kernel asks for the watch: tried under a filter that
        # does not forbid it.
        bare, runs = self.same_as_bare(["seccomp", "set_mempolicy", "early"], modes=("defer",),
                                       LAZYPIN_WATCH="kernel")
        self.assertEqual(runs["defer"].records[0]["watch"], "uffd")

    def test_prefault_nothing_for_a_refused_register(self):
        for how in ("none", "read"):
            bare, runs = self.same_as_bare(["protect", how], LAZYPIN_PREFAULT="4")
            self.assertIn("register=1 resident_past_it_mib=0", bare.out)
        figure("96 MiB register with one PROT_NONE / read-only page at 24 MiB: refused (1), "
               "nothing faulted in past it, as bare")

    def test_rlimit_nofile(self):
        # The limit lowered after lazypin set up: the program opens as many
        # descriptors as bare (lazypin's few sit above the new limit).
        bare, runs = self.same_as_bare(["nofile", "late"])
        figure("RLIMIT_NOFILE lowered to 64 after set-up: " + bare.out.splitlines()[-2])
        # Lowered before: lazypin holds the log file (log mode), the kernel
        # watch's userfaultfd too (defer mode), and where it may keep memory
        # (freed blocks, cudaFreeHost'd blocks: the defaults) /proc/meminfo,
        # with the cgroup's limit and usage files under a cgroup limit, as
        # the README says.
        argv = [happ("confined"), "nofile", "early"]
        bare = self.run_app(argv, shim=False, timeout=60)
        self.assertEqual(bare.rc, 0, bare.why())
        opened = lambda run: int(run.out.split("opened=")[1].split()[0])  # noqa: E731
        nothing_kept = {"LAZYPIN_REUSE_FREED": "0", "LAZYPIN_HOST_ALLOC_CACHE": "0"}
        expect = [("off", {}, (0,)), ("log", {}, (1,)), ("defer", nothing_kept, (2,)),
                  ("defer+hooks", dict(nothing_kept, LAZYPIN_WATCH="hooks"), (1,)),
                  ("defer", {}, (3, 5))]
        got = []
        for label, extra, held in expect:
            run = self.run_app(argv, timeout=60, LAZYPIN_MODE=label.split("+")[0], **extra)
            self.assertEqual(run.rc, 0, run.why())
            self.assertIn(opened(bare) - opened(run), held, (label, extra, run.out))
            got.append("%s%s: %d" % (label, ", nothing kept" if extra else "", opened(run)))
        figure("RLIMIT_NOFILE 64 from the start: bare opened %d; %s" % (opened(bare), ", ".join(got)))


if __name__ == "__main__":
    unittest.main()
