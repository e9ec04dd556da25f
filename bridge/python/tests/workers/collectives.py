"""Every collective × every dtype, on numpy arrays and/or torch tensors,
blocking and non-blocking; then split. Usage: collectives.py numpy|torch|both"""

import sys

import numpy as np

import gocoll
from common import main, rank_size, report

N = 13  # elements per rank for allreduce & co (awkward on purpose)
K = 5  # elements per peer for reduce_scatter / alltoall


class NumpyLib:
    name = "numpy"
    dtypes = ["int8", "uint8", "int16", "int32", "uint32", "int64", "uint64", "float16", "float32",
              "float64"]

    def make(self, values, dtype):
        return np.asarray(values).astype(dtype)

    def empty(self, n, dtype):
        return np.full(n, 99, dtype=dtype)

    def to_np(self, x):
        return np.asarray(x).astype(np.float64)

    def ptr(self, x):
        return x.ctypes.data


class TorchLib:
    name = "torch"
    dtypes = ["int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]

    def __init__(self):
        import torch
        self.torch = torch

    def make(self, values, dtype):
        return self.torch.tensor(np.asarray(values, dtype=np.float64)).to(getattr(self.torch, dtype))

    def empty(self, n, dtype):
        return self.torch.full((n,), 99, dtype=getattr(self.torch, dtype))

    def to_np(self, x):
        return x.to(self.torch.float64).numpy()

    def ptr(self, x):
        return x.data_ptr()


def base(n, r):
    return (np.arange(n) % 7) + r + 1


def pbase(n, r):
    return 1 + (np.arange(n) + r) % 2


def run_lib(c, L, asyncs):
    r, n = c.rank, c.size
    checked = 0

    def check(what, got, want):
        nonlocal checked
        g = L.to_np(got)
        w = np.asarray(want, dtype=np.float64)
        if g.shape != w.shape or not np.array_equal(g, w):
            raise AssertionError("%s %s: rank %d got %s, want %s" % (L.name, what, r, g, w))
        checked += 1

    def run(fn, *a, **k):
        """Call blocking, or async then wait, per ``asyncs``."""
        if not asyncs:
            return fn(*a, **k)
        w = fn(*a, async_op=True, **k)
        assert isinstance(w, gocoll.Work), w
        return w.wait()

    for dt in L.dtypes:
        is_int = not dt.startswith(("float", "bfloat"))
        everyone = [base(N, q) for q in range(n)]
        # allreduce, every op, in place
        for op, want in [("sum", sum(everyone)), ("max", np.max(everyone, axis=0)),
                         ("min", np.min(everyone, axis=0)),
                         ("avg", (sum(everyone) // n) if is_int else sum(everyone) / n)]:
            x = L.make(base(N, r), dt)
            p = L.ptr(x)
            res = run(c.all_reduce, x, op)
            assert res is x and L.ptr(x) == p
            check("allreduce %s %s" % (op, dt), x, want)
        x = L.make(pbase(N, r), dt)
        run(c.all_reduce, x, gocoll.ReduceOp.PROD)
        check("allreduce prod %s" % dt, x, np.prod([pbase(N, q) for q in range(n)], axis=0))
        # allreduce into out=
        x = L.make(base(N, r), dt)
        out = L.empty(N, dt)
        res = run(c.all_reduce, x, "sum", out=out)
        assert res is out
        check("allreduce out %s" % dt, out, sum(everyone))
        check("allreduce input untouched %s" % dt, x, base(N, r))
        # reduce to the last rank
        root = n - 1
        x = L.make(base(N, r), dt)
        run(c.reduce, x, root, "sum")
        check("reduce %s" % dt, x, sum(everyone) if r == root else base(N, r))
        # broadcast from rank 1 % n
        root = 1 % n
        x = L.make(base(N, r), dt)
        run(c.broadcast, x, root)
        check("broadcast %s" % dt, x, base(N, root))
        x = L.make(base(N, r), dt)
        out = L.empty(N, dt)
        run(c.broadcast, x, root, out=out)
        check("broadcast out %s" % dt, out, base(N, root))
        # allgather, new output and in place
        x = L.make(base(N, r), dt)
        got = run(c.all_gather_into_tensor, None, x)
        check("all_gather_into_tensor %s" % dt, got, np.stack(everyone))
        out = L.make(np.zeros(n * N), dt)
        mine = out[r * N:(r + 1) * N]
        mine[:] = L.make(base(N, r), dt)
        run(c.all_gather_into_tensor, out, mine)
        check("all_gather_into_tensor in place %s" % dt, out, np.concatenate(everyone))
        # torch's list form (outputs of another shape: only the sizes must match)
        outs = [L.empty(N, dt).reshape(1, N) for _ in range(n)]
        assert run(c.all_gather, outs, L.make(base(N, r), dt)) is outs
        for q in range(n):
            check("all_gather list %s" % dt, outs[q].reshape(N), base(N, q))
        # reduce_scatter
        full = [base(n * K, q) for q in range(n)]
        x = L.make(base(n * K, r), dt)
        got = run(c.reduce_scatter_tensor, None, x, "sum")
        check("reduce_scatter_tensor %s" % dt, got, sum(full)[r * K:(r + 1) * K])
        x2 = L.make(base(n * K, r), dt).reshape(n, K)
        got = run(c.reduce_scatter_tensor, None, x2, "max")
        check("reduce_scatter_tensor 2-D %s" % dt, got, np.max(full, axis=0)[r * K:(r + 1) * K])
        # torch's reduce_scatter(output, input_list), and with one input tensor
        out = L.empty(K, dt)
        ins = [L.make(base(n * K, r)[j * K:(j + 1) * K], dt) for j in range(n)]
        assert run(c.reduce_scatter, out, ins, "sum") is out
        check("reduce_scatter list %s" % dt, out, sum(full)[r * K:(r + 1) * K])
        out = L.empty(K, dt)
        run(c.reduce_scatter, out, L.make(base(n * K, r), dt), "min")
        check("reduce_scatter tensor input %s" % dt, out, np.min(full, axis=0)[r * K:(r + 1) * K])
        # alltoall: block j of rank q is 100*q + 10*j + i (fits int8 only mod 128, so small)
        def a2a(q):
            return np.array([(q * 4 + j) % 50 + i for j in range(n) for i in range(K)])
        x = L.make(a2a(r), dt)
        got = run(c.all_to_all_single, None, x)
        check("all_to_all_single %s" % dt, got, np.concatenate([a2a(q)[r * K:(r + 1) * K] for q in range(n)]))
        x = L.make(a2a(r), dt)
        run(c.all_to_all_single, x, x)
        check("all_to_all_single in place %s" % dt, x,
              np.concatenate([a2a(q)[r * K:(r + 1) * K] for q in range(n)]))
        # torch's list form: rank i sends i+j+1 elements to rank j
        ins = [L.make(np.full(r + j + 1, (3 * r + j) % 50), dt) for j in range(n)]
        outs = [L.empty(i + r + 1, dt) for i in range(n)]
        assert run(c.all_to_all, outs, ins) is outs
        for q in range(n):
            check("all_to_all list %s" % dt, outs[q], np.full(q + r + 1, (3 * q + r) % 50))
        # alltoallv: rank i sends i+j+1 elements valued 10*i+j to rank j
        sc = [r + j + 1 for j in range(n)]
        rcnt = [i + r + 1 for i in range(n)]
        send = np.concatenate([np.full(sc[j], (10 * r + j) % 100) for j in range(n)])
        x = L.make(send, dt)
        got = run(c.alltoallv, x, sc, rcnt)
        check("alltoallv %s" % dt, got,
              np.concatenate([np.full(rcnt[i], (10 * i + r) % 100) for i in range(n)]))
        # send/recv around a ring (non-blocking pair, so it cannot deadlock)
        if n > 1:
            x = L.make(base(N, r), dt)
            y = L.empty(N, dt)
            ws = c.isend(x, (r + 1) % n)
            wr = c.irecv(y, (r - 1) % n)
            ws.wait()
            assert wr.wait() is y
            check("send/recv %s" % dt, y, base(N, (r - 1) % n))
            # tags: two messages received in the reverse order of their sends
            x2 = L.make(base(N, r) + 1, dt)
            y2 = L.empty(N, dt)
            ws = [c.isend(x, (r + 1) % n, tag=5), c.isend(x2, (r + 1) % n, tag=2)]
            c.recv(y2, (r - 1) % n, tag=2)
            c.recv(y, (r - 1) % n, tag=5)
            for w in ws:
                w.wait()
            check("recv tag 2 %s" % dt, y2, base(N, (r - 1) % n) + 1)
            check("recv tag 5 %s" % dt, y, base(N, (r - 1) % n))
            # blocking pair: even ranks send first
            if r % 2 == 0 and r + 1 < n:
                c.send(x, r + 1)
                c.recv(y, r + 1)
                check("blocking recv %s" % dt, y, base(N, r + 1))
            elif r % 2 == 1:
                c.recv(y, r - 1)
                c.send(x, r - 1)
                check("blocking recv %s" % dt, y, base(N, r - 1))
        run(c.barrier)
    return checked


def run_split(c):
    r, n = c.rank, c.size
    sub = c.split(r % 2, key=-r)  # reversed order inside each half
    members = [q for q in range(n) if q % 2 == r % 2]
    assert sub.size == len(members), (sub.size, members)
    assert sub.rank == sorted(members, reverse=True).index(r), sub.rank
    x = np.array([r], dtype=np.int64)
    sub.all_reduce(x)
    assert x[0] == sum(members), (x, members)
    g = sub.all_gather_into_tensor(None, np.array([r], dtype=np.int32))
    assert list(g.ravel()) == sorted(members, reverse=True), g
    none = c.split(None if r == 0 else 7)
    assert (none is None) == (r == 0)
    if none is not None:
        assert none.size == n - 1
        none.barrier()
        none.destroy()
    sub.destroy()
    assert sub.closed


def run_edges(c, with_torch):
    """Empty buffers, scalars (0-d), and torch.distributed's op objects."""
    z = np.zeros(0, dtype=np.float32)
    assert c.all_reduce(z) is z
    assert c.all_gather_into_tensor(None, z).shape == (c.size, 0)
    c.broadcast(z, src=0)
    s = np.array(c.rank + 1.0)  # 0-d
    c.all_reduce(s)
    assert s == sum(range(1, c.size + 1)), s
    if with_torch:
        import torch
        import torch.distributed as dist
        c.all_reduce(torch.zeros(0))
        t = torch.full((3,), float(c.rank))
        c.all_reduce(t, op=dist.ReduceOp.MAX)
        assert torch.all(t == c.size - 1), t


def work():
    which = sys.argv[1] if len(sys.argv) > 1 else "both"
    rank, size = rank_size()
    c = gocoll.init()
    assert (c.rank, c.size) == (rank, size), (c.rank, c.size, rank, size)
    libs = []
    if which in ("numpy", "both"):
        libs.append(NumpyLib())
    if which in ("torch", "both"):
        libs.append(TorchLib())
    counts = {}
    for L in libs:
        counts[L.name] = run_lib(c, L, asyncs=False)
        counts[L.name + "-async"] = run_lib(c, L, asyncs=True)
    run_split(c)
    run_edges(c, which in ("torch", "both"))
    with c:
        c.barrier()
    assert c.closed
    report({"checked": counts})


main(work)
