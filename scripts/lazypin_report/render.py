"""The text report of one run (render_text) and of a comparison (render_compare)."""

import json
import os
import shlex

from .base import NO_DRIVER_CODES, NO_DRIVER_HINT, api_sort_key, result_name, size_class_label
from .bigpins import render_big_pins
from .fmt import fmt_bytes, fmt_driver, fmt_ns, fmt_pct, fmt_ratio, fmt_start, table


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


# The configuration's sizes (the option table's "a size ..." rows), shown in units.
CONFIG_SIZES = ("log_max", "pool_bytes", "host_alloc_cache", "autopin_min", "autopin_bytes",
                "reuse_freed", "keep_margin")


def fmt_config(cfg):
    if not cfg:
        return "-"
    parts = []
    for k, v in cfg.items():
        if k == "mode":
            continue
        if isinstance(v, bool):
            v = "yes" if v else "no"
        elif (k in CONFIG_SIZES or k.endswith("_bytes")) and isinstance(v, int):
            v = fmt_bytes(v)
        parts.append("%s=%s" % (k, v))
    return " ".join(parts) or "-"


def fmt_argv(argv):
    if not argv:
        return "-"
    return " ".join(shlex.quote(str(a)) for a in argv)


# Opt-in features a defer-mode run is labelled with: (config key, its value
# when on, label).
RUN_FEATURES = (("autopin", True, "autopin"), ("unregister_wait", False, "no-wait"),
                ("defer_shared", True, "shared"))


def run_mode(doc):
    """A run's mode and the features it ran with: "log", "defer",
    "defer+autopin" (from the logs' configuration; auto-pin also where it
    pinned, for logs without one)."""
    modes = sorted({p["mode"] for p in doc["processes"] if p["mode"]})
    if not modes:
        return None
    feats = []
    for key, on, label in RUN_FEATURES:
        if any(p["mode"] == "defer" and (p["config"] or {}).get(key) is on for p in doc["processes"]):
            feats.append(label)
    if "autopin" not in feats and (doc.get("autopin") or {}).get("pins"):
        feats.insert(0, "autopin")
    return "+".join(["/".join(modes)] + feats)


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


def entries_bound(doc):
    """LAZYPIN_POOL_ENTRIES of a one-process run (None: several, or unknown)."""
    procs = doc["processes"]
    if len(procs) != 1:
        return None
    v = (procs[0]["config"] or {}).get("pool_entries")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


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
            saved = ", %s saved~" % fmt_ns(e["saved_ns"]) if e["saved_ns"] or e["hits"] else ""
            L.append("  #%d  %s spent%s  %d calls (%d hits, %d to the driver)%s"
                     % (i + 1, fmt_ns(e["time_ns"]), saved, e["calls"], e["hits"],
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
            L.append("  peak pooled %s in %s entr%s%s; still pooled at exit %s in %s entr%s"
                     % (fmt_bytes(pool["peak_bytes"]), pool["peak_entries"],
                        "y" if pool["peak_entries"] == 1 else "ies", over,
                        fmt_bytes(pool["pooled_bytes_at_exit"]), pool["pooled_entries_at_exit"],
                        "y" if pool["pooled_entries_at_exit"] == 1 else "ies"))
            bound = entries_bound(doc)
            if bound is not None and pool["peak_entries"] is not None and pool["peak_entries"] > bound:
                L.append("  (the peak counts the entry a deferred unregister adds before the LRU "
                         "eviction it sets off: the bound, LAZYPIN_POOL_ENTRIES=%d, holds between calls)"
                         % bound)
        else:
            L.append("  peak pooled: unknown (no summary record)")
        sv = pool["saving"]
        L.append("  how: " + sv["method"])
        L.append("  time in registration work: %s (calls %s, evictions %s, those inside calls counted once)"
                 % (fmt_ns(sv["measured_ns"]), fmt_ns(sv["calls_ns"]), fmt_ns(sv["evictions_ns"])))
        if pool["evictions"]:
            L.append("  evictions: %d (evict records), %d of them made inside program calls (overlap, "
                     "make room), the others outside any" % (pool["evictions_total"], pool["evicted_in_calls"]))
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
            L.append("  evictions: none")

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
    render_big_pins(doc.get("big_pins") or {"calls": 0}, L)
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
        L.append("  " + ap["method"])
        if ap["apis"]:
            L.append("  by copy: " + ", ".join("%s %d" % kv for kv in sorted(ap["apis"].items())))

    render_advice(doc, L)
    render_sites(doc, L, min(top, 5) if top else 0)

    if top > 0 and doc["slowest"]:
        L.append("")
        ends = [p["records_end_ns"] for p in doc["processes"] if p.get("records_end_ns") is not None]
        L.append("== slowest %d%s" % (len(doc["slowest"]), "" if not ends else
                 " (of the calls logged one by one, up to t=%.3f s where the log's bound, "
                 "LAZYPIN_LOG_MAX, ended them; the max columns above count the whole run)"
                 % (max(ends) / 1e9)))
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
        if any(e["code"] in NO_DRIVER_CODES for e in doc["errors"]):
            L.append("  " + NO_DRIVER_HINT)
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
        if s["measured"]:
            L.append("  the pool (%s) %s %s, measured: bare %s - pooled %s (calls and evictions)%s"
                     % (who, word, fmt_ns(abs(s["saved_ns"])), fmt_ns(s["bare_ns"]), fmt_ns(s["pooled_ns"]),
                        "; bare scaled per API to the pooled run's call count" if s["scaled"] else ""))
        else:
            L.append("  registration time: bare %s, pooled (%s) %s, a difference of %s%s; not a measured "
                     "saving: the runs differ (--force)"
                     % (fmt_ns(s["bare_ns"]), who, fmt_ns(s["pooled_ns"]),
                        ("-" if s["saved_ns"] < 0 else "") + fmt_ns(abs(s["saved_ns"])),
                        " (bare scaled per API to the pooled run's call count)" if s["scaled"] else ""))
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
