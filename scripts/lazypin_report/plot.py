"""--plot: latency CDF per API and latency by size class (matplotlib, imported lazily)."""

import os
import subprocess
import sys

from .base import Agg, SIZE_CLASS_NAMES, api_sort_key
from .read import process_info
from .render import run_mode, run_name


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
