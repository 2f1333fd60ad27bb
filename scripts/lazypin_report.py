#!/usr/bin/env python3
"""lazypin report: read lazypin logs (JSON Lines, docs/log-format.md) and print
what the program's host-memory registration calls cost, what the pool saved,
why it did not save more (advice), and which code pins (call sites).

    lazypin report LOG... [--compare OTHER...] [--plot FILE.png] [--json] [--top N]

Logs are streamed: each record updates a latency histogram of its group and is
dropped, so memory does not grow with the number of records.
Standard library only; matplotlib is imported lazily, for --plot alone.
Exit status: 0 report printed (with warnings, if any); 1 printed, but the
--plot asked for not written; 2 bad usage or unusable input.
"""

import argparse
import bisect
import datetime
import glob
import heapq
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

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

RESULT_NAMES = {0: "success", 1: "invalid value", 2: "out of memory",
                201: "invalid context", 712: "host memory already registered",
                713: "host memory not registered"}

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


# --------------------------------------------------------------------------
# small helpers

# Pinned host allocations and frees (the shim's host-allocation cache): their
# actions (hit, miss, deferred = kept, forward) are the cache's, not the pool's,
# so they are kept apart as host_hit, host_miss, host_deferred, host_forward.
HOST_APIS = frozenset(("cudaHostAlloc", "cudaMallocHost", "cudaFreeHost", "cuMemHostAlloc",
                       "cuMemAllocHost", "cuMemAllocHost_v2", "cuMemFreeHost"))


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


# --------------------------------------------------------------------------
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
        return {"calls": self.n, "errors": self.errors,
                "bytes": self.bytes if nbytes else 0, "total_ns": self.total,
                "p50_ns": self.percentile(0.5), "p90_ns": self.percentile(0.9),
                "p99_ns": self.percentile(0.99), "max_ns": self.max if self.n else None}


def merged(aggs):
    out = Agg()
    for a in aggs:
        out.merge(a)
    return out


def fmt_num(v):
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v


def fmt_ns(ns):
    """Human time: 850 ns, 43.2 us, 171 us, 1.90 ms, 2.31 s."""
    if ns is None:
        return "-"
    neg = ns < 0
    a = abs(ns)
    if a < 1000:
        s = "%d ns" % a
    elif a < 1000 ** 2:
        s = fmt_num(a / 1e3) + " us"
    elif a < 1000 ** 3:
        s = fmt_num(a / 1e6) + " ms"
    else:
        s = fmt_num(a / 1e9) + " s"
    return ("-" if neg else "") + s


def fmt_bytes(n):
    """Human size, binary units: 512 B, 4 KiB, 1.5 MiB, 40 GiB."""
    if n is None:
        return "-"
    if n < 1024:
        return "%d B" % n
    v = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        v /= 1024.0
        if v < 1024 or unit == "PiB":
            break
    if v == int(v):
        return "%d %s" % (v, unit)
    return ("%.0f %s" if v >= 100 else "%.1f %s") % (v, unit)


def fmt_size_setting(n):
    """A size as LAZYPIN_POOL_BYTES takes it: 512M, 8G (rounded up to a power of two)."""
    p = 1 << max(20, (max(1, n) - 1).bit_length())
    for unit, shift in (("T", 40), ("G", 30), ("M", 20)):
        if p >= (1 << shift):
            return "%d%s" % (p >> shift, unit)
    return str(p)


def fmt_ratio(r):
    if r is None:
        return "-"
    return ("%.0fx" if r >= 100 else "%.1fx" if r >= 10 else "%.2fx") % r


def fmt_pct(x):
    return "-" if x is None else "%.0f%%" % (100.0 * x)


