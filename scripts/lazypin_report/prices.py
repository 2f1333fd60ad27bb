"""This machine's price table: what a real register (per size class) and a
real unregister cost here, from the real calls of earlier runs that the
report read on this host. It prices the hits and deferrals of a run too short
to price its own, when neither the bare side of --compare nor another log of
the same program can (savings.pool_saving), and says so: the figure is an
estimate at other runs' prices, never a measurement.

The table is one small JSON file, by default
$XDG_CACHE_HOME/lazypin/prices-<host>.json (~/.cache/lazypin/...);
`--prices FILE|off` or LAZYPIN_REPORT_PRICES=FILE|off names another or
turns it off. It holds one entry per run (the newest MAX_RUNS): the sums of
its warm real registers per size class and of its real unregisters, keyed
by the driver version (and the GPU, where a header names one). Only logs
written on this host are recorded or priced from it; a table whose host is
another is not used. Writes are atomic (a temporary file renamed over the
table) and never fail the report: where the table cannot be written, it is
left as it is."""

import json
import os
import re
import socket
import tempfile
import time

from .base import Agg
from .fmt import iso_start

PRICES_VARIABLE = "LAZYPIN_REPORT_PRICES"
TABLE_FORMAT = 1
MAX_RUNS = 32
OFF = ("off", "0", "no", "none")

# `--prices` of the command line: None (the variable, else the default path),
# "off", or a path
setting = None
_cache = {}


def configure(value):
    """The command line's --prices (None: LAZYPIN_REPORT_PRICES, else the default)."""
    global setting
    setting = value
    _cache.clear()


def this_host():
    try:
        return socket.gethostname() or None
    except OSError:
        return None


def table_path():
    """The table's path, or None (off, or no place for it)."""
    value = setting if setting is not None else os.environ.get(PRICES_VARIABLE, "")
    if value.strip().lower() in OFF:
        return None
    if value:
        return os.path.abspath(os.path.expanduser(value))
    host = this_host()
    if not host:
        return None
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):   # the XDG rule: a relative value is ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        cache = os.path.join(home, ".cache")
    return os.path.join(cache, "lazypin", "prices-%s.json" % re.sub(r"[^A-Za-z0-9._-]", "_", host))


def machine_key(header):
    """What the prices depend on besides the host: (driver version, GPU)."""
    h = header if isinstance(header, dict) else {}
    dv = h.get("driver_version")
    gpu = h.get("gpu")
    return (dv if isinstance(dv, int) and not isinstance(dv, bool) else None,
            gpu if isinstance(gpu, str) else None)


def run_id(log):
    h = log.header if isinstance(log.header, dict) else {}
    if h.get("pid") is None and h.get("start_unix_ns") is None:
        return None
    return "%s@%s:%s" % (h.get("pid"), h.get("start_unix_ns"), os.path.basename(str(h.get("exe") or "")))


def own_host(log):
    """The log's host where it is this machine's, else None."""
    h = log.header if isinstance(log.header, dict) else {}
    host = h.get("host")
    return host if isinstance(host, str) and host and host == this_host() else None


def read_table(path):
    """The table at `path` ({"host", "runs"}), or None (absent, unreadable, not one)."""
    if path in _cache:
        return _cache[path]
    t = None
    try:
        with open(path) as f:
            t = json.load(f)
        if not (isinstance(t, dict) and t.get("lazypin_prices") == TABLE_FORMAT
                and isinstance(t.get("host"), str) and isinstance(t.get("runs"), list)):
            t = None
    except (OSError, ValueError, UnicodeDecodeError):
        t = None
    _cache[path] = t
    return t


def _agg(v):
    """An Agg from a table's [calls, total_ns, sum of squares], or None."""
    if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)):
        return None
    a = Agg()
    a.n, a.total, a.sq = int(v[0]), v[1], v[2]
    return a if a.n > 0 else None


def _sums(a):
    return [a.n, a.total, a.sq]


def _day(ns):
    return (iso_start(ns) or "?")[:10]


