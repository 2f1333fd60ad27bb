"""Call sites and NVTX under the shim, on the simulated CUDA stack.

Call sites: each call record that reached the driver names a stack whose
`stack` record (and the `objects` that hold its frames) came before it; no
frame is lazypin's; the report ranks the sites by name. A native call site
that registers many buffers is unwound once (the summary's `stacks` counts),
its calls given the stack each would get unwound alone; in a Python program,
two lines are two sites. NVTX: with an
injection library that records what it is given (nvtx_recorder.cc), every
intercepted call is a balanced range in the "lazypin" domain and every pool
action a marker.
Environment (set by CMake): as test_preload, plus NVTX_RECORDER.
"""
import bisect
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_preload import AppTestCase, app, calls, SRC  # noqa: E402
from nvtx_timeline import lazypin_timeline  # noqa: E402  (tests/pylib, on the path by test_preload)

RECORDER = os.environ["NVTX_RECORDER"]


def objects_of(records):
    out = []
    for r in records:
        if r["type"] == "objects":
            out += [(int(o["base"], 16), o["size"], o["path"]) for o in r["list"]]
    return sorted(out)


def place_of(objs, addr):
    """(path of the object holding addr, offset in it), or (None, addr)."""
    i = bisect.bisect_right([o[0] for o in objs], addr) - 1
    while i >= 0:
        base, size, path = objs[i]
        if base <= addr < base + size:
            return path, addr - base
        i -= 1
    return None, addr


def object_of(objs, addr):
    return place_of(objs, addr)[0]


class CallSiteTest(AppTestCase):
    def test_every_driver_call_names_a_stack_written_before_it(self):
        run = self.run_app([app("seed_shared"), "--repeat", "3"], LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        seen_stacks, seen_objects = {}, []
        real = 0
        for r in run.records:
            if r["type"] == "objects":
                seen_objects += [(int(o["base"], 16), o["size"], o["path"]) for o in r["list"]]
            elif r["type"] == "stack":
                self.assertNotIn(r["id"], seen_stacks, "each stack written once")
                seen_stacks[r["id"]] = [int(f, 16) for f in r["frames"]]
                objs = sorted(seen_objects)
                for f in seen_stacks[r["id"]]:
                    path = object_of(objs, f)
                    self.assertIsNotNone(path, "frame 0x%x in no object written before" % f)
                    self.assertFalse(os.path.basename(path).startswith("liblazypin"), path)
            elif r["type"] == "call":
                if r["action"] in ("hit", "deferred"):
                    self.assertNotIn("stack", r, "hits and deferrals carry no stack by default")
                    continue
                real += 1
                self.assertIn(r["stack"], seen_stacks, r)
        self.assertGreater(real, 0)
        # The register's stack holds the program's own code.
        objs = objects_of(run.records)
        exe = os.path.realpath(app("seed_shared"))
        paths = {object_of(objs, f) for fr in seen_stacks.values() for f in fr}
        self.assertIn(exe, paths)

    def test_all_gives_hits_a_stack_and_zero_gives_none(self):
        run = self.run_app([app("seed_shared"), "--repeat", "3"], LAZYPIN_MODE="defer",
                           LAZYPIN_STACKS="all")
        hits = [r for r in calls(run.records) if r["action"] == "hit"]
        self.assertTrue(hits)
        self.assertTrue(all("stack" in r for r in calls(run.records)))
        run = self.run_app([app("seed_shared"), "--repeat", "3"], LAZYPIN_MODE="defer",
                           LAZYPIN_STACKS="0")
        self.assertEqual(run.rc, 0, run.err)
        self.assertFalse([r for r in run.records if r["type"] in ("stack", "objects")])
        self.assertFalse([r for r in calls(run.records) if "stack" in r])
        self.assertEqual(run.records[0]["config"]["stacks"], "0")

    def test_the_report_ranks_named_call_sites(self):
        run = self.run_app([app("seed_shared"), "--repeat", "3"], LAZYPIN_MODE="defer")
        self.assertEqual(run.rc, 0, run.err)
        rep = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "lazypin"), "report",
                              "--json", run.log], capture_output=True, text=True, timeout=120)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        sites = json.loads(rep.stdout)["call_sites"]["by_time"]
        self.assertTrue(sites)
        names = " ".join(" ".join(s["frames"]) for s in sites)
        self.assertIn("main", names)  # symbolized, or object+offset when no symbolizer
        self.assertNotIn("lazypin::", names)


