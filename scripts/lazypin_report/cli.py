"""The command line: `lazypin report LOG... [--compare OTHER...] [--plot FILE.png] [--json] [--top N]`."""

import argparse
import json
import os
import sys

from .base import JSON_SCHEMA, PROG, ReportError
from .read import load
from .aggregate import analyze
from .compare import compare, is_bare, run_differences
from .savings import borrowed_prices, own_price_aggs
from . import prices
from .render import render_compare, render_text
from .plot import PLOT_HINT, PLOT_PYTHON, import_pyplot, plot, plot_missing_message, python_with_matplotlib


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
               "A run too short to price its own hits and deferrals is priced, where "
               "nothing else can, from this machine's price table, which reports of "
               "this host's logs fill (--prices). "
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
    p.add_argument("--prices", metavar="FILE|off",
                   help="this machine's price table (default $%s, else "
                        "$XDG_CACHE_HOME/lazypin/prices-<host>.json); off: neither read "
                        "nor written" % prices.PRICES_VARIABLE)
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
            # the package's directory runs as a program (its __main__.py)
            os.execve(python, [python, os.path.dirname(os.path.abspath(__file__))] + argv, env)
    if args.top < 0:
        print("%s: --top must be 0 or more" % PROG, file=sys.stderr)
        return 2
    prices.configure(args.prices)
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
        if not diff:   # the bare run's real calls price what the pooled run's cannot
            if is_bare(doc) and not is_bare(other):
                other = analyze(other_logs, args.top, borrowed_prices(logs, "the bare run (--compare)"))
            elif is_bare(other) and not is_bare(doc):
                doc = analyze(logs, args.top, borrowed_prices(other_logs, "the bare run (--compare)"))
        cmp = compare(doc, other, diff)
    # this host's logs that price themselves, for later runs that cannot
    prices.record(logs + (other_logs or []), own_price_aggs)

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
