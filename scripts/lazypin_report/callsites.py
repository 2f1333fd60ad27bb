"""Call sites: the code that pins, from the logged native stacks, symbolized
with addr2line or llvm-symbolizer."""

import bisect
import os
import re
import shutil
import subprocess

from .savings import group_saving, log_prices


def symbolizer():
    """('addr2line'|'llvm-symbolizer', path) or None."""
    for name in ("addr2line", "llvm-symbolizer"):
        p = shutil.which(name)
        if p:
            return name, p
    return None


def symbolize_object(path, offsets, tool):
    """{offset: 'function (file:line)'} for the offsets (ints) inside object
    `path`; one process per object; missing entries where it could not."""
    if tool is None or not os.path.isfile(path) or not offsets:
        return {}
    name, exe = tool
    offs = sorted(offsets)
    addrs = ["0x%x" % o for o in offs]
    if name == "addr2line":
        cmd = [exe, "-f", "-C", "-e", path]
    else:
        cmd = [exe, "--obj=" + path, "--demangle", "--functions=linkage", "--no-inlines",
               "--output-style=GNU"]
    try:
        r = subprocess.run(cmd, input="\n".join(addrs) + "\n", capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [l for l in r.stdout.splitlines() if l.strip() or name == "addr2line"]
    if name != "addr2line":
        lines = [l for l in r.stdout.splitlines() if l.strip()]
    out = {}
    if r.returncode != 0 or len(lines) < 2 * len(offs):
        return out
    for i, o in enumerate(offs):
        func, where = lines[2 * i].strip(), lines[2 * i + 1].strip()
        if func in ("??", ""):
            continue
        where = where.split(" (discriminator")[0]
        if where.startswith("??"):
            out[o] = func
        else:
            out[o] = "%s (%s)" % (func, os.path.basename(where))
    return out


def is_lazypin_object(path):
    return os.path.basename(path).startswith("liblazypin")


# The innermost frames inside CUDA's own code (libcuda, libcudart, a static
# cudart linked into the program or an extension) say nothing the record's
# API does not: they are dropped, at most this many, before `depth` counts.
CUDA_FRAMES = 8
CUDA_API_NAME = re.compile(r"^cu(da)?[A-Z]\w*(?:[ (]|$)")


def is_cuda_frame(frame, name):
    path = frame[0]
    base = os.path.basename(path) if path else ""
    return (base.startswith("libcuda.so") or base.startswith("libcudart.so")
            or name.startswith("libcudart_static_") or CUDA_API_NAME.match(name) is not None)


def call_sites(logs, depth=4):
    """Call sites ranked: each unique symbolized stack (lazypin's own frames
    left out, `depth` frames kept) with its calls, time spent (calls and
    evictions) and time saved (bare estimate minus measured)."""
    resolved = []   # per log: {stack id: [(path, offset) or (None, addr)]}
    wanted = {}
    for log in logs:
        objs = sorted(log.objects)
        bases = [o[0] for o in objs]
        per = {}
        for sid, frames in log.stacks.items():
            out = []
            for a in frames:
                i = bisect.bisect_right(bases, a) - 1
                hit = None
                while i >= 0:
                    base, size, path = objs[i]
                    if base <= a < base + size:
                        hit = (path, a - base)
                        break
                    i -= 1
                    if i >= 0 and objs[i][0] + (1 << 40) < a:
                        break
                if hit is not None and is_lazypin_object(hit[0]):
                    continue
                out.append(hit if hit is not None else (None, a))
                if len(out) >= depth + CUDA_FRAMES:
                    break
            per[sid] = out
            for path, off in out:
                if path is not None:
                    # a return address: the call is the byte before it
                    wanted.setdefault(path, set()).add(max(0, off - 1))
        resolved.append(per)
    tool = symbolizer()
    names = {path: symbolize_object(path, offs, tool) for path, offs in wanted.items()}

    def frame_name(fr):
        path, off = fr
        if path is None:
            return "0x%x" % off
        n = names.get(path, {}).get(max(0, off - 1))
        return n if n else "%s+0x%x" % (os.path.basename(path), off)

    sites = {}
    for log, per in zip(logs, resolved):
        prices = log_prices(log)

        def site(stack):
            if stack is None:
                return None
            if stack not in per:
                return ("stack %d (frames not in the log)" % stack,)
            named = [(f, frame_name(f)) for f in per[stack]]
            while named and is_cuda_frame(*named[0]):
                named.pop(0)
            python = log.python_lines.get(stack)
            return ((("python " + python,) if python else ())
                    + tuple(n for _, n in named[:depth])) or ("(lazypin and CUDA frames only)",)

        def entry(s):
            return sites.setdefault(s, {"frames": list(s), "calls": 0, "hits": 0, "real": 0,
                                        "evictions": 0, "time_ns": 0, "bare_ns": 0})

        for key, g in log.groups.items():
            s = site(key[7])
            if s is None:
                continue
            e = entry(s)
            e["calls"] += g.n
            e["time_ns"] += g.total
            e["bare_ns"] += g.total + group_saving(key, g, prices)
            if key[1] == "hit":
                e["hits"] += g.n
            elif key[1] in ("miss", "forward", "passthrough"):
                e["real"] += g.n
        for key, g in log.egroups.items():
            s = site(key[3])
            if s is None:
                continue
            e = entry(s)
            e["evictions"] += g.n
            e["time_ns"] += g.total
    out = list(sites.values())
    for e in out:
        e["saved_ns"] = int(round(e.pop("bare_ns") - e["time_ns"]))
    return {"symbolizer": tool[0] if tool else None,
            "by_time": sorted(out, key=lambda e: (-e["time_ns"], e["frames"])),
            "by_saved": sorted(out, key=lambda e: (-e["saved_ns"], e["frames"]))}
