"""Tests of the user-facing tools: scripts/lazypin (run, report) and
scripts/lazypin_report.py, on the hand-written logs in fixtures/.

Run:  python3 -m unittest discover -s tests/report -v
      (ctest runs the same; LAZYPIN_SCRIPTS_DIR names the scripts directory,
      by default ../../scripts from this file.)
Standard library only; the real-plot test runs only where matplotlib is.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")
SCRIPTS = os.path.abspath(os.environ.get("LAZYPIN_SCRIPTS_DIR") or os.path.join(HERE, "..", "..", "scripts"))
REPORT = os.path.join(SCRIPTS, "lazypin_report.py")
# The build tree (ctest sets it): the library's option tool, the library, the
# simulated CUDA stack and the test apps, for the runner's tests.
BUILD = os.path.abspath(os.environ.get("LAZYPIN_BUILD_DIR") or os.path.join(HERE, "..", "..", "build"))
OPTIONS_TOOL = os.path.join(BUILD, "shim", "lazypin-options")
LAZYPIN = os.path.join(SCRIPTS, "lazypin")
PY = sys.executable or "python3"

M4 = 4 << 20


def fx(name):
    return os.path.join(FIX, name)


def clean_env(**extra):
    # The suite's LAZYPIN_REPORT_PRICES (off) stays: a tool's variable.
    env = {k: v for k, v in os.environ.items()
           if (not k.startswith("LAZYPIN_") or k == "LAZYPIN_REPORT_PRICES") and k != "LD_PRELOAD"}
    env.update(extra)
    return env


def report(*args, env=None):
    return subprocess.run([PY, REPORT] + list(args), capture_output=True, text=True,
                          env=env or clean_env(), timeout=60)


def lazypin(*args, env=None, cwd=None, script=LAZYPIN, timeout=60):
    return subprocess.run([PY, script] + list(args), capture_output=True, text=True,
                          env=env or clean_env(), cwd=cwd, timeout=timeout)


def tool(*args):
    r = subprocess.run([OPTIONS_TOOL] + list(args), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def options_table_doc():
    return json.loads(tool("table"))


def options_table():
    """The library's option table (lazypin-options table), by variable name."""
    return {o["name"]: o for o in options_table_doc()["options"]}


