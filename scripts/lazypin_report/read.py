"""Reading logs, streamed: each record updates its group's histogram and is
dropped (Log, load); what process a log comes from (process_info)."""

import glob
import heapq
import json
import os
import re
import sys
import time

from .base import Agg, BIG_PIN_BYTES, BIG_PIN_MEMORY, FREE_REASONS, LOG_FORMAT, PROG, PTR_MEMORY, RECENT_EVICTIONS, ReportError, as_int, host_action, ptr_int, size_class
from .fmt import fmt_bytes, iso_start


# The shim's own record layout (shim/telemetry/records.cc), read without json: a line that
# does not match exactly (other field order, escapes, unknown fields) goes
# through json.loads, with the same result.
CALL_RE = re.compile(
    rb'\{"type":"call","t_ns":(-?\d+),"tid":(-?\d+),"api":"([A-Za-z0-9_]+)","via":"[a-z]*",'
    rb'"ptr":"([^"\\]*)","bytes":(\d+),"flags":\d+,"result":(-?\d+),"latency_ns":(-?\d+),'
    rb'"action":"([a-z_]+)","evicted":(\d+)(?:,"reason":"([a-z_]*)")?(?:,"stack":(\d+))?\}\r?$')
EVICT_RE = re.compile(
    rb'\{"type":"evict","t_ns":(-?\d+),"tid":(-?\d+),"ptr":"([^"\\]*)","bytes":(\d+),'
    rb'"reason":"([a-z_]+)","result":(-?\d+),"latency_ns":(-?\d+)(?:,"waited_ns":(\d+))?'
    rb'(?:,"forced":(true|false))?(?:,"stack":(\d+))?\}\r?$')
CHUNK = 4 << 20