def fmt_driver(v):
    v = as_int(v)
    if v <= 0:
        return "unknown"
    return "%d.%d (%d)" % (v // 1000, (v % 1000) // 10, v)


def fmt_start(ns):
    if not ns:
        return "unknown"
    try:
        dt = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "unknown"
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + "%03d UTC" % (dt.microsecond // 1000)


def iso_start(ns):
    if not ns:
        return None
    try:
        dt = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(headers, rows, indent="  ", left=(0,)):
    """Aligned columns: columns listed in `left` are left-aligned, others right."""
    cols = len(headers)
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(cols)]
    lines = []
    for r in cells:
        parts = []
        for i in range(cols):
            parts.append(r[i].ljust(width[i]) if i in left else r[i].rjust(width[i]))
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines


# --------------------------------------------------------------------------
# reading logs, streamed

# The shim's own record layout (shim/telemetry/records.cc), read without json: a line that
# does not match exactly (other field order, escapes, unknown fields) goes
# through json.loads, with the same result.
CALL_RE = re.compile(
    rb'\{"type":"call","t_ns":(-?\d+),"tid":(-?\d+),"api":"([A-Za-z0-9_]+)","via":"[a-z]*",'
    rb'"ptr":"([^"\\]*)","bytes":(\d+),"flags":\d+,"result":(-?\d+),"latency_ns":(-?\d+),'
    rb'"action":"([a-z_]+)","evicted":(\d+)(?:,"reason":"([a-z_]*)")?(?:,"stack":(\d+))?\}\r?$')
EVICT_RE = re.compile(
    rb'\{"type":"evict","t_ns":(-?\d+),"tid":(-?\d+),"ptr":"([^"\\]*)","bytes":(\d+),'
    rb'"reason":"([a-z_]+)","result":(-?\d+),"latency_ns":(-?\d+)(?:,"waited_ns":(\d+))?'
    rb'(?:,"forced":(true|false))?(?:,"stack":(\d+))?\}\r?$')
CHUNK = 4 << 20


class Progress:
    """One line on stderr, rewritten in place, once reading has taken more
    than a second, and only when stderr is a terminal."""

    def __init__(self, total_bytes, stream=None):
        self.total = max(1, total_bytes)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, done_in_file, name):
        if not self.tty:
            return
        now = time.monotonic()
        if now - self.start < 1.0 or now - self.last < 0.2:
            return
        self.last = now
        done = self.done + done_in_file
        self.stream.write("\r%s: reading %s: %3d%% (%d of %d MB)\x1b[K"
                          % (PROG, os.path.basename(name), 100 * done // self.total,
                             done >> 20, self.total >> 20))
        self.stream.flush()
        self.shown = True

    def file_done(self, size):
        self.done += size

    def finish(self):
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class Log:
    """What one log file (one process) holds, summed up while reading."""

    def __init__(self, path, top=10):
        self.path = path
        self.header = None
        self.summary = None
        self.warnings = []          # warning records written by the shim
        self.warnings_dropped = 0
        self.reader_warnings = []   # what this tool found wrong with the file
        self.cut = False
        self.records = 0
        self.calls = 0
        self.top = top
        self.slowest = []           # heap of (latency, -t, seq, row)
        self.seq = 0
        self.groups = {}            # call group key -> Agg (see call_key)
        self.egroups = {}           # (reason, error, forced, stack) -> Agg
        self.errors = {}            # (code, api) -> count
        self.host_releases = {}     # reason -> host_release records (the host-allocation cache)
        self.devices = {}           # device -> {"calls", "total_ns", action: count} (several devices)
        self.objects = []           # (base, size, path) of loaded objects
        self.stacks = {}            # stack id -> [frame addresses]
        self.python_lines = {}      # stack id -> "file.py:12 in f" (the Python line that called)
        self.last_t = None
        self.pool_bytes = None
        self.mode = None
        # pattern state for the advice rules (addresses as ints)
        self.first_register_done = False
        self.seen = set()
        self.last_unregister = {}   # ptr -> t of its last deferred unregister
        # ptr -> the stack of the real register that made its registration:
        # a hit or deferral logged without a stack of its own (LAZYPIN_STACKS=1)
        # is that registration's, so it is credited to that call site.
        self.site_of = {}
        self.idle_gone = {}         # ptr -> t of its last use, released idle
        self.lru_gone = set()
        self.freed_sizes = {}       # bytes -> freed pooled registrations not yet re-registered
        # per thread its last RECENT_EVICTIONS evictions (end time, latency), and
        # (action, size class) -> time of evictions made inside hits and deferrals
        self.recent_evictions = {}
        self.in_call_evictions = {}
        # a bounded log (LAZYPIN_LOG_MAX): where its per-call records end, and
        # the shim's last tally of the calls after that
        self.cut_at = None
        self.log_max = None
        self.tally = None
        # auto-pins (LAZYPIN_AUTOPIN): {"pins", "failed", "bytes", "register_ns", "apis": {api: n}}
        self.autopin = {"pins": 0, "failed": 0, "bytes": 0, "register_ns": 0, "apis": {}}
        self.last_size = {}         # log mode: ptr -> bytes of its last register
        self.registered = {}        # log mode: (ptr, bytes) -> latency of its last unregister (None: registered)
        self.f = {"rereg": 0, "rereg_ns": 0, "idle_reuse": 0, "idle_gap_max_ns": 0, "lru_reload": 0, "pattern": 0,
                  "too_big": 0, "too_big_max": 0, "busy": 0, "busy_bytes": 0,
                  "waited_ns": 0, "old_passthrough": 0, "in_call": 0, "ptr_memory_full": False}

    @property
    def pid(self):
        if self.header and "pid" in self.header:
            return as_int(self.header.get("pid"), None)
        return None

    # ---- records

    def on_header(self, rec, lineno):
        if self.header is not None:
            self.reader_warnings.append(
                "%s: a second header at line %d was ignored" % (self.path, lineno))
            return
        fmt = rec.get("format")
        if isinstance(fmt, (int, float)) and not isinstance(fmt, bool) and fmt > LOG_FORMAT:
            raise ReportError("%s: log format %s is newer than this report tool "
                              "understands (%d)" % (self.path, fmt if fmt != int(fmt) else int(fmt),
                                                     LOG_FORMAT))
        if not isinstance(fmt, int) or isinstance(fmt, bool):
            self.reader_warnings.append(
                "%s: header has no valid \"format\"; reading it as format %d"
                % (self.path, LOG_FORMAT))
        if self.calls or self.egroups or self.warnings:
            self.reader_warnings.append(
                "%s: the header is not the first record (line %d)" % (self.path, lineno))
        self.header = rec
        cfg = rec.get("config") if isinstance(rec.get("config"), dict) else {}
        pb = cfg.get("pool_bytes")
        self.pool_bytes = pb if isinstance(pb, int) and not isinstance(pb, bool) and pb > 0 else None
        self.mode = rec.get("mode") or cfg.get("mode")

    def on_call(self, t, tid, ptr, api, nbytes, result, lat, action, evicted, reason, stack):
        action = host_action(api, action)
        self.calls += 1
        self.last_t = t
        reg = "Register" in api and "Unregister" not in api
        err = result != 0
        sclass = size_class(nbytes) if reg else None
        warm = False
        if reg and not err and (action == "miss" or action == "forward"):
            warm = self.first_register_done and evicted == 0
            self.first_register_done = True
            self.on_real_register(t, ptr, nbytes, action)
            if stack is not None and ptr is not None and (
                    ptr in self.site_of or len(self.site_of) < PTR_MEMORY):
                self.site_of[ptr] = stack
        if self.mode == "log" and action == "forward" and not err and ptr is not None:
            self.on_log_mode_call(reg, ptr, nbytes, lat)
        if stack is None and (action == "hit" or action == "deferred") and self.site_of:
            stack = self.site_of.get(ptr)
        elif action == "deferred" and ptr is not None:
            self.last_unregister[ptr] = t
        if evicted:
            self.f["in_call"] += evicted
            k = (action, sclass)
            self.in_call_evictions[k] = (self.in_call_evictions.get(k, 0)
                                         + self.in_call_ns(tid, t, lat, evicted))
        if action == "passthrough" and not reason:
            self.f["old_passthrough"] += 1
        key = (api, action, sclass, err, warm, evicted > 0, reason, stack)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = Agg()
        g.add(lat, nbytes, err)
        if err:
            k = (result, api)
            self.errors[k] = self.errors.get(k, 0) + 1
        if self.top:
            self.offer_slow(lat, t, tid, "call", api, ptr, nbytes, result, action)

    def on_log_mode_call(self, reg, ptr, nbytes, lat):
        """Log mode: count registers that the pool would have served (the same
        address and size registered and unregistered before) and their cost."""
        r = self.registered
        if reg:
            key = (ptr, nbytes)
            prev = r.get(key, False)
            if prev is not False and prev is not None:
                self.f["rereg"] += 1
                self.f["rereg_ns"] += lat + prev
            if key in r or len(r) < PTR_MEMORY:
                r[key] = None
            if ptr in self.last_size or len(self.last_size) < PTR_MEMORY:
                self.last_size[ptr] = nbytes
        else:
            nb = self.last_size.get(ptr)
            if nb is not None and r.get((ptr, nb), False) is None:
                r[(ptr, nb)] = lat

    def on_real_register(self, t, ptr, nbytes, action):
        f = self.f
        if action == "forward" and self.mode == "defer" and self.pool_bytes and nbytes > self.pool_bytes:
            f["too_big"] += 1
            f["too_big_max"] = max(f["too_big_max"], nbytes)
        if ptr is None:
            return
        if ptr in self.idle_gone:
            f["idle_reuse"] += 1
            f["idle_gap_max_ns"] = max(f["idle_gap_max_ns"], t - self.idle_gone.pop(ptr))
        if ptr in self.lru_gone:
            self.lru_gone.discard(ptr)
            f["lru_reload"] += 1
        if ptr not in self.seen:
            n = self.freed_sizes.get(nbytes)
            if n:
                f["pattern"] += 1
                if n == 1:
                    del self.freed_sizes[nbytes]
                else:
                    self.freed_sizes[nbytes] = n - 1
            if len(self.seen) < PTR_MEMORY:
                self.seen.add(ptr)
            else:
                f["ptr_memory_full"] = True

    def in_call_ns(self, tid, t, lat, evicted):
        """The time of the evictions a call of `tid` ending at `t` made inside
        it (as the shim's Stats::InCallEvictionsNs)."""
        ns = taken = 0
        for et, elat in reversed(self.recent_evictions.get(tid, ())):
            if taken >= evicted:
                break
            if t - lat <= et <= t:
                ns += elat
                taken += 1
        return ns

    def on_evict(self, t, tid, ptr, nbytes, reason, result, lat, waited, forced, stack):
        self.last_t = t
        recent = self.recent_evictions.setdefault(tid, [])
        if len(recent) == RECENT_EVICTIONS:
            del recent[0]
        recent.append((t, lat))
        err = result != 0
        key = (reason, err, forced, stack)
        g = self.egroups.get(key)
        if g is None:
            g = self.egroups[key] = Agg()
        g.add(lat, nbytes, err)
        g.waited += waited
        if forced:
            g.forced += 1
            self.f["busy"] += 1
            self.f["busy_bytes"] += nbytes
        self.f["waited_ns"] += waited
        if ptr is not None:
            last = self.last_unregister.pop(ptr, t)
            if reason == "idle":
                self.idle_gone[ptr] = last
            elif reason == "lru":
                self.lru_gone.add(ptr)
            elif reason in FREE_REASONS:
                self.freed_sizes[nbytes] = self.freed_sizes.get(nbytes, 0) + 1
                self.idle_gone.pop(ptr, None)
                self.lru_gone.discard(ptr)
                self.seen.discard(ptr)
        if self.top:
            self.offer_slow(lat, t, tid, "evict", "evict", ptr, nbytes, result, reason)

    def offer_slow(self, lat, t, tid, record, api, ptr, nbytes, result, action):
        h = self.slowest
        if len(h) >= self.top and (lat, -t) <= h[0][:2]:
            return
        self.seq += 1
        row = {"pid": None, "t_ns": t, "tid": tid, "record": record, "api": api,
               "ptr": ("0x%x" % ptr) if ptr is not None else None, "bytes": nbytes,
               "result": result, "action": action, "latency_ns": lat}
        item = (lat, -t, -self.seq, row)
        if len(h) < self.top:
            heapq.heappush(h, item)
        else:
            heapq.heapreplace(h, item)

    def on_record(self, rec, lineno):
        """A record parsed by json (anything the fast paths did not take)."""
        kind = rec["type"]
        if kind == "call":
            if "device" in rec:  # written with several devices only (the fast path takes the rest)
                d = self.devices.setdefault(as_int(rec.get("device")), {"calls": 0, "total_ns": 0})
                d["calls"] += 1
                d["total_ns"] += max(0, as_int(rec.get("latency_ns")))
                act = str(rec.get("action", "?"))
                d[act] = d.get(act, 0) + 1
            self.on_call(as_int(rec.get("t_ns")), rec.get("tid"), ptr_int(rec.get("ptr")), str(rec.get("api", "?")),
                         max(0, as_int(rec.get("bytes"))), as_int(rec.get("result")),
                         max(0, as_int(rec.get("latency_ns"))), str(rec.get("action", "?")),
                         max(0, as_int(rec.get("evicted"))),
                         str(rec["reason"]) if isinstance(rec.get("reason"), str) else None,
                         as_int(rec["stack"], None) if "stack" in rec else None)
        elif kind == "evict":
            self.on_evict(as_int(rec.get("t_ns")), rec.get("tid"), ptr_int(rec.get("ptr")),
                          max(0, as_int(rec.get("bytes"))), str(rec.get("reason", "?")),
                          as_int(rec.get("result")), max(0, as_int(rec.get("latency_ns"))),
                          max(0, as_int(rec.get("waited_ns"))), rec.get("forced") is True,
                          as_int(rec["stack"], None) if "stack" in rec else None)
        elif kind == "host_release":
            r = str(rec.get("reason", "?"))
            self.host_releases[r] = self.host_releases.get(r, 0) + 1
        elif kind == "autopin":
            a = self.autopin
            if as_int(rec.get("result")) == 0:
                a["pins"] += 1
                a["bytes"] += max(0, as_int(rec.get("bytes")))
                a["register_ns"] += max(0, as_int(rec.get("latency_ns")))
                api = str(rec.get("api", "?"))
                a["apis"][api] = a["apis"].get(api, 0) + 1
            else:
                a["failed"] += 1
        elif kind == "log_cut":
            self.cut_at = as_int(rec.get("t_ns"))
            self.log_max = as_int(rec.get("log_max"), None)
        elif kind == "tally":
            self.tally = rec
        elif kind == "header":
            self.on_header(rec, lineno)
        elif kind == "warning":
            if len(self.warnings) < 1000:
                self.warnings.append(rec)
            else:
                self.warnings_dropped += 1
        elif kind == "summary":
            self.summary = rec
        elif kind == "objects":
            for o in rec.get("list") or []:
                if isinstance(o, dict):
                    base, size = ptr_int(o.get("base")), as_int(o.get("size"))
                    if base is not None and size > 0 and isinstance(o.get("path"), str):
                        self.objects.append((base, size, o["path"]))
        elif kind == "stack":
            sid = as_int(rec.get("id"), None)
            frames = rec.get("frames")
            if sid is not None and isinstance(frames, list):
                self.stacks[sid] = [p for p in (ptr_int(x) for x in frames) if p is not None]
                if isinstance(rec.get("python"), str) and rec["python"]:
                    self.python_lines[sid] = rec["python"]
        # other types: ignored (newer writers may add some)

    # ---- the whole file

    def read(self, f, progress=None):
        call_match = CALL_RE.match
        evict_match = EVICT_RE.match
        on_call = self.on_call
        on_evict = self.on_evict
        loads = json.loads
        groups = self.groups
        last_unregister = self.last_unregister
        site_of = self.site_of
        # call shapes (api, bytes, action, evicted, reason, stack, result as
        # written) whose record changes nothing but their group: summed here
        # without the general path. value: (group, is a deferred unregister)
        plain = {}
        slow = self.slowest
        top = self.top
        floor = -1 if top else 1 << 62
        records = 0
        ncalls = 0
        last_t = None
        rest = b""
        lineno = 0
        skipped = 0
        first_skipped = None
        content = False
        done = 0
        pending_bad = None   # (lineno) of an unreadable line, until we know it is not the last
        while True:
            chunk = f.read(CHUNK)
            eof = not chunk
            if eof:
                data = rest.rstrip(b"\0")
                lines = [data] if data.strip() else []
                ends_with_newline = not lines
                rest = b""
            else:
                done += len(chunk)
                lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
                rest = lines.pop()
            for line in lines:
                lineno += 1
                if pending_bad is not None:
                    skipped += 1
                    if first_skipped is None:
                        first_skipped = pending_bad
                    pending_bad = None
                m = call_match(line)
                if m is not None:
                    content = True
                    records += 1
                    ck = m.group(3, 5, 8, 9, 10, 11, 6)  # api bytes action evicted reason stack result
                    if site_of and ck[5] is None:  # a hit or deferral is its registration's
                        p4 = m.group(4)
                        ck = ck + (site_of.get(int(p4, 16)) if p4[:2] == b"0x" else None,)
                    hit = plain.get(ck)
                    if hit is not None:
                        g, deferred = hit
                        lat = int(m.group(7))
                        nb = ck[1]
                        ncalls += 1
                        last_t = m
                        if deferred:
                            last_unregister[int(m.group(4), 16)] = int(m.group(1))
                        g.n += 1
                        g.total += lat
                        g.sq += lat * lat
                        if lat > g.max:
                            g.max = lat
                        if lat < 32:
                            i = lat if lat > 0 else 0
                        else:
                            sh = lat.bit_length() - 6
                            i = ((sh + 1) << 5) + ((lat >> sh) & 31)
                        b = g.b
                        b[i] = b.get(i, 0) + 1
                        if nb != b"0":
                            g.bytes += int(nb)
                        if lat >= floor:
                            self.offer_slow(lat, int(m.group(1)), int(m.group(2)), "call",
                                            ck[0].decode(), int(m.group(4), 16), int(nb), 0,
                                            ck[2].decode())
                            if len(slow) >= top:
                                floor = slow[0][0]
                        continue
                    t, tid, api, p, nb, res, lat, act, ev, rsn, st = m.groups()
                    lat = int(lat)
                    ptr = int(p, 16) if p[:2] == b"0x" else ptr_int(p.decode())
                    action = host_action(api.decode(), act.decode())
                    on_call(int(t), int(tid), ptr, api.decode(), int(nb), int(res), lat, action,
                            int(ev), rsn.decode() if rsn is not None else None,
                            int(st) if st is not None else None)
                    last_t = None
                    if top and len(slow) >= top:
                        floor = slow[0][0]
                    if (res == b"0" and ev == b"0" and p[:2] == b"0x"
                            and (action == "hit" or action == "deferred"
                                 or (action == "passthrough" and rsn))):
                        api_s = api.decode()
                        reg = "Register" in api_s and "Unregister" not in api_s
                        sid = int(st) if st is not None else (
                            site_of.get(ptr) if action in ("hit", "deferred") else None)
                        key = (api_s, action, size_class(int(nb)) if reg else None, False, False,
                               False, rsn.decode() if rsn is not None else None, sid)
                        if site_of and st is None and len(ck) == 7:
                            ck = ck + (site_of.get(ptr),)
                        plain[ck] = (groups[key], action == "deferred")
                    continue
                m = evict_match(line)
                if m is not None:
                    content = True
                    self.records += 1
                    t, tid, p, nb, rsn, res, lat, w, forced, st = m.groups()
                    last_t = None
                    on_evict(int(t), int(tid), int(p, 16) if p[:2] == b"0x" else ptr_int(p.decode()),
                             int(nb), rsn.decode(), int(res), int(lat), int(w) if w else 0,
                             forced == b"true", int(st) if st is not None else None)
                    continue
                if not line.strip(b" \t\r\0"):
                    continue
                content = True
                try:
                    try:
                        rec = loads(line)
                    except UnicodeDecodeError:
                        rec = loads(line.decode("utf-8", errors="replace"))
                    if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
                        raise ValueError("not a record")
                except ValueError:
                    pending_bad = lineno
                    continue
                self.records += 1
                last_t = None
                self.on_record(rec, lineno)
            if progress is not None:
                progress.update(done, self.path)
            if eof:
                break
        self.records += records
        self.calls += ncalls
        if last_t is not None:
            self.last_t = int(last_t.group(1))
        if pending_bad is not None:
            if ends_with_newline:
                skipped += 1
                if first_skipped is None:
                    first_skipped = pending_bad
            else:
                self.cut = True
                self.reader_warnings.append(
                    "log was cut: %s ends with an incomplete record "
                    "(the process may have crashed)" % self.path)
        if skipped:
            self.reader_warnings.append(
                "%s: skipped %d unreadable line%s (first at line %d)"
                % (self.path, skipped, "" if skipped == 1 else "s", first_skipped))
        return content

    def merge_tally(self):
        """Adds the shim's tally of the calls past the log's bound to the
        groups read from the records: the tables stay exact."""
        if self.cut_at is None:
            return
        t = self.tally
        if not isinstance(t, dict):
            self.reader_warnings.append(
                "%s: per-call records end at t=%.3f s (LAZYPIN_LOG_MAX) and no tally of the "
                "calls after it was written (the process ended before its first); tables "
                "count only the calls before" % (self.path, self.cut_at / 1e9))
            return

        def agg(r):
            a = Agg()
            a.n = max(0, as_int(r.get("n")))
            a.errors = max(0, as_int(r.get("errors")))
            a.bytes = max(0, as_int(r.get("bytes")))
            a.total = max(0, as_int(r.get("total_ns")))
            sq = r.get("sq")
            a.sq = sq if isinstance(sq, (int, float)) and not isinstance(sq, bool) else 0
            a.max = max(0, as_int(r.get("max_ns")))
            for pair in r.get("hist") or []:
                if isinstance(pair, list) and len(pair) == 2:
                    i, n = as_int(pair[0]), as_int(pair[1])
                    a.b[i] = a.b.get(i, 0) + n
            return a

        for c in t.get("calls") or []:
            if not isinstance(c, dict):
                continue
            api = str(c.get("api", "?"))
            action = host_action(api, str(c.get("action", "?")))
            sclass = c.get("size_class") if isinstance(c.get("size_class"), str) else None
            result = as_int(c.get("result"))
            reason = c.get("reason") if isinstance(c.get("reason"), str) else None
            stack = as_int(c.get("stack"), 0) or None
            key = (api, action, sclass, result != 0, c.get("warm") is True,
                   c.get("evicted") is True, reason, stack)
            a = agg(c)
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = Agg()
            g.merge(a)
            self.calls += a.n
            if result != 0:
                self.errors[(result, api)] = self.errors.get((result, api), 0) + a.n
            ns = as_int(c.get("in_call_evictions_ns"))
            if ns:
                k = (action, sclass)
                self.in_call_evictions[k] = self.in_call_evictions.get(k, 0) + ns
        for e in t.get("evictions") or []:
            if not isinstance(e, dict):
                continue
            forced = e.get("forced") is True
            key = (str(e.get("reason", "?")), e.get("error") is True, forced, None)
            a = agg(e)
            if forced:
                a.forced = a.n
                self.f["busy"] += a.n
                self.f["busy_bytes"] += a.bytes
            g = self.egroups.get(key)
            if g is None:
                g = self.egroups[key] = Agg()
            g.merge(a)
        t_ns = as_int(t.get("t_ns"))
        end = as_int((self.summary or {}).get("t_ns"), None)
        note = ("%s: per-call records end at t=%.3f s (the log's bound, LAZYPIN_LOG_MAX=%s); "
                "counts, times and histograms after it come from the shim's tally"
                % (self.path, self.cut_at / 1e9, fmt_bytes(self.log_max) if self.log_max else "?"))
        if end is not None and t_ns < end and (self.summary or {}).get("ended_by") != "exit":
            note += " as of t=%.3f s (the process ended at %.3f s, before its next tally)" % (
                t_ns / 1e9, end / 1e9)
        self.reader_warnings.append(note)
        self.last_t = max(self.last_t or 0, t_ns)

    def check(self):
        """Warnings about the file as a whole, once it is read."""
        self.merge_tally()
        path = self.path
        if self.header is None:
            self.reader_warnings.append(
                "%s: no header record (the start of the log is missing); "
                "reporting the records found" % path)
        if self.summary is None and not self.cut:
            self.reader_warnings.append(
                "%s: no summary record: the process did not exit normally "
                "(or is still running)" % path)
        if self.warnings_dropped:
            self.reader_warnings.append("%s: %d more shim warnings not shown"
                                        % (path, self.warnings_dropped))
        if self.summary is None:
            return
        dropped = as_int(self.summary.get("records_dropped"))
        if dropped:
            self.reader_warnings.append(
                "%s: the shim dropped %d record%s (the log writer fell behind); "
                "figures from call records undercount"
                % (path, dropped, "" if dropped == 1 else "s"))
            return
        apis = self.summary.get("apis")
        if isinstance(apis, dict):
            counted = {}
            for key, g in self.groups.items():
                counted[key[0]] = counted.get(key[0], 0) + g.n
            for api, s in sorted(apis.items()):
                if isinstance(s, dict) and "calls" in s and as_int(s["calls"]) != counted.get(api, 0):
                    self.reader_warnings.append(
                        "%s: the summary counts %d %s calls, the log holds %d call records"
                        % (path, as_int(s["calls"]), api, counted.get(api, 0)))

    def slow_rows(self):
        rows = []
        for _, _, _, row in self.slowest:
            r = dict(row)
            r["pid"] = self.pid
            rows.append(r)
        return rows


