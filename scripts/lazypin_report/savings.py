"""What lazypin saved: the one definition of every saving the report shows
(the pool's, the shim's Saving in shim/telemetry/stats.h, and auto-pin's)."""

import glob
import json
import math
import os

from . import prices as machine
from .base import Agg, SIZE_CLASS_NAMES, api_sort_key, as_int, is_unregister
from .fmt import fmt_bytes, fmt_ns


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


def log_prices(log, more=()):
    """What a call costs without the pool in this process, as the shim prices
    it: per size class the warm real registers (successful misses and forwards
    that evicted nothing, the process's first real register left out); for
    unregisters the successful real calls, else the successful evictions.
    `more`: other logs whose real calls count too (borrowed prices)."""
    a = _price_aggs(log, more)
    return {"reg": {c: _price(g) for c, g in a["reg"].items()},
            "unreg": _price(a["unreg"]) or _price(a["good_ev"])}


def own_price_aggs(log):
    """The real calls that price something in `log` (log_prices'), as Aggs:
    {"reg": {size class: Agg}, "unreg": Agg or None}; what the machine table
    records (prices.record)."""
    a = _price_aggs(log)
    unreg = a["unreg"] if _price(a["unreg"]) else (a["good_ev"] if _price(a["good_ev"]) else None)
    return {"reg": {c: g for c, g in a["reg"].items() if _price(g)}, "unreg": unreg}


def _price_aggs(log, more=()):
    reg = {}
    unreg = Agg()
    good_ev = Agg()
    for one in (log,) + tuple(more):
        for (api, action, sclass, err, warm, inev, reason, stack), g in one.groups.items():
            if err:
                continue
            if sclass is not None and warm:
                reg.setdefault(sclass, Agg()).merge(g)
            elif sclass is None and action in ("forward", "passthrough") and is_unregister(api):
                unreg.merge(g)
        for (reason, err, forced, stack), g in one.egroups.items():
            if not err:
                good_ev.merge(g)
    return {"reg": reg, "unreg": unreg, "good_ev": good_ev}


def borrowed_prices(logs, label):
    """Prices from other logs' real calls (the bare run of --compare, another
    log of the same program), for what a process's own calls cannot price:
    (prices, label), or None when they price nothing."""
    if not logs:
        return None
    prices = log_prices(logs[0], logs[1:])
    if prices["unreg"] is None and not any(prices["reg"].values()):
        return None
    return prices, label


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


def saving_of(log, borrowed=None):
    """What the pool saved in one process (see shim/telemetry/stats.h, Saving): priced
    hits and deferrals at this process's own real calls, net of their time and
    of evictions made inside them, minus every eviction's time. `borrowed`
    (borrowed_prices, or prices.machine_prices with its third element, the
    table's description): what prices the hits and deferrals that this
    process's own calls cannot; without it the figure is the shim's."""
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
           "borrowed": 0, "borrowed_calls": 0, "borrowed_from": None, "price_table": None,
           "processes": 1, "estimable": False}
    variance = 0.0
    for sclass in SIZE_CLASS_NAMES + (None,):
        n = hits.get(sclass, 0)
        kind = "deferred" if sclass is None else "hits"
        out[kind] += n
        p = prices["unreg"] if sclass is None else prices["reg"].get(sclass)
        if n and p is None and borrowed is not None:
            p = borrowed[0]["unreg"] if sclass is None else borrowed[0]["reg"].get(sclass)
            if p is not None:
                out["borrowed"] += n
                out["borrowed_calls"] += p[0]
                out["borrowed_from"] = borrowed[1]
                out["price_table"] = borrowed[2] if len(borrowed) > 2 else None
                out["price_calls"] -= p[0]   # counted apart, as the borrowed calls
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
                            or out["hits"] + out["deferred"] == 0)
    return out


def round_ns(v):
    """Round half away from zero, as the shim (RoundNs in shim/telemetry/stats.cc)."""
    return int(math.floor(v + 0.5)) if v >= 0 else -int(math.floor(-v + 0.5))


