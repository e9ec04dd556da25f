"""gocoll.vppu: resource maps and redistribution plans across processes,
numpy and torch, every element checked."""

import numpy as np
import torch

import gocoll
from common import main, report


def cyclic_global(proc, off, block, procs):
    return (off // block * procs + proc) * block + off % block


def check_cyclic(c):
    n = 500
    with gocoll.vppu.Plan.cyclic(src=(c.size, 3), dst=(c.size, 4), n=n, src_index=(2, 1), dst_index=(3, 4)) as plan:
        info = plan.info()
        assert sum(map(sum, info["com"])) == n, info
        ns, nd = plan.counts(c.rank)
        src = np.array([cyclic_global(c.rank, k, 3, c.size) for k in range(ns)], dtype=np.float64)
        dst = np.full(nd, -1.0)
        plan.redistribute(c, src, dst)
        for k in range(nd):
            g = cyclic_global(c.rank, k, 4, c.size)
            want = 2 * ((g - 4) // 3) + 1 if g >= 4 and (g - 4) % 3 == 0 and (g - 4) // 3 < n else -1
            assert dst[k] == want, (g, dst[k], want)
        return info["method"], len(info["steps"]), info["lower_bound"]


def check_maps(c):
    # 24x18 matrix: row bands -> 4x3 tiles dealt cyclically, torch int32.
    a = gocoll.vppu.Map.block((24, 18), dim=0, devices=c.size)
    b = gocoll.vppu.Map((24, 18), (4, 3), c.size, assign="cyclic")
    full = torch.arange(24 * 18, dtype=torch.int32).reshape(24, 18)
    with gocoll.vppu.Plan.maps(a, b) as plan:
        ns, nd = plan.counts(c.rank)
        r0, r1 = c.rank * 24 // c.size, (c.rank + 1) * 24 // c.size
        src = full[r0:r1].contiguous().reshape(-1)
        assert src.numel() == ns
        dst = torch.empty(nd, dtype=torch.int32)
        plan.redistribute(c, src, dst)
        k = 0
        for t in range(c.rank, 6 * 6, c.size):
            tile = full[t // 6 * 4:t // 6 * 4 + 4, t % 6 * 3:t % 6 * 3 + 3].reshape(-1)
            assert torch.equal(dst[k:k + tile.numel()], tile), t
            k += tile.numel()
        assert k == nd
        try:
            plan.redistribute(c, src[:0] if ns else None, dst)
        except gocoll.InvalidArgument as e:
            refused = str(e)
        else:
            refused = "" if ns == 0 else "accepted"
        return refused


def work():
    c = gocoll.init()
    res = {"cyclic": check_cyclic(c), "maps_refused": check_maps(c)}
    c.barrier()
    c.destroy()
    report(res)


main(work)