def expand_inputs(args):
    """LOG arguments -> [(path, explicit)]. Directories give their *.jsonl,
    globs their matches; a named file that does not exist is fatal."""
    out = []
    seen = set()

    def add(p, explicit):
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            out.append((p, explicit))

    for arg in args:
        if os.path.isdir(arg):
            files = sorted(glob.glob(os.path.join(glob.escape(arg), "*.jsonl")))
            if not files:
                raise ReportError("%s: directory holds no *.jsonl log" % arg)
            for f in files:
                add(f, False)
        elif os.path.exists(arg):
            add(arg, True)
        elif glob.has_magic(arg):
            files = sorted(f for f in glob.glob(arg) if os.path.isfile(f))
            if not files:
                raise ReportError("%s: no such file" % arg)
            for f in files:
                add(f, False)
        else:
            raise ReportError("%s: no such file" % arg)
    return out


def read_log(path, explicit=True, progress=None, top=10):
    """Read one log. Returns a Log, or None for an empty file found through
    a directory or glob (skipped). Raises ReportError for unusable files."""
    log = Log(path, top)
    try:
        with open(path, "rb") as f:
            content = log.read(f, progress)
    except FileNotFoundError:
        raise ReportError("%s: no such file" % path)
    except IsADirectoryError:
        raise ReportError("%s: is a directory" % path)
    except OSError as e:
        raise ReportError("%s: %s" % (path, e.strerror or e))
    if not content:
        if explicit:
            raise ReportError("%s: empty log (no records: the program made no "
                              "registration call, or the log was never written)" % path)
        return None
    if log.records == 0:
        raise ReportError("%s: no lazypin records in this file" % path)
    log.check()
    return log


def load(args, top=10, progress=True):
    inputs = expand_inputs(args)
    total = 0
    for p, _ in inputs:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    prog = Progress(total) if progress else None
    logs = []
    skipped = []
    try:
        for path, explicit in inputs:
            log = read_log(path, explicit, prog, top)
            if prog is not None:
                try:
                    prog.file_done(os.path.getsize(path))
                except OSError:
                    pass
            if log is None:
                skipped.append(path)
            else:
                logs.append(log)
    finally:
        if prog is not None:
            prog.finish()
    if not logs:
        raise ReportError("%s: empty log%s (no records)"
                          % (", ".join(skipped) or " ".join(args),
                             "" if len(skipped) == 1 else "s"))
    for path in skipped:
        logs[0].reader_warnings.append("%s: empty log, skipped" % path)
    return logs


# --------------------------------------------------------------------------
# analysis: everything the text, JSON and plot outputs show

ARGV_RANK = re.compile(r"^--?(?:local[-_])?rank(?:=(\d+))?$")
ENV_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "LOCAL_RANK")


def process_rank(h):
    """The job rank of a process: the header's "rank", its "env" (RANK,
    OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, ...), or --rank N in argv."""
    if isinstance(h.get("rank"), int) and not isinstance(h.get("rank"), bool):
        return h["rank"]
    env = h.get("env")
    if isinstance(env, dict):
        for k in ENV_RANK:
            v = env.get(k)
            if isinstance(v, (str, int)) and str(v).isdigit():
                return int(v)
    argv = h.get("argv")
    if isinstance(argv, list):
        for i, a in enumerate(argv):
            m = ARGV_RANK.match(str(a))
            if not m:
                continue
            if m.group(1):
                return int(m.group(1))
            if i + 1 < len(argv) and str(argv[i + 1]).isdigit():
                return int(argv[i + 1])
    return None


def process_info(log):
    h = log.header or {}
    s = log.summary or {}
    pool = s.get("pool") if isinstance(s.get("pool"), dict) else {}
    mode = h.get("mode") or (h.get("config") or {}).get("mode")
    return {
        "file": log.path,
        "host": h.get("host") if isinstance(h.get("host"), str) else None,
        "pid": log.pid,
        "rank": process_rank(h),
        "exe": h.get("exe"),
        "argv": h.get("argv") if isinstance(h.get("argv"), list) else None,
        "mode": mode,
        "mode_requested": h.get("mode_requested") or mode,
        "mode_reason": h.get("mode_reason") or "",
        "watch": h.get("watch"),
        "watch_reason": h.get("watch_reason") or "",
        "lazypin": h.get("lazypin"),
        "format": h.get("format"),
        "config": h.get("config") if isinstance(h.get("config"), dict) else None,
        "driver_version": as_int(h.get("driver_version"), None) if "driver_version" in h else None,
        "start_unix_ns": as_int(h.get("start_unix_ns"), None) if "start_unix_ns" in h else None,
        "start_time": iso_start(as_int(h.get("start_unix_ns"), 0)),
        "records": log.records,
        "calls": log.calls,
        "has_header": log.header is not None,
        "has_summary": log.summary is not None,
        "ended_by": s.get("ended_by") if log.summary is not None else None,
        "duration_ns": (as_int(s.get("t_ns"), None) if log.summary is not None else log.last_t),
        "cut": log.cut,
        "pool_peak_bytes": as_int(pool.get("peak_bytes"), None) if "peak_bytes" in pool else None,
        "pool_peak_entries": as_int(pool.get("peak_entries"), None) if "peak_entries" in pool else None,
    }


# ---- what the pool saved: the one definition (the shim's Saving, shim/telemetry/stats.h)

# a price rests on at least this many real calls (the shim's kMinPriceCalls)
MIN_PRICE_CALLS = 3


def _price(agg):
    """(calls, mean, variance of the mean) of an Agg of real calls, or None
    (fewer than MIN_PRICE_CALLS)."""
    if agg is None or agg.n < MIN_PRICE_CALLS:
        return None
    n = agg.n
    mean = agg.total / n
    vom = 0.0
    if n >= 2:
        var = (agg.sq - agg.total * agg.total / n) / (n - 1)
        vom = var / n if var > 0 else 0.0
    return (n, mean, vom)


def log_prices(log):
    """What a call costs without the pool in this process, as the shim prices
    it: per size class the warm real registers (successful misses and forwards
    that evicted nothing, the process's first real register left out); for
    unregisters the successful real calls, else the successful evictions."""
    reg = {}
    unreg = Agg()
    good_ev = Agg()
    for (api, action, sclass, err, warm, inev, reason, stack), g in log.groups.items():
        if err:
            continue
        if sclass is not None and warm:
            reg.setdefault(sclass, Agg()).merge(g)
        elif sclass is None and action in ("forward", "passthrough") and is_unregister(api):
            unreg.merge(g)
    for (reason, err, forced, stack), g in log.egroups.items():
        if not err:
            good_ev.merge(g)
    return {"reg": {c: _price(a) for c, a in reg.items()},
            "unreg": _price(unreg) or _price(good_ev)}


def group_price(key, prices):
    """The price (calls, mean, variance of the mean) of one call of group `key`
    without the pool: hits and deferrals only; None: not pooled, or unpriced."""
    action, sclass = key[1], key[2]
    if action == "hit" and sclass is not None:
        return prices["reg"].get(sclass)
    if action == "deferred":
        return prices["unreg"]
    return None


def group_saving(key, g, prices):
    """What the calls of one group saved, before evictions (0 if unpriced)."""
    p = group_price(key, prices)
    return 0.0 if p is None else g.n * p[1] - g.total


def saving_of(log):
    """What the pool saved in one process (see shim/telemetry/stats.h, Saving): priced
    hits and deferrals at this process's own real calls, net of their time and
    of evictions made inside them, minus every eviction's time."""
    prices = log_prices(log)
    saved = 0.0
    hits = {}        # size class -> calls, and the deferrals under None
    for key, g in log.groups.items():
        if key[1] == "hit" and key[2] is not None:
            hits[key[2]] = hits.get(key[2], 0) + g.n
        elif key[1] == "deferred":
            hits[None] = hits.get(None, 0) + g.n
    out = {"saved_ns": 0, "spread_ns": 0, "hits": 0, "hits_priced": 0, "deferred": 0,
           "deferred_priced": 0, "evictions": 0, "evictions_ns": 0, "price_calls": 0,
           "processes": 1, "estimable": False}
    variance = 0.0
    for sclass in SIZE_CLASS_NAMES + (None,):
        n = hits.get(sclass, 0)
        kind = "deferred" if sclass is None else "hits"
        out[kind] += n
        p = prices["unreg"] if sclass is None else prices["reg"].get(sclass)
        if not n or p is None:
            continue
        out[kind + "_priced"] += n
        out["price_calls"] += p[0]
        variance += float(n) * float(n) * p[2]
        # the calls' time net of the evictions made inside them
        saved += n * p[1] - sum(g.total for k, g in log.groups.items()
                                if (k[1], k[2] if sclass is not None else None)
                                == (("deferred", None) if sclass is None else ("hit", sclass)))
        saved += log.in_call_evictions.get(("deferred", None) if sclass is None else ("hit", sclass), 0)
    for key, g in log.egroups.items():
        out["evictions"] += g.n
        out["evictions_ns"] += g.total
    saved -= out["evictions_ns"]
    out["saved_ns"] = round_ns(saved)
    out["spread_ns"] = round_ns(2 * math.sqrt(variance))
    out["estimable"] = bool(out["hits_priced"] + out["deferred_priced"]
                            or (out["hits"] + out["deferred"] == 0 and out["evictions"]))
    return out


