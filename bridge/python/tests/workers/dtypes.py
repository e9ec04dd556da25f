"""int16 and bool buffers, the bitwise ops, and per-communicator settings
(gocoll.init(timeout=, algo=, debug=)). Usage: dtypes.py numpy | torch

numpy: allreduce / reduce_scatter of int16 (wrapping sums) and bool (torch's
rules, bytes other than 1 counting as true) with every op that applies,
BAND/BOR/BXOR on every integer type, the refused pairs, bad settings, and
two communicators of one process with their own timeouts (the short one
times out while the long one, waiting through it, completes).

torch: under init_process_group("gocoll"): dist.all_reduce with BAND, BOR,
BXOR on integer and bool tensors, SUM/PRODUCT/MIN/MAX on bool, the refused
pairs as exceptions; a new_group's timeout reaches its communicator."""

import datetime
import functools
import operator
import os
import sys

import numpy as np

import gocoll
from common import expect_raises, main, rank_size, report

N = 1031  # elements: the vector loops and their tails


def values(dtype, r, salt):
    """Rank r's input: all bit patterns of the integer types; for bool the
    bytes 0, 1, 2 and 0x80 (all but 0 are true) seen as numpy bools."""
    rng = np.random.default_rng(1000 * salt + r)
    if dtype == "bool":
        raw = rng.choice(np.array([0, 1, 2, 0x80, 0], dtype=np.uint8), N)
        return raw.view(np.bool_)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, N, dtype=dtype, endpoint=True)


def truth(a):
    return a.view(np.uint8) != 0


BOOL_RULES = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or,
              "prod": np.logical_and, "min": np.logical_and, "band": np.logical_and,
              "bxor": np.logical_xor}
INT_RULES = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}
INT_TYPES = ["int8", "uint8", "int16", "int32", "uint32", "int64", "uint64"]


def run_numpy():
    r, n = rank_size()
    c = gocoll.init()
    checked = []

    def same(got, want, what):
        if got.dtype != want.dtype or not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            raise AssertionError("%s: rank %d got %s, want %s" % (what, r, got[:8], want[:8]))
        checked.append(what)

    # bool, every op but avg: results are 0 or 1 bytes
    for salt, (op, rule) in enumerate(sorted(BOOL_RULES.items())):
        ins = [values("bool", q, salt) for q in range(n)]
        want = functools.reduce(rule, [truth(x) for x in ins])
        x = ins[r].copy()
        c.all_reduce(x, op)
        same(x, want, "bool allreduce " + op)
        full = [np.concatenate([values("bool", q, salt + 50 + j) for j in range(n)]) for q in range(n)]
        want = functools.reduce(rule, [truth(x) for x in full])[r * N:(r + 1) * N]
        same(c.reduce_scatter_tensor(None, full[r].copy(), op), want, "bool reduce_scatter " + op)
    # the bitwise ops on every integer type, by name and by ReduceOp
    for dt in INT_TYPES:
        for salt, (op, rule) in enumerate(sorted(INT_RULES.items())):
            ins = [values(dt, q, salt) for q in range(n)]
            x = ins[r].copy()
            c.all_reduce(x, getattr(gocoll.ReduceOp, op.upper()) if salt % 2 else op)
            same(x, functools.reduce(rule, ins), "%s allreduce %s" % (dt, op))
    # int16 arithmetic wraps, as torch's does
    ins = [np.full(N, 30000 + q, dtype=np.int16) for q in range(n)]
    x = ins[r].copy()
    c.all_reduce(x, "sum")
    same(x, np.full(N, sum(30000 + q for q in range(n)), np.int64).astype(np.int16), "int16 sum wraps")
    ins = [values("int16", q, 9) for q in range(n)]
    for op, rule in (("max", np.maximum), ("min", np.minimum)):
        x = ins[r].copy()
        c.all_reduce(x, op)
        same(x, functools.reduce(rule, ins), "int16 " + op)
    x = np.full(N, 2 * (r + 1), dtype=np.int16)
    c.all_reduce(x, "avg")
    same(x, np.full(N, (n + 1), dtype=np.int16), "int16 avg")

    # refused: bitwise on floats, avg on bool; the communicator goes on
    for dt in ("float16", "float32", "float64"):
        for op in ("band", "bor", gocoll.BXOR):
            expect_raises(gocoll.InvalidArgument, c.all_reduce, np.zeros(4, dt), op,
                          contains="bitwise ops take integer and bool types only")
    expect_raises(gocoll.InvalidArgument, c.all_reduce, np.zeros(4, np.bool_), "avg",
                  contains="avg is not defined on bool")
    expect_raises(gocoll.InvalidArgument, c.reduce_scatter_tensor, None, np.zeros(4 * n, np.float32), "bxor",
                  contains="bxor")
    checked.append("refused")
    x = np.array([r + 1], dtype=np.int32)
    c.all_reduce(x)
    assert x[0] == n * (n + 1) // 2, x

    # bad settings are refused before any rendezvous, naming the setting
    uid = bytes(gocoll.UNIQUE_ID_BYTES)
    for kw, contains in (({"algo": "allreduce=bogus"}, "gocollConfig_t.algo"),
                         ({"debug": "LOUD"}, "gocollConfig_t.debug"),
                         ({"timeout": 0}, "timeout"), ({"timeout": -3.5}, "timeout"),
                         ({"timeout": "10s"}, "timeout"), ({"algo": 7}, "algo")):
        expect_raises(gocoll.InvalidArgument, gocoll.init, rank=r, size=n, unique_id=uid,
                      contains=contains, **kw)
    checked.append("bad settings")

    # two communicators with their own timeouts; ids travel over c
    def share():
        buf = np.frombuffer(gocoll.get_unique_id(), np.uint8).copy() if r == 0 \
            else np.zeros(gocoll.UNIQUE_ID_BYTES, np.uint8)
        c.broadcast(buf, 0)
        return buf.tobytes()

    ids = [share() for _ in range(3)]
    short = gocoll.init(rank=r, size=n, unique_id=ids[0], timeout=0.3, debug="OFF")
    long_ = gocoll.init(rank=r, size=n, unique_id=ids[1], timeout=datetime.timedelta(minutes=10),
                        algo="allreduce=ring")
    gate = gocoll.init(rank=r, size=n, unique_id=ids[2])  # the environment's timeout
    x = np.full(4, r + 1, dtype=np.float32)
    if r == 0:
        w = long_.all_reduce(x, async_op=True)
        e = expect_raises(gocoll.Timeout, short.all_reduce, np.zeros(4, np.float32))
        assert "300ms" in str(e), e  # the short communicator's own deadline
        gate.barrier()  # only now do the others join long_
        w.wait()
    else:
        gate.barrier()
        long_.all_reduce(x)
    same(x, np.full(4, n * (n + 1) / 2, dtype=np.float32), "long communicator outlives the short one")
    short.abort()
    gate.barrier()
    for comm in (long_, gate, c):
        comm.destroy()
    report({"checked": checked})