def idle(sv):
    """The pool did nothing (no hit, deferral or eviction): it saved exactly 0
    (the shim's Saving::Idle)."""
    return sv["hits"] + sv["deferred"] + sv["evictions"] == 0


def saving_total(savings):
    """Several processes' savings: the estimable ones' figures summed (spreads
    in quadrature), the others counted."""
    out = {"saved_ns": 0, "spread_ns": 0, "hits": 0, "hits_priced": 0, "deferred": 0,
           "deferred_priced": 0, "evictions": 0, "evictions_ns": 0, "price_calls": 0,
           "borrowed": 0, "borrowed_calls": 0, "borrowed_from": None, "price_table": None,
           "processes": 0, "not_estimable": 0, "estimable": False}
    var = 0.0
    sources = []
    for sv in savings:
        for k in ("hits", "hits_priced", "deferred", "deferred_priced",
                  "evictions", "evictions_ns", "price_calls", "processes",
                  "borrowed", "borrowed_calls"):
            out[k] += sv.get(k, 0)
        if sv.get("borrowed_from") and sv["borrowed_from"] not in sources:
            sources.append(sv["borrowed_from"])
        if sv.get("price_table") and (out["price_table"] is None
                                      or sv["price_table"]["runs"] > out["price_table"]["runs"]):
            out["price_table"] = sv["price_table"]
    out["borrowed_from"] = "; ".join(sources) or None
    for sv in savings:
        if idle(sv):
            continue
        if sv["estimable"]:
            out["saved_ns"] += sv["saved_ns"]
            var += float(sv["spread_ns"]) ** 2
            out["estimable"] = True
        else:
            out["not_estimable"] += 1
    if idle(out):
        out["estimable"] = True
    out["spread_ns"] = round_ns(math.sqrt(var))
    return out


def saving_text(sv):
    """The saving as one line: for one process exactly the shim's exit summary
    (SavingText in shim/telemetry/stats.cc)."""
    if idle(sv):
        return "saved nothing (no register hit the pool and no unregister was deferred)"
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
    elif n or not sv.get("borrowed"):
        out += " (estimated from %d real call%s of this run" % (n, "" if n == 1 else "s")
    else:
        out += " (estimated"
    if sv.get("borrowed"):
        k, c = sv["borrowed"], sv["borrowed_calls"]
        out += "%s%d hit%s/deferral%s priced from %d real call%s of %s, %s" % (
            "; " if n or sv["processes"] > 1 else ": ",
            k, "" if k == 1 else "s", "" if k == 1 else "s", c, "" if c == 1 else "s",
            sv["borrowed_from"], "this run having too few of its own" if sv["processes"] == 1
            else "for processes with too few of their own")
    unpriced = (sv["hits"] - sv["hits_priced"]) + (sv["deferred"] - sv["deferred_priced"])
    if unpriced:
        out += "; %d hits/deferrals unpriced, counted as 0" % unpriced
    return out + ")"



def unpriced(sv):
    return (sv["hits"] - sv["hits_priced"]) + (sv["deferred"] - sv["deferred_priced"])


def log_identity(header):
    """A log's program and arguments, as --compare matches runs."""
    h = header if isinstance(header, dict) else {}
    argv = h.get("argv") if isinstance(h.get("argv"), list) else []
    if not h.get("exe"):
        return None
    return (os.path.basename(str(h["exe"])), tuple(str(a) for a in argv[1:]))


# at most this many other logs of the same program are read for prices
SAME_PROGRAM_LOGS = 4


