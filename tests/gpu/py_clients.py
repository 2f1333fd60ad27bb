"""Python clients of host registration, for scripts/gpu-suite (GPU only).

    python3 py_clients.py torch|torch_query|torch_pinned|torch_hostalloc|cupy|numba
    python3 py_clients.py torch_loop|cupy_loop|numba_loop [SIZES]

The *_loop clients (LAZYPIN_AUTOPIN) copy ordinary pageable arrays,
which nobody pins: PyTorch .cuda()/.cpu(), CuPy asarray/asnumpy, numba
to_device/copy_to_host, repeated on 4 MiB, 256 MiB and 1 GiB (SIZES: a comma
list of MiB), checking the bytes. Their times go to stderr as
"TIME client=... size=... op=... first_us=... median_us=..." lines.

Each registers one host buffer three times (so that lazypin's defer mode can
serve the 2nd and 3rd from its pool), copies a fresh pattern to the device and
back each time, and checks the bytes. Prints only deterministic lines, so the
output with and without lazypin can be compared; ends with DATA OK.
torch_query makes six such rounds and asks t.is_pinned() (a pointer query)
after each unregister, printing its answer.
torch_hostalloc (PyTorch's default pin_memory: cudaHostAlloc, freed with
cudaFreeHost by torch._C._host_emptyCache) also times its cycles, on stderr:
"TIME torch_hostalloc size=N cycle_us=.. kept_us=.. ratio=..".
"""
import sys

import numpy as np

N = 4 << 20
which = sys.argv[1]
LOOP_SIZES = [int(x) << 20 for x in (sys.argv[2] if len(sys.argv) > 2 else "4,256,1024").split(",")]
LOOP_REPEAT = 10


def timed_loop(client, size, op, fn):
    """Runs fn() once (first) and LOOP_REPEAT times more; reports to stderr."""
    import time
    t0 = time.perf_counter()
    out = fn()
    first = (time.perf_counter() - t0) * 1e6
    times = []
    for _ in range(LOOP_REPEAT):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    print("TIME client=%s size=%dM op=%s first_us=%.1f median_us=%.1f"
          % (client, size >> 20, op, first, times[len(times) // 2]), file=sys.stderr, flush=True)
    return out


def loop_pattern(size, seed):
    return (np.arange(size, dtype=np.uint32) * (seed + 3) % 253).astype(np.uint8)
buf = np.zeros(N, dtype=np.uint8)
ptr = buf.ctypes.data


def pattern(i):
    buf[:] = (np.arange(N, dtype=np.uint32) * (i + 7) % 251).astype(np.uint8)
    return buf.copy()


def check(got, want, what):
    if not np.array_equal(got, want):
        print("DATA MISMATCH", what)
        sys.exit(2)


if which == "torch":
    import torch
    cr = torch.cuda.cudart()
    for i in range(3):
        want = pattern(i)
        print("register", int(cr.cudaHostRegister(ptr, N, 0)))
        dev = torch.from_numpy(buf).to("cuda", non_blocking=False)
        check(dev.cpu().numpy(), want, "torch round trip")
        print("unregister", int(cr.cudaHostUnregister(ptr)))
elif which == "torch_query":
    import torch
    cr = torch.cuda.cudart()
    t = torch.from_numpy(buf)
    for i in range(6):
        want = pattern(i)
        print("register", int(cr.cudaHostRegister(ptr, N, 0)))
        dev = t.to("cuda", non_blocking=False)
        check(dev.cpu().numpy(), want, "torch round trip")
        print("unregister", int(cr.cudaHostUnregister(ptr)))
        print("is_pinned", t.is_pinned())
elif which == "torch_pinned":
    # PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True: the caching
    # host allocator registers malloc'd blocks instead of cudaHostAlloc.
    import torch
    for i in range(3):
        t = torch.empty(N, dtype=torch.uint8, pin_memory=True)
        want = pattern(i)
        t.copy_(torch.from_numpy(want))
        check(t.to("cuda").cpu().numpy(), want, "pinned tensor round trip")
        print("pinned", t.is_pinned())
        del t
        empty = getattr(torch._C, "_host_emptyCache", None)
        if empty is not None:
            torch.cuda.synchronize()
            empty()
elif which == "torch_hostalloc":
    # The default caching host allocator: pin_memory() allocates with
    # cudaHostAlloc; _host_emptyCache() frees its free blocks with cudaFreeHost,
    # so every cycle below is an allocation and a free of the same size.
    import time
    import torch
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is None:
        sys.exit("torch._C._host_emptyCache is missing")
    for n in (4 << 20, 256 << 20):
        src = torch.from_numpy((np.arange(n, dtype=np.uint32) % 251).astype(np.uint8))
        cycle, kept = [], []
        for i in range(12):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            pinned = src.pin_memory()
            dev = pinned.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            del pinned
            empty()
            cycle.append(time.perf_counter() - t0)
        check(dev.cpu().numpy(), src.numpy(), "pin_memory cycle")
        pinned = src.pin_memory()
        for i in range(12):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            pinned.copy_(src)
            dev = pinned.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            kept.append(time.perf_counter() - t0)
        check(dev.cpu().numpy(), src.numpy(), "kept pinned copy")
        del pinned
        empty()
        c, k = sorted(cycle)[len(cycle) // 2], sorted(kept)[len(kept) // 2]
        sys.stderr.write("TIME torch_hostalloc size=%d cycle_us=%.1f kept_us=%.1f ratio=%.2f\n"
                         % (n, c * 1e6, k * 1e6, c / k))
        print("pin_memory cycles", n, "ok")
elif which == "cupy":
    import cupy
    for i in range(3):
        want = pattern(i)
        cupy.cuda.runtime.hostRegister(ptr, N, 0)
        check(cupy.asnumpy(cupy.asarray(buf)), want, "cupy round trip")
        cupy.cuda.runtime.hostUnregister(ptr)
        print("registered and unregistered")
elif which == "numba":
    from numba import cuda
    for i in range(3):
        want = pattern(i)
        with cuda.pinned(buf):
            check(cuda.to_device(buf).copy_to_host(), want, "numba round trip")
        print("pinned block done")
elif which == "torch_loop":
    import torch
    for size in LOOP_SIZES:
        host = torch.from_numpy(loop_pattern(size, 1))
        dev = timed_loop(which, size, "cuda", lambda: host.cuda())
        torch.cuda.synchronize()
        back = timed_loop(which, size, "cpu", lambda: dev.cpu())
        check(back.numpy(), host.numpy(), "torch .cuda()/.cpu() %d" % size)
        print("torch loop", size >> 20, "MiB ok")
        del dev, back, host
elif which == "cupy_loop":
    import cupy
    for size in LOOP_SIZES:
        host = loop_pattern(size, 2)
        dev = timed_loop(which, size, "asarray", lambda: cupy.asarray(host))
        back = timed_loop(which, size, "asnumpy", lambda: cupy.asnumpy(dev))
        check(back, host, "cupy asarray/asnumpy %d" % size)
        print("cupy loop", size >> 20, "MiB ok")
        del dev, back
elif which == "numba_loop":
    from numba import cuda
    for size in LOOP_SIZES:
        host = loop_pattern(size, 3)
        dev = timed_loop(which, size, "to_device", lambda: cuda.to_device(host))
        back = timed_loop(which, size, "copy_to_host", lambda: dev.copy_to_host())
        check(back, host, "numba to_device/copy_to_host %d" % size)
        print("numba loop", size >> 20, "MiB ok")
        del dev, back
else:
    sys.exit("unknown client " + which)
print("DATA OK")
