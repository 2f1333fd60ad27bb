"""--compare: two runs of the same program, side by side."""

import os

from .base import api_sort_key
from .fmt import ratio
from .render import fmt_argv, run_mode
from .savings import measured_saving


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


def compare(base, other, differences=()):
    """The comparison document; `differences` (run_differences, --force):
    the runs are of other programs or arguments, so the difference of their
    registration time is no measurement of the pool."""
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
           "saving": None, "differences": list(differences)}
    # the measured saving: a bare run against a pooled one
    bare, pooled, side = None, None, None
    if is_bare(base) and not is_bare(other):
        bare, pooled, side = base, other, "other"
    elif is_bare(other) and not is_bare(base):
        bare, pooled, side = other, base, "baseline"
    if bare is not None:
        res["saving"] = measured_saving(bare, pooled, side)
        if differences:
            res["saving"]["measured"] = False
            res["saving"]["method"] = ("not measured: the difference of the registration time "
                                       "of two different runs (%s; --force)" % "; ".join(differences))
        else:
            pooled["pool"]["saved_ns_est"] = res["saving"]["saved_ns"]
            pooled["pool"]["saved_ns_source"] = "measured"
    return res