def round_ns(v):
    """Round half away from zero, as the shim (RoundNs in shim/telemetry/stats.cc)."""
    return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))


def saving_total(savings):
    """Several processes' savings: the estimable ones' figures summed (spreads
    in quadrature), the others counted."""
    out = {"saved_ns": 0, "spread_ns": 0, "hits": 0, "hits_priced": 0, "deferred": 0,
           "deferred_priced": 0, "evictions": 0, "evictions_ns": 0, "price_calls": 0,
           "processes": 0, "not_estimable": 0, "estimable": False}
    var = 0.0
    for sv in savings:
        for k in ("hits", "hits_priced", "deferred", "deferred_priced",
                  "evictions", "evictions_ns", "price_calls", "processes"):
            out[k] += sv[k]
        if sv["estimable"]:
            out["saved_ns"] += sv["saved_ns"]
            var += float(sv["spread_ns"]) ** 2
            out["estimable"] = True
        elif sv["hits"] + sv["deferred"] + sv["evictions"]:
            out["not_estimable"] += 1
    out["spread_ns"] = round_ns(math.sqrt(var))
    return out


def saving_text(sv):
    """The saving as one line: for one process exactly the shim's exit summary
    (SavingText in shim/telemetry/stats.cc)."""
    if not sv["estimable"]:
        return ("saving not estimable (fewer than %d real calls of a kind in this process to price "
                "the hits and deferrals): measure it with --compare against a bare run"
                % MIN_PRICE_CALLS)
    saved = sv["saved_ns"]
    out = ("saved " + fmt_ns(saved)) if saved >= 0 else ("cost %s more than it saved" % fmt_ns(-saved))
    if sv["spread_ns"] > 0:
        out += " +/- " + fmt_ns(sv["spread_ns"])
    n = sv["price_calls"]
    if sv["processes"] > 1:
        k = sv["processes"] - sv.get("not_estimable", 0)
        out += " (estimated per process from its own real calls: %d process%s, %d call%s" % (
            k, "" if k == 1 else "es", n, "" if n == 1 else "s")
        if sv.get("not_estimable"):
            out += "; %d processes not estimable, left out" % sv["not_estimable"]
    else:
        out += " (estimated from %d real call%s of this run" % (n, "" if n == 1 else "s")
    unpriced = (sv["hits"] - sv["hits_priced"]) + (sv["deferred"] - sv["deferred_priced"])
    if unpriced:
        out += "; %d hits/deferrals unpriced, counted as 0" % unpriced
    return out + ")"


SAVING_METHOD = (
    "estimated per process from its own calls: each hit priced at the mean warm real register "
    "of its size class (the process's first register and registers that evicted are left out), "
    "each deferred unregister at the mean real unregister (else the mean eviction), minus the "
    "hit's or deferral's own time; every eviction lazypin made counted as cost; +/- is two "
    "standard errors of those means; a price rests on at least %d real calls, and a hit or "
    "deferral without them counts 0. The shim's exit summary prints the same figure."
    % MIN_PRICE_CALLS)


# ---- call sites

def symbolizer():
    """('addr2line'|'llvm-symbolizer', path) or None."""
    for name in ("addr2line", "llvm-symbolizer"):
        p = shutil.which(name)
        if p:
            return name, p
    return None


