"""The analysis: logs -> one document (analyze), everything the text, JSON
and plot outputs show."""

from .base import Agg, EVICT_REASONS, JSON_SCHEMA, SIZE_CLASS_NAMES, api_sort_key, as_int, is_unregister, result_name
from .read import process_info
from .savings import autopin_run_saving, pool_saving
from .callsites import call_sites
from .advice import advise
from .bigpins import big_pins_summary

def analyze(logs, top=10, borrowed=None):
    """`borrowed`: prices for what the logs' own calls cannot price (savings.pool_saving)."""
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
    sv, per_log = pool_saving(logs, borrowed)
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
        "saved_ns_source": "borrowed" if sv["borrowed"] else "records",
        "saved_ns_records": sv["saved_ns"] if sv["estimable"] else None,
        # the shim's own figures (its summary records' pool.saving), summed
        "saved_ns_summary": summary_saving(spools),
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
        "big_pins": big_pins_summary(logs, procs, top),
        "advice": advise(logs, procs, pool),
        "call_sites": call_sites(logs),
        "slowest": slowest,
        "errors": errors,
        "warnings": warnings,
    }


def summary_saving(spools):
    """The summaries' pool.saving.saved_ns summed (None: no summary has one)."""
    vals = [as_int(p["saving"].get("saved_ns")) for p in spools
            if isinstance(p.get("saving"), dict) and "saved_ns" in p["saving"]]
    return sum(vals) if vals else None


def devices_summary(logs):
    """Calls per device (logs of runs with several devices), as "0", "1", ..."""
    out = {}
    for log in logs:
        for dev, d in log.devices.items():
            o = out.setdefault(str(dev), {"calls": 0, "total_ns": 0})
            for k, v in d.items():
                o[k] = o.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def autopin_summary(logs):
    """What LAZYPIN_AUTOPIN did: from the autopin records and the summaries'
    pool.autopin; what it saved in copies, from savings.autopin_run_saving."""
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
    saved, text, per = autopin_run_saving(logs)
    out["saved_ns_est"] = saved
    out["method"] = text
    out["rates_measured"] = any(sv["measured"] for sv in per)
    out["processes"] = [{"saved_ns": sv["saved_ns"], "directions": sv["directions"]} for sv in per]
    return out