class Progress:
    """One line on stderr, rewritten in place, once reading has taken more
    than a second, and only when stderr is a terminal."""

    def __init__(self, total_bytes, stream=None):
        self.total = max(1, total_bytes)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def update(self, done_in_file, name):
        if not self.tty:
            return
        now = time.monotonic()
        if now - self.start < 1.0 or now - self.last < 0.2:
            return
        self.last = now
        done = self.done + done_in_file
        self.stream.write("\r%s: reading %s: %3d%% (%d of %d MB)\x1b[K"
                          % (PROG, os.path.basename(name), 100 * done // self.total,
                             done >> 20, self.total >> 20))
        self.stream.flush()
        self.shown = True

    def file_done(self, size):
        self.done += size

    def finish(self):
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class Log:
    """What one log file (one process) holds, summed up while reading."""

    def __init__(self, path, top=10):
        self.path = path
        self.header = None
        self.summary = None
        self.warnings = []          # warning records written by the shim
        self.warnings_dropped = 0
        self.reader_warnings = []   # what this tool found wrong with the file
        self.cut = False
        self.records = 0
        self.calls = 0
        self.top = top
        self.slowest = []           # heap of (latency, -t, seq, row)
        self.big_pins = []          # (api, bytes, latency) of the driver's registers and
                                    # pinned allocations of BIG_PIN_BYTES or more
        self.seq = 0
        self.groups = {}            # call group key -> Agg (see call_key)
        self.egroups = {}           # (reason, error, forced, stack) -> Agg
        self.errors = {}            # (code, api) -> count
        self.host_releases = {}     # reason -> host_release records (the host-allocation cache)
        self.devices = {}           # device -> {"calls", "total_ns", action: count} (several devices)
        self.objects = []           # (base, size, path) of loaded objects
        self.stacks = {}            # stack id -> [frame addresses]
        self.python_lines = {}      # stack id -> "file.py:12 in f" (the Python line that called)
        self.last_t = None
        self.pool_bytes = None
        self.mode = None
        # pattern state for the advice rules (addresses as ints)
        self.first_register_done = False
        self.seen = set()
        self.last_unregister = {}   # ptr -> t of its last deferred unregister
        # ptr -> the stack of the real register that made its registration:
        # a hit or deferral logged without a stack of its own (LAZYPIN_STACKS=1)
        # is that registration's, so it is credited to that call site.
        self.site_of = {}
        self.idle_gone = {}         # ptr -> t of its last use, released idle
        self.lru_gone = set()
        self.freed_sizes = {}       # bytes -> freed pooled registrations not yet re-registered
        # per thread its last RECENT_EVICTIONS evictions (end time, latency), and
        # (action, size class) -> time of evictions made inside hits and deferrals
        self.recent_evictions = {}
        self.in_call_evictions = {}
        # a bounded log (LAZYPIN_LOG_MAX): where its per-call records end, and
        # the shim's last tally of the calls after that
        self.cut_at = None
        self.log_max = None
        self.tally = None
        # auto-pins (LAZYPIN_AUTOPIN): {"pins", "failed", "bytes", "register_ns", "apis": {api: n}}
        self.autopin = {"pins": 0, "failed": 0, "bytes": 0, "register_ns": 0, "apis": {}}
        self.last_size = {}         # log mode: ptr -> bytes of its last register
        self.rereg_classes = {}     # log mode: size class -> registers the pool would serve
        self.registered = {}        # log mode: (ptr, bytes) -> latency of its last unregister (None: registered)
        self.f = {"rereg": 0, "rereg_ns": 0, "idle_reuse": 0, "idle_gap_max_ns": 0, "lru_reload": 0, "pattern": 0,
                  "too_big": 0, "too_big_max": 0, "busy": 0, "busy_bytes": 0,
                  "waited_ns": 0, "old_passthrough": 0, "in_call": 0, "ptr_memory_full": False}

    @property
    def pid(self):
        if self.header and "pid" in self.header:
            return as_int(self.header.get("pid"), None)
        return None

    # ---- records

    def on_header(self, rec, lineno):
        if self.header is not None:
            self.reader_warnings.append(
                "%s: a second header at line %d was ignored" % (self.path, lineno))
            return
        fmt = rec.get("format")
        if isinstance(fmt, (int, float)) and not isinstance(fmt, bool) and fmt > LOG_FORMAT:
            raise ReportError("%s: log format %s is newer than this report tool "
                              "understands (%d)" % (self.path, fmt if fmt != int(fmt) else int(fmt),
                                                     LOG_FORMAT))
        if not isinstance(fmt, int) or isinstance(fmt, bool):
            self.reader_warnings.append(
                "%s: header has no valid \"format\"; reading it as format %d"
                % (self.path, LOG_FORMAT))
        if self.calls or self.egroups or self.warnings:
            self.reader_warnings.append(
                "%s: the header is not the first record (line %d)" % (self.path, lineno))
        self.header = rec
        cfg = rec.get("config") if isinstance(rec.get("config"), dict) else {}
        pb = cfg.get("pool_bytes")
        self.pool_bytes = pb if isinstance(pb, int) and not isinstance(pb, bool) and pb > 0 else None
        self.mode = rec.get("mode") or cfg.get("mode")

    def on_call(self, t, tid, ptr, api, nbytes, result, lat, action, evicted, reason, stack):
        action = host_action(api, action)
        self.calls += 1
        self.last_t = t
        reg = "Register" in api and "Unregister" not in api
        err = result != 0
        sclass = size_class(nbytes) if reg else None
        warm = False
        if reg and not err and (action == "miss" or action == "forward"):
            warm = self.first_register_done and evicted == 0
            self.first_register_done = True
            self.on_real_register(t, ptr, nbytes, action)
            if stack is not None and ptr is not None and (
                    ptr in self.site_of or len(self.site_of) < PTR_MEMORY):
                self.site_of[ptr] = stack
        if (not err and nbytes >= BIG_PIN_BYTES and len(self.big_pins) < BIG_PIN_MEMORY
                and action in ("miss", "forward", "host_miss", "host_forward")):
            self.big_pins.append((api, nbytes, lat))
        if self.mode == "log" and action == "forward" and not err and ptr is not None:
            self.on_log_mode_call(reg, ptr, nbytes, lat)
        if stack is None and (action == "hit" or action == "deferred") and self.site_of:
            stack = self.site_of.get(ptr)
        elif action == "deferred" and ptr is not None:
            self.last_unregister[ptr] = t
        if evicted:
            self.f["in_call"] += evicted
            k = (action, sclass)
            self.in_call_evictions[k] = (self.in_call_evictions.get(k, 0)
                                         + self.in_call_ns(tid, t, lat, evicted))
        if action == "passthrough" and not reason:
            self.f["old_passthrough"] += 1
        key = (api, action, sclass, err, warm, evicted > 0, reason, stack)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = Agg()
        g.add(lat, nbytes, err)
        if err:
            k = (result, api)
            self.errors[k] = self.errors.get(k, 0) + 1
        if self.top:
            self.offer_slow(lat, t, tid, "call", api, ptr, nbytes, result, action)

    def on_log_mode_call(self, reg, ptr, nbytes, lat):
        """Log mode: count registers that the pool would have served (the same
        address and size registered and unregistered before) and their cost."""
        r = self.registered
        if reg:
            key = (ptr, nbytes)
            prev = r.get(key, False)
            if prev is not False and prev is not None:
                self.f["rereg"] += 1
                self.f["rereg_ns"] += lat + prev
                c = size_class(nbytes)
                self.rereg_classes[c] = self.rereg_classes.get(c, 0) + 1
            if key in r or len(r) < PTR_MEMORY:
                r[key] = None
            if ptr in self.last_size or len(self.last_size) < PTR_MEMORY:
                self.last_size[ptr] = nbytes
        else:
            nb = self.last_size.get(ptr)
            if nb is not None and r.get((ptr, nb), False) is None:
                r[(ptr, nb)] = lat

    def on_real_register(self, t, ptr, nbytes, action):
        f = self.f
        if action == "forward" and self.mode == "defer" and self.pool_bytes and nbytes > self.pool_bytes:
            f["too_big"] += 1
            f["too_big_max"] = max(f["too_big_max"], nbytes)
        if ptr is None:
            return
        if ptr in self.idle_gone:
            f["idle_reuse"] += 1
            f["idle_gap_max_ns"] = max(f["idle_gap_max_ns"], t - self.idle_gone.pop(ptr))
        if ptr in self.lru_gone:
            self.lru_gone.discard(ptr)
            f["lru_reload"] += 1
        if ptr not in self.seen:
            n = self.freed_sizes.get(nbytes)
            if n:
                f["pattern"] += 1
                if n == 1:
                    del self.freed_sizes[nbytes]
                else:
                    self.freed_sizes[nbytes] = n - 1
            if len(self.seen) < PTR_MEMORY:
                self.seen.add(ptr)
            else:
                f["ptr_memory_full"] = True

    def in_call_ns(self, tid, t, lat, evicted):
        """The time of the evictions a call of `tid` ending at `t` made inside
        it (as the shim's Stats::InCallEvictionsNs)."""
        ns = taken = 0
        for et, elat in reversed(self.recent_evictions.get(tid, ())):
            if taken >= evicted:
                break
            if t - lat <= et <= t:
                ns += elat
                taken += 1
        return ns

    def on_evict(self, t, tid, ptr, nbytes, reason, result, lat, waited, forced, stack):
        self.last_t = t
        recent = self.recent_evictions.setdefault(tid, [])
        if len(recent) == RECENT_EVICTIONS:
            del recent[0]
        recent.append((t, lat))
        err = result != 0
        key = (reason, err, forced, stack)
        g = self.egroups.get(key)
        if g is None:
            g = self.egroups[key] = Agg()
        g.add(lat, nbytes, err)
        g.waited += waited
        if forced:
            g.forced += 1
            self.f["busy"] += 1
            self.f["busy_bytes"] += nbytes
        self.f["waited_ns"] += waited
        if ptr is not None:
            last = self.last_unregister.pop(ptr, t)
            if reason == "idle":
                self.idle_gone[ptr] = last
            elif reason == "lru":
                self.lru_gone.add(ptr)
            elif reason in FREE_REASONS:
                self.freed_sizes[nbytes] = self.freed_sizes.get(nbytes, 0) + 1
                self.idle_gone.pop(ptr, None)
                self.lru_gone.discard(ptr)
                self.seen.discard(ptr)
        if self.top:
            self.offer_slow(lat, t, tid, "evict", "evict", ptr, nbytes, result, reason)

    def offer_slow(self, lat, t, tid, record, api, ptr, nbytes, result, action):
        h = self.slowest
        if len(h) >= self.top and (lat, -t) <= h[0][:2]:
            return
        self.seq += 1
        row = {"pid": None, "t_ns": t, "tid": tid, "record": record, "api": api,
               "ptr": ("0x%x" % ptr) if ptr is not None else None, "bytes": nbytes,
               "result": result, "action": action, "latency_ns": lat}
        item = (lat, -t, -self.seq, row)
        if len(h) < self.top:
            heapq.heappush(h, item)
        else:
            heapq.heapreplace(h, item)

    def on_record(self, rec, lineno):
        """A record parsed by json (anything the fast paths did not take)."""
        kind = rec["type"]
        if kind == "call":
            if "device" in rec:  # written with several devices only (the fast path takes the rest)
                d = self.devices.setdefault(as_int(rec.get("device")), {"calls": 0, "total_ns": 0})
                d["calls"] += 1
                d["total_ns"] += max(0, as_int(rec.get("latency_ns")))
                act = str(rec.get("action", "?"))
                d[act] = d.get(act, 0) + 1
            self.on_call(as_int(rec.get("t_ns")), rec.get("tid"), ptr_int(rec.get("ptr")), str(rec.get("api", "?")),
                         max(0, as_int(rec.get("bytes"))), as_int(rec.get("result")),
                         max(0, as_int(rec.get("latency_ns"))), str(rec.get("action", "?")),
                         max(0, as_int(rec.get("evicted"))),
                         str(rec["reason"]) if isinstance(rec.get("reason"), str) else None,
                         as_int(rec["stack"], None) if "stack" in rec else None)
        elif kind == "evict":
            self.on_evict(as_int(rec.get("t_ns")), rec.get("tid"), ptr_int(rec.get("ptr")),
                          max(0, as_int(rec.get("bytes"))), str(rec.get("reason", "?")),
                          as_int(rec.get("result")), max(0, as_int(rec.get("latency_ns"))),
                          max(0, as_int(rec.get("waited_ns"))), rec.get("forced") is True,
                          as_int(rec["stack"], None) if "stack" in rec else None)
        elif kind == "host_release":
            r = str(rec.get("reason", "?"))
            self.host_releases[r] = self.host_releases.get(r, 0) + 1
        elif kind == "autopin":
            a = self.autopin
            if as_int(rec.get("result")) == 0:
                a["pins"] += 1
                a["bytes"] += max(0, as_int(rec.get("bytes")))
                a["register_ns"] += max(0, as_int(rec.get("latency_ns")))
                api = str(rec.get("api", "?"))
                a["apis"][api] = a["apis"].get(api, 0) + 1
            else:
                a["failed"] += 1
        elif kind == "log_cut":
            self.cut_at = as_int(rec.get("t_ns"))
            self.log_max = as_int(rec.get("log_max"), None)
        elif kind == "tally":
            self.tally = rec
        elif kind == "header":
            self.on_header(rec, lineno)
        elif kind == "warning":
            if len(self.warnings) < 1000:
                self.warnings.append(rec)
            else:
                self.warnings_dropped += 1
        elif kind == "summary":
            self.summary = rec
        elif kind == "objects":
            for o in rec.get("list") or []:
                if isinstance(o, dict):
                    base, size = ptr_int(o.get("base")), as_int(o.get("size"))
                    if base is not None and size > 0 and isinstance(o.get("path"), str):
                        self.objects.append((base, size, o["path"]))
        elif kind == "stack":
            sid = as_int(rec.get("id"), None)
            frames = rec.get("frames")
            if sid is not None and isinstance(frames, list):
                self.stacks[sid] = [p for p in (ptr_int(x) for x in frames) if p is not None]
                if isinstance(rec.get("python"), str) and rec["python"]:
                    self.python_lines[sid] = rec["python"]
        # other types: ignored (newer writers may add some)

    # ---- the whole file

    def read(self, f, progress=None):
        call_match = CALL_RE.match
        evict_match = EVICT_RE.match
        on_call = self.on_call
        on_evict = self.on_evict
        loads = json.loads
        groups = self.groups
        last_unregister = self.last_unregister
        site_of = self.site_of
        # call shapes (api, bytes, action, evicted, reason, stack, result as
        # written) whose record changes nothing but their group: summed here
        # without the general path. value: (group, is a deferred unregister)
        plain = {}
        slow = self.slowest
        top = self.top
        floor = -1 if top else 1 << 62
        records = 0
        ncalls = 0
        last_t = None
        rest = b""
        lineno = 0
        skipped = 0
        first_skipped = None
        content = False
        done = 0
        pending_bad = None   # (lineno) of an unreadable line, until we know it is not the last
        while True:
            chunk = f.read(CHUNK)
            eof = not chunk
            if eof:
                data = rest.rstrip(b"\0")
                lines = [data] if data.strip() else []
                ends_with_newline = not lines
                rest = b""
            else:
                done += len(chunk)
                lines = (rest + chunk).split(b"\n") if rest else chunk.split(b"\n")
                rest = lines.pop()
            for line in lines:
                lineno += 1
                if pending_bad is not None:
                    skipped += 1
                    if first_skipped is None:
                        first_skipped = pending_bad
                    pending_bad = None
                m = call_match(line)
                if m is not None:
                    content = True
                    records += 1
                    ck = m.group(3, 5, 8, 9, 10, 11, 6)  # api bytes action evicted reason stack result
                    if site_of and ck[5] is None:  # a hit or deferral is its registration's
                        p4 = m.group(4)
                        ck = ck + (site_of.get(int(p4, 16)) if p4[:2] == b"0x" else None,)
                    hit = plain.get(ck)
                    if hit is not None:
                        g, deferred = hit
                        lat = int(m.group(7))
                        nb = ck[1]
                        ncalls += 1
                        last_t = m
                        if deferred:
                            last_unregister[int(m.group(4), 16)] = int(m.group(1))
                        g.n += 1
                        g.total += lat
                        g.sq += lat * lat
                        if lat > g.max:
                            g.max = lat
                        if lat < 32:
                            i = lat if lat > 0 else 0
                        else:
                            sh = lat.bit_length() - 6
                            i = ((sh + 1) << 5) + ((lat >> sh) & 31)
                        b = g.b
                        b[i] = b.get(i, 0) + 1
                        if nb != b"0":
                            g.bytes += int(nb)
                        if lat >= floor:
                            self.offer_slow(lat, int(m.group(1)), int(m.group(2)), "call",
                                            ck[0].decode(), int(m.group(4), 16), int(nb), 0,
                                            ck[2].decode())
                            if len(slow) >= top:
                                floor = slow[0][0]
                        continue
                    t, tid, api, p, nb, res, lat, act, ev, rsn, st = m.groups()
                    lat = int(lat)
                    ptr = int(p, 16) if p[:2] == b"0x" else ptr_int(p.decode())
                    action = host_action(api.decode(), act.decode())
                    on_call(int(t), int(tid), ptr, api.decode(), int(nb), int(res), lat, action,
                            int(ev), rsn.decode() if rsn is not None else None,
                            int(st) if st is not None else None)
                    last_t = None
                    if top and len(slow) >= top:
                        floor = slow[0][0]
                    if (res == b"0" and ev == b"0" and p[:2] == b"0x"
                            and (action == "hit" or action == "deferred"
                                 or (action == "passthrough" and rsn))):
                        api_s = api.decode()
                        reg = "Register" in api_s and "Unregister" not in api_s
                        sid = int(st) if st is not None else (
                            site_of.get(ptr) if action in ("hit", "deferred") else None)
                        key = (api_s, action, size_class(int(nb)) if reg else None, False, False,
                               False, rsn.decode() if rsn is not None else None, sid)
                        if site_of and st is None and len(ck) == 7:
                            ck = ck + (site_of.get(ptr),)
                        plain[ck] = (groups[key], action == "deferred")
                    continue
                m = evict_match(line)
                if m is not None:
                    content = True
                    self.records += 1
                    t, tid, p, nb, rsn, res, lat, w, forced, st = m.groups()
                    last_t = None
                    on_evict(int(t), int(tid), int(p, 16) if p[:2] == b"0x" else ptr_int(p.decode()),
                             int(nb), rsn.decode(), int(res), int(lat), int(w) if w else 0,
                             forced == b"true", int(st) if st is not None else None)
                    continue
                if not line.strip(b" \t\r\0"):
                    continue
                content = True
                try:
                    try:
                        rec = loads(line)
                    except UnicodeDecodeError:
                        rec = loads(line.decode("utf-8", errors="replace"))
                    if not isinstance(rec, dict) or not isinstance(rec.get("type"), str):
                        raise ValueError("not a record")
                except ValueError:
                    pending_bad = lineno
                    continue
                self.records += 1
                last_t = None
                self.on_record(rec, lineno)
            if progress is not None:
                progress.update(done, self.path)
            if eof:
                break
        self.records += records
        self.calls += ncalls
        if last_t is not None:
            self.last_t = int(last_t.group(1))
        if pending_bad is not None:
            if ends_with_newline:
                skipped += 1
                if first_skipped is None:
                    first_skipped = pending_bad
            else:
                self.cut = True
                self.reader_warnings.append(
                    "log was cut: %s ends with an incomplete record "
                    "(the process may have crashed)" % self.path)
        if skipped:
            self.reader_warnings.append(
                "%s: skipped %d unreadable line%s (first at line %d)"
                % (self.path, skipped, "" if skipped == 1 else "s", first_skipped))
        return content

    def merge_tally(self):
        """Adds the shim's tally of the calls past the log's bound to the
        groups read from the records: the tables stay exact."""
        if self.cut_at is None:
            return
        t = self.tally
        if not isinstance(t, dict):
            self.reader_warnings.append(
                "%s: per-call records end at t=%.3f s (LAZYPIN_LOG_MAX) and no tally of the "
                "calls after it was written (the process ended before its first); tables "
                "count only the calls before" % (self.path, self.cut_at / 1e9))
            return

        def agg(r):
            a = Agg()
            a.n = max(0, as_int(r.get("n")))
            a.errors = max(0, as_int(r.get("errors")))
            a.bytes = max(0, as_int(r.get("bytes")))
            a.total = max(0, as_int(r.get("total_ns")))
            sq = r.get("sq")
            a.sq = sq if isinstance(sq, (int, float)) and not isinstance(sq, bool) else 0
            a.max = max(0, as_int(r.get("max_ns")))
            for pair in r.get("hist") or []:
                if isinstance(pair, list) and len(pair) == 2:
                    i, n = as_int(pair[0]), as_int(pair[1])
                    a.b[i] = a.b.get(i, 0) + n
            return a

        for c in t.get("calls") or []:
            if not isinstance(c, dict):
                continue
            api = str(c.get("api", "?"))
            action = host_action(api, str(c.get("action", "?")))
            sclass = c.get("size_class") if isinstance(c.get("size_class"), str) else None
            result = as_int(c.get("result"))
            reason = c.get("reason") if isinstance(c.get("reason"), str) else None
            stack = as_int(c.get("stack"), 0) or None
            key = (api, action, sclass, result != 0, c.get("warm") is True,
                   c.get("evicted") is True, reason, stack)
            a = agg(c)
            g = self.groups.get(key)
            if g is None:
                g = self.groups[key] = Agg()
            g.merge(a)
            self.calls += a.n
            if result != 0:
                self.errors[(result, api)] = self.errors.get((result, api), 0) + a.n
            ns = as_int(c.get("in_call_evictions_ns"))
            if ns:
                k = (action, sclass)
                self.in_call_evictions[k] = self.in_call_evictions.get(k, 0) + ns
        for e in t.get("evictions") or []:
            if not isinstance(e, dict):
                continue
            forced = e.get("forced") is True
            key = (str(e.get("reason", "?")), e.get("error") is True, forced, None)
            a = agg(e)
            if forced:
                a.forced = a.n
                self.f["busy"] += a.n
                self.f["busy_bytes"] += a.bytes
            g = self.egroups.get(key)
            if g is None:
                g = self.egroups[key] = Agg()
            g.merge(a)
        t_ns = as_int(t.get("t_ns"))
        end = as_int((self.summary or {}).get("t_ns"), None)
        note = ("%s: per-call records end at t=%.3f s (the log's bound, LAZYPIN_LOG_MAX=%s); "
                "counts, times and histograms after it come from the shim's tally"
                % (self.path, self.cut_at / 1e9, fmt_bytes(self.log_max) if self.log_max else "?"))
        if end is not None and t_ns < end and (self.summary or {}).get("ended_by") != "exit":
            note += " as of t=%.3f s (the process ended at %.3f s, before its next tally)" % (
                t_ns / 1e9, end / 1e9)
        self.reader_warnings.append(note)
        self.last_t = max(self.last_t or 0, t_ns)

    def check(self):
        """Warnings about the file as a whole, once it is read."""
        self.merge_tally()
        path = self.path
        if self.header is None:
            self.reader_warnings.append(
                "%s: no header record (the start of the log is missing); "
                "reporting the records found" % path)
        if self.summary is None and not self.cut:
            self.reader_warnings.append(
                "%s: no summary record: the process did not exit normally "
                "(or is still running)" % path)
        if self.warnings_dropped:
            self.reader_warnings.append("%s: %d more shim warnings not shown"
                                        % (path, self.warnings_dropped))
        if self.summary is None:
            return
        dropped = as_int(self.summary.get("records_dropped"))
        if dropped:
            self.reader_warnings.append(
                "%s: the shim dropped %d record%s (the log writer fell behind); "
                "figures from call records undercount"
                % (path, dropped, "" if dropped == 1 else "s"))
            return
        apis = self.summary.get("apis")
        if isinstance(apis, dict):
            counted = {}
            for key, g in self.groups.items():
                counted[key[0]] = counted.get(key[0], 0) + g.n
            for api, s in sorted(apis.items()):
                if isinstance(s, dict) and "calls" in s and as_int(s["calls"]) != counted.get(api, 0):
                    self.reader_warnings.append(
                        "%s: the summary counts %d %s calls, the log holds %d call records"
                        % (path, as_int(s["calls"]), api, counted.get(api, 0)))

    def slow_rows(self):
        rows = []
        for _, _, _, row in self.slowest:
            r = dict(row)
            r["pid"] = self.pid
            rows.append(r)
        return rows


