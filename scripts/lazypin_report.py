#!/usr/bin/env python3
"""lazypin report: read lazypin logs (JSON Lines, docs/log-format.md) and print
what the program's host-memory registration calls cost.

    lazypin report LOG... [--compare OTHER...] [--plot FILE.png] [--json] [--top N]

Standard library only; matplotlib is imported lazily, for --plot alone.
Exit status: 0 report printed (with warnings, if any); 2 bad usage or unusable input.
"""

import argparse
import datetime
import glob
import json
import math
import os
import sys

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

RESULT_NAMES = {0: "success", 1: "invalid value", 2: "out of memory",
                201: "invalid context", 712: "host memory already registered",
                713: "host memory not registered"}

EVICT_REASONS = ("lru", "idle", "overlap", "make_room", "query", "free", "realloc",
                 "munmap", "mremap", "mmap_fixed", "madvise", "brk", "shmdt",
                 "shmat", "context", "pfn", "exit")

STAT_KEYS = ("calls", "errors", "bytes", "total_ns",
             "p50_ns", "p90_ns", "p99_ns", "max_ns")


class ReportError(Exception):
    """Unusable input: the message is printed after 'lazypin report: ', exit 2."""


# --------------------------------------------------------------------------
# small helpers

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
    """Nearest-rank percentile: the smallest value with at least p% of the
    values at or below it. Exact, and always one of the recorded values."""
    if not sorted_vals:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[min(rank, len(sorted_vals)) - 1]


def median(vals):
    return percentile(sorted(vals), 50) if vals else None


def as_int(v, default=0):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return default


def stats(records, nbytes=True):
    """calls/errors/bytes/total/percentiles of a list of call or evict records."""
    lat = sorted(as_int(r.get("latency_ns")) for r in records)
    out = {
        "calls": len(records),
        "errors": sum(1 for r in records if as_int(r.get("result")) != 0),
        "bytes": sum(as_int(r.get("bytes")) for r in records) if nbytes else 0,
        "total_ns": sum(lat),
        "p50_ns": percentile(lat, 50),
        "p90_ns": percentile(lat, 90),
        "p99_ns": percentile(lat, 99),
        "max_ns": lat[-1] if lat else None,
    }
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
# reading logs

class Log:
    def __init__(self, path):
        self.path = path
        self.header = None
        self.calls = []
        self.evicts = []
        self.warnings = []          # warning records written by the shim
        self.summary = None
        self.reader_warnings = []   # what this tool found wrong with the file
        self.cut = False
        self.records = 0

    @property
    def pid(self):
        if self.header and "pid" in self.header:
            return as_int(self.header.get("pid"), None)
        return None


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