def report_json(*args):
    r = report("--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def load_cli():
    from importlib.machinery import SourceFileLoader
    loader = SourceFileLoader("lazypin_cli_under_test", LAZYPIN)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m


def load_module():
    spec = importlib.util.spec_from_file_location("lazypin_report_under_test", REPORT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(text, first):
    """The whitespace-split cells of the table row starting with `first`."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == first:
            return cells
    raise AssertionError("no row %r in:\n%s" % (first, text))


# --------------------------------------------------------------------------

class Helpers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.m = load_module()

    def test_percentile_nearest_rank(self):
        p = self.m.percentile
        v = list(range(1, 11))
        self.assertEqual(p(v, 50), 5)
        self.assertEqual(p(v, 90), 9)
        self.assertEqual(p(v, 99), 10)
        self.assertEqual(p([7], 50), 7)
        self.assertIsNone(p([], 50))

    def test_size_classes(self):
        sc = self.m.size_class
        self.assertEqual(sc(0), "4K")
        self.assertEqual(sc(4096), "4K")
        self.assertEqual(sc(4097), "16K")
        self.assertEqual(sc(M4), "4M")
        self.assertEqual(sc(M4 + 1), "16M")
        self.assertEqual(sc(4 << 30), "4G")
        self.assertEqual(sc((4 << 30) + 1), "big")

    def test_human_units(self):
        self.assertEqual(self.m.fmt_ns(850), "850 ns")
        self.assertEqual(self.m.fmt_ns(43200), "43.2 us")
        self.assertEqual(self.m.fmt_ns(171000), "171 us")
        self.assertEqual(self.m.fmt_ns(1900000), "1.90 ms")
        self.assertEqual(self.m.fmt_ns(2310000000), "2.31 s")
        self.assertEqual(self.m.fmt_bytes(512), "512 B")
        self.assertEqual(self.m.fmt_bytes(M4), "4 MiB")
        self.assertEqual(self.m.fmt_bytes(3 << 29), "1.5 GiB")
        self.assertEqual(self.m.result_name(712), "host memory already registered")
        self.assertEqual(self.m.result_name(713), "host memory not registered")
        self.assertEqual(self.m.result_name(201), "invalid context")


class TextReport(unittest.TestCase):
    def test_log_mode(self):
        r = report(fx("log_mode.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        # header
        self.assertIn("/opt/app/copyloop", out)
        self.assertIn("./copyloop -n 5", out)
        self.assertIn("4242", out)
        self.assertRegex(out, r"mode\s+log")
        self.assertIn("13.0 (13000)", out)
        self.assertIn("2025-12-01 01:36:40.000 UTC", out)
        self.assertIn("pool_bytes=8 GiB", out)
        # per API: calls errors bytes total p50 p90 p99 max
        reg = row(out, "cudaHostRegister")
        self.assertEqual(reg[1:3], ["9", "1"])
        # percentiles from the shim's histogram (bucket midpoints, the max exact)
        self.assertEqual(" ".join(reg[-8:]), "170 us 397 us 397 us 400 us")
        unreg = row(out, "cudaHostUnregister")
        self.assertEqual(unreg[1:3], ["9", "1"])
        self.assertEqual(" ".join(unreg[-8:]), "87.0 us 2.13 ms 2.13 ms 2.14 ms")
        self.assertEqual(row(out, "all")[1:3], ["18", "2"])
        # size classes
        self.assertIn("<= 64K", out)
        self.assertIn("<= 4M", out)
        self.assertIn("128 KiB", out)
        # errors
        self.assertRegex(out, r"712\s+host memory already registered\s+1")
        self.assertRegex(out, r"713\s+host memory not registered\s+1")
        self.assertIn("pool: not used (mode log)", out)
        # slowest: the 2.14 ms unregister first
        slow = out.split("== slowest 10")[1].splitlines()
        self.assertIn("cudaHostUnregister", slow[2])
        self.assertIn("2.14 ms", slow[2])

    def test_defer_mode_pool(self):
        r = report(fx("defer_mode.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        # one warm register and two evictions: too few to price anything
        self.assertIn("pool: 18 hits / 20 registers (90%), saving not estimable (fewer than 3 "
                      "real calls of a kind in this process", out)
        self.assertIn("deferred unregisters 20", out)
        self.assertIn("peak pooled 4 MiB in 1 entry", out)
        self.assertRegex(out, r"free\s+1\s+0\s+4 MiB\s+88.0 us\s+87.0 us")
        self.assertRegex(out, r"exit\s+1\s+0\s+4 MiB\s+86.0 us")
        self.assertIn("LAZYPIN_POOL_ENTRIES=lots: not a number; using 65536", out)
        self.assertRegex(out, r"release_at_exit=yes")

    def test_multi_process_directory(self):
        r = report(fx("multi"))
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("== run (2 processes)", out)
        self.assertIn("7001", out)
        self.assertIn("7002", out)
        self.assertIn("python3 train.py --rank 1", out)
        self.assertIn("SIGTERM", out)
        self.assertEqual(row(out, "cuMemHostRegister_v2")[1], "6")
        self.assertIn("pool: 4 hits / 6 registers (67%)", out)
        # rank 1 was killed: its summary (written from the signal handler) has no pool figures
        self.assertIn("peak pooled 1 MiB in 1 entry (sum over the 1 of 2 processes with a full summary)", out)
        self.assertRegex(out, r"idle\s+2")

    def test_glob_and_several_files(self):
        a = report(os.path.join(FIX, "multi", "*.jsonl"))
        b = report(fx("multi/lazypin-python3-7001.jsonl"), fx("multi/lazypin-python3-7002.jsonl"))
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(a.stdout, b.stdout)

    def test_top(self):
        out = report("--top", "3", fx("log_mode.jsonl")).stdout
        self.assertIn("== slowest 3", out)
        sect = out.split("== slowest 3")[1].split("\n\n")[0].strip().splitlines()
        self.assertEqual(len(sect), 1 + 3)
        out = report("--top", "0", fx("log_mode.jsonl")).stdout
        self.assertNotIn("== slowest", out)
        self.assertEqual(report("--top", "-1", fx("log_mode.jsonl")).returncode, 2)

    def test_lazypin_report_dispatch(self):
        a = lazypin("report", fx("defer_mode.jsonl"))
        b = report(fx("defer_mode.jsonl"))
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(a.stdout, b.stdout)

    def test_help(self):
        r = report("--help")
        self.assertEqual(r.returncode, 0)
        for opt in ("--compare", "--plot", "--json", "--top"):
            self.assertIn(opt, r.stdout)
        self.assertEqual(report().returncode, 2)


class JsonReport(unittest.TestCase):
    def test_autopin(self):
        # A sim run of testapps/autopin under LAZYPIN_AUTOPIN=1 (getproc door, async copies).
        d = report_json(fx("autopin.jsonl"))
        ap = d["autopin"]
        self.assertEqual((ap["pins"], ap["failed"], ap["bytes"]), (3, 0, 3 * (8 << 20)))
        self.assertEqual(ap["register_ns"], 4180510)
        self.assertEqual((ap["copies"], ap["copy_bytes"], ap["program_hits"], ap["over_bound"]),
                         (11, 11 * (8 << 20), 1, 0))
        self.assertEqual(ap["apis"], {"cuMemcpyHtoDAsync_v2": 2, "cuMemcpyDtoHAsync_v2": 1})
        per_byte = 1 / 6.5 - 1 / 53.0
        self.assertEqual(ap["saved_ns_est"], int(14 * (8 << 20) * per_byte - 4180510))
        text = report(fx("autopin.jsonl")).stdout
        self.assertIn("== auto-pin (LAZYPIN_AUTOPIN)", text)
        # a log without copy times (an older lazypin's): the fixed rates, said so
        self.assertFalse(ap["rates_measured"])
        self.assertIn("in logs without copy times (written by an older lazypin, or ended by a "
                      "signal), priced at fixed rates, an H200's: pageable 6.5 GB/s, pinned 53.0 GB/s",
                      text)
        self.assertIn("3 ranges pinned for copies (24 MiB)", text)
        self.assertIn("later copies at the pinned rate: 11 (88 MiB); program registers served: 1", text)
        self.assertNotIn("== auto-pin", report(fx("defer_mode.jsonl")).stdout)

    def test_keys_and_values(self):
        d = report_json(fx("log_mode.jsonl"))
        self.assertEqual(d["lazypin_report"], 1)
        self.assertEqual(list(d), ["lazypin_report", "files", "processes", "totals", "apis",
                                   "size_classes", "pool", "host_alloc", "devices", "autopin", "big_pins", "advice",
                                   "call_sites", "slowest", "errors", "warnings"])
        self.assertFalse(d["host_alloc"]["active"])  # no pinned host allocation in that log
        reg = d["apis"]["cudaHostRegister"]
        self.assertEqual(sorted(reg), sorted(["calls", "errors", "bytes", "total_ns",
                                              "p50_ns", "p90_ns", "p99_ns", "max_ns"]))
        self.assertEqual(reg["calls"], 9)
        self.assertEqual(reg["errors"], 1)
        self.assertEqual(reg["bytes"], 7 * M4 + 2 * (64 << 10))
        self.assertEqual(reg["total_ns"], 1350500)
        self.assertEqual(reg["p50_ns"], 169984)   # 171500 in the histogram bucket [167936, 172032)
        self.assertEqual(reg["p90_ns"], 397312)
        self.assertEqual(reg["max_ns"], 400000)
        un = d["apis"]["cudaHostUnregister"]
        self.assertEqual((un["calls"], un["p50_ns"], un["max_ns"], un["bytes"]), (9, 87040, 2139736, 0))
        self.assertEqual(list(d["size_classes"]), ["64K", "4M"])
        self.assertEqual(d["size_classes"]["64K"]["p50_ns"], 37376)
        self.assertEqual(d["size_classes"]["4M"]["calls"], 7)
        self.assertEqual(d["totals"]["calls"], 18)
        self.assertEqual(d["totals"]["total_ns"], 1350500 + 2646736)
        self.assertEqual([(e["code"], e["name"], e["count"]) for e in d["errors"]],
                         [(712, "host memory already registered", 1),
                          (713, "host memory not registered", 1)])
        p = d["processes"][0]
        self.assertEqual((p["pid"], p["exe"], p["mode"], p["driver_version"]),
                         (4242, "/opt/app/copyloop", "log", 13000))
        self.assertEqual(p["argv"], ["./copyloop", "-n", "5"])
        self.assertEqual(p["start_time"], "2025-12-01T01:36:40.000000Z")
        self.assertEqual(p["ended_by"], "exit")
        self.assertFalse(d["pool"]["active"])
        self.assertIsNone(d["pool"]["hit_rate"])
        self.assertEqual(len(d["slowest"]), 10)
        self.assertEqual(d["slowest"][0]["latency_ns"], 2139736)
        self.assertEqual(sorted(d["slowest"][0]), sorted(["pid", "t_ns", "tid", "record", "api", "ptr",
                                                          "bytes", "result", "action", "latency_ns"]))
        self.assertEqual(d["warnings"], [])

    def test_pool(self):
        pool = report_json(fx("defer_mode.jsonl"))["pool"]
        self.assertEqual((pool["hits"], pool["misses"], pool["deferred"]), (18, 2, 20))
        self.assertAlmostEqual(pool["hit_rate"], 0.9)
        self.assertEqual(list(pool["evictions"]), ["free", "exit"])
        self.assertEqual(pool["evictions"]["free"]["p50_ns"], 87040)
        self.assertEqual(pool["evictions_total"], 2)
        self.assertEqual(pool["summary_evictions"], {"free": 1, "exit": 1})
        self.assertEqual(pool["peak_bytes"], M4)
        self.assertEqual(pool["peak_entries"], 1)
        self.assertEqual(pool["saved_ns_source"], "records")
        # the first register (171 us) may pay CUDA's start-up and prices nothing;
        # one warm register (175 us) and two evictions are too few to price
        sv = pool["saving"]
        self.assertEqual(sv["measured_ns"], 364000 + 10000 + 174000)
        self.assertEqual((sv["hits"], sv["hits_priced"], sv["deferred"], sv["deferred_priced"]),
                         (18, 0, 20, 0))
        self.assertFalse(sv["estimable"])
        self.assertIsNone(pool["saved_ns_est"])

    def test_pool_saving_priced(self):
        b = priced_log()
        d = tempfile.mkdtemp(prefix="lazypin-priced-")
        try:
            pool = report_json(b.write(os.path.join(d, "p.jsonl")))["pool"]
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self.assertEqual(pool["saved_ns_est"], 30 * (170 - 1) * US + 30 * (90 * US - 500))
        # each price: sample variance 100 us^2, of the mean 33.3; 2 x 30 x 5.77 us x 2^0.5
        self.assertEqual(pool["saving"]["spread_ns"], round(2 * (2 * 900 * 1e8 / 3) ** 0.5))
        self.assertEqual(pool["saving"]["price_calls"], 6)

    def test_an_idle_pool_saved_nothing(self):
        # a program that keeps its registrations (a caching pinned allocator):
        # misses only, so the saving is exactly 0, said as the shim says it
        b = LogBuilder("defer")
        for i in range(4):
            b.reg(0x7f0000000000 + i * (8 << 20), M4, 300 * US, "miss")
        d = tempfile.mkdtemp(prefix="lazypin-idle-")
        try:
            path = b.write(os.path.join(d, "p.jsonl"))
            sv = report_json(path)["pool"]["saving"]
            text = report(path).stdout
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self.assertTrue(sv["estimable"])
        self.assertEqual(sv["saved_ns"], 0)
        self.assertEqual(sv["text"], "saved nothing (no register hit the pool and no unregister was deferred)")
        self.assertIn("saved nothing", text)

    def test_multi(self):
        d = report_json(fx("multi"))
        self.assertEqual([p["pid"] for p in d["processes"]], [7001, 7002])
        self.assertEqual(d["apis"]["cuMemHostRegister_v2"]["calls"], 6)
        self.assertEqual(d["pool"]["peak_bytes"], 1 << 20)
        self.assertEqual(d["pool"]["pool_summaries"], 1)
        self.assertEqual(d["processes"][1]["ended_by"], "SIGTERM")
        # not every process has the shim's estimate: recomputed from the records
        self.assertEqual(d["pool"]["saved_ns_source"], "records")
        # each process's only driver register is its first: no warm register
        # prices the 4 hits (they count as nothing); each process prices its
        # deferrals at its own evictions; the run's figure is their sum
        sv = d["pool"]["saving"]
        self.assertEqual((sv["hits"] - sv["hits_priced"], sv["deferred"] - sv["deferred_priced"]), (4, 6))
        self.assertEqual([p["saved_ns"] for p in d["processes"]], [None, None])
        self.assertIsNone(d["pool"]["saved_ns_est"])
        r = report(fx("multi"))
        self.assertIn("saving not estimable", r.stdout)
        self.assertNotIn("(estimated", r.stdout)

    def test_no_summary_recomputes_saved(self):
        d = report_json(fx("truncated.jsonl"))
        self.assertEqual(d["pool"]["saved_ns_source"], "records")
        self.assertIsNone(d["pool"]["peak_bytes"])


class CompareAutoPin(unittest.TestCase):
    def test_autopin_run_is_labelled_and_its_copies_named(self):
        # a log-mode run of the same program and arguments: the header's mode
        with open(fx("autopin.jsonl")) as f:
            lines = f.read().splitlines()
        h = json.loads(lines[0])
        h["mode"] = h["mode_requested"] = "log"
        h["config"]["mode"] = "log"
        bare = [json.dumps(h)]
        for l in lines[1:]:
            r = json.loads(l)
            if r.get("type") == "call":
                r["action"] = "forward"
                bare.append(json.dumps(r))
        d = tempfile.mkdtemp(prefix="lazypin-apc-")
        try:
            p = os.path.join(d, "bare.jsonl")
            with open(p, "w") as f:
                f.write("\n".join(bare) + "\n")
            out = report(p, "--compare", fx("autopin.jsonl")).stdout
            c = report_json(p, "--compare", fx("autopin.jsonl"))["comparison"]
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self.assertIn("(defer+autopin)", out)
        # the fixture predates copy times: its copies priced at the fixed rates, said so
        self.assertIn("its copies are not in the registration calls measured here; estimated at "
                      "fixed copy rates, an H200's", out)
        self.assertIn("autopin", c["saving"])


    def test_a_run_is_labelled_with_its_features_from_its_configuration(self):
        # auto-pin asked for but nothing pinned, and LAZYPIN_UNREGISTER_WAIT=0: not "(defer)"
        with open(fx("defer_mode.jsonl")) as f:
            lines = f.read().splitlines()
        h = json.loads(lines[0])
        h["config"].update(autopin=True, unregister_wait=False)
        d = tempfile.mkdtemp(prefix="lazypin-label-")
        try:
            p = os.path.join(d, "features.jsonl")
            with open(p, "w") as f:
                f.write("\n".join([json.dumps(h)] + lines[1:]) + "\n")
            out = report(fx("log_mode.jsonl"), "--compare", p, "--force").stdout
        finally:
            shutil.rmtree(d, ignore_errors=True)
        self.assertIn("features.jsonl (defer+autopin+no-wait)", out)
        self.assertIn("log_mode.jsonl (log)", out)


class BriefSummary(unittest.TestCase):
    def test_large_logs_are_summed_from_their_summaries(self):
        # a log whose summary carries the shim's saving, as the shim writes it
        b = priced_log()
        d = tempfile.mkdtemp(prefix="lazypin-brief-")
        try:
            path = b.write(os.path.join(d, "p.jsonl"))
            doc = report_json(path)
            with open(path) as f:
                lines = f.read().splitlines()
            summ = json.loads(lines[-1])
            sv = {k: doc["processes"][0]["saving"][k] for k in (
                "saved_ns", "spread_ns", "hits", "hits_priced", "deferred", "deferred_priced",
                "evictions", "evictions_ns", "price_calls")}
            summ["apis"] = {api: {k: st[k] for k in ("calls", "errors", "total_ns", "p50_ns", "p99_ns")}
                            for api, st in doc["apis"].items()}
            summ["pool"] = {"hits": doc["pool"]["hits"], "misses": doc["pool"]["misses"], "saving": sv}
            lines[-1] = json.dumps(summ)
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            m = load_module()
            full = m.brief_summary([path])
            m.BRIEF_READ_LIMIT = 0
            brief = m.brief_summary([path])
        finally:
            shutil.rmtree(d, ignore_errors=True)
        pool = [l for l in full.splitlines() if "pool:" in l]
        self.assertEqual(len(pool), 1)
        self.assertIn("saved", pool[0])
        self.assertEqual(pool, [l for l in brief.splitlines() if "pool:" in l])
        self.assertEqual([l for l in full.splitlines() if "cudaHostRegister" in l],
                         [l for l in brief.splitlines() if "cudaHostRegister" in l])
        self.assertIn("from the shim's summaries", brief)

    def test_signal_summary_is_named(self):
        m = load_module()
        m.BRIEF_READ_LIMIT = 0
        self.assertIn("without a full summary", m.brief_summary([fx("multi")+"/lazypin-python3-7002.jsonl"]))


class Compare(unittest.TestCase):
    def test_json_ratios(self):
        d = report_json(fx("log_mode.jsonl"), "--compare", fx("defer_mode.jsonl"), "--force")
        self.assertEqual(list(d), ["lazypin_report", "baseline", "other", "comparison"])
        c = d["comparison"]
        reg = c["apis"]["cudaHostRegister"]
        self.assertEqual(reg["baseline"]["p50_ns"], 169984)
        self.assertEqual(reg["other"]["p50_ns"], 1000)
        self.assertAlmostEqual(reg["ratio"]["p50"], 169.984)
        self.assertAlmostEqual(reg["ratio"]["total"], 1350500 / 364000)
        self.assertAlmostEqual(c["apis"]["cudaHostUnregister"]["ratio"]["p99"], 2129920 / 500)
        self.assertEqual(c["total_ns"]["baseline"], 3997236)
        self.assertEqual(c["total_ns"]["other"], 374000)
        self.assertAlmostEqual(c["total_ns"]["ratio"], 3997236 / 374000)

    def test_text(self):
        r = report(fx("log_mode.jsonl"), "--compare", fx("defer_mode.jsonl"), "--force")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("pool: 18 hits / 20 registers (90%)", out)
        reg = row(out, "cudaHostRegister")
        self.assertEqual(reg[1:3], ["9", "20"])
        self.assertIn("170x", reg)   # p50 ratio 169.984
        self.assertIn("time in registration calls: A 4.00 ms, B 374 us, ratio 10.7x", out)

    def test_api_missing_on_one_side(self):
        d = report_json(fx("log_mode.jsonl"), "--compare", fx("multi"), "--force")
        c = d["comparison"]["apis"]
        self.assertEqual(c["cuMemHostRegister_v2"]["baseline"]["calls"], 0)
        self.assertIsNone(c["cuMemHostRegister_v2"]["ratio"]["p50"])
        self.assertEqual(c["cudaHostRegister"]["other"]["calls"], 0)


class Plot(unittest.TestCase):
    HINT = ("lazypin report: --plot needs matplotlib (pip install matplotlib, "
            "or apt-get install python3-matplotlib)")

    def test_without_matplotlib(self):
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "out.png")
            r = report(fx("defer_mode.jsonl"), "--plot", png,
                       env=clean_env(LAZYPIN_REPORT_NO_MATPLOTLIB="1"))
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("no plot written: " + self.HINT[len("lazypin report: "):], r.stderr)
            self.assertIn("pool: 18 hits / 20 registers", r.stdout)
            self.assertFalse(os.path.exists(png))

    def test_without_matplotlib_in_process(self):
        m = load_module()
        saved = {k: sys.modules[k] for k in list(sys.modules) if k.split(".")[0] == "matplotlib"}
        sys.modules["matplotlib"] = None    # makes `import matplotlib` fail
        try:
            logs = m.load([fx("log_mode.jsonl")])
            self.assertEqual(m.plot([("baseline", logs)], "/nonexistent/x.png"), m.PLOT_HINT)
        finally:
            del sys.modules["matplotlib"]
            sys.modules.update(saved)

    def test_a_plot_that_cannot_be_written_fails(self):
        if not any(subprocess.run([p, "-c", "import matplotlib"], capture_output=True).returncode == 0
                   for p in ("/usr/bin/python3", PY)):
            self.skipTest("no python3 here has matplotlib")
        r = report(fx("log_mode.jsonl"), "--plot", "/nonexistent/dir/out.png")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("no plot written: /nonexistent/dir/out.png", r.stderr)

    def test_the_interpreter_that_has_matplotlib_draws_it(self):
        # python3 on PATH without matplotlib (a venv, pyenv's), another with it:
        # the report runs there; with none, it names what it tried and fails
        has = [p for p in ("/usr/bin/python3", sys.executable)
               if subprocess.run([p, "-c", "import matplotlib"], capture_output=True).returncode == 0]
        if not has:
            self.skipTest("no python3 here has matplotlib")
        with tempfile.TemporaryDirectory() as d:
            venv = os.path.join(d, "venv")
            r = subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], capture_output=True)
            if r.returncode != 0:
                self.skipTest("no venv: %s" % r.stderr)
            bare = os.path.join(venv, "bin", "python3")
            if subprocess.run([bare, "-c", "import matplotlib"], capture_output=True).returncode == 0:
                self.skipTest("the venv sees matplotlib")
            png = os.path.join(d, "out.png")
            path = os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", "")
            env = clean_env(PATH=path, LAZYPIN_REPORT_PYTHON=has[0])
            r = subprocess.run([bare, REPORT, fx("log_mode.jsonl"), "--plot", png], capture_output=True,
                               text=True, env=env, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("plot written to", r.stderr)
            self.assertIn("cudaHostRegister", r.stdout)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            # through `lazypin report`, without naming one: found on its own
            os.unlink(png)
            r = subprocess.run([bare, LAZYPIN, "report", fx("log_mode.jsonl"), "--plot", png],
                               capture_output=True, text=True, env=clean_env(PATH=path), timeout=120)
            if "/usr/bin/python3" in has:
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(os.path.exists(png))
            # one named that lacks it: no search, a message naming it, status 1
            r = subprocess.run([bare, REPORT, fx("log_mode.jsonl"), "--plot", png], capture_output=True,
                               text=True, env=clean_env(PATH=path, LAZYPIN_REPORT_PYTHON=bare), timeout=120)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("LAZYPIN_REPORT_PYTHON=", r.stderr)
            self.assertIn(bare, r.stderr)

    @unittest.skipUnless(importlib.util.find_spec("matplotlib"), "matplotlib is not installed")
    def test_with_matplotlib(self):
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "out.png")
            r = report(fx("log_mode.jsonl"), "--compare", fx("defer_mode.jsonl"), "--plot", png)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class BadInput(unittest.TestCase):
    def test_missing_file(self):
        r = report("/nonexistent/lp.jsonl")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip(), "lazypin report: /nonexistent/lp.jsonl: no such file")
        r = report(fx("log_mode.jsonl"), "--compare", "/nonexistent/other.jsonl")
        self.assertEqual(r.returncode, 2)
        self.assertIn("/nonexistent/other.jsonl: no such file", r.stderr)

    def test_empty_file(self):
        r = report(fx("empty.jsonl"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("empty.jsonl: empty log", r.stderr)
        self.assertTrue(r.stderr.startswith("lazypin report: "))

    def test_empty_file_among_others_in_a_directory(self):
        with tempfile.TemporaryDirectory() as d:
            shutil.copy(fx("log_mode.jsonl"), d)
            shutil.copy(fx("empty.jsonl"), d)
            r = report(d)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("empty.jsonl: empty log, skipped", r.stdout)

    def test_directory_without_logs(self):
        with tempfile.TemporaryDirectory() as d:
            r = report(d)
            self.assertEqual(r.returncode, 2)
            self.assertIn("no *.jsonl", r.stderr)

    def test_truncated(self):
        path = fx("truncated.jsonl")
        r = report(path)
        self.assertEqual(r.returncode, 0, r.stderr)
        msg = ("log was cut: %s ends with an incomplete record (the process may have crashed)" % path)
        self.assertIn(msg, r.stdout)
        self.assertEqual(row(r.stdout, "cudaHostRegister")[1], "3")
        d = report_json(path)
        self.assertTrue(d["processes"][0]["cut"])
        self.assertEqual(d["totals"]["calls"], 6)
        self.assertIn(msg, [w["message"] for w in d["warnings"]])

    def test_garbage_in_the_middle(self):
        r = report(fx("garbage.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("skipped 2 unreadable lines (first at line 4)", r.stdout)
        d = report_json(fx("garbage.jsonl"))
        self.assertEqual(d["apis"]["cudaHostRegister"]["calls"], 4)
        self.assertEqual(d["apis"]["cudaHostRegister"]["p50_ns"], 198656)
        self.assertFalse(d["processes"][0]["cut"])

    def test_newer_format(self):
        path = fx("newer_format.jsonl")
        r = report(path)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip(), "lazypin report: %s: log format 2 is newer than this "
                                           "report tool understands (1)" % path)

    def test_no_header(self):
        r = report(fx("no_header.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("no header record", r.stdout)
        self.assertEqual(row(r.stdout, "cudaHostRegister")[1], "1")

    def test_not_a_log(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.jsonl")
            with open(p, "w") as f:
                f.write("hello\nworld\n")
            r = report(p)
            self.assertEqual(r.returncode, 2)
            self.assertIn("no lazypin records", r.stderr)

    def test_unknown_record_types_and_fields_are_ignored(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.jsonl")
            with open(fx("log_mode.jsonl")) as f:
                lines = f.read().splitlines()
            lines.insert(2, json.dumps({"type": "future_thing", "x": 1}))
            rec = json.loads(lines[1])
            rec["new_field"] = {"a": 1}
            lines[1] = json.dumps(rec)
            with open(p, "w") as f:
                f.write("\n".join(lines) + "\n")
            self.assertEqual(report_json(p)["apis"]["cudaHostRegister"]["calls"], 9)


# --------------------------------------------------------------------------
# logs built here, with a known truth

M1 = 1 << 20
US = 1000
MS = 1000 * 1000


def header(mode="defer", pid=4242, **kw):
    h = {"type": "header", "format": 1, "lazypin": "0.1.0", "pid": pid, "exe": "/opt/app/demo",
         "argv": ["./demo"], "mode": mode, "mode_requested": mode, "mode_reason": "",
         "host": "node1", "watch": "uffd", "watch_reason": "",
         "start_unix_ns": 1764553000000000000, "driver_version": 13000,
         "config": {"mode": mode, "pool_bytes": 8 << 30, "pool_entries": 65536, "idle_ms": 10000}}
    for k, v in kw.items():
        if k == "config":
            h["config"].update(v)
        else:
            h[k] = v
    return h


class LogBuilder:
    """Records of one process, in order, with a clock."""

    def __init__(self, mode="defer", **kw):
        self.recs = [header(mode, **kw)]
        self.t = 0

    def call(self, api, ptr, nbytes, lat, action, result=0, evicted=0, **extra):
        r = {"type": "call", "t_ns": self.t, "tid": 1, "api": api, "via": "symbol",
             "ptr": "0x%x" % ptr, "bytes": nbytes, "flags": 0, "result": result,
             "latency_ns": lat, "action": action, "evicted": evicted}
        r.update(extra)
        self.recs.append(r)
        self.t += lat + 10 * US
        return self

    def reg(self, ptr, nbytes, lat, action, **kw):
        return self.call("cudaHostRegister", ptr, nbytes, lat, action, **kw)

    def unreg(self, ptr, lat, action, **kw):
        return self.call("cudaHostUnregister", ptr, 0, lat, action, **kw)

    def evict(self, ptr, nbytes, reason, lat, **extra):
        r = {"type": "evict", "t_ns": self.t, "tid": 2, "ptr": "0x%x" % ptr, "bytes": nbytes,
             "reason": reason, "result": 0, "latency_ns": lat}
        r.update(extra)
        self.recs.append(r)
        self.t += lat
        return self

    def wait(self, ns):
        self.t += ns
        return self

    def write(self, path, ended_by="exit"):
        with open(path, "w") as f:
            for r in self.recs + [{"type": "summary", "t_ns": self.t, "ended_by": ended_by}]:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        return path


def priced_log():
    """A defer log whose real calls price its hits and deferrals: three warm
    registers (160, 170, 180 us) price 30 hits of 1 us; three forwarded
    unregisters (80, 90, 100 us) price 30 deferrals of 500 ns."""
    b = LogBuilder("defer")
    bufs = [0x7f0000000000 + i * (8 << 20) for i in range(4)]
    b.reg(bufs[3], M4, 300 * MS, "miss")
    for p, lat in zip(bufs, (160, 170, 180)):
        b.reg(p, M4, lat * US, "miss")
    for p, lat in zip(bufs, (80, 90, 100)):
        b.unreg(p, lat * US, "passthrough", reason="shared")
    for k in range(30):
        b.reg(bufs[k % 3], M4, 1 * US, "hit").unreg(bufs[k % 3], 500, "deferred")
    return b


def bare_total(b):
    return sum(r["latency_ns"] for r in b.recs if r["type"] in ("call", "evict"))


class InTempDir(unittest.TestCase):
    """A test case with its own temporary directory, self.d."""

    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="lazypin-%s-" % type(self).__name__.lower())

    def tearDown(self):
        shutil.rmtree(self.d, ignore_errors=True)


class BigPins(InTempDir):
    """Registers and pinned allocations of 64 MiB or more the driver made:
    their lines and rate, and the advice that names what would help."""

    G = 1 << 30

    def doc(self, b, name="b.jsonl"):
        path = b.write(os.path.join(self.d, name))
        return report_json(path), report(path).stdout

    def test_lines_rates_and_shares(self):
        b = LogBuilder("defer", config={"prefault": 16, "prefault_huge": False})
        b.reg(0x7f0000000000, 4 * self.G, 400 * MS, "miss")        # 100 ms per GiB
        b.reg(0x7f1000000000, M4, 300 * US, "miss")                # small: not a big pin
        b.call("cudaHostAlloc", 0x7f2000000000, self.G, 500 * MS, "miss")
        b.reg(0x7f0000000000, 4 * self.G, 1 * US, "hit")           # the pool's: not the driver's
        b.wait(100 * MS)
        d, text = self.doc(b)
        big = d["big_pins"]
        self.assertEqual((big["calls"], big["bytes"], big["total_ns"]), (2, 5 * self.G, 900 * MS))
        self.assertEqual([(r["api"], r["ms_per_gib"]) for r in big["slowest"]],
                         [("cudaHostAlloc", 500.0), ("cudaHostRegister", 100.0)])
        run = d["processes"][0]["duration_ns"]
        self.assertAlmostEqual(big["slowest"][0]["share_of_run"], 500 * MS / run, places=3)
        self.assertIn("== big pins", text)
        rules = {a["rule"]: a for a in d["advice"]}
        # defer with small pages at 100 ms per GiB: huge pages asked for
        self.assertEqual(rules["prefault_huge"]["setting"], {"LAZYPIN_PREFAULT_HUGE": "1"})
        self.assertIn("1 call of 4 GiB in all took 400 ms (100 ms per GiB)", rules["prefault_huge"]["finding"])
        # the allocation: no variable helps; the register path is named
        self.assertIsNone(rules["host_alloc_big"]["setting"])
        self.assertNotIn("prefault", rules)

    def test_log_mode_first_registers_suggest_defer(self):
        b = LogBuilder("log")
        b.reg(0x7f0000000000, 16 * self.G, 5200 * MS, "forward")  # 325 ms per GiB
        d, _ = self.doc(b)
        rules = {a["rule"]: a for a in d["advice"]}
        self.assertEqual(rules["prefault"]["setting"], {"LAZYPIN_MODE": "defer", "LAZYPIN_PREFAULT": "16"})
        self.assertNotIn("prefault_huge", rules)

    def test_touched_memory_and_huge_pages_get_no_advice(self):
        # 40 ms per GiB: the driver's pin of present pages (or huge pages): nothing to gain
        b = LogBuilder("log")
        b.reg(0x7f0000000000, 4 * self.G, 160 * MS, "forward")
        b2 = LogBuilder("defer", pid=4243, config={"prefault": 16, "prefault_huge": True})
        b2.reg(0x7f0000000000, 4 * self.G, 180 * MS, "miss")
        d = report_json(b.write(os.path.join(self.d, "a.jsonl")), b2.write(os.path.join(self.d, "c.jsonl")))
        self.assertEqual(d["big_pins"]["calls"], 2)
        self.assertFalse({"prefault", "prefault_huge", "host_alloc_big"} & {a["rule"] for a in d["advice"]})


class TrueSavings(InTempDir):
    """Pairs of logs (bare, pooled) of the same program where the truth is known."""

    def p(self, name):
        return os.path.join(self.d, name)

    def test_sigterm_run_estimate_stays_under_the_truth(self):
        # 4 buffers of 4 MiB, then 1000 register/unregister rounds; the process's
        # first register pays CUDA's start-up (300 ms); killed by SIGTERM.
        bufs = [0x7f0000000000 + i * (8 << 20) for i in range(4)]
        bare, pooled = LogBuilder("log"), LogBuilder("defer")
        for i, b in enumerate(bufs):
            first = 300 * MS if i == 0 else 170 * US
            bare.reg(b, M4, first, "forward")
            pooled.reg(b, M4, first, "miss")
        for k in range(1000):
            b = bufs[k % 4]
            bare.unreg(b, 90 * US, "forward").reg(b, M4, 170 * US, "forward")
            pooled.unreg(b, 500, "deferred").reg(b, M4, 1 * US, "hit")
        os.mkdir(self.p("alone"))
        pooled.write(self.p("alone/defer.jsonl"), "SIGTERM")
        truth = bare_total(bare) - bare_total(pooled)
        d = report_json(self.p("alone/defer.jsonl"))
        est = d["pool"]["saved_ns_est"]
        duration = d["processes"][0]["duration_ns"]
        # the naive figure (hits x mean real register) would be ~75 s for a 0.32 s run
        self.assertGreater(est, 0)
        self.assertLessEqual(est, truth)
        self.assertLessEqual(est, duration)
        self.assertGreater(est, truth * 0.6)   # the hits are priced; the unregisters are not
        sv = d["pool"]["saving"]
        self.assertEqual(sv["deferred"] - sv["deferred_priced"], 1000)
        self.assertIn("1000 hits/deferrals unpriced", sv["text"])
        # beside a log of the same program in log mode, its real unregisters
        # price the deferrals: the estimate is the truth here
        bare.write(self.p("bare.jsonl"), "SIGTERM")
        pooled.write(self.p("defer.jsonl"), "SIGTERM")
        d = report_json(self.p("defer.jsonl"))
        sv = d["pool"]["saving"]
        self.assertEqual((sv["deferred_priced"], sv["borrowed"]), (1000, 1000))
        self.assertEqual(d["pool"]["saved_ns_est"], truth)
        self.assertIn("1000 hits/deferrals priced from 1000 real calls of another log of the "
                      "same program (bare.jsonl), this run having too few of its own", sv["text"])
        self.assertNotIn("unpriced", sv["text"])
        # the same figure in the directory's report, and in --compare's estimate
        self.assertEqual(report_json(self.d)["processes"][1]["saved_ns"], truth)
        # with the bare log, the measured difference wins
        c = report_json(self.p("bare.jsonl"), "--compare", self.p("defer.jsonl"))
        self.assertEqual(c["comparison"]["saving"]["saved_ns"], truth)
        self.assertEqual(c["other"]["pool"]["saved_ns_est"], truth)
        self.assertEqual(c["other"]["pool"]["saved_ns_source"], "measured")
        out = report(self.p("bare.jsonl"), "--compare", self.p("defer.jsonl")).stdout
        self.assertIn("the pool (B) saved %s, measured" % load_module().fmt_ns(truth), out)

    def test_pool_of_two_entries_reports_a_loss(self):
        # 3 buffers cycled with LAZYPIN_POOL_ENTRIES=2: every register misses,
        # every deferral is paid back by an LRU eviction (slower than a bare
        # unregister: it waits for the GPU first).
        bufs = [0x7f0000000000 + i * (2 << 20) for i in range(3)]
        bare = LogBuilder("log")
        pooled = LogBuilder("defer", config={"pool_entries": 2})
        for k in range(300):
            b = bufs[k % 3]
            bare.reg(b, M1, 100 * US, "forward").unreg(b, 50 * US, "forward")
            pooled.reg(b, M1, 104 * US, "miss").unreg(b, 500, "deferred")
            if k >= 1:
                pooled.evict(bufs[(k - 1) % 3], M1, "lru", 58 * US)
        bare.write(self.p("bare.jsonl"))
        pooled.write(self.p("defer.jsonl"))
        truth = bare_total(bare) - bare_total(pooled)
        self.assertLess(truth, 0)
        d = report_json(self.p("defer.jsonl"))
        self.assertLess(d["pool"]["saved_ns_est"], 0)
        self.assertGreaterEqual(d["pool"]["saved_ns_est"], truth)   # never flatters
        r = report(self.p("defer.jsonl"))
        self.assertIn("more than it saved (estimated from", r.stdout)
        c = report_json(self.p("bare.jsonl"), "--compare", self.p("defer.jsonl"))
        self.assertEqual(c["comparison"]["saving"]["saved_ns"], truth)
        adv = {a["rule"]: a for a in d["advice"]}
        self.assertEqual(adv["lru_entries"]["setting"], {"LAZYPIN_POOL_ENTRIES": "4"})

    def test_fixture_pair(self):
        # the hand-written fixtures: 9 calls bare vs 40 pooled: scaled per API
        c = report_json(fx("log_mode.jsonl"), "--compare", fx("defer_mode.jsonl"), "--force")
        s = c["comparison"]["saving"]
        self.assertTrue(s["scaled"])
        self.assertEqual(s["pooled_run"], "other")
        bare = 1350500 * 20 / 9 + 2646736 * 20 / 9
        self.assertEqual(s["saved_ns"], round(bare - (374000 + 174000)))


class Advice(InTempDir):
    """One rule per finding; each test makes the finding and nothing else."""

    def advice(self, b):
        d = report_json(b.write(os.path.join(self.d, "x.jsonl")))
        return {a["rule"]: a for a in d["advice"]}

    def test_happy_run_has_none(self):
        self.assertEqual(report_json(fx("defer_mode.jsonl"))["advice"], [])
        self.assertIn("== advice\n  none", report(fx("defer_mode.jsonl")).stdout)

    def test_buffer_bigger_than_pool_bytes(self):
        b = LogBuilder(config={"pool_bytes": 64 << 20})
        for _ in range(5):
            b.reg(0x7f0000000000, 256 << 20, 9 * MS, "forward").unreg(0x7f0000000000, 4 * MS, "forward")
        a = self.advice(b)
        self.assertEqual(list(a), ["pool_bytes"])
        self.assertIn("5 registers of up to 256 MiB were bigger than LAZYPIN_POOL_BYTES (64 MiB)",
                      a["pool_bytes"]["finding"])
        self.assertEqual(a["pool_bytes"]["setting"], {"LAZYPIN_POOL_BYTES": "512M"})

    def test_lru_evictions_from_too_few_entries(self):
        b = LogBuilder(config={"pool_entries": 4})
        bufs = [0x7f0000000000 + i * M1 for i in range(6)]
        for k in range(30):
            p = bufs[k % 6]
            b.reg(p, 4096, 20 * US, "miss").unreg(p, 500, "deferred")
            if k >= 4:
                b.evict(bufs[(k - 4) % 6], 4096, "lru", 10 * US)
        a = self.advice(b)
        self.assertEqual(list(a), ["lru_entries"])
        self.assertEqual(a["lru_entries"]["setting"], {"LAZYPIN_POOL_ENTRIES": "8"})

    def test_idle_release_reused_later(self):
        b = LogBuilder()
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "miss").unreg(p, 500, "deferred").wait(10 * 1000 * MS)
        b.evict(p, M1, "idle", 50 * US).wait(5 * 1000 * MS)
        b.reg(p, M1, 100 * US, "miss").unreg(p, 500, "deferred")
        a = self.advice(b)
        self.assertEqual(list(a), ["idle"])
        self.assertIn("longest pause between uses: 15.0 s", a["idle"]["finding"])
        self.assertEqual(a["idle"]["setting"], {"LAZYPIN_IDLE_MS": "50000"})

    def test_shared_pages_passed_through(self):
        b = LogBuilder()
        p = 0x7f0000000000
        for _ in range(3):
            b.reg(p, M1, 100 * US, "miss").unreg(p, 50 * US, "passthrough", reason="shared")
        a = self.advice(b)
        self.assertEqual(list(a), ["shared"])
        self.assertIn("3 unregisters of shared or file-backed pages", a["shared"]["finding"])
        out = report(os.path.join(self.d, "x.jsonl")).stdout
        self.assertIn("passed to the driver on purpose: shared 3", out)
        self.assertNotIn("lazypin was off", out)   # the new meaning of passthrough

    def test_kernel_watch_unavailable(self):
        b = LogBuilder(watch="hooks", watch_reason="userfaultfd: EPERM")
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "miss").unreg(p, 50 * US, "passthrough", reason="unwatched")
        a = self.advice(b)
        self.assertEqual(list(a), ["watch"])
        self.assertIn("(userfaultfd: EPERM)", a["watch"]["finding"])
        self.assertIn("1 unregister of ranges lazypin could not watch", a["watch"]["finding"])

    def test_releases_while_the_gpu_was_busy(self):
        b = LogBuilder()
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "miss").unreg(p, 500, "deferred")
        b.evict(p, M1, "free", 2 * MS, waited_ns=2 * MS, forced=True)
        a = self.advice(b)
        self.assertEqual(list(a), ["busy"])
        self.assertIn("1 release made while the GPU was still busy", a["busy"]["finding"])
        self.assertIn("waiting 2.00 ms", a["busy"]["finding"])
        d = report_json(os.path.join(self.d, "x.jsonl"))
        self.assertEqual(d["pool"]["evictions"]["free"]["forced"], 1)

    def test_allocate_pin_unpin_free(self):
        b = LogBuilder()
        for i in range(5):
            p = 0x7f0000000000 + i * (8 << 20)
            b.reg(p, M4, 170 * US, "miss").unreg(p, 500, "deferred").evict(p, M4, "free", 90 * US)
        a = self.advice(b)
        self.assertEqual(list(a), ["pattern"])
        self.assertIn("4 of 5 driver registers were of a new address", a["pattern"]["finding"])

    def test_same_address_after_free_is_the_pattern_too(self):
        b = LogBuilder()
        p = 0x7f0000000000   # malloc may hand back the freed address
        for i in range(4):
            b.reg(p, M4, 170 * US, "miss").unreg(p, 500, "deferred").evict(p, M4, "free", 90 * US)
        self.assertEqual(list(self.advice(b)), ["pattern"])

    def test_kernel_watch_not_advised_in_log_mode(self):
        # log mode never uses the watch: its header says hooks, with no reason
        b = LogBuilder("log", watch="hooks", watch_reason="")
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "forward").unreg(p, 50 * US, "forward")
        self.assertEqual(self.advice(b), {})

    def test_kernel_watch_not_advised_when_the_user_chose_hooks(self):
        b = LogBuilder(watch="hooks", watch_reason="LAZYPIN_WATCH=hooks", config={"watch": "hooks"})
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "miss").unreg(p, 500, "deferred")
        self.assertEqual(self.advice(b), {})

    def test_kernel_watch_unavailable_in_defer_mode_without_passthroughs(self):
        b = LogBuilder(watch="hooks", watch_reason="userfaultfd: EPERM", config={"watch": "auto"})
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "miss").unreg(p, 500, "deferred")
        a = self.advice(b)
        self.assertEqual(list(a), ["watch"])
        self.assertIn("lazypin relied on its hooks alone", a["watch"]["finding"])

    def test_log_mode_reregistrations_advise_defer(self):
        b = LogBuilder("log")
        p = 0x7f0000000000
        for _ in range(606):
            b.reg(p, M4, 170 * US, "forward").unreg(p, 90 * US, "forward")
        a = self.advice(b)
        self.assertEqual(list(a), ["defer"])
        self.assertIn("605 of 606 registers were of an address and size registered before",
                      a["defer"]["finding"])
        # 605 registers (170 us) and the unregisters before them (90 us)
        self.assertIn("estimated %s saved" % load_module().fmt_ns(605 * 260 * US),
                      a["defer"]["suggestion"])
        self.assertEqual(a["defer"]["setting"], {"LAZYPIN_MODE": "defer"})
        out = report(os.path.join(self.d, "x.jsonl")).stdout
        self.assertIn("try --defer", out)

    def test_log_mode_distinct_buffers_do_not_advise_defer(self):
        b = LogBuilder("log")
        for i in range(50):
            p = 0x7f0000000000 + i * (8 << 20)
            b.reg(p, M4, 170 * US, "forward").unreg(p, 90 * US, "forward")
        # the same address with another size is not a hit either
        p = 0x7f0000000000
        b.reg(p, M1, 100 * US, "forward").unreg(p, 50 * US, "forward")
        self.assertEqual(self.advice(b), {})

    def test_defer_mode_reregistrations_do_not_advise_defer(self):
        b = LogBuilder("defer")
        p = 0x7f0000000000
        b.reg(p, M4, 170 * US, "miss").unreg(p, 500, "deferred")
        for _ in range(100):
            b.reg(p, M4, 1 * US, "hit").unreg(p, 500, "deferred")
        self.assertEqual(self.advice(b), {})

    def test_lru_evictions_from_too_few_bytes(self):
        # the pool's bytes were full (peak at the bound): raise the bytes
        b = LogBuilder(config={"pool_bytes": 8 << 20, "pool_entries": 65536})
        bufs = [0x7f0000000000 + i * (8 << 20) for i in range(3)]
        for k in range(30):
            p = bufs[k % 3]
            b.reg(p, M4, 170 * US, "miss").unreg(p, 500, "deferred")
            if k >= 2:
                b.evict(bufs[(k - 2) % 3], M4, "lru", 90 * US)
        path = b.write(os.path.join(self.d, "x.jsonl"))
        with open(path) as f:
            lines = f.read().splitlines()
        summ = json.loads(lines[-1])
        summ["pool"] = {"peak_bytes": 8 << 20, "peak_entries": 2}
        lines[-1] = json.dumps(summ)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        a = {x["rule"]: x for x in report_json(path)["advice"]}
        self.assertEqual(list(a), ["lru_bytes"])
        self.assertEqual(a["lru_bytes"]["setting"], {"LAZYPIN_POOL_BYTES": "16M"})

    def test_unregisters_that_kept_their_wait(self):
        b = LogBuilder()
        p = 0x7f0000000000
        for _ in range(2):
            b.reg(p, M1, 100 * US, "miss").unreg(p, 50 * US, "passthrough", reason="wait")
        a = self.advice(b)
        self.assertEqual(list(a), ["wait"])
        self.assertIn("2 unregisters kept their bare semantics", a["wait"]["finding"])

    def test_few_frees_do_not_make_the_pattern(self):
        # one buffer freed among many reused: not the allocate-pin-free pattern
        b = LogBuilder()
        bufs = [0x7f0000000000 + i * (8 << 20) for i in range(8)]
        for p in bufs:
            b.reg(p, M4, 170 * US, "miss").unreg(p, 500, "deferred")
        b.evict(bufs[0], M4, "free", 90 * US)
        b.reg(0x7f1000000000, M4, 170 * US, "miss").unreg(0x7f1000000000, 500, "deferred")
        for _ in range(5):
            for p in bufs[1:]:
                b.reg(p, M4, 1 * US, "hit").unreg(p, 500, "deferred")
        self.assertEqual(self.advice(b), {})

    def test_mode_not_the_one_asked_for(self):
        b = LogBuilder("log", mode_requested="defer", mode_reason="self-test failed: cuMemHostRegister 201")
        b.reg(0x7f0000000000, M1, 100 * US, "forward")
        a = self.advice(b)
        self.assertEqual(list(a), ["mode"])
        self.assertIn("asked for LAZYPIN_MODE=defer and ran in log mode: self-test failed",
                      a["mode"]["finding"])
        out = report(os.path.join(self.d, "x.jsonl")).stdout
        self.assertIn("mode     log (asked: defer; self-test failed", out)


class CallSites(unittest.TestCase):
    SRC = ("#include <stdio.h>\n"
           "void pin_small(void) { puts(\"small\"); }\n"
           "void pin_big(void) {\n"
           "  puts(\"big\");\n"
           "}\n"
           "int main(void) { pin_small(); pin_big(); return 0; }\n")

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lazypin-sites-")
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc or not shutil.which("nm"):
            raise unittest.SkipTest("no C compiler or nm")
        src = os.path.join(cls.tmp, "sites.c")
        with open(src, "w") as f:
            f.write(cls.SRC)
        cls.exe = os.path.join(cls.tmp, "sites")
        subprocess.run([cc, "-g", "-O0", "-fPIE", "-pie", "-o", cls.exe, src], check=True)
        syms = {}
        for line in subprocess.run(["nm", cls.exe], capture_output=True, text=True).stdout.splitlines():
            parts = line.split()
            if len(parts) == 3:
                syms[parts[2]] = int(parts[0], 16)
        cls.syms = syms

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def make_log(self, with_objects=True, hit_stacks=True):
        base = 0x555555554000
        shim_base = 0x7ff000000000
        cudart_base = 0x7fe000000000
        b = LogBuilder()
        if with_objects:
            b.recs.append({"type": "objects", "list": [
                {"path": "/opt/lazypin/lib/liblazypin.so", "base": "0x%x" % shim_base, "size": 1 << 20},
                {"path": "/usr/local/cuda/lib64/libcudart.so.13", "base": "0x%x" % cudart_base,
                 "size": 1 << 20}]})
            b.recs.append({"type": "objects", "list": [
                {"path": self.exe, "base": "0x%x" % base, "size": os.path.getsize(self.exe) + (1 << 16)}]})
        # frames: the shim's hook, cudart's (dropped: the API says it), then a
        # return address inside each function
        b.recs.append({"type": "stack", "id": 1, "frames": [
            "0x%x" % (shim_base + 0x1234), "0x%x" % (cudart_base + 0x2000),
            "0x%x" % (cudart_base + 0x3000), "0x%x" % (base + self.syms["pin_small"] + 8),
            "0x%x" % (base + self.syms["main"] + 8)]})
        b.recs.append({"type": "stack", "id": 2, "frames": [
            "0x%x" % (shim_base + 0x1234), "0x%x" % (base + self.syms["pin_big"] + 8)]})
        p1, p2 = 0x7f0000000000, 0x7f1000000000
        b.reg(p2, 64 << 10, 300 * MS, "miss", stack=2)       # start-up
        b.reg(p1, M4, 170 * US, "miss", stack=1)
        for _ in range(50):
            if hit_stacks:
                b.unreg(p1, 500, "deferred", stack=1).reg(p1, M4, 1 * US, "hit", stack=1)
            else:  # LAZYPIN_STACKS=1: hits and deferrals carry no stack
                b.unreg(p1, 500, "deferred").reg(p1, M4, 1 * US, "hit")
        for _ in range(3):
            b.unreg(p2, 40 * US, "forward", stack=2).reg(p2, 64 << 10, 40 * US, "forward", stack=2)
        return b.write(os.path.join(self.tmp, "sites.jsonl"))

    def test_symbolized_and_ranked(self):
        d = report_json(self.make_log())
        cs = d["call_sites"]
        self.assertIsNotNone(cs["symbolizer"])
        by_time, by_saved = cs["by_time"], cs["by_saved"]
        self.assertEqual(len(by_time), 2)
        self.assertTrue(by_time[0]["frames"][0].startswith("pin_big (sites.c:"), by_time[0])
        self.assertTrue(by_saved[0]["frames"][0].startswith("pin_small (sites.c:"), by_saved[0])
        self.assertTrue(by_saved[0]["frames"][1].startswith("main (sites.c:6"), by_saved[0])
        self.assertEqual(by_saved[0]["hits"], 50)
        self.assertGreater(by_saved[0]["saved_ns"], 0)
        # the shim's own frames are left out
        self.assertFalse(any("liblazypin" in f for e in by_time for f in e["frames"]))
        out = report(self.make_log()).stdout
        self.assertIn("== call sites by time spent", out)
        self.assertIn("== call sites by time saved", out)
        self.assertIn("pin_small (sites.c:2)", out)

    def test_hits_without_a_stack_are_their_registrations(self):
        # The default log (stacks on driver calls only): the 50 hits and
        # deferrals go to the call site of the miss that registered p1.
        a = report_json(self.make_log())["call_sites"]["by_saved"]
        b = report_json(self.make_log(hit_stacks=False))["call_sites"]["by_saved"]
        self.assertEqual(b[0]["frames"], a[0]["frames"])
        self.assertEqual((b[0]["hits"], b[0]["calls"], b[0]["saved_ns"]),
                         (a[0]["hits"], a[0]["calls"], a[0]["saved_ns"]))

    def test_without_objects_frames_stay_addresses(self):
        d = report_json(self.make_log(with_objects=False))
        frames = d["call_sites"]["by_time"][0]["frames"]
        self.assertTrue(all(f.startswith("0x") for f in frames), frames)


class EveryProcess(unittest.TestCase):
    def test_grouped_by_host_and_rank(self):
        with tempfile.TemporaryDirectory() as d:
            for host, pid, rank in (("nodeB", 300, 2), ("nodeA", 200, 1), ("nodeA", 100, 0),
                                    ("nodeB", 400, 3)):
                b = LogBuilder(pid=pid, host=host, env={"RANK": str(rank)})
                b.reg(0x7f0000000000, M1, 100 * US, "miss").unreg(0x7f0000000000, 500, "deferred")
                b.reg(0x7f0000000000, M1, 1 * US, "hit")
                b.write(os.path.join(d, "lazypin-demo-%s-%d.jsonl" % (host, pid)))
            r = report(d)
            self.assertEqual(r.returncode, 0, r.stderr)
            out = r.stdout
            self.assertIn("== run (4 processes, 2 hosts)", out)
            rows = [l.split() for l in out.splitlines() if l.strip().startswith("node")]
            self.assertEqual([(c[0], c[1], c[2]) for c in rows],
                             [("nodeA", "100", "0"), ("nodeA", "200", "1"),
                              ("nodeB", "300", "2"), ("nodeB", "400", "3")])
            dj = report_json(d)
            self.assertEqual(sorted(p["rank"] for p in dj["processes"]), [0, 1, 2, 3])
            self.assertEqual({p["host"] for p in dj["processes"]}, {"nodeA", "nodeB"})


class BigLogs(unittest.TestCase):
    def test_progress_only_on_a_terminal_and_after_a_second(self):
        m = load_module()

        class Term:
            def __init__(self, tty):
                self.tty, self.text = tty, ""

            def isatty(self):
                return self.tty

            def write(self, s):
                self.text += s

            def flush(self):
                pass

        for tty in (True, False):
            t = Term(tty)
            p = m.Progress(200 << 20, stream=t)
            p.update(50 << 20, "/tmp/big.jsonl")
            self.assertEqual(t.text, "")      # under a second: nothing
            p.start -= 2
            p.update(100 << 20, "/tmp/big.jsonl")
            p.finish()
            if tty:
                self.assertIn("reading big.jsonl:  50% (100 of 200 MB)", t.text)
                self.assertTrue(t.text.endswith("\r\x1b[K"))
            else:
                self.assertEqual(t.text, "")

    def test_streamed_memory_does_not_hold_records(self):
        # 60k records: the Log keeps groups, not records
        with tempfile.TemporaryDirectory() as d:
            b = LogBuilder()
            p = 0x7f0000000000
            b.reg(p, M4, 170 * US, "miss")
            for k in range(30000):
                b.unreg(p, 400 + k % 100, "deferred").reg(p, M4, 900 + k % 300, "hit")
            path = b.write(os.path.join(d, "x.jsonl"))
            m = load_module()
            log = m.load([path])[0]
            self.assertEqual(log.calls, 60001)
            self.assertLess(len(log.groups), 10)
            self.assertFalse(hasattr(log, "records_list"))
            d = report_json(path)
            self.assertEqual(d["pool"]["hits"], 30000)
            # the shim's histogram: the hits' median is within 1.6% of the exact 1.05 us
            self.assertAlmostEqual(d["size_classes"]["4M"]["p50_ns"], 1049, delta=1049 * 0.016)

    def test_json_fallback_reads_what_the_fast_path_reads(self):
        # the same records with fields in another order go through json.loads
        with tempfile.TemporaryDirectory() as d:
            a = report_json(fx("defer_mode.jsonl"))
            p = os.path.join(d, "reordered.jsonl")
            with open(fx("defer_mode.jsonl")) as f, open(p, "w") as g:
                for line in f:
                    rec = json.loads(line)
                    g.write(json.dumps(dict(reversed(list(rec.items())))) + "\n")
            b = report_json(p)
            for k in ("apis", "size_classes", "totals", "slowest", "errors"):
                self.assertEqual(a[k], b[k], k)
            self.assertEqual(a["pool"]["saving"], b["pool"]["saving"])


# --------------------------------------------------------------------------
# lazypin run

def dry_env(*args, env=None, cwd=None):
    """Run `lazypin run --dry-run ARGS`, return ({var: value}, command line)."""
    r = lazypin("run", "--dry-run", *args, env=env, cwd=cwd)
    if r.returncode != 0:
        raise AssertionError("rc %d: %s" % (r.returncode, r.stderr))
    lines = r.stdout.strip().splitlines()
    out = {}
    import shlex
    for line in lines[:-1]:
        k, v = line.split("=", 1)
        out[k] = shlex.split(v)[0] if v else ""
    return out, lines[-1]


class RunOptions(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lazypin-test-")
        cls.lib = os.path.join(cls.tmp, "liblazypin.so")
        with open(cls.lib, "w") as f:
            f.write("not really a library\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_help(self):
        r = lazypin("run", "--help")
        self.assertEqual(r.returncode, 0)
        for opt in ("--mode", "--defer", "--log", "--pool-bytes", "--pool-entries", "--idle-ms",
                    "--check-pfn", "--release-at-exit", "--no-wait", "--quiet", "--lib",
                    "--dry-run", "LAZYPIN_MODE", "LAZYPIN_UNREGISTER_WAIT", "LAZYPIN_POOL_BYTES", "torchrun"):
            self.assertIn(opt, r.stdout)
        r = lazypin("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("lazypin run", r.stdout)
        self.assertIn("lazypin report", r.stdout)
        self.assertEqual(lazypin().returncode, 2)
        self.assertEqual(lazypin("frobnicate").returncode, 2)
        self.assertEqual(lazypin("--version").stdout.strip(), "lazypin 0.1.0")

    def test_every_option(self):
        env, cmd = dry_env("--lib", self.lib, "--defer", "--log", "/tmp/lp-%p.jsonl",
                           "--pool-bytes", "512M", "--pool-entries", "100", "--idle-ms", "250",
                           "--check-pfn", "--release-at-exit", "--no-wait", "--quiet", "--", "./app",
                           "-n", "a b")
        self.assertEqual(env, {
            "LD_PRELOAD": self.lib,
            "LAZYPIN_MODE": "defer",
            "LAZYPIN_LOG": "/tmp/lp-%p.jsonl",
            "LAZYPIN_POOL_BYTES": "512M",
            "LAZYPIN_POOL_ENTRIES": "100",
            "LAZYPIN_IDLE_MS": "250",
            "LAZYPIN_CHECK_PFN": "1",
            "LAZYPIN_RELEASE_AT_EXIT": "1",
            "LAZYPIN_UNREGISTER_WAIT": "0",
            "LAZYPIN_SUMMARY": "0",
        })
        self.assertEqual(cmd, "./app -n 'a b'")

    def test_autopin_options(self):
        env, _ = dry_env("--lib", self.lib, "--autopin", "--autopin-min", "8M",
                         "--autopin-bytes", "2G", "--autopin-after", "2", "--", "./app")
        self.assertEqual((env["LAZYPIN_MODE"], env["LAZYPIN_AUTOPIN"], env["LAZYPIN_AUTOPIN_MIN"],
                          env["LAZYPIN_AUTOPIN_BYTES"], env["LAZYPIN_AUTOPIN_AFTER"]),
                         ("defer", "1", "8M", "2G", "2"))
        for bad in (["--autopin", "--mode", "log"], ["--autopin-min", "lots"],
                    ["--autopin-after", "0"]):
            r = lazypin("run", "--lib", self.lib, "--dry-run", *bad, "--", "true")
            self.assertEqual(r.returncode, 2, (bad, r.stdout, r.stderr))

    def test_modes_and_sizes(self):
        for args, mode in ((["--mode", "log"], "log"), (["--mode", "off"], "off"),
                           (["--mode", "defer"], "defer"), (["--defer"], "defer")):
            env, _ = dry_env("--lib", self.lib, *args, "--", "true")
            self.assertEqual(env["LAZYPIN_MODE"], mode)
        env, _ = dry_env("--lib", self.lib, "--", "true")
        self.assertNotIn("LAZYPIN_MODE", env)
        for size in ("8G", "25%", "100%", "1073741824", "64k", "8GB", "512MiB"):
            env, _ = dry_env("--lib", self.lib, "--pool-bytes", size, "--", "true")
            self.assertEqual(env["LAZYPIN_POOL_BYTES"], size)
        for bad in (["--pool-bytes", "lots"], ["--pool-bytes", "1.5G"], ["--pool-bytes", "0%"],
                    ["--pool-bytes", "101%"], ["--pool-bytes", "8X"], ["--pool-entries", "-1"],
                    ["--idle-ms", "x"], ["--mode", "fast"], ["--defer", "--mode", "log"]):
            r = lazypin("run", "--dry-run", "--lib", self.lib, *bad, "--", "true")
            self.assertEqual(r.returncode, 2, bad)

    def test_command_without_double_dash(self):
        env, cmd = dry_env("--lib", self.lib, "--mode", "log", "prog", "--mode", "x")
        self.assertEqual(cmd, "prog --mode x")
        self.assertEqual(env["LAZYPIN_MODE"], "log")
        # the command's own --lib is the command's
        env, cmd = dry_env("--lib", self.lib, "prog", "--lib", "/nonexistent/l.so")
        self.assertEqual((cmd, env["LD_PRELOAD"]), ("prog --lib /nonexistent/l.so", self.lib))
        r = lazypin("run", "--lib", self.lib)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no command", r.stderr)

    def test_default_log_path(self):
        # the library's default, in the current directory: each process's own program (%e)
        default = options_table()["LAZYPIN_LOG"]["default"]
        self.assertEqual(default, "lazypin-%e-%h-%p.jsonl")
        env, _ = dry_env("--lib", self.lib, "--", "/usr/bin/myapp", "x", cwd=self.tmp)
        self.assertEqual(env["LAZYPIN_LOG"], os.path.join(os.path.realpath(self.tmp), default))
        # a relative --log is made absolute (children may chdir)
        os.makedirs(os.path.join(self.tmp, "logs"), exist_ok=True)
        env, _ = dry_env("--lib", self.lib, "--log", "logs/lp-%p.jsonl", "--", "x", cwd=self.tmp)
        self.assertEqual(env["LAZYPIN_LOG"], os.path.join(os.path.realpath(self.tmp), "logs/lp-%p.jsonl"))
        # --log DIR: each process's file in it, named as by default
        for arg in ("logs", "logs/"):
            env, _ = dry_env("--lib", self.lib, "--log", arg, "--", "x", cwd=self.tmp)
            self.assertEqual(env["LAZYPIN_LOG"], os.path.join(os.path.realpath(self.tmp), "logs", default))
        # LAZYPIN_LOG from the environment is left alone
        env, _ = dry_env("--lib", self.lib, "--", "x", env=clean_env(LAZYPIN_LOG="/tmp/mine-%p.jsonl"))
        self.assertNotIn("LAZYPIN_LOG", env)

    def test_logs_are_found_by_the_librarys_expansion(self):
        # the runner has no expansion of its own: the library's glob (%h the
        # host, %e and %p any) matches what the library's expansion names
        m = load_cli()
        d = tempfile.mkdtemp(dir=self.tmp)
        host = options_table_doc()["host"]
        for pattern in ("x-%h-%p.jsonl", "lp-%%-%p.jsonl", "[x]-%e-%p.jsonl", "lazypin-%e-%h-%p.jsonl"):
            pattern = os.path.join(d, pattern)
            mine = tool("expand", pattern, "4242")
            other = tool("expand", pattern, "17")
            self.assertNotIn("%h", mine)
            for f in (mine, other):
                open(f, "w").close()
            log = m.options_tool(OPTIONS_TOOL, "check", env=dict(clean_env(), LAZYPIN_LOG=pattern))["log"]
            self.assertEqual(log["pattern"], pattern)
            self.assertEqual(log["problem"], "")
            found = m.find_logs(OPTIONS_TOOL, log, time.time() - 60, 4242)
            self.assertEqual(found, [mine, other], pattern)
            if "%h" in pattern:
                self.assertIn("-%s-" % host, os.path.basename(mine))
            for f in (mine, other):
                os.unlink(f)

    def test_ld_preload_is_prepended(self):
        env, _ = dry_env("--lib", self.lib, "--", "x",
                         env=clean_env(LD_PRELOAD="/opt/a.so:/opt/b.so"))
        self.assertEqual(env["LD_PRELOAD"], self.lib + ":/opt/a.so:/opt/b.so")
        env, _ = dry_env("--lib", self.lib, "--", "x",
                         env=clean_env(LD_PRELOAD="%s:/opt/a.so" % self.lib))
        self.assertEqual(env["LD_PRELOAD"], self.lib + ":/opt/a.so")

    def test_library_lookup(self):
        # --lib that does not exist
        r = lazypin("run", "--dry-run", "--lib", "/nonexistent/liblazypin.so", "--", "x")
        self.assertEqual(r.returncode, 2)
        self.assertIn("/nonexistent/liblazypin.so: no such file", r.stderr)
        # LAZYPIN_LIB
        env, _ = dry_env("--", "x", env=clean_env(LAZYPIN_LIB=self.lib))
        self.assertEqual(env["LD_PRELOAD"], self.lib)
        r = lazypin("run", "--dry-run", "--", "x", env=clean_env(LAZYPIN_LIB="/nonexistent/l.so"))
        self.assertEqual(r.returncode, 2)
        with tempfile.TemporaryDirectory() as prefix:
            # installed: <prefix>/bin/lazypin, <prefix>/libexec/lazypin/lazypin_report/
            os.makedirs(os.path.join(prefix, "bin"))
            os.makedirs(os.path.join(prefix, "libexec", "lazypin"))
            script = os.path.join(prefix, "bin", "lazypin")
            shutil.copy(LAZYPIN, script)
            shutil.copy(REPORT, os.path.join(prefix, "libexec", "lazypin"))
            shutil.copytree(os.path.join(SCRIPTS, "lazypin_report"),
                            os.path.join(prefix, "libexec", "lazypin", "lazypin_report"),
                            ignore=shutil.ignore_patterns("__pycache__"))
            shutil.copy(OPTIONS_TOOL, os.path.join(prefix, "libexec", "lazypin"))
            r = lazypin("run", "--dry-run", "--", "x", script=script)
            self.assertEqual(r.returncode, 2)
            self.assertIn("cannot find liblazypin.so", r.stderr)
            for sub in ("lib/x86_64-linux-gnu", "lib"):
                os.makedirs(os.path.join(prefix, sub), exist_ok=True)
                shutil.copy(self.lib, os.path.join(prefix, sub))
                r = lazypin("run", "--dry-run", "--", "x", script=script)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("LD_PRELOAD=%s" % os.path.join(prefix, sub, "liblazypin.so"), r.stdout)
            # the report is found in libexec
            r = lazypin("report", "--json", fx("log_mode.jsonl"), script=script)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["totals"]["calls"], 18)
        with tempfile.TemporaryDirectory() as repo:
            # a source tree: <repo>/scripts/lazypin, <repo>/build-asan/shim/liblazypin.so
            os.makedirs(os.path.join(repo, "scripts"))
            os.makedirs(os.path.join(repo, "build-asan", "shim"))
            script = os.path.join(repo, "scripts", "lazypin")
            shutil.copy(LAZYPIN, script)
            shutil.copy(OPTIONS_TOOL, os.path.join(repo, "build-asan", "shim"))
            lib = os.path.join(repo, "build-asan", "shim", "liblazypin.so")
            shutil.copy(self.lib, lib)
            r = lazypin("run", "--dry-run", "--", "x", script=script)
            self.assertIn("LD_PRELOAD=%s" % lib, r.stdout)
            os.makedirs(os.path.join(repo, "build", "shim"))
            lib = os.path.join(repo, "build", "shim", "liblazypin.so")
            shutil.copy(self.lib, lib)
            r = lazypin("run", "--dry-run", "--", "x", script=script)
            self.assertIn("LD_PRELOAD=%s" % lib, r.stdout)


class RunPackedLayout(unittest.TestCase):
    def test_the_option_tool_beside_the_packed_library(self):
        # scripts/pack's dist/ on a GPU machine without a build tree:
        # <repo>/scripts/lazypin --lib <repo>/dist/lib/liblazypin.so, the tool in dist/bin
        with tempfile.TemporaryDirectory() as repo:
            for sub in ("scripts", "dist/lib", "dist/bin"):
                os.makedirs(os.path.join(repo, sub))
            script = os.path.join(repo, "scripts", "lazypin")
            shutil.copy(LAZYPIN, script)
            shutil.copy(OPTIONS_TOOL, os.path.join(repo, "dist", "bin"))
            lib = os.path.join(repo, "dist", "lib", "liblazypin.so")
            open(lib, "w").close()
            r = lazypin("run", "--dry-run", "--lib", lib, "--watch", "kernel", "x", script=script, cwd=repo)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("LAZYPIN_WATCH=kernel", r.stdout)


class RunSimAndPrintLib(unittest.TestCase):
    def test_sim_and_print_lib(self):
        with tempfile.TemporaryDirectory() as repo:
            os.makedirs(os.path.join(repo, "scripts"))
            os.makedirs(os.path.join(repo, "build", "shim"))
            os.makedirs(os.path.join(repo, "build", "simcuda"))
            script = os.path.join(repo, "scripts", "lazypin")
            shutil.copy(LAZYPIN, script)
            shutil.copy(OPTIONS_TOOL, os.path.join(repo, "build", "shim"))
            lib = os.path.join(repo, "build", "shim", "liblazypin.so")
            open(lib, "w").close()
            r = lazypin("--print-lib", script=script)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, lib))
            # --sim without a simulated stack: one line saying what to build
            r = lazypin("run", "--dry-run", "--sim", "--", "x", script=script)
            self.assertEqual(r.returncode, 2)
            self.assertIn("ninja -C build simcuda_driver simcuda_runtime", r.stderr)
            open(os.path.join(repo, "build", "simcuda", "libcuda.so.1"), "w").close()
            r = lazypin("run", "--dry-run", "--sim", "--", "x", script=script,
                        env=clean_env(LD_LIBRARY_PATH="/opt/x"))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("LD_LIBRARY_PATH=%s:/opt/x" % os.path.join(repo, "build", "simcuda"), r.stdout)
        # no library anywhere: exit 2 and where it looked
        with tempfile.TemporaryDirectory() as prefix:
            os.makedirs(os.path.join(prefix, "bin"))
            script = os.path.join(prefix, "bin", "lazypin")
            shutil.copy(LAZYPIN, script)
            r = lazypin("--print-lib", script=script)
            self.assertEqual(r.returncode, 2)
            self.assertIn("cannot find liblazypin.so", r.stderr)


class RunChild(unittest.TestCase):
    """Runs real children with a harmless preloaded library: an empty shared
    object built with cc, or (no compiler) a file the loader refuses and ignores."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lazypin-test-")
        cls.lib = os.path.join(cls.tmp, "liblazypin.so")
        cc = shutil.which("cc") or shutil.which("gcc")
        ok = False
        if cc:
            src = os.path.join(cls.tmp, "empty.c")
            with open(src, "w") as f:
                f.write("int lazypin_test_dummy;\n")
            ok = subprocess.run([cc, "-shared", "-fPIC", "-o", cls.lib, src],
                                capture_output=True).returncode == 0
        if not ok:
            with open(cls.lib, "w") as f:
                f.write("not a library\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.cwd = tempfile.mkdtemp(dir=self.tmp)

    def run_child(self, *args, **kw):
        return lazypin("run", "--lib", self.lib, *args, cwd=self.cwd, **kw)

    def test_exit_code_passes_through(self):
        r = self.run_child("--quiet", "--", "sh", "-c", "exit 7")
        self.assertEqual(r.returncode, 7, r.stderr)
        self.assertEqual(self.run_child("--quiet", "--", "true").returncode, 0)

    def test_environment_reaches_the_child(self):
        r = self.run_child("--quiet", "--defer", "--", "sh", "-c",
                           'echo "$LD_PRELOAD|$LAZYPIN_MODE|$LAZYPIN_SUMMARY"',
                           env=clean_env(LD_PRELOAD=""))
        self.assertEqual(r.stdout.strip(), "%s|defer|0" % self.lib)

    def test_killed_by_signal(self):
        r = self.run_child("--quiet", "--", "sh", "-c", "kill -KILL $$")
        self.assertEqual(r.returncode, 128 + signal.SIGKILL)
        r = self.run_child("--quiet", "--", "sh", "-c", "kill -TERM $$")
        self.assertEqual(r.returncode, 128 + signal.SIGTERM)

    def test_command_not_found(self):
        r = self.run_child("--quiet", "--", "/nonexistent/prog")
        self.assertEqual(r.returncode, 127)
        self.assertIn("command not found", r.stderr)

    def forwarded(self, sig):
        ready = os.path.join(self.cwd, "ready")
        child = ("import os, signal, time\n"
                 "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                 "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
                 "open(%r, 'w').close()\n"
                 "time.sleep(60)\n" % ready)
        p = subprocess.Popen([PY, LAZYPIN, "run", "--quiet", "--lib", self.lib, "--", PY, "-c", child],
                             cwd=self.cwd, env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while not os.path.exists(ready) and time.time() < deadline:
                time.sleep(0.05)
            self.assertTrue(os.path.exists(ready), "the child did not start")
            p.send_signal(sig)
            p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        return p.returncode

    def test_sigterm_is_forwarded(self):
        self.assertEqual(self.forwarded(signal.SIGTERM), 128 + signal.SIGTERM)

    def test_sigint_is_forwarded(self):
        self.assertEqual(self.forwarded(signal.SIGINT), 128 + signal.SIGINT)

    # What the library does at its first call: its own log, named by its own
    # expansion (the option tool's; %e is the tool's name there).
    WRITE_LOG = 'cp "$0" "$(%s expand "$LAZYPIN_LOG" $$)"' % shlex.quote(OPTIONS_TOOL)

    def test_closing_summary(self):
        # an old log matching the pattern, from an earlier run: not listed
        old = os.path.join(os.path.realpath(self.cwd),
                           tool("expand", options_table()["LAZYPIN_LOG"]["default"], "1"))
        shutil.copy(fx("log_mode.jsonl"), old)
        os.utime(old, (time.time() - 3600, time.time() - 3600))
        r = self.run_child("--", "sh", "-c", self.WRITE_LOG, fx("defer_mode.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        err = r.stderr
        self.assertIn("lazypin: 1 log:", err)
        self.assertRegex(err, re.escape(os.path.realpath(self.cwd)) + r"/lazypin-lazypin-options-[^/]+-\d+\.jsonl")
        self.assertNotIn(old, err)
        self.assertRegex(err, r"cudaHostRegister\s+20\s+0\s+1.00 us\s+174 us")
        self.assertIn("pool: 18 hits / 20 registers (90%), saving not estimable", err)
        self.assertIn("lazypin: full report: lazypin report ", err)

    def test_closing_summary_of_a_large_log_is_immediate(self):
        # 64 MiB of call records, then the summary: the closing lines come
        # from the summary at the end, within a second of the program
        big = os.path.join(self.cwd, "big.src")
        rec = ('{"type":"call","t_ns":1,"tid":1,"api":"cudaHostRegister","via":"symbol",'
               '"ptr":"0x7f0000000000","bytes":4096,"flags":0,"result":0,"latency_ns":900,'
               '"action":"forward","evicted":0}\n')
        with open(fx("log_mode.jsonl")) as f:
            lines = f.read().splitlines()
        with open(big, "w") as f:
            f.write(lines[0] + "\n")
            f.write(rec * ((64 << 20) // len(rec)))
            f.write(lines[-1] + "\n")
        t0 = time.monotonic()
        r = self.run_child("--", "sh", "-c", self.WRITE_LOG, big)
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("from the shim's summaries", r.stderr)
        self.assertRegex(r.stderr, r"cudaHostRegister\s+9\s+1")
        self.assertLess(took, 5.0)   # the copy itself; reading the log would take ~10 s

    def test_closing_summary_several_processes(self):
        script = self.WRITE_LOG + "; sh -c %s \"$1\"" % shlex.quote(self.WRITE_LOG)
        r = self.run_child("--log", "job-%p.jsonl", "--", "sh", "-c", script,
                           fx("multi/lazypin-python3-7001.jsonl"), fx("multi/lazypin-python3-7002.jsonl"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazypin: 2 logs:", r.stderr)
        self.assertRegex(r.stderr, r"cuMemHostRegister_v2\s+6")

    def test_no_log(self):
        r = self.run_child("--", "true")
        self.assertEqual(r.returncode, 0)
        self.assertIn("lazypin: no log written", r.stderr)

    def test_no_cuda_driver_hint(self):
        with tempfile.TemporaryDirectory() as empty:
            m = load_cli()
            visible = m.cuda_driver_visible({"LD_LIBRARY_PATH": empty})
            open(os.path.join(empty, "libcuda.so.1"), "w").close()
            self.assertTrue(m.cuda_driver_visible({"LD_LIBRARY_PATH": empty}))
        r = self.run_child("--", "sh", "-c", "exit 3")
        self.assertEqual(r.returncode, 3)
        if not visible:   # this machine has no driver: the hint names --sim
            self.assertIn("no CUDA driver library (libcuda.so.1) is visible", r.stderr)
            self.assertIn("--sim", r.stderr)

    def test_quiet(self):
        r = self.run_child("--quiet", "--", "sh", "-c", self.WRITE_LOG, fx("defer_mode.jsonl"))
        self.assertEqual(r.returncode, 0)
        self.assertNotIn("lazypin:", r.stderr)


class RunFlagsFromTheTable(unittest.TestCase):
    """The runner's flags are the library's option table (lazypin-options)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="lazypin-test-")
        cls.lib = os.path.join(cls.tmp, "liblazypin.so")
        with open(cls.lib, "w") as f:
            f.write("not really a library\n")
        cls.table = options_table()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_help_names_every_option_of_the_table(self):
        r = lazypin("run", "--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        text = " ".join(r.stdout.split())
        for name, o in self.table.items():
            self.assertIn("[%s" % name, text)
            if name == "LAZYPIN_SUMMARY":
                continue  # the runner's own: one summary for every process (--quiet: none)
            self.assertRegex(r.stdout, r"\n  %s[ \n]" % re.escape(o["flag"]))
            if o["kind"] == "switch":
                self.assertIn("--no-" + o["flag"][2:], r.stdout)

    def test_every_value_flag_takes_its_value_before_the_command(self):
        # without "--", the command starts at the first argument that is no
        # option nor an option's value; every value flag of the table counts
        for name, o in self.table.items():
            if o["kind"] != "value" or name == "LAZYPIN_SUMMARY":
                continue
            value = o["default"] or "1"
            env, cmd = dry_env("--lib", self.lib, o["flag"], value, "./app", "-x", cwd=self.tmp)
            self.assertEqual(cmd, "./app -x", name)
            if name != "LAZYPIN_LOG":
                self.assertEqual(env[name], value, name)
        for args, name, value in ((["--watch", "kernel"], "LAZYPIN_WATCH", "kernel"),
                                  (["--stacks", "all"], "LAZYPIN_STACKS", "all"),
                                  (["--prefault", "2"], "LAZYPIN_PREFAULT", "2"),
                                  (["--reuse-freed=0"], "LAZYPIN_REUSE_FREED", "0")):
            env, cmd = dry_env("--lib", self.lib, *args, "./app", cwd=self.tmp)
            self.assertEqual((env[name], cmd), (value, "./app"), args)

    def test_switches(self):
        for flag, name, value in (("--check-pfn", "LAZYPIN_CHECK_PFN", "1"),
                                  ("--no-check-pfn", "LAZYPIN_CHECK_PFN", "0"),
                                  ("--no-unregister-wait", "LAZYPIN_UNREGISTER_WAIT", "0"),
                                  ("--no-wait", "LAZYPIN_UNREGISTER_WAIT", "0"),
                                  ("--defer-shared", "LAZYPIN_DEFER_SHARED", "1")):
            env, cmd = dry_env("--lib", self.lib, flag, "./app", cwd=self.tmp)
            self.assertEqual((env[name], cmd), (value, "./app"), flag)

    def test_values_are_checked_by_the_librarys_parsers(self):
        r = lazypin("run", "--dry-run", "--lib", self.lib, "--pool-bytes", "8X", "--", "true")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--pool-bytes 8X: accepts %s [LAZYPIN_POOL_BYTES]"
                      % self.table["LAZYPIN_POOL_BYTES"]["accepts"], r.stderr)
        # a variable of the environment (not a flag) is the library's to warn about
        env, _ = dry_env("--lib", self.lib, "--", "x", env=clean_env(LAZYPIN_POOL_BYTES="8X"))
        self.assertNotIn("LAZYPIN_POOL_BYTES", env)


class RunLogPath(unittest.TestCase):
    """Where the logs go: said before the program starts; a path no log can be
    written to is refused before it starts; --log DIR."""

    @classmethod
    def setUpClass(cls):
        RunChild.setUpClass.__func__(cls)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.cwd = os.path.realpath(tempfile.mkdtemp(dir=self.tmp))
        self.ran = os.path.join(self.cwd, "ran")

    def run_child(self, *args, env=None):
        return lazypin("run", "--lib", self.lib, *args, "--", "sh", "-c", "touch %s" % self.ran,
                       cwd=self.cwd, env=env)

    def refused(self, r, why):
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(why, r.stderr)
        self.assertIn("not starting the program", r.stderr)
        self.assertFalse(os.path.exists(self.ran), "the program ran")

    def test_bad_paths_are_refused_before_the_program_runs(self):
        self.refused(self.run_child("--log", "missing/x.jsonl"), "No such file or directory")
        os.symlink(self.tmp, os.path.join(self.cwd, "link"))
        self.refused(self.run_child("--log", "link/x.jsonl"), "goes through a symbolic link")
        os.mkfifo(os.path.join(self.cwd, "fifo"))
        self.refused(self.run_child("--log", "fifo"), "is a FIFO, not a regular file")
        os.mkdir(os.path.join(self.cwd, "dir"))
        self.refused(self.run_child(env=clean_env(LAZYPIN_LOG=os.path.join(self.cwd, "dir"))),
                     "is a directory, not a regular file")
        r = self.run_child("--log", "ok.jsonl")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(self.ran))

    def test_a_read_only_directory_is_refused(self):
        ro = os.path.join(self.cwd, "ro")
        os.mkdir(ro)
        unshare = shutil.which("unshare")
        if not unshare or subprocess.run([unshare, "-m", "--propagation", "private", "mount", "-t",
                                          "tmpfs", "-o", "ro,size=64k", "none", ro],
                                         capture_output=True).returncode != 0:
            self.skipTest("no private read-only mount can be made here")
        line = "mount -t tmpfs -o ro,size=64k none %s && exec %s %s run --lib %s --log %s -- sh -c %s" % (
            ro, shlex.quote(PY), shlex.quote(LAZYPIN), shlex.quote(self.lib), ro,
            shlex.quote("touch %s" % self.ran))
        r = subprocess.run([unshare, "-m", "--propagation", "private", "sh", "-c", line],
                           capture_output=True, text=True, env=clean_env(), cwd=self.cwd, timeout=60)
        self.refused(r, "Read-only file system")

    def test_where_the_logs_go_is_said_first(self):
        r = lazypin("run", "--lib", self.lib, "--", "sh", "-c", "echo CHILD >&2", cwd=self.cwd)
        self.assertEqual(r.returncode, 0, r.stderr)
        host = options_table_doc()["host"]
        said = "lazypin: each process logs to %s/lazypin-<program>-%s-<pid>.jsonl\n" % (self.cwd, host)
        self.assertTrue(r.stderr.startswith(said + "CHILD\n"), r.stderr)

    def test_log_dir_holds_one_log_per_process(self):
        os.mkdir(os.path.join(self.cwd, "logs"))
        write = RunChild.WRITE_LOG
        script = write + "; sh -c %s \"$1\"" % shlex.quote(write)
        r = lazypin("run", "--lib", self.lib, "--log", "logs", "--", "sh", "-c", script,
                    fx("multi/lazypin-python3-7001.jsonl"), fx("multi/lazypin-python3-7002.jsonl"),
                    cwd=self.cwd)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("each process logs to %s/logs/lazypin-<program>-" % self.cwd, r.stderr)
        self.assertIn("lazypin: 2 logs:", r.stderr)
        self.assertEqual(len(os.listdir(os.path.join(self.cwd, "logs"))), 2)


class RunDriverHint(unittest.TestCase):
    def test_link_stubs_are_no_driver(self):
        m = load_cli()
        if m.cuda_driver_visible({}):
            self.skipTest("this machine has a CUDA driver")
        with tempfile.TemporaryDirectory() as d:
            stubs = os.path.join(d, "stubs")
            os.mkdir(stubs)
            for name in ("libcuda.so", "libcuda.so.1"):
                open(os.path.join(stubs, name), "w").close()
            # CUDA's development images set LIBRARY_PATH to the stubs, where
            # ctypes.util.find_library("cuda") finds libcuda.so
            self.assertFalse(m.cuda_driver_visible({"LIBRARY_PATH": stubs, "LD_LIBRARY_PATH": stubs}))
            real = os.path.join(d, "lib")
            os.mkdir(real)
            open(os.path.join(real, "libcuda.so.1"), "w").close()
            self.assertTrue(m.cuda_driver_visible({"LD_LIBRARY_PATH": real}))
            r = lazypin("run", "--lib", os.path.join(BUILD, "shim", "liblazypin.so"), "--", "true",
                        env=clean_env(LIBRARY_PATH=stubs), cwd=d)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("add --sim", r.stderr)


@unittest.skipUnless(all(os.path.exists(os.path.join(BUILD, p)) for p in
                         ("shim/liblazypin.so", "simcuda/libcuda.so.1", "testapps/seed_shared")),
                     "needs the build's library, simulated CUDA stack and seed_shared")
class RunTheLibrary(unittest.TestCase):
    """lazypin run with the real library on the simulated CUDA stack."""
    SEED = os.path.join(BUILD, "testapps", "seed_shared")

    def setUp(self):
        self.cwd = os.path.realpath(tempfile.mkdtemp(prefix="lazypin-test-"))
        self.addCleanup(shutil.rmtree, self.cwd, True)

    def run_lazypin(self, *args):
        return lazypin("run", "--lib", os.path.join(BUILD, "shim", "liblazypin.so"), "--sim", *args,
                       cwd=self.cwd, timeout=120)

    def logs(self):
        return sorted(f for f in os.listdir(self.cwd) if f.endswith(".jsonl"))

    def test_a_value_flag_without_double_dash(self):
        r = self.run_lazypin("--watch", "kernel", "--stacks", "all", self.SEED, "--repeat", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazypin: 1 log:", r.stderr)
        with open(os.path.join(self.cwd, self.logs()[0])) as f:
            config = json.loads(f.readline())["config"]
        self.assertEqual((config["watch"], config["stacks"]), ("kernel", "all"))

    def test_log_pattern_with_host_and_pid(self):
        r = self.run_lazypin("--log", "x-%h-%p.jsonl", self.SEED, "--repeat", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lazypin: 1 log:", r.stderr)
        host = options_table_doc()["host"]
        self.assertRegex(self.logs()[0], r"^x-%s-\d+\.jsonl$" % re.escape(host))
        self.assertIn(os.path.join(self.cwd, self.logs()[0]), r.stderr)

    def test_each_log_is_named_after_its_own_program(self):
        shells = [s for s in ("sh", "bash") if shutil.which(s)]
        for shell in shells:
            for f in self.logs():
                os.unlink(os.path.join(self.cwd, f))
            r = self.run_lazypin(shell, "-c", "%s --repeat 1 >/dev/null; true" % shlex.quote(self.SEED))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("lazypin: 1 log:", r.stderr)
            self.assertRegex(self.logs()[0], r"^lazypin-seed_shared-.*-\d+\.jsonl$", shell)


if __name__ == "__main__":
    unittest.main()