def same_program_prices(log, logs):
    """Prices for `log` from other logs of the same program and arguments:
    those among `logs`, else the newest few in its directory (a run in log
    mode beside a run in defer mode). borrowed_prices' form, or None."""
    from .read import read_log   # read imports nothing of this module's users
    ident = log_identity(log.header)
    if ident is None:
        return None
    others = [o for o in logs if o is not log and log_identity(o.header) == ident]
    if borrowed_prices(others, "") is None:
        others = []
        loaded = {os.path.realpath(o.path) for o in logs}
        cands = []
        for f in glob.glob(os.path.join(glob.escape(os.path.dirname(os.path.abspath(log.path))), "*.jsonl")):
            if os.path.realpath(f) in loaded:
                continue
            try:
                with open(f, "rb") as fh:
                    first = json.loads(fh.readline() or b"{}")
                if log_identity(first) == ident:
                    cands.append((-os.path.getmtime(f), f))
            except (OSError, ValueError):
                continue
        for _, f in sorted(cands)[:SAME_PROGRAM_LOGS]:
            try:
                o = read_log(f, True, None, 0)
            except Exception:   # a damaged neighbour prices nothing
                continue
            if borrowed_prices([o], "") is not None:
                others.append(o)
    if not others:
        return None
    names = ", ".join(os.path.basename(o.path) for o in others)
    return borrowed_prices(others, "another log of the same program (%s)" % names)


def pool_saving(logs, borrowed=None):
    """(the run's saving, each log's saving): each process estimated by
    saving_of, the run's their saving_total, with what registration took
    (calls_ns; measured_ns: the calls and the evictions made outside them,
    those inside being in the calls' time), the text and the method. A
    process whose own calls leave hits or deferrals unpriced borrows prices:
    `borrowed` (the bare run of --compare), else same_program_prices; what
    they leave unpriced, this machine's price table (prices.machine_prices)
    where it prices more."""
    per_log = []
    for log in logs:
        sv = saving_of(log)
        if unpriced(sv):
            b = borrowed or same_program_prices(log, logs)
            if b is not None:
                sv = saving_of(log, b)
        if unpriced(sv):
            t = machine.machine_prices(log, _price)
            if t is not None:
                tsv = saving_of(log, t)
                if unpriced(tsv) < unpriced(sv):
                    sv = tsv
        per_log.append(sv)
    sv = saving_total(per_log)
    sv["calls_ns"] = sum(g.total for log in logs for g in log.groups.values())
    sv["measured_ns"] = (sv["calls_ns"] + sv["evictions_ns"]
                         - sum(v for log in logs for v in log.in_call_evictions.values()))
    sv["text"] = saving_text(sv)
    sv["method"] = SAVING_METHOD
    return sv, per_log


SUMMARY_SAVING_KEYS = ("saved_ns", "spread_ns", "hits", "hits_priced", "deferred",
                       "deferred_priced", "evictions", "evictions_ns", "price_calls")


def saving_from_summary(rec):
    """One process's saving as its summary record's pool.saving states it (the
    shim's Saving), in saving_of's form; None where the record has none or
    the pool did nothing."""
    if not isinstance(rec, dict):
        return None
    sv = {k: as_int(rec.get(k)) for k in SUMMARY_SAVING_KEYS}
    sv["processes"] = 1
    sv["estimable"] = bool(sv["hits_priced"] + sv["deferred_priced"]
                           or sv["hits"] + sv["deferred"] == 0)
    return None if idle(sv) else sv


def measured_saving(bare, pooled, side):
    """--compare of a bare run (log or off mode) with a pooled one (documents
    of analyze): the bare run's time in registration calls (per API, scaled
    to the pooled run's number of calls where they differ) minus the pooled
    run's measured_ns. `side` names the pooled run ("baseline" or "other")."""
    bare_ns = 0
    scaled = False
    for api in sorted(set(bare["apis"]) & set(pooled["apis"]), key=api_sort_key):
        a, b = bare["apis"][api], pooled["apis"][api]
        if a["calls"] == b["calls"]:
            bare_ns += a["total_ns"]
        else:
            scaled = True
            bare_ns += a["total_ns"] * b["calls"] / a["calls"]
    measured = pooled["pool"]["saving"]["measured_ns"]
    out = {
        "pooled_run": side, "measured": True, "saved_ns": int(round(bare_ns - measured)),
        "bare_ns": int(round(bare_ns)), "pooled_ns": measured, "scaled": scaled,
        "estimate_ns": pooled["pool"]["saved_ns_records"],
        "estimate_text": pooled["pool"]["saving"]["text"],
        "method": "measured: the bare run's time in registration calls%s, minus the "
                  "pooled run's (its calls, and lazypin's evictions outside them)"
                  % (" (scaled per API to the pooled run's number of calls)" if scaled else "")}
    ap = pooled.get("autopin") or {}
    if ap.get("pins"):
        out["autopin"] = {
            "saved_ns_est": ap["saved_ns_est"], "register_ns": ap["register_ns"],
            "note": "its copies are not in the registration calls measured here; estimated "
                    "at %s; compare the programs' wall times"
                    % ("copy rates measured in that run" if ap.get("rates_measured")
                       else "fixed copy rates, an H200's")}
    return out


