"""What a new user meets: lazypin run finding every log, the runner's hints
and refusals, the report's text and its --json keys held to docs/tools.md,
and a saving for runs too short to price themselves (from the bare side of
--compare, another log of the same program, or this machine's price table).

Run:  python3 -m unittest discover -s tests/report -v   (ctest report_tools)
Standard library only. The tests that run the real library on the simulated
CUDA stack skip where the build lacks it. No timing is asserted.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from test_report import (BUILD, FIX, LAZYPIN, M1, M4, OPTIONS_TOOL, PY, SCRIPTS, InTempDir, LogBuilder,
                         clean_env, fx, lazypin, load_module, priced_log, report, report_json)

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs")
US = 1000
MS = 1000 * US
LIB = os.path.join(BUILD, "shim", "liblazypin.so")
SIM = os.path.join(BUILD, "simcuda")
SEED = os.path.join(BUILD, "testapps", "seed_shared")
SEED_STATIC = os.path.join(BUILD, "testapps", "seed")
HAVE_SIM = all(os.path.exists(p) for p in (LIB, os.path.join(SIM, "libcuda.so.1"), SEED, OPTIONS_TOOL))
needs_sim = unittest.skipUnless(HAVE_SIM, "needs the build's library, simulated CUDA stack and seed_shared")


def run_real(*args, cwd, env=None, timeout=180):
    return lazypin("run", "--lib", LIB, *args, cwd=cwd, env=env, timeout=timeout)


# --------------------------------------------------------------------------
# lazypin run

@needs_sim
class RunFindsEveryLog(InTempDir):
    def test_a_name_that_exists_logs_to_its_numbered_name(self):
        old = os.path.join(self.d, "job.jsonl")
        with open(old, "w") as f:
            f.write("mine\n")
        os.utime(old, (time.time() - 60, time.time() - 60))   # an earlier run's
        r = run_real("--sim", "--log", "job.jsonl", SEED, "--repeat", "1", cwd=self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazypin: 1 log:\n  %s\n" % os.path.join(os.path.realpath(self.d), "job.1.jsonl"),
                      r.stderr)
        self.assertNotIn("no log written", r.stderr)
        with open(old) as f:
            self.assertEqual(f.read(), "mine\n")

    def test_several_processes_into_one_name(self):
        seed = "%s --repeat 1 >/dev/null" % SEED
        r = run_real("--sim", "--log", "job.jsonl", "--", "sh", "-c",
                     "%s & %s & %s & wait" % (seed, seed, seed), cwd=self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazypin: 3 logs:", r.stderr)
        for name in ("job.jsonl", "job.1.jsonl", "job.2.jsonl"):
            self.assertIn(os.path.join(os.path.realpath(self.d), name), r.stderr)
        self.assertRegex(r.stderr, r"cudaHostRegister\s+3\s")   # summed over the three

    def test_rank_of_each_process_from_the_launchers_variables(self):
        seed = "%s --repeat 1 >/dev/null" % SEED
        script = " & ".join("RANK=%d LOCAL_RANK=%d %s" % (i, i, seed) for i in range(3)) + " & wait"
        os.mkdir(os.path.join(self.d, "logs"))
        r = run_real("--sim", "--log", "logs/", "--", "sh", "-c", script, cwd=self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = report_json(os.path.join(self.d, "logs"))
        self.assertEqual(sorted(p["rank"] for p in doc["processes"]), [0, 1, 2])
        out = report(os.path.join(self.d, "logs")).stdout
        rows = [l.split() for l in out.splitlines() if l.split()[3:4] == ["seed_shared"]]
        self.assertEqual(sorted(row[2] for row in rows), ["0", "1", "2"], out)

    def test_mode_in_any_case(self):
        r = run_real("--sim", "--log", "x.jsonl", "--", SEED, "--repeat", "1", cwd=self.d,
                     env=clean_env(LAZYPIN_MODE="Defer"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("LAZYPIN_MODE", r.stderr)
        with open(os.path.join(self.d, "x.jsonl")) as f:
            self.assertEqual(json.loads(f.readline())["mode"], "defer")

    def test_pool_bytes_above_the_memory_is_clamped_with_one_line(self):
        r = run_real("--sim", "--pool-bytes", "99999T", "--log", "x.jsonl", "--", SEED, "--repeat", "1",
                     cwd=self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stderr.splitlines() if "LAZYPIN_POOL_BYTES" in l]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn('LAZYPIN_POOL_BYTES="99999T" is more than this machine\'s memory; using the memory',
                      lines[0])
        with open(os.path.join(self.d, "x.jsonl")) as f:
            pool_bytes = json.loads(f.readline())["config"]["pool_bytes"]
        self.assertEqual(str(pool_bytes), lines[0].split("using the memory, ")[1].split()[0])
        self.assertLess(pool_bytes, 99999 << 40)

    @unittest.skipUnless(os.path.exists(SEED_STATIC), "no statically linked seed")
    def test_static_cudart_under_sim_is_named(self):
        r = run_real("--sim", SEED_STATIC, "--repeat", "1", cwd=self.d)
        self.assertIn("no log written", r.stderr)
        self.assertIn("%s has the CUDA runtime linked in statically" % SEED_STATIC, r.stderr)
        self.assertIn("nvcc -cudart shared", r.stderr)

    def test_no_driver_calls_name_sim(self):
        m = load_module()
        if subprocess.run(["sh", "-c", "ls /dev/nvidia* >/dev/null 2>&1"]).returncode == 0:
            self.skipTest("this machine has a GPU")
        cudart = [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
                  if os.path.exists(os.path.join(d, "libcudart.so.13"))]
        if not cudart:
            self.skipTest("no real libcudart.so.13 to fail without a driver")
        r = run_real("--log", "x.jsonl", "--", SEED, "--repeat", "1", cwd=self.d,
                     env=clean_env(LD_LIBRARY_PATH=cudart[0]))
        self.assertIn("failed with 35 (insufficient driver): no CUDA driver", r.stderr)
        self.assertIn("lazypin run --sim", r.stderr)
        out = report(os.path.join(self.d, "x.jsonl")).stdout
        self.assertIn("insufficient driver", out)
        self.assertIn(m.NO_DRIVER_HINT if hasattr(m, "NO_DRIVER_HINT") else "--sim", out)

    def test_sigterm_in_defer_mode_closing_block_reads_the_log(self):
        # a log past the closing block's read limit, ended by SIGTERM (no full summary)
        m = load_module()
        big = os.path.join(self.d, "big.jsonl")
        b = priced_log()
        b.write(big, "SIGTERM")
        with open(big) as f:
            lines = f.read().splitlines()
        lines[-1] = json.dumps({"type": "summary", "t_ns": b.t, "ended_by": "SIGTERM"})
        with open(big, "w") as f:
            f.write("\n".join(lines) + "\n")
        m.BRIEF_READ_LIMIT = 0
        text = m.brief_summary([big])
        self.assertNotIn("no summary with calls", text)
        self.assertRegex(text, r"cudaHostRegister\s+34\s")
        self.assertIn("pool: 30 hits / 34 registers", text)
        self.assertIn("1 log without a full summary (ended by a signal): read from the records", text)


@needs_sim
class RunFromThePackedTree(InTempDir):
    def test_dist_bin_lazypin_run_sim(self):
        # scripts/pack's layout: dist/bin (runner, tool, report), dist/lib, dist/simcuda
        dist = os.path.join(self.d, "dist")
        for sub in ("bin", "lib", "simcuda"):
            os.makedirs(os.path.join(dist, sub))
        shutil.copy(LAZYPIN, os.path.join(dist, "bin"))
        shutil.copy(OPTIONS_TOOL, os.path.join(dist, "bin"))
        shutil.copytree(os.path.join(SCRIPTS, "lazypin_report"), os.path.join(dist, "bin", "lazypin_report"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(LIB, os.path.join(dist, "lib"))
        for so in ("libcuda.so.1", "libcudart.so.13"):
            shutil.copy(os.path.join(SIM, so), os.path.join(dist, "simcuda"))
        with open(os.path.join(HERE, "..", "..", "scripts", "pack")) as f:
            pack = f.read()
        self.assertIn("dist/simcuda/", pack)   # the layout copied here is pack's
        r = lazypin("run", "--sim", "--log", self.d + "/", SEED, "--repeat", "1",
                    script=os.path.join(dist, "bin", "lazypin"), cwd=self.d, timeout=180)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazypin: 1 log:", r.stderr)
        r = lazypin("run", "--sim", "--dry-run", "x", script=os.path.join(dist, "bin", "lazypin"), cwd=self.d)
        self.assertIn("LD_LIBRARY_PATH=%s" % os.path.join(dist, "simcuda"), r.stdout)
        self.assertIn("LD_PRELOAD=%s" % os.path.join(dist, "lib", "liblazypin.so"), r.stdout)


class RunArguments(InTempDir):
    LIB = os.path.join(BUILD, "shim", "liblazypin.so")

    def dry(self, *args, env=None):
        r = lazypin("run", "--dry-run", "--lib", self.fake_lib(), *args, cwd=self.d, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        return dict(l.split("=", 1) for l in lines[:-1]), lines[-1]

    def fake_lib(self):
        p = os.path.join(self.d, "liblazypin.so")
        if not os.path.exists(p):
            open(p, "w").close()
        return p

    def test_double_dash_after_the_command_is_the_programs(self):
        env, cmd = self.dry("--defer", "/bin/echo", "--", "a")
        self.assertEqual((env["LAZYPIN_MODE"], cmd), ("defer", "/bin/echo -- a"))
        env, cmd = self.dry("--defer", "--", "/bin/echo", "--", "a")
        self.assertEqual(cmd, "/bin/echo -- a")
        r = lazypin("run", "--quiet", "--lib", self.fake_lib(), "--defer", "/bin/echo", "--", "a", cwd=self.d)
        self.assertEqual((r.returncode, r.stdout), (0, "-- a\n"), r.stderr)

    def test_dry_run_shows_the_shims_summary_off_and_a_users_value_kept(self):
        env, _ = self.dry("x")
        self.assertEqual(env["LAZYPIN_SUMMARY"], "0")
        env, _ = self.dry("x", env=clean_env(LAZYPIN_SUMMARY="1"))
        self.assertNotIn("LAZYPIN_SUMMARY", env)
        with open(os.path.join(DOCS, "tools.md")) as f:
            doc = " ".join(f.read().split())
        self.assertIn("Under `lazypin run` the shim's own lines at exit are off (`LAZYPIN_SUMMARY=0`, "
                      "which `--dry-run` shows)", doc)

    def refused(self, *args):
        ran = os.path.join(self.d, "ran")
        r = lazypin("run", "--lib", self.fake_lib(), *args, "--", "sh", "-c", "touch " + ran, cwd=self.d)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertFalse(os.path.exists(ran))
        self.assertIn("not starting the program", r.stderr)
        self.assertNotIn("lazypin-options", r.stderr)   # no internal helper's name
        return r.stderr

    def test_kernel_filesystems_are_refused(self):
        self.assertIn("/proc/x.jsonl is under /proc, a kernel filesystem", self.refused("--log", "/proc/x.jsonl"))
        self.assertIn("is under /sys, a kernel filesystem", self.refused("--log", "/sys/"))

    def test_a_missing_directory_names_the_users_pattern(self):
        err = self.refused("--log", "missing/")
        self.assertIn("missing/lazypin-<program>-", err)
        self.assertIn("No such file or directory", err)

    def test_a_directory_where_no_file_can_be_created(self):
        m = __import__("importlib").import_module("test_report").load_cli()
        ro = os.path.join(self.d, "ro")
        os.mkdir(ro, 0o500)
        try:
            problem = m.log_dir_problem(os.path.join(ro, "x.jsonl"))
        finally:
            os.chmod(ro, 0o700)
        if os.geteuid() == 0:
            self.assertEqual(problem, "")   # root creates files there: a real probe, not access()
        else:
            self.assertIn("cannot create a file in %s" % ro, problem)
        self.assertIn("kernel filesystem", m.log_dir_problem("/proc/self/x.jsonl"))


# --------------------------------------------------------------------------
# the report's text

def evicting_log(path, entries=2):
    """3 buffers cycled through a pool of `entries` entries: LRU evictions
    (outside calls) and an overlap eviction inside a register."""
    b = LogBuilder("defer", config={"pool_entries": entries})
    bufs = [0x7f0000000000 + i * (2 << 20) for i in range(3)]
    for k in range(12):
        p = bufs[k % 3]
        b.reg(p, M1, 100 * US, "miss").unreg(p, 500, "deferred")
        if k >= 1:
            b.evict(bufs[(k - 1) % 3], M1, "lru", 50 * US)
    b.evict(bufs[0], M1, "overlap", 40 * US)
    b.reg(bufs[0] + 4096, M1, 150 * US, "miss", evicted=1)
    b.recs.append({"type": "summary", "t_ns": b.t, "ended_by": "exit",
                   "pool": {"peak_bytes": 3 << 20, "peak_entries": entries + 1, "pooled_bytes": 1 << 20,
                            "pooled_entries": 1, "evictions": {"lru": 11, "overlap": 1}}})
    with open(path, "w") as f:
        for r in b.recs:
            f.write(json.dumps(r) + "\n")
    return path


class ReportText(InTempDir):
    def test_pool_section(self):
        out = report(evicting_log(os.path.join(self.d, "e.jsonl"))).stdout
        pool = out.split("== pool")[1].split("\n==")[0]
        verdict = [l for l in pool.splitlines() if l.strip().startswith("pool:")]
        self.assertEqual(len(verdict), 1, pool)
        self.assertEqual(pool.count("(estimated from"), 1, pool)   # the saving once
        self.assertIn("still pooled at exit 1 MiB in 1 entry", pool)
        self.assertNotIn("1 entries", pool)
        self.assertIn("evictions: 12 (evict records), 1 of them made inside program calls", pool)
        self.assertNotIn("outside program calls:", pool)
        self.assertIn("peak pooled 3 MiB in 3 entries", pool)
        self.assertIn("the bound, LAZYPIN_POOL_ENTRIES=2, holds between calls", pool)

    def test_config_sizes_in_units(self):
        b = LogBuilder("defer", config={"keep_margin": 268435456, "host_alloc_cache": 6319041536,
                                        "log_max": 268435456})
        b.reg(0x7f0000000000, M1, 100 * US, "miss")
        out = report(b.write(os.path.join(self.d, "c.jsonl"))).stdout
        cfg = [l for l in out.splitlines() if l.strip().startswith("config")][0]
        self.assertNotRegex(cfg, r"=\d{6,}")
        self.assertIn("host_alloc_cache=5.9 GiB", cfg)
        self.assertIn("keep_margin=256 MiB", cfg)

    def test_slowest_of_a_bounded_log_says_where_it_ends(self):
        b = priced_log()
        b.recs.append({"type": "log_cut", "t_ns": b.t, "log_max": 65536})
        out = report(b.write(os.path.join(self.d, "b.jsonl"))).stdout
        self.assertRegex(out, r"== slowest \d+ \(of the calls logged one by one, up to t=[\d.]+ s where "
                              r"the log's bound, LAZYPIN_LOG_MAX, ended them; the max columns above "
                              r"count the whole run\)")

    def test_call_sites_without_hits_show_no_saving(self):
        m = load_module()
        text = "\n".join(m.render_text({**report_json(fx("log_mode.jsonl")), "call_sites": {
            "symbolizer": None, "by_time": [{"frames": ["a+0x1"], "calls": 3, "hits": 0, "real": 3,
                                              "evictions": 0, "time_ns": 5000, "saved_ns": 0}],
            "by_saved": []}}, 10).splitlines())
        self.assertIn("#1  5.00 us spent  3 calls (0 hits, 3 to the driver)", text)
        self.assertNotIn("0 ns saved~", text)

    def test_docs_say_mean_as_the_tool_does(self):
        with open(os.path.join(DOCS, "tools.md")) as f:
            doc = f.read()
        self.assertNotIn("median warm", doc)
        self.assertNotIn("median real", doc)
        self.assertIn("mean warm real register", load_module().SAVING_METHOD
                      if hasattr(load_module(), "SAVING_METHOD") else "mean warm real register")

    def test_a_bad_file_in_a_directory_is_skipped_and_named(self):
        shutil.copy(fx("defer_mode.jsonl"), self.d)
        shutil.copy(fx("newer_format.jsonl"), self.d)
        os.mkdir(os.path.join(self.d, "adir.jsonl"))   # unreadable as a log
        r = report(self.d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("newer_format.jsonl: log format", r.stderr)
        self.assertIn("skipped", r.stderr)
        self.assertIn("adir.jsonl: is a directory, skipped", r.stdout)
        self.assertIn("pool: 18 hits / 20 registers", r.stdout)
        # named on the command line, the same file stays an error
        self.assertEqual(report(os.path.join(self.d, "newer_format.jsonl")).returncode, 2)

    def test_no_driver_errors_name_sim(self):
        b = LogBuilder("log")
        b.reg(0x7f0000000000, M1, 2 * US, "forward", result=35)
        out = report(b.write(os.path.join(self.d, "n.jsonl"))).stdout
        self.assertIn("35  insufficient driver", out)
        self.assertIn("`lazypin run --sim`", out)


# --------------------------------------------------------------------------
# a saving for every run

class EverySaving(InTempDir):
    def pair(self, bare_dir=None):
        """A log-mode run and a defer run of the same program: the defer run's
        one buffer is registered once (no warm register, no real unregister)."""
        p = 0x7f0000000000
        bare, pooled = LogBuilder("log"), LogBuilder("defer")
        for k, lat in enumerate((300 * MS, 160 * US, 170 * US, 180 * US, 170 * US)):
            bare.reg(p, M4, lat, "forward").unreg(p, (80 + 5 * k) * US, "forward")
        pooled.reg(p, M4, 300 * MS, "miss")
        for _ in range(100):
            pooled.unreg(p, 500, "deferred").reg(p, M4, 1 * US, "hit")
        d = bare_dir or self.d
        return bare.write(os.path.join(d, "bare.jsonl")), pooled.write(os.path.join(self.d, "defer.jsonl"))

    def test_priced_from_another_log_of_the_same_program(self):
        bare, pooled = self.pair()
        doc = report_json(pooled)
        sv = doc["pool"]["saving"]
        # hits at the mean warm register (170 us), deferrals at the mean unregister (90 us)
        want = 100 * (170 * US - 1 * US) + 100 * (90 * US - 500)
        self.assertEqual(doc["pool"]["saved_ns_est"], want)
        self.assertEqual(doc["pool"]["saved_ns_source"], "borrowed")
        self.assertEqual((sv["borrowed"], sv["hits_priced"], sv["deferred_priced"]), (200, 100, 100))
        self.assertIn("(estimated: 200 hits/deferrals priced from 9 real calls of another log of the "
                      "same program (bare.jsonl), this run having too few of its own)", sv["text"])
        out = report(pooled).stdout
        self.assertEqual(out.count(sv["text"]), 1)

    def test_priced_from_the_bare_side_of_compare(self):
        os.mkdir(os.path.join(self.d, "elsewhere"))
        bare, pooled = self.pair(os.path.join(self.d, "elsewhere"))
        self.assertIsNone(report_json(pooled)["pool"]["saved_ns_est"])   # alone: no figure
        c = report_json(bare, "--compare", pooled)
        self.assertIn("priced from 9 real calls of the bare run (--compare)",
                      c["comparison"]["saving"]["estimate_text"])
        self.assertEqual(c["other"]["pool"]["saved_ns_records"], 100 * 169 * US + 100 * 89500)
        self.assertTrue(c["comparison"]["saving"]["measured"])

    def test_compare_force_across_programs_is_not_measured(self):
        b = LogBuilder("log", exe="/opt/app/other")
        for _ in range(5):
            b.reg(0x7f0000000000, M4, 170 * US, "forward").unreg(0x7f0000000000, 90 * US, "forward")
        other = b.write(os.path.join(self.d, "other.jsonl"))
        c = report_json(other, "--compare", fx("defer_mode.jsonl"), "--force")
        s = c["comparison"]["saving"]
        self.assertFalse(s["measured"])
        self.assertIn("not measured", s["method"])
        self.assertNotEqual(c["other"]["pool"]["saved_ns_source"], "measured")
        out = report(other, "--compare", fx("defer_mode.jsonl"), "--force").stdout
        self.assertNotIn("measured:", out)
        self.assertNotIn("measured against", out)
        self.assertIn("not a measured saving: the runs differ (--force)", out)

    def test_log_mode_advice_priced_as_the_estimate(self):
        b = LogBuilder("log")
        p = 0x7f0000000000
        b.reg(p, M4, 300 * MS, "forward")
        regs = [150, 170, 190, 150, 170, 190]
        unregs = [80, 100, 80, 100, 80, 100]
        for r, u in zip(regs, unregs):
            b.unreg(p, u * US, "forward").reg(p, M4, r * US, "forward")
        d = report_json(b.write(os.path.join(self.d, "x.jsonl")))
        adv = {a["rule"]: a for a in d["advice"]}["defer"]
        # 6 would-be hits at the mean warm register (170 us) and 6 deferrals at
        # the mean unregister (90 us): the pool's saving's prices
        self.assertIn("estimated %s saved (these registers and the unregisters before them, priced "
                      "as the pool's saving is" % load_module().fmt_ns(6 * 170 * US + 6 * 90 * US),
                      adv["suggestion"])


def headline_log(path, host=None, exe="/opt/app/demo"):
    """The users' headline case: one buffer registered once, then re-registered
    from the pool every time (100% hits, every unregister deferred)."""
    p = 0x7f0000000000
    b = LogBuilder("defer", host=host or socket.gethostname(), exe=exe)
    b.reg(p, M4, 300 * MS, "miss")
    for _ in range(100):
        b.unreg(p, 500, "deferred").reg(p, M4, 1 * US, "hit")
    return b.write(path)


def priced_run(path, host=None, pid=5000):
    """Another program's run on this host whose real calls price 4 MiB
    registers (160, 170, 180 us) and unregisters (80, 90, 100 us)."""
    b = priced_log()
    b.recs[0].update(host=host or socket.gethostname(), exe="/opt/app/priced", pid=pid)
    return b.write(path)


class MachineTable(InTempDir):
    """This machine's price table (--prices, LAZYPIN_REPORT_PRICES): filled by
    reports of this host's runs that price themselves, it prices a run that
    cannot when neither --compare nor another log of the same program can."""
    # the headline's 100 hits at the table's 170 us, its 100 deferrals at 90 us
    WANT = 100 * (170 * US - 1 * US) + 100 * (90 * US - 500)

    def setUp(self):
        super().setUp()
        # The suite turns the table off (tests/report/CMakeLists.txt); these
        # tests ask for it.
        saved = os.environ.pop("LAZYPIN_REPORT_PRICES", None)
        if saved is not None:
            self.addCleanup(os.environ.__setitem__, "LAZYPIN_REPORT_PRICES", saved)
        for sub in ("earlier", "now"):
            os.mkdir(os.path.join(self.d, sub))
        self.table = os.path.join(self.d, "cache", "prices.json")
        self.headline = headline_log(os.path.join(self.d, "now", "headline.jsonl"))
        self.priced = priced_run(os.path.join(self.d, "earlier", "priced.jsonl"))

    def test_the_headline_case_is_priced_from_the_table(self):
        alone = report_json(self.headline, "--prices", self.table)["pool"]
        self.assertIsNone(alone["saved_ns_est"])
        self.assertFalse(os.path.exists(self.table))   # it priced nothing to record
        self.assertEqual(report(self.priced, "--prices", self.table).returncode, 0)
        with open(self.table) as f:
            t = json.load(f)
        self.assertEqual((t["host"], len(t["runs"])), (socket.gethostname(), 1))
        report_json(self.priced, "--prices", self.table)   # reported again: counted once
        with open(self.table) as f:
            self.assertEqual(len(json.load(f)["runs"]), 1)
        doc = report_json(self.headline, "--prices", self.table)
        sv = doc["pool"]["saving"]
        self.assertEqual(doc["pool"]["saved_ns_est"], self.WANT)
        self.assertEqual(doc["pool"]["saved_ns_source"], "borrowed")
        self.assertEqual((sv["borrowed"], sv["borrowed_calls"], sv["price_calls"]), (200, 6, 0))
        label = ("the machine table %s (1 earlier run on this host, 2025-12-01)" % self.table)
        self.assertEqual(sv["borrowed_from"], label)
        self.assertIn("(estimated: 200 hits/deferrals priced from 6 real calls of %s, this run "
                      "having too few of its own)" % label, sv["text"])
        self.assertNotIn("measured", sv["text"])
        self.assertEqual(sv["price_table"], {"file": self.table, "host": socket.gethostname(), "runs": 1,
                                             "runs_from_unix_ns": 1764553000000000000,
                                             "runs_to_unix_ns": 1764553000000000000})
        self.assertEqual(doc["processes"][0]["saving"]["price_table"], sv["price_table"])
        out = report(self.headline, "--prices", self.table).stdout
        self.assertEqual(out.count(sv["text"]), 1, out)
        # off: neither read nor written
        self.assertIsNone(report_json(self.headline, "--prices", "off")["pool"]["saved_ns_est"])
        self.assertIsNone(report_json(self.headline, "--prices", self.table, "--prices", "off")
                          ["pool"]["saved_ns_est"])

    def test_the_variable_and_the_default_path(self):
        cache = os.path.join(self.d, "xdg")
        env = clean_env(XDG_CACHE_HOME=cache)
        self.assertEqual(report(self.priced, env=env).returncode, 0)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
        default = os.path.join(cache, "lazypin", "prices-%s.json" % name)
        self.assertTrue(os.path.isfile(default))
        self.assertEqual(os.listdir(os.path.dirname(default)), [os.path.basename(default)])   # no temp left
        r = report("--json", self.headline, env=env)
        self.assertEqual(json.loads(r.stdout)["pool"]["saving"]["price_table"]["file"], default)
        # LAZYPIN_REPORT_PRICES: another file, or off
        r = report("--json", self.headline, env=clean_env(XDG_CACHE_HOME=cache, LAZYPIN_REPORT_PRICES="off"))
        self.assertIsNone(json.loads(r.stdout)["pool"]["saved_ns_est"])
        r = report("--json", self.headline, env=clean_env(LAZYPIN_REPORT_PRICES=default))
        self.assertEqual(json.loads(r.stdout)["pool"]["saved_ns_est"], self.WANT)

    def test_a_table_of_another_host_is_not_used(self):
        report_json(self.priced, "--prices", self.table)
        with open(self.table) as f:
            t = json.load(f)
        t["host"] = "not-" + socket.gethostname()
        with open(self.table, "w") as f:
            json.dump(t, f)
        with open(self.table) as f:
            before = f.read()
        doc = report_json(self.headline, "--prices", self.table)
        self.assertIsNone(doc["pool"]["saved_ns_est"])
        self.assertIsNone(doc["pool"]["saving"]["price_table"])
        self.assertIn("saving not estimable", report(self.headline, "--prices", self.table).stdout)
        report_json(self.priced, "--prices", self.table)   # nor overwritten
        with open(self.table) as f:
            self.assertEqual(f.read(), before)
        # a log written on another host is neither priced from this host's table nor recorded in it
        os.remove(self.table)
        report_json(self.priced, "--prices", self.table)
        other = headline_log(os.path.join(self.d, "now", "other.jsonl"), host="not-" + socket.gethostname())
        self.assertIsNone(report_json(other, "--prices", self.table)["pool"]["saved_ns_est"])
        report_json(priced_run(os.path.join(self.d, "earlier", "o.jsonl"), host="elsewhere", pid=6000),
                    "--prices", self.table)
        with open(self.table) as f:
            self.assertEqual(len(json.load(f)["runs"]), 1)

    def test_a_table_that_cannot_be_written_does_not_fail_the_report(self):
        blocker = os.path.join(self.d, "a-file")
        open(blocker, "w").close()
        os.mkdir(os.path.join(self.d, "a-dir"))
        # its directory cannot be made; a directory where the file would be
        tables = [os.path.join(blocker, "prices.json"), os.path.join(self.d, "a-dir")]
        if os.geteuid() != 0:   # root writes into a read-only directory
            tables.append(os.path.join(self.d, "ro", "prices.json"))
        for table in tables:
            os.makedirs(os.path.join(self.d, "ro"), 0o500, exist_ok=True)
            try:
                for log in (self.priced, self.headline):
                    r = report(log, "--prices", table)
                    self.assertEqual((r.returncode, r.stderr), (0, ""), table)
                    self.assertEqual(r.stdout, report(log, "--prices", "off").stdout)
            finally:
                os.chmod(os.path.join(self.d, "ro"), 0o700)
        # a damaged table is no table, and the next priced report replaces it
        os.makedirs(os.path.dirname(self.table), exist_ok=True)
        with open(self.table, "w") as f:
            f.write("{not json")
        self.assertIsNone(report_json(self.headline, "--prices", self.table)["pool"]["saved_ns_est"])
        report_json(self.priced, "--prices", self.table)
        self.assertEqual(report_json(self.headline, "--prices", self.table)["pool"]["saved_ns_est"], self.WANT)

    def test_compare_and_the_same_program_come_first(self):
        report_json(self.priced, "--prices", self.table)
        bare = LogBuilder("log", host=socket.gethostname())
        p = 0x7f0000000000
        for lat in (300 * MS, 200 * US, 200 * US, 200 * US, 200 * US):
            bare.reg(p, M4, lat, "forward").unreg(p, 100 * US, "forward")
        bare = bare.write(os.path.join(self.d, "bare.jsonl"))
        c = report_json(bare, "--compare", self.headline, "--prices", self.table)
        self.assertIn("priced from 9 real calls of the bare run (--compare)",
                      c["comparison"]["saving"]["estimate_text"])
        self.assertIsNone(c["other"]["pool"]["saving"]["price_table"])
        shutil.copy(bare, os.path.join(self.d, "now"))
        sv = report_json(self.headline, "--prices", self.table)["pool"]["saving"]
        self.assertIn("another log of the same program (bare.jsonl)", sv["borrowed_from"])
        self.assertIsNone(sv["price_table"])


# --------------------------------------------------------------------------
# --json: docs/tools.md's key list, key for key

def doc_keys():
    with open(os.path.join(DOCS, "tools.md")) as f:
        text = f.read()
    block = text.split("<!-- json-keys: begin -->")[1].split("<!-- json-keys: end -->")[0]
    return {l.split()[0] for l in block.splitlines() if l.strip() and not l.startswith("```")}


def walk(v, path, keys, out, bad):
    if path:
        out.add(path)
    if isinstance(v, dict):
        var = (path + ".*") in keys
        for k, x in v.items():
            walk(x, (path + "." if path else "") + ("*" if var else k), keys, out, bad)
    elif isinstance(v, list):
        for x in v:
            walk(x, path + "[]", keys, out, bad)
    elif path.endswith("_ns") and not path.endswith("_per_ns") and v is not None \
            and (isinstance(v, bool) or not isinstance(v, int)):
        bad.append("%s = %r" % (path, v))


class JsonKeys(InTempDir):
    def reports(self):
        """Reports that between them hold every documented key."""
        out = []
        for f in ("defer_mode.jsonl", "log_mode.jsonl", "autopin.jsonl", "multi", "truncated.jsonl"):
            out.append([fx(f)])
        out.append([fx("log_mode.jsonl"), "--compare", fx("defer_mode.jsonl"), "--force"])
        out.append([evicting_log(os.path.join(self.d, "e.jsonl"))])
        # several devices, call sites, auto-pin with copy times, a borrowed price
        b = LogBuilder("defer")
        p = 0x7f0000000000
        b.recs.append({"type": "stack", "id": 1, "frames": ["0x1234", "0x5678"]})
        for act, dev in (("miss", 0), ("hit", 1), ("forward", 0)):
            b.reg(p, M1, 100 * US, act, device=dev, stack=1)
        b.unreg(p, 500, "deferred", device=1, stack=1)
        b.unreg(p, 90 * US, "passthrough", reason="shared", device=0)
        b.recs.append({"type": "host_release", "t_ns": b.t, "tid": 1, "ptr": "0x%x" % p, "bytes": 4096,
                       "reason": "idle", "result": 0, "latency_ns": 1000})
        b.call("cudaHostAlloc", p + (64 << 20), 4096, 2000, "host_hit")
        b.reg(p + (1 << 32), 1 << 30, 400 * 1000000, "miss", device=0)  # a big pin
        out.append([b.write(os.path.join(self.d, "dev.jsonl"))])
        a = LogBuilder("defer", config={"autopin": True})
        a.recs.append({"type": "autopin", "t_ns": 1, "tid": 1, "api": "cuMemcpyHtoD_v2", "via": "getproc",
                       "ptr": "0x7f0000000000", "bytes": M4, "dir": "htod", "result": 0,
                       "latency_ns": 300 * US, "action": "autopin"})
        a.reg(p, M4, 1 * US, "hit")
        a.write(os.path.join(self.d, "ap.jsonl"))
        with open(os.path.join(self.d, "ap.jsonl")) as f:
            lines = f.read().splitlines()
        lines[-1] = json.dumps({"type": "summary", "t_ns": a.t, "ended_by": "exit", "pool": {
            "hits": 1, "saving": {"saved_ns": 0}, "autopin": {
                "pins": 1, "bytes": M4, "register_ns": 300 * US, "copies": 3, "copy_bytes": 3 * M4, "hits": 1,
                "full": 0, "copy_times": {"htod": {"pinned_rate_bytes": 3 * M4,
                                                   "pageable": {"bytes": M4, "ns": 600 * US, "copies": 1},
                                                   "pinned": {"bytes": 3 * M4, "ns": 240 * US, "copies": 3}}}}}})
        with open(os.path.join(self.d, "ap.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        bare = LogBuilder("log")
        for _ in range(4):
            bare.reg(p, M4, 170 * US, "forward").unreg(p, 90 * US, "forward")
        bare.write(os.path.join(self.d, "bare.jsonl"))
        out.append([os.path.join(self.d, "bare.jsonl"), "--compare", os.path.join(self.d, "ap.jsonl")])
        # priced from this machine's table, which the report before it fills
        table = os.path.join(self.d, "prices.json")
        os.mkdir(os.path.join(self.d, "table"))
        out.append([priced_run(os.path.join(self.d, "table", "priced.jsonl")), "--prices", table])
        out.append([headline_log(os.path.join(self.d, "table", "headline.jsonl")), "--prices", table])
        return out

    def test_documented_keys_are_the_outputs(self):
        keys = doc_keys()
        self.assertGreater(len(keys), 100)
        seen, bad = set(), []
        for args in self.reports():
            doc = report_json(*args)
            if "comparison" in doc:
                for side in ("baseline", "other"):
                    seen.add(side)
                    walk(doc[side], "", keys, seen, bad)
                seen.add("lazypin_report")
                walk(doc["comparison"], "comparison", keys, seen, bad)
            else:
                walk(doc, "", keys, seen, bad)
        self.assertEqual(sorted(seen - keys), [], "in the output, not in docs/tools.md")
        self.assertEqual(sorted(keys - seen), [], "in docs/tools.md, in no report")
        self.assertEqual(bad, [], "nanoseconds that are not integers")


if __name__ == "__main__":
    unittest.main()
