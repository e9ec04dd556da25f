"""The cost of calling gocoll from Python (ctypes) vs from C.

    /usr/bin/python3 bridge/python/bench/call_bench.py [--call-ranks 1,2] [--iters 1000]

Starts the ranks itself (fresh interpreters with torchrun-style variables).
One in-place float32 allreduce per call, microseconds per call:
  C           bench/allreduce_c.c compiled with gcc against libgocoll
  py-numpy    comm.all_reduce(numpy array)
  py-torch    comm.all_reduce(torch tensor)
  gloo        torch.distributed.all_reduce (for scale)
The difference py − C is what the Python bridge (validation + ctypes) adds.
Training-step times (DDP, the comm hook, DistributedGradients against Gloo)
are ddp_bench.py's. The machine may have fewer cores than ranks: then ranks
share cores and times are inflated; compare ratios.
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


# ---------------------------------------------------------------------------
# workers (one process per rank)


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
        for name, fn in (("py-numpy", lambda: comm.all_reduce(a)), ("py-torch", lambda: comm.all_reduce(t)),
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=1000, help="allreduce calls per timed loop (small sizes)")
    ap.add_argument("--call-ranks", default="1,2",
                    help="rank counts for part 2 (comma-separated; 1 isolates the per-call cost)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", choices=["calls"], help=argparse.SUPPRESS)
    args = ap.parse_args()
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
    passthrough = ["--iters", args.iters]
    me = os.path.abspath(__file__)
    print("gocoll per-call benchmark on %d cores, library %s" % (os.cpu_count(), lib))
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
            print("\nOne in-place float32 allreduce, µs per call, %d rank%s%s"
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
            json.dump({"calls": part2, "cores": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
