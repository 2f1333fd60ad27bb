"""Number, time, size and table formatting for the text report."""

import datetime

from .base import as_int

def fmt_num(v):
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.2f" % v


def fmt_ns(ns):
    """Human time: 850 ns, 43.2 us, 171 us, 1.90 ms, 2.31 s."""
    if ns is None:
        return "-"
    neg = ns < 0
    a = abs(ns)
    if a < 1000:
        s = "%d ns" % a
    elif a < 1000 ** 2:
        s = fmt_num(a / 1e3) + " us"
    elif a < 1000 ** 3:
        s = fmt_num(a / 1e6) + " ms"
    else:
        s = fmt_num(a / 1e9) + " s"
    return ("-" if neg else "") + s


def fmt_bytes(n):
    """Human size, binary units: 512 B, 4 KiB, 1.5 MiB, 40 GiB."""
    if n is None:
        return "-"
    if n < 1024:
        return "%d B" % n
    v = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        v /= 1024.0
        if v < 1024 or unit == "PiB":
            break
    if v == int(v):
        return "%d %s" % (v, unit)
    return ("%.0f %s" if v >= 100 else "%.1f %s") % (v, unit)


def fmt_size_setting(n):
    """A size as LAZYPIN_POOL_BYTES takes it: 512M, 8G (rounded up to a power of two)."""
    p = 1 << max(20, (max(1, n) - 1).bit_length())
    for unit, shift in (("T", 40), ("G", 30), ("M", 20)):
        if p >= (1 << shift):
            return "%d%s" % (p >> shift, unit)
    return str(p)


def fmt_ratio(r):
    if r is None:
        return "-"
    return ("%.0fx" if r >= 100 else "%.1fx" if r >= 10 else "%.2fx") % r


def fmt_pct(x):
    return "-" if x is None else "%.0f%%" % (100.0 * x)


def fmt_driver(v):
    v = as_int(v)
    if v <= 0:
        return "unknown"
    return "%d.%d (%d)" % (v // 1000, (v % 1000) // 10, v)


def fmt_start(ns):
    if not ns:
        return "unknown"
    try:
        dt = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "unknown"
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + "%03d UTC" % (dt.microsecond // 1000)


def iso_start(ns):
    if not ns:
        return None
    try:
        dt = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(headers, rows, indent="  ", left=(0,)):
    """Aligned columns: columns listed in `left` are left-aligned, others right."""
    cols = len(headers)
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cells) for i in range(cols)]
    lines = []
    for r in cells:
        parts = []
        for i in range(cols):
            parts.append(r[i].ljust(width[i]) if i in left else r[i].rjust(width[i]))
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines
