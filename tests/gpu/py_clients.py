"""Python clients of host registration, for scripts/gpu-suite (GPU only).

    python3 py_clients.py torch|torch_pinned|cupy|numba

Each registers one host buffer three times (so that lazypin's defer mode can
serve the 2nd and 3rd from its pool), copies a fresh pattern to the device and
back each time, and checks the bytes. Prints only deterministic lines, so the
output with and without lazypin can be compared; ends with DATA OK.
"""
import sys

import numpy as np

N = 4 << 20
which = sys.argv[1]
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
else:
    sys.exit("unknown client " + which)
print("DATA OK")
