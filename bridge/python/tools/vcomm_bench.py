#!/usr/bin/env python3
"""The virtual allreduce from Python against the plain allreduce of the
same bytes per process: 8 virtual devices in blocks, float64 sum, the
local devices' vectors rows of one array and one ``out``; p50 of the
timed calls, each after a barrier. The Python counterpart of
``NP=2 OP=allreduce build/vppubench`` (docs/virtual.md).

    GOCOLL_LIBRARY=$PWD/build/out/lib/libgocoll.so PYTHONPATH=bridge/python \\
        /usr/bin/python3 bridge/python/tools/vcomm_bench.py [nprocs] [MiB,...]

Without GOCOLL_RANK it starts nprocs (default 2) fresh interpreters of
itself on this host (never forking after loading the library) and waits
for them; rank 0 prints one line per size.
"""

import os
import socket
import subprocess
import sys
import time

NDEV, WARM, TIMED = 8, 10, 50


def launch(nprocs):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nprocs):
        env = dict(os.environ, GOCOLL_RANK=str(r), GOCOLL_SIZE=str(nprocs), GOCOLL_LOCAL_RANK=str(r),
                   GOCOLL_LOCAL_SIZE=str(nprocs), GOCOLL_ROOT_ADDR="127.0.0.1:%d" % port,
                   GOCOLL_SECRET=os.environ.get("GOCOLL_SECRET", "vcomm-bench-%d" % os.getpid()))
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    rc = 0
    for p in procs:
        try:
            rc = rc or p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = 1
    return rc


def bench(sizes):
    import numpy as np
    import gocoll

    c = gocoll.init()
    vc = gocoll.vppu.VirtualComm(c, "ring", NDEV)
    devs = vc.devices
    for mib in sizes:
        count = int(mib * (1 << 20)) // 8
        rows = np.random.default_rng(c.rank).standard_normal((len(devs), count))
        out = np.empty(count)
        plain = rows.reshape(-1).copy()
        tv, tp = [], []
        for _ in range(WARM + TIMED):
            c.barrier()
            t = time.perf_counter()
            vc.allreduce(list(rows), out=[out] * len(devs))
            tv.append(time.perf_counter() - t)
            c.barrier()
            t = time.perf_counter()
            c.all_reduce(plain)
            tp.append(time.perf_counter() - t)
        if c.rank == 0:
            v, p = np.median(tv[WARM:]) * 1e6, np.median(tp[WARM:]) * 1e6
            print("%d processes, %g MiB per device: virtual allreduce p50 %.0f µs, plain allreduce of the same "
                  "bytes per process %.0f µs: %.2fx" % (c.size, mib, v, p, p / v), flush=True)
    vc.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    nprocs = int(args[0]) if args else 2
    sizes = [float(s) for s in args[1].split(",")] if len(args) > 1 else [1, 4]
    if "GOCOLL_RANK" not in os.environ:
        sys.exit(launch(nprocs))
    bench(sizes)