def defer_estimate_ns(logs):
    """Log mode: what --defer would save on registers of an address and size
    registered before (with an unregister between), priced as the pool's
    saving prices hits and deferrals (saving_of): each such register at the
    mean warm register of its size class, the unregister before it at the
    mean unregister; where this run has too few calls to price them, the
    time those calls took here."""
    total = 0.0
    for log in logs:
        prices = log_prices(log)
        n = log.f["rereg"]
        priced = all(prices["reg"].get(c) for c in log.rereg_classes) and prices["unreg"]
        if not n or not priced:
            total += log.f["rereg_ns"]
            continue
        total += sum(k * prices["reg"][c][1] for c, k in log.rereg_classes.items())
        total += n * prices["unreg"][1]
    return round_ns(total)


SAVING_METHOD = (
    "estimated per process from its own calls: each hit priced at the mean warm real register "
    "of its size class (the process's first register and registers that evicted are left out), "
    "each deferred unregister at the mean real unregister (else the mean eviction), minus the "
    "hit's or deferral's own time; every eviction lazypin made counted as cost; +/- is two "
    "standard errors of those means; a price rests on at least %d real calls, and a hit or "
    "deferral without them counts 0. The shim's exit summary prints the same figure."
    % MIN_PRICE_CALLS)


# ---- what auto-pin saved in copies: the one definition (the shim's
# AutoPinSavingOf, shim/telemetry/stats.h). Per direction, the bytes copied at
# the pinned rate times (pageable - pinned ns per byte), both rates measured
# in the run on the synchronous copies the shim timed (summary pool.autopin.
# copy_times); a direction without both: these fixed rates, an H200's
# (docs/benchmarks.md, "Pinned blocks and pageable copies": 64 MiB pageable
# 9.4-11 ms, pinned 1.24-1.29 ms), in
# bytes per ns (= GB/s). Then minus the registers' time, truncated to whole ns.
FIXED_PAGEABLE_BYTES_PER_NS = 6.5
FIXED_PINNED_BYTES_PER_NS = 53.0
COPY_DIRECTIONS = (("htod", "to"), ("dtoh", "from"))


def autopin_saving(copy_times, register_ns):
    """One process's auto-pin saving from its summary's copy_times and the
    registers' time: saved_ns, per direction bytes, measured and the rates
    (bytes per ns), and the text the shim's exit summary prints."""
    out = {"saved_ns": 0, "register_ns": register_ns, "directions": {}, "measured": False}
    saved = 0.0
    for key, _ in COPY_DIRECTIONS:
        c = copy_times.get(key) if isinstance(copy_times.get(key), dict) else {}
        pg = c.get("pageable") if isinstance(c.get("pageable"), dict) else {}
        pn = c.get("pinned") if isinstance(c.get("pinned"), dict) else {}
        pg_b, pg_ns, pn_b, pn_ns = (as_int(pg.get("bytes")), as_int(pg.get("ns")),
                                    as_int(pn.get("bytes")), as_int(pn.get("ns")))
        d = {"bytes": as_int(c.get("pinned_rate_bytes")),
             "measured": pg_b > 0 and pg_ns > 0 and pn_b > 0 and pn_ns > 0,
             "pageable_copies": as_int(pg.get("copies")), "pinned_copies": as_int(pn.get("copies"))}
        if d["measured"]:
            d["pageable_bytes_per_ns"] = pg_b / pg_ns
            d["pinned_bytes_per_ns"] = pn_b / pn_ns
            per_byte = pg_ns / pg_b - pn_ns / pn_b
        else:
            d["pageable_bytes_per_ns"] = FIXED_PAGEABLE_BYTES_PER_NS
            d["pinned_bytes_per_ns"] = FIXED_PINNED_BYTES_PER_NS
            per_byte = 1.0 / FIXED_PAGEABLE_BYTES_PER_NS - 1.0 / FIXED_PINNED_BYTES_PER_NS
        if d["bytes"]:
            saved += float(d["bytes"]) * per_byte
            out["measured"] = out["measured"] or d["measured"]
        out["directions"][key] = d
    out["saved_ns"] = int(saved - float(register_ns))
    out["text"] = autopin_saving_text(out)
    return out


