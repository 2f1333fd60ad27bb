#!/usr/bin/env python3
"""users_round.py: the runner as a user meets it, on a GPU machine, from the
packed tree (scripts/pack's dist/). For each of: the seed benchmark, a torch
DataLoader with pin_memory=True (the pinned allocator on cudaHostRegister),
and a three-rank torchrun job, it runs `lazypin run` once in log mode and
once with --defer into one directory and checks that
  - the closing block names every log written (lazypin: N logs:),
  - the defer run gets one saving figure (priced from its own calls or, said
    so, from the log-mode run beside it),
  - `lazypin report DIR` of the defer logs gives the same figure,
  - with torchrun, every process's rank is shown (0, 1, 2).
Prints one line per check; exit 1 on a failure; a case without torch skips.

    python3 tests/gpu/users_round.py [DIST]        (default: dist)
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

DATALOADER = r"""
import torch
torch.cuda.init()
ds = torch.utils.data.TensorDataset(torch.randn(4096, 1024))
dl = torch.utils.data.DataLoader(ds, batch_size=256, pin_memory=True, num_workers=2)
for _ in range(5):
    for (x,) in dl:
        x.cuda(non_blocking=True)
torch.cuda.synchronize()
"""

RANK_JOB = r"""
import os, torch
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
buf = torch.empty(4 << 20, dtype=torch.uint8)
cudart = torch.cuda.cudart()
for _ in range(200):
    assert cudart.cudaHostRegister(buf.data_ptr(), buf.numel(), 0) == 0
    assert cudart.cudaHostUnregister(buf.data_ptr()) == 0
"""

FAILED = []


def check(ok, what):
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        FAILED.append(what)


def run(lazypin, d, args, cmd):
    r = subprocess.run([sys.executable, lazypin, "run"] + args + ["--log", d + "/", "--"] + cmd,
                       capture_output=True, text=True, timeout=900, cwd=d)
    return r


def case(lazypin, name, cmd, ranks=None):
    d = tempfile.mkdtemp(prefix="lazypin-users-%s-" % name)
    try:
        bare = run(lazypin, d, [], cmd)
        before = set(glob.glob(os.path.join(d, "*.jsonl")))
        r = run(lazypin, d, ["--defer"], cmd)
        logs = sorted(set(glob.glob(os.path.join(d, "*.jsonl"))) - before)
        check(bare.returncode == 0 and r.returncode == 0, "%s: both runs exit 0 (%d, %d)"
              % (name, bare.returncode, r.returncode))
        m = re.search(r"lazypin: (\d+) logs?:\n((?:  .*\n)+)", r.stderr)
        named = set(l.strip() for l in m.group(2).splitlines()) if m else set()
        check(m is not None and set(logs) <= named,
              "%s: the closing block names every log (%d written)" % (name, len(logs)))
        pool = [l for l in r.stderr.splitlines() if l.strip().startswith("pool:")]
        check(len(pool) == 1 and ("saved " in pool[0] or "cost " in pool[0]),
              "%s: one saving figure: %s" % (name, pool[0].strip() if pool else "none"))
        rep = subprocess.run([sys.executable, lazypin, "report", "--json"] + logs,
                             capture_output=True, text=True, timeout=900)
        doc = json.loads(rep.stdout)
        text = doc["pool"]["saving"]["text"]
        check(bool(pool) and text in pool[0], "%s: lazypin report of the logs says the same: %s"
              % (name, text))
        if ranks:
            got = sorted(p["rank"] for p in doc["processes"] if p["rank"] is not None)
            check(set(range(ranks)) <= set(got), "%s: every rank shown: %r" % (name, got))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv):
    dist = os.path.abspath(argv[1] if len(argv) > 1 else "dist")
    lazypin = os.path.join(dist, "bin", "lazypin")
    case(lazypin, "seed", [os.path.join(dist, "bin", "seed"), "--repeat", "1000"])
    have_torch = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                                capture_output=True).returncode == 0
    if not have_torch:
        print("skip torch cases: no torch with CUDA for %s" % sys.executable)
    else:
        # The pinned allocator on cudaHostRegister, as LLM servers and
        # trainers configure it.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "pinned_use_cuda_host_register:True"
        case(lazypin, "dataloader", [sys.executable, "-c", DATALOADER])
        del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(RANK_JOB)
        case(lazypin, "torchrun", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                                   f.name], ranks=3)
        os.unlink(f.name)
    print("%d failed" % len(FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
