"""NCCL traffic while one rank pins and unpins host memory (scripts/gpu-suite,
row "multigpu nccl"; needs several GPUs and PyTorch with NCCL).

One process per GPU (torch.multiprocessing, as torchrun would start them),
each inheriting LD_PRELOAD and the LAZYPIN_* variables. Every rank all-reduces
a 64 MiB tensor --iters times and times each (synchronized); rank 0 also
registers and unregisters a 64 MiB host buffer (cudaHostRegister through
torch.cuda.cudart()) every --every iterations, with a copy from it between.
Bare, each unregister waits for the device and stalls the all-reduces; with
lazypin --defer the unregister is deferred and later ones are hits.

    python3 multigpu_nccl.py [--devices N] [--iters 200] [--every 5]

Prints "DATA OK" when every all-reduce gave the expected sum, and per rank
RESULT rank=<r> median_ms= worst_ms=. Exit 3 when PyTorch, NCCL or enough
GPUs are missing (the suite skips the row).
"""
import argparse
import os
import sys
import time


def worker(rank, world, iters, every, port, results):
    import ctypes

    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    x = torch.empty(64 << 18, dtype=torch.float32, device="cuda")  # 64 MiB
    host = ctypes.create_string_buffer(64 << 20)
    dev = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    cudart = torch.cuda.cudart()
    times, ok = [], True
    for i in range(iters):
        x.fill_(rank + 1)
        if rank == 0 and i % every == 0:
            ptr = ctypes.addressof(host)
            cudart.cudaHostRegister(ptr, 64 << 20, 0)
            dev.copy_(torch.frombuffer(host, dtype=torch.uint8), non_blocking=True)
            cudart.cudaHostUnregister(ptr)
        t0 = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        ok = ok and float(x[0]) == world * (world + 1) / 2 and float(x[-1]) == float(x[0])
    times.sort()
    results[rank] = (ok, times[len(times) // 2], times[-1])
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=0)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--every", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError as e:
        print("multigpu_nccl: no PyTorch (%s)" % e, file=sys.stderr)
        sys.exit(3)
    n = torch.cuda.device_count()
    world = min(n, args.devices) if args.devices else n
    if world < 2 or not dist.is_nccl_available():
        print("multigpu_nccl: %d GPU(s), NCCL %s: 2 GPUs and NCCL needed"
              % (n, "available" if dist.is_nccl_available() else "missing"), file=sys.stderr)
        sys.exit(3)
    results = mp.Manager().dict()
    port = 29500 + os.getpid() % 1000
    mp.spawn(worker, args=(world, args.iters, args.every, port, results), nprocs=world, join=True)
    for r in range(world):
        ok, med, worst = results[r]
        print("RESULT rank=%d median_ms=%.3f worst_ms=%.3f" % (r, med, worst))
    print("DATA OK" if all(results[r][0] for r in range(world)) else "DATA MISMATCH")


if __name__ == "__main__":
    main()