def machine_prices(log, price):
    """Prices for `log` from this machine's table, in borrowed_prices' form
    plus a third element, what the JSON says of the table: (prices, label,
    {"file", "host", "runs", "runs_from_unix_ns", "runs_to_unix_ns"}); None
    where the table is off, absent, another host's, or prices nothing for
    this driver. `price`: savings._price (an Agg to a price, or None)."""
    path = table_path()
    host = own_host(log)
    if path is None or host is None:
        return None
    t = read_table(path)
    if t is None or t["host"] != host:
        return None
    key = machine_key(log.header)
    me = run_id(log)
    reg, unreg, runs = {}, Agg(), []
    for r in t["runs"]:
        if not isinstance(r, dict) or r.get("run") == me:
            continue
        if (r.get("driver_version"), r.get("gpu")) != key:
            continue
        used = False
        for sclass, v in (r.get("reg") or {}).items() if isinstance(r.get("reg"), dict) else ():
            a = _agg(v)
            if a is not None:
                reg.setdefault(sclass, Agg()).merge(a)
                used = True
        a = _agg(r.get("unreg"))
        if a is not None:
            unreg.merge(a)
            used = True
        if used:
            when = r.get("start_unix_ns") or r.get("recorded_unix_ns")
            runs.append(when if isinstance(when, int) else 0)
    prices = {"reg": {c: price(a) for c, a in reg.items()}, "unreg": price(unreg)}
    if prices["unreg"] is None and not any(prices["reg"].values()):
        return None
    lo, hi = min(runs), max(runs)
    when = _day(lo) if _day(lo) == _day(hi) else "%s to %s" % (_day(lo), _day(hi))
    label = "the machine table %s (%d earlier run%s on this host, %s)" % (
        path, len(runs), "" if len(runs) == 1 else "s", when)
    info = {"file": path, "host": host, "runs": len(runs),
            "runs_from_unix_ns": lo, "runs_to_unix_ns": hi}
    return prices, label, info


def is_simulated(log):
    """A run on the simulated CUDA stack (tests/simcuda), where its objects
    record shows it: its prices are not this machine's."""
    return any("simcuda" in str(p) for _, _, p in getattr(log, "objects", ()))


def record(logs, own_aggs):
    """Add to this machine's table the prices of each log of this host whose
    own real calls price something (`own_aggs(log)`: {"reg": {class: Agg},
    "unreg": Agg or None}, the priced ones only). Atomic; never raises."""
    try:
        _record(logs, own_aggs)
    except Exception:   # the table is a convenience: the report goes on without it
        pass


def _record(logs, own_aggs):
    path = table_path()
    if path is None:
        return
    entries = []
    for log in logs:
        host = own_host(log)
        rid = run_id(log)
        if host is None or rid is None or is_simulated(log):
            continue
        aggs = own_aggs(log)
        reg = {c: _sums(a) for c, a in sorted(aggs["reg"].items())}
        if not reg and aggs["unreg"] is None:
            continue
        dv, gpu = machine_key(log.header)
        start = log.header.get("start_unix_ns")
        entries.append((host, {
            "run": rid, "exe": os.path.basename(str(log.header.get("exe") or "")),
            "mode": log.header.get("mode"), "driver_version": dv, "gpu": gpu,
            "start_unix_ns": start if isinstance(start, int) and not isinstance(start, bool) else None,
            "recorded_unix_ns": time.time_ns(),
            "reg": reg, "unreg": _sums(aggs["unreg"]) if aggs["unreg"] is not None else None}))
    if not entries:
        return
    _cache.pop(path, None)
    t = read_table(path) if os.path.exists(path) else None
    host = entries[0][0]
    if t is None:
        t = {"lazypin_prices": TABLE_FORMAT, "host": host, "runs": []}
    elif t["host"] != host:
        return   # another host's table: neither used nor overwritten
    runs = [r for r in t["runs"] if isinstance(r, dict)]
    changed = False
    for _, e in entries:
        old = [r for r in runs if r.get("run") == e["run"]]
        if old and all(o.get(k) == e.get(k) for o in old for k in ("reg", "unreg", "driver_version", "gpu")):
            continue   # this run is in the table already: reported again, counted once
        runs = [r for r in runs if r.get("run") != e["run"]] + [e]
        changed = True
    if not changed:
        return
    runs.sort(key=lambda r: (r.get("start_unix_ns") or 0, r.get("recorded_unix_ns") or 0))
    t["runs"] = runs[-MAX_RUNS:]
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".prices-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(t, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _cache.pop(path, None)
