"""Constants, small helpers and the latency histogram (Agg) every stage shares."""

import math

PROG = "lazypin report"
LOG_FORMAT = 1          # the newest log format this tool understands
JSON_SCHEMA = 1         # version of the --json document ("lazypin_report" key)

API_ORDER = ("cudaHostRegister", "cudaHostUnregister",
             "cuMemHostRegister", "cuMemHostRegister_v2", "cuMemHostUnregister")

# (name, upper bound in bytes, inclusive); "big" has no bound.
SIZE_CLASSES = (("4K", 4 << 10), ("16K", 16 << 10), ("64K", 64 << 10),
                ("256K", 256 << 10), ("1M", 1 << 20), ("4M", 4 << 20),
                ("16M", 16 << 20), ("64M", 64 << 20), ("256M", 256 << 20),
                ("1G", 1 << 30), ("4G", 4 << 30), ("big", None))
SIZE_CLASS_NAMES = tuple(n for n, _ in SIZE_CLASSES)

RESULT_NAMES = {0: "success", 1: "invalid value", 2: "out of memory", 3: "initialization error",
                35: "insufficient driver", 100: "no device",
                201: "invalid context", 712: "host memory already registered",
                713: "host memory not registered"}
# Results that mean the process had no CUDA driver it could use (the
# runtime's cudaErrorInsufficientDriver, cudaErrorNoDevice; the driver's
# CUDA_ERROR_NOT_INITIALIZED): the report and `lazypin run` then name --sim.
NO_DRIVER_CODES = (3, 35, 100)
NO_DRIVER_HINT = ("no CUDA driver the program could use was loaded: on a machine without a GPU, "
                  "`lazypin run --sim` runs a program linked with the shared CUDA runtime on the "
                  "simulated stack")

EVICT_REASONS = ("lru", "idle", "overlap", "make_room", "query", "free", "realloc",
                 "munmap", "mremap", "mmap_fixed", "madvise", "brk", "shmdt",
                 "shmat", "context", "pfn", "exit", "pressure")
# evictions because the memory left the process (the program freed it)
FREE_REASONS = ("free", "realloc", "munmap", "mremap", "mmap_fixed", "madvise", "brk", "shmdt")

STAT_KEYS = ("calls", "errors", "bytes", "total_ns",
             "p50_ns", "p90_ns", "p99_ns", "max_ns")

# how many distinct addresses per process the pattern rules remember
PTR_MEMORY = 1 << 20
# evictions remembered per thread to find those made inside a call (the shim's kRecentEvictions)
RECENT_EVICTIONS = 16


class ReportError(Exception):
    """Unusable input: the message is printed after 'lazypin report: ', exit 2."""


# Pinned host allocations and frees (the shim's host-allocation cache): their
# actions (hit, miss, deferred = kept, forward) are the cache's, not the pool's,
# so they are kept apart as host_hit, host_miss, host_deferred, host_forward.
HOST_APIS = frozenset(("cudaHostAlloc", "cudaMallocHost", "cudaFreeHost", "cuMemHostAlloc",
                       "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemFreeHost"))


# A register or pinned allocation the driver made of at least this many
# bytes is a big pin (the size from which LAZYPIN_PREFAULT faults a first
# register in: kPrefaultMinBytes in shim/os/prefault.h); a log keeps this
# many of them.
BIG_PIN_BYTES = 64 << 20
BIG_PIN_MEMORY = 256


def host_action(api, action):
    return "host_" + action if api in HOST_APIS and not action.startswith("host_") else action


def is_register(api):
    return "Register" in api and "Unregister" not in api


def is_unregister(api):
    return "Unregister" in api


def size_class(nbytes):
    for name, bound in SIZE_CLASSES:
        if bound is None or nbytes <= bound:
            return name
    return "big"


def size_class_label(name):
    return "> 4G" if name == "big" else "<= " + name


def result_name(code):
    return RESULT_NAMES.get(code, "unknown")