def frames_by_call(records):
    """Each call record's stack as (object path, offset) frames, in order (None: no stack)."""
    objs = objects_of(records)
    stacks = {r["id"]: r for r in records if r["type"] == "stack"}
    out = []
    for r in calls(records):
        st = stacks.get(r.get("stack"))
        if st is None:
            out.append(None)
            continue
        out.append((tuple(place_of(objs, int(f, 16)) for f in st["frames"]), st.get("python")))
    return out


class NativeSiteTest(AppTestCase):
    """testapps/sites: N buffers from one line, N through one wrapper called
    from two depths, N from two alternating lines, two lines of main, then
    the wrapper from two lines of one function with two sizes."""
    N = 64

    def sites(self, stacks):
        run = self.run_app([app("sites"), "--buffers", str(self.N)], LAZYPIN_STACKS=stacks)
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(run.records[-1]["type"], "summary")
        rep = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "lazypin"), "report",
                              "--json", run.log], capture_output=True, text=True, timeout=120)
        self.assertEqual(rep.returncode, 0, rep.stderr)
        run.sites = sorted((s["frames"], s["calls"])
                           for s in json.loads(rep.stdout)["call_sites"]["by_time"])
        return run

    def test_one_line_registering_many_buffers_is_unwound_once(self):
        n = self.N
        one, every = self.sites("1"), self.sites("all")
        regs = [r for r in calls(one.records) if r["api"] == "cudaHostRegister"]
        self.assertEqual(len(regs), 3 * n + 4)
        ids = lambda rs: {r["stack"] for r in rs}  # noqa: E731
        loop, shallow, deep = ids(regs[:n]), ids(regs[n:2 * n:2]), ids(regs[n + 1:2 * n:2])
        first, second = ids(regs[2 * n:3 * n:2]), ids(regs[2 * n + 1:3 * n:2])
        line_a, line_b = ids(regs[3 * n:3 * n + 1]), ids(regs[3 * n + 1:3 * n + 2])
        size_1, size_2 = ids(regs[3 * n + 2:3 * n + 3]), ids(regs[3 * n + 3:])
        sets = [loop, shallow, deep, first, second, line_a, line_b, size_1, size_2]
        self.assertEqual([len(s) for s in sets], [1] * 9, "each site one stack")
        self.assertEqual(len(set.union(*sets)), 9, "and no two sites the same")
        # Every call has the frames it has when each call is unwound.
        self.assertEqual(frames_by_call(one.records), frames_by_call(every.records))
        # Unwound once per site (the 9 above and the unregisters' loop), not
        # once a call.
        self.assertEqual(one.records[-1]["stacks"], {"unwound": 10, "unique": 10})
        self.assertEqual(every.records[-1]["stacks"],
                         {"unwound": len(calls(every.records)), "unique": 10})
        # The report shows the same sites with the same calls.
        self.assertEqual(one.sites, every.sites)

    def test_the_getproc_door_is_keyed_by_address_and_size(self):
        # A driver entry point from cuGetProcAddress is called by the runtime
        # (static cudart) for every line of the program: its caller names none.
        run = self.run_app([app("path_getproc")])
        self.assertEqual(run.rc, 0, run.err)
        cs = calls(run.records)
        self.assertEqual({r["via"] for r in cs}, {"getproc"})
        keys = {(r["api"], r.get("flags"), r["ptr"], r.get("bytes")) for r in cs}
        self.assertLess(len(keys), len(cs))
        self.assertEqual(run.records[-1]["stacks"]["unwound"], len(keys))

    def test_no_stacks_no_counts(self):
        run = self.sites("0")
        self.assertNotIn("stacks", run.records[-1])
        self.assertEqual(run.sites, [])


PY_CLIENT = """\
import ctypes, sys
# PyDLL keeps the GIL held during the call (as CuPy's Cython does); CDLL releases it.
lib = (ctypes.PyDLL if sys.argv[1] == "held" else ctypes.CDLL)("libcudart.so.13")
buf = ctypes.create_string_buffer(1 << 16)
def pin_it():
    return lib.cudaHostRegister(buf, 1 << 16, 0)
assert pin_it() == 0
assert lib.cudaHostUnregister(buf) == 0
print("OK")
"""


