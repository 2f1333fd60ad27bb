"""Big pins: the driver's registers and pinned allocations of BIG_PIN_BYTES or
more (an LLM server's KV cache, an offload trainer's pool), their rate per
GiB and their share of each process's run, and the advice that names what
would have made them faster."""

from statistics import median

from .base import BIG_PIN_BYTES, HOST_APIS, as_int
from .fmt import fmt_bytes, fmt_ns

GIB = float(1 << 30)
# The rates of a first register of fresh memory measured on an H200
# (docs/benchmarks.md, "Big first pins"), ms per GiB: bare, LAZYPIN_PREFAULT
# (16 threads), huge pages.
BARE_MS_PER_GIB = "306-364"
PREFAULT_MS_PER_GIB = "84-117"
HUGE_MS_PER_GIB = "39-45"
# Above this a first register paid for faulting its pages in (the driver's
# pin of present pages alone: 36-57 ms per GiB on the same machine).
FAULTED_MS_PER_GIB = 100
# Above this a prefaulted register of small pages would gain from huge ones.
SMALL_PAGES_MS_PER_GIB = 60


def ms_per_gib(latency_ns, nbytes):
    return latency_ns / 1e6 / (nbytes / GIB)


def big_pins_summary(logs, procs, top=10):
    """The run's big pins: count, bytes and time in all, the median rate, and
    the slowest `top` of them with their process's share."""
    rows = []
    for log, p in zip(logs, procs):
        run_ns = p.get("duration_ns") or 0
        for api, nbytes, lat in log.big_pins:
            rows.append({"pid": log.pid, "api": api, "bytes": nbytes, "latency_ns": lat,
                         "ms_per_gib": round(ms_per_gib(lat, nbytes), 1),
                         "share_of_run": round(lat / float(run_ns), 3) if run_ns >= lat > 0 else None})
    rows.sort(key=lambda r: -r["latency_ns"])
    return {"calls": len(rows), "bytes": sum(r["bytes"] for r in rows),
            "total_ns": sum(r["latency_ns"] for r in rows),
            "ms_per_gib_p50": round(median([r["ms_per_gib"] for r in rows]), 1) if rows else None,
            "slowest": rows[:max(0, top)]}


def render_big_pins(big, L):
    if not big["calls"]:
        return
    L.append("")
    L.append("== big pins (registers and pinned allocations of %s or more the driver made)"
             % fmt_bytes(BIG_PIN_BYTES))
    L.append("  %d call%s, %s, %s in all; median %.1f ms per GiB"
             % (big["calls"], "" if big["calls"] == 1 else "s", fmt_bytes(big["bytes"]),
                fmt_ns(big["total_ns"]), big["ms_per_gib_p50"]))
    for r in big["slowest"]:
        L.append("  pid %-8s %-22s %10s %10s %7.1f ms per GiB%s"
                 % (r["pid"], r["api"], fmt_bytes(r["bytes"]), fmt_ns(r["latency_ns"]), r["ms_per_gib"],
                    "  %.0f%% of its run" % (100 * r["share_of_run"]) if r["share_of_run"] is not None
                    else ""))


def big_pin_advice(logs, procs, add):
    """The rules `prefault`, `prefault_huge` and `host_alloc_big` (docs/tools.md)."""
    slow_regs, small_pages, host = {}, {}, {}
    for log, p in zip(logs, procs):
        cfg = p.get("config") or {}
        threads = as_int(cfg.get("prefault"), 16)
        prefaulting = p.get("mode") == "defer" and threads >= 2
        for api, nbytes, lat in log.big_pins:
            rate = ms_per_gib(lat, nbytes)
            if api in HOST_APIS:
                if rate > FAULTED_MS_PER_GIB:
                    host.setdefault(log.pid, []).append((api, nbytes, lat))
            elif not prefaulting and rate > FAULTED_MS_PER_GIB:
                slow_regs.setdefault(log.pid, []).append((p.get("mode"), nbytes, lat))
            elif prefaulting and not cfg.get("prefault_huge") and rate > SMALL_PAGES_MS_PER_GIB:
                small_pages.setdefault(log.pid, []).append((api, nbytes, lat))

    def figure(per):
        calls = [c for cs in per.values() for c in cs]
        nbytes = sum(c[1] for c in calls)
        lat = sum(c[2] for c in calls)
        return "%d call%s of %s in all took %s (%.0f ms per GiB)" % (
            len(calls), "" if len(calls) == 1 else "s", fmt_bytes(nbytes), fmt_ns(lat),
            ms_per_gib(lat, nbytes))

    if slow_regs:
        setting = {"LAZYPIN_PREFAULT": "16"}
        if any(m != "defer" for cs in slow_regs.values() for m, _, _ in cs):
            setting["LAZYPIN_MODE"] = "defer"
        add("prefault",
            "first registers of %s or more: %s; the driver faulted their pages in on the "
            "calling thread" % (fmt_bytes(BIG_PIN_BYTES), figure(slow_regs)),
            "in defer mode lazypin faults such a register in first with up to LAZYPIN_PREFAULT "
            "threads (within the program's CPU affinity): %s ms per GiB on an H200 for fresh "
            "memory, against %s bare (docs/benchmarks.md)" % (PREFAULT_MS_PER_GIB, BARE_MS_PER_GIB),
            setting, list(slow_regs))
    if small_pages:
        add("prefault_huge",
            "first registers of %s or more faulted in by LAZYPIN_PREFAULT in small pages: %s"
            % (fmt_bytes(BIG_PIN_BYTES), figure(small_pages)),
            "ask for transparent huge pages on the ranges lazypin faults in (where the kernel "
            "allows them: 'madvise' or 'always'): %s ms per GiB on an H200, against %s in small "
            "pages (docs/benchmarks.md)" % (HUGE_MS_PER_GIB, PREFAULT_MS_PER_GIB),
            {"LAZYPIN_PREFAULT_HUGE": "1"}, list(small_pages))
    if host:
        add("host_alloc_big",
            "pinned allocations of %s or more: %s; the driver faults and pins their pages on the "
            "calling thread, and lazypin does not speed these up" % (fmt_bytes(BIG_PIN_BYTES),
                                                                     figure(host)),
            "for a block allocated once and kept, where cudaHostAlloc's own flags are not needed "
            "(write-combined), mmap it and cudaHostRegister it instead: in defer mode "
            "LAZYPIN_PREFAULT faults that register in with the program's cores",
            pids=list(host))
