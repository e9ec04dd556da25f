"""Comm.recv from any source with senders racing, and
Comm.all_gather_coalesced with mixed sizes, dtypes, empty and
non-contiguous tensors, numpy and torch, against a per-tensor reference.
Argument: "numpy" or "torch" (which library's buffers)."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import expect_raises, main, rank_size, report  # noqa: E402

import gocoll  # noqa: E402

MSGS = 6  # messages each sender sends each receiver
N = 257   # their elements


def payload(frm, k):
    return (np.arange(N, dtype=np.int64) * 7 + frm * 1000 + k) % 30011


def any_source(c, checked):
    """Each rank in turn receives from any source while every other rank
    sends it MSGS messages at once: blocking recv (which returns the
    sender), then irecv + Work.source_rank()."""
    r, n = c.rank, c.size
    for root in range(n):
        if r != root:
            ws = [c.isend(payload(r, k), root, tag=3) for k in range(MSGS)]
            for w in ws:
                w.wait()
        else:
            nxt = [0] * n
            half = (n - 1) * MSGS // 2
            got = []
            for _ in range(half):
                y = np.empty(N, np.int64)
                src = c.recv(y, tag=3)
                got.append((src, y))
            works = [(c.irecv(np.empty(N, np.int64), tag=3)) for _ in range((n - 1) * MSGS - half)]
            for w in works:
                y = w.wait()
                got.append((w.source_rank(), y))
            for src, y in got:
                assert 0 <= src < n and src != r, src
                k = nxt[src]
                assert np.array_equal(y, payload(src, k)), ("message %d from rank %d" % (k, src), y[:3])
                nxt[src] += 1
            assert all(nxt[q] == (0 if q == r else MSGS) for q in range(n)), nxt
        c.barrier()
    checked.append("recv from any source")
    # source_rank() is for receives from any source only
    w = c.isend(np.zeros(1, np.int8), (r + 1) % n, tag=4)
    y = np.empty(1, np.int8)
    wr = c.irecv(y, (r - 1) % n, tag=4)
    expect_raises(RuntimeError, wr.source_rank, contains="any source")
    w.wait()
    wr.wait()
    checked.append("source_rank refused for a named recv")


def coalesced(c, L, checked):
    """all_gather_coalesced of mixed dtypes and sizes (some empty, one
    non-contiguous) against all_gather per tensor."""
    r, n = c.rank, c.size
    specs = [("float32", (3, 4)), ("int8", (0,)), ("float64", (5,)), ("int64", (2, 0, 3)),
             ("uint8", (17,)), ("float16", (1,)), ("int32", (6, 2))]

    def make(q, j, dt, shape):
        count = int(np.prod(shape))
        return L.make(((np.arange(count) + 11 * q + 5 * j) % 97).reshape(shape), dt)

    ins = [make(r, j, dt, shape) for j, (dt, shape) in enumerate(specs)]
    ins[0] = L.transpose(L.make(((np.arange(12) + 11 * r) % 97).reshape(4, 3), "float32"))
    outs = [[L.empty(shape, dt) for dt, shape in specs] for _ in range(n)]
    outs[n - 1][6] = L.transpose(L.empty((2, 6), "int32"))  # a non-contiguous output
    res = c.all_gather_coalesced(outs, ins)
    assert res is outs
    for j, x in enumerate(ins):
        ref = [L.empty(tuple(L.shape(x)), specs[j][0]) for _ in range(n)]
        c.all_gather(ref, L.contiguous(x))
        for q in range(n):
            assert L.equal(outs[q][j], ref[q]), ("tensor %d from rank %d" % (j, q), outs[q][j], ref[q])
    w = c.all_gather_coalesced(outs, ins, async_op=True)
    assert w.wait() is outs
    checked.append("all_gather_coalesced " + L.name)
    empty = [[] for _ in range(n)]
    c.all_gather_coalesced(empty, [])
    e = expect_raises(ValueError, c.all_gather_coalesced, [[L.empty((3,), "float32")]] * n,
                      [L.empty((4,), "float32")])
    assert "want input_list[0]'s float32[4]" in str(e), e
    checked.append("all_gather_coalesced edges " + L.name)


class NumpyLib:
    name = "numpy"

    def make(self, a, dt):
        return np.asarray(a).astype(dt)

    def empty(self, shape, dt):
        return np.full(shape, 99, dtype=dt)

    def transpose(self, a):
        return a.T

    def contiguous(self, a):
        return np.ascontiguousarray(a)

    def shape(self, a):
        return a.shape

    def equal(self, a, b):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


class TorchLib:
    name = "torch"

    def __init__(self):
        import torch
        self.t = torch

    def make(self, a, dt):
        return self.t.from_numpy(np.ascontiguousarray(np.asarray(a).astype(dt)))

    def empty(self, shape, dt):
        return self.t.full(shape, 99, dtype=getattr(self.t, dt))

    def transpose(self, a):
        return a.t()

    def contiguous(self, a):
        return a.contiguous()

    def shape(self, a):
        return a.shape

    def equal(self, a, b):
        return a.shape == b.shape and a.dtype == b.dtype and bool(self.t.equal(a, b))


def work():
    which = sys.argv[1] if len(sys.argv) > 1 else "numpy"
    rank, size = rank_size()
    c = gocoll.init()
    checked = []
    any_source(c, checked)
    coalesced(c, NumpyLib() if which == "numpy" else TorchLib(), checked)
    # the communicator is still in step: a collective after all of it
    x = np.array([rank], np.int64)
    c.all_reduce(x)
    assert x[0] == size * (size - 1) // 2, x
    c.destroy()
    report({"checked": checked})


main(work)