class PythonLineTest(AppTestCase):
    def run_client(self, gil):
        script = os.path.join(self.dir, "client.py")
        with open(script, "w") as f:
            f.write(PY_CLIENT)
        run = self.run_app([sys.executable, script, gil])
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(run.out, "OK\n")
        return [r for r in run.records if r["type"] == "stack"], run

    def test_the_python_line_is_named_while_the_gil_is_held(self):
        stacks, run = self.run_client("held")
        lines = {r.get("python") for r in stacks}
        script = os.path.join(self.dir, "client.py")
        self.assertIn("%s:6 in pin_it" % script, lines)       # the register
        self.assertIn("%s:8 in <module>" % script, lines)     # the unregister
        rep = subprocess.run([sys.executable, os.path.join(SRC, "scripts", "lazypin"), "report",
                              run.log], capture_output=True, text=True, timeout=120)
        self.assertIn("python %s:6 in pin_it" % script, rep.stdout)

    def test_nothing_is_named_when_the_gil_is_released(self):
        stacks, _ = self.run_client("released")
        self.assertTrue(stacks)
        self.assertFalse([r for r in stacks if "python" in r])


PY_TWO_LINES = """\
import ctypes
lib = ctypes.PyDLL("libcudart.so.13")
bufs = [ctypes.create_string_buffer(1 << 16) for _ in range(8)]
for i in range(0, 8, 2):
    assert lib.cudaHostRegister(bufs[i], 1 << 16, 0) == 0
    assert lib.cudaHostRegister(bufs[i + 1], 1 << 16, 0) == 0
for b in bufs:
    assert lib.cudaHostUnregister(b) == 0
print("OK")
"""


class PythonSiteTest(AppTestCase):
    def test_two_python_lines_registering_different_buffers_are_two_sites(self):
        script = os.path.join(self.dir, "two.py")
        with open(script, "w") as f:
            f.write(PY_TWO_LINES)
        run = self.run_app([sys.executable, script], LAZYPIN_STACKS="1")
        self.assertEqual(run.rc, 0, run.err)
        self.assertEqual(run.out, "OK\n")
        python = {r["id"]: r.get("python") for r in run.records if r["type"] == "stack"}
        regs = [r for r in calls(run.records) if r["api"] == "cudaHostRegister"]
        self.assertEqual([python[r["stack"]] for r in regs],
                         ["%s:%d in <module>" % (script, 5 + i % 2) for i in range(8)])


class NvtxTest(AppTestCase):
    def timeline(self, argv, **extra):
        record = os.path.join(self.dir, "nvtx.txt")
        run = self.run_app(argv, NVTX_INJECTION64_PATH=RECORDER, NVTX_RECORD=record, **extra)
        self.assertEqual(run.rc, 0, run.err)
        return run, lazypin_timeline(record)

    def test_each_call_is_a_balanced_range_and_each_action_a_marker(self):
        run, (pushes, marks, balanced, created) = self.timeline(
            [app("seed_shared"), "--repeat", "3"], LAZYPIN_MODE="defer", LAZYPIN_RELEASE_AT_EXIT="1")
        self.assertTrue(created)
        self.assertTrue(balanced)
        recs = calls(run.records)
        self.assertEqual(pushes, [r["api"] for r in recs], "one range per call, named by its API")
        actions = [r["action"] for r in recs if r["action"] in ("hit", "deferred")]
        self.assertEqual([m for m in marks if m in ("hit", "deferred")], actions)
        evicts = [r for r in run.records if r["type"] == "evict"]
        self.assertTrue(evicts)
        self.assertEqual([m for m in marks if m.startswith("evict:")],
                         ["evict:" + e["reason"] + (":forced" if e.get("forced") else "")
                          for e in evicts])

    def test_log_mode_has_ranges_and_no_markers(self):
        run, (pushes, marks, balanced, _) = self.timeline([app("path_runtime_shared")])
        self.assertTrue(balanced)
        self.assertEqual(len(pushes), len(calls(run.records)))
        self.assertFalse(marks)


if __name__ == "__main__":
    unittest.main()