def expand_inputs(args):
    """LOG arguments -> [(path, explicit)]. Directories give their *.jsonl,
    globs their matches; a named file that does not exist is fatal."""
    out = []
    seen = set()

    def add(p, explicit):
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            out.append((p, explicit))

    for arg in args:
        if os.path.isdir(arg):
            files = sorted(glob.glob(os.path.join(glob.escape(arg), "*.jsonl")))
            if not files:
                raise ReportError("%s: directory holds no *.jsonl log" % arg)
            for f in files:
                add(f, False)
        elif os.path.exists(arg):
            add(arg, True)
        elif glob.has_magic(arg):
            files = sorted(f for f in glob.glob(arg) if os.path.isfile(f))
            if not files:
                raise ReportError("%s: no such file" % arg)
            for f in files:
                add(f, False)
        else:
            raise ReportError("%s: no such file" % arg)
    return out


def read_log(path, explicit=True, progress=None, top=10):
    """Read one log. Returns a Log, or None for an empty file found through
    a directory or glob (skipped). Raises ReportError for unusable files."""
    log = Log(path, top)
    try:
        with open(path, "rb") as f:
            content = log.read(f, progress)
    except FileNotFoundError:
        raise ReportError("%s: no such file" % path)
    except IsADirectoryError:
        raise ReportError("%s: is a directory" % path)
    except OSError as e:
        raise ReportError("%s: %s" % (path, e.strerror or e))
    if not content:
        if explicit:
            raise ReportError("%s: empty log (no records: the program made no "
                              "registration call, or the log was never written)" % path)
        return None
    if log.records == 0:
        raise ReportError("%s: no lazypin records in this file" % path)
    log.check()
    return log