def run_torch():
    import torch
    import torch.distributed as dist
    import gocoll.torch  # noqa: F401  (registers the backend)
    from gocoll import _backend

    R = dist.ReduceOp
    dist.init_process_group("gocoll")
    r, n = dist.get_rank(), dist.get_world_size()
    checked = []

    def eq(got, want, what):
        if got.dtype != want.dtype or not torch.equal(got, want):
            raise AssertionError("%s: rank %d got %s, want %s" % (what, r, got[:8], want[:8]))
        checked.append(what)

    ops = {"BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor}
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        for salt, (name, rule) in enumerate(sorted(ops.items())):
            ins = [torch.from_numpy(values(str(dt).split(".")[1], q, salt)) for q in range(n)]
            t = ins[r].clone()
            dist.all_reduce(t, op=getattr(R, name))
            eq(t, functools.reduce(rule, ins), "all_reduce %s %s" % (dt, name))
    bool_rules = {"SUM": operator.or_, "MAX": operator.or_, "BOR": operator.or_,
                  "PRODUCT": operator.and_, "MIN": operator.and_, "BAND": operator.and_,
                  "BXOR": operator.xor}
    for salt, (name, rule) in enumerate(sorted(bool_rules.items())):
        ins = [torch.from_numpy(truth(values("bool", q, salt)).copy()) for q in range(n)]
        t = ins[r].clone()
        w = dist.all_reduce(t, op=getattr(R, name), async_op=True)
        w.wait()
        eq(t, functools.reduce(rule, ins), "all_reduce bool " + name)
    # refused pairs surface as exceptions at the call
    for name in ("BAND", "BOR", "BXOR"):
        expect_raises(gocoll.InvalidArgument, dist.all_reduce, torch.zeros(4), op=getattr(R, name),
                      contains="bitwise ops take integer and bool types only")
    expect_raises(gocoll.InvalidArgument, dist.all_reduce, torch.zeros(4, dtype=torch.bool),
                  op=R.AVG, contains="avg is not defined on bool")
    checked.append("refused")

    # The group's timeout is its communicator's: torch's default leaves an
    # explicit GOCOLL_TIMEOUT in charge (the launcher sets one); any other
    # value wins over it.
    assert os.environ.get("GOCOLL_TIMEOUT")
    assert _backend._comm_timeout(dist.default_pg_timeout) is None
    assert _backend._comm_timeout(datetime.timedelta(seconds=7)) == datetime.timedelta(seconds=7)
    assert _backend._comm_timeout(datetime.timedelta(0)) is None
    assert _backend._comm_timeout(datetime.timedelta(days=400)) == _backend._MAX_TIMEOUT
    short = dist.new_group(list(range(n)), timeout=datetime.timedelta(milliseconds=400))
    gate = dist.new_group(list(range(n)))
    t = torch.full((4,), float(r + 1))
    if r == 0:
        w = dist.all_reduce(t, async_op=True)  # the default group
        e = expect_raises(gocoll.Timeout, lambda: dist.all_reduce(torch.zeros(4), group=short))
        assert "400ms" in str(e), e
        dist.barrier(group=gate)
        w.wait()
    else:
        dist.barrier(group=gate)
        dist.all_reduce(t)
    eq(t, torch.full((4,), float(n * (n + 1) // 2)), "default group outlives the short group")
    dist.barrier(group=gate)
    report({"checked": checked})
    # short failed on rank 0: do not wait for it in destroy
    short.comm.abort()
    dist.destroy_process_group()


def run():
    mode = sys.argv[1] if len(sys.argv) > 1 else "numpy"
    {"numpy": run_numpy, "torch": run_torch}[mode]()
    r, n = rank_size()
    print("TYPES OK rank %d of %d" % (r, n), flush=True)


if __name__ == "__main__":
    main(run)
