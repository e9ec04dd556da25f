"""alltoallw with strided vectors on both sides, numpy and torch, blocking
and non-blocking, under whatever GOCOLL_ALGO says; then the errors: bad
block types, and ranks whose block sizes differ. Usage: alltoallw.py"""

import numpy as np
import torch

import gocoll
from common import expect_raises, main, report


def layout(n, r, sending):
    """Rank s sends rank d (s + 2d) % 4 + 1 elements valued 16s + 4d + k
    (exact in bfloat16);
    the sender lays them out every other element (a vector), the receiver
    contiguous from even ranks and every third element from odd ones."""
    cnt = lambda s, d: (s + 2 * d) % 4 + 1
    types = []
    for p in range(n):
        if sending:
            types.append((cnt(r, p), 1, 2))
        elif p % 2 == 0:
            types.append(cnt(p, r))
        else:
            types.append((cnt(p, r), 1, 3))
    return types, cnt


def check(c, lib, dtype, async_op):
    r, n = c.rank, c.size
    st, cnt = layout(n, r, True)
    rt, _ = layout(n, r, False)
    ext = [(k - 1) * s + b for k, b, s in st]
    sd = list(np.cumsum([0] + ext[:-1]))
    send = np.full(sum(ext), -1.0)
    for d in range(n):
        for k in range(cnt(r, d)):
            send[sd[d] + 2 * k] = 16 * r + 4 * d + k
    if lib == "torch":
        x = torch.tensor(send).to(getattr(torch, dtype))
    else:
        x = send.astype(dtype)
    res = c.alltoallw(x, st, rt, async_op=async_op)
    got = np.asarray(res.wait() if async_op else res, dtype=np.float64) if lib == "numpy" else \
        (res.wait() if async_op else res).to(torch.float64).numpy()
    at = 0
    for s in range(n):
        k_n = cnt(s, r)
        step = 1 if s % 2 == 0 else 3
        for k in range(k_n):
            want = 16 * s + 4 * r + k
            assert got[at + step * k] == want, (s, k, got[at:at + step * k_n], want)
        at += (k_n - 1) * step + 1
    assert at == len(got), (at, len(got))
    return 1


def run():
    c = gocoll.init()
    checked = 0
    for lib, dtypes in (("numpy", ["float32", "int32", "float64"]),
                        ("torch", ["float32", "bfloat16", "int64"])):
        for dt in dtypes:
            for async_op in (False, True):
                checked += check(c, lib, dt, async_op)
    msgs = {}
    n, r = c.size, c.rank
    x = np.zeros(64, dtype=np.float32)
    e = expect_raises(gocoll.InvalidArgument, c.alltoallw, x, [(1, 2)] * n, [1] * n)
    msgs["short vector"] = str(e)
    e = expect_raises(gocoll.InvalidArgument, c.alltoallw, x, [(2, 2, 1)] * n, [4] * n)
    msgs["overlapping runs"] = str(e)
    e = expect_raises(gocoll.InvalidArgument, c.alltoallw, x, [(9, 1, 9)] * n, [9] * n)
    msgs["past the end"] = str(e)
    # Rank 0 expects one element less from the last rank than it sends.
    # Every rank first finishes the checked calls: rank 0's failure on
    # this one aborts the communicator, which would fail a rank still
    # waiting on its part of the last checked call.
    c.barrier()
    rt = [2] * n
    if r == 0 and n > 1:
        rt[n - 1] = 1
    try:
        c.alltoallw(x, [2] * n, rt)
        msgs["counts differ"] = ""
    except gocoll.Error as err:
        msgs["counts differ"] = str(err)
    report({"checked": checked, "messages": msgs})


if __name__ == "__main__":
    main(run)