def load(args, top=10, progress=True, lenient=False):
    """The logs `args` name. A bad file found through a directory or glob is
    skipped and named; one named on the command line is fatal, unless
    `lenient` (lazypin run's closing lines, on the files a pattern matched)."""
    inputs = [(p, explicit and not lenient) for p, explicit in expand_inputs(args)]
    total = 0
    for p, _ in inputs:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    prog = Progress(total) if progress else None
    logs = []
    skipped = []     # (path, why) of files found through a directory or glob
    try:
        for path, explicit in inputs:
            try:
                log = read_log(path, explicit, prog, top)
            except ReportError as e:
                if explicit:
                    raise
                # one bad file of a directory or glob: the others are reported
                skipped.append((path, str(e)[len(path) + 2:] if str(e).startswith(path + ": ") else str(e)))
                continue
            if prog is not None:
                try:
                    prog.file_done(os.path.getsize(path))
                except OSError:
                    pass
            if log is None:
                skipped.append((path, "empty log"))
            else:
                logs.append(log)
    finally:
        if prog is not None:
            prog.finish()
    if not logs:
        if skipped and all(why == "empty log" for _, why in skipped):
            raise ReportError("%s: empty log%s (no records)"
                              % (", ".join(p for p, _ in skipped), "" if len(skipped) == 1 else "s"))
        raise ReportError("no log could be read: %s" % "; ".join("%s: %s" % s for s in skipped)
                          if skipped else "%s: empty log (no records)" % " ".join(args))
    for path, why in skipped:
        logs[0].reader_warnings.append("%s: %s, skipped" % (path, why))
        print("%s: %s: %s, skipped" % (PROG, path, why), file=sys.stderr)
    return logs