def symbolize_object(path, offsets, tool):
    """{offset: 'function (file:line)'} for the offsets (ints) inside object
    `path`; one process per object; missing entries where it could not."""
    if tool is None or not os.path.isfile(path) or not offsets:
        return {}
    name, exe = tool
    offs = sorted(offsets)
    addrs = ["0x%x" % o for o in offs]
    if name == "addr2line":
        cmd = [exe, "-f", "-C", "-e", path]
    else:
        cmd = [exe, "--obj=" + path, "--demangle", "--functions=linkage", "--no-inlines",
               "--output-style=GNU"]
    try:
        r = subprocess.run(cmd, input="\n".join(addrs) + "\n", capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [l for l in r.stdout.splitlines() if l.strip() or name == "addr2line"]
    if name != "addr2line":
        lines = [l for l in r.stdout.splitlines() if l.strip()]
    out = {}
    if r.returncode != 0 or len(lines) < 2 * len(offs):
        return out
    for i, o in enumerate(offs):
        func, where = lines[2 * i].strip(), lines[2 * i + 1].strip()
        if func in ("??", ""):
            continue
        where = where.split(" (discriminator")[0]
        if where.startswith("??"):
            out[o] = func
        else:
            out[o] = "%s (%s)" % (func, os.path.basename(where))
    return out


def is_lazypin_object(path):
    return os.path.basename(path).startswith("liblazypin")


# The innermost frames inside CUDA's own code (libcuda, libcudart, a static
# cudart linked into the program or an extension) say nothing the record's
# API does not: they are dropped, at most this many, before `depth` counts.
CUDA_FRAMES = 8
CUDA_API_NAME = re.compile(r"^cu(da)?[A-Z]\w*(?:[ (]|$)")


def is_cuda_frame(frame, name):
    path = frame[0]
    base = os.path.basename(path) if path else ""
    return (base.startswith("libcuda.so") or base.startswith("libcudart.so")
            or name.startswith("libcudart_static_") or CUDA_API_NAME.match(name) is not None)


def call_sites(logs, depth=4):
    """Call sites ranked: each unique symbolized stack (lazypin's own frames
    left out, `depth` frames kept) with its calls, time spent (calls and
    evictions) and time saved (bare estimate minus measured)."""
    resolved = []   # per log: {stack id: [(path, offset) or (None, addr)]}
    wanted = {}
    for log in logs:
        objs = sorted(log.objects)
        bases = [o[0] for o in objs]
        per = {}
        for sid, frames in log.stacks.items():
            out = []
            for a in frames:
                i = bisect.bisect_right(bases, a) - 1
                hit = None
                while i >= 0:
                    base, size, path = objs[i]
                    if base <= a < base + size:
                        hit = (path, a - base)
                        break
                    i -= 1
                    if i >= 0 and objs[i][0] + (1 << 40) < a:
                        break
                if hit is not None and is_lazypin_object(hit[0]):
                    continue
                out.append(hit if hit is not None else (None, a))
                if len(out) >= depth + CUDA_FRAMES:
                    break
            per[sid] = out
            for path, off in out:
                if path is not None:
                    # a return address: the call is the byte before it
                    wanted.setdefault(path, set()).add(max(0, off - 1))
        resolved.append(per)
    tool = symbolizer()
    names = {path: symbolize_object(path, offs, tool) for path, offs in wanted.items()}

    def frame_name(fr):
        path, off = fr
        if path is None:
            return "0x%x" % off
        n = names.get(path, {}).get(max(0, off - 1))
        return n if n else "%s+0x%x" % (os.path.basename(path), off)

    sites = {}
    for log, per in zip(logs, resolved):
        prices = log_prices(log)

        def site(stack):
            if stack is None:
                return None
            if stack not in per:
                return ("stack %d (frames not in the log)" % stack,)
            named = [(f, frame_name(f)) for f in per[stack]]
            while named and is_cuda_frame(*named[0]):
                named.pop(0)
            python = log.python_lines.get(stack)
            return ((("python " + python,) if python else ())
                    + tuple(n for _, n in named[:depth])) or ("(lazypin and CUDA frames only)",)

        for key, g in log.groups.items():
            s = site(key[7])
            if s is None:
                continue
            e = sites.setdefault(s, {"frames": list(s), "calls": 0, "hits": 0, "real": 0,
                                     "evictions": 0, "time_ns": 0, "bare_ns": 0})
            e["calls"] += g.n
            e["time_ns"] += g.total
            e["bare_ns"] += g.total + group_saving(key, g, prices)
            if key[1] == "hit":
                e["hits"] += g.n
            elif key[1] in ("miss", "forward", "passthrough"):
                e["real"] += g.n
        for key, g in log.egroups.items():
            s = site(key[3])
            if s is None:
                continue
            e = sites.setdefault(s, {"frames": list(s), "calls": 0, "hits": 0, "real": 0,
                                     "evictions": 0, "time_ns": 0, "bare_ns": 0})
            e["evictions"] += g.n
            e["time_ns"] += g.total
    out = list(sites.values())
    for e in out:
        e["saved_ns"] = e.pop("bare_ns") - e["time_ns"]
    return {"symbolizer": tool[0] if tool else None,
            "by_time": sorted(out, key=lambda e: (-e["time_ns"], e["frames"])),
            "by_saved": sorted(out, key=lambda e: (-e["saved_ns"], e["frames"]))}


# ---- advice: one rule per finding

def nice_ms(ms):
    """Round up to 1, 2 or 5 times a power of ten."""
    ms = max(1, int(math.ceil(ms)))
    p = 1
    while True:
        for m in (1, 2, 5):
            if m * p >= ms:
                return m * p
        p *= 10


def advise(logs, procs, pool):
    out = []

    def add(rule, finding, suggestion, setting=None, pids=None):
        out.append({"rule": rule, "finding": finding, "suggestion": suggestion,
                    "setting": setting, "pids": sorted(p for p in (pids or []) if p is not None)})

    def total(key):
        return sum(log.f[key] for log in logs)

    def pids_with(key):
        return [log.pid for log in logs if log.f[key]]

    # the mode that ran is not the one asked for
    for p in procs:
        if p["mode_requested"] and p["mode"] and p["mode_requested"] != p["mode"]:
            add("mode", "pid %s asked for LAZYPIN_MODE=%s and ran in %s mode%s"
                % (p["pid"], p["mode_requested"], p["mode"],
                   ": " + p["mode_reason"] if p["mode_reason"] else ""),
                "fix what the reason names; until then the pool does not serve this process",
                pids=[p["pid"]])

    n = total("too_big")
    if n:
        biggest = max(log.f["too_big_max"] for log in logs)
        limit = min(log.pool_bytes for log in logs if log.f["too_big"])
        peak = pool.get("peak_bytes") or 0
        add("pool_bytes",
            "%d register%s of up to %s %s bigger than LAZYPIN_POOL_BYTES (%s): forwarded to "
            "the driver every time, never pooled (0 hits for them)"
            % (n, "" if n == 1 else "s", fmt_bytes(biggest), "was" if n == 1 else "were",
               fmt_bytes(limit)),
            "raise the bound to hold them and what was pooled besides",
            {"LAZYPIN_POOL_BYTES": fmt_size_setting(biggest + peak + 1)}, pids_with("too_big"))

    lru = sum(g.n for log in logs for k, g in log.egroups.items() if k[0] == "lru")
    reload_ = total("lru_reload")
    if lru and reload_:
        entries_bound = min((as_int((log.header or {}).get("config", {}).get("pool_entries"), 0)
                             for log in logs if log.f["lru_reload"]), default=0)
        bytes_full = any(log.pool_bytes and (process_info(log)["pool_peak_bytes"] or 0)
                         >= 0.9 * log.pool_bytes for log in logs if log.f["lru_reload"])
        distinct = max(len(log.seen) for log in logs)
        if bytes_full or (entries_bound and distinct < entries_bound):
            add("lru_bytes",
                "%d LRU eviction%s; %d of the evicted registrations were registered again "
                "(a driver register each): the pool was full by bytes"
                % (lru, "" if lru == 1 else "s", reload_),
                "raise the bound on pooled bytes",
                {"LAZYPIN_POOL_BYTES": fmt_size_setting(2 * max(l.pool_bytes or 0 for l in logs))},
                pids_with("lru_reload"))
        else:
            want = max(distinct, 2 * entries_bound, 2)
            add("lru_entries",
                "%d LRU eviction%s; %d of the evicted registrations were registered again "
                "(a driver register each): too few pool entries (%s) for the %d addresses "
                "the program registers"
                % (lru, "" if lru == 1 else "s", reload_, entries_bound or "?", distinct),
                "allow at least as many entries as the program has buffers",
                {"LAZYPIN_POOL_ENTRIES": str(1 << (want - 1).bit_length())}, pids_with("lru_reload"))

    n = total("idle_reuse")
    if n:
        gap = max(log.f["idle_gap_max_ns"] for log in logs)
        idle_now = max(as_int(((log.header or {}).get("config") or {}).get("idle_ms"), 0)
                       for log in logs if log.f["idle_reuse"])
        add("idle",
            "%d registration%s released as idle %s registered again later (the longest "
            "pause between uses: %s)" % (n, "" if n == 1 else "s", "was" if n == 1 else "were",
                                         fmt_ns(gap)),
            "keep pooled memory longer than the program's pauses",
            {"LAZYPIN_IDLE_MS": str(max(nice_ms(2 * gap / 1e6), 2 * idle_now))}, pids_with("idle_reuse"))

    # kept memory given back because the program needed it (memory_budget.h)
    pressure_pids = {}
    for log in logs:
        k = sum(g.n for key, g in log.egroups.items() if key[0] == "pressure") + \
            log.host_releases.get("pressure", 0)
        every = sum(g.n for g in log.egroups.values()) + sum(log.host_releases.values())
        if k and 2 * k >= every:  # most of lazypin's releases were for pressure
            pressure_pids[log.pid] = k
    if pressure_pids:
        n = sum(pressure_pids.values())
        add("pressure",
            "%d of lazypin's releases (most) were for memory pressure: memory lazypin kept for later (freed pinned host "
            "blocks, parked freed blocks) was needed by the program (its headroom fell under "
            "LAZYPIN_KEEP_MARGIN)" % n,
            "keep less: a smaller host-allocation cache and reuse bound leave the program "
            "its memory without a release each time",
            {"LAZYPIN_HOST_ALLOC_CACHE": "5%", "LAZYPIN_REUSE_FREED": "2%"}, list(pressure_pids))

    def reason_calls(reason):
        per = {}
        for log in logs:
            k = sum(g.n for key, g in log.groups.items() if key[1] == "passthrough" and key[6] == reason)
            if k:
                per[log.pid] = k
        return per

    shared = reason_calls("shared")
    if shared:
        n = sum(shared.values())
        add("shared",
            "%d unregister%s of shared or file-backed pages %s passed to the driver on purpose "
            "(lazypin cannot tell when such pages change)" % (n, "" if n == 1 else "s",
                                                              "was" if n == 1 else "were"),
            "pin private anonymous memory (malloc, or mmap MAP_PRIVATE|MAP_ANONYMOUS) to have "
            "it pooled", pids=list(shared))

    unwatched = reason_calls("unwatched")
    # only where the pool ran (log mode never uses the watch) and the user did
    # not choose the hooks (LAZYPIN_WATCH=hooks)
    hooks = [p for p in procs if p["watch"] == "hooks" and p["mode"] == "defer"
             and (p["config"] or {}).get("watch") != "hooks"]
    if hooks or unwatched:
        why = sorted({p["watch_reason"] for p in hooks if p["watch_reason"]})
        n = sum(unwatched.values())
        add("watch",
            "the kernel watch (userfaultfd) was unavailable%s%s" % (
                " (%s)" % "; ".join(why) if why else "",
                ": %d unregister%s of ranges lazypin could not watch passed to the driver"
                % (n, "" if n == 1 else "s") if n else "; lazypin relied on its hooks alone"),
            "allow userfaultfd (sysctl vm.unprivileged_userfaultfd=1, or run with "
            "CAP_SYS_PTRACE) so that memory changed behind lazypin's hooks is seen",
            pids=[p["pid"] for p in hooks] + list(unwatched))

    wait = reason_calls("wait")
    if wait:
        n = sum(wait.values())
        add("wait",
            "%d unregister%s kept their bare semantics (passed to the driver, which waits for "
            "the GPU's work on the memory)" % (n, "" if n == 1 else "s"),
            "nothing to set: these unregisters ordered the program's work; synchronize the "
            "stream before unregistering if the wait is not needed", pids=list(wait))

    n = total("busy")
    if n:
        waited = total("waited_ns")
        add("busy",
            "%d release%s made while the GPU was still busy with the memory, after "
            "waiting %s in all (%s)" % (n, "" if n == 1 else "s", fmt_ns(waited),
                                        fmt_bytes(total("busy_bytes"))),
            "synchronize the stream that uses a pinned buffer before freeing or unmapping it",
            pids=pids_with("busy"))

    # log mode: registers of an address and size registered before would be hits
    n = total("rereg")
    regs = sum(g.n for log in logs for k, g in log.groups.items()
               if k[2] is not None and not k[3] and log.mode == "log")
    if n >= 2 and n * 4 >= regs:
        est = total("rereg_ns")
        add("defer",
            "%d of %d registers were of an address and size registered before (with an "
            "unregister between): in defer mode they would be pool hits" % (n, regs),
            "try --defer: estimated %s saved, the time these registers and the unregisters "
            "before them took here" % fmt_ns(est),
            {"LAZYPIN_MODE": "defer"}, pids_with("rereg"))

    n = total("pattern")
    real = sum(g.n for log in logs for k, g in log.groups.items()
               if k[1] == "miss" and not k[3])
    if n >= 2 and n * 4 >= real:
        add("pattern",
            "%d of %d driver registers were of a new address right after a pooled "
            "registration of the same size was freed: the program allocates, pins, unpins "
            "and frees each buffer, and the pool cannot serve new memory" % (n, real),
            "allocate the buffer once and reuse it, or use a pinned-memory allocator "
            "(cudaHostAlloc, a caching allocator such as PyTorch's pin_memory())",
            pids=pids_with("pattern"))
    return out


# Copy rates for the auto-pin indication: the H200's (docs/benchmarks.md,
# "Pinned blocks and pageable copies": 64 MiB pageable 9.4-11 ms, pinned
# 1.24-1.29 ms), as bytes per ns. The shim does not time copies, so this is no
# rate of the machine a log comes from; the text says so.
PAGEABLE_BYTES_PER_NS = 6.5
PINNED_BYTES_PER_NS = 53.0


def autopin_summary(logs):
    """What LAZYPIN_AUTOPIN did: from the autopin records and the summaries' pool.autopin."""
    out = {"pins": 0, "failed": 0, "bytes": 0, "register_ns": 0, "apis": {}, "copies": None,
           "copy_bytes": None, "program_hits": None, "over_bound": None}
    for log in logs:
        a = log.autopin
        for k in ("pins", "failed", "bytes", "register_ns"):
            out[k] += a[k]
        for api, n in a["apis"].items():
            out["apis"][api] = out["apis"].get(api, 0) + n
        s = (log.summary or {}).get("pool", {}).get("autopin")
        if isinstance(s, dict):
            for key, field in (("copies", "copies"), ("copy_bytes", "copy_bytes"),
                               ("program_hits", "hits"), ("over_bound", "full")):
                out[key] = (out[key] or 0) + as_int(s.get(field))
    pinned_bytes = out["bytes"] + (out["copy_bytes"] or 0)
    per_byte = 1.0 / PAGEABLE_BYTES_PER_NS - 1.0 / PINNED_BYTES_PER_NS
    out["saved_ns_est"] = int(pinned_bytes * per_byte - out["register_ns"])
    out["method"] = ("%s copied at the pinned rate (first copies %s + later copies %s), priced at "
                     "the H200's pageable %.1f GB/s vs pinned %.0f GB/s (not this machine's: "
                     "lazypin does not time copies; compare wall times), minus the registers' "
                     "measured %s" % (fmt_bytes(pinned_bytes), fmt_bytes(out["bytes"]),
                                      fmt_bytes(out["copy_bytes"] or 0), PAGEABLE_BYTES_PER_NS,
                                      PINNED_BYTES_PER_NS, fmt_ns(out["register_ns"])))
    return out


def analyze(logs, top=10):
    by_api = {}
    by_class = {}
    totals = Agg()
    actions = {}
    regs = unregs = 0
    passthrough_reasons = {}
    for log in logs:
        for key, g in log.groups.items():
            api, action, sclass = key[0], key[1], key[2]
            by_api.setdefault(api, Agg()).merge(g)
            totals.merge(g)
            actions[action] = actions.get(action, 0) + g.n
            if sclass is not None:
                by_class.setdefault(sclass, Agg()).merge(g)
                regs += g.n
            elif is_unregister(api):
                unregs += g.n
            if action == "passthrough":
                r = key[6] or "off"
                passthrough_reasons[r] = passthrough_reasons.get(r, 0) + g.n
    apis = {api: by_api[api].stats(nbytes=not is_unregister(api))
            for api in sorted(by_api, key=api_sort_key)}
    size_classes = {name: by_class[name].stats() for name in SIZE_CLASS_NAMES if name in by_class}
    tot = totals.stats()
    tot["register_calls"] = regs
    tot["unregister_calls"] = unregs

    hits = actions.get("hit", 0)
    misses = actions.get("miss", 0)
    deferred = actions.get("deferred", 0)
    ev_by_reason = {}
    for log in logs:
        for (reason, err, forced, stack), g in log.egroups.items():
            ev_by_reason.setdefault(reason, Agg()).merge(g)
    order = {r: i for i, r in enumerate(EVICT_REASONS)}
    evictions = {}
    for r in sorted(ev_by_reason, key=lambda r: (order.get(r, len(order)), r)):
        s = ev_by_reason[r].stats()
        s["forced"] = ev_by_reason[r].forced
        s["waited_ns"] = ev_by_reason[r].waited
        evictions[r] = s
    summaries = [log.summary for log in logs if log.summary is not None]
    spools = [s.get("pool") for s in summaries if isinstance(s.get("pool"), dict)]
    all_summarized = bool(logs) and len(spools) == len(logs)

    def ssum(key):
        vals = [p[key] for p in spools if isinstance(p.get(key), (int, float))
                and not isinstance(p.get(key), bool)]
        return int(sum(vals)) if vals else None

    summary_evictions = None
    if spools:
        summary_evictions = {}
        for p in spools:
            for r, n in (p.get("evictions") or {}).items():
                summary_evictions[r] = summary_evictions.get(r, 0) + as_int(n)
    per_log = [saving_of(log) for log in logs]
    sv = saving_total(per_log)
    sv["calls_ns"] = sum(g.total for log in logs for g in log.groups.values())
    # the time the process spent in registration work: its calls, and the
    # evictions made outside them (those inside are in the calls' time)
    sv["measured_ns"] = (sv["calls_ns"] + sv["evictions_ns"]
                         - sum(v for log in logs for v in log.in_call_evictions.values()))
    sv["text"] = saving_text(sv)
    sv["method"] = SAVING_METHOD
    evict_count = sum(a.n for a in ev_by_reason.values())
    pool_used = bool(hits or misses or deferred or evict_count)
    pool = {
        "active": pool_used,
        "hits": hits,
        "misses": misses,
        "hit_rate": (hits / (hits + misses)) if (hits + misses) else None,
        "deferred": deferred,
        "forwarded": actions.get("forward", 0),
        "passthrough": actions.get("passthrough", 0),
        "passthrough_reasons": passthrough_reasons,
        "evicted_in_calls": 0,
        "evictions": evictions,
        "evictions_total": evict_count,
        "summary_evictions": summary_evictions,
        "pool_summaries": len(spools),
        "peak_bytes": ssum("peak_bytes"),
        "peak_entries": ssum("peak_entries"),
        "pooled_bytes_at_exit": ssum("pooled_bytes"),
        "pooled_entries_at_exit": ssum("pooled_entries"),
        "saved_ns_est": sv["saved_ns"] if sv["estimable"] else None,
        "saved_ns_source": "records",
        "saved_ns_records": sv["saved_ns"] if sv["estimable"] else None,
        "saving": sv,
    }
    host_releases = {}
    for log in logs:
        for r, n in log.host_releases.items():
            host_releases[r] = host_releases.get(r, 0) + n
    hsum = [s.get("host_alloc") for s in summaries if isinstance(s.get("host_alloc"), dict)]
    host = {
        "active": bool(actions.get("host_hit") or actions.get("host_miss")
                       or actions.get("host_deferred") or host_releases),
        "hits": actions.get("host_hit", 0),
        "misses": actions.get("host_miss", 0),
        "kept": actions.get("host_deferred", 0),
        "forwarded": actions.get("host_forward", 0),
        "releases": host_releases,
        "peak_bytes": sum(h.get("peak_bytes", 0) for h in hsum) if hsum else None,
        "zero_ns": sum(h.get("zero_ns", 0) for h in hsum) if hsum else None,
    }
    # in-call evictions: the calls' "evicted" counts (groups hold only whether > 0)
    pool["evicted_in_calls"] = sum(log.f.get("in_call", 0) for log in logs)

    slowest = []
    for log in logs:
        slowest += log.slow_rows()
    slowest.sort(key=lambda r: (-r["latency_ns"], r["t_ns"]))
    slowest = slowest[:max(0, top)]

    errs = {}
    for log in logs:
        for (code, api), n in log.errors.items():
            e = errs.setdefault(code, {"code": code, "name": result_name(code), "count": 0, "apis": {}})
            e["count"] += n
            e["apis"][api] = e["apis"].get(api, 0) + n
    errors = [errs[k] for k in sorted(errs)]
    evict_errors = sum(a.errors for a in ev_by_reason.values())

    procs = []
    for log, s in zip(logs, per_log):
        p = process_info(log)
        regs_p = sum(g.n for k, g in log.groups.items() if k[1] in ("hit", "miss"))
        p["time_ns"] = (sum(g.total for g in log.groups.values())
                        + sum(g.total for g in log.egroups.values()))
        p["hits"] = s["hits"]
        p["pool_registers"] = regs_p
        p["saving"] = s
        p["saved_ns"] = s["saved_ns"] if s["estimable"] else None
        procs.append(p)

    warnings = []
    for log in logs:
        for w in log.warnings:
            warnings.append({"source": "log", "file": log.path, "pid": log.pid,
                             "t_ns": as_int(w.get("t_ns"), None) if "t_ns" in w else None,
                             "message": str(w.get("message", ""))})
        for m in log.reader_warnings:
            warnings.append({"source": "report", "file": log.path, "pid": log.pid,
                             "t_ns": None, "message": m})
        n = log.f["old_passthrough"]
        if n:
            warnings.append({"source": "report", "file": log.path, "pid": log.pid, "t_ns": None,
                             "message": "lazypin was off for %d call%s of pid %s (passthrough: "
                                        "a forked child, or the self-test failed)"
                                        % (n, "" if n == 1 else "s", log.pid)})
    if evict_errors:
        warnings.append({"source": "report", "file": None, "pid": None, "t_ns": None,
                         "message": "%d eviction%s failed (non-zero result)"
                                    % (evict_errors, "" if evict_errors == 1 else "s")})

    return {
        "lazypin_report": JSON_SCHEMA,
        "files": [log.path for log in logs],
        "processes": procs,
        "totals": tot,
        "apis": apis,
        "size_classes": size_classes,
        "pool": pool,
        "host_alloc": host,
        "devices": devices_summary(logs),
        "autopin": autopin_summary(logs),
        "advice": advise(logs, procs, pool),
        "call_sites": call_sites(logs),
        "slowest": slowest,
        "errors": errors,
        "warnings": warnings,
    }


def devices_summary(logs):
    """Calls per device (logs of runs with several devices), as "0", "1", ..."""
    out = {}
    for log in logs:
        for dev, d in log.devices.items():
            o = out.setdefault(str(dev), {"calls": 0, "total_ns": 0})
            for k, v in d.items():
                o[k] = o.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def is_bare(doc):
    """A run without the pool: log or off mode, or no pool action at all."""
    mode = run_mode(doc)
    return (mode in ("log", "off")) or not doc["pool"]["active"]


def run_identity(doc):
    """What ran: sorted (program, arguments) of the processes."""
    return sorted({(os.path.basename(p["exe"]) if p["exe"] else "-",
                    fmt_argv(p["argv"][1:] if p["argv"] else p["argv"])) for p in doc["processes"]})


def run_differences(base, other):
    """Lines saying how the two runs' programs or arguments differ (none: alike)."""
    a, b = run_identity(base), run_identity(other)
    if a == b:
        return []
    out = []
    progs_a, progs_b = sorted({x[0] for x in a}), sorted({x[0] for x in b})
    if progs_a != progs_b:
        out.append("programs: A %s, B %s" % (", ".join(progs_a), ", ".join(progs_b)))
    else:
        args_a, args_b = sorted({x[1] for x in a}), sorted({x[1] for x in b})
        out.append("arguments: A %s, B %s" % (" | ".join(args_a), " | ".join(args_b)))
    return out


def compare(base, other):
    apis = sorted(set(base["apis"]) | set(other["apis"]), key=api_sort_key)
    out = {}
    for api in apis:
        a = base["apis"].get(api)
        b = other["apis"].get(api)
        pick = lambda s: ({k: s[k] for k in ("calls", "p50_ns", "p99_ns", "total_ns")} if s else
                          {"calls": 0, "p50_ns": None, "p99_ns": None, "total_ns": 0})
        pa, pb = pick(a), pick(b)
        out[api] = {"baseline": pa, "other": pb,
                    "ratio": {"p50": ratio(pa["p50_ns"], pb["p50_ns"]),
                              "p99": ratio(pa["p99_ns"], pb["p99_ns"]),
                              "total": ratio(pa["total_ns"], pb["total_ns"])}}
    tb = base["totals"]["total_ns"]
    to = other["totals"]["total_ns"]
    res = {"apis": out, "total_ns": {"baseline": tb, "other": to, "ratio": ratio(tb, to)},
           "saving": None}
    # the measured saving: a bare run against a pooled one
    bare, pooled, side = None, None, None
    if is_bare(base) and not is_bare(other):
        bare, pooled, side = base, other, "other"
    elif is_bare(other) and not is_bare(base):
        bare, pooled, side = other, base, "baseline"
    if bare is not None:
        bare_ns = 0
        scaled = False
        for api in apis:
            a = bare["apis"].get(api)
            b = pooled["apis"].get(api)
            if not a or not b:
                continue
            if a["calls"] == b["calls"]:
                bare_ns += a["total_ns"]
            else:
                scaled = True
                bare_ns += a["total_ns"] * b["calls"] / a["calls"]
        measured = pooled["pool"]["saving"]["measured_ns"]
        saved = int(round(bare_ns - measured))
        res["saving"] = {
            "pooled_run": side, "saved_ns": saved, "bare_ns": int(round(bare_ns)),
            "pooled_ns": measured, "scaled": scaled,
            "estimate_ns": pooled["pool"]["saved_ns_records"],
            "estimate_text": pooled["pool"]["saving"]["text"],
            "method": "measured: the bare run's time in registration calls%s, minus the "
                      "pooled run's (its calls, and lazypin's evictions outside them)"
                      % (" (scaled per API to the pooled run's number of calls)" if scaled else "")}
        ap = pooled.get("autopin") or {}
        if ap.get("pins"):
            res["saving"]["autopin"] = {
                "saved_ns_est": ap["saved_ns_est"], "register_ns": ap["register_ns"],
                "note": "auto-pin changed copy times, which the logs do not hold: not in the "
                        "measured figure; compare the programs' wall times"}
        pooled["pool"]["saved_ns_est"] = saved
        pooled["pool"]["saved_ns_source"] = "measured"
    return res


# --------------------------------------------------------------------------
# text output

def pool_verdict(pool, mode=None):
    if not pool["active"]:
        if pool["passthrough"] and not pool["forwarded"]:
            return "pool: off (lazypin passed every call through)"
        return "pool: not used (mode %s)" % (mode or "log")
    regs = pool["hits"] + pool["misses"]
    if pool["saved_ns_source"] == "measured":
        saved = pool["saved_ns_est"]
        tail = (", saved %s (measured against the bare run)" % fmt_ns(saved) if saved >= 0 else
                ", cost %s more than it saved (measured against the bare run)" % fmt_ns(-saved))
    else:
        tail = ", " + pool["saving"]["text"]
    return "pool: %d hit%s / %d register%s (%s)%s" % (
        pool["hits"], "" if pool["hits"] == 1 else "s", regs, "" if regs == 1 else "s",
        fmt_pct(pool["hit_rate"]) if regs else "-", tail)


def stat_row(name, s, with_bytes=True):
    row = [name, s["calls"], s["errors"]]
    if with_bytes:
        row.append(fmt_bytes(s["bytes"]) if s["bytes"] else "-")
    row += [fmt_ns(s["total_ns"]), fmt_ns(s["p50_ns"]), fmt_ns(s["p90_ns"]),
            fmt_ns(s["p99_ns"]), fmt_ns(s["max_ns"])]
    return row


def fmt_config(cfg):
    if not cfg:
        return "-"
    parts = []
    for k, v in cfg.items():
        if k == "mode":
            continue
        if isinstance(v, bool):
            v = "yes" if v else "no"
        elif k == "pool_bytes" and isinstance(v, int):
            v = fmt_bytes(v)
        parts.append("%s=%s" % (k, v))
    return " ".join(parts) or "-"


def fmt_argv(argv):
    if not argv:
        return "-"
    return " ".join(shlex.quote(str(a)) for a in argv)


def run_mode(doc):
    modes = sorted({p["mode"] for p in doc["processes"] if p["mode"]})
    if not modes:
        return None
    return "/".join(modes) + ("+autopin" if (doc.get("autopin") or {}).get("pins") else "")


def fmt_mode(p):
    m = p["mode"] or "-"
    if p["mode_requested"] and p["mode_requested"] != p["mode"]:
        m += " (asked: %s%s)" % (p["mode_requested"], "; " + p["mode_reason"] if p["mode_reason"] else "")
    return m


def render_run(doc, lines):
    procs = doc["processes"]
    if len(procs) == 1:
        p = procs[0]
        lines.append("== run")
        rows = [("log", p["file"]),
                ("program", p["exe"] or "-"),
                ("argv", fmt_argv(p["argv"])),
                ("host", p["host"] or "-"),
                ("pid", p["pid"] if p["pid"] is not None else "-")]
        if p["rank"] is not None:
            rows.append(("rank", p["rank"]))
        rows += [("mode", fmt_mode(p)),
                 ("config", fmt_config(p["config"]))]
        if p["watch"]:
            rows.append(("watch", p["watch"] + (" (%s)" % p["watch_reason"] if p["watch_reason"] else "")))
        rows += [("driver", fmt_driver(p["driver_version"]) if p["driver_version"] is not None else "unknown"),
                 ("lazypin", p["lazypin"] or "-"),
                 ("started", fmt_start(p["start_unix_ns"]))]
        if p["has_summary"]:
            rows.append(("ended", "%s, %s after the first call" % (p["ended_by"], fmt_ns(p["duration_ns"]))))
        else:
            rows.append(("ended", "no summary record (%s)" % ("log was cut" if p["cut"] else "did not exit normally")))
        rows.append(("records", p["records"]))
        w = max(len(k) for k, _ in rows)
        lines += ["  %s  %s" % (k.ljust(w), v) for k, v in rows]
        return
    hosts = sorted({p["host"] or "-" for p in procs})
    lines.append("== run (%d processes%s)" % (len(procs), ", %d hosts" % len(hosts) if len(hosts) > 1 else ""))
    order = sorted(procs, key=lambda p: (p["host"] or "", p["rank"] if p["rank"] is not None else 1 << 62,
                                         p["pid"] if p["pid"] is not None else 0, p["file"]))
    rows = []
    for p in order:
        regs = p["pool_registers"]
        rows.append([p["host"] or "-",
                     p["pid"] if p["pid"] is not None else "-",
                     p["rank"] if p["rank"] is not None else "-",
                     os.path.basename(p["exe"]) if p["exe"] else "-",
                     p["mode"] or "-",
                     fmt_driver(p["driver_version"]).split(" ")[0] if p["driver_version"] is not None else "unknown",
                     fmt_start(p["start_unix_ns"]),
                     p["calls"],
                     fmt_ns(p["time_ns"]),
                     "%d/%d" % (p["hits"], regs) if regs else "-",
                     fmt_ns(p["saved_ns"]) if p["saved_ns"] is not None else "-",
                     (p["ended_by"] or "-") if p["has_summary"] else ("cut" if p["cut"] else "no summary"),
                     p["file"]])
    lines += table(["host", "pid", "rank", "program", "mode", "driver", "started", "calls", "time",
                    "hits", "saved~", "ended", "log"],
                   rows, left=(0, 3, 4, 6, 11, 12))
    for p in order:
        lines.append("  argv[%s]  %s" % (p["pid"], fmt_argv(p["argv"])))
    cfgs = {json.dumps(p["config"], sort_keys=True) for p in procs}
    if len(cfgs) == 1:
        lines.append("  config    %s" % fmt_config(procs[0]["config"]))
    else:
        for p in order:
            lines.append("  config[%s]  %s" % (p["pid"], fmt_config(p["config"])))
    for p in order:
        if p["mode_requested"] and p["mode_requested"] != p["mode"]:
            lines.append("  mode[%s]  %s" % (p["pid"], fmt_mode(p)))


def render_advice(doc, L):
    L.append("")
    L.append("== advice")
    if not doc["advice"]:
        L.append("  none: nothing in the log says the pool could do better")
        return
    for a in doc["advice"]:
        L.append("  [%s] %s" % (a["rule"], a["finding"]))
        s = a["suggestion"]
        if a["setting"]:
            s = "set %s: %s" % (" ".join("%s=%s" % kv for kv in a["setting"].items()), s)
        L.append("      -> " + s)


def render_sites(doc, L, top):
    cs = doc["call_sites"]
    if not cs["by_time"] or top <= 0:
        return
    L.append("")
    L.append("== call sites by time spent (frames symbolized with %s)"
             % (cs["symbolizer"] or "nothing: no addr2line or llvm-symbolizer; object+offset"))

    def block(sites, key):
        for i, e in enumerate(sites[:top]):
            L.append("  #%d  %s spent, %s saved~  %d calls (%d hits, %d to the driver)%s"
                     % (i + 1, fmt_ns(e["time_ns"]), fmt_ns(e["saved_ns"]), e["calls"], e["hits"],
                        e["real"], ", %d evictions" % e["evictions"] if e["evictions"] else ""))
            for fr in e["frames"]:
                L.append("        " + fr)
    block(cs["by_time"], "time_ns")
    saved = [e for e in cs["by_saved"] if e["saved_ns"] > 0]
    if saved:
        L.append("")
        L.append("== call sites by time saved")
        block(saved, "saved_ns")


def render_text(doc, top=10):
    L = []
    render_run(doc, L)
    L.append("")
    L.append("== calls by API")
    hdr = ["api", "calls", "errors", "bytes", "total", "p50", "p90", "p99", "max"]
    rows = [stat_row(api, s) for api, s in doc["apis"].items()]
    if len(doc["apis"]) > 1:
        rows.append(stat_row("all", doc["totals"]))
    if rows:
        L += table(hdr, rows)
    else:
        L.append("  (no calls)")

    if doc["size_classes"]:
        L.append("")
        L.append("== register calls by size")
        rows = [stat_row(size_class_label(k), s) for k, s in doc["size_classes"].items()]
        L += table(["size"] + hdr[1:], rows)

    L.append("")
    pool = doc["pool"]
    L.append("== pool")
    L.append("  " + pool_verdict(pool, run_mode(doc)))
    if pool["active"]:
        L.append("  hits %d  misses %d  hit rate %s  deferred unregisters %d  forwarded %d"
                 % (pool["hits"], pool["misses"], fmt_pct(pool["hit_rate"]),
                    pool["deferred"], pool["forwarded"]))
        if pool["passthrough"]:
            L.append("  passed to the driver on purpose: %s" % ", ".join(
                "%s %d" % kv for kv in sorted(pool["passthrough_reasons"].items())))
        if pool["peak_bytes"] is not None:
            nproc = len(doc["processes"])
            if nproc == 1:
                over = ""
            elif pool["pool_summaries"] == nproc:
                over = " (sum over %d processes)" % nproc
            else:
                over = " (sum over the %d of %d processes with a full summary)" % (
                    pool["pool_summaries"], nproc)
            L.append("  peak pooled %s in %s entr%s%s; still pooled at exit %s in %s entries"
                     % (fmt_bytes(pool["peak_bytes"]), pool["peak_entries"],
                        "y" if pool["peak_entries"] == 1 else "ies", over,
                        fmt_bytes(pool["pooled_bytes_at_exit"]), pool["pooled_entries_at_exit"]))
        else:
            L.append("  peak pooled: unknown (no summary record)")
        sv = pool["saving"]
        L.append("  " + sv["text"])
        L.append("  how: " + sv["method"])
        L.append("  time in registration work: %s (calls %s, evictions %s, those inside calls counted once)"
                 % (fmt_ns(sv["measured_ns"]), fmt_ns(sv["calls_ns"]), fmt_ns(sv["evictions_ns"])))
        L.append("  evicted inside program calls (overlap, make room): %d" % pool["evicted_in_calls"])
        if pool["evictions"]:
            L.append("  evictions outside program calls: %d" % pool["evictions_total"])
            rows = [[r, s["calls"], s["errors"], fmt_bytes(s["bytes"]) if s["bytes"] else "-",
                     fmt_ns(s["total_ns"]), fmt_ns(s["p50_ns"]), fmt_ns(s["p90_ns"]),
                     fmt_ns(s["p99_ns"]), fmt_ns(s["max_ns"])]
                    + ([s["forced"]] if any(x["forced"] for x in pool["evictions"].values()) else [])
                    for r, s in pool["evictions"].items()]
            hdr = ["reason", "count", "errors", "bytes", "total", "p50", "p90", "p99", "max"]
            if any(x["forced"] for x in pool["evictions"].values()):
                hdr.append("forced")
            L += table(hdr, rows, indent="    ")
        else:
            L.append("  evictions outside program calls: none")

    if doc.get("devices"):
        L.append("")
        L.append("== by device")
        rows = [[dev, str(d["calls"]), fmt_ns(d["total_ns"]), str(d.get("hit", 0)),
                 str(d.get("miss", 0)), str(d.get("deferred", 0)), str(d.get("forward", 0))]
                for dev, d in doc["devices"].items()]
        L += table(["device", "calls", "time", "hits", "misses", "deferred", "forwarded"], rows,
                   indent="  ")
    host = doc.get("host_alloc") or {}
    if host.get("active"):
        L.append("")
        L.append("== host allocations (cudaHostAlloc/cudaMallocHost/cuMemHostAlloc/cuMemAllocHost)")
        allocs = host["hits"] + host["misses"]
        L.append("  hits %d  misses %d  hit rate %s  frees kept %d  forwarded %d"
                 % (host["hits"], host["misses"], fmt_pct(host["hits"] / allocs if allocs else None),
                    host["kept"], host["forwarded"]))
        if host["releases"]:
            L.append("  released by lazypin: %s" % ", ".join(
                "%s %d" % kv for kv in sorted(host["releases"].items())))
        if host.get("peak_bytes") is not None:
            L.append("  peak cached %s; zeroing served blocks took %s"
                     % (fmt_bytes(host["peak_bytes"]), fmt_ns(host["zero_ns"] or 0)))
    ap = doc.get("autopin") or {}
    if ap.get("pins") or ap.get("failed"):
        L.append("")
        L.append("== auto-pin (LAZYPIN_AUTOPIN)")
        L.append("  %d ranges pinned for copies (%s), registers took %s; %d refused by the driver"
                 % (ap["pins"], fmt_bytes(ap["bytes"]), fmt_ns(ap["register_ns"]), ap["failed"]))
        if ap["copies"] is not None:
            L.append("  later copies at the pinned rate: %d (%s); program registers served: %d; "
                     "left pageable for the bound: %d" % (ap["copies"], fmt_bytes(ap["copy_bytes"]),
                                                          ap["program_hits"], ap["over_bound"]))
        L.append("  saved about %s (indicative, at the H200's copy rates): %s" % (fmt_ns(ap["saved_ns_est"]), ap["method"]))
        if ap["apis"]:
            L.append("  by copy: " + ", ".join("%s %d" % kv for kv in sorted(ap["apis"].items())))

    render_advice(doc, L)
    render_sites(doc, L, min(top, 5) if top else 0)

    if top > 0 and doc["slowest"]:
        L.append("")
        L.append("== slowest %d" % len(doc["slowest"]))
        multi = len(doc["processes"]) > 1
        rows = []
        for r in doc["slowest"]:
            row = ["%.6f s" % (r["t_ns"] / 1e9)]
            if multi:
                row.append(r["pid"] if r["pid"] is not None else "-")
            row += [r["tid"] if r["tid"] is not None else "-", r["api"],
                    fmt_bytes(r["bytes"]) if r["bytes"] else "-",
                    r["result"] if r["result"] == 0 else "%d %s" % (r["result"], result_name(r["result"])),
                    r["action"] or "-", fmt_ns(r["latency_ns"])]
            rows.append(row)
        hdr = ["time"] + (["pid"] if multi else []) + ["tid", "api", "bytes", "result", "action", "latency"]
        api_col = 3 if multi else 2
        L += table(hdr, rows, left=(api_col, api_col + 2, api_col + 3))

    L.append("")
    L.append("== errors")
    if doc["errors"]:
        rows = [[e["code"], e["name"], e["count"],
                 ", ".join("%s %d" % (a, n) for a, n in sorted(e["apis"].items(), key=lambda x: api_sort_key(x[0])))]
                for e in doc["errors"]]
        L += table(["code", "name", "count", "apis"], rows, left=(1, 3))
    else:
        L.append("  none")

    L.append("")
    L.append("== warnings")
    if doc["warnings"]:
        # repeated shim warnings are shown once with a count
        seen = {}
        order = []
        for w in doc["warnings"]:
            key = (w["source"], w["pid"], w["message"])
            if key not in seen:
                seen[key] = [w, 0]
                order.append(key)
            seen[key][1] += 1
        multi = len(doc["processes"]) > 1
        for key in order:
            w, n = seen[key]
            where = []
            if w["source"] == "log":
                if multi:
                    where.append("pid %s" % w["pid"])
                if w["t_ns"] is not None:
                    where.append("t=%.6f s" % (w["t_ns"] / 1e9))
            prefix = ("[%s] " % ", ".join(where)) if where else ""
            L.append("  %s%s%s" % (prefix, w["message"], " (x%d)" % n if n > 1 else ""))
    else:
        L.append("  none")
    return "\n".join(L) + "\n"


def run_name(doc):
    """A run as the user knows it: its file (or directory, for several) and mode."""
    files = doc["files"]
    if len(files) == 1:
        name = os.path.basename(files[0])
    else:
        dirs = sorted({os.path.dirname(f) for f in files})
        name = (os.path.basename(dirs[0]) or dirs[0]) + "/ (%d logs)" % len(files) if len(dirs) == 1 \
            else "%d logs" % len(files)
    return "%s (%s)" % (name, run_mode(doc) or "?")


def render_compare(base, other, cmp):
    L = []
    for d in cmp.get("differences") or []:
        L.append("note: A and B differ (--force): " + d)
    for label, doc in (("A", base), ("B", other)):
        procs = doc["processes"]
        prog = ", ".join(sorted({os.path.basename(p["exe"]) for p in procs if p["exe"]})) or "-"
        pids = ", ".join(str(p["pid"]) for p in procs if p["pid"] is not None) or "-"
        L.append("%s  %s: %s  (pid %s; %s)" % (label, run_name(doc), prog, pids, ", ".join(doc["files"])))
        L.append("   " + pool_verdict(doc["pool"], run_mode(doc)))
    L.append("")
    L.append("== A vs B (A/B: ratio A / B; above 1: B is faster)")
    rows = []
    for api, c in cmp["apis"].items():
        a, b, r = c["baseline"], c["other"], c["ratio"]
        rows.append([api, a["calls"], b["calls"],
                     fmt_ns(a["p50_ns"]), fmt_ns(b["p50_ns"]), fmt_ratio(r["p50"]),
                     fmt_ns(a["p99_ns"]), fmt_ns(b["p99_ns"]), fmt_ratio(r["p99"]),
                     fmt_ns(a["total_ns"]), fmt_ns(b["total_ns"]), fmt_ratio(r["total"])])
    L += table(["api", "calls A", "calls B", "p50 A", "p50 B", "A/B", "p99 A", "p99 B", "A/B",
                "total A", "total B", "A/B"], rows)
    t = cmp["total_ns"]
    L.append("")
    L.append("  time in registration calls: A %s, B %s, ratio %s"
             % (fmt_ns(t["baseline"]), fmt_ns(t["other"]), fmt_ratio(t["ratio"])))
    s = cmp["saving"]
    if s is not None:
        who = "B" if s["pooled_run"] == "other" else "A"
        word = "saved" if s["saved_ns"] >= 0 else "cost"
        L.append("  the pool (%s) %s %s, measured: bare %s - pooled %s (calls and evictions)%s"
                 % (who, word, fmt_ns(abs(s["saved_ns"])), fmt_ns(s["bare_ns"]), fmt_ns(s["pooled_ns"]),
                    "; bare scaled per API to the pooled run's call count" if s["scaled"] else ""))
        L.append("  (from the pooled run's log alone: %s)" % s["estimate_text"])
        if s.get("autopin"):
            L.append("  auto-pin: %s; its registers took %s (%s)"
                     % ("estimated %s saved in copies" % fmt_ns(s["autopin"]["saved_ns_est"]),
                        fmt_ns(s["autopin"]["register_ns"]), s["autopin"]["note"]))
    for label, doc in (("A", base), ("B", other)):
        if doc["advice"]:
            L.append("")
            L.append("== advice (%s)" % label)
            sub = []
            render_advice(doc, sub)
            L += sub[2:]
    warn = [(label, w) for label, d in (("A", base), ("B", other)) for w in d["warnings"]]
    if warn:
        L.append("")
        L.append("== warnings")
        for label, w in warn:
            L.append("  [%s] %s" % (label, w["message"]))
    return "\n".join(L) + "\n"


# Past this many bytes of logs, `lazypin run`'s closing lines come from the
# shim's summary records at the logs' ends, not from reading the logs.
BRIEF_READ_LIMIT = 8 << 20


def last_summary(path):
    """The summary record among the last MiB of a log, or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - (1 << 20)))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.split(b"\n")):
        if b'"summary"' in line:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("type") == "summary":
                return rec
    return None


def brief_from_summaries(paths):
    """brief_summary's lines from the summary records alone (large logs)."""
    apis = {}
    pool_hits = pool_regs = 0
    savings = []
    unsummarized = 0
    for path in paths:
        rec = last_summary(path)
        if rec is None or not isinstance(rec.get("apis"), dict):
            unsummarized += 1
            continue
        for api, st in rec["apis"].items():
            if not isinstance(st, dict):
                continue
            a = apis.setdefault(api, {"calls": 0, "errors": 0, "total_ns": 0, "p50_ns": [], "p99_ns": []})
            for k in ("calls", "errors", "total_ns"):
                a[k] += as_int(st.get(k))
            for k in ("p50_ns", "p99_ns"):
                a[k].append(as_int(st.get(k)))
        pool = rec.get("pool") if isinstance(rec.get("pool"), dict) else {}
        pool_hits += as_int(pool.get("hits"))
        pool_regs += as_int(pool.get("hits")) + as_int(pool.get("misses"))
        sv = pool.get("saving")
        if isinstance(sv, dict):
            sv = {k: as_int(sv.get(k)) for k in ("saved_ns", "spread_ns", "hits", "hits_priced",
                                                  "deferred", "deferred_priced", "evictions",
                                                  "evictions_ns", "price_calls")}
            sv["processes"] = 1
            sv["estimable"] = bool(sv["hits_priced"] + sv["deferred_priced"]
                                   or (sv["hits"] + sv["deferred"] == 0 and sv["evictions"]))
            if sv["hits"] + sv["deferred"] + sv["evictions"]:
                savings.append(sv)
    L = []
    rows = [[api, a["calls"], a["errors"],
             fmt_ns(a["p50_ns"][0]) if len(a["p50_ns"]) == 1 else "-",
             fmt_ns(a["p99_ns"][0]) if len(a["p99_ns"]) == 1 else "-", fmt_ns(a["total_ns"])]
            for api, a in sorted(apis.items(), key=lambda kv: api_sort_key(kv[0]))]
    if rows:
        L += table(["api", "calls", "errors", "p50", "p99", "total"], rows)
    else:
        L.append("  no summary with calls at the logs' ends")
    if pool_regs or savings:
        text = saving_text(saving_total(savings)) if savings else ""
        L.append("  pool: %d hit%s / %d register%s (%s)%s" % (
            pool_hits, "" if pool_hits == 1 else "s", pool_regs, "" if pool_regs == 1 else "s",
            fmt_pct(pool_hits / pool_regs if pool_regs else None), ", " + text if text else ""))
    if unsummarized:
        L.append("  %d log%s without a full summary (ended by a signal): see `lazypin report`"
                 % (unsummarized, "" if unsummarized == 1 else "s"))
    L.append("  (from the shim's summaries; advice and warnings: `lazypin report`)")
    return "\n".join(L)


def brief_summary(paths):
    """The few lines that `lazypin run` prints at the end: from the logs, or,
    past BRIEF_READ_LIMIT bytes of them, from the shim's summaries alone (so
    that the run returns at once after a long job)."""
    try:
        size = sum(os.path.getsize(p) for p in paths)
    except OSError:
        size = 0
    if size > BRIEF_READ_LIMIT:
        return brief_from_summaries(paths)
    logs = load(paths, top=0)
    doc = analyze(logs, top=0)
    L = []
    rows = [[api, s["calls"], s["errors"], fmt_ns(s["p50_ns"]), fmt_ns(s["p99_ns"]),
             fmt_ns(s["total_ns"])] for api, s in doc["apis"].items()]
    if rows:
        L += table(["api", "calls", "errors", "p50", "p99", "total"], rows)
    else:
        L.append("  no registration calls")
    if doc["pool"]["active"]:
        L.append("  " + pool_verdict(doc["pool"]))
    n = len(doc["advice"])
    if n:
        L.append("  %d piece%s of advice (%s): see `lazypin report`"
                 % (n, "" if n == 1 else "s", ", ".join(a["rule"] for a in doc["advice"])))
    n = len(doc["warnings"])
    if n:
        L.append("  %d warning%s: see `lazypin report`" % (n, "" if n == 1 else "s"))
    return "\n".join(L)


# --------------------------------------------------------------------------
# plot

PLOT_HINT = ("--plot needs matplotlib (pip install matplotlib, "
             "or apt-get install python3-matplotlib)")
# The interpreter --plot runs the report under when this one lacks matplotlib
# (set by the report itself when it re-runs there, so that it never loops).
PLOT_PYTHON = "LAZYPIN_REPORT_PYTHON"


def python_with_matplotlib():
    """(an interpreter other than this one that imports matplotlib, or None;
    those tried): $LAZYPIN_REPORT_PYTHON, /usr/bin/python3 (where
    python3-matplotlib installs it), then each python3 on PATH."""
    named = os.environ.get(PLOT_PYTHON)
    here = os.path.realpath(sys.executable or "")
    if named:
        if os.path.realpath(named) == here:
            return None, [named]  # asked for this one, or re-run here already
        cands = [named]
    else:
        cands = ["/usr/bin/python3"]
        for d in (os.environ.get("PATH") or "").split(os.pathsep):
            cands.append(os.path.join(d or ".", "python3"))
    tried, seen = [], {here}
    for c in cands:
        real = os.path.realpath(c)
        if real in seen or not os.access(c, os.X_OK):
            continue
        seen.add(real)
        tried.append(c)
        try:
            ok = subprocess.run([c, "-c", "import matplotlib"], capture_output=True,
                                timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return c, tried
    return None, tried


def plot_missing_message(tried):
    return ("%s; %s cannot import it%s; or name an interpreter that can: %s=/path/to/python3"
            % (PLOT_HINT, sys.executable or "python3",
               ", nor can " + ", ".join(tried) if tried else "", PLOT_PYTHON))


def import_pyplot():
    if os.environ.get("LAZYPIN_REPORT_NO_MATPLOTLIB"):
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    return plt


def plot_title(runs):
    parts = []
    for name, doc in runs:
        progs = sorted({os.path.basename(p["exe"]) for p in doc["processes"] if p["exe"]}) or ["?"]
        parts.append("%s, %s mode" % (", ".join(progs), run_mode(doc) or "?"))
    return "lazypin: " + " vs ".join(parts)


def plot(runs, path):
    """runs: [(name or None, logs)], a run named by its file and mode when the
    name is None. Left: latency CDF per API (log x). Right: register latency
    per size class (4K, 64K, 1M...), hits and driver registers apart (median,
    bar p10 to p90). The legend sits under the axes. Returns an error
    message or None."""
    plt = import_pyplot()
    if plt is None:
        return PLOT_HINT
    named = []
    for name, logs in runs:
        doc = {"files": [l.path for l in logs], "processes": [process_info(l) for l in logs]}
        named.append((name or run_name(doc), doc, logs))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.6))
    styles = ("-", "--", ":", "-.")
    colors = [c.get("color") for c in plt.rcParams["axes.prop_cycle"]] or [None]
    all_apis = sorted({k[0] for _, _, logs in named for l in logs for k in l.groups}, key=api_sort_key)
    classes_used = sorted({k[2] for _, _, logs in named for l in logs for k in l.groups if k[2]},
                          key=SIZE_CLASS_NAMES.index)
    xpos = {c: i for i, c in enumerate(classes_used)}
    kinds = (("hit", ("hit",), "o"), ("driver register", ("miss", "forward"), "s"))
    nseries = len(named) * len(kinds)
    k = 0
    for ri, (name, doc, logs) in enumerate(named):
        by_api = {}
        for l in logs:
            for key, g in l.groups.items():
                by_api.setdefault(key[0], Agg()).merge(g)
        for api in sorted(by_api, key=api_sort_key):
            pts = by_api[api].cdf()
            pts = [(pts[0][0], 0.0)] + pts
            ax1.step([max(1, x) / 1e3 for x, _ in pts], [y for _, y in pts], where="post",
                     linestyle=styles[ri % len(styles)],
                     color=colors[all_apis.index(api) % len(colors)], label="%s - %s" % (api, name))
        for kname, actions, marker in kinds:
            xs, ys, lo, hi = [], [], [], []
            for c in classes_used:
                a = Agg()
                for l in logs:
                    for key, g in l.groups.items():
                        if key[2] == c and key[1] in actions and not key[3]:
                            a.merge(g)
                if a.n:
                    med = max(1, a.median()) / 1e3
                    xs.append(xpos[c] + (k - (nseries - 1) / 2) * 0.12)
                    ys.append(med)
                    lo.append(med - max(1, a.percentile(0.1)) / 1e3)
                    hi.append(max(1, a.percentile(0.9)) / 1e3 - med)
            if xs:
                ax2.errorbar(xs, ys, yerr=[lo, hi], fmt=marker, capsize=3,
                             fillstyle="full" if kname == "hit" else "none",
                             color=colors[k % len(colors)], label="%s - %s" % (kname, name))
            k += 1
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (us)")
    ax1.set_ylabel("fraction of calls")
    ax1.set_title("latency CDF per API")
    ax1.grid(True, which="both", alpha=0.3)
    ax2.set_yscale("log")
    ax2.set_xticks(range(len(classes_used)))
    ax2.set_xticklabels(classes_used)
    ax2.set_xlim(-0.6, max(0.6, len(classes_used) - 0.4))
    ax2.set_xlabel("register size (up to)")
    ax2.set_ylabel("latency (us), median and p10-p90")
    ax2.set_title("register latency by size: hits and driver registers")
    ax2.grid(True, which="both", alpha=0.3)
    fig.suptitle(plot_title([(n, d) for n, d, _ in named]))
    for ax in (ax1, ax2):
        h, lab = ax.get_legend_handles_labels()
        if h:
            ax.legend(h, lab, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                      ncol=1 if len(h) > 4 else 1, frameon=False)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as e:
        return "%s: %s" % (path, e.strerror or e)
    finally:
        plt.close(fig)
    return None


# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Report on lazypin logs: per-process rows (by host), per-API and per-size "
                    "latency, the pool and what it saved, advice on what to set, call sites, "
                    "the slowest calls, errors and warnings.",
        epilog="LOG may be a file, a glob or a directory (all *.jsonl inside); several "
               "logs (one per process of a job, from any number of hosts) are reported "
               "together. Put LOG... before --compare. With --compare and one run bare "
               "(log mode), the saving is the measured difference. "
               "--plot runs the report under another python3 that has matplotlib when this "
               "one lacks it (LAZYPIN_REPORT_PYTHON names it). "
               "Exit status: 0 report printed, 1 report printed but no plot written, "
               "2 bad usage or unusable log.")
    p.add_argument("logs", nargs="+", metavar="LOG", help="log file, glob or directory")
    p.add_argument("--compare", nargs="+", metavar="OTHER",
                   help="compare with another run (e.g. log mode as LOG, defer mode as OTHER)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="latency CDF per API and latency by size (needs matplotlib)")
    p.add_argument("--force", action="store_true",
                   help="with --compare: compare runs of different programs or arguments")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="how many of the slowest calls to list (default 10, 0: none)")
    return p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    plot_tried = []
    if args.plot and not os.environ.get("LAZYPIN_REPORT_NO_MATPLOTLIB") and import_pyplot() is None:
        python, plot_tried = python_with_matplotlib()
        if python is not None:  # the whole report, there (the same output, and the plot)
            sys.stdout.flush()
            sys.stderr.flush()
            env = dict(os.environ)
            env[PLOT_PYTHON] = python
            os.execve(python, [python, os.path.abspath(__file__)] + argv, env)
    if args.top < 0:
        print("%s: --top must be 0 or more" % PROG, file=sys.stderr)
        return 2
    try:
        logs = load(args.logs, args.top)
        other_logs = load(args.compare, args.top) if args.compare else None
    except ReportError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    doc = analyze(logs, args.top)
    other = analyze(other_logs, args.top) if other_logs else None
    cmp = None
    if other is not None:
        diff = run_differences(doc, other)
        if diff and not args.force:
            print("%s: --compare needs runs of the same program with the same arguments; %s "
                  "(--force compares them anyway)" % (PROG, "; ".join(diff)), file=sys.stderr)
            return 2
        cmp = compare(doc, other)
        cmp["differences"] = diff

    plot_msg = None
    if args.plot:
        runs = [(None, logs)] + ([(None, other_logs)] if other_logs else [])
        plot_msg = plot(runs, args.plot)

    out = sys.stdout
    try:
        if args.json:
            if other is not None:
                payload = {"lazypin_report": JSON_SCHEMA, "baseline": doc, "other": other,
                           "comparison": cmp}
            else:
                payload = doc
            json.dump(payload, out, indent=2, sort_keys=False)
            out.write("\n")
        elif other is not None:
            out.write(render_compare(doc, other, cmp))
        else:
            out.write(render_text(doc, args.top))
        out.flush()
    except BrokenPipeError:
        # `lazypin report x | head`: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    if args.plot:
        if plot_msg == PLOT_HINT and not os.environ.get("LAZYPIN_REPORT_NO_MATPLOTLIB"):
            plot_msg = plot_missing_message(plot_tried)
        if plot_msg:
            print("%s: no plot written: %s" % (PROG, plot_msg), file=sys.stderr)
            return 1
        print("%s: plot written to %s" % (PROG, args.plot), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