def read_log(path, explicit=True):
    """Parse one log. Returns a Log, or None for an empty file found through
    a directory or glob (skipped). Raises ReportError for unusable files."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ReportError("%s: no such file" % path)
    except IsADirectoryError:
        raise ReportError("%s: is a directory" % path)
    except OSError as e:
        raise ReportError("%s: %s" % (path, e.strerror or e))
    text = data.decode("utf-8", errors="replace")
    # a crashed writer can leave NUL padding (preallocated or mapped files)
    text = text.rstrip("\0")
    if not text.strip():
        if explicit:
            raise ReportError("%s: empty log (no records: the program made no "
                              "registration call, or the log was never written)" % path)
        return None
    log = Log(path)
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines.pop()  # the empty string after the final newline
    skipped = 0
    first_skipped = None
    for i, line in enumerate(lines):
        last = i == len(lines) - 1
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
                raise ValueError("not a record")
        except ValueError:
            if last and not ends_with_newline:
                log.cut = True
                log.reader_warnings.append(
                    "log was cut: %s ends with an incomplete record "
                    "(the process may have crashed)" % path)
            else:
                skipped += 1
                if first_skipped is None:
                    first_skipped = i + 1
            continue
        log.records += 1
        kind = rec["type"]
        if kind == "header":
            if log.header is not None:
                log.reader_warnings.append(
                    "%s: a second header at line %d was ignored" % (path, i + 1))
                continue
            fmt = rec.get("format")
            if isinstance(fmt, (int, float)) and not isinstance(fmt, bool) and fmt > LOG_FORMAT:
                raise ReportError("%s: log format %s is newer than this report tool "
                                  "understands (%d)" % (path, fmt if fmt != int(fmt) else int(fmt),
                                                         LOG_FORMAT))
            if not isinstance(fmt, int) or isinstance(fmt, bool):
                log.reader_warnings.append(
                    "%s: header has no valid \"format\"; reading it as format %d"
                    % (path, LOG_FORMAT))
            if log.calls or log.evicts or log.warnings:
                log.reader_warnings.append(
                    "%s: the header is not the first record (line %d)" % (path, i + 1))
            log.header = rec
        elif kind == "call":
            log.calls.append(rec)
        elif kind == "evict":
            log.evicts.append(rec)
        elif kind == "warning":
            log.warnings.append(rec)
        elif kind == "summary":
            log.summary = rec
        # other types: ignored (newer writers may add some)
    if skipped:
        log.reader_warnings.append(
            "%s: skipped %d unreadable line%s (first at line %d)"
            % (path, skipped, "" if skipped == 1 else "s", first_skipped))
    if log.records == 0:
        raise ReportError("%s: no lazypin records in this file" % path)
    if log.header is None:
        log.reader_warnings.append(
            "%s: no header record (the start of the log is missing); "
            "reporting the records found" % path)
    if log.summary is None and not log.cut:
        log.reader_warnings.append(
            "%s: no summary record: the process did not exit normally "
            "(or is still running)" % path)
    if log.summary is not None:
        dropped = as_int(log.summary.get("records_dropped"))
        if dropped:
            log.reader_warnings.append(
                "%s: the shim dropped %d record%s (the log writer fell behind); "
                "figures from call records undercount"
                % (path, dropped, "" if dropped == 1 else "s"))
        else:
            apis = log.summary.get("apis")
            if isinstance(apis, dict):
                counted = {}
                for c in log.calls:
                    a = str(c.get("api"))
                    counted[a] = counted.get(a, 0) + 1
                for api, s in sorted(apis.items()):
                    if isinstance(s, dict) and "calls" in s and as_int(s["calls"]) != counted.get(api, 0):
                        log.reader_warnings.append(
                            "%s: the summary counts %d %s calls, the log holds %d call records"
                            % (path, as_int(s["calls"]), api, counted.get(api, 0)))
    return log


def load(args):
    logs = []
    skipped = []
    for path, explicit in expand_inputs(args):
        log = read_log(path, explicit)
        if log is None:
            skipped.append(path)
        else:
            logs.append(log)
    if not logs:
        raise ReportError("%s: empty log%s (no records)"
                          % (", ".join(skipped) or " ".join(args),
                             "" if len(skipped) == 1 else "s"))
    for path in skipped:
        logs[0].reader_warnings.append("%s: empty log, skipped" % path)
    return logs


# --------------------------------------------------------------------------
# analysis: everything the text, JSON and plot outputs show

def process_info(log):
    h = log.header or {}
    s = log.summary or {}
    pool = s.get("pool") if isinstance(s.get("pool"), dict) else {}
    return {
        "file": log.path,
        "pid": log.pid,
        "exe": h.get("exe"),
        "argv": h.get("argv") if isinstance(h.get("argv"), list) else None,
        "mode": h.get("mode") or (h.get("config") or {}).get("mode"),
        "lazypin": h.get("lazypin"),
        "format": h.get("format"),
        "config": h.get("config") if isinstance(h.get("config"), dict) else None,
        "driver_version": as_int(h.get("driver_version"), None) if "driver_version" in h else None,
        "start_unix_ns": as_int(h.get("start_unix_ns"), None) if "start_unix_ns" in h else None,
        "start_time": iso_start(as_int(h.get("start_unix_ns"), 0)),
        "records": log.records,
        "calls": len(log.calls),
        "has_header": log.header is not None,
        "has_summary": log.summary is not None,
        "ended_by": s.get("ended_by") if log.summary is not None else None,
        "duration_ns": as_int(s.get("t_ns"), None) if log.summary is not None else None,
        "cut": log.cut,
        "pool_peak_bytes": as_int(pool.get("peak_bytes"), None) if "peak_bytes" in pool else None,
        "pool_peak_entries": as_int(pool.get("peak_entries"), None) if "peak_entries" in pool else None,
    }


def saved_from_records(calls, evicts):
    """Estimate of the time the pool saved, from the records alone:
    each hit saves a driver register of its size class (median of the real
    registers in the log) minus what the hit took; each deferred unregister
    saves a real unregister (median of real unregisters and evictions) minus
    what it took; every eviction pays one real unregister back."""
    reg_by_class = {}
    reg_all = []
    unreg = []
    for c in calls:
        api = str(c.get("api", ""))
        if as_int(c.get("result")) != 0 or c.get("action") not in ("miss", "forward"):
            continue
        if is_register(api):
            lat = as_int(c.get("latency_ns"))
            reg_by_class.setdefault(size_class(as_int(c.get("bytes"))), []).append(lat)
            reg_all.append(lat)
        elif is_unregister(api):
            unreg.append(as_int(c.get("latency_ns")))
    unreg += [as_int(e.get("latency_ns")) for e in evicts if as_int(e.get("result")) == 0]
    reg_med = {k: median(v) for k, v in reg_by_class.items()}
    reg_all_med = median(reg_all)
    unreg_med = median(unreg)
    saved = 0
    for c in calls:
        action = c.get("action")
        lat = as_int(c.get("latency_ns"))
        if action == "hit":
            base = reg_med.get(size_class(as_int(c.get("bytes"))), reg_all_med)
            if base is not None:
                saved += max(0, base - lat)
        elif action == "deferred" and unreg_med is not None:
            saved += max(0, unreg_med - lat)
    saved -= sum(as_int(e.get("latency_ns")) for e in evicts)
    return saved


def analyze(logs, top=10):
    calls = [c for log in logs for c in log.calls]
    evicts = [e for log in logs for e in log.evicts]
    by_api = {}
    for c in calls:
        by_api.setdefault(str(c.get("api", "?")), []).append(c)
    apis = {api: stats(by_api[api]) for api in sorted(by_api, key=api_sort_key)}
    for api, s in apis.items():
        if is_unregister(api):
            s["bytes"] = 0

    regs = [c for c in calls if is_register(str(c.get("api", "")))]
    by_class = {}
    for c in regs:
        by_class.setdefault(size_class(as_int(c.get("bytes"))), []).append(c)
    size_classes = {name: stats(by_class[name]) for name, _ in SIZE_CLASSES if name in by_class}

    totals = stats(calls)
    totals["register_calls"] = len(regs)
    totals["unregister_calls"] = sum(1 for c in calls if is_unregister(str(c.get("api", ""))))

    # pool
    actions = {}
    for c in calls:
        a = str(c.get("action", "?"))
        actions[a] = actions.get(a, 0) + 1
    hits = actions.get("hit", 0)
    misses = actions.get("miss", 0)
    deferred = actions.get("deferred", 0)
    ev_by_reason = {}
    for e in evicts:
        ev_by_reason.setdefault(str(e.get("reason", "?")), []).append(e)
    order = {r: i for i, r in enumerate(EVICT_REASONS)}
    evictions = {r: stats(ev_by_reason[r])
                 for r in sorted(ev_by_reason, key=lambda r: (order.get(r, len(order)), r))}
    summaries = [log.summary for log in logs if log.summary is not None]
    spools = [s.get("pool") for s in summaries if isinstance(s.get("pool"), dict)]
    all_summarized = bool(logs) and len(spools) == len(logs)

    def ssum(key):
        vals = [p[key] for p in spools if isinstance(p.get(key), (int, float))]
        return int(sum(vals)) if vals else None

    summary_evictions = None
    if spools:
        summary_evictions = {}
        for p in spools:
            for r, n in (p.get("evictions") or {}).items():
                summary_evictions[r] = summary_evictions.get(r, 0) + as_int(n)
    saved_records = saved_from_records(calls, evicts)
    saved_summary = ssum("saved_ns_est") if all_summarized else None
    pool_used = bool(hits or misses or deferred or evicts)
    pool = {
        "active": pool_used,
        "hits": hits,
        "misses": misses,
        "hit_rate": (hits / (hits + misses)) if (hits + misses) else None,
        "deferred": deferred,
        "forwarded": actions.get("forward", 0),
        "passthrough": actions.get("passthrough", 0),
        "evicted_in_calls": sum(as_int(c.get("evicted")) for c in calls),
        "evictions": evictions,
        "evictions_total": len(evicts),
        "summary_evictions": summary_evictions,
        "pool_summaries": len(spools),
        "peak_bytes": ssum("peak_bytes"),
        "peak_entries": ssum("peak_entries"),
        "pooled_bytes_at_exit": ssum("pooled_bytes"),
        "pooled_entries_at_exit": ssum("pooled_entries"),
        "saved_ns_est": saved_summary if saved_summary is not None else saved_records,
        "saved_ns_source": "summary" if saved_summary is not None else "records",
        "saved_ns_records": saved_records,
        "saved_ns_summary": saved_summary,
    }

    # slowest calls (program calls and evictions, both stall the program)
    rows = []
    for log in logs:
        for c in log.calls:
            rows.append({"pid": log.pid, "t_ns": as_int(c.get("t_ns")), "tid": c.get("tid"),
                         "record": "call", "api": str(c.get("api", "?")),
                         "ptr": c.get("ptr"), "bytes": as_int(c.get("bytes")),
                         "result": as_int(c.get("result")),
                         "action": c.get("action"), "latency_ns": as_int(c.get("latency_ns"))})
        for e in log.evicts:
            rows.append({"pid": log.pid, "t_ns": as_int(e.get("t_ns")), "tid": e.get("tid"),
                         "record": "evict", "api": "evict", "ptr": e.get("ptr"),
                         "bytes": as_int(e.get("bytes")), "result": as_int(e.get("result")),
                         "action": e.get("reason"), "latency_ns": as_int(e.get("latency_ns"))})
    rows.sort(key=lambda r: (-r["latency_ns"], r["t_ns"]))
    slowest = rows[:max(0, top)]

    # errors by result code
    errs = {}
    for c in calls:
        code = as_int(c.get("result"))
        if code == 0:
            continue
        e = errs.setdefault(code, {"code": code, "name": result_name(code), "count": 0, "apis": {}})
        e["count"] += 1
        api = str(c.get("api", "?"))
        e["apis"][api] = e["apis"].get(api, 0) + 1
    errors = [errs[k] for k in sorted(errs)]
    evict_errors = sum(1 for e in evicts if as_int(e.get("result")) != 0)

    warnings = []
    for log in logs:
        for w in log.warnings:
            warnings.append({"source": "log", "file": log.path, "pid": log.pid,
                             "t_ns": as_int(w.get("t_ns"), None) if "t_ns" in w else None,
                             "message": str(w.get("message", ""))})
        for m in log.reader_warnings:
            warnings.append({"source": "report", "file": log.path, "pid": log.pid,
                             "t_ns": None, "message": m})
        n = sum(1 for c in log.calls if c.get("action") == "passthrough")
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
        "processes": [process_info(log) for log in logs],
        "totals": totals,
        "apis": apis,
        "size_classes": size_classes,
        "pool": pool,
        "slowest": slowest,
        "errors": errors,
        "warnings": warnings,
    }


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
    return {"apis": out,
            "total_ns": {"baseline": tb, "other": to, "ratio": ratio(tb, to)}}


# --------------------------------------------------------------------------
# text output

def pool_verdict(pool, mode=None):
    if not pool["active"]:
        if pool["passthrough"] and not pool["forwarded"]:
            return "pool: off (lazypin passed every call through)"
        return "pool: not used (mode %s)" % (mode or "log")
    regs = pool["hits"] + pool["misses"]
    saved = pool["saved_ns_est"]
    if saved is None:
        tail = ""
    elif saved >= 0:
        tail = ", saved ~%s" % fmt_ns(saved)
    else:
        tail = ", cost ~%s more than it saved" % fmt_ns(-saved)
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
    import shlex
    return " ".join(shlex.quote(str(a)) for a in argv)


def run_mode(doc):
    modes = sorted({p["mode"] for p in doc["processes"] if p["mode"]})
    return "/".join(modes) if modes else None


def render_run(doc, lines):
    procs = doc["processes"]
    if len(procs) == 1:
        p = procs[0]
        lines.append("== run")
        rows = [("log", p["file"]),
                ("program", p["exe"] or "-"),
                ("argv", fmt_argv(p["argv"])),
                ("pid", p["pid"] if p["pid"] is not None else "-"),
                ("mode", p["mode"] or "-"),
                ("config", fmt_config(p["config"])),
                ("driver", fmt_driver(p["driver_version"]) if p["driver_version"] is not None else "unknown"),
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
    lines.append("== run (%d processes)" % len(procs))
    rows = []
    for p in procs:
        rows.append([p["pid"] if p["pid"] is not None else "-",
                     os.path.basename(p["exe"]) if p["exe"] else "-",
                     p["mode"] or "-",
                     fmt_driver(p["driver_version"]).split(" ")[0] if p["driver_version"] is not None else "unknown",
                     fmt_start(p["start_unix_ns"]),
                     p["calls"],
                     (p["ended_by"] or "-") if p["has_summary"] else ("cut" if p["cut"] else "no summary"),
                     p["file"]])
    lines += table(["pid", "program", "mode", "driver", "started", "calls", "ended", "log"],
                   rows, left=(1, 2, 4, 6, 7))
    for p in procs:
        lines.append("  argv[%s]  %s" % (p["pid"], fmt_argv(p["argv"])))
    cfgs = {json.dumps(p["config"], sort_keys=True) for p in procs}
    if len(cfgs) == 1:
        lines.append("  config    %s" % fmt_config(procs[0]["config"]))
    else:
        for p in procs:
            lines.append("  config[%s]  %s" % (p["pid"], fmt_config(p["config"])))


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
        if pool["saved_ns_summary"] is not None:
            L.append("  time saved, estimated: %s by the shim, %s from the records"
                     % (fmt_ns(pool["saved_ns_summary"]), fmt_ns(pool["saved_ns_records"])))
        else:
            L.append("  time saved, estimated from the records: %s" % fmt_ns(pool["saved_ns_records"]))
        L.append("  evicted inside program calls (overlap, make room): %d" % pool["evicted_in_calls"])
        if pool["evictions"]:
            L.append("  evictions outside program calls: %d" % pool["evictions_total"])
            rows = [[r, s["calls"], s["errors"], fmt_bytes(s["bytes"]) if s["bytes"] else "-",
                     fmt_ns(s["total_ns"]), fmt_ns(s["p50_ns"]), fmt_ns(s["p90_ns"]),
                     fmt_ns(s["p99_ns"]), fmt_ns(s["max_ns"])]
                    for r, s in pool["evictions"].items()]
            L += table(["reason", "count", "errors", "bytes", "total", "p50", "p90", "p99", "max"],
                       rows, indent="    ")
        else:
            L.append("  evictions outside program calls: none")

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


def render_compare(base, other, cmp):
    L = []
    for label, doc in (("A (baseline)", base), ("B (other)", other)):
        procs = doc["processes"]
        prog = ", ".join(sorted({os.path.basename(p["exe"]) for p in procs if p["exe"]})) or "-"
        pids = ", ".join(str(p["pid"]) for p in procs if p["pid"] is not None) or "-"
        L.append("%-12s  %s  (mode %s, pid %s; %s)" % (label, prog, run_mode(doc) or "-", pids,
                                                       ", ".join(doc["files"])))
        L.append("              " + pool_verdict(doc["pool"], run_mode(doc)))
    L.append("")
    L.append("== A vs B (A/B: ratio baseline / other; above 1: B is faster)")
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
    L.append("  time in registration calls: baseline %s, other %s, ratio %s"
             % (fmt_ns(t["baseline"]), fmt_ns(t["other"]), fmt_ratio(t["ratio"])))
    warn = [(label, w) for label, d in (("A", base), ("B", other)) for w in d["warnings"]]
    if warn:
        L.append("")
        L.append("== warnings")
        for label, w in warn:
            L.append("  [%s] %s" % (label, w["message"]))
    return "\n".join(L) + "\n"


def brief_summary(paths):
    """The few lines that `lazypin run` prints at the end."""
    logs = load(paths)
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
    n = len(doc["warnings"])
    if n:
        L.append("  %d warning%s: see `lazypin report`" % (n, "" if n == 1 else "s"))
    return "\n".join(L)


# --------------------------------------------------------------------------
# plot

PLOT_HINT = ("--plot needs matplotlib (pip install matplotlib, "
             "or apt-get install python3-matplotlib)")


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


def plot(runs, path):
    """runs: [(label, logs)]. Left: latency CDF per API (log x). Right:
    latency against size for register calls (log-log). Returns an error
    message or None."""
    plt = import_pyplot()
    if plt is None:
        return PLOT_HINT
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    styles = ("-", "--", ":", "-.")
    colors = [c.get("color") for c in plt.rcParams["axes.prop_cycle"]] or [None]
    all_apis = sorted({str(c.get("api", "?")) for _, logs in runs for log in logs for c in log.calls},
                      key=api_sort_key)
    for i, (label, logs) in enumerate(runs):
        by_api = {}
        for log in logs:
            for c in log.calls:
                by_api.setdefault(str(c.get("api", "?")), []).append(max(1, as_int(c.get("latency_ns"))))
        for api in sorted(by_api, key=api_sort_key):
            v = sorted(by_api[api])
            y = [(k + 1) / len(v) for k in range(len(v))]
            name = api if len(runs) == 1 else "%s (%s)" % (api, label)
            ax1.step([x / 1e3 for x in v], y, where="post", linestyle=styles[i % len(styles)],
                     color=colors[all_apis.index(api) % len(colors)], label=name)
        xs, ys, cs = [], [], []
        for log in logs:
            for c in log.calls:
                if is_register(str(c.get("api", ""))) and as_int(c.get("bytes")) > 0:
                    xs.append(as_int(c.get("bytes")))
                    ys.append(max(1, as_int(c.get("latency_ns"))) / 1e3)
        if xs:
            ax2.scatter(xs, ys, s=10, alpha=0.6, marker="o" if i == 0 else "x",
                        label="register" if len(runs) == 1 else "register (%s)" % label)
    ax1.set_xscale("log")
    ax1.set_xlabel("latency (us)")
    ax1.set_ylabel("fraction of calls")
    ax1.set_title("latency CDF per API")
    ax1.grid(True, which="both", alpha=0.3)
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(fontsize=8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("bytes")
    ax2.set_ylabel("latency (us)")
    ax2.set_title("register latency vs size")
    ax2.grid(True, which="both", alpha=0.3)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        return "%s: %s" % (path, e.strerror or e)
    finally:
        plt.close(fig)
    return None


# --------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Report on lazypin logs: per-API and per-size latency, the pool, "
                    "the slowest calls, errors and warnings.",
        epilog="LOG may be a file, a glob or a directory (all *.jsonl inside); several "
               "logs (one per process of a job) are added up. Put LOG... before --compare. "
               "Exit status: 0 report printed, 2 bad usage or unusable log.")
    p.add_argument("logs", nargs="+", metavar="LOG", help="log file, glob or directory")
    p.add_argument("--compare", nargs="+", metavar="OTHER",
                   help="compare with another run (e.g. log mode as LOG, defer mode as OTHER)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="latency CDF per API and latency vs size (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="how many of the slowest calls to list (default 10, 0: none)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.top < 0:
        print("%s: --top must be 0 or more" % PROG, file=sys.stderr)
        return 2
    try:
        logs = load(args.logs)
        other_logs = load(args.compare) if args.compare else None
    except ReportError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    doc = analyze(logs, args.top)
    other = analyze(other_logs, args.top) if other_logs else None

    plot_msg = None
    if args.plot:
        runs = [("baseline", logs)] + ([("other", other_logs)] if other_logs else [])
        plot_msg = plot(runs, args.plot)

    out = sys.stdout
    try:
        if args.json:
            if other is not None:
                payload = {"lazypin_report": JSON_SCHEMA, "baseline": doc, "other": other,
                           "comparison": compare(doc, other)}
            else:
                payload = doc
            json.dump(payload, out, indent=2, sort_keys=False)
            out.write("\n")
        elif other is not None:
            out.write(render_compare(doc, other, compare(doc, other)))
        else:
            out.write(render_text(doc, args.top))
        out.flush()
    except BrokenPipeError:
        # `lazypin report x | head`: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    if args.plot:
        if plot_msg:
            print("%s: %s" % (PROG, plot_msg), file=sys.stderr)
        else:
            print("%s: plot written to %s" % (PROG, args.plot), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
