"""A large first register faulted in by several threads (LAZYPIN_PREFAULT):
the program sees the same bytes and codes as bare, on the simulated stack.
Environment (set by CMake): as test_preload."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_preload import AppTestCase, app, calls  # noqa: E402


class PrefaultTest(AppTestCase):
    def test_same_bytes_and_codes_with_and_without(self):
        argv = [app("loop_shared"), "--sizes", "64M,72M", "--iters", "3", "--warmup", "0",
                "--modes", "reg", "--verify-every", "1"]
        for threads in ("4", "0"):
            run = self.run_app(argv, LAZYPIN_MODE="defer", LAZYPIN_PREFAULT=threads)
            self.assertEqual(run.rc, 0, run.err)
            self.assertNotIn("MISMATCH", run.out)
            self.assertEqual(run.records[0]["config"]["prefault"], int(threads))
            regs = [r for r in calls(run.records) if r["api"] == "cudaHostRegister"]
            self.assertEqual([r["result"] for r in regs], [0] * 6)
            self.assertEqual([r["action"] for r in regs], ["miss", "hit", "hit"] * 2)


if __name__ == "__main__":
    unittest.main()
