"""Advice: one rule per finding, what to set and why."""

import math

from .base import as_int
from .fmt import fmt_bytes, fmt_ns, fmt_size_setting
from .read import process_info
from .bigpins import big_pin_advice
from .savings import defer_estimate_ns


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
        est = defer_estimate_ns(logs)
        add("defer",
            "%d of %d registers were of an address and size registered before (with an "
            "unregister between): in defer mode they would be pool hits" % (n, regs),
            "try --defer: estimated %s saved (these registers and the unregisters before "
            "them, priced as the pool's saving is: at this run's mean register of their size "
            "and mean unregister)" % fmt_ns(est),
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

    big_pin_advice(logs, procs, add)
    return out