def api_sort_key(api):
    return (API_ORDER.index(api), "") if api in API_ORDER else (len(API_ORDER), api)


def percentile(sorted_vals, p):
    """Nearest-rank percentile of a sorted list: the smallest value with at
    least p% of the values at or below it."""
    if not sorted_vals:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[min(rank, len(sorted_vals)) - 1]


def as_int(v, default=0):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return default


def ptr_int(p):
    """A log pointer ("0x7f..") as an int; None when unreadable."""
    if isinstance(p, int) and not isinstance(p, bool):
        return p
    if isinstance(p, str):
        try:
            return int(p, 16) if p.lower().startswith("0x") else int(p, 0)
        except ValueError:
            return None
    return None


# the latency histogram: the shim's (shim/telemetry/stats.cc LatencyHistogram), so that
# the report's percentiles are the shim summary's for the same calls.
# Values under 32 ns are exact; above, 32 sub-buckets per power of two, a
# value reported as its bucket's midpoint (relative error under 1.6%), never
# above the exact maximum.

SUB_BITS = 5
_SUB_MASK = (1 << SUB_BITS) - 1


def hist_index(v):
    if v < 32:
        return v if v > 0 else 0
    shift = v.bit_length() - 1 - SUB_BITS
    return ((shift + 1) << SUB_BITS) + ((v >> shift) & _SUB_MASK)


def hist_midpoint(i):
    if i < (1 << SUB_BITS):
        return i
    shift = (i >> SUB_BITS) - 1
    lo = ((1 << SUB_BITS) | (i & _SUB_MASK)) << shift
    return lo + ((1 << shift) >> 1)


class Agg:
    """Calls (or evictions) of one group: counts, bytes, time, a histogram."""
    __slots__ = ("n", "errors", "bytes", "total", "sq", "max", "b", "waited", "forced")

    def __init__(self):
        self.n = 0
        self.errors = 0
        self.bytes = 0
        self.total = 0
        self.sq = 0             # sum of squared latencies (the saving's spread)
        self.max = 0
        self.b = {}
        self.waited = 0
        self.forced = 0

    def add(self, lat, nbytes=0, err=False):
        self.n += 1
        self.total += lat
        self.sq += lat * lat
        self.bytes += nbytes
        if err:
            self.errors += 1
        if lat > self.max:
            self.max = lat
        i = hist_index(lat) if lat >= 32 else (lat if lat > 0 else 0)
        b = self.b
        b[i] = b.get(i, 0) + 1

    def merge(self, o):
        self.n += o.n
        self.errors += o.errors
        self.bytes += o.bytes
        self.total += o.total
        self.sq += o.sq
        self.waited += o.waited
        self.forced += o.forced
        if o.max > self.max:
            self.max = o.max
        b = self.b
        for k, v in o.b.items():
            b[k] = b.get(k, 0) + v
        return self

    def percentile(self, q):
        """The shim's Percentile(q), q in 0..1; None when empty."""
        if self.n == 0:
            return None
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for i in sorted(self.b):
            seen += self.b[i]
            if seen >= rank:
                return min(hist_midpoint(i), self.max)
        return self.max

    def median(self):
        return self.percentile(0.5)

    def cdf(self):
        """[(latency, fraction of calls at or below)] for a plot."""
        out = []
        seen = 0
        for i in sorted(self.b):
            seen += self.b[i]
            out.append((min(hist_midpoint(i), self.max), seen / self.n))
        return out

    def stats(self, nbytes=True):
        """STATS of docs/tools.md (--json): integer nanoseconds."""
        ns = lambda v: None if v is None else int(round(v))
        return {"calls": self.n, "errors": self.errors,
                "bytes": self.bytes if nbytes else 0, "total_ns": ns(self.total),
                "p50_ns": ns(self.percentile(0.5)), "p90_ns": ns(self.percentile(0.9)),
                "p99_ns": ns(self.percentile(0.99)), "max_ns": ns(self.max) if self.n else None}


def merged(aggs):
    out = Agg()
    for a in aggs:
        out.merge(a)
    return out
