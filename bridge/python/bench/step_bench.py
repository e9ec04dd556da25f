"""Training-step time with gocoll's hooks vs DDP on gloo, and the cost of
calling gocoll from Python (ctypes) vs from C.

    /usr/bin/python3 bridge/python/bench/step_bench.py [--ranks 4] [--steps 20]

Starts the ranks itself (fresh interpreters with torchrun-style variables).
Part 1, per training step of the same MLP on the same ranks (rank 0's mean
over the timed steps, after warm-up):
  local       forward+backward+SGD step, no communication (compute floor)
  gocoll-dg   gocoll.torch.DistributedGradients, buckets averaged during backward
  ddp+gocoll  DDP (gloo process group) with gocoll.torch.allreduce_hook
  ddp-gloo    plain DDP on gloo
Part 2, one in-place float32 allreduce per call, microseconds per call:
  C           bench/allreduce_c.c compiled with gcc against libgocoll
  py-numpy    comm.allreduce(numpy array)
  py-torch    comm.allreduce(torch tensor)
  gloo        torch.distributed.all_reduce (for scale)
The difference py − C is what the Python bridge (validation + ctypes) adds.
The machine may have fewer cores than ranks: then ranks share cores and
times are inflated; compare ratios.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BRIDGE = os.path.dirname(HERE)
sys.path.insert(0, BRIDGE)
sys.path.insert(0, os.path.join(BRIDGE, "tests"))

SIZES = [4, 4096, 65536, 1 << 20, 4 << 20]
MODES = ["local", "gocoll-dg", "ddp+gocoll", "ddp-gloo"]


# ---------------------------------------------------------------------------
# workers (one process per rank)


def _model(width, depth):
    import torch
    from torch import nn
    torch.manual_seed(0)
    layers, d = [], width
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def worker_steps(args):
    import torch
    import torch.distributed as dist
    from torch import nn

    import gocoll
    import gocoll.torch as gt
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    comm = gocoll.init()
    rank = comm.rank
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    out = {"params": sum(p.numel() for p in _model(args.width, args.depth).parameters())}
    for mode in MODES:
        model = _model(args.width, args.depth)
        net, step_fn = model, None
        if mode == "gocoll-dg":
            dg = gt.DistributedGradients(model, comm, bucket_cap_mb=args.bucket_mb)
            opt = gt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), dg)
        elif mode.startswith("ddp"):
            net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
            if mode == "ddp+gocoll":
                net.register_comm_hook(comm, gt.allreduce_hook)
            opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

        for _ in range(args.warmup):
            step()
        comm.barrier()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        comm.barrier()
        times.sort()
        out[mode] = {"mean_ms": 1000 * sum(times) / len(times), "p50_ms": 1000 * times[len(times) // 2]}
        if mode == "gocoll-dg":
            out["dg_buckets"] = len(dg.buckets)
            dg.remove()
    comm.destroy()
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def worker_calls(args):
    import numpy as np
    import torch
    import torch.distributed as dist

    import gocoll
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    comm = gocoll.init()
    out = {"py-numpy": {}, "py-torch": {}, "gloo": {}}
    for nbytes in SIZES:
        n = nbytes // 4
        a = np.ones(n, dtype=np.float32)
        t = torch.ones(n)
        iters = args.iters if nbytes <= 65536 else max(args.iters // 20, 20)
        for name, fn in (("py-numpy", lambda: comm.allreduce(a)), ("py-torch", lambda: comm.allreduce(t)),
                         ("gloo", lambda: dist.all_reduce(t))):
            for _ in range(iters // 10 + 1):
                fn()
            best = float("inf")
            for _ in range(5):  # best of 5 loops, as the C side: the machine may be shared
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                best = min(best, (time.perf_counter() - t0) / iters * 1e6)
            out[name][str(nbytes)] = best
    # the bridge alone: validation + argument conversion, no library call
    from gocoll._buffer import as_buffer
    a = np.ones(1, dtype=np.float32)
    t = torch.ones(1)
    for name, obj in (("numpy", a), ("torch", t)):
        k = 100000
        t0 = time.perf_counter()
        for _ in range(k):
            as_buffer(obj)
        out["as_buffer_" + name + "_us"] = (time.perf_counter() - t0) / k * 1e6
    comm.destroy()
    dist.destroy_process_group()
    if comm.rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------
# driver


def compile_c(lib):
    libdir = os.path.dirname(os.path.realpath(lib))
    inc = os.path.join(os.path.dirname(libdir), "include")
    if not os.path.exists(os.path.join(inc, "gocoll.h")):
        inc = os.path.join(os.path.dirname(os.path.dirname(BRIDGE)), "capi")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler"
    d = tempfile.mkdtemp(prefix="gocoll-bench-")
    exe = os.path.join(d, "allreduce_c")
    r = subprocess.run([cc, "-O2", "-o", exe, os.path.join(HERE, "allreduce_c.c"), "-I", inc,
                        os.path.realpath(lib), "-Wl,-rpath," + libdir], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        return None, r.stderr
    return exe, d


def _print_steps(args, res):
    print("\nPart 1: time per training step, MLP %d×%d (%d parameters, %.1f MiB of gradients), batch %d "
          "per rank, bucket cap %g MiB (gocoll-dg: %d buckets), %d ranks"
          % (args.depth, args.width, res["params"], res["params"] * 4 / 2 ** 20, args.batch, args.bucket_mb,
             res["dg_buckets"], args.ranks))
    print("  %-12s %10s %10s %12s" % ("mode", "mean ms", "p50 ms", "/ ddp-gloo"))
    for m in MODES:
        print("  %-12s %10.2f %10.2f %12.2f" % (m, res[m]["mean_ms"], res[m]["p50_ms"],
                                                res[m]["mean_ms"] / res["ddp-gloo"]["mean_ms"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=1000, help="allreduce calls per timed loop (small sizes)")
    ap.add_argument("--call-ranks", default="1,2",
                    help="rank counts for part 2 (comma-separated; 1 isolates the per-call cost)")
    ap.add_argument("--skip-steps", action="store_true", help="run part 2 only")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", choices=["steps", "calls"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "steps":
        return worker_steps(args)
    if args.worker == "calls":
        return worker_calls(args)

    import gocoll._lib as L
    from launch import run_ranks
    lib = None
    for path, _ in L.candidate_paths():
        if os.sep in path and os.path.exists(path):
            lib = os.path.realpath(path)
            break
    if lib is None:
        sys.exit("libgocoll.so not found; build it with build/build.sh or set GOCOLL_LIBRARY")
    env = {"GOCOLL_LIBRARY": lib, "OMP_NUM_THREADS": "1"}
    passthrough = ["--steps", args.steps, "--warmup", args.warmup, "--width", args.width, "--depth",
                   args.depth, "--batch", args.batch, "--bucket-mb", args.bucket_mb, "--iters", args.iters]
    me = os.path.abspath(__file__)
    print("gocoll step benchmark: %d ranks on %d cores%s, library %s" % (
        args.ranks, os.cpu_count(), " (oversubscribed)" if args.ranks > os.cpu_count() else "", lib))

    res = None if args.skip_steps else \
        run_ranks(me, args.ranks, ["--worker", "steps"] + passthrough, env=env, timeout=600)[0].result
    if res:
        _print_steps(args, res)
    exe, tmp = compile_c(lib)
    if not exe:
        print("(C side skipped: %s)" % tmp)
    part2 = {}
    try:
        for n in [int(v) for v in args.call_ranks.split(",")]:
            calls = run_ranks(me, n, ["--worker", "calls"] + passthrough, env=env, timeout=600)[0].result
            c = None
            if exe:
                c = run_ranks(None, n, [args.iters] + SIZES, env=env, timeout=600, cmd=[exe])[0].result
            part2[n] = {"python": calls, "c": c}
            print("\nPart 2: one in-place float32 allreduce, µs per call, %d rank%s%s"
                  % (n, "s" if n > 1 else "", " (no peer: the cost of the call itself)" if n == 1 else ""))
            print("  %10s %10s %10s %10s %10s %12s %12s" % ("bytes", "C", "py-numpy", "py-torch", "gloo",
                                                           "numpy-C", "torch-C"))
            for sz in SIZES:
                k = str(sz)
                cv = c[k] if c else float("nan")
                print("  %10d %10.2f %10.2f %10.2f %10.2f %12.2f %12.2f" % (
                    sz, cv, calls["py-numpy"][k], calls["py-torch"][k], calls["gloo"][k],
                    calls["py-numpy"][k] - cv, calls["py-torch"][k] - cv))
            print("  bridge validation alone (as_buffer): numpy %.2f µs, torch %.2f µs"
                  % (calls["as_buffer_numpy_us"], calls["as_buffer_torch_us"]))
    finally:
        if exe:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": res, "calls": part2, "ranks": args.ranks, "cores": os.cpu_count()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
