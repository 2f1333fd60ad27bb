"""Running apps under an instrumented liblazypin.so (scripts/test --asan).

The test apps and the simulated CUDA stack are not instrumented. ASan's
runtime is preloaded right AFTER the shim: the shim's free/munmap/malloc hooks stay
the process's global ones and reach ASan's allocator as "the next" one, so one
allocator serves everything (freed blocks do not come back: LAZYPIN_REUSE_FREED
steps aside for an allocator that is not glibc's).
ASan's start-up check wants its runtime first, hence verify_asan_link_order=0.
CMake sets LAZYPIN_SANITIZER_RUNTIME (the libasan.so path) only in such builds.
"""
import os

RUNTIME = os.environ.get("LAZYPIN_SANITIZER_RUNTIME", "")
ACTIVE = bool(RUNTIME)
# Lines a sanitizer prints when it finds something.
REPORT_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")


def apply(env, lib):
    """Adds the sanitizer runtime after `lib` in env's LD_PRELOAD, and its options."""
    if not ACTIVE:
        return env
    parts = env.get("LD_PRELOAD", "").replace(":", " ").split()
    if lib in parts:
        parts.insert(parts.index(lib) + 1, RUNTIME)
        env["LD_PRELOAD"] = " ".join(parts)
    # Leaks: the apps, the simulator and lazypin's never-destroyed singleton keep memory on purpose.
    env["ASAN_OPTIONS"] = "verify_asan_link_order=0:detect_leaks=0:halt_on_error=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return env


def reports(stderr):
    """The sanitizer's report lines in a run's stderr (empty when clean)."""
    return [l for l in stderr.splitlines() if any(m in l for m in REPORT_MARKERS)]