# The process a log comes from: rank, program, arguments, host.

ARGV_RANK = re.compile(r"^--?(?:local[-_])?rank(?:=(\d+))?$")
ENV_RANK = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", "LOCAL_RANK")


def process_rank(h):
    """The job rank of a process: the header's "rank", its "env" (RANK,
    OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, ...), or --rank N in argv."""
    if isinstance(h.get("rank"), int) and not isinstance(h.get("rank"), bool):
        return h["rank"]
    env = h.get("env")
    if isinstance(env, dict):
        for k in ENV_RANK:
            v = env.get(k)
            if isinstance(v, (str, int)) and str(v).isdigit():
                return int(v)
    argv = h.get("argv")
    if isinstance(argv, list):
        for i, a in enumerate(argv):
            m = ARGV_RANK.match(str(a))
            if not m:
                continue
            if m.group(1):
                return int(m.group(1))
            if i + 1 < len(argv) and str(argv[i + 1]).isdigit():
                return int(argv[i + 1])
    return None


def process_info(log):
    h = log.header or {}
    s = log.summary or {}
    pool = s.get("pool") if isinstance(s.get("pool"), dict) else {}
    mode = h.get("mode") or (h.get("config") or {}).get("mode")
    return {
        "file": log.path,
        "host": h.get("host") if isinstance(h.get("host"), str) else None,
        "pid": log.pid,
        "rank": process_rank(h),
        "exe": h.get("exe"),
        "argv": h.get("argv") if isinstance(h.get("argv"), list) else None,
        "mode": mode,
        "mode_requested": h.get("mode_requested") or mode,
        "mode_reason": h.get("mode_reason") or "",
        "watch": h.get("watch"),
        "watch_reason": h.get("watch_reason") or "",
        "lazypin": h.get("lazypin"),
        "format": h.get("format"),
        "config": h.get("config") if isinstance(h.get("config"), dict) else None,
        "driver_version": as_int(h.get("driver_version"), None) if "driver_version" in h else None,
        "start_unix_ns": as_int(h.get("start_unix_ns"), None) if "start_unix_ns" in h else None,
        "start_time": iso_start(as_int(h.get("start_unix_ns"), 0)),
        "records": log.records,
        "calls": log.calls,
        "has_header": log.header is not None,
        "has_summary": log.summary is not None,
        "ended_by": s.get("ended_by") if log.summary is not None else None,
        "duration_ns": (as_int(s.get("t_ns"), None) if log.summary is not None else log.last_t),
        "cut": log.cut,
        "records_end_ns": log.cut_at,
        "pool_peak_bytes": as_int(pool.get("peak_bytes"), None) if "peak_bytes" in pool else None,
        "pool_peak_entries": as_int(pool.get("peak_entries"), None) if "peak_entries" in pool else None,
    }
