"""The short report `lazypin run` prints after the program: from the logs'
summary records when the logs are large."""

import json
import os

from .base import NO_DRIVER_CODES, NO_DRIVER_HINT, api_sort_key, as_int
from .fmt import fmt_ns, fmt_pct, table
from .read import load
from .aggregate import analyze
from .savings import saving_from_summary, saving_text, saving_total
from .render import pool_verdict


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
        sv = saving_from_summary(pool.get("saving"))
        if sv is not None:
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


def brief_summary(paths, read_limit=None):
    """The few lines that `lazypin run` prints at the end: from the logs, or,
    past `read_limit` (BRIEF_READ_LIMIT) bytes of them, from the shim's
    summaries alone (so that the run returns at once after a long job)."""
    try:
        size = sum(os.path.getsize(p) for p in paths)
    except OSError:
        size = 0
    unsummarized = 0
    if size > (BRIEF_READ_LIMIT if read_limit is None else read_limit):
        unsummarized = sum(1 for p in paths if not isinstance((last_summary(p) or {}).get("apis"), dict))
        if not unsummarized:
            return brief_from_summaries(paths)
        # a log ended by a signal has no full summary: all are read (as the report would)
    logs = load(paths, top=0, lenient=True)
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
    L += no_driver_lines(doc)
    if unsummarized:
        L.append("  (%d log%s without a full summary (ended by a signal): read from the records)"
                 % (unsummarized, "" if unsummarized == 1 else "s"))
    return "\n".join(L)


def no_driver_lines(doc):
    """The line naming --sim when calls failed for want of a CUDA driver."""
    bad = [e for e in doc["errors"] if e["code"] in NO_DRIVER_CODES]
    if not bad:
        return []
    n = sum(e["count"] for e in bad)
    return ["  %d call%s failed with %s: %s" % (n, "" if n == 1 else "s", ", ".join(
        "%d (%s)" % (e["code"], e["name"]) for e in bad), NO_DRIVER_HINT)]