def autopin_saving_text(sv):
    """The saving as one line: exactly the shim's (AutoPinSavingText)."""
    saved = sv["saved_ns"]
    out = ("saved %s in copies" % fmt_ns(saved) if saved >= 0
           else "cost %s more than it saved in copies" % fmt_ns(-saved))
    parts = []
    for key, word in COPY_DIRECTIONS:
        d = sv["directions"][key]
        if not d["bytes"]:
            continue
        parts.append("%d bytes %s the device at the pinned rate, priced at %s: pageable %.1f GB/s, "
                     "pinned %.1f GB/s" % (
                         d["bytes"], word,
                         "rates measured in this run" if d["measured"] else
                         "fixed rates, an H200's (no synchronous pageable and pinned copy timed "
                         "in this run)", d["pageable_bytes_per_ns"], d["pinned_bytes_per_ns"]))
    return "%s (estimated: %s; minus its registers' %s)" % (
        out, "; ".join(parts) or "no copy at the pinned rate", fmt_ns(sv["register_ns"]))


def autopin_run_saving(logs):
    """What auto-pin saved in the run's copies: per process from its summary's
    copy times (autopin_saving), summed. A log without them (written by a
    lazypin that did not time copies, or ended by a signal) is priced at the
    fixed rates, its pinned bytes being the pins' and the later copies'.
    Returns (saved_ns, text, per-process savings)."""
    per = []
    legacy_bytes = legacy_reg = 0
    for log in logs:
        s = (log.summary or {}).get("pool", {}).get("autopin")
        s = s if isinstance(s, dict) else {}
        if not (log.autopin["pins"] or log.autopin["failed"] or as_int(s.get("pins"))):
            continue
        if isinstance(s.get("copy_times"), dict):
            per.append(autopin_saving(s["copy_times"], as_int(s.get("register_ns"))))
        else:
            legacy_bytes += log.autopin["bytes"] + as_int(s.get("copy_bytes"))
            legacy_reg += log.autopin["register_ns"]
    saved = sum(sv["saved_ns"] for sv in per)
    notes = []
    if legacy_bytes or legacy_reg or not per:
        per_byte = 1.0 / FIXED_PAGEABLE_BYTES_PER_NS - 1.0 / FIXED_PINNED_BYTES_PER_NS
        legacy = int(legacy_bytes * per_byte - legacy_reg)
        saved += legacy
        notes.append("%s copied at the pinned rate in logs without copy times (written by an "
                     "older lazypin, or ended by a signal), priced at fixed rates, an H200's: "
                     "pageable %.1f GB/s, pinned %.1f GB/s, minus the registers' %s"
                     % (fmt_bytes(legacy_bytes), FIXED_PAGEABLE_BYTES_PER_NS,
                        FIXED_PINNED_BYTES_PER_NS, fmt_ns(legacy_reg)))
    if len(per) == 1 and not notes:
        return saved, per[0]["text"], per
    if per:
        notes.insert(0, "%d process%s, each at its own copy rates (%d measured in its run)"
                     % (len(per), "" if len(per) == 1 else "es", sum(1 for sv in per if sv["measured"])))
    word = "saved %s in copies" % fmt_ns(saved) if saved >= 0 else \
        "cost %s more than it saved in copies" % fmt_ns(-saved)
    return saved, "%s (estimated: %s)" % (word, "; ".join(notes)), per
